//! Graceful shutdown and restarts of the real binary, as a deploy does them:
//! SIGTERM hands running sagas over (another instance resumes them at once,
//! at the default poll interval and lease, without using up a recovery, so
//! deploys never orphan a long AI call), closes display sockets with 1001
//! "going away", and exits; SQLite mode refuses a second `serve` on the
//! same file; a saga step that meets a database error (a lock held by
//! another process) runs again instead of sitting out its lease.

mod support;

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use sea_orm::{ConnectionTrait, Database, EntityTrait};
use serde_json::json;
use stagehand::ai::simulator::SimConfig;
use stagehand::store::entities::sagas;
use support::{http_client, Backend, Logs, Server, TestDb};
use tokio_tungstenite::tungstenite::Message;

/// What a deploy runs: the default poll interval (10 s) and lease (60 s),
/// so only the hand-over (not a poll, not an expired lease) can explain a
/// resume within seconds; a short grace so the AI call outlasts it.
const DEPLOYED: [(&str, &str); 4] = [
    ("STAGEHAND_POLL_INTERVAL", ""),
    ("STAGEHAND_LEASE", ""),
    ("STAGEHAND_SHUTDOWN_GRACE", "300ms"),
    ("STAGEHAND_MAX_RECOVERIES", "1"),
];

async fn all_sagas(url: &str) -> Vec<sagas::Model> {
    let db = Database::connect(url).await.expect("connect");
    let rows = sagas::Entity::find().all(&db).await.expect("sagas");
    db.close().await.ok();
    rows
}

/// Two deploys during one long AI call: each instance is SIGTERMed while
/// the jobs run; the next resumes them at once and adopts the same jobs.
/// With MAX_RECOVERIES = 1, two lost leases would orphan them; hand-overs
/// cost nothing, so all complete with `recoveries = 0`, one job each.
async fn two_deploys_during_a_long_ai_call_orphan_nothing(backend: Backend) {
    let db = TestDb::fresh(backend).await;
    let sim = support::start_sim(SimConfig {
        latency: Duration::from_secs(4),
        ..support::fast_sim()
    })
    .await;
    let http = http_client();
    let mut logs = Logs::new();
    let mut a_log = logs.next();
    let mut a = Server::start_with(&db.url, &sim.url(), &a_log, &http, &DEPLOYED).await;
    let slug = support::create_experience(&http, &a.base, 10).await;
    let (terminal, terminal_token) = support::create_terminal(&http, &a.base, &slug).await;
    let mut participants = Vec::new();
    for i in 0..3 {
        let (sid, token) =
            support::create_session(&http, &a.base, &slug, Some(&terminal), &format!("p{i}")).await;
        let resp = support::submit(
            &http,
            &a.base,
            &sid,
            &token,
            json!({"prompt": format!("deploy {i}")}),
            &format!("key-{i}"),
        )
        .await;
        assert_eq!(resp.status(), 202, "{:?}", resp.text().await);
        participants.push((sid, token));
    }
    let control = sim.control.clone();
    let started = support::wait_for(Duration::from_secs(10), || {
        let control = control.clone();
        async move { (control.stats().running >= 3).then_some(()) }
    })
    .await;
    assert!(
        started.is_some(),
        "the 3 jobs never ran: {:?}",
        sim.control.stats()
    );

    // A display on A is told to go away, with 1001.
    let port: u16 = a.base.rsplit(':').next().unwrap().parse().unwrap();
    let url = format!("ws://127.0.0.1:{port}/ws/terminals/{terminal}?token={terminal_token}");
    let (mut display, _) = tokio_tungstenite::connect_async(url)
        .await
        .expect("display");

    let mut previous = None;
    for deploy in 1..=2 {
        // PostgreSQL: the next instance runs beside the old one, as behind a
        // load balancer. SQLite is one process: it starts after.
        let next_log = logs.next();
        let next = if backend == Backend::Postgres {
            Some(Server::start_with(&db.url, &sim.url(), &next_log, &http, &DEPLOYED).await)
        } else {
            None
        };
        let term_at = Instant::now();
        a.sigterm();
        let status = a.exited(Duration::from_secs(10)).await;
        assert!(
            status.is_some_and(|s| s.success()),
            "deploy {deploy}: SIGTERM did not end the server cleanly within 10 s: {status:?}"
        );
        // The old instance says what it did (on PostgreSQL the next one may
        // have resumed them already, so the rows cannot show it).
        let said = std::fs::read_to_string(&a_log).unwrap_or_default();
        assert!(
            said.lines()
                .any(|l| l.contains("shut down") && l.contains("handed_over=3")),
            "deploy {deploy}: the 3 running sagas were handed over:\n{}",
            support::tail(&a_log, 20)
        );
        if backend == Backend::Sqlite {
            let rows = all_sagas(&db.url).await;
            assert!(
                rows.iter().all(|s| s.step == "AI_PENDING" && s.handed_over),
                "deploy {deploy}: every saga waits, handed over: {:?}",
                rows.iter()
                    .map(|s| (&s.step, s.handed_over, s.recoveries))
                    .collect::<Vec<_>>()
            );
        }
        if deploy == 1 {
            let close = tokio::time::timeout(Duration::from_secs(5), async {
                while let Some(frame) = display.next().await {
                    match frame {
                        Ok(Message::Close(c)) => return c.map(|c| u16::from(c.code)),
                        Ok(_) => continue,
                        Err(_) => return None,
                    }
                }
                None
            })
            .await;
            assert_eq!(
                close,
                Ok(Some(1001)),
                "the display is told the server goes away"
            );
        }
        let b = match next {
            Some(b) => b,
            None => Server::start_with(&db.url, &sim.url(), &next_log, &http, &DEPLOYED).await,
        };
        a_log = next_log;
        // Resumed at once: claimed again (handed_over cleared) within 3 s of
        // the SIGTERM, far under the 10 s poll and the 60 s lease.
        let resumed = support::wait_for(Duration::from_secs(3), || {
            let url = db.url.clone();
            async move {
                let rows = all_sagas(&url).await;
                rows.iter()
                    .all(|s| !s.handed_over && s.lock_token.is_some())
                    .then_some(())
            }
        })
        .await;
        assert!(
            resumed.is_some(),
            "deploy {deploy}: the handed-over sagas were not resumed within 3 s of the SIGTERM ({:?} ago)",
            term_at.elapsed()
        );
        previous = Some(std::mem::replace(&mut a, b));
    }
    drop(previous);

    let deadline = Instant::now() + Duration::from_secs(20);
    for (sid, token) in &participants {
        let left = deadline.saturating_duration_since(Instant::now());
        let s = support::wait_final(&http, &a.base, sid, token, left).await;
        assert_eq!(s["status"], "COMPLETED", "session {sid}: {s}");
    }
    let rows = all_sagas(&db.url).await;
    assert!(
        rows.iter().all(|s| s.recoveries == 0),
        "a hand-over uses up no recovery: {:?}",
        rows.iter().map(|s| s.recoveries).collect::<Vec<_>>()
    );
    assert_eq!(
        sim.control.stats().jobs_created,
        3,
        "each resume adopted the job already running"
    );
}
db_test!(two_deploys_during_a_long_ai_call_orphan_nothing);

