//! A derive input as a model: an event struct (`DomainEvent`) or a payload
//! type (`EventPayload`), with its serialized fields, read the way serde
//! writes them. The derive and `cargo outbox lock` both build schemas from
//! here, so they always agree on what a struct's schema is.

use proc_macro2::TokenStream;
use quote::quote;
use syn::{Data, DeriveInput, Fields, Generics, Ident, Type};

use crate::attr::{EventAttrs, FieldAttrs, SerdeContainer, SerdeField, unraw};
use crate::ctxt::Ctxt;
use crate::schema_lock::{EventEntry, FieldEntry, TypeEntry, VariantEntry};
use crate::shape::Kind;
use crate::ty;

/// An event struct, checked.
pub struct Event<'a> {
    pub ident: &'a Ident,
    pub generics: &'a Generics,
    pub attrs: EventAttrs,
    pub serde: SerdeContainer,
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
    /// `#[domain_event(opaque)]`: compared by type name only.
    pub opaque: bool,
    /// The field as written, for errors about it.
    pub source: &'a syn::Field,
}

impl Field<'_> {
    /// The field as the lock records it.
    pub fn entry(&self) -> FieldEntry {
        let mut entry = FieldEntry::new(
            self.name.clone(),
            self.rust_name.clone(),
            ty::normalize(self.ty),
        );
        entry.optional = self.optional;
        entry.default = self.default;
        entry.flatten = self.flatten;
        entry.opaque = self.opaque;
        entry
    }

    /// The field's name and type, where errors about the field point.
    pub fn site(&self) -> TokenStream {
        let ty = self.ty;
        match &self.source.ident {
            Some(ident) => quote!(#ident: #ty),
            None => quote!(#ty),
        }
    }

    /// The payload types inside the field's type, unless it is opaque.
    pub fn payload_types(&self, generic_params: &[String]) -> Vec<&Type> {
        if self.opaque {
            Vec::new()
        } else {
            ty::payload_types(self.ty, generic_params)
        }
    }
}

/// The names of the type parameters of `generics`.
pub fn type_params(generics: &Generics) -> Vec<String> {
    generics
        .type_params()
        .map(|param| param.ident.to_string())
        .collect()
}

/// Reads the serialized named fields of a struct or struct variant.
/// `container_default` is `#[serde(default)]` on the container.
fn named_fields<'a>(
    cx: &Ctxt,
    fields: impl IntoIterator<Item = &'a syn::Field>,
    rename_all: Option<crate::case::RenameRule>,
    container_default: bool,
) -> Vec<Field<'a>> {
    fields
        .into_iter()
        .enumerate()
        .filter_map(|(index, field)| {
            let own = FieldAttrs::from_attrs(cx, &field.attrs);
            let attrs = SerdeField::from_attrs(&field.attrs);
            if attrs.skip_serializing {
                return None;
            }
            let rust_name = match &field.ident {
                Some(ident) => unraw(ident),
                None => index.to_string(),
            };
            let name = match (&attrs.rename, rename_all, &field.ident) {
                (Some(rename), _, _) => rename.clone(),
                (None, Some(rule), Some(_)) => rule.apply_to_field(&rust_name),
                _ => rust_name.clone(),
            };
            Some(Field {
                name,
                rust_name,
                ty: &field.ty,
                optional: ty::option_inner(&field.ty).is_some(),
                default: attrs.default || container_default,
                flatten: attrs.flatten,
                opaque: own.opaque,
                source: field,
            })
        })
        .collect()
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
        let fields = named_fields(cx, fields?.iter(), serde.rename_all, serde.default);
        Some(Self {
            ident: &input.ident,
            generics: &input.generics,
            attrs: attrs?,
            serde,
            fields,
        })
    }

    /// The event as the lock records it, without its nested payload types.
    pub fn entry(&self) -> EventEntry {
        EventEntry {
            event: self.attrs.name.clone(),
            version: self.attrs.version,
            aggregate: self.attrs.aggregate.clone(),
            rename_all: self.serde.rename_all.map(|rule| rule.as_str().to_owned()),
            fields: self.fields.iter().map(Field::entry).collect(),
            types: Default::default(),
        }
    }

    /// The names of the struct's type parameters, compared by name.
    pub fn type_params(&self) -> Vec<String> {
        type_params(self.generics)
    }
}

/// A payload type deriving `EventPayload`, checked.
pub struct Payload<'a> {
    pub ident: &'a Ident,
    pub kind: Kind,
    pub serde: SerdeContainer,
    /// The fields of a struct.
    pub fields: Vec<Field<'a>>,
    /// The variants of an enum.
    pub variants: Vec<Variant<'a>>,
}

