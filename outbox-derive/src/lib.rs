//! `#[derive(DomainEvent)]` and `#[derive(EventPayload)]` for `outbox-core`.
//!
//! A thin shim: reading a struct the way serde writes it, the lock file and
//! the compatibility rules live in `outbox-schema`, which `cargo outbox lock`
//! shares, so the derive and the command always agree. Here the model is
//! turned into tokens: the trait implementations ([`expand`], [`payload`],
//! [`shape_tokens`]) and the checks against `outbox.lock` ([`schema_lock`]).
//! Use the derives through `outbox_core`, which re-exports them.
//!
//! The messages users see are pinned by the `trybuild` suite in
//! `outbox-core/tests/ui` (`cargo test -p outbox-core --test derive_ui`).

mod expand;
mod payload;
mod schema_lock;
mod shape_tokens;

use proc_macro::TokenStream;
use syn::{DeriveInput, parse_macro_input};

/// Derives `outbox_core::DomainEvent`; see the `outbox_core` documentation.
#[proc_macro_derive(DomainEvent, attributes(domain_event))]
pub fn derive_domain_event(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    expand::derive_domain_event(&input)
        .unwrap_or_else(to_compile_errors)
        .into()
}

/// Derives `outbox_core::EventPayload`; see the `outbox_core` documentation.
#[proc_macro_derive(EventPayload, attributes(domain_event))]
pub fn derive_event_payload(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    payload::derive_event_payload(&input)
        .unwrap_or_else(to_compile_errors)
        .into()
}

fn to_compile_errors(errors: Vec<syn::Error>) -> proc_macro2::TokenStream {
    let compile_errors = errors.iter().map(syn::Error::to_compile_error);
    quote::quote!(#(#compile_errors)*)
}
