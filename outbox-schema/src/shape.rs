//! Payload shapes as constants, and the rules that decide whether a shape is
//! still compatible with the one recorded in the lock.
//!
//! Everything here is `const fn` over borrowed data, so the same rules run in
//! three places: in the derive while it expands an event (the event's own
//! fields), in code the derive generates (payload types nested in an event,
//! which only the compiler can see, compared during constant evaluation),
//! and in `cargo outbox lock`.
//!
//! A recorded shape stays compatible with the current one when every
//! recorded field is still there with the same type and is not more
//! required than before, every new field is optional (`Option<_>` or
//! `#[serde(default)]`), and no enum variant disappeared. Added variants are
//! accepted (they are new values, not a new shape of old ones) unless the
//! recorded enum is [`TypeShape::closed`]: under `compat = "full"` a new
//! variant is a change old readers of the closed enum cannot read.

/// What a payload type is on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(
    feature = "model",
    derive(serde::Serialize, serde::Deserialize),
    serde(rename_all = "lowercase")
)]
pub enum Kind {
    /// A struct with named fields: a JSON object.
    Struct,
    /// A tuple struct (one field: a newtype, written as the field).
    Tuple,
    /// A unit struct.
    Unit,
    /// An enum; its representation is in [`TypeShape::repr`].
    Enum,
}

impl Kind {
    /// The word for the kind in messages and in the lock.
    pub const fn as_str(self) -> &'static str {
        match self {
            Kind::Struct => "struct",
            Kind::Tuple => "tuple",
            Kind::Unit => "unit",
            Kind::Enum => "enum",
        }
    }
}

/// The shape of a payload type (a struct or enum deriving `EventPayload`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TypeShape<'a> {
    /// The Rust name of the type.
    pub name: &'a str,
    /// Struct, tuple, unit or enum.
    pub kind: Kind,
    /// `#[serde(rename_all = "..")]`, or `""`.
    pub rename_all: &'a str,
    /// An enum's representation: `external`, `internal(tag)`,
    /// `adjacent(tag, content)` or `untagged`; `""` for structs.
    pub repr: &'a str,
    /// The serialized fields of a struct (tuple fields are named `0`, `1`, ..).
    pub fields: &'a [FieldShape<'a>],
    /// The serialized variants of an enum.
    pub variants: &'a [VariantShape<'a>],
    /// A recorded enum under `compat = "full"`: its variants are all its
    /// readers know, so a new one is incompatible. `false` for current
    /// shapes.
    pub closed: bool,
}

/// One serialized variant of an enum payload type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VariantShape<'a> {
    /// The name serde writes.
    pub name: &'a str,
    /// The Rust variant name.
    pub rust_name: &'a str,
    /// Unit, tuple or struct variant.
    pub kind: Kind,
    /// The variant's fields.
    pub fields: &'a [FieldShape<'a>],
}

/// One serialized field of an event or payload type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FieldShape<'a> {
    /// The name serde writes.
    pub name: &'a str,
    /// The Rust field name.
    pub rust_name: &'a str,
    /// The normalized type, like `Vec<Money>`.
    pub ty: &'a str,
    /// The JSON the type is written as, spelled as a type (`outbox_schema::ty::wire`
    /// with the `model` feature): `Box<Money>` and `&Money` are `Money`,
    /// every sequence is `Vec<_>`, every map `Map<_, _>`; in a recorded
    /// shape, newtypes are spelled as what they hold. Types are compared by
    /// this spelling, with newtypes in `types` read as what they hold
    /// ([`json_eq`]).
    pub wire: &'a str,
    /// The type is an `Option`.
    pub optional: bool,
    /// The field has `#[serde(default)]`.
    pub default: bool,
    /// The field has `#[serde(flatten)]`.
    pub flatten: bool,
    /// The field has `#[serde(skip_serializing_if)]`: its key may be left out.
    pub omittable: bool,
    /// The shapes of the payload types inside `ty`, in order of appearance.
    pub types: &'a [&'a TypeShape<'a>],
}

impl FieldShape<'_> {
    /// A reader finds the field optional: missing is fine.
    pub const fn tolerant(&self) -> bool {
        self.optional || self.default
    }
}

impl<'a> TypeShape<'a> {
    /// The one field a newtype (`struct Sku(String)`) or a
    /// `#[serde(transparent)]` struct is written as, if this is one.
    pub const fn newtype_field(&self) -> Option<&FieldShape<'a>> {
        let wraps_one = matches!(self.kind, Kind::Tuple) || str_eq(self.repr, "transparent");
        match self.fields {
            [only] if wraps_one && !only.flatten => Some(only),
            _ => None,
        }
    }
}

