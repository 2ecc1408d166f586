//! Mail to the guest: the outbox of mails, the templates operators edit,
//! and the experience's mail settings.
//! - `mails`: one mail of one session's result to one address. `address`
//!   is personal data (blanked when the session is forgotten);
//!   `address_key` is a keyed digest of it that bounds how often one
//!   address is mailed (blanked with it). `locale` is the language it is
//!   written in. The consent: `consent_notice` (the version of the
//!   consent text the guest saw) and `consent_at_ms`; the separate
//!   marketing opt-in: `marketing` and `marketing_at_ms` (null: not
//!   given). `status` is `QUEUED`, `SENT`, `FAILED` or `CANCELED`;
//!   `attempts`, `next_attempt_at_ms` and `last_error` say how sending
//!   went; `lease_token` and `lease_until_ms` fence the instance sending
//!   it (a mail under a live lease is being sent).
//! - `mail_templates`: an operator's subject and body for one locale
//!   (none: the built-in one).
//! - `experiences`: `mails_per_guest` (default 3; 0: guests cannot ask
//!   for mail), `mail_attach` (the full file is attached), `mail_consent`
//!   and `mail_marketing` (the organiser's texts, JSON of locale to text).

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        use Mails as M;
        manager
            .create_table(
                Table::create()
                    .table(M::Table)
                    .col(ColumnDef::new(M::Id).text().not_null().primary_key())
                    .col(ColumnDef::new(M::SessionId).text().not_null())
                    .col(ColumnDef::new(M::ExperienceId).text().not_null())
                    .col(ColumnDef::new(M::Address).text().null())
                    .col(ColumnDef::new(M::AddressKey).text().null())
                    .col(ColumnDef::new(M::Locale).text().not_null())
                    .col(ColumnDef::new(M::ConsentNotice).text().not_null())
                    .col(ColumnDef::new(M::ConsentAtMs).big_integer().not_null())
                    .col(
                        ColumnDef::new(M::Marketing)
                            .boolean()
                            .not_null()
                            .default(false),
                    )
                    .col(ColumnDef::new(M::MarketingAtMs).big_integer().null())
                    .col(ColumnDef::new(M::Status).text().not_null())
                    .col(ColumnDef::new(M::Attempts).integer().not_null().default(0))
                    .col(ColumnDef::new(M::LastError).text().null())
                    .col(ColumnDef::new(M::LeaseToken).text().null())
                    .col(ColumnDef::new(M::LeaseUntilMs).big_integer().null())
                    .col(ColumnDef::new(M::NextAttemptAtMs).big_integer().not_null())
                    .col(ColumnDef::new(M::CreatedAtMs).big_integer().not_null())
                    .col(ColumnDef::new(M::UpdatedAtMs).big_integer().not_null())
                    .col(ColumnDef::new(M::SentAtMs).big_integer().null())
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table(MailTemplates::Table)
                    .col(
                        ColumnDef::new(MailTemplates::Locale)
                            .text()
                            .not_null()
                            .primary_key(),
                    )
                    .col(ColumnDef::new(MailTemplates::Subject).text().not_null())
                    .col(ColumnDef::new(MailTemplates::Body).text().not_null())
                    .col(
                        ColumnDef::new(MailTemplates::UpdatedAtMs)
                            .big_integer()
                            .not_null(),
                    )
                    .to_owned(),
            )
            .await?;
        let columns = [
            ColumnDef::new(Experiences::MailsPerGuest)
                .integer()
                .not_null()
                .default(3)
                .to_owned(),
            ColumnDef::new(Experiences::MailAttach)
                .boolean()
                .not_null()
                .default(false)
                .to_owned(),
            ColumnDef::new(Experiences::MailConsent)
                .text()
                .null()
                .to_owned(),
            ColumnDef::new(Experiences::MailMarketing)
                .text()
                .null()
                .to_owned(),
        ];
        // One column per statement: SQLite adds one at a time.
        for column in columns {
            manager
                .alter_table(
                    Table::alter()
                        .table(Experiences::Table)
                        .add_column(column)
                        .to_owned(),
                )
                .await?;
        }
        let db = manager.get_connection();
        for index in [
            "CREATE INDEX mails_queued ON mails (next_attempt_at_ms, created_at_ms) \
             WHERE status = 'QUEUED'",
            "CREATE INDEX mails_by_session ON mails (session_id)",
            "CREATE INDEX mails_by_address ON mails (address_key, created_at_ms)",
            "CREATE INDEX mails_by_time ON mails (created_at_ms)",
        ] {
            db.execute_unprepared(index).await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for column in [
            Experiences::MailsPerGuest,
            Experiences::MailAttach,
            Experiences::MailConsent,
            Experiences::MailMarketing,
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
        manager
            .drop_table(Table::drop().table(MailTemplates::Table).to_owned())
            .await?;
        manager
            .drop_table(Table::drop().table(Mails::Table).to_owned())
            .await?;
        Ok(())
    }
}

#[derive(DeriveIden)]
enum Mails {
    Table,
    Id,
    SessionId,
    ExperienceId,
    Address,
    AddressKey,
    Locale,
    ConsentNotice,
    ConsentAtMs,
    Marketing,
    MarketingAtMs,
    Status,
    Attempts,
    LastError,
    LeaseToken,
    LeaseUntilMs,
    NextAttemptAtMs,
    CreatedAtMs,
    UpdatedAtMs,
    SentAtMs,
}

#[derive(DeriveIden)]
enum MailTemplates {
    Table,
    Locale,
    Subject,
    Body,
    UpdatedAtMs,
}

#[derive(DeriveIden)]
enum Experiences {
    Table,
    MailsPerGuest,
    MailAttach,
    MailConsent,
    MailMarketing,
}
