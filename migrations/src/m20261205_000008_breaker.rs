//! What every instance shares about the AI provider: `provider_breakers`,
//! its circuit breaker (`open_until_ms` NULL is closed; `probe_until_ms`
//! marks the one probe let through after the cool-down), and
//! `provider_rates`, its request rate limit (the GCRA's theoretical arrival
//! time, `tat_ms`).

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(ProviderBreakers::Table)
                    .col(
                        ColumnDef::new(ProviderBreakers::Provider)
                            .string()
                            .not_null()
                            .primary_key(),
                    )
                    .col(
                        ColumnDef::new(ProviderBreakers::OpenUntilMs)
                            .big_integer()
                            .null(),
                    )
                    .col(
                        ColumnDef::new(ProviderBreakers::ProbeUntilMs)
                            .big_integer()
                            .null(),
                    )
                    .col(ColumnDef::new(ProviderBreakers::OpenedBy).string().null())
                    .col(
                        ColumnDef::new(ProviderBreakers::UpdatedAtMs)
                            .big_integer()
                            .not_null(),
                    )
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table(ProviderRates::Table)
                    .col(
                        ColumnDef::new(ProviderRates::Provider)
                            .string()
                            .not_null()
                            .primary_key(),
                    )
                    .col(
                        ColumnDef::new(ProviderRates::TatMs)
                            .big_integer()
                            .not_null(),
                    )
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(Table::drop().table(ProviderRates::Table).to_owned())
            .await?;
        manager
            .drop_table(Table::drop().table(ProviderBreakers::Table).to_owned())
            .await
    }
}

#[derive(DeriveIden)]
enum ProviderBreakers {
    Table,
    Provider,
    OpenUntilMs,
    ProbeUntilMs,
    OpenedBy,
    UpdatedAtMs,
}

#[derive(DeriveIden)]
enum ProviderRates {
    Table,
    Provider,
    TatMs,
}
