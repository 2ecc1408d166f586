//! Reactive delivery: the outbox without a hot row, and a claim that costs
//! the same however long the queue is.
//!
//! - `terminal_events.seq` becomes nullable. The transaction that ends a
//!   saga appends its event with `seq` NULL and touches no row shared by the
//!   sagas of a terminal; the outbox relay numbers committed events in
//!   batches afterwards (one short transaction per batch, relays serialised),
//!   so `seq` has no gaps and becomes visible in order.
//!   PostgreSQL drops the NOT NULL in place; SQLite cannot alter a column, so
//!   the table is rebuilt with the same columns, foreign key and indexes.
//! - `idx_terminal_events_unnumbered` (partial, `seq IS NULL`): the relay
//!   finds what it has to number without scanning the numbered history.
//! - `idx_sagas_claim` (partial, non-final steps) on (experience_id, step,
//!   created_at_ms, id): "oldest runnable of this experience at this step" is
//!   an ordered index walk, and finished sagas are not in the index at all.
//!   It also serves the cleanup actor's scan of unowned sagas, so
//!   `idx_sagas_runnable` goes: every saga update that is not HOT writes
//!   every index, and a saga is updated five or six times.
//! - `idx_sagas_in_flight` (partial, leased AI_PENDING) on (experience_id,
//!   locked_until_ms) replaces `idx_sagas_inflight`: the AI cap counts only
//!   those rows, and no other saga row is in it.
//! - `idx_score_attempts_ranking` on (experience_id, score DESC,
//!   created_at_ms) replaces `idx_score_attempts_rank`: the top N in ranking
//!   order is an index walk that stops after N (the old index sorted every
//!   entry of the experience for each read), and it still serves counting
//!   the entries above a score.
//! - PostgreSQL only: `sagas` is a queue table with many updates per row, so
//!   autovacuum visits it after 2 % of its rows changed instead of 20 %,
//!   before dead index entries slow the claim's walk.

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::{ConnectionTrait, DbBackend};

#[derive(DeriveMigrationName)]
pub struct Migration;

/// The steps a saga can still be claimed in (`domain::saga::Step::runnable`).
const RUNNABLE: [&str; 3] = ["AI_PENDING", "AI_DONE", "RANKING_DONE"];

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    fn use_transaction(&self) -> Option<bool> {
        Some(true)
    }

    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        match manager.get_database_backend() {
            DbBackend::Sqlite => rebuild_terminal_events(manager, true).await?,
            _ => {
                manager
                    .get_connection()
                    .execute_unprepared(
                        "ALTER TABLE terminal_events ALTER COLUMN seq DROP NOT NULL",
                    )
                    .await?;
            }
        }
        manager
            .create_index(
                Index::create()
                    .name("idx_terminal_events_unnumbered")
                    .table(TerminalEvents::Table)
                    .col(TerminalEvents::Id)
                    .and_where(Expr::col(TerminalEvents::Seq).is_null())
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("idx_sagas_claim")
                    .table(Sagas::Table)
                    .col(Sagas::ExperienceId)
                    .col(Sagas::Step)
                    .col(Sagas::CreatedAtMs)
                    .col(Sagas::Id)
                    .and_where(Expr::col(Sagas::Step).is_in(RUNNABLE))
                    .to_owned(),
            )
            .await?;
        manager
            .drop_index(
                Index::drop()
                    .name("idx_sagas_runnable")
                    .table(Sagas::Table)
                    .to_owned(),
            )
            .await?;
        manager
            .drop_index(
                Index::drop()
                    .name("idx_sagas_inflight")
                    .table(Sagas::Table)
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("idx_sagas_in_flight")
                    .table(Sagas::Table)
                    .col(Sagas::ExperienceId)
                    .col(Sagas::LockedUntilMs)
                    .and_where(Expr::col(Sagas::Step).eq("AI_PENDING"))
                    .and_where(Expr::col(Sagas::LockToken).is_not_null())
                    .to_owned(),
            )
            .await?;
        manager
            .drop_index(
                Index::drop()
                    .name("idx_score_attempts_rank")
                    .table(ScoreAttempts::Table)
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("idx_score_attempts_ranking")
                    .table(ScoreAttempts::Table)
                    .col(ScoreAttempts::ExperienceId)
                    .col((ScoreAttempts::Score, IndexOrder::Desc))
                    .col(ScoreAttempts::CreatedAtMs)
                    .to_owned(),
            )
            .await?;
        if manager.get_database_backend() == DbBackend::Postgres {
            manager
                .get_connection()
                .execute_unprepared(
                    "ALTER TABLE sagas SET (autovacuum_vacuum_scale_factor = 0.02, \
                     autovacuum_analyze_scale_factor = 0.02)",
                )
                .await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        if manager.get_database_backend() == DbBackend::Postgres {
            manager
                .get_connection()
                .execute_unprepared(
                    "ALTER TABLE sagas RESET (autovacuum_vacuum_scale_factor, \
                     autovacuum_analyze_scale_factor)",
                )
                .await?;
        }
        manager
            .drop_index(
                Index::drop()
                    .name("idx_score_attempts_ranking")
                    .table(ScoreAttempts::Table)
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
        manager
            .drop_index(
                Index::drop()
                    .name("idx_sagas_in_flight")
                    .table(Sagas::Table)
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
                    .name("idx_sagas_runnable")
                    .table(Sagas::Table)
                    .col(Sagas::Step)
                    .col(Sagas::NextAttemptAtMs)
                    .col(Sagas::CreatedAtMs)
                    .to_owned(),
            )
            .await?;
        manager
            .drop_index(
                Index::drop()
                    .name("idx_sagas_claim")
                    .table(Sagas::Table)
                    .to_owned(),
            )
            .await?;
        manager
            .drop_index(
                Index::drop()
                    .name("idx_terminal_events_unnumbered")
                    .table(TerminalEvents::Table)
                    .to_owned(),
            )
            .await?;
        // Events not yet numbered cannot live in a NOT NULL column: they are
        // dropped with the relay that would have numbered them.
        let conn = manager.get_connection();
        conn.execute_unprepared("DELETE FROM terminal_events WHERE seq IS NULL")
            .await?;
        match manager.get_database_backend() {
            DbBackend::Sqlite => rebuild_terminal_events(manager, false).await?,
            _ => {
                conn.execute_unprepared(
                    "ALTER TABLE terminal_events ALTER COLUMN seq SET NOT NULL",
                )
                .await?;
            }
        }
        Ok(())
    }
}

