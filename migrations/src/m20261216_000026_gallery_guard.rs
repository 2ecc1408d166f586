//! The gallery guard (`gallery_guards`): how many PINs were checked
//! against each PIN gallery, over every client address and every
//! instance, and whether that gallery is locked for it.
//!
//! One row per PIN gallery that was ever guessed at (`experience_id`),
//! about one PIN: `pin_salt` is the salt of the stored PIN hash it counts
//! against (a new PIN has a new salt, and its first guess starts the row
//! afresh: a new count, no lock, no outdated flag).
//!
//! - `window_started_at_ms`, `guesses`: the PINs checked by the slow hash
//!   since the window began. The guess that reaches the ceiling sets
//!   `locked_until_ms`: until then every PIN answer of that gallery is 429,
//!   the right PIN's too. A window, or a lock, that is over starts a new
//!   one at the next guess. One conditional upsert takes a guess, so the
//!   ceiling holds across instances.
//! - `outdated_pin_at_ms`: when this PIN was first given right with fewer
//!   than 6 digits (a PIN set before 6 were required); such a PIN no
//!   longer opens the gallery, and /ops says so until a new one is set.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        use GalleryGuards as G;
        manager
            .create_table(
                Table::create()
                    .table(G::Table)
                    .col(
                        ColumnDef::new(G::ExperienceId)
                            .string()
                            .not_null()
                            .primary_key(),
                    )
                    .col(ColumnDef::new(G::PinSalt).string().not_null())
                    .col(
                        ColumnDef::new(G::WindowStartedAtMs)
                            .big_integer()
                            .not_null(),
                    )
                    .col(ColumnDef::new(G::Guesses).integer().not_null())
                    .col(ColumnDef::new(G::LockedUntilMs).big_integer().null())
                    .col(ColumnDef::new(G::OutdatedPinAtMs).big_integer().null())
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(Table::drop().table(GalleryGuards::Table).to_owned())
            .await
    }
}

#[derive(DeriveIden)]
enum GalleryGuards {
    Table,
    ExperienceId,
    PinSalt,
    WindowStartedAtMs,
    Guesses,
    LockedUntilMs,
    OutdatedPinAtMs,
}
