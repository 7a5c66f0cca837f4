//! An order. Inserting one appends `OrderPlaced` from the outbox hooks.

use outbox_core::{Change, EmitEvents, OutboxEvent};
use sea_orm::entity::prelude::*;

use crate::events::OrderPlaced;

/// An order row.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "orders")]
pub struct Model {
    /// Generated id; the aggregate id of the order's events.
    #[sea_orm(primary_key)]
    pub id: i64,
    /// Who ordered.
    pub customer: String,
    /// `placed` or `paid`.
    pub status: String,
}

/// An order has lines.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {
    /// The order's lines.
    #[sea_orm(has_many = "super::order_line::Entity")]
    Lines,
}

impl Related<super::order_line::Entity> for Entity {
    fn to() -> RelationDef {
        Relation::Lines.def()
    }
}

// The one line that makes saves append the events below.
outbox_core::active_model_behavior!();

impl EmitEvents for Model {
    fn events(&self, change: Change) -> Vec<OutboxEvent> {
        match change {
            Change::Inserted => vec![
                OrderPlaced {
                    order_id: self.id,
                    customer: self.customer.clone(),
                }
                .into(),
            ],
            Change::Updated => Vec::new(),
        }
    }
}
