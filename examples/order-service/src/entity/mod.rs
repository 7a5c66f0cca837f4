//! The order service's SeaORM entities.

pub mod order;
pub mod order_line;
