//! Several providers, one account each, black box against the simulator,
//! on SQLite and on PostgreSQL: a provider's cap shared by weight among the
//! experiences with work (a booth arriving behind another's backlog gets
//! its share as soon as jobs end), never above the cap nor an experience's
//! ceiling, also with two instances; the providers file and its errors;
//! the experiences' `provider` and `weight`; `GET /api/admin/providers`.

mod support;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use stagehand::ai::simulator::SimConfig;
use stagehand::config::Config;
use stagehand::startup::Application;
use support::{Backend, Instance, TestApp, TestDb, OPERATOR};

/// A providers file in a temp dir, kept alive with the value.
struct ProvidersFile {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

fn providers_file(text: &str) -> ProvidersFile {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("providers.toml");
    std::fs::write(&path, text).expect("write providers file");
    ProvidersFile { _dir: dir, path }
}

/// One provider `shared` on the simulator at `url` with `cap` slots.
fn shared_provider(url: &str, cap: i32) -> ProvidersFile {
    providers_file(&format!(
        "[providers.shared]\nkind = \"jobs\"\nurl = \"{url}\"\nmax_in_flight = {cap}\n"
    ))
}

/// Creates an experience on `provider`; its slug.
async fn experience_on(
    http: &reqwest::Client,
    base: &str,
    provider: &str,
    weight: i32,
    max_in_flight: i32,
) -> String {
    let slug = format!("booth-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let resp = http
        .post(format!("{base}/api/experiences"))
        .bearer_auth(OPERATOR)
        .json(&json!({
            "slug": slug, "title": "Booth", "kind": "image",
            "provider": provider, "weight": weight, "max_in_flight": max_in_flight,
        }))
        .send()
        .await
        .expect("POST /api/experiences");
    assert_eq!(resp.status(), 201, "{:?}", resp.text().await);
    slug
}

/// `n` sessions of `slug`, each submitted at once; their (id, token).
async fn submit_many(
    http: &reqwest::Client,
    base: &str,
    slug: &str,
    n: usize,
) -> Vec<(String, String)> {
    let mut sessions = Vec::with_capacity(n);
    for i in 0..n {
        sessions.push(support::create_session(http, base, slug, None, &format!("p{i}")).await);
    }
    let submits = sessions.iter().map(|(sid, token)| {
        let (http, base) = (http.clone(), base.to_owned());
        async move {
            let key = uuid::Uuid::new_v4().to_string();
            let resp =
                support::submit(&http, &base, sid, token, json!({"prompt": "a cat"}), &key).await;
            assert_eq!(resp.status(), 202, "{:?}", resp.text().await);
        }
    });
    futures_util::future::join_all(submits).await;
    sessions
}

fn one_second_jobs() -> SimConfig {
    SimConfig {
        latency: Duration::from_secs(1),
        ..support::fast_sim()
    }
}

/// The scenario: cap 6, 1 s jobs; booth A floods 60, booth B
/// submits 6 a moment later. First come, first served, B would wait for
/// A's ten waves (~10 s); shared by weight, B gets 3 slots as soon as A's
/// first jobs end, so its 6 are done in about 3 s.
async fn a_late_booth_gets_its_share_of_the_cap(backend: Backend) {
    let sim = support::start_sim(one_second_jobs()).await;
    let file = shared_provider(&sim.url(), 6);
    let app = TestApp::spawn_with(backend, support::fast_sim(), |c| {
        c.providers = Some(file.path.clone());
    })
    .await;
    let (http, base) = (&app.http, app.base.as_str());
    let a = experience_on(http, base, "shared", 1, 20).await;
    let b = experience_on(http, base, "shared", 1, 20).await;
    let a_sessions = submit_many(http, base, &a, 60).await;
    // A fills the cap first.
    let filled = support::wait_for(Duration::from_secs(5), || async {
        (sim.control.stats().running >= 6).then_some(())
    })
    .await;
    assert!(
        filled.is_some(),
        "booth A never filled the cap: {:?}",
        sim.control.stats()
    );
    let b_started = Instant::now();
    // B's first submission is first in B's queue, not 55th in the
    // provider's.
    let (sid, token) = support::create_session(http, base, &b, None, "b0").await;
    let resp = support::submit(
        http,
        base,
        &sid,
        &token,
        json!({"prompt": "a dog"}),
        "b0-key",
    )
    .await;
    assert_eq!(resp.status(), 202);
    let accepted: Value = resp.json().await.unwrap();
    assert_eq!(accepted["queue_position"], 1, "{accepted}");
    let mut b_sessions = vec![(sid, token)];
    b_sessions.extend(submit_many(http, base, &b, 5).await);
    let b_finals = support::wait_all_final(http, base, &b_sessions, Duration::from_secs(20))
        .await
        .expect("booth B's sessions end");
    let b_took = b_started.elapsed();
    assert!(
        b_finals.iter().all(|s| s["status"] == "COMPLETED"),
        "{b_finals:?}"
    );
    eprintln!(
        "booth B's 6 done {:.2} s after its submit (cap 6, A had 60 queued)",
        b_took.as_secs_f64()
    );
    // First come, first served, B would start after A's ten waves (≥ 9 s);
    // with its share (3 of 6 slots) it takes ~3 s: two waves of its own
    // after A's first wave ends. The bound leaves room for a loaded machine.
    assert!(
        b_took < Duration::from_secs(6),
        "booth B waited {b_took:?} behind booth A's backlog (its share is 3 of 6 slots: ~3 s)"
    );
    // While B had work, the cap was never passed; A's backlog ends too.
    support::wait_all_final(http, base, &a_sessions, Duration::from_secs(40))
        .await
        .expect("booth A's sessions end");
    let stats = sim.control.stats();
    assert!(
        stats.max_concurrent_jobs <= 6,
        "the provider ran {} jobs at once against a cap of 6",
        stats.max_concurrent_jobs
    );
    assert_eq!(stats.jobs_created, 66, "one job per session: {stats:?}");

    // A third experience whose own ceiling (20) is above the provider's
    // cap (6) still never runs more than the cap.
    let c = experience_on(http, base, "shared", 1, 20).await;
    let before = sim.control.stats();
    let c_sessions = submit_many(http, base, &c, 18).await;
    support::wait_all_final(http, base, &c_sessions, Duration::from_secs(20))
        .await
        .expect("C's sessions end");
    let after = sim.control.stats();
    assert_eq!(after.jobs_created - before.jobs_created, 18);
    assert!(after.max_concurrent_jobs <= 6, "{after:?}");

    // The operators' view of the provider.
    let (status, body) = app.operator_get("/api/admin/providers").await;
    assert_eq!(status, 200, "{body}");
    let shared = &body["providers"][0];
    assert_eq!(shared["name"], "shared");
    assert_eq!(shared["kind"], "jobs");
    assert_eq!(shared["max_in_flight"], 6);
    assert_eq!(shared["breaker"], "closed");
    assert_eq!(shared["in_flight"], 0);
    assert_eq!(shared["queued"], 0);
    let slugs: Vec<&str> = shared["experiences"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["slug"].as_str().unwrap())
        .collect();
    assert_eq!(slugs, vec![a.as_str(), b.as_str(), c.as_str()]);
    app.stop().await;
}
db_test!(a_late_booth_gets_its_share_of_the_cap);

/// Weights share the cap in proportion while both booths have work, and
/// `/api/admin/providers` shows each share.
async fn weights_share_the_cap_in_proportion(backend: Backend) {
    let sim = support::start_sim(SimConfig {
        latency: Duration::from_secs(3),
        ..support::fast_sim()
    })
    .await;
    let file = shared_provider(&sim.url(), 6);
    let app = TestApp::spawn_with(backend, support::fast_sim(), |c| {
        c.providers = Some(file.path.clone());
    })
    .await;
    let (http, base) = (&app.http, app.base.as_str());
    let heavy = experience_on(http, base, "shared", 2, 20).await;
    let light = experience_on(http, base, "shared", 1, 20).await;
    // Both queues arrive while the provider is paused (its breaker open
    // by hand); the claim after it closes shares the six slots 4:2.
    let (status, _, _) = app
        .operator_post("/api/admin/breaker/open?provider=shared", None)
        .await;
    assert_eq!(status, 200);
    let mut sessions = submit_many(http, base, &heavy, 12).await;
    sessions.extend(submit_many(http, base, &light, 12).await);
    // Paused: the phone keeps its place and says so; so does the booth's.
    // Each of light's 12 has its own place, 1 to 12.
    let mut places = Vec::new();
    for (sid, token) in &sessions[12..] {
        let paused = support::session_status(http, base, sid, token).await;
        assert_eq!(paused["ai_paused"], true, "{paused}");
        assert!(
            paused["message"].as_str().unwrap().contains("paused"),
            "{paused}"
        );
        places.push(paused["queue_position"].as_i64().expect("a queue position"));
    }
    places.sort_unstable();
    assert_eq!(places, (1..=12).collect::<Vec<i64>>());
    assert_eq!(
        app.get_json(&format!("/api/experiences/{light}")).await["ai_paused"],
        true
    );
    let (status, _, _) = app
        .operator_post("/api/admin/breaker/close?provider=shared", None)
        .await;
    assert_eq!(status, 200);
    let seen = support::wait_for(Duration::from_secs(5), || async {
        let (_, body) = app.operator_get("/api/admin/providers").await;
        let p = &body["providers"][0];
        (p["in_flight"] == 6).then(|| p.clone())
    })
    .await
    .expect("the cap fills");
    let of = |slug: &str| {
        seen["experiences"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["slug"] == slug)
            .cloned()
            .unwrap()
    };
    assert_eq!(of(&heavy)["in_flight"], 4, "{seen}");
    assert_eq!(of(&light)["in_flight"], 2, "{seen}");
    assert_eq!(of(&heavy)["share"], 4.0, "{seen}");
    assert_eq!(of(&light)["share"], 2.0, "{seen}");
    assert_eq!(of(&heavy)["weight"], 2);
    support::wait_all_final(http, base, &sessions, Duration::from_secs(60))
        .await
        .expect("every session ends");
    assert!(sim.control.stats().max_concurrent_jobs <= 6);
    app.stop().await;
}
db_test!(weights_share_the_cap_in_proportion);

/// Two instances on one PostgreSQL share one provider's cap exactly, and
/// the late booth still gets its share (its sessions go to the other
/// instance).
#[actix_web::test]
#[cfg_attr(not(pg_tests), ignore = "STAGEHAND_TEST_POSTGRES_URL is not set")]
async fn two_instances_share_one_cap() {
    let db = TestDb::fresh(Backend::Postgres).await;
    let sim = support::start_sim(one_second_jobs()).await;
    let file = shared_provider(&sim.url(), 6);
    let one = Instance::start(&db, &sim.url(), |c| c.providers = Some(file.path.clone())).await;
    let two = Instance::start(&db, &sim.url(), |c| c.providers = Some(file.path.clone())).await;
    let http = reqwest::Client::new();
    let a = experience_on(&http, &one.base, "shared", 1, 20).await;
    let b = experience_on(&http, &one.base, "shared", 1, 20).await;
    let a_sessions = submit_many(&http, &one.base, &a, 60).await;
    let filled = support::wait_for(Duration::from_secs(5), || async {
        (sim.control.stats().running >= 6).then_some(())
    })
    .await;
    assert!(filled.is_some(), "{:?}", sim.control.stats());
    let b_started = Instant::now();
    let b_sessions = submit_many(&http, &two.base, &b, 6).await;
    support::wait_all_final(&http, &two.base, &b_sessions, Duration::from_secs(20))
        .await
        .expect("booth B's sessions end");
    let b_took = b_started.elapsed();
    eprintln!(
        "two instances: booth B's 6 done {:.2} s after its submit",
        b_took.as_secs_f64()
    );
    assert!(
        b_took < Duration::from_millis(4_500),
        "booth B waited {b_took:?}"
    );
    support::wait_all_final(&http, &one.base, &a_sessions, Duration::from_secs(40))
        .await
        .expect("booth A's sessions end");
    let stats = sim.control.stats();
    assert!(stats.max_concurrent_jobs <= 6, "{stats:?}");
    assert_eq!(stats.jobs_created, 66, "{stats:?}");
    one.stop().await;
    two.stop().await;
}

/// Without a providers file there is one provider `default` with no
/// shared cap; an experience naming another provider is refused.
async fn experiences_name_a_configured_provider(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let resp = app
        .http
        .post(format!("{}/api/experiences", app.base))
        .bearer_auth(OPERATOR)
        .json(&json!({"slug": "x", "title": "X", "kind": "image", "provider": "nope"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 422);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"], "validation_failed");
    assert!(
        body["message"].as_str().unwrap().contains("default"),
        "{body}"
    );
    for weight in [0, 101] {
        let resp = app
            .http
            .post(format!("{}/api/experiences", app.base))
            .bearer_auth(OPERATOR)
            .json(&json!({"slug": "y", "title": "Y", "kind": "image", "weight": weight}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 422, "weight {weight}");
    }
    let slug = app.experience(3).await;
    let (_, body) = app.operator_get(&format!("/api/experiences/{slug}")).await;
    assert_eq!(body["provider"], "default");
    assert_eq!(body["weight"], 1);
    assert_eq!(body["ai_paused"], false);
    let (status, body) = app.operator_get("/api/admin/providers").await;
    assert_eq!(status, 200);
    assert_eq!(
        body["providers"],
        json!([{
            "name": "default", "kind": "jobs", "max_in_flight": null, "in_flight": 0,
            "queued": 0, "breaker": "closed", "reason": null, "rate_limit": null,
            "models": [],
            "experiences": [{"slug": slug, "weight": 1, "in_flight": 0, "queued": 0,
                             "share": null, "max_in_flight": 3}],
        }])
    );
    app.stop().await;
}
db_test!(experiences_name_a_configured_provider);

/// A providers file that cannot be used stops the start with its line and
/// the reason; a key in it is refused without being shown.
#[actix_web::test]
async fn a_bad_providers_file_stops_the_start() {
    let db = TestDb::fresh(Backend::Sqlite).await;
    let cases = [
        (
            "[providers.a]\nkind = \"jobs\"\nmax_in_flight = 2\napi_key = \"sk-secret-1\"\n",
            "line 4",
        ),
        ("[providers.a]\nkind = \"jobs\"\nmax_in_flight = -1\n", "max_in_flight"),
        ("[providers.a]\nkind = \"jobs\"\nmax_in_flight = 2\napi_key_env = \"UNSET_STAGEHAND_KEY\"\n", "UNSET_STAGEHAND_KEY"),
    ];
    for (text, expected) in cases {
        let file = providers_file(text);
        let mut config: Config = support::test_config(&db, "http://127.0.0.1:9");
        config.providers = Some(file.path.clone());
        let err = match Application::build(config).await {
            Ok(_) => panic!("{text:?} was accepted"),
            Err(e) => e.to_string(),
        };
        assert!(err.contains(expected), "{text:?}: {err}");
        assert!(!err.contains("sk-secret"), "{err}");
    }
}

/// The second scenario: cap 1, `AI_TIMEOUT` 2 s (one attempt), 6 s
/// jobs, two submissions. The first saga ends AI_TIMEOUT at 2 s while its
/// job still runs. Returns (seconds from the first job to the second,
/// seconds from the first saga's end to the second job, the simulator's
/// stats then).
async fn second_job_after_a_timed_out_first(
    backend: Backend,
    refuse_cancel: bool,
) -> (f64, f64, stagehand::ai::SimStats) {
    let sim = support::start_sim(SimConfig {
        latency: Duration::from_secs(6),
        refuse_cancel,
        ..support::fast_sim()
    })
    .await;
    let file = shared_provider(&sim.url(), 1);
    let app = TestApp::spawn_with(backend, support::fast_sim(), |c| {
        c.providers = Some(file.path.clone());
        c.ai_timeout = Duration::from_secs(2);
        c.max_attempts = 1;
    })
    .await;
    let (http, base) = (&app.http, app.base.as_str());
    let slug = experience_on(http, base, "shared", 1, 5).await;
    let first = submit_many(http, base, &slug, 1).await;
    let first_job = support::wait_for(Duration::from_secs(5), || async {
        (sim.control.stats().jobs_created == 1).then(Instant::now)
    })
    .await
    .expect("the first job starts");
    let second = submit_many(http, base, &slug, 1).await;
    let ended = support::wait_all_final(http, base, &first, Duration::from_secs(10))
        .await
        .expect("the first saga ends");
    assert_eq!(ended[0]["abort_reason"], "AI_TIMEOUT", "{}", ended[0]);
    let first_ended = Instant::now();
    let second_job = support::wait_for(Duration::from_secs(15), || async {
        (sim.control.stats().jobs_created == 2).then(Instant::now)
    })
    .await
    .expect("the second job starts");
    let stats = sim.control.stats();
    support::wait_all_final(http, base, &second, Duration::from_secs(15))
        .await
        .expect("the second saga ends");
    // Every job that outlived its saga is settled in the end.
    let store = app.state.store.clone();
    let settled = support::wait_for(Duration::from_secs(15), || async {
        (store.ledger_rows().await.unwrap() == 0).then_some(())
    })
    .await;
    assert!(settled.is_some(), "a slot of the ledger was never freed");
    app.stop().await;
    (
        second_job.duration_since(first_job).as_secs_f64(),
        second_job.duration_since(first_ended).as_secs_f64(),
        stats,
    )
}

/// Without cancel the timed-out job keeps its slot until it ends: the
/// provider never runs two at once, and the second starts when the first
/// job ends (6 s), not when its saga ended (2 s).
async fn without_cancel_a_timed_out_job_keeps_its_slot(backend: Backend) {
    let (from_first_job, from_first_end, stats) =
        second_job_after_a_timed_out_first(backend, true).await;
    eprintln!(
        "no cancel: second job {from_first_job:.2} s after the first job, {from_first_end:.2} s after the first saga ended"
    );
    assert_eq!(stats.max_concurrent_jobs, 1, "{stats:?}");
    assert_eq!(stats.cancelled, 0, "{stats:?}");
    assert!(
        stats.cancel_requests >= 1,
        "the server never asked to cancel: {stats:?}"
    );
    assert!(
        from_first_job >= 5.8,
        "the second job started {from_first_job:.2} s after the first, before the first ended (6 s)"
    );
    assert!(
        from_first_job < 8.0,
        "the freed slot was not used promptly: {from_first_job:.2} s"
    );
}
db_test!(without_cancel_a_timed_out_job_keeps_its_slot);

/// With cancel the timed-out job is cancelled once, and the second starts
/// within a second of the first saga's end.
async fn with_cancel_a_timed_out_job_is_cancelled(backend: Backend) {
    let (from_first_job, from_first_end, stats) =
        second_job_after_a_timed_out_first(backend, false).await;
    eprintln!(
        "cancel: second job {from_first_job:.2} s after the first job, {from_first_end:.2} s after the first saga ended"
    );
    assert_eq!(stats.max_concurrent_jobs, 1, "{stats:?}");
    assert_eq!(stats.cancelled, 1, "{stats:?}");
    assert_eq!(stats.cancel_requests, 1, "{stats:?}");
    assert!(
        from_first_end < 1.0,
        "the second job started {from_first_end:.2} s after the first saga ended"
    );
}
db_test!(with_cancel_a_timed_out_job_is_cancelled);

/// An instance that stops while a job of an ended saga still runs loses
/// nothing: the job's row keeps the slot, and another instance polls the
/// job and frees the slot only when it ends.
#[actix_web::test]
#[cfg_attr(not(pg_tests), ignore = "STAGEHAND_TEST_POSTGRES_URL is not set")]
async fn a_job_of_an_ended_saga_survives_its_instance() {
    let db = TestDb::fresh(Backend::Postgres).await;
    let sim = support::start_sim(SimConfig {
        latency: Duration::from_secs(6),
        refuse_cancel: true,
        ..support::fast_sim()
    })
    .await;
    let file = shared_provider(&sim.url(), 1);
    let tweak = |c: &mut Config| {
        c.providers = Some(file.path.clone());
        c.ai_timeout = Duration::from_secs(2);
        c.max_attempts = 1;
    };
    let one = Instance::start(&db, &sim.url(), tweak).await;
    let http = reqwest::Client::new();
    let slug = experience_on(&http, &one.base, "shared", 1, 5).await;
    let first = submit_many(&http, &one.base, &slug, 1).await;
    let first_job = support::wait_for(Duration::from_secs(5), || async {
        (sim.control.stats().jobs_created == 1).then(Instant::now)
    })
    .await
    .expect("the first job starts");
    support::wait_all_final(&http, &one.base, &first, Duration::from_secs(10))
        .await
        .expect("the first saga ends");
    let store = db.store().await;
    assert_eq!(store.ledger_rows().await.unwrap(), 1);
    one.stop().await;
    let two = Instance::start(&db, &sim.url(), tweak).await;
    let second = submit_many(&http, &two.base, &slug, 1).await;
    let second_job = support::wait_for(Duration::from_secs(20), || async {
        (sim.control.stats().jobs_created == 2).then(Instant::now)
    })
    .await
    .expect("the second job starts");
    let waited = second_job.duration_since(first_job).as_secs_f64();
    eprintln!("after a restart: second job {waited:.2} s after the first");
    assert!(
        waited >= 5.8,
        "the slot was freed {waited:.2} s after the first job, before it ended"
    );
    assert_eq!(sim.control.stats().max_concurrent_jobs, 1);
    support::wait_all_final(&http, &two.base, &second, Duration::from_secs(15))
        .await
        .expect("the second saga ends");
    two.stop().await;
}

/// An operator cancels a fan-out saga while its three jobs run: each job
/// is cancelled at the provider (once), and their slots are free at once.
async fn an_operator_cancel_cancels_the_running_jobs(backend: Backend) {
    let app = TestApp::spawn_with(
        backend,
        SimConfig {
            latency: Duration::from_secs(30),
            ..support::fast_sim()
        },
        |_| {},
    )
    .await;
    let (http, base) = (&app.http, app.base.as_str());
    let slug = format!("fan-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let resp = http
        .post(format!("{base}/api/experiences"))
        .bearer_auth(OPERATOR)
        .json(&json!({"slug": slug, "title": "Panels", "kind": "comic",
                      "ai_calls": 3, "max_in_flight": 3}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    let sessions = submit_many(http, base, &slug, 1).await;
    let running = support::wait_for(Duration::from_secs(5), || async {
        (app.sim.control.stats().running == 3).then_some(())
    })
    .await;
    assert!(running.is_some(), "{:?}", app.sim.control.stats());
    let saga = app.saga_of(&sessions[0].0).await;
    let saga_id = saga["saga_id"].as_str().expect("saga id").to_owned();
    let (status, _, body) = app
        .operator_post(&format!("/api/admin/sagas/{saga_id}/cancel"), None)
        .await;
    assert_eq!(status, 200, "{body}");
    let cancelled = support::wait_for(Duration::from_secs(2), || async {
        let stats = app.sim.control.stats();
        (stats.cancelled == 3 && stats.running == 0).then_some(stats)
    })
    .await;
    let stats = app.sim.control.stats();
    assert!(
        cancelled.is_some(),
        "the jobs of the cancelled saga still run: {stats:?}"
    );
    assert_eq!(stats.cancel_requests, 3, "{stats:?}");
    let store = app.state.store.clone();
    let freed = support::wait_for(Duration::from_secs(2), || async {
        (store.ledger_rows().await.unwrap() == 0).then_some(())
    })
    .await;
    assert!(freed.is_some(), "the cancelled jobs still hold their slots");
    app.stop().await;
}
db_test!(an_operator_cancel_cancels_the_running_jobs);
