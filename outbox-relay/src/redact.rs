//! Keeps credentials out of everything the relay prints: log lines,
//! errors, `status`, usage errors and panics.
//!
//! Two layers work together. *Structured* redaction knows where a
//! credential sits in the forms the relay accepts: a URL's
//! `user:password@`, and a query parameter or `key=value` setting whose key
//! names a secret (`password`, `sslpassword`, `sasl.password`, ...; see
//! [`is_secret_key`]). *Known-value* redaction covers text the relay does
//! not write itself: drivers and clients echo settings in their own words
//! (sqlx warns `ignoring unrecognized connect parameter key=sslpassword
//! value=...`, librdkafka's configuration errors end with the value, SeaORM
//! quotes the whole connection string). The credentials found in the
//! settings at start are [remembered](remember_url_credentials), and
//! [`redact_text`] removes them wherever they appear. The binary sends its
//! log lines through [`RedactingStderr`], its errors through
//! [`redact_text`], and panics through [`install_panic_hook`].
//!
//! ```
//! use outbox_relay::redact::{redact_text, redact_url, remember_setting};
//!
//! assert_eq!(
//!     redact_url("postgres://app@db/orders?password=s3cret&sslmode=require"),
//!     "postgres://app@db/orders?password=***&sslmode=require"
//! );
//! remember_setting("sasl.password", "kafka-s3cret");
//! assert_eq!(
//!     redact_text("Client config error: ... sasl.password kafka-s3cret"),
//!     "Client config error: ... sasl.password ***"
//! );
//! ```

use std::borrow::Cow;
use std::io::Write;
use std::sync::RwLock;

/// What a credential is replaced with.
pub const MASK: &str = "***";

/// Remembered credentials at least this long are removed wherever they
/// appear; shorter ones only where they stand alone (between characters
/// that are not letters or digits), so that a very short password does not
/// blank out every word that contains it.
const MATCH_ANYWHERE_LEN: usize = 6;

/// The credentials found in the settings, longest first.
static KNOWN: RwLock<Vec<String>> = RwLock::new(Vec::new());

/// Whether a setting or URL parameter named `key` holds a secret:
/// passwords (`password`, `sslpassword`, `pass`, `pwd`, `sasl.password`,
/// `ssl.key.password`, ...), secrets, tokens, passphrases and private keys
/// (`ssl.key.pem`, `sasl.oauthbearer.client.secret`,
/// `sasl.oauthbearer.config`). Case is ignored.
pub fn is_secret_key(key: &str) -> bool {
    let key = key.trim().to_ascii_lowercase();
    const PARTS: [&str; 9] = [
        "password",
        "passwd",
        "passphrase",
        "secret",
        "token",
        "credential",
        "apikey",
        "api_key",
        "api-key",
    ];
    if PARTS.iter().any(|part| key.contains(part)) {
        return true;
    }
    let last = key.rsplit(['.', '_', '-']).next().unwrap_or_default();
    matches!(last, "pass" | "pwd" | "pw")
        || key.ends_with("key.pem")
        || key.contains("private.key")
        || matches!(key.as_str(), "ssl_key" | "sasl.oauthbearer.config")
}

/// `url` with its credentials replaced by `***`: the password of
/// `user:password@`, and the value of every query parameter named by
/// [`is_secret_key`]. A libpq-style `key=value` connection string keeps its
/// keys with secret values masked; anything else that does not parse as a
/// URL is shown up to its scheme only.
pub fn redact_url(url: &str) -> String {
    let Ok(mut parsed) = url::Url::parse(url) else {
        if let Some((scheme, _)) = url.split_once("://") {
            return format!("{scheme}://…");
        }
        let is_key_values = url
            .split_whitespace()
            .next()
            .is_some_and(|word| word.split_once('=').is_some_and(|(key, _)| !key.is_empty()));
        return if is_key_values {
            redact_patterns(url).into_owned()
        } else {
            "the given URL".to_owned()
        };
    };
    if parsed.password().is_some() {
        // Setting a password fails only for URLs that cannot have one.
        let _ = parsed.set_password(Some(MASK));
    }
    if let Some(query) = parsed.query() {
        let masked: Vec<String> = query
            .split('&')
            .map(|pair| match pair.split_once('=') {
                Some((key, _)) if is_secret_key(&percent_decode(key)) => format!("{key}={MASK}"),
                _ => pair.to_owned(),
            })
            .collect();
        parsed.set_query(Some(&masked.join("&")));
    }
    // The URL parser accepts oddities (spaces, a second `://` in the path):
    // the patterns catch what hides there.
    redact_patterns(parsed.as_str()).into_owned()
}

