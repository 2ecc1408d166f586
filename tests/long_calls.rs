//! A long AI call keeps its saga: the worker renews its lease while it
//! waits, so neither another worker nor the cleanup actor takes the saga
//! from a live worker, however long the call (here 3 s against a 600 ms
//! lease and a cleanup round every 200 ms). On SQLite and on PostgreSQL.

mod support;

use std::time::Duration;

use serde_json::json;
use stagehand::ai::simulator::SimConfig;
use support::{fast_sim, Backend, TestApp};

async fn a_long_call_keeps_its_lease_by_renewal(backend: Backend) {
    let sim = SimConfig {
        latency: Duration::from_secs(3),
        ..fast_sim()
    };
    let app = TestApp::spawn_with(backend, sim, |config| {
        config.lease = Duration::from_millis(600);
        config.cleanup_interval = Duration::from_millis(200);
        config.max_recoveries = 0;
    })
    .await;
    let slug = app.experience(5).await;
    let (sid, tok) = app.session(&slug, None, "patient").await;
    assert_eq!(
        app.submit(&sid, &tok, json!({"prompt": "x"}), "k")
            .await
            .status(),
        202
    );
    let done = app.wait_final(&sid, &tok, Duration::from_secs(20)).await;
    assert_eq!(done["status"], "COMPLETED", "{done}");
    let saga = app.saga_of(&sid).await;
    assert_eq!(
        saga["recoveries"], 0,
        "never resumed by another worker: {saga}"
    );
    let stats = app.sim.control.stats();
    assert_eq!(stats.jobs_created, 1, "{stats:?}");
    app.stop().await;
}
db_test!(a_long_call_keeps_its_lease_by_renewal);

/// A database error at the write that follows a long AI step is retried:
/// the retries are counted per failing write, not from the start of the
/// saga. Lease 1 s, a 3 s AI call, and the server's PostgreSQL connections
/// killed again and again around the moment the result is written: the
/// saga completes without being resumed by anyone (`recoveries` 0). Before,
/// the retry window was one lease from the saga's start, long gone after
/// the AI step: the write's error stopped the worker, and the saga waited
/// out its lease and spent a recovery.
#[actix_web::test]
#[cfg_attr(not(pg_tests), ignore = "STAGEHAND_TEST_POSTGRES_URL is not set")]
async fn a_write_after_a_long_ai_step_is_retried() {
    use sea_orm::ConnectionTrait;
    let sim = SimConfig {
        latency: Duration::from_secs(3),
        ..fast_sim()
    };
    let app = TestApp::spawn_with(Backend::Postgres, sim, |config| {
        config.lease = Duration::from_secs(1);
    })
    .await;
    let slug = app.experience(5).await;
    let (sid, tok) = app.session(&slug, None, "unlucky").await;
    assert_eq!(
        app.submit(&sid, &tok, json!({"prompt": "x"}), "k")
            .await
            .status(),
        202
    );
    let started = support::wait_for(Duration::from_secs(5), || async {
        (app.sim.control.stats().jobs_created == 1).then(std::time::Instant::now)
    })
    .await
    .expect("the job starts");
    // From 2.7 s to 3.6 s after the job started, every 40 ms, end the
    // server's connections to its database.
    let admin = sea_orm::Database::connect(support::postgres_admin_url().unwrap())
        .await
        .unwrap();
    let kill = format!(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE datname = '{}' AND pid <> pg_backend_pid()",
        app.db.name()
    );
    while started.elapsed() < Duration::from_millis(2_700) {
        actix_web::rt::time::sleep(Duration::from_millis(20)).await;
    }
    let mut killed = 0;
    while started.elapsed() < Duration::from_millis(3_600) {
        admin.execute_unprepared(&kill).await.unwrap();
        killed += 1;
        actix_web::rt::time::sleep(Duration::from_millis(40)).await;
    }
    assert!(killed > 10);
    // The requests' pool met the killed connections too: a read may answer
    // 503 once before the pool reconnects.
    let done = support::wait_for(Duration::from_secs(20), || async {
        let resp = app
            .http
            .get(format!("{}/api/sessions/{sid}", app.base))
            .bearer_auth(&tok)
            .send()
            .await
            .ok()?;
        let body: serde_json::Value = resp.json().await.ok()?;
        matches!(body["status"].as_str(), Some("COMPLETED") | Some("ABORTED")).then_some(body)
    })
    .await
    .expect("the session ends");
    assert_eq!(done["status"], "COMPLETED", "{done}");
    let saga = app.saga_of(&sid).await;
    assert_eq!(
        saga["recoveries"], 0,
        "the saga was resumed after its worker gave up: {saga}"
    );
    assert_eq!(app.sim.control.stats().jobs_created, 1);
    app.stop().await;
}
