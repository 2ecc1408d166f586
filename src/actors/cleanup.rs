//! CleanupActor: every `CLEANUP_INTERVAL` ends what nobody owns any more.
//! Orphans (`Store::orphans`: sagas nobody holds that are past their
//! deadline, or whose lease ran out with their recoveries used up) are
//! aborted, each in its own transaction and only if still unowned at that
//! moment: AI_TIMEOUT when the deadline passed while the saga waited for
//! the AI, ORPHANED otherwise (`domain::policy::orphan_reason`); sessions
//! stuck in SUBMITTING without a saga are aborted, each in its own
//! transaction; the presence rows of displays whose instance died, expired
//! idempotency records and old outbox events are deleted, the last two in
//! statements of at most [`PURGE_BATCH`] rows, at most [`PURGE_ROUNDS`]
//! statements each a round (what is left waits for the next round). With
//! a media store it also keeps the organisers' retention: sessions whose
//! `retention` ended are forgotten and photos whose `photo_retention`
//! ended are given up (`store::guests`: fenced, each its own short
//! transaction), photos nobody submitted within `photo_orphan_ttl` are
//! swept (marked, then given up once no submission that read them can
//! still name them: `store::photos`), and the objects they all leave are
//! deleted under a claim that another instance takes over once it runs
//! out; a swept photo's row goes only after its object. One
//! item that fails is logged with its id and counted in
//! [`CleanupReport::failed`]; the round goes on with the rest.
//!
//! Rounds never overlap. When rounds are asked for faster than they run:
//! a timer tick that comes while a round runs is skipped (the next tick
//! comes anyway), and every [`RunCleanup`] that arrives while a round runs
//! waits for one more round that starts when the current one ends; all
//! such requests share that one round and its report (they are
//! coalesced). So at most one round runs and at most one more is queued,
//! however often rounds are asked for; the mailbox is actix's bounded one
//! (a sender waits while it is full), and each waiting request costs one
//! small entry until its round ends.

use std::collections::HashMap;
use std::future::Future;
use std::time::{Duration, Instant};

use actix::prelude::*;
use tokio::sync::oneshot;

use super::persistence::{PersistenceActor, WriteAlone};
use super::wakeups::Wakeups;
use crate::clock::SharedClock;
use crate::domain::breaker::Opener;
use crate::domain::guests::ForgottenBy;
use crate::domain::policy::{orphan_reason, ownership, recovery, Recovery, RecoveryLimits};
use crate::domain::presence::PRESENCE_STALE_MS;
use crate::domain::saga::{AbortReason, OUT_OF_CREDIT};
use crate::media::MediaStore;
use crate::store::guests::Forget;
use crate::store::sagas::{ClaimRules, Fence};
use crate::store::transitions::SagaWrite;
use crate::store::{Store, StoreResult};

pub use crate::store::idempotency::PURGE_BATCH;

/// Outbox events are kept this long for displays that reconnect.
const OUTBOX_RETENTION_MS: i64 = 7 * 24 * 3_600_000;
/// Orphans, and stuck sessions, handled per round at most, so a round
/// stays short; the rest wait for the next round.
const BATCH: u64 = 500;
/// Purges (a forgotten session's objects, or a given-up photo) claimed
/// per round at most. A claim lasts one saga lease (`--lease`), long
/// enough to delete this many sessions' objects; past it another
/// instance may take them again, which only repeats deletes.
const PURGE_BATCH_ITEMS: u64 = 100;
/// Purge statements (of [`PURGE_BATCH`] rows) per table and round at most.
pub const PURGE_ROUNDS: u32 = 20;

/// Run one round (tests and operators). Answered with the report of a
/// round that started after the request arrived: at once when no round
/// runs, else the one queued after the current round (see the module doc).
#[derive(Message)]
#[rtype(result = "CleanupReport")]
pub struct RunCleanup;

/// How the rounds went so far (see [`CleanupStats`]).
#[derive(Message)]
#[rtype(result = "CleanupStats")]
pub struct GetCleanupStats;

