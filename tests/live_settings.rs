//! Changing an experience while the event runs (`PATCH
//! /api/experiences/{slug}`), black box against the simulator, on SQLite
//! and on PostgreSQL, at the default poll interval (10 s), so every change
//! that must act at once is proven to act through its wake-up, never the
//! next poll: a raised cap starts queued work in the same moment, a
//! lowered one starts nothing until the running jobs are below it and
//! cancels none, also across two instances; a provider moved while its
//! jobs run keeps both accounts under their caps with one job per saga;
//! closing and reopening; credits set and topped up; the patch's rules
//! (unknown, fixed and bad fields; a PIN gallery keeps its PIN).

mod support;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use stagehand::ai::simulator::{RunningSim, SimConfig};
use support::{Backend, Instance, TestApp, TestDb, OPERATOR};

/// The server's own default: changes must not wait for it.
const DEFAULT_POLL: Duration = Duration::from_secs(10);
/// Well under one poll: a change seen within this came by its wake-up.
const AT_ONCE: Duration = Duration::from_secs(3);

fn two_second_jobs() -> SimConfig {
    SimConfig {
        latency: Duration::from_secs(2),
        ..support::fast_sim()
    }
}

/// PATCH the experience with the operator token and a fresh
/// Idempotency-Key.
async fn patch(http: &reqwest::Client, base: &str, slug: &str, body: Value) -> (u16, Value) {
    let key = uuid::Uuid::new_v4().to_string();
    let path = format!("/api/experiences/{slug}");
    support::api_call(http, base, "PATCH", &path, OPERATOR, Some(body), Some(&key)).await
}