/// SQLite mode is single-instance: a second `serve` on the same file exits
/// at once with a message that says why; after the first is killed (even
/// with -9) the file is free again.
#[actix_web::test]
async fn a_second_serve_on_one_sqlite_file_refuses_to_start() {
    let db = TestDb::fresh(Backend::Sqlite).await;
    let sim = support::start_sim(support::fast_sim()).await;
    let http = http_client();
    let mut logs = Logs::new();
    let mut first = Server::start(&db.url, &sim.url(), &logs.next(), &http).await;

    let port = support::free_port();
    let second = std::process::Command::new(env!("CARGO_BIN_EXE_stagehand"))
        .arg("serve")
        .env("STAGEHAND_DATABASE_URL", &db.url)
        .env("STAGEHAND_MEDIA_URL", support::media_folder_of(&db.url))
        .env("STAGEHAND_BIND", format!("127.0.0.1:{port}"))
        .env("STAGEHAND_AI_URL", sim.url())
        .env("STAGEHAND_OPERATOR_TOKEN", support::OPERATOR)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run a second serve");
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(!second.status.success(), "the second serve must not run");
    assert!(
        stderr.contains("in use by another stagehand process")
            && stderr.contains("single-instance"),
        "the message says why: {stderr}"
    );

    first.kill9();
    let _again = Server::start(&db.url, &sim.url(), &logs.next(), &http).await;
}

/// A saga step whose write meets a lock another process holds (SQLite
/// BUSY after the busy timeout) runs again with backoff, and the saga
/// completes once the lock is gone, with the default 60 s lease: it does
/// not sit the lease out, nor use up a recovery.
#[actix_web::test]
async fn a_step_that_meets_a_database_error_runs_again() {
    let db = TestDb::fresh(Backend::Sqlite).await;
    let sim = support::start_sim(SimConfig {
        latency: Duration::from_millis(1500),
        ..support::fast_sim()
    })
    .await;
    let http = http_client();
    let mut logs = Logs::new();
    let log = logs.next();
    let server = Server::start_with(
        &db.url,
        &sim.url(),
        &log,
        &http,
        &[("STAGEHAND_LEASE", ""), ("STAGEHAND_POLL_INTERVAL", "")],
    )
    .await;
    let slug = support::create_experience(&http, &server.base, 10).await;
    let (sid, token) = support::create_session(&http, &server.base, &slug, None, "p").await;
    let resp = support::submit(
        &http,
        &server.base,
        &sid,
        &token,
        json!({"prompt": "x"}),
        "k",
    )
    .await;
    assert_eq!(resp.status(), 202);
    let control = sim.control.clone();
    let running = support::wait_for(Duration::from_secs(10), || {
        let control = control.clone();
        async move { (control.stats().running >= 1).then_some(()) }
    })
    .await;
    assert!(running.is_some(), "the job never ran");

    // Another process takes SQLite's write lock while the job runs, so
    // the first write after it (the keep stage's record of the files it
    // is about to store, or the AI_DONE write) waits out the busy timeout
    // and fails; either is tried again, with no new AI job.
    let locker = Database::connect(&db.url).await.expect("connect");
    locker
        .execute_unprepared("BEGIN IMMEDIATE")
        .await
        .expect("take the write lock");
    let retried = support::wait_for(Duration::from_secs(30), || {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        async move {
            (text.contains("running the step again")
                || text.contains("keeping the result failed for now; trying again"))
            .then_some(())
        }
    })
    .await;
    assert!(
        retried.is_some(),
        "the failed step was not run again:\n{}",
        support::tail(&log, 40)
    );
    let released = Instant::now();
    locker
        .execute_unprepared("ROLLBACK")
        .await
        .expect("release");
    locker.close().await.ok();

    let s = support::wait_final(&http, &server.base, &sid, &token, Duration::from_secs(10)).await;
    assert_eq!(s["status"], "COMPLETED", "{s}");
    assert!(
        released.elapsed() < Duration::from_secs(10),
        "completed soon after the lock went, not after the lease"
    );
    let rows = all_sagas(&db.url).await;
    assert_eq!(rows[0].recoveries, 0);
    assert_eq!(sim.control.stats().jobs_created, 1);
}
