//! PostgreSQL only: the slow AI call never holds a database transaction.
//! While 200 submissions wait on an AI that takes seconds, `pg_stat_activity`
//! (read through a separate admin connection) never shows a connection of the
//! application idle in a transaction for more than a second, and an unrelated
//! read (the public ranking) stays fast.

mod support;

use std::time::{Duration, Instant};

use futures_util::future::join_all;
use sea_orm::{ConnectionTrait, Database, DbBackend, Statement};
use serde_json::json;
use stagehand::ai::simulator::SimConfig;
use support::{Backend, TestApp};

const SESSIONS: usize = 200;

/// One look at the test database's connections.
struct Sample {
    idle_in_tx_over_1s: i64,
    not_idle: i64,
    total: i64,
    /// pid, state, age of the state, query: of the offenders, for the report.
    offenders: Vec<String>,
}

async fn sample(admin: &sea_orm::DatabaseConnection, db_name: &str) -> Sample {
    let counts = admin
        .query_one_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            "SELECT \
               count(*) FILTER (WHERE state LIKE 'idle in transaction%' \
                                  AND now() - state_change > interval '1 second'), \
               count(*) FILTER (WHERE state <> 'idle'), \
               count(*) \
             FROM pg_stat_activity WHERE datname = $1",
            [db_name.into()],
        ))
        .await
        .expect("query pg_stat_activity")
        .expect("one row");
    let idle_in_tx_over_1s: i64 = counts.try_get_by_index(0).unwrap();
    let not_idle: i64 = counts.try_get_by_index(1).unwrap();
    let total: i64 = counts.try_get_by_index(2).unwrap();
    let mut offenders = Vec::new();
    if idle_in_tx_over_1s > 0 {
        let rows = admin
            .query_all_raw(Statement::from_sql_and_values(
                DbBackend::Postgres,
                "SELECT pid::bigint, state, \
                        (extract(epoch FROM now() - state_change) * 1000)::bigint, \
                        query \
                 FROM pg_stat_activity WHERE datname = $1 \
                   AND state LIKE 'idle in transaction%' \
                   AND now() - state_change > interval '1 second'",
                [db_name.into()],
            ))
            .await
            .expect("query offenders");
        for row in rows {
            let pid: i64 = row.try_get_by_index(0).unwrap_or_default();
            let state: String = row.try_get_by_index(1).unwrap_or_default();
            let ms: i64 = row.try_get_by_index(2).unwrap_or_default();
            let query: String = row.try_get_by_index(3).unwrap_or_default();
            offenders.push(format!(
                "pid {pid} {state} for {ms} ms, last query: {query}"
            ));
        }
    }
    Sample {
        idle_in_tx_over_1s,
        not_idle,
        total,
        offenders,
    }
}