/// Whether the type spelled `actual` writes JSON that readers of the type
/// spelled `recorded` read (both as `FieldShape::wire` spells them), given
/// the payload types inside each (`recorded_types`, `actual_types`):
///
/// - each newtype among `actual_types` is read as the field it holds, so a
///   field recorded as `String` may become `Sku` for `struct Sku(String)`
///   (recorded newtypes are already spelled so);
/// - a payload type named otherwise than the recorded one in its place is
///   compared with it field by field ([`first_problem`]), so a decoder kept
///   for an old version may have its own copies of the old nested types
///   (`MoneyV1` for the recorded `Money`);
/// - a payload type of the recorded name is taken as it: the nested
///   comparison reports what changed in it, with its own message.
pub const fn json_eq(
    recorded: &str,
    recorded_types: &[&TypeShape<'_>],
    actual: &str,
    actual_types: &[&TypeShape<'_>],
) -> bool {
    json_mismatch(recorded, recorded_types, actual, actual_types).is_ok()
}

/// [`json_eq`], with why not: the first incompatible change between a
/// payload type and the recorded one of another name in its place, if that
/// is the reason.
pub const fn json_mismatch<'a>(
    recorded: &str,
    recorded_types: &[&TypeShape<'a>],
    actual: &str,
    actual_types: &[&TypeShape<'a>],
) -> Result<(), Option<Problem<'a>>> {
    let actual = actual.as_bytes();
    let sides = Sides {
        recorded: recorded.as_bytes(),
        recorded_types,
    };
    match sides.match_json(0, actual, 0, actual.len(), actual_types, 0) {
        Ok(end) if end == recorded.len() => Ok(()),
        Ok(_) => Err(None),
        Err(problem) => Err(problem),
    }
}

/// What a field's type changed since its recorded type, found while the
/// crate compiles (see `compare::Unsettled`), as a message: `None` if
/// readers of the recorded type read it ([`json_eq`]); else, when a payload
/// type of another name changed against the recorded one, `nested_prefix`,
/// where and what changed, `fix` and the way to keep the old shape; else
/// `message`. The code `#[derive(DomainEvent)]` generates panics with it.
pub const fn settle_mismatch(
    recorded: &str,
    recorded_types: &[&TypeShape<'_>],
    actual: &str,
    actual_types: &[&TypeShape<'_>],
    nested_prefix: &str,
    fix: &str,
    message: &str,
) -> Option<Message> {
    match json_mismatch(recorded, recorded_types, actual, actual_types) {
        Ok(()) => None,
        Err(Some(problem)) => Some(Message::report(nested_prefix, &problem, fix)),
        Err(None) => Some(Message::new().push(message)),
    }
}

/// What the fields of an event changed as a JSON object since the
/// recorded ones (see [`fields_problem`]), as a message: `prefix`, what
/// changed, `fix` and the way to keep the old shape; the problem after `n`
/// others; `None` if there is no such problem. The code
/// `#[derive(DomainEvent)]` generates for an event that flattens a payload
/// type panics with it.
pub const fn object_mismatch(
    recorded: &[FieldShape<'_>],
    actual: &[FieldShape<'_>],
    n: usize,
    prefix: &str,
    fix: &str,
) -> Option<Message> {
    match fields_problem_after("", "", recorded, actual, &mut { n }) {
        Some(problem) => Some(Message::report(prefix, &problem, fix)),
        None => None,
    }
}

/// How deep newtypes may hold newtypes before [`json_eq`] gives up.
const NEWTYPE_DEPTH: usize = 16;

/// The recorded side of [`json_eq`].
struct Sides<'s, 'a> {
    recorded: &'s [u8],
    recorded_types: &'s [&'s TypeShape<'a>],
}

impl<'a> Sides<'_, 'a> {
    /// Matches `actual[from..to]` against the recorded spelling from `at`,
    /// reading payload types among `types` as [`json_eq`] says; where the
    /// match ends in the recorded spelling, or why it fails.
    const fn match_json(
        &self,
        mut at: usize,
        actual: &[u8],
        mut from: usize,
        to: usize,
        types: &[&TypeShape<'a>],
        depth: usize,
    ) -> Result<usize, Option<Problem<'a>>> {
        let recorded = self.recorded;
        if depth > NEWTYPE_DEPTH {
            return Err(None);
        }
        while from < to {
            if !is_ident_byte(actual[from]) {
                if at >= recorded.len() || recorded[at] != actual[from] {
                    return Err(None);
                }
                at += 1;
                from += 1;
                continue;
            }
            let start = from;
            while from < to && is_ident_byte(actual[from]) {
                from += 1;
            }
            // Payload types are never generic, so `Name<..>` is none.
            let generic = from < to && actual[from] == b'<';
            let payload = if generic {
                None
            } else {
                named(types, actual, start, from)
            };
            if let Some(shape) = payload
                && let Some(field) = shape.newtype_field()
            {
                let wire = field.wire.as_bytes();
                match self.match_json(at, wire, 0, wire.len(), field.types, depth + 1) {
                    Ok(next) => at = next,
                    Err(problem) => return Err(problem),
                }
                continue;
            }
            let mut end = at;
            while end < recorded.len() && is_ident_byte(recorded[end]) {
                end += 1;
            }
            if !bytes_eq(recorded, at, end, actual, start, from) {
                let recorded_shape = named(self.recorded_types, recorded, at, end);
                let (Some(actual_shape), Some(recorded_shape)) = (payload, recorded_shape) else {
                    return Err(None);
                };
                if let Some(problem) = first_problem(recorded_shape, actual_shape) {
                    return Err(Some(problem));
                }
            }
            at = end;
        }
        Ok(at)
    }
}

/// `a[a_start..a_end] == b[b_start..b_end]`, in a constant.
const fn bytes_eq(
    a: &[u8],
    a_start: usize,
    a_end: usize,
    b: &[u8],
    b_start: usize,
    b_end: usize,
) -> bool {
    if a_end - a_start != b_end - b_start {
        return false;
    }
    let mut i = 0;
    while a_start + i < a_end {
        if a[a_start + i] != b[b_start + i] {
            return false;
        }
        i += 1;
    }
    true
}

const fn is_ident_byte(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || byte == b'_'
}

/// The payload type among `types` named `text[start..end]`.
const fn named<'t, 'a>(
    types: &'t [&'t TypeShape<'a>],
    text: &[u8],
    start: usize,
    end: usize,
) -> Option<&'t TypeShape<'a>> {
    let mut t = 0;
    while t < types.len() {
        let name = types[t].name.as_bytes();
        if bytes_eq(name, 0, name.len(), text, start, end) {
            return Some(types[t]);
        }
        t += 1;
    }
    None
}

/// How a shape changed incompatibly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// A recorded field is gone.
    FieldRemoved,
    /// A recorded field is written under another name (`from` -> `to`).
    FieldRenamed,
    /// A field's type changed (`from` -> `to`).
    TypeChanged,
    /// A field lost `#[serde(default)]`.
    MadeRequired,
    /// A field readers require may now be left out of the JSON.
    MadeOmittable,
    /// A field gained or lost `#[serde(flatten)]` (`to` is the new state).
    FlattenChanged,
    /// A new field that a reader of old payloads cannot fill in.
    NewRequiredField,
    /// `rename_all` changed (`from` -> `to`, `""` for none).
    RenameAllChanged,
    /// An enum's representation changed.
    ReprChanged,
    /// The type became another kind (`from` -> `to`).
    KindChanged,
    /// A recorded variant is gone (removed or renamed).
    VariantRemoved,
    /// A variant became another kind (`from` -> `to`).
    VariantKindChanged,
    /// A variant was added to a closed enum (`compat = "full"`).
    VariantAdded,
}

/// One incompatible change, located.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Problem<'a> {
    /// What changed.
    pub change: Change,
    /// The payload type where it changed; `""` for an event's own fields.
    pub ty: &'a str,
    /// The variant where it changed, or `""`.
    pub variant: &'a str,
    /// The field or variant that changed.
    pub item: &'a str,
    /// The recorded value, where one applies.
    pub from: &'a str,
    /// The current value, where one applies.
    pub to: &'a str,
}

impl<'a> Problem<'a> {
    const fn new(change: Change, ty: &'a str, variant: &'a str, item: &'a str) -> Self {
        Self {
            change,
            ty,
            variant,
            item,
            from: "",
            to: "",
        }
    }

    const fn between(mut self, from: &'a str, to: &'a str) -> Self {
        self.from = from;
        self.to = to;
        self
    }
}

/// `a == b` for strings, in a constant.
pub const fn str_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// How `actual` changed from `recorded` (the same field by name), if
/// incompatibly. Nested payload types are not looked at.
pub const fn field_change(recorded: &FieldShape<'_>, actual: &FieldShape<'_>) -> Option<Change> {
    if !json_eq(recorded.wire, recorded.types, actual.wire, actual.types) {
        Some(Change::TypeChanged)
    } else if recorded.flatten != actual.flatten {
        Some(Change::FlattenChanged)
    } else if recorded.tolerant() && !actual.tolerant() {
        Some(Change::MadeRequired)
    } else if !recorded.tolerant() && actual.omittable {
        Some(Change::MadeOmittable)
    } else {
        None
    }
}

/// The problem `field_change` found, with its details.
pub const fn field_problem<'a>(
    ty: &'a str,
    variant: &'a str,
    recorded: &FieldShape<'a>,
    actual: &FieldShape<'a>,
) -> Option<Problem<'a>> {
    let Some(change) = field_change(recorded, actual) else {
        return None;
    };
    let problem = Problem::new(change, ty, variant, actual.name);
    Some(match change {
        Change::TypeChanged => problem.between(recorded.ty, actual.ty),
        Change::FlattenChanged if actual.flatten => problem.between("", "flattened"),
        Change::FlattenChanged => problem.between("flattened", ""),
        _ => problem,
    })
}

const fn find_field<'a, 'b>(
    fields: &'b [FieldShape<'a>],
    name: &str,
) -> Option<&'b FieldShape<'a>> {
    let mut i = 0;
    while i < fields.len() {
        if str_eq(fields[i].name, name) {
            return Some(&fields[i]);
        }
        i += 1;
    }
    None
}

