//! Saving a SeaORM ActiveModel together with its events, in one call.

use std::future::Future;

use sea_orm::sea_query::{Query, ValueTuple};
use sea_orm::{
    ActiveModelBehavior, ActiveModelTrait, ColumnTrait, ColumnType, ConnectionTrait, DbBackend,
    DbErr, EntityTrait, FromQueryResult, IdenStatic, IntoActiveModel, Iterable, ModelTrait,
    PrimaryKeyToColumn, QueryTrait, Value,
};

use crate::append::{prepare, save_and_append_statement, write};
use crate::outbox_event::PreparedEvent;
use crate::transaction::ensure_transaction;
use crate::{OutboxError, OutboxEvent};

type ModelOf<A> = <<A as ActiveModelTrait>::Entity as EntityTrait>::Model;

/// Saves an aggregate and appends its events in the same transaction.
///
/// Each event's aggregate id is the saved model's primary key unless the
/// event sets one ([`OutboxEvent::aggregate_id`]); a composite key is joined
/// with `:`. Payloads are serialized and the connection is checked before
/// anything is written; a connection that is not a transaction is refused
/// with [`OutboxError::NotInTransaction`].
///
/// The model's [`ActiveModelBehavior`] hooks run as in SeaORM's own
/// `insert`/`update`: `before_save` before the row is written, `after_save`
/// with the saved model after it. The events given here are written with
/// the row, before `after_save`, so events that `after_save` appends (see
/// [`EmitEvents`](crate::EmitEvents)) come after them in the aggregate's
/// sequence. On PostgreSQL, `insert_with_events` writes the row and its
/// events in one statement.
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
    /// Inserts the row and appends `events` with its primary key as
    /// aggregate id. Returns the inserted model.
    ///
    /// On PostgreSQL the row and its events are written by one statement,
    /// one round trip: SeaORM's `INSERT .. RETURNING` of the row inside a
    /// data-modifying CTE that also reserves the events' sequence numbers
    /// and inserts their outbox rows, taking the aggregate id from the
    /// inserted row's key in SQL. Elsewhere, and on PostgreSQL for more
    /// than 500 events or for events whose aggregate id the statement cannot
    /// compute (a key that is not integers, strings and UUIDs; one aggregate
    /// type with both given ids and the row's), the insert and the append
    /// are separate statements. Either way `before_save` runs before the row
    /// is written and `after_save` after the events are.
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
        async move { insert_and_write(self, db, checked?).await }
    }

    /// Updates the row, then appends `events` with its primary key as
    /// aggregate id. Returns the updated model. `before_save` runs before
    /// the row is written and `after_save` after the events are.
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
        async move { update_and_write(self, db, checked?).await }
    }

    /// Inserts the row if its primary key is not set and updates it
    /// otherwise (SeaORM's `save`), appending `events` as
    /// [`insert_with_events`](Self::insert_with_events) and
    /// [`update_with_events`](Self::update_with_events) do.
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
                update_and_write(self, db, events).await?
            } else {
                insert_and_write(self, db, events).await?
            };
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

/// SeaORM's `ActiveModelTrait::insert` with the events written between the
/// insert and `after_save`; on PostgreSQL, in the insert's statement.
async fn insert_and_write<A, C>(
    active_model: A,
    db: &C,
    events: Vec<PreparedEvent>,
) -> Result<ModelOf<A>, OutboxError>
where
    A: ActiveModelTrait + ActiveModelBehavior + Send,
    ModelOf<A>: IntoActiveModel<A>,
    C: ConnectionTrait,
{
    let active_model = ActiveModelBehavior::before_save(active_model, db, true).await?;
    let insert = <A::Entity as EntityTrait>::insert(active_model);
    let backend = db.get_database_backend();
    let one_statement = if backend == DbBackend::Postgres {
        // What `Insert::exec_with_returning` sends, wrapped with the append.
        let mut save = insert.as_query().clone();
        save.returning(
            Query::returning().exprs(
                <A::Entity as EntityTrait>::Column::iter()
                    .map(|column| column.select_as(column.into_returning_expr(backend))),
            ),
        );
        let key_columns = key_columns::<A::Entity>();
        save_and_append_statement(backend.build(&save), key_columns.as_deref(), &events)
    } else {
        None
    };
    let model = match one_statement {
        Some(statement) => {
            let row = db
                .query_one_raw(statement)
                .await?
                .ok_or_else(|| DbErr::RecordNotFound("Failed to find inserted item".to_owned()))?;
            ModelOf::<A>::from_query_result(&row, "")?
        }
        None => {
            let model = insert.exec_with_returning(db).await?;
            let aggregate_id = default_aggregate_id(&model, &events)?;
            write(db, events, aggregate_id.as_deref()).await?;
            model
        }
    };
    Ok(A::after_save(model, db, true).await?)
}

/// SeaORM's `ActiveModelTrait::update` with the events written between the
/// update and `after_save`.
async fn update_and_write<A, C>(
    active_model: A,
    db: &C,
    events: Vec<PreparedEvent>,
) -> Result<ModelOf<A>, OutboxError>
where
    A: ActiveModelTrait + ActiveModelBehavior + Send,
    ModelOf<A>: IntoActiveModel<A>,
    C: ConnectionTrait,
{
    let active_model = ActiveModelBehavior::before_save(active_model, db, false).await?;
    let model = <A::Entity as EntityTrait>::update(active_model)
        .exec(db)
        .await?;
    let aggregate_id = default_aggregate_id(&model, &events)?;
    write(db, events, aggregate_id.as_deref()).await?;
    Ok(A::after_save(model, db, false).await?)
}

/// The primary key's column names, if PostgreSQL's `::text` of each column
/// is what [`aggregate_id_of`] makes of its value in Rust: integers in
/// decimal, strings as they are, UUIDs hyphenated in lower case.
fn key_columns<E: EntityTrait>() -> Option<Vec<&'static str>> {
    E::PrimaryKey::iter()
        .map(|key| {
            let column = key.into_column();
            match column.def().get_column_type() {
                ColumnType::TinyInteger
                | ColumnType::SmallInteger
                | ColumnType::Integer
                | ColumnType::BigInteger
                | ColumnType::TinyUnsigned
                | ColumnType::SmallUnsigned
                | ColumnType::Unsigned
                | ColumnType::BigUnsigned
                | ColumnType::String(_)
                | ColumnType::Text
                | ColumnType::Uuid => Some(column.as_str()),
                // `char(n)` loses its padding in `::text`, enums and other
                // types may read differently: such keys take the
                // statement-per-step path, which formats them in Rust.
                _ => None,
            }
        })
        .collect()
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
