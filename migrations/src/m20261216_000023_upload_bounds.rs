//! Bounds at the upload desk (a booth's QR code is public):
//! - `experiences.max_photos_per_session` (default 5): the photos one
//!   session may have at once (not given up); an upload that replaces the
//!   session's unsubmitted photo gives that one up in its own transaction.

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
                        ColumnDef::new(Experiences::MaxPhotosPerSession)
                            .integer()
                            .not_null()
                            .default(5),
                    )
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(Experiences::Table)
                    .drop_column(Experiences::MaxPhotosPerSession)
                    .to_owned(),
            )
            .await
    }
}

#[derive(DeriveIden)]
enum Experiences {
    Table,
    MaxPhotosPerSession,
}
