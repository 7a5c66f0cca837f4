//! The derive's attributes, parsed into a typed model: our own
//! `#[domain_event(..)]` and the serde attributes that shape the payload.

use proc_macro2::{Span, TokenStream};
use quote::ToTokens;
use syn::meta::ParseNestedMeta;
use syn::spanned::Spanned;
use syn::{Attribute, Expr, Ident, Lit, LitStr, Meta, Token};

use crate::case::RenameRule;
use crate::ctxt::Ctxt;
use crate::schema_lock::Compat;

/// `#[domain_event(aggregate = "..", version = N, name = "..")]`, checked.
pub struct EventAttrs {
    /// The aggregate type.
    pub aggregate: String,
    /// The payload version, at least 1.
    pub version: u32,
    /// The event type: `name = ".."`, else the struct name.
    pub name: String,
    /// Where `aggregate = ".."` is written, for errors about the aggregate.
    pub aggregate_span: Span,
    /// Where `version = N` is written, for errors about the version.
    pub version_span: Span,
    /// The first `#[domain_event(..)]`, for errors about the event as a whole.
    pub attribute: TokenStream,
    /// `compat = ".."`: the event's own compatibility rule, over the lock's.
    pub compat: Option<Compat>,
}

/// The example every message about the attribute as a whole shows.
const ATTRIBUTE_EXAMPLE: &str = "#[domain_event(aggregate = \"...\", version = 1)]";

/// One key of `#[domain_event(..)]`, as read.
enum Given<T> {
    Absent,
    Valid(T),
    /// Written, but wrong; that is already reported.
    Reported,
}

/// The keys of every `#[domain_event(..)]` on a struct, each checked as it
/// is read so errors come out in source order.
struct RawEventAttrs<'a> {
    /// The first `#[domain_event]`, where a missing key belongs.
    first: Option<&'a Attribute>,
    aggregate: Given<(String, Span)>,
    version: Given<(u32, Span)>,
    name: Given<String>,
    compat: Given<Compat>,
    /// A syntax error stopped reading an attribute, so a key that looks
    /// missing may only be unread.
    unreadable: bool,
}

impl EventAttrs {
    /// Reads and checks the `domain_event` attributes of the struct `ident`.
    /// Returns `None` when an error was recorded.
    pub fn from_attrs(cx: &Ctxt, ident: &Ident, attrs: &[Attribute]) -> Option<Self> {
        let raw = RawEventAttrs::read(cx, attrs);
        let Some(first) = raw.first else {
            cx.error_spanned_by(
                ident,
                format!(
                    "missing {ATTRIBUTE_EXAMPLE} on the event struct: DomainEvent needs the \
                     aggregate the event belongs to and the version of its payload"
                ),
            );
            return None;
        };
        let missing = |key: &str, message: &str| {
            if !raw.unreadable {
                cx.error_spanned_by(first, format!("missing `{key}`: {message}"));
            }
        };

        let aggregate = match raw.aggregate {
            Given::Valid(aggregate) => Some(aggregate),
            Given::Absent => {
                missing(
                    "aggregate",
                    "add `aggregate = \"...\"` to #[domain_event(..)], naming the aggregate \
                     this event belongs to",
                );
                None
            }
            Given::Reported => None,
        };
        let version = match raw.version {
            Given::Valid(version) => Some(version),
            Given::Absent => {
                missing(
                    "version",
                    "add `version = 1` to #[domain_event(..)] and bump it whenever the \
                     payload changes in a way old readers cannot handle",
                );
                None
            }
            Given::Reported => None,
        };
        let name = match raw.name {
            Given::Valid(name) => Some(name),
            Given::Absent => Some(unraw(ident)),
            Given::Reported => None,
        };
        let (aggregate, aggregate_span) = aggregate?;
        let (version, version_span) = version?;
        let compat = match raw.compat {
            Given::Valid(compat) => Some(compat),
            Given::Absent => None,
            Given::Reported => return None,
        };
        Some(Self {
            aggregate,
            version,
            name: name?,
            aggregate_span,
            version_span,
            attribute: first.to_token_stream(),
            compat,
        })
    }
}

