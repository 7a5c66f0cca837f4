//! `#[derive(DomainEvent)]` for `outbox-core`.
//!
//! The derive parses its input into a typed model first ([`ast`], [`attr`]),
//! collecting every misuse with the span of the offending tokens, and only
//! then generates the `DomainEvent` implementation ([`expand`]). Use it
//! through `outbox_core::DomainEvent`, which re-exports it.
//!
//! The messages users see are pinned by the `trybuild` suite in
//! `outbox-core/tests/ui` (`cargo test -p outbox-core --test derive_ui`).

mod ast;
mod attr;
mod case;
mod ctxt;
mod expand;
mod ty;

use proc_macro::TokenStream;
use syn::{DeriveInput, parse_macro_input};

/// Derives `outbox_core::DomainEvent`; see the `outbox_core` documentation.
#[proc_macro_derive(DomainEvent, attributes(domain_event))]
pub fn derive_domain_event(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    expand::derive_domain_event(&input)
        .unwrap_or_else(|errors| {
            let compile_errors = errors.iter().map(syn::Error::to_compile_error);
            quote::quote!(#(#compile_errors)*)
        })
        .into()
}