/// What one round did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CleanupReport {
    pub orphaned_sagas: u64,
    pub stuck_sessions: u64,
    pub expired_keys: u64,
    pub old_events: u64,
    pub stale_displays: u64,
    /// Photos uploaded but never submitted, deleted (object, then row)
    /// after `photo_orphan_ttl`.
    pub orphan_photos: u64,
    /// Sessions whose retention ended: their personal data forgotten.
    pub forgotten_sessions: u64,
    /// Input photos given up after their `photo_retention`.
    pub photos_given_up: u64,
    /// Objects deleted from the media store by the purge (forgotten
    /// sessions' results and photos, given-up photos).
    pub purged_objects: u64,
    /// Audit records older than `audit_retention`, deleted.
    pub old_audit: u64,
    /// Items (a saga, a session, a purge statement) that failed; each is
    /// logged with its id, and the round went on with the rest.
    pub failed: u64,
}

/// Counters of the rounds since the actor started.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CleanupStats {
    /// Rounds started.
    pub rounds: u64,
    /// Rounds running now: 0 or 1.
    pub running: u64,
    /// Timer ticks skipped because a round was running.
    pub ticks_skipped: u64,
    /// `RunCleanup` requests that came while a round ran and waited for
    /// the next one.
    pub requests_queued: u64,
    /// How long the last finished round took, in milliseconds.
    pub last_round_ms: u64,
}

/// When rounds start: the rule of the module doc, apart from the actor so
/// it is tested alone. `W` is what a waiting request is answered through.
#[derive(Debug)]
struct Rounds<W> {
    running: bool,
    /// Requests for the round after the current one.
    queued: Vec<W>,
    stats: CleanupStats,
}

impl<W> Default for Rounds<W> {
    fn default() -> Self {
        Rounds {
            running: false,
            queued: Vec::new(),
            stats: CleanupStats::default(),
        }
    }
}

impl<W> Rounds<W> {
    /// The timer fired: true to start a round now, false when one runs
    /// (the tick is skipped).
    fn tick(&mut self) -> bool {
        if self.running {
            self.stats.ticks_skipped += 1;
            return false;
        }
        self.start();
        true
    }

    /// A request: `Some(waiters)` to start a round now for them; `None`
    /// when it waits for the round after the current one.
    fn request(&mut self, waiter: W) -> Option<Vec<W>> {
        if self.running {
            self.stats.requests_queued += 1;
            self.queued.push(waiter);
            return None;
        }
        self.start();
        Some(vec![waiter])
    }

    /// The running round ended after `elapsed_ms`: `Some(waiters)` to start
    /// the queued round now for them.
    fn finished(&mut self, elapsed_ms: u64) -> Option<Vec<W>> {
        self.running = false;
        self.stats.running = 0;
        self.stats.last_round_ms = elapsed_ms;
        if self.queued.is_empty() {
            return None;
        }
        self.start();
        Some(std::mem::take(&mut self.queued))
    }

    fn start(&mut self) {
        self.running = true;
        self.stats.running = 1;
        self.stats.rounds += 1;
    }
}

/// `AUDIT_RETENTION`'s default: 400 days.
pub const DEFAULT_AUDIT_RETENTION_MS: i64 = 400 * 24 * 3_600_000;

pub struct CleanupActor {
    store: Store,
    clock: SharedClock,
    persistence: Addr<PersistenceActor>,
    wakeups: Wakeups,
    rules: ClaimRules,
    interval: Duration,
    /// How long a session may sit in SUBMITTING without a saga.
    stuck_after_ms: i64,
    rounds: Rounds<oneshot::Sender<CleanupReport>>,
    /// Where photos live, and how long one no submission names is kept.
    photos: Option<(MediaStore, Duration)>,
    /// How long audit records are kept.
    audit_retention_ms: i64,
}

impl CleanupActor {
    pub fn new(
        store: Store,
        clock: SharedClock,
        persistence: Addr<PersistenceActor>,
        wakeups: Wakeups,
        rules: ClaimRules,
        interval: Duration,
    ) -> Self {
        CleanupActor {
            store,
            clock,
            persistence,
            wakeups,
            rules,
            interval,
            stuck_after_ms: rules.lease_ms,
            rounds: Rounds::default(),
            photos: None,
            audit_retention_ms: DEFAULT_AUDIT_RETENTION_MS,
        }
    }

