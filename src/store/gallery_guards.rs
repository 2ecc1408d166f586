//! The gallery guard (`gallery_guards`): how many PINs were checked
//! against each PIN gallery, over every client address and every
//! instance, whether that gallery is locked for it, and whether its PIN
//! turned out to be an outdated one (fewer than 6 digits). Each change is
//! one conditional statement, so the ceiling holds across instances. A row
//! is about one PIN, named by the salt of its stored hash
//! ([`crate::domain::guests::pin_salt`]): a new PIN starts afresh.

use std::collections::HashMap;

use sea_orm::ConnectionTrait;

use super::{Store, StoreResult};
use crate::domain::guests::{pin_salt, GuessCeiling};
use crate::domain::policy::EpochMs;

/// What the guard holds of a gallery's current PIN.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GalleryGuard {
    /// PINs checked in the current window.
    pub guesses: i32,
    /// Locked until then (it may be past).
    pub locked_until_ms: Option<EpochMs>,
    /// The PIN was given right with fewer than 6 digits.
    pub outdated_pin: bool,
}

impl GalleryGuard {
    /// Until when the gallery is locked at `now`, if it is.
    pub fn locked_at(&self, now: EpochMs) -> Option<EpochMs> {
        self.locked_until_ms.filter(|until| *until > now)
    }
}

/// What taking a guess gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PinGuess {
    /// Check the PIN: it is the `guesses`-th of its window. When it
    /// reached the ceiling, the gallery is locked from now on
    /// (`locks_until`), this guess still answered.
    Check {
        guesses: i32,
        locks_until: Option<EpochMs>,
    },
    /// The gallery is locked until then: answer without checking.
    Locked { until_ms: EpochMs },
}

impl Store {
    /// The guard of the gallery `experience_id` for its current PIN (whose
    /// stored hash is `stored_pin`); the default when nothing was guessed
    /// at this PIN.
    pub async fn gallery_guard(
        &self,
        experience_id: &str,
        stored_pin: &str,
    ) -> StoreResult<GalleryGuard> {
        let row = self
            .db()
            .query_one_raw(self.sql(
                "SELECT guesses, locked_until_ms, outdated_pin_at_ms FROM gallery_guards \
                 WHERE experience_id = $1 AND pin_salt = $2",
                vec![experience_id.into(), pin_salt(stored_pin).into()],
            ))
            .await?;
        let Some(row) = row else {
            return Ok(GalleryGuard::default());
        };
        Ok(GalleryGuard {
            guesses: row.try_get_by_index(0)?,
            locked_until_ms: row.try_get_by_index(1)?,
            outdated_pin: row.try_get_by_index::<Option<i64>>(2)?.is_some(),
        })
    }

