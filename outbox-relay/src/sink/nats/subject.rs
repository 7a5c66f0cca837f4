//! Subjects: the template that names each message's subject, the reversible
//! encoding that turns any aggregate id (or type) into one subject token,
//! and the check that a stream captures every subject a template names.
//!
//! A NATS subject is a list of tokens separated by `.`; a token may not be
//! empty, hold white space, or be a wildcard (`*`, `>`). An aggregate id may
//! be anything, so each value is encoded as one token:
//!
//! - bytes `!` to `~` (printable ASCII) stay as they are, except `.`, `*`,
//!   `>` and `%`;
//! - every other byte of the value's UTF-8 (those four, space, control
//!   characters, non-ASCII) becomes `%XX`, its value in upper-case hex;
//! - the empty value becomes `%` alone.
//!
//! ```
//! use outbox_relay::sink::nats::subject::{decode_token, encode_token};
//!
//! assert_eq!(encode_token("order-42"), "order-42");
//! assert_eq!(encode_token("a.b c"), "a%2Eb%20c");
//! assert_eq!(encode_token(""), "%");
//! assert_eq!(decode_token("a%2Eb%20c").unwrap(), "a.b c");
//! ```

use std::fmt::Write as _;

/// What stands for the row's aggregate type in a subject template.
pub const AGGREGATE_TYPE_PLACEHOLDER: &str = "{aggregatetype}";
/// What stands for the row's aggregate id in a subject template.
pub const AGGREGATE_ID_PLACEHOLDER: &str = "{aggregateid}";
/// The default subject template.
pub const DEFAULT_TEMPLATE: &str = "outbox.event.{aggregatetype}.{aggregateid}";
/// The longest subject published: past it a message fails for good (the
/// server's protocol line, 4 KiB by default, must hold the subject).
pub const MAX_SUBJECT_BYTES: usize = 1024;

/// The marker of an encoded byte, and alone, of the empty value.
const ESCAPE: u8 = b'%';

/// Whether `byte` stands for itself in a token.
fn kept(byte: u8) -> bool {
    byte.is_ascii_graphic() && !matches!(byte, b'.' | b'*' | b'>' | ESCAPE)
}

/// `value` as one subject token, reversibly (see the module's doc).
pub fn encode_token(value: &str) -> String {
    if value.is_empty() {
        return "%".to_owned();
    }
    let mut token = String::with_capacity(value.len());
    for &byte in value.as_bytes() {
        if kept(byte) {
            token.push(char::from(byte));
        } else {
            let _ = write!(token, "%{byte:02X}");
        }
    }
    token
}

/// A token [`encode_token`] could not have written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not an encoded subject token: {1}")]
pub struct TokenError(String, &'static str);

/// The value [`encode_token`] turned into `token`.
pub fn decode_token(token: &str) -> Result<String, TokenError> {
    let invalid = |why| TokenError(token.to_owned(), why);
    if token == "%" {
        return Ok(String::new());
    }
    let bytes = token.as_bytes();
    let mut value = Vec::with_capacity(bytes.len());
    let mut position = 0;
    while position < bytes.len() {
        let byte = bytes[position];
        if byte == ESCAPE {
            let hex = bytes
                .get(position + 1..position + 3)
                .and_then(|hex| std::str::from_utf8(hex).ok())
                .filter(|hex| hex.bytes().all(|b| b.is_ascii_hexdigit()))
                .ok_or_else(|| invalid("`%` must be followed by two hex digits"))?;
            value.push(u8::from_str_radix(hex, 16).map_err(|_| invalid("bad hex digits"))?);
            position += 3;
        } else if kept(byte) {
            value.push(byte);
            position += 1;
        } else {
            return Err(invalid("it holds a character that is always encoded"));
        }
    }
    String::from_utf8(value).map_err(|_| invalid("the decoded bytes are not UTF-8"))
}

/// A checked subject template: `{aggregatetype}` and `{aggregateid}` stand
/// for the row's values, each encoded as a token.
///
/// ```
/// use outbox_relay::sink::nats::subject::SubjectTemplate;
///
/// let template = SubjectTemplate::parse("outbox.event.{aggregatetype}.{aggregateid}").unwrap();
/// assert_eq!(template.subject("Order", "42"), "outbox.event.Order.42");
/// assert_eq!(template.subject("Order", "a.b"), "outbox.event.Order.a%2Eb");
/// assert_eq!(template.capture(), "outbox.event.>");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubjectTemplate {
    template: String,
}

