//! Print stations.
//! - `printers`: one IPP printer (`uri`, the PWG `media` it prints on,
//!   `colour`, the experiences it serves as a comma-separated list of
//!   ids), and what it said when last asked: `state` (`idle`,
//!   `processing`, `stopped`, `unreachable`), `state_reasons` (comma
//!   separated, e.g. `media-empty`), `formats`, `dpi`, `checked_at_ms`.
//! - `prints`: one print of a session's result. `status` is `QUEUED`,
//!   `SENDING`, `PRINTING`, `COMPLETED`, `CANCELED` or `ABORTED`, with the
//!   `reason` a person reads; `awaiting_review` holds a guest's print for
//!   an operator's approval; `source_key` is the kept file it prints;
//!   `job_name` (derived from its id) is how the printer knows it, so a
//!   print actor that lost the answer of a Print-Job asks the printer
//!   before sending again; `printer_id` and `ipp_job_id` once sent;
//!   `lease_token` and `lease_until_ms` fence the print actor that holds
//!   it; `next_attempt_at_ms` its next try.
//! - A partial index over the prints that are not finished, in their
//!   order: the print actor's claim walks only it.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        use Printers as P;
        use Prints as J;
        manager
            .create_table(
                Table::create()
                    .table(P::Table)
                    .col(ColumnDef::new(P::Id).text().not_null().primary_key())
                    .col(ColumnDef::new(P::Name).text().not_null())
                    .col(ColumnDef::new(P::Uri).text().not_null())
                    .col(ColumnDef::new(P::Media).text().not_null())
                    .col(ColumnDef::new(P::Colour).boolean().not_null().default(true))
                    .col(ColumnDef::new(P::Experiences).text().not_null().default(""))
                    .col(
                        ColumnDef::new(P::State)
                            .text()
                            .not_null()
                            .default("unknown"),
                    )
                    .col(
                        ColumnDef::new(P::StateReasons)
                            .text()
                            .not_null()
                            .default(""),
                    )
                    .col(ColumnDef::new(P::Formats).text().not_null().default(""))
                    .col(ColumnDef::new(P::Dpi).integer().not_null().default(300))
                    .col(ColumnDef::new(P::CheckedAtMs).big_integer().null())
                    .col(ColumnDef::new(P::CreatedAtMs).big_integer().not_null())
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table(J::Table)
                    .col(ColumnDef::new(J::Id).text().not_null().primary_key())
                    .col(ColumnDef::new(J::SessionId).text().not_null())
                    .col(ColumnDef::new(J::ExperienceId).text().not_null())
                    .col(ColumnDef::new(J::SourceKey).text().not_null())
                    .col(ColumnDef::new(J::RequestedBy).text().not_null())
                    .col(ColumnDef::new(J::Status).text().not_null())
                    .col(ColumnDef::new(J::Reason).text().null())
                    .col(
                        ColumnDef::new(J::AwaitingReview)
                            .boolean()
                            .not_null()
                            .default(false),
                    )
                    .col(ColumnDef::new(J::JobName).text().not_null())
                    .col(ColumnDef::new(J::PrinterId).text().null())
                    .col(ColumnDef::new(J::IppJobId).integer().null())
                    .col(ColumnDef::new(J::Attempts).integer().not_null().default(0))
                    .col(ColumnDef::new(J::LeaseToken).text().null())
                    .col(ColumnDef::new(J::LeaseUntilMs).big_integer().null())
                    .col(ColumnDef::new(J::NextAttemptAtMs).big_integer().not_null())
                    .col(ColumnDef::new(J::CreatedAtMs).big_integer().not_null())
                    .col(ColumnDef::new(J::UpdatedAtMs).big_integer().not_null())
                    .to_owned(),
            )
            .await?;
        let db = manager.get_connection();
        db.execute_unprepared(
            "CREATE INDEX prints_open ON prints (next_attempt_at_ms, created_at_ms) \
             WHERE status IN ('QUEUED', 'SENDING', 'PRINTING')",
        )
        .await?;
        db.execute_unprepared("CREATE INDEX prints_by_session ON prints (session_id)")
            .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(Table::drop().table(Prints::Table).to_owned())
            .await?;
        manager
            .drop_table(Table::drop().table(Printers::Table).to_owned())
            .await?;
        Ok(())
    }
}

#[derive(DeriveIden)]
enum Printers {
    Table,
    Id,
    Name,
    Uri,
    Media,
    Colour,
    Experiences,
    State,
    StateReasons,
    Formats,
    Dpi,
    CheckedAtMs,
    CreatedAtMs,
}

#[derive(DeriveIden)]
enum Prints {
    Table,
    Id,
    SessionId,
    ExperienceId,
    SourceKey,
    RequestedBy,
    Status,
    Reason,
    AwaitingReview,
    JobName,
    PrinterId,
    IppJobId,
    Attempts,
    LeaseToken,
    LeaseUntilMs,
    NextAttemptAtMs,
    CreatedAtMs,
    UpdatedAtMs,
}
