//! What every instance shares about the AI provider, each change one short
//! statement: its circuit breaker (one row of `provider_breakers`; no row
//! is closed; the rules are in [`crate::domain::breaker`]) and its request
//! rate limit (`provider_rates`).

use sea_orm::ConnectionTrait;

use super::{Store, StoreResult};
use crate::domain::breaker::Breaker;
use crate::domain::policy::EpochMs;

/// The provider of the experiences today: the one AI provider configured
/// for the instance.
pub const DEFAULT_PROVIDER: &str = "default";

impl Store {
    /// The breaker of `provider` (closed when it has no row).
    pub async fn breaker(&self, provider: &str) -> StoreResult<Breaker> {
        let row = self
            .db()
            .query_one_raw(self.sql(
                "SELECT open_until_ms, probe_until_ms FROM provider_breakers WHERE provider = $1",
                vec![provider.into()],
            ))
            .await?;
        Ok(match row {
            Some(row) => Breaker {
                open_until_ms: row.try_get_by_index(0)?,
                probe_until_ms: row.try_get_by_index(1)?,
            },
            None => Breaker::default(),
        })
    }

    /// Opens the breaker until `until` (`by`: "unavailable" or "operator").
    /// An automatic opening never shortens an opening already longer (an
    /// operator's for an hour stays an hour); an operator's sets it as said.
    pub async fn open_breaker(
        &self,
        provider: &str,
        until: EpochMs,
        by: &str,
        now: EpochMs,
    ) -> StoreResult<()> {
        let keep_longer = if by == "operator" {
            "excluded.open_until_ms"
        } else {
            "CASE WHEN provider_breakers.open_until_ms > excluded.open_until_ms \
             THEN provider_breakers.open_until_ms ELSE excluded.open_until_ms END"
        };
        self.write_one(self.sql(
            &format!(
                "INSERT INTO provider_breakers (provider, open_until_ms, probe_until_ms, opened_by, \
                 updated_at_ms) VALUES ($1, $2, NULL, $3, $4) \
                 ON CONFLICT (provider) DO UPDATE SET open_until_ms = {keep_longer}, \
                 probe_until_ms = NULL, opened_by = excluded.opened_by, \
                 updated_at_ms = excluded.updated_at_ms"
            ),
            vec![provider.into(), until.into(), by.into(), now.into()],
        ))
        .await?;
        Ok(())
    }

    /// A probe (or any call) failed while a probe was out: open again until
    /// `until`. Changes nothing when no probe is out.
    pub async fn probe_failed(
        &self,
        provider: &str,
        until: EpochMs,
        now: EpochMs,
    ) -> StoreResult<u64> {
        self.write_one(self.sql(
            "UPDATE provider_breakers SET open_until_ms = $2, probe_until_ms = NULL, \
             opened_by = 'unavailable', updated_at_ms = $3 \
             WHERE provider = $1 AND open_until_ms IS NOT NULL AND probe_until_ms IS NOT NULL",
            vec![provider.into(), until.into(), now.into()],
        ))
        .await
    }

    /// Closes the breaker (the provider answered, or an operator said so).
    pub async fn close_breaker(&self, provider: &str, now: EpochMs) -> StoreResult<u64> {
        self.write_one(self.sql(
            "UPDATE provider_breakers SET open_until_ms = NULL, probe_until_ms = NULL, \
             opened_by = NULL, updated_at_ms = $2 \
             WHERE provider = $1 AND open_until_ms IS NOT NULL",
            vec![provider.into(), now.into()],
        ))
        .await
    }

    /// Takes the one probe of an open breaker whose cool-down is over: true
    /// for exactly one caller among all instances until `probe_until`.
    pub async fn take_probe(
        &self,
        provider: &str,
        probe_until: EpochMs,
        now: EpochMs,
    ) -> StoreResult<bool> {
        let taken = self
            .write_one(self.sql(
                "UPDATE provider_breakers SET probe_until_ms = $2, updated_at_ms = $3 \
                 WHERE provider = $1 AND open_until_ms IS NOT NULL AND open_until_ms <= $3 \
                 AND (probe_until_ms IS NULL OR probe_until_ms <= $3)",
                vec![provider.into(), probe_until.into(), now.into()],
            ))
            .await?;
        Ok(taken == 1)
    }
}

impl Store {
    /// Takes one request of the provider's rate limit (GCRA: one request
    /// every `emission_ms`, bursts up to `tolerance_ms / emission_ms + 1`),
    /// shared by every instance in one conditional statement. `Err(wait)`:
    /// refused, the next request fits in `wait` ms.
    pub async fn take_provider_request(
        &self,
        provider: &str,
        now: EpochMs,
        emission_ms: i64,
        tolerance_ms: i64,
    ) -> StoreResult<Result<(), i64>> {
        let admitted = self
            .write_returning(self.sql(
                "INSERT INTO provider_rates (provider, tat_ms) VALUES ($1, $2 + $3) \
                 ON CONFLICT (provider) DO UPDATE SET tat_ms = \
                 (CASE WHEN provider_rates.tat_ms > $2 THEN provider_rates.tat_ms ELSE $2 END) + $3 \
                 WHERE provider_rates.tat_ms - $2 <= $4 RETURNING tat_ms",
                vec![
                    provider.into(),
                    now.into(),
                    emission_ms.into(),
                    tolerance_ms.into(),
                ],
            ))
            .await?;
        if !admitted.is_empty() {
            return Ok(Ok(()));
        }
        let tat: Option<i64> = self
            .db()
            .query_one_raw(self.sql(
                "SELECT tat_ms FROM provider_rates WHERE provider = $1",
                vec![provider.into()],
            ))
            .await?
            .map(|r| r.try_get_by_index(0))
            .transpose()?;
        Ok(Err(tat.map_or(emission_ms, |tat| {
            (tat - now - tolerance_ms).max(1)
        })))
    }
}