    /// Keeps audit records this long (default 400 days).
    pub fn with_audit_retention(mut self, retention: Duration) -> Self {
        self.audit_retention_ms = retention.as_millis().min(i64::MAX as u128) as i64;
        self
    }

    /// Also deletes photos no submission named within `ttl`, from `media`.
    pub fn with_photo_orphans(mut self, media: MediaStore, ttl: Duration) -> Self {
        self.photos = Some((media, ttl));
        self
    }

    /// Runs a round (the caller has marked it started in `rounds`); its
    /// report goes to `waiters`, and when it ends the queued round, if
    /// any, starts.
    fn start_round(
        &mut self,
        ctx: &mut Context<Self>,
        waiters: Vec<oneshot::Sender<CleanupReport>>,
    ) {
        let started = Instant::now();
        let round = self.round();
        crate::metrics::task_spawned("cleanup.round");
        ctx.spawn(actix::fut::wrap_future(round).map(
            move |report, act: &mut Self, ctx: &mut Context<Self>| {
                let elapsed = started.elapsed();
                if report != CleanupReport::default() {
                    tracing::info!(
                        ?report,
                        elapsed_ms = elapsed.as_millis() as u64,
                        "cleanup round"
                    );
                }
                for waiter in waiters {
                    let _ = waiter.send(report); // the requester gave up
                }
                if let Some(next) = act.rounds.finished(elapsed.as_millis() as u64) {
                    act.start_round(ctx, next);
                }
            },
        ));
    }

    fn round(&self) -> impl Future<Output = CleanupReport> + 'static {
        let (store, clock, persistence, wakeups, rules) = (
            self.store.clone(),
            self.clock.clone(),
            self.persistence.clone(),
            self.wakeups.clone(),
            self.rules,
        );
        let stuck_after_ms = self.stuck_after_ms;
        let photos = self.photos.clone();
        let audit_retention_ms = self.audit_retention_ms;
        async move {
            let mut report = CleanupReport::default();
            let now = clock.now_ms();
            abort_orphans(&store, &persistence, rules, now, &mut report).await;
            abort_stuck_sessions(&store, &wakeups, now - stuck_after_ms, now, &mut report).await;
            // Before the outbox: a display whose instance died no longer
            // holds back the purge of the events it did not acknowledge.
            match store.purge_stale_presence(now - PRESENCE_STALE_MS).await {
                Ok(n) => report.stale_displays = n,
                Err(e) => {
                    report.failed += 1;
                    tracing::error!(error = %e, "cleanup: purging stale presence failed")
                }
            }
            report.expired_keys =
                purge_in_batches("idempotency records", &mut report.failed, |n| {
                    store.purge_expired_keys(now, n)
                })
                .await;
            report.old_events = purge_in_batches("outbox events", &mut report.failed, |n| {
                store.purge_events_before(now - OUTBOX_RETENTION_MS, n)
            })
            .await;
            report.old_audit = purge_in_batches("audit records", &mut report.failed, |n| {
                store.drop_old_audit(now.saturating_sub(audit_retention_ms), n)
            })
            .await;
            if let Some((media, ttl)) = &photos {
                let before = now - ttl.as_millis() as i64;
                sweep_orphan_photos(&store, before, now, &mut report).await;
                forget_what_is_due(&store, now, &mut report).await;
                purge_objects(&store, media, now, rules.lease_ms, &mut report).await;
                drop_swept_photos(&store, &mut report).await;
            }
            report
        }
    }
}

/// The orphan sweep's first two steps: marks up to [`BATCH`] photos
/// uploaded before `before_ms` that no saga names, and gives up those
/// marked `store::photos::SWEEP_GRACE_MS` ago that still none names (their objects go
/// with [`purge_objects`], like any given-up photo: a delete that fails is
/// tried again at a later round).
async fn sweep_orphan_photos(store: &Store, before_ms: i64, now: i64, report: &mut CleanupReport) {
    if let Err(e) = store.sweep_orphan_photos(before_ms, now, BATCH).await {
        report.failed += 1;
        tracing::error!(error = %e, "cleanup: sweeping orphan photos failed");
    }
    match store.give_up_swept_photos(now, BATCH).await {
        Ok((_, 0)) => {}
        Ok((_, kept)) => {
            tracing::info!(kept, "swept photos a submission named meanwhile are kept")
        }
        Err(e) => {
            report.failed += 1;
            tracing::error!(error = %e, "cleanup: giving up swept photos failed");
        }
    }
}