/// Remembers the credentials of a database URL (or `key=value` connection
/// string), so that [`redact_text`] removes them from text that drivers
/// write in their own words.
pub fn remember_url_credentials(url: &str) {
    match url::Url::parse(url) {
        Ok(parsed) => {
            if let Some(password) = parsed.password() {
                remember(password);
                remember(&percent_decode(password));
            }
            for pair in parsed.query().unwrap_or_default().split('&') {
                if let Some((key, value)) = pair.split_once('=')
                    && is_secret_key(&percent_decode(key))
                {
                    remember(value);
                    remember(&percent_decode(value));
                }
            }
        }
        Err(_) => {
            // Not a URL: a connection string of `key=value` words, or
            // something unknown whose user:password@ part is still worth
            // hiding.
            for (key, value) in key_values(url) {
                if is_secret_key(key) {
                    remember(value);
                }
            }
            if let Some((_, rest)) = url.split_once("://")
                && let Some((userinfo, _)) = rest.rsplit_once('@')
                && let Some((_, password)) = userinfo.split_once(':')
            {
                remember(password);
                remember(&percent_decode(password));
            }
        }
    }
}

/// Remembers `value` as a credential when the setting `key` holds a
/// secret (see [`is_secret_key`]), for example `-X sasl.password=...`.
pub fn remember_setting(key: &str, value: &str) {
    if is_secret_key(key) {
        remember(value);
    }
}

fn remember(secret: &str) {
    let secret = secret.trim();
    if secret.is_empty() || secret == MASK {
        return;
    }
    // JSON log lines and `{:?}` output escape quotes and backslashes.
    let quoted = serde_json::to_string(secret).unwrap_or_default();
    let escaped = quoted
        .strip_prefix('"')
        .and_then(|quoted| quoted.strip_suffix('"'))
        .unwrap_or(secret);
    let mut known = KNOWN
        .write()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    for form in [secret, escaped] {
        if !known.iter().any(|known| known == form) {
            known.push(form.to_owned());
        }
    }
    // Longest first, so a secret containing another is masked whole.
    known.sort_by_key(|secret| std::cmp::Reverse(secret.len()));
}

/// `text` without credentials: every remembered one is masked, and so is
/// every URL password and every `key=value` whose key names a secret.
pub fn redact_text(text: &str) -> String {
    let known = KNOWN
        .read()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let mut text = Cow::Borrowed(text);
    for secret in known.iter() {
        if let Some(masked) = mask_known(&text, secret) {
            text = Cow::Owned(masked);
        }
    }
    redact_patterns(&text).into_owned()
}

/// `text` with `secret` masked, or `None` when it does not occur.
fn mask_known(text: &str, secret: &str) -> Option<String> {
    if !text.contains(secret) {
        return None;
    }
    if secret.chars().count() >= MATCH_ANYWHERE_LEN {
        return Some(text.replace(secret, MASK));
    }
    let is_word = |c: Option<char>| c.is_some_and(char::is_alphanumeric);
    let mut masked = String::with_capacity(text.len());
    let mut copied = 0;
    for (start, _) in text.match_indices(secret) {
        let end = start + secret.len();
        if start < copied
            || is_word(text[..start].chars().next_back())
            || is_word(text[end..].chars().next())
        {
            continue;
        }
        masked.push_str(&text[copied..start]);
        masked.push_str(MASK);
        copied = end;
    }
    masked.push_str(&text[copied..]);
    Some(masked)
}

/// Masks URL passwords (`scheme://user:password@host`) and the values of
/// `key=value` pairs whose key names a secret, wherever they are in `text`.
fn redact_patterns(text: &str) -> Cow<'_, str> {
    let text = mask_userinfo(text);
    match mask_secret_values(&text) {
        Some(masked) => Cow::Owned(masked),
        None => text,
    }
}

