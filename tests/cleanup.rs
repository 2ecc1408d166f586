//! The cleanup actor at event scale (issue 9): a round's orphan batch holds
//! only real orphans, however many free sagas wait out a backoff in front
//! of them; a session stuck in SUBMITTING is aborted again each time it
//! sticks; rounds never overlap; purges go in bounded batches and never
//! delete what a connected display has not acknowledged. Rows are seeded
//! with a few multi-row INSERTs. On SQLite and on PostgreSQL.

mod support;

use std::time::{Duration, Instant};

use sea_orm::{ConnectionTrait, Value};
use stagehand::actors::cleanup::{
    CleanupReport, CleanupStats, GetCleanupStats, RunCleanup, PURGE_BATCH, PURGE_ROUNDS,
};
use stagehand::clock::{Clock, ManualClock};
use stagehand::domain::policy::{ownership, recovery, Recovery, RecoveryLimits};
use stagehand::store::Store;
use support::{fast_sim, wait_for, Backend, TestApp, TestDb};

const WITHIN: Duration = Duration::from_secs(20);
const START: i64 = 1_800_000_000_000;
const HOUR: i64 = 3_600_000;
const MAX_RECOVERIES: u32 = 2;

/// The app on a manual clock; the dispatcher only runs when woken and the
/// cleanup actor only when asked.
async fn app(backend: Backend) -> (TestApp, std::sync::Arc<ManualClock>) {
    let clock = ManualClock::new(START);
    let app = TestApp::spawn_with_clock(
        backend,
        fast_sim(),
        |c| {
            c.max_recoveries = MAX_RECOVERIES;
            c.poll_interval = Duration::from_secs(3600);
            c.cleanup_interval = Duration::from_secs(3600);
        },
        clock.clone(),
    )
    .await;
    (app, clock)
}

/// One number from a query.
async fn scalar(store: &Store, sql: &str, values: Vec<Value>) -> i64 {
    let row = store
        .db()
        .query_one_raw(store.sql(sql, values))
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .expect("a row");
    row.try_get_by_index::<i64>(0).expect("a number")
}

async fn exec(store: &Store, sql: &str, values: Vec<Value>) -> u64 {
    store
        .write_one(store.sql(sql, values))
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// `INSERT INTO {into} VALUES (..), (..)` with the rows given as SQL
/// literals, 2,000 rows a statement.
async fn insert_rows(store: &Store, into: &str, rows: &[String]) {
    for chunk in rows.chunks(2_000) {
        let sql = format!("INSERT INTO {into} VALUES {}", chunk.join(", "));
        store
            .db()
            .execute_unprepared(&sql)
            .await
            .unwrap_or_else(|e| panic!("insert into {into}: {e}"));
    }
}

async fn experience_id(app: &TestApp, slug: &str) -> String {
    let row = app
        .state
        .store
        .db()
        .query_one_raw(app.state.store.sql(
            "SELECT id FROM experiences WHERE slug = $1",
            vec![slug.into()],
        ))
        .await
        .unwrap()
        .unwrap();
    row.try_get_by_index(0).unwrap()
}

fn sql_opt(v: Option<i64>) -> String {
    v.map_or("NULL".into(), |v| v.to_string())
}

/// A saga to seed (and its session).
struct Seed<'a> {
    kind: &'a str,
    step: &'a str,
    lock_token: Option<&'a str>,
    locked_until: Option<i64>,
    recoveries: u32,
    next_attempt_at: i64,
    deadline_at: i64,
    handed_over: bool,
    created_at: i64,
}