impl<'a> RawEventAttrs<'a> {
    /// Reads every `#[domain_event(..)]`, reporting unknown, duplicate,
    /// valueless and invalid keys but reading on past them.
    fn read(cx: &Ctxt, attrs: &'a [Attribute]) -> Self {
        let mut raw = Self {
            first: None,
            aggregate: Given::Absent,
            version: Given::Absent,
            name: Given::Absent,
            compat: Given::Absent,
            unreadable: false,
        };
        for attr in attrs
            .iter()
            .filter(|attr| attr.path().is_ident("domain_event"))
        {
            raw.first.get_or_insert(attr);
            if !matches!(attr.meta, Meta::List(_)) {
                cx.error_spanned_by(
                    attr,
                    format!("#[domain_event] takes arguments: {ATTRIBUTE_EXAMPLE}"),
                );
                raw.unreadable = true;
                continue;
            }
            let result = attr.parse_nested_meta(|meta| {
                if meta.path.is_ident("aggregate") {
                    read_key(
                        cx,
                        &meta,
                        "aggregate = \"Order\"",
                        &mut raw.aggregate,
                        |expr| {
                            non_empty_str(
                                cx,
                                expr,
                                "aggregate",
                                "name the aggregate this event belongs to",
                            )
                            .map(|aggregate| (aggregate, expr.span()))
                        },
                    )
                } else if meta.path.is_ident("version") {
                    read_key(cx, &meta, "version = 1", &mut raw.version, |expr| {
                        version(cx, expr).map(|version| (version, expr.span()))
                    })
                } else if meta.path.is_ident("name") {
                    read_key(cx, &meta, "name = \"OrderPlaced\"", &mut raw.name, |expr| {
                        non_empty_str(cx, expr, "name", "omit `name` to use the struct name")
                    })
                } else if meta.path.is_ident("compat") {
                    read_key(cx, &meta, "compat = \"full\"", &mut raw.compat, |expr| {
                        compat(cx, expr)
                    })
                } else {
                    let key = meta.path.to_token_stream().to_string().replace(' ', "");
                    cx.error_spanned_by(
                        &meta.path,
                        format!(
                            "unknown domain_event attribute `{key}`; expected `aggregate`, \
                             `version`, `name` or `compat`{}",
                            unknown_key_hint(&key)
                        ),
                    );
                    skip_value(&meta)
                }
            });
            if let Err(error) = result {
                cx.syn_error(error);
                raw.unreadable = true;
            }
        }
        raw
    }
}

/// A pointer to what a user writing `key` most likely wants.
fn unknown_key_hint(key: &str) -> String {
    use outbox_contract::topic;
    match key {
        "topic" => format!(
            " (the Kafka topic follows from `aggregate`: `{}` by default, configured in the relay)",
            topic::for_aggregate(topic::DEFAULT_TEMPLATE, "<aggregate>")
        ),
        "type" | "event_type" | "r#type" => " (`name` sets the event type)".to_owned(),
        _ => String::new(),
    }
}

/// Reads `key = value` into `slot` unless it is already set, checking the
/// value with `check`. `example` shows the key with a value.
fn read_key<T>(
    cx: &Ctxt,
    meta: &ParseNestedMeta<'_>,
    example: &str,
    slot: &mut Given<T>,
    check: impl FnOnce(&Expr) -> Option<T>,
) -> syn::Result<()> {
    let key = meta.path.to_token_stream();
    if !matches!(slot, Given::Absent) {
        skip_value(meta)?;
        cx.error_spanned_by(
            &meta.path,
            format!("duplicate `{key}` in #[domain_event(..)]; keep only one"),
        );
        return Ok(());
    }
    *slot = if meta.input.peek(Token![=]) {
        let expr: Expr = meta.value()?.parse()?;
        check(&expr).map_or(Given::Reported, Given::Valid)
    } else {
        skip_value(meta)?;
        cx.error_spanned_by(&meta.path, format!("`{key}` needs a value: `{example}`"));
        Given::Reported
    };
    Ok(())
}

