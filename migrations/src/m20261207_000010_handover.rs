//! `sagas.handed_over`: true while a saga waits to be resumed because the
//! instance that held it shut down gracefully and handed it over (its
//! lease was cut short on purpose), not because its worker died. The next
//! claim takes it at once, like an expired lease, but counts no recovery,
//! so deploys never orphan a long AI call; the cleanup actor never takes
//! such a saga for an orphan unless its deadline passed. Every claim sets
//! it back to false.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(Sagas::Table)
                    .add_column(
                        ColumnDef::new(Sagas::HandedOver)
                            .boolean()
                            .not_null()
                            .default(false),
                    )
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(Sagas::Table)
                    .drop_column(Sagas::HandedOver)
                    .to_owned(),
            )
            .await
    }
}

#[derive(DeriveIden)]
enum Sagas {
    Table,
    HandedOver,
}
