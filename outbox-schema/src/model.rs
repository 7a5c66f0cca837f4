//! A derive input as a model: an event struct (`DomainEvent`) or a payload
//! type (`EventPayload`), with its serialized fields, read the way serde
//! writes them. The derive and `cargo outbox lock` both build schemas from
//! here, so they always agree on what a struct's schema is.

use proc_macro2::TokenStream;
use quote::quote;
use syn::{Data, DeriveInput, Fields, Generics, Ident, Type};

use crate::attr::{EventAttrs, FieldAttrs, Refused, SerdeContainer, SerdeField, unraw};
use crate::ctxt::Ctxt;
use crate::schema_lock::{EventEntry, FieldEntry, TypeEntry, VariantEntry};
use crate::shape::Kind;
use crate::ty;

/// An event struct, checked.
pub struct Event<'a> {
    /// The type's name.
    pub ident: &'a Ident,
    /// The struct's generics, kept on the impl.
    pub generics: &'a Generics,
    /// `#[domain_event(..)]`, checked.
    pub attrs: EventAttrs,
    /// The container's serde attributes.
    pub serde: SerdeContainer,
    /// The serialized fields.
    pub fields: Vec<Field<'a>>,
}

/// A serialized field of the payload.
pub struct Field<'a> {
    /// The name serde writes.
    pub name: String,
    /// The Rust name.
    pub rust_name: String,
    /// The type as written.
    pub ty: &'a Type,
    /// The type is an `Option`.
    pub optional: bool,
    /// `#[serde(default)]` on the field or the container.
    pub default: bool,
    /// `#[serde(flatten)]`.
    pub flatten: bool,
    /// `#[serde(skip_serializing_if)]`: the key may be left out.
    pub omittable: bool,
    /// `#[domain_event(opaque)]`: compared by type name only.
    pub opaque: bool,
    /// `#[serde(alias)]`: other keys readers accept.
    pub aliases: Vec<String>,
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
        entry.omittable = self.omittable;
        entry.opaque = self.opaque;
        entry.aliases.clone_from(&self.aliases);
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
/// `owner` names the type (and variant) the fields belong to, for errors.
fn named_fields<'a>(
    cx: &Ctxt,
    owner: &str,
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
            let rust_name = match &field.ident {
                Some(ident) => unraw(ident),
                None => index.to_string(),
            };
            let place = format!("field `{rust_name}` of {owner}");
            let refused = attrs
                .refused
                .iter()
                .filter(|refused| !(own.opaque && refused.opaque_allows));
            refuse(cx, &place, refused);
            let optional = ty::option_inner(&field.ty).is_some();
            if let Some(span) = attrs.skip_serializing_if
                && !attrs.skip_serializing
                && !(optional || attrs.default || container_default)
            {
                cx.syn_error(syn::Error::new(
                    span,
                    format!(
                        "#[serde(skip_serializing_if)] on {place} is not supported on a \
                         required field: the key could be left out while readers require \
                         it; make the field an Option<T> or add #[serde(default)]"
                    ),
                ));
            }
            if attrs.skip_serializing {
                return None;
            }
            let name = match (&attrs.rename, rename_all, &field.ident) {
                (Some(rename), _, _) => rename.clone(),
                (None, Some(rule), Some(_)) => rule.apply_to_field(&rust_name),
                _ => rust_name.clone(),
            };
            Some(Field {
                name,
                rust_name,
                ty: &field.ty,
                optional,
                default: attrs.default || container_default,
                flatten: attrs.flatten,
                omittable: attrs.skip_serializing_if.is_some(),
                opaque: own.opaque,
                aliases: attrs.aliases.clone(),
                source: field,
            })
        })
        .collect()
}

/// Reports each serde attribute `refused` on `place` (`event
/// `OrderPlaced``, `field `qty` of payload type `Line``).
fn refuse<'r>(cx: &Ctxt, place: &str, refused: impl IntoIterator<Item = &'r Refused>) {
    for refused in refused {
        cx.syn_error(syn::Error::new(
            refused.span,
            format!(
                "#[serde({})] on {place} is not supported: {}",
                refused.key, refused.fix
            ),
        ));
    }
}

impl<'a> Event<'a> {
    /// Reads the derive input, recording every problem in `cx`.
    pub fn from_ast(cx: &Ctxt, input: &'a DeriveInput) -> Option<Self> {
        let attrs = EventAttrs::from_attrs(cx, &input.ident, &input.attrs);
        let serde = SerdeContainer::from_attrs(&input.attrs);
        let owner = format!("event `{}`", unraw(&input.ident));
        refuse(cx, &owner, &serde.refused);
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
        let fields = named_fields(cx, &owner, fields?.iter(), serde.rename_all, serde.default);
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
    /// The type's name.
    pub ident: &'a Ident,
    /// Struct, tuple, unit or enum (for a variant: unit, tuple or struct).
    pub kind: Kind,
    /// The container's serde attributes.
    pub serde: SerdeContainer,
    /// The fields of a struct.
    pub fields: Vec<Field<'a>>,
    /// The variants of an enum.
    pub variants: Vec<Variant<'a>>,
}

/// A serialized enum variant.
pub struct Variant<'a> {
    /// The name serde writes.
    pub name: String,
    /// The Rust name.
    pub rust_name: String,
    /// Struct, tuple, unit or enum (for a variant: unit, tuple or struct).
    pub kind: Kind,
    /// The serialized fields.
    pub fields: Vec<Field<'a>>,
    /// `#[serde(other)]`: readers read unknown variants as this one.
    pub other: bool,
    /// `#[serde(alias)]`: other names readers accept.
    pub aliases: Vec<String>,
}

