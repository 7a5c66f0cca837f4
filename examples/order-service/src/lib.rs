//! The order service's entities and domain events, shared with the
//! services that consume its events (see `examples/order-consumer`, which
//! decodes the structs of [`events`]). In your own services, keep event
//! structs in a crate the producer and its consumers both depend on.

pub mod entity;
pub mod events;
