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
