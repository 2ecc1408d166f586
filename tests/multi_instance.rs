//! Two server instances on one PostgreSQL database (the multi-instance
//! mode): both claim from the same queue, the per-experience AI cap holds
//! across them, and no saga runs twice. PostgreSQL only: SQLite is a
//! one-process database.
//!
//! The wake-up tests run both instances with the default 10 s poll, so only
//! wake-ups (LISTEN/NOTIFY), not the poll timer, can explain what happens
//! within a second or two.

mod support;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use sea_orm::{ConnectionTrait, Database, DbBackend, Statement};
use serde_json::json;
use stagehand::ai::simulator::SimConfig;
use stagehand::config::Config;
use stagehand::startup::Application;
use support::{
    fast_sim, postgres_admin_url, start_sim, test_config, Backend, Display, DisplayReader,
    Instance, TestDb,
};

#[actix_web::test]
#[cfg_attr(not(pg_tests), ignore = "STAGEHAND_TEST_POSTGRES_URL is not set")]
async fn two_instances_share_the_cap_and_never_run_a_saga_twice() {
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

/// The default poll interval (10 s): only wake-ups can be fast.
fn default_poll(config: &mut Config) {
    config.poll_interval = Config::defaults().poll_interval;
}

/// Creates `n` sessions on `base` for `terminal`, submits them all at once
/// with prompts `"{prefix} <i>"`, and returns them.
async fn submit_wave(
    http: &reqwest::Client,
    base: &str,
    slug: &str,
    terminal: &str,
    prefix: &str,
    n: usize,
) -> Vec<(String, String)> {
    let mut sessions = Vec::new();
    for i in 0..n {
        sessions.push(
            support::create_session(http, base, slug, Some(terminal), &format!("{prefix}{i}"))
                .await,
        );
    }
    let answers = join_all(sessions.iter().enumerate().map(|(i, (sid, tok))| {
        support::submit(
            http,
            base,
            sid,
            tok,
            json!({"prompt": format!("{prefix} <{i}>")}),
            "k",
        )
    }))
    .await;
    for resp in answers {
        assert_eq!(resp.status(), 202);
    }
    sessions
}

#[actix_web::test]
#[cfg_attr(not(pg_tests), ignore = "STAGEHAND_TEST_POSTGRES_URL is not set")]
async fn a_display_on_b_gets_what_a_finished_within_a_second() {
    const SESSIONS: usize = 20;
    let db = TestDb::fresh(Backend::Postgres).await;
    let sim = start_sim(SimConfig {
        latency: Duration::from_millis(100),
        ..fast_sim()
    })
    .await;
    let a = Instance::start(&db, &sim.url(), default_poll).await;
    let b = Instance::start(&db, &sim.url(), default_poll).await;
    let http = reqwest::Client::new();
    let slug = support::create_experience(&http, &a.base, SESSIONS as i32).await;
    let (tid, ttok) = support::create_terminal(&http, &a.base, &slug).await;
    let display = Display::connect("on B", b.port, &tid, &ttok, 0).await;
    let mut reader = DisplayReader::spawn(display, SESSIONS, Duration::from_secs(60));

    let sessions = submit_wave(&http, &a.base, &slug, &tid, "cross", SESSIONS).await;
    // When A reports each session final (every session watched at once).
    let finals = join_all(sessions.iter().map(|(sid, tok)| {
        let http = &http;
        let base = &a.base;
        async move {
            let s = support::wait_final(http, base, sid, tok, Duration::from_secs(20)).await;
            (sid.clone(), Instant::now(), s)
        }
    }))
    .await;
    for (_, _, s) in &finals {
        assert_eq!(s["status"], "COMPLETED", "{s}");
    }

    let mut arrived: HashMap<String, Instant> = HashMap::new();
    let mut by_final: Vec<_> = finals.iter().map(|(sid, at, _)| (sid, *at)).collect();
    by_final.sort_by_key(|(_, at)| *at);
    let first_final = by_final[0].1;
    let mut late = Vec::new();
    let mut worst_ms: Option<f64> = None;
    for (sid, final_at) in &by_final {
        let deadline = *final_at + Duration::from_secs(1);
        while !arrived.contains_key(*sid) {
            let next = match reader.arrivals.try_recv() {
                Ok(x) => Some(x),
                Err(_) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        None
                    } else {
                        tokio::time::timeout(left, reader.arrivals.recv())
                            .await
                            .ok()
                            .flatten()
                    }
                }
            };
            match next {
                Some((at, event)) => {
                    if let Some(id) = event["session_id"].as_str() {
                        arrived.entry(id.to_owned()).or_insert(at);
                    }
                }
                None => break,
            }
        }
        match arrived.get(*sid) {
            Some(at) => {
                let delay_ms = if *at >= *final_at {
                    at.duration_since(*final_at).as_secs_f64() * 1e3
                } else {
                    -(final_at.duration_since(*at).as_secs_f64() * 1e3)
                };
                worst_ms = Some(worst_ms.map_or(delay_ms, |w| w.max(delay_ms)));
                if delay_ms > 1_000.0 {
                    late.push(format!("{sid}: {delay_ms:.0} ms after A reported it final"));
                }
            }
            None => late.push(format!(
                "{sid}: no frame on B's display 1 s after A reported it final (+{} ms from the first final)",
                final_at.duration_since(first_final).as_millis()
            )),
        }
    }
    eprintln!(
        "display on B: {} of {SESSIONS} events within 1 s of A's final status; worst delay {} \
         (negative: before A's status said final)",
        SESSIONS - late.len(),
        worst_ms.map_or("- (none arrived)".to_owned(), |w| format!("{w:.0} ms"))
    );
    assert!(
        late.is_empty(),
        "{} of {SESSIONS} events reached B's display late or never, e.g.:\n{}",
        late.len(),
        late.iter().take(5).cloned().collect::<Vec<_>>().join("\n")
    );
    reader.cut_off_at(Instant::now() + Duration::from_secs(5));
    let display = reader.finish().await;
    eprintln!("display on B: {} reconnects", display.reconnects);
    let expected: Vec<String> = sessions.iter().map(|(sid, _)| sid.clone()).collect();
    display
        .check_delivery(&expected, SESSIONS as i64)
        .unwrap_or_else(|e| panic!("{e}"));
    a.stop().await;
    b.stop().await;
}

