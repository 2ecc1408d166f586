//! Two indexes hold only the rows their questions ask about (issue 46).
//! Neither a session's nor a saga's UPDATE is HOT (each changes an indexed
//! column), so every row version adds an entry to every index of its
//! table, also to one whose question will never find that row.
//!
//! - `sagas_by_photo` answers "which sagas name this photo"
//!   (`photo_id = $1`). Every saga of a prompt-only experience has
//!   `photo_id` NULL, yet its insert and each step's UPDATE added an
//!   entry. Now partial on `photo_id IS NOT NULL`: an equality implies it,
//!   on PostgreSQL and on SQLite, so the same questions use it.
//! - `sessions_with_objects_left` answers the purge's claim: the sessions
//!   whose kept files still wait to be deleted, oldest forgotten first.
//!   It held every session (`objects_left` false for nearly all); now it
//!   holds those with `objects_left = TRUE`, ordered by `forgotten_at_ms`,
//!   and the claim asks with that same literal term (SQLite uses a partial
//!   index only for a query that carries its WHERE term).
//!
//! Each index is built again, which holds writes to its table while it is
//! built: 45 ms in all for 100,000 sagas and sessions on PostgreSQL on the
//! development machine (2 cores), at the start of the first instance of
//! this version.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    /// One connection for each drop and its create: without a
    /// transaction, SQLite runs them on two connections of the pool, and
    /// the second, with the schema it read before the drop, refuses the
    /// create ("index sagas_by_photo already exists").
    fn use_transaction(&self) -> Option<bool> {
        Some(true)
    }

    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        for statement in [
            "DROP INDEX IF EXISTS sagas_by_photo",
            "CREATE INDEX sagas_by_photo ON sagas (photo_id) WHERE photo_id IS NOT NULL",
            "DROP INDEX IF EXISTS sessions_with_objects_left",
            "CREATE INDEX sessions_with_objects_left ON sessions (forgotten_at_ms) \
             WHERE objects_left = TRUE",
        ] {
            db.execute_unprepared(statement).await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        for statement in [
            "DROP INDEX IF EXISTS sagas_by_photo",
            "CREATE INDEX sagas_by_photo ON sagas (photo_id)",
            "DROP INDEX IF EXISTS sessions_with_objects_left",
            "CREATE INDEX sessions_with_objects_left ON sessions (objects_left)",
        ] {
            db.execute_unprepared(statement).await?;
        }
        Ok(())
    }
}
