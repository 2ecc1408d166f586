//! Initial schema: every table stagehand needs, on SQLite and PostgreSQL alike.
//!
//! Tables: `experiences` (a booth and its AI settings), `terminals` (booth
//! displays), `sessions` (one participant's visit), `sagas` (the background
//! job that turns a submission into a result), `score_attempts` (ranking
//! entries, at most one per session), `results` (the stored outcome of a
//! saga), `terminal_events` (the per-terminal outbox pushed over WebSockets)
//! and `idempotency_records` (replayable answers to POSTs with an
//! `Idempotency-Key`).
//!
//! Conventions: ids are UUIDs stored as `varchar(36)`; times are `i64`
//! milliseconds since the Unix epoch in `BigInteger` columns ending in `_ms`,
//! so comparisons are plain integer comparisons on both databases; JSON is
//! stored as `text`.
//!
//! Why the indexes exist (the reactive-delivery migration replaces
//! `idx_sagas_runnable`, `idx_sagas_inflight` and `idx_score_attempts_rank`):
//! - `idx_sagas_runnable` (step, next_attempt_at_ms, created_at_ms): the
//!   dispatcher claims runnable sagas of a step whose next attempt is due,
//!   oldest first; the cleanup actor scans non-final steps by lease.
//! - `idx_sagas_inflight` (experience_id, step, locked_until_ms): counting AI
//!   jobs in flight per experience (leased `AI_PENDING` sagas) before a claim.
//! - `idx_sagas_session`: a session's saga(s) for the status endpoint and for
//!   re-submission after an abort.
//! - `idx_sessions_status_updated`: the cleanup actor finds sessions stuck in
//!   `SUBMITTING` for too long.
//! - `idx_score_attempts_rank` (experience_id, score): ranking reads (top N,
//!   and the rank of one score, computed at read time) per experience.
//! - unique `score_attempts.session_id`: one ranking entry per session, so a
//!   replayed ranking step never adds a second.
//! - unique `results.saga_id`: one stored result per saga; `idx_results_session`
//!   looks results up by session.
//! - unique `idx_terminal_events_terminal_seq`: `seq` is unique per terminal
//!   and replay after reconnect is a range scan (`seq > after`); unique
//!   `idx_terminal_events_saga`: one terminal event per ended saga, so ending a
//!   saga twice cannot emit two events; `idx_terminal_events_created`: the
//!   cleanup actor deletes old outbox rows by age.
//! - `idx_terminals_experience`: terminals of an experience.
//! - `idx_idempotency_records_expires`: the cleanup actor deletes expired
//!   records; the primary key (scope, key) is the lookup itself.
//!
//! The migration runs in one transaction on both databases (SQLite has
//! transactional DDL too), so a crash half-way leaves no half-built schema.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

/// A UUID primary key stored as text.
fn id_pk<T: IntoIden>(col: T) -> ColumnDef {
    ColumnDef::new(col)
        .string_len(36)
        .not_null()
        .primary_key()
        .take()
}

/// A required UUID (usually a reference to another table's id).
fn uuid<T: IntoIden>(col: T) -> ColumnDef {
    ColumnDef::new(col).string_len(36).not_null().take()
}

/// An optional UUID.
fn uuid_null<T: IntoIden>(col: T) -> ColumnDef {
    ColumnDef::new(col).string_len(36).null().take()
}

/// A required short string.
fn string<T: IntoIden>(col: T) -> ColumnDef {
    ColumnDef::new(col).string().not_null().take()
}

/// An optional short string.
fn string_null<T: IntoIden>(col: T) -> ColumnDef {
    ColumnDef::new(col).string().null().take()
}

/// A required time in milliseconds since the Unix epoch.
fn ms<T: IntoIden>(col: T) -> ColumnDef {
    ColumnDef::new(col).big_integer().not_null().take()
}

/// An optional time in milliseconds since the Unix epoch.
fn ms_null<T: IntoIden>(col: T) -> ColumnDef {
    ColumnDef::new(col).big_integer().null().take()
}

/// A required integer with a default.
fn int_default<T: IntoIden>(col: T, default: i32) -> ColumnDef {
    ColumnDef::new(col)
        .integer()
        .not_null()
        .default(default)
        .take()
}

/// An optional integer.
fn int_null<T: IntoIden>(col: T) -> ColumnDef {
    ColumnDef::new(col).integer().null().take()
}

/// An optional double.
fn double_null<T: IntoIden>(col: T) -> ColumnDef {
    ColumnDef::new(col).double().null().take()
}

