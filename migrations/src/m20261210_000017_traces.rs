//! `sagas.trace_context` (nullable text): where the saga's next run joins
//! the traces (OpenTelemetry, W3C Trace Context). A submission stores the
//! `traceparent` of its HTTP request (`00-<trace id>-<span id>-<flags>`),
//! and each run's `saga` span is a child of it, so the request and every
//! step of the saga are one trace, whichever instance runs them and
//! however much later. A run that resumes a lost or handed-over lease, or
//! an operator's retry, marks it `link:<traceparent>`: that run starts a
//! new trace with a span link to the earlier one, and stores its own
//! `traceparent` for the runs after it. NULL: traces were off when the
//! saga was submitted.
//!
//! Numbered 17: 16 is the review step's migration.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(Sagas::Table)
                    .add_column(ColumnDef::new(Sagas::TraceContext).text().null())
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(Sagas::Table)
                    .drop_column(Sagas::TraceContext)
                    .to_owned(),
            )
            .await
    }
}

#[derive(DeriveIden)]
enum Sagas {
    Table,
    TraceContext,
}
