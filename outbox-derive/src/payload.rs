//! Generates the `EventPayload` implementation: the type's shape as a
//! constant, reaching the shapes of the payload types it contains through
//! their own implementations.

use outbox_schema::ctxt::Ctxt;
use outbox_schema::model::Payload;
use outbox_schema::ty;
use proc_macro2::TokenStream;
use quote::quote;
use syn::DeriveInput;

use crate::shape_tokens;

/// The `impl outbox_core::EventPayload` for `input`, or every error found.
pub fn derive_event_payload(input: &DeriveInput) -> Result<TokenStream, Vec<syn::Error>> {
    let cx = Ctxt::default();
    let payload = Payload::from_ast(&cx, input);
    cx.check()?;
    let Some(payload) = payload else {
        return Err(vec![syn::Error::new_spanned(
            &input.ident,
            "EventPayload could not read this type",
        )]);
    };
    let name = payload.name();
    let entry = payload.entry();
    // The fields of the model and of the entry are in the same order.
    let mut sources = payload.all_fields();
    let shape = shape_tokens::type_shape(&name, &entry, &ty::wire_of, &mut |_| {
        let Some(field) = sources.next() else {
            return Vec::new();
        };
        field
            .payload_types(&[])
            .into_iter()
            // A reference to the type itself would make its constant
            // depend on itself; the recorded shape leaves it out too.
            .filter(|inner| ty::payload_name(inner) != name)
            .map(shape_tokens::current)
            .collect()
    });

    let ident = &input.ident;
    let (impl_generics, ty_generics, where_clause) = input.generics.split_for_impl();
    Ok(quote! {
        #[automatically_derived]
        impl #impl_generics ::outbox_core::EventPayload for #ident #ty_generics #where_clause {
            const SHAPE: &'static ::outbox_core::shape::TypeShape<'static> = &#shape;
        }
    })
}
