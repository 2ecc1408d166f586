//! `GET /metrics`, black box, on SQLite and on PostgreSQL: the text parses
//! as the Prometheus text format (every sample line `name{labels} value`,
//! every `stagehand_*` family with a HELP line); after a completed saga
//! and a moderation rejection the step and abort-reason gauges show them
//! and the AI request histogram moved; the experience's AI slots show its
//! cap and a running job; connected displays show in the sockets and in
//! the outbox lag (lag before the acks, the slower display's lag while one
//! of two has acked, none after both); the breaker's state
//! flips when an operator opens it; the pools show their sizes; and the
//! recording functions land in histograms with the explicit buckets.
//!
//! The recorded figures (histograms, counters) are process-wide and other
//! tests of this binary run beside this one, so they are compared before
//! and after, never to a fixed value; the gauges are this app's own.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde_json::json;
use support::{fast_sim, Backend, Socket, TestApp};

/// One sample: its name, labels and value.
#[derive(Debug, Clone)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// The scrape, parsed.
#[derive(Debug)]
struct Scrape {
    samples: Vec<Sample>,
    /// Families with a `# HELP` line.
    helped: BTreeSet<String>,
}

impl Scrape {
    /// The value of the one sample of `name` whose labels include `labels`.
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let found: Vec<&Sample> = self.matching(name, labels).collect();
        assert!(found.len() <= 1, "{name} {labels:?} matches {found:?}");
        found.first().map(|s| s.value)
    }

    /// The sum over the samples of `name` whose labels include `labels`.
    fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.matching(name, labels).map(|s| s.value).sum()
    }

    fn matching<'a>(
        &'a self,
        name: &'a str,
        labels: &'a [(&'a str, &'a str)],
    ) -> impl Iterator<Item = &'a Sample> + 'a {
        self.samples.iter().filter(move |s| {
            s.name == name
                && labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
    }
}

fn is_name(text: &str) -> bool {
    let mut chars = text.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// Parses the text format; panics on any line that is not a comment, a
/// blank or `name{labels} value`.
fn parse(text: &str) -> Scrape {
    let mut samples = Vec::new();
    let mut helped = BTreeSet::new();
    let mut typed = BTreeSet::new();
    for line in text.lines() {
        if line.trim().is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let name = rest.split(' ').next().unwrap_or_default();
            assert!(is_name(name), "HELP of a bad name: {line:?}");
            helped.insert(name.to_owned());
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split(' ');
            let name = parts.next().unwrap_or_default();
            let kind = parts.next().unwrap_or_default();
            assert!(
                ["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind),
                "{line:?}"
            );
            assert!(
                typed.insert(name.to_owned()),
                "family typed twice: {line:?}"
            );
            continue;
        }
        if line.starts_with('#') {
            continue;
        }
        let (name_end, mut labels) = (
            line.find(['{', ' '])
                .unwrap_or_else(|| panic!("no value: {line:?}")),
            BTreeMap::new(),
        );
        let name = &line[..name_end];
        assert!(is_name(name), "bad metric name in {line:?}");
        let mut rest = &line[name_end..];
        if let Some(inner) = rest.strip_prefix('{') {
            // key="value" pairs; values may hold \\, \" and \n escapes.
            let mut chars = inner.char_indices().peekable();
            loop {
                let (start, c) = chars
                    .next()
                    .unwrap_or_else(|| panic!("open labels: {line:?}"));
                if c == '}' {
                    rest = &inner[start + 1..];
                    break;
                }
                if c == ',' {
                    continue;
                }
                let eq = inner[start..]
                    .find("=\"")
                    .unwrap_or_else(|| panic!("label without =\": {line:?}"))
                    + start;
                let key = &inner[start..eq];
                assert!(is_name(key), "bad label name {key:?} in {line:?}");
                while chars.peek().is_some_and(|(i, _)| *i < eq + 2) {
                    chars.next();
                }
                let mut value = String::new();
                loop {
                    match chars.next() {
                        Some((_, '\\')) => match chars.next() {
                            Some((_, 'n')) => value.push('\n'),
                            Some((_, c @ ('\\' | '"'))) => value.push(c),
                            other => panic!("bad escape {other:?} in {line:?}"),
                        },
                        Some((_, '"')) => break,
                        Some((_, c)) => value.push(c),
                        None => panic!("unterminated label value in {line:?}"),
                    }
                }
                labels.insert(key.to_owned(), value);
            }
        }
        let value_text = rest
            .strip_prefix(' ')
            .unwrap_or_else(|| panic!("no space before the value: {line:?}"));
        assert!(!value_text.contains(' '), "more than a value: {line:?}");
        let value = match value_text {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            "NaN" => f64::NAN,
            v => v
                .parse::<f64>()
                .unwrap_or_else(|_| panic!("bad value in {line:?}")),
        };
        samples.push(Sample {
            name: name.to_owned(),
            labels,
            value,
        });
    }
    for s in &samples {
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| s.name.strip_suffix(suffix))
            .filter(|f| typed.contains(*f))
            .unwrap_or(&s.name);
        if family.starts_with("stagehand_") {
            assert!(helped.contains(family), "{family} has no HELP line");
        }
    }
    Scrape { samples, helped }
}

async fn scrape(app: &TestApp) -> Scrape {
    let resp = app
        .http
        .get(format!("{}/metrics", app.base))
        .bearer_auth(support::OPERATOR)
        .send()
        .await
        .expect("GET /metrics");
    assert_eq!(resp.status(), 200);
    let content_type = resp.headers()["content-type"].to_str().unwrap().to_owned();
    assert!(
        content_type.starts_with("text/plain; version=0.0.4"),
        "{content_type}"
    );
    parse(&resp.text().await.expect("body"))
}

/// Scrapes until `probe` says yes, or panics with the last scrape.
async fn wait_scrape(app: &TestApp, what: &str, probe: impl Fn(&Scrape) -> bool) -> Scrape {
    let found = support::wait_for(Duration::from_secs(10), || async {
        let s = scrape(app).await;
        probe(&s).then_some(s)
    })
    .await;
    found.unwrap_or_else(|| panic!("/metrics never showed {what}"))
}

const AI_REQUESTS: &str = "stagehand_ai_request_duration_seconds_count";

async fn metrics_follow_sagas_displays_and_the_breaker(backend: Backend) {
    let mut sim = fast_sim();
    // Long enough to see the job in flight.
    sim.latency = Duration::from_millis(1_000);
    let app = TestApp::spawn_with(backend, sim, |_| {}).await;
    let before = scrape(&app).await;
    assert_eq!(
        before.value("stagehand_metrics_database_up", &[]),
        Some(1.0)
    );
    assert_eq!(before.value("stagehand_queue_depth", &[]), Some(0.0));
    assert_eq!(
        before.value("stagehand_breaker_state", &[("provider", "default")]),
        Some(0.0),
        "closed"
    );
    assert_eq!(
        before.value("stagehand_sockets_connected", &[("kind", "display")]),
        Some(0.0)
    );
    assert_eq!(before.value("stagehand_outbox_lag_max", &[]), Some(0.0));
    for step in [
        "AI_PENDING",
        "AI_DONE",
        "RANKING_DONE",
        "COMPLETED",
        "ABORTED",
    ] {
        assert_eq!(
            before.value("stagehand_sagas", &[("step", step)]),
            Some(0.0),
            "{step}"
        );
    }
    // The pools as configured (tests: 10 each).
    for pool in ["requests", "work"] {
        assert_eq!(
            before.value("stagehand_db_pool_max_connections", &[("pool", pool)]),
            Some(10.0),
            "{pool}"
        );
        let open = before.sum("stagehand_db_pool_connections", &[("pool", pool)]);
        assert!((1.0..=10.0).contains(&open), "{pool}: {open} connections");
        let waited = before
            .value("stagehand_db_pool_acquire_seconds", &[("pool", pool)])
            .expect("acquire probe");
        assert!((0.0..=1.0).contains(&waited), "{pool}: {waited}");
    }
    let requests_before = before.sum(AI_REQUESTS, &[]);
    let gate_waits_before = before.sum("stagehand_sqlite_gate_wait_seconds_count", &[]);
    let commits_timed_before = before.sum("stagehand_sqlite_commit_seconds_count", &[]);
    let steps_before = before.sum(
        "stagehand_saga_step_duration_seconds_count",
        &[("step", "AI_PENDING")],
    );
    let ended_before = before.sum("stagehand_saga_duration_seconds_count", &[]);
    let claims_before = before.sum("stagehand_claim_batch_size_count", &[]);
    let rejected_before = before.sum(AI_REQUESTS, &[("outcome", "content_rejected")]);
    let persisted_before = before.sum(
        "stagehand_actor_messages_total",
        &[("actor", "PersistenceActor")],
    );
    let driven_before = before.sum(
        "stagehand_tasks_spawned_total",
        &[("task", "saga_supervisor.drive")],
    );
    let encoded_before = before.sum(
        "stagehand_frames_encoded_total",
        &[("kind", "session_event")],
    );

    let slug = app.experience(3).await;
    let (terminal, terminal_token) = app.terminal(&slug).await;
    // The database gauges are at most a second old.
    let s = wait_scrape(&app, "the new experience", |s| {
        s.value("stagehand_ai_capacity", &[("experience", &slug)])
            .is_some()
    })
    .await;
    assert_eq!(
        s.value("stagehand_ai_capacity", &[("experience", &slug)]),
        Some(3.0),
        "the configured cap"
    );
    assert_eq!(
        s.value("stagehand_ai_jobs_in_flight", &[("experience", &slug)]),
        Some(0.0)
    );

    let mut display = Socket::connect(app.port, &terminal, &terminal_token, 0).await;
    display
        .next_of_type("hello", Duration::from_secs(5))
        .await
        .expect("hello");
    wait_scrape(&app, "the display connected", |s| {
        s.value("stagehand_sockets_connected", &[("kind", "display")]) == Some(1.0)
            && s.value("stagehand_outbox_lag", &[("terminal", &terminal)]) == Some(0.0)
    })
    .await;

    // One saga completes (seen in flight on its way), one is rejected.
    let (done_sid, done_tok) = app.session(&slug, Some(&terminal), "ada").await;
    let resp = app
        .submit(
            &done_sid,
            &done_tok,
            json!({"prompt": "a comic", "score": 7}),
            "k1",
        )
        .await;
    assert_eq!(resp.status(), 202);
    wait_scrape(&app, "the AI job in flight", |s| {
        s.value("stagehand_ai_jobs_in_flight", &[("experience", &slug)]) == Some(1.0)
    })
    .await;
    let done = app
        .wait_final(&done_sid, &done_tok, Duration::from_secs(20))
        .await;
    assert_eq!(done["status"], "COMPLETED", "{done}");
    let (bad_sid, bad_tok) = app.session(&slug, Some(&terminal), "bob").await;
    let resp = app
        .submit(
            &bad_sid,
            &bad_tok,
            json!({"prompt": "forbidden words"}),
            "k2",
        )
        .await;
    assert_eq!(resp.status(), 202);
    let rejected = app
        .wait_final(&bad_sid, &bad_tok, Duration::from_secs(20))
        .await;
    assert_eq!(rejected["abort_reason"], "INPUT_REJECTED", "{rejected}");
    for _ in 0..2 {
        display
            .next_session_event(Duration::from_secs(10))
            .await
            .expect("the display gets both events");
    }

    let after = wait_scrape(&app, "both events unacked", |s| {
        s.value("stagehand_outbox_lag", &[("terminal", &terminal)]) == Some(2.0)
    })
    .await;
    assert_eq!(
        after.value("stagehand_sagas", &[("step", "COMPLETED")]),
        Some(1.0)
    );
    assert_eq!(
        after.value("stagehand_sagas", &[("step", "ABORTED")]),
        Some(1.0)
    );
    assert_eq!(
        after.value("stagehand_sagas", &[("step", "AI_PENDING")]),
        Some(0.0)
    );
    assert_eq!(
        after.value(
            "stagehand_sagas_aborted_last_hour",
            &[("reason", "INPUT_REJECTED")]
        ),
        Some(1.0)
    );
    assert_eq!(
        after.value(
            "stagehand_sagas_aborted_last_hour",
            &[("reason", "AI_FAILED")]
        ),
        Some(0.0),
        "every reason is listed"
    );
    assert_eq!(after.value("stagehand_queue_depth", &[]), Some(0.0));
    assert_eq!(
        after.value("stagehand_ai_jobs_in_flight", &[("experience", &slug)]),
        Some(0.0)
    );
    assert_eq!(after.value("stagehand_outbox_lag_max", &[]), Some(2.0));
    assert!(
        after.sum(AI_REQUESTS, &[]) >= requests_before + 2.0,
        "the AI request histogram moved: {requests_before} -> {}",
        after.sum(AI_REQUESTS, &[])
    );
    assert!(
        after.sum(AI_REQUESTS, &[("outcome", "content_rejected")]) >= rejected_before + 1.0,
        "the moderation rejection is an AI request outcome"
    );
    // The supervisor's and the dispatcher's figures: the completed saga's
    // AI step was timed, both sagas' ends, and claim rounds happened.
    assert!(
        after.sum(
            "stagehand_saga_step_duration_seconds_count",
            &[("step", "AI_PENDING")]
        ) >= steps_before + 1.0,
        "the AI step's duration was recorded"
    );
    assert!(
        after.sum("stagehand_saga_duration_seconds_count", &[]) >= ended_before + 2.0,
        "both sagas' ends were recorded"
    );
    assert!(
        after.sum("stagehand_claim_batch_size_count", &[]) > claims_before,
        "claim batch sizes were recorded"
    );
    assert!(
        after.sum(
            "stagehand_ai_request_duration_seconds_count",
            &[("request", "submit"), ("outcome", "queued")]
        ) + after.sum(
            "stagehand_ai_request_duration_seconds_count",
            &[("request", "submit"), ("outcome", "running")]
        ) >= 1.0,
        "the accepted submit"
    );
    assert!(
        after.sum(
            "stagehand_ai_jobs_finished_total",
            &[("outcome", "succeeded")]
        ) >= 1.0
    );
    assert!(
        after.sum(
            "stagehand_ai_job_duration_seconds_count",
            &[("outcome", "succeeded")]
        ) >= 1.0,
        "the job was timed from its submit"
    );
    // The hot path's own work is counted (process-wide, so compared with
    // before): the persistence writes are actor messages, each saga's
    // supervisor is a spawned drive, each completion frame one encoding.
    assert!(
        after.sum(
            "stagehand_actor_messages_total",
            &[("actor", "PersistenceActor")]
        ) >= persisted_before + 2.0,
        "the sagas' writes went through the persistence actor"
    );
    assert!(
        after.sum(
            "stagehand_tasks_spawned_total",
            &[("task", "saga_supervisor.drive")]
        ) >= driven_before + 2.0,
        "one supervisor drive per saga"
    );
    assert!(
        after.sum(
            "stagehand_frames_encoded_total",
            &[("kind", "session_event")]
        ) >= encoded_before + 2.0,
        "each completion frame was encoded for the display"
    );
    // SQLite's write gate counts its commits and what they committed
    // (this app's own gate: no other app shares its database file).
    let commits = after.value("stagehand_sqlite_commits_total", &[]);
    let writes = after.value("stagehand_sqlite_committed_writes_total", &[]);
    match backend {
        Backend::Sqlite => {
            let (commits, writes) = (commits.expect("commits"), writes.expect("writes"));
            assert!(
                commits >= 2.0 && writes >= commits,
                "{commits} commits of {writes} writes after two sagas"
            );
            // And times them (process-wide histograms, so compared with
            // before): each wait for the gate, each group's COMMIT, in
            // the gate's own millisecond buckets.
            let waits = after.sum("stagehand_sqlite_gate_wait_seconds_count", &[]);
            let timed = after.sum("stagehand_sqlite_commit_seconds_count", &[]);
            assert!(
                waits >= gate_waits_before + 2.0 && timed >= commits_timed_before + 2.0,
                "gate waits {gate_waits_before} -> {waits}, commits timed {commits_timed_before} -> {timed}"
            );
            assert!(
                after
                    .value(
                        "stagehand_sqlite_commit_seconds_bucket",
                        &[("le", "0.0005")]
                    )
                    .is_some(),
                "the commit histogram has the gate's sub-millisecond bucket"
            );
        }
        Backend::Postgres => assert_eq!((commits, writes), (None, None), "no gate"),
    }

    // A second display connects and reads both events too.
    let mut second = Socket::connect(app.port, &terminal, &terminal_token, 0).await;
    for _ in 0..2 {
        second
            .next_session_event(Duration::from_secs(10))
            .await
            .expect("the second display gets both events");
    }
    wait_scrape(&app, "two displays", |s| {
        s.value("stagehand_sockets_connected", &[("kind", "display")]) == Some(2.0)
    })
    .await;
    // The first acks everything: the lag is the slower one's.
    display.send_json(json!({"type": "ack", "seq": 2})).await;
    let recorded = support::wait_for(Duration::from_secs(10), || async {
        let (_, body) = app
            .operator_get(&format!("/api/terminals?experience={slug}"))
            .await;
        (body["terminals"][0]["acked_seq"] == 2).then_some(())
    })
    .await;
    assert!(recorded.is_some(), "the first display's ack was recorded");
    assert_eq!(
        scrape(&app)
            .await
            .value("stagehand_outbox_lag", &[("terminal", &terminal)]),
        Some(2.0),
        "the second display has acked nothing"
    );
    // The second acks: no lag left.
    second.send_json(json!({"type": "ack", "seq": 2})).await;
    wait_scrape(&app, "the lag gone after both acks", |s| {
        s.value("stagehand_outbox_lag", &[("terminal", &terminal)]) == Some(0.0)
            && s.value("stagehand_outbox_lag_max", &[]) == Some(0.0)
    })
    .await;

    // An operator opens the breaker.
    let (status, _, opened) = app.operator_post("/api/admin/breaker/open", None).await;
    assert_eq!(status, 200, "{opened}");
    wait_scrape(&app, "the breaker open", |s| {
        s.value("stagehand_breaker_state", &[("provider", "default")]) == Some(1.0)
    })
    .await;
    let (status, _, _) = app.operator_post("/api/admin/breaker/close", None).await;
    assert_eq!(status, 200);
    wait_scrape(&app, "the breaker closed again", |s| {
        s.value("stagehand_breaker_state", &[("provider", "default")]) == Some(0.0)
    })
    .await;

    // The displays leave: no socket, no lag series for its terminal.
    drop(display);
    drop(second);
    wait_scrape(&app, "the display gone", |s| {
        s.value("stagehand_sockets_connected", &[("kind", "display")]) == Some(0.0)
            && s.value("stagehand_outbox_lag", &[("terminal", &terminal)])
                .is_none()
    })
    .await;
    app.stop().await;
}

db_test!(metrics_follow_sagas_displays_and_the_breaker);

/// The recording functions the actors call land in histograms with the
/// explicit buckets (10 ms .. 10 min; batch sizes in powers of two).
async fn recorded_figures_use_the_explicit_buckets(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let step = "stagehand_saga_step_duration_seconds";
    let before = scrape(&app).await;
    let le = |s: &Scrape, name: &str, labels: &[(&str, &str)]| s.sum(name, labels);
    let step_in_25ms = le(
        &before,
        &format!("{step}_bucket"),
        &[("step", "AI_DONE"), ("le", "0.025")],
    );
    let batch_of_4 = le(&before, "stagehand_claim_batch_size_bucket", &[("le", "4")]);
    let ended = le(
        &before,
        "stagehand_saga_duration_seconds_count",
        &[("outcome", "CANCELLED")],
    );

    stagehand::metrics::step_finished(
        stagehand::domain::saga::Step::AiDone,
        Duration::from_millis(20),
    );
    stagehand::metrics::claimed(3);
    stagehand::metrics::saga_ended(
        Some(stagehand::domain::saga::AbortReason::Cancelled),
        Duration::from_secs(400),
    );

    // A scrape's text is at most a second old.
    let after = wait_scrape(&app, "the recorded figures", |s| {
        le(s, "stagehand_claim_batch_size_bucket", &[("le", "4")]) >= batch_of_4 + 1.0
    })
    .await;
    assert!(
        le(
            &after,
            &format!("{step}_bucket"),
            &[("step", "AI_DONE"), ("le", "0.025")]
        ) >= step_in_25ms + 1.0
    );
    assert!(le(&after, "stagehand_claim_batch_size_bucket", &[("le", "4")]) >= batch_of_4 + 1.0);
    assert!(
        le(
            &after,
            "stagehand_saga_duration_seconds_count",
            &[("outcome", "CANCELLED")]
        ) >= ended + 1.0
    );
    // The buckets are the explicit ones, up to 10 minutes.
    let bounds: BTreeSet<String> = after
        .matching(
            "stagehand_saga_duration_seconds_bucket",
            &[("outcome", "CANCELLED")],
        )
        .map(|s| s.labels["le"].clone())
        .collect();
    for bound in ["0.01", "1", "60", "600", "+Inf"] {
        assert!(bounds.contains(bound), "no le={bound} in {bounds:?}");
    }
    assert!(after.helped.contains(step));
    app.stop().await;
}

db_test!(recorded_figures_use_the_explicit_buckets);

/// A database that cannot be read: the scrape still answers, says so in
/// `stagehand_metrics_database_up`, and still shows the pools.
async fn a_database_that_cannot_be_read_is_reported(backend: Backend) {
    let db = support::TestDb::fresh(backend).await;
    let store = db.store().await;
    let clock: stagehand::clock::SharedClock = std::sync::Arc::new(stagehand::clock::SystemClock);
    let render = |store| {
        let clock = &clock;
        async move {
            parse(
                &stagehand::metrics::render(stagehand::metrics::Scrape {
                    requests: store,
                    work: store,
                    clock,
                    instance_id: "here",
                    // A fresh cache each time: this test is about the read.
                    cache: &stagehand::metrics::ScrapeCache::default(),
                })
                .await,
            )
        }
    };
    let open = render(&store).await;
    assert_eq!(open.value("stagehand_metrics_database_up", &[]), Some(1.0));
    assert_eq!(
        open.value("stagehand_sagas", &[("step", "COMPLETED")]),
        Some(0.0)
    );

    store.db().clone().close().await.expect("close the pool");
    let closed = render(&store).await;
    assert_eq!(
        closed.value("stagehand_metrics_database_up", &[]),
        Some(0.0)
    );
    assert_eq!(
        closed.value("stagehand_sagas", &[("step", "COMPLETED")]),
        None
    );
    assert_eq!(
        closed.value("stagehand_sockets_connected", &[("kind", "display")]),
        None,
        "unknown, not 0"
    );
    assert!(closed
        .value("stagehand_sockets_connected", &[("kind", "operator")])
        .is_some());
    assert_eq!(
        closed.value("stagehand_db_pool_max_connections", &[("pool", "requests")]),
        Some(20.0)
    );
}

db_test!(a_database_that_cannot_be_read_is_reported);

/// `/metrics` is not public: anonymous scrapes are refused 401; the
/// operator token or `STAGEHAND_METRICS_TOKEN` opens it; `--metrics-bind`
/// serves it without a token on its own address only. Before, anyone could
/// read it (terminal ids and slugs included) and every scrape ran the full
/// statistics.
async fn metrics_need_a_credential_or_their_own_address(backend: Backend) {
    let metrics_port = support::free_port();
    let app = TestApp::spawn_with(backend, support::fast_sim(), |c| {
        c.metrics_token = Some("scraper-secret".into());
        c.metrics_bind = Some(format!("127.0.0.1:{metrics_port}"));
    })
    .await;
    let get = |url: String, token: Option<&'static str>| {
        let http = app.http.clone();
        async move {
            let mut req = http.get(url);
            if let Some(token) = token {
                req = req.bearer_auth(token);
            }
            req.send().await.expect("GET /metrics").status().as_u16()
        }
    };
    let main = format!("{}/metrics", app.base);
    assert_eq!(get(main.clone(), None).await, 401);
    assert_eq!(get(main.clone(), Some("wrong")).await, 401);
    assert_eq!(get(main.clone(), Some("scraper-secret")).await, 200);
    assert_eq!(get(main.clone(), Some(support::OPERATOR)).await, 200);
    let own = format!("http://127.0.0.1:{metrics_port}/metrics");
    assert_eq!(get(own.clone(), None).await, 200);
    // Only /metrics there.
    assert_eq!(
        get(
            format!("http://127.0.0.1:{metrics_port}/api/experiences"),
            None
        )
        .await,
        404
    );
    // A flood of scrapes reads the database once (a second's worth).
    let before = app
        .state
        .scrape_cache
        .reads
        .load(std::sync::atomic::Ordering::Relaxed);
    let flood = (0..50).map(|_| get(own.clone(), None));
    let statuses = futures_util::future::join_all(flood).await;
    assert!(statuses.iter().all(|s| *s == 200));
    let reads = app
        .state
        .scrape_cache
        .reads
        .load(std::sync::atomic::Ordering::Relaxed)
        - before;
    assert!(reads <= 2, "50 scrapes read the database {reads} times");
    app.stop().await;
}
db_test!(metrics_need_a_credential_or_their_own_address);
