//! The `order_summary` table and the effect of each event on it.
//!
//! Every effect is one upsert that adds to the row's counters, so applying
//! an event twice would show: `events_applied` counts the effects.

use sea_orm::entity::prelude::*;
use sea_orm::sea_query::{Expr, ExprTrait, OnConflict};
use sea_orm::{ActiveValue::Set, ConnectionTrait, Schema};

use crate::events::OrderEvent;

/// One order as this consumer sees it.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "order_summary")]
pub struct Model {
    /// The order (the events' aggregate id).
    #[sea_orm(primary_key, auto_increment = false)]
    pub order_id: i64,
    /// Who ordered, once `OrderPlaced` was applied.
    pub customer: Option<String>,
    /// Lines added.
    pub lines: i32,
    /// Items over all lines.
    pub items: i64,
    /// Sum of the lines' prices.
    pub total_cents: i64,
    /// Amount paid.
    pub paid_cents: i64,
    /// Effects applied to the row: one per event, if exactly once.
    pub events_applied: i32,
}

/// No relations.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}

/// Creates the table if it does not exist.
pub async fn create_table<C: ConnectionTrait>(db: &C) -> Result<(), DbErr> {
    let statement = Schema::new(db.get_database_backend())
        .create_table_from_entity(Entity)
        .if_not_exists()
        .to_owned();
    db.execute(&statement).await?;
    Ok(())
}

/// Applies one event to its order's row, creating the row if needed.
pub async fn apply<C: ConnectionTrait>(db: &C, event: &OrderEvent) -> Result<(), DbErr> {
    let mut change = Change {
        order_id: event.order_id(),
        ..Change::default()
    };
    match event {
        OrderEvent::Placed(placed) => change.customer = Some(placed.customer.clone()),
        OrderEvent::LineAdded(line) => {
            change.lines = 1;
            change.items = line.quantity;
            change.total_cents = line.quantity * line.unit_price_cents;
        }
        OrderEvent::Paid(paid) => change.paid_cents = paid.amount_cents,
    }
    change.save(db).await
}

/// What one event adds to an order's row.
#[derive(Default)]
struct Change {
    order_id: i64,
    customer: Option<String>,
    lines: i32,
    items: i64,
    total_cents: i64,
    paid_cents: i64,
}

impl Change {
    /// One statement: insert the row with these values, or add them to it.
    async fn save<C: ConnectionTrait>(self, db: &C) -> Result<(), DbErr> {
        let mut on_conflict = OnConflict::column(Column::OrderId);
        if self.customer.is_some() {
            on_conflict.update_column(Column::Customer);
        }
        let added: [(Column, i64); 5] = [
            (Column::Lines, i64::from(self.lines)),
            (Column::Items, self.items),
            (Column::TotalCents, self.total_cents),
            (Column::PaidCents, self.paid_cents),
            (Column::EventsApplied, 1),
        ];
        for (column, amount) in added {
            on_conflict.value(column, Expr::col((Entity, column)).add(amount));
        }
        let row = ActiveModel {
            order_id: Set(self.order_id),
            customer: Set(self.customer),
            lines: Set(self.lines),
            items: Set(self.items),
            total_cents: Set(self.total_cents),
            paid_cents: Set(self.paid_cents),
            events_applied: Set(1),
        };
        Entity::insert(row)
            .on_conflict(on_conflict)
            .exec_without_returning(db)
            .await?;
        Ok(())
    }
}
