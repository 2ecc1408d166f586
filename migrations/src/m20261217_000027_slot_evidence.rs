//! What the slot ledger needs to find a job again without the saga's own
//! rows, and the photo's fingerprint it finds it by (issue: the ledger
//! frees a slot only on evidence).
//!
//! - `ai_slots.prompt`, `ai_slots.photo_key`, `ai_slots.photo_sha256`: the
//!   prompt the call's order carried and the photo it sent (its object key
//!   and the SHA-256 of the bytes sent), copied when the slot is granted.
//!   The slot adopter looks for a job with exactly the order that was
//!   sent, even after erasure or retention blanked the saga's prompt and
//!   deleted the photo; the row, and with it this copy, goes when the slot
//!   is freed on evidence. Rows granted before this migration have none:
//!   the adopter then reads the saga's prompt and photo as before.
//! - `ai_slots.unfound_since_ms`: when the adopter first looked for a job
//!   it could not find (or, for a provider that cannot be asked, first
//!   took the row): not finding a job is no evidence; a provider that ends
//!   every job by a deadline of its own is, once that deadline has passed.
//! - `photos.sha256`: the SHA-256 of the stored photo's bytes, made when
//!   the photo is stored (NULL for photos stored before).

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // SQLite takes one column per ALTER TABLE.
        for column in [
            ColumnDef::new(AiSlots::Prompt).text().null().to_owned(),
            ColumnDef::new(AiSlots::PhotoKey).text().null().to_owned(),
            ColumnDef::new(AiSlots::PhotoSha256)
                .text()
                .null()
                .to_owned(),
            ColumnDef::new(AiSlots::UnfoundSinceMs)
                .big_integer()
                .null()
                .to_owned(),
        ] {
            manager
                .alter_table(
                    Table::alter()
                        .table(AiSlots::Table)
                        .add_column(column)
                        .to_owned(),
                )
                .await?;
        }
        manager
            .alter_table(
                Table::alter()
                    .table(Photos::Table)
                    .add_column(ColumnDef::new(Photos::Sha256).text().null())
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for column in [
            AiSlots::Prompt,
            AiSlots::PhotoKey,
            AiSlots::PhotoSha256,
            AiSlots::UnfoundSinceMs,
        ] {
            manager
                .alter_table(
                    Table::alter()
                        .table(AiSlots::Table)
                        .drop_column(column)
                        .to_owned(),
                )
                .await?;
        }
        manager
            .alter_table(
                Table::alter()
                    .table(Photos::Table)
                    .drop_column(Photos::Sha256)
                    .to_owned(),
            )
            .await
    }
}

#[derive(DeriveIden)]
enum AiSlots {
    Table,
    Prompt,
    PhotoKey,
    PhotoSha256,
    UnfoundSinceMs,
}

#[derive(DeriveIden)]
enum Photos {
    Table,
    Sha256,
}
