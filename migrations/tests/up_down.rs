//! Migrations run up, down and up again on a fresh SQLite file, and on a fresh
//! PostgreSQL database when `STAGEHAND_TEST_POSTGRES_URL` is set (an admin URL,
//! e.g. `postgres://postgres@127.0.0.1:5432/postgres`; the test creates a
//! database with a random name through it and drops it afterwards).
//!
//! Besides "it runs", the test checks what the rest of stagehand relies on:
//! every table exists after `up` and none after `down`, the outbox id
//! auto-increments on both databases, and the unique indexes and foreign keys
//! really reject what they must.

mod common;

use common::{err, on_postgres, on_sqlite, with_database, TestResult};
use migration::{Migrator, MigratorTrait, SchemaManager};
use sea_orm_migration::sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, Statement};
use sea_orm_migration::sea_query::{Alias, Expr, Func, InsertStatement, Order, Query};

const TABLES: [&str; 13] = [
    "experiences",
    "terminals",
    "sessions",
    "sagas",
    "score_attempts",
    "results",
    "terminal_events",
    "idempotency_records",
    "terminal_presence",
    "ai_calls",
    "providers",
    "ai_slots",
    "instances",
];

const EXPERIENCE_ID: &str = "00000000-0000-4000-8000-000000000001";
const TERMINAL_ID: &str = "00000000-0000-4000-8000-000000000002";
const SESSION_ID: &str = "00000000-0000-4000-8000-000000000003";

async fn assert_tables(db: &DatabaseConnection, present: bool) -> TestResult {
    let manager = SchemaManager::new(db);
    for table in TABLES {
        let has = manager.has_table(table).await.map_err(err("has_table"))?;
        if has != present {
            return Err(format!(
                "table {table}: expected present={present}, found present={has}"
            ));
        }
    }
    Ok(())
}

fn insert_event(seq: i64, saga_id: &str, terminal_id: &str) -> InsertStatement {
    Query::insert()
        .into_table("terminal_events")
        .columns([
            "terminal_id",
            "seq",
            "session_id",
            "saga_id",
            "event_type",
            "payload",
            "created_at_ms",
        ])
        .values_panic([
            terminal_id.into(),
            seq.into(),
            SESSION_ID.into(),
            saga_id.into(),
            "session.completed".into(),
            "{}".into(),
            1_700_000_000_000i64.into(),
        ])
        .to_owned()
}

/// Inserts the parents an outbox row needs (an experience and a terminal
/// whose token column is `token_column`: `token` before the people's-side
/// migration, `token_hash` after).
async fn insert_parents(db: &DatabaseConnection, token_column: &str) -> TestResult {
    db.execute(
        Query::insert()
            .into_table("experiences")
            .columns(["id", "slug", "title", "kind", "created_at_ms"])
            .values_panic([
                EXPERIENCE_ID.into(),
                "comic-booth".into(),
                "Comic booth".into(),
                "comic".into(),
                1_700_000_000_000i64.into(),
            ]),
    )
    .await
    .map_err(err("insert experience"))?;
    db.execute(
        Query::insert()
            .into_table("terminals")
            .columns(["id", "experience_id", "name", token_column, "created_at_ms"].map(Alias::new))
            .values_panic([
                TERMINAL_ID.into(),
                EXPERIENCE_ID.into(),
                "Booth A".into(),
                "secret".into(),
                1_700_000_000_000i64.into(),
            ]),
    )
    .await
    .map_err(err("insert terminal"))?;

    // Column defaults are applied.
    let row = db
        .query_one(
            Query::select()
                .columns(["ai_calls", "max_in_flight"])
                .from("experiences"),
        )
        .await
        .map_err(err("select experience"))?
        .ok_or("experience row missing")?;
    let ai_calls: i32 = row.try_get("", "ai_calls").map_err(err("ai_calls"))?;
    let max_in_flight: i32 = row
        .try_get("", "max_in_flight")
        .map_err(err("max_in_flight"))?;
    if (ai_calls, max_in_flight) != (1, 5) {
        return Err(format!(
            "defaults: ai_calls={ai_calls} max_in_flight={max_in_flight}, expected 1 and 5"
        ));
    }
    let row = db
        .query_one(Query::select().column("last_seq").from("terminals"))
        .await
        .map_err(err("select terminal"))?
        .ok_or("terminal row missing")?;
    let last_seq: i64 = row.try_get("", "last_seq").map_err(err("last_seq"))?;
    if last_seq != 0 {
        return Err(format!("default last_seq={last_seq}, expected 0"));
    }
    Ok(())
}

