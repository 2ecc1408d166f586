//! `stagehand bench --server-binary` as a user runs it: the built binary
//! measures the servers of another build (here a wrapper script that notes
//! each start and then runs this build; the bench also asks each build's
//! `serve --help` which flags it takes, which starts no server), while the
//! AI simulator stays its own; a path that is not a file is refused before
//! anything starts. The runs take only the memory per idle socket
//! (SQLite, 20 sockets), the bench's shortest measurement.
//! `--side-by-side` runs builds in alternation and gives their ratio.

mod support;

/// Starting the simulator and a server, 20 sockets and the RSS reads take
/// a few seconds, but the media figures' quick run (a debug build's photo
/// pipeline, one photo worker) takes about 100 s of CPU on two cores: a
/// bound against a hang, not a timing.
const RUN_DEADLINE: std::time::Duration = std::time::Duration::from_secs(300);

/// Writes an executable shell script at `path`: a build standing in for
/// another, for `--server-binary` and `--side-by-side`.
fn write_script(path: &std::path::Path, text: &str) {
    std::fs::write(path, text).expect("write the wrapper");
    let mut mode = std::fs::metadata(path).expect("wrapper").permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut mode, 0o755);
    std::fs::set_permissions(path, mode).expect("make the wrapper executable");
}

/// Runs `stagehand bench` with `args`, no PostgreSQL (an empty
/// `--postgres-url` wins over `STAGEHAND_BENCH_POSTGRES_URL`), and only the
/// memory per idle socket unless `args` say otherwise; its exit code and
/// output.
fn bench(args: &[&str]) -> (Option<i32>, String) {
    let mut all = vec![
        "bench",
        "--postgres-url",
        "",
        "--no-throughput",
        "--no-push-latency",
        "--no-outputs",
        "--no-webhooks",
    ];
    all.extend_from_slice(args);
    support::run_stagehand(&all, RUN_DEADLINE)
}

#[test]
fn the_servers_run_from_the_given_binary_and_the_simulator_from_this_one() {
    let dir = tempfile::tempdir().expect("temp dir");
    let starts = dir.path().join("starts.txt");
    let wrapper = dir.path().join("other-build");
    write_script(
        &wrapper,
        &format!(
            "#!/bin/sh\n\
             if [ \"$2\" = --help ]; then exec '{exe}' \"$@\"; fi\n\
             echo \"$1\" >> '{starts}'\nexec '{exe}' \"$@\"\n",
            starts = starts.display(),
            exe = env!("CARGO_BIN_EXE_stagehand")
        ),
    );

    let wrapper_arg = wrapper.to_str().expect("utf-8 path");
    let (code, output) = bench(&[
        "--idle-sockets",
        "20",
        "--media-quick",
        "--server-binary",
        wrapper_arg,
    ]);
    assert_eq!(code, Some(0), "bench failed:\n{output}");
    let started: Vec<String> = std::fs::read_to_string(&starts)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(
        started,
        vec!["serve".to_owned(), "serve".to_owned(), "serve".to_owned()],
        "the servers of the socket measurement, the media figures and the export, and nothing else, run from --server-binary:\n{output}"
    );
    assert!(
        output.contains(&format!("servers run by: {wrapper_arg}")),
        "the table's header names the servers' build:\n{output}"
    );
    assert!(
        output.contains("KiB"),
        "the socket measurement reports its figure:\n{output}"
    );
    assert!(
        output.contains("CPU per upload, 1.5 MP / 12 MP JPEG (ms)")
            && output.contains("keep stage per result")
            && output.contains("SQLite commits over 50 ms in those four sets"),
        "the media figures are reported:\n{output}"
    );
}

