//! TLS towards the database and the brokers: which certificate files a URL
//! names, the settings of CDC mode's replication connection, and one-line
//! reasons for connections that fail in the handshake.
//!
//! Every connection of the binary (SQL connections through sqlx, the
//! replication connection, `amqps://`, NATS's `tls://`) speaks TLS through
//! rustls with the *ring* provider: no system OpenSSL is needed, and
//! certificates are checked the same way on every path. Kafka's TLS is
//! librdkafka's own (the `kafka-tls` feature, OpenSSL).
//!
//! PostgreSQL URLs take libpq's parameters (`sslmode` = `disable`, `prefer`
//! (the default), `require`, `verify-ca`, `verify-full`; `sslrootcert`,
//! `sslcert`, `sslkey`), with `PGSSLMODE`, `PGSSLROOTCERT`, `PGSSLCERT` and
//! `PGSSLKEY` as fallbacks. MySQL/MariaDB URLs take `ssl-mode` (`DISABLED`,
//! `PREFERRED`, `REQUIRED`, `VERIFY_CA`, `VERIFY_IDENTITY`), `ssl-ca`,
//! `ssl-cert` and `ssl-key`. Verifying modes trust the root file given and
//! the public roots of Mozilla's program (webpki-roots, compiled in).

use std::fmt;
use std::path::PathBuf;

use pgwire_replication::{SslMode, TlsConfig};
use rustls::{AlertDescription, CertificateError};
use sqlx::postgres::PgSslMode;

use crate::redact::redact_url;

/// Makes *ring* the process's TLS provider. Two providers are compiled in
/// (CDC's client brings the other), so rustls cannot pick one by itself;
/// call this once at start before any connection (the binary does). Later
/// calls, and a provider installed by the embedding program, are kept.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// The certificate files a database URL names (or its environment, for
/// PostgreSQL). Paths only: they are no secrets, the key's content is
/// never read here.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CertificateFiles {
    /// Root certificates the server's certificate must chain to.
    pub root: Option<PathBuf>,
    /// The client's certificate chain.
    pub client_cert: Option<PathBuf>,
    /// The client's private key.
    pub client_key: Option<PathBuf>,
}

impl CertificateFiles {
    /// The files `url` names; for PostgreSQL, `PGSSLROOTCERT`, `PGSSLCERT`
    /// and `PGSSLKEY` stand in for parameters the URL does not give.
    pub fn of_url(url: &str) -> Self {
        let postgres = url.starts_with("postgres:") || url.starts_with("postgresql:");
        let param = |names: &[&str], env: &str| -> Option<PathBuf> {
            let from_url = url::Url::parse(url).ok().and_then(|parsed| {
                parsed
                    .query_pairs()
                    .find(|(key, _)| names.contains(&key.as_ref()))
                    .map(|(_, value)| value.into_owned())
            });
            from_url
                .or_else(|| postgres.then(|| std::env::var(env).ok()).flatten())
                .filter(|value| !value.is_empty())
                .map(PathBuf::from)
        };
        Self {
            root: param(
                &["sslrootcert", "ssl-root-cert", "ssl-ca", "cacertfile"],
                "PGSSLROOTCERT",
            ),
            client_cert: param(&["sslcert", "ssl-cert", "certfile"], "PGSSLCERT"),
            client_key: param(&["sslkey", "ssl-key", "keyfile"], "PGSSLKEY"),
        }
    }

    /// Where trusted roots come from, for messages.
    fn roots(&self, names: &OptionNames) -> String {
        match &self.root {
            Some(path) => format!("root certificates from {}", path.display()),
            None => format!(
                "the public root certificates (set {} to add a file)",
                names.root
            ),
        }
    }
}

/// What the settings that name certificate files are called where a
/// connection takes them, for the advice in a failure's reason.
#[derive(Debug, Clone, Copy)]
pub struct OptionNames {
    /// The setting naming the root certificates.
    pub root: &'static str,
    /// The settings naming the client certificate and key.
    pub client: &'static str,
    /// What to do when the server's name is not in its certificate.
    pub name_mismatch: &'static str,
}

/// The database URLs' names.
const DATABASE_OPTIONS: OptionNames = OptionNames {
    root: "sslrootcert or ssl-ca",
    client: "sslcert and sslkey, or ssl-cert and ssl-key",
    name_mismatch: "connect by a name the certificate lists, or use sslmode=verify-ca",
};

