//! The guests' data: keep, share, forget.
//! - `experiences`: `gallery` (`off` | `public` | `pin`, default `off`),
//!   `gallery_pin_hash` (PBKDF2, never the PIN), `photo_retention_ms`
//!   (default 1 h), `retention_ms` (default 30 days), `notice` (JSON, per
//!   locale), `consent_required`, `share_qr_ms` (how long a display shows
//!   the newest result's QR code; 0: never).
//! - `sessions`: `share_id` (the result link's id: random, unique, not the
//!   token; existing rows get one here), `in_gallery`, `hidden`,
//!   `consented`; `forgotten_at_ms` and `forgotten_by` (`retention`,
//!   `participant` or `operator`) once its personal fields are blanked;
//!   `objects_left` while its kept files still wait to be deleted, and
//!   `purge_claim_until_ms`, the lease of the instance deleting them.
//! - `photos`: `deleted_at_ms` once the photo is given up (no saga may
//!   read it after), `object_gone` once its object is deleted, and
//!   `purge_claim_until_ms` as above.

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::{ConnectionTrait, DatabaseBackend};

#[derive(DeriveMigrationName)]
pub struct Migration;

fn add(table: impl IntoIden + Copy, column: ColumnDef) -> TableAlterStatement {
    let mut column = column;
    Table::alter()
        .table(table)
        .add_column(&mut column)
        .to_owned()
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        use Experiences as E;
        use Photos as P;
        use Sessions as S;
        // One column per statement: SQLite adds one at a time.
        let columns = [
            add(
                E::Table,
                ColumnDef::new(E::Gallery)
                    .text()
                    .not_null()
                    .default("off")
                    .to_owned(),
            ),
            add(
                E::Table,
                ColumnDef::new(E::GalleryPinHash).text().null().to_owned(),
            ),
            add(
                E::Table,
                ColumnDef::new(E::PhotoRetentionMs)
                    .big_integer()
                    .not_null()
                    .default(3_600_000i64)
                    .to_owned(),
            ),
            add(
                E::Table,
                ColumnDef::new(E::RetentionMs)
                    .big_integer()
                    .not_null()
                    .default(2_592_000_000i64)
                    .to_owned(),
            ),
            add(E::Table, ColumnDef::new(E::Notice).text().null().to_owned()),
            add(
                E::Table,
                ColumnDef::new(E::ConsentRequired)
                    .boolean()
                    .not_null()
                    .default(false)
                    .to_owned(),
            ),
            add(
                E::Table,
                ColumnDef::new(E::ShareQrMs)
                    .big_integer()
                    .not_null()
                    .default(0i64)
                    .to_owned(),
            ),
            add(
                S::Table,
                ColumnDef::new(S::ShareId).text().null().to_owned(),
            ),
            add(
                S::Table,
                ColumnDef::new(S::InGallery)
                    .boolean()
                    .not_null()
                    .default(true)
                    .to_owned(),
            ),
            add(
                S::Table,
                ColumnDef::new(S::Hidden)
                    .boolean()
                    .not_null()
                    .default(false)
                    .to_owned(),
            ),
            add(
                S::Table,
                ColumnDef::new(S::Consented)
                    .boolean()
                    .not_null()
                    .default(false)
                    .to_owned(),
            ),
            add(
                S::Table,
                ColumnDef::new(S::ForgottenAtMs)
                    .big_integer()
                    .null()
                    .to_owned(),
            ),
            add(
                S::Table,
                ColumnDef::new(S::ForgottenBy).text().null().to_owned(),
            ),
            add(
                S::Table,
                ColumnDef::new(S::ObjectsLeft)
                    .boolean()
                    .not_null()
                    .default(false)
                    .to_owned(),
            ),
            add(
                S::Table,
                ColumnDef::new(S::PurgeClaimUntilMs)
                    .big_integer()
                    .null()
                    .to_owned(),
            ),
            add(
                P::Table,
                ColumnDef::new(P::DeletedAtMs)
                    .big_integer()
                    .null()
                    .to_owned(),
            ),
            add(
                P::Table,
                ColumnDef::new(P::ObjectGone)
                    .boolean()
                    .not_null()
                    .default(false)
                    .to_owned(),
            ),
            add(
                P::Table,
                ColumnDef::new(P::PurgeClaimUntilMs)
                    .big_integer()
                    .null()
                    .to_owned(),
            ),
        ];
        for statement in columns {
            manager.alter_table(statement).await?;
        }
        // Every existing session gets its share id (random, 128 bits).
        let fill = match manager.get_database_backend() {
            DatabaseBackend::Postgres => {
                "UPDATE sessions SET share_id = md5(random()::text || clock_timestamp()::text || id) \
                 WHERE share_id IS NULL"
            }
            _ => "UPDATE sessions SET share_id = lower(hex(randomblob(16))) WHERE share_id IS NULL",
        };
        manager.get_connection().execute_unprepared(fill).await?;
        let indexes = [
            Index::create()
                .name("sessions_by_share_id")
                .table(S::Table)
                .col(S::ShareId)
                .unique()
                .to_owned(),
            // The retention sweep's question: sessions not yet forgotten,
            // oldest first.
            Index::create()
                .name("sessions_to_forget")
                .table(S::Table)
                .col(S::ForgottenAtMs)
                .col(S::UpdatedAtMs)
                .to_owned(),
            Index::create()
                .name("sessions_with_objects_left")
                .table(S::Table)
                .col(S::ObjectsLeft)
                .to_owned(),
            Index::create()
                .name("photos_given_up")
                .table(P::Table)
                .col(P::DeletedAtMs)
                .col(P::ObjectGone)
                .to_owned(),
            // The gallery's order: newest result first.
            Index::create()
                .name("results_by_time")
                .table(Results::Table)
                .col(Results::CreatedAtMs)
                .col(Results::SessionId)
                .to_owned(),
        ];
        for index in indexes {
            manager.create_index(index).await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for (name, table) in [
            ("results_by_time", Results::Table.into_iden()),
            ("photos_given_up", Photos::Table.into_iden()),
            ("sessions_with_objects_left", Sessions::Table.into_iden()),
            ("sessions_to_forget", Sessions::Table.into_iden()),
            ("sessions_by_share_id", Sessions::Table.into_iden()),
        ] {
            manager
                .drop_index(Index::drop().name(name).table(table).to_owned())
                .await?;
        }
        let drops: Vec<(DynIden, DynIden)> = vec![
            (
                Photos::Table.into_iden(),
                Photos::PurgeClaimUntilMs.into_iden(),
            ),
            (Photos::Table.into_iden(), Photos::ObjectGone.into_iden()),
            (Photos::Table.into_iden(), Photos::DeletedAtMs.into_iden()),
            (
                Sessions::Table.into_iden(),
                Sessions::PurgeClaimUntilMs.into_iden(),
            ),
            (
                Sessions::Table.into_iden(),
                Sessions::ObjectsLeft.into_iden(),
            ),
            (
                Sessions::Table.into_iden(),
                Sessions::ForgottenBy.into_iden(),
            ),
            (
                Sessions::Table.into_iden(),
                Sessions::ForgottenAtMs.into_iden(),
            ),
            (Sessions::Table.into_iden(), Sessions::Consented.into_iden()),
            (Sessions::Table.into_iden(), Sessions::Hidden.into_iden()),
            (Sessions::Table.into_iden(), Sessions::InGallery.into_iden()),
            (Sessions::Table.into_iden(), Sessions::ShareId.into_iden()),
            (
                Experiences::Table.into_iden(),
                Experiences::ShareQrMs.into_iden(),
            ),
            (
                Experiences::Table.into_iden(),
                Experiences::ConsentRequired.into_iden(),
            ),
            (
                Experiences::Table.into_iden(),
                Experiences::Notice.into_iden(),
            ),
            (
                Experiences::Table.into_iden(),
                Experiences::RetentionMs.into_iden(),
            ),
            (
                Experiences::Table.into_iden(),
                Experiences::PhotoRetentionMs.into_iden(),
            ),
            (
                Experiences::Table.into_iden(),
                Experiences::GalleryPinHash.into_iden(),
            ),
            (
                Experiences::Table.into_iden(),
                Experiences::Gallery.into_iden(),
            ),
        ];
        for (table, column) in drops {
            manager
                .alter_table(Table::alter().table(table).drop_column(column).to_owned())
                .await?;
        }
        Ok(())
    }
}

#[derive(DeriveIden, Clone, Copy)]
enum Experiences {
    Table,
    Gallery,
    GalleryPinHash,
    PhotoRetentionMs,
    RetentionMs,
    Notice,
    ConsentRequired,
    ShareQrMs,
}

#[derive(DeriveIden, Clone, Copy)]
enum Sessions {
    Table,
    UpdatedAtMs,
    ShareId,
    InGallery,
    Hidden,
    Consented,
    ForgottenAtMs,
    ForgottenBy,
    ObjectsLeft,
    PurgeClaimUntilMs,
}

#[derive(DeriveIden, Clone, Copy)]
enum Photos {
    Table,
    DeletedAtMs,
    ObjectGone,
    PurgeClaimUntilMs,
}

#[derive(DeriveIden, Clone, Copy)]
enum Results {
    Table,
    CreatedAtMs,
    SessionId,
}