/// The struct a `#[serde(flatten)]` field writes its fields from, if it is
/// one whose shape is known (a flattened map takes any keys and is
/// compared as a field).
const fn flattened<'a>(field: &FieldShape<'a>) -> Option<&'a TypeShape<'a>> {
    match field.types {
        [inner] if field.flatten && matches!(inner.kind, Kind::Struct) => Some(*inner),
        _ => None,
    }
}

/// How deep flattened structs may nest before the comparison stops
/// looking into them.
const FLATTEN_DEPTH: usize = 16;

/// The field of `fields` whose key is `name` in the JSON object they
/// write, looking into flattened structs; made optional and omittable when
/// a flattened `Option` on the way may leave it out.
const fn find_key<'a>(
    fields: &[FieldShape<'a>],
    name: &str,
    depth: usize,
) -> Option<FieldShape<'a>> {
    let mut i = 0;
    while i < fields.len() {
        let field = &fields[i];
        if let Some(inner) = flattened(field) {
            if depth < FLATTEN_DEPTH
                && let Some(mut found) = find_key(inner.fields, name, depth + 1)
            {
                // Readers fill it in, and writers may leave it out.
                found.optional |= field.optional;
                found.omittable |= field.optional;
                return Some(found);
            }
        } else if str_eq(field.name, name) {
            return Some(*field);
        }
        i += 1;
    }
    None
}

/// The first incompatible change from the `recorded` fields to the `actual`
/// ones, looking into nested payload types. They are compared as the JSON
/// object they write: the fields of a flattened struct are keys of that
/// object, so fields may move into or out of one.
pub const fn fields_problem<'a>(
    ty: &'a str,
    variant: &'a str,
    recorded: &[FieldShape<'a>],
    actual: &[FieldShape<'a>],
) -> Option<Problem<'a>> {
    fields_problem_after(ty, variant, recorded, actual, &mut 0)
}

/// The incompatible change of [`fields_problem`] that comes after `skip`
/// others, in the order they are found; `skip` is counted down by the
/// problems passed.
pub const fn fields_problem_after<'a>(
    ty: &'a str,
    variant: &'a str,
    recorded: &[FieldShape<'a>],
    actual: &[FieldShape<'a>],
    skip: &mut usize,
) -> Option<Problem<'a>> {
    let keys = Keys {
        ty,
        variant,
        recorded,
        actual,
    };
    match keys.recorded_problem(recorded, 0, skip) {
        Some(problem) => Some(problem),
        None => keys.new_problem(actual, false, 0, skip),
    }
}

/// Whether a problem just found is the one wanted; if not, it is counted
/// off `skip`.
const fn wanted(skip: &mut usize) -> bool {
    if *skip == 0 {
        true
    } else {
        *skip -= 1;
        false
    }
}

/// The two field lists [`fields_problem`] compares, as JSON objects.
struct Keys<'k, 'a> {
    ty: &'a str,
    variant: &'a str,
    recorded: &'k [FieldShape<'a>],
    actual: &'k [FieldShape<'a>],
}