fn mask_userinfo(text: &str) -> Cow<'_, str> {
    let mut masked = String::new();
    let mut copied = 0;
    let mut search = 0;
    while let Some(found) = text[search..].find("://") {
        let authority_start = search + found + 3;
        // The authority ends where the path, query or fragment starts; its
        // last `@` ends the user information (a raw `@` in a password
        // included).
        let authority_len = text[authority_start..]
            .find(|c: char| {
                matches!(c, '/' | '?' | '#' | '\\' | '"' | '\'' | '`' | '<' | '>')
                    || c.is_whitespace()
            })
            .unwrap_or(text.len() - authority_start);
        let authority = &text[authority_start..authority_start + authority_len];
        if let Some(at) = authority.rfind('@')
            && let Some(colon) = authority[..at].find(':')
            && &authority[colon + 1..at] != MASK
        {
            masked.push_str(&text[copied..authority_start + colon + 1]);
            masked.push_str(MASK);
            copied = authority_start + at;
        }
        search = authority_start + authority_len;
    }
    if copied == 0 {
        return Cow::Borrowed(text);
    }
    masked.push_str(&text[copied..]);
    Cow::Owned(masked)
}

fn mask_secret_values(text: &str) -> Option<String> {
    let mut masked = String::new();
    let mut copied = 0;
    for (equals, _) in text.match_indices('=') {
        if equals < copied {
            continue;
        }
        let key_start = text[..equals]
            .rfind(|c: char| !(c.is_alphanumeric() || matches!(c, '.' | '_' | '-')))
            .map_or(0, |before| before + 1);
        let key = &text[key_start..equals];
        if key.is_empty() || !is_secret_key(key) {
            continue;
        }
        let value_start = equals + 1;
        let rest = &text[value_start..];
        let value_len = match rest.chars().next() {
            Some(quote @ ('\'' | '"')) => match rest[1..].find(quote) {
                Some(close) => close + 2,
                None => rest.len(),
            },
            _ => rest
                .find(|c: char| matches!(c, '&' | '"' | '\'' | '`') || c.is_whitespace())
                .unwrap_or(rest.len()),
        };
        // A value that starts masked was a remembered credential.
        if value_len == 0 || rest.starts_with(MASK) {
            continue;
        }
        masked.push_str(&text[copied..value_start]);
        masked.push_str(MASK);
        copied = value_start + value_len;
    }
    if copied == 0 {
        return None;
    }
    masked.push_str(&text[copied..]);
    Some(masked)
}

/// The `key=value` words of a libpq-style connection string, with quotes
/// around values removed.
fn key_values(text: &str) -> Vec<(&str, &str)> {
    let mut pairs = Vec::new();
    let mut rest = text.trim_start();
    while let Some(equals) = rest.find('=') {
        let key = rest[..equals].trim();
        let after = rest[equals + 1..].trim_start();
        let (value, next) = match after.chars().next() {
            Some(quote @ ('\'' | '"')) => match after[1..].find(quote) {
                Some(close) => (&after[1..close + 1], &after[close + 2..]),
                None => (&after[1..], ""),
            },
            _ => {
                let end = after.find(char::is_whitespace).unwrap_or(after.len());
                (&after[..end], &after[end..])
            }
        };
        pairs.push((key, value));
        rest = next.trim_start();
    }
    pairs
}

/// Percent-decodes a URL component (`+` stays as it is).
pub(crate) fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        let hex = bytes
            .get(index + 1..index + 3)
            .and_then(|pair| std::str::from_utf8(pair).ok())
            .and_then(|pair| u8::from_str_radix(pair, 16).ok());
        match (bytes[index], hex) {
            (b'%', Some(byte)) => {
                decoded.push(byte);
                index += 3;
            }
            (byte, _) => {
                decoded.push(byte);
                index += 1;
            }
        }
    }
    String::from_utf8_lossy(&decoded).into_owned()
}

/// Standard error for log lines, each line passed through [`redact_text`].
///
/// ```
/// let logs = tracing_subscriber::fmt()
///     .with_writer(outbox_relay::redact::RedactingStderr);
/// # drop(logs);
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct RedactingStderr;

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for RedactingStderr {
    type Writer = RedactedLine;

    fn make_writer(&'a self) -> Self::Writer {
        RedactedLine(Vec::new())
    }
}

