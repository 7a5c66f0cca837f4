//! Events that follow from a saved row, appended by SeaORM's
//! [`ActiveModelBehavior`](sea_orm::ActiveModelBehavior) hooks.
//!
//! Implement [`EmitEvents`] for an entity's `Model` and replace the entity's
//! `impl ActiveModelBehavior for ActiveModel {}` with one line,
//! [`outbox_core::active_model_behavior!();`](crate::active_model_behavior).
//! Saving the row through an ActiveModel's `insert`, `update` or `save` then
//! appends the events in the same transaction, with the row's primary key as
//! aggregate id; saving it on a connection that is not a transaction is
//! refused before the row is written.
//!
//! SeaORM's hooks can only fail with a `DbErr`: a refusal arrives as a
//! `DbErr::Custom` that [`OutboxErrorKind::of_db_err`](crate::OutboxErrorKind::of_db_err)
//! recognises, for example as [`OutboxErrorKind::NotInTransaction`](crate::OutboxErrorKind::NotInTransaction).
//!
//! SeaORM runs these hooks only for `ActiveModel::insert`, `update` and
//! `save` (and this crate's `*_with_events`). Bulk statements such as
//! `Entity::insert_many`, `Entity::update_many` or raw SQL bypass them and
//! append nothing.

use sea_orm::{ConnectionTrait, ModelTrait};

use crate::active_model::default_aggregate_id;
use crate::append::{prepare, write};
use crate::transaction::ensure_transaction;
use crate::{OutboxError, OutboxEvent};

/// What happened to the saved row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// The row was inserted.
    Inserted,
    /// The row was updated.
    Updated,
}

/// The events that saving a row of this model produces.
///
/// ```
/// # mod order {
/// #     use sea_orm::entity::prelude::*;
/// #     #[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
/// #     #[sea_orm(table_name = "orders")]
/// #     pub struct Model {
/// #         #[sea_orm(primary_key)]
/// #         pub id: i64,
/// #         pub customer: String,
/// #     }
/// #     #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
/// #     pub enum Relation {}
/// // In the entity module, instead of `impl ActiveModelBehavior for ActiveModel {}`:
/// outbox_core::active_model_behavior!();
/// # }
/// use outbox_core::{Change, DomainEvent, EmitEvents, OutboxEvent};
///
/// #[derive(DomainEvent, serde::Serialize)]
/// #[domain_event(aggregate = "Order", version = 1)]
/// struct OrderPlaced { customer: String }
///
/// impl EmitEvents for order::Model {
///     fn events(&self, change: Change) -> Vec<OutboxEvent> {
///         match change {
///             Change::Inserted => vec![OrderPlaced { customer: self.customer.clone() }.into()],
///             Change::Updated => vec![],
///         }
///     }
/// }
/// ```
pub trait EmitEvents: ModelTrait {
    /// The events to append after this row was saved; their aggregate id
    /// defaults to the row's primary key.
    fn events(&self, change: Change) -> Vec<OutboxEvent>;
}

/// The `before_save` half of [`active_model_behavior!`](crate::active_model_behavior):
/// refuses a save that is not inside a transaction, before the row is written.
pub fn before_save<C: ConnectionTrait>() -> Result<(), OutboxError> {
    ensure_transaction::<C>()
}

/// The `after_save` half of [`active_model_behavior!`](crate::active_model_behavior):
/// appends the events of [`EmitEvents::events`] for the saved `model`.
pub async fn after_save<C, M>(model: &M, db: &C, insert: bool) -> Result<(), OutboxError>
where
    C: ConnectionTrait,
    M: EmitEvents,
{
    ensure_transaction::<C>()?;
    let change = if insert {
        Change::Inserted
    } else {
        Change::Updated
    };
    let events = prepare(model.events(change))?;
    let aggregate_id = default_aggregate_id(model, &events)?;
    write(db, events, aggregate_id.as_deref()).await?;
    Ok(())
}

/// Implements SeaORM's `ActiveModelBehavior` for the entity module's
/// `ActiveModel` so that saves append the [`EmitEvents`] of its `Model`.
///
/// Write it in the entity module in place of
/// `impl ActiveModelBehavior for ActiveModel {}`. See [`EmitEvents`] for an
/// example and [the module docs](crate::hooks) for which SeaORM calls run it.
#[macro_export]
macro_rules! active_model_behavior {
    () => {
        #[$crate::__private::sea_orm::prelude::async_trait::async_trait]
        impl $crate::__private::sea_orm::ActiveModelBehavior for ActiveModel {
            async fn before_save<C>(
                self,
                _db: &C,
                _insert: bool,
            ) -> ::std::result::Result<Self, $crate::__private::sea_orm::DbErr>
            where
                C: $crate::__private::sea_orm::ConnectionTrait,
            {
                $crate::hooks::before_save::<C>()?;
                ::std::result::Result::Ok(self)
            }

            async fn after_save<C>(
                model: Model,
                db: &C,
                insert: bool,
            ) -> ::std::result::Result<Model, $crate::__private::sea_orm::DbErr>
            where
                C: $crate::__private::sea_orm::ConnectionTrait,
            {
                $crate::hooks::after_save(&model, db, insert).await?;
                ::std::result::Result::Ok(model)
            }
        }
    };
}
