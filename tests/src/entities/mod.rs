//! Entities the tests save: `orders` appends its events from SeaORM hooks,
//! `invoices` has plain hooks and is saved with the explicit API,
//! `customers` has a composite key and a `before_save` hook of its own.

pub mod customer;
pub mod invoice;
pub mod order;

use sea_orm::DatabaseConnection;

/// Creates the tables of every test entity.
pub async fn create_tables(db: &DatabaseConnection) {
    crate::db::create_table(db, order::Entity).await;
    crate::db::create_table(db, invoice::Entity).await;
    crate::db::create_table(db, customer::Entity).await;
}
