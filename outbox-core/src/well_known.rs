//! `EventPayload` for the well-known types, so a `type` alias of one
//! (`type Quantity = u32;`, `type Lines = Vec<Line>;`) can stand in a
//! payload.
//!
//! The derive compares well-known types by their spelling and never asks
//! for these shapes; it asks only for a name it does not know, which is
//! what an alias is. Each shape describes the JSON the type writes the way
//! a newtype does: one field `0` whose `wire` spelling is the type's own
//! (`u32`, `Vec<T>`, `Map<K, V>`), with the shapes of its type parameters,
//! named `T`, `K` and `V`, as that field's nested types. `shape::json_eq`
//! reads such a newtype as the field it holds.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::EventPayload;
use crate::shape::{FieldShape, Kind, TypeShape};

/// The shape of a well-known type `name` written as `wire`, whose type
/// parameters' shapes are `types`.
macro_rules! written_as {
    ($name:expr, $wire:expr, [$($types:expr),*]) => {
        &TypeShape {
            name: $name,
            kind: Kind::Tuple,
            rename_all: "",
            repr: "",
            fields: &[FieldShape {
                name: "0",
                rust_name: "0",
                ty: $wire,
                wire: $wire,
                optional: false,
                default: false,
                flatten: false,
                omittable: false,
                types: &[$($types),*],
            }],
            variants: &[],
            closed: false,
        }
    };
}

/// The shape of type parameter `$param`, under its name in a `wire`
/// spelling.
macro_rules! param {
    ($param:ident) => {
        &TypeShape {
            name: stringify!($param),
            ..*<$param as EventPayload>::SHAPE
        }
    };
}

/// Types written as one JSON value, spelled as `ty::wire` spells them.
macro_rules! leaves {
    ($($ty:ty => $wire:literal),* $(,)?) => {$(
        impl EventPayload for $ty {
            const SHAPE: &'static TypeShape<'static> = written_as!($wire, $wire, []);
        }
    )*};
}

leaves! {
    bool => "bool",
    char => "char",
    str => "String",
    String => "String",
    i8 => "i8",
    i16 => "i16",
    i32 => "i32",
    i64 => "i64",
    i128 => "i128",
    isize => "isize",
    u8 => "u8",
    u16 => "u16",
    u32 => "u32",
    u64 => "u64",
    u128 => "u128",
    usize => "usize",
    f32 => "f32",
    f64 => "f64",
    Duration => "Duration",
    SystemTime => "SystemTime",
    IpAddr => "IpAddr",
    Ipv4Addr => "Ipv4Addr",
    Ipv6Addr => "Ipv6Addr",
    SocketAddr => "SocketAddr",
    SocketAddrV4 => "SocketAddrV4",
    SocketAddrV6 => "SocketAddrV6",
    PathBuf => "PathBuf",
    uuid::Uuid => "Uuid",
    serde_json::Value => "Value",
    chrono::DateTime<chrono::Utc> => "DateTime<Utc>",
    chrono::DateTime<chrono::FixedOffset> => "DateTime<FixedOffset>",
    chrono::DateTime<chrono::Local> => "DateTime<Local>",
    chrono::NaiveDate => "NaiveDate",
    chrono::NaiveDateTime => "NaiveDateTime",
    chrono::NaiveTime => "NaiveTime",
}

/// Containers of one type parameter `T`.
macro_rules! containers {
    ($($container:ident $(<$($extra:ident),*>)? => $wire:literal),* $(,)?) => {$(
        impl<T: EventPayload $($(, $extra)*)?> EventPayload for $container<T $($(, $extra)*)?> {
            const SHAPE: &'static TypeShape<'static> =
                written_as!(stringify!($container), $wire, [param!(T)]);
        }
    )*};
}

containers! {
    Option => "Option<T>",
    Vec => "Vec<T>",
    VecDeque => "Vec<T>",
    BTreeSet => "Vec<T>",
    HashSet<S> => "Vec<T>",
}

/// Serde's transparent wrappers, of any `T` (`Box<str>` too).
macro_rules! wrappers {
    ($($wrapper:ident),* $(,)?) => {$(
        impl<T: EventPayload + ?Sized> EventPayload for $wrapper<T> {
            const SHAPE: &'static TypeShape<'static> =
                written_as!(stringify!($wrapper), "T", [param!(T)]);
        }
    )*};
}

wrappers!(Box, Rc, Arc);

impl<K: EventPayload, V: EventPayload> EventPayload for BTreeMap<K, V> {
    const SHAPE: &'static TypeShape<'static> =
        written_as!("BTreeMap", "Map<K, V>", [param!(K), param!(V)]);
}

impl<K: EventPayload, V: EventPayload, S> EventPayload for HashMap<K, V, S> {
    const SHAPE: &'static TypeShape<'static> =
        written_as!("HashMap", "Map<K, V>", [param!(K), param!(V)]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shape::json_eq;

    type Quantity = u32;
    type Lines = Vec<Option<Box<str>>>;
    type ByName = HashMap<String, Vec<Quantity>>;

    fn same(recorded: &str, actual: &str, shape: &TypeShape<'_>) -> bool {
        json_eq(recorded, &[], actual, &[shape])
    }

    #[test]
    fn aliases_of_well_known_types_write_what_they_name() {
        let quantity = TypeShape {
            name: "Quantity",
            ..*<Quantity as EventPayload>::SHAPE
        };
        assert!(same("u32", "Quantity", &quantity));
        assert!(same("Vec<u32>", "Vec<Quantity>", &quantity));
        assert!(!same("i32", "Quantity", &quantity));

        let lines = TypeShape {
            name: "Lines",
            ..*<Lines as EventPayload>::SHAPE
        };
        assert!(same("Vec<Option<String>>", "Lines", &lines));
        assert!(!same("Vec<String>", "Lines", &lines));

        let by_name = TypeShape {
            name: "ByName",
            ..*<ByName as EventPayload>::SHAPE
        };
        assert!(same("Map<String, Vec<u32>>", "ByName", &by_name));
        assert!(!same("Map<String, Vec<u64>>", "ByName", &by_name));
    }
}
