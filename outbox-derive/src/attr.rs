//! The derive's attributes, parsed into a typed model: our own
//! `#[domain_event(..)]` and the serde attributes that shape the payload.

use proc_macro2::Span;
use syn::meta::ParseNestedMeta;
use syn::spanned::Spanned;
use syn::{Attribute, Ident, LitInt, LitStr};

use crate::case::RenameRule;
use crate::ctxt::Ctxt;

/// `#[domain_event(aggregate = "..", version = N, name = "..")]`, checked.
pub struct EventAttrs {
    pub aggregate: String,
    pub version: u32,
    pub name: String,
}

impl EventAttrs {
    /// Reads and checks the `domain_event` attributes of the struct `ident`.
    /// Returns `None` when an error was recorded.
    pub fn from_attrs(cx: &Ctxt, ident: &Ident, attrs: &[Attribute]) -> Option<Self> {
        let mut aggregate: Option<LitStr> = None;
        let mut version: Option<LitInt> = None;
        let mut name: Option<LitStr> = None;
        let mut seen_attribute = false;

        for attr in attrs
            .iter()
            .filter(|attr| attr.path().is_ident("domain_event"))
        {
            seen_attribute = true;
            let result = attr.parse_nested_meta(|meta| {
                if meta.path.is_ident("aggregate") {
                    set_once(cx, &meta, &mut aggregate, "aggregate")
                } else if meta.path.is_ident("version") {
                    set_once(cx, &meta, &mut version, "version")
                } else if meta.path.is_ident("name") {
                    set_once(cx, &meta, &mut name, "name")
                } else {
                    let key = meta.path.get_ident().map(ToString::to_string).unwrap_or_default();
                    Err(meta.error(format!(
                        "unknown domain_event attribute `{key}`; expected `aggregate`, `version` or `name`"
                    )))
                }
            });
            if let Err(error) = result {
                cx.syn_error(error);
                return None;
            }
        }

        if !seen_attribute {
            cx.error_spanned_by(
                ident,
                "missing #[domain_event(aggregate = \"...\", version = N)] on the event struct",
            );
            return None;
        }
        let aggregate = match aggregate {
            Some(lit) if lit.value().trim().is_empty() => {
                cx.error_spanned_by(&lit, "`aggregate` must not be empty");
                None
            }
            Some(lit) => Some(lit.value()),
            None => {
                cx.error_spanned_by(
                    ident,
                    "missing `aggregate`: add `aggregate = \"...\"` to #[domain_event(..)], \
                     naming the aggregate this event belongs to",
                );
                None
            }
        };
        let version = match version {
            Some(lit) => match lit.base10_parse::<u32>() {
                Ok(0) => {
                    cx.error_spanned_by(&lit, "`version` starts at 1; use `version = 1`");
                    None
                }
                Ok(version) => Some(version),
                Err(_) => {
                    cx.error_spanned_by(&lit, "`version` must be an integer from 1 to 4294967295");
                    None
                }
            },
            None => {
                cx.error_spanned_by(
                    ident,
                    "missing `version`: add `version = 1` to #[domain_event(..)] and bump it \
                     whenever the payload changes in a way old readers cannot handle",
                );
                None
            }
        };
        let name = match name {
            Some(lit) if lit.value().trim().is_empty() => {
                cx.error_spanned_by(
                    &lit,
                    "`name` must not be empty; omit it to use the struct name",
                );
                None
            }
            Some(lit) => Some(lit.value()),
            None => Some(unraw(ident)),
        };
        Some(Self {
            aggregate: aggregate?,
            version: version?,
            name: name?,
        })
    }
}

fn set_once<T: syn::parse::Parse>(
    cx: &Ctxt,
    meta: &ParseNestedMeta<'_>,
    slot: &mut Option<T>,
    key: &str,
) -> syn::Result<()> {
    let value: T = meta.value()?.parse()?;
    if slot.is_some() {
        cx.error_spanned_by(
            &meta.path,
            format!("duplicate `{key}` in #[domain_event(..)]"),
        );
    } else {
        *slot = Some(value);
    }
    Ok(())
}

/// The serde attributes of the struct that change the payload's shape.
#[derive(Default)]
pub struct SerdeContainer {
    pub rename_all: Option<RenameRule>,
    pub default: bool,
    pub transparent: Option<Span>,
}

impl SerdeContainer {
    /// Reads `#[serde(..)]` on the struct. Malformed serde attributes are
    /// serde's to report, so unknown keys are skipped silently.
    pub fn from_attrs(attrs: &[Attribute]) -> Self {
        let mut container = Self::default();
        for_each_serde_meta(attrs, |meta| {
            if meta.path.is_ident("rename_all") {
                if let Some(rule) = serialize_name(meta)? {
                    container.rename_all = RenameRule::from_str(&rule);
                }
            } else if meta.path.is_ident("default") {
                container.default = true;
                skip_value(meta)?;
            } else if meta.path.is_ident("transparent") {
                container.transparent = Some(meta.path.span());
            } else {
                skip_value(meta)?;
            }
            Ok(())
        });
        container
    }
}

/// The serde attributes of one field that change the payload's shape.
#[derive(Default)]
pub struct SerdeField {
    pub rename: Option<String>,
    pub default: bool,
    pub skip_serializing: bool,
    pub flatten: bool,
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
            } else {
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
    if meta.input.peek(syn::Token![=]) {
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
    if meta.input.peek(syn::Token![=]) {
        meta.value()?.parse::<syn::Expr>()?;
    } else if meta.input.peek(syn::token::Paren) {
        meta.parse_nested_meta(|inner| skip_value(&inner))?;
    }
    Ok(())
}

/// An identifier without its `r#` prefix, as serde names it.
pub fn unraw(ident: &Ident) -> String {
    let name = ident.to_string();
    name.strip_prefix("r#").map(str::to_owned).unwrap_or(name)
}
