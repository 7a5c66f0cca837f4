//! A decoder kept for an old version may have its own copies of the old
//! nested types. outbox.lock records `ShipmentBooked` version 1 with
//! `weight: ShipmentWeight { grams: i64 }`, and version 2, where
//! `ShipmentWeight` gained a required `unit`. `ShipmentBookedV1` reads
//! version 1 through `ShipmentWeightV1`, compared with the recorded
//! `ShipmentWeight` of version 1 field by field.

use outbox_core::{DomainEvent, EventPayload};
use serde::{Deserialize, Serialize};

#[derive(EventPayload, Serialize, Deserialize)]
struct ShipmentWeight {
    grams: i64,
    unit: String,
}

#[derive(DomainEvent, Serialize, Deserialize)]
#[domain_event(aggregate = "Shipment", version = 2)]
struct ShipmentBooked {
    shipment_id: i64,
    weight: ShipmentWeight,
}

#[derive(EventPayload, Serialize, Deserialize)]
struct ShipmentWeightV1 {
    grams: i64,
}

#[derive(DomainEvent, Serialize, Deserialize)]
#[domain_event(aggregate = "Shipment", version = 1, name = "ShipmentBooked")]
struct ShipmentBookedV1 {
    shipment_id: i64,
    weight: ShipmentWeightV1,
}

fn main() {
    assert_eq!(ShipmentBookedV1::VERSION, 1);
    let recorded_v1 = r#"{"shipment_id":3,"weight":{"grams":1200}}"#;
    let decoded: ShipmentBookedV1 = serde_json::from_str(recorded_v1).unwrap();
    assert_eq!(decoded.weight.grams, 1200);
    assert!(serde_json::from_str::<ShipmentBooked>(recorded_v1).is_err());
    let v2 = ShipmentBooked {
        shipment_id: decoded.shipment_id,
        weight: ShipmentWeight {
            grams: decoded.weight.grams,
            unit: "g".into(),
        },
    };
    assert_eq!(v2.weight.unit, "g");
}
