//! Webhooks: the organiser's endpoints and what was sent to them.
//! - `webhooks`: one endpoint (`url`, the `events` it takes as a
//!   comma-separated list), its signing `secret` sealed with the server's
//!   key, whether it is `enabled` (an endpoint that kept failing is
//!   disabled, with `disabled_reason`), and since when it has been failing
//!   (`failing_since_ms`, cleared by a delivery that succeeds).
//! - `webhook_deliveries`: one event for one endpoint. Its `id` is the
//!   `webhook-id` the endpoint sees on every attempt; `event_id` is the
//!   event's own (the same for every endpoint); `payload` is the body,
//!   fixed when the event happened; `session_id` names the guest's
//!   session it is about (erasure removes its deliveries). `status` is
//!   `PENDING`, `DELIVERED` or `FAILED`; `attempts`, `next_attempt_at_ms`,
//!   and the last answer (`last_status`, `last_error`, `last_latency_ms`);
//!   `lease_token` and `lease_until_ms` fence the instance sending it.
//! - A partial index over the pending deliveries in their order (the
//!   sender's claim walks only it), and one per endpoint for its log.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        use WebhookDeliveries as D;
        use Webhooks as W;
        manager
            .create_table(
                Table::create()
                    .table(W::Table)
                    .col(ColumnDef::new(W::Id).text().not_null().primary_key())
                    .col(ColumnDef::new(W::Url).text().not_null())
                    .col(ColumnDef::new(W::Events).text().not_null())
                    .col(ColumnDef::new(W::Secret).text().not_null())
                    .col(
                        ColumnDef::new(W::Enabled)
                            .boolean()
                            .not_null()
                            .default(true),
                    )
                    .col(ColumnDef::new(W::DisabledReason).text().null())
                    .col(ColumnDef::new(W::FailingSinceMs).big_integer().null())
                    .col(ColumnDef::new(W::CreatedAtMs).big_integer().not_null())
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table(D::Table)
                    .col(ColumnDef::new(D::Id).text().not_null().primary_key())
                    .col(ColumnDef::new(D::WebhookId).text().not_null())
                    .col(ColumnDef::new(D::EventId).text().not_null())
                    .col(ColumnDef::new(D::Event).text().not_null())
                    .col(ColumnDef::new(D::SessionId).text().null())
                    .col(ColumnDef::new(D::Payload).text().not_null())
                    .col(ColumnDef::new(D::Status).text().not_null())
                    .col(ColumnDef::new(D::Attempts).integer().not_null().default(0))
                    .col(ColumnDef::new(D::LastStatus).integer().null())
                    .col(ColumnDef::new(D::LastError).text().null())
                    .col(ColumnDef::new(D::LastLatencyMs).integer().null())
                    .col(ColumnDef::new(D::LeaseToken).text().null())
                    .col(ColumnDef::new(D::LeaseUntilMs).big_integer().null())
                    .col(ColumnDef::new(D::NextAttemptAtMs).big_integer().not_null())
                    .col(ColumnDef::new(D::CreatedAtMs).big_integer().not_null())
                    .col(ColumnDef::new(D::UpdatedAtMs).big_integer().not_null())
                    .col(ColumnDef::new(D::DeliveredAtMs).big_integer().null())
                    .to_owned(),
            )
            .await?;
        let db = manager.get_connection();
        db.execute_unprepared(
            "CREATE INDEX webhook_deliveries_pending \
             ON webhook_deliveries (next_attempt_at_ms, created_at_ms) WHERE status = 'PENDING'",
        )
        .await?;
        db.execute_unprepared(
            "CREATE INDEX webhook_deliveries_by_webhook \
             ON webhook_deliveries (webhook_id, created_at_ms)",
        )
        .await?;
        db.execute_unprepared(
            "CREATE INDEX webhook_deliveries_by_session ON webhook_deliveries (session_id)",
        )
        .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(Table::drop().table(WebhookDeliveries::Table).to_owned())
            .await?;
        manager
            .drop_table(Table::drop().table(Webhooks::Table).to_owned())
            .await?;
        Ok(())
    }
}

#[derive(DeriveIden)]
enum Webhooks {
    Table,
    Id,
    Url,
    Events,
    Secret,
    Enabled,
    DisabledReason,
    FailingSinceMs,
    CreatedAtMs,
}

#[derive(DeriveIden)]
enum WebhookDeliveries {
    Table,
    Id,
    WebhookId,
    EventId,
    Event,
    SessionId,
    Payload,
    Status,
    Attempts,
    LastStatus,
    LastError,
    LastLatencyMs,
    LeaseToken,
    LeaseUntilMs,
    NextAttemptAtMs,
    CreatedAtMs,
    UpdatedAtMs,
    DeliveredAtMs,
}