/// Two outbox rows get increasing ids without the id being given; the
/// unique indexes and the terminal foreign key reject bad rows.
async fn check_outbox(db: &DatabaseConnection) -> TestResult {
    insert_parents(db, "token_hash").await?;

    let saga_a = "00000000-0000-4000-8000-00000000000a";
    let saga_b = "00000000-0000-4000-8000-00000000000b";
    // The first insert asks for the generated id back (RETURNING works on
    // PostgreSQL and on the bundled SQLite), the second does not.
    let returned = db
        .query_one(insert_event(1, saga_a, TERMINAL_ID).returning_col("id"))
        .await
        .map_err(err("insert event 1"))?
        .ok_or("RETURNING gave no row")?;
    let returned_id: i64 = returned.try_get("", "id").map_err(err("returned id"))?;
    db.execute(&insert_event(2, saga_b, TERMINAL_ID))
        .await
        .map_err(err("insert event 2"))?;

    let rows = db
        .query_all(
            Query::select()
                .column("id")
                .from("terminal_events")
                .order_by("seq", Order::Asc),
        )
        .await
        .map_err(err("select events"))?;
    let ids = rows
        .iter()
        .map(|r| r.try_get::<i64>("", "id"))
        .collect::<Result<Vec<_>, _>>()
        .map_err(err("event id"))?;
    if ids.len() != 2 || ids[0] != returned_id || ids[0] < 1 || ids[1] <= ids[0] {
        return Err(format!(
            "outbox ids do not auto-increment: {ids:?} (returned {returned_id})"
        ));
    }

    // (terminal_id, seq) is unique.
    if db
        .execute(&insert_event(
            2,
            "00000000-0000-4000-8000-00000000000c",
            TERMINAL_ID,
        ))
        .await
        .is_ok()
    {
        return Err("duplicate (terminal_id, seq) was accepted".into());
    }
    // A saga retried by an operator after it aborted ends a second time.
    db.execute(&insert_event(3, saga_a, TERMINAL_ID))
        .await
        .map_err(err("second event of a retried saga"))?;
    // The terminal must exist (SQLite enforces foreign keys on sqlx connections).
    if db
        .execute(&insert_event(
            4,
            "00000000-0000-4000-8000-00000000000d",
            "00000000-0000-4000-8000-0000000000ff",
        ))
        .await
        .is_ok()
    {
        return Err("event for an unknown terminal was accepted".into());
    }
    // Duplicate experience slug.
    if db
        .execute(
            Query::insert()
                .into_table("experiences")
                .columns(["id", "slug", "title", "kind", "created_at_ms"])
                .values_panic([
                    "00000000-0000-4000-8000-0000000000e1".into(),
                    "comic-booth".into(),
                    "Again".into(),
                    "comic".into(),
                    Expr::val(1i64),
                ]),
        )
        .await
        .is_ok()
    {
        return Err("duplicate experience slug was accepted".into());
    }
    Ok(())
}

/// The outbox id is a real auto-increment column on each backend.
async fn check_outbox_id_column(db: &DatabaseConnection) -> TestResult {
    match db.get_database_backend() {
        DbBackend::Sqlite => {
            let row = db
                .query_one_raw(Statement::from_string(
                    DbBackend::Sqlite,
                    "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'terminal_events'",
                ))
                .await
                .map_err(err("sqlite_master"))?
                .ok_or("terminal_events missing from sqlite_master")?;
            let sql: String = row.try_get("", "sql").map_err(err("sql"))?;
            // `integer PRIMARY KEY` makes the column the rowid alias.
            if !sql.contains(r#""id" integer NOT NULL PRIMARY KEY AUTOINCREMENT"#) {
                return Err(format!("terminal_events.id is not a rowid alias: {sql}"));
            }
        }
        DbBackend::Postgres => {
            let row = db
                .query_one_raw(Statement::from_string(
                    DbBackend::Postgres,
                    "SELECT data_type, column_default, is_identity FROM information_schema.columns \
                     WHERE table_name = 'terminal_events' AND column_name = 'id'",
                ))
                .await
                .map_err(err("information_schema"))?
                .ok_or("terminal_events.id missing")?;
            let data_type: String = row.try_get("", "data_type").map_err(err("data_type"))?;
            let default: Option<String> = row
                .try_get("", "column_default")
                .map_err(err("column_default"))?;
            let identity: String = row.try_get("", "is_identity").map_err(err("is_identity"))?;
            let generated =
                identity == "YES" || default.as_deref().is_some_and(|d| d.starts_with("nextval"));
            if data_type != "bigint" || !generated {
                return Err(format!(
                    "terminal_events.id: type {data_type}, default {default:?}, identity {identity}"
                ));
            }
        }
        other => return Err(format!("unexpected backend {other:?}")),
    }
    Ok(())
}

fn insert_unnumbered(saga_id: &str) -> InsertStatement {
    Query::insert()
        .into_table("terminal_events")
        .columns([
            "terminal_id",
            "session_id",
            "saga_id",
            "event_type",
            "payload",
            "created_at_ms",
        ])
        .values_panic([
            TERMINAL_ID.into(),
            SESSION_ID.into(),
            saga_id.into(),
            "session.completed".into(),
            "{}".into(),
            1_700_000_000_000i64.into(),
        ])
        .to_owned()
}