impl<'a> Payload<'a> {
    /// Reads the derive input, recording every problem in `cx`.
    pub fn from_ast(cx: &Ctxt, input: &'a DeriveInput) -> Option<Self> {
        let serde = SerdeContainer::from_attrs(&input.attrs);
        let owner = format!("payload type `{}`", unraw(&input.ident));
        refuse(cx, &owner, &serde.refused);
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
                let fields = named_fields(cx, &owner, &data.fields, rename_all, serde.default);
                (kind, fields, Vec::new())
            }
            Data::Enum(data) => {
                let variants = data
                    .variants
                    .iter()
                    .filter_map(|variant| {
                        let attrs = SerdeField::from_attrs(&variant.attrs);
                        let rust_name = unraw(&variant.ident);
                        let variant_owner = format!("variant `{rust_name}` of {owner}");
                        refuse(cx, &variant_owner, &attrs.refused);
                        if attrs.skip_serializing {
                            return None;
                        }
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
                        let fields = named_fields(
                            cx,
                            &variant_owner,
                            &variant.fields,
                            attrs.rename_all,
                            false,
                        );
                        Some(Variant {
                            name,
                            rust_name,
                            kind,
                            fields,
                            other: attrs.other,
                            aliases: attrs.aliases.clone(),
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
                    other: variant.other,
                    aliases: variant.aliases.clone(),
                })
                .collect(),
            closed: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use syn::parse_quote;

    use super::*;

    fn payload(input: DeriveInput) -> TypeEntry {
        let cx = Ctxt::default();
        let entry = Payload::from_ast(&cx, &input).map(|payload| payload.entry());
        cx.check().map_err(|errors| errors[0].to_string()).unwrap();
        entry.unwrap()
    }

    #[test]
    fn events_record_serialized_names_types_and_flags() {
        let input: DeriveInput = parse_quote! {
            #[domain_event(aggregate = "Order", version = 3, name = "order.placed")]
            #[serde(rename_all = "camelCase")]
            struct OrderPlaced {
                order_id: i64,
                #[serde(skip)]
                cache: Vec<u8>,
                #[serde(default)]
                gift_note: String,
                coupon: Option<std::string::String>,
                #[domain_event(opaque)]
                receipt: other::Receipt,
            }
        };
        let cx = Ctxt::default();
        let entry = Event::from_ast(&cx, &input).unwrap().entry();
        assert!(cx.check().is_ok());
        assert_eq!((entry.event.as_str(), entry.version), ("order.placed", 3));
        assert_eq!(entry.rename_all.as_deref(), Some("camelCase"));
        let fields: Vec<(&str, &str, &str, bool, bool, bool)> = entry
            .fields
            .iter()
            .map(|f| {
                (
                    f.name.as_str(),
                    f.rust_name(),
                    f.ty.as_str(),
                    f.optional,
                    f.default,
                    f.opaque,
                )
            })
            .collect();
        assert_eq!(
            fields,
            [
                ("orderId", "order_id", "i64", false, false, false),
                ("giftNote", "gift_note", "String", false, true, false),
                ("coupon", "coupon", "Option<String>", true, false, false),
                ("receipt", "receipt", "Receipt", false, false, true),
            ]
        );
    }

    #[test]
    fn enums_record_variants_as_serde_names_them() {
        let entry = payload(parse_quote! {
            #[serde(tag = "type", content = "data", rename_all = "snake_case")]
            enum Payment {
                Card { #[serde(rename = "lastFour")] last4: String },
                #[serde(rename = "wire")]
                BankTransfer(String, u32),
                #[serde(skip)]
                Internal,
                GiftCard,
            }
        });
        assert_eq!(entry.kind, Kind::Enum);
        assert_eq!(entry.repr.as_deref(), Some("adjacent(type, data)"));
        let variants: Vec<(&str, &str, Kind, usize)> = entry
            .variants
            .iter()
            .map(|v| (v.name.as_str(), v.rust_name(), v.kind, v.fields.len()))
            .collect();
        assert_eq!(
            variants,
            [
                ("card", "Card", Kind::Struct, 1),
                ("wire", "BankTransfer", Kind::Tuple, 2),
                ("gift_card", "GiftCard", Kind::Unit, 0),
            ]
        );
        assert_eq!(entry.variants[0].fields[0].name, "lastFour");
        assert_eq!(entry.variants[1].fields[1].name, "1");
        let untagged = payload(parse_quote!(
            #[serde(untagged)]
            enum Id {
                Number(i64),
                Text(String),
            }
        ));
        assert_eq!(untagged.repr.as_deref(), Some("untagged"));
        let external = payload(parse_quote!(
            enum Side {
                Buy,
                Sell,
            }
        ));
        assert_eq!(external.repr.as_deref(), Some("external"));
    }

    #[test]
    fn structs_record_their_kind() {
        let newtype = payload(parse_quote!(
            struct Sku(String);
        ));
        assert_eq!(
            (newtype.kind, newtype.fields[0].ty.as_str()),
            (Kind::Tuple, "String")
        );
        let unit = payload(parse_quote!(
            struct Marker;
        ));
        assert_eq!((unit.kind, unit.fields.len()), (Kind::Unit, 0));
        let transparent = payload(parse_quote!(
            #[serde(transparent)]
            struct Cents {
                value: i64,
            }
        ));
        assert_eq!(transparent.repr.as_deref(), Some("transparent"));
    }

    #[test]
    fn payload_types_cannot_be_generic() {
        let input: DeriveInput = parse_quote!(
            struct Page<T> {
                items: Vec<T>,
            }
        );
        let cx = Ctxt::default();
        let _ = Payload::from_ast(&cx, &input);
        let errors = cx.check().unwrap_err();
        assert!(
            errors[0]
                .to_string()
                .starts_with("EventPayload cannot be derived for a generic type")
        );
    }
}
