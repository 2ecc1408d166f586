//! Fan-out (an experience with `ai_calls` > 1).
//!
//! - `sagas.slots` (NOT NULL, default 1): the AI slots the saga holds while
//!   it is AI_PENDING and leased, set by the claim (at most the free
//!   capacity of its experience) and lowered by its worker as its calls
//!   end. The experience's jobs in flight are the sum of the slots of its
//!   leased AI_PENDING sagas, so the `max_in_flight` cap counts calls, not
//!   sagas.
//! - `ai_calls`: one row per call of a saga, written the moment the call's
//!   job is known and again when it is final, fenced on the saga's lock
//!   token like every other step. `status` is RUNNING (a job may exist:
//!   `job_id` when known), SUCCEEDED (`content` JSON list, `score`) or
//!   FAILED (`error`). A resumed saga adopts RUNNING jobs and never re-runs a
//!   SUCCEEDED call; a new submission of the session copies the SUCCEEDED
//!   rows of the session's previous saga and runs only the rest.

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
                    .add_column(ColumnDef::new(Sagas::Slots).integer().not_null().default(1))
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table(AiCalls::Table)
                    .col(ColumnDef::new(AiCalls::SagaId).string().not_null())
                    .col(ColumnDef::new(AiCalls::CallIndex).integer().not_null())
                    .col(ColumnDef::new(AiCalls::Attempts).integer().not_null())
                    .col(ColumnDef::new(AiCalls::Status).string().not_null())
                    .col(ColumnDef::new(AiCalls::JobId).string().null())
                    .col(ColumnDef::new(AiCalls::SubmittedAtMs).big_integer().null())
                    .col(ColumnDef::new(AiCalls::Content).text().null())
                    .col(ColumnDef::new(AiCalls::Score).double().null())
                    .col(ColumnDef::new(AiCalls::Error).text().null())
                    .col(
                        ColumnDef::new(AiCalls::CreatedAtMs)
                            .big_integer()
                            .not_null(),
                    )
                    .col(
                        ColumnDef::new(AiCalls::UpdatedAtMs)
                            .big_integer()
                            .not_null(),
                    )
                    .primary_key(Index::create().col(AiCalls::SagaId).col(AiCalls::CallIndex))
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(Table::drop().table(AiCalls::Table).to_owned())
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(Sagas::Table)
                    .drop_column(Sagas::Slots)
                    .to_owned(),
            )
            .await
    }
}

#[derive(DeriveIden)]
enum Sagas {
    Table,
    Slots,
}

#[derive(DeriveIden)]
enum AiCalls {
    Table,
    SagaId,
    CallIndex,
    Attempts,
    Status,
    JobId,
    SubmittedAtMs,
    Content,
    Score,
    Error,
    CreatedAtMs,
    UpdatedAtMs,
}