async fn event_count(db: &DatabaseConnection) -> Result<i64, String> {
    let row = db
        .query_one(
            Query::select()
                .expr(Func::count(Expr::col("id")))
                .from("terminal_events"),
        )
        .await
        .map_err(err("count events"))?
        .ok_or("no count")?;
    row.try_get_by_index::<i64>(0).map_err(err("count"))
}

/// The reactive-delivery migration on a database that already has numbered
/// events: they survive with their `seq`, unnumbered events (several per
/// terminal) become possible, the foreign key and unique indexes still hold;
/// one step down drops only the unnumbered ones.
async fn check_outbox_becomes_nullable(db: &DatabaseConnection) -> TestResult {
    Migrator::up(db, Some(1)).await.map_err(err("up to init"))?;
    insert_parents(db, "token").await?;
    db.execute(&insert_event(
        1,
        "00000000-0000-4000-8000-0000000000a1",
        TERMINAL_ID,
    ))
    .await
    .map_err(err("numbered event before"))?;
    if db
        .execute(&insert_unnumbered("00000000-0000-4000-8000-0000000000a0"))
        .await
        .is_ok()
    {
        return Err("the init schema accepted an event without seq".into());
    }
    Migrator::up(db, Some(1))
        .await
        .map_err(err("up to reactive delivery"))?;
    for saga in [
        "00000000-0000-4000-8000-0000000000a2",
        "00000000-0000-4000-8000-0000000000a3",
    ] {
        db.execute(&insert_unnumbered(saga))
            .await
            .map_err(err("unnumbered event"))?;
    }
    if event_count(db).await? != 3 {
        return Err("the numbered event did not survive the migration".into());
    }
    if db
        .execute(&insert_event(
            1,
            "00000000-0000-4000-8000-0000000000a4",
            TERMINAL_ID,
        ))
        .await
        .is_ok()
    {
        return Err("duplicate (terminal_id, seq) accepted after the migration".into());
    }
    if db
        .execute(&insert_unnumbered("00000000-0000-4000-8000-0000000000a2"))
        .await
        .is_ok()
    {
        return Err("second event for one saga accepted after the migration".into());
    }
    Migrator::down(db, Some(1)).await.map_err(err("one down"))?;
    if event_count(db).await? != 1 {
        return Err("one step down must keep exactly the numbered event".into());
    }
    Migrator::down(db, None).await.map_err(err("all down"))?;
    Ok(())
}

/// The people's-side migration on a database with tokens in the clear:
/// they are hashed in place (SHA-256, hex), and the column names say so.
async fn check_tokens_get_hashed(db: &DatabaseConnection) -> TestResult {
    Migrator::up(db, Some(2))
        .await
        .map_err(err("up to reactive delivery"))?;
    insert_parents(db, "token").await?;
    Migrator::up(db, None).await.map_err(err("up to latest"))?;
    let row = db
        .query_one(Query::select().column("token_hash").from("terminals"))
        .await
        .map_err(err("select token_hash"))?
        .ok_or("terminal missing")?;
    let hash: String = row.try_get("", "token_hash").map_err(err("token_hash"))?;
    // SHA-256 of "secret", the token insert_parents gives.
    let expected = "2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b";
    if hash != expected {
        return Err(format!("token_hash {hash}, expected {expected}"));
    }
    Migrator::down(db, None).await.map_err(err("all down"))?;
    Ok(())
}

