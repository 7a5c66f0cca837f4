//! An order whose saves append events through the outbox hooks.

use outbox_core::{Change, EmitEvents, OutboxEvent};
use sea_orm::entity::prelude::*;

use crate::events::{OrderPlaced, OrderStatusChanged};

/// An order row.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "orders")]
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

outbox_core::active_model_behavior!();

impl EmitEvents for Model {
    fn events(&self, change: Change) -> Vec<OutboxEvent> {
        match change {
            Change::Inserted => vec![
                OrderPlaced {
                    order_id: self.id,
                    customer: self.customer.clone(),
                    total_cents: self.total_cents,
                }
                .into(),
            ],
            Change::Updated => vec![
                OrderStatusChanged {
                    order_id: self.id,
                    status: self.status.clone(),
                }
                .into(),
            ],
        }
    }
}
