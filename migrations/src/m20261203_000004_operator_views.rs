//! What operators read: `idx_sagas_step_updated` on (step, updated_at_ms,
//! id) serves the admin list of sagas in one step, newest first (with its
//! cursor), and the count of sagas aborted in the last hour, without reading
//! the whole table.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_index(
                Index::create()
                    .name("idx_sagas_step_updated")
                    .table(Sagas::Table)
                    .col(Sagas::Step)
                    .col(Sagas::UpdatedAtMs)
                    .col(Sagas::Id)
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_index(
                Index::drop()
                    .name("idx_sagas_step_updated")
                    .table(Sagas::Table)
                    .to_owned(),
            )
            .await
    }
}

#[derive(DeriveIden)]
enum Sagas {
    Table,
    Id,
    Step,
    UpdatedAtMs,
}
