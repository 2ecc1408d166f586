//! The door of a PIN gallery: whether a request's `X-Gallery-Pin` opens
//! it, in this order:
//!
//! 1. no PIN: 401 `gallery_pin_required`;
//! 2. the client address past its own limit: 429 `rate_limited`
//!    (`RateLimits::check_gallery_pin`);
//! 3. the gallery locked: 429 `gallery_locked` until the lock ends, the
//!    right PIN too, so a guess learns nothing while it lasts;
//! 4. a PIN no gallery can have (not 4 to 12 digits): 401
//!    `gallery_pin_wrong` at once, with no hash and no guess counted;
//! 5. the PIN this gallery was last opened with on this instance: open;
//! 6. else one guess is taken from the gallery's ceiling, over every
//!    address and instance (`store::gallery_guards`: the guess that
//!    reaches it locks the gallery), and the slow hash checks it off the
//!    HTTP workers ([`PinChecks`]). A right PIN of fewer than 6 digits
//!    (set before 6 were required) opens nothing: 401
//!    `gallery_pin_outdated`, and /ops says so.
//!
//! New PINs (creating an experience, or changing its PIN) are hashed off
//! the HTTP workers the same way ([`GalleryPins::hash_new`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use actix_web::HttpRequest;
use sha2::{Digest, Sha256};
use tokio::sync::Semaphore;

use super::error::ApiError;
use super::AppState;
use crate::clock::rfc3339;
use crate::config::RateLimit;
use crate::domain::guests::{self, GuessCeiling, PinShape};
use crate::domain::policy::EpochMs;
use crate::store::entities::experiences;
use crate::store::gallery_guards::PinGuess;

/// Slow hashes (PBKDF2, about 50 ms of one core each) running at once.
pub const PIN_CHECKS_AT_ONCE: usize = 2;
/// Slow hashes waiting for a place at most; past that, a PIN check is
/// answered 503 `busy` with `Retry-After: 1` at once.
pub const PIN_CHECKS_WAITING: usize = 64;

/// The PIN galleries' door keeper: the PIN each gallery was last opened
/// with, the places for the slow hash, and the ceiling of guesses.
pub struct GalleryPins {
    /// The PIN each PIN gallery was last opened with on this instance, as
    /// a digest, beside the stored hash it opened: the slow hash runs once
    /// per gallery and PIN, not on every poll of every viewer. One entry
    /// per gallery (a new PIN replaces it).
    opened: Mutex<HashMap<String, (String, [u8; 32])>>,
    checks: PinChecks,
    /// None: `--gallery-pin-guesses off`.
    ceiling: Option<GuessCeiling>,
}

impl GalleryPins {
    /// The door keeper with `ceiling` (`--gallery-pin-guesses`).
    pub fn new(ceiling: RateLimit) -> GalleryPins {
        GalleryPins {
            opened: Mutex::default(),
            checks: PinChecks::new(),
            ceiling: match ceiling {
                RateLimit::Off => None,
                RateLimit::Every { count, per } => Some(GuessCeiling {
                    guesses: count.get(),
                    period_ms: per.as_millis().clamp(1, i64::MAX as u128) as i64,
                }),
            },
        }
    }

    /// The stored form of a new gallery PIN, hashed off the HTTP workers.
    pub async fn hash_new(&self, pin: &str) -> Result<String, ApiError> {
        let pin = pin.to_owned();
        self.checks
            .run(move || guests::hash_pin(&pin, rand::random()))
            .await
    }

    /// Whether `pin` is the one the gallery `slug` was last opened with
    /// here, while its stored hash is still `stored`.
    fn remembered(&self, slug: &str, stored: &str, pin: &str) -> bool {
        let digest: [u8; 32] = Sha256::digest(pin.as_bytes()).into();
        self.opened
            .lock()
            .map(|map| {
                map.get(slug)
                    .is_some_and(|(hash, d)| hash == stored && *d == digest)
            })
            .unwrap_or(false)
    }

    fn remember(&self, slug: &str, stored: &str, pin: &str) {
        let digest: [u8; 32] = Sha256::digest(pin.as_bytes()).into();
        if let Ok(mut map) = self.opened.lock() {
            map.insert(slug.to_owned(), (stored.to_owned(), digest));
        }
    }
}

/// The bounded place where slow hashes run: tokio's blocking threads, at
/// most [`PIN_CHECKS_AT_ONCE`] at a time, with [`PIN_CHECKS_WAITING`]
/// more waiting their turn. When that is full, [`ApiError::PinChecksFull`]
/// (503 `busy`) at once. The ceiling of guesses per gallery bounds what
/// reaches it: a flood of guesses is mostly answered 429 without a hash.
struct PinChecks {
    /// Places: running or waiting.
    admitted: Arc<Semaphore>,
    running: Arc<Semaphore>,
}

impl PinChecks {
    fn new() -> PinChecks {
        PinChecks {
            admitted: Arc::new(Semaphore::new(PIN_CHECKS_AT_ONCE + PIN_CHECKS_WAITING)),
            running: Arc::new(Semaphore::new(PIN_CHECKS_AT_ONCE)),
        }
    }

