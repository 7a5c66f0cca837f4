//! Serde's `rename_all` rules, applied to field names exactly as serde does.

/// A `#[serde(rename_all = "..")]` rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RenameRule {
    /// `lowercase`
    Lower,
    /// `UPPERCASE`
    Upper,
    /// `PascalCase`
    Pascal,
    /// `camelCase`
    Camel,
    /// `snake_case`
    Snake,
    /// `SCREAMING_SNAKE_CASE`
    ScreamingSnake,
    /// `kebab-case`
    Kebab,
    /// `SCREAMING-KEBAB-CASE`
    ScreamingKebab,
}

impl RenameRule {
    /// Parses the rule names serde accepts.
    pub fn from_name(rule: &str) -> Option<Self> {
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

    /// The rule as written in `#[serde(rename_all = "..")]`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Lower => "lowercase",
            Self::Upper => "UPPERCASE",
            Self::Pascal => "PascalCase",
            Self::Camel => "camelCase",
            Self::Snake => "snake_case",
            Self::ScreamingSnake => "SCREAMING_SNAKE_CASE",
            Self::Kebab => "kebab-case",
            Self::ScreamingKebab => "SCREAMING-KEBAB-CASE",
        }
    }

    /// Renames a PascalCase Rust variant name, as serde does.
    pub fn apply_to_variant(self, variant: &str) -> String {
        match self {
            Self::Pascal => variant.to_owned(),
            Self::Lower => variant.to_ascii_lowercase(),
            Self::Upper => variant.to_ascii_uppercase(),
            Self::Camel => {
                let mut chars = variant.chars();
                match chars.next() {
                    Some(first) => first.to_ascii_lowercase().to_string() + chars.as_str(),
                    None => String::new(),
                }
            }
            Self::Snake => {
                let mut snake = String::new();
                for (i, ch) in variant.char_indices() {
                    if i > 0 && ch.is_uppercase() {
                        snake.push('_');
                    }
                    snake.push(ch.to_ascii_lowercase());
                }
                snake
            }
            Self::ScreamingSnake => Self::Snake.apply_to_variant(variant).to_ascii_uppercase(),
            Self::Kebab => Self::Snake.apply_to_variant(variant).replace('_', "-"),
            Self::ScreamingKebab => Self::ScreamingSnake
                .apply_to_variant(variant)
                .replace('_', "-"),
        }
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

    #[test]
    fn renames_variants_like_serde() {
        let cases = [
            (Camel, "CardPayment", "cardPayment"),
            (Snake, "CardPayment", "card_payment"),
            (ScreamingSnake, "CardPayment", "CARD_PAYMENT"),
            (Kebab, "CardPayment", "card-payment"),
            (ScreamingKebab, "CardPayment", "CARD-PAYMENT"),
            (Lower, "CardPayment", "cardpayment"),
            (Upper, "CardPayment", "CARDPAYMENT"),
            (Pascal, "CardPayment", "CardPayment"),
        ];
        for (rule, variant, expected) in cases {
            assert_eq!(rule.apply_to_variant(variant), expected, "{rule:?}");
        }
        for rule in [
            Lower,
            Upper,
            Pascal,
            Camel,
            Snake,
            ScreamingSnake,
            Kebab,
            ScreamingKebab,
        ] {
            assert_eq!(super::RenameRule::from_name(rule.as_str()), Some(rule));
        }
    }
}
