//! Store tests, on SQLite and on PostgreSQL: the claim (one winner among many
//! claimers, the capacity cap), fencing of a worker whose lease expired and
//! was re-claimed, idempotent and conflicting transitions, the ranking and
//! the outbox. Times are fixed numbers, not the clock.

mod support;

use futures_util::future::join_all;
use sea_orm::{ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter};
use stagehand::domain::failure::{AiResult, ContentItem};
use stagehand::domain::ledger::Evidence;
use stagehand::domain::policy::AttemptState;
use stagehand::domain::saga::{AbortReason, Step, TransitionError};
use stagehand::http::idempotency::key_request;
use stagehand::store::entities::sagas;
use stagehand::store::experiences::NewExperience;
use stagehand::store::idempotency::{KeyClaim, StoredAnswer};
use stagehand::store::ranking::ScoreEntry;
use stagehand::store::sagas::{ClaimRules, ClaimSource, ClaimableExperience, Fence};
use stagehand::store::submissions::Submission;
use stagehand::store::transitions::SagaWrite;
use stagehand::store::{Store, StoreError};
use support::{Backend, TestDb};

use std::time::Duration;

const T0: i64 = 1_800_000_000_000;
const LEASE: i64 = 10_000;
const RULES: ClaimRules = ClaimRules {
    lease_ms: LEASE,
    max_recoveries: 2,
};

struct Fixture {
    store: Store,
    experience_id: String,
    terminal_id: String,
    _db: TestDb,
}

async fn fixture(backend: Backend, max_in_flight: i32) -> Fixture {
    let db = TestDb::fresh(backend).await;
    let store = db.store().await;
    let exp = store
        .create_experience(
            NewExperience {
                slug: format!("s-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]),
                title: "t".into(),
                kind: "comic".into(),
                ai_calls: 1,
                min_success: None,
                max_in_flight,
                credits: None,
                closes_at_ms: None,
                locale: "en".into(),
                provider: "default".into(),
                weight: 1,
                review: Default::default(),
                review_timeout_ms: None,
                review_timeout_action: None,
                input: stagehand::domain::media::InputKind::Prompt,
                photo_max_px: 1536,
                max_photos_per_session: 5,
                guests: Default::default(),
                outputs: Default::default(),
            },
            None,
            T0,
        )
        .await
        .unwrap();
    let terminal = store
        .create_terminal(&exp.id, "booth", "secret", None, T0)
        .await
        .unwrap();
    Fixture {
        store,
        experience_id: exp.id,
        terminal_id: terminal.id,
        _db: db,
    }
}

impl Fixture {
    /// The fixture's experience as the claim sees it, with `max_in_flight`.
    fn exp(&self, max_in_flight: i32) -> ClaimableExperience {
        ClaimableExperience {
            id: self.experience_id.clone(),
            max_in_flight,
            kind: "comic".into(),
            ai_calls: 1,
            min_success: None,
            has_resumed: true,
            has_expired_ai: true,
            provider: "default".into(),
            weight: 1,
            provider_max_in_flight: None,
            has_queued_ai: true,
            review: Default::default(),
            breaker: Default::default(),
            brand_version: 0,
        }
    }

    /// A submitted session on the fixture's terminal: one runnable saga,
    /// created at `at`.
    async fn saga(&self, at: i64) -> sagas::Model {
        self.saga_on(&self.terminal_id, at).await
    }

    /// A submitted session on `terminal_id`, created at `at`.
    async fn saga_on(&self, terminal_id: &str, at: i64) -> sagas::Model {
        self.saga_of("nick", terminal_id, at).await
    }

    /// A submitted session of `nickname` on `terminal_id`, created at `at`.
    async fn saga_of(&self, nickname: &str, terminal_id: &str, at: i64) -> sagas::Model {
        let session = self
            .store
            .create_session(
                &self.experience_id,
                Some(terminal_id.to_owned()),
                nickname,
                &uuid::Uuid::new_v4().to_string(),
                at,
            )
            .await
            .unwrap();
        self.store
            .submit(
                &session,
                Submission {
                    photo_id: None,
                    in_gallery: true,
                    consent: false,
                    prompt: "a cat".into(),
                    score: None,
                },
                900_000,
                at,
            )
            .await
            .unwrap()
    }

    async fn claim(&self, max_in_flight: i32, now: i64) -> Vec<sagas::Model> {
        self.store
            .claim_runnable(&self.exp(max_in_flight), 100, now, RULES)
            .await
            .unwrap()
    }
}

fn result(text: &str) -> AiResult {
    AiResult {
        content: vec![ContentItem {
            thumb_url: None,
            original_url: None,
            print_url: None,
            kind: "image".into(),
            url: Some("https://x.invalid/1.png".into()),
            text: Some(text.into()),
        }],
        score: Some(42.0),
    }
}

fn token(s: &sagas::Model) -> String {
    s.lock_token.clone().expect("claimed saga has a token")
}

async fn twenty_concurrent_claimers_one_winner(backend: Backend) {
    let f = fixture(backend, 5).await;
    let saga = f.saga(T0).await;
    let claims = join_all((0..20).map(|_| {
        let store = f.store.clone();
        let exp = f.exp(5);
        actix_web::rt::spawn(async move { store.claim_runnable(&exp, 100, T0 + 1, RULES).await })
    }))
    .await;
    let won: Vec<_> = claims
        .into_iter()
        .flat_map(|c| c.expect("task").expect("claim"))
        .collect();
    assert_eq!(won.len(), 1, "exactly one claimer wins");
    assert_eq!(won[0].id, saga.id);
    assert_eq!(won[0].recoveries, 0);
    assert_eq!(won[0].locked_until_ms, Some(T0 + 1 + LEASE));
}
db_test!(twenty_concurrent_claimers_one_winner);

async fn capacity_cap_holds_under_concurrent_claims(backend: Backend) {
    let f = fixture(backend, 3).await;
    for i in 0..10 {
        f.saga(T0 + i).await;
    }
    let claims = join_all((0..8).map(|_| {
        let store = f.store.clone();
        let exp = f.exp(3);
        actix_web::rt::spawn(async move { store.claim_runnable(&exp, 100, T0 + 100, RULES).await })
    }))
    .await;
    let mut won: Vec<_> = claims
        .into_iter()
        .flat_map(|c| c.expect("task").expect("claim"))
        .collect();
    assert_eq!(
        won.len(),
        3,
        "never more AI jobs in flight than max_in_flight"
    );
    won.sort_by_key(|s| s.created_at_ms);
    assert_eq!(
        won.iter().map(|s| s.created_at_ms).collect::<Vec<_>>(),
        vec![T0, T0 + 1, T0 + 2],
        "oldest first"
    );
    assert!(
        f.claim(3, T0 + 200).await.is_empty(),
        "no room until one finishes"
    );

    // One moves past the AI step: its slot frees up.
    let first = &won[0];
    f.store
        .record_ai_done(&first.id, &token(first), &result("x"), T0 + 300, LEASE)
        .await
        .unwrap();
    let next = f.claim(3, T0 + 400).await;
    assert_eq!(next.len(), 1);
    assert_eq!(next[0].created_at_ms, T0 + 3);
}
db_test!(capacity_cap_holds_under_concurrent_claims);

async fn stale_worker_loses_after_lease_expired_and_reclaimed(backend: Backend) {
    let f = fixture(backend, 5).await;
    f.saga(T0).await;
    let first = f.claim(5, T0).await.remove(0);
    // Within the lease nobody else can claim it.
    assert!(f.claim(5, T0 + LEASE - 1).await.is_empty());
    // Lease expired: re-claimed with a new token, counted as a recovery.
    let second = f.claim(5, T0 + LEASE + 1).await.remove(0);
    assert_ne!(token(&first), token(&second));
    assert_eq!(second.recoveries, 1);

    let stale = f
        .store
        .record_ai_done(
            &first.id,
            &token(&first),
            &result("stale"),
            T0 + LEASE + 2,
            LEASE,
        )
        .await;
    assert!(
        matches!(
            stale,
            Err(StoreError::Transition(TransitionError::LeaseLost))
        ),
        "{stale:?}"
    );
    let renew = f
        .store
        .renew_lease(&first.id, &token(&first), T0 + LEASE + 2, LEASE)
        .await;
    assert!(renew.unwrap_err().is_lease_lost());
    let abort = f
        .store
        .abort(
            &first.id,
            Fence::Token(token(&first)),
            AbortReason::AiFailed,
            "stale",
            T0 + LEASE + 2,
        )
        .await;
    assert!(abort.unwrap_err().is_lease_lost());

    f.store
        .record_ai_done(
            &second.id,
            &token(&second),
            &result("fresh"),
            T0 + LEASE + 3,
            LEASE,
        )
        .await
        .expect("the current owner writes");
    let row = f.store.saga(&second.id).await.unwrap().unwrap();
    assert_eq!(row.step, "AI_DONE");
    assert!(row.content.unwrap().contains("fresh"));
}
db_test!(stale_worker_loses_after_lease_expired_and_reclaimed);

async fn repeated_transition_is_idempotent_conflicting_one_refused(backend: Backend) {
    let f = fixture(backend, 5).await;
    f.saga(T0).await;
    let s = f.claim(5, T0).await.remove(0);
    let t = token(&s);
    f.store
        .record_ai_done(&s.id, &t, &result("a"), T0 + 1, LEASE)
        .await
        .unwrap();
    f.store
        .record_ai_done(&s.id, &t, &result("a"), T0 + 2, LEASE)
        .await
        .expect("same step, same data: success");
    let conflict = f
        .store
        .record_ai_done(&s.id, &t, &result("b"), T0 + 3, LEASE)
        .await;
    assert!(
        matches!(
            conflict,
            Err(StoreError::Transition(TransitionError::Conflict {
                step: Step::AiDone,
                ..
            }))
        ),
        "{conflict:?}"
    );
    let row = f.store.saga(&s.id).await.unwrap().unwrap();
    assert!(
        row.content.unwrap().contains("\"a\""),
        "the recorded data is never overwritten"
    );

    // The same for the end: completing twice is fine and writes one event.
    f.store
        .record_ranking_done(&s.id, &t, None, T0 + 4, LEASE)
        .await
        .unwrap();
    assert!(
        f.store.complete(&s.id, &t, T0 + 5).await.unwrap(),
        "the first completion appends an event"
    );
    assert!(
        !f.store.complete(&s.id, &t, T0 + 6).await.unwrap(),
        "a repeated completion appends none"
    );
    f.store.number_events(100).await.unwrap();
    let events = f.store.events_after(&f.terminal_id, 0, 100).await.unwrap();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].seq, 1);
    assert_eq!(events[0].payload["type"], "session.completed");
    assert_eq!(events[0].payload["seq"], 1);
    let session = f.store.session(&row.session_id).await.unwrap().unwrap();
    assert_eq!(session.status, "COMPLETED");
}
db_test!(repeated_transition_is_idempotent_conflicting_one_refused);