impl SubjectTemplate {
    /// Checks `template`: tokens separated by single dots, no white space,
    /// no wildcard, no `{..}` but the two placeholders.
    pub fn parse(template: &str) -> Result<Self, String> {
        if template.is_empty() {
            return Err("the subject template is empty".into());
        }
        for token in template.split('.') {
            if token.is_empty() {
                return Err(format!(
                    "the subject template {template:?} has an empty token (a leading, trailing or double dot)"
                ));
            }
            let literal = token
                .replace(AGGREGATE_TYPE_PLACEHOLDER, "")
                .replace(AGGREGATE_ID_PLACEHOLDER, "");
            if literal.contains(['{', '}']) {
                return Err(format!(
                    "the subject template {template:?} has a placeholder other than \
                     {AGGREGATE_TYPE_PLACEHOLDER} and {AGGREGATE_ID_PLACEHOLDER}"
                ));
            }
            if literal
                .chars()
                .any(|c| c.is_whitespace() || c.is_control() || c == '*' || c == '>')
            {
                return Err(format!(
                    "the subject template {template:?} holds white space or a wildcard (`*`, `>`)"
                ));
            }
        }
        Ok(Self {
            template: template.to_owned(),
        })
    }

    /// The template as given.
    pub fn as_str(&self) -> &str {
        &self.template
    }

    /// The subject of one aggregate's events.
    pub fn subject(&self, aggregate_type: &str, aggregate_id: &str) -> String {
        self.template
            .replace(AGGREGATE_TYPE_PLACEHOLDER, &encode_token(aggregate_type))
            .replace(AGGREGATE_ID_PLACEHOLDER, &encode_token(aggregate_id))
    }

    /// Every subject the template names, as a filter: each token holding a
    /// placeholder becomes `*`.
    pub fn pattern(&self) -> String {
        self.template
            .split('.')
            .map(|token| if has_placeholder(token) { "*" } else { token })
            .collect::<Vec<_>>()
            .join(".")
    }

    /// What a stream created for the template captures: its tokens up to
    /// the first placeholder, then `>` (`outbox.event.>`); the
    /// [`pattern`](Self::pattern) when the first token holds a placeholder.
    pub fn capture(&self) -> String {
        let prefix: Vec<&str> = self
            .template
            .split('.')
            .take_while(|token| !has_placeholder(token))
            .collect();
        if prefix.is_empty() {
            return self.pattern();
        }
        if prefix.len() == self.template.split('.').count() {
            return self.template.clone();
        }
        format!("{}.>", prefix.join("."))
    }
}

fn has_placeholder(token: &str) -> bool {
    token.contains(AGGREGATE_TYPE_PLACEHOLDER) || token.contains(AGGREGATE_ID_PLACEHOLDER)
}

