//! Delivery at scale, black box through HTTP and the terminal socket: a
//! freed AI slot starts the next queued saga at once (not at the next poll),
//! one terminal takes thousands of results with fast, stalled and late
//! displays, and a display gets a backlog of any size in order. On SQLite
//! and on PostgreSQL.

mod support;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use futures_util::stream::{self, StreamExt};
use sea_orm::ConnectionTrait;
use serde_json::json;
use stagehand::ai::simulator::SimConfig;
use stagehand::config::Config;
use support::{fast_sim, Backend, Display, DisplayReader, Frame, TestApp};

/// With the default poll interval (10 s) and the default AI poll interval,
/// 30 sessions behind a cap of 5 and a 1 s AI run in 6 rounds: about 6 s
/// when each freed slot wakes the dispatcher, about 50 s when only the poll
/// timer does.
async fn freed_slots_start_the_next_saga_at_the_default_poll(backend: Backend) {
    const SESSIONS: usize = 30;
    const CAP: i32 = 5;
    let ideal = Duration::from_secs(6);
    let sim = SimConfig {
        latency: Duration::from_secs(1),
        ..fast_sim()
    };
    let app = TestApp::spawn_with(backend, sim, |config| {
        config.poll_interval = Config::defaults().poll_interval;
        config.ai_poll_interval = Config::defaults().ai_poll_interval;
    })
    .await;
    let slug = app.experience(CAP).await;
    let mut sessions = Vec::new();
    for i in 0..SESSIONS {
        sessions.push(app.session(&slug, None, &format!("p{i}")).await);
    }

    let started = Instant::now();
    let answers = join_all(sessions.iter().enumerate().map(|(i, (sid, tok))| {
        app.submit(sid, tok, json!({"prompt": format!("round <{i}>")}), "k")
    }))
    .await;
    for resp in &answers {
        assert_eq!(resp.status(), 202);
    }
    // Fails fast: 20 s is well past the 9 s the ratio allows, and well
    // before the ~50 s the poll timer alone needs.
    let finals = support::wait_all_final(&app.http, &app.base, &sessions, Duration::from_secs(20))
        .await
        .unwrap_or_else(|e| {
            panic!(
                "{e} (first submission {:.1} s ago; ideal {ideal:?}): a freed AI slot does not start \
                 the next queued saga before the next poll",
                started.elapsed().as_secs_f64()
            )
        });
    let elapsed = started.elapsed();
    for s in &finals {
        assert_eq!(s["status"], "COMPLETED", "{s}");
    }
    let ratio = elapsed.as_secs_f64() / ideal.as_secs_f64();
    let stats = app.sim.control.stats();
    eprintln!(
        "{backend:?}: {SESSIONS} sessions, cap {CAP}, AI 1 s: all COMPLETED after {:.2} s, ideal {:.0} s, \
         ratio {ratio:.2}; simulator: {} jobs, max {} concurrent",
        elapsed.as_secs_f64(),
        ideal.as_secs_f64(),
        stats.jobs_created,
        stats.max_concurrent_jobs
    );
    assert!(
        ratio <= 1.5,
        "took {:.2} s, {ratio:.2} times the ideal {ideal:?} (at most 1.5)",
        elapsed.as_secs_f64()
    );
    assert_eq!(stats.jobs_created, SESSIONS as u64, "{stats:?}");
    assert!(stats.max_concurrent_jobs <= CAP as u64, "{stats:?}");
    app.stop().await;
}
db_test!(freed_slots_start_the_next_saga_at_the_default_poll);

