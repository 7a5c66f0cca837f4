//! Normalized type names for the schema description, and which types inside
//! a field's type are payload types of their own.
//!
//! Paths are reduced to their last segment and lifetimes dropped, so
//! `std::string::String`, `::std::string::String` and `String` read the same,
//! as do `&'a str` and `&str`.
//!
//! A field's type is read as serde writes it: well-known leaves ([`LEAVES`])
//! are compared by name, well-known containers ([`is_container`]) by name and
//! by what they contain, and every other named type is a payload type whose
//! own shape is recorded and compared (it derives `EventPayload`).

use quote::ToTokens;
use syn::{GenericArgument, PathArguments, Type};

/// The normalized spelling of `ty`.
pub fn normalize(ty: &Type) -> String {
    spell(ty, &normalize)
}

/// `ty` spelled with its paths reduced to their last segment, lifetimes
/// dropped and every type inside it spelled by `inner`.
fn spell(ty: &Type, inner: &dyn Fn(&Type) -> String) -> String {
    match ty {
        Type::Path(path) if path.qself.is_none() => match path.path.segments.last() {
            Some(last) => {
                let mut name = last.ident.to_string();
                if let PathArguments::AngleBracketed(args) = &last.arguments {
                    let args: Vec<String> = args
                        .args
                        .iter()
                        .filter_map(|arg| match arg {
                            GenericArgument::Type(ty) => Some(inner(ty)),
                            GenericArgument::Const(expr) => Some(compact(expr)),
                            GenericArgument::Lifetime(_) => None,
                            other => Some(compact(other)),
                        })
                        .collect();
                    if !args.is_empty() {
                        name.push('<');
                        name.push_str(&args.join(", "));
                        name.push('>');
                    }
                }
                name
            }
            None => compact(ty),
        },
        Type::Reference(reference) => format!("&{}", inner(&reference.elem)),
        Type::Slice(slice) => format!("[{}]", inner(&slice.elem)),
        Type::Array(array) => format!("[{}; {}]", inner(&array.elem), compact(&array.len)),
        Type::Tuple(tuple) => {
            let elems: Vec<String> = tuple.elems.iter().map(inner).collect();
            if elems.len() == 1 {
                format!("({},)", elems[0])
            } else {
                format!("({})", elems.join(", "))
            }
        }
        Type::Paren(paren) => inner(&paren.elem),
        Type::Group(group) => inner(&group.elem),
        other => compact(other),
    }
}

/// The inner type of `Option<T>` (under any path), if `ty` is one.
pub fn option_inner(ty: &Type) -> Option<&Type> {
    let Type::Path(path) = ty else { return None };
    let last = path.path.segments.last()?;
    if last.ident != "Option" {
        return None;
    }
    let PathArguments::AngleBracketed(args) = &last.arguments else {
        return None;
    };
    match args.args.first() {
        Some(GenericArgument::Type(inner)) if args.args.len() == 1 => Some(inner),
        _ => None,
    }
}

/// Types serde writes as a single value, compared by name only. A crate's own
/// type with one of these names is taken for the well-known one.
pub const LEAVES: &[&str] = &[
    "bool",
    "char",
    "str",
    "String",
    "i8",
    "i16",
    "i32",
    "i64",
    "i128",
    "isize",
    "u8",
    "u16",
    "u32",
    "u64",
    "u128",
    "usize",
    "f32",
    "f64",
    "NonZeroI8",
    "NonZeroI16",
    "NonZeroI32",
    "NonZeroI64",
    "NonZeroI128",
    "NonZeroIsize",
    "NonZeroU8",
    "NonZeroU16",
    "NonZeroU32",
    "NonZeroU64",
    "NonZeroU128",
    "NonZeroUsize",
    "NonZero",
    "PhantomData",
    "Duration",
    "SystemTime",
    "IpAddr",
    "Ipv4Addr",
    "Ipv6Addr",
    "SocketAddr",
    "SocketAddrV4",
    "SocketAddrV6",
    "PathBuf",
    "Path",
    "OsString",
    "OsStr",
    "CString",
    "CStr",
    // chrono, time, jiff
    "DateTime",
    "NaiveDate",
    "NaiveDateTime",
    "NaiveTime",
    "Utc",
    "FixedOffset",
    "Local",
    "TimeDelta",
    "Weekday",
    "Month",
    "OffsetDateTime",
    "PrimitiveDateTime",
    "UtcDateTime",
    "Date",
    "Time",
    "Timestamp",
    "Zoned",
    // uuid, rust_decimal, bigdecimal, serde_json, url, bytes, serde_bytes, ulid, semver
    "Uuid",
    "Decimal",
    "BigDecimal",
    "Value",
    "Number",
    "RawValue",
    "Url",
    "Bytes",
    "ByteBuf",
    "ByteArray",
    "Ulid",
];

