//! An invoice with SeaORM's default hooks, saved with the explicit API.

use sea_orm::entity::prelude::*;

/// An invoice row.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "invoices")]
pub struct Model {
    /// Generated id; the default aggregate id of events saved with it.
    #[sea_orm(primary_key)]
    pub id: i64,
    /// Invoiced amount.
    pub amount_cents: i64,
}

/// No relations.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
