//! Which connections may carry outbox rows: only a SeaORM transaction, so
//! that the events commit or roll back with the aggregate.
//!
//! SeaORM's hooks (`ActiveModelBehavior::before_save`/`after_save`) receive
//! the connection as a generic `C: ConnectionTrait` and nothing more, and no
//! trait method tells a transaction from a pool. The check therefore
//! compares `C` with the transaction type SeaORM's [`TransactionTrait`]
//! hands out (`begin`), by type identity: unlike a type's name, that cannot
//! mistake another type (or another SeaORM version's transaction) for it.

use sea_orm::{ConnectionTrait, DatabaseConnection, TransactionTrait};

use crate::OutboxError;

/// The transaction type of SeaORM's [`TransactionTrait`]: what `begin` on a
/// connection (or on a transaction, for a nested one) returns.
type SeaOrmTransaction = <DatabaseConnection as TransactionTrait>::Transaction;

/// Whether `C` is SeaORM's transaction type.
fn is_transaction<C: ConnectionTrait + ?Sized>() -> bool {
    typeid::of::<C>() == typeid::of::<SeaOrmTransaction>()
}

/// Refuses a connection that is not a transaction: events written on an
/// auto-committing connection could commit without the aggregate.
pub(crate) fn ensure_transaction<C: ConnectionTrait>() -> Result<(), OutboxError> {
    if is_transaction::<C>() {
        Ok(())
    } else {
        Err(OutboxError::NotInTransaction {
            connection: std::any::type_name::<C>(),
        })
    }
}

#[cfg(test)]
mod tests {
    use sea_orm::{DatabaseConnection, DatabaseTransaction};

    use super::*;

    #[test]
    fn a_transaction_is_accepted() {
        assert!(ensure_transaction::<DatabaseTransaction>().is_ok());
        assert!(
            ensure_transaction::<<DatabaseTransaction as TransactionTrait>::Transaction>().is_ok()
        );
    }

    #[test]
    fn a_pool_is_refused_with_a_variant_to_match() {
        let error = ensure_transaction::<DatabaseConnection>().unwrap_err();
        assert!(
            matches!(error, OutboxError::NotInTransaction { connection } if connection.ends_with("DatabaseConnection")),
            "{error:?}"
        );
    }
}