/// The value of a `key = ".."` that must be a non-empty string.
fn non_empty_str(cx: &Ctxt, expr: &Expr, key: &str, fix: &str) -> Option<String> {
    match expr_lit(expr) {
        Some(Lit::Str(lit)) if lit.value().trim().is_empty() => {
            cx.error_spanned_by(lit, format!("`{key}` must not be empty; {fix}"));
            None
        }
        Some(Lit::Str(lit)) => Some(lit.value()),
        _ => {
            let example = match expr {
                Expr::Path(path) => path.to_token_stream().to_string().replace(' ', ""),
                _ => "...".to_owned(),
            };
            cx.error_spanned_by(
                expr,
                format!("`{key}` must be a string literal: `{key} = \"{example}\"`"),
            );
            None
        }
    }
}

/// The value of `compat = ".."`: `backward` or `full`.
fn compat(cx: &Ctxt, expr: &Expr) -> Option<Compat> {
    let given = match expr_lit(expr) {
        Some(Lit::Str(lit)) => lit.value(),
        _ => String::new(),
    };
    if let Some(compat) = Compat::parse(given.trim()) {
        return Some(compat);
    }
    let forward = if given.trim().starts_with("forward") {
        "; FORWARD alone is not offered: consumers decode old and new payloads of a version \
         with one struct, so every rule includes BACKWARD"
    } else {
        ""
    };
    cx.error_spanned_by(
        expr,
        format!(
            "`compat` is \"backward\" (the default: new variants allowed) or \"full\" (a new \
             enum variant needs a new version){forward}"
        ),
    );
    None
}

/// The value of `version = N`: an integer from 1 to `u32::MAX`.
fn version(cx: &Ctxt, expr: &Expr) -> Option<u32> {
    let message = match expr_lit(expr) {
        Some(Lit::Int(lit)) => match lit.base10_parse::<u32>() {
            Ok(0) => "`version` starts at 1: use `version = 1`".to_owned(),
            Ok(version) => return Some(version),
            Err(_) => VERSION_RANGE.to_owned(),
        },
        Some(Lit::Str(lit)) => match lit.value().trim().parse::<u32>() {
            Ok(version) if version > 0 => {
                format!("`version` must be an integer, not a string: `version = {version}`")
            }
            _ => VERSION_RANGE.to_owned(),
        },
        _ => VERSION_RANGE.to_owned(),
    };
    cx.error_spanned_by(expr, message);
    None
}

/// What `version` accepts, for every value outside it.
const VERSION_RANGE: &str = "`version` must be an integer from 1 to 4294967295, like `version = 2`";

/// The literal `expr` is, if it is one.
fn expr_lit(expr: &Expr) -> Option<&Lit> {
    match expr {
        Expr::Lit(lit) => Some(&lit.lit),
        Expr::Group(group) => expr_lit(&group.expr),
        _ => None,
    }
}

/// `#[domain_event(opaque)]` on a field of an event or payload type.
#[derive(Default)]
pub struct FieldAttrs {
    /// Compare the field by its type's name only: for types from other
    /// crates that implement neither a well-known serde shape nor
    /// `EventPayload`.
    pub opaque: bool,
}

/// What every misplaced `#[domain_event(..)]` on a field is told.
const FIELD_ATTRIBUTE_HELP: &str = "#[domain_event(..)] belongs on the event struct, not on a \
     field; on a field it only takes `opaque`, and #[serde(rename = \"..\")] or #[serde(skip)] \
     shape a field";

