//! What every instance shares about the AI provider, each change one short
//! statement: its circuit breaker (one row of `provider_breakers`; no row
//! is closed; the rules are in [`crate::domain::breaker`]; closing it on
//! the provider's answer is a read and a conditional write on the row it
//! read) and its request rate limit (`provider_rates`).

use sea_orm::ConnectionTrait;

use super::{Store, StoreResult};
use crate::domain::audit::AuditEntry;
use crate::domain::breaker::{Breaker, Opener, Probe};
use crate::domain::policy::EpochMs;

/// A provider's breaker as operators see it: the state, who opened it and
/// why (both None while closed).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BreakerRow {
    pub breaker: Breaker,
    pub opener: Option<Opener>,
    pub reason: Option<String>,
}

/// The provider of the experiences today: the one AI provider configured
/// for the instance.
pub const DEFAULT_PROVIDER: &str = "default";

impl Store {
    /// The breaker of `provider` (closed when it has no row).
    pub async fn breaker(&self, provider: &str) -> StoreResult<Breaker> {
        Ok(self.breaker_row(provider).await?.breaker)
    }

    /// The breaker of `provider`, who opened it and why (None while
    /// closed).
    pub async fn breaker_row(&self, provider: &str) -> StoreResult<BreakerRow> {
        let row = self
            .db()
            .query_one_raw(self.sql(
                "SELECT open_until_ms, probe_until_ms, opened_by, reason, paused_until_ms \
                 FROM provider_breakers WHERE provider = $1",
                vec![provider.into()],
            ))
            .await?;
        let Some(row) = row else {
            return Ok(BreakerRow::default());
        };
        let breaker = Breaker {
            open_until_ms: row.try_get_by_index(0)?,
            probe_until_ms: row.try_get_by_index(1)?,
            paused_until_ms: row.try_get_by_index(4)?,
        };
        let opener: Option<String> = row.try_get_by_index(2)?;
        let reason: Option<String> = row.try_get_by_index(3)?;
        Ok(BreakerRow {
            breaker,
            opener: opener
                .as_deref()
                .and_then(Opener::parse)
                .filter(|_| breaker.is_open()),
            reason: reason.filter(|_| breaker.is_open()),
        })
    }

    /// Opens the breaker until `until`, as `by`, for `reason` (the words
    /// operators read); any probe out is no longer the breaker's. An
    /// automatic opening never shortens an opening already longer (an
    /// operator's for an hour stays an hour, and stays the operator's,
    /// with its reason); an operator's sets it as said
    /// ([`Opener::may_shorten`]).
    pub async fn open_breaker(
        &self,
        provider: &str,
        until: EpochMs,
        by: Opener,
        reason: &str,
        audit: Option<&AuditEntry>,
        now: EpochMs,
    ) -> StoreResult<()> {
        let kept = |column: &str| {
            if by.may_shorten() {
                format!("excluded.{column}")
            } else {
                format!(
                    "CASE WHEN provider_breakers.open_until_ms > excluded.open_until_ms \
                     THEN provider_breakers.{column} ELSE excluded.{column} END"
                )
            }
        };
        let (open_until, opened_by, why) =
            (kept("open_until_ms"), kept("opened_by"), kept("reason"));
        let stmt = self.sql(
            &format!(
                "INSERT INTO provider_breakers (provider, open_until_ms, probe_until_ms, opened_by, \
                 reason, updated_at_ms) VALUES ($1, $2, NULL, $3, $5, $4) \
                 ON CONFLICT (provider) DO UPDATE SET open_until_ms = {open_until}, \
                 probe_until_ms = NULL, opened_by = {opened_by}, reason = {why}, \
                 updated_at_ms = excluded.updated_at_ms"
            ),
            vec![
                provider.into(),
                until.into(),
                by.as_str().into(),
                now.into(),
                reason.into(),
            ],
        );
        self.write_one_audited(stmt, audit, now).await?;
        Ok(())
    }