/// A TLS-specific reason, in one line, for `error` (or one of its
/// sources) met while connecting to `host` with `files`; `None` when the
/// failure is no TLS handshake's. Used by the sinks' connections, which
/// name their files with options of their own (`names`).
pub fn handshake_reason(
    error: &(dyn std::error::Error + 'static),
    host: &str,
    files: &CertificateFiles,
    names: &OptionNames,
) -> Option<String> {
    rustls_error(error).map(|tls| rustls_reason(host, files, names, tls))
}

/// The replication connection's TLS settings for `mode` and the files of
/// `url`, the same as the SQL connections use.
pub fn replication_tls(mode: PgSslMode, url: &str) -> TlsConfig {
    let files = CertificateFiles::of_url(url);
    let mode = match mode {
        PgSslMode::Disable | PgSslMode::Allow => SslMode::Disable,
        PgSslMode::Prefer => SslMode::Prefer,
        PgSslMode::Require => SslMode::Require,
        PgSslMode::VerifyCa => SslMode::VerifyCa,
        PgSslMode::VerifyFull => SslMode::VerifyFull,
    };
    let mut config = TlsConfig {
        mode,
        ca_pem_path: files.root,
        ..TlsConfig::default()
    };
    if let (Some(cert), Some(key)) = (files.client_cert, files.client_key) {
        config = config.with_client_cert(cert, key);
    }
    config
}

/// Why the connection to a database failed, in one line, with the URL
/// (password removed) and, for a failed TLS handshake, what to check.
#[derive(Debug)]
pub struct ConnectFailure {
    url: String,
    reason: String,
}

impl ConnectFailure {
    /// Describes `error`, met while connecting to `url`.
    pub fn new(url: &str, error: &sqlx::Error) -> Self {
        let reason = tls_reason(url, error).unwrap_or_else(|| one_line(&error.to_string()));
        Self {
            url: redact_url(url),
            reason,
        }
    }

    /// Describes a SeaORM connection error met while connecting to `url`.
    pub fn of_db_err(url: &str, error: &sea_orm::DbErr) -> Self {
        match error {
            sea_orm::DbErr::Conn(sea_orm::RuntimeErr::SqlxError(sqlx)) => Self::new(url, sqlx),
            other => Self {
                url: redact_url(url),
                reason: one_line(&other.to_string()),
            },
        }
    }

    /// The one-line reason, without the URL.
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

impl fmt::Display for ConnectFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cannot connect to the database at {}: {}",
            self.url, self.reason
        )
    }
}

impl std::error::Error for ConnectFailure {}

/// A TLS-specific reason for `error`, if it is one.
fn tls_reason(url: &str, error: &sqlx::Error) -> Option<String> {
    match error {
        sqlx::Error::Tls(inner) => {
            if let Some(tls) = rustls_error(inner.as_ref()) {
                return Some(database_reason(url, tls));
            }
            let text = inner.to_string();
            if text.contains("does not support TLS") {
                return Some(
                    "the server does not support TLS, and the URL requires it \
                     (sslmode / ssl-mode); turn TLS on in the server or relax the mode"
                        .into(),
                );
            }
            Some(format!("TLS: {}", one_line(&text)))
        }
        sqlx::Error::Io(io) => {
            if let Some(tls) = io.get_ref().and_then(|inner| rustls_error(inner)) {
                return Some(database_reason(url, tls));
            }
            let files = CertificateFiles::of_url(url);
            let named = [&files.root, &files.client_cert, &files.client_key];
            if io.kind() == std::io::ErrorKind::NotFound && named.iter().any(|f| f.is_some()) {
                let list: Vec<String> = named
                    .iter()
                    .filter_map(|f| f.as_ref().map(|p| p.display().to_string()))
                    .collect();
                return Some(format!(
                    "cannot read a certificate or key file ({}): {io}",
                    list.join(", ")
                ));
            }
            None
        }
        _ => None,
    }
}

/// The rustls error in `error` or in its sources.
fn rustls_error<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    let mut current = Some(error);
    while let Some(error) = current {
        if let Some(tls) = error.downcast_ref::<rustls::Error>() {
            return Some(tls);
        }
        if let Some(io) = error.downcast_ref::<std::io::Error>()
            && let Some(tls) = io
                .get_ref()
                .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        {
            return Some(tls);
        }
        current = error.source();
    }
    None
}

/// What a rustls failure connecting to the database at `url` means.
fn database_reason(url: &str, error: &rustls::Error) -> String {
    let files = CertificateFiles::of_url(url);
    rustls_reason(&host_of(url), &files, &DATABASE_OPTIONS, error)
}

