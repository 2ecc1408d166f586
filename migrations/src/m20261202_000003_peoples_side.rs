//! The people's side: languages, hashed tokens, display acks and presence,
//! hidden ranking entries, and sagas that can be retried.
//!
//! - `experiences.locale` (`en` or `ko`, default `en`): the language of the
//!   human messages and page texts of an experience.
//! - Tokens are stored hashed (SHA-256, hex): `terminals.token` becomes
//!   `token_hash` and `sessions.participant_token` becomes
//!   `participant_token_hash`; the rows that exist are hashed in place.
//!   A token is 244 random bits, so a plain hash is enough to make a leaked
//!   table useless and needs no salt.
//! - `terminals.acked_seq`: the highest `seq` a display of the terminal
//!   acknowledged; it never goes down.
//! - `terminal_presence`: one row per connected display socket, on any
//!   instance (`instance_id`), refreshed by its instance (`seen_at_ms`), with
//!   what the socket sent and what its display acknowledged. A row not seen
//!   for a while belongs to a dead instance and counts as offline.
//! - `sagas.aborted_at_step`: where an aborted saga stood, so an operator's
//!   retry resumes it there and keeps the work already done.
//! - `score_attempts.hidden`: the entry of a session whose saga ended
//!   ABORTED is hidden from the ranking. The ranking index leads with
//!   (experience_id, hidden) so reads and rank counts of visible entries
//!   still walk it in score order.
//! - `idx_terminal_events_saga` is no longer unique: a saga that an operator
//!   retries after it aborted ends a second time. Each end is still fenced.

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::{ConnectionTrait, Statement};
use sha2::{Digest, Sha256};

#[derive(DeriveMigrationName)]
pub struct Migration;

/// SHA-256 of a token, in hex. Must equal `stagehand::domain::keys::token_hash`.
fn token_hash(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    fn use_transaction(&self) -> Option<bool> {
        Some(true)
    }

    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(Experiences::Table)
                    .add_column(
                        ColumnDef::new(Experiences::Locale)
                            .string_len(8)
                            .not_null()
                            .default("en"),
                    )
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(Terminals::Table)
                    .add_column(
                        ColumnDef::new(Terminals::AckedSeq)
                            .big_integer()
                            .not_null()
                            .default(0i64),
                    )
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(Sagas::Table)
                    .add_column(ColumnDef::new(Sagas::AbortedAtStep).string_len(16).null())
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(ScoreAttempts::Table)
                    .add_column(
                        ColumnDef::new(ScoreAttempts::Hidden)
                            .boolean()
                            .not_null()
                            .default(false),
                    )
                    .to_owned(),
            )
            .await?;
        hash_tokens(manager, "terminals", "token", "token_hash").await?;
        hash_tokens(
            manager,
            "sessions",
            "participant_token",
            "participant_token_hash",
        )
        .await?;

        manager
            .drop_index(
                Index::drop()
                    .name("idx_score_attempts_ranking")
                    .table(ScoreAttempts::Table)
                    .to_owned(),
            )
            .await?;
        manager.create_index(ranking_index(true)).await?;
        manager
            .drop_index(
                Index::drop()
                    .name("idx_terminal_events_saga")
                    .table(TerminalEvents::Table)
                    .to_owned(),
            )
            .await?;
        manager.create_index(events_by_saga(false)).await?;

        manager
            .create_table(
                Table::create()
                    .table(TerminalPresence::Table)
                    .col(
                        ColumnDef::new(TerminalPresence::SocketId)
                            .string_len(64)
                            .not_null()
                            .primary_key(),
                    )
                    .col(
                        ColumnDef::new(TerminalPresence::TerminalId)
                            .string_len(36)
                            .not_null(),
                    )
                    .col(
                        ColumnDef::new(TerminalPresence::InstanceId)
                            .string_len(36)
                            .not_null(),
                    )
                    .col(
                        ColumnDef::new(TerminalPresence::ConnectedAtMs)
                            .big_integer()
                            .not_null(),
                    )
                    .col(
                        ColumnDef::new(TerminalPresence::SeenAtMs)
                            .big_integer()
                            .not_null(),
                    )
                    .col(
                        ColumnDef::new(TerminalPresence::SentSeq)
                            .big_integer()
                            .not_null()
                            .default(0i64),
                    )
                    .col(
                        ColumnDef::new(TerminalPresence::AckedSeq)
                            .big_integer()
                            .not_null()
                            .default(0i64),
                    )
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("idx_terminal_presence_terminal")
                    .table(TerminalPresence::Table)
                    .col(TerminalPresence::TerminalId)
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("idx_terminal_presence_instance")
                    .table(TerminalPresence::Table)
                    .col(TerminalPresence::InstanceId)
                    .to_owned(),
            )
            .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(Table::drop().table(TerminalPresence::Table).to_owned())
            .await?;
        manager
            .drop_index(
                Index::drop()
                    .name("idx_terminal_events_saga")
                    .table(TerminalEvents::Table)
                    .to_owned(),
            )
            .await?;
        // Back to one event per saga: a retried saga keeps its first.
        manager
            .get_connection()
            .execute_unprepared(
                "DELETE FROM terminal_events WHERE id NOT IN \
                 (SELECT MIN(id) FROM terminal_events GROUP BY saga_id)",
            )
            .await?;
        manager.create_index(events_by_saga(true)).await?;
        manager
            .drop_index(
                Index::drop()
                    .name("idx_score_attempts_ranking")
                    .table(ScoreAttempts::Table)
                    .to_owned(),
            )
            .await?;
        manager.create_index(ranking_index(false)).await?;
        // Hashed tokens cannot be turned back: the columns get their old
        // names, and the tokens handed out before stop working.
        for (table, from, to) in [
            ("terminals", "token_hash", "token"),
            ("sessions", "participant_token_hash", "participant_token"),
        ] {
            manager
                .alter_table(
                    Table::alter()
                        .table(Alias::new(table))
                        .rename_column(Alias::new(from), Alias::new(to))
                        .to_owned(),
                )
                .await?;
        }
        for (table, column) in [
            (Alias::new("score_attempts"), Alias::new("hidden")),
            (Alias::new("sagas"), Alias::new("aborted_at_step")),
            (Alias::new("terminals"), Alias::new("acked_seq")),
            (Alias::new("experiences"), Alias::new("locale")),
        ] {
            manager
                .alter_table(Table::alter().table(table).drop_column(column).to_owned())
                .await?;
        }
        Ok(())
    }
}