async fn release_for_retry_frees_the_slot_without_counting_a_recovery(backend: Backend) {
    let f = fixture(backend, 1).await;
    f.saga(T0).await;
    f.saga(T0 + 1).await;
    let s = f.claim(1, T0).await.remove(0);
    let state = AttemptState {
        attempts: 0,
        unavailable_streak: 1,
    };
    f.store
        .release_for_retry(
            &s.id,
            &token(&s),
            state,
            T0 + 5_000,
            false,
            vec![(0, Evidence::SubmitRefused)],
            T0 + 10,
        )
        .await
        .unwrap();
    // The slot goes to the next saga; ours waits for its backoff.
    let other = f.claim(1, T0 + 20).await;
    assert_eq!(other.len(), 1);
    assert_ne!(other[0].id, s.id);
    let other = &other[0];
    f.store
        .record_ai_done(&other.id, &token(other), &result("o"), T0 + 30, LEASE)
        .await
        .unwrap();
    assert!(f.claim(1, T0 + 4_999).await.is_empty(), "backoff not over");
    let again = f.claim(1, T0 + 5_000).await.remove(0);
    assert_eq!(again.id, s.id);
    assert_eq!(again.recoveries, 0, "a release is not a lost lease");
    assert_eq!(again.unavailable_streak, 1);
}
db_test!(release_for_retry_frees_the_slot_without_counting_a_recovery);

async fn cleanup_abort_only_applies_to_unowned_sagas(backend: Backend) {
    let f = fixture(backend, 5).await;
    f.saga(T0).await;
    let s = f.claim(5, T0).await.remove(0);
    let held = f
        .store
        .abort(&s.id, Fence::Unowned, AbortReason::Orphaned, "x", T0 + 1)
        .await;
    assert!(
        held.unwrap_err().is_lease_lost(),
        "a held saga is not an orphan"
    );
    let appended = f
        .store
        .abort(
            &s.id,
            Fence::Unowned,
            AbortReason::Orphaned,
            "gone",
            T0 + LEASE + 1,
        )
        .await
        .unwrap();
    assert!(appended.event_appended, "the terminal is told");
    f.store.number_events(100).await.unwrap();
    let event = f
        .store
        .events_after(&f.terminal_id, 0, 100)
        .await
        .unwrap()
        .remove(0);
    assert_eq!(event.payload["type"], "session.aborted");
    assert_eq!(event.payload["reason"], "ORPHANED");
    let row = f.store.saga(&s.id).await.unwrap().unwrap();
    assert_eq!(row.step, "ABORTED");
    // The late owner cannot resurrect it.
    let late = f
        .store
        .record_ai_done(&s.id, &token(&s), &result("late"), T0 + LEASE + 2, LEASE)
        .await;
    assert!(late.unwrap_err().is_lease_lost());
}
db_test!(cleanup_abort_only_applies_to_unowned_sagas);

/// Sagas of the fixture's terminal for these nicknames, claimed and moved
/// to AI_DONE, as the ranking step finds them.
/// An operator cancels a saga a worker holds: the cancel applies, and the
/// worker's next write is refused. The operator then retries it: of two
/// retries at once exactly one applies; the saga is runnable again at the
/// step it stood, with fresh attempts, and the old worker still loses.
async fn an_operator_cancel_beats_the_worker_and_a_retry_runs_it_again(backend: Backend) {
    let f = fixture(backend, 5).await;
    f.saga(T0).await;
    let held = f.claim(5, T0).await.remove(0);
    f.store
        .abort(
            &held.id,
            Fence::Operator,
            AbortReason::Cancelled,
            "cancelled by an operator",
            T0 + 1,
        )
        .await
        .expect("the operator's cancel applies while a worker holds the saga");
    let late = f
        .store
        .record_ai_done(&held.id, &token(&held), &result("late"), T0 + 2, LEASE)
        .await;
    assert!(late.is_err(), "{late:?}");
    let row = f.store.saga(&held.id).await.unwrap().unwrap();
    assert_eq!(
        (row.step.as_str(), row.abort_reason.as_deref()),
        ("ABORTED", Some("CANCELLED"))
    );

    let retries =
        join_all((0..2).map(|_| f.store.retry_saga(&held.id, None, T0 + 3, 900_000))).await;
    assert_eq!(
        retries.iter().filter(|r| r.is_ok()).count(),
        1,
        "exactly one retry applies: {retries:?}"
    );
    let row = f.store.saga(&held.id).await.unwrap().unwrap();
    assert_eq!(row.step, "AI_PENDING");
    assert_eq!((row.attempts, row.recoveries), (0, 0));
    assert!(row.lock_token.is_none());
    let late = f
        .store
        .record_ai_done(&held.id, &token(&held), &result("late"), T0 + 4, LEASE)
        .await;
    assert!(late.as_ref().is_err_and(|e| e.is_lease_lost()), "{late:?}");
    let again = f.claim(5, T0 + 5).await.remove(0);
    assert_eq!(again.id, held.id);
    f.store
        .record_ai_done(&again.id, &token(&again), &result("fresh"), T0 + 6, LEASE)
        .await
        .expect("the new owner writes");
    // A saga that is not ABORTED cannot be retried.
    let refused = f.store.retry_saga(&held.id, None, T0 + 7, 900_000).await;
    assert!(
        matches!(
            refused,
            Err(StoreError::Transition(TransitionError::Conflict { .. }))
        ),
        "{refused:?}"
    );
}
db_test!(an_operator_cancel_beats_the_worker_and_a_retry_runs_it_again);

