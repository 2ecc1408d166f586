//! `sagas.attempt_offset` (NOT NULL, default 0): where the AI attempt keys
//! of a saga of one call start. Attempt `n` is sent with the key of
//! `attempt_offset + n` (rule 5). An operator's retry keeps the saga's
//! `ai_base_key` and moves the offset to the first key not known to be
//! used: the key of the attempt that was in flight when the saga ended. So
//! a job that was made under it but never recorded (the worker died between
//! "submitted" and "recorded") is found again by its key, never doubled.

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
                        ColumnDef::new(Sagas::AttemptOffset)
                            .integer()
                            .not_null()
                            .default(0),
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
                    .drop_column(Sagas::AttemptOffset)
                    .to_owned(),
            )
            .await
    }
}

#[derive(DeriveIden)]
enum Sagas {
    Table,
    AttemptOffset,
}
