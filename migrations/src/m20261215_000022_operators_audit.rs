//! Operators with roles, and the audit trail of what they did.
//!
//! - `operators`: a person's operator token, by its digest only
//!   (`token_hash`, unique; the token is shown once), with a `name` and a
//!   `role` (`admin`, `moderator` or `viewer`). `revoked_at_ms` once
//!   revoked: the token is refused from then on, on every instance (each
//!   request reads the row). The bootstrap admin (`OPERATOR_TOKEN`) has no
//!   row.
//! - `audit_log`: one row per operator action, written in the transaction
//!   of the action itself: when (`at_ms`), who (`operator_id`, NULL for the
//!   bootstrap admin, and `operator_name` as it was then), `action`,
//!   `target`, the experience it concerns (`experience_id`, for the export)
//!   and a short `detail`. Never a token, a photo or a guest's prompt. Read
//!   newest first by `(at_ms, id)`; kept `AUDIT_RETENTION`.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        use AuditLog as A;
        use Operators as O;
        manager
            .create_table(
                Table::create()
                    .table(O::Table)
                    .col(ColumnDef::new(O::Id).string().not_null().primary_key())
                    .col(ColumnDef::new(O::Name).string().not_null())
                    .col(ColumnDef::new(O::Role).string().not_null())
                    .col(ColumnDef::new(O::TokenHash).string().not_null())
                    .col(ColumnDef::new(O::CreatedAtMs).big_integer().not_null())
                    .col(ColumnDef::new(O::CreatedBy).string().not_null())
                    .col(ColumnDef::new(O::RevokedAtMs).big_integer().null())
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("idx_operators_token_hash")
                    .table(O::Table)
                    .col(O::TokenHash)
                    .unique()
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table(A::Table)
                    .col(ColumnDef::new(A::Id).string().not_null().primary_key())
                    .col(ColumnDef::new(A::AtMs).big_integer().not_null())
                    .col(ColumnDef::new(A::OperatorId).string().null())
                    .col(ColumnDef::new(A::OperatorName).string().not_null())
                    .col(ColumnDef::new(A::Action).string().not_null())
                    .col(ColumnDef::new(A::Target).string().not_null())
                    .col(ColumnDef::new(A::ExperienceId).string().null())
                    .col(ColumnDef::new(A::Detail).text().not_null())
                    .to_owned(),
            )
            .await?;
        for (name, columns) in [
            ("idx_audit_log_at", vec![A::AtMs, A::Id]),
            ("idx_audit_log_experience", vec![A::ExperienceId, A::AtMs]),
        ] {
            let mut index = Index::create();
            index.name(name).table(A::Table);
            for column in columns {
                index.col(column);
            }
            manager.create_index(index.to_owned()).await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(Table::drop().table(AuditLog::Table).to_owned())
            .await?;
        manager
            .drop_table(Table::drop().table(Operators::Table).to_owned())
            .await
    }
}

#[derive(DeriveIden)]
enum Operators {
    Table,
    Id,
    Name,
    Role,
    TokenHash,
    CreatedAtMs,
    CreatedBy,
    RevokedAtMs,
}

#[derive(DeriveIden)]
enum AuditLog {
    Table,
    Id,
    AtMs,
    OperatorId,
    OperatorName,
    Action,
    Target,
    ExperienceId,
    Detail,
}