/// Renames a token column to its hash column and hashes what it holds.
async fn hash_tokens(
    manager: &SchemaManager<'_>,
    table: &str,
    from: &str,
    to: &str,
) -> Result<(), DbErr> {
    manager
        .alter_table(
            Table::alter()
                .table(Alias::new(table))
                .rename_column(Alias::new(from), Alias::new(to))
                .to_owned(),
        )
        .await?;
    let conn = manager.get_connection();
    let backend = conn.get_database_backend();
    let rows = conn
        .query_all_raw(Statement::from_string(
            backend,
            format!("SELECT id, {to} FROM {table}"),
        ))
        .await?;
    for row in rows {
        let id: String = row.try_get_by_index(0)?;
        let token: String = row.try_get_by_index(1)?;
        let update = Query::update()
            .table(Alias::new(table))
            .value(Alias::new(to), token_hash(&token))
            .and_where(Expr::col(Alias::new("id")).eq(id))
            .to_owned();
        conn.execute(&update).await?;
    }
    Ok(())
}

/// The ranking index: visible entries of an experience in ranking order
/// (`with_hidden`), or the reactive-delivery version without `hidden`.
fn ranking_index(with_hidden: bool) -> IndexCreateStatement {
    let mut index = Index::create();
    index
        .name("idx_score_attempts_ranking")
        .table(ScoreAttempts::Table)
        .col(ScoreAttempts::ExperienceId);
    if with_hidden {
        index.col(ScoreAttempts::Hidden);
    }
    index
        .col((ScoreAttempts::Score, IndexOrder::Desc))
        .col(ScoreAttempts::CreatedAtMs)
        .col(ScoreAttempts::SessionId)
        .to_owned()
}

/// Outbox events by saga, unique before this migration.
fn events_by_saga(unique: bool) -> IndexCreateStatement {
    let mut index = Index::create();
    index
        .name("idx_terminal_events_saga")
        .table(TerminalEvents::Table)
        .col(TerminalEvents::SagaId);
    if unique {
        index.unique();
    }
    index.to_owned()
}

#[derive(DeriveIden)]
enum Experiences {
    Table,
    Locale,
}

#[derive(DeriveIden)]
enum Terminals {
    Table,
    AckedSeq,
}

#[derive(DeriveIden)]
enum Sagas {
    Table,
    AbortedAtStep,
}

#[derive(DeriveIden)]
enum ScoreAttempts {
    Table,
    ExperienceId,
    Hidden,
    Score,
    CreatedAtMs,
    SessionId,
}

#[derive(DeriveIden)]
enum TerminalEvents {
    Table,
    SagaId,
}

#[derive(DeriveIden)]
enum TerminalPresence {
    Table,
    SocketId,
    TerminalId,
    InstanceId,
    ConnectedAtMs,
    SeenAtMs,
    SentSeq,
    AckedSeq,
}
