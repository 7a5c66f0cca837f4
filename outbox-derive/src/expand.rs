//! Generates the `DomainEvent` implementation from a checked [`Event`],
//! followed by its checks against the lock ([`crate::schema_lock`]).

use outbox_schema::ctxt::Ctxt;
use outbox_schema::model::Event;
use outbox_schema::ty;
use proc_macro2::TokenStream;
use quote::quote;
use syn::DeriveInput;

/// The `impl outbox_core::DomainEvent` for `input` and its lock checks
/// (which may be compile errors), or every error in the input.
pub fn derive_domain_event(input: &DeriveInput) -> Result<TokenStream, Vec<syn::Error>> {
    let cx = Ctxt::default();
    let event = Event::from_ast(&cx, input);
    cx.check()?;
    // `from_ast` records an error whenever it returns `None`.
    let Some(event) = event else {
        return Err(vec![syn::Error::new_spanned(
            &input.ident,
            "DomainEvent could not read this struct",
        )]);
    };

    let lock_checks = crate::schema_lock::check_event(&event);
    let ident = event.ident;
    let (impl_generics, ty_generics, where_clause) = event.generics.split_for_impl();
    let aggregate = &event.attrs.aggregate;
    let name = &event.attrs.name;
    let version = event.attrs.version;
    let fields = event.fields.iter().map(|field| {
        let name = &field.name;
        let rust_name = &field.rust_name;
        let ty = ty::normalize(field.ty);
        let optional = field.optional;
        let default = field.default;
        let flatten = field.flatten;
        quote! {
            ::outbox_core::FieldSchema {
                name: #name,
                rust_name: #rust_name,
                ty: #ty,
                optional: #optional,
                default: #default,
                flatten: #flatten,
            }
        }
    });

    Ok(quote! {
        #[automatically_derived]
        impl #impl_generics ::outbox_core::DomainEvent for #ident #ty_generics #where_clause {
            const AGGREGATE_TYPE: &'static str = #aggregate;
            const EVENT_TYPE: &'static str = #name;
            const VERSION: u32 = #version;
            const SCHEMA: &'static ::outbox_core::EventSchema = &::outbox_core::EventSchema {
                aggregate_type: #aggregate,
                event_type: #name,
                version: #version,
                fields: &[#(#fields),*],
            };
        }
        #lock_checks
    })
}

#[cfg(test)]
mod tests {
    use quote::ToTokens;
    use syn::{ImplItem, ItemImpl, parse_quote};

    use super::*;

    fn expand(input: DeriveInput) -> ItemImpl {
        let tokens = derive_domain_event(&input).unwrap_or_else(|errors| {
            panic!(
                "{:?}",
                errors.iter().map(ToString::to_string).collect::<Vec<_>>()
            )
        });
        let file: syn::File = syn::parse2(tokens).expect("the expansion is items");
        file.items
            .into_iter()
            .find_map(|item| match item {
                syn::Item::Impl(item) => Some(item),
                _ => None,
            })
            .expect("the expansion has an impl block")
    }

    fn errors(input: DeriveInput) -> Vec<String> {
        match derive_domain_event(&input) {
            Ok(_) => Vec::new(),
            Err(errors) => errors.iter().map(ToString::to_string).collect(),
        }
    }

    fn payload_errors(input: DeriveInput) -> Vec<String> {
        match crate::payload::derive_event_payload(&input) {
            Ok(_) => Vec::new(),
            Err(errors) => errors.iter().map(ToString::to_string).collect(),
        }
    }

    /// The tokens of the associated constant `name`, without spaces.
    fn constant(item: &ItemImpl, name: &str) -> String {
        item.items
            .iter()
            .find_map(|item| match item {
                ImplItem::Const(constant) if constant.ident == name => {
                    Some(constant.expr.to_token_stream().to_string().replace(' ', ""))
                }
                _ => None,
            })
            .unwrap_or_else(|| panic!("no constant {name}"))
    }

    #[test]
    fn implements_the_trait_with_constants_from_the_attribute() {
        let item = expand(parse_quote! {
            #[domain_event(aggregate = "Order", version = 2, name = "order.placed")]
            #[serde(rename_all = "camelCase")]
            struct OrderPlaced {
                order_id: i64,
                #[serde(skip)]
                cache: Vec<u8>,
                coupon: Option<std::string::String>,
            }
        });
        let trait_path = item
            .trait_
            .as_ref()
            .unwrap()
            .1
            .to_token_stream()
            .to_string();
        assert_eq!(trait_path.replace(' ', ""), "::outbox_core::DomainEvent");
        assert_eq!(constant(&item, "AGGREGATE_TYPE"), "\"Order\"");
        assert_eq!(constant(&item, "EVENT_TYPE"), "\"order.placed\"");
        assert_eq!(constant(&item, "VERSION"), "2u32");
        let schema = constant(&item, "SCHEMA");
        assert!(schema.contains("name:\"orderId\",rust_name:\"order_id\",ty:\"i64\""));
        assert!(
            schema.contains(
                "name:\"coupon\",rust_name:\"coupon\",ty:\"Option<String>\",optional:true"
            )
        );
        assert!(!schema.contains("cache"), "{schema}");
    }

