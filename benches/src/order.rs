//! The business row of the benchmarks: an order with SeaORM's default
//! hooks, so saving it alone appends nothing and every event is appended
//! explicitly.

use outbox_core::OutboxEvent;
use outbox_tests::events::{OrderPlaced, OrderStatusChanged};
use sea_orm::ActiveValue::Set;
use sea_orm::entity::prelude::*;

/// An order row of the `bench_orders` table.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "bench_orders")]
pub struct Model {
    /// Generated id; the aggregate id of the order's events.
    #[sea_orm(primary_key)]
    pub id: i64,
    /// Who ordered.
    pub customer: String,
    /// Order total.
    pub total_cents: i64,
    /// `placed`, `paid`, ...
    pub status: String,
}

/// No relations.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}

/// The `n`th order a benchmark places, not yet saved.
///
/// ```
/// let order = outbox_bench::order::new_order(7);
/// assert_eq!(order.customer.as_ref(), "customer-7");
/// ```
pub fn new_order(n: i64) -> ActiveModel {
    ActiveModel {
        customer: Set(customer(n)),
        total_cents: Set(total_cents(n)),
        status: Set("placed".into()),
        ..Default::default()
    }
}

/// The `count` events of placing the `n`th order: `OrderPlaced`, then
/// `OrderStatusChanged` for each further event. Their aggregate id is left
/// to the saved order's primary key.
///
/// ```
/// let events = outbox_bench::order::order_events(7, 3);
/// let types: Vec<_> = events.iter().map(|event| event.event_type()).collect();
/// assert_eq!(types, ["OrderPlaced", "OrderStatusChanged", "OrderStatusChanged"]);
/// ```
pub fn order_events(n: i64, count: usize) -> Vec<OutboxEvent> {
    (0..count)
        .map(|index| {
            if index == 0 {
                order_placed(n).into()
            } else {
                OrderStatusChanged {
                    order_id: n,
                    status: format!("step-{index}"),
                }
                .into()
            }
        })
        .collect()
}

/// The `OrderPlaced` event of the `n`th order.
///
/// ```
/// assert_eq!(outbox_bench::order::order_placed(7).customer, "customer-7");
/// ```
pub fn order_placed(n: i64) -> OrderPlaced {
    OrderPlaced {
        order_id: n,
        customer: customer(n),
        total_cents: total_cents(n),
    }
}

fn customer(n: i64) -> String {
    format!("customer-{n}")
}

fn total_cents(n: i64) -> i64 {
    1_000 + n % 10_000
}