impl<'a> Keys<'_, 'a> {
    /// The wanted problem (see [`fields_problem_after`]) with a recorded key
    /// among `fields` (of the recorded object, at flattening `depth`) gone
    /// or changed in the actual object.
    const fn recorded_problem(
        &self,
        fields: &[FieldShape<'a>],
        depth: usize,
        skip: &mut usize,
    ) -> Option<Problem<'a>> {
        let (ty, variant) = (self.ty, self.variant);
        let mut i = 0;
        while i < fields.len() {
            let old = &fields[i];
            i += 1;
            // A key of this name that gained or lost `flatten` is reported so.
            if let Some(same) = find_field(self.actual, old.name)
                && same.flatten != old.flatten
                && depth == 0
            {
                match field_problem(ty, variant, old, same) {
                    Some(problem) if wanted(skip) => return Some(problem),
                    _ => continue,
                }
            }
            if let Some(inner) = flattened(old)
                && depth < FLATTEN_DEPTH
            {
                match self.recorded_problem(inner.fields, depth + 1, skip) {
                    Some(problem) => return Some(problem),
                    None => continue,
                }
            }
            let Some(new) = find_key(self.actual, old.name, 0) else {
                if wanted(skip) {
                    return Some(self.gone(old));
                }
                continue;
            };
            let mut old = *old;
            if depth > 0 {
                // Within a flattened struct, `flatten` itself is not compared.
                old.flatten = new.flatten;
            }
            if let Some(problem) = field_problem(ty, variant, &old, &new) {
                if wanted(skip) {
                    return Some(problem);
                }
                continue;
            }
            // Nested types pair up by name: the same type is the same name.
            let mut t = 0;
            while t < old.types.len() {
                let mut u = 0;
                while u < new.types.len() {
                    if str_eq(old.types[t].name, new.types[u].name)
                        && let Some(problem) = problem_after(old.types[t], new.types[u], skip)
                    {
                        return Some(problem);
                    }
                    u += 1;
                }
                t += 1;
            }
        }
        None
    }

    /// What became of the recorded field `old`, gone under its key:
    /// renamed if an unrecorded field of the actual object has its Rust name,
    /// or is the only unrecorded one written as its type; else removed.
    const fn gone(&self, old: &FieldShape<'a>) -> Problem<'a> {
        let (mut same_rust, mut same_type, mut same_types) = (None, None, 0);
        let mut j = 0;
        while j < self.actual.len() {
            let new = &self.actual[j];
            j += 1;
            if new.flatten || find_key(self.recorded, new.name, 0).is_some() {
                continue;
            }
            if str_eq(new.rust_name, old.rust_name) {
                same_rust = Some(new);
            }
            if json_eq(old.wire, old.types, new.wire, new.types) {
                same_type = Some(new);
                same_types += 1;
            }
        }
        let renamed = match (same_rust, same_type) {
            (Some(new), _) => Some(new),
            (None, Some(new)) if same_types == 1 => Some(new),
            _ => None,
        };
        match renamed {
            Some(new) => Problem::new(Change::FieldRenamed, self.ty, self.variant, new.name)
                .between(old.name, new.name),
            None => Problem::new(Change::FieldRemoved, self.ty, self.variant, old.name),
        }
    }

    /// Whether the new key `name` is what a recorded field was renamed to
    /// (reported as that rename, not as a new field).
    const fn renamed_to(&self, name: &str) -> bool {
        let mut i = 0;
        while i < self.recorded.len() {
            let old = &self.recorded[i];
            i += 1;
            if !old.flatten && find_key(self.actual, old.name, 0).is_none() {
                let problem = self.gone(old);
                if matches!(problem.change, Change::FieldRenamed) && str_eq(problem.to, name) {
                    return true;
                }
            }
        }
        false
    }

    /// The wanted problem (see [`fields_problem_after`]) with a key among
    /// `fields` (of the actual object) that readers of the recorded object
    /// cannot fill in; `optional` when a flattened `Option` on the way may
    /// leave them all out.
    const fn new_problem(
        &self,
        fields: &[FieldShape<'a>],
        optional: bool,
        depth: usize,
        skip: &mut usize,
    ) -> Option<Problem<'a>> {
        let mut j = 0;
        while j < fields.len() {
            let new = &fields[j];
            j += 1;
            if let Some(inner) = flattened(new)
                && depth < FLATTEN_DEPTH
            {
                match self.new_problem(inner.fields, optional || new.optional, depth + 1, skip) {
                    Some(problem) => return Some(problem),
                    None => continue,
                }
            }
            if find_key(self.recorded, new.name, 0).is_none()
                && !new.tolerant()
                && !optional
                && !self.renamed_to(new.name)
                && wanted(skip)
            {
                let name = new.name;
                return Some(Problem::new(
                    Change::NewRequiredField,
                    self.ty,
                    self.variant,
                    name,
                ));
            }
        }
        None
    }
}

/// The first incompatible change from `recorded` to `actual`, if any.
pub const fn first_problem<'a>(
    recorded: &TypeShape<'a>,
    actual: &TypeShape<'a>,
) -> Option<Problem<'a>> {
    problem_after(recorded, actual, &mut 0)
}

/// The incompatible change from `recorded` to `actual` that comes after
/// `skip` others, in the order they are found; `skip` is counted down by
/// the problems passed. A change of kind, `rename_all` or representation
/// is the only one reported for the type: it changes every part of it.
pub const fn problem_after<'a>(
    recorded: &TypeShape<'a>,
    actual: &TypeShape<'a>,
    skip: &mut usize,
) -> Option<Problem<'a>> {
    let ty = actual.name;
    let whole = if !matches!(
        (recorded.kind, actual.kind),
        (Kind::Struct, Kind::Struct)
            | (Kind::Tuple, Kind::Tuple)
            | (Kind::Unit, Kind::Unit)
            | (Kind::Enum, Kind::Enum)
    ) {
        let problem = Problem::new(Change::KindChanged, ty, "", ty);
        Some(problem.between(recorded.kind.as_str(), actual.kind.as_str()))
    } else if !str_eq(recorded.rename_all, actual.rename_all) {
        let problem = Problem::new(Change::RenameAllChanged, ty, "", ty);
        Some(problem.between(recorded.rename_all, actual.rename_all))
    } else if !str_eq(recorded.repr, actual.repr) {
        let problem = Problem::new(Change::ReprChanged, ty, "", ty);
        Some(problem.between(recorded.repr, actual.repr))
    } else {
        None
    };
    if let Some(problem) = whole {
        return if wanted(skip) { Some(problem) } else { None };
    }
    if let Some(problem) = fields_problem_after(ty, "", recorded.fields, actual.fields, skip) {
        return Some(problem);
    }
    let mut i = 0;
    while i < recorded.variants.len() {
        let old = &recorded.variants[i];
        i += 1;
        let mut found = None;
        let mut j = 0;
        while j < actual.variants.len() {
            if str_eq(actual.variants[j].name, old.name) {
                found = Some(&actual.variants[j]);
            }
            j += 1;
        }
        let Some(new) = found else {
            if wanted(skip) {
                return Some(Problem::new(Change::VariantRemoved, ty, "", old.name));
            }
            continue;
        };
        if !matches!(
            (old.kind, new.kind),
            (Kind::Struct, Kind::Struct) | (Kind::Tuple, Kind::Tuple) | (Kind::Unit, Kind::Unit)
        ) {
            if wanted(skip) {
                let problem = Problem::new(Change::VariantKindChanged, ty, "", old.name);
                return Some(problem.between(old.kind.as_str(), new.kind.as_str()));
            }
            continue;
        }
        if let Some(problem) = fields_problem_after(ty, old.name, old.fields, new.fields, skip) {
            return Some(problem);
        }
    }
    if recorded.closed {
        let mut j = 0;
        while j < actual.variants.len() {
            let new = &actual.variants[j];
            j += 1;
            let mut known = false;
            let mut i = 0;
            while i < recorded.variants.len() {
                known |= str_eq(recorded.variants[i].name, new.name);
                i += 1;
            }
            if !known && wanted(skip) {
                return Some(Problem::new(Change::VariantAdded, ty, "", new.name));
            }
        }
    }
    None
}