    /// Takes one guess at the gallery `experience_id`'s current PIN
    /// (`stored_pin`) at `now`, within `ceiling`: a window that is over, a
    /// lock that ended or a new PIN start a new window; the guess that
    /// reaches the ceiling locks the gallery for the ceiling's period. One
    /// statement, atomic on every backend and across instances.
    pub async fn take_pin_guess(
        &self,
        experience_id: &str,
        stored_pin: &str,
        now: EpochMs,
        ceiling: GuessCeiling,
    ) -> StoreResult<PinGuess> {
        // $1 experience, $2 PIN, $3 now, $4 the ceiling, $5 its period.
        const FRESH: &str = "(gallery_guards.pin_salt <> $2 \
             OR gallery_guards.window_started_at_ms + $5 <= $3 \
             OR gallery_guards.locked_until_ms <= $3)";
        let taken = self
            .write_returning(self.sql(
                &format!(
                    "INSERT INTO gallery_guards (experience_id, pin_salt, window_started_at_ms, \
                       guesses, locked_until_ms, outdated_pin_at_ms) \
                     VALUES ($1, $2, $3, 1, CASE WHEN $4 <= 1 THEN $3 + $5 END, NULL) \
                     ON CONFLICT (experience_id) DO UPDATE SET \
                       pin_salt = $2, \
                       window_started_at_ms = CASE WHEN {FRESH} THEN $3 \
                         ELSE gallery_guards.window_started_at_ms END, \
                       guesses = CASE WHEN {FRESH} THEN 1 ELSE gallery_guards.guesses + 1 END, \
                       locked_until_ms = CASE WHEN \
                         (CASE WHEN {FRESH} THEN 1 ELSE gallery_guards.guesses + 1 END) >= $4 \
                         THEN $3 + $5 END, \
                       outdated_pin_at_ms = CASE WHEN gallery_guards.pin_salt = $2 \
                         THEN gallery_guards.outdated_pin_at_ms END \
                     WHERE gallery_guards.pin_salt <> $2 \
                       OR gallery_guards.locked_until_ms IS NULL \
                       OR gallery_guards.locked_until_ms <= $3 \
                     RETURNING guesses, locked_until_ms"
                ),
                vec![
                    experience_id.into(),
                    pin_salt(stored_pin).into(),
                    now.into(),
                    i64::from(ceiling.guesses).into(),
                    ceiling.period_ms.into(),
                ],
            ))
            .await?;
        if let Some(row) = taken.first() {
            return Ok(PinGuess::Check {
                guesses: row.try_get_by_index(0)?,
                locks_until: row.try_get_by_index(1)?,
            });
        }
        let guard = self.gallery_guard(experience_id, stored_pin).await?;
        Ok(PinGuess::Locked {
            until_ms: guard.locked_until_ms.unwrap_or(now + ceiling.period_ms),
        })
    }

    /// Records that the gallery's current PIN (`stored_pin`) was given
    /// right with fewer than 6 digits: it opens nothing, and /ops says so
    /// until a new PIN is set.
    pub async fn mark_pin_outdated(
        &self,
        experience_id: &str,
        stored_pin: &str,
        now: EpochMs,
    ) -> StoreResult<()> {
        self.write_one(self.sql(
            "INSERT INTO gallery_guards (experience_id, pin_salt, window_started_at_ms, \
               guesses, locked_until_ms, outdated_pin_at_ms) VALUES ($1, $2, $3, 0, NULL, $3) \
             ON CONFLICT (experience_id) DO UPDATE SET outdated_pin_at_ms = $3 \
             WHERE gallery_guards.pin_salt = $2 AND gallery_guards.outdated_pin_at_ms IS NULL",
            vec![
                experience_id.into(),
                pin_salt(stored_pin).into(),
                now.into(),
            ],
        ))
        .await?;
        Ok(())
    }

    /// The guard of every PIN gallery that has one, for its current PIN,
    /// by experience id.
    pub(super) async fn gallery_guards(&self) -> StoreResult<HashMap<String, GalleryGuard>> {
        let rows = self
            .db()
            .query_all_raw(self.sql(
                "SELECT g.experience_id, g.pin_salt, e.gallery_pin_hash, g.guesses, \
                   g.locked_until_ms, g.outdated_pin_at_ms \
                 FROM gallery_guards g JOIN experiences e ON e.id = g.experience_id \
                 WHERE e.gallery = 'pin'",
                vec![],
            ))
            .await?;
        let mut guards = HashMap::new();
        for row in rows {
            let salt: String = row.try_get_by_index(1)?;
            let stored: Option<String> = row.try_get_by_index(2)?;
            if pin_salt(stored.as_deref().unwrap_or_default()) != salt {
                continue;
            }
            guards.insert(
                row.try_get_by_index(0)?,
                GalleryGuard {
                    guesses: row.try_get_by_index(3)?,
                    locked_until_ms: row.try_get_by_index(4)?,
                    outdated_pin: row.try_get_by_index::<Option<i64>>(5)?.is_some(),
                },
            );
        }
        Ok(guards)
    }
}
