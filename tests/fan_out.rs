//! Fan-out experiences (`ai_calls` = N > 1), black box against the
//! simulator, on SQLite and on PostgreSQL: N jobs per submission under the
//! experience's `max_in_flight`, each call's result stored the moment it
//! arrives (`ai_calls` rows), failures kept as values, a resubmission that
//! re-runs only the calls without a result, `min_success`, and a kill -9 of
//! the real binary in the middle of a fan-out that re-runs no finished call.

mod support;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use stagehand::ai::simulator::SimConfig;
use stagehand::store::Store;
use support::{Backend, Server, TestApp, OPERATOR};

/// Creates an experience with `ai_calls` calls per submission.
async fn fan_out_experience(
    http: &reqwest::Client,
    base: &str,
    ai_calls: i32,
    max_in_flight: i32,
    min_success: Option<i32>,
) -> String {
    let slug = format!("fan-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let resp = http
        .post(format!("{base}/api/experiences"))
        .bearer_auth(OPERATOR)
        .json(&json!({
            "slug": slug, "title": "Personas", "kind": "score",
            "ai_calls": ai_calls, "max_in_flight": max_in_flight, "min_success": min_success,
        }))
        .send()
        .await
        .expect("POST /api/experiences");
    assert_eq!(resp.status(), 201, "{:?}", resp.text().await);
    slug
}

/// Submits and returns the saga id from the 202.
async fn submit(http: &reqwest::Client, base: &str, sid: &str, token: &str, key: &str) -> String {
    let resp = support::submit(
        http,
        base,
        sid,
        token,
        json!({"prompt": format!("thirty opinions about {key}")}),
        key,
    )
    .await;
    assert_eq!(resp.status(), 202, "{:?}", resp.text().await);
    let body: Value = resp.json().await.unwrap();
    body["saga_id"].as_str().unwrap().to_owned()
}

/// The saga's calls as (index, status).
async fn calls(store: &Store, saga_id: &str) -> Vec<(i32, String)> {
    store
        .ai_calls_of(saga_id)
        .await
        .expect("read ai_calls")
        .into_iter()
        .map(|c| (c.call_index, c.status))
        .collect()
}

fn count(calls: &[(i32, String)], status: &str) -> usize {
    calls.iter().filter(|(_, s)| s == status).count()
}

/// The contents of the saga's successful calls, in call order.
async fn contents_in_call_order(store: &Store, saga_id: &str) -> Vec<Value> {
    let mut out = Vec::new();
    for call in store.ai_calls_of(saga_id).await.expect("read ai_calls") {
        if call.status == "SUCCEEDED" {
            let items: Vec<Value> = serde_json::from_str(call.content.as_deref().unwrap()).unwrap();
            out.extend(items);
        }
    }
    out
}

/// 30 calls with a cap of 10: the provider sees exactly 30 jobs, never more
/// than 10 at once and at least 8 at once; the session shows its progress
/// while it runs, and its result (and the terminal frame) lists the 30
/// contents in call order.
async fn thirty_calls_under_a_cap_of_ten(backend: Backend) {
    const LATENCY: Duration = Duration::from_millis(600);
    let sim = SimConfig {
        latency: LATENCY,
        ..support::fast_sim()
    };
    let app = TestApp::spawn_with(backend, sim, |_| {}).await;
    let slug = fan_out_experience(&app.http, &app.base, 30, 10, None).await;
    let (terminal, terminal_token) = app.terminal(&slug).await;
    let mut socket = app.terminal_socket(&terminal, &terminal_token, 0).await;
    let (sid, token) = app.session(&slug, Some(&terminal), "crowd").await;

    let started = Instant::now();
    let saga_id = submit(&app.http, &app.base, &sid, &token, "fan-30").await;
    let progress_seen = std::cell::RefCell::new(Vec::new());
    let done = support::wait_for(Duration::from_secs(60), || {
        let (http, base, sid, token) = (app.http.clone(), app.base.clone(), &sid, &token);
        let seen = &progress_seen;
        async move {
            let s = support::session_status(&http, &base, sid, token).await;
            if !s["progress"].is_null() {
                seen.borrow_mut().push(s["progress"].clone());
            }
            matches!(s["status"].as_str(), Some("COMPLETED") | Some("ABORTED")).then_some(s)
        }
    })
    .await
    .expect("the fan-out ended within 60 s");
    let wall = started.elapsed();
    assert_eq!(done["status"], "COMPLETED", "{done}");
    assert!(done["progress"].is_null(), "no progress once final: {done}");

    let stats = app.sim.control.stats();
    assert_eq!(stats.jobs_created, 30, "one job per call: {stats:?}");
    assert!(stats.max_concurrent_jobs <= 10, "cap of 10: {stats:?}");
    assert!(
        stats.max_concurrent_jobs >= 8,
        "real parallelism: {stats:?}"
    );
    assert_eq!(stats.missing_key, 0, "{stats:?}");

    let ideal = LATENCY * 3;
    eprintln!(
        "fan-out ({backend:?}): 30 calls at cap 10, call latency {LATENCY:?}: wall {wall:?} \
         (202 to COMPLETED seen by GET polls every 25 ms), ideal 3 x latency = {ideal:?}, \
         ratio {:.2}; provider max concurrent jobs {}",
        wall.as_secs_f64() / ideal.as_secs_f64(),
        stats.max_concurrent_jobs
    );

    let progress_seen = progress_seen.into_inner();
    assert!(!progress_seen.is_empty(), "progress shown while running");
    for p in &progress_seen {
        assert_eq!(p["total"], 30, "{p}");
        assert!(p["done"].as_i64().unwrap() <= 30, "{p}");
    }
    assert!(
        progress_seen.iter().any(|p| p["done"].as_i64() < Some(30)),
        "a partial progress was seen: {progress_seen:?}"
    );

    let store = &app.state.store;
    let rows = calls(store, &saga_id).await;
    assert_eq!(rows.len(), 30);
    assert_eq!(count(&rows, "SUCCEEDED"), 30, "{rows:?}");
    let expected = contents_in_call_order(store, &saga_id).await;
    assert_eq!(expected.len(), 30);
    assert_eq!(done["result"]["content"], Value::Array(expected.clone()));
    let frame = socket
        .next_session_event(Duration::from_secs(10))
        .await
        .expect("terminal frame");
    assert_eq!(frame["type"], "session.completed", "{frame}");
    assert_eq!(frame["result"]["content"], Value::Array(expected));
    app.stop().await;
}
db_test!(thirty_calls_under_a_cap_of_ten);

/// Two calls of six fail for good (one attempt each): the saga aborts
/// AI_FAILED keeping the four results; a new submission of the session
/// runs only the two missing calls and completes with all six, in call
/// order.
async fn partial_failure_then_resubmission_reruns_only_missing(backend: Backend) {
    let app = TestApp::spawn_with(backend, support::fast_sim(), |c| c.max_attempts = 1).await;
    let slug = fan_out_experience(&app.http, &app.base, 6, 6, None).await;
    let (sid, token) = app.session(&slug, None, "partial").await;
    app.sim.control.fail_next(2);
    let first = submit(&app.http, &app.base, &sid, &token, "first").await;
    let s = app.wait_final(&sid, &token, Duration::from_secs(30)).await;
    assert_eq!(s["status"], "ABORTED", "{s}");
    assert_eq!(s["abort_reason"], "AI_FAILED", "{s}");
    let store = &app.state.store;
    let rows = calls(store, &first).await;
    assert_eq!(count(&rows, "SUCCEEDED"), 4, "{rows:?}");
    assert_eq!(count(&rows, "FAILED"), 2, "{rows:?}");
    assert_eq!(app.sim.control.stats().jobs_created, 6);

    let second = submit(&app.http, &app.base, &sid, &token, "second").await;
    assert_ne!(first, second);
    let s = app.wait_final(&sid, &token, Duration::from_secs(30)).await;
    assert_eq!(s["status"], "COMPLETED", "{s}");
    let stats = app.sim.control.stats();
    assert_eq!(
        stats.jobs_created, 8,
        "only the two calls without a result ran again: {stats:?}"
    );
    let rows = calls(store, &second).await;
    assert_eq!(count(&rows, "SUCCEEDED"), 6, "{rows:?}");
    let expected = contents_in_call_order(store, &second).await;
    assert_eq!(expected.len(), 6);
    assert_eq!(s["result"]["content"], Value::Array(expected));
    app.stop().await;
}
db_test!(partial_failure_then_resubmission_reruns_only_missing);

/// `min_success` 3 of 5: two calls fail for good, the saga completes with
/// the three results.
async fn min_success_completes_with_k_of_n(backend: Backend) {
    let app = TestApp::spawn_with(backend, support::fast_sim(), |c| c.max_attempts = 1).await;
    let slug = fan_out_experience(&app.http, &app.base, 5, 5, Some(3)).await;
    let (sid, token) = app.session(&slug, None, "enough").await;
    app.sim.control.fail_next(2);
    let saga = submit(&app.http, &app.base, &sid, &token, "k-of-n").await;
    let s = app.wait_final(&sid, &token, Duration::from_secs(30)).await;
    assert_eq!(s["status"], "COMPLETED", "{s}");
    let rows = calls(&app.state.store, &saga).await;
    assert_eq!(count(&rows, "SUCCEEDED"), 3, "{rows:?}");
    assert_eq!(count(&rows, "FAILED"), 2, "{rows:?}");
    assert_eq!(app.sim.control.stats().jobs_created, 5);
    let expected = contents_in_call_order(&app.state.store, &saga).await;
    assert_eq!(expected.len(), 3);
    assert_eq!(s["result"]["content"], Value::Array(expected));
    app.stop().await;
}
db_test!(min_success_completes_with_k_of_n);

/// kill -9 of the server in the middle of a 12-call fan-out (cap 4, 1 s a
/// job) once some calls are stored, then a restart on the same database:
/// the saga completes and the provider saw exactly 12 jobs (no finished
/// call ran again; the running ones were adopted by their keys).
async fn kill9_mid_fan_out_reruns_no_finished_call(backend: Backend) {
    support::init_logs();
    stagehand::ai::client::ensure_crypto_provider();
    let http = reqwest::Client::new();
    let db = support::TestDb::fresh(backend).await;
    let sim = support::start_sim(SimConfig {
        latency: Duration::from_secs(1),
        ..support::fast_sim()
    })
    .await;
    let logs = tempfile::tempdir().expect("log dir");
    let log = |n: u32| -> PathBuf { logs.path().join(format!("server-{n}.log")) };

    let mut server = Server::start(&db.url, &sim.url(), &log(1), &http).await;
    let slug = fan_out_experience(&http, &server.base, 12, 4, None).await;
    let (sid, token) = support::create_session(&http, &server.base, &slug, None, "survivor").await;
    let saga_id = submit(&http, &server.base, &sid, &token, "crash").await;

    let store = db.store().await;
    let stored = support::wait_for(Duration::from_secs(30), || {
        let (store, saga_id) = (&store, &saga_id);
        async move {
            let rows = calls(store, saga_id).await;
            let done = count(&rows, "SUCCEEDED");
            (done >= 4).then_some(done)
        }
    })
    .await;
    let Some(done_before) = stored else {
        panic!(
            "no call finished within 30 s; log:\n{}",
            std::fs::read_to_string(log(1)).unwrap_or_default()
        );
    };
    server.kill9();
    let before = calls(&store, &saga_id).await;
    assert!(done_before < 12, "killed mid fan-out: {before:?}");
    let jobs_before = sim.control.stats().jobs_created;
    eprintln!(
        "kill -9 with {} of 12 calls stored, {jobs_before} jobs created",
        count(&before, "SUCCEEDED")
    );

    let server = Server::start(&db.url, &sim.url(), &log(2), &http).await;
    let s = support::wait_final(&http, &server.base, &sid, &token, Duration::from_secs(60)).await;
    if s["status"] != "COMPLETED" {
        panic!(
            "{s}\nlog 1:\n{}\nlog 2:\n{}",
            std::fs::read_to_string(log(1)).unwrap_or_default(),
            std::fs::read_to_string(log(2)).unwrap_or_default()
        );
    }
    let stats = sim.control.stats();
    assert_eq!(
        stats.jobs_created, 12,
        "one job per call across the crash: {stats:?}"
    );
    assert!(stats.max_concurrent_jobs <= 4, "cap of 4: {stats:?}");
    let after = calls(&store, &saga_id).await;
    assert_eq!(count(&after, "SUCCEEDED"), 12, "{after:?}");
    assert_eq!(s["result"]["content"].as_array().map(Vec::len), Some(12));
}
db_test!(kill9_mid_fan_out_reruns_no_finished_call);

/// The store claim tests' ground: a fresh database with one fan-out
/// experience (`ai_calls` calls per submission, cap `max_in_flight`), and
/// `sessions` submitted sessions, one millisecond apart from `CLAIM_T0`.
struct ClaimGround {
    _db: support::TestDb,
    store: stagehand::store::Store,
    experience_id: String,
    sagas: Vec<stagehand::store::entities::sagas::Model>,
    claimable: stagehand::store::sagas::ClaimableExperience,
}

const CLAIM_T0: i64 = 1_800_000_000_000;
const CLAIM_RULES: stagehand::store::sagas::ClaimRules = stagehand::store::sagas::ClaimRules {
    lease_ms: 60_000,
    max_recoveries: 2,
};

async fn claim_ground(
    backend: Backend,
    slug: &str,
    ai_calls: i32,
    max_in_flight: i32,
    sessions: i64,
) -> ClaimGround {
    use stagehand::store::experiences::NewExperience;
    use stagehand::store::sagas::ClaimableExperience;
    use stagehand::store::submissions::Submission;

    let db = support::TestDb::fresh(backend).await;
    let store = db.store().await;
    let exp = store
        .create_experience(
            NewExperience {
                slug: slug.into(),
                title: "t".into(),
                kind: "score".into(),
                ai_calls,
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
            CLAIM_T0,
        )
        .await
        .unwrap();
    let mut sagas = Vec::new();
    for i in 0..sessions {
        let session = store
            .create_session(
                &exp.id,
                None,
                "n",
                &uuid::Uuid::new_v4().to_string(),
                CLAIM_T0,
            )
            .await
            .unwrap();
        let prompt = Submission {
            photo_id: None,
            in_gallery: true,
            consent: false,
            prompt: "p".into(),
            score: None,
        };
        sagas.push(
            store
                .submit(&session, prompt, 900_000, CLAIM_T0 + i)
                .await
                .unwrap(),
        );
    }
    let claimable = ClaimableExperience {
        id: exp.id.clone(),
        max_in_flight,
        kind: "score".into(),
        ai_calls,
        min_success: None,
        has_resumed: false,
        has_expired_ai: false,
        provider: "default".into(),
        weight: 1,
        provider_max_in_flight: None,
        has_queued_ai: true,
        review: Default::default(),
        breaker: Default::default(),
        brand_version: 0,
    };
    ClaimGround {
        _db: db,
        store,
        experience_id: exp.id,
        sagas,
        claimable,
    }
}

/// Slots of the ledger in use for an experience now.
async fn slots_in_use(store: &Store, experience_id: &str, now: i64) -> i64 {
    stagehand::store::ledger::slots_in_use(store.db(), None, now)
        .await
        .unwrap()
        .experience_total(experience_id)
}

/// The calls a claimed saga holds slots for (reserved by the claim now).
fn fresh_calls(holds: &stagehand::store::sagas::Holds) -> Vec<i32> {
    match holds {
        stagehand::store::sagas::Holds::Fresh(calls) => calls.clone(),
        other => panic!("expected fresh slots, got {other:?}"),
    }
}

/// The claim, on the store: a fan-out saga takes as many of the free slots
/// as it has calls (each call counts one against `max_in_flight`), each
/// written to the ledger for one of its calls, and the slots a saga frees
/// as its calls end are claimed by the next one.
async fn claim_counts_calls_not_sagas(backend: Backend) {
    use stagehand::domain::ledger::Evidence;
    use stagehand::store::ai_calls::{CallRow, CallSlot, SUCCEEDED};
    use stagehand::store::ledger::Wanted;

    let ClaimGround {
        _db,
        store,
        experience_id: exp_id,
        sagas,
        claimable,
    } = claim_ground(backend, "personas", 4, 10, 4).await;
    const T0: i64 = CLAIM_T0;
    const RULES: stagehand::store::sagas::ClaimRules = CLAIM_RULES;
    let now = T0 + 10;
    let claimed = store
        .claim_for_provider(std::slice::from_ref(&claimable), 100, now, RULES)
        .await
        .unwrap();
    let slots: Vec<(String, Vec<i32>)> = claimed
        .iter()
        .map(|c| (c.saga.id.clone(), fresh_calls(&c.holds)))
        .collect();
    assert_eq!(
        slots,
        vec![
            (sagas[0].id.clone(), vec![0, 1, 2, 3]),
            (sagas[1].id.clone(), vec![0, 1, 2, 3]),
            (sagas[2].id.clone(), vec![0, 1])
        ],
        "oldest first, 10 slots in all"
    );
    assert_eq!(slots_in_use(&store, &exp_id, now).await, 10);
    assert!(store
        .claim_runnable(&claimable, 100, now, RULES)
        .await
        .unwrap()
        .is_empty());

    // The first saga's calls end: 3 stored, their slots freed.
    let first = &claimed[0].saga;
    let token = first.lock_token.clone().unwrap();
    for k in 0..3 {
        let row = CallRow {
            call_index: k,
            attempts: 0,
            status: SUCCEEDED,
            job_id: Some(format!("job-{k}")),
            submitted_at_ms: Some(now),
            content: Some("[]".into()),
            score: None,
            error: None,
        };
        store
            .write_ai_call(
                &first.id,
                &token,
                &row,
                CallSlot::Free(Evidence::JobFinal),
                &Wanted::default(),
                now,
                60_000,
            )
            .await
            .unwrap();
    }
    assert_eq!(slots_in_use(&store, &exp_id, now).await, 7);
    let next = store
        .claim_for_provider(std::slice::from_ref(&claimable), 100, now, RULES)
        .await
        .unwrap();
    assert_eq!(next.len(), 1);
    assert_eq!(
        (next[0].saga.id.clone(), fresh_calls(&next[0].holds)),
        (sagas[3].id.clone(), vec![0, 1, 2])
    );
    // A write with a stale token is refused (rule 2), and frees nothing.
    let refused = store
        .write_ai_call(
            &first.id,
            "not-the-token",
            &CallRow {
                call_index: 3,
                attempts: 0,
                status: SUCCEEDED,
                job_id: None,
                submitted_at_ms: None,
                content: Some("[]".into()),
                score: None,
                error: None,
            },
            CallSlot::Free(Evidence::JobFinal),
            &Wanted::default(),
            now,
            60_000,
        )
        .await;
    assert!(refused.is_err_and(|e| e.is_lease_lost()));
    assert_eq!(store.ai_calls_done(&first.id).await.unwrap(), 3);
    assert_eq!(slots_in_use(&store, &exp_id, now).await, 10);
}
db_test!(claim_counts_calls_not_sagas);

/// An operator's retry of a fan-out saga that aborted `AI_FAILED` runs, in
/// the same saga, only its failed calls (with fresh attempts) and
/// completes.
async fn operator_retry_reruns_only_failed_calls(backend: Backend) {
    let app = TestApp::spawn_with(backend, support::fast_sim(), |c| c.max_attempts = 1).await;
    let slug = fan_out_experience(&app.http, &app.base, 5, 5, None).await;
    let (sid, token) = app.session(&slug, None, "retried").await;
    app.sim.control.fail_next(1);
    let saga = submit(&app.http, &app.base, &sid, &token, "retry").await;
    let s = app.wait_final(&sid, &token, Duration::from_secs(30)).await;
    assert_eq!(s["abort_reason"], "AI_FAILED", "{s}");
    assert_eq!(app.sim.control.stats().jobs_created, 5);

    let (status, _, body) = app
        .operator_post(&format!("/api/admin/sagas/{saga}/retry"), None)
        .await;
    assert!(status == 200 || status == 202, "{status} {body}");
    let s = app.wait_final(&sid, &token, Duration::from_secs(30)).await;
    assert_eq!(s["status"], "COMPLETED", "{s}");
    let stats = app.sim.control.stats();
    assert_eq!(
        stats.jobs_created, 6,
        "only the failed call ran again: {stats:?}"
    );
    let rows = calls(&app.state.store, &saga).await;
    assert_eq!(count(&rows, "SUCCEEDED"), 5, "{rows:?}");
    assert_eq!(s["result"]["content"].as_array().map(Vec::len), Some(5));
    app.stop().await;
}
db_test!(operator_retry_reruns_only_failed_calls);

/// Two participants of a 30-call experience at cap 10: the second saga is
/// claimed with the one slot the first gives back, and grows with the
/// slots the first frees after (without that it would run its 30 calls one
/// at a time). Never more than 10 jobs at once, exactly 60 jobs.
async fn a_second_fan_out_grows_into_freed_slots(backend: Backend) {
    const LATENCY: Duration = Duration::from_millis(400);
    let sim = SimConfig {
        latency: LATENCY,
        ..support::fast_sim()
    };
    let app = TestApp::spawn_with(backend, sim, |_| {}).await;
    let slug = fan_out_experience(&app.http, &app.base, 30, 10, None).await;
    let (a, a_token) = app.session(&slug, None, "first").await;
    let (b, b_token) = app.session(&slug, None, "second").await;
    let started = Instant::now();
    submit(&app.http, &app.base, &a, &a_token, "a").await;
    submit(&app.http, &app.base, &b, &b_token, "b").await;
    for (sid, token) in [(&a, &a_token), (&b, &b_token)] {
        let s = app.wait_final(sid, token, Duration::from_secs(60)).await;
        assert_eq!(s["status"], "COMPLETED", "{s}");
    }
    let wall = started.elapsed();
    let stats = app.sim.control.stats();
    assert_eq!(stats.jobs_created, 60, "{stats:?}");
    assert!(stats.max_concurrent_jobs <= 10, "{stats:?}");
    // Ideal: 6 waves. One slot at a time for the second saga would take
    // about 3 + 27 waves; allow a generous margin below that.
    let ideal = LATENCY * 6;
    eprintln!(
        "two 30-call fan-outs at cap 10 ({backend:?}): wall {wall:?}, ideal {ideal:?}, ratio {:.2}",
        wall.as_secs_f64() / ideal.as_secs_f64()
    );
    assert!(wall < LATENCY * 12, "the second saga grew: {wall:?}");
    app.stop().await;
}
db_test!(a_second_fan_out_grows_into_freed_slots);

/// The slots of a saga whose lease ran out, or that its instance handed
/// over on shutdown, stay in the ledger until it is resumed: its jobs may
/// still run at the provider. So neither a fan-out saga growing its slots
/// nor a queued saga takes them meanwhile, and the next claim resumes the
/// saga in them, even when the probe before the claim's transaction saw no
/// expired lease (the chaos suite once saw the provider run 5 jobs of an
/// experience capped at 4 right after a hand-over).
async fn a_handed_over_saga_keeps_its_slots_until_it_resumes(backend: Backend) {
    use stagehand::domain::ledger::Evidence;
    use stagehand::store::ai_calls::{CallRow, CallSlot, RUNNING, SUCCEEDED};
    use stagehand::store::ledger::Wanted;
    use stagehand::store::sagas::Holds;

    let ClaimGround {
        _db,
        store,
        experience_id: exp_id,
        sagas,
        mut claimable,
    } = claim_ground(backend, "panels", 2, 2, 3).await;
    const T0: i64 = CLAIM_T0;
    const RULES: stagehand::store::sagas::ClaimRules = CLAIM_RULES;
    let now = T0 + 10;
    let call = |k: i32, status: &'static str| CallRow {
        call_index: k,
        attempts: 0,
        status,
        job_id: Some(format!("job-{k}")),
        submitted_at_ms: Some(now),
        content: (status == SUCCEEDED).then(|| "[]".into()),
        score: None,
        error: None,
    };
    let claim = |limit| {
        let (store, claimable) = (&store, &claimable);
        async move {
            store
                .claim_for_provider(std::slice::from_ref(claimable), limit, now, RULES)
                .await
                .unwrap()
        }
    };
    // The first saga takes both slots; its call 1 ends, freeing one, which
    // the second saga takes.
    let a = claim(1).await.remove(0);
    assert_eq!(fresh_calls(&a.holds), vec![0, 1]);
    let (a, a_token) = (a.saga.clone(), a.saga.lock_token.clone().unwrap());
    let bind = CallSlot::BindJob("job-0".into());
    store
        .write_ai_call(
            &a.id,
            &a_token,
            &call(0, RUNNING),
            bind,
            &Wanted::default(),
            now,
            60_000,
        )
        .await
        .unwrap();
    let done = CallSlot::Free(Evidence::JobFinal);
    store
        .write_ai_call(
            &a.id,
            &a_token,
            &call(1, SUCCEEDED),
            done,
            &Wanted::default(),
            now,
            60_000,
        )
        .await
        .unwrap();
    let b = claim(1).await.remove(0);
    assert_eq!(
        (a.id.as_str(), b.saga.id.as_str()),
        (sagas[0].id.as_str(), sagas[1].id.as_str())
    );
    assert_eq!(
        fresh_calls(&b.holds),
        vec![0],
        "one slot left for the second"
    );
    let (b, b_token) = (b.saga.clone(), b.saga.lock_token.clone().unwrap());

    // The first one's instance shuts down and hands it over: its job runs on.
    let later = now + 1_000;
    assert_eq!(
        store
            .hand_over(&[(a.id.clone(), a_token.clone())], later)
            .await
            .unwrap(),
        1
    );
    assert_eq!(slots_in_use(&store, &exp_id, later).await, 2);

    // The second one wants a slot for its call 1: none is free.
    let granted = store
        .write_ai_call(
            &b.id,
            &b_token,
            &call(0, RUNNING),
            CallSlot::BindJob("job-0".into()),
            &Wanted {
                provider: "default".into(),
                calls: vec![(1, 0)],
            },
            later,
            60_000,
        )
        .await
        .unwrap();
    assert!(
        granted.is_empty(),
        "the handed-over saga's slot is not free"
    );

    // A claim whose probe saw only the queue resumes the handed-over saga in
    // its slot, and gives the queued one nothing.
    claimable.has_expired_ai = false;
    let claimed = store
        .claim_for_provider(std::slice::from_ref(&claimable), 10, later, RULES)
        .await
        .unwrap();
    let ids: Vec<(&str, &Holds, i32)> = claimed
        .iter()
        .map(|c| (c.saga.id.as_str(), &c.holds, c.saga.recoveries))
        .collect();
    assert_eq!(
        ids,
        vec![(a.id.as_str(), &Holds::Read, 0)],
        "resumed in its one slot, no recovery used"
    );
    let held = store.slots_of_saga(&a.id).await.unwrap();
    assert_eq!(held.len(), 1);
    assert_eq!(
        (held[0].call_index, held[0].job_id.as_deref()),
        (0, Some("job-0"))
    );
    assert_eq!(slots_in_use(&store, &exp_id, later).await, 2);
}
db_test!(a_handed_over_saga_keeps_its_slots_until_it_resumes);

/// A fan-out saga whose experience an operator moved to another provider
/// takes its next slot on the provider its worker submits to, not on the
/// one the experience names now: its jobs run there, so they count there.
/// The hard case: its only slot is freed in the same write that asks for
/// the next one, so it holds none at that moment.
async fn a_moved_fan_out_takes_its_next_slot_where_its_jobs_run(backend: Backend) {
    use sea_orm::ConnectionTrait;
    use stagehand::domain::ledger::Evidence;
    use stagehand::store::ai_calls::{CallRow, CallSlot, SUCCEEDED};
    use stagehand::store::ledger::Wanted;

    let ClaimGround {
        _db,
        store,
        experience_id,
        claimable,
        ..
    } = claim_ground(backend, "moved", 2, 1, 1).await;
    let now = CLAIM_T0 + 10;
    let a = store
        .claim_for_provider(std::slice::from_ref(&claimable), 1, now, CLAIM_RULES)
        .await
        .unwrap()
        .remove(0);
    assert_eq!(fresh_calls(&a.holds), vec![0], "a ceiling of 1: one slot");
    let token = a.saga.lock_token.clone().unwrap();
    store
        .db()
        .execute_unprepared(&format!(
            "UPDATE experiences SET provider = 'b' WHERE id = '{experience_id}'"
        ))
        .await
        .unwrap();
    let done = CallRow {
        call_index: 0,
        attempts: 0,
        status: SUCCEEDED,
        job_id: Some("job-0".into()),
        submitted_at_ms: Some(now),
        content: Some("[]".into()),
        score: None,
        error: None,
    };
    let next = Wanted {
        provider: "default".into(),
        calls: vec![(1, 0)],
    };
    let granted = store
        .write_ai_call(
            &a.saga.id,
            &token,
            &done,
            CallSlot::Free(Evidence::JobFinal),
            &next,
            now,
            60_000,
        )
        .await
        .unwrap();
    assert_eq!(granted, vec![1]);
    assert_eq!(
        store
            .provider_of_slots(&a.saga.id)
            .await
            .unwrap()
            .as_deref(),
        Some("default"),
        "the next call's slot counts on the account its job runs on"
    );
}
db_test!(a_moved_fan_out_takes_its_next_slot_where_its_jobs_run);
