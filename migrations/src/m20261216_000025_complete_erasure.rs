//! Erasure that leaves nothing behind (issue 45).
//! - `kept_objects`: every media-store key a keep is about to write for a
//!   saga (a result file, its thumbnail), recorded before the object is
//!   written, under the saga's lease. Forgetting a session queues every key
//!   its rows name here too, and the purge deletes exactly what is listed
//!   (also what a keep cut short left: no content names those). A row goes
//!   once its object is deleted.
//! - `photos.swept_at_ms`: when the orphan sweep found the photo named by
//!   no saga. From then on no new submission may name it; once no
//!   submission that read it before can still commit, it is given up (its
//!   object deleted by the purge, then its row), unless a saga names it by
//!   then. A partial index holds only the swept photos.
//! - Sessions forgotten before this: what their fan-out calls and aborts
//!   said is blanked, and those whose calls still name kept files (the
//!   purge never read them) are queued for the purge again, which deletes
//!   the files and blanks the contents.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(KeptObjects::Table)
                    .col(
                        ColumnDef::new(KeptObjects::ObjectKey)
                            .text()
                            .not_null()
                            .primary_key(),
                    )
                    .col(ColumnDef::new(KeptObjects::SagaId).text().not_null())
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("kept_objects_by_saga")
                    .table(KeptObjects::Table)
                    .col(KeptObjects::SagaId)
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(Photos::Table)
                    .add_column(ColumnDef::new(Photos::SweptAtMs).big_integer().null())
                    .to_owned(),
            )
            .await?;
        // Only the few photos the sweep is handling: every round reads them.
        manager
            .get_connection()
            .execute_unprepared(
                "CREATE INDEX photos_swept ON photos (swept_at_ms) WHERE swept_at_ms IS NOT NULL",
            )
            .await?;
        for repair in [
            "UPDATE sessions SET objects_left = true, purge_claim_until_ms = NULL \
             WHERE forgotten_at_ms IS NOT NULL AND objects_left = false AND EXISTS \
             (SELECT 1 FROM ai_calls c JOIN sagas g ON g.id = c.saga_id \
              WHERE g.session_id = sessions.id AND c.content IS NOT NULL AND c.content <> '[]')",
            "UPDATE ai_calls SET error = NULL WHERE error IS NOT NULL AND saga_id IN \
             (SELECT g.id FROM sagas g JOIN sessions s ON s.id = g.session_id \
              WHERE s.forgotten_at_ms IS NOT NULL)",
            "UPDATE sagas SET abort_detail = NULL WHERE abort_detail IS NOT NULL \
             AND session_id IN (SELECT id FROM sessions WHERE forgotten_at_ms IS NOT NULL)",
        ] {
            manager.get_connection().execute_unprepared(repair).await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .get_connection()
            .execute_unprepared("DROP INDEX IF EXISTS photos_swept")
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(Photos::Table)
                    .drop_column(Photos::SweptAtMs)
                    .to_owned(),
            )
            .await?;
        manager
            .drop_table(Table::drop().table(KeptObjects::Table).to_owned())
            .await
    }
}

#[derive(DeriveIden)]
enum KeptObjects {
    Table,
    ObjectKey,
    SagaId,
}

#[derive(DeriveIden)]
enum Photos {
    Table,
    SweptAtMs,
}