/// Room for one message built in a constant.
const MESSAGE_CAPACITY: usize = 1024;

/// A message assembled in a constant, where `format!` is not available.
/// Text beyond its capacity is dropped.
#[derive(Debug, Clone, Copy)]
pub struct Message {
    bytes: [u8; MESSAGE_CAPACITY],
    len: usize,
}

impl Default for Message {
    fn default() -> Self {
        Self::new()
    }
}

impl Message {
    /// An empty message.
    pub const fn new() -> Self {
        Self {
            bytes: [0; MESSAGE_CAPACITY],
            len: 0,
        }
    }

    /// Appends `text` if it fits whole.
    pub const fn push(mut self, text: &str) -> Self {
        let text = text.as_bytes();
        if self.len + text.len() > MESSAGE_CAPACITY {
            return self;
        }
        let mut i = 0;
        while i < text.len() {
            self.bytes[self.len] = text[i];
            self.len += 1;
            i += 1;
        }
        self
    }

    /// Appends `` `text` ``.
    pub const fn code(self, text: &str) -> Self {
        self.push("`").push(text).push("`")
    }

    /// The text so far.
    pub const fn as_str(&self) -> &str {
        let (text, _) = self.bytes.split_at(self.len);
        match core::str::from_utf8(text) {
            Ok(text) => text,
            Err(_) => "",
        }
    }

    /// Appends what `problem` changed, like "field `cents` changed type from
    /// `i64` to `u64`". The location (payload type, variant) is not included.
    pub const fn describe(self, problem: &Problem<'_>) -> Self {
        let item = problem.item;
        match problem.change {
            Change::FieldRemoved => self.push("field ").code(item).push(" was removed"),
            Change::FieldRenamed => self
                .push("field ")
                .code(problem.from)
                .push(" was renamed to ")
                .code(problem.to),
            Change::TypeChanged => self
                .push("field ")
                .code(item)
                .push(" changed type from ")
                .code(problem.from)
                .push(" to ")
                .code(problem.to),
            Change::MadeRequired => self
                .push("field ")
                .code(item)
                .push(" lost `#[serde(default)]`, so payloads without it no longer decode"),
            Change::MadeOmittable => self.push("field ").code(item).push(
                " may now be left out of the JSON (`#[serde(skip_serializing_if)]`), but \
                 readers of the recorded version require it",
            ),
            Change::FlattenChanged if problem.to.is_empty() => self
                .push("field ")
                .code(item)
                .push(" is no longer `#[serde(flatten)]`"),
            Change::FlattenChanged => self
                .push("field ")
                .code(item)
                .push(" is now `#[serde(flatten)]`"),
            Change::NewRequiredField => self.push("new field ").code(item).push(
                " is required (neither `Option<_>` nor `#[serde(default)]`), so recorded \
                     payloads without it do not decode",
            ),
            Change::RenameAllChanged => self
                .push("`#[serde(rename_all)]` changed from ")
                .rule(problem.from)
                .push(" to ")
                .rule(problem.to)
                .push(", which renames every field on the wire"),
            Change::ReprChanged => self
                .push("the enum representation changed from ")
                .code(problem.from)
                .push(" to ")
                .code(problem.to),
            Change::KindChanged => self
                .push("it changed from a ")
                .push(problem.from)
                .push(" to a ")
                .push(problem.to),
            Change::VariantRemoved => self
                .push("variant ")
                .code(item)
                .push(" was removed or renamed"),
            Change::VariantKindChanged => self
                .push("variant ")
                .code(item)
                .push(" changed from a ")
                .push(problem.from)
                .push(" variant to a ")
                .push(problem.to)
                .push(" variant"),
            Change::VariantAdded => self.push("variant ").code(item).push(
                " was added, which readers of the recorded version cannot read under \
                 `compat = \"full\"`",
            ),
        }
    }

    /// The whole message about `problem`: `prefix`, where and what changed,
    /// `fix` and the way to keep the old shape.
    pub const fn report(prefix: &str, problem: &Problem<'_>, fix: &str) -> Self {
        Self::new()
            .push(prefix)
            .location(problem)
            .describe(problem)
            .push(fix)
            .hint(problem)
    }

    /// Appends the way to keep the old shape instead of bumping the version.
    pub const fn hint(self, problem: &Problem<'_>) -> Self {
        match problem.change {
            Change::FieldRemoved => self.push("or keep the field"),
            Change::FieldRenamed => self
                .push("or keep the old name with `#[serde(rename = \"")
                .push(problem.from)
                .push("\")]`"),
            Change::TypeChanged => self
                .push("or keep ")
                .code(problem.from)
                .push(" and add the new data as an `Option<_>` field"),
            Change::MadeRequired => self.push("or keep `#[serde(default)]`"),
            Change::MadeOmittable => self.push("or always write the field"),
            Change::NewRequiredField => {
                self.push("or make it additive: `Option<_>` or `#[serde(default)]`")
            }
            Change::RenameAllChanged => self.push("or keep the old rule"),
            Change::VariantRemoved => self.push("or keep the variant"),
            Change::VariantAdded => self.push("or leave the variant out of this version's enum"),
            Change::FlattenChanged
            | Change::ReprChanged
            | Change::KindChanged
            | Change::VariantKindChanged => self.push("or undo the change"),
        }
    }