/// The sweep's last step: forgets the rows of swept photos whose objects
/// are deleted.
async fn drop_swept_photos(store: &Store, report: &mut CleanupReport) {
    match store.drop_swept_photos(BATCH).await {
        Ok(n) => report.orphan_photos = n,
        Err(e) => {
            report.failed += 1;
            tracing::error!(error = %e, "cleanup: forgetting swept photos failed");
        }
    }
}

/// Retention: forgets up to [`BATCH`] sessions whose `retention` ended
/// (each in its own fenced transaction: a session that runs again is
/// left alone), and gives up the photos whose `photo_retention` ended.
async fn forget_what_is_due(store: &Store, now: i64, report: &mut CleanupReport) {
    match store.sessions_due(now, BATCH).await {
        Ok(due) => {
            let forgotten_before = report.forgotten_sessions;
            for id in due {
                match store
                    .forget_session(&id, ForgottenBy::Retention, None, now)
                    .await
                {
                    Ok(Forget::Forgotten { .. }) => {
                        report.forgotten_sessions += 1;
                        tracing::info!(session_id = %id, "retention ended: the session's personal data is forgotten");
                    }
                    Ok(Forget::Already | Forget::Running) => {}
                    Err(e) => {
                        report.failed += 1;
                        tracing::error!(session_id = %id, error = %e, "cleanup: forgetting a session failed");
                    }
                }
            }
            if report.forgotten_sessions > forgotten_before {
                store.wipe_log().await;
            }
        }
        Err(e) => {
            report.failed += 1;
            tracing::error!(error = %e, "cleanup: reading the sessions due failed");
        }
    }
    match store.give_up_photos(now, BATCH).await {
        Ok(n) => report.photos_given_up = n,
        Err(e) => {
            report.failed += 1;
            tracing::error!(error = %e, "cleanup: giving up photos failed");
        }
    }
}

/// Deletes the objects of up to [`PURGE_BATCH_ITEMS`] purges (forgotten
/// sessions, given-up photos) this instance claims for `lease_ms`; a purge
/// that fails keeps its claim until it runs out and is taken again then.
async fn purge_objects(
    store: &Store,
    media: &MediaStore,
    now: i64,
    lease_ms: i64,
    report: &mut CleanupReport,
) {
    let items = match store.claim_purges(now, lease_ms, PURGE_BATCH_ITEMS).await {
        Ok(items) => items,
        Err(e) => {
            report.failed += 1;
            tracing::error!(error = %e, "cleanup: claiming purges failed");
            return;
        }
    };
    for item in items {
        match crate::media::purge::purge(store, media, &item).await {
            Ok(objects) => report.purged_objects += objects as u64,
            Err(e) => {
                report.failed += 1;
                tracing::error!(?item, error = %e, "cleanup: a purge failed; it is taken again once its claim runs out");
            }
        }
    }
}

/// Why an orphan is aborted, in words for the log and the saga row.
fn orphan_detail(reason: AbortReason, deadline_passed: bool, recoveries: i32) -> String {
    if reason == AbortReason::AiTimeout {
        "the saga deadline passed while waiting for the AI".to_owned()
    } else if deadline_passed {
        "nobody finished it before its deadline".to_owned()
    } else {
        format!("lease lost {recoveries} times; giving up")
    }
}

/// Whether the provider of `experience_id` is out of quota (its breaker
/// opened for it), asked once per experience per run; false when it
/// cannot be read.
async fn out_of_quota(
    store: &Store,
    experience_id: &str,
    known: &mut HashMap<String, bool>,
) -> bool {
    if let Some(known) = known.get(experience_id) {
        return *known;
    }
    let provider = match store.experience_by_id(experience_id).await {
        Ok(Some(experience)) => experience.provider,
        _ => return false,
    };
    let out = matches!(
        store.breaker_row(&provider).await,
        Ok(row) if row.opener == Some(Opener::OutOfQuota)
    );
    known.insert(experience_id.to_owned(), out);
    out
}