impl FieldAttrs {
    /// Reads `#[domain_event(..)]` on a field, reporting anything but `opaque`.
    pub fn from_attrs(cx: &Ctxt, attrs: &[Attribute]) -> Self {
        let mut field = Self::default();
        for attr in attrs
            .iter()
            .filter(|attr| attr.path().is_ident("domain_event"))
        {
            let mut misplaced = !matches!(attr.meta, Meta::List(_));
            if !misplaced {
                let result = attr.parse_nested_meta(|meta| {
                    if meta.path.is_ident("opaque")
                        && !meta.input.peek(Token![=])
                        && !meta.input.peek(syn::token::Paren)
                    {
                        field.opaque = true;
                    } else {
                        misplaced = true;
                        skip_value(&meta)?;
                    }
                    Ok(())
                });
                misplaced |= result.is_err();
            }
            if misplaced {
                cx.error_spanned_by(attr, FIELD_ATTRIBUTE_HELP);
            }
        }
        field
    }
}

/// The serde attributes of a struct or enum that change the payload's shape.
#[derive(Default)]
pub struct SerdeContainer {
    /// `rename_all = ".."`, if serde knows the rule.
    pub rename_all: Option<RenameRule>,
    /// Where `rename_all` is written, for errors about a changed rule.
    pub rename_all_span: Option<Span>,
    /// `default` on the container: a reader fills in every missing field.
    pub default: bool,
    /// Where `transparent` is written, if it is.
    pub transparent: Option<Span>,
    /// `tag = ".."` of an internally or adjacently tagged enum.
    pub tag: Option<String>,
    /// `content = ".."` of an adjacently tagged enum.
    pub content: Option<String>,
    /// `untagged` on an enum.
    pub untagged: bool,
    /// Attributes the contract does not model, to refuse.
    pub refused: Vec<Refused>,
}

/// A serde attribute that changes what is written or what a reader
/// accepts in a way the contract does not model: refused at compile time
/// rather than ignored.
#[derive(Debug, Clone)]
pub struct Refused {
    /// Where it is written.
    pub span: Span,
    /// Its key (`deny_unknown_fields`).
    pub key: &'static str,
    /// Why, and what to do instead.
    pub fix: &'static str,
    /// Whether `#[domain_event(opaque)]` on the field makes it acceptable.
    pub opaque_allows: bool,
}

/// What is wrong with `with`, `serialize_with` and `deserialize_with`.
const WITH_FIX: &str = "the contract cannot see the JSON a function writes or reads; give the \
     field a type that derives Serialize and Deserialize, or mark it #[domain_event(opaque)] \
     to accept any JSON there";
/// What is wrong with reading or writing through another type.
const FROM_FIX: &str = "the payload would be read through another type, whose shape the \
     contract does not see; derive Deserialize on this type itself";

/// Container attributes refused, with the fix each error shows.
/// (`opaque` is a field attribute, so it never allows one of these.)
const CONTAINER_REFUSED: [(&str, &str, bool); 8] = [
    (
        "deny_unknown_fields",
        "a reader that denies unknown fields breaks on every field a later version adds; \
         remove it (readers ignore fields they do not know)",
        false,
    ),
    ("from", FROM_FIX, false),
    ("try_from", FROM_FIX, false),
    (
        "into",
        "the payload would be written as another type, whose shape the contract does not \
         see; derive Serialize on this type itself",
        false,
    ),
    (
        "remote",
        "a definition of a remote type is not a payload; derive on the payload type itself",
        false,
    ),
    (
        "rename_all_fields",
        "it renames the fields of every struct variant, which the contract does not model; \
         put #[serde(rename_all = \"...\")] on each variant instead",
        false,
    ),
    (
        "variant_identifier",
        "an identifier enum is not a payload shape; use a plain enum",
        false,
    ),
    (
        "field_identifier",
        "an identifier enum is not a payload shape; use a plain enum",
        false,
    ),
];

