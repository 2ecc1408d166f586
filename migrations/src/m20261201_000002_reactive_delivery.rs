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
//! - The claim's two indexes, both partial on the non-final steps, so
//!   finished sagas are in neither and the claim costs the same however
//!   long the history or the queue is:
//!   - `idx_sagas_unowned` (lock_token IS NULL) on (experience_id, step,
//!     created_at_ms, id): "oldest queued saga of this experience at this
//!     step" is an ordered walk that never passes a saga someone holds;
//!   - `idx_sagas_leased` (lock_token IS NOT NULL) on (experience_id, step,
//!     locked_until_ms): the AI cap counts the live leases of AI_PENDING,
//!     and the leases that ran out (sagas to resume) are at its start.
//!
//!   They replace `idx_sagas_runnable` and `idx_sagas_inflight`: a saga is
//!   updated five or six times, and every update that is not HOT writes
//!   every index the row is in.
//! - `idx_score_attempts_ranking` on (experience_id, score DESC,
//!   created_at_ms, session_id) replaces `idx_score_attempts_rank`: the top
//!   N in ranking order is an index walk that stops after N (the old index
//!   sorted every entry of the experience for each read), and ranking a
//!   batch of new entries (by session) reads the index alone.
//! - PostgreSQL only: `sagas` is a queue table with many updates per row, so
//!   autovacuum visits it after 2 % of its rows changed instead of 20 %,
//!   before dead index entries slow the claim; `score_attempts` only grows,
//!   so it is vacuumed after 2 % new rows, which keeps the visibility map
//!   fresh and the rank counts index-only.

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
        let postgres = manager.get_database_backend() == DbBackend::Postgres;
        if postgres {
            execute(
                manager,
                "ALTER TABLE terminal_events ALTER COLUMN seq DROP NOT NULL",
            )
            .await?;
        } else {
            rebuild_terminal_events(manager, true).await?;
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
        for name in ["idx_sagas_runnable", "idx_sagas_inflight"] {
            drop_index(manager, name, Sagas::Table).await?;
        }
        manager.create_index(claim_index(false)).await?;
        manager.create_index(claim_index(true)).await?;
        drop_index(manager, "idx_score_attempts_rank", ScoreAttempts::Table).await?;
        manager
            .create_index(
                Index::create()
                    .name("idx_score_attempts_ranking")
                    .table(ScoreAttempts::Table)
                    .col(ScoreAttempts::ExperienceId)
                    .col((ScoreAttempts::Score, IndexOrder::Desc))
                    .col(ScoreAttempts::CreatedAtMs)
                    .col(ScoreAttempts::SessionId)
                    .to_owned(),
            )
            .await?;
        if postgres {
            execute(
                manager,
                "ALTER TABLE sagas SET (autovacuum_vacuum_scale_factor = 0.02, \
                 autovacuum_analyze_scale_factor = 0.02)",
            )
            .await?;
            execute(
                manager,
                "ALTER TABLE score_attempts SET (autovacuum_vacuum_insert_scale_factor = 0.02, \
                 autovacuum_analyze_scale_factor = 0.02)",
            )
            .await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let postgres = manager.get_database_backend() == DbBackend::Postgres;
        if postgres {
            execute(
                manager,
                "ALTER TABLE sagas RESET (autovacuum_vacuum_scale_factor, \
                 autovacuum_analyze_scale_factor)",
            )
            .await?;
            execute(
                manager,
                "ALTER TABLE score_attempts RESET (autovacuum_vacuum_insert_scale_factor, \
                 autovacuum_analyze_scale_factor)",
            )
            .await?;
        }
        drop_index(manager, "idx_score_attempts_ranking", ScoreAttempts::Table).await?;
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
        for name in ["idx_sagas_unowned", "idx_sagas_leased"] {
            drop_index(manager, name, Sagas::Table).await?;
        }
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
        drop_index(
            manager,
            "idx_terminal_events_unnumbered",
            TerminalEvents::Table,
        )
        .await?;
        // Events not yet numbered cannot live in a NOT NULL column: they are
        // dropped with the relay that would have numbered them.
        execute(manager, "DELETE FROM terminal_events WHERE seq IS NULL").await?;
        if postgres {
            execute(
                manager,
                "ALTER TABLE terminal_events ALTER COLUMN seq SET NOT NULL",
            )
            .await?;
        } else {
            rebuild_terminal_events(manager, false).await?;
        }
        Ok(())
    }
}

/// `idx_sagas_leased` (`leased`) or `idx_sagas_unowned`: see the module doc.
fn claim_index(leased: bool) -> IndexCreateStatement {
    let mut index = Index::create();
    index
        .table(Sagas::Table)
        .col(Sagas::ExperienceId)
        .col(Sagas::Step);
    if leased {
        index
            .name("idx_sagas_leased")
            .col(Sagas::LockedUntilMs)
            .and_where(Expr::col(Sagas::LockToken).is_not_null());
    } else {
        index
            .name("idx_sagas_unowned")
            .col(Sagas::CreatedAtMs)
            .col(Sagas::Id)
            .and_where(Expr::col(Sagas::LockToken).is_null());
    }
    index
        .and_where(Expr::col(Sagas::Step).is_in(RUNNABLE))
        .to_owned()
}

async fn drop_index<T: IntoIden + 'static>(
    manager: &SchemaManager<'_>,
    name: &str,
    table: T,
) -> Result<(), DbErr> {
    manager
        .drop_index(Index::drop().name(name).table(table).to_owned())
        .await
}

async fn execute(manager: &SchemaManager<'_>, sql: &str) -> Result<(), DbErr> {
    manager.get_connection().execute_unprepared(sql).await?;
    Ok(())
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
    SessionId,
}
