//! Keeps credentials out of logs and error messages.

/// `url` with its password replaced by `***`; anything that does not parse
/// as a URL is returned up to its scheme only.
pub fn redact_url(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut parsed) => {
            if parsed.password().is_some() {
                // Setting a password fails only for URLs that cannot have one.
                let _ = parsed.set_password(Some("***"));
            }
            parsed.to_string()
        }
        Err(_) => match url.split_once("://") {
            Some((scheme, _)) => format!("{scheme}://…"),
            None => "the given URL".to_owned(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::redact_url;

    #[test]
    fn passwords_never_survive() {
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
    }
}
