//! Normalized type names for the schema description.
//!
//! Paths are reduced to their last segment and lifetimes dropped, so
//! `std::string::String`, `::std::string::String` and `String` read the same,
//! as do `&'a str` and `&str`.

use quote::ToTokens;
use syn::{GenericArgument, PathArguments, Type};

/// The normalized spelling of `ty`.
pub fn normalize(ty: &Type) -> String {
    match ty {
        Type::Path(path) if path.qself.is_none() => match path.path.segments.last() {
            Some(last) => {
                let mut name = last.ident.to_string();
                if let PathArguments::AngleBracketed(args) = &last.arguments {
                    let args: Vec<String> = args
                        .args
                        .iter()
                        .filter_map(|arg| match arg {
                            GenericArgument::Type(ty) => Some(normalize(ty)),
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
        Type::Reference(reference) => format!("&{}", normalize(&reference.elem)),
        Type::Slice(slice) => format!("[{}]", normalize(&slice.elem)),
        Type::Array(array) => format!("[{}; {}]", normalize(&array.elem), compact(&array.len)),
        Type::Tuple(tuple) => {
            let elems: Vec<String> = tuple.elems.iter().map(normalize).collect();
            if elems.len() == 1 {
                format!("({},)", elems[0])
            } else {
                format!("({})", elems.join(", "))
            }
        }
        Type::Paren(paren) => normalize(&paren.elem),
        Type::Group(group) => normalize(&group.elem),
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

fn compact<T: ToTokens>(tokens: &T) -> String {
    tokens.to_token_stream().to_string().replace(' ', "")
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

    #[test]
    fn options_are_recognized_under_any_path() {
        let ty: Type = syn::parse_str("std::option::Option<i64>").unwrap();
        assert_eq!(norm("i64"), normalize(option_inner(&ty).unwrap()));
        assert!(option_inner(&syn::parse_str::<Type>("Vec<i64>").unwrap()).is_none());
    }
}