/// Other types serde writes as what they contain, beside [`TRANSPARENT`],
/// [`SEQUENCES`] and [`MAPS`]: compared by name and by their type
/// arguments.
pub const CONTAINERS: &[&str] = &[
    "Option",
    "Result",
    "Bound",
    "Range",
    "RangeInclusive",
    "SmallVec",
    "ArrayVec",
];

/// Whether `name` is a well-known container: [`CONTAINERS`],
/// [`TRANSPARENT`], [`SEQUENCES`] or [`MAPS`].
pub fn is_container(name: &str) -> bool {
    [CONTAINERS, TRANSPARENT, SEQUENCES, MAPS]
        .iter()
        .any(|names| names.contains(&name))
}

/// Wrappers serde writes as the value they hold (with serde's `rc`
/// feature for `Rc` and `Arc`): `Box<Money>` is written as `Money` is.
pub const TRANSPARENT: &[&str] = &[
    "Box",
    "Rc",
    "Arc",
    "Cow",
    "Cell",
    "RefCell",
    "Mutex",
    "RwLock",
    "Reverse",
    "Wrapping",
    "Saturating",
];

/// Collections serde writes as a JSON array of their elements.
pub const SEQUENCES: &[&str] = &[
    "Vec",
    "VecDeque",
    "LinkedList",
    "BinaryHeap",
    "HashSet",
    "BTreeSet",
    "IndexSet",
];

/// Maps serde writes as a JSON object (`Map` is `serde_json::Map`).
pub const MAPS: &[&str] = &["HashMap", "BTreeMap", "IndexMap", "Map"];

/// The JSON a type is written as, spelled as a type: two types with the
/// same spelling here write and read the same JSON. Serde's transparent
/// wrappers ([`TRANSPARENT`]) and references are their contents, `str` is
/// `String`, every sequence ([`SEQUENCES`], slices) is `Vec<T>` and every
/// map ([`MAPS`]) is `Map<K, V>`; other types are spelled as [`normalize`]
/// spells them. So `Box<Money>`, `Arc<Money>` and `&Money` are `Money`,
/// and `BTreeMap<String, Vec<Line>>` and `HashMap<String, VecDeque<Line>>`
/// are both `Map<String, Vec<Line>>`.
pub fn wire(ty: &Type) -> String {
    match ty {
        Type::Path(path) if path.qself.is_none() => {
            let Some(last) = path.path.segments.last() else {
                return spell(ty, &wire);
            };
            let args = type_args(last);
            match (last.ident.to_string().as_str(), args.as_slice()) {
                ("str", []) => "String".to_owned(),
                (wrapper, [inner]) if TRANSPARENT.contains(&wrapper) => wire(inner),
                // A hasher parameter (`HashSet<T, S>`) does not change the JSON.
                (sequence, [element, ..]) if SEQUENCES.contains(&sequence) => {
                    format!("Vec<{}>", wire(element))
                }
                (map, [key, value, ..]) if MAPS.contains(&map) => {
                    format!("Map<{}, {}>", wire(key), wire(value))
                }
                _ => spell(ty, &wire),
            }
        }
        Type::Reference(reference) => wire(&reference.elem),
        Type::Slice(slice) => format!("Vec<{}>", wire(&slice.elem)),
        Type::Paren(paren) => wire(&paren.elem),
        Type::Group(group) => wire(&group.elem),
        other => spell(other, &wire),
    }
}

