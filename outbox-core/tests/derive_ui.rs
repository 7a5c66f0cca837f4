//! Compile tests for `#[derive(DomainEvent)]`.
//!
//! `ui/pass` holds events that must compile; each is a program whose `main`
//! asserts the generated constants and schema. `ui/fail` holds one misuse per
//! file, with the compiler output a user must see checked in beside it as
//! `.stderr`. After an intended change to a message, regenerate them with
//! `TRYBUILD=overwrite cargo test -p outbox-core --test derive_ui` and review
//! the diff.

#[test]
fn derive_domain_event() {
    let cases = trybuild::TestCases::new();
    cases.pass("tests/ui/pass/*.rs");
    cases.compile_fail("tests/ui/fail/*.rs");
}