/// What a rustls failure means for the operator.
fn rustls_reason(
    host: &str,
    files: &CertificateFiles,
    names: &OptionNames,
    error: &rustls::Error,
) -> String {
    match error {
        rustls::Error::InvalidCertificate(
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
        ) => format!(
            "TLS: the server's certificate is not valid for the host name in the URL ({host}); {}",
            names.name_mismatch
        ),
        rustls::Error::InvalidCertificate(
            CertificateError::UnknownIssuer | CertificateError::BadSignature,
        ) => format!(
            "TLS: the server's certificate is not trusted by {}",
            files.roots(names)
        ),
        rustls::Error::InvalidCertificate(CertificateError::Expired)
        | rustls::Error::InvalidCertificate(CertificateError::ExpiredContext { .. }) => {
            "TLS: the server's certificate has expired".into()
        }
        rustls::Error::AlertReceived(
            AlertDescription::CertificateRequired
            | AlertDescription::BadCertificate
            | AlertDescription::UnknownCA
            | AlertDescription::CertificateUnknown
            | AlertDescription::AccessDenied,
        ) => match &files.client_cert {
            Some(cert) => format!(
                "TLS: the server refused the client certificate {}",
                cert.display()
            ),
            None => format!(
                "TLS: the server requires a client certificate (set {})",
                names.client
            ),
        },
        other => format!("TLS: {}", one_line(&other.to_string())),
    }
}

/// The host part of `url`, for messages (`?` when it has none).
pub(crate) fn host_of(url: &str) -> String {
    url::Url::parse(url)
        .ok()
        .and_then(|parsed| parsed.host_str().map(str::to_owned))
        .unwrap_or_else(|| "?".into())
}

/// `text` on one line.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_come_from_the_url_under_every_spelling() {
        let files = CertificateFiles::of_url(
            "postgres://u@h/db?sslmode=verify-full&sslrootcert=/ca.pem&ssl-cert=/c.pem&sslkey=/k.pem",
        );
        assert_eq!(files.root, Some("/ca.pem".into()));
        assert_eq!(files.client_cert, Some("/c.pem".into()));
        assert_eq!(files.client_key, Some("/k.pem".into()));
        let mysql = CertificateFiles::of_url("mysql://u@h/db?ssl-mode=VERIFY_CA&ssl-ca=/ca.pem");
        assert_eq!(mysql.root, Some("/ca.pem".into()));
        assert_eq!(mysql.client_cert, None);
    }

    #[test]
    fn the_replication_connection_takes_the_same_mode_and_files() {
        let tls = replication_tls(
            PgSslMode::VerifyFull,
            "postgres://u@h/db?sslrootcert=/ca.pem&sslcert=/c.pem&sslkey=/k.pem",
        );
        assert_eq!(tls.mode, SslMode::VerifyFull);
        assert_eq!(tls.ca_pem_path, Some("/ca.pem".into()));
        assert_eq!(tls.client_cert_pem_path, Some("/c.pem".into()));
        assert_eq!(tls.client_key_pem_path, Some("/k.pem".into()));
        assert_eq!(
            replication_tls(PgSslMode::Prefer, "postgres://u@h/db").mode,
            SslMode::Prefer
        );
        assert_eq!(
            replication_tls(PgSslMode::Disable, "postgres://u@h/db").mode,
            SslMode::Disable
        );
    }

    #[test]
    fn handshake_failures_are_named() {
        let url = "postgres://u:secret@db.internal/x?sslmode=verify-full&sslrootcert=/etc/ca.pem";
        let untrusted = database_reason(
            url,
            &rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer),
        );
        assert!(
            untrusted.contains("not trusted by root certificates from /etc/ca.pem"),
            "{untrusted}"
        );
        let name = database_reason(
            url,
            &rustls::Error::InvalidCertificate(CertificateError::NotValidForName),
        );
        assert!(
            name.contains("not valid for the host name in the URL (db.internal)"),
            "{name}"
        );
        let refused = database_reason(
            "postgres://u@h/x?sslcert=/c.pem&sslkey=/k.pem",
            &rustls::Error::AlertReceived(AlertDescription::BadCertificate),
        );
        assert!(
            refused.contains("refused the client certificate /c.pem"),
            "{refused}"
        );
        for reason in [untrusted, name, refused] {
            assert!(
                !reason.contains("secret") && !reason.contains('\n'),
                "{reason}"
            );
        }
    }

    #[test]
    fn a_rustls_error_is_found_inside_io_errors() {
        let io = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer),
        );
        let failure = ConnectFailure::new("postgres://u@h/x", &sqlx::Error::Io(io));
        assert!(
            failure
                .reason()
                .contains("not trusted by the public root certificates"),
            "{failure}"
        );
        let unsupported = ConnectFailure::new(
            "mysql://u@h/x?ssl-mode=REQUIRED",
            &sqlx::Error::Tls("server does not support TLS".into()),
        );
        assert!(
            unsupported.reason().contains("does not support TLS"),
            "{unsupported}"
        );
    }
}
