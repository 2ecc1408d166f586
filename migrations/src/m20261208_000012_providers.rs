//! Several AI providers, one account each, and slots held until a job
//! really ends.
//!
//! - `providers`: the AI accounts this deployment uses, as the providers
//!   file (or `AI_URL` / `AI_PROVIDER`: one provider `default`) names them,
//!   written by every instance at start. `max_in_flight` is the account's
//!   limit of concurrent jobs across every experience and every instance
//!   (NULL: no shared limit, only each experience's own ceiling). The
//!   claim reads it inside its transaction, so the cap is exact across
//!   instances.
//! - `experiences.provider` (default `default`) and `experiences.weight`
//!   (1 to 100, default 1): which account an experience's jobs run on, and
//!   its share of that account's slots among the experiences with work.
//! - `lingering_jobs`: a job that may still run at the provider after its
//!   saga ended without it (an attempt or the deadline ran out, an operator
//!   cancelled, a sibling call was rejected). It holds one slot of its
//!   experience and provider until the provider says it is final (or a
//!   cancel made it so), at most until `until_ms`. Any instance takes it
//!   with a lease (`lock_token`, `locked_until_ms`) to cancel or poll it,
//!   so a crash loses nothing.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(Providers::Table)
                    .col(
                        ColumnDef::new(Providers::Name)
                            .string()
                            .not_null()
                            .primary_key(),
                    )
                    .col(ColumnDef::new(Providers::Kind).string().not_null())
                    .col(ColumnDef::new(Providers::MaxInFlight).integer().null())
                    .col(ColumnDef::new(Providers::RateLimit).string().null())
                    .col(
                        ColumnDef::new(Providers::UpdatedAtMs)
                            .big_integer()
                            .not_null(),
                    )
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(Experiences::Table)
                    .add_column(
                        ColumnDef::new(Experiences::Provider)
                            .string()
                            .not_null()
                            .default("default"),
                    )
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(Experiences::Table)
                    .add_column(
                        ColumnDef::new(Experiences::Weight)
                            .integer()
                            .not_null()
                            .default(1),
                    )
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table(LingeringJobs::Table)
                    .col(ColumnDef::new(LingeringJobs::Provider).string().not_null())
                    .col(ColumnDef::new(LingeringJobs::JobId).string().not_null())
                    .col(ColumnDef::new(LingeringJobs::SagaId).string().not_null())
                    .col(
                        ColumnDef::new(LingeringJobs::ExperienceId)
                            .string()
                            .not_null(),
                    )
                    .col(
                        ColumnDef::new(LingeringJobs::UntilMs)
                            .big_integer()
                            .not_null(),
                    )
                    .col(ColumnDef::new(LingeringJobs::LockToken).string().null())
                    .col(
                        ColumnDef::new(LingeringJobs::LockedUntilMs)
                            .big_integer()
                            .not_null()
                            .default(0),
                    )
                    .col(
                        ColumnDef::new(LingeringJobs::CancelTried)
                            .boolean()
                            .not_null()
                            .default(false),
                    )
                    .col(
                        ColumnDef::new(LingeringJobs::CreatedAtMs)
                            .big_integer()
                            .not_null(),
                    )
                    .primary_key(
                        Index::create()
                            .col(LingeringJobs::Provider)
                            .col(LingeringJobs::JobId),
                    )
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("idx_lingering_jobs_experience")
                    .table(LingeringJobs::Table)
                    .col(LingeringJobs::ExperienceId)
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(Table::drop().table(LingeringJobs::Table).to_owned())
            .await?;
        for column in [Experiences::Weight, Experiences::Provider] {
            manager
                .alter_table(
                    Table::alter()
                        .table(Experiences::Table)
                        .drop_column(column)
                        .to_owned(),
                )
                .await?;
        }
        manager
            .drop_table(Table::drop().table(Providers::Table).to_owned())
            .await
    }
}

#[derive(DeriveIden)]
enum Providers {
    Table,
    Name,
    Kind,
    MaxInFlight,
    RateLimit,
    UpdatedAtMs,
}

#[derive(DeriveIden)]
enum Experiences {
    Table,
    Provider,
    Weight,
}

#[derive(DeriveIden)]
enum LingeringJobs {
    Table,
    Provider,
    JobId,
    SagaId,
    ExperienceId,
    UntilMs,
    LockToken,
    LockedUntilMs,
    CancelTried,
    CreatedAtMs,
}
