//! A customer with a composite key (tenant, UUID) and a `before_save` hook
//! of its own, saved with the explicit API.

use sea_orm::entity::prelude::*;

/// A customer row.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "customers")]
pub struct Model {
    /// The tenant; first part of the key.
    #[sea_orm(primary_key, auto_increment = false)]
    pub tenant: String,
    /// Second part of the key. Events saved with the row default to the
    /// aggregate id `<tenant>:<id>`.
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: Uuid,
    /// Full name, trimmed by `before_save`.
    pub name: String,
}

/// No relations.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

#[async_trait::async_trait]
impl ActiveModelBehavior for ActiveModel {
    /// Trims the name, so a test sees that the hook's changes are saved.
    async fn before_save<C>(mut self, _db: &C, _insert: bool) -> Result<Self, DbErr>
    where
        C: ConnectionTrait,
    {
        if let sea_orm::ActiveValue::Set(name) = &self.name {
            self.name = sea_orm::ActiveValue::Set(name.trim().to_owned());
        }
        Ok(self)
    }
}
