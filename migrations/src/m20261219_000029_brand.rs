//! The event's brand and its print settings, per experience:
//! - `brand_fit` (`cover` | `fit`, default `cover`): how the overlay is
//!   placed on a result;
//! - `brand_caption` (0 to 80 characters, none by default), drawn along
//!   the result's foot;
//! - `brand_applies_to` (any of `display`, `share`, `print`, comma
//!   separated; default all three);
//! - `brand_overlay_key`, `brand_overlay_width`, `brand_overlay_height`:
//!   the overlay PNG in the media store and its size;
//! - `brand_logo_key`: the corner logo PNG in the media store;
//! - `brand_version`: raised by every change of the brand, so each
//!   instance knows when the brand it holds in memory is stale;
//! - `prints_per_guest` (default 1; 0: guests cannot print) and
//!   `print_review` (guests' prints wait for an operator).

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

fn columns() -> Vec<ColumnDef> {
    use Experiences as E;
    vec![
        ColumnDef::new(E::BrandFit)
            .text()
            .not_null()
            .default("cover")
            .to_owned(),
        ColumnDef::new(E::BrandCaption).text().null().to_owned(),
        ColumnDef::new(E::BrandAppliesTo)
            .text()
            .not_null()
            .default("display,share,print")
            .to_owned(),
        ColumnDef::new(E::BrandOverlayKey).text().null().to_owned(),
        ColumnDef::new(E::BrandOverlayWidth)
            .integer()
            .null()
            .to_owned(),
        ColumnDef::new(E::BrandOverlayHeight)
            .integer()
            .null()
            .to_owned(),
        ColumnDef::new(E::BrandLogoKey).text().null().to_owned(),
        ColumnDef::new(E::BrandVersion)
            .big_integer()
            .not_null()
            .default(0i64)
            .to_owned(),
        ColumnDef::new(E::PrintsPerGuest)
            .integer()
            .not_null()
            .default(1)
            .to_owned(),
        ColumnDef::new(E::PrintReview)
            .boolean()
            .not_null()
            .default(false)
            .to_owned(),
    ]
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // One column per statement: SQLite adds one at a time.
        for mut column in columns() {
            manager
                .alter_table(
                    Table::alter()
                        .table(Experiences::Table)
                        .add_column(&mut column)
                        .to_owned(),
                )
                .await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for column in columns().into_iter().rev() {
            manager
                .alter_table(
                    Table::alter()
                        .table(Experiences::Table)
                        .drop_column(Alias::new(column.get_column_name()))
                        .to_owned(),
                )
                .await?;
        }
        Ok(())
    }
}

#[derive(DeriveIden, Clone, Copy)]
enum Experiences {
    Table,
    BrandFit,
    BrandCaption,
    BrandAppliesTo,
    BrandOverlayKey,
    BrandOverlayWidth,
    BrandOverlayHeight,
    BrandLogoKey,
    BrandVersion,
    PrintsPerGuest,
    PrintReview,
}
