//! Two server instances on one PostgreSQL database (the multi-instance
//! mode): both claim from the same queue, the per-experience AI cap holds
//! across them, and no saga runs twice. PostgreSQL only: SQLite is a
//! one-process database.

mod support;

use std::time::Duration;

use serde_json::json;
use stagehand::ai::simulator::SimConfig;
use stagehand::startup::Application;
use support::{fast_sim, postgres_admin_url, start_sim, test_config, Backend, TestDb};

#[actix_web::test]
async fn two_instances_share_the_cap_and_never_run_a_saga_twice() {
    if postgres_admin_url().is_none() {
        eprintln!("skipped: STAGEHAND_TEST_POSTGRES_URL is not set");
        return;
    }
    support::init_logs();
    let db = TestDb::fresh(Backend::Postgres).await;
    let sim = start_sim(SimConfig {
        latency: Duration::from_millis(300),
        ..fast_sim()
    })
    .await;
    let mut bases = Vec::new();
    let mut handles = Vec::new();
    for _ in 0..2 {
        let app = Application::build(test_config(&db, &sim.url()))
            .await
            .expect("instance");
        bases.push(format!("http://127.0.0.1:{}", app.port()));
        let (server, _) = app.into_server();
        handles.push(server.handle());
        actix_web::rt::spawn(server);
    }
    let http = reqwest::Client::new();
    let slug = support::create_experience(&http, &bases[0], 3).await;
    let mut sessions = Vec::new();
    for i in 0..12 {
        // Alternate instances: each wakes only its own dispatcher.
        let base = &bases[i % 2];
        let (sid, tok) = support::create_session(&http, base, &slug, None, &format!("p{i}")).await;
        let resp = support::submit(
            &http,
            base,
            &sid,
            &tok,
            json!({"prompt": format!("multi <{i}>")}),
            "k",
        )
        .await;
        assert_eq!(resp.status(), 202);
        sessions.push((sid, tok));
    }
    for (i, (sid, tok)) in sessions.iter().enumerate() {
        let s = support::wait_final(
            &http,
            &bases[(i + 1) % 2],
            sid,
            tok,
            Duration::from_secs(30),
        )
        .await;
        assert_eq!(s["status"], "COMPLETED", "{s}");
    }
    let stats = sim.control.stats();
    assert_eq!(
        stats.jobs_created, 12,
        "one job per session across both instances"
    );
    assert!(
        stats.max_concurrent_jobs <= 3,
        "cap of 3 exceeded across instances: {stats:?}"
    );
    for i in 0..12 {
        assert_eq!(sim.control.jobs_for_prompt(&format!("multi <{i}>")), 1);
    }
    for h in handles {
        h.stop(false).await;
    }
}
