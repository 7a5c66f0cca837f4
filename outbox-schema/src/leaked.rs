//! The shapes of recorded payload types (`shape::TypeShape`), built from a
//! lock entry's types as the derive builds them from the compiled types,
//! so that the same `const fn` comparisons judge them outside constant
//! evaluation: in `cargo outbox`, and in the derive when the sources
//! define every payload type nested in an event. The shapes borrow
//! `'static` strings, so they are leaked: each is built once per check of
//! a short-lived process (a command, or a compiler's macro expansion).

use std::collections::BTreeMap;

use crate::compare::{self, ObjectCheck, Unsettled};
use crate::schema_lock::{EventEntry, FieldEntry, TypeEntry, json_of};
use crate::shape::{
    FieldShape, TypeShape, VariantShape, nested_mismatch, object_mismatch, settle_mismatch,
};
use crate::ty;

/// Every incompatible change, since `recorded`, in the payload types
/// nested in the field `field` of `actual` (every field when `None`), as
/// messages; `next` is the version a bump would give.
pub fn nested_problems(
    recorded: &EventEntry,
    actual: &EventEntry,
    field: Option<&str>,
    lock_name: &str,
    next: u32,
) -> Vec<String> {
    let mut problems = Vec::new();
    let fields = recorded
        .fields
        .iter()
        .filter(|recorded| field.is_none_or(|name| recorded.name == name));
    for field in fields {
        if field.opaque {
            continue;
        }
        for name in ty::payload_names_in(&field.ty, &[]) {
            let (Some(old), Some(new)) = (
                shape(&name, &recorded.types, &mut Vec::new()),
                shape(&name, &actual.types, &mut Vec::new()),
            ) else {
                continue;
            };
            let prefix = compare::mismatch(recorded, lock_name, Some(&field.name));
            let fix = compare::bump_fix(next);
            problems.extend(
                (0..)
                    .map_while(|n| nested_mismatch(old, new, n, &prefix, &fix))
                    .map(|message| message.as_str().to_owned()),
            );
        }
    }
    problems
}

/// What the type of field `unsettled.field` of `actual` changed since its
/// recorded type, settled as the derive settles it: `None` if readers of
/// the recorded type read it.
pub fn settle(
    recorded: Option<&EventEntry>,
    actual: &EventEntry,
    unsettled: &Unsettled,
) -> Option<String> {
    let Some(recorded) = recorded else {
        return Some(unsettled.message.clone());
    };
    let shapes = |ty: Option<&str>, types| ty.map_or_else(Vec::new, |ty| types_in(ty, types, &[]));
    let recorded_ty = recorded
        .fields
        .iter()
        .find(|field| field.name == unsettled.recorded_field)
        .map(|field| field.ty.as_str());
    let actual_ty = actual
        .fields
        .get(unsettled.field)
        .map(|field| field.ty.as_str());
    settle_mismatch(
        &unsettled.recorded,
        &shapes(recorded_ty, &recorded.types),
        &unsettled.actual,
        &shapes(actual_ty, &actual.types),
        &unsettled.nested_prefix,
        &unsettled.fix,
        &unsettled.message,
    )
    .map(|message| message.as_str().to_owned())
}

/// What the keys of `actual`'s JSON object changed since `recorded`'s
/// (an event that flattens a payload type), as the derive settles it: a
/// message per problem.
pub fn object_changes(
    recorded: Option<&EventEntry>,
    actual: &EventEntry,
    check: &ObjectCheck,
) -> Vec<String> {
    let Some(recorded) = recorded else {
        return Vec::new();
    };
    let (old, new) = (
        fields(&recorded.fields, &recorded.types, &[]),
        fields(&actual.fields, &actual.types, &[]),
    );
    (0..)
        .map_while(|n| object_mismatch(old, new, n, &check.prefix, &check.fix))
        .map(|message| message.as_str().to_owned())
        .collect()
}

/// The shape of the payload type `name` from `types`, with its nested
/// types (those in `path`, being expanded, left out).
pub fn shape(
    name: &str,
    types: &BTreeMap<String, TypeEntry>,
    path: &mut Vec<String>,
) -> Option<&'static TypeShape<'static>> {
    let entry = types.get(name)?;
    path.push(name.to_owned());
    let struct_fields = fields(&entry.fields, types, path);
    let variants: Vec<VariantShape<'static>> = entry
        .variants
        .iter()
        .map(|variant| VariantShape {
            name: leak(&variant.name),
            rust_name: leak(variant.rust_name()),
            kind: variant.kind,
            fields: fields(&variant.fields, types, path),
        })
        .collect();
    let shape = TypeShape {
        name: leak(name),
        kind: entry.kind,
        rename_all: leak(entry.rename_all.as_deref().unwrap_or("")),
        repr: leak(entry.repr.as_deref().unwrap_or("")),
        fields: struct_fields,
        variants: Box::leak(variants.into_boxed_slice()),
        closed: entry.closed,
    };
    path.pop();
    Some(Box::leak(Box::new(shape)))
}

/// The shapes of `fields`, whose payload types are in `types` (those in
/// `path`, being expanded, left out).
pub fn fields(
    fields: &[FieldEntry],
    types: &BTreeMap<String, TypeEntry>,
    path: &[String],
) -> &'static [FieldShape<'static>] {
    let shapes: Vec<FieldShape<'static>> = fields
        .iter()
        .map(|field| {
            let nested = if field.opaque {
                Vec::new()
            } else {
                types_in(&field.ty, types, path)
            };
            FieldShape {
                name: leak(&field.name),
                rust_name: leak(field.rust_name()),
                ty: leak(&field.ty),
                wire: leak(&json_of(&field.ty, types)),
                optional: field.optional,
                default: field.default,
                flatten: field.flatten,
                omittable: field.omittable,
                types: Box::leak(nested.into_boxed_slice()),
            }
        })
        .collect();
    Box::leak(shapes.into_boxed_slice())
}

/// The shapes of the payload types in the type `ty`, from `types` (those
/// in `path`, being expanded, left out).
pub fn types_in(
    ty: &str,
    types: &BTreeMap<String, TypeEntry>,
    path: &[String],
) -> Vec<&'static TypeShape<'static>> {
    ty::payload_names_in(ty, &[])
        .iter()
        .filter(|inner| !path.contains(inner))
        .filter_map(|inner| shape(inner, types, &mut path.to_vec()))
        .collect()
}

fn leak(text: &str) -> &'static str {
    Box::leak(text.to_owned().into_boxed_str())
}
