//! Double click, credits and closing time, on SQLite and on PostgreSQL:
//! one session submitted many times at once starts once; an experience's
//! credits are taken exactly (never overdrawn) under concurrency, and given
//! back exactly once when a saga aborts for a reason that is not the
//! participant's fault, however many abort paths race; an operator's retry
//! of a refunded saga is charged again; a closed experience, or one that
//! closes before the estimated wait ends, refuses with 409 `closing`; the
//! 202 tells the queue position and the estimated wait.
//!
//! Black box through HTTP where the outcome is visible there; the races of
//! abort paths and the estimate with fixed times drive the store directly.

mod support;

use std::time::Duration;

use futures_util::future::join_all;
use sea_orm::ConnectionTrait;
use serde_json::{json, Value};
use stagehand::ai::simulator::SimConfig;
use stagehand::domain::admission::Admission;
use stagehand::domain::failure::{AiResult, ContentItem};
use stagehand::domain::saga::AbortReason;
use stagehand::store::entities::{sagas, sessions};
use stagehand::store::experiences::NewExperience;
use stagehand::store::sagas::{ClaimRules, ClaimableExperience, Fence};
use stagehand::store::submissions::{
    AdmissionReads, Submission, SubmissionAction, SubmissionOrder, SubmissionOutcome,
};
use stagehand::store::{Store, StoreError};
use support::{Backend, Instance, TestApp, TestDb, OPERATOR};

const WITHIN: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------- HTTP

