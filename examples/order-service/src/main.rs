//! An order service that places and pays orders through SeaORM, with the
//! domain events appended to the outbox in the same transactions.
//!
//! ```sh
//! cargo run -p order-service                      # SQLite file outbox.db
//! cargo run -p order-service -- --orders 100      # more orders
//! DATABASE_URL=postgres://postgres@127.0.0.1/test cargo run -p order-service
//! ```
//! Then publish the events with `outbox-relay run`.

use anyhow::Context;
use clap::Parser;
use outbox_core::ActiveModelOutboxExt;
use sea_orm::sea_query::TableCreateStatement;
use sea_orm::{
    ActiveModelTrait, ActiveValue::Set, ConnectionTrait, Database, DatabaseConnection,
    DatabaseTransaction, IntoActiveModel, Schema, TransactionTrait,
};
use sea_orm_migration::MigratorTrait;

use order_service::entity::{order, order_line};
use order_service::events::OrderPaid;

/// Places and pays orders; each saved with its events in one transaction.
#[derive(Parser)]
#[command(version, about)]
struct Args {
    /// Database to write to; the outbox and order tables are created if missing.
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "sqlite://outbox.db?mode=rwc"
    )]
    database_url: String,
    /// How many orders to place; every other one is paid as well.
    #[arg(long, default_value_t = 3)]
    orders: u32,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let db = Database::connect(&args.database_url)
        .await
        .context("cannot connect to the database given by --database-url / DATABASE_URL")?;
    outbox_migrations::Migrator::up(&db, None)
        .await
        .context("cannot create the outbox tables")?;
    create_order_tables(&db).await?;

    for n in 0..args.orders {
        let customer = ["ada", "grace", "edsger"][n as usize % 3];
        let txn = db.begin().await?;
        let placed = place_order(&txn, customer, &[("book", 1, 2500), ("pen", 3, 150)]).await?;
        let paid = n % 2 == 0;
        if paid {
            pay_order(&txn, placed.clone(), 2950).await?;
        }
        txn.commit().await?;
        eprintln!(
            "order {} for {customer}: placed{}",
            placed.id,
            if paid { " and paid" } else { "" }
        );
    }
    Ok(())
}

/// Inserts the order and its lines; the hooks append `OrderPlaced` and one
/// `OrderLineAdded` per line.
async fn place_order(
    txn: &DatabaseTransaction,
    customer: &str,
    lines: &[(&str, i32, i64)],
) -> anyhow::Result<order::Model> {
    let order = order::ActiveModel {
        customer: Set(customer.to_owned()),
        status: Set("placed".to_owned()),
        ..Default::default()
    }
    .insert(txn)
    .await?;
    for &(sku, quantity, unit_price_cents) in lines {
        order_line::ActiveModel {
            order_id: Set(order.id),
            sku: Set(sku.to_owned()),
            quantity: Set(quantity),
            unit_price_cents: Set(unit_price_cents),
            ..Default::default()
        }
        .insert(txn)
        .await?;
    }
    Ok(order)
}

/// Marks the order paid and appends `OrderPaid` in the same call.
async fn pay_order(
    txn: &DatabaseTransaction,
    order: order::Model,
    amount_cents: i64,
) -> anyhow::Result<order::Model> {
    let paid = OrderPaid {
        order_id: order.id,
        amount_cents,
        payment_reference: Some(format!("pay-{}", order.id)),
    };
    let mut order = order.into_active_model();
    order.status = Set("paid".to_owned());
    Ok(order.update_with_events(txn, [paid]).await?)
}

async fn create_order_tables(db: &DatabaseConnection) -> anyhow::Result<()> {
    let schema = Schema::new(db.get_database_backend());
    let tables: [TableCreateStatement; 2] = [
        schema
            .create_table_from_entity(order::Entity)
            .if_not_exists()
            .to_owned(),
        schema
            .create_table_from_entity(order_line::Entity)
            .if_not_exists()
            .to_owned(),
    ];
    for table in &tables {
        db.execute(table)
            .await
            .context("cannot create the order tables")?;
    }
    Ok(())
}