async fn at_ranking(f: &Fixture, nicknames: &[&str]) -> Vec<sagas::Model> {
    for (i, nick) in nicknames.iter().enumerate() {
        f.saga_of(nick, &f.terminal_id, T0 + i as i64).await;
    }
    let claimed = f.claim(100, T0 + 100).await;
    for s in &claimed {
        f.store
            .record_ai_done(&s.id, &token(s), &result("r"), T0 + 101, LEASE)
            .await
            .unwrap();
    }
    claimed
}

fn score_entry(f: &Fixture, s: &sagas::Model, score: f64) -> ScoreEntry {
    ScoreEntry {
        experience_id: f.experience_id.clone(),
        session_id: s.session_id.clone(),
        saga_id: s.id.clone(),
        token: token(s),
        score,
    }
}

async fn one_ranking_entry_per_session(backend: Backend) {
    let f = fixture(backend, 5).await;
    let s = at_ranking(&f, &["ann", "bob", "cy", "di"]).await;
    let (a, b, c, d) = (&s[0], &s[1], &s[2], &s[3]);
    let first = f
        .store
        .register_score(score_entry(&f, a, 10.0), T0)
        .await
        .unwrap();
    assert_eq!(first.rank, 1);
    // One batch: a repeat of ann (with another score), bob, a score that
    // is not a number, and di with bob's score.
    let batch = f
        .store
        .register_scores(
            &[
                score_entry(&f, a, 99.0),
                score_entry(&f, b, 20.0),
                score_entry(&f, c, f64::NAN),
                score_entry(&f, d, 20.0),
            ],
            T0 + 1,
        )
        .await
        .unwrap();
    let again = batch[0].as_ref().unwrap();
    assert_eq!(
        again.score_attempt_id, first.score_attempt_id,
        "a repeat adds nothing"
    );
    assert_eq!(again.score, 10.0, "and keeps the entry that exists");
    assert_eq!(
        again.rank, 3,
        "ranked at read time: bob and di are ahead now"
    );
    assert_eq!(batch[1].as_ref().unwrap().rank, 1);
    assert_eq!(
        batch[3].as_ref().unwrap().rank,
        1,
        "equal scores share a rank"
    );
    assert!(
        matches!(batch[2], Err(StoreError::Conflict(_))),
        "{:?}",
        batch[2]
    );
    let ranking = f.store.ranking(&f.experience_id, 10).await.unwrap();
    let mut shown: Vec<(&str, i64)> = ranking
        .iter()
        .map(|r| (r.nickname.as_str(), r.rank))
        .collect();
    // bob and di tie (same score, same millisecond): their order is the
    // index's tiebreak, by session id.
    shown[..2].sort();
    assert_eq!(shown, vec![("bob", 1), ("di", 1), ("ann", 3)]);
}
db_test!(one_ranking_entry_per_session);

/// A batch's rows reach the database exactly: on PostgreSQL they travel
/// as one JSON parameter (one statement text whatever the batch size), so
/// a score must come back with every bit, and the ranks computed from the
/// process's cache must agree with what is stored.
async fn scores_keep_every_bit_through_a_batch(backend: Backend) {
    let f = fixture(backend, 5).await;
    let names = ["a", "b", "c", "d", "e"];
    let s = at_ranking(&f, &names).await;
    let scores = [0.1 + 0.2, 1e-300, 123_456_789.123_456_79, f64::MAX, 0.3];
    let entries: Vec<_> = s
        .iter()
        .zip(scores)
        .map(|(saga, score)| score_entry(&f, saga, score))
        .collect();
    let ranked = f.store.register_scores(&entries, T0 + 1).await.unwrap();
    let ranks: Vec<i32> = ranked.iter().map(|r| r.as_ref().unwrap().rank).collect();
    // f64::MAX, 123456789.12, 0.30000000000000004, 0.3, 1e-300
    assert_eq!(ranks, vec![3, 5, 2, 1, 4]);
    for (saga, score) in s.iter().zip(scores) {
        let stored = stagehand::store::entities::score_attempts::Entity::find()
            .filter(
                stagehand::store::entities::score_attempts::Column::SessionId
                    .eq(saga.session_id.clone()),
            )
            .one(f.store.db())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(stored.score.to_bits(), score.to_bits(), "{score}");
    }
}
db_test!(scores_keep_every_bit_through_a_batch);

/// The ranks come from scores this process keeps (no walk of the index):
/// an abort that hides an entry counts at the very next rank, and a
/// second process (its own store, as another instance) ranks what is in
/// the table when it first looks.
async fn ranks_follow_hidden_entries(backend: Backend) {
    let f = fixture(backend, 5).await;
    let s = at_ranking(&f, &["top", "mid", "low", "late"]).await;
    let ranked = f
        .store
        .register_scores(
            &[
                score_entry(&f, &s[0], 30.0),
                score_entry(&f, &s[1], 20.0),
                score_entry(&f, &s[2], 10.0),
            ],
            T0 + 1,
        )
        .await
        .unwrap();
    let ranks: Vec<i32> = ranked.iter().map(|r| r.as_ref().unwrap().rank).collect();
    assert_eq!(ranks, vec![1, 2, 3]);
    // The top entry's saga is cancelled: its entry is hidden.
    f.store
        .abort(
            &s[0].id,
            Fence::Operator,
            AbortReason::Cancelled,
            "test",
            T0 + 2,
        )
        .await
        .unwrap();
    let late = f
        .store
        .register_score(score_entry(&f, &s[3], 15.0), T0 + 3)
        .await
        .unwrap();
    assert_eq!(late.rank, 2, "only mid (20) is above 15 once top is hidden");
    let other = f._db.store().await;
    let low = stagehand::store::entities::score_attempts::Entity::find()
        .filter(
            stagehand::store::entities::score_attempts::Column::SessionId
                .eq(s[2].session_id.clone()),
        )
        .one(other.db())
        .await
        .unwrap()
        .unwrap();
    let ranks = other.ranks_of(&f.experience_id, &[&low]).await.unwrap();
    assert_eq!(
        ranks.get(&s[2].session_id),
        Some(&3),
        "mid 20, late 15, then low 10"
    );
}
db_test!(ranks_follow_hidden_entries);

/// News from another instance that its ranking changed marks the cached
/// scores stale: a rank reads them again, but not more often than the
/// refresh bound, so instances that both rank all the time do not each
/// read every entry again per batch (they did, at every piece of news).
async fn another_instances_news_rereads_the_scores_at_most_once_per_bound(backend: Backend) {
    let f = fixture(backend, 5).await;
    let s = at_ranking(&f, &["ann", "bob", "cy"]).await;
    let experience = [f.experience_id.clone()];
    let here = |refresh: Duration| f.store.clone().with_rank_refresh(refresh);
    let rank_of_ann = |store: Store| {
        let session = s[0].session_id.clone();
        let experience = f.experience_id.clone();
        async move {
            let entry = stagehand::store::entities::score_attempts::Entity::find()
                .filter(
                    stagehand::store::entities::score_attempts::Column::SessionId
                        .eq(session.clone()),
                )
                .one(store.db())
                .await
                .unwrap()
                .unwrap();
            *store
                .ranks_of(&experience, &[&entry])
                .await
                .unwrap()
                .get(&session)
                .unwrap()
        }
    };
    let ann = f
        .store
        .register_score(score_entry(&f, &s[0], 30.0), T0 + 1)
        .await
        .unwrap();
    assert_eq!(ann.rank, 1);
    // Another instance (its own store and cache) ranks bob above ann.
    let other = f._db.store().await;
    let bob = other
        .register_score(score_entry(&f, &s[1], 40.0), T0 + 2)
        .await
        .unwrap();
    assert_eq!(bob.rank, 1, "it reads the table whole: ann is there");
    // Its news arrives here. Within the bound the cached scores serve.
    let slow = here(Duration::from_secs(3600));
    slow.ranks_changed_elsewhere(Some(&experience)).await;
    assert_eq!(
        rank_of_ann(slow.clone()).await,
        1,
        "read again within the bound"
    );
    // Past the bound (zero here) the next rank reads them again.
    let eager = here(Duration::ZERO);
    assert_eq!(rank_of_ann(eager.clone()).await, 2, "bob counted");
    // Read, they are fresh until the next news.
    other
        .register_score(score_entry(&f, &s[2], 50.0), T0 + 3)
        .await
        .unwrap();
    assert_eq!(rank_of_ann(eager.clone()).await, 2, "no news of cy yet");
    eager.ranks_changed_elsewhere(None).await;
    assert_eq!(rank_of_ann(eager).await, 3, "cy counted after its news");
}
db_test!(another_instances_news_rereads_the_scores_at_most_once_per_bound);