#[test]
fn a_server_binary_that_is_not_a_file_is_refused_before_anything_runs() {
    let dir = tempfile::tempdir().expect("temp dir");
    let missing = dir.path().join("no-such-build");
    let (code, output) = bench(&["--server-binary", missing.to_str().expect("utf-8 path")]);
    assert_ne!(
        code,
        Some(0),
        "a missing build must fail the run:\n{output}"
    );
    assert!(
        output.contains("no such file"),
        "the error names the problem:\n{output}"
    );
    assert!(
        !output.contains("stagehand bench,"),
        "nothing was measured:\n{output}"
    );
}

/// The claim cost of `stagehand bench` is the store's own measurement,
/// run as `stagehand claim-cost` (the load tools cannot reach the store):
/// on a scratch SQLite file it prints, as one JSON line, every queue length
/// asked for with one time per round for each figure the table shows.
#[test]
fn the_claim_cost_command_times_each_queue_length() {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}/claim.db?mode=rwc", dir.path().display());
    let (code, output) = support::run_stagehand(
        &[
            "claim-cost",
            "--database-url",
            &url,
            "--rounds",
            "3",
            "--sizes",
            "20,200",
            "--rank-batch",
            "4",
        ],
        RUN_DEADLINE,
    );
    assert_eq!(code, Some(0), "claim-cost failed:\n{output}");
    let line = output
        .lines()
        .find(|l| l.starts_with('['))
        .unwrap_or_else(|| panic!("no JSON figures:\n{output}"));
    let sizes: Vec<serde_json::Value> = serde_json::from_str(line).expect("JSON figures");
    let queued: Vec<i64> = sizes.iter().filter_map(|s| s["queued"].as_i64()).collect();
    assert_eq!(queued, vec![20, 200], "{line}");
    for size in &sizes {
        for figure in [
            "rounds_ms",
            "list_ms",
            "rank_ms",
            "rank_after_news_ms",
            "rank_reread_ms",
        ] {
            let times = size[figure].as_array().expect(figure);
            assert_eq!(times.len(), 3, "{figure}: {line}");
            assert!(
                times.iter().all(|t| t.as_f64().is_some_and(|t| t > 0.0)),
                "{figure}: {line}"
            );
        }
    }
    assert!(
        output.contains("plan of the claim of the AI queue"),
        "the plans go to stderr:\n{output}"
    );
}

/// The metrics the load tools read are named as the server serves them.
#[test]
fn the_load_tools_read_the_metrics_by_the_servers_names() {
    use stagehand::metrics;
    use stagehand_bench::metric_names;
    assert_eq!(metric_names::AI_JOB_DURATION, metrics::AI_JOB_DURATION);
    assert_eq!(metric_names::ACTOR_MESSAGES, metrics::ACTOR_MESSAGES);
    assert_eq!(metric_names::TASKS_SPAWNED, metrics::TASKS_SPAWNED);
    assert_eq!(metric_names::FRAMES_ENCODED, metrics::FRAMES_ENCODED);
    assert_eq!(metric_names::KEEP_DURATION, metrics::KEEP_DURATION);
    assert_eq!(metric_names::SQLITE_COMMIT, stagehand::store::SQLITE_COMMIT);
    // The media bench counts commits over this bound: it must be one of
    // the commit histogram's buckets.
    let bound: f64 = stagehand_bench::media::SLOW_COMMIT_LE.parse().unwrap();
    assert!(
        metrics::GATE_BUCKETS.contains(&bound),
        "{bound} is not a bucket of {:?}",
        metrics::GATE_BUCKETS
    );
}

