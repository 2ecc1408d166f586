//! Idempotency-Key records keep no secret in clear: from now on the key is
//! stored as a digest and a stored answer (which may carry a token the
//! request issued, such as a new participant's token) is sealed with a key
//! only its caller can derive. Records written before held both in clear;
//! they are deleted. A retry of a request made before the upgrade then runs
//! as a new request (for session creation, a second session).

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .get_connection()
            .execute_unprepared("DELETE FROM idempotency_records")
            .await?;
        Ok(())
    }

    async fn down(&self, _manager: &SchemaManager) -> Result<(), DbErr> {
        // Sealed records cannot be turned back into clear ones; they are
        // kept (an older binary reads them as answers it cannot replay).
        Ok(())
    }
}