/// The ranking write is fenced like every step: a worker whose lease was
/// lost (the saga was claimed again) writes no entry; the holder does.
async fn a_stale_workers_ranking_write_is_refused(backend: Backend) {
    let f = fixture(backend, 5).await;
    let stale = at_ranking(&f, &["eve"]).await.remove(0);
    // The lease runs out and another worker resumes the saga at AI_DONE.
    let fresh = f.claim(5, T0 + 101 + LEASE + 1).await.remove(0);
    assert_eq!(fresh.id, stale.id);
    let refused = f
        .store
        .register_score(score_entry(&f, &stale, 50.0), T0 + 200)
        .await;
    assert!(
        refused.as_ref().is_err_and(|e| e.is_lease_lost()),
        "{refused:?}"
    );
    assert!(f
        .store
        .ranking(&f.experience_id, 10)
        .await
        .unwrap()
        .is_empty());
    let written = f
        .store
        .register_score(score_entry(&f, &fresh, 60.0), T0 + 201)
        .await
        .unwrap();
    assert_eq!((written.score, written.rank), (60.0, 1));
}
db_test!(a_stale_workers_ranking_write_is_refused);

/// A saga that ends ABORTED after its entry was written has the entry
/// hidden; a new submission of the session replaces it with its new score.
async fn an_aborted_sagas_entry_is_hidden_and_a_new_submission_replaces_it(backend: Backend) {
    let f = fixture(backend, 5).await;
    let s = at_ranking(&f, &["fay", "gus"]).await;
    let (fay, gus) = (&s[0], &s[1]);
    let entry = f
        .store
        .register_score(score_entry(&f, fay, 90.0), T0 + 200)
        .await
        .unwrap();
    f.store
        .register_score(score_entry(&f, gus, 10.0), T0 + 200)
        .await
        .unwrap();
    let aborted = f
        .store
        .abort(
            &fay.id,
            Fence::Token(token(fay)),
            AbortReason::PersistFailed,
            "x",
            T0 + 300,
        )
        .await
        .unwrap();
    assert_eq!(
        aborted.ranking_changed.as_deref(),
        Some(f.experience_id.as_str())
    );
    let ranking = f.store.ranking(&f.experience_id, 10).await.unwrap();
    let names: Vec<&str> = ranking.iter().map(|r| r.nickname.as_str()).collect();
    assert_eq!(names, vec!["gus"], "fay's entry is hidden");
    assert_eq!(ranking[0].rank, 1, "and no longer counts for others' rank");

    // fay submits again; the new saga reaches the ranking with 5.
    let session = f.store.session(&fay.session_id).await.unwrap().unwrap();
    f.store
        .submit(
            &session,
            Submission {
                photo_id: None,
                in_gallery: true,
                consent: false,
                prompt: "again".into(),
                score: None,
            },
            900_000,
            T0 + 400,
        )
        .await
        .unwrap();
    let second = f.claim(5, T0 + 401).await.remove(0);
    f.store
        .record_ai_done(&second.id, &token(&second), &result("r2"), T0 + 402, LEASE)
        .await
        .unwrap();
    let replaced = f
        .store
        .register_score(score_entry(&f, &second, 5.0), T0 + 403)
        .await
        .unwrap();
    assert_eq!(
        replaced.score_attempt_id, entry.score_attempt_id,
        "one entry per session"
    );
    assert_eq!((replaced.score, replaced.rank), (5.0, 2));
    let ranking = f.store.ranking(&f.experience_id, 10).await.unwrap();
    let shown: Vec<(&str, f64)> = ranking
        .iter()
        .map(|r| (r.nickname.as_str(), r.score))
        .collect();
    assert_eq!(shown, vec![("gus", 10.0), ("fay", 5.0)]);
}
db_test!(an_aborted_sagas_entry_is_hidden_and_a_new_submission_replaces_it);

async fn outbox_seq_grows_per_terminal_and_replays_after(backend: Backend) {
    let f = fixture(backend, 10).await;
    for i in 0..3 {
        f.saga(T0 + i).await;
    }
    let claimed = f.claim(10, T0 + 10).await;
    assert_eq!(claimed.len(), 3);
    for s in &claimed {
        let appended = f
            .store
            .abort(
                &s.id,
                Fence::Token(token(s)),
                AbortReason::InputRejected,
                "mod",
                T0 + 20,
            )
            .await
            .unwrap();
        assert!(appended.event_appended);
    }
    assert!(
        f.store
            .events_after(&f.terminal_id, 0, 100)
            .await
            .unwrap()
            .is_empty(),
        "an event nobody numbered yet is not shown"
    );
    let batch = f.store.number_events(100).await.unwrap();
    assert_eq!(batch.events, 3);
    assert_eq!(batch.terminals, vec![f.terminal_id.clone()]);
    let all = f.store.events_after(&f.terminal_id, 0, 100).await.unwrap();
    assert_eq!(all.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![1, 2, 3]);
    for event in &all {
        assert_eq!(event.payload["type"], "session.rejected");
        assert_eq!(event.payload["reason"], "INPUT_REJECTED");
        assert_eq!(event.payload["seq"], event.seq);
    }
    let after_one: Vec<i64> = f
        .store
        .events_after(&f.terminal_id, 1, 100)
        .await
        .unwrap()
        .iter()
        .map(|e| e.seq)
        .collect();
    assert_eq!(after_one, vec![2, 3]);
    assert_eq!(
        f.store.number_events(100).await.unwrap().events,
        0,
        "nothing is numbered twice"
    );
    let terminal = f.store.terminal(&f.terminal_id).await.unwrap().unwrap();
    assert_eq!(terminal.last_seq, 3);
    assert_numbered_in_id_order(&f.store, &f.terminal_id).await;
}
db_test!(outbox_seq_grows_per_terminal_and_replays_after);

