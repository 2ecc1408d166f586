//! Instances that share a PostgreSQL database, and who holds an
//! Idempotency-Key.
//!
//! - `instances`: one row per running `serve` (its random id), its
//!   `seen_at_ms` renewed every second. An instance not seen for a few
//!   seconds is dead; one that shuts down deletes its row at once. The live
//!   ones share the participants' rate limits (each allows its share).
//! - `idempotency_records.instance_id`: the instance whose request holds an
//!   IN_PROGRESS key (PostgreSQL only). A key whose instance is known dead
//!   is taken over at once by a retry, instead of at the end of its 30 s
//!   lease.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(Instances::Table)
                    .col(
                        ColumnDef::new(Instances::Id)
                            .string()
                            .not_null()
                            .primary_key(),
                    )
                    .col(
                        ColumnDef::new(Instances::StartedAtMs)
                            .big_integer()
                            .not_null(),
                    )
                    .col(ColumnDef::new(Instances::SeenAtMs).big_integer().not_null())
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(IdempotencyRecords::Table)
                    .add_column(
                        ColumnDef::new(IdempotencyRecords::InstanceId)
                            .string()
                            .null(),
                    )
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(IdempotencyRecords::Table)
                    .drop_column(IdempotencyRecords::InstanceId)
                    .to_owned(),
            )
            .await?;
        manager
            .drop_table(Table::drop().table(Instances::Table).to_owned())
            .await
    }
}

#[derive(DeriveIden)]
enum Instances {
    Table,
    Id,
    StartedAtMs,
    SeenAtMs,
}

#[derive(DeriveIden)]
enum IdempotencyRecords {
    Table,
    InstanceId,
}
