//! Crash recovery of the real binary, on SQLite and on PostgreSQL: the server
//! process is killed with SIGKILL while its sagas wait on the AI, a new
//! process is started on the same database, and every saga still ends
//! COMPLETED while the provider (the simulator, running in this test process
//! so it outlives the server) saw exactly one job per session.
//!
//! The server runs as a child process (`stagehand serve`), so a kill -9 is a
//! real kill -9: no destructor, no graceful shutdown, leases left behind.

mod support;

use std::time::{Duration, Instant};

use sea_orm::{ConnectionTrait, EntityTrait};
use serde_json::json;
use stagehand::ai::simulator::{RunningSim, SimConfig};
use stagehand::store::entities::sagas;
use stagehand::store::Store;
use support::{http_client, Backend, Logs, Server, TestDb};

/// The simulator of these tests: every job takes 2 s, so the kill lands
/// while jobs are running.
fn crash_sim() -> SimConfig {
    SimConfig {
        latency: Duration::from_secs(2),
        ..support::fast_sim()
    }
}

fn steps(counts: &[(String, i64)], step: &str) -> i64 {
    counts
        .iter()
        .find(|(s, _)| s == step)
        .map(|(_, n)| *n)
        .unwrap_or(0)
}

struct Participant {
    sid: String,
    token: String,
    marker: String,
}

/// Opens `n` sessions on a fresh experience and submits each with a prompt
/// that carries a unique marker.
async fn submit_sessions(http: &reqwest::Client, base: &str, n: usize) -> Vec<Participant> {
    let slug = support::create_experience(http, base, 20).await;
    let (terminal, _) = support::create_terminal(http, base, &slug).await;
    let mut out = Vec::new();
    for i in 0..n {
        let (sid, token) =
            support::create_session(http, base, &slug, Some(&terminal), &format!("p{i}")).await;
        let marker = format!("crash-test {i} {}", uuid::Uuid::new_v4().simple());
        let resp = support::submit(
            http,
            base,
            &sid,
            &token,
            json!({"prompt": format!("a comic about {marker}")}),
            &format!("key-{i}"),
        )
        .await;
        assert_eq!(resp.status(), 202, "{:?}", resp.text().await);
        out.push(Participant { sid, token, marker });
    }
    out
}

/// Waits (one shared deadline) until every session is final, and asserts it
/// COMPLETED with content.
async fn assert_all_completed(
    http: &reqwest::Client,
    base: &str,
    participants: &[Participant],
    within: Duration,
) {
    let deadline = Instant::now() + within;
    for p in participants {
        let left = deadline.saturating_duration_since(Instant::now());
        let s = support::wait_final(http, base, &p.sid, &p.token, left).await;
        assert_eq!(s["status"], "COMPLETED", "session {}: {s}", p.sid);
        assert!(
            s["result"]["content"]
                .as_array()
                .is_some_and(|c| !c.is_empty()),
            "session {} completed without content: {s}",
            p.sid
        );
    }
}

fn assert_one_job_per_session(sim: &RunningSim, participants: &[Participant]) {
    for p in participants {
        assert_eq!(
            sim.control.jobs_for_prompt(&p.marker),
            1,
            "the provider saw {} jobs for {:?}",
            sim.control.jobs_for_prompt(&p.marker),
            p.marker
        );
    }
    let stats = sim.control.stats();
    assert_eq!(
        stats.jobs_created,
        participants.len() as u64,
        "jobs created: {stats:?}"
    );
    assert_eq!(stats.missing_key, 0, "{stats:?}");
}

async fn all_sagas(store: &Store) -> Vec<sagas::Model> {
    sagas::Entity::find()
        .all(store.db())
        .await
        .expect("read sagas")
}

