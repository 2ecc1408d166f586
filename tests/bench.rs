//! `stagehand bench --server-binary` as a user runs it: the built binary
//! measures the servers of another build (here a wrapper script that notes
//! each start and then runs this build), while the AI simulator stays its
//! own; a path that is not a file is refused before anything starts. The
//! runs take only the memory per idle socket (SQLite, 20 sockets), the
//! bench's shortest measurement.

mod support;

/// Starting the simulator and a server, 20 sockets and the RSS reads take
/// a few seconds; this is the bound.
const RUN_DEADLINE: std::time::Duration = std::time::Duration::from_secs(120);

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
    ];
    all.extend_from_slice(args);
    support::run_stagehand(&all, RUN_DEADLINE)
}

#[test]
fn the_servers_run_from_the_given_binary_and_the_simulator_from_this_one() {
    let dir = tempfile::tempdir().expect("temp dir");
    let starts = dir.path().join("starts.txt");
    let wrapper = dir.path().join("other-build");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\necho \"$1\" >> '{}'\nexec '{}' \"$@\"\n",
            starts.display(),
            env!("CARGO_BIN_EXE_stagehand")
        ),
    )
    .expect("write the wrapper");
    let mut mode = std::fs::metadata(&wrapper).expect("wrapper").permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut mode, 0o755);
    std::fs::set_permissions(&wrapper, mode).expect("make the wrapper executable");

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
            && output.contains("keep stage per result"),
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
