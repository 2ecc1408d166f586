//! `stagehand rehearse` as a user runs it: the built binary, a burst of 40
//! participants on 3 displays with 10 % of the prompts rejected, against
//! its embedded server (SQLite in its own temp dir, or a fresh PostgreSQL
//! database), checked through the JSON it writes.

mod support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::{Backend, TestDb};

/// The whole run (two subprocesses, 40 sagas behind a cap of 5 at the
/// default 500 ms AI poll) takes about 6 s; this is the bound.
const RUN_DEADLINE: Duration = Duration::from_secs(120);

/// Runs `stagehand rehearse` with `args`; its stdout and stderr when it
/// exits in time, a panic otherwise.
fn rehearse(args: &[&str]) -> (bool, String) {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("out.log");
    let file = std::fs::File::create(&out).expect("log file");
    let mut child = Command::new(env!("CARGO_BIN_EXE_stagehand"))
        .arg("rehearse")
        .args(args)
        .stdin(Stdio::null())
        .stdout(file.try_clone().expect("log file"))
        .stderr(file)
        .spawn()
        .expect("start stagehand rehearse");
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if start.elapsed() > RUN_DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "rehearse still running after {RUN_DEADLINE:?}:\n{}",
                std::fs::read_to_string(&out).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    (
        status.success(),
        std::fs::read_to_string(&out).unwrap_or_default(),
    )
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
        "--json",
        &json_arg,
    ];
    if let Some(db) = &db {
        args.extend(["--database-url", &db.url]);
    }
    let (ok, output) = rehearse(&args);
    assert!(ok, "rehearse failed:\n{output}");
    assert!(
        output.contains("| 202 to terminal frame, p50 / p95 / p99 (ms)"),
        "no table on stdout:\n{output}"
    );
    let v: Value = serde_json::from_str(
        &std::fs::read_to_string(Path::new(&json_path)).expect("the JSON file"),
    )
    .expect("JSON");

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