/// One booth screen at a stadium finale: 2,000 results on one terminal, one
/// display reading all the time, one stuck until everything is final, one
/// connecting afterwards. Each gets every event once, in `seq` order.
async fn one_terminal_two_thousand_sagas_three_displays(backend: Backend) {
    const SESSIONS: usize = 2_000;
    const SUBMITTERS: usize = 32;
    let sim = SimConfig {
        latency: Duration::ZERO,
        ..fast_sim()
    };
    let app = TestApp::spawn_with(backend, sim, |_| {}).await;
    let slug = app.experience(200).await;
    let (tid, ttok) = app.terminal(&slug).await;

    let prepared = Instant::now();
    let sessions: Vec<(String, String)> = stream::iter(0..SESSIONS)
        .map(|i| {
            let app = &app;
            let (slug, tid) = (&slug, &tid);
            async move { app.session(slug, Some(tid), &format!("p{i}")).await }
        })
        .buffered(SUBMITTERS)
        .collect()
        .await;
    eprintln!(
        "{backend:?}: {SESSIONS} sessions created in {:.1} s",
        prepared.elapsed().as_secs_f64()
    );
    let expected: Vec<String> = sessions.iter().map(|(sid, _)| sid.clone()).collect();

    let live = Display::connect("live", app.port, &tid, &ttok, 0).await;
    let live = DisplayReader::spawn(live, SESSIONS, Duration::from_secs(240));
    // Connected, then never read until every session is final.
    let mut stalled = Display::connect("stalled", app.port, &tid, &ttok, 0).await;

    let started = Instant::now();
    let statuses: Vec<u16> = stream::iter(sessions.iter().enumerate())
        .map(|(i, (sid, tok))| {
            let app = &app;
            async move {
                app.submit(sid, tok, json!({"prompt": format!("finale <{i}>")}), "k")
                    .await
                    .status()
                    .as_u16()
            }
        })
        .buffer_unordered(SUBMITTERS)
        .collect()
        .await;
    let submitted = started.elapsed();
    assert!(
        statuses.iter().all(|s| *s == 202),
        "submissions answered {:?}",
        statuses.iter().collect::<HashSet<_>>()
    );

    let finals = support::wait_all_final(&app.http, &app.base, &sessions, Duration::from_secs(150))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let all_final = started.elapsed();
    let completed = finals.iter().filter(|s| s["status"] == "COMPLETED").count();
    eprintln!(
        "{backend:?}: {SESSIONS} submissions answered in {:.1} s; all final after {:.1} s ({completed} COMPLETED)",
        submitted.as_secs_f64(),
        all_final.as_secs_f64()
    );
    assert_eq!(completed, SESSIONS, "every session COMPLETED");

    // Every session is final: the events are all in the outbox. The
    // displays get a bounded time to deliver them, so a lost event fails
    // here rather than at the overall deadline.
    let delivery = Duration::from_secs(60);
    live.cut_off_at(Instant::now() + delivery);
    let stalled_from = Instant::now();
    stalled.read_until_count(SESSIONS, delivery).await;
    let stalled_took = stalled_from.elapsed();
    let late_from = Instant::now();
    let mut late = Display::connect("late", app.port, &tid, &ttok, 0).await;
    late.read_until_count(SESSIONS, delivery).await;
    let late_took = late_from.elapsed();
    let live = live.finish().await;
    eprintln!(
        "{backend:?}: live got {} events ({} reconnects); stalled got {} in {:.1} s after the end ({} reconnects); \
         late got {} in {:.1} s ({} reconnects); total {:.1} s",
        live.events.len(),
        live.reconnects,
        stalled.events.len(),
        stalled_took.as_secs_f64(),
        stalled.reconnects,
        late.events.len(),
        late_took.as_secs_f64(),
        late.reconnects,
        started.elapsed().as_secs_f64()
    );
    let problems: Vec<String> = [&live, &stalled, &late]
        .iter()
        .filter_map(|d| d.check_delivery(&expected, SESSIONS as i64).err())
        .collect();
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    app.stop().await;
}
db_test!(one_terminal_two_thousand_sagas_three_displays);

