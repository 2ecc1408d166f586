//! Shared test plumbing: a fresh SQLite file, and a fresh PostgreSQL database
//! (created through the admin URL in `STAGEHAND_TEST_POSTGRES_URL`, dropped
//! afterwards) when that variable is set.

#![allow(dead_code)]

use std::collections::hash_map::RandomState;
use std::future::Future;
use std::hash::{BuildHasher, Hasher};

use sea_orm_migration::sea_orm::{ConnectionTrait, Database, DatabaseConnection};

/// What a database check returns: `Err` carries a readable reason.
pub type TestResult = Result<(), String>;

/// Maps an error to `"{context}: {error}"`.
pub fn err<E: std::fmt::Display>(context: &str) -> impl FnOnce(E) -> String + '_ {
    move |e| format!("{context}: {e}")
}

/// Runs `check` on a fresh SQLite file (`sqlite://{path}?mode=rwc`).
pub async fn on_sqlite<F, Fut>(check: F)
where
    F: FnOnce(DatabaseConnection) -> Fut,
    Fut: Future<Output = TestResult>,
{
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!(
        "sqlite://{}?mode=rwc",
        dir.path().join("stagehand.db").display()
    );
    let db = Database::connect(&url).await.expect("connect to SQLite");
    let outcome = check(db.clone()).await;
    db.close().await.expect("close SQLite");
    outcome.unwrap();
}

/// Runs `check` on a freshly created PostgreSQL database with a random name
/// when `STAGEHAND_TEST_POSTGRES_URL` is set; the database is dropped
/// afterwards, whatever the outcome.
pub async fn on_postgres<F, Fut>(check: F)
where
    F: FnOnce(DatabaseConnection) -> Fut,
    Fut: Future<Output = TestResult>,
{
    // The tests that call this are ignored without the variable (build.rs).
    let admin_url = std::env::var("STAGEHAND_TEST_POSTGRES_URL")
        .expect("STAGEHAND_TEST_POSTGRES_URL (the test is ignored without it)");
    let name = random_database_name();

    let admin = Database::connect(&admin_url)
        .await
        .expect("connect to the PostgreSQL admin URL");
    admin
        .execute_unprepared(&format!(r#"CREATE DATABASE "{name}""#))
        .await
        .expect("create test database");

    let outcome = match Database::connect(&with_database(&admin_url, &name)).await {
        Ok(db) => {
            let outcome = check(db.clone()).await;
            let _ = db.close().await;
            outcome
        }
        Err(e) => Err(format!("connect to {name}: {e}")),
    };

    let dropped = admin
        .execute_unprepared(&format!(r#"DROP DATABASE IF EXISTS "{name}" WITH (FORCE)"#))
        .await;
    let _ = admin.close().await;
    outcome.unwrap();
    dropped.expect("drop test database");
}

/// `stagehand_test_` and 16 random hex digits.
fn random_database_name() -> String {
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    hasher.write_u32(std::process::id());
    format!("stagehand_test_{:016x}", hasher.finish())
}

/// Replaces the database name in a PostgreSQL URL, keeping any query string.
pub fn with_database(url: &str, name: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (url, None),
    };
    let authority_start = base.find("://").map_or(0, |i| i + 3);
    let authority_end = base[authority_start..]
        .find('/')
        .map_or(base.len(), |i| authority_start + i);
    let mut out = format!("{}/{}", &base[..authority_end], name);
    if let Some(query) = query {
        out.push('?');
        out.push_str(query);
    }
    out
}