async fn experience_with(http: &reqwest::Client, base: &str, settings: Value) -> String {
    let slug = format!("live-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let mut body = json!({"slug": slug, "title": "Live", "kind": "image"});
    for (k, v) in settings.as_object().expect("settings object") {
        body[k] = v.clone();
    }
    let resp = http
        .post(format!("{base}/api/experiences"))
        .bearer_auth(OPERATOR)
        .json(&body)
        .send()
        .await
        .expect("POST /api/experiences");
    assert_eq!(resp.status(), 201, "{:?}", resp.text().await);
    slug
}

/// `n` sessions of `slug`, each submitted; their (id, token).
async fn submit_many(
    http: &reqwest::Client,
    base: &str,
    slug: &str,
    n: usize,
) -> Vec<(String, String)> {
    let mut sessions = Vec::with_capacity(n);
    for i in 0..n {
        let (sid, token) = support::create_session(http, base, slug, None, &format!("p{i}")).await;
        let key = uuid::Uuid::new_v4().to_string();
        let resp =
            support::submit(http, base, &sid, &token, json!({"prompt": "a cat"}), &key).await;
        assert_eq!(resp.status(), 202, "{:?}", resp.text().await);
        sessions.push((sid, token));
    }
    sessions
}

/// Every job start the simulator saw, by its number (the simulator's
/// count of jobs created then), with how many of its jobs ran right after
/// it (sampled every 2 ms while it lives).
#[derive(Clone, Default)]
struct Starts(Arc<Mutex<Vec<(u64, u64)>>>);

impl Starts {
    fn watch(sim: &RunningSim) -> (Starts, tokio::task::JoinHandle<()>) {
        let starts = Starts::default();
        let (control, log) = (sim.control.clone(), starts.clone());
        let watcher = tokio::spawn(async move {
            let mut created = control.stats().jobs_created;
            loop {
                let stats = control.stats();
                if stats.jobs_created > created {
                    created = stats.jobs_created;
                    log.0.lock().unwrap().push((created, stats.running));
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        });
        (starts, watcher)
    }

    /// The starts after the first `created` jobs, each with the jobs
    /// running then. By number, not by when the watcher noticed them: a
    /// start it noticed a moment late still counts where it happened.
    fn after(&self, created: u64) -> Vec<u64> {
        let log = self.0.lock().unwrap();
        log.iter()
            .filter(|(n, _)| *n > created)
            .map(|(_, running)| *running)
            .collect()
    }
}

/// The scenario: cap 1, 2 s jobs, 10 queued. A PATCH to 4 has 4
/// running at once (by its wake-up: the poll is 10 s), never more; a PATCH
/// back to 1 starts nothing until the running jobs are below 1, and
/// cancels none; every session completes.
async fn a_cap_raised_starts_work_at_once_and_lowered_starts_none(backend: Backend) {
    let app = TestApp::spawn_with(backend, two_second_jobs(), |c| {
        c.poll_interval = DEFAULT_POLL;
    })
    .await;
    let (http, base, sim) = (&app.http, app.base.as_str(), &app.sim);
    let slug = experience_with(http, base, json!({"max_in_flight": 1})).await;
    let sessions = submit_many(http, base, &slug, 10).await;
    let one = support::wait_for(AT_ONCE, || async {
        (sim.control.stats().running == 1).then_some(())
    })
    .await;
    assert!(
        one.is_some(),
        "the first job never started: {:?}",
        sim.control.stats()
    );
    let (starts, watcher) = Starts::watch(sim);

    let raised_at = Instant::now();
    let (status, body) = patch(http, base, &slug, json!({"max_in_flight": 4})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["max_in_flight"], 4);
    let four = support::wait_for(AT_ONCE, || async {
        (sim.control.stats().running == 4).then_some(())
    })
    .await;
    assert!(
        four.is_some(),
        "4 jobs were not running within {AT_ONCE:?} of the PATCH (poll {DEFAULT_POLL:?}): {:?}",
        sim.control.stats()
    );
    eprintln!(
        "cap 1 -> 4: 4 running {:?} after the PATCH",
        raised_at.elapsed()
    );

    let created_before_lowering = sim.control.stats().jobs_created;
    let (status, body) = patch(http, base, &slug, json!({"max_in_flight": 1})).await;
    assert_eq!(status, 200, "{body}");
    let running_then = sim.control.stats().running;
    assert!(running_then >= 3, "jobs ended meanwhile: {running_then}");
    support::wait_all_final(http, base, &sessions, Duration::from_secs(60))
        .await
        .expect("every session ends");
    watcher.abort();
    let stats = sim.control.stats();
    assert!(
        stats.max_concurrent_jobs <= 4,
        "more than the cap ran at once: {stats:?}"
    );
    assert_eq!(stats.cancelled, 0, "lowering the cap cancelled a job");
    assert_eq!(stats.jobs_created, 10, "one job per saga: {stats:?}");
    let after_lowering = starts.after(created_before_lowering);
    assert!(
        !after_lowering.is_empty(),
        "the queue never went on after the cap was lowered"
    );
    assert!(
        after_lowering.iter().all(|&running| running <= 1),
        "a job started while others ran above the lowered cap: jobs running at each start {after_lowering:?}"
    );
    for (sid, token) in &sessions {
        let s = support::session_status(http, base, sid, token).await;
        assert_eq!(s["status"], "COMPLETED", "{s}");
    }
}
db_test!(a_cap_raised_starts_work_at_once_and_lowered_starts_none);

/// Two instances on PostgreSQL at the default poll; the PATCH goes to
/// instance A, which may run one saga at most: the other jobs can only
/// start on instance B, which learns of the change through the
/// cross-instance news within a moment, not at its next poll.
#[actix_web::test]
async fn the_other_instance_acts_on_a_raised_cap_at_once() {
    let Some(_) = std::env::var("STAGEHAND_TEST_POSTGRES_URL").ok() else {
        eprintln!("skipped: STAGEHAND_TEST_POSTGRES_URL is not set (CI sets it)");
        return;
    };
    let db = TestDb::fresh(Backend::Postgres).await;
    let sim = support::start_sim(SimConfig {
        latency: Duration::from_secs(30),
        ..support::fast_sim()
    })
    .await;
    let a = Instance::start(&db, &sim.url(), |c| {
        c.poll_interval = DEFAULT_POLL;
        c.max_running = 1;
    })
    .await;
    let b = Instance::start(&db, &sim.url(), |c| c.poll_interval = DEFAULT_POLL).await;
    let http = support::http_client();
    let slug = experience_with(&http, &a.base, json!({"max_in_flight": 1})).await;
    submit_many(&http, &a.base, &slug, 10).await;
    let one = support::wait_for(AT_ONCE, || async {
        (sim.control.stats().running == 1).then_some(())
    })
    .await;
    assert!(one.is_some(), "the first job never started");

    let raised_at = Instant::now();
    let (status, body) = patch(&http, &a.base, &slug, json!({"max_in_flight": 4})).await;
    assert_eq!(status, 200, "{body}");
    let four = support::wait_for(AT_ONCE, || async {
        (sim.control.stats().running == 4).then_some(())
    })
    .await;
    assert!(
        four.is_some(),
        "instance B did not start the work within {AT_ONCE:?} (its poll is {DEFAULT_POLL:?}): {:?}",
        sim.control.stats()
    );
    eprintln!(
        "two instances: 4 running {:?} after the PATCH to the other one",
        raised_at.elapsed()
    );
    assert_eq!(sim.control.stats().max_concurrent_jobs, 4);
    a.stop().await;
    b.stop().await;
}

/// A providers file in a temp dir, kept alive with the value.
struct ProvidersFile {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

/// Two accounts, `a` and `b`, each on its own simulator with `cap` slots.
fn two_accounts(a: &RunningSim, b: &RunningSim, cap: i32) -> ProvidersFile {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("providers.toml");
    let text = format!(
        "[providers.a]\nkind = \"jobs\"\nurl = \"{}\"\nmax_in_flight = {cap}\n\n\
         [providers.b]\nkind = \"jobs\"\nurl = \"{}\"\nmax_in_flight = {cap}\n",
        a.url(),
        b.url()
    );
    std::fs::write(&path, text).expect("write providers file");
    ProvidersFile { _dir: dir, path }
}

/// An experience moved from account A to account B while A's jobs run:
/// the queued sagas start on B at once; A's jobs finish on A, counted
/// there (against A's cap, and against the experience's own ceiling of
/// 3: B gets 1 slot while A's 2 run, not 2); neither account ever runs
/// more than its cap, and no saga gets two jobs.
async fn a_provider_moved_while_its_jobs_run_keeps_both_caps(backend: Backend) {
    let sim_a = support::start_sim(two_second_jobs()).await;
    let sim_b = support::start_sim(two_second_jobs()).await;
    let file = two_accounts(&sim_a, &sim_b, 2);
    let app = TestApp::spawn_with(backend, support::fast_sim(), |c| {
        c.providers = Some(file.path.clone());
        c.poll_interval = DEFAULT_POLL;
    })
    .await;
    let (http, base) = (&app.http, app.base.as_str());
    let slug = experience_with(http, base, json!({"provider": "a", "max_in_flight": 3})).await;
    let sessions = submit_many(http, base, &slug, 8).await;
    // The jobs of the experience on both accounts at once, at most.
    let both_peak = Arc::new(Mutex::new(0u64));
    let watcher = {
        let (a, b, peak) = (
            sim_a.control.clone(),
            sim_b.control.clone(),
            both_peak.clone(),
        );
        tokio::spawn(async move {
            loop {
                let both = a.stats().running + b.stats().running;
                {
                    let mut peak = peak.lock().unwrap();
                    *peak = (*peak).max(both);
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
    };
    let on_a = support::wait_for(AT_ONCE, || async {
        (sim_a.control.stats().running == 2).then_some(())
    })
    .await;
    assert!(
        on_a.is_some(),
        "A never filled its cap: {:?}",
        sim_a.control.stats()
    );

    let (status, body) = patch(http, base, &slug, json!({"provider": "b"})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["provider"], "b");
    let on_b = support::wait_for(AT_ONCE, || async {
        (sim_b.control.stats().running >= 1).then_some(())
    })
    .await;
    assert!(
        on_b.is_some(),
        "the queued sagas did not start on B at once: {:?}",
        sim_b.control.stats()
    );
    // A's two jobs still run: they were not cancelled or moved.
    assert!(
        sim_a.control.stats().running >= 1,
        "{:?}",
        sim_a.control.stats()
    );

    support::wait_all_final(http, base, &sessions, Duration::from_secs(60))
        .await
        .expect("every session ends");
    watcher.abort();
    let peak = *both_peak.lock().unwrap();
    assert!(
        peak <= 3,
        "the experience ran {peak} jobs at once across the two accounts, over its ceiling of 3"
    );
    let (a, b) = (sim_a.control.stats(), sim_b.control.stats());
    assert!(
        a.max_concurrent_jobs <= 2,
        "account A ran over its cap: {a:?}"
    );
    assert!(
        b.max_concurrent_jobs <= 2,
        "account B ran over its cap: {b:?}"
    );
    assert_eq!(a.jobs_created, 2, "A got work after the move: {a:?}");
    assert_eq!(
        a.jobs_created + b.jobs_created,
        8,
        "a saga got two jobs (or none): A {a:?}, B {b:?}"
    );
    assert_eq!(a.cancelled + b.cancelled, 0);
    for (sid, token) in &sessions {
        let s = support::session_status(http, base, sid, token).await;
        assert_eq!(s["status"], "COMPLETED", "{s}");
    }
}
db_test!(a_provider_moved_while_its_jobs_run_keeps_both_caps);

/// Closing now refuses the next submission with the closing message;
/// reopening takes the next one again; credits are set, topped up (every
/// concurrent top-up counted), and refused as a top-up when unlimited.
async fn closing_reopening_and_credits_take_effect_for_the_next_submission(backend: Backend) {
    let app = TestApp::spawn_with(backend, support::fast_sim(), |c| {
        c.poll_interval = DEFAULT_POLL;
    })
    .await;
    let (http, base) = (&app.http, app.base.as_str());
    let slug = experience_with(http, base, json!({"credits": 1})).await;

    let (sid, token) = support::create_session(http, base, &slug, None, "first").await;
    let ok = support::submit(http, base, &sid, &token, json!({"prompt": "x"}), "k1").await;
    assert_eq!(ok.status(), 202);
    let (sid2, token2) = support::create_session(http, base, &slug, None, "second").await;
    let broke = support::submit(http, base, &sid2, &token2, json!({"prompt": "x"}), "k2").await;
    assert_eq!(broke.status(), 402, "credits ran out");

    // Ten top-ups of 1 at once, while nothing else changes: all counted.
    let topups = (0..10).map(|_| patch(http, base, &slug, json!({"credits_add": 1})));
    for (status, body) in futures_util::future::join_all(topups).await {
        assert_eq!(status, 200, "{body}");
    }
    let (_, experience) = patch(http, base, &slug, json!({"title": "Live again"})).await;
    assert_eq!(experience["credits"], 10, "{experience}");
    let topped = support::submit(http, base, &sid2, &token2, json!({"prompt": "x"}), "k3").await;
    assert_eq!(topped.status(), 202, "{:?}", topped.text().await);

    let (status, body) = patch(http, base, &slug, json!({"credits": 0})).await;
    assert_eq!((status, &body["credits"]), (200, &json!(0)));
    let (status, body) = patch(http, base, &slug, json!({"credits": null})).await;
    assert_eq!((status, &body["credits"]), (200, &Value::Null), "unlimited");
    let (status, body) = patch(http, base, &slug, json!({"credits_add": 5})).await;
    assert_eq!(status, 409, "a top-up of unlimited credits: {body}");

    // Closed now: the next submission hears it; reopened: welcome again.
    let (sid3, token3) = support::create_session(http, base, &slug, None, "third").await;
    let now = chrono::Utc::now() - chrono::Duration::seconds(1);
    let (status, body) = patch(http, base, &slug, json!({"closes_at": now.to_rfc3339()})).await;
    assert_eq!(status, 200, "{body}");
    let closed = support::submit(http, base, &sid3, &token3, json!({"prompt": "x"}), "k4").await;
    assert_eq!(closed.status(), 409);
    let closed: Value = closed.json().await.unwrap();
    assert_eq!(closed["error"], "closing", "{closed}");
    let (status, body) = patch(http, base, &slug, json!({"closes_at": null})).await;
    assert_eq!((status, &body["closes_at"]), (200, &Value::Null));
    let open = support::submit(http, base, &sid3, &token3, json!({"prompt": "x"}), "k5").await;
    assert_eq!(open.status(), 202, "reopened: {:?}", open.text().await);
}
db_test!(closing_reopening_and_credits_take_effect_for_the_next_submission);

/// The patch's rules: an unknown field is 400, a fixed one 409 saying
/// why, a bad value 422 naming the setting, nothing changes on any of
/// them; the same Idempotency-Key replays; a PIN gallery whose title
/// changes keeps its PIN (the server holds only its hash).
async fn a_patch_is_checked_like_a_new_experience(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let (http, base) = (&app.http, app.base.as_str());
    let slug = experience_with(
        http,
        base,
        json!({"gallery": "pin", "gallery_pin": "246810", "max_in_flight": 3}),
    )
    .await;

    let (status, body) = patch(http, base, &slug, json!({"colour": "red"})).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (400, Some("invalid_json")),
        "{body}"
    );
    for fixed in ["slug", "kind", "ai_calls", "min_success"] {
        let (status, body) = patch(http, base, &slug, json!({ fixed: "x" })).await;
        assert_eq!(
            (status, body["error"].as_str()),
            (409, Some("conflict")),
            "{body}"
        );
        assert!(
            body["message"].as_str().unwrap().contains(fixed),
            "the message names {fixed}: {body}"
        );
    }
    for (bad, named) in [
        (json!({"max_in_flight": 0}), "max_in_flight"),
        (json!({"weight": 101}), "weight"),
        (json!({"provider": "nowhere"}), "provider"),
        (json!({"closes_at": "tomorrow"}), "closes_at"),
        (json!({"retention": "forever"}), "retention"),
        (json!({"max_in_flight": "many"}), "max_in_flight"),
        (json!({"credits_add": -3}), "credits_add"),
    ] {
        let (status, body) = patch(http, base, &slug, bad.clone()).await;
        assert_eq!(status, 422, "{bad}: {body}");
        assert!(
            body["message"].as_str().unwrap().contains(named),
            "{bad}: the message names {named}: {body}"
        );
    }
    let (_, unchanged) = app.operator_get(&format!("/api/experiences/{slug}")).await;
    assert_eq!(
        unchanged["max_in_flight"], 3,
        "a refused patch changed something"
    );

    // The same key and body: the first answer again.
    let key = uuid::Uuid::new_v4().to_string();
    let send = || {
        http.patch(format!("{base}/api/experiences/{slug}"))
            .bearer_auth(OPERATOR)
            .header("Idempotency-Key", &key)
            .json(&json!({"title": "Gallery night"}))
            .send()
    };
    let first = send().await.unwrap();
    assert_eq!(first.status(), 200);
    let again = send().await.unwrap();
    assert_eq!(again.status(), 200);
    assert_eq!(
        again
            .headers()
            .get("Idempotent-Replayed")
            .map(|v| v.to_str().unwrap()),
        Some("true")
    );

    // The PIN stays what it was: the old PIN opens, the stand-in does not.
    let gallery = |pin: &'static str| {
        http.get(format!("{base}/api/experiences/{slug}/gallery"))
            .header("X-Gallery-Pin", pin)
            .send()
    };
    assert_eq!(gallery("246810").await.unwrap().status(), 200);
    assert_eq!(gallery("000000").await.unwrap().status(), 401);
    // A new PIN replaces it.
    let (status, body) = patch(http, base, &slug, json!({"gallery_pin": "13572468"})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(gallery("13572468").await.unwrap().status(), 200);
    assert_eq!(gallery("246810").await.unwrap().status(), 401);
}
db_test!(a_patch_is_checked_like_a_new_experience);
