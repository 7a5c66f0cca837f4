//! Payload shapes as constant expressions of `outbox_core::shape` types:
//! recorded ones rebuilt from the lock, current ones from a payload type.

use std::collections::BTreeMap;

use outbox_schema::schema_lock::{EventEntry, FieldEntry, TypeEntry, json_of};
use outbox_schema::shape::Kind;
use outbox_schema::ty;
use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};
use syn::Type;
use syn::spanned::Spanned;
use syn::visit_mut::VisitMut;

/// `ty` with every lifetime replaced by `'static`, so it can be named in a
/// constant outside the struct's generics.
pub fn with_static_lifetimes(ty: &Type) -> Type {
    struct Static;
    impl VisitMut for Static {
        fn visit_lifetime_mut(&mut self, lifetime: &mut syn::Lifetime) {
            lifetime.ident = syn::Ident::new("static", lifetime.ident.span());
        }
    }
    let mut ty = ty.clone();
    Static.visit_type_mut(&mut ty);
    ty
}

/// The current shape of the payload type `inner` (as written in a field),
/// under the name the field spells it with: `<Quantity as EventPayload>`
/// for `type Quantity = u32;` is `u32`'s shape, which a `wire` spelling
/// names `Quantity`.
pub fn current(inner: &Type) -> TokenStream {
    let name = ty::payload_name(inner);
    let inner = with_static_lifetimes(inner);
    quote_spanned! {inner.span()=>
        &::outbox_core::shape::TypeShape {
            name: #name,
            ..*<#inner as ::outbox_core::EventPayload>::SHAPE
        }
    }
}

/// `outbox_core::shape::Kind::..`.
pub fn kind(kind: Kind) -> TokenStream {
    match kind {
        Kind::Struct => quote!(::outbox_core::shape::Kind::Struct),
        Kind::Tuple => quote!(::outbox_core::shape::Kind::Tuple),
        Kind::Unit => quote!(::outbox_core::shape::Kind::Unit),
        Kind::Enum => quote!(::outbox_core::shape::Kind::Enum),
    }
}

/// A `TypeShape` expression for the type `name` shaped like `entry`, whose
/// fields' nested payload types are the `&TypeShape` expressions `nested`
/// returns for each field, and whose fields' `wire` spellings `wire` gives.
pub fn type_shape(
    name: &str,
    entry: &TypeEntry,
    wire: &dyn Fn(&str) -> String,
    nested: &mut dyn FnMut(&FieldEntry) -> Vec<TokenStream>,
) -> TokenStream {
    let kind = kind(entry.kind);
    let rename_all = entry.rename_all.as_deref().unwrap_or("");
    let repr = entry.repr.as_deref().unwrap_or("");
    let closed = entry.closed;
    let struct_fields = fields(&entry.fields, wire, nested);
    let mut variants = Vec::new();
    for variant in &entry.variants {
        let name = &variant.name;
        let rust_name = variant.rust_name();
        let kind = self::kind(variant.kind);
        let fields = fields(&variant.fields, wire, nested);
        variants.push(quote! {
            ::outbox_core::shape::VariantShape {
                name: #name,
                rust_name: #rust_name,
                kind: #kind,
                fields: #fields,
            }
        });
    }
    let fields = struct_fields;
    quote! {
        ::outbox_core::shape::TypeShape {
            name: #name,
            kind: #kind,
            rename_all: #rename_all,
            repr: #repr,
            fields: #fields,
            variants: &[#(#variants),*],
            closed: #closed,
        }
    }
}

/// A `&[FieldShape]` expression.
fn fields(
    fields: &[FieldEntry],
    wire: &dyn Fn(&str) -> String,
    nested: &mut dyn FnMut(&FieldEntry) -> Vec<TokenStream>,
) -> TokenStream {
    let mut shapes = Vec::new();
    for field in fields {
        let name = &field.name;
        let rust_name = field.rust_name();
        let ty = &field.ty;
        let wire = wire(&field.ty);
        let (optional, default, flatten) = (field.optional, field.default, field.flatten);
        let omittable = field.omittable;
        let types = nested(field);
        shapes.push(quote! {
            ::outbox_core::shape::FieldShape {
                name: #name,
                rust_name: #rust_name,
                ty: #ty,
                wire: #wire,
                optional: #optional,
                default: #default,
                flatten: #flatten,
                omittable: #omittable,
                types: &[#(#types),*],
            }
        });
    }
    quote!(&[#(#shapes),*])
}

/// The recorded fields of an event version, as a `&[FieldShape]`
/// expression with the recorded shapes of their payload types.
pub fn recorded_fields(entry: &EventEntry) -> TokenStream {
    let wire = |ty: &str| json_of(ty, &entry.types);
    fields(&entry.fields, &wire, &mut |field| {
        if field.opaque {
            return Vec::new();
        }
        recorded_types_in(&field.ty, &entry.types, &[])
    })
}

/// The current fields `entries` of a struct, as a `&[FieldShape]`
/// expression whose nested payload types are the `&TypeShape` expressions
/// `nested` returns for each field.
pub fn current_fields(
    entries: &[FieldEntry],
    nested: &mut dyn FnMut(&FieldEntry) -> Vec<TokenStream>,
) -> TokenStream {
    fields(entries, &ty::wire_of, nested)
}

/// The recorded shape of the payload type `name`, with the recorded shapes
/// of the types it contains, from an event's `types` in the lock. A type
/// already being expanded on the way here is not expanded again, as
/// `#[derive(EventPayload)]` leaves out a type's references to itself.
pub fn recorded(
    name: &str,
    types: &BTreeMap<String, TypeEntry>,
    path: &mut Vec<String>,
) -> Option<TokenStream> {
    let entry = types.get(name)?;
    path.push(name.to_owned());
    // Recorded newtypes are spelled as what they hold; the current ones
    // are read so by `shape::json_eq`.
    let wire = |ty: &str| json_of(ty, types);
    let shape = type_shape(name, entry, &wire, &mut |field| {
        if field.opaque {
            return Vec::new();
        }
        recorded_types_in(&field.ty, types, path)
    });
    path.pop();
    Some(shape)
}

/// The recorded shapes (`&TypeShape` expressions) of the payload types in
/// the recorded type `ty`, from `types`; those in `path`, being expanded,
/// are left out.
pub fn recorded_types_in(
    ty: &str,
    types: &BTreeMap<String, TypeEntry>,
    path: &[String],
) -> Vec<TokenStream> {
    ty::payload_names_in(ty, &[])
        .iter()
        .filter(|inner| !path.contains(inner))
        .filter_map(|inner| recorded(inner, types, &mut path.to_vec()))
        .map(|shape| quote!(&#shape))
        .collect()
}
