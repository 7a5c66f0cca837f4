//! Whether a decoder reads every payload a recorded event version can be
//! written as: the consumer's side of the contract (`cargo outbox check`).
//!
//! The writer is a producer's recorded version (from its exported lock),
//! the reader a consumer's own struct for that version, recorded the same
//! way from the consumer's sources. Both are compared as JSON, the way
//! serde reads it: by key, never by Rust name or field order; newtypes and
//! `#[serde(transparent)]` structs are what they hold; nested payload types
//! are matched by where they are used, so a reader's own copies under other
//! names (`LineV1` for the producer's `Line`) are fine. Readers ignore keys
//! they do not know (the contract refuses `deny_unknown_fields`).
//!
//! A reader fails on a payload when it requires a key the writer may leave
//! out or never writes, reads a value as a type that refuses what the
//! writer writes there (`null` into a non-`Option`, a wider integer into a
//! narrower one, a float into an integer), misses a variant of an enum, or
//! reads an enum in another representation.

use std::collections::{BTreeMap, BTreeSet};

use syn::Type;

use crate::schema_lock::{EventEntry, FieldEntry, TypeEntry, VariantEntry, json_of};
use crate::shape::Kind;

/// Every reason the decoder `reader` cannot read a payload of the recorded
/// version `writer`, one line each naming the path (`OrderPlaced.lines[].qty`);
/// empty if it reads them all.
pub fn problems(writer: &EventEntry, reader: &EventEntry) -> Vec<String> {
    let mut check = Check {
        writer: &writer.types,
        reader: &reader.types,
        compared: BTreeSet::new(),
        problems: Vec::new(),
    };
    check.object(&writer.event, &writer.fields, &reader.fields);
    check.problems
}

/// One comparison of a writer's and a reader's payload types.
struct Check<'a> {
    writer: &'a BTreeMap<String, TypeEntry>,
    reader: &'a BTreeMap<String, TypeEntry>,
    /// (writer type, reader type) pairs compared or being compared, so a
    /// recursive type ends.
    compared: BTreeSet<(String, String)>,
    problems: Vec<String>,
}

/// One key of a JSON object, as one side writes or reads it.
struct Key<'a> {
    field: &'a FieldEntry,
    /// The key may be missing: the field is omittable, or it comes from a
    /// flattened `Option` of a struct.
    may_be_missing: bool,
    /// The field can do without it: an `Option` or `#[serde(default)]`.
    can_be_missing: bool,
}

/// The keys of an object with `fields`, flattened structs' keys included.
fn keys<'a>(
    fields: &'a [FieldEntry],
    types: &'a BTreeMap<String, TypeEntry>,
    inside_optional: bool,
    out: &mut Vec<Key<'a>>,
) {
    for field in fields {
        if field.flatten {
            let optional = field.optional || inside_optional;
            let json = json_of(&field.ty, types);
            let inner = match syn::parse_str::<Type>(&json) {
                Ok(ty) => match named(&ty) {
                    Some((name, args)) if name == "Option" && args.len() == 1 => {
                        named(args[0]).map(|(name, _)| name)
                    }
                    Some((name, _)) => Some(name),
                    None => None,
                },
                Err(_) => None,
            };
            // A flattened map takes any other keys: nothing a reader requires.
            if let Some(entry) = inner.as_deref().and_then(|name| types.get(name)) {
                keys(&entry.fields, types, optional, out);
            }
            continue;
        }
        out.push(Key {
            field,
            may_be_missing: field.omittable || inside_optional,
            can_be_missing: field.optional || field.default || inside_optional,
        });
    }
}