/// SQLite: recreates `terminal_events` with `seq` nullable or not, keeping
/// its rows, its foreign key and its three indexes (create the new table,
/// copy, drop the old one, rename, index).
async fn rebuild_terminal_events(
    manager: &SchemaManager<'_>,
    seq_nullable: bool,
) -> Result<(), DbErr> {
    let mut seq = ColumnDef::new(TerminalEvents::Seq);
    seq.big_integer();
    if seq_nullable {
        seq.null();
    } else {
        seq.not_null();
    }
    manager
        .create_table(
            Table::create()
                .table(TerminalEventsRebuilt::Table)
                .col(
                    ColumnDef::new(TerminalEvents::Id)
                        .big_integer()
                        .not_null()
                        .auto_increment()
                        .primary_key(),
                )
                .col(
                    ColumnDef::new(TerminalEvents::TerminalId)
                        .string_len(36)
                        .not_null(),
                )
                .col(seq)
                .col(
                    ColumnDef::new(TerminalEvents::SessionId)
                        .string_len(36)
                        .not_null(),
                )
                .col(
                    ColumnDef::new(TerminalEvents::SagaId)
                        .string_len(36)
                        .not_null(),
                )
                .col(
                    ColumnDef::new(TerminalEvents::EventType)
                        .string()
                        .not_null(),
                )
                .col(ColumnDef::new(TerminalEvents::Payload).text().not_null())
                .col(
                    ColumnDef::new(TerminalEvents::CreatedAtMs)
                        .big_integer()
                        .not_null(),
                )
                .foreign_key(
                    ForeignKey::create()
                        .name("fk_terminal_events_terminal")
                        .from(TerminalEventsRebuilt::Table, TerminalEvents::TerminalId)
                        .to(Terminals::Table, Terminals::Id),
                )
                .to_owned(),
        )
        .await?;
    manager
        .get_connection()
        .execute_unprepared(
            "INSERT INTO terminal_events_rebuilt \
             (id, terminal_id, seq, session_id, saga_id, event_type, payload, created_at_ms) \
             SELECT id, terminal_id, seq, session_id, saga_id, event_type, payload, created_at_ms \
             FROM terminal_events",
        )
        .await?;
    manager
        .drop_table(Table::drop().table(TerminalEvents::Table).to_owned())
        .await?;
    manager
        .rename_table(
            Table::rename()
                .table(TerminalEventsRebuilt::Table, TerminalEvents::Table)
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
    Ok(())
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
enum TerminalEventsRebuilt {
    Table,
}

#[derive(DeriveIden)]
enum Terminals {
    Table,
    Id,
}

#[derive(DeriveIden)]
enum Sagas {
    Table,
    ExperienceId,
    Step,
    CreatedAtMs,
    Id,
    LockToken,
    LockedUntilMs,
    NextAttemptAtMs,
}

#[derive(DeriveIden)]
enum ScoreAttempts {
    Table,
    ExperienceId,
    Score,
    CreatedAtMs,
}