    /// The provider named a wait: no request of any instance goes out
    /// before `until`. Never shortens a pause already longer.
    pub async fn pause_provider(
        &self,
        provider: &str,
        until: EpochMs,
        now: EpochMs,
    ) -> StoreResult<()> {
        self.write_one(self.sql(
            "INSERT INTO provider_breakers (provider, open_until_ms, probe_until_ms, opened_by, \
             paused_until_ms, updated_at_ms) VALUES ($1, NULL, NULL, NULL, $2, $3) \
             ON CONFLICT (provider) DO UPDATE SET paused_until_ms = \
             CASE WHEN provider_breakers.paused_until_ms > excluded.paused_until_ms \
             THEN provider_breakers.paused_until_ms ELSE excluded.paused_until_ms END, \
             updated_at_ms = excluded.updated_at_ms",
            vec![provider.into(), until.into(), now.into()],
        ))
        .await?;
        Ok(())
    }

    /// A probe (or any call) failed while a probe was out: open again until
    /// `until`, as the cool-down. Changes nothing when no probe is out.
    pub async fn probe_failed(
        &self,
        provider: &str,
        until: EpochMs,
        reason: &str,
        now: EpochMs,
    ) -> StoreResult<u64> {
        self.write_one(self.sql(
            "UPDATE provider_breakers SET open_until_ms = $2, probe_until_ms = NULL, \
             opened_by = $4, reason = $5, updated_at_ms = $3 \
             WHERE provider = $1 AND open_until_ms IS NOT NULL AND probe_until_ms IS NOT NULL",
            vec![
                provider.into(),
                until.into(),
                now.into(),
                Opener::Unavailable.as_str().into(),
                reason.into(),
            ],
        ))
        .await
    }

    /// An operator closes the breaker, whoever opened it, and lifts a wait
    /// the provider named (the instances that learnt it from the row lift
    /// it at their next claim).
    pub async fn close_breaker(
        &self,
        provider: &str,
        audit: Option<&AuditEntry>,
        now: EpochMs,
    ) -> StoreResult<u64> {
        let stmt = self.sql(
            "UPDATE provider_breakers SET open_until_ms = NULL, probe_until_ms = NULL, \
             opened_by = NULL, reason = NULL, paused_until_ms = NULL, updated_at_ms = $2 \
             WHERE provider = $1 AND (open_until_ms IS NOT NULL OR paused_until_ms IS NOT NULL)",
            vec![provider.into(), now.into()],
        );
        self.write_one_audited(stmt, audit, now).await
    }

    /// The provider answered a request sent at `sent_ms`: closes the
    /// breaker when [`Breaker::closed_by_answer`] says this answer is the
    /// one to `probe`'s, and the row is still what it decided on. True
    /// when it closed it.
    pub async fn close_by_answer(
        &self,
        provider: &str,
        probe: Probe,
        sent_ms: EpochMs,
        now: EpochMs,
    ) -> StoreResult<bool> {
        let breaker = self.breaker(provider).await?;
        let (Some(open_until), Some(probe_until)) = (breaker.open_until_ms, breaker.probe_until_ms)
        else {
            return Ok(false);
        };
        if !breaker.closed_by_answer(Some(probe), sent_ms) {
            return Ok(false);
        }
        let closed = self
            .write_one(self.sql(
                "UPDATE provider_breakers SET open_until_ms = NULL, probe_until_ms = NULL, \
                 opened_by = NULL, reason = NULL, updated_at_ms = $4 \
                 WHERE provider = $1 AND open_until_ms = $2 AND probe_until_ms = $3",
                vec![
                    provider.into(),
                    open_until.into(),
                    probe_until.into(),
                    now.into(),
                ],
            ))
            .await?;
        Ok(closed == 1)
    }

    /// Takes the one probe of an open breaker whose cool-down is over:
    /// true for exactly one caller among all instances until
    /// `probe.until_ms`, which then names the breaker's probe.
    pub async fn take_probe(&self, provider: &str, probe: Probe) -> StoreResult<bool> {
        let taken = self
            .write_one(self.sql(
                "UPDATE provider_breakers SET probe_until_ms = $2, updated_at_ms = $3 \
                 WHERE provider = $1 AND open_until_ms IS NOT NULL AND open_until_ms <= $3 \
                 AND (probe_until_ms IS NULL OR probe_until_ms <= $3)",
                vec![
                    provider.into(),
                    probe.until_ms.into(),
                    probe.taken_at_ms.into(),
                ],
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