#[actix_web::test]
#[cfg_attr(not(pg_tests), ignore = "STAGEHAND_TEST_POSTGRES_URL is not set")]
async fn a_submission_on_a_is_claimed_by_b_when_a_is_full() {
    let db = TestDb::fresh(Backend::Postgres).await;
    // One simulator per instance, so the simulator that gets a job says
    // which instance claimed its saga.
    let slow = SimConfig {
        latency: Duration::from_secs(3),
        ..fast_sim()
    };
    let sim_a = start_sim(slow.clone()).await;
    let sim_b = start_sim(slow).await;
    let a = Instance::start(&db, &sim_a.url(), |c| {
        default_poll(c);
        c.max_running = 2;
    })
    .await;
    let b = Instance::start(&db, &sim_b.url(), default_poll).await;
    let http = reqwest::Client::new();
    let slug = support::create_experience(&http, &a.base, 10).await;
    let jobs = |prompt: &str| {
        (
            sim_a.control.jobs_for_prompt(prompt),
            sim_b.control.jobs_for_prompt(prompt),
        )
    };

    // Fill A: submit on A until A runs 2 sagas (B may take one of them
    // first; then another is submitted).
    let mut sessions = Vec::new();
    while sim_a.control.stats().running < 2 {
        assert!(
            sessions.len() < 6,
            "A never ran 2 sagas at once: {:?} / {:?}",
            sim_a.control.stats(),
            sim_b.control.stats()
        );
        let i = sessions.len();
        let (sid, tok) =
            support::create_session(&http, &a.base, &slug, None, &format!("f{i}")).await;
        let prompt = format!("fill <{i}>");
        let resp =
            support::submit(&http, &a.base, &sid, &tok, json!({"prompt": prompt}), "k").await;
        assert_eq!(resp.status(), 202);
        support::wait_for(Duration::from_secs(5), || async {
            let (on_a, on_b) = jobs(&prompt);
            (on_a + on_b == 1).then_some(())
        })
        .await
        .unwrap_or_else(|| panic!("no AI job for {prompt} within 5 s"));
        sessions.push((sid, tok));
    }
    eprintln!(
        "A is full after {} submissions: A runs {}, B runs {}",
        sessions.len(),
        sim_a.control.stats().running,
        sim_b.control.stats().running
    );

    let (sid, tok) = support::create_session(&http, &a.base, &slug, None, "overflow").await;
    let submitted = Instant::now();
    let resp = support::submit(
        &http,
        &a.base,
        &sid,
        &tok,
        json!({"prompt": "overflow <x>"}),
        "k",
    )
    .await;
    assert_eq!(resp.status(), 202);
    let claimed = support::wait_for(Duration::from_secs(1), || async {
        let (on_a, on_b) = jobs("overflow <x>");
        (on_a + on_b >= 1).then_some((on_a, on_b))
    })
    .await;
    let a_running = sim_a.control.stats().running;
    eprintln!(
        "saga submitted on full A: jobs (on A, on B) = {:?} after {} ms; A was running {a_running}",
        claimed,
        submitted.elapsed().as_millis()
    );
    let (on_a, on_b) = claimed.unwrap_or_else(|| {
        panic!("no instance claimed the saga submitted on full A within 1 s (B's poll is 10 s: B was not woken)")
    });
    assert_eq!(
        (on_a, on_b),
        (0, 1),
        "the saga submitted on full A must be claimed by B: A has max_running = 2 ({a_running} jobs running on A)"
    );
    sessions.push((sid, tok));

    let finals = support::wait_all_final(&http, &a.base, &sessions, Duration::from_secs(20))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    for s in &finals {
        assert_eq!(s["status"], "COMPLETED", "{s}");
    }
    for i in 0..sessions.len() - 1 {
        let (on_a, on_b) = jobs(&format!("fill <{i}>"));
        assert_eq!(on_a + on_b, 1, "one job for fill <{i}>");
    }
    assert_eq!(jobs("overflow <x>"), (0, 1));
    a.stop().await;
    b.stop().await;
}

