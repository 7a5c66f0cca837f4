//! What `status` shows: how `status` reads a dialect's rows of pending
//! rows per type and dead letters. The statements themselves are the
//! dialect's ([`super::Dialect::PENDING_BY_TYPE`],
//! [`super::Dialect::DEAD_LETTERS`]).

use sqlx::{Database, FromRow};

use super::{DeadLetter, TypeBacklog};

/// How `status` reads its rows.
pub trait StatusRows<DB: Database> {
    /// A row of pending rows of one aggregate type.
    fn type_backlog(row: &DB::Row) -> Result<TypeBacklog, sqlx::Error>;

    /// A row of a dead letter.
    fn dead_letter(row: &DB::Row) -> Result<DeadLetter, sqlx::Error>;
}

/// Rows read by their columns' declared types.
pub struct Typed;

impl<DB: Database> StatusRows<DB> for Typed
where
    for<'r> TypeBacklog: FromRow<'r, DB::Row>,
    for<'r> DeadLetter: FromRow<'r, DB::Row>,
{
    fn type_backlog(row: &DB::Row) -> Result<TypeBacklog, sqlx::Error> {
        TypeBacklog::from_row(row)
    }

    fn dead_letter(row: &DB::Row) -> Result<DeadLetter, sqlx::Error> {
        DeadLetter::from_row(row)
    }
}
