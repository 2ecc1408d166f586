//! Sets `cfg(pg_tests)` when `STAGEHAND_TEST_POSTGRES_URL` is set, so the
//! PostgreSQL variants of the tests run then, and are reported *ignored*
//! ("STAGEHAND_TEST_POSTGRES_URL is not set") otherwise, instead of
//! passing without running.
fn main() {
    println!("cargo::rustc-check-cfg=cfg(pg_tests)");
    println!("cargo::rerun-if-env-changed=STAGEHAND_TEST_POSTGRES_URL");
    if std::env::var("STAGEHAND_TEST_POSTGRES_URL").is_ok_and(|url| !url.is_empty()) {
        println!("cargo::rustc-cfg=pg_tests");
    }
}