/// [`wire`] of a recorded, normalized spelling such as `Box<Money>`; the
/// spelling itself if it does not parse.
pub fn wire_of(normalized: &str) -> String {
    match syn::parse_str::<Type>(normalized) {
        Ok(ty) => wire(&ty),
        Err(_) => normalized.to_owned(),
    }
}

/// Whether the JSON type spelled `recorded` could be what `actual` writes
/// once the payload types named in `actual` are known: `actual` spelled
/// like `recorded` with any type in place of each payload type. `i64` could
/// be `OrderId` (a newtype) and `Vec<Line>` could be `Vec<LineV1>`, but
/// `Money` cannot be `Vec<Money>` whatever `Money` is. Both are spellings
/// as [`wire`] writes them.
pub fn could_be(recorded: &str, actual: &str) -> bool {
    match (
        syn::parse_str::<Type>(recorded),
        syn::parse_str::<Type>(actual),
    ) {
        (Ok(recorded), Ok(actual)) => matches_with_holes(&recorded, &actual),
        _ => true,
    }
}

fn matches_with_holes(recorded: &Type, actual: &Type) -> bool {
    // A payload type itself is a hole: any type may turn out to be there.
    if let [only] = payload_types(actual, &[]).as_slice()
        && std::ptr::eq(*only, actual)
    {
        return true;
    }
    match (recorded, actual) {
        (Type::Path(recorded), Type::Path(actual)) => {
            let (Some(r), Some(a)) = (recorded.path.segments.last(), actual.path.segments.last())
            else {
                return false;
            };
            let args = |arguments: &PathArguments| -> Vec<GenericArgument> {
                match arguments {
                    PathArguments::AngleBracketed(args) => args.args.iter().cloned().collect(),
                    _ => Vec::new(),
                }
            };
            let (r_args, a_args) = (args(&r.arguments), args(&a.arguments));
            r.ident == a.ident
                && r_args.len() == a_args.len()
                && r_args.iter().zip(&a_args).all(|pair| match pair {
                    (GenericArgument::Type(r), GenericArgument::Type(a)) => {
                        matches_with_holes(r, a)
                    }
                    (r, a) => compact(r) == compact(a),
                })
        }
        (Type::Tuple(recorded), Type::Tuple(actual)) => {
            recorded.elems.len() == actual.elems.len()
                && recorded
                    .elems
                    .iter()
                    .zip(&actual.elems)
                    .all(|(r, a)| matches_with_holes(r, a))
        }
        (Type::Array(recorded), Type::Array(actual)) => {
            compact(&recorded.len) == compact(&actual.len)
                && matches_with_holes(&recorded.elem, &actual.elem)
        }
        (recorded, actual) => normalize(recorded) == normalize(actual),
    }
}

/// The payload types inside `ty`, in the order they appear: the named types
/// that are neither [`LEAVES`], containers ([`is_container`]) nor one of `generic_params`
/// (the event's own type parameters, compared by name).
pub fn payload_types<'t>(ty: &'t Type, generic_params: &[String]) -> Vec<&'t Type> {
    let mut found = Vec::new();
    collect_payload_types(ty, generic_params, &mut found);
    found
}