/// Inserts the sagas (and one session each, SUBMITTING while the saga
/// runs) in a few statements; the prompt says the kind.
async fn seed_sagas(store: &Store, experience: &str, seeds: &[Seed<'_>], now: i64) {
    let mut sessions = Vec::with_capacity(seeds.len());
    let mut sagas = Vec::with_capacity(seeds.len());
    for seed in seeds {
        let (session, saga) = (uuid::Uuid::new_v4(), uuid::Uuid::new_v4());
        let status = match seed.step {
            "COMPLETED" => "'COMPLETED'",
            "ABORTED" => "'ABORTED'",
            _ => "'SUBMITTING'",
        };
        let reason = if seed.step == "ABORTED" {
            "'AI_FAILED'"
        } else {
            "NULL"
        };
        sessions.push(format!(
            "('{session}', '{experience}', NULL, 'p', '{session}', {status}, {reason}, {c}, {now})",
            c = seed.created_at
        ));
        sagas.push(format!(
            "('{saga}', '{session}', '{experience}', '{step}', '{kind}', {token}, {until}, 0, {rec}, 0, \
             {next}, '{key}', {reason}, {deadline}, {handed}, {c}, {now})",
            step = seed.step,
            kind = seed.kind,
            token = seed
                .lock_token
                .map_or("NULL".into(), |t| format!("'{t}'")),
            until = sql_opt(seed.locked_until),
            rec = seed.recoveries,
            next = seed.next_attempt_at,
            key = uuid::Uuid::new_v4(),
            deadline = seed.deadline_at,
            handed = if seed.handed_over { "true" } else { "false" },
            c = seed.created_at,
        ));
    }
    insert_rows(
        store,
        "sessions (id, experience_id, terminal_id, nickname, participant_token_hash, status, \
         abort_reason, created_at_ms, updated_at_ms)",
        &sessions,
    )
    .await;
    insert_rows(
        store,
        "sagas (id, session_id, experience_id, step, prompt, lock_token, locked_until_ms, attempts, \
         recoveries, unavailable_streak, next_attempt_at_ms, ai_base_key, abort_reason, \
         deadline_at_ms, handed_over, created_at_ms, updated_at_ms)",
        &sagas,
    )
    .await;
}

/// Runs one round and says how long it took.
async fn round(app: &TestApp) -> (CleanupReport, Duration) {
    let started = Instant::now();
    let report = app
        .app_cleanup
        .send(RunCleanup)
        .await
        .expect("cleanup actor");
    (report, started.elapsed())
}

async fn stats(app: &TestApp) -> CleanupStats {
    app.app_cleanup
        .send(GetCleanupStats)
        .await
        .expect("cleanup actor")
}

async fn orphans_are_aborted_past_a_crowd_of_sagas_in_backoff(backend: Backend) {
    let (app, clock) = app(backend).await;
    let slug = app.experience(5).await;
    let experience = experience_id(&app, &slug).await;
    let store = &app.state.store;
    let now = clock.now_ms();
    let max = MAX_RECOVERIES;
    let mut seeds = Vec::new();
    // History: finished sagas, long past their deadline.
    for i in 0..10_000 {
        seeds.push(Seed {
            kind: "finished",
            step: if i % 2 == 0 { "COMPLETED" } else { "ABORTED" },
            lock_token: None,
            locked_until: Some(now - HOUR),
            recoveries: max,
            next_attempt_at: now - 2 * HOUR,
            deadline_at: now - HOUR,
            handed_over: false,
            created_at: now - 3 * HOUR + i,
        });
    }
    // Free sagas waiting out a backoff with their recoveries used up:
    // older than the orphans, so an oldest-first batch meets them first.
    for i in 0..600 {
        seeds.push(Seed {
            kind: "backoff",
            step: "AI_PENDING",
            lock_token: None,
            locked_until: Some(now - 1_000),
            recoveries: max,
            next_attempt_at: now + HOUR,
            deadline_at: now + HOUR,
            handed_over: false,
            created_at: now - HOUR + i,
        });
    }
    // Orphans: their worker died with its last recovery.
    for i in 0..100 {
        seeds.push(Seed {
            kind: "orphan",
            step: if i % 4 == 0 { "AI_DONE" } else { "AI_PENDING" },
            lock_token: Some("dead-worker"),
            locked_until: Some(now - 1_000),
            recoveries: max,
            next_attempt_at: now - 10_000,
            deadline_at: now + HOUR,
            handed_over: false,
            created_at: now - 30_000 + i,
        });
    }
    let seeded = Instant::now();
    seed_sagas(store, &experience, &seeds, now).await;
    eprintln!("{backend:?}: seeded 10,700 sagas in {:?}", seeded.elapsed());
    if store.is_postgres() {
        store.db().execute_unprepared("ANALYZE").await.unwrap();
    }
    let plan = store.orphans_plan(now, max).await.unwrap();
    eprintln!("{backend:?}: orphan query plan:\n{plan}");
    // Only the non-final sagas are read, along an index: PostgreSQL walks
    // the claim's partial indexes; SQLite searches an index by step.
    if store.is_postgres() {
        assert!(
            plan.contains("idx_sagas_leased") && plan.contains("idx_sagas_unowned"),
            "the orphan query walks the claim's partial indexes: {plan}"
        );
        assert!(!plan.contains("Seq Scan"), "no scan of the table: {plan}");
    } else {
        assert!(
            plan.lines()
                .filter(|l| l.contains(" sagas "))
                .all(|l| l.trim_start().starts_with("SEARCH sagas USING")),
            "only index searches on sagas: {plan}"
        );
    }

    let mut aborted = 0;
    for n in 1..=2 {
        let (report, took) = round(&app).await;
        eprintln!("{backend:?}: round {n} on 10,700 sagas took {took:?}: {report:?}");
        assert_eq!(report.failed, 0, "{report:?}");
        aborted += report.orphaned_sagas;
    }
    assert_eq!(aborted, 100, "every orphan, within two rounds");
    assert_eq!(
        scalar(
            store,
            "SELECT COUNT(*) FROM sagas WHERE prompt = 'orphan' AND step = 'ABORTED' \
             AND abort_reason = 'ORPHANED'",
            vec![],
        )
        .await,
        100
    );
    assert_eq!(
        scalar(
            store,
            "SELECT COUNT(*) FROM sessions s JOIN sagas g ON g.session_id = s.id \
             WHERE g.prompt = 'orphan' AND s.status = 'ABORTED'",
            vec![],
        )
        .await,
        100
    );
    assert_eq!(
        scalar(
            store,
            "SELECT COUNT(*) FROM sagas WHERE prompt = 'backoff' AND step = 'AI_PENDING' \
             AND lock_token IS NULL AND abort_reason IS NULL AND recoveries = $1 \
             AND updated_at_ms = $2",
            vec![(max as i32).into(), now.into()],
        )
        .await,
        600,
        "the sagas in backoff are untouched"
    );
    for step in ["COMPLETED", "ABORTED"] {
        assert_eq!(
            scalar(
                store,
                "SELECT COUNT(*) FROM sagas WHERE prompt = 'finished' AND step = $1 \
                 AND updated_at_ms = $2",
                vec![step.into(), now.into()],
            )
            .await,
            5_000,
            "the finished sagas are untouched"
        );
    }
    app.stop().await;
}
db_test!(orphans_are_aborted_past_a_crowd_of_sagas_in_backoff);

/// `Store::orphans` is `domain::policy::recovery` returning `Orphan`, row
/// for row, over every combination of the columns it reads.
async fn the_orphan_query_is_the_recovery_policy(backend: Backend) {
    let db = TestDb::fresh(backend).await;
    let store = db.store().await;
    let now = START;
    let experience = uuid::Uuid::new_v4().to_string();
    exec(
        &store,
        "INSERT INTO experiences (id, slug, title, kind, ai_calls, max_in_flight, locale, created_at_ms) \
         VALUES ($1, 'matrix', 'm', 'comic', 1, 5, 'en', $2)",
        vec![experience.clone().into(), now.into()],
    )
    .await;
    let mut seeds = Vec::new();
    let mut expected = 0;
    for step in [
        "AI_PENDING",
        "AI_DONE",
        "RANKING_DONE",
        "COMPLETED",
        "ABORTED",
    ] {
        for token in [None, Some("t")] {
            for until in [None, Some(now - 1), Some(now), Some(now + 1)] {
                for recoveries in [0, MAX_RECOVERIES - 1, MAX_RECOVERIES, MAX_RECOVERIES + 1] {
                    for next in [now - 1, now + 1] {
                        for deadline in [now - 1, now, now + 1] {
                            for handed_over in [false, true] {
                                let runnable = !matches!(step, "COMPLETED" | "ABORTED");
                                let owner = ownership(token, until, handed_over, now);
                                let orphan = runnable
                                    && recovery(
                                        owner,
                                        recoveries,
                                        next,
                                        deadline,
                                        now,
                                        RecoveryLimits {
                                            max_recoveries: MAX_RECOVERIES,
                                        },
                                    ) == Recovery::Orphan;
                                expected += orphan as usize;
                                seeds.push(Seed {
                                    kind: if orphan { "orphan" } else { "other" },
                                    step,
                                    lock_token: token,
                                    locked_until: until,
                                    recoveries,
                                    next_attempt_at: next,
                                    deadline_at: deadline,
                                    handed_over,
                                    created_at: now - 10_000,
                                });
                            }
                        }
                    }
                }
            }
        }
    }
    seed_sagas(&store, &experience, &seeds, now).await;
    let found = store.orphans(now, MAX_RECOVERIES, 10_000).await.unwrap();
    assert!(expected > 0 && expected < seeds.len());
    let wrong: Vec<_> = found.iter().filter(|s| s.prompt != "orphan").collect();
    assert!(wrong.is_empty(), "not orphans: {wrong:#?}");
    assert_eq!(found.len(), expected, "every orphan, once");
    // The limit holds.
    assert_eq!(
        store.orphans(now, MAX_RECOVERIES, 7).await.unwrap().len(),
        7
    );
}
db_test!(the_orphan_query_is_the_recovery_policy);

async fn a_session_stuck_again_is_aborted_again(backend: Backend) {
    let (app, clock) = app(backend).await;
    let slug = app.experience(5).await;
    let (tid, ttok) = app.terminal(&slug).await;
    let mut socket = app.terminal_socket(&tid, &ttok, 0).await;
    let (sid, ptok) = app.session(&slug, Some(&tid), "hal").await;
    let store = &app.state.store;
    let events = || {
        scalar(
            store,
            "SELECT COUNT(*) FROM terminal_events WHERE session_id = $1",
            vec![sid.clone().into()],
        )
    };
    for time in 1..=2 {
        // Stuck in SUBMITTING without a saga (as after restoring a partial
        // backup); the second time after the participant submitted again.
        exec(
            store,
            "UPDATE sessions SET status = 'SUBMITTING', updated_at_ms = $1 WHERE id = $2",
            vec![clock.now_ms().into(), sid.clone().into()],
        )
        .await;
        clock.advance_ms(60_000);
        let (report, _) = round(&app).await;
        assert_eq!(report.failed, 0, "round {time}: {report:?}");
        assert_eq!(report.stuck_sessions, 1, "round {time}: {report:?}");
        assert_eq!(app.status(&sid, &ptok).await["status"], "ABORTED");
        assert_eq!(events().await, time, "one event each time");
        // Each abort's event has an id of its own where a saga id stands.
        assert_eq!(
            scalar(
                store,
                "SELECT COUNT(DISTINCT saga_id) FROM terminal_events WHERE session_id = $1 \
                 AND saga_id <> $1",
                vec![sid.clone().into()],
            )
            .await,
            time
        );
        let frame = socket
            .next_session_event(WITHIN)
            .await
            .expect("the display is told");
        assert_eq!(frame["type"], "session.aborted");
        assert_eq!(frame["reason"], "ORPHANED");
        assert_eq!(frame["session_id"], sid.as_str());
        assert_eq!(frame["seq"], time);
    }
    // Nothing is left for a third round.
    let (report, _) = round(&app).await;
    assert_eq!(report, CleanupReport::default());
    app.stop().await;
}
db_test!(a_session_stuck_again_is_aborted_again);

async fn one_failed_item_never_stops_the_round(backend: Backend) {
    let (app, clock) = app(backend).await;
    let slug = app.experience(5).await;
    let (tid, _) = app.terminal(&slug).await;
    let store = &app.state.store;
    let mut stuck = Vec::new();
    for name in ["first", "second", "third"] {
        let (sid, ptok) = app.session(&slug, Some(&tid), name).await;
        exec(
            store,
            "UPDATE sessions SET status = 'SUBMITTING', updated_at_ms = $1 WHERE id = $2",
            vec![clock.now_ms().into(), sid.clone().into()],
        )
        .await;
        clock.advance_ms(1);
        stuck.push((sid, ptok));
    }
    // The database refuses the outbox event of the oldest one.
    let refused = &stuck[0].0;
    let refuse = if store.is_postgres() {
        format!(
            "CREATE FUNCTION refuse_event() RETURNS trigger AS $$ BEGIN \
             RAISE EXCEPTION 'refused by the test'; END $$ LANGUAGE plpgsql; \
             CREATE TRIGGER refuse_one BEFORE INSERT ON terminal_events FOR EACH ROW \
             WHEN (NEW.session_id = '{refused}') EXECUTE FUNCTION refuse_event()"
        )
    } else {
        format!(
            "CREATE TRIGGER refuse_one BEFORE INSERT ON terminal_events \
             WHEN NEW.session_id = '{refused}' BEGIN SELECT RAISE(ABORT, 'refused by the test'); END"
        )
    };
    store.db().execute_unprepared(&refuse).await.unwrap();
    clock.advance_ms(60_000);
    let (report, _) = round(&app).await;
    assert_eq!(report.stuck_sessions, 2, "{report:?}");
    assert_eq!(report.failed, 1, "{report:?}");
    assert_eq!(
        app.status(&stuck[0].0, &stuck[0].1).await["status"],
        "SUBMITTING"
    );
    for (sid, ptok) in &stuck[1..] {
        assert_eq!(app.status(sid, ptok).await["status"], "ABORTED");
    }
    store
        .db()
        .execute_unprepared(if store.is_postgres() {
            "DROP TRIGGER refuse_one ON terminal_events"
        } else {
            "DROP TRIGGER refuse_one"
        })
        .await
        .unwrap();
    let (report, _) = round(&app).await;
    assert_eq!((report.stuck_sessions, report.failed), (1, 0), "{report:?}");
    assert_eq!(
        app.status(&stuck[0].0, &stuck[0].1).await["status"],
        "ABORTED"
    );
    app.stop().await;
}
db_test!(one_failed_item_never_stops_the_round);

async fn overlapping_round_requests_run_one_round_at_a_time(backend: Backend) {
    let (app, _clock) = app(backend).await;
    let store = &app.state.store;
    // Hold the first round inside its purges: on SQLite the write gate,
    // on PostgreSQL a lock on the idempotency table.
    let held = store.write_tx().await.unwrap();
    if store.is_postgres() {
        held.execute_unprepared("LOCK TABLE idempotency_records IN ACCESS EXCLUSIVE MODE")
            .await
            .unwrap();
    }
    let first = actix_web::rt::spawn(app.app_cleanup.send(RunCleanup));
    let running = wait_for(WITHIN, || async {
        let s = stats(&app).await;
        (s.rounds == 1 && s.running == 1).then_some(s)
    })
    .await;
    assert!(running.is_some(), "the first round started");
    let more: Vec<_> = (0..4)
        .map(|_| actix_web::rt::spawn(app.app_cleanup.send(RunCleanup)))
        .collect();
    let queued = wait_for(WITHIN, || async {
        let s = stats(&app).await;
        (s.requests_queued == 4).then_some(s)
    })
    .await
    .unwrap_or_else(|| {
        panic!(
            "the requests were not queued: {:?}",
            futures_util::FutureExt::now_or_never(stats(&app))
        )
    });
    assert_eq!(queued.rounds, 1, "no second round while the first runs");
    assert_eq!(queued.running, 1);
    drop(held); // rolls back, lets the first round go on

    first.await.unwrap().unwrap();
    for request in more {
        request.await.unwrap().unwrap();
    }
    let after = stats(&app).await;
    assert_eq!(
        after.rounds, 2,
        "the four requests that came during the first round shared one more round: {after:?}"
    );
    assert_eq!(after.running, 0);
    // A request when nothing runs starts its own round at once.
    round(&app).await;
    assert_eq!(stats(&app).await.rounds, 3);
    app.stop().await;
}
db_test!(overlapping_round_requests_run_one_round_at_a_time);

async fn purges_go_in_bounded_batches_and_stop_at_their_bound(backend: Backend) {
    let (app, clock) = app(backend).await;
    let slug = app.experience(5).await;
    let (terminal, _) = app.terminal(&slug).await;
    let store = &app.state.store;
    let now = clock.now_ms();
    let old = now - 8 * 24 * HOUR; // past the 7 days' retention
    let bound = PURGE_BATCH * PURGE_ROUNDS as u64;
    let extra = 2_500;
    let total = bound + extra;

    let keys: Vec<String> = (0..total)
        .map(|i| {
            format!(
                "('s', 'k{i}', 'h', 'completed', 200, '{{}}', {old}, {e})",
                e = now - 1
            )
        })
        .collect();
    insert_rows(
        store,
        "idempotency_records (scope, key, request_hash, state, response_status, response_body, \
         created_at_ms, expires_at_ms)",
        &keys,
    )
    .await;
    // Numbered events of a terminal without a display.
    let events: Vec<String> = (1..=total)
        .map(|seq| {
            format!(
                "('{terminal}', {seq}, '{s}', '{s}', 'session.aborted', '{{}}', {old})",
                s = uuid::Uuid::new_v4()
            )
        })
        .collect();
    insert_rows(
        store,
        "terminal_events (terminal_id, seq, session_id, saga_id, event_type, payload, created_at_ms)",
        &events,
    )
    .await;
    exec(
        store,
        "UPDATE terminals SET last_seq = $1 WHERE id = $2",
        vec![(total as i64).into(), terminal.clone().into()],
    )
    .await;

    // One statement deletes one batch at most.
    assert_eq!(store.purge_expired_keys(now, 10).await.unwrap(), 10);
    assert_eq!(
        store
            .purge_events_before(now - 7 * 24 * HOUR, 10)
            .await
            .unwrap(),
        10
    );

    let (first, took) = round(&app).await;
    eprintln!("{backend:?}: a round purging {bound} + {bound} rows took {took:?}: {first:?}");
    assert_eq!(first.failed, 0);
    assert_eq!(first.expired_keys, bound, "a round stops at its bound");
    assert_eq!(first.old_events, bound, "a round stops at its bound");
    let (second, _) = round(&app).await;
    assert_eq!(second.expired_keys, extra - 10, "the rest, the next round");
    assert_eq!(second.old_events, extra - 10);
    for table in ["idempotency_records", "terminal_events"] {
        assert_eq!(
            scalar(store, &format!("SELECT COUNT(*) FROM {table}"), vec![]).await,
            0,
            "{table}"
        );
    }
    app.stop().await;
}
db_test!(purges_go_in_bounded_batches_and_stop_at_their_bound);

/// The outbox purge never deletes an event the relay has not numbered, nor
/// one that a connected display of its terminal has not acknowledged.
async fn the_outbox_purge_keeps_what_a_display_has_not_acknowledged(backend: Backend) {
    let db = TestDb::fresh(backend).await;
    let store = db.store().await;
    let now = START;
    let old = now - 8 * 24 * HOUR;
    let experience = uuid::Uuid::new_v4().to_string();
    exec(
        &store,
        "INSERT INTO experiences (id, slug, title, kind, ai_calls, max_in_flight, locale, created_at_ms) \
         VALUES ($1, 'purge', 'p', 'comic', 1, 5, 'en', $2)",
        vec![experience.clone().into(), now.into()],
    )
    .await;
    let (quiet, watched, gone) = (
        uuid::Uuid::new_v4().to_string(),
        uuid::Uuid::new_v4().to_string(),
        uuid::Uuid::new_v4().to_string(),
    );
    let terminals: Vec<String> = [&quiet, &watched, &gone]
        .iter()
        .map(|t| format!("('{t}', '{experience}', 'booth', '{t}', 10, 0, {now})"))
        .collect();
    insert_rows(
        &store,
        "terminals (id, experience_id, name, token_hash, last_seq, acked_seq, created_at_ms)",
        &terminals,
    )
    .await;
    let mut events = Vec::new();
    for terminal in [&quiet, &watched, &gone] {
        for seq in 1..=10 {
            events.push(format!(
                "('{terminal}', {seq}, '{s}', '{s}', 'session.aborted', '{{}}', {old})",
                s = uuid::Uuid::new_v4()
            ));
        }
    }
    // Old, but not numbered yet; and a numbered one within the retention.
    events.push(format!(
        "('{quiet}', NULL, '{s}', '{s}', 'session.aborted', '{{}}', {old})",
        s = uuid::Uuid::new_v4()
    ));
    events.push(format!(
        "('{quiet}', 11, '{s}', '{s}', 'session.aborted', '{{}}', {now})",
        s = uuid::Uuid::new_v4()
    ));
    insert_rows(
        &store,
        "terminal_events (terminal_id, seq, session_id, saga_id, event_type, payload, created_at_ms)",
        &events,
    )
    .await;
    // The watched terminal has two displays: one acknowledged 8, one 5.
    // The gone terminal's display acknowledged everything.
    exec(
        &store,
        "INSERT INTO terminal_presence (socket_id, terminal_id, instance_id, connected_at_ms, \
         seen_at_ms, sent_seq, acked_seq) VALUES ('a', $1, 'i', $3, $3, 10, 8), \
         ('b', $1, 'i', $3, $3, 10, 5), ('c', $2, 'i', $3, $3, 10, 10)",
        vec![watched.clone().into(), gone.clone().into(), now.into()],
    )
    .await;

    let cutoff = now - 7 * 24 * HOUR;
    let mut batches = Vec::new();
    loop {
        let n = store.purge_events_before(cutoff, 4).await.unwrap();
        batches.push(n);
        if n < 4 {
            break;
        }
    }
    assert_eq!(batches.iter().sum::<u64>(), 10 + 5 + 10, "{batches:?}");
    assert!(batches.iter().all(|&n| n <= 4), "{batches:?}");
    let left = |terminal: String| {
        let store = store.clone();
        async move {
            let rows = store
                .db()
                .query_all_raw(store.sql(
                    "SELECT seq FROM terminal_events WHERE terminal_id = $1 ORDER BY seq",
                    vec![terminal.into()],
                ))
                .await
                .unwrap();
            rows.iter()
                .map(|r| r.try_get_by_index::<Option<i64>>(0).unwrap())
                .collect::<Vec<_>>()
        }
    };
    let mut quiet_left = left(quiet.clone()).await;
    quiet_left.sort();
    assert_eq!(
        quiet_left,
        vec![None, Some(11)],
        "unnumbered and recent ones stay"
    );
    assert_eq!(
        left(watched.clone()).await,
        (6..=10).map(Some).collect::<Vec<_>>(),
        "what a connected display has not acknowledged stays"
    );
    assert!(left(gone.clone()).await.is_empty());
}
db_test!(the_outbox_purge_keeps_what_a_display_has_not_acknowledged);