/// Field and variant attributes refused, with the fix each error shows and
/// whether `opaque` makes them acceptable.
const FIELD_REFUSED: [(&str, &str, bool); 6] = [
    ("with", WITH_FIX, true),
    ("serialize_with", WITH_FIX, true),
    ("deserialize_with", WITH_FIX, true),
    (
        "skip_deserializing",
        "readers would ignore a key writers send and fill in a default; use \
         #[serde(default)] instead",
        false,
    ),
    (
        "getter",
        "it belongs to definitions of remote types; remove it",
        false,
    ),
    (
        "untagged",
        "an untagged variant is written without its name, which the contract does not \
         model; remove it",
        false,
    ),
];

fn refused_key(
    meta: &ParseNestedMeta<'_>,
    table: &[(&'static str, &'static str, bool)],
) -> Option<Refused> {
    table
        .iter()
        .find(|(key, _, _)| meta.path.is_ident(key))
        .map(|(key, fix, opaque_allows)| Refused {
            span: meta.path.span(),
            key,
            fix,
            opaque_allows: *opaque_allows,
        })
}

impl SerdeContainer {
    /// Reads `#[serde(..)]` on the struct. Malformed serde attributes are
    /// serde's to report, so unknown keys are skipped silently.
    pub fn from_attrs(attrs: &[Attribute]) -> Self {
        let mut container = Self::default();
        for_each_serde_meta(attrs, |meta| {
            if meta.path.is_ident("rename_all") {
                container.rename_all_span = Some(meta.path.span());
                if let Some(rule) = serialize_name(meta)? {
                    container.rename_all = RenameRule::from_name(&rule);
                }
            } else if meta.path.is_ident("default") {
                container.default = true;
                skip_value(meta)?;
            } else if meta.path.is_ident("transparent") {
                container.transparent = Some(meta.path.span());
            } else if meta.path.is_ident("tag") {
                container.tag = Some(meta.value()?.parse::<LitStr>()?.value());
            } else if meta.path.is_ident("content") {
                container.content = Some(meta.value()?.parse::<LitStr>()?.value());
            } else if meta.path.is_ident("untagged") {
                container.untagged = true;
            } else {
                container
                    .refused
                    .extend(refused_key(meta, &CONTAINER_REFUSED));
                skip_value(meta)?;
            }
            Ok(())
        });
        container
    }
}

/// The serde attributes of one field or enum variant that change the
/// payload's shape.
#[derive(Default)]
pub struct SerdeField {
    /// The serialized name from `rename`.
    pub rename: Option<String>,
    /// `default`: a reader fills the field in when missing.
    pub default: bool,
    /// `skip` or `skip_serializing`: serde never writes it.
    pub skip_serializing: bool,
    /// `flatten`: its fields appear inline.
    pub flatten: bool,
    /// `rename_all` on an enum variant, for the fields of a struct variant.
    pub rename_all: Option<RenameRule>,
    /// Where `skip_serializing_if` is written: the key may be left out.
    pub skip_serializing_if: Option<Span>,
    /// `other` on a unit variant: readers read any variant they do not
    /// know as this one.
    pub other: bool,
    /// `alias = ".."`: other names readers accept.
    pub aliases: Vec<String>,
    /// Attributes the contract does not model, to refuse.
    pub refused: Vec<Refused>,
}

impl SerdeField {
    /// Reads `#[serde(..)]` on a field, skipping what does not shape the payload.
    pub fn from_attrs(attrs: &[Attribute]) -> Self {
        let mut field = Self::default();
        for_each_serde_meta(attrs, |meta| {
            if meta.path.is_ident("rename") {
                field.rename = serialize_name(meta)?;
            } else if meta.path.is_ident("default") {
                field.default = true;
                skip_value(meta)?;
            } else if meta.path.is_ident("skip") || meta.path.is_ident("skip_serializing") {
                field.skip_serializing = true;
            } else if meta.path.is_ident("flatten") {
                field.flatten = true;
            } else if meta.path.is_ident("rename_all") {
                if let Some(rule) = serialize_name(meta)? {
                    field.rename_all = RenameRule::from_name(&rule);
                }
            } else if meta.path.is_ident("skip_serializing_if") {
                field.skip_serializing_if = Some(meta.path.span());
                skip_value(meta)?;
            } else if meta.path.is_ident("other") {
                field.other = true;
            } else if meta.path.is_ident("alias") {
                field.aliases.push(meta.value()?.parse::<LitStr>()?.value());
            } else {
                field.refused.extend(refused_key(meta, &FIELD_REFUSED));
                skip_value(meta)?;
            }
            Ok(())
        });
        field
    }
}