/// Aborts up to [`BATCH`] orphans, each in its own transaction.
async fn abort_orphans(
    store: &Store,
    persistence: &Addr<PersistenceActor>,
    rules: ClaimRules,
    now: i64,
    report: &mut CleanupReport,
) {
    let candidates = match store.orphans(now, rules.max_recoveries, BATCH).await {
        Ok(candidates) => candidates,
        Err(e) => {
            report.failed += 1;
            tracing::error!(error = %e, "cleanup: reading orphans failed");
            return;
        }
    };
    let limits = RecoveryLimits {
        max_recoveries: rules.max_recoveries,
    };
    let mut quota_of = HashMap::new();
    for saga in candidates {
        let owner = ownership(
            saga.lock_token.as_deref(),
            saga.locked_until_ms,
            saga.handed_over,
            now,
        );
        let decision = recovery(
            owner,
            saga.recoveries as u32,
            saga.next_attempt_at_ms,
            saga.deadline_at_ms,
            now,
            limits,
        );
        if decision != Recovery::Orphan {
            // The query is the policy in SQL: this is a bug in one of them.
            report.failed += 1;
            tracing::error!(saga_id = %saga.id, ?decision, "cleanup: the orphan query and the recovery policy disagree; saga left alone");
            continue;
        }
        let deadline_passed = saga.deadline_at_ms < now;
        // Waiting for the AI when its time ran out: AI_TIMEOUT.
        let asked_ai = saga.ai_job_id.is_some() || saga.attempts > 0 || saga.unavailable_streak > 0;
        let reason = match saga.step.parse() {
            Ok(step) => orphan_reason(step, deadline_passed, asked_ai),
            Err(_) => AbortReason::Orphaned,
        };
        let (reason, detail) = if reason == AbortReason::AiTimeout
            && out_of_quota(store, &saga.experience_id, &mut quota_of).await
        {
            // Not slow: the account could not work at all. Say so.
            (
                AbortReason::AiFailed,
                format!("{OUT_OF_CREDIT}: the saga deadline passed while the provider's account was out of quota"),
            )
        } else {
            (
                reason,
                orphan_detail(reason, deadline_passed, saga.recoveries),
            )
        };
        let aborted = persistence
            .send(WriteAlone(SagaWrite::Abort {
                saga_id: saga.id.clone(),
                fence: Fence::Unowned,
                reason,
                detail: detail.clone(),
                free_calls: Vec::new(),
                audit: None,
            }))
            .await;
        match aborted {
            Ok(Ok(_)) => {
                report.orphaned_sagas += 1;
                tracing::warn!(saga_id = %saga.id, step = %saga.step, %reason, %detail, "saga nobody will finish ABORTED");
            }
            Ok(Err(e)) if e.is_lease_lost() => {
                tracing::debug!(saga_id = %saga.id, "orphan taken by a worker meanwhile; left alone")
            }
            Ok(Err(e)) => {
                report.failed += 1;
                tracing::error!(saga_id = %saga.id, error = %e, "cleanup: could not abort orphan");
            }
            Err(e) => {
                report.failed += 1;
                tracing::error!(saga_id = %saga.id, error = %e, "cleanup: persistence actor unreachable");
            }
        }
    }
}

/// Aborts up to [`BATCH`] sessions stuck in SUBMITTING without a saga since
/// before `older_than`, each in its own transaction.
async fn abort_stuck_sessions(
    store: &Store,
    wakeups: &Wakeups,
    older_than: i64,
    now: i64,
    report: &mut CleanupReport,
) {
    let ids = match store
        .submitting_without_saga(older_than, BATCH as i64)
        .await
    {
        Ok(ids) => ids,
        Err(e) => {
            report.failed += 1;
            tracing::error!(error = %e, "cleanup: reading stuck sessions failed");
            return;
        }
    };
    for id in ids {
        match store.abort_stuck_session(&id, now).await {
            Ok(appended) => {
                report.stuck_sessions += 1;
                tracing::warn!(session_id = %id, "session stuck in SUBMITTING without a saga: ABORTED");
                if appended {
                    wakeups.event_appended();
                }
            }
            Err(e) => {
                report.failed += 1;
                tracing::error!(session_id = %id, error = %e, "cleanup: could not abort stuck session");
            }
        }
    }
}

