//! Serde's `rename_all` rules, applied to field names exactly as serde does.

/// A `#[serde(rename_all = "..")]` rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RenameRule {
    Lower,
    Upper,
    Pascal,
    Camel,
    Snake,
    ScreamingSnake,
    Kebab,
    ScreamingKebab,
}

impl RenameRule {
    /// Parses the rule names serde accepts.
    pub fn from_str(rule: &str) -> Option<Self> {
        Some(match rule {
            "lowercase" => Self::Lower,
            "UPPERCASE" => Self::Upper,
            "PascalCase" => Self::Pascal,
            "camelCase" => Self::Camel,
            "snake_case" => Self::Snake,
            "SCREAMING_SNAKE_CASE" => Self::ScreamingSnake,
            "kebab-case" => Self::Kebab,
            "SCREAMING-KEBAB-CASE" => Self::ScreamingKebab,
            _ => return None,
        })
    }

    /// Renames a snake_case Rust field name.
    pub fn apply_to_field(self, field: &str) -> String {
        match self {
            Self::Lower | Self::Snake => field.to_owned(),
            Self::Upper | Self::ScreamingSnake => field.to_ascii_uppercase(),
            Self::Pascal => {
                let mut pascal = String::new();
                let mut capitalize = true;
                for ch in field.chars() {
                    if ch == '_' {
                        capitalize = true;
                    } else if capitalize {
                        pascal.push(ch.to_ascii_uppercase());
                        capitalize = false;
                    } else {
                        pascal.push(ch);
                    }
                }
                pascal
            }
            Self::Camel => {
                let pascal = Self::Pascal.apply_to_field(field);
                let mut chars = pascal.chars();
                match chars.next() {
                    Some(first) => first.to_ascii_lowercase().to_string() + chars.as_str(),
                    None => pascal,
                }
            }
            Self::Kebab => field.replace('_', "-"),
            Self::ScreamingKebab => field.to_ascii_uppercase().replace('_', "-"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::RenameRule::*;

    #[test]
    fn renames_fields_like_serde() {
        let cases = [
            (Camel, "total_cents", "totalCents"),
            (Pascal, "total_cents", "TotalCents"),
            (ScreamingSnake, "total_cents", "TOTAL_CENTS"),
            (Kebab, "total_cents", "total-cents"),
            (ScreamingKebab, "total_cents", "TOTAL-CENTS"),
            (Upper, "total_cents", "TOTAL_CENTS"),
            (Lower, "total_cents", "total_cents"),
            (Camel, "id", "id"),
        ];
        for (rule, field, expected) in cases {
            assert_eq!(rule.apply_to_field(field), expected, "{rule:?}");
        }
    }
}
