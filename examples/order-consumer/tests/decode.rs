//! Decoding through the real pipeline: events of two versions appended on
//! PostgreSQL, published by the relay, read back from the broker and
//! decoded into the current struct.

mod support;

use std::time::Duration;

use outbox_core::{EventDecoder, IncomingMessage, OutboxEvent};
use outbox_tests::events::{CustomerRegistered, CustomerRegisteredV1};
use outbox_tests::kafka::{self, Consumed};
use sea_orm::TransactionTrait;
use support::Pipeline;

fn incoming(message: &Consumed) -> IncomingMessage<'_> {
    let mut incoming = IncomingMessage::new(&message.topic, message.payload.as_deref());
    if let Some(key) = &message.key {
        incoming = incoming.key(key.as_bytes());
    }
    for (name, value) in &message.headers {
        incoming = incoming.header(name, value.as_bytes());
    }
    incoming
}

#[tokio::test(flavor = "multi_thread")]
async fn version_1_and_2_payloads_from_the_broker_decode_into_the_current_struct() {
    let p = Pipeline::new("versions", 1).await;
    let txn = p.producer.db.begin().await.unwrap();
    outbox_core::append(
        &txn,
        [
            OutboxEvent::new(CustomerRegisteredV1 {
                customer_id: 17,
                name: "Ada Lovelace".into(),
            })
            .aggregate_id("17"),
            OutboxEvent::new(CustomerRegistered {
                customer_id: 18,
                first_name: "Grace".into(),
                last_name: "Hopper".into(),
            })
            .aggregate_id("18"),
        ],
    )
    .await
    .unwrap();
    txn.commit().await.unwrap();
    p.drain().await;

    let messages = kafka::consume(
        &p.brokers,
        &format!("{}.Customer", p.prefix),
        2,
        Duration::from_secs(20),
        Duration::from_millis(200),
    );
    assert_eq!(messages.len(), 2);
    let decoder = EventDecoder::<CustomerRegistered>::new()
        .event::<CustomerRegistered>()
        .upcast::<CustomerRegisteredV1, CustomerRegistered>();
    let decoded: Vec<_> = messages
        .iter()
        .map(|message| decoder.decode(&incoming(message)).expect("decodes"))
        .collect();

    assert_eq!(decoded[0].metadata.version, 1);
    assert_eq!(
        decoded[0].event,
        CustomerRegistered {
            customer_id: 17,
            first_name: "Ada".into(),
            last_name: "Lovelace".into(),
        }
    );
    assert_eq!(decoded[1].metadata.version, 2);
    assert_eq!(decoded[1].event.first_name, "Grace");
    assert_eq!(decoded[1].metadata.aggregate_id.as_deref(), Some("18"));
    assert_eq!(decoded[1].metadata.aggregate_sequence, Some(1));
    p.drop().await;
}
