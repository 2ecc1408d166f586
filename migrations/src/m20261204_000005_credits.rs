//! Credits and the queue estimate.
//!
//! - `sagas.charged_credits` (NOT NULL, default 0): the credits this saga
//!   holds, taken from its experience's `credits` in the transaction that
//!   started it. An abort that is not the participant's fault gives them
//!   back in the transaction that aborts the saga and sets this to 0, so a
//!   second abort path (the cleanup actor racing the supervisor, or an
//!   operator's cancel) finds nothing to give back; an operator's retry of
//!   a refunded saga takes them again. Existing sagas hold none.
//! - `sagas.ai_duration_ms` (nullable): how long the AI step of the saga's
//!   last run took, from its job's submit to AI_DONE (0 when the provider
//!   answered at once). The 202 estimates the wait from the median of the
//!   experience's recent ones.
//! - `idx_sagas_completed_ai` on (experience_id, updated_at_ms), partial on
//!   `step = 'COMPLETED'`: "the last N completed sagas of this experience"
//!   is a walk that stops after N. Only completed sagas are in it, so the
//!   updates of a running saga never write it.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

const INDEX: &str = "idx_sagas_completed_ai";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // SQLite takes one change per ALTER TABLE.
        manager
            .alter_table(
                Table::alter()
                    .table(Sagas::Table)
                    .add_column(
                        ColumnDef::new(Sagas::ChargedCredits)
                            .big_integer()
                            .not_null()
                            .default(0),
                    )
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(Sagas::Table)
                    .add_column(ColumnDef::new(Sagas::AiDurationMs).big_integer().null())
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name(INDEX)
                    .table(Sagas::Table)
                    .col(Sagas::ExperienceId)
                    .col(Sagas::UpdatedAtMs)
                    .and_where(Expr::col(Sagas::Step).eq("COMPLETED"))
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_index(Index::drop().name(INDEX).table(Sagas::Table).to_owned())
            .await?;
        for column in [Sagas::AiDurationMs, Sagas::ChargedCredits] {
            manager
                .alter_table(
                    Table::alter()
                        .table(Sagas::Table)
                        .drop_column(column)
                        .to_owned(),
                )
                .await?;
        }
        Ok(())
    }
}

#[derive(DeriveIden)]
enum Sagas {
    Table,
    ExperienceId,
    Step,
    UpdatedAtMs,
    ChargedCredits,
    AiDurationMs,
}
