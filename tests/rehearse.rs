//! `stagehand rehearse` as a user runs it: the built binary against its
//! embedded server (SQLite in its own temp dir, or a fresh PostgreSQL
//! database), checked through its exit code, its verdict line and the JSON
//! it writes: a burst of 40 participants on 3 displays with 10 % of the
//! prompts rejected meets the default targets (GO, exit 0); a steady rate
//! behind a cap of 1 misses an impossible p95 (NO-GO, exit 1) and is told
//! the cap that would hold; bad inputs exit 2.

mod support;

use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use support::{Backend, TestDb};

/// The whole run (two subprocesses, 40 sagas behind a cap of 5 at the
/// default 500 ms AI poll) takes about 6 s; this is the bound.
const RUN_DEADLINE: Duration = Duration::from_secs(120);

/// Runs `stagehand rehearse` with `args`; its exit code and its stdout and
/// stderr when it exits in time, a panic otherwise.
fn rehearse(args: &[&str]) -> (Option<i32>, String) {
    let mut all = vec!["rehearse"];
    all.extend_from_slice(args);
    support::run_stagehand(&all, RUN_DEADLINE)
}

/// The last line of the output that starts with `GO:` or `NO-GO:`.
fn verdict_line(output: &str) -> &str {
    output
        .lines()
        .rev()
        .find(|l| l.starts_with("GO: ") || l.starts_with("NO-GO: "))
        .unwrap_or_else(|| panic!("no verdict line:\n{output}"))
}

fn number(v: &Value, what: &str) -> f64 {
    v.as_f64()
        .unwrap_or_else(|| panic!("{what} is not a number: {v}"))
}