fn collect_payload_types<'t>(ty: &'t Type, generic_params: &[String], found: &mut Vec<&'t Type>) {
    match ty {
        Type::Path(path) if path.qself.is_none() => {
            let Some(last) = path.path.segments.last() else {
                return;
            };
            let name = last.ident.to_string();
            let generic = path.path.segments.len() == 1 && generic_params.contains(&name);
            if generic || name == "Self" || LEAVES.contains(&name.as_str()) {
                return;
            }
            if !is_container(&name) {
                found.push(ty);
                return;
            }
            if let PathArguments::AngleBracketed(args) = &last.arguments {
                for arg in &args.args {
                    if let GenericArgument::Type(inner) = arg {
                        collect_payload_types(inner, generic_params, found);
                    }
                }
            }
        }
        Type::Reference(reference) => collect_payload_types(&reference.elem, generic_params, found),
        Type::Slice(slice) => collect_payload_types(&slice.elem, generic_params, found),
        Type::Array(array) => collect_payload_types(&array.elem, generic_params, found),
        Type::Paren(paren) => collect_payload_types(&paren.elem, generic_params, found),
        Type::Group(group) => collect_payload_types(&group.elem, generic_params, found),
        Type::Tuple(tuple) => {
            for elem in &tuple.elems {
                collect_payload_types(elem, generic_params, found);
            }
        }
        _ => {}
    }
}

/// The name a payload type is recorded under: its last path segment,
/// without type arguments or `r#`.
pub fn payload_name(ty: &Type) -> String {
    match ty {
        Type::Path(path) => path
            .path
            .segments
            .last()
            .map(|last| {
                let name = last.ident.to_string();
                name.strip_prefix("r#").map(str::to_owned).unwrap_or(name)
            })
            .unwrap_or_else(|| compact(ty)),
        _ => compact(ty),
    }
}

/// The payload types named in a recorded, normalized type such as
/// `Vec<Money>` (see [`normalize`]); empty if it does not parse.
pub fn payload_names_in(normalized: &str, generic_params: &[String]) -> Vec<String> {
    match syn::parse_str::<Type>(normalized) {
        Ok(ty) => payload_types(&ty, generic_params)
            .into_iter()
            .map(payload_name)
            .collect(),
        Err(_) => Vec::new(),
    }
}

fn compact<T: ToTokens>(tokens: &T) -> String {
    tokens.to_token_stream().to_string().replace(' ', "")
}

