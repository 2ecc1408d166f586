//! The AI providers as the database knows them: each instance writes its
//! providers at start ([`Store::register_providers`]); the claim reads a
//! provider's `max_in_flight` with its experiences, and experience
//! creation checks that a named provider exists. Every instance must be
//! given the same providers file: the last one to start wins. The slots in
//! use on them are the ledger's ([`super::ledger`]).

use sea_orm::ConnectionTrait;

use super::entities::sagas;
use super::{Store, StoreResult};
use crate::domain::policy::EpochMs;

/// A provider as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderRow {
    pub name: String,
    pub kind: String,
    pub max_in_flight: Option<i32>,
    pub rate_limit: Option<String>,
}

/// One experience's part of a provider, for operators.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExperienceShare {
    pub slug: String,
    pub weight: i32,
    pub max_in_flight: i32,
    /// Slots in use: rows of the ledger (see [`super::ledger`]).
    pub in_flight: i64,
    /// AI_PENDING sagas nobody holds that are not past their deadline
    /// (queued, or backing off).
    pub queued: i64,
}

impl Store {
    /// Writes this instance's providers (a provider no longer configured
    /// stays: its experiences' sagas wait, and the dispatcher says why).
    pub async fn register_providers(&self, rows: &[ProviderRow], now: EpochMs) -> StoreResult<()> {
        let tx = self.write_tx().await?;
        for row in rows {
            tx.execute_raw(self.sql(
                "INSERT INTO providers (name, kind, max_in_flight, rate_limit, updated_at_ms) \
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT (name) DO UPDATE SET \
                 kind = excluded.kind, max_in_flight = excluded.max_in_flight, \
                 rate_limit = excluded.rate_limit, updated_at_ms = excluded.updated_at_ms",
                vec![
                    row.name.clone().into(),
                    row.kind.clone().into(),
                    row.max_in_flight.into(),
                    row.rate_limit.clone().into(),
                    now.into(),
                ],
            ))
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Every provider, by name.
    pub async fn providers(&self) -> StoreResult<Vec<ProviderRow>> {
        let rows = self
            .db()
            .query_all_raw(self.sql(
                "SELECT name, kind, max_in_flight, rate_limit FROM providers ORDER BY name",
                vec![],
            ))
            .await?;
        rows.iter()
            .map(|r| {
                Ok(ProviderRow {
                    name: r.try_get_by_index(0)?,
                    kind: r.try_get_by_index(1)?,
                    max_in_flight: r.try_get_by_index(2)?,
                    rate_limit: r.try_get_by_index(3)?,
                })
            })
            .collect::<Result<_, sea_orm::DbErr>>()
            .map_err(Into::into)
    }

    /// The experiences on `provider`, oldest first, with their slots in use
    /// and their queues.
    pub async fn provider_shares(
        &self,
        provider: &str,
        now: EpochMs,
    ) -> StoreResult<Vec<(String, ExperienceShare)>> {
        let slots = super::ledger::slots_in_use(self.db(), Some(provider), now).await?;
        let runnable = super::sagas::RUNNABLE;
        let rows = self
            .db()
            .query_all_raw(self.sql(
                &format!(
                    "SELECT e.id, e.slug, e.weight, e.max_in_flight, \
                     (SELECT COUNT(*) FROM sagas s WHERE s.experience_id = e.id \
                      AND {runnable} AND s.step = 'AI_PENDING' \
                      AND s.lock_token IS NULL AND s.deadline_at_ms >= $2) \
                     FROM experiences e WHERE e.provider = $1 ORDER BY e.created_at_ms, e.id"
                ),
                vec![provider.into(), now.into()],
            ))
            .await?;
        rows.iter()
            .map(|r| {
                let id: String = r.try_get_by_index(0)?;
                let used = slots.of(provider, &id).in_use;
                Ok((
                    id,
                    ExperienceShare {
                        slug: r.try_get_by_index(1)?,
                        weight: r.try_get_by_index(2)?,
                        max_in_flight: r.try_get_by_index(3)?,
                        in_flight: used,
                        queued: r.try_get_by_index(4)?,
                    },
                ))
            })
            .collect::<Result<_, sea_orm::DbErr>>()
            .map_err(Into::into)
    }

    /// Where an AI_PENDING saga waiting for a slot stands in its
    /// experience's queue (1: next); None while it holds a slot.
    pub async fn queue_position(
        &self,
        saga: &sagas::Model,
        now: EpochMs,
    ) -> StoreResult<Option<i64>> {
        // A saga someone holds, or whose lease ran out (it resumes in the
        // slots it holds), is not in the queue.
        if saga.lock_token.is_some() {
            return Ok(None);
        }
        let runnable = super::sagas::RUNNABLE;
        let row = self
            .db()
            .query_one_raw(self.sql(
                &format!(
                    "SELECT COUNT(*) FROM sagas WHERE experience_id = $1 AND {runnable} \
                     AND step = 'AI_PENDING' AND lock_token IS NULL AND deadline_at_ms >= $2 \
                     AND (created_at_ms < $3 OR (created_at_ms = $3 AND id < $4))"
                ),
                vec![
                    saga.experience_id.clone().into(),
                    now.into(),
                    saga.created_at_ms.into(),
                    saga.id.clone().into(),
                ],
            ))
            .await?;
        let ahead = row
            .map(|r| r.try_get_by_index::<i64>(0))
            .transpose()?
            .unwrap_or(0);
        Ok(Some(ahead + 1))
    }
}