/// One log event, collected and written redacted when dropped.
#[derive(Debug)]
pub struct RedactedLine(Vec<u8>);

impl Write for RedactedLine {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for RedactedLine {
    fn drop(&mut self) {
        if !self.0.is_empty() {
            let line = redact_text(&String::from_utf8_lossy(&self.0));
            let _ = std::io::stderr().lock().write_all(line.as_bytes());
        }
    }
}

/// Replaces the standard panic message with one passed through
/// [`redact_text`] (same shape: thread, location, message, and the
/// backtrace when `RUST_BACKTRACE` asks for it).
pub fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        let payload = info.payload();
        let message = payload
            .downcast_ref::<&str>()
            .copied()
            .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
            .unwrap_or("Box<dyn Any>");
        let thread = std::thread::current();
        let location = info.location().map(ToString::to_string).unwrap_or_default();
        let report = panic_report(
            thread.name().unwrap_or("<unnamed>"),
            &location,
            message,
            &std::backtrace::Backtrace::capture(),
        );
        let _ = std::io::stderr().lock().write_all(report.as_bytes());
    }));
}

fn panic_report(
    thread: &str,
    location: &str,
    message: &str,
    backtrace: &std::backtrace::Backtrace,
) -> String {
    let mut report = format!("thread '{thread}' panicked at {location}:\n{message}\n");
    if backtrace.status() == std::backtrace::BacktraceStatus::Captured {
        report.push_str(&format!("stack backtrace:\n{backtrace}\n"));
    } else {
        report.push_str(
            "note: run with `RUST_BACKTRACE=1` environment variable to display a backtrace\n",
        );
    }
    redact_text(&report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_passwords_never_survive() {
        assert_eq!(
            redact_url("postgres://app:s3cret@db:5432/orders"),
            "postgres://app:***@db:5432/orders"
        );
        assert_eq!(
            redact_url("mysql://root@127.0.0.1/test"),
            "mysql://root@127.0.0.1/test"
        );
        assert!(!redact_url("postgres://app:s3cret@[bad/x").contains("s3cret"));
        assert_eq!(redact_url("sqlite://outbox.db"), "sqlite://outbox.db");
        assert_eq!(
            redact_url("postgres://app:p%40ss%2Fw@db/orders"),
            "postgres://app:***@db/orders"
        );
    }

    #[test]
    fn secret_query_parameters_are_masked_and_others_kept() {
        assert_eq!(
            redact_url("postgres://app@db/orders?password=s3cret&sslmode=require"),
            "postgres://app@db/orders?password=***&sslmode=require"
        );
        assert_eq!(
            redact_url(
                "postgres://db/o?sslpassword=a&PASSWORD=b&pass=c&pwd=d&user=app&options=-c%20x%3Dy"
            ),
            "postgres://db/o?sslpassword=***&PASSWORD=***&pass=***&pwd=***&user=app&options=-c%20x%3Dy"
        );
        assert_eq!(
            redact_url("mysql://root@db/test?pass%77ord=s3cret"),
            "mysql://root@db/test?pass%77ord=***"
        );
        assert_eq!(
            redact_url("mariadb://u:x@db/t?password=y"),
            "mariadb://u:***@db/t?password=***"
        );
    }

    #[test]
    fn key_value_connection_strings_keep_their_keys_only() {
        assert_eq!(
            redact_url("host=db port=5432 user=app password=s3cret dbname=orders"),
            "host=db port=5432 user=app password=*** dbname=orders"
        );
        assert_eq!(
            redact_url("host=db password='with space'"),
            "host=db password=***"
        );
        assert_eq!(redact_url("not a url"), "the given URL");
        assert_eq!(redact_url("redis://u:s3cret@h:1/0"), "redis://u:***@h:1/0");
        assert_eq!(redact_url("weird://u:s3cret@[h/0"), "weird://…");
    }

    #[test]
    fn secret_keys_are_recognised() {
        for key in [
            "password",
            "sslpassword",
            "PASSWORD",
            "pass",
            "pwd",
            "sasl.password",
            "ssl.key.password",
            "ssl.keystore.password",
            "ssl.key.pem",
            "ssl_key",
            "sasl.oauthbearer.client.secret",
            "sasl.oauthbearer.config",
            "sasl.oauthbearer.assertion.private.key.passphrase",
            "sasl.oauthbearer.assertion.private.key.pem",
        ] {
            assert!(is_secret_key(key), "{key}");
        }
        for key in [
            "user",
            "sasl.username",
            "sslmode",
            "host",
            "passage",
            "compression.type",
            "ssl.key.location",
        ] {
            assert!(!is_secret_key(key), "{key}");
        }
    }

    #[test]
    fn patterns_catch_credentials_in_foreign_text() {
        assert_eq!(
            redact_text(
                "The connection string 'host=db password=pw123 user=app' cannot be parsed."
            ),
            "The connection string 'host=db password=*** user=app' cannot be parsed."
        );
        assert_eq!(
            redact_text("has no supporting driver: 'foo://u:pw@db/x' (see \"x://a:b@c\")"),
            "has no supporting driver: 'foo://u:***@db/x' (see \"x://a:***@c\")"
        );
        assert_eq!(
            redact_text("connecting to postgres://u:p@ss@db/x?sslpassword=k&x=1"),
            "connecting to postgres://u:***@db/x?sslpassword=***&x=1"
        );
        assert_eq!(
            redact_text("settings: sasl.password=abc ssl.key.password=\"d e\" x=1"),
            "settings: sasl.password=*** ssl.key.password=*** x=1"
        );
        let clean = "no secrets: a=b, http://host/x, user@host, ratio 1=1";
        assert_eq!(redact_text(clean), clean);
    }

    #[test]
    fn remembered_credentials_are_masked_in_any_words() {
        remember_url_credentials(
            "postgres://app:long%40Secret1@db/x?sslpassword=ssl-Secret-2&sslmode=disable",
        );
        remember_url_credentials("host=db password='dsn Secret 3'");
        remember_setting("sasl.password", "kafka-Secret-4");
        remember_setting("compression.type", "lz4");
        let text = "key=sslpassword value=ssl-Secret-2; long@Secret1 and long%40Secret1; \
                    dsn Secret 3; ssl.key.password kafka-Secret-4; lz4";
        assert_eq!(
            redact_text(text),
            "key=sslpassword value=***; *** and ***; ***; ssl.key.password ***; lz4"
        );
    }

    #[test]
    fn escaped_credentials_are_masked_in_json_and_debug_output() {
        remember_setting("sasl.password", r#"quote"and\back"#);
        let json = serde_json::json!({ "value": r#"quote"and\back"# }).to_string();
        assert_eq!(redact_text(&json), r#"{"value":"***"}"#);
        let debug = format!("{:?}", r#"quote"and\back"#);
        assert_eq!(redact_text(&debug), r#""***""#);
    }

    #[test]
    fn short_credentials_are_masked_where_they_stand_alone() {
        remember_setting("pwd", "Qz7");
        assert_eq!(
            redact_text("value=Qz7 QQz7 Qz7x (Qz7)"),
            "value=*** QQz7 Qz7x (***)"
        );
    }

    #[test]
    fn panic_reports_are_redacted() {
        remember_setting("password", "panicky-Secret-5");
        let report = panic_report(
            "main",
            "src/x.rs:1:2",
            "called `Result::unwrap()` on an `Err` value: \"postgres://u:pw@h/x panicky-Secret-5\"",
            &std::backtrace::Backtrace::disabled(),
        );
        assert!(report.starts_with("thread 'main' panicked at src/x.rs:1:2:\n"));
        assert!(report.contains("postgres://u:***@h/x ***"), "{report}");
        assert!(!report.contains("panicky-Secret-5") && !report.contains(":pw@"));
    }

    #[test]
    fn log_lines_are_redacted_when_written() {
        remember_setting("ssl.key.password", "log-Secret-6");
        let mut line = RedactedLine(Vec::new());
        line.write_all(b"a log line with log-Secret-6\n").unwrap();
        assert_eq!(
            redact_text(&String::from_utf8_lossy(&line.0)),
            "a log line with ***\n"
        );
        line.0.clear();
    }
}