/// [`named`]'s result, borrowed for matching.
fn view<'n, 't>(named: &'n Option<(String, Vec<&'t Type>)>) -> Option<(&'n str, &'n [&'t Type])> {
    named
        .as_ref()
        .map(|(name, args)| (name.as_str(), args.as_slice()))
}

/// `Name` and its type arguments, if `ty` is a path.
fn named(ty: &Type) -> Option<(String, Vec<&Type>)> {
    let Type::Path(path) = ty else { return None };
    let last = path.path.segments.last()?;
    Some((last.ident.to_string(), crate::ty::type_args(last)))
}

impl Check<'_> {
    fn problem(&mut self, path: &str, what: String) {
        self.problems.push(format!("`{path}`: {what}"));
    }

    /// A JSON object of the writer's `written` fields read by `read`.
    fn object(&mut self, path: &str, written: &[FieldEntry], read: &[FieldEntry]) {
        let (mut writes, mut reads) = (Vec::new(), Vec::new());
        keys(written, self.writer, false, &mut writes);
        keys(read, self.reader, false, &mut reads);
        for key in &reads {
            let at = format!("{path}.{}", key.field.name);
            // serde reads a key under the field's name or any alias, and
            // refuses a payload with two of them.
            let reads_key = |w: &&Key<'_>| {
                w.field.name == key.field.name || key.field.aliases.contains(&w.field.name)
            };
            let both: Vec<&str> = writes
                .iter()
                .filter(reads_key)
                .map(|w| w.field.name.as_str())
                .collect();
            if let [first, second, ..] = both.as_slice() {
                self.problem(
                    &at,
                    format!(
                        "the producer writes both `{first}` and `{second}`, which the decoder \
                         reads as this one field (serde refuses the duplicate); drop the alias"
                    ),
                );
                continue;
            }
            let Some(written) = writes.iter().find(reads_key) else {
                if !key.can_be_missing {
                    self.problem(
                        &at,
                        "the decoder requires this key, which the producer never writes; \
                         make it an Option or give it #[serde(default)]"
                            .to_owned(),
                    );
                }
                continue;
            };
            if written.may_be_missing && !key.can_be_missing {
                self.problem(
                    &at,
                    "the producer may leave this key out, which the decoder requires; make \
                     it an Option or give it #[serde(default)]"
                        .to_owned(),
                );
            }
            if written.field.opaque || key.field.opaque {
                if written.field.ty != key.field.ty && !key.field.opaque {
                    self.problem(
                        &at,
                        format!(
                            "the producer writes `{}` (opaque to the contract), the decoder \
                             reads `{}`",
                            written.field.ty, key.field.ty
                        ),
                    );
                }
                continue;
            }
            let w = json_of(&written.field.ty, self.writer);
            let r = json_of(&key.field.ty, self.reader);
            match (syn::parse_str::<Type>(&w), syn::parse_str::<Type>(&r)) {
                (Ok(w), Ok(r)) => self.value(&at, &w, &r),
                _ if w == r => {}
                _ => self.problem(
                    &at,
                    format!("the producer writes `{w}`, the decoder reads `{r}`"),
                ),
            }
        }
    }

    /// A value the writer writes as `w` (a [`json_of`] spelling), read as `r`.
    fn value<'t>(&mut self, path: &str, w: &'t Type, r: &'t Type) {
        let (wn, rn) = (named(w), named(r));
        match (view(&wn), view(&rn)) {
            (Some(("Option", wa)), Some(("Option", ra))) if wa.len() == 1 && ra.len() == 1 => {
                return self.value(path, wa[0], ra[0]);
            }
            (Some(("Option", wa)), _) if wa.len() == 1 => {
                self.problem(
                    path,
                    format!(
                        "the producer may write null here, which the decoder's `{}` does not \
                         read; make it an Option",
                        spell(r)
                    ),
                );
                return self.value(path, wa[0], r);
            }
            (_, Some(("Option", ra))) if ra.len() == 1 => return self.value(path, w, ra[0]),
            (Some(("Vec", wa)), Some(("Vec", ra))) if wa.len() == 1 && ra.len() == 1 => {
                return self.value(&format!("{path}[]"), wa[0], ra[0]);
            }
            (Some(("Map", wa)), Some(("Map", ra))) if wa.len() == 2 && ra.len() == 2 => {
                self.value(&format!("{path}{{key}}"), wa[0], ra[0]);
                return self.value(&format!("{path}{{}}"), wa[1], ra[1]);
            }
            _ => {}
        }
        if let (Type::Tuple(wt), Type::Tuple(rt)) = (w, r) {
            if wt.elems.len() != rt.elems.len() {
                return self.mismatch(path, w, r);
            }
            for (index, (w, r)) in wt.elems.iter().zip(&rt.elems).enumerate() {
                self.value(&format!("{path}.{index}"), w, r);
            }
            return;
        }
        if let Type::Array(wa) = w {
            match (r, view(&rn)) {
                (Type::Array(ra), _) if spell(&ra.len) == spell(&wa.len) => {
                    return self.value(&format!("{path}[]"), &wa.elem, &ra.elem);
                }
                (_, Some(("Vec", ra))) if ra.len() == 1 => {
                    return self.value(&format!("{path}[]"), &wa.elem, ra[0]);
                }
                _ => return self.mismatch(path, w, r),
            }
        }
        let (Some((wname, _)), Some((rname, _))) = (&wn, &rn) else {
            if spell(w) != spell(r) {
                self.mismatch(path, w, r);
            }
            return;
        };
        let (wname, rname) = (wname.as_str(), rname.as_str());
        match (self.writer.get(wname), self.reader.get(rname)) {
            (Some(wt), Some(rt)) => self.payload(path, (wname, wt), (rname, rt)),
            // serde_json's `Value` reads any JSON.
            (_, None) if rname == "Value" => {}
            (None, None) if leaf_reads(wname, rname) => {}
            _ if spell(w) == spell(r) => {}
            _ => self.mismatch(path, w, r),
        }
    }

    fn mismatch(&mut self, path: &str, w: &Type, r: &Type) {
        self.problem(
            path,
            format!(
                "the producer writes `{}`, which the decoder's `{}` does not read",
                spell(w),
                spell(r)
            ),
        );
    }

    /// The writer's payload type `w` read as the reader's `r`.
    fn payload(&mut self, path: &str, w: (&str, &TypeEntry), r: (&str, &TypeEntry)) {
        if !self.compared.insert((w.0.to_owned(), r.0.to_owned())) {
            return;
        }
        let ((wname, w), (rname, r)) = (w, r);
        match (w.kind, r.kind) {
            (Kind::Struct, Kind::Struct) => self.object(path, &w.fields, &r.fields),
            (Kind::Unit, Kind::Unit) => {}
            (Kind::Tuple, Kind::Tuple) => self.unnamed(path, &w.fields, &r.fields),
            (Kind::Enum, Kind::Enum) => self.enumeration(path, w, r),
            _ => self.problem(
                path,
                format!(
                    "the producer writes `{wname}` as a {}, the decoder's `{rname}` reads a {}",
                    kind_name(w.kind),
                    kind_name(r.kind)
                ),
            ),
        }
    }

    /// The fields of a tuple struct or variant, as a JSON array.
    fn unnamed(&mut self, path: &str, written: &[FieldEntry], read: &[FieldEntry]) {
        if written.len() != read.len() {
            self.problem(
                path,
                format!(
                    "the producer writes {} value(s) here, the decoder reads {}",
                    written.len(),
                    read.len()
                ),
            );
            return;
        }
        for (index, (w, r)) in written.iter().zip(read).enumerate() {
            let at = if written.len() == 1 {
                path.to_owned()
            } else {
                format!("{path}.{index}")
            };
            let (w, r) = (json_of(&w.ty, self.writer), json_of(&r.ty, self.reader));
            match (syn::parse_str::<Type>(&w), syn::parse_str::<Type>(&r)) {
                (Ok(w), Ok(r)) => self.value(&at, &w, &r),
                _ if w == r => {}
                _ => self.problem(
                    &at,
                    format!("the producer writes `{w}`, the decoder reads `{r}`"),
                ),
            }
        }
    }

    /// An enum: the same representation, and every written variant read.
    fn enumeration(&mut self, path: &str, w: &TypeEntry, r: &TypeEntry) {
        let repr = |entry: &TypeEntry| entry.repr.clone().unwrap_or_else(|| "external".into());
        if repr(w) != repr(r) {
            self.problem(
                path,
                format!(
                    "the producer writes this enum {}, the decoder reads it {}",
                    repr(w),
                    repr(r)
                ),
            );
            return;
        }
        // serde reads an unknown tag as the `#[serde(other)]` unit variant
        // of an internally tagged enum, and of an adjacently tagged one when
        // no content comes with the tag (a unit variant).
        let has_other = r.variants.iter().any(|read| read.other);
        let reads_unknown = |variant: &VariantEntry| {
            has_other
                && (repr(r).starts_with("internal")
                    || repr(r).starts_with("adjacent") && variant.kind == Kind::Unit)
        };
        for variant in &w.variants {
            let at = format!("{path}::{}", variant.name);
            let reads = |read: &&VariantEntry| {
                read.name == variant.name || read.aliases.contains(&variant.name)
            };
            match r.variants.iter().find(reads) {
                None if reads_unknown(variant) => {}
                None => self.problem(
                    &at,
                    "the producer writes this variant, which the decoder does not have; add it"
                        .to_owned(),
                ),
                Some(read) => self.variant(&at, variant, read),
            }
        }
    }

    fn variant(&mut self, path: &str, w: &VariantEntry, r: &VariantEntry) {
        match (w.kind, r.kind) {
            (Kind::Unit, Kind::Unit) => {}
            (Kind::Struct, Kind::Struct) => self.object(path, &w.fields, &r.fields),
            (Kind::Tuple, Kind::Tuple) => self.unnamed(path, &w.fields, &r.fields),
            _ => self.problem(
                path,
                format!(
                    "the producer writes a {} variant, the decoder reads a {} variant",
                    kind_name(w.kind),
                    kind_name(r.kind)
                ),
            ),
        }
    }
}

