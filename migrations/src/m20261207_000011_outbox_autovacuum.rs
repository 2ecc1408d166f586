//! PostgreSQL: autovacuum visits `terminal_events` (the outbox: an insert
//! and a numbering update per event, and the cleanup's purges) after 2 % of
//! its rows changed instead of 20 %, like `sagas`, so the relay's walk
//! along unnumbered events does not wade through dead tuples at an event's
//! peak. SQLite has no autovacuum settings: nothing to do there.

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::{ConnectionTrait, DbBackend};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        if manager.get_database_backend() == DbBackend::Postgres {
            manager
                .get_connection()
                .execute_unprepared(
                    "ALTER TABLE terminal_events SET (autovacuum_vacuum_scale_factor = 0.02, \
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
                    "ALTER TABLE terminal_events RESET (autovacuum_vacuum_scale_factor, \
                     autovacuum_analyze_scale_factor)",
                )
                .await?;
        }
        Ok(())
    }
}