/// kill -9 of the server while 10 jobs run at the provider, restart on the
/// same database: every saga ends COMPLETED through lease recovery, with
/// exactly one provider job per session.
async fn kill9_mid_run_then_restart_completes_all(backend: Backend) {
    const N: usize = 10;
    let mut logs = Logs::new();
    let http = http_client();
    let db = TestDb::fresh(backend).await;
    let sim = support::start_sim(crash_sim()).await;

    let mut first = Server::start(&db.url, &sim.url(), &logs.next(), &http).await;
    let participants = submit_sessions(&http, &first.base, N).await;

    // All ten jobs exist at the provider and are running (2 s latency).
    let created = support::wait_for(Duration::from_secs(15), || async {
        (sim.control.stats().jobs_created == N as u64).then_some(())
    })
    .await;
    assert!(
        created.is_some(),
        "the provider did not get {N} jobs: {:?}",
        sim.control.stats()
    );
    assert!(sim.control.stats().running > 0, "{:?}", sim.control.stats());

    first.kill9();
    let killed_at = Instant::now();
    drop(first);

    // Right after the kill the database holds unfinished sagas, owned by a
    // dead process.
    let store = Store::connect(&db.url, 2).await.expect("open the database");
    let at_kill = store.count_by_step().await.expect("count sagas");
    eprintln!("[crash/{backend:?}] sagas by step at kill time: {at_kill:?}");
    assert!(
        steps(&at_kill, "AI_PENDING") > 0,
        "no saga was waiting on the AI at kill time: {at_kill:?}"
    );
    assert!(
        steps(&at_kill, "COMPLETED") < N as i64,
        "everything had already completed: {at_kill:?}"
    );

    let second = Server::start(&db.url, &sim.url(), &logs.next(), &http).await;
    assert_all_completed(&http, &second.base, &participants, Duration::from_secs(40)).await;
    let took = killed_at.elapsed();
    eprintln!("[crash/{backend:?}] kill -> all {N} sagas COMPLETED: {took:?}");

    assert_one_job_per_session(&sim, &participants);
    let rows = all_sagas(&store).await;
    assert_eq!(rows.len(), N, "one saga per session");
    assert!(rows.iter().all(|s| s.step == "COMPLETED"), "{rows:?}");
    let recovered = rows.iter().filter(|s| s.recoveries >= 1).count();
    eprintln!(
        "[crash/{backend:?}] sagas resumed after a lost lease: {recovered} of {N}; sim stats {:?}",
        sim.control.stats()
    );
    assert!(
        recovered >= 1,
        "no saga went through lease recovery: {:?}",
        rows.iter()
            .map(|s| (s.id.as_str(), s.recoveries))
            .collect::<Vec<_>>()
    );
    drop(second);
    sim.stop().await;
}
db_test!(kill9_mid_run_then_restart_completes_all);

/// The provider is down; the server is killed after the first submits were
/// refused (503), restarted while it is still down, then the provider comes
/// back: every saga completes with one job per session.
async fn kill9_while_provider_down_then_recover(backend: Backend) {
    const N: usize = 3;
    let mut logs = Logs::new();
    let http = http_client();
    let db = TestDb::fresh(backend).await;
    let sim = support::start_sim(crash_sim()).await;
    sim.control.set_down(true);

    let mut first = Server::start(&db.url, &sim.url(), &logs.next(), &http).await;
    let participants = submit_sessions(&http, &first.base, N).await;

    // Every saga's AI submit was answered 503 (the provider's record:
    // each saga's first submit, and its key asked again at once). A 503 to
    // a create is unclear (the job may have been made), so the sagas wait
    // in place, holding their slots, and their rows do not change.
    let store = Store::connect(&db.url, 2).await.expect("open the database");
    let refused = support::wait_for(Duration::from_secs(15), || async {
        let rows = all_sagas(&store).await;
        let refused = sim.control.stats().refused;
        (rows.len() == N && refused >= 2 * N as u64).then_some(refused)
    })
    .await;
    let Some(refused) = refused else {
        let rows = all_sagas(&store).await;
        panic!(
            "not every saga saw its submit refused within 15 s: {:?}; {rows:?}",
            sim.control.stats()
        );
    };
    eprintln!("[crash-down/{backend:?}] submits answered 503 before the kill: {refused}");

    first.kill9();
    let killed_at = Instant::now();
    drop(first);
    let at_kill = store.count_by_step().await.expect("count sagas");
    assert_eq!(steps(&at_kill, "AI_PENDING"), N as i64, "{at_kill:?}");
    assert_eq!(sim.control.stats().jobs_created, 0);

    let second = Server::start(&db.url, &sim.url(), &logs.next(), &http).await;
    sim.control.set_down(false);
    assert_all_completed(&http, &second.base, &participants, Duration::from_secs(40)).await;
    eprintln!(
        "[crash-down/{backend:?}] kill -> all {N} sagas COMPLETED: {:?}",
        killed_at.elapsed()
    );

    assert_one_job_per_session(&sim, &participants);
    let rows = all_sagas(&store).await;
    assert_eq!(rows.len(), N);
    assert!(rows.iter().all(|s| s.step == "COMPLETED"), "{rows:?}");
    assert!(
        rows.iter().all(|s| s.attempts == 0),
        "unavailability is not an attempt: {rows:?}"
    );
    eprintln!(
        "[crash-down/{backend:?}] recoveries per saga: {:?}; sim stats {:?}",
        rows.iter().map(|s| s.recoveries).collect::<Vec<_>>(),
        sim.control.stats()
    );
    drop(second);
    sim.stop().await;
}
db_test!(kill9_while_provider_down_then_recover);

