//! Two states of a provider that every instance must see, on its
//! `provider_breakers` row:
//! - `reason` (TEXT NULL): why the breaker is open, in words an operator
//!   acts on ("out of quota: …", "no answer: …", "paused by an operator");
//!   shown by `GET /api/admin/breaker`, the providers view and /ops.
//! - `paused_until_ms` (BIGINT NULL): the provider named a wait (a 429's
//!   `Retry-After`, OpenAI's `x-ratelimit-reset-*`, a "try again in N s"
//!   text): no request of any instance goes out before then. Not an
//!   opening of the breaker: when the time is over, work goes on without a
//!   probe.
//!
//! And on `ai_slots`, `keyed_at_ms` (BIGINT NULL): when the row took the key
//! it holds (reserved, or re-keyed for the next attempt; not when a retry
//! takes it back). A job made under that key is no older: a provider
//! without an idempotency key looks for it from then. NULL on rows made
//! before: their `created_at_ms` is read instead.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // One column per statement: SQLite adds one at a time.
        manager
            .alter_table(
                Table::alter()
                    .table(ProviderBreakers::Table)
                    .add_column(ColumnDef::new(ProviderBreakers::Reason).text().null())
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(ProviderBreakers::Table)
                    .add_column(
                        ColumnDef::new(ProviderBreakers::PausedUntilMs)
                            .big_integer()
                            .null(),
                    )
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(AiSlots::Table)
                    .add_column(ColumnDef::new(AiSlots::KeyedAtMs).big_integer().null())
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(AiSlots::Table)
                    .drop_column(AiSlots::KeyedAtMs)
                    .to_owned(),
            )
            .await?;
        for column in [ProviderBreakers::PausedUntilMs, ProviderBreakers::Reason] {
            manager
                .alter_table(
                    Table::alter()
                        .table(ProviderBreakers::Table)
                        .drop_column(column)
                        .to_owned(),
                )
                .await?;
        }
        Ok(())
    }
}

#[derive(DeriveIden)]
enum AiSlots {
    Table,
    KeyedAtMs,
}

#[derive(DeriveIden)]
enum ProviderBreakers {
    Table,
    Reason,
    PausedUntilMs,
}