fn for_each_serde_meta(
    attrs: &[Attribute],
    mut visit: impl FnMut(&ParseNestedMeta<'_>) -> syn::Result<()>,
) {
    for attr in attrs.iter().filter(|attr| attr.path().is_ident("serde")) {
        // serde reports its own malformed attributes.
        let _ = attr.parse_nested_meta(|meta| visit(&meta));
    }
}

/// The serialized name of `rename = ".."` or `rename(serialize = "..")`.
fn serialize_name(meta: &ParseNestedMeta<'_>) -> syn::Result<Option<String>> {
    if meta.input.peek(Token![=]) {
        let lit: LitStr = meta.value()?.parse()?;
        return Ok(Some(lit.value()));
    }
    let mut name = None;
    meta.parse_nested_meta(|inner| {
        let lit: LitStr = inner.value()?.parse()?;
        if inner.path.is_ident("serialize") {
            name = Some(lit.value());
        }
        Ok(())
    })?;
    Ok(name)
}

/// Consumes `= value` or `(..)` after a key we do not interpret.
fn skip_value(meta: &ParseNestedMeta<'_>) -> syn::Result<()> {
    if meta.input.peek(Token![=]) {
        meta.value()?.parse::<Expr>()?;
    } else if meta.input.peek(syn::token::Paren) {
        meta.input.parse::<proc_macro2::Group>()?;
    }
    Ok(())
}

/// An identifier without its `r#` prefix, as serde names it.
pub fn unraw(ident: &Ident) -> String {
    let name = ident.to_string();
    name.strip_prefix("r#").map(str::to_owned).unwrap_or(name)
}

#[cfg(test)]
mod tests {
    use syn::{DeriveInput, parse_quote};

    use super::*;

    /// The checked attributes of `input`, or the messages of every error.
    fn read(input: DeriveInput) -> Result<EventAttrs, Vec<String>> {
        let cx = Ctxt::default();
        let attrs = EventAttrs::from_attrs(&cx, &input.ident, &input.attrs);
        match cx.check() {
            Ok(()) => Ok(attrs.expect("no error was recorded")),
            Err(errors) => Err(errors.iter().map(ToString::to_string).collect()),
        }
    }

    fn version_of(value: Expr) -> Result<u32, Vec<String>> {
        read(parse_quote! {
            #[domain_event(aggregate = "Order", version = #value)]
            struct OrderPlaced {}
        })
        .map(|attrs| attrs.version)
    }

    #[test]
    fn reads_every_key_and_defaults_the_name_to_the_struct() {
        let attrs = read(parse_quote! {
            #[domain_event(aggregate = "Order", version = 2)]
            struct r#OrderPlaced {}
        })
        .unwrap();
        assert_eq!(attrs.aggregate, "Order");
        assert_eq!(attrs.version, 2);
        assert_eq!(attrs.name, "OrderPlaced");

        let attrs = read(parse_quote! {
            #[domain_event(name = "order.placed")]
            #[domain_event(aggregate = "Order", version = 1)]
            struct OrderPlaced {}
        })
        .unwrap();
        assert_eq!(attrs.name, "order.placed");
    }

    #[test]
    fn accepts_versions_from_one_to_u32_max() {
        assert_eq!(version_of(parse_quote!(1)), Ok(1));
        assert_eq!(version_of(parse_quote!(4294967295)), Ok(u32::MAX));
        assert_eq!(version_of(parse_quote!(7u32)), Ok(7));
        for rejected in [
            parse_quote!(0),
            parse_quote!(4294967296),
            parse_quote!(-1),
            parse_quote!(1.5),
            parse_quote!(V2),
            parse_quote!("2"),
        ] {
            let errors = version_of(rejected).unwrap_err();
            assert_eq!(errors.len(), 1, "{errors:?}");
        }
        assert_eq!(
            version_of(parse_quote!("2")).unwrap_err(),
            ["`version` must be an integer, not a string: `version = 2`"]
        );
    }

    #[test]
    fn reports_every_bad_key_in_source_order() {
        let errors = read(parse_quote! {
            #[domain_event(aggregate = "", version = 0, topic = "t", name = "A", name = "B")]
            struct OrderPlaced {}
        })
        .err()
        .unwrap();
        let starts: Vec<&str> = errors
            .iter()
            .map(|error| error.split(';').next().unwrap())
            .collect();
        assert_eq!(
            starts,
            [
                "`aggregate` must not be empty",
                "`version` starts at 1: use `version = 1`",
                "unknown domain_event attribute `topic`",
                "duplicate `name` in #[domain_event(..)]",
            ]
        );
    }

    #[test]
    fn reports_missing_keys_only_when_the_attribute_was_read() {
        let errors = read(parse_quote! {
            #[domain_event(name = "Placed")]
            struct OrderPlaced {}
        })
        .err()
        .unwrap();
        assert_eq!(errors.len(), 2);
        assert!(errors[0].starts_with("missing `aggregate`"), "{errors:?}");
        assert!(errors[1].starts_with("missing `version`"), "{errors:?}");

        // A syntax error hides what follows it, so nothing is called missing.
        let errors = read(parse_quote! {
            #[domain_event(version = 1 aggregate = "Order")]
            struct OrderPlaced {}
        })
        .err()
        .unwrap();
        assert_eq!(errors, ["expected `,`"]);
    }

    #[test]
    fn reads_on_past_keys_without_values() {
        let errors = read(parse_quote! {
            #[domain_event(aggregate, version(2), unknown(a b c), name = "")]
            struct OrderPlaced {}
        })
        .err()
        .unwrap();
        assert_eq!(errors.len(), 4, "{errors:?}");
        assert_eq!(
            errors[0],
            "`aggregate` needs a value: `aggregate = \"Order\"`"
        );
        assert_eq!(errors[1], "`version` needs a value: `version = 1`");
        assert!(errors[3].starts_with("`name` must not be empty"));
    }

    #[test]
    fn suggests_the_string_a_bare_word_meant() {
        let errors = read(parse_quote! {
            #[domain_event(aggregate = Order, version = 1)]
            struct OrderPlaced {}
        })
        .err()
        .unwrap();
        assert_eq!(
            errors,
            ["`aggregate` must be a string literal: `aggregate = \"Order\"`"]
        );
    }

    #[test]
    fn reads_the_serialized_names_of_serde_attributes() {
        let container = SerdeContainer::from_attrs(&[
            parse_quote!(#[serde(deny_unknown_fields, rename_all(serialize = "camelCase"))]),
            parse_quote!(#[serde(bound(serialize = "T: Serialize"), default)]),
        ]);
        assert_eq!(container.rename_all, Some(RenameRule::Camel));
        assert!(container.default);
        assert!(container.transparent.is_none());

        let field = SerdeField::from_attrs(&[parse_quote!(
            #[serde(rename(deserialize = "in", serialize = "out"), skip_serializing_if = "x")]
        )]);
        assert_eq!(field.rename.as_deref(), Some("out"));
        assert!(!field.skip_serializing);

        let field = SerdeField::from_attrs(&[parse_quote!(#[serde(rename(deserialize = "in"))])]);
        assert_eq!(field.rename, None);
    }
}
