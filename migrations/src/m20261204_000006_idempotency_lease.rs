//! An IN_PROGRESS Idempotency-Key record gets an owner and a lease: the
//! request that took the key (`owner`, a random id) holds it until
//! `locked_until_ms` (its request timeout). A request whose process died
//! leaves the record only until then; the next request with that key takes
//! it over and runs. Finishing or releasing a key is fenced on the owner, so
//! a request that outlived its lease cannot overwrite its successor's
//! answer. Records from before this migration have no lease and may be
//! taken over at once.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // SQLite takes one change per ALTER TABLE.
        manager
            .alter_table(
                Table::alter()
                    .table(IdempotencyRecords::Table)
                    .add_column(ColumnDef::new(IdempotencyRecords::Owner).string().null())
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(IdempotencyRecords::Table)
                    .add_column(
                        ColumnDef::new(IdempotencyRecords::LockedUntilMs)
                            .big_integer()
                            .null(),
                    )
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for column in [IdempotencyRecords::LockedUntilMs, IdempotencyRecords::Owner] {
            manager
                .alter_table(
                    Table::alter()
                        .table(IdempotencyRecords::Table)
                        .drop_column(column)
                        .to_owned(),
                )
                .await?;
        }
        Ok(())
    }
}

#[derive(DeriveIden)]
enum IdempotencyRecords {
    Table,
    Owner,
    LockedUntilMs,
}
