//! Compile tests for `#[derive(DomainEvent)]` and `#[derive(EventPayload)]`.
//!
//! `ui/pass` holds events that must compile; each is a program whose `main`
//! asserts the generated constants and schema. `ui/fail` holds one misuse
//! (or one rejected schema change) per file, with the compiler output a user
//! must see checked in beside it as `.stderr`. After an intended change to a
//! message, regenerate them with
//! `TRYBUILD=overwrite cargo test -p outbox-core --test derive_ui` and review
//! the diff.
//!
//! Every event is checked against a schema lock. trybuild compiles the cases
//! as binaries of a crate it generates under `target/`, whose root has no
//! lock, so the derive is pointed at `ui/outbox.lock` with `OUTBOX_LOCK`.
//! That fixture records the `pass` events as they are (written by
//! `OUTBOX_LOCK=$PWD/tests/ui/outbox.lock cargo outbox lock --src tests/ui/pass`)
//! and, for each `fail/lock_*` case, the earlier version of its event that
//! the case breaks (written by hand). Event names are unique across cases.

#[test]
fn derive_domain_event() {
    let lock = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/ui/outbox.lock");
    // SAFETY: the only test of this binary sets the variable before trybuild
    // starts cargo, and no other thread reads the environment meanwhile.
    unsafe { std::env::set_var("OUTBOX_LOCK", lock) };
    let cases = trybuild::TestCases::new();
    cases.pass("tests/ui/pass/*.rs");
    cases.compile_fail("tests/ui/fail/*.rs");
}
