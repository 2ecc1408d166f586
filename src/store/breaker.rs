//! What every instance shares about the AI provider, each change one short
//! statement: its circuit breaker (one row of `provider_breakers`; no row
//! is closed; the rules are in [`crate::domain::breaker`]; closing it on
//! the provider's answer is a read and a conditional write on the row it
//! read) and its request rate limit (`provider_rates`).

use sea_orm::ConnectionTrait;

use super::{Store, StoreResult};
use crate::domain::breaker::{Breaker, Opener, Probe};
use crate::domain::policy::EpochMs;

/// The provider of the experiences today: the one AI provider configured
/// for the instance.
pub const DEFAULT_PROVIDER: &str = "default";

impl Store {
    /// The breaker of `provider` (closed when it has no row).
    pub async fn breaker(&self, provider: &str) -> StoreResult<Breaker> {
        Ok(self.breaker_and_opener(provider).await?.0)
    }

    /// The breaker of `provider` and who opened it (None while closed).
    pub async fn breaker_and_opener(
        &self,
        provider: &str,
    ) -> StoreResult<(Breaker, Option<Opener>)> {
        let row = self
            .db()
            .query_one_raw(self.sql(
                "SELECT open_until_ms, probe_until_ms, opened_by FROM provider_breakers \
                 WHERE provider = $1",
                vec![provider.into()],
            ))
            .await?;
        Ok(match row {
            Some(row) => {
                let breaker = Breaker {
                    open_until_ms: row.try_get_by_index(0)?,
                    probe_until_ms: row.try_get_by_index(1)?,
                };
                let opener: Option<String> = row.try_get_by_index(2)?;
                let opener = opener.as_deref().and_then(Opener::parse);
                (breaker, opener.filter(|_| breaker.is_open()))
            }
            None => (Breaker::default(), None),
        })
    }

    /// Opens the breaker until `until`, as `by`; any probe out is no longer
    /// the breaker's. An automatic opening never shortens an opening
    /// already longer (an operator's for an hour stays an hour, and stays
    /// the operator's); an operator's sets it as said
    /// ([`Opener::may_shorten`]).
    pub async fn open_breaker(
        &self,
        provider: &str,
        until: EpochMs,
        by: Opener,
        now: EpochMs,
    ) -> StoreResult<()> {
        let (open_until, opened_by) = if by.may_shorten() {
            (
                "excluded.open_until_ms".to_owned(),
                "excluded.opened_by".to_owned(),
            )
        } else {
            let longer = |column: &str| {
                format!(
                    "CASE WHEN provider_breakers.open_until_ms > excluded.open_until_ms \
                     THEN provider_breakers.{column} ELSE excluded.{column} END"
                )
            };
            (longer("open_until_ms"), longer("opened_by"))
        };
        self.write_one(self.sql(
            &format!(
                "INSERT INTO provider_breakers (provider, open_until_ms, probe_until_ms, opened_by, \
                 updated_at_ms) VALUES ($1, $2, NULL, $3, $4) \
                 ON CONFLICT (provider) DO UPDATE SET open_until_ms = {open_until}, \
                 probe_until_ms = NULL, opened_by = {opened_by}, \
                 updated_at_ms = excluded.updated_at_ms"
            ),
            vec![
                provider.into(),
                until.into(),
                by.as_str().into(),
                now.into(),
            ],
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
        now: EpochMs,
    ) -> StoreResult<u64> {
        self.write_one(self.sql(
            "UPDATE provider_breakers SET open_until_ms = $2, probe_until_ms = NULL, \
             opened_by = $4, updated_at_ms = $3 \
             WHERE provider = $1 AND open_until_ms IS NOT NULL AND probe_until_ms IS NOT NULL",
            vec![
                provider.into(),
                until.into(),
                now.into(),
                Opener::Unavailable.as_str().into(),
            ],
        ))
        .await
    }

    /// An operator closes the breaker, whoever opened it.
    pub async fn close_breaker(&self, provider: &str, now: EpochMs) -> StoreResult<u64> {
        self.write_one(self.sql(
            "UPDATE provider_breakers SET open_until_ms = NULL, probe_until_ms = NULL, \
             opened_by = NULL, updated_at_ms = $2 \
             WHERE provider = $1 AND open_until_ms IS NOT NULL",
            vec![provider.into(), now.into()],
        ))
        .await
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
                 opened_by = NULL, updated_at_ms = $4 \
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