/// Whether the stream subject `filter` captures every subject `pattern`
/// matches (`*` one token, `>` one or more trailing tokens).
///
/// ```
/// use outbox_relay::sink::nats::subject::covers;
///
/// assert!(covers("outbox.event.>", "outbox.event.*.*"));
/// assert!(covers("outbox.*.*.*", "outbox.event.*.*"));
/// assert!(!covers("outbox.event.Order.*", "outbox.event.*.*"));
/// ```
pub fn covers(filter: &str, pattern: &str) -> bool {
    let mut filter = filter.split('.');
    let mut pattern = pattern.split('.');
    loop {
        match (filter.next(), pattern.next()) {
            (Some(">"), Some(_)) => return true,
            (Some("*"), Some(token)) if token != ">" => {}
            (Some(literal), Some(token)) if literal == token && token != "*" && token != ">" => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_special_character_round_trips_into_one_token() {
        let values = [
            "",
            ".",
            "..",
            "a.b",
            " ",
            "a b",
            "*",
            ">",
            "a*b",
            "a>b",
            "%",
            "%25",
            "%2E",
            "\t",
            "\r\n",
            "\0",
            "\u{7f}",
            "\u{1b}[0m",
            "é",
            "注文-42",
            "🦀",
            "$JS.API",
            "_INBOX.x",
            "order-42",
        ];
        for value in values {
            let token = encode_token(value);
            assert!(!token.is_empty(), "{value:?}");
            assert!(
                token.bytes().all(|b| b.is_ascii_graphic() && b != b'.'),
                "{value:?} -> {token:?}"
            );
            assert!(token != "*" && token != ">", "{value:?}");
            assert_eq!(decode_token(&token).unwrap(), value, "{token:?}");
        }
        // Every byte that is not kept is escaped, and every kept one is not.
        for byte in 0u8..=127 {
            let value = char::from(byte).to_string();
            let token = encode_token(&value);
            if kept(byte) {
                assert_eq!(token, value);
            } else {
                assert_eq!(token, format!("%{byte:02X}"));
            }
            assert_eq!(decode_token(&token).unwrap(), value);
        }
        assert_eq!(encode_token("a.b c*>%"), "a%2Eb%20c%2A%3E%25");
        assert_eq!(encode_token("é"), "%C3%A9");
    }

    #[test]
    fn distinct_values_have_distinct_tokens() {
        let values = ["", "%", "%25", "a.b", "a%2Eb", "a b", "a%20b"];
        let tokens: std::collections::HashSet<String> =
            values.iter().map(|value| encode_token(value)).collect();
        assert_eq!(tokens.len(), values.len());
    }

    #[test]
    fn tokens_the_encoding_never_writes_are_refused() {
        for token in ["%2", "%zz", "a.b", "a b", "*", "%%", "%C3"] {
            assert!(decode_token(token).is_err(), "{token:?}");
        }
    }

    #[test]
    fn templates_are_checked_and_filled() {
        let template = SubjectTemplate::parse(DEFAULT_TEMPLATE).unwrap();
        assert_eq!(
            template.subject("Order", "a.b c"),
            "outbox.event.Order.a%2Eb%20c"
        );
        assert_eq!(
            template.subject("com.acme.Order", ""),
            "outbox.event.com%2Eacme%2EOrder.%"
        );
        assert_eq!(template.pattern(), "outbox.event.*.*");
        assert_eq!(template.capture(), "outbox.event.>");
        let bare = SubjectTemplate::parse("{aggregatetype}.{aggregateid}").unwrap();
        assert_eq!(bare.capture(), "*.*");
        let fixed = SubjectTemplate::parse("events.all").unwrap();
        assert_eq!(fixed.capture(), "events.all");
        let mixed = SubjectTemplate::parse("ev.x-{aggregatetype}.{aggregateid}.v1").unwrap();
        assert_eq!(mixed.pattern(), "ev.*.*.v1");
        assert_eq!(mixed.subject("A", "1"), "ev.x-A.1.v1");
        for bad in [
            "",
            "outbox..{aggregateid}",
            ".outbox",
            "outbox.",
            "outbox.*.{aggregateid}",
            "outbox.>",
            "out box.{aggregateid}",
            "outbox.{aggregate_id}",
        ] {
            assert!(SubjectTemplate::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_filter_covers_a_pattern_only_when_it_captures_all_of_it() {
        assert!(covers(">", "outbox.event.*.*"));
        assert!(covers("outbox.event.>", "outbox.event.*.*"));
        assert!(covers("outbox.event.*.*", "outbox.event.*.*"));
        assert!(covers("*.event.*.>", "outbox.event.*.*"));
        assert!(!covers("outbox.event.*", "outbox.event.*.*"));
        assert!(!covers("outbox.event.*.*.*", "outbox.event.*.*"));
        assert!(!covers("outbox.event.Order.>", "outbox.event.*.*"));
        assert!(!covers("outbox.event.>", "outbox.event"));
        assert!(!covers("other.>", "outbox.event.*.*"));
        assert!(covers("events.all", "events.all"));
    }
}
