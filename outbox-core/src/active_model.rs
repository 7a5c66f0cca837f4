//! Saving a SeaORM ActiveModel together with its events, in one call.

use std::future::Future;

use sea_orm::{
    ActiveModelBehavior, ActiveModelTrait, ConnectionTrait, EntityTrait, IntoActiveModel,
    ModelTrait, Value, sea_query::ValueTuple,
};

use crate::append::{ensure_transaction, prepare, write};
use crate::outbox_event::PreparedEvent;
use crate::{OutboxError, OutboxEvent};

type ModelOf<A> = <<A as ActiveModelTrait>::Entity as EntityTrait>::Model;

/// Saves an aggregate and appends its events in the same transaction.
///
/// Each event's aggregate id is the saved model's primary key unless the
/// event sets one ([`OutboxEvent::aggregate_id`]); a composite key is joined
/// with `:`. Payloads are serialized and the connection is checked before
/// anything is written; a connection that is not a transaction is refused
/// with [`OutboxError::NotInTransaction`]. The model's
/// [`ActiveModelBehavior`] hooks run as in SeaORM's own `insert`/`update`.
///
/// ```no_run
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
/// #     impl ActiveModelBehavior for ActiveModel {}
/// # }
/// use outbox_core::{ActiveModelOutboxExt, DomainEvent};
/// use sea_orm::{ActiveValue::Set, DatabaseConnection, TransactionTrait};
///
/// #[derive(DomainEvent, serde::Serialize)]
/// #[domain_event(aggregate = "Order", version = 1)]
/// struct OrderPlaced { customer: String }
///
/// # async fn place(db: &DatabaseConnection) -> Result<(), Box<dyn std::error::Error>> {
/// let txn = db.begin().await?;
/// let order = order::ActiveModel { customer: Set("ada".into()), ..Default::default() }
///     .insert_with_events(&txn, [OrderPlaced { customer: "ada".into() }])
///     .await?;
/// txn.commit().await?; // the order and its OrderPlaced row, or neither
/// # let _ = order; Ok(()) }
/// ```
pub trait ActiveModelOutboxExt: ActiveModelTrait + ActiveModelBehavior + Send
where
    ModelOf<Self>: IntoActiveModel<Self>,
{
    /// Inserts the row, then appends `events` with its primary key as
    /// aggregate id. Returns the inserted model.
    fn insert_with_events<'a, C, I>(
        self,
        db: &'a C,
        events: I,
    ) -> impl Future<Output = Result<ModelOf<Self>, OutboxError>> + Send + 'a
    where
        Self: 'a,
        C: ConnectionTrait,
        I: IntoIterator,
        I::Item: Into<OutboxEvent>,
    {
        let checked = ensure_transaction::<C>().and_then(|()| prepare(events));
        async move {
            let events = checked?;
            let model = self.insert(db).await?;
            let aggregate_id = default_aggregate_id(&model, &events)?;
            write(db, events, aggregate_id.as_deref()).await?;
            Ok(model)
        }
    }

    /// Updates the row, then appends `events` with its primary key as
    /// aggregate id. Returns the updated model.
    fn update_with_events<'a, C, I>(
        self,
        db: &'a C,
        events: I,
    ) -> impl Future<Output = Result<ModelOf<Self>, OutboxError>> + Send + 'a
    where
        Self: 'a,
        C: ConnectionTrait,
        I: IntoIterator,
        I::Item: Into<OutboxEvent>,
    {
        let checked = ensure_transaction::<C>().and_then(|()| prepare(events));
        async move {
            let events = checked?;
            let model = self.update(db).await?;
            let aggregate_id = default_aggregate_id(&model, &events)?;
            write(db, events, aggregate_id.as_deref()).await?;
            Ok(model)
        }
    }

    /// Inserts the row if its primary key is not set and updates it
    /// otherwise (SeaORM's `save`), then appends `events`.
    fn save_with_events<'a, C, I>(
        self,
        db: &'a C,
        events: I,
    ) -> impl Future<Output = Result<Self, OutboxError>> + Send + 'a
    where
        Self: 'a,
        C: ConnectionTrait,
        I: IntoIterator,
        I::Item: Into<OutboxEvent>,
    {
        let checked = ensure_transaction::<C>().and_then(|()| prepare(events));
        async move {
            let events = checked?;
            let model = if self.is_update() {
                self.update(db).await?
            } else {
                self.insert(db).await?
            };
            let aggregate_id = default_aggregate_id(&model, &events)?;
            write(db, events, aggregate_id.as_deref()).await?;
            Ok(model.into_active_model())
        }
    }
}

impl<A> ActiveModelOutboxExt for A
where
    A: ActiveModelTrait + ActiveModelBehavior + Send,
    ModelOf<A>: IntoActiveModel<A>,
{
}

/// The aggregate id for those `events` that set none: `model`'s primary key.
pub(crate) fn default_aggregate_id<M: ModelTrait>(
    model: &M,
    events: &[PreparedEvent],
) -> Result<Option<String>, OutboxError> {
    if events.iter().all(|event| event.aggregate_id.is_some()) {
        return Ok(None);
    }
    aggregate_id_of(model.get_primary_key_value()).map(Some)
}

/// The primary key as the `aggregateid` string; parts of a composite key are
/// joined with `:`.
fn aggregate_id_of(key: ValueTuple) -> Result<String, OutboxError> {
    let parts = match key {
        ValueTuple::One(a) => vec![a],
        ValueTuple::Two(a, b) => vec![a, b],
        ValueTuple::Three(a, b, c) => vec![a, b, c],
        ValueTuple::Many(values) => values,
    };
    let parts = parts
        .iter()
        .map(key_part)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|reason| OutboxError::UnsupportedPrimaryKey { reason })?;
    Ok(parts.join(":"))
}

fn key_part(value: &Value) -> Result<String, String> {
    let text = match value {
        Value::TinyInt(Some(v)) => v.to_string(),
        Value::SmallInt(Some(v)) => v.to_string(),
        Value::Int(Some(v)) => v.to_string(),
        Value::BigInt(Some(v)) => v.to_string(),
        Value::TinyUnsigned(Some(v)) => v.to_string(),
        Value::SmallUnsigned(Some(v)) => v.to_string(),
        Value::Unsigned(Some(v)) => v.to_string(),
        Value::BigUnsigned(Some(v)) => v.to_string(),
        Value::String(Some(v)) => v.clone(),
        Value::Char(Some(v)) => v.to_string(),
        Value::Uuid(Some(v)) => v.hyphenated().to_string(),
        other if !other.is_some() => return Err("it is NULL".to_owned()),
        other => return Err(format!("a column of type {other:?} is not an id")),
    };
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn primary_keys_become_aggregate_ids() {
        assert_eq!(
            aggregate_id_of(ValueTuple::One(42i64.into())).unwrap(),
            "42"
        );
        let uuid = uuid::Uuid::nil();
        assert_eq!(
            aggregate_id_of(ValueTuple::Two("tenant".into(), uuid.into())).unwrap(),
            "tenant:00000000-0000-0000-0000-000000000000"
        );
        let null = ValueTuple::One(Value::BigInt(None));
        assert!(matches!(
            aggregate_id_of(null),
            Err(OutboxError::UnsupportedPrimaryKey { .. })
        ));
    }
}
