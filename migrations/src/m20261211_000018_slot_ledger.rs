//! The slot ledger (`ai_slots`): one row per AI call that may have a job
//! at a provider, the one place that says an AI slot is in use.
//!
//! A row is written in the short transaction that grants its slot (the
//! claim, or a fan-out saga taking a free slot), before the submit is sent,
//! and deleted only on evidence that no job runs in it: the provider
//! reported the job final, a cancel was confirmed, or the submit surely
//! created nothing. Nothing else frees a slot: not the saga's end, a lease
//! running out, a deadline or a crash.
//!
//! - `provider`, `experience_id`: the account the job runs on and the
//!   experience it counts against (kept as granted, whatever the
//!   experience says later).
//! - `saga_id`, `call_index`: the call. `base_key`, `key_attempt`: a
//!   submit under this row is sent with the key `ai_call_key(base_key,
//!   call_index, key_attempt)` (the saga's `ai_base_key` when the row was
//!   written: an operator's retry may give the saga a new one), so a row
//!   whose job id was never recorded is found again by re-sending that
//!   key. `job_id`: once known.
//! - `detached`: the saga no longer runs this call (it ended, or the call
//!   gave up on a job that may still run); whoever adopts it polls or
//!   cancels the job to its end. At most one attached row per call
//!   (`idx_ai_slots_call`). `adopt_token`, `adopted_until_ms`: the lease of
//!   the instance working on a detached row; `cancel_tried`: a cancel was
//!   sent once.
//!
//! It replaces `lingering_jobs` (its rows move here, detached) and
//! `sagas.slots`: a saga's slots are its rows. Sagas that held a lease in
//! AI_PENDING at the upgrade get a row for each call that may run (a
//! single call's, or a fan-out's RUNNING calls), so no running job is
//! forgotten by the upgrade.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let conn = manager.get_connection();
        conn.execute_unprepared(
            "CREATE TABLE ai_slots (\
             id TEXT NOT NULL PRIMARY KEY, \
             provider TEXT NOT NULL, \
             experience_id TEXT NOT NULL, \
             saga_id TEXT NOT NULL, \
             call_index INTEGER NOT NULL, \
             base_key TEXT NOT NULL, \
             key_attempt INTEGER NOT NULL, \
             job_id TEXT NULL, \
             detached BOOLEAN NOT NULL DEFAULT false, \
             adopt_token TEXT NULL, \
             adopted_until_ms BIGINT NOT NULL DEFAULT 0, \
             cancel_tried BOOLEAN NOT NULL DEFAULT false, \
             created_at_ms BIGINT NOT NULL, \
             updated_at_ms BIGINT NOT NULL)",
        )
        .await?;
        conn.execute_unprepared(
            "CREATE UNIQUE INDEX idx_ai_slots_call ON ai_slots (saga_id, call_index) \
             WHERE NOT detached",
        )
        .await?;
        conn.execute_unprepared(
            "CREATE INDEX idx_ai_slots_provider ON ai_slots (provider, experience_id)",
        )
        .await?;
        // What may run now: leased AI_PENDING sagas' calls, and the jobs
        // that lingered after their saga.
        conn.execute_unprepared(
            "INSERT INTO ai_slots (id, provider, experience_id, saga_id, call_index, \
             base_key, key_attempt, job_id, detached, created_at_ms, updated_at_ms) \
             SELECT 'm-' || s.id || '-0', e.provider, s.experience_id, s.id, 0, \
             s.ai_base_key, s.attempt_offset + s.attempts, s.ai_job_id, false, 0, 0 \
             FROM sagas s JOIN experiences e ON e.id = s.experience_id \
             WHERE s.step = 'AI_PENDING' AND s.lock_token IS NOT NULL AND e.ai_calls <= 1",
        )
        .await?;
        conn.execute_unprepared(
            "INSERT INTO ai_slots (id, provider, experience_id, saga_id, call_index, \
             base_key, key_attempt, job_id, detached, created_at_ms, updated_at_ms) \
             SELECT 'm-' || s.id || '-' || c.call_index, e.provider, s.experience_id, s.id, \
             c.call_index, s.ai_base_key, s.attempt_offset + c.attempts, c.job_id, false, 0, 0 \
             FROM ai_calls c JOIN sagas s ON s.id = c.saga_id \
             JOIN experiences e ON e.id = s.experience_id \
             WHERE s.step = 'AI_PENDING' AND s.lock_token IS NOT NULL AND e.ai_calls > 1 \
             AND c.status = 'RUNNING'",
        )
        .await?;
        conn.execute_unprepared(
            "INSERT INTO ai_slots (id, provider, experience_id, saga_id, call_index, \
             base_key, key_attempt, job_id, detached, cancel_tried, created_at_ms, \
             updated_at_ms) \
             SELECT 'l-' || provider || '-' || job_id, provider, experience_id, saga_id, -1, '', \
             0, job_id, true, cancel_tried, created_at_ms, created_at_ms FROM lingering_jobs",
        )
        .await?;
        conn.execute_unprepared("DROP TABLE lingering_jobs").await?;
        conn.execute_unprepared("ALTER TABLE sagas DROP COLUMN slots")
            .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let conn = manager.get_connection();
        conn.execute_unprepared("ALTER TABLE sagas ADD COLUMN slots INTEGER NOT NULL DEFAULT 1")
            .await?;
        conn.execute_unprepared(
            "CREATE TABLE lingering_jobs (\
             provider TEXT NOT NULL, job_id TEXT NOT NULL, saga_id TEXT NOT NULL, \
             experience_id TEXT NOT NULL, until_ms BIGINT NOT NULL, lock_token TEXT NULL, \
             locked_until_ms BIGINT NOT NULL DEFAULT 0, \
             cancel_tried BOOLEAN NOT NULL DEFAULT false, created_at_ms BIGINT NOT NULL, \
             PRIMARY KEY (provider, job_id))",
        )
        .await?;
        conn.execute_unprepared(
            "CREATE INDEX idx_lingering_jobs_experience ON lingering_jobs (experience_id)",
        )
        .await?;
        conn.execute_unprepared("DROP TABLE ai_slots").await?;
        Ok(())
    }
}
