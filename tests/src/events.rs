//! Domain events of the test entities.

use std::collections::BTreeMap;

use outbox_core::DomainEvent;
use serde::{Deserialize, Serialize};

/// Appended by the order hooks when an order row is inserted.
#[derive(Debug, Clone, PartialEq, DomainEvent, Serialize, Deserialize)]
#[domain_event(aggregate = "Order", version = 1)]
pub struct OrderPlaced {
    /// The order's id.
    pub order_id: i64,
    /// Who ordered.
    pub customer: String,
    /// Order total.
    pub total_cents: i64,
}

/// Appended by the order hooks when an order row is updated.
#[derive(Debug, Clone, PartialEq, DomainEvent, Serialize, Deserialize)]
#[domain_event(aggregate = "Order", version = 1)]
pub struct OrderStatusChanged {
    /// The order's id.
    pub order_id: i64,
    /// The new status.
    pub status: String,
}

/// Saved with invoices through the explicit API.
#[derive(Debug, Clone, PartialEq, DomainEvent, Serialize, Deserialize)]
#[domain_event(aggregate = "Invoice", version = 2, name = "InvoiceIssued")]
#[serde(rename_all = "camelCase")]
pub struct InvoiceIssuedV2 {
    /// Invoiced amount.
    pub amount_cents: i64,
    /// Optional note.
    pub note: Option<String>,
}

/// An event whose payload serde_json refuses: map keys must be strings.
#[derive(Debug, Clone, DomainEvent, Serialize)]
#[domain_event(aggregate = "Invoice", version = 1)]
pub struct Unserializable {
    /// Keys that are not strings.
    pub by_bytes: BTreeMap<Vec<u8>, u8>,
}

/// Version 1 of `CustomerRegistered`, kept so consumers decode what was
/// published before version 2.
#[derive(Debug, Clone, PartialEq, DomainEvent, Serialize, Deserialize)]
#[domain_event(aggregate = "Customer", version = 1, name = "CustomerRegistered")]
pub struct CustomerRegisteredV1 {
    /// The customer.
    pub customer_id: i64,
    /// Full name.
    pub name: String,
}

/// Version 2: the name split in two, a change old readers cannot follow,
/// hence the new version.
#[derive(Debug, Clone, PartialEq, DomainEvent, Serialize, Deserialize)]
#[domain_event(aggregate = "Customer", version = 2)]
pub struct CustomerRegistered {
    /// The customer.
    pub customer_id: i64,
    /// Given name.
    pub first_name: String,
    /// Family name.
    pub last_name: String,
}

/// The upcast consumers declare once: version 1 read as version 2.
impl From<CustomerRegisteredV1> for CustomerRegistered {
    fn from(v1: CustomerRegisteredV1) -> Self {
        let (first_name, last_name) = v1.name.split_once(' ').unwrap_or((&v1.name, ""));
        Self {
            customer_id: v1.customer_id,
            first_name: first_name.to_owned(),
            last_name: last_name.to_owned(),
        }
    }
}