    /// Appends a `rename_all` rule, or "none".
    const fn rule(self, rule: &str) -> Self {
        if rule.is_empty() {
            self.push("none")
        } else {
            self.code(rule)
        }
    }

    /// Appends where in a payload type `problem` is, like "in `Money`, " or
    /// "in `Payment::Card`, "; nothing for an event's own fields.
    pub const fn location(self, problem: &Problem<'_>) -> Self {
        if problem.ty.is_empty() {
            return self;
        }
        let message = self.push("in `").push(problem.ty);
        let message = if problem.variant.is_empty() {
            message
        } else {
            message.push("::").push(problem.variant)
        };
        message.push("`, ")
    }
}

/// What a payload type nested in an event changed incompatibly since its
/// recorded shape, as a message: `prefix`, where and what changed, `fix` and
/// the way to keep the old shape; the problem after `n` others, so a build
/// can report each (see [`problem_after`]). The code
/// `#[derive(DomainEvent)]` generates panics with it (a compile error, in a
/// constant) at the field.
pub const fn nested_mismatch(
    recorded: &TypeShape<'_>,
    actual: &TypeShape<'_>,
    n: usize,
    prefix: &str,
    fix: &str,
) -> Option<Message> {
    match problem_after(recorded, actual, &mut { n }) {
        Some(problem) => Some(Message::report(prefix, &problem, fix)),
        None => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn field(name: &'static str, ty: &'static str) -> FieldShape<'static> {
        FieldShape {
            name,
            rust_name: name,
            ty,
            wire: ty,
            optional: false,
            default: false,
            flatten: false,
            omittable: false,
            types: &[],
        }
    }

    const fn optional(name: &'static str, ty: &'static str) -> FieldShape<'static> {
        FieldShape {
            optional: true,
            ..field(name, ty)
        }
    }

    fn shape<'a>(fields: &'a [FieldShape<'a>]) -> TypeShape<'a> {
        TypeShape {
            name: "Money",
            kind: Kind::Struct,
            rename_all: "",
            repr: "",
            fields,
            variants: &[],
            closed: false,
        }
    }

    fn message(recorded: &TypeShape<'_>, actual: &TypeShape<'_>) -> Option<String> {
        first_problem(recorded, actual).map(|problem| {
            Message::new()
                .location(&problem)
                .describe(&problem)
                .as_str()
                .to_owned()
        })
    }

    const CENTS: FieldShape<'static> = field("cents", "i64");

    #[test]
    fn the_same_shape_and_additive_changes_are_compatible() {
        let recorded = [CENTS];
        assert_eq!(message(&shape(&recorded), &shape(&recorded)), None);
        let added = [CENTS, optional("currency", "Option<String>")];
        assert_eq!(message(&shape(&recorded), &shape(&added)), None);
        let defaulted = [
            CENTS,
            FieldShape {
                default: true,
                ..field("scale", "u8")
            },
        ];
        assert_eq!(message(&shape(&recorded), &shape(&defaulted)), None);
        // Field order is not part of a JSON object.
        let reordered = [field("b", "i64"), field("a", "i64")];
        let original = [field("a", "i64"), field("b", "i64")];
        assert_eq!(message(&shape(&original), &shape(&reordered)), None);
    }

    #[test]
    fn types_are_compared_by_the_json_they_write() {
        // `Box<i64>` recorded, `i64` now: the same JSON, another spelling.
        let boxed = [FieldShape {
            ty: "Box<i64>",
            ..CENTS
        }];
        assert_eq!(message(&shape(&boxed), &shape(&[CENTS])), None);
        assert_eq!(message(&shape(&[CENTS]), &shape(&boxed)), None);
    }

    #[test]
    fn newtypes_are_read_as_the_field_they_hold() {
        const SKU_FIELDS: [FieldShape<'static>; 1] = [field("0", "String")];
        const SKU: TypeShape<'static> = TypeShape {
            name: "Sku",
            kind: Kind::Tuple,
            rename_all: "",
            repr: "",
            fields: &SKU_FIELDS,
            variants: &[],
            closed: false,
        };
        const SKU_TYPES: [&TypeShape<'static>; 1] = [&SKU];
        const CODE_FIELDS: [FieldShape<'static>; 1] = [FieldShape {
            types: &SKU_TYPES,
            ..field("value", "Sku")
        }];
        const CODE: TypeShape<'static> = TypeShape {
            name: "Code",
            kind: Kind::Struct,
            repr: "transparent",
            fields: &CODE_FIELDS,
            ..SKU
        };
        let types = [&SKU, &CODE];
        for (recorded, actual) in [
            ("String", "Sku"),
            ("Vec<String>", "Vec<Sku>"),
            ("Map<String, String>", "Map<Sku, Code>"),
            ("Option<(String, i64)>", "Option<(Code, i64)>"),
            ("String", "String"),
        ] {
            assert!(
                json_eq(recorded, &[], actual, &types),
                "{recorded} vs {actual}"
            );
        }
        for (recorded, actual) in [
            ("i64", "Sku"),
            ("String", "Skus"),
            ("Vec<String>", "Sku"),
            ("Strings", "Sku"),
            ("String", "Sku<u8>"),
            ("Sku", "Sku"),
        ] {
            let expected = recorded == "Sku";
            let alone = json_eq(recorded, &[], actual, &[]);
            assert_eq!(alone, expected, "{recorded} vs {actual}");
            if !expected {
                assert!(
                    !json_eq(recorded, &[], actual, &types),
                    "{recorded} vs {actual}"
                );
            }
        }
        // A struct of two fields, or one flattened, is no newtype.
        let two = [field("0", "String"), field("1", "String")];
        let pair = TypeShape {
            fields: &two,
            ..SKU
        };
        assert!(!json_eq("String", &[], "Sku", &[&pair]));
    }

    #[test]
    fn a_payload_type_of_another_name_is_compared_field_by_field() {
        let recorded_fields = [CENTS];
        let recorded = shape(&recorded_fields);
        let kept_fields = [CENTS, optional("note", "Option<String>")];
        let kept = TypeShape {
            name: "MoneyV1",
            ..shape(&kept_fields)
        };
        let changed_fields = [field("cents", "String")];
        let changed = TypeShape {
            name: "MoneyV1",
            ..shape(&changed_fields)
        };
        assert!(json_eq(
            "Vec<Money>",
            &[&recorded],
            "Vec<MoneyV1>",
            &[&kept]
        ));
        assert!(!json_eq(
            "Vec<Money>",
            &[&recorded],
            "Vec<MoneyV1>",
            &[&changed]
        ));
        // Without the recorded shape, only the name could tell.
        assert!(!json_eq("Money", &[], "MoneyV1", &[&kept]));
        // Of the same name, the nested comparison reports the change.
        let same_name = TypeShape {
            name: "Money",
            ..changed
        };
        assert!(json_eq("Money", &[&recorded], "Money", &[&same_name]));
    }

    #[test]
    fn fields_may_move_into_and_out_of_a_flattened_struct() {
        const INNER_FIELDS: [FieldShape<'static>; 2] =
            [field("street", "String"), field("city", "String")];
        const INNER: TypeShape<'static> = TypeShape {
            name: "Address",
            kind: Kind::Struct,
            rename_all: "",
            repr: "",
            fields: &INNER_FIELDS,
            variants: &[],
            closed: false,
        };
        const INNER_TYPES: [&TypeShape<'static>; 1] = [&INNER];
        let flat = |optional| FieldShape {
            flatten: true,
            optional,
            types: &INNER_TYPES,
            ..field(
                "address",
                if optional {
                    "Option<Address>"
                } else {
                    "Address"
                },
            )
        };
        let plain = [CENTS, field("street", "String"), field("city", "String")];
        let moved = [CENTS, flat(false)];
        assert_eq!(message(&shape(&plain), &shape(&moved)), None);
        assert_eq!(message(&shape(&moved), &shape(&plain)), None);

        // Keys a flattened `Option` may leave out: fine for new keys, not
        // for keys readers of the recorded version require.
        assert_eq!(
            message(&shape(&plain), &shape(&[CENTS, flat(true)])).as_deref(),
            Some(
                "in `Money`, field `street` may now be left out of the JSON \
                 (`#[serde(skip_serializing_if)]`), but readers of the recorded version require it"
            )
        );
        assert_eq!(
            message(&shape(&[CENTS]), &shape(&[CENTS, flat(true)])),
            None
        );
        assert_eq!(
            message(&shape(&[CENTS]), &shape(&moved)).as_deref(),
            Some(
                "in `Money`, new field `street` is required (neither `Option<_>` nor \
                 `#[serde(default)]`), so recorded payloads without it do not decode"
            )
        );
        // A key gone from both places is gone.
        let fewer_fields = [field("street", "String")];
        let fewer = TypeShape {
            fields: &fewer_fields,
            ..INNER
        };
        let fewer_types = [&fewer];
        let moved_fewer = [
            CENTS,
            FieldShape {
                types: &fewer_types,
                ..flat(false)
            },
        ];
        assert_eq!(
            message(&shape(&plain), &shape(&moved_fewer)).as_deref(),
            Some("in `Money`, field `city` was removed")
        );
        // A field of the same name that gained `flatten` is reported so.
        let same_name = [CENTS, field("address", "Address")];
        assert_eq!(
            message(&shape(&same_name), &shape(&moved)).as_deref(),
            Some("in `Money`, field `address` is now `#[serde(flatten)]`")
        );
    }

    #[test]
    fn a_renamed_field_of_a_nested_type_is_reported_as_a_rename() {
        let recorded = [CENTS, field("currency", "String")];
        let renamed_rust = [
            CENTS,
            FieldShape {
                rust_name: "currency",
                ..field("iso_currency", "String")
            },
        ];
        let renamed_only_string = [CENTS, field("code", "String")];
        for actual in [&renamed_rust[..], &renamed_only_string[..]] {
            let got = message(&shape(&recorded), &shape(actual)).unwrap();
            assert!(
                got.starts_with("in `Money`, field `currency` was renamed to `"),
                "{got}"
            );
        }
        let full = first_problem(&shape(&recorded), &shape(&renamed_only_string)).unwrap();
        let hint = Message::new().hint(&full);
        assert_eq!(
            hint.as_str(),
            "or keep the old name with `#[serde(rename = \"currency\")]`"
        );
        // Two new fields of its type: no telling which, so removed.
        let two = [CENTS, field("code", "String"), field("symbol", "String")];
        assert_eq!(
            message(&shape(&recorded), &shape(&two)).as_deref(),
            Some("in `Money`, field `currency` was removed")
        );
    }

    #[test]
    fn every_problem_of_a_type_is_found_one_after_another() {
        let recorded = [CENTS, field("currency", "String"), field("scale", "u8")];
        let actual = [
            field("cents", "u64"),
            field("currency", "String"),
            field("region", "String"),
            field("rate", "f64"),
        ];
        let (old, new) = (shape(&recorded), shape(&actual));
        let all: Vec<String> = (0..)
            .map_while(|n| nested_mismatch(&old, &new, n, "", "; "))
            .map(|message| message.as_str().to_owned())
            .collect();
        assert_eq!(
            all,
            [
                "in `Money`, field `cents` changed type from `i64` to `u64`; or keep `i64` and add \
                 the new data as an `Option<_>` field",
                "in `Money`, field `scale` was removed; or keep the field",
                "in `Money`, new field `region` is required (neither `Option<_>` nor \
                 `#[serde(default)]`), so recorded payloads without it do not decode; or make it \
                 additive: `Option<_>` or `#[serde(default)]`",
                "in `Money`, new field `rate` is required (neither `Option<_>` nor \
                 `#[serde(default)]`), so recorded payloads without it do not decode; or make it \
                 additive: `Option<_>` or `#[serde(default)]`",
            ]
        );
        // A renamed field is one problem, not also a new required field.
        let renamed = [CENTS, field("code", "String"), field("scale", "u8")];
        let new = shape(&renamed);
        let all: Vec<_> = (0..)
            .map_while(|n| problem_after(&old, &new, &mut { n }))
            .collect();
        assert_eq!(all.len(), 1, "{all:?}");
        assert_eq!(all[0].change, Change::FieldRenamed);
    }

    #[test]
    fn removed_retyped_and_new_required_fields_are_not() {
        let recorded = [CENTS, optional("note", "Option<String>")];
        let cases: [(&[FieldShape<'_>], &str); 4] = [
            (&[CENTS], "in `Money`, field `note` was removed"),
            (
                &[field("cents", "u64"), optional("note", "Option<String>")],
                "in `Money`, field `cents` changed type from `i64` to `u64`",
            ),
            (
                &[CENTS, field("note", "String")],
                "in `Money`, field `note` changed type from `Option<String>` to `String`",
            ),
            (
                &[
                    CENTS,
                    optional("note", "Option<String>"),
                    field("currency", "String"),
                ],
                "in `Money`, new field `currency` is required (neither `Option<_>` nor \
                 `#[serde(default)]`), so recorded payloads without it do not decode",
            ),
        ];
        for (actual, expected) in cases {
            let got = message(&shape(&recorded), &shape(actual));
            assert_eq!(got.as_deref(), Some(expected));
        }
    }

    #[test]
    fn losing_a_default_makes_a_field_required() {
        let recorded = [FieldShape {
            default: true,
            ..CENTS
        }];
        let got = message(&shape(&recorded), &shape(&[CENTS])).unwrap();
        assert!(got.contains("lost `#[serde(default)]`"), "{got}");
    }

    #[test]
    fn a_required_field_that_may_be_left_out_breaks_its_readers() {
        let omittable = |field: FieldShape<'static>| FieldShape {
            default: true,
            omittable: true,
            ..field
        };
        let got = message(&shape(&[CENTS]), &shape(&[omittable(CENTS)])).unwrap();
        assert_eq!(
            got,
            "in `Money`, field `cents` may now be left out of the JSON \
             (`#[serde(skip_serializing_if)]`), but readers of the recorded version require it"
        );
        // Readers of an optional or defaulted field fill it in.
        let note = optional("note", "Option<String>");
        let left_out = FieldShape {
            omittable: true,
            ..note
        };
        assert_eq!(message(&shape(&[note]), &shape(&[left_out])), None);
        let defaulted = FieldShape {
            default: true,
            ..CENTS
        };
        assert_eq!(
            message(&shape(&[defaulted]), &shape(&[omittable(CENTS)])),
            None
        );
    }

    #[test]
    fn nested_types_are_compared_through_fields() {
        let old_inner = shape(&[CENTS]);
        let new_fields = [field("cents", "String")];
        let new_inner = shape(&new_fields);
        let old_types = [&old_inner];
        let new_types = [&new_inner];
        let outer = |types| TypeShape {
            name: "Line",
            fields: std::slice::from_ref(Box::leak(Box::new(FieldShape {
                types,
                ..field("price", "Money")
            }))),
            ..shape(&[])
        };
        assert_eq!(
            message(&outer(&old_types), &outer(&new_types)).as_deref(),
            Some("in `Money`, field `cents` changed type from `i64` to `String`")
        );
    }

    #[test]
    fn enum_variants_may_be_added_but_not_removed_or_reshaped() {
        let variant = |name, kind, fields| VariantShape {
            name,
            rust_name: name,
            kind,
            fields,
        };
        let enum_of = |variants| TypeShape {
            name: "Payment",
            kind: Kind::Enum,
            repr: "external",
            variants,
            ..shape(&[])
        };
        let iban = [field("iban", "String")];
        let recorded = [
            variant("Card", Kind::Unit, &[]),
            variant("Transfer", Kind::Struct, &iban),
        ];
        let added = [
            variant("Card", Kind::Unit, &[]),
            variant("Transfer", Kind::Struct, &iban),
            variant("Cash", Kind::Unit, &[]),
        ];
        assert_eq!(message(&enum_of(&recorded), &enum_of(&added)), None);
        // Under `compat = "full"` the recorded enum is closed.
        let closed = TypeShape {
            closed: true,
            ..enum_of(&recorded)
        };
        assert_eq!(
            message(&closed, &enum_of(&added)).as_deref(),
            Some(
                "in `Payment`, variant `Cash` was added, which readers of the recorded version \
                 cannot read under `compat = \"full\"`"
            )
        );
        assert_eq!(message(&closed, &enum_of(&recorded)), None);
        let removed = [variant("Transfer", Kind::Struct, &iban)];
        assert_eq!(
            message(&enum_of(&recorded), &enum_of(&removed)).as_deref(),
            Some("in `Payment`, variant `Card` was removed or renamed")
        );
        let numeric_iban = [field("iban", "u64")];
        let retyped = [
            variant("Card", Kind::Unit, &[]),
            variant("Transfer", Kind::Struct, &numeric_iban),
        ];
        assert_eq!(
            message(&enum_of(&recorded), &enum_of(&retyped)).as_deref(),
            Some("in `Payment::Transfer`, field `iban` changed type from `String` to `u64`")
        );
        let internally_tagged = TypeShape {
            repr: "internal(type)",
            ..enum_of(&recorded)
        };
        assert!(
            message(&enum_of(&recorded), &internally_tagged)
                .unwrap()
                .contains("representation changed")
        );
    }

    #[test]
    fn a_changed_rename_all_is_reported_once() {
        let recorded = TypeShape {
            rename_all: "camelCase",
            ..shape(&[])
        };
        assert_eq!(
            message(&recorded, &shape(&[])).as_deref(),
            Some(
                "in `Money`, `#[serde(rename_all)]` changed from `camelCase` to none, which \
                 renames every field on the wire"
            )
        );
    }

    #[test]
    fn messages_are_cut_at_their_capacity_not_mid_text() {
        let long = "x".repeat(MESSAGE_CAPACITY);
        let message = Message::new().push("start ").push(&long);
        assert_eq!(message.as_str(), "start ");
    }
}