/// Runs `purge` (given the batch size, returning the rows it deleted) up
/// to [`PURGE_ROUNDS`] times, until a statement deletes less than a full
/// batch; returns the rows deleted. A failed statement ends the purge of
/// this round, counted in `failed`.
async fn purge_in_batches<F, Fut>(what: &'static str, failed: &mut u64, mut purge: F) -> u64
where
    F: FnMut(u64) -> Fut,
    Fut: Future<Output = StoreResult<u64>>,
{
    let mut deleted = 0;
    for _ in 0..PURGE_ROUNDS {
        match purge(PURGE_BATCH).await {
            Ok(n) => {
                deleted += n;
                if n < PURGE_BATCH {
                    break;
                }
            }
            Err(e) => {
                *failed += 1;
                tracing::error!(what, error = %e, "cleanup: purge failed");
                break;
            }
        }
    }
    deleted
}

impl Actor for CleanupActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.run_interval(self.interval, |act, ctx| {
            if act.rounds.tick() {
                act.start_round(ctx, Vec::new());
            } else {
                tracing::info!("cleanup round still running at the next tick; tick skipped");
            }
        });
    }
}

impl Handler<RunCleanup> for CleanupActor {
    type Result = ResponseFuture<CleanupReport>;
    fn handle(&mut self, _: RunCleanup, ctx: &mut Context<Self>) -> Self::Result {
        crate::metrics::actor_message("CleanupActor");
        let (answer, report) = oneshot::channel();
        if let Some(waiters) = self.rounds.request(answer) {
            self.start_round(ctx, waiters);
        }
        Box::pin(async move {
            report.await.unwrap_or_else(|_| {
                // Only when the actor stops before the round ends.
                tracing::warn!("cleanup actor stopped before the requested round ended");
                CleanupReport::default()
            })
        })
    }
}

impl Handler<GetCleanupStats> for CleanupActor {
    type Result = MessageResult<GetCleanupStats>;
    fn handle(&mut self, _: GetCleanupStats, _: &mut Context<Self>) -> Self::Result {
        crate::metrics::actor_message("CleanupActor");
        MessageResult(self.rounds.stats)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_while_a_round_runs_waits_for_one_more_round_shared_by_all() {
        let mut rounds = Rounds::default();
        assert_eq!(rounds.request(1), Some(vec![1]), "nothing runs: start now");
        assert_eq!(rounds.request(2), None);
        assert_eq!(rounds.request(3), None);
        assert_eq!(rounds.stats.running, 1);
        assert_eq!(rounds.finished(5), Some(vec![2, 3]), "one round for both");
        assert_eq!(rounds.request(4), None, "the queued round runs now");
        assert_eq!(rounds.finished(5), Some(vec![4]));
        assert_eq!(rounds.finished(5), None);
        assert_eq!(rounds.stats.rounds, 3);
        assert_eq!(rounds.stats.requests_queued, 3);
        assert_eq!(rounds.stats.running, 0);
    }

    #[test]
    fn a_tick_while_a_round_runs_is_skipped() {
        let mut rounds = Rounds::<u32>::default();
        assert!(rounds.tick());
        assert!(!rounds.tick(), "a round runs");
        assert_eq!(rounds.request(1), None);
        assert!(!rounds.tick());
        assert_eq!(rounds.finished(7), Some(vec![1]));
        assert!(!rounds.tick(), "the queued round runs");
        assert_eq!(rounds.finished(7), None);
        assert!(rounds.tick());
        assert_eq!(rounds.stats.ticks_skipped, 3);
        assert_eq!(rounds.stats.rounds, 3);
        assert_eq!(rounds.stats.last_round_ms, 7);
    }
}