/// Every file under `dir` (recursively), by path.
fn files_under(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let mut todo = vec![dir.to_owned()];
    while let Some(at) = todo.pop() {
        for entry in std::fs::read_dir(&at).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                todo.push(path);
            } else {
                found.push(path);
            }
        }
    }
    found
}

/// kill -9 while the server keeps results: the jobs have succeeded at the
/// provider, but the S3 server holding the media is stopped, so every saga
/// is in its keep stage (retrying) when the process dies. The S3 server
/// comes back, a new process starts: every saga completes with exactly one
/// stored object per output and one AI job per session.
async fn kill9_while_keeping_results_then_restart(backend: Backend) {
    const N: usize = 6;
    let mut logs = Logs::new();
    let http = http_client();
    let db = TestDb::fresh(backend).await;
    let sim = support::start_sim(crash_sim()).await;
    support::S3Server::credentials_in_env();
    let mut s3 = support::S3Server::start("media").await;
    let media_url = s3.media_url("media");
    let env = [("STAGEHAND_MEDIA_URL", media_url.as_str())];
    let mut first = Server::start_with(&db.url, &sim.url(), &logs.next(), &http, &env).await;
    let participants = submit_sessions(&http, &first.base, N).await;
    s3.stop();
    let all_done = support::wait_for(Duration::from_secs(20), || async {
        let stats = sim.control.stats();
        (stats.jobs_created == N as u64 && stats.running == 0).then_some(())
    })
    .await;
    assert!(
        all_done.is_some(),
        "the jobs did not end: {:?}",
        sim.control.stats()
    );
    let store = Store::connect(&db.url, 2).await.expect("open the database");
    let at_kill = store.count_by_step().await.expect("count sagas");
    assert_eq!(
        steps(&at_kill, "AI_PENDING"),
        N as i64,
        "every saga is keeping its result: {at_kill:?}"
    );
    first.kill9();
    drop(first);
    s3.resume().await;
    let second = Server::start_with(&db.url, &sim.url(), &logs.next(), &http, &env).await;
    assert_all_completed(&http, &second.base, &participants, Duration::from_secs(60)).await;
    assert_one_job_per_session(&sim, &participants);
    let kept: Vec<_> = files_under(&s3.root.path().join("media/r"))
        .into_iter()
        .filter(|p| !p.to_string_lossy().contains(".s3s"))
        .collect();
    assert_eq!(kept.len(), N, "one stored object per output: {kept:?}");
    for p in &participants {
        let done = support::session_status(&http, &second.base, &p.sid, &p.token).await;
        let url = done["result"]["content"][0]["url"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        assert!(url.starts_with("/media/r/"), "{done}");
        let file = http
            .get(format!("{}{url}", second.base))
            .send()
            .await
            .unwrap();
        assert_eq!(file.status(), 200, "{url}");
    }
    drop(second);
    sim.stop().await;
}
db_test!(kill9_while_keeping_results_then_restart);

/// kill -9 while the retention purge runs: sessions of an experience
/// kept 1 s are forgotten and their objects deleted by the cleanup (every
/// 100 ms) when the process dies; a new process finishes the purge. After
/// it, every session is forgotten, no kept object is left in the bucket,
/// no session still waits for its objects, and every link answers 410:
/// nothing half-done.
async fn kill9_during_the_purge_then_restart(backend: Backend) {
    const N: usize = 40;
    let mut logs = Logs::new();
    let http = http_client();
    let db = TestDb::fresh(backend).await;
    let sim = support::start_sim(support::fast_sim()).await;
    support::S3Server::credentials_in_env();
    let s3 = support::S3Server::start("media").await;
    let media_url = s3.media_url("media");
    let env = [
        ("STAGEHAND_MEDIA_URL", media_url.as_str()),
        ("STAGEHAND_CLEANUP_INTERVAL", "100ms"),
    ];
    let first = Server::start_with(&db.url, &sim.url(), &logs.next(), &http, &env).await;
    let slug = format!("purge-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let resp = http
        .post(format!("{}/api/experiences", first.base))
        .bearer_auth(support::OPERATOR)
        .json(
            &json!({"slug": slug, "title": "Kept a second", "kind": "comic",
                      "max_in_flight": 20, "retention": "1s"}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    let mut links = Vec::new();
    for i in 0..N {
        let (sid, token) =
            support::create_session(&http, &first.base, &slug, None, &format!("p{i}")).await;
        let resp = support::submit(
            &http,
            &first.base,
            &sid,
            &token,
            json!({"prompt": format!("a comic {i}")}),
            &format!("key-{i}"),
        )
        .await;
        assert_eq!(resp.status(), 202);
        links.push((sid, token));
    }
    let held = |base: String| {
        let http = http.clone();
        let slug = slug.clone();
        async move {
            let resp = http
                .get(format!("{base}/api/admin/experiences/{slug}/held"))
                .bearer_auth(support::OPERATOR)
                .send()
                .await
                .ok()?;
            resp.json::<serde_json::Value>().await.ok()
        }
    };
    // The purge has begun: kill at once.
    let at_kill = support::wait_for(Duration::from_secs(60), || async {
        held(first.base.clone())
            .await
            .filter(|h| h["forgotten"].as_i64() > Some(0))
    })
    .await
    .expect("the purge began");
    let mut first = first;
    first.kill9();
    drop(first);
    let objects = || {
        files_under(&s3.root.path().join("media/r"))
            .into_iter()
            .filter(|p| !p.to_string_lossy().contains(".s3s"))
            .count()
    };
    eprintln!(
        "kill -9 during the purge: {} of {N} sessions forgotten, {} kept objects left",
        at_kill["forgotten"],
        objects()
    );
    let second = Server::start_with(&db.url, &sim.url(), &logs.next(), &http, &env).await;
    let store = Store::connect(&db.url, 2).await.expect("open the database");
    // Sessions not yet forgotten, or forgotten with objects still to
    // delete. The purge deletes a batch's objects before it marks their
    // rows, so an empty bucket alone does not say it is finished.
    let half_forgotten = || async {
        store
            .db()
            .query_one_raw(store.sql(
                "SELECT COUNT(*) FROM sessions WHERE objects_left = $1 OR forgotten_at_ms IS NULL",
                vec![true.into()],
            ))
            .await
            .unwrap()
            .unwrap()
            .try_get_by_index::<i64>(0)
            .unwrap()
    };
    let done = support::wait_for(Duration::from_secs(60), || async {
        let h = held(second.base.clone()).await?;
        (h["forgotten"].as_i64() == Some(N as i64) && objects() == 0 && half_forgotten().await == 0)
            .then_some(h)
    })
    .await;
    assert!(
        done.is_some(),
        "the purge did not finish: {:?}, {} objects, {} sessions half-forgotten",
        held(second.base.clone()).await,
        objects(),
        half_forgotten().await
    );
    for (sid, token) in &links {
        let view = support::session_status(&http, &second.base, sid, token).await;
        assert_eq!(view["erased"], true, "{view}");
        assert_eq!(view["share_url"], serde_json::Value::Null);
    }
    drop(second);
    sim.stop().await;
}
db_test!(kill9_during_the_purge_then_restart);

/// An experience moved from account A to account B while A's jobs run,
/// then kill -9: the restarted server resumes the sagas whose jobs run on
/// A (their slots say so), polls them there and completes them. No job is
/// created on B for them, and none on A again.
async fn kill9_after_a_provider_move_resumes_on_the_jobs_account(backend: Backend) {
    const N: usize = 2;
    let mut logs = Logs::new();
    let http = http_client();
    let db = TestDb::fresh(backend).await;
    let (sim_a, sim_b) = (
        support::start_sim(SimConfig {
            latency: Duration::from_secs(4),
            ..support::fast_sim()
        })
        .await,
        support::start_sim(crash_sim()).await,
    );
    let dir = tempfile::tempdir().expect("temp dir");
    let providers = dir.path().join("providers.toml");
    std::fs::write(
        &providers,
        format!(
            "[providers.a]\nkind = \"jobs\"\nurl = \"{}\"\nmax_in_flight = 5\n\n\
             [providers.b]\nkind = \"jobs\"\nurl = \"{}\"\nmax_in_flight = 5\n",
            sim_a.url(),
            sim_b.url()
        ),
    )
    .expect("providers file");
    let env = [("STAGEHAND_PROVIDERS", providers.to_str().expect("path"))];
    let mut first = Server::start_with(&db.url, &sim_a.url(), &logs.next(), &http, &env).await;
    let slug = format!("moved-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let created = http
        .post(format!("{}/api/experiences", first.base))
        .bearer_auth(support::OPERATOR)
        .json(&json!({"slug": slug, "title": "Moved", "kind": "image", "provider": "a"}))
        .send()
        .await
        .expect("create");
    assert_eq!(created.status(), 201);
    let mut participants = Vec::new();
    for i in 0..N {
        let (sid, token) =
            support::create_session(&http, &first.base, &slug, None, &format!("p{i}")).await;
        let resp = support::submit(
            &http,
            &first.base,
            &sid,
            &token,
            json!({"prompt": "a moved cat"}),
            &uuid::Uuid::new_v4().to_string(),
        )
        .await;
        assert_eq!(resp.status(), 202);
        participants.push(Participant {
            sid,
            token,
            marker: "a moved cat".into(),
        });
    }
    let running = support::wait_for(Duration::from_secs(10), || async {
        (sim_a.control.stats().running == N as u64).then_some(())
    })
    .await;
    assert!(
        running.is_some(),
        "A never ran the jobs: {:?}",
        sim_a.control.stats()
    );

    let moved = http
        .patch(format!("{}/api/experiences/{slug}", first.base))
        .bearer_auth(support::OPERATOR)
        .json(&json!({"provider": "b"}))
        .send()
        .await
        .expect("PATCH");
    assert_eq!(moved.status(), 200);
    first.kill9();
    drop(first);

    let second = Server::start_with(&db.url, &sim_a.url(), &logs.next(), &http, &env).await;
    assert_all_completed(&http, &second.base, &participants, Duration::from_secs(40)).await;
    let (a, b) = (sim_a.control.stats(), sim_b.control.stats());
    assert_eq!(
        b.jobs_created, 0,
        "a resumed saga sent its job to B: A {a:?}, B {b:?}"
    );
    assert_eq!(
        a.jobs_created, N as u64,
        "a job was created twice on A: {a:?}"
    );
    drop(second);
    sim_a.stop().await;
    sim_b.stop().await;
}
db_test!(kill9_after_a_provider_move_resumes_on_the_jobs_account);
