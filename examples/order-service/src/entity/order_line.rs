//! A line of an order. Inserting one appends `OrderLineAdded` to its order.

use outbox_core::{Change, EmitEvents, OutboxEvent};
use sea_orm::entity::prelude::*;

use crate::events::OrderLineAdded;

/// An order line row.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "order_lines")]
pub struct Model {
    /// Generated id.
    #[sea_orm(primary_key)]
    pub id: i64,
    /// The order it belongs to: the aggregate of its events.
    pub order_id: i64,
    /// What was ordered.
    pub sku: String,
    /// How many.
    pub quantity: i32,
    /// Price of one.
    pub unit_price_cents: i64,
}

/// A line belongs to an order.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {
    /// The order.
    #[sea_orm(
        belongs_to = "super::order::Entity",
        from = "Column::OrderId",
        to = "super::order::Column::Id"
    )]
    Order,
}

impl Related<super::order::Entity> for Entity {
    fn to() -> RelationDef {
        Relation::Order.def()
    }
}

outbox_core::active_model_behavior!();

impl EmitEvents for Model {
    fn events(&self, change: Change) -> Vec<OutboxEvent> {
        if change != Change::Inserted {
            return Vec::new();
        }
        let added = OrderLineAdded {
            order_id: self.order_id,
            sku: self.sku.clone(),
            quantity: self.quantity,
            unit_price_cents: self.unit_price_cents,
        };
        // The line's events belong to its order, not to the line's own key.
        vec![OutboxEvent::new(added).aggregate_id(self.order_id.to_string())]
    }
}