/// Writers end sagas, three relays number concurrently in small batches,
/// and a reader per terminal follows along: every reader sees each `seq`
/// once, in order, with no gap (an event numbered lower never shows up
/// after a higher one), and each terminal's numbers are exactly 1..=n.
async fn numbering_keeps_commit_order_under_concurrent_writers_and_relays(backend: Backend) {
    let f = fixture(backend, 1000).await;
    let second = f
        .store
        .create_terminal(&f.experience_id, "booth 2", "secret2", None, T0)
        .await
        .unwrap()
        .id;
    let terminals = [f.terminal_id.clone(), second];
    for i in 0..240 {
        f.saga_on(&terminals[i % 2], T0 + i as i64).await;
    }
    let claimed = f
        .store
        .claim_runnable(&f.exp(1000), 1000, T0 + 1000, RULES)
        .await
        .unwrap();
    assert_eq!(claimed.len(), 240);

    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writers = {
        let done = done.clone();
        let writers = claimed.chunks(40).map(|chunk| {
            let (store, chunk) = (f.store.clone(), chunk.to_vec());
            actix_web::rt::spawn(async move {
                for s in chunk {
                    let token = s.lock_token.clone().unwrap();
                    let fence = Fence::Token(token.clone());
                    let ended = store
                        .abort(&s.id, fence, AbortReason::Cancelled, "t", T0 + 2000)
                        .await
                        .unwrap();
                    assert!(ended.event_appended);
                }
            })
        });
        let writers = join_all(writers);
        async move {
            for w in writers.await {
                w.expect("writer");
            }
            done.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    };
    let relays = join_all((0..3).map(|_| {
        let (store, done) = (f.store.clone(), done.clone());
        actix_web::rt::spawn(async move {
            loop {
                // Read the flag first: a batch that finds nothing after the
                // last writer committed means the outbox is drained.
                let writers_done = done.load(std::sync::atomic::Ordering::SeqCst);
                if store.number_events(7).await.unwrap().events == 0 {
                    if writers_done {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
        })
    }));
    let readers = join_all(terminals.iter().map(|terminal| {
        let (store, terminal) = (f.store.clone(), terminal.clone());
        actix_web::rt::spawn(async move {
            let mut after = 0;
            let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
            while after < 120 {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "reader stuck at {after}"
                );
                let page = store.events_after(&terminal, after, 13).await.unwrap();
                for event in page {
                    assert_eq!(event.seq, after + 1, "a gap or a repeat after {after}");
                    after = event.seq;
                }
                tokio::task::yield_now().await;
            }
            after
        })
    }));
    let ((), relays, seen) = futures_util::join!(writers, relays, readers);
    for r in relays {
        r.expect("relay");
    }
    let seen: Vec<i64> = seen.into_iter().map(|s| s.expect("reader")).collect();
    assert_eq!(seen, vec![120, 120]);
    for terminal in &terminals {
        let row = f.store.terminal(terminal).await.unwrap().unwrap();
        assert_eq!(row.last_seq, 120, "each terminal numbered 1..=120");
    }
}
db_test!(numbering_keeps_commit_order_under_concurrent_writers_and_relays);

/// A terminal's events are numbered in the order they were appended (their
/// ids), also within one numbering batch. (Only for events appended one
/// after the other: concurrent writers commit out of id order, and the
/// numbers follow the commits.)
async fn assert_numbered_in_id_order(store: &Store, terminal: &str) {
    let rows = store
        .db()
        .query_all_raw(store.sql(
            "SELECT id FROM terminal_events WHERE terminal_id = $1 ORDER BY seq",
            vec![terminal.into()],
        ))
        .await
        .unwrap();
    let ids: Vec<i64> = rows
        .iter()
        .map(|r| r.try_get_by_index(0).unwrap())
        .collect();
    assert!(!ids.is_empty());
    assert!(
        ids.windows(2).all(|w| w[0] < w[1]),
        "numbers out of append order: ids by seq {ids:?}"
    );
}

/// A saga resumed past the AI step needs no AI slot: it is claimed ahead of
/// a long AI queue, even when it is younger than all of it and the AI cap is
/// full (the claim used to look only at the oldest `free + 64`).
async fn resumed_sagas_are_claimed_ahead_of_a_long_ai_queue(backend: Backend) {
    let f = fixture(backend, 1).await;
    let resumed = f.saga(T0).await;
    let first = f.claim(1, T0).await.remove(0);
    assert_eq!(first.id, resumed.id);
    f.store
        .record_ai_done(&first.id, &token(&first), &result("r"), T0 + 1, LEASE)
        .await
        .unwrap();
    let queued_holder = f.saga(T0 + 2).await;
    let holder = f.claim(1, T0 + 3).await.remove(0);
    assert_eq!(holder.id, queued_holder.id);
    for i in 0..200 {
        f.saga(T0 + 10 + i).await;
    }
    // Test setup: make the resumed saga the youngest of all, as if it had
    // been submitted last.
    f.store
        .db()
        .execute_raw(f.store.sql(
            "UPDATE sagas SET created_at_ms = $1 WHERE id = $2",
            vec![(T0 + 10_000).into(), resumed.id.clone().into()],
        ))
        .await
        .unwrap();
    let listed = f
        .store
        .experiences_with_claimable(T0 + 100, RULES)
        .await
        .unwrap();
    assert!(
        !listed[0].has_resumed,
        "its first worker still holds it: {listed:?}"
    );
    // The first worker's lease ran out; the holder keeps its AI slot.
    let now = T0 + 1 + LEASE + 1;
    let listed = f
        .store
        .experiences_with_claimable(now, RULES)
        .await
        .unwrap();
    assert!(listed[0].has_resumed, "{listed:?}");
    f.store
        .renew_lease(&holder.id, &token(&holder), now, LEASE)
        .await
        .unwrap();
    let claimed = f
        .store
        .claim_runnable(&f.exp(1), 1, now, RULES)
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1, "{claimed:?}");
    assert_eq!(claimed[0].id, resumed.id, "the resumed saga goes first");
    assert_eq!(claimed[0].step, "AI_DONE");
    assert_eq!(claimed[0].recoveries, 1);
    assert!(
        f.claim(1, now).await.is_empty(),
        "the AI queue still waits for a slot"
    );
}
db_test!(resumed_sagas_are_claimed_ahead_of_a_long_ai_queue);

/// The dispatcher's list of experiences with work probes each experience's
/// partial indexes and stops at the first claimable saga, however long the
/// queue and whatever the planner's statistics say (here none: a table
/// filled faster than autovacuum analyzes it, as under a rush). PostgreSQL
/// once turned the probes into hashed subplans that read every queued and
/// every held saga of the step on each dispatcher round.
async fn the_list_of_claimable_experiences_stops_at_the_first_saga(backend: Backend) {
    let f = fixture(backend, 5).await;
    let template = f.saga(T0).await;
    f.store
        .insert_bulk_sagas(&template, 1, 2_000, "AI_PENDING", T0)
        .await
        .unwrap();
    // Half the queue is held, its leases running.
    f.store
        .db()
        .execute_raw(f.store.sql(
            "UPDATE sagas SET lock_token = 'held', locked_until_ms = $1 WHERE id IN \
             (SELECT id FROM sagas WHERE prompt = 'bulk' ORDER BY created_at_ms LIMIT 1000)",
            vec![(T0 + 1_000_000).into()],
        ))
        .await
        .unwrap();
    let now = T0 + 1;
    let listed = f
        .store
        .experiences_with_claimable(now, RULES)
        .await
        .unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert!(
        listed[0].has_queued_ai && !listed[0].has_expired_ai && !listed[0].has_resumed,
        "{listed:?}"
    );
    let plan = f
        .store
        .claimable_experiences_plan(now, RULES)
        .await
        .unwrap();
    let probes: Vec<&str> = plan.lines().filter(|l| l.contains("sagas")).collect();
    // Six probes, each a walk of the sagas: none may go unchecked.
    assert!(probes.len() >= 6, "{} probes in\n{plan}", probes.len());
    for line in probes {
        match backend {
            Backend::Postgres => {
                let rows: f64 = line
                    .split("actual time=")
                    .nth(1)
                    .and_then(|a| a.split("rows=").nth(1))
                    .and_then(|r| r.split_whitespace().next())
                    .and_then(|r| r.parse().ok())
                    .unwrap_or_else(|| panic!("no actual rows in {line:?} of\n{plan}"));
                assert!(
                    rows <= 1.0,
                    "a probe read {rows} sagas, not at most one:\n{plan}"
                );
            }
            Backend::Sqlite => assert!(
                line.contains("experience_id=?"),
                "a probe that is not per experience:\n{plan}"
            ),
        }
    }
    assert!(!plan.contains("hashed SubPlan"), "{plan}");
}
db_test!(the_list_of_claimable_experiences_stops_at_the_first_saga);

/// The claim is an ordered walk of `idx_sagas_claim`, whatever the queue
/// length: with 100,000 sagas queued (and finished ones beside them) the
/// database's own plan uses the index for every step. The claim time at
/// 1,000 and at 100,000 queued is printed for the record, not asserted.
async fn claim_walks_the_index_however_long_the_queue(backend: Backend) {
    let f = fixture(backend, 5).await;
    let template = f.saga(T0).await;
    let mut timings = Vec::new();
    for (queued, finished) in [(1_000i64, 1_000i64), (100_000, 10_000)] {
        let have: i64 = count(&f.store, "SELECT COUNT(*) FROM sagas").await;
        f.store
            .insert_bulk_sagas(&template, have, queued, "AI_PENDING", T0)
            .await
            .unwrap();
        f.store
            .insert_bulk_sagas(&template, have + queued, finished, "COMPLETED", T0)
            .await
            .unwrap();
        f.store.db().execute_unprepared("ANALYZE").await.unwrap();
        for step in [Step::AiPending, Step::AiDone, Step::RankingDone] {
            for source in [
                ClaimSource::Unowned,
                ClaimSource::Expired,
                ClaimSource::Holding,
            ] {
                let plan = f
                    .store
                    .claim_plan(&f.experience_id, step, source, T0 + 1, RULES)
                    .await
                    .unwrap();
                let index = match source {
                    ClaimSource::Unowned | ClaimSource::Holding => "idx_sagas_unowned",
                    ClaimSource::Expired => "idx_sagas_leased",
                };
                // The long queue (unowned AI_PENDING) must be walked on its
                // index in age order. The other sources have no rows here,
                // and any index on (experience, step) reaches them at once.
                // Never a full scan of the sagas.
                let full_scan = plan.contains("Seq Scan on sagas") || plan.contains("SCAN sagas");
                let long_queue = (step, source) == (Step::AiPending, ClaimSource::Unowned);
                assert!(
                    !full_scan && (plan.contains(index) || !long_queue),
                    "claim of {step} from {source:?} with {queued} queued:\n{plan}"
                );
                // SQLite: the UPDATE finds the picked rows by key, not by a
                // walk of every runnable saga of the step (which made a
                // claim at 100k queued 10x slower than at 1k).
                if backend == Backend::Sqlite {
                    assert!(
                        plan.contains("(id=?)") && !plan.contains("idx_sagas_step_updated"),
                        "claim of {step} from {source:?}: the update looks the picked ids up:\n{plan}"
                    );
                }
            }
        }
        let started = std::time::Instant::now();
        let claimed = f.claim(5, T0 + 1).await;
        timings.push((queued, started.elapsed()));
        assert_eq!(claimed.len(), 5);
        // Give the slots back for the next size (nothing was submitted in
        // them).
        for s in claimed {
            f.store
                .abort_freeing(
                    &s.id,
                    Fence::Token(token(&s)),
                    AbortReason::Cancelled,
                    "t",
                    vec![(0, Evidence::NeverSubmitted)],
                    T0 + 2,
                )
                .await
                .unwrap();
        }
    }
    eprintln!("claim of 5 ({backend:?}): {timings:?}");
}
db_test!(claim_walks_the_index_however_long_the_queue);

async fn count(store: &Store, sql: &str) -> i64 {
    let row = store
        .db()
        .query_one_raw(store.sql(sql, vec![]))
        .await
        .unwrap()
        .unwrap();
    row.try_get_by_index::<i64>(0).unwrap()
}

/// Many sagas' writes in one transaction, each judged on its own terms: a
/// stale token loses only its own write, a repeat is success, the ends
/// write their results, session states and outbox events.
async fn a_batch_applies_each_write_on_its_own_terms(backend: Backend) {
    let f = fixture(backend, 10).await;
    for i in 0..4 {
        f.saga(T0 + i).await;
    }
    let s = f.claim(10, T0 + 10).await;
    let (a, b, c, d) = (&s[0], &s[1], &s[2], &s[3]);
    let done = |saga: &sagas::Model, token: &str, text: &str| SagaWrite::AiDone {
        saga_id: saga.id.clone(),
        token: token.to_owned(),
        result: result(text),
        job_id: Some(format!("job-{text}")),
    };
    let out = f
        .store
        .apply_saga_writes(
            &[
                done(a, &token(a), "a"),
                done(b, &token(b), "b"),
                done(c, "stale", "c"),
            ],
            T0 + 20,
            LEASE,
        )
        .await
        .unwrap();
    assert!(out[0].is_ok() && out[1].is_ok(), "{out:?}");
    assert!(out[2].as_ref().unwrap_err().is_lease_lost(), "{out:?}");
    let row = f.store.saga(&a.id).await.unwrap().unwrap();
    assert_eq!(row.step, "AI_DONE");
    assert_eq!(row.ai_job_id.as_deref(), Some("job-a"));
    assert_eq!(
        row.locked_until_ms,
        Some(T0 + 20 + LEASE),
        "the lease was renewed"
    );

    let ranked = |saga: &sagas::Model| SagaWrite::RankingDone {
        saga_id: saga.id.clone(),
        token: token(saga),
        entry: None,
        after_review: false,
    };
    let out = f
        .store
        .apply_saga_writes(
            &[ranked(a), ranked(b), done(c, &token(c), "c")],
            T0 + 30,
            LEASE,
        )
        .await
        .unwrap();
    assert!(out.iter().all(Result::is_ok), "{out:?}");

    let complete = |saga: &sagas::Model| SagaWrite::Complete {
        saga_id: saga.id.clone(),
        token: token(saga),
    };
    let out = f
        .store
        .apply_saga_writes(
            &[
                complete(a),
                complete(b),
                SagaWrite::Abort {
                    saga_id: d.id.clone(),
                    fence: Fence::Token(token(d)),
                    reason: AbortReason::AiFailed,
                    detail: "gave up".into(),
                    free_calls: Vec::new(),
                    audit: None,
                },
                // c is at AI_DONE: the same result again is a repeat.
                done(c, &token(c), "c"),
            ],
            T0 + 40,
            LEASE,
        )
        .await
        .unwrap();
    let appended: Vec<bool> = out
        .iter()
        .map(|o| o.as_ref().expect("applied").event_appended)
        .collect();
    assert_eq!(appended, vec![true, true, true, false]);
    let again = f
        .store
        .apply_saga_writes(&[complete(a)], T0 + 50, LEASE)
        .await
        .unwrap();
    assert!(
        !again[0].as_ref().unwrap().event_appended,
        "a repeat appends nothing"
    );

    f.store.number_events(100).await.unwrap();
    let events = f.store.events_after(&f.terminal_id, 0, 100).await.unwrap();
    let kinds: Vec<&str> = events
        .iter()
        .map(|e| e.payload["type"].as_str().unwrap())
        .collect();
    assert_eq!(kinds.len(), 3);
    assert_eq!(
        kinds.iter().filter(|k| **k == "session.completed").count(),
        2
    );
    assert_eq!(kinds.iter().filter(|k| **k == "session.aborted").count(), 1);
    for saga in [a, b] {
        let session = f.store.session(&saga.session_id).await.unwrap().unwrap();
        assert_eq!(session.status, "COMPLETED");
    }
    let session = f.store.session(&d.session_id).await.unwrap().unwrap();
    assert_eq!(session.status, "ABORTED");
    assert_eq!(session.abort_reason.as_deref(), Some("AI_FAILED"));
}
db_test!(a_batch_applies_each_write_on_its_own_terms);

/// The ranking write is fenced against an abort that commits while it
/// runs (PostgreSQL; SQLite has one writer): an operator's cancel holds
/// the saga's row when the ranking write starts, and commits afterwards.
/// The write must wait for it and then find the saga ABORTED, so no visible
/// entry is left for an aborted session. Before, the write's snapshot still
/// saw AI_DONE: it inserted an entry the abort had already hidden its
/// entries without, and the ABORTED session stayed ranked.
#[actix_web::test]
#[cfg_attr(not(pg_tests), ignore = "STAGEHAND_TEST_POSTGRES_URL is not set")]
async fn a_cancel_committing_during_the_ranking_write_leaves_no_entry() {
    use sea_orm::TransactionTrait;
    let f = fixture(Backend::Postgres, 5).await;
    f.saga(T0).await;
    let s = f.claim(5, T0).await.remove(0);
    let t = token(&s);
    f.store
        .record_ai_done(&s.id, &t, &result("a"), T0 + 1, LEASE)
        .await
        .unwrap();
    // The operator's cancel, holding the saga's row, not committed yet.
    let cancel = f.store.db().begin().await.unwrap();
    cancel
        .execute_unprepared(&format!(
            "UPDATE sagas SET step = 'ABORTED', abort_reason = 'CANCELLED' WHERE id = '{}'",
            s.id
        ))
        .await
        .unwrap();
    cancel
        .execute_unprepared(&format!(
            "UPDATE score_attempts SET hidden = true WHERE saga_id = '{}'",
            s.id
        ))
        .await
        .unwrap();
    let store = f.store.clone();
    let entry = ScoreEntry {
        experience_id: s.experience_id.clone(),
        session_id: s.session_id.clone(),
        saga_id: s.id.clone(),
        token: t.clone(),
        score: 10.0,
    };
    let write = actix_web::rt::spawn(async move { store.register_scores(&[entry], T0 + 2).await });
    // Wait until the write either finished or waits on the saga's row.
    let waiting = support::wait_for(std::time::Duration::from_secs(5), || async {
        let waiting = support::lock_waiters(&f.store).await;
        (waiting > 0 || write.is_finished()).then_some(waiting)
    })
    .await;
    assert!(
        waiting.is_some(),
        "the ranking write neither finished nor waited"
    );
    cancel.commit().await.unwrap();
    let outcome = write.await.unwrap().unwrap().remove(0);
    assert!(
        outcome.is_err(),
        "the write of an aborted saga succeeded: {outcome:?}"
    );
    let visible = f
        .store
        .db()
        .query_one_raw(f.store.sql(
            "SELECT COUNT(*) FROM score_attempts WHERE saga_id = $1 AND NOT hidden",
            vec![s.id.clone().into()],
        ))
        .await
        .unwrap()
        .unwrap();
    let visible: i64 = visible.try_get_by_index(0).unwrap();
    assert_eq!(visible, 0, "the ABORTED session is ranked");
}

/// One bad row fails alone: an abort in a batch that the database refuses
/// (here a trigger raises for that saga) leaves the batch's other writes
/// applied. Before, its error failed the whole batch (up to 256 sagas), and
/// every other saga of it had to run its step again.
async fn a_failing_abort_fails_alone_in_its_batch(backend: Backend) {
    let f = fixture(backend, 5).await;
    f.saga(T0).await;
    f.saga(T0 + 1).await;
    let mut claimed = f.claim(5, T0 + 10).await;
    let (bad, good) = (claimed.remove(0), claimed.remove(0));
    let trigger = match backend {
        Backend::Postgres => vec![
            format!(
                "CREATE FUNCTION stagehand_test_bad_row() RETURNS trigger AS $$ BEGIN \
                 IF NEW.id = '{}' THEN RAISE EXCEPTION 'bad row'; END IF; RETURN NEW; END \
                 $$ LANGUAGE plpgsql",
                bad.id
            ),
            "CREATE TRIGGER bad_row BEFORE UPDATE ON sagas FOR EACH ROW \
             EXECUTE FUNCTION stagehand_test_bad_row()"
                .to_owned(),
        ],
        Backend::Sqlite => vec![format!(
            "CREATE TRIGGER bad_row BEFORE UPDATE ON sagas WHEN NEW.id = '{}' \
             BEGIN SELECT RAISE(ABORT, 'bad row'); END",
            bad.id
        )],
    };
    for statement in trigger {
        f.store.db().execute_unprepared(&statement).await.unwrap();
    }
    let writes = [
        SagaWrite::Abort {
            saga_id: bad.id.clone(),
            fence: Fence::Token(token(&bad)),
            reason: AbortReason::AiFailed,
            detail: "gave up".into(),
            free_calls: Vec::new(),
            audit: None,
        },
        SagaWrite::AiDone {
            saga_id: good.id.clone(),
            token: token(&good),
            result: result("fine"),
            job_id: Some("job-good".into()),
        },
    ];
    let outcome = f
        .store
        .apply_saga_writes(&writes, T0 + 20, LEASE)
        .await
        .expect("the batch itself commits");
    assert!(outcome[0].is_err(), "{:?}", outcome[0]);
    assert!(outcome[1].is_ok(), "{:?}", outcome[1]);
    let good_now = f.store.saga(&good.id).await.unwrap().unwrap();
    assert_eq!(good_now.step, "AI_DONE");
    let bad_now = f.store.saga(&bad.id).await.unwrap().unwrap();
    assert_eq!(
        bad_now.step, "AI_PENDING",
        "the failed abort changed nothing"
    );
}
db_test!(a_failing_abort_fails_alone_in_its_batch);

/// What the statistics count of `table` (`pg_stat_user_tables`): the
/// statements whose effect this waits for.
enum Counted {
    /// Rows updated.
    Updates,
    /// Sequential and index scans started.
    Scans,
}

/// Rows read by sequential scans of `table` so far, once the statistics
/// count at least `at_least` of `counted` (each backend reports them within
/// about a second of going idle, so this waits for the last statement's).
async fn rows_read_by_table_scans(
    store: &Store,
    table: &str,
    counted: Counted,
    at_least: i64,
) -> i64 {
    let counter = match counted {
        Counted::Updates => "n_tup_upd",
        Counted::Scans => "seq_scan + COALESCE(idx_scan, 0)",
    };
    let stmt = store.sql(
        &format!("SELECT seq_tup_read, {counter} FROM pg_stat_user_tables WHERE relname = $1"),
        vec![table.into()],
    );
    support::wait_for(Duration::from_secs(30), || async {
        let row = store.db().query_one_raw(stmt.clone()).await.unwrap()?;
        let (read, counted): (i64, i64) = (
            row.try_get_by_index(0).unwrap(),
            row.try_get_by_index(1).unwrap(),
        );
        (counted >= at_least).then_some(read)
    })
    .await
    .unwrap_or_else(|| panic!("the statistics of {table} never counted {at_least} of {counter}"))
}

/// A connection plans a statement generically after a few runs, while the
/// tables are young, and keeps that plan as they grow until they are next
/// analyzed: the batched statements must find a batch's rows by key
/// whatever the table held when they were planned. With generic plans from
/// the first run on an empty database, then 20,000 keys and 20,000
/// sessions, finishing a key and reading two sessions by id (with their
/// admission figures, as a submission batch reads them) read a handful
/// of rows, not the tables (before: the read of two sessions scanned all
/// 20,000; the finish's old plan happened to probe the index here, though
/// in a paced bench run such a plan scanned the table). SQLite plans each
/// run: there the same calls only have to work.
async fn batched_statements_find_rows_by_key_on_tables_grown_after_planning(backend: Backend) {
    const GROWN: i64 = 20_000;
    /// Session reads at once, young and grown: the grown ones find the
    /// connections the young ones opened idle, so each reads with a plan
    /// made on the young table (a lone read could land on a connection
    /// opened after the growth, which plans on the grown table).
    const READS: usize = 8;
    let f = fixture(backend, 5).await;
    let pg = backend == Backend::Postgres;
    if pg {
        f.store
            .db()
            .execute_unprepared(&format!(
                "ALTER DATABASE \"{}\" SET plan_cache_mode = force_generic_plan",
                f._db.name()
            ))
            .await
            .unwrap();
    }
    // New connections, which take the setting: plans made on empty tables.
    let store = f._db.store().await;
    let day = 24 * 3_600_000;
    let answer = StoredAnswer {
        status: 202,
        body: "{}".into(),
    };
    let young = key_request("session:young", "k", "token", b"{}");
    assert_eq!(
        store.claim_key(&young, T0, day).await.unwrap(),
        KeyClaim::Fresh
    );
    store.finish_key(&young, &answer).await.unwrap();
    // Reads at once: each connection they open plans on the young table.
    let none = ["none".to_owned()];
    for read in join_all((0..READS).map(|_| store.read_submissions(&none, T0))).await {
        assert!(read.unwrap().0.is_empty());
    }

    for grow in [
        format!(
            "WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < {GROWN}) \
             INSERT INTO idempotency_records (scope, key, request_hash, state, created_at_ms, \
             expires_at_ms) SELECT 'session:grown', 'k' || n, 'h', 'completed', {T0}, {} FROM g",
            T0 + day
        ),
        format!(
            "WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < {GROWN}) \
             INSERT INTO sessions (id, experience_id, nickname, participant_token_hash, status, \
             created_at_ms, updated_at_ms) SELECT 'grown-' || n, '{}', 'n', 'h-' || n, 'OPEN', \
             {T0}, {T0} FROM g",
            f.experience_id
        ),
    ] {
        store.db().execute_unprepared(&grow).await.unwrap();
    }

    let grown = key_request("session:young", "k2", "token", b"{}");
    assert_eq!(
        store.claim_key(&grown, T0, day).await.unwrap(),
        KeyClaim::Fresh
    );
    store.finish_key(&grown, &answer).await.unwrap();
    assert_eq!(
        store.claim_key(&grown, T0, day).await.unwrap(),
        KeyClaim::Replay(answer.clone()),
        "the answer was stored on the grown table"
    );
    // As many again on the grown table: each connection reads with its plan.
    let two = ["grown-17".to_owned(), "grown-18".to_owned()];
    for read in join_all((0..READS).map(|_| store.read_submissions(&two, T0))).await {
        assert_eq!(read.unwrap().0.len(), 2);
    }

    if pg {
        // Two finishes (one row updated each), all the session reads.
        let keys =
            rows_read_by_table_scans(&store, "idempotency_records", Counted::Updates, 2).await;
        let sessions =
            rows_read_by_table_scans(&store, "sessions", Counted::Scans, 2 * READS as i64).await;
        assert!(
            keys < 1_000 && sessions < 1_000,
            "rows read by table scans: {keys} of idempotency_records, {sessions} of sessions \
             ({GROWN} rows each): the generic plans made on the empty tables scan them"
        );
    }
}
db_test!(batched_statements_find_rows_by_key_on_tables_grown_after_planning);

/// Forty writers at once through `write_tx` and `write_one`: each one that
/// commits finds its row readable on another connection as soon as its
/// commit returns; one that rolls back, or is dropped uncommitted, leaves
/// no row and takes nobody else's with it. On SQLite the writers that
/// queued together share commits (the write gate's group commit), so
/// there are fewer commits than committed writers.
async fn writers_that_queue_together_share_a_commit_and_fail_alone(backend: Backend) {
    let f = fixture(backend, 10).await;
    let store = &f.store;
    store
        .db()
        .execute_unprepared("CREATE TABLE gate_probe (n INTEGER PRIMARY KEY)")
        .await
        .unwrap();
    let before = store.group_commits();
    let insert = |n: i64| store.sql("INSERT INTO gate_probe (n) VALUES ($1)", vec![n.into()]);
    let visible = |n: i64| async move {
        count(
            store,
            &format!("SELECT COUNT(*) FROM gate_probe WHERE n = {n}"),
        )
        .await
    };
    let writers = (0..40i64).map(|n| async move {
        match n % 5 {
            // One statement through the gate.
            4 => {
                assert_eq!(store.write_one(insert(n)).await.unwrap(), 1);
                assert_eq!(
                    visible(n).await,
                    1,
                    "writer {n} committed, row not readable"
                );
                true
            }
            ending => {
                let tx = store.write_tx().await.unwrap();
                tx.execute_raw(insert(n)).await.unwrap();
                // Another statement after a hand-over: the gate is held
                // across awaits.
                tokio::task::yield_now().await;
                tx.execute_raw(insert(n + 1000)).await.unwrap();
                match ending {
                    0 => {
                        tx.rollback().await.unwrap();
                        false
                    }
                    1 => {
                        drop(tx);
                        false
                    }
                    _ => {
                        tx.commit().await.unwrap();
                        assert_eq!(
                            visible(n).await,
                            1,
                            "writer {n} committed, row not readable"
                        );
                        true
                    }
                }
            }
        }
    });
    let committed: Vec<bool> = join_all(writers).await;
    for (n, kept) in committed.iter().enumerate() {
        let n = n as i64;
        let want = i64::from(*kept);
        assert_eq!(visible(n).await, want, "writer {n}");
        if n % 5 != 4 {
            assert_eq!(visible(n + 1000).await, want, "writer {n}'s second row");
        }
    }
    let writers_committed = committed.iter().filter(|k| **k).count() as u64;
    assert_eq!(writers_committed, 24);
    if let (Some((commits_before, members_before)), Some((commits, members))) =
        (before, store.group_commits())
    {
        let (commits, members) = (commits - commits_before, members - members_before);
        assert_eq!(
            members, writers_committed,
            "every committed writer counted once"
        );
        assert!(
            commits < members,
            "writers queued together share commits: {commits} commits for {members} writers"
        );
    }
}
db_test!(writers_that_queue_together_share_a_commit_and_fail_alone);

/// Every claim round counts the slots in use (`ai_slots`, one row per job
/// that may run). That count must cost what the slots cost, however many
/// sagas the database holds: with 20,000 finished sagas, and the ledger's
/// statistics left over from a busier moment (the table's churn: 2,000
/// rows when last analyzed, 10 now), its plan reads the slots and probes
/// each one's saga by key, and never scans the sagas (before: a hash join
/// over every saga of the database, 11 ms per claim round at 14,000
/// sagas in a bench run, growing with the table).
async fn the_slot_count_reads_the_slots_not_every_saga(backend: Backend) {
    let f = fixture(backend, 5).await;
    let template = f.saga(T0).await;
    f.store
        .insert_bulk_sagas(&template, 1, 20_000, "COMPLETED", T0)
        .await
        .unwrap();
    let slots = |n: i64| {
        format!(
            "WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < {n}) \
             INSERT INTO ai_slots (id, provider, experience_id, saga_id, call_index, base_key, \
             key_attempt, detached, created_at_ms, updated_at_ms) \
             SELECT 'slot-' || n, 'default', '{}', 'gone-' || n, 0, 'k-' || n, 0, false, {T0}, {T0} \
             FROM g",
            f.experience_id
        )
    };
    let db = f.store.db();
    db.execute_unprepared(&slots(2_000)).await.unwrap();
    db.execute_unprepared("ANALYZE").await.unwrap();
    db.execute_unprepared("DELETE FROM ai_slots WHERE saga_id NOT IN ('gone-1', 'gone-2', 'gone-3', 'gone-4', 'gone-5', 'gone-6', 'gone-7', 'gone-8', 'gone-9', 'gone-10')")
        .await
        .unwrap();
    let plan = f.store.slot_count_plan("default", T0).await.unwrap();
    let scans_sagas = plan.contains("Seq Scan on sagas")
        || plan.contains("Bitmap Heap Scan on sagas")
        || plan.contains("SCAN sagas")
        || plan.contains("SCAN s ");
    assert!(
        !scans_sagas,
        "the slot count must probe each slot's saga by key:\n{plan}"
    );
    let counts = stagehand::store::ledger::slots_in_use(db, Some("default"), T0)
        .await
        .unwrap();
    assert_eq!(counts.provider_total("default"), 10, "{plan}");
}
db_test!(the_slot_count_reads_the_slots_not_every_saga);

/// Issue 46: a saga that names no photo (every saga of a prompt-only
/// experience) has no entry in `sagas_by_photo`, so its insert and each
/// step's UPDATE do not write that index; the photo question
/// (`photo_id = $1`) is still answered from it. Before, the index held a
/// NULL entry for every saga and every version of its row. Likewise
/// `sessions_with_objects_left` holds only the sessions whose files wait
/// to be deleted, and the purge's claim still reads it.
async fn only_sagas_with_a_photo_are_in_the_photo_index(backend: Backend) {
    let f = fixture(backend, 5).await;
    let template = f.saga(T0).await;
    f.store
        .insert_bulk_sagas(&template, 1, 5_000, "COMPLETED", T0)
        .await
        .unwrap();
    let db = f.store.db();
    let definition = index_definition(&f.store, "sagas_by_photo").await;
    assert!(
        definition.contains("where photo_id is not null"),
        "sagas_by_photo must hold only the sagas that name a photo: {definition}"
    );
    let definition = index_definition(&f.store, "sessions_with_objects_left").await;
    assert!(
        definition.contains("where objects_left = true"),
        "sessions_with_objects_left must hold only the sessions with files left: {definition}"
    );
    // An event's sessions, none with files left to delete.
    db.execute_unprepared(&format!(
        "WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < 5000) \
         INSERT INTO sessions (id, experience_id, nickname, participant_token_hash, status, \
         created_at_ms, updated_at_ms) \
         SELECT 'bulk-' || n, '{}', 'guest', 'token-' || n, 'COMPLETED', {T0}, {T0} FROM g",
        f.experience_id
    ))
    .await
    .unwrap();
    if f.store.is_postgres() {
        db.execute_unprepared("ANALYZE sagas, sessions")
            .await
            .unwrap();
    }
    let plan = f.store.photo_question_plan("p-1").await.unwrap();
    assert!(
        plan.contains("sagas_by_photo"),
        "the photo question must still be answered from sagas_by_photo:\n{plan}"
    );
    let plan = f.store.session_purges_plan(T0, 10).await.unwrap();
    assert!(
        plan.contains("sessions_with_objects_left"),
        "the purge's claim must read sessions_with_objects_left:\n{plan}"
    );
}
db_test!(only_sagas_with_a_photo_are_in_the_photo_index);

/// Index `name`'s definition as the database keeps it, in lower case and
/// without parentheses (PostgreSQL writes a predicate in them, SQLite as
/// given).
async fn index_definition(store: &Store, name: &str) -> String {
    let query = if store.is_postgres() {
        "SELECT indexdef FROM pg_indexes WHERE indexname = $1"
    } else {
        "SELECT sql FROM sqlite_master WHERE type = 'index' AND name = $1"
    };
    let definition: String = store
        .db()
        .query_one_raw(store.sql(query, vec![name.into()]))
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("index {name} exists"))
        .try_get_by_index(0)
        .unwrap();
    definition.to_lowercase().replace(['(', ')'], "")
}