/// A foreign key `from_table.from_col -> to_table.id`.
fn fk<F: IntoIden, C: IntoIden, T: IntoIden, I: IntoIden>(
    name: &str,
    from_table: F,
    from_col: C,
    to_table: T,
    to_col: I,
) -> ForeignKeyCreateStatement {
    ForeignKey::create()
        .name(name)
        .from(from_table, from_col)
        .to(to_table, to_col)
        .take()
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    fn use_transaction(&self) -> Option<bool> {
        Some(true)
    }

    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // experiences
        manager
            .create_table(
                Table::create()
                    .table(Experiences::Table)
                    .col(id_pk(Experiences::Id))
                    .col(
                        ColumnDef::new(Experiences::Slug)
                            .string()
                            .not_null()
                            .unique_key(),
                    )
                    .col(string(Experiences::Title))
                    .col(string(Experiences::Kind))
                    .col(int_default(Experiences::AiCalls, 1))
                    .col(int_null(Experiences::MinSuccess))
                    .col(int_default(Experiences::MaxInFlight, 5))
                    .col(ColumnDef::new(Experiences::Credits).big_integer().null())
                    .col(ms_null(Experiences::ClosesAtMs))
                    .col(ms(Experiences::CreatedAtMs))
                    .to_owned(),
            )
            .await?;

        // terminals
        manager
            .create_table(
                Table::create()
                    .table(Terminals::Table)
                    .col(id_pk(Terminals::Id))
                    .col(uuid(Terminals::ExperienceId))
                    .col(string(Terminals::Name))
                    .col(string(Terminals::Token))
                    .col(
                        ColumnDef::new(Terminals::LastSeq)
                            .big_integer()
                            .not_null()
                            .default(0i64),
                    )
                    .col(ms(Terminals::CreatedAtMs))
                    .foreign_key(&mut fk(
                        "fk_terminals_experience",
                        Terminals::Table,
                        Terminals::ExperienceId,
                        Experiences::Table,
                        Experiences::Id,
                    ))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("idx_terminals_experience")
                    .table(Terminals::Table)
                    .col(Terminals::ExperienceId)
                    .to_owned(),
            )
            .await?;

        // sessions
        manager
            .create_table(
                Table::create()
                    .table(Sessions::Table)
                    .col(id_pk(Sessions::Id))
                    .col(uuid(Sessions::ExperienceId))
                    .col(uuid_null(Sessions::TerminalId))
                    .col(string(Sessions::Nickname))
                    .col(
                        ColumnDef::new(Sessions::ParticipantToken)
                            .string()
                            .not_null()
                            .unique_key(),
                    )
                    .col(string(Sessions::Status))
                    .col(string_null(Sessions::AbortReason))
                    .col(ms(Sessions::CreatedAtMs))
                    .col(ms(Sessions::UpdatedAtMs))
                    .foreign_key(&mut fk(
                        "fk_sessions_experience",
                        Sessions::Table,
                        Sessions::ExperienceId,
                        Experiences::Table,
                        Experiences::Id,
                    ))
                    .foreign_key(&mut fk(
                        "fk_sessions_terminal",
                        Sessions::Table,
                        Sessions::TerminalId,
                        Terminals::Table,
                        Terminals::Id,
                    ))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("idx_sessions_status_updated")
                    .table(Sessions::Table)
                    .col(Sessions::Status)
                    .col(Sessions::UpdatedAtMs)
                    .to_owned(),
            )
            .await?;

        // sagas
        manager
            .create_table(
                Table::create()
                    .table(Sagas::Table)
                    .col(id_pk(Sagas::Id))
                    .col(uuid(Sagas::SessionId))
                    .col(uuid(Sagas::ExperienceId))
                    .col(string(Sagas::Step))
                    .col(ColumnDef::new(Sagas::Prompt).text().not_null())
                    .col(double_null(Sagas::ParticipantScore))
                    .col(uuid_null(Sagas::LockToken))
                    .col(ms_null(Sagas::LockedUntilMs))
                    .col(int_default(Sagas::Attempts, 0))
                    .col(int_default(Sagas::Recoveries, 0))
                    .col(int_default(Sagas::UnavailableStreak, 0))
                    .col(ms(Sagas::NextAttemptAtMs))
                    .col(uuid(Sagas::AiBaseKey))
                    .col(string_null(Sagas::AiJobId))
                    .col(ms_null(Sagas::AiSubmittedAtMs))
                    .col(ColumnDef::new(Sagas::Content).text().null())
                    .col(double_null(Sagas::AiScore))
                    .col(double_null(Sagas::Score))
                    .col(uuid_null(Sagas::ScoreAttemptId))
                    .col(int_null(Sagas::Rank))
                    .col(string_null(Sagas::AbortReason))
                    .col(ColumnDef::new(Sagas::AbortDetail).text().null())
                    .col(ms(Sagas::DeadlineAtMs))
                    .col(ms(Sagas::CreatedAtMs))
                    .col(ms(Sagas::UpdatedAtMs))
                    .foreign_key(&mut fk(
                        "fk_sagas_session",
                        Sagas::Table,
                        Sagas::SessionId,
                        Sessions::Table,
                        Sessions::Id,
                    ))
                    .foreign_key(&mut fk(
                        "fk_sagas_experience",
                        Sagas::Table,
                        Sagas::ExperienceId,
                        Experiences::Table,
                        Experiences::Id,
                    ))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("idx_sagas_runnable")
                    .table(Sagas::Table)
                    .col(Sagas::Step)
                    .col(Sagas::NextAttemptAtMs)
                    .col(Sagas::CreatedAtMs)
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("idx_sagas_inflight")
                    .table(Sagas::Table)
                    .col(Sagas::ExperienceId)
                    .col(Sagas::Step)
                    .col(Sagas::LockedUntilMs)
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("idx_sagas_session")
                    .table(Sagas::Table)
                    .col(Sagas::SessionId)
                    .to_owned(),
            )
            .await?;

        // score_attempts (ranking entries)
        manager
            .create_table(
                Table::create()
                    .table(ScoreAttempts::Table)
                    .col(id_pk(ScoreAttempts::Id))
                    .col(uuid(ScoreAttempts::ExperienceId))
                    .col(uuid(ScoreAttempts::SessionId).unique_key())
                    .col(uuid(ScoreAttempts::SagaId))
                    .col(string(ScoreAttempts::Nickname))
                    .col(ColumnDef::new(ScoreAttempts::Score).double().not_null())
                    .col(ms(ScoreAttempts::CreatedAtMs))
                    .foreign_key(&mut fk(
                        "fk_score_attempts_experience",
                        ScoreAttempts::Table,
                        ScoreAttempts::ExperienceId,
                        Experiences::Table,
                        Experiences::Id,
                    ))
                    .foreign_key(&mut fk(
                        "fk_score_attempts_session",
                        ScoreAttempts::Table,
                        ScoreAttempts::SessionId,
                        Sessions::Table,
                        Sessions::Id,
                    ))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("idx_score_attempts_rank")
                    .table(ScoreAttempts::Table)
                    .col(ScoreAttempts::ExperienceId)
                    .col(ScoreAttempts::Score)
                    .to_owned(),
            )
            .await?;

        // results
        manager
            .create_table(
                Table::create()
                    .table(Results::Table)
                    .col(id_pk(Results::Id))
                    .col(uuid(Results::SagaId).unique_key())
                    .col(uuid(Results::SessionId))
                    .col(ColumnDef::new(Results::Content).text().not_null())
                    .col(double_null(Results::Score))
                    .col(int_null(Results::Rank))
                    .col(ms(Results::CreatedAtMs))
                    .foreign_key(&mut fk(
                        "fk_results_session",
                        Results::Table,
                        Results::SessionId,
                        Sessions::Table,
                        Sessions::Id,
                    ))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("idx_results_session")
                    .table(Results::Table)
                    .col(Results::SessionId)
                    .to_owned(),
            )
            .await?;

        // terminal_events (the outbox)
        manager
            .create_table(
                Table::create()
                    .table(TerminalEvents::Table)
                    // BigInteger maps to `integer PRIMARY KEY AUTOINCREMENT` on
                    // SQLite (a rowid alias) and to `bigserial` on PostgreSQL.
                    .col(
                        ColumnDef::new(TerminalEvents::Id)
                            .big_integer()
                            .not_null()
                            .auto_increment()
                            .primary_key(),
                    )
                    .col(uuid(TerminalEvents::TerminalId))
                    .col(ColumnDef::new(TerminalEvents::Seq).big_integer().not_null())
                    .col(uuid(TerminalEvents::SessionId))
                    .col(uuid(TerminalEvents::SagaId))
                    .col(string(TerminalEvents::EventType))
                    .col(ColumnDef::new(TerminalEvents::Payload).text().not_null())
                    .col(ms(TerminalEvents::CreatedAtMs))
                    .foreign_key(&mut fk(
                        "fk_terminal_events_terminal",
                        TerminalEvents::Table,
                        TerminalEvents::TerminalId,
                        Terminals::Table,
                        Terminals::Id,
                    ))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("idx_terminal_events_terminal_seq")
                    .table(TerminalEvents::Table)
                    .col(TerminalEvents::TerminalId)
                    .col(TerminalEvents::Seq)
                    .unique()
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("idx_terminal_events_saga")
                    .table(TerminalEvents::Table)
                    .col(TerminalEvents::SagaId)
                    .unique()
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("idx_terminal_events_created")
                    .table(TerminalEvents::Table)
                    .col(TerminalEvents::CreatedAtMs)
                    .to_owned(),
            )
            .await?;

        // idempotency_records
        manager
            .create_table(
                Table::create()
                    .table(IdempotencyRecords::Table)
                    .col(string(IdempotencyRecords::Scope))
                    .col(
                        ColumnDef::new(IdempotencyRecords::Key)
                            .string_len(255)
                            .not_null(),
                    )
                    .col(string(IdempotencyRecords::RequestHash))
                    .col(string(IdempotencyRecords::State))
                    .col(int_null(IdempotencyRecords::ResponseStatus))
                    .col(
                        ColumnDef::new(IdempotencyRecords::ResponseBody)
                            .text()
                            .null(),
                    )
                    .col(ms(IdempotencyRecords::CreatedAtMs))
                    .col(ms(IdempotencyRecords::ExpiresAtMs))
                    .primary_key(
                        Index::create()
                            .name("pk_idempotency_records")
                            .col(IdempotencyRecords::Scope)
                            .col(IdempotencyRecords::Key),
                    )
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("idx_idempotency_records_expires")
                    .table(IdempotencyRecords::Table)
                    .col(IdempotencyRecords::ExpiresAtMs)
                    .to_owned(),
            )
            .await?;

        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // Children before parents, so foreign keys never block a drop.
        // Dropping a table drops its indexes too, on both databases.
        manager
            .drop_table(Table::drop().table(IdempotencyRecords::Table).to_owned())
            .await?;
        manager
            .drop_table(Table::drop().table(TerminalEvents::Table).to_owned())
            .await?;
        manager
            .drop_table(Table::drop().table(Results::Table).to_owned())
            .await?;
        manager
            .drop_table(Table::drop().table(ScoreAttempts::Table).to_owned())
            .await?;
        manager
            .drop_table(Table::drop().table(Sagas::Table).to_owned())
            .await?;
        manager
            .drop_table(Table::drop().table(Sessions::Table).to_owned())
            .await?;
        manager
            .drop_table(Table::drop().table(Terminals::Table).to_owned())
            .await?;
        manager
            .drop_table(Table::drop().table(Experiences::Table).to_owned())
            .await?;
        Ok(())
    }
}

