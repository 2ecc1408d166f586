//! Media: photos in, results kept.
//! - `photos`: one row per uploaded photo (its object key in the media
//!   store, its size, its session). The orphan sweep deletes only photos
//!   no saga names (`sagas.photo_id`, indexed for that question).
//! - `server_keys`: secrets every instance shares, made once by whichever
//!   instance starts first (`media_signing`: the HMAC key of the signed
//!   photo URLs and of the result objects' keys).
//! - `experiences.input` (`prompt` | `photo` | `photo+prompt`, default
//!   `prompt`) and `experiences.photo_max_px` (default 1536).
//! - `sagas.photo_id` (TEXT NULL): the photo its submission named.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(Photos::Table)
                    .col(ColumnDef::new(Photos::Id).text().not_null().primary_key())
                    .col(ColumnDef::new(Photos::SessionId).text().not_null())
                    .col(ColumnDef::new(Photos::ObjectKey).text().not_null())
                    .col(ColumnDef::new(Photos::ContentType).text().not_null())
                    .col(ColumnDef::new(Photos::Width).integer().not_null())
                    .col(ColumnDef::new(Photos::Height).integer().not_null())
                    .col(ColumnDef::new(Photos::Bytes).big_integer().not_null())
                    .col(ColumnDef::new(Photos::CreatedAtMs).big_integer().not_null())
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("photos_by_session")
                    .table(Photos::Table)
                    .col(Photos::SessionId)
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("photos_by_object_key")
                    .table(Photos::Table)
                    .col(Photos::ObjectKey)
                    .unique()
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("photos_by_age")
                    .table(Photos::Table)
                    .col(Photos::CreatedAtMs)
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table(ServerKeys::Table)
                    .col(
                        ColumnDef::new(ServerKeys::Name)
                            .text()
                            .not_null()
                            .primary_key(),
                    )
                    .col(ColumnDef::new(ServerKeys::Value).text().not_null())
                    .to_owned(),
            )
            .await?;
        // One column per statement: SQLite adds one at a time.
        manager
            .alter_table(
                Table::alter()
                    .table(Experiences::Table)
                    .add_column(
                        ColumnDef::new(Experiences::Input)
                            .text()
                            .not_null()
                            .default("prompt"),
                    )
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(Experiences::Table)
                    .add_column(
                        ColumnDef::new(Experiences::PhotoMaxPx)
                            .integer()
                            .not_null()
                            .default(1536),
                    )
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(Sagas::Table)
                    .add_column(ColumnDef::new(Sagas::PhotoId).text().null())
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("sagas_by_photo")
                    .table(Sagas::Table)
                    .col(Sagas::PhotoId)
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_index(
                Index::drop()
                    .name("sagas_by_photo")
                    .table(Sagas::Table)
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(Sagas::Table)
                    .drop_column(Sagas::PhotoId)
                    .to_owned(),
            )
            .await?;
        for column in [Experiences::PhotoMaxPx, Experiences::Input] {
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
            .drop_table(Table::drop().table(ServerKeys::Table).to_owned())
            .await?;
        manager
            .drop_table(Table::drop().table(Photos::Table).to_owned())
            .await
    }
}

#[derive(DeriveIden)]
enum Photos {
    Table,
    Id,
    SessionId,
    ObjectKey,
    ContentType,
    Width,
    Height,
    Bytes,
    CreatedAtMs,
}

#[derive(DeriveIden)]
enum ServerKeys {
    Table,
    Name,
    Value,
}

#[derive(DeriveIden)]
enum Experiences {
    Table,
    Input,
    PhotoMaxPx,
}

#[derive(DeriveIden)]
enum Sagas {
    Table,
    PhotoId,
}
