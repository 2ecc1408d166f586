//! Store tests, on SQLite and on PostgreSQL: the claim (one winner among many
//! claimers, the capacity cap), fencing of a worker whose lease expired and
//! was re-claimed, idempotent and conflicting transitions, the ranking and
//! the outbox. Times are fixed numbers, not the clock.

mod support;

use futures_util::future::join_all;
use stagehand::domain::failure::{AiResult, ContentItem};
use stagehand::domain::policy::AttemptState;
use stagehand::domain::saga::{AbortReason, Step, TransitionError};
use stagehand::store::entities::sagas;
use stagehand::store::experiences::NewExperience;
use stagehand::store::sagas::{ClaimRules, Fence};
use stagehand::store::sessions::Submission;
use stagehand::store::{Store, StoreError};
use support::{Backend, TestDb};

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
            },
            T0,
        )
        .await
        .unwrap();
    let terminal = store
        .create_terminal(&exp.id, "booth", "secret", T0)
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
    /// A submitted session: one runnable saga, created at `at`.
    async fn saga(&self, at: i64) -> sagas::Model {
        let session = self
            .store
            .create_session(
                &self.experience_id,
                Some(self.terminal_id.clone()),
                "nick",
                &uuid::Uuid::new_v4().to_string(),
                at,
            )
            .await
            .unwrap();
        self.store
            .submit(
                &session,
                Submission {
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
            .claim_runnable(&self.experience_id, max_in_flight, now, RULES)
            .await
            .unwrap()
    }
}

fn result(text: &str) -> AiResult {
    AiResult {
        content: vec![ContentItem {
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
        let exp = f.experience_id.clone();
        actix_web::rt::spawn(async move { store.claim_runnable(&exp, 5, T0 + 1, RULES).await })
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
        let exp = f.experience_id.clone();
        actix_web::rt::spawn(async move { store.claim_runnable(&exp, 3, T0 + 100, RULES).await })
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
            Fence::Token(&token(&first)),
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
    let event = f
        .store
        .complete(&s.id, &t, T0 + 5)
        .await
        .unwrap()
        .expect("event");
    assert_eq!(event.seq, 1);
    assert_eq!(event.payload["type"], "session.completed");
    assert_eq!(f.store.complete(&s.id, &t, T0 + 6).await.unwrap(), None);
    assert_eq!(
        f.store
            .events_after(&f.terminal_id, 0, 100)
            .await
            .unwrap()
            .len(),
        1
    );
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
        .release_for_retry(&s.id, &token(&s), state, T0 + 5_000, false, T0 + 10)
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
    let event = f
        .store
        .abort(
            &s.id,
            Fence::Unowned,
            AbortReason::Orphaned,
            "gone",
            T0 + LEASE + 1,
        )
        .await
        .unwrap()
        .expect("terminal event");
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

async fn one_ranking_entry_per_session(backend: Backend) {
    let f = fixture(backend, 5).await;
    let a = f.saga(T0).await;
    let b = f.saga(T0 + 1).await;
    let first = f
        .store
        .register_score(&f.experience_id, &a.session_id, &a.id, "ann", 10.0, T0)
        .await
        .unwrap();
    let again = f
        .store
        .register_score(&f.experience_id, &a.session_id, &a.id, "ann", 10.0, T0 + 1)
        .await
        .unwrap();
    assert_eq!(first.score_attempt_id, again.score_attempt_id);
    let better = f
        .store
        .register_score(&f.experience_id, &b.session_id, &b.id, "bob", 20.0, T0 + 2)
        .await
        .unwrap();
    assert_eq!(better.rank, 1);
    let ranking = f.store.ranking(&f.experience_id, 10).await.unwrap();
    assert_eq!(ranking.len(), 2);
    assert_eq!((ranking[0].nickname.as_str(), ranking[0].rank), ("bob", 1));
    assert_eq!((ranking[1].nickname.as_str(), ranking[1].rank), ("ann", 2));
}
db_test!(one_ranking_entry_per_session);

async fn outbox_seq_grows_per_terminal_and_replays_after(backend: Backend) {
    let f = fixture(backend, 10).await;
    for i in 0..3 {
        f.saga(T0 + i).await;
    }
    let claimed = f.claim(10, T0 + 10).await;
    assert_eq!(claimed.len(), 3);
    let mut seqs = Vec::new();
    for s in &claimed {
        let event = f
            .store
            .abort(
                &s.id,
                Fence::Token(&token(s)),
                AbortReason::InputRejected,
                "mod",
                T0 + 20,
            )
            .await
            .unwrap()
            .unwrap();
        assert_eq!(event.payload["type"], "session.rejected");
        assert_eq!(event.payload["reason"], "INPUT_REJECTED");
        seqs.push(event.seq);
    }
    assert_eq!(seqs, vec![1, 2, 3]);
    let after_one: Vec<i64> = f
        .store
        .events_after(&f.terminal_id, 1, 100)
        .await
        .unwrap()
        .iter()
        .map(|e| e.seq)
        .collect();
    assert_eq!(after_one, vec![2, 3]);
}
db_test!(outbox_seq_grows_per_terminal_and_replays_after);