#[actix_web::test]
#[cfg_attr(not(pg_tests), ignore = "STAGEHAND_TEST_POSTGRES_URL is not set")]
async fn listener_connection_killed_mid_run_loses_nothing() {
    const WAVES: usize = 4;
    const PER_WAVE: usize = 10;
    const ON_B: usize = 3;
    let db = TestDb::fresh(Backend::Postgres).await;
    let sim = start_sim(SimConfig {
        latency: Duration::from_millis(200),
        ..fast_sim()
    })
    .await;
    let a = Instance::start(&db, &sim.url(), default_poll).await;
    let b = Instance::start(&db, &sim.url(), default_poll).await;
    let http = reqwest::Client::new();
    let total = WAVES * PER_WAVE + ON_B;
    // Room for everything at once: no saga waits for an AI slot, so only
    // the listener's loss can delay anything.
    let slug = support::create_experience(&http, &a.base, total as i32).await;
    let (tid, ttok) = support::create_terminal(&http, &a.base, &slug).await;
    let display = Display::connect("on B", b.port, &tid, &ttok, 0).await;
    let reader = DisplayReader::spawn(display, total, Duration::from_secs(120));

    let started = Instant::now();
    let mut on_a = Vec::new();
    let mut on_b = Vec::new();
    for wave in 0..WAVES {
        let prefix = format!("w{wave}-");
        let sessions = submit_wave(&http, &a.base, &slug, &tid, &prefix, PER_WAVE).await;
        // The next wave goes when this one is running.
        support::wait_for(Duration::from_secs(5), || async {
            (0..PER_WAVE)
                .all(|i| sim.control.jobs_for_prompt(&format!("{prefix} <{i}>")) == 1)
                .then_some(())
        })
        .await
        .unwrap_or_else(|| panic!("wave {wave} did not start within 5 s"));
        on_a.extend(sessions);

        if wave == 1 {
            let admin = Database::connect(postgres_admin_url().unwrap())
                .await
                .expect("admin connection");
            let killed = admin
                .query_all_raw(Statement::from_string(
                    DbBackend::Postgres,
                    format!(
                        "SELECT pg_terminate_backend(pid) AS killed FROM pg_stat_activity \
                         WHERE datname = '{}' AND application_name = 'stagehand-listener'",
                        db.name()
                    ),
                ))
                .await
                .expect("terminate listeners")
                .iter()
                .filter(|row| row.try_get::<bool>("", "killed").unwrap_or(false))
                .count();
            admin.close().await.ok();
            eprintln!(
                "killed {killed} listener connections {:.1} s into the run",
                started.elapsed().as_secs_f64()
            );
            assert!(
                killed >= 1,
                "no connection with application_name 'stagehand-listener' on the test database"
            );

            // B still starts its own submissions at once.
            let mine = submit_wave(&http, &b.base, &slug, &tid, "on-b-", ON_B).await;
            let t = Instant::now();
            let finals = support::wait_all_final(&http, &b.base, &mine, Duration::from_secs(2))
                .await
                .unwrap_or_else(|e| panic!("on B after the kill: {e} (the poll is 10 s)"));
            eprintln!(
                "{ON_B} sessions on B after the kill final within {} ms",
                t.elapsed().as_millis()
            );
            for s in &finals {
                assert_eq!(s["status"], "COMPLETED", "{s}");
            }
            on_b.extend(mine);
        }
    }

    let finals = support::wait_all_final(&http, &a.base, &on_a, Duration::from_secs(20))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    for s in &finals {
        assert_eq!(s["status"], "COMPLETED", "{s}");
    }
    eprintln!(
        "all {} sessions on A final after {:.1} s",
        on_a.len(),
        started.elapsed().as_secs_f64()
    );
    reader.cut_off_at(Instant::now() + Duration::from_secs(15));
    let display = reader.finish().await;
    eprintln!(
        "display on B: {} of {total} events after {:.1} s, {} reconnects",
        display.events.len(),
        started.elapsed().as_secs_f64(),
        display.reconnects
    );
    let expected: Vec<String> = on_a
        .iter()
        .chain(&on_b)
        .map(|(sid, _)| sid.clone())
        .collect();
    display
        .check_delivery(&expected, total as i64)
        .unwrap_or_else(|e| panic!("{e}"));
    a.stop().await;
    b.stop().await;
}

