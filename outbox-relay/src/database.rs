//! Which database a URL names, read once from its scheme.
//!
//! ```
//! use outbox_relay::database::{Backend, DatabaseUrl};
//!
//! let url = DatabaseUrl::parse("mariadb://root@127.0.0.1/test").unwrap();
//! assert_eq!(url.backend(), Backend::MySql);
//! assert_eq!(url.driver_url(), "mysql://root@127.0.0.1/test");
//! assert!(DatabaseUrl::parse("redis://127.0.0.1/0").is_err());
//! ```

use crate::redact::redact_url;

/// A database the relay claims outbox rows from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Backend {
    /// PostgreSQL: `postgres://` or `postgresql://`.
    Postgres,
    /// MariaDB or MySQL: `mysql://` or `mariadb://`.
    MySql,
    /// An SQLite file: `sqlite://` (or `sqlite::memory:`).
    Sqlite,
}

impl Backend {
    /// The backend `url`'s scheme names, if any.
    ///
    /// ```
    /// use outbox_relay::database::Backend;
    ///
    /// assert_eq!(Backend::of("postgresql://db/orders"), Some(Backend::Postgres));
    /// assert_eq!(Backend::of("sqlite://outbox.db"), Some(Backend::Sqlite));
    /// assert_eq!(Backend::of("host=db user=app"), None);
    /// ```
    pub fn of(url: &str) -> Option<Self> {
        match scheme(url)? {
            "postgres" | "postgresql" => Some(Self::Postgres),
            "mysql" | "mariadb" => Some(Self::MySql),
            "sqlite" => Some(Self::Sqlite),
            _ => None,
        }
    }

    /// Whether the database wakes a waiting relay when rows are inserted
    /// (PostgreSQL's `LISTEN`), so that polling is only a fallback.
    pub fn notifies(self) -> bool {
        self == Self::Postgres
    }

    /// Whether several relays can share the database's rows through shard
    /// ownership (not SQLite: one relay per file).
    pub fn shares_work(self) -> bool {
        self != Self::Sqlite
    }
}

/// The scheme of `url` (the part before the first `:`), when it is a
/// well-formed one (letters, digits, `+`, `-`, `.`): safe to show, since
/// it holds no part of a connection string's password.
///
/// ```
/// assert_eq!(outbox_relay::database::scheme("mysql://db/test"), Some("mysql"));
/// assert_eq!(outbox_relay::database::scheme("password=x:y"), None);
/// ```
pub fn scheme(url: &str) -> Option<&str> {
    url.split_once(':')
        .map(|(scheme, _)| scheme)
        .filter(|scheme| {
            !scheme.is_empty()
                && scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
        })
}

/// A database URL whose scheme names a supported [`Backend`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DatabaseUrl {
    backend: Backend,
    url: String,
}

impl DatabaseUrl {
    /// Reads the backend from `url`'s scheme; the rest is left to the
    /// database's driver.
    pub fn parse(url: &str) -> Result<Self, UnsupportedUrl> {
        match Backend::of(url) {
            Some(backend) => Ok(Self {
                backend,
                url: url.to_owned(),
            }),
            None => Err(UnsupportedUrl(redact_url(url))),
        }
    }

    /// The database it names.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The URL as given.
    pub fn as_str(&self) -> &str {
        &self.url
    }

    /// The URL as the database's driver takes it: `mariadb://` is
    /// `mysql://` to sqlx.
    pub fn driver_url(&self) -> String {
        match self.backend {
            Backend::MySql => self.url.replacen("mariadb://", "mysql://", 1),
            Backend::Postgres | Backend::Sqlite => self.url.clone(),
        }
    }
}

/// A URL that names no supported database; holds the URL without its
/// password.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unsupported database URL `{0}`; expected postgres://, mysql:// (or mariadb://) or sqlite://"
)]
pub struct UnsupportedUrl(pub String);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_scheme_of_a_supported_database_is_recognised() {
        for (url, backend) in [
            ("postgres://db/x", Backend::Postgres),
            ("postgresql://db/x", Backend::Postgres),
            ("mysql://db/x", Backend::MySql),
            ("mariadb://db/x", Backend::MySql),
            ("sqlite://outbox.db", Backend::Sqlite),
            ("sqlite::memory:", Backend::Sqlite),
        ] {
            assert_eq!(Backend::of(url), Some(backend), "{url}");
        }
        for url in [
            "",
            "not a url",
            "postgresfoo://db/x",
            "redis://db/0",
            "host=db dbname=x",
            "sqlite",
        ] {
            assert_eq!(Backend::of(url), None, "{url}");
        }
    }

    #[test]
    fn an_unsupported_url_is_named_without_its_password() {
        let error = DatabaseUrl::parse("redis://app:s3cret@db/0").unwrap_err();
        assert!(!error.to_string().contains("s3cret"), "{error}");
        assert!(error.to_string().starts_with("unsupported database URL"));
    }

    #[test]
    fn only_mariadb_urls_are_rewritten_for_the_driver() {
        let url = DatabaseUrl::parse("mariadb://u@db/mariadb://x").unwrap();
        assert_eq!(url.driver_url(), "mysql://u@db/mariadb://x");
        let url = DatabaseUrl::parse("postgres://db/x").unwrap();
        assert_eq!(url.driver_url(), url.as_str());
    }
}