/// A display that connects with `after=0` to 10,000 old events gets all of
/// them, in order, on one connection; `after=9990` gives the last 10.
async fn a_display_gets_a_backlog_of_ten_thousand_events_in_order(backend: Backend) {
    const EVENTS: i64 = 10_000;
    const PER_INSERT: i64 = 500;
    let app = TestApp::spawn(backend).await;
    let slug = app.experience(5).await;
    let (tid, ttok) = app.terminal(&slug).await;

    // Setup, not the thing under test: the backlog written straight into
    // the outbox. `seq` is only in its column, not in the payload.
    let db = app.state.store.db();
    let now_ms = chrono::Utc::now().timestamp_millis();
    let mut session_of = vec![String::new(); EVENTS as usize + 1];
    for chunk in 0..EVENTS / PER_INSERT {
        let rows: Vec<String> = (chunk * PER_INSERT + 1..=(chunk + 1) * PER_INSERT)
            .map(|seq| {
                let session_id = uuid::Uuid::new_v4().to_string();
                let saga_id = uuid::Uuid::new_v4();
                let payload = json!({"type": "session.completed", "session_id": session_id, "nickname": format!("p{seq}")});
                session_of[seq as usize] = session_id.clone();
                format!(
                    "('{tid}', {seq}, '{session_id}', '{saga_id}', 'session.completed', '{payload}', {now_ms})"
                )
            })
            .collect();
        db.execute_unprepared(&format!(
            "INSERT INTO terminal_events (terminal_id, seq, session_id, saga_id, event_type, payload, created_at_ms) \
             VALUES {}",
            rows.join(", ")
        ))
        .await
        .expect("insert outbox rows");
    }
    db.execute_unprepared(&format!(
        "UPDATE terminals SET last_seq = {EVENTS} WHERE id = '{tid}'"
    ))
    .await
    .expect("set last_seq");

    let started = Instant::now();
    let mut socket = support::Socket::try_connect(app.port, &tid, &ttok, 0)
        .await
        .expect("connect");
    let mut hello = None;
    let mut seqs = Vec::new();
    let mut wrong_rows = 0;
    let mut ended = None;
    let deadline = Instant::now() + Duration::from_secs(60);
    while (seqs.len() as i64) < EVENTS {
        let left = deadline.saturating_duration_since(Instant::now());
        match socket.next_frame(left).await {
            Frame::Json(v) if v["type"] == "hello" => hello = Some(v),
            // The experience's top 10, not an outbox event.
            Frame::Json(v) if v["type"] == "ranking" => {}
            Frame::Json(v) => {
                let seq = v["seq"].as_i64().unwrap_or(-1);
                let row = usize::try_from(seq).ok().and_then(|s| session_of.get(s));
                if row.is_none_or(|sid| v["session_id"] != sid.as_str())
                    || v["nickname"] != format!("p{seq}")
                {
                    wrong_rows += 1;
                }
                seqs.push(seq);
            }
            Frame::Closed(reason) => {
                ended = Some(format!("the server closed the socket ({reason})"));
                break;
            }
            Frame::TimedOut => {
                ended = Some("nothing more arrived within 60 s".to_owned());
                break;
            }
        }
    }
    let took = started.elapsed();
    let with_seq = seqs.iter().filter(|s| **s > 0).count();
    eprintln!(
        "{backend:?}: backlog of {EVENTS}: received {} frames ({with_seq} with a seq) in {:.2} s{}",
        seqs.len(),
        took.as_secs_f64(),
        ended
            .as_deref()
            .map(|e| format!("; stopped: {e}"))
            .unwrap_or_default()
    );
    let hello = hello.expect("hello frame");
    assert_eq!(hello["last_seq"], EVENTS, "{hello}");
    assert!(
        ended.is_none(),
        "display got {} of {EVENTS} backlog events ({with_seq} carrying a seq), then {}",
        seqs.len(),
        ended.unwrap()
    );
    assert_eq!(
        with_seq,
        seqs.len(),
        "frames must carry seq from the outbox column"
    );
    let expected: Vec<i64> = (1..=EVENTS).collect();
    if seqs != expected {
        let at = seqs.iter().zip(&expected).position(|(a, b)| a != b);
        panic!(
            "seq not 1..={EVENTS} in order: first difference at frame #{at:?} (got {:?})",
            at.map(|i| seqs[i])
        );
    }
    assert_eq!(wrong_rows, 0, "frames whose payload is not their seq's row");

    // Resuming near the end gives exactly the rest.
    let mut tail = support::Socket::try_connect(app.port, &tid, &ttok, EVENTS - 10)
        .await
        .expect("connect");
    let mut tail_seqs = Vec::new();
    while tail_seqs.len() < 10 {
        match tail.next_frame(Duration::from_secs(10)).await {
            Frame::Json(v) if v["type"] == "hello" => assert_eq!(v["last_seq"], EVENTS),
            Frame::Json(v) if v["type"] == "ranking" => {}
            Frame::Json(v) => tail_seqs.push(v["seq"].as_i64().unwrap_or(-1)),
            other => panic!("after={}: {other:?} after {tail_seqs:?}", EVENTS - 10),
        }
    }
    assert_eq!(tail_seqs, (EVENTS - 9..=EVENTS).collect::<Vec<_>>());
    // Nothing beyond the 10 (a bounded check for an extra frame).
    assert!(
        tail.next_session_event(Duration::from_millis(300))
            .await
            .is_none(),
        "more than the last 10 events after after={}",
        EVENTS - 10
    );
    app.stop().await;
}
db_test!(a_display_gets_a_backlog_of_ten_thousand_events_in_order);
