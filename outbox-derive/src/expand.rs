//! Generates the `DomainEvent` implementation from a checked [`Event`].

use proc_macro2::TokenStream;
use quote::quote;
use syn::DeriveInput;

use crate::ast::Event;
use crate::ctxt::Ctxt;
use crate::ty;

/// The `impl outbox_core::DomainEvent` for `input`, or every error found.
pub fn derive_domain_event(input: &DeriveInput) -> Result<TokenStream, Vec<syn::Error>> {
    let cx = Ctxt::default();
    let event = Event::from_ast(&cx, input);
    cx.check()?;
    let event = event.expect("no errors were recorded, so the event was read");

    let ident = event.ident;
    let (impl_generics, ty_generics, where_clause) = event.generics.split_for_impl();
    let aggregate = &event.attrs.aggregate;
    let name = &event.attrs.name;
    let version = event.attrs.version;
    let fields = event.fields.iter().map(|field| {
        let name = &field.name;
        let rust_name = &field.rust_name;
        let ty = ty::normalize(field.ty);
        let optional = field.optional;
        let default = field.default;
        let flatten = field.flatten;
        quote! {
            ::outbox_core::FieldSchema {
                name: #name,
                rust_name: #rust_name,
                ty: #ty,
                optional: #optional,
                default: #default,
                flatten: #flatten,
            }
        }
    });

    Ok(quote! {
        #[automatically_derived]
        impl #impl_generics ::outbox_core::DomainEvent for #ident #ty_generics #where_clause {
            const AGGREGATE_TYPE: &'static str = #aggregate;
            const EVENT_TYPE: &'static str = #name;
            const VERSION: u32 = #version;
            const SCHEMA: &'static ::outbox_core::EventSchema = &::outbox_core::EventSchema {
                aggregate_type: #aggregate,
                event_type: #name,
                version: #version,
                fields: &[#(#fields),*],
            };
        }
    })
}