#[derive(DeriveIden)]
enum Experiences {
    Table,
    Id,
    Slug,
    Title,
    Kind,
    AiCalls,
    MinSuccess,
    MaxInFlight,
    Credits,
    ClosesAtMs,
    CreatedAtMs,
}

#[derive(DeriveIden)]
enum Terminals {
    Table,
    Id,
    ExperienceId,
    Name,
    Token,
    LastSeq,
    CreatedAtMs,
}

#[derive(DeriveIden)]
enum Sessions {
    Table,
    Id,
    ExperienceId,
    TerminalId,
    Nickname,
    ParticipantToken,
    Status,
    AbortReason,
    CreatedAtMs,
    UpdatedAtMs,
}

#[derive(DeriveIden)]
enum Sagas {
    Table,
    Id,
    SessionId,
    ExperienceId,
    Step,
    Prompt,
    ParticipantScore,
    LockToken,
    LockedUntilMs,
    Attempts,
    Recoveries,
    UnavailableStreak,
    NextAttemptAtMs,
    AiBaseKey,
    AiJobId,
    AiSubmittedAtMs,
    Content,
    AiScore,
    Score,
    ScoreAttemptId,
    Rank,
    AbortReason,
    AbortDetail,
    DeadlineAtMs,
    CreatedAtMs,
    UpdatedAtMs,
}

#[derive(DeriveIden)]
enum ScoreAttempts {
    Table,
    Id,
    ExperienceId,
    SessionId,
    SagaId,
    Nickname,
    Score,
    CreatedAtMs,
}

#[derive(DeriveIden)]
enum Results {
    Table,
    Id,
    SagaId,
    SessionId,
    Content,
    Score,
    Rank,
    CreatedAtMs,
}

#[derive(DeriveIden)]
enum TerminalEvents {
    Table,
    Id,
    TerminalId,
    Seq,
    SessionId,
    SagaId,
    EventType,
    Payload,
    CreatedAtMs,
}

#[derive(DeriveIden)]
enum IdempotencyRecords {
    Table,
    Scope,
    Key,
    RequestHash,
    State,
    ResponseStatus,
    ResponseBody,
    CreatedAtMs,
    ExpiresAtMs,
}