fn kind_name(kind: Kind) -> &'static str {
    match kind {
        Kind::Struct => "struct",
        Kind::Tuple => "tuple",
        Kind::Unit => "unit",
        Kind::Enum => "enum",
    }
}

/// `ty` spelled as in the lock.
fn spell(ty: &impl quote::ToTokens) -> String {
    crate::ty::normalize(&syn::parse_quote!(#ty))
}

/// The range of an integer type, as (min, max) in i128 (`u128` is capped).
fn int_range(name: &str) -> Option<(i128, i128)> {
    Some(match name {
        "u8" => (0, u8::MAX.into()),
        "u16" => (0, u16::MAX.into()),
        "u32" => (0, u32::MAX.into()),
        "u64" | "usize" => (0, u64::MAX.into()),
        "u128" => (0, i128::MAX),
        "i8" => (i8::MIN.into(), i8::MAX.into()),
        "i16" => (i16::MIN.into(), i16::MAX.into()),
        "i32" => (i32::MIN.into(), i32::MAX.into()),
        "i64" | "isize" => (i64::MIN.into(), i64::MAX.into()),
        "i128" => (i128::MIN, i128::MAX),
        _ => return None,
    })
}

/// Whether a reader of the leaf `read` reads every value of the leaf
/// `written`: the same type, an integer into a wider one or into a float,
/// `f32` into `f64`, a `char` into a `String`.
fn leaf_reads(written: &str, read: &str) -> bool {
    if written == read {
        return true;
    }
    match (int_range(written), int_range(read)) {
        (Some((wmin, wmax)), Some((rmin, rmax))) => rmin <= wmin && wmax <= rmax,
        (Some(_), None) => matches!(read, "f32" | "f64"),
        _ => matches!((written, read), ("f32", "f64") | ("char", "String")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema_lock::Lock;

    fn entry(toml: &str) -> EventEntry {
        let lock: Lock = toml::from_str(toml).unwrap();
        lock.events.into_iter().next().unwrap()
    }

    const WRITER: &str = r#"
        [[event]]
        event = "OrderPlaced"
        version = 1
        aggregate = "Order"
        fields = [
            { name = "order_id", type = "OrderId" },
            { name = "lines", type = "Vec<Line>" },
            { name = "coupon", type = "Option<String>", optional = true },
            { name = "note", type = "Option<String>", optional = true, omittable = true },
            { name = "status", type = "Status" },
        ]
        [event.types.OrderId]
        kind = "tuple"
        fields = [{ name = "0", type = "i64" }]
        [event.types.Line]
        kind = "struct"
        fields = [{ name = "sku", type = "String" }, { name = "qty", type = "u16" }]
        [event.types.Status]
        kind = "enum"
        variants = [{ name = "Open", kind = "unit" }, { name = "Closed", kind = "unit" }]
    "#;

    #[test]
    fn a_copy_under_other_names_with_wider_types_reads_everything() {
        let reader = entry(
            r#"
            [[event]]
            event = "OrderPlaced"
            version = 1
            aggregate = "Order"
            fields = [
                { name = "order_id", type = "i64" },
                { name = "lines", type = "Box<[LineV1]>" },
                { name = "coupon", type = "Option<String>", optional = true },
                { name = "note", type = "Option<String>", optional = true },
                { name = "status", type = "StatusV1" },
                { name = "later", type = "Option<u8>", optional = true },
            ]
            [event.types.LineV1]
            kind = "struct"
            fields = [{ name = "qty", type = "i64" }]
            [event.types.StatusV1]
            kind = "enum"
            variants = [
                { name = "Open", kind = "unit" },
                { name = "Closed", kind = "unit" },
                { name = "Lost", kind = "unit" },
            ]
            "#,
        );
        assert_eq!(problems(&entry(WRITER), &reader), Vec::<String>::new());
    }

    #[test]
    fn every_unreadable_path_is_named() {
        let reader = entry(
            r#"
            [[event]]
            event = "OrderPlaced"
            version = 1
            aggregate = "Order"
            fields = [
                { name = "order_id", type = "String" },
                { name = "lines", type = "Vec<Line>" },
                { name = "coupon", type = "String" },
                { name = "note", type = "String", default = true },
                { name = "status", type = "Status" },
                { name = "total", type = "i64" },
            ]
            [event.types.Line]
            kind = "struct"
            fields = [{ name = "qty", type = "u8" }]
            [event.types.Status]
            kind = "enum"
            variants = [{ name = "Open", kind = "unit" }]
            "#,
        );
        let found = problems(&entry(WRITER), &reader);
        let paths: Vec<&str> = found
            .iter()
            .map(|line| line.split('`').nth(1).unwrap())
            .collect();
        assert_eq!(
            paths,
            [
                "OrderPlaced.order_id",
                "OrderPlaced.lines[].qty",
                "OrderPlaced.coupon",
                "OrderPlaced.note",
                "OrderPlaced.status::Closed",
                "OrderPlaced.total",
            ],
            "{found:#?}"
        );
        assert!(found[2].contains("null"), "{}", found[2]);
        assert!(found[3].contains("null"), "{}", found[3]);
    }

    #[test]
    fn a_required_key_the_producer_may_leave_out_is_named() {
        let reader = entry(
            r#"
            [[event]]
            event = "OrderPlaced"
            version = 1
            aggregate = "Order"
            fields = [{ name = "note", type = "String" }]
            "#,
        );
        let found = problems(&entry(WRITER), &reader);
        assert_eq!(found.len(), 2, "{found:#?}");
        assert!(found[0].contains("may leave this key out"), "{}", found[0]);
        assert!(found[1].contains("null"), "{}", found[1]);
    }

    #[test]
    fn flattened_keys_and_enum_representations() {
        let writer = entry(
            r#"
            [[event]]
            event = "Shipped"
            version = 1
            aggregate = "Order"
            fields = [
                { name = "address", type = "Address", flatten = true },
                { name = "carrier", type = "Carrier" },
            ]
            [event.types.Address]
            kind = "struct"
            fields = [{ name = "city", type = "String" }]
            [event.types.Carrier]
            kind = "enum"
            repr = "internal(type)"
            variants = [{ name = "Post", kind = "struct", fields = [{ name = "code", type = "u32" }] }]
            "#,
        );
        let reader = entry(
            r#"
            [[event]]
            event = "Shipped"
            version = 1
            aggregate = "Order"
            fields = [
                { name = "city", type = "String" },
                { name = "carrier", type = "Carrier" },
            ]
            [event.types.Carrier]
            kind = "enum"
            variants = [{ name = "Post", kind = "struct", fields = [{ name = "code", type = "u64" }] }]
            "#,
        );
        let found = problems(&writer, &reader);
        assert_eq!(found.len(), 1, "{found:#?}");
        assert!(
            found[0].starts_with("`Shipped.carrier`") && found[0].contains("internal(type)"),
            "{}",
            found[0]
        );
    }

    #[test]
    fn a_tagged_enum_with_an_other_variant_reads_unknown_variants() {
        let writer = entry(
            r#"
            [[event]]
            event = "Shipped"
            version = 1
            aggregate = "Order"
            fields = [{ name = "carrier", type = "Carrier" }]
            [event.types.Carrier]
            kind = "enum"
            repr = "internal(type)"
            variants = [
                { name = "Post", kind = "unit" },
                { name = "Drone", kind = "struct", fields = [{ name = "id", type = "u32" }] },
            ]
            "#,
        );
        let reader = |repr: &str, other: bool| {
            entry(&format!(
                r#"
                [[event]]
                event = "Shipped"
                version = 1
                aggregate = "Order"
                fields = [{{ name = "carrier", type = "Carrier" }}]
                [event.types.Carrier]
                kind = "enum"
                repr = "{repr}"
                variants = [
                    {{ name = "Post", kind = "unit" }},
                    {{ name = "Unknown", kind = "unit", other = {other} }},
                ]
                "#
            ))
        };
        assert_eq!(
            problems(&writer, &reader("internal(type)", true)),
            Vec::<String>::new()
        );
        let without = problems(&writer, &reader("internal(type)", false));
        assert_eq!(without.len(), 1, "{without:#?}");
        assert!(
            without[0].starts_with("`Shipped.carrier::Drone`"),
            "{}",
            without[0]
        );
    }

    #[test]
    fn a_decoder_reads_a_key_under_an_alias() {
        let writer = entry(
            r#"
            [[event]]
            event = "Picked"
            version = 1
            aggregate = "Order"
            fields = [{ name = "qty", type = "u32" }]
            "#,
        );
        let mut reader = entry(
            r#"
            [[event]]
            event = "Picked"
            version = 1
            aggregate = "Order"
            fields = [{ name = "quantity", type = "u64" }]
            "#,
        );
        let without = problems(&writer, &reader);
        assert_eq!(without.len(), 1, "{without:#?}");
        assert!(
            without[0].starts_with("`Picked.quantity`"),
            "{}",
            without[0]
        );
        // `#[serde(alias = "qty")]`, as the model reads it from a decoder.
        reader.fields[0].aliases = vec!["qty".to_owned()];
        assert_eq!(problems(&writer, &reader), Vec::<String>::new());

        // A producer writing both names breaks such a decoder.
        let mut both = writer.clone();
        let mut quantity = both.fields[0].clone();
        quantity.name = "quantity".to_owned();
        both.fields.push(quantity);
        let found = problems(&both, &reader);
        assert_eq!(found.len(), 1, "{found:#?}");
        assert!(found[0].contains("writes both"), "{}", found[0]);
    }

    #[test]
    fn leaves_widen_but_never_narrow() {
        assert!(leaf_reads("i32", "i64"));
        assert!(leaf_reads("u32", "i64"));
        assert!(leaf_reads("u64", "f64"));
        assert!(leaf_reads("char", "String"));
        assert!(!leaf_reads("i64", "i32"));
        assert!(!leaf_reads("i8", "u64"));
        assert!(!leaf_reads("f64", "i64"));
        assert!(!leaf_reads("String", "char"));
    }
}