/// up, checks, down, up again, checks again.
/// Migration 18 (the slot ledger) loses no job that may run: a leased
/// AI_PENDING saga's call and a job that lingered after its saga become
/// rows of `ai_slots` (attached with the saga's job and key attempt, and
/// detached), and `lingering_jobs` and `sagas.slots` are gone.
async fn check_running_jobs_move_to_the_ledger(db: &DatabaseConnection) -> TestResult {
    let pending = Migrator::get_pending_migrations(db)
        .await
        .map_err(err("pending"))?;
    let before_ledger = pending
        .iter()
        .position(|m| m.name().contains("slot_ledger"))
        .ok_or("no slot ledger migration")?;
    Migrator::up(db, Some(before_ledger as u32))
        .await
        .map_err(err("up to the ledger"))?;
    insert_parents(db, "token_hash").await?;
    let statements = [
        format!(
            "INSERT INTO sessions (id, experience_id, terminal_id, nickname, participant_token_hash, \
             status, created_at_ms, updated_at_ms) VALUES ('{SESSION_ID}', '{EXPERIENCE_ID}', \
             '{TERMINAL_ID}', 'n', 'h', 'SUBMITTING', 1, 1)"
        ),
        format!(
            "INSERT INTO sagas (id, session_id, experience_id, step, prompt, attempts, recoveries, \
             unavailable_streak, next_attempt_at_ms, ai_base_key, attempt_offset, slots, \
             handed_over, deadline_at_ms, charged_credits, created_at_ms, updated_at_ms, \
             lock_token, locked_until_ms, ai_job_id) VALUES ('saga-1', '{SESSION_ID}', \
             '{EXPERIENCE_ID}', 'AI_PENDING', 'p', 1, 0, 0, 1, 'base', 2, 1, false, 9, 0, 1, 1, \
             'token', 5, 'job-1')"
        ),
        format!(
            "INSERT INTO lingering_jobs (provider, job_id, saga_id, experience_id, until_ms, \
             locked_until_ms, cancel_tried, created_at_ms) VALUES ('default', 'job-0', 'saga-0', \
             '{EXPERIENCE_ID}', 9, 0, true, 1)"
        ),
    ];
    for sql in &statements {
        db.execute_unprepared(sql)
            .await
            .map_err(err("rows before the ledger"))?;
    }
    Migrator::up(db, Some(1))
        .await
        .map_err(err("up to the ledger"))?;
    let rows = db
        .query_all_raw(Statement::from_string(
            db.get_database_backend(),
            "SELECT saga_id, call_index, key_attempt, job_id, detached, cancel_tried \
             FROM ai_slots ORDER BY saga_id",
        ))
        .await
        .map_err(err("ledger rows"))?;
    let found = rows
        .iter()
        .map(|r| {
            Ok::<_, sea_orm_migration::sea_orm::DbErr>((
                r.try_get::<String>("", "saga_id")?,
                r.try_get::<i32>("", "call_index")?,
                r.try_get::<i32>("", "key_attempt")?,
                r.try_get::<Option<String>>("", "job_id")?,
                r.try_get::<bool>("", "detached")?,
                r.try_get::<bool>("", "cancel_tried")?,
            ))
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(err("ledger row"))?;
    let expected = vec![
        (
            "saga-0".to_owned(),
            -1,
            0,
            Some("job-0".to_owned()),
            true,
            true,
        ),
        (
            "saga-1".to_owned(),
            0,
            3,
            Some("job-1".to_owned()),
            false,
            false,
        ),
    ];
    if found != expected {
        return Err(format!(
            "ledger after the upgrade: {found:?}, expected {expected:?}"
        ));
    }
    let manager = SchemaManager::new(db);
    if manager
        .has_table("lingering_jobs")
        .await
        .map_err(err("has_table"))?
        || manager
            .has_column("sagas", "slots")
            .await
            .map_err(err("has_column"))?
    {
        return Err("lingering_jobs or sagas.slots is still there".into());
    }
    for table in ["ai_slots", "sagas", "sessions", "terminals", "experiences"] {
        db.execute_unprepared(&format!("DELETE FROM {table}"))
            .await
            .map_err(err("clear what the check wrote"))?;
    }
    Ok(())
}

async fn up_down_up(db: &DatabaseConnection) -> TestResult {
    check_outbox_becomes_nullable(db).await?;
    check_tokens_get_hashed(db).await?;
    check_running_jobs_move_to_the_ledger(db).await?;
    Migrator::up(db, None).await.map_err(err("first up"))?;
    assert_tables(db, true).await?;
    check_outbox_id_column(db).await?;
    check_outbox(db).await?;

    Migrator::down(db, None).await.map_err(err("down"))?;
    assert_tables(db, false).await?;

    Migrator::up(db, None).await.map_err(err("second up"))?;
    assert_tables(db, true).await?;
    check_outbox(db).await?;

    // Nothing left pending.
    let pending = Migrator::get_pending_migrations(db)
        .await
        .map_err(err("pending"))?;
    if !pending.is_empty() {
        return Err(format!("{} migrations still pending", pending.len()));
    }
    Ok(())
}

#[tokio::test]
async fn sqlite_up_down_up() {
    on_sqlite(|db| async move { up_down_up(&db).await }).await;
}

#[tokio::test]
#[cfg_attr(not(pg_tests), ignore = "STAGEHAND_TEST_POSTGRES_URL is not set")]
async fn postgres_up_down_up() {
    on_postgres(|db| async move { up_down_up(&db).await }).await;
}

#[test]
fn with_database_replaces_only_the_path() {
    assert_eq!(
        with_database("postgres://postgres@127.0.0.1:5432/postgres", "x"),
        "postgres://postgres@127.0.0.1:5432/x"
    );
    assert_eq!(
        with_database("postgres://u:p@h/db?sslmode=disable", "x"),
        "postgres://u:p@h/x?sslmode=disable"
    );
    assert_eq!(
        with_database("postgres://h:5432", "x"),
        "postgres://h:5432/x"
    );
}
