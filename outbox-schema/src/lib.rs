//! What an event's payload schema is, and how it may change.
//!
//! One implementation shared by `#[derive(DomainEvent)]`,
//! `#[derive(EventPayload)]` (in `outbox-derive`, a thin shim over this crate)
//! and the `cargo outbox lock` command, like `sqlx-macros-core` behind
//! `sqlx`'s macros:
//!
//! - [`model`] reads a struct or enum the way serde writes it (with
//!   [`attr`], [`case`] and [`ty`]), reporting misuse through [`ctxt`];
//! - [`schema_lock`] is the `outbox.lock` file that records every published
//!   (event type, version);
//! - [`compare`] checks an event against the lock, and [`shape`] holds the
//!   compatibility rules as `const fn`s, so the code the derive generates
//!   can apply them to nested payload types at compile time;
//! - [`sources`] reads a crate's events and payload types from its source
//!   files, and [`leaked`] turns recorded types into shapes, so the same
//!   rules judge them outside constant evaluation;
//! - [`reader`] checks that a consumer's decoder reads every payload of a
//!   recorded version (`cargo outbox check`);
//! - [`export`] (feature `export`) writes the recorded contract as JSON
//!   Schema and AsyncAPI documents.
//!
//! Without the default `model` feature only [`shape`] is built; that is what
//! `outbox-core` re-exports for generated code.

#![cfg_attr(not(any(feature = "model", test)), no_std)]

pub mod shape;

#[cfg(feature = "model")]
pub mod attr;
#[cfg(feature = "model")]
pub mod case;
#[cfg(feature = "model")]
pub mod compare;
#[cfg(feature = "model")]
pub mod ctxt;
#[cfg(feature = "export")]
pub mod export;
#[cfg(feature = "model")]
pub mod leaked;
#[cfg(feature = "model")]
pub mod model;
#[cfg(feature = "model")]
pub mod reader;
#[cfg(feature = "model")]
pub mod schema_lock;
#[cfg(feature = "model")]
pub mod sources;
#[cfg(feature = "model")]
pub mod ty;
