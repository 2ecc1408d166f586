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

use sea_orm::EntityTrait;
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

    // Every saga had at least one AI submit refused as unavailable.
    let store = Store::connect(&db.url, 2).await.expect("open the database");
    let refused = support::wait_for(Duration::from_secs(15), || async {
        let rows = all_sagas(&store).await;
        (rows.len() == N && rows.iter().all(|s| s.unavailable_streak >= 1)).then_some(rows)
    })
    .await;
    let Some(refused) = refused else {
        let rows = all_sagas(&store).await;
        panic!("not every saga saw a refused submit within 15 s: {rows:?}");
    };
    eprintln!(
        "[crash-down/{backend:?}] unavailable streaks before the kill: {:?}",
        refused
            .iter()
            .map(|s| s.unavailable_streak)
            .collect::<Vec<_>>()
    );

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