    /// Runs `work` on a blocking thread once a place is free. The places
    /// are held by the work itself, so a client that leaves does not free
    /// them while its hash still runs.
    async fn run<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, ApiError> {
        let place = self
            .admitted
            .clone()
            .try_acquire_owned()
            .map_err(|_| ApiError::PinChecksFull)?;
        let turn = self
            .running
            .clone()
            .acquire_owned()
            .await
            .map_err(|e| ApiError::Internal(e.to_string()))?;
        tokio::task::spawn_blocking(move || {
            let _held = (place, turn);
            work()
        })
        .await
        .map_err(|e| ApiError::Internal(format!("a PIN check failed: {e}")))
    }
}

/// Whether the request may see the PIN gallery `experience` (see the
/// module's order).
pub async fn open(
    state: &AppState,
    req: &HttpRequest,
    experience: &experiences::Model,
) -> Result<(), ApiError> {
    let pin = req
        .headers()
        .get("X-Gallery-Pin")
        .and_then(|v| v.to_str().ok())
        .ok_or(ApiError::GalleryPinRequired)?
        .to_owned();
    state
        .limits
        .check_gallery_pin(req, &experience.slug)
        .map_err(|retry_after| ApiError::RateLimited { retry_after })?;
    let stored = experience.gallery_pin_hash.clone().unwrap_or_default();
    let now = state.clock.now_ms();
    let guard = state.store.gallery_guard(&experience.id, &stored).await?;
    if let Some(until) = guard.locked_at(now) {
        return Err(locked(until, now));
    }
    let shape = guests::pin_shape(&pin);
    if shape == PinShape::Malformed {
        return Err(ApiError::GalleryPinWrong);
    }
    let keeper = &state.gallery_pins;
    if shape == PinShape::Current && keeper.remembered(&experience.slug, &stored, &pin) {
        return Ok(());
    }
    take_a_guess(state, experience, &stored, now).await?;
    let (given, hash) = (pin.clone(), stored.clone());
    let right = keeper
        .checks
        .run(move || guests::pin_matches(&given, &hash))
        .await?;
    match (right, shape) {
        (true, PinShape::Current) => {
            keeper.remember(&experience.slug, &stored, &pin);
            Ok(())
        }
        (true, _) => Err(outdated(state, experience, &stored, now).await),
        (false, _) => {
            tracing::warn!(experience = %experience.slug, "a wrong gallery PIN");
            Err(ApiError::GalleryPinWrong)
        }
    }
}

/// Takes one guess from the gallery's ceiling, or says it is locked.
async fn take_a_guess(
    state: &AppState,
    experience: &experiences::Model,
    stored: &str,
    now: EpochMs,
) -> Result<(), ApiError> {
    let Some(ceiling) = state.gallery_pins.ceiling else {
        return Ok(());
    };
    match state
        .store
        .take_pin_guess(&experience.id, stored, now, ceiling)
        .await?
    {
        PinGuess::Locked { until_ms } => Err(locked(until_ms, now)),
        PinGuess::Check {
            guesses,
            locks_until,
        } => {
            if let Some(until) = locks_until {
                tracing::warn!(
                    experience = %experience.slug, guesses, locked_until = %rfc3339(until),
                    "a PIN gallery is locked: its ceiling of PIN guesses was reached; someone is guessing its PIN"
                );
                state.wakeups.stats.ring();
            }
            Ok(())
        }
    }
}

/// The answer to the right PIN of fewer than 6 digits: it opens nothing,
/// and /ops is told (once per PIN).
async fn outdated(
    state: &AppState,
    experience: &experiences::Model,
    stored: &str,
    now: EpochMs,
) -> ApiError {
    tracing::warn!(
        experience = %experience.slug,
        "a gallery's PIN has fewer than 6 digits and no longer opens it; set a new PIN"
    );
    match state
        .store
        .mark_pin_outdated(&experience.id, stored, now)
        .await
    {
        Ok(()) => state.wakeups.stats.ring(),
        Err(e) => tracing::warn!(error = %e, "could not record the outdated gallery PIN"),
    }
    ApiError::GalleryPinOutdated
}

/// The answer while the gallery is locked until `until`.
fn locked(until: EpochMs, now: EpochMs) -> ApiError {
    ApiError::GalleryLocked {
        retry_after: (until.saturating_sub(now).max(0) as u64)
            .div_ceil(1000)
            .max(1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every place taken (2 hashing, 64 waiting): the next check is
    /// refused at once with `PinChecksFull` (503 `busy`), and the places
    /// come back as the work ends.
    #[actix_web::test]
    async fn a_full_place_for_pin_checks_refuses_at_once() {
        let checks = Arc::new(PinChecks::new());
        let (release, gate) = std::sync::mpsc::channel::<()>();
        let gate = Arc::new(Mutex::new(gate));
        let places = PIN_CHECKS_AT_ONCE + PIN_CHECKS_WAITING;
        let held: Vec<_> = (0..places)
            .map(|_| {
                let (checks, gate) = (checks.clone(), gate.clone());
                tokio::spawn(async move {
                    checks
                        .run(move || {
                            let _ = gate.lock().expect("the gate").recv();
                        })
                        .await
                })
            })
            .collect();
        for _ in 0..10_000 {
            if checks.admitted.available_permits() == 0 {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(checks.admitted.available_permits(), 0, "every place taken");
        assert!(matches!(
            checks.run(|| ()).await,
            Err(ApiError::PinChecksFull)
        ));
        for _ in 0..places {
            release.send(()).expect("a waiting check");
        }
        for work in held {
            work.await.expect("a check").expect("it ran");
        }
        assert_eq!(checks.run(|| 7).await.expect("a place again"), 7);
    }
}
