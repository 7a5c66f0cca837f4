//! A newtype (`struct InvoiceId(i64)`) or a `#[serde(transparent)]` struct
//! is written as the field it holds, so it may replace that field's type,
//! and be replaced by it, in a recorded version. outbox.lock records
//! `InvoiceIssued` version 1 as first written: `invoice_id: i64`,
//! `customer: String`, `lines: Vec<InvoiceLine>` with
//! `InvoiceLine { sku: String, cents: InvoiceCents }` and
//! `struct InvoiceCents(i64)`. `main` checks that the JSON is the same.

use outbox_core::{DomainEvent, EventPayload};
use serde::Serialize;

#[derive(EventPayload, Serialize)]
struct InvoiceId(i64);

#[derive(EventPayload, Serialize)]
#[serde(transparent)]
struct CustomerRef {
    id: String,
}

#[derive(EventPayload, Serialize)]
struct InvoiceSku(String);

#[derive(EventPayload, Serialize)]
struct InvoiceLine {
    sku: InvoiceSku,
    cents: i64,
}

#[derive(DomainEvent, Serialize)]
#[domain_event(aggregate = "Invoice", version = 1)]
struct InvoiceIssued {
    invoice_id: InvoiceId,
    customer: CustomerRef,
    lines: Vec<InvoiceLine>,
}

/// The types as version 1 was first written.
mod first {
    use serde::Serialize;

    #[derive(Serialize)]
    pub struct InvoiceCents(pub i64);

    #[derive(Serialize)]
    pub struct InvoiceLine {
        pub sku: String,
        pub cents: InvoiceCents,
    }

    #[derive(Serialize)]
    pub struct InvoiceIssued {
        pub invoice_id: i64,
        pub customer: String,
        pub lines: Vec<InvoiceLine>,
    }
}

fn main() {
    let now = InvoiceIssued {
        invoice_id: InvoiceId(42),
        customer: CustomerRef { id: "c-7".into() },
        lines: vec![InvoiceLine {
            sku: InvoiceSku("A-1".into()),
            cents: 1250,
        }],
    };
    let then = first::InvoiceIssued {
        invoice_id: 42,
        customer: "c-7".into(),
        lines: vec![first::InvoiceLine {
            sku: "A-1".into(),
            cents: first::InvoiceCents(1250),
        }],
    };
    assert_eq!(
        serde_json::to_string(&now).unwrap(),
        serde_json::to_string(&then).unwrap()
    );
}