    #[test]
    fn keeps_the_struct_generics() {
        let item = expand(parse_quote! {
            #[domain_event(aggregate = "Order", version = 1)]
            struct OrderTagged<'a, T: Serialize, const N: usize> where T: Clone {
                tag: &'a T,
            }
        });
        assert_eq!(item.generics.params.len(), 3);
        assert!(item.generics.where_clause.is_some());
        let self_ty = item.self_ty.to_token_stream().to_string().replace(' ', "");
        assert_eq!(self_ty, "OrderTagged<'a,T,N>");
    }

    #[test]
    fn reports_shape_and_attribute_errors_together() {
        let errors = errors(parse_quote! {
            #[domain_event(aggregate = "Order")]
            #[serde(transparent)]
            struct OrderPlaced(i64);
        });
        assert_eq!(errors.len(), 3, "{errors:?}");
        assert!(errors[0].starts_with("missing `version`"));
        assert!(errors[1].starts_with("#[serde(transparent)] is not supported"));
        assert!(errors[2].starts_with("DomainEvent can only be derived for structs"));
    }

    #[test]
    fn refuses_every_serde_attribute_the_contract_does_not_model_at_once() {
        let errors = errors(parse_quote! {
            #[domain_event(aggregate = "Order", version = 1)]
            #[serde(deny_unknown_fields, into = "Other", bound = "", rename = "X")]
            struct OrderPlaced {
                #[serde(with = "custom")]
                at: i64,
                #[serde(with = "custom")]
                #[domain_event(opaque)]
                raw: i64,
                #[serde(skip_deserializing, alias = "qty2", borrow)]
                qty: i64,
                #[serde(skip_serializing_if = "Vec::is_empty")]
                tags: Vec<String>,
                #[serde(skip_serializing_if = "Option::is_none")]
                coupon: Option<String>,
                #[serde(default, skip_serializing_if = "Vec::is_empty")]
                notes: Vec<String>,
            }
        });
        let expected = [
            "#[serde(deny_unknown_fields)] on event `OrderPlaced` is not supported: a reader",
            "#[serde(into)] on event `OrderPlaced` is not supported: the payload would be written",
            "#[serde(with)] on field `at` of event `OrderPlaced` is not supported: the contract \
             cannot see",
            "#[serde(skip_deserializing)] on field `qty` of event `OrderPlaced` is not supported",
            "#[serde(skip_serializing_if)] on field `tags` of event `OrderPlaced` is not \
             supported on a required field",
        ];
        assert_eq!(errors.len(), expected.len(), "{errors:#?}");
        for (error, start) in errors.iter().zip(expected) {
            assert!(
                error.starts_with(start),
                "{error}\nshould start with\n{start}"
            );
        }
    }

    #[test]
    fn refuses_unmodelled_attributes_of_payload_types_and_variants() {
        let errors = payload_errors(parse_quote! {
            #[serde(rename_all_fields = "camelCase")]
            enum Line {
                #[serde(untagged)]
                Free { text_value: String },
                #[serde(deserialize_with = "custom")]
                Sku(String),
            }
        });
        let expected = [
            "#[serde(rename_all_fields)] on payload type `Line` is not supported",
            "#[serde(untagged)] on variant `Free` of payload type `Line` is not supported",
            "#[serde(deserialize_with)] on variant `Sku` of payload type `Line` is not supported",
        ];
        assert_eq!(errors.len(), expected.len(), "{errors:#?}");
        for (error, start) in errors.iter().zip(expected) {
            assert!(error.starts_with(start), "{error}");
        }
    }

    #[test]
    fn rejects_the_attribute_on_a_field() {
        let errors = errors(parse_quote! {
            #[domain_event(aggregate = "Order", version = 1)]
            struct OrderPlaced {
                #[domain_event(name = "id")]
                order_id: i64,
            }
        });
        assert_eq!(errors.len(), 1);
        assert!(errors[0].starts_with("#[domain_event(..)] belongs on the event struct"));
    }
}