/// A short flat-out run (a few hundred sagas, well under a second of
/// load) still counts the server's own work per saga: `GET /metrics`
/// renders its text at most once a second, so the bench must not read the
/// counters after the run from the same rendering as before it.
#[test]
fn a_short_run_still_counts_the_servers_messages_per_saga() {
    let (code, output) = support::run_stagehand(
        &[
            "bench",
            "--postgres-url",
            "",
            "--sessions",
            "200",
            "--concurrency",
            "8",
            "--no-push-latency",
            "--no-socket-memory",
            "--no-media",
            "--no-claim-cost",
            "--no-outputs",
            "--no-webhooks",
        ],
        RUN_DEADLINE,
    );
    assert_eq!(code, Some(0), "bench failed:\n{output}");
    let rows: Vec<&str> = output
        .lines()
        .filter(|l| l.contains("per saga: actor messages / tasks spawned / frames encoded"))
        .collect();
    assert_eq!(rows.len(), 2, "one row per terminal count:\n{output}");
    for row in rows {
        let cell = row.split('|').nth(2).unwrap_or("").trim();
        let figures: Vec<f64> = cell
            .split(" / ")
            .map(|f| f.trim().parse().unwrap_or(0.0))
            .collect();
        assert!(
            figures.len() == 3 && figures.iter().all(|&f| f > 0.0),
            "every saga takes actor messages, a task and a frame: {row}\n{output}"
        );
    }
}

/// `--side-by-side A` measures A and this build in alternation, A B B A:
/// the run's rows name the build of each run in that order, and the
/// summary gives this build's ratio to A with its spread. A is an older
/// build here (a wrapper that notes each start and knows no
/// `--media-url`, as builds before the media store did): it is given only
/// the flags it takes.
#[test]
fn side_by_side_runs_a_b_b_a_and_gives_the_ratio_with_its_spread() {
    let dir = tempfile::tempdir().expect("temp dir");
    let starts = dir.path().join("starts.txt");
    let older = dir.path().join("older-build");
    write_script(
        &older,
        &format!(
            "#!/bin/sh\n\
             if [ \"$2\" = --help ]; then '{exe}' \"$@\" | grep -v -e --media-url; exit 0; fi\n\
             for arg in \"$@\"; do\n\
               if [ \"$arg\" = --media-url ]; then echo 'unexpected argument --media-url' >&2; exit 2; fi\n\
             done\n\
             echo \"$1\" >> '{starts}'\n\
             exec '{exe}' \"$@\"\n",
            starts = starts.display(),
            exe = env!("CARGO_BIN_EXE_stagehand")
        ),
    );

    let (code, output) = support::run_stagehand(
        &[
            "bench",
            "--postgres-url",
            "",
            "--sessions",
            "150",
            "--concurrency",
            "8",
            "--terminals",
            "1",
            "--side-by-side",
            older.to_str().expect("utf-8 path"),
        ],
        RUN_DEADLINE * 2,
    );
    assert_eq!(code, Some(0), "bench failed:\n{output}");
    let started = std::fs::read_to_string(&starts).unwrap_or_default();
    assert_eq!(
        started.lines().collect::<Vec<_>>(),
        vec!["serve", "serve"],
        "the older build serves runs 1 and 4 only:\n{output}"
    );
    let runs: Vec<&str> = output
        .lines()
        .filter(|l| {
            l.split('|')
                .nth(1)
                .is_some_and(|c| c.trim().parse::<u32>().is_ok())
        })
        .collect();
    let order: Vec<&str> = runs
        .iter()
        .map(|l| l.split('|').nth(2).unwrap_or("").trim())
        .collect();
    assert_eq!(
        order,
        vec!["older-build", "this build", "this build", "older-build"],
        "one row per run, A B B A:\n{output}"
    );
    let ratio = output
        .lines()
        .find(|l| l.contains("SQLite, 1 terminal sagas/s | this build"))
        .unwrap_or_else(|| panic!("a summary row for this build:\n{output}"));
    let cells: Vec<&str> = ratio.split('|').map(str::trim).collect();
    let times = |cell: &str| cell.trim_end_matches('×').parse::<f64>().ok();
    let (r, spread) = (times(cells[4]), cells[5]);
    let (low, high) = spread
        .split_once('–')
        .and_then(|(l, h)| Some((times(l)?, times(h)?)))
        .unwrap_or_else(|| panic!("a spread low–high: {ratio}"));
    let r = r.unwrap_or_else(|| panic!("a ratio: {ratio}"));
    assert!(
        r > 0.0 && low > 0.0 && low <= high,
        "the ratio and its spread are figures: {ratio}"
    );
}