/// Creates an experience with the given extra fields; its slug.
async fn experience_with(app: &TestApp, extra: Value) -> String {
    let slug = format!("cr-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let mut body = json!({"slug": slug, "title": "Booth", "kind": "comic", "ai_calls": 1});
    for (k, v) in extra.as_object().expect("an object") {
        body[k] = v.clone();
    }
    let resp = app
        .http
        .post(format!("{}/api/experiences", app.base))
        .bearer_auth(OPERATOR)
        .json(&body)
        .send()
        .await
        .expect("POST /api/experiences");
    assert_eq!(resp.status(), 201, "{:?}", resp.text().await);
    slug
}

/// The credits left, as operators read them in `GET /api/experiences`.
async fn credits_left(app: &TestApp, slug: &str) -> Value {
    let (status, body) = app.operator_get("/api/experiences").await;
    assert_eq!(status, 200, "{body}");
    body["experiences"]
        .as_array()
        .and_then(|all| all.iter().find(|e| e["slug"] == slug))
        .map(|e| e["credits"].clone())
        .unwrap_or_else(|| panic!("no experience {slug} in {body}"))
}

/// Status, error code (None on success), replay header and body.
async fn answer_of(resp: reqwest::Response) -> (u16, Option<String>, bool, Value) {
    let status = resp.status().as_u16();
    let replayed = resp.headers().get("Idempotent-Replayed").is_some();
    let body: Value = resp.json().await.expect("answers are JSON");
    let code = body["error"].as_str().map(str::to_owned);
    if code.is_some() {
        assert!(body["message"].is_string(), "{body}");
    }
    (status, code, replayed, body)
}

async fn one_session_double_submitted_with_many_keys_starts_once(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let slug = experience_with(&app, json!({"max_in_flight": 5, "credits": 10})).await;
    let (sid, tok) = app.session(&slug, None, "double").await;
    let body = json!({"prompt": "tap tap"});
    let keys: Vec<String> = (0..20).map(|i| format!("k-{i}")).collect();
    let answers = join_all(keys.iter().map(|k| app.submit(&sid, &tok, body.clone(), k))).await;
    let mut accepted = Vec::new();
    let mut refused = 0;
    for resp in answers {
        match answer_of(resp).await {
            (202, None, false, body) => accepted.push(body),
            (409, Some(code), false, _) if code == "already_submitted" => refused += 1,
            other => panic!("unexpected answer {other:?}"),
        }
    }
    assert_eq!(accepted.len(), 1, "exactly one 202: {accepted:?}");
    assert_eq!(refused, 19);
    let ok = &accepted[0];
    assert_eq!(ok["session_id"], sid.as_str());
    assert_eq!(ok["queue_position"], 1, "{ok}");
    assert!(
        ok.get("eta_seconds").is_some_and(Value::is_null),
        "no AI history yet: {ok}"
    );
    // One charge, one job.
    assert_eq!(credits_left(&app, &slug).await, 9);
    assert_eq!(
        app.wait_final(&sid, &tok, WITHIN).await["status"],
        "COMPLETED"
    );
    assert_eq!(app.sim.control.stats().jobs_created, 1);
    assert_eq!(
        credits_left(&app, &slug).await,
        9,
        "a completed saga keeps its credit"
    );
    app.stop().await;
}
db_test!(one_session_double_submitted_with_many_keys_starts_once);

async fn credits_are_exhausted_exactly_under_concurrency(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let slug = experience_with(&app, json!({"max_in_flight": 5, "credits": 5})).await;
    assert_eq!(credits_left(&app, &slug).await, 5);
    let mut sessions = Vec::new();
    for i in 0..20 {
        sessions.push(app.session(&slug, None, &format!("p{i}")).await);
    }
    // On PostgreSQL half of them go through a second instance: the credits
    // are exact across instances too.
    let other = match backend {
        Backend::Postgres => Some(Instance::start(&app.db, &app.sim.url(), |_| {}).await),
        Backend::Sqlite => None,
    };
    let answers =
        join_all(sessions.iter().enumerate().map(|(i, (sid, tok))| {
            let base = match (&other, i % 2) {
                (Some(other), 1) => other.base.clone(),
                _ => app.base.clone(),
            };
            let http = app.http.clone();
            async move {
                support::submit(&http, &base, sid, tok, json!({"prompt": "go"}), "key-1").await
            }
        }))
        .await;
    let mut accepted = Vec::new();
    let mut exhausted = Vec::new();
    for (resp, session) in answers.into_iter().zip(&sessions) {
        match answer_of(resp).await {
            (202, None, _, _) => accepted.push(session.clone()),
            (402, Some(code), false, _) if code == "budget_exhausted" => {
                exhausted.push(session.clone())
            }
            other => panic!("unexpected answer {other:?}"),
        }
    }
    assert_eq!(accepted.len(), 5, "exactly the credits' worth is accepted");
    assert_eq!(exhausted.len(), 15);
    assert_eq!(credits_left(&app, &slug).await, 0);
    for (sid, tok) in &exhausted {
        assert_eq!(app.status(sid, tok).await["status"], "OPEN");
    }
    // A 402 is about the moment: the key was released, so the same
    // request is decided again (and refused again), not replayed.
    let (sid, tok) = &exhausted[0];
    let again = app.submit(sid, tok, json!({"prompt": "go"}), "key-1").await;
    let (status, code, replayed, _) = answer_of(again).await;
    assert_eq!(
        (status, code.as_deref(), replayed),
        (402, Some("budget_exhausted"), false)
    );

    support::wait_all_final(&app.http, &app.base, &accepted, WITHIN)
        .await
        .expect("the accepted sagas end");
    for (sid, tok) in &accepted {
        assert_eq!(app.status(sid, tok).await["status"], "COMPLETED");
    }
    assert_eq!(
        credits_left(&app, &slug).await,
        0,
        "never negative, nothing refunded"
    );
    assert_eq!(app.sim.control.stats().jobs_created, 5);
    if let Some(other) = other {
        other.stop().await;
    }
    app.stop().await;
}
db_test!(credits_are_exhausted_exactly_under_concurrency);

async fn cancel_refunds_once_and_retry_charges_again(backend: Backend) {
    // The AI never answers in time: the sagas stay AI_PENDING until cancelled.
    let sim = SimConfig {
        latency: Duration::from_secs(600),
        ..support::fast_sim()
    };
    let app = TestApp::spawn_with(backend, sim, |_| {}).await;
    let slug = experience_with(&app, json!({"max_in_flight": 5, "credits": 1})).await;
    let (a, a_tok) = app.session(&slug, None, "a").await;
    let (status, _, _, body) =
        answer_of(app.submit(&a, &a_tok, json!({"prompt": "x"}), "k").await).await;
    assert_eq!(status, 202, "{body}");
    let saga = body["saga_id"].as_str().unwrap().to_owned();
    assert_eq!(credits_left(&app, &slug).await, 0);

    let cancel = format!("/api/admin/sagas/{saga}/cancel");
    let (status, _, body) = app.operator_post(&cancel, None).await;
    assert_eq!(status, 200, "{body}");
    let ended = app.wait_final(&a, &a_tok, WITHIN).await;
    assert_eq!(ended["abort_reason"], "CANCELLED");
    assert_eq!(credits_left(&app, &slug).await, 1, "cancelled: given back");
    // Cancelling again is answered 200 and gives nothing more back.
    let (status, _, _) = app.operator_post(&cancel, None).await;
    assert_eq!(status, 200);
    assert_eq!(credits_left(&app, &slug).await, 1);

    // The retry of a refunded saga is charged again...
    let retry = format!("/api/admin/sagas/{saga}/retry");
    let (status, _, body) = app.operator_post(&retry, None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(credits_left(&app, &slug).await, 0);
    let (status, _, _) = app.operator_post(&cancel, None).await;
    assert_eq!(status, 200);
    app.wait_final(&a, &a_tok, WITHIN).await;
    assert_eq!(
        credits_left(&app, &slug).await,
        1,
        "the second run is given back too"
    );

    // ...and refused when the credits went elsewhere meanwhile.
    let (b, b_tok) = app.session(&slug, None, "b").await;
    let (status, _, _, _) =
        answer_of(app.submit(&b, &b_tok, json!({"prompt": "y"}), "k").await).await;
    assert_eq!(status, 202);
    assert_eq!(credits_left(&app, &slug).await, 0);
    let (status, _, body) = app.operator_post(&retry, None).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (402, Some("budget_exhausted")),
        "{body}"
    );
    assert_eq!(
        app.saga_of(&a).await["step"],
        "ABORTED",
        "a refused retry changes nothing"
    );
    assert_eq!(app.status(&a, &a_tok).await["status"], "ABORTED");
    assert_eq!(credits_left(&app, &slug).await, 0);
    app.stop().await;
}
db_test!(cancel_refunds_once_and_retry_charges_again);

async fn closing_refuses_and_the_202_tells_the_queue(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let closed = experience_with(
        &app,
        json!({"max_in_flight": 1, "credits": 3, "closes_at": "2020-01-01T00:00:00Z"}),
    )
    .await;
    let (sid, tok) = app.session(&closed, None, "late").await;
    for _ in 0..2 {
        // Refused, and not replayed: the key is released each time.
        let resp = app.submit(&sid, &tok, json!({"prompt": "x"}), "k").await;
        let (status, code, replayed, _) = answer_of(resp).await;
        assert_eq!(
            (status, code.as_deref(), replayed),
            (409, Some("closing"), false)
        );
    }
    assert_eq!(app.status(&sid, &tok).await["status"], "OPEN");
    assert_eq!(
        credits_left(&app, &closed).await,
        3,
        "a refusal takes no credit"
    );

    // An open experience: the 202 carries the position and the estimate
    // (none before any saga completed; the median AI time after).
    let open = experience_with(&app, json!({"max_in_flight": 1})).await;
    let (s1, t1) = app.session(&open, None, "first").await;
    let (status, _, _, body) =
        answer_of(app.submit(&s1, &t1, json!({"prompt": "x"}), "k").await).await;
    assert_eq!(status, 202);
    assert_eq!(body["queue_position"], 1, "{body}");
    assert!(body["eta_seconds"].is_null(), "{body}");
    app.wait_final(&s1, &t1, WITHIN).await;
    let (s2, t2) = app.session(&open, None, "second").await;
    let (status, _, _, body) =
        answer_of(app.submit(&s2, &t2, json!({"prompt": "x"}), "k").await).await;
    assert_eq!(status, 202);
    assert_eq!(body["queue_position"], 1, "{body}");
    // The simulator takes 100 ms (plus polling): a second or so, rounded up.
    assert!(
        body["eta_seconds"]
            .as_i64()
            .is_some_and(|s| (1..=5).contains(&s)),
        "{body}"
    );
    app.wait_final(&s2, &t2, WITHIN).await;
    app.stop().await;
}
db_test!(closing_refuses_and_the_202_tells_the_queue);

// --------------------------------------------------------------- store

const T0: i64 = 1_800_000_000_000;
const LEASE: i64 = 10_000;
const RULES: ClaimRules = ClaimRules {
    lease_ms: LEASE,
    max_recoveries: 2,
};

struct Fixture {
    store: Store,
    experience_id: String,
    max_in_flight: i32,
    /// The database, kept while the fixture lives (None: another
    /// fixture's).
    _db: Option<TestDb>,
}

async fn fixture(backend: Backend, max_in_flight: i32, credits: Option<i64>) -> Fixture {
    let db = TestDb::fresh(backend).await;
    let store = db.store().await;
    let mut f = fixture_on(&store, max_in_flight, credits).await;
    f._db = Some(db);
    f
}

/// Another experience on the same database.
async fn fixture_on(store: &Store, max_in_flight: i32, credits: Option<i64>) -> Fixture {
    let exp = store
        .create_experience(
            NewExperience {
                slug: format!("s-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]),
                title: "t".into(),
                kind: "comic".into(),
                ai_calls: 1,
                min_success: None,
                max_in_flight,
                credits,
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
    Fixture {
        store: store.clone(),
        experience_id: exp.id,
        max_in_flight,
        _db: None,
    }
}

impl Fixture {
    async fn session(&self, at: i64) -> sessions::Model {
        self.store
            .create_session(
                &self.experience_id,
                None,
                "nick",
                &uuid::Uuid::new_v4().to_string(),
                at,
            )
            .await
            .unwrap()
    }

    async fn submit(&self, at: i64) -> Result<sagas::Model, StoreError> {
        let session = self.session(at).await;
        self.store.submit(&session, submission(), 900_000, at).await
    }

    /// Claims what the experience's capacity allows at `now`.
    async fn claim(&self, now: i64) -> Vec<sagas::Model> {
        let exp = ClaimableExperience {
            id: self.experience_id.clone(),
            max_in_flight: self.max_in_flight,
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
        };
        self.store
            .claim_runnable(&exp, 100, now, RULES)
            .await
            .unwrap()
    }

    async fn credits(&self) -> Option<i64> {
        self.store
            .experience_by_id(&self.experience_id)
            .await
            .unwrap()
            .unwrap()
            .credits
    }

    async fn charged(&self, saga_id: &str) -> i64 {
        self.store
            .saga(saga_id)
            .await
            .unwrap()
            .unwrap()
            .charged_credits
    }

    /// Sagas of the session.
    async fn sagas_of(&self, session_id: &str) -> i64 {
        let row = self
            .store
            .db()
            .query_one_raw(self.store.sql(
                "SELECT COUNT(*) FROM sagas WHERE session_id = $1",
                vec![session_id.to_owned().into()],
            ))
            .await
            .unwrap()
            .unwrap();
        row.try_get_by_index(0).unwrap()
    }

    /// One batch of submissions, one per session, at `now`.
    async fn batch(&self, sessions: &[sessions::Model], now: i64) -> Vec<SubmissionOutcome> {
        let orders: Vec<SubmissionOrder> = sessions.iter().map(order).collect();
        let ids: Vec<String> = sessions.iter().map(|s| s.id.clone()).collect();
        let reads = self.reads(&ids, now).await;
        self.store
            .submit_batch(&orders, &reads, now, 0, &|_, _| None)
            .await
            .unwrap()
    }

    /// What a batch to `ids` reads as the HTTP path reads it (the sessions
    /// and admission in one statement), checked against the reads it
    /// stands for: the sessions of `ids` that exist, each once, as stored,
    /// and the admission read alone.
    async fn reads(&self, ids: &[String], now: i64) -> AdmissionReads {
        let (mut found, reads) = self.store.read_submissions(ids, now).await.unwrap();
        found.sort_by(|a, b| a.id.cmp(&b.id));
        let mut stored = Vec::new();
        for id in ids.iter().collect::<std::collections::BTreeSet<_>>() {
            stored.extend(self.store.session(id).await.unwrap());
        }
        assert_eq!(found, stored, "the sessions read with admission");
        assert_eq!(
            reads,
            self.store.admission_reads(ids, now).await.unwrap(),
            "admission read with the sessions differs from the admission read alone"
        );
        reads
    }

    async fn set_closes_at(&self, closes_at: Option<i64>) {
        let store = &self.store;
        store
            .db()
            .execute_raw(store.sql(
                "UPDATE experiences SET closes_at_ms = $1 WHERE id = $2",
                vec![closes_at.into(), self.experience_id.clone().into()],
            ))
            .await
            .unwrap();
    }
}

/// A keyless submission of `session` that starts a new saga.
fn order(session: &sessions::Model) -> SubmissionOrder {
    SubmissionOrder {
        session: session.clone(),
        key: None,
        action: SubmissionAction::Submit {
            submission: submission(),
            saga_id: stagehand::store::new_id(),
            deadline_ms: 900_000,
            trace_context: None,
        },
    }
}

fn submission() -> Submission {
    Submission {
        photo_id: None,
        in_gallery: true,
        consent: false,
        prompt: "a cat".into(),
        score: None,
    }
}

fn ai_result() -> AiResult {
    AiResult {
        content: vec![ContentItem {
            thumb_url: None,
            original_url: None,
            print_url: None,
            kind: "image".into(),
            url: Some("https://x.invalid/1.png".into()),
            text: None,
        }],
        score: None,
    }
}

fn token(s: &sagas::Model) -> String {
    s.lock_token.clone().expect("a claimed saga has a token")
}

async fn refund_happens_once_when_abort_paths_race(backend: Backend) {
    let f = fixture(backend, 20, Some(10)).await;
    let mut sagas = Vec::new();
    for _ in 0..6 {
        sagas.push(f.submit(T0).await.unwrap());
    }
    assert_eq!(f.credits().await, Some(4));
    let held = f.claim(T0).await;
    assert_eq!(held.len(), 6);
    // Past the lease: the supervisor (its token), the cleanup actor
    // (unowned) and an operator (cancel) abort each saga at the same time.
    let late = T0 + LEASE + 1;
    let mut racers = Vec::new();
    for saga in &held {
        racers.push(f.store.abort(
            &saga.id,
            Fence::Token(token(saga)),
            AbortReason::AiFailed,
            "x",
            late,
        ));
        racers.push(
            f.store
                .abort(&saga.id, Fence::Unowned, AbortReason::Orphaned, "y", late),
        );
        racers.push(
            f.store
                .abort(&saga.id, Fence::Operator, AbortReason::Cancelled, "z", late),
        );
    }
    let results = join_all(racers).await;
    for (saga, tries) in held.iter().zip(results.chunks(3)) {
        let ended = f.store.saga(&saga.id).await.unwrap().unwrap();
        assert_eq!(ended.step, "ABORTED");
        assert!(tries.iter().any(|r| r.is_ok()), "{tries:?}");
        assert_eq!(ended.charged_credits, 0, "given back");
    }
    assert_eq!(
        f.credits().await,
        Some(10),
        "each saga's credit came back exactly once"
    );
    // Aborting again, by any path, gives nothing more.
    for saga in &held {
        let _ = f
            .store
            .abort(
                &saga.id,
                Fence::Operator,
                AbortReason::Cancelled,
                "again",
                late + 1,
            )
            .await;
        let _ = f
            .store
            .abort(
                &saga.id,
                Fence::Unowned,
                AbortReason::Orphaned,
                "again",
                late + 1,
            )
            .await;
    }
    assert_eq!(f.credits().await, Some(10));
}
db_test!(refund_happens_once_when_abort_paths_race);

async fn refunds_follow_the_reason_and_a_batch_of_aborts(backend: Backend) {
    let f = fixture(backend, 20, Some(10)).await;
    let rejected = f.submit(T0).await.unwrap();
    let failed = f.submit(T0).await.unwrap();
    let timed_out = f.submit(T0).await.unwrap();
    let completed = f.submit(T0).await.unwrap();
    assert_eq!(f.credits().await, Some(6));
    let held = f.claim(T0).await;
    let tok = |id: &str| token(held.iter().find(|s| s.id == id).unwrap());
    // The participant's own fault keeps the credit.
    f.store
        .abort(
            &rejected.id,
            Fence::Token(tok(&rejected.id)),
            AbortReason::InputRejected,
            "no",
            T0 + 1,
        )
        .await
        .unwrap();
    assert_eq!(f.credits().await, Some(6));
    assert_eq!(f.charged(&rejected.id).await, 1);
    // Two refundable aborts of one experience in one batch: both given back.
    use stagehand::store::transitions::SagaWrite;
    let writes = [&failed, &timed_out].map(|s| SagaWrite::Abort {
        saga_id: s.id.clone(),
        fence: Fence::Token(tok(&s.id)),
        reason: if s.id == failed.id {
            AbortReason::AiFailed
        } else {
            AbortReason::AiTimeout
        },
        detail: "attempts used up".into(),
        free_calls: Vec::new(),
        audit: None,
    });
    let outcome = f
        .store
        .apply_saga_writes(&writes, T0 + 2, LEASE)
        .await
        .unwrap();
    assert!(outcome.iter().all(|o| o.is_ok()), "{outcome:?}");
    assert_eq!(f.credits().await, Some(8));
    // A completed saga keeps its credit.
    let t = tok(&completed.id);
    f.store
        .record_ai_done(&completed.id, &t, &ai_result(), T0 + 3, LEASE)
        .await
        .unwrap();
    f.store
        .record_ranking_done(&completed.id, &t, None, T0 + 4, LEASE)
        .await
        .unwrap();
    f.store.complete(&completed.id, &t, T0 + 5).await.unwrap();
    assert_eq!(f.charged(&completed.id).await, 1);
    assert_eq!(f.credits().await, Some(8));

    // A retried INPUT_REJECTED saga still holds its credit: no new charge;
    // a retried refunded one is charged again.
    f.store
        .retry_saga(&rejected.id, None, T0 + 6, 900_000)
        .await
        .unwrap();
    assert_eq!(f.credits().await, Some(8));
    assert_eq!(f.charged(&rejected.id).await, 1);
    f.store
        .retry_saga(&failed.id, None, T0 + 6, 900_000)
        .await
        .unwrap();
    assert_eq!(f.credits().await, Some(7));
    assert_eq!(f.charged(&failed.id).await, 1);
}
db_test!(refunds_follow_the_reason_and_a_batch_of_aborts);

async fn retry_without_credits_is_refused_and_changes_nothing(backend: Backend) {
    let f = fixture(backend, 5, Some(1)).await;
    let first = f.submit(T0).await.unwrap();
    assert!(matches!(
        f.submit(T0).await,
        Err(StoreError::BudgetExhausted)
    ));
    f.store
        .abort(
            &first.id,
            Fence::Operator,
            AbortReason::Cancelled,
            "stop",
            T0 + 1,
        )
        .await
        .unwrap();
    assert_eq!(f.credits().await, Some(1));
    let second = f.submit(T0 + 2).await.unwrap();
    assert_eq!(f.credits().await, Some(0));
    let refused = f.store.retry_saga(&first.id, None, T0 + 3, 900_000).await;
    assert!(
        matches!(refused, Err(StoreError::BudgetExhausted)),
        "{refused:?}"
    );
    let after = f.store.saga(&first.id).await.unwrap().unwrap();
    assert_eq!((after.step.as_str(), after.charged_credits), ("ABORTED", 0));
    let session = f.store.session(&first.session_id).await.unwrap().unwrap();
    assert_eq!(session.status, "ABORTED");
    assert_eq!(f.credits().await, Some(0));
    assert_eq!(f.charged(&second.id).await, 1);
}
db_test!(retry_without_credits_is_refused_and_changes_nothing);

async fn queue_position_eta_and_closing_with_fixed_times(backend: Backend) {
    let f = fixture(backend, 1, None).await;
    let mut first = Vec::new();
    for _ in 0..3 {
        first.push(f.session(T0).await);
    }
    // One batch: positions in arrival order, no estimate without history.
    let outcomes = f.batch(&first, T0).await;
    let positions: Vec<_> = outcomes
        .iter()
        .map(|o| match o {
            SubmissionOutcome::Accepted(Admission {
                queue_position,
                eta_ms: None,
            }) => *queue_position,
            other => panic!("unexpected {other:?}"),
        })
        .collect();
    assert_eq!(positions, vec![1, 2, 3]);

    // One saga completes; its AI step took 10 s (submit to AI_DONE).
    let running = f.claim(T0).await;
    assert_eq!(running.len(), 1);
    let (id, tok) = (&running[0].id, token(&running[0]));
    f.store
        .record_ai_submitted(id, &tok, "job-1", T0 + 1_000, LEASE)
        .await
        .unwrap();
    f.store
        .record_ai_done(id, &tok, &ai_result(), T0 + 11_000, LEASE)
        .await
        .unwrap();
    f.store
        .record_ranking_done(id, &tok, None, T0 + 11_000, LEASE)
        .await
        .unwrap();
    f.store.complete(id, &tok, T0 + 11_000).await.unwrap();
    let done = f.store.saga(id).await.unwrap().unwrap();
    assert_eq!(done.ai_duration_ms, Some(10_000));
    assert_eq!(
        f.store.median_ai_ms(&f.experience_id).await.unwrap(),
        Some(10_000)
    );

    // The next one runs, one waits: a new one is second in the queue, with
    // two turns of 10 s before its own.
    assert_eq!(f.claim(T0 + 11_000).await.len(), 1);
    let now = T0 + 12_000;
    let outcome = f.batch(&[f.session(now).await], now).await;
    assert_eq!(
        outcome,
        vec![SubmissionOutcome::Accepted(Admission {
            queue_position: 2,
            eta_ms: Some(30_000)
        })]
    );
    // Now 40 s: closing 1 ms too early refuses it, closing in time takes it.
    f.set_closes_at(Some(now + 39_999)).await;
    let late = f.session(now).await;
    assert_eq!(
        f.batch(std::slice::from_ref(&late), now).await,
        vec![SubmissionOutcome::Closing]
    );
    assert_eq!(
        f.store.session(&late.id).await.unwrap().unwrap().status,
        "OPEN",
        "a refused session stays open"
    );
    f.set_closes_at(Some(now + 40_000)).await;
    assert!(matches!(
        f.batch(std::slice::from_ref(&late), now).await.as_slice(),
        [SubmissionOutcome::Accepted(Admission {
            queue_position: 3,
            eta_ms: Some(40_000)
        })]
    ));
    // Past the closing time, with or without an estimate.
    f.set_closes_at(Some(now)).await;
    assert!(matches!(f.submit(now).await, Err(StoreError::Closing)));
}
db_test!(queue_position_eta_and_closing_with_fixed_times);

/// A batch's sessions and admission come in one read: every session found
/// once, whatever the experience, a repeated id once, an unknown id not at
/// all; each experience's queue read as the admission read alone reads it.
async fn a_batch_reads_its_sessions_and_admission_at_once(backend: Backend) {
    let f = fixture(backend, 1, Some(10)).await;
    let other = fixture_on(&f.store, 2, None).await;
    let (a, b) = (f.session(T0).await, f.session(T0).await);
    let c = other.session(T0).await;
    f.batch(std::slice::from_ref(&a), T0).await;
    let ids = vec![
        a.id.clone(),
        b.id.clone(),
        "no-such-session".to_owned(),
        c.id.clone(),
        b.id.clone(),
    ];
    let reads = f.reads(&ids, T0 + 1).await;
    assert_ne!(reads, AdmissionReads::default(), "nothing was read");
    let (found, _) = f
        .store
        .read_submissions(&["no-such-session".to_owned()], T0)
        .await
        .unwrap();
    assert!(found.is_empty());
}
db_test!(a_batch_reads_its_sessions_and_admission_at_once);

async fn a_batch_never_overdraws_and_a_session_takes_one(backend: Backend) {
    let f = fixture(backend, 5, Some(3)).await;
    let mut sessions = Vec::new();
    for _ in 0..5 {
        sessions.push(f.session(T0).await);
    }
    // The first session twice, then the others: one per session, three in
    // all, in arrival order.
    let mut batch = vec![sessions[0].clone()];
    batch.extend(sessions.iter().cloned());
    let outcomes = f.batch(&batch, T0).await;
    let kinds: Vec<&str> = outcomes
        .iter()
        .map(|o| match o {
            SubmissionOutcome::Accepted(_) => "accepted",
            SubmissionOutcome::AlreadySubmitted => "already",
            SubmissionOutcome::BudgetExhausted => "budget",
            other => panic!("unexpected {other:?}"),
        })
        .collect();
    assert_eq!(
        kinds,
        vec!["accepted", "already", "accepted", "accepted", "budget", "budget"]
    );
    assert_eq!(f.credits().await, Some(0));
}
db_test!(a_batch_never_overdraws_and_a_session_takes_one);

/// A batch decides on the sessions as it read them; a session submitted
/// since (here behind its back) is answered "already submitted", and the
/// batch's other request is admitted once, charged once. On PostgreSQL
/// the batch first tries its one-statement write, whose session update
/// finds one session of two: that statement must leave nothing behind
/// (a saga or credits written twice would show here).
async fn a_session_submitted_since_the_batch_read_it_is_refused_and_the_rest_written_once(
    backend: Backend,
) {
    let f = fixture(backend, 5, Some(5)).await;
    let moved = f.session(T0).await;
    let other = f.session(T0).await;
    f.store
        .db()
        .execute_raw(f.store.sql(
            "UPDATE sessions SET status = 'SUBMITTING' WHERE id = $1",
            vec![moved.id.clone().into()],
        ))
        .await
        .unwrap();
    let outcomes = f.batch(&[moved.clone(), other.clone()], T0).await;
    assert!(
        matches!(
            outcomes.as_slice(),
            [
                SubmissionOutcome::AlreadySubmitted,
                SubmissionOutcome::Accepted(_)
            ]
        ),
        "{outcomes:?}"
    );
    assert_eq!(f.credits().await, Some(4), "one admitted, charged once");
    assert_eq!(f.sagas_of(&moved.id).await, 0);
    assert_eq!(f.sagas_of(&other.id).await, 1);
}
db_test!(a_session_submitted_since_the_batch_read_it_is_refused_and_the_rest_written_once);

/// Credits taken by another transaction while a batch decides (PostgreSQL;
/// SQLite has one writer): the batch read one credit left without a lock,
/// the other transaction holds the experience's row and takes it. The
/// batch must wait for it and then refuse with `budget_exhausted`,
/// leaving the session open and no saga.
#[actix_web::test]
#[cfg_attr(not(pg_tests), ignore = "STAGEHAND_TEST_POSTGRES_URL is not set")]
async fn credits_taken_while_a_batch_decides_refuse_it() {
    use sea_orm::TransactionTrait;
    let f = fixture(Backend::Postgres, 5, Some(1)).await;
    let session = f.session(T0).await;
    let other = f.store.db().begin().await.unwrap();
    other
        .execute_unprepared(&format!(
            "UPDATE experiences SET credits = 0 WHERE id = '{}'",
            f.experience_id
        ))
        .await
        .unwrap();
    let (store, submitted) = (f.store.clone(), session.clone());
    let batch = actix_web::rt::spawn(async move {
        let orders = [order(&submitted)];
        let reads = store
            .admission_reads(std::slice::from_ref(&submitted.id), T0)
            .await?;
        store
            .submit_batch(&orders, &reads, T0, 0, &|_, _| None)
            .await
    });
    let waiting = support::wait_for(WITHIN, || async {
        let waiting = support::lock_waiters(&f.store).await;
        (waiting > 0 || batch.is_finished()).then_some(waiting)
    })
    .await;
    assert!(
        waiting.is_some_and(|n| n > 0),
        "the batch did not wait for the experience's row"
    );
    other.commit().await.unwrap();
    let outcomes = batch.await.unwrap().unwrap();
    assert_eq!(outcomes, vec![SubmissionOutcome::BudgetExhausted]);
    assert_eq!(f.credits().await, Some(0));
    assert_eq!(f.sagas_of(&session.id).await, 0);
    let status = f.store.session(&session.id).await.unwrap().unwrap().status;
    assert_eq!(status, "OPEN");
}