/// The participants' rate limits hold across instances: two instances on
/// one database each allow half of a limit of 10 session creations a
/// minute per address, so together about 10 go through, not 20.
#[actix_web::test]
#[cfg_attr(not(pg_tests), ignore = "STAGEHAND_TEST_POSTGRES_URL is not set")]
async fn rate_limits_hold_across_instances() {
    let db = TestDb::fresh(Backend::Postgres).await;
    let sim = start_sim(fast_sim()).await;
    let limited = |c: &mut Config| {
        c.session_rate_limit = stagehand::config::parse_rate_limit("10/min").unwrap();
    };
    let a = Instance::start(&db, &sim.url(), limited).await;
    let b = Instance::start(&db, &sim.url(), limited).await;
    let both = support::wait_for(Duration::from_secs(5), || async {
        (a.state.limits.instances() == 2 && b.state.limits.instances() == 2).then_some(())
    })
    .await;
    assert!(both.is_some(), "the instances never saw each other");
    let http = reqwest::Client::new();
    let slug = support::create_experience(&http, &a.base, 5).await;
    let mut accepted = 0;
    for i in 0..30 {
        let base = if i % 2 == 0 { &a.base } else { &b.base };
        let resp = http
            .post(format!("{base}/api/experiences/{slug}/sessions"))
            .json(&json!({"nickname": format!("p{i}")}))
            .send()
            .await
            .unwrap();
        match resp.status().as_u16() {
            201 => accepted += 1,
            429 => {}
            other => panic!("unexpected {other}"),
        }
    }
    assert!(
        (9..=11).contains(&accepted),
        "{accepted} of 30 went through a limit of 10 shared by two instances"
    );
    a.stop().await;
    b.stop().await;
}