async fn burst_with_rejections(backend: Backend) {
    let db = match backend {
        Backend::Sqlite => None,
        Backend::Postgres => Some(TestDb::fresh(backend).await),
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let json_path = dir.path().join("rehearse.json");
    let json_arg = json_path.display().to_string();
    let mut args = vec![
        "--burst",
        "40",
        "--terminals",
        "3",
        "--reject-rate",
        "0.1",
        "--ai-latency",
        "50ms",
        // The default targets (p95 30 s, abort rate 2 %), and a p99 too.
        "--target-p99",
        "60s",
        "--json",
        &json_arg,
    ];
    if let Some(db) = &db {
        args.extend(["--database-url", &db.url]);
    }
    let (code, output) = rehearse(&args);
    assert_eq!(code, Some(0), "rehearse did not say GO:\n{output}");
    assert!(
        output.contains("| 202 to terminal frame, p50 / p95 / p99 (ms)"),
        "no table on stdout:\n{output}"
    );
    // The verdict is the last line, each target with its figure; the
    // moderation rejections (10 %) are not aborts against the 2 %.
    let line = verdict_line(&output);
    assert_eq!(output.trim_end().lines().last(), Some(line), "{output}");
    assert!(line.starts_with("GO: p95 "), "{line}");
    for said in [
        "<= target 30 s",
        "p99 ",
        "<= target 60 s",
        "abort rate 0 % <= target 2 %",
        "delivery problems 0 <= target 0",
    ] {
        assert!(line.contains(said), "{said:?} not in {line:?}");
    }
    let v: Value = serde_json::from_str(
        &std::fs::read_to_string(Path::new(&json_path)).expect("the JSON file"),
    )
    .expect("JSON");
    assert_eq!(v["verdict"]["go"], true, "{v:#}");
    assert_eq!(v["verdict"]["line"], line, "{v:#}");
    assert_eq!(v["targets"]["p95_ms"], 30_000.0, "{v:#}");
    assert_eq!(v["targets"]["p99_ms"], 60_000.0, "{v:#}");
    assert_eq!(v["targets"]["abort_rate"], 0.02, "{v:#}");
    assert_eq!(v["abort_rate"], 0.0, "{v:#}");
    // A burst has no steady arrival rate: no Little's law; its own figure
    // says the cap of 5 gets 95 % of it through well within 30 s.
    assert!(v["capacity"].is_null(), "{v:#}");
    let b = &v["burst_capacity"];
    assert_eq!(b["participants"], 40, "{v:#}");
    assert!(number(&b["mean_ai_job_s"], "mean AI job") >= 0.05, "{v:#}");
    let recommended = number(&b["recommended_max_in_flight"], "cap");
    assert!((1.0..=5.0).contains(&recommended), "{v:#}");
    assert!(b["advice"].is_null(), "{v:#}");
    assert!(!output.contains("capacity: "), "{output}");

    let s = &v["sessions"];
    assert_eq!(s["participants"], 40, "{v:#}");
    assert_eq!(s["accepted"], 40, "{v:#}");
    assert_eq!(s["lost"], 0, "{v:#}");
    let completed = s["completed"].as_u64().expect("completed");
    let rejected = s["rejected"].as_u64().expect("rejected");
    assert_eq!(completed + rejected, 40, "{v:#}");
    // The rejected prompts are chosen evenly: exactly 4 of 40 at 10 %, and
    // each of them is rejected, nothing else aborts.
    assert_eq!(s["injected_rejections"], 4, "{v:#}");
    assert_eq!(rejected, 4, "{v:#}");
    assert_eq!(
        s["aborted_by_reason"],
        serde_json::json!({"INPUT_REJECTED": 4}),
        "{v:#}"
    );
    assert_eq!(v["abort_rate_by_reason"]["INPUT_REJECTED"], 0.1);

    for what in ["submit_to_frame_ms", "push_ms", "submit_ms"] {
        let l = &v[what];
        assert_eq!(l["count"], 40, "{what}: {v:#}");
        let (p50, p95, p99) = (
            number(&l["p50"], what),
            number(&l["p95"], what),
            number(&l["p99"], what),
        );
        assert!(
            0.0 <= p50 && p50 <= p95 && p95 <= p99,
            "{what}: {p50} {p95} {p99}"
        );
    }
    // A frame comes after its saga ended, which comes after the 202 and
    // at least one AI job of 50 ms.
    assert!(
        number(&v["submit_to_frame_ms"]["p50"], "p50") >= 50.0,
        "{v:#}"
    );

    let ai = &v["ai_concurrency"];
    let cap = number(&ai["cap"], "cap");
    assert_eq!(cap, 5.0);
    let sim = number(&ai["simulator_max_concurrent_jobs"], "simulator peak");
    assert!((1.0..=cap).contains(&sim), "{v:#}");
    let seen = number(&ai["peak_in_flight"], "stats peak");
    assert!(seen <= cap, "{v:#}");
    assert!(number(&v["queue_depth_peak"], "queue depth") >= 0.0);

    match backend {
        Backend::Sqlite => assert_eq!(v["postgres"]["not_sampled"], "n/a (SQLite)", "{v:#}"),
        Backend::Postgres => {
            let pg = &v["postgres"];
            assert!(number(&pg["samples"], "samples") > 0.0, "{v:#}");
            assert!(number(&pg["idle_in_transaction_peak"], "idle") >= 0.0);
            // Nothing holds a transaction open while the AI works (the
            // bound of tests/pg_no_idle_tx.rs: a busy machine may pause a
            // transaction between two statements, never for a second).
            assert!(
                number(&pg["idle_in_transaction_longest_ms"], "longest") < 1000.0,
                "{v:#}"
            );
            assert!(
                number(&pg["connections_peak"], "connections") >= 1.0,
                "{v:#}"
            );
        }
    }
    assert!(number(&v["unrelated_read_ms"]["count"], "reads") > 0.0);
    assert_eq!(v["unrelated_read_ms"]["failed"], 0, "{v:#}");
    let m = &v["memory"];
    assert_eq!(m["sockets"], 3);
    assert!(
        number(&m["rss_before_displays_kib"], "rss") > 1000.0,
        "{v:#}"
    );
    assert!(v["violations"].as_array().expect("violations").is_empty());
}

db_test!(burst_with_rejections);

/// 20 participants a second for a second, behind a cap of 1 AI job at a
/// time with a 100 ms simulated AI (polled every 50 ms): the arrivals bring
/// 2 or more jobs' worth of AI a second for 1 slot, so the queue grows
/// while they arrive. The p95 target of 50 ms is below the AI's own 100 ms,
/// so the verdict is NO-GO whatever the machine's speed; the advice's cap
/// is Little's law of the figures the JSON reports. About 3 s of sagas.
async fn short_cap_is_no_go_with_advice(backend: Backend) {
    let db = match backend {
        Backend::Sqlite => None,
        Backend::Postgres => Some(TestDb::fresh(backend).await),
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let json_path = dir.path().join("rehearse.json");
    let json_arg = json_path.display().to_string();
    let mut args = vec![
        "--rate",
        "20/s",
        "--duration",
        "1s",
        "--terminals",
        "2",
        "--ai-latency",
        "100ms",
        "--max-in-flight",
        "1",
        "--server-arg",
        "--ai-poll-interval 50ms",
        "--target-p95",
        "50ms",
        "--target-abort-rate",
        "0.5",
        "--json",
        &json_arg,
    ];
    if let Some(db) = &db {
        args.extend(["--database-url", &db.url]);
    }
    let (code, output) = rehearse(&args);
    assert_eq!(code, Some(1), "rehearse did not say NO-GO:\n{output}");
    let line = verdict_line(&output);
    assert_eq!(output.trim_end().lines().last(), Some(line), "{output}");
    assert!(line.starts_with("NO-GO: p95 "), "{line}");
    assert!(line.contains(" > target 50 ms"), "{line}");
    // Only the failed target is named.
    assert!(!line.contains("abort rate"), "{line}");

    let v: Value = serde_json::from_str(
        &std::fs::read_to_string(Path::new(&json_path)).expect("the JSON file"),
    )
    .expect("JSON");
    assert_eq!(v["verdict"]["go"], false, "{v:#}");
    assert_eq!(v["verdict"]["line"], line, "{v:#}");
    assert_eq!(v["sessions"]["completed"], 20, "{v:#}");
    assert!(number(&v["submit_to_frame_ms"]["p95"], "p95") > 50.0);

    let c = &v["capacity"];
    let rate = number(&c["arrival_per_s"], "arrival rate");
    assert!((10.0..=40.0).contains(&rate), "scheduled 20/s: {v:#}");
    let mean = number(&c["mean_ai_job_s"], "mean AI job");
    // Each job takes the simulator's 100 ms, seen by a poll every 50 ms.
    assert!((0.1..5.0).contains(&mean), "{v:#}");
    assert_eq!(c["jobs_per_participant"], 1.0, "{v:#}");
    assert_eq!(c["max_in_flight"], 1, "{v:#}");
    assert_eq!(c["grows_without_bound"], true, "{v:#}");
    let needed = rate * mean;
    assert!(
        (number(&c["needed_in_flight"], "needed") - needed).abs() < 1e-6,
        "{v:#}"
    );
    let recommended = c["recommended_max_in_flight"].as_u64().expect("cap");
    assert_eq!(recommended, (needed / 0.85).ceil() as u64, "{v:#}");
    assert!(recommended >= 3, "at least 2 jobs' worth a second: {v:#}");
    let advice = format!("you need max_in_flight >= {recommended}");
    assert!(output.contains(&advice), "{advice:?} not in:\n{output}");
    assert!(
        output.contains("the AI queue grows without bound"),
        "{output}"
    );
    assert!(
        output.contains(&format!(
            "at {:.0}/min with a {mean:.2} s mean AI job",
            rate * 60.0
        )),
        "{output}"
    );
    // The queue was seen non-empty by the operators' stats frames (one
    // every 250 ms at most, over the seconds the queue drained).
    assert!(
        number(&v["queue_depth_peak"], "queue depth") >= 1.0,
        "{v:#}"
    );
}

db_test!(short_cap_is_no_go_with_advice);

/// Bad inputs and a server that cannot be reached give no verdict: exit 2,
/// not the 1 of a NO-GO.
#[test]
fn failures_to_run_exit_2() {
    let (code, output) = rehearse(&["--target-abort-rate", "150%"]);
    assert_eq!(code, Some(2), "{output}");
    assert!(output.contains("--target-abort-rate"), "{output}");
    assert!(!output.contains("GO"), "{output}");

    let (code, output) = rehearse(&["--target-p95", "soon"]);
    assert_eq!(code, Some(2), "{output}");

    let url = format!("http://127.0.0.1:{}", support::free_port());
    let (code, output) = rehearse(&["--url", &url, "--operator-token", "x", "--burst", "1"]);
    assert_eq!(code, Some(2), "{output}");
    assert!(!output.contains("GO"), "{output}");
}

/// The rehearsal's advice followed end to end, as docs/OPERATIONS.md
/// tells an event team: rehearse the experience as it stands (cap 1,
/// 300 ms AI jobs, 20 participants a second): NO-GO with the cap that
/// would hold; PATCH the cap to it; rehearse the same experience again:
/// GO. The slug, and so every printed QR code, stays the same.
async fn the_advice_is_followed_with_a_patch(backend: Backend) {
    let app = support::TestApp::spawn_with(
        backend,
        stagehand::ai::simulator::SimConfig {
            latency: Duration::from_millis(300),
            ..support::fast_sim()
        },
        |_| {},
    )
    .await;
    let slug = app.experience(1).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let run = |name: &str| {
        let json_path = dir.path().join(name);
        let args: Vec<String> = [
            "rehearse",
            "--url",
            &app.base,
            "--operator-token",
            support::OPERATOR,
            "--experience",
            &slug,
            "--rate",
            "20/s",
            "--duration",
            "1s",
            "--terminals",
            "2",
            "--target-p95",
            "2s",
            "--json",
            &json_path.display().to_string(),
        ]
        .map(str::to_owned)
        .to_vec();
        async move {
            let (code, output) = tokio::task::spawn_blocking(move || {
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                support::run_stagehand(&args, RUN_DEADLINE)
            })
            .await
            .expect("rehearse ran");
            let report: Value = serde_json::from_str(
                &std::fs::read_to_string(&json_path)
                    .unwrap_or_else(|e| panic!("no JSON ({e}):\n{output}")),
            )
            .expect("JSON");
            (code, output, report)
        }
    };

    let (code, output, report) = run("before.json").await;
    assert_eq!(code, Some(1), "cap 1 should be NO-GO:\n{output}");
    assert_eq!(report["capacity"]["max_in_flight"], 1, "{report:#}");
    let recommended = report["capacity"]["recommended_max_in_flight"]
        .as_u64()
        .unwrap_or_else(|| panic!("no advice: {report:#}"));
    assert!(recommended > 1, "{report:#}");
    assert!(
        output.contains(&format!("you need max_in_flight >= {recommended}"))
            && output.contains("PATCH /api/experiences/{slug}"),
        "{output}"
    );

    let resp = app
        .http
        .patch(format!("{}/api/experiences/{slug}", app.base))
        .bearer_auth(support::OPERATOR)
        .json(&serde_json::json!({"max_in_flight": recommended}))
        .send()
        .await
        .expect("PATCH");
    assert_eq!(resp.status(), 200, "{:?}", resp.text().await);

    let (code, output, report) = run("after.json").await;
    assert_eq!(
        code,
        Some(0),
        "with the advised cap it should be GO:\n{output}"
    );
    assert_eq!(
        report["capacity"]["max_in_flight"].as_u64(),
        Some(recommended),
        "the second run rehearsed the patched experience: {report:#}"
    );
    assert!(verdict_line(&output).starts_with("GO: "), "{output}");
    eprintln!(
        "rehearse NO-GO at cap 1, PATCH to {recommended}, rehearse GO: {}",
        verdict_line(&output)
    );
}

db_test!(the_advice_is_followed_with_a_patch);