/// The type arguments of a path segment: `[String, Line]` for
/// `BTreeMap<String, Line>`, empty for `Line`. Lifetimes and const
/// arguments are left out.
pub fn type_args(segment: &syn::PathSegment) -> Vec<&Type> {
    match &segment.arguments {
        PathArguments::AngleBracketed(args) => args
            .args
            .iter()
            .filter_map(|arg| match arg {
                GenericArgument::Type(ty) => Some(ty),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn norm(source: &str) -> String {
        normalize(&syn::parse_str::<Type>(source).unwrap())
    }

    #[test]
    fn paths_reduce_to_their_last_segment() {
        assert_eq!(norm("std::string::String"), "String");
        assert_eq!(norm("::std::vec::Vec<std::string::String>"), "Vec<String>");
        assert_eq!(
            norm("std::collections::HashMap<String, Vec<crate::money::Money>>"),
            "HashMap<String, Vec<Money>>"
        );
        assert_eq!(norm("chrono::DateTime<chrono::Utc>"), "DateTime<Utc>");
    }

    #[test]
    fn lifetimes_and_grouping_are_dropped() {
        assert_eq!(norm("&'a str"), "&str");
        assert_eq!(norm("Cow<'a, str>"), "Cow<str>");
        assert_eq!(norm("(i64, String)"), "(i64, String)");
        assert_eq!(norm("[u8; 16]"), "[u8; 16]");
    }

    fn payloads(source: &str) -> Vec<String> {
        let ty = syn::parse_str::<Type>(source).unwrap();
        payload_types(&ty, &["T".to_owned()])
            .into_iter()
            .map(payload_name)
            .collect()
    }

    #[test]
    fn finds_payload_types_inside_containers_but_not_leaves() {
        assert_eq!(payloads("String"), Vec::<String>::new());
        assert_eq!(
            payloads("chrono::DateTime<chrono::Utc>"),
            Vec::<String>::new()
        );
        assert_eq!(payloads("crate::money::Money"), ["Money"]);
        assert_eq!(
            payloads("std::collections::HashMap<Sku, Vec<Option<Box<Line>>>>"),
            ["Sku", "Line"]
        );
        assert_eq!(payloads("(Money, &'a [Line; 2], T)"), ["Money", "Line"]);
        assert_eq!(payloads("Vec<T>"), Vec::<String>::new());
        assert_eq!(
            payload_names_in("HashMap<Sku, Vec<Line>>", &[]),
            ["Sku", "Line"]
        );
    }

    #[test]
    fn types_serde_writes_alike_have_one_wire_spelling() {
        let same = [
            (
                "Money",
                &[
                    "Box<Money>",
                    "Arc<Money>",
                    "Rc<Money>",
                    "&'a Money",
                    "crate::m::Money",
                ][..],
            ),
            (
                "String",
                &["&'a str", "Box<str>", "Cow<'a, str>", "std::string::String"][..],
            ),
            (
                "Vec<Line>",
                &[
                    "VecDeque<Line>",
                    "&'a [Line]",
                    "Box<[Box<Line>]>",
                    "BTreeSet<Line>",
                ][..],
            ),
            (
                "Map<String, Vec<Line>>",
                &[
                    "BTreeMap<String, Vec<Line>>",
                    "HashMap<String, VecDeque<Arc<Line>>, S>",
                ][..],
            ),
            (
                "Option<Money>",
                &["Option<Box<Money>>", "std::option::Option<Arc<Money>>"][..],
            ),
            ("(i64, String)", &["(i64, Box<str>)"][..]),
            ("[Money; 2]", &["[Box<Money>; 2]"][..]),
            ("DateTime<Utc>", &["chrono::DateTime<chrono::Utc>"][..]),
        ];
        for (expected, spellings) in same {
            assert_eq!(wire_of(expected), expected);
            for spelling in spellings {
                let ty = syn::parse_str::<Type>(spelling).unwrap();
                assert_eq!(wire(&ty), expected, "{spelling}");
                assert_eq!(wire_of(&normalize(&ty)), expected, "{spelling}");
            }
        }
        // What changes the JSON, or what a reader accepts, stays apart.
        for (a, b) in [
            ("i32", "u32"),
            ("Money", "Option<Money>"),
            ("Vec<Money>", "[Money; 2]"),
            ("Vec<u8>", "String"),
            ("char", "String"),
            ("Vec<Money>", "Map<String, Money>"),
        ] {
            assert_ne!(wire_of(a), wire_of(b), "{a} vs {b}");
        }
    }

    #[test]
    fn a_payload_type_could_be_any_type_in_its_place() {
        for (recorded, actual) in [
            ("i64", "OrderId"),
            ("Vec<Line>", "Vec<LineV1>"),
            ("Map<String, Vec<u32>>", "Map<Sku, Lines>"),
            ("(i64, String)", "(i64, Sku)"),
            ("Money", "Amount"),
        ] {
            assert!(could_be(recorded, actual), "{recorded} vs {actual}");
        }
        for (recorded, actual) in [
            ("Money", "Vec<Money>"),
            ("Vec<Line>", "Option<LineV1>"),
            ("(i64, String)", "(Sku,)"),
            ("[u8; 4]", "[Byte; 8]"),
            ("i64", "String"),
        ] {
            assert!(!could_be(recorded, actual), "{recorded} vs {actual}");
        }
    }

    #[test]
    fn options_are_recognized_under_any_path() {
        let ty: Type = syn::parse_str("std::option::Option<i64>").unwrap();
        assert_eq!(norm("i64"), normalize(option_inner(&ty).unwrap()));
        assert!(option_inner(&syn::parse_str::<Type>("Vec<i64>").unwrap()).is_none());
    }
}