#[actix_web::test]
async fn no_connection_idle_in_transaction_while_the_ai_works() {
    let Some(admin_url) = support::postgres_admin_url() else {
        eprintln!("skipped: STAGEHAND_TEST_POSTGRES_URL is not set");
        return;
    };
    let app = TestApp::spawn_with(
        Backend::Postgres,
        SimConfig {
            latency: Duration::from_secs(4),
            ..support::fast_sim()
        },
        |c| {
            c.db_pool = 10;
        },
    )
    .await;
    let db_name = app.db.name().to_owned();
    let admin = Database::connect(&admin_url)
        .await
        .expect("admin connection");

    // Room for all 200 at once: every saga goes to the AI together.
    let slug = app.experience(SESSIONS as i32).await;
    let mut sessions = Vec::new();
    for batch in (0..SESSIONS).collect::<Vec<_>>().chunks(50) {
        let created = join_all(batch.iter().map(|i| {
            let slug = &slug;
            let app = &app;
            async move { app.session(slug, None, &format!("p{i}")).await }
        }))
        .await;
        sessions.extend(created);
    }
    for (n, batch) in sessions.chunks(50).enumerate() {
        let app = &app;
        let answers = join_all(batch.iter().enumerate().map(|(i, (sid, token))| {
            let marker = format!("idle-tx {} {}", n * 50 + i, uuid::Uuid::new_v4().simple());
            async move {
                app.submit(sid, token, json!({"prompt": marker}), "k1")
                    .await
                    .status()
            }
        }))
        .await;
        assert!(
            answers.iter().all(|s| *s == 202),
            "every submission is accepted: {answers:?}"
        );
    }

    // Sample every 100 ms while the AI works (until all 200 jobs were
    // created and none runs any more).
    let ranking_url = format!("{}/api/experiences/{slug}/ranking", app.base);
    let mut samples_during_wait = 0u32;
    let mut samples = 0u32;
    let mut max_ranking = Duration::ZERO;
    let mut max_not_idle = 0i64;
    let mut max_total = 0i64;
    let mut max_running = 0u64;
    let mut offenders: Vec<String> = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let sampling_deadline = Instant::now() + Duration::from_secs(60);
    loop {
        tick.tick().await;
        let stats = app.sim.control.stats();
        if stats.jobs_created >= SESSIONS as u64 && stats.running == 0 {
            break;
        }
        assert!(
            Instant::now() < sampling_deadline,
            "the AI wait did not end within 60 s: {stats:?}"
        );
        let s = sample(&admin, &db_name).await;
        // The ranking is an unrelated read. 2 s is generous on purpose: this
        // is not a speed benchmark but a check that nothing it needs (a pool
        // connection, a row or table lock) is held across the AI call; such a
        // hold would last the AI latency (4 s) or more.
        let started = Instant::now();
        let resp = app
            .http
            .get(&ranking_url)
            .send()
            .await
            .expect("GET ranking");
        assert_eq!(resp.status(), 200);
        let _ = resp.bytes().await.expect("ranking body");
        let latency = started.elapsed();

        samples += 1;
        if stats.running > 0 {
            samples_during_wait += 1;
        }
        max_running = max_running.max(stats.running);
        max_ranking = max_ranking.max(latency);
        max_not_idle = max_not_idle.max(s.not_idle);
        max_total = max_total.max(s.total);
        if s.idle_in_tx_over_1s > 0 {
            offenders.push(format!(
                "sample {samples}: {} idle in transaction > 1 s: {:?}",
                s.idle_in_tx_over_1s, s.offenders
            ));
        }
    }
    let stats = app.sim.control.stats();
    eprintln!(
        "[pg_no_idle_tx] samples: {samples} ({samples_during_wait} while AI jobs ran, \
         peak running jobs {max_running}, sim max_concurrent_jobs {}); \
         max ranking latency: {max_ranking:?}; app connections: max not idle {max_not_idle}, \
         max total {max_total} (pool 10); idle-in-transaction > 1 s samples: {}",
        stats.max_concurrent_jobs,
        offenders.len()
    );
    assert!(
        offenders.is_empty(),
        "connections idle in a transaction for more than 1 s:\n{}",
        offenders.join("\n")
    );
    assert!(
        samples_during_wait >= 20,
        "only {samples_during_wait} samples were taken while the AI worked"
    );
    assert!(
        max_ranking < Duration::from_secs(2),
        "the ranking took {max_ranking:?} while the AI worked"
    );

    // Every session completes, with exactly one job each.
    let deadline = Instant::now() + Duration::from_secs(60);
    for (sid, token) in &sessions {
        let left = deadline.saturating_duration_since(Instant::now());
        let s = app.wait_final(sid, token, left).await;
        assert_eq!(s["status"], "COMPLETED", "{s}");
    }
    let stats = app.sim.control.stats();
    assert_eq!(stats.jobs_created, SESSIONS as u64, "{stats:?}");
    eprintln!("[pg_no_idle_tx] sim stats at the end: {stats:?}");
    admin.close().await.ok();
    app.stop().await;
}
