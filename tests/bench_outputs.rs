//! `stagehand bench`'s outputs (issue 47), in a test binary of its own:
//! it starts two real printers and photo sagas, and test binaries run one
//! after the other, so it never steals the CPU of tests/bench.rs's timed
//! runs.

mod support;

const RUN_DEADLINE: std::time::Duration = std::time::Duration::from_secs(180);

/// The event's outputs: the brand's and a print's CPU-ms, and prints
/// queued over two real printers (CUPS's ippeveprinter), each printed
/// once; a short run (4 prints, 1 round) checks the table, not the
/// figures.
#[test]
fn the_outputs_print_each_queued_print_once_and_time_the_queue() {
    let (code, output) = support::run_stagehand(
        &[
            "bench",
            "--postgres-url",
            "",
            "--no-throughput",
            "--no-push-latency",
            "--no-socket-memory",
            "--no-media",
            "--no-claim-cost",
            "--prints",
            "4",
            "--output-rounds",
            "1",
            "--print-pace",
            "100ms",
        ],
        RUN_DEADLINE,
    );
    assert_eq!(code, Some(0), "bench failed:\n{output}");
    assert!(
        output.contains("| prints queued / documents printed / printed twice | 4 / 4 / 0 |"),
        "each of the 4 prints printed once:\n{output}"
    );
    for row in [
        "brand a 1024² result",
        "brand a 2048² result",
        "prepare a print",
        "the queue took",
    ] {
        assert!(output.contains(row), "the table has {row:?}:\n{output}");
    }
}
