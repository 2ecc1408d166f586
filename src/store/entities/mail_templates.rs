//! An operator's mail template for one locale: the subject and the body
//! (plain text with `{event}` and `{link}`).

use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "mail_templates")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub locale: String,
    pub subject: String,
    pub body: String,
    pub updated_at_ms: i64,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
