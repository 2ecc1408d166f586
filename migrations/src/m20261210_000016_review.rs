//! Operators' review before the public screen.
//! - `experiences.review` (`off` or `before_display`, default `off`),
//!   `review_timeout_ms` (none: an item waits until someone decides) and
//!   `review_timeout_action` (`approve` or `reject`).
//! - `sagas.review_since_ms`: when its AI result entered IN_REVIEW (the
//!   queue's order and the timeout's start), and `sagas.review_decision`
//!   (`APPROVED`; a rejection is the saga's `REVIEW_REJECTED` abort), the
//!   fence of the two actions: each applies only while none was taken.
//! - A partial index over the IN_REVIEW sagas, oldest first: the queue, the
//!   timeout scan and the adoption of approved sagas walk only it.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(Experiences::Table)
                    .add_column(
                        ColumnDef::new(Experiences::Review)
                            .string()
                            .not_null()
                            .default("off"),
                    )
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(Experiences::Table)
                    .add_column(ColumnDef::new(Experiences::ReviewTimeoutMs).big_integer().null())
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(Experiences::Table)
                    .add_column(ColumnDef::new(Experiences::ReviewTimeoutAction).string().null())
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(Sagas::Table)
                    .add_column(ColumnDef::new(Sagas::ReviewSinceMs).big_integer().null())
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(Sagas::Table)
                    .add_column(ColumnDef::new(Sagas::ReviewDecision).string().null())
                    .to_owned(),
            )
            .await?;
        manager
            .get_connection()
            .execute_unprepared(
                "CREATE INDEX idx_sagas_in_review ON sagas (review_since_ms, id) \
                 WHERE step = 'IN_REVIEW'",
            )
            .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .get_connection()
            .execute_unprepared("DROP INDEX IF EXISTS idx_sagas_in_review")
            .await?;
        for column in [Sagas::ReviewSinceMs, Sagas::ReviewDecision] {
            manager
                .alter_table(Table::alter().table(Sagas::Table).drop_column(column).to_owned())
                .await?;
        }
        for column in [
            Experiences::Review,
            Experiences::ReviewTimeoutMs,
            Experiences::ReviewTimeoutAction,
        ] {
            manager
                .alter_table(
                    Table::alter()
                        .table(Experiences::Table)
                        .drop_column(column)
                        .to_owned(),
                )
                .await?;
        }
        Ok(())
    }
}

#[derive(DeriveIden)]
enum Experiences {
    Table,
    Review,
    ReviewTimeoutMs,
    ReviewTimeoutAction,
}

#[derive(DeriveIden)]
enum Sagas {
    Table,
    ReviewSinceMs,
    ReviewDecision,
}