/// A serialized enum variant.
pub struct Variant<'a> {
    pub name: String,
    pub rust_name: String,
    pub kind: Kind,
    pub fields: Vec<Field<'a>>,
}

impl<'a> Payload<'a> {
    /// Reads the derive input, recording every problem in `cx`.
    pub fn from_ast(cx: &Ctxt, input: &'a DeriveInput) -> Option<Self> {
        let serde = SerdeContainer::from_attrs(&input.attrs);
        for attr in &input.attrs {
            if attr.path().is_ident("domain_event") {
                cx.error_spanned_by(
                    attr,
                    "#[domain_event(..)] belongs on event structs; a payload type needs \
                     only #[derive(EventPayload)]",
                );
            }
        }
        if let Some(param) = input.generics.type_params().next() {
            cx.error_spanned_by(
                param,
                "EventPayload cannot be derived for a generic type: its shape must be known \
                 to be recorded; use a concrete type in the event",
            );
        }
        let (kind, fields, variants) = match &input.data {
            Data::Struct(data) => {
                let (kind, rename_all) = match &data.fields {
                    Fields::Named(_) => (Kind::Struct, serde.rename_all),
                    Fields::Unnamed(_) => (Kind::Tuple, None),
                    Fields::Unit => (Kind::Unit, None),
                };
                let fields = named_fields(cx, &data.fields, rename_all, serde.default);
                (kind, fields, Vec::new())
            }
            Data::Enum(data) => {
                let variants = data
                    .variants
                    .iter()
                    .filter_map(|variant| {
                        let attrs = SerdeField::from_attrs(&variant.attrs);
                        if attrs.skip_serializing {
                            return None;
                        }
                        let rust_name = unraw(&variant.ident);
                        let name = match (&attrs.rename, serde.rename_all) {
                            (Some(rename), _) => rename.clone(),
                            (None, Some(rule)) => rule.apply_to_variant(&rust_name),
                            (None, None) => rust_name.clone(),
                        };
                        let kind = match &variant.fields {
                            Fields::Named(_) => Kind::Struct,
                            Fields::Unnamed(_) => Kind::Tuple,
                            Fields::Unit => Kind::Unit,
                        };
                        let fields = named_fields(cx, &variant.fields, attrs.rename_all, false);
                        Some(Variant {
                            name,
                            rust_name,
                            kind,
                            fields,
                        })
                    })
                    .collect();
                (Kind::Enum, Vec::new(), variants)
            }
            Data::Union(data) => {
                cx.error_spanned_by(
                    data.union_token,
                    "EventPayload cannot be derived for a union: serde cannot serialize one",
                );
                return None;
            }
        };
        Some(Self {
            ident: &input.ident,
            kind,
            serde,
            fields,
            variants,
        })
    }

    /// The name the type is recorded under.
    pub fn name(&self) -> String {
        unraw(self.ident)
    }

    /// Every field, of the struct or of any variant.
    pub fn all_fields(&self) -> impl Iterator<Item = &Field<'a>> {
        self.fields
            .iter()
            .chain(self.variants.iter().flat_map(|variant| &variant.fields))
    }

    /// An enum's representation, as recorded; `None` for structs.
    pub fn repr(&self) -> Option<String> {
        if self.kind != Kind::Enum {
            return self.serde.transparent.map(|_| "transparent".to_owned());
        }
        Some(
            match (&self.serde.tag, &self.serde.content, self.serde.untagged) {
                (_, _, true) => "untagged".to_owned(),
                (Some(tag), Some(content), false) => format!("adjacent({tag}, {content})"),
                (Some(tag), None, false) => format!("internal({tag})"),
                (None, _, false) => "external".to_owned(),
            },
        )
    }

    /// The type as the lock records it.
    pub fn entry(&self) -> TypeEntry {
        TypeEntry {
            kind: self.kind,
            rename_all: match self.kind {
                Kind::Struct | Kind::Enum => {
                    self.serde.rename_all.map(|rule| rule.as_str().to_owned())
                }
                Kind::Tuple | Kind::Unit => None,
            },
            repr: self.repr(),
            fields: self.fields.iter().map(Field::entry).collect(),
            variants: self
                .variants
                .iter()
                .map(|variant| VariantEntry {
                    name: variant.name.clone(),
                    rust: (variant.rust_name != variant.name).then(|| variant.rust_name.clone()),
                    kind: variant.kind,
                    fields: variant.fields.iter().map(Field::entry).collect(),
                })
                .collect(),
        }
    }
}
