//! Benchmarks of the transactional outbox, run as binaries against the real
//! services rather than as timed tests (see `BENCHMARKS.md` at the repository
//! root for the results and the commands that reproduce them):
//!
//! - `bench-append`: what appending events costs a business transaction
//!   (an order insert through SeaORM with 0, 1 and 10 events);
//! - `bench-relay`: the relay's throughput against the database's own
//!   claim-and-mark ceiling, its commit-to-ack latency at a fixed rate, and
//!   its throughput with a long history of published rows;
//! - `bench-cdc`: CDC mode (reading the write-ahead log) beside polling
//!   mode on the same load: backlog throughput and commit-to-ack latency;
//! - `bench-rabbitmq` and `bench-nats`: the relay draining a backlog to
//!   RabbitMQ (by confirm window) and NATS JetStream (by PubAck window)
//!   beside the database's and a plain client's ceilings;
//! - `bench-brokers`: Kafka, RabbitMQ and NATS side by side in one run:
//!   drain throughput against both ceilings, and commit-to-ack latency.
//!
//! This library holds what the binaries share: the benchmark's order
//! entity ([`order`]), the loader of pending rows ([`load`]), the broker
//! benchmarks' drains, plain clients and fixed-rate runs ([`brokers`]),
//! latency statistics ([`stats`]), CPU accounting ([`cpu`]), report
//! printing ([`report`]) and the recording sinks ([`recording`]).

pub mod brokers;
pub mod cpu;
pub mod load;
pub mod order;
pub mod recording;
pub mod report;
pub mod stats;
