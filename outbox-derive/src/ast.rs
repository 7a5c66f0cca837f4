//! The derive input as an event model: the struct, its attributes and its
//! serialized fields.

use syn::{Data, DeriveInput, Fields, Generics, Ident, Type};

use crate::attr::{EventAttrs, SerdeContainer, SerdeField, unraw};
use crate::ctxt::Ctxt;
use crate::ty;

/// An event struct, checked.
pub struct Event<'a> {
    pub ident: &'a Ident,
    pub generics: &'a Generics,
    pub attrs: EventAttrs,
    pub fields: Vec<Field<'a>>,
}

/// A serialized field of the payload.
pub struct Field<'a> {
    pub name: String,
    pub rust_name: String,
    pub ty: &'a Type,
    pub optional: bool,
    pub default: bool,
    pub flatten: bool,
}

impl<'a> Event<'a> {
    /// Reads the derive input, recording every problem in `cx`.
    pub fn from_ast(cx: &Ctxt, input: &'a DeriveInput) -> Option<Self> {
        let attrs = EventAttrs::from_attrs(cx, &input.ident, &input.attrs);
        let serde = SerdeContainer::from_attrs(&input.attrs);
        if let Some(span) = serde.transparent {
            cx.syn_error(syn::Error::new(
                span,
                "#[serde(transparent)] is not supported: a DomainEvent payload is a JSON object \
                 of the struct's fields; remove it",
            ));
        }
        let fields = match &input.data {
            Data::Struct(data) => match &data.fields {
                Fields::Named(named) => Some(&named.named),
                Fields::Unnamed(_) => {
                    cx.error_spanned_by(
                        &data.fields,
                        "DomainEvent can only be derived for structs with named fields, \
                         whose payload is a JSON object; give the tuple fields names",
                    );
                    None
                }
                Fields::Unit => {
                    cx.error_spanned_by(
                        &input.ident,
                        format!(
                            "DomainEvent can only be derived for structs with named fields, \
                             whose payload is a JSON object; add fields or write \
                             `struct {} {{}}`",
                            input.ident
                        ),
                    );
                    None
                }
            },
            Data::Enum(data) => {
                cx.error_spanned_by(
                    data.enum_token,
                    "DomainEvent can only be derived for structs with named fields; \
                     declare one event struct per variant",
                );
                None
            }
            Data::Union(data) => {
                cx.error_spanned_by(
                    data.union_token,
                    "DomainEvent can only be derived for structs with named fields; \
                     serde cannot serialize a union, declare a struct instead",
                );
                None
            }
        };
        let fields = fields?
            .iter()
            .filter_map(|field| {
                for attr in &field.attrs {
                    if attr.path().is_ident("domain_event") {
                        cx.error_spanned_by(
                            attr,
                            "#[domain_event(..)] belongs on the event struct, not on a field; \
                             use #[serde(rename = \"..\")] or #[serde(skip)] to shape a field",
                        );
                    }
                }
                let ident = field.ident.as_ref()?;
                let attrs = SerdeField::from_attrs(&field.attrs);
                if attrs.skip_serializing {
                    return None;
                }
                let rust_name = unraw(ident);
                let name = match (&attrs.rename, serde.rename_all) {
                    (Some(rename), _) => rename.clone(),
                    (None, Some(rule)) => rule.apply_to_field(&rust_name),
                    (None, None) => rust_name.clone(),
                };
                Some(Field {
                    name,
                    rust_name,
                    ty: &field.ty,
                    optional: ty::option_inner(&field.ty).is_some(),
                    default: attrs.default || serde.default,
                    flatten: attrs.flatten,
                })
            })
            .collect();
        Some(Self {
            ident: &input.ident,
            generics: &input.generics,
            attrs: attrs?,
            fields,
        })
    }
}
