//! Decoding consumed messages into typed events: every version of an event
//! into its current struct, and every malformed message into a typed error.

use outbox_core::{DecodeError, EventDecoder, IncomingMessage};
use outbox_tests::events::{
    CustomerRegistered, CustomerRegisteredV1, InvoiceIssuedV2, OrderPlaced,
};

const ID: &[u8] = b"0190a7e8-0000-7000-8000-000000000001";

fn message<'a>(event_type: &'a str, version: &'a str, payload: &'a [u8]) -> IncomingMessage<'a> {
    IncomingMessage::new("outbox.event.Customer", Some(payload))
        .key(b"17")
        .header("id", ID)
        .header("eventType", event_type.as_bytes())
        .header("eventVersion", version.as_bytes())
        .header("aggregateSequence", b"1")
}

fn customers() -> EventDecoder<CustomerRegistered> {
    EventDecoder::new()
        .event::<CustomerRegistered>()
        .upcast::<CustomerRegisteredV1, CustomerRegistered>()
}

fn ada() -> CustomerRegistered {
    CustomerRegistered {
        customer_id: 17,
        first_name: "Ada".into(),
        last_name: "Lovelace".into(),
    }
}

#[test]
fn version_1_and_version_2_decode_into_the_current_struct() {
    let v1 = serde_json::to_vec(&CustomerRegisteredV1 {
        customer_id: 17,
        name: "Ada Lovelace".into(),
    })
    .unwrap();
    let v2 = serde_json::to_vec(&ada()).unwrap();
    let decoder = customers();

    let from_v1 = decoder
        .decode(&message("CustomerRegistered", "1", &v1))
        .unwrap();
    let from_v2 = decoder
        .decode(&message("CustomerRegistered", "2", &v2))
        .unwrap();
    assert_eq!(from_v1.event, ada());
    assert_eq!(from_v2.event, ada());
    assert_eq!(from_v1.metadata.version, 1);
    assert_eq!(from_v2.metadata.version, 2);
    assert_eq!(from_v1.metadata.aggregate_id.as_deref(), Some("17"));
    assert_eq!(from_v1.metadata.aggregate_sequence, Some(1));
}

/// What a consumer of several event types handles.
#[derive(Debug, PartialEq)]
enum Handled {
    Customer(CustomerRegistered),
    Order(OrderPlaced),
}

#[test]
fn several_event_types_decode_into_an_enum() {
    let decoder = EventDecoder::<Handled>::new()
        .event_with::<CustomerRegistered>(Handled::Customer)
        .event_with::<CustomerRegisteredV1>(|v1| Handled::Customer(v1.into()))
        .event_with::<OrderPlaced>(Handled::Order);
    assert!(decoder.knows("CustomerRegistered", 1));
    assert!(!decoder.knows("CustomerRegistered", 3));

    let v1 = br#"{"customer_id":17,"name":"Ada Lovelace"}"#;
    let placed = br#"{"order_id":1,"customer":"ada","total_cents":250}"#;
    assert_eq!(
        decoder
            .decode(&message("CustomerRegistered", "1", v1))
            .unwrap()
            .event,
        Handled::Customer(ada())
    );
    assert_eq!(
        decoder
            .decode(&message("OrderPlaced", "1", placed))
            .unwrap()
            .event,
        Handled::Order(OrderPlaced {
            order_id: 1,
            customer: "ada".into(),
            total_cents: 250
        })
    );
}

#[test]
fn unknown_types_and_versions_are_errors_to_route() {
    let decoder = customers();
    let error = decoder
        .decode(&message("InvoiceIssued", "2", b"{}"))
        .unwrap_err();
    assert!(
        matches!(&error, DecodeError::UnknownEventType { event_type } if event_type == "InvoiceIssued"),
        "{error:?}"
    );

    let error = decoder
        .decode(&message("CustomerRegistered", "3", b"{}"))
        .unwrap_err();
    match &error {
        DecodeError::UnknownVersion {
            event_type,
            version,
            known,
        } => {
            assert_eq!((event_type.as_str(), *version), ("CustomerRegistered", 3));
            assert_eq!(known, &[1, 2]);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        error.to_string(),
        "`CustomerRegistered` version 3 is not listed in this decoder (it lists versions [1, 2]); \
         add its struct with `.event::<..>()` or `.upcast::<..>()`"
    );
}

#[test]
fn malformed_messages_are_errors_not_panics() {
    let decoder = customers();

    let not_json = decoder
        .decode(&message("CustomerRegistered", "2", b"{not json"))
        .unwrap_err();
    assert!(
        matches!(not_json, DecodeError::Payload { .. }),
        "{not_json:?}"
    );

    // A version 1 payload sent as version 2 misses version 2's fields.
    let wrong_shape = decoder
        .decode(&message(
            "CustomerRegistered",
            "2",
            br#"{"customer_id":17,"name":"Ada Lovelace"}"#,
        ))
        .unwrap_err();
    let text = wrong_shape.to_string();
    assert!(
        text.starts_with("`CustomerRegistered` version 2 does not decode as `")
            && text.contains("CustomerRegistered`: missing field `first_name`"),
        "{text}"
    );

    let mut tombstone = message("CustomerRegistered", "2", b"");
    tombstone.payload = None;
    assert!(matches!(
        decoder.decode(&tombstone).unwrap_err(),
        DecodeError::MissingPayload { version: 2, .. }
    ));

    let mut headless = message("CustomerRegistered", "2", b"{}");
    headless.headers.clear();
    assert!(matches!(
        decoder.decode(&headless).unwrap_err(),
        DecodeError::MissingHeader { header: "id" }
    ));

    let bad_version = message("CustomerRegistered", "v2", b"{}");
    assert!(matches!(
        decoder.decode(&bad_version).unwrap_err(),
        DecodeError::InvalidHeader {
            header: "eventVersion",
            ..
        }
    ));
}

#[test]
fn what_the_producer_serializes_decodes() {
    // The payload as the outbox stores it (serde_json of the event).
    let issued = InvoiceIssuedV2 {
        amount_cents: 1200,
        note: Some("first".into()),
    };
    let payload = serde_json::to_vec(&issued).unwrap();
    let decoder = EventDecoder::<InvoiceIssuedV2>::new().event::<InvoiceIssuedV2>();
    let decoded = decoder
        .decode(&message("InvoiceIssued", "2", &payload))
        .unwrap();
    assert_eq!(decoded.event, issued);
}

#[test]
#[should_panic(expected = "`CustomerRegistered` version 2 is listed twice")]
fn a_version_is_listed_once() {
    let _ = EventDecoder::<CustomerRegistered>::new()
        .event::<CustomerRegistered>()
        .event::<CustomerRegistered>();
}
