//! Booth displays, black box through HTTP and the terminal socket: acks are
//! recorded and never go down, presence says who is connected where (across
//! instances on PostgreSQL), a display that stops answering pings is
//! dropped, wrong tokens are refused, the ranking is pushed, the QR code
//! encodes the booth's participant URL, and the pages are served. On SQLite
//! and on PostgreSQL.

mod support;

use std::time::Duration;

use serde_json::{json, Value};
use support::{fast_sim, start_sim, Backend, Frame, Instance, Socket, TestApp, TestDb};

const WITHIN: Duration = Duration::from_secs(20);

/// The booth's presence as `GET /api/terminals` shows it (any instance).
async fn presence(http: &reqwest::Client, base: &str, slug: &str) -> Value {
    let resp = http
        .get(format!("{base}/api/terminals?experience={slug}"))
        .bearer_auth(support::OPERATOR)
        .send()
        .await
        .expect("GET /api/terminals");
    assert_eq!(resp.status(), 200);
    let body: Value = resp.json().await.unwrap();
    let terminals = body["terminals"].as_array().expect("terminals");
    assert_eq!(terminals.len(), 1, "{body}");
    terminals[0].clone()
}

/// Waits until the booth's presence satisfies `ok`.
async fn wait_presence(
    http: &reqwest::Client,
    base: &str,
    slug: &str,
    what: &str,
    ok: impl Fn(&Value) -> bool,
) -> Value {
    let found = support::wait_for(WITHIN, || async {
        let p = presence(http, base, slug).await;
        ok(&p).then_some(p)
    })
    .await;
    found.unwrap_or_else(|| {
        panic!("presence never showed {what}");
    })
}

/// One event delivered, not yet acked: unacked 1. The ack records it; a
/// lower ack afterwards changes nothing (acks never go down); closing the
/// socket shows the booth offline.
async fn acks_are_recorded_and_shown_in_presence(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let slug = app.experience(5).await;
    let (terminal_id, token) = app.terminal(&slug).await;
    let offline = presence(&app.http, &app.base, &slug).await;
    assert_eq!(offline["online"], false);
    assert_eq!(offline["terminal_id"], terminal_id.as_str());

    let mut display = app.terminal_socket(&terminal_id, &token, 0).await;
    assert_eq!(display.next_json(WITHIN).await.unwrap()["type"], "hello");
    let online = wait_presence(&app.http, &app.base, &slug, "the display online", |p| {
        p["online"] == true
    })
    .await;
    assert_eq!(online["displays"], 1);
    assert_eq!(
        online["instances"],
        json!([app.state.instance_id.clone()]),
        "{online}"
    );
    assert!(online["connected_since"].is_string(), "{online}");

    let (sid, tok) = app.session(&slug, Some(&terminal_id), "gil").await;
    assert_eq!(
        app.submit(&sid, &tok, json!({"prompt": "x"}), "k")
            .await
            .status(),
        202
    );
    let event = display
        .next_session_event(WITHIN)
        .await
        .expect("the result");
    assert_eq!(event["seq"], 1);
    // The socket reports what it sent a moment after sending it.
    let delivered = wait_presence(&app.http, &app.base, &slug, "seq 1 delivered", |p| {
        p["last_seq"] == 1 && p["unacked"] == 1
    })
    .await;
    assert_eq!(delivered["acked_seq"], 0);

    display.send_json(json!({"type": "ack", "seq": 1})).await;
    let acked = wait_presence(&app.http, &app.base, &slug, "seq 1 acked", |p| {
        p["acked_seq"] == 1
    })
    .await;
    assert_eq!(acked["unacked"], 0);

    // A lower ack, then a garbage frame, then an ack of the same seq: the
    // recorded ack stays 1, and the socket stays open.
    display.send_json(json!({"type": "ack", "seq": 0})).await;
    display.send_json(json!({"type": "dance"})).await;
    display.send_json(json!({"type": "ack", "seq": 1})).await;
    let (sid2, tok2) = app.session(&slug, Some(&terminal_id), "hal").await;
    assert_eq!(
        app.submit(&sid2, &tok2, json!({"prompt": "y"}), "k")
            .await
            .status(),
        202
    );
    assert_eq!(
        display
            .next_session_event(WITHIN)
            .await
            .expect("still streaming")["seq"],
        2
    );
    let after = wait_presence(&app.http, &app.base, &slug, "seq 2 delivered", |p| {
        p["last_seq"] == 2 && p["unacked"] == 1
    })
    .await;
    assert_eq!(after["acked_seq"], 1, "an ack never goes down: {after}");

    drop(display);
    wait_presence(&app.http, &app.base, &slug, "the booth offline", |p| {
        p["online"] == false
    })
    .await;
    app.stop().await;
}
db_test!(acks_are_recorded_and_shown_in_presence);

/// A wrong, missing or other terminal's token is answered 401 before the
/// upgrade, like an unknown terminal.
async fn wrong_tokens_are_refused(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let slug = app.experience(5).await;
    let (terminal_id, token) = app.terminal(&slug).await;
    let (_, other_token) = app.terminal(&slug).await;
    for (id, tok) in [
        (terminal_id.as_str(), "wrong"),
        (terminal_id.as_str(), ""),
        (terminal_id.as_str(), other_token.as_str()),
        ("no-such-terminal", token.as_str()),
    ] {
        let refused = Socket::try_connect(app.port, id, tok, 0).await;
        let err = refused.err().expect("refused");
        assert!(err.contains("401"), "{id}/{tok}: {err}");
    }
    let mut ok = Socket::try_connect(app.port, &terminal_id, &token, 0)
        .await
        .expect("the right token");
    assert_eq!(ok.next_json(WITHIN).await.unwrap()["type"], "hello");
    app.stop().await;
}
db_test!(wrong_tokens_are_refused);

/// Two displays on one booth; one stops reading (so never answers a ping).
/// It is dropped after three missed heartbeats and the booth shows one
/// display; the one that answers stays.
async fn a_display_that_stops_answering_is_dropped(backend: Backend) {
    let app = TestApp::spawn_with(backend, fast_sim(), |config| {
        config.display_heartbeat = Duration::from_millis(100);
    })
    .await;
    let slug = app.experience(5).await;
    let (terminal_id, token) = app.terminal(&slug).await;
    let mut silent = app.terminal_socket(&terminal_id, &token, 0).await;
    assert_eq!(silent.next_json(WITHIN).await.unwrap()["type"], "hello");
    let mut alive = app.terminal_socket(&terminal_id, &token, 0).await;
    assert_eq!(alive.next_json(WITHIN).await.unwrap()["type"], "hello");
    wait_presence(&app.http, &app.base, &slug, "two displays", |p| {
        p["displays"] == 2
    })
    .await;
    // The live display reads (and so answers pings) until told to stop.
    let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
    let reader = tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = &mut stopped => return alive,
                frame = alive.next_frame(Duration::from_millis(50)) => {
                    if let Frame::Closed(why) = frame {
                        panic!("the display that answers pings was closed: {why}");
                    }
                }
            }
        }
    });
    let one = wait_presence(
        &app.http,
        &app.base,
        &slug,
        "the silent display dropped",
        |p| p["displays"] == 1,
    )
    .await;
    assert_eq!(one["online"], true);
    stop.send(()).unwrap();
    let mut alive = reader.await.unwrap();
    // The silent one reads what was sent before, then finds its socket
    // closed.
    loop {
        match silent.next_frame(WITHIN).await {
            Frame::Closed(_) => break,
            Frame::Json(_) => {}
            Frame::TimedOut => panic!("the silent display's socket is still open"),
        }
    }
    // The other still streams.
    let (sid, tok) = app.session(&slug, Some(&terminal_id), "ivy").await;
    assert_eq!(
        app.submit(&sid, &tok, json!({"prompt": "x"}), "k")
            .await
            .status(),
        202
    );
    assert_eq!(
        alive.next_session_event(WITHIN).await.expect("streams")["nickname"],
        "ivy"
    );
    app.stop().await;
}
db_test!(a_display_that_stops_answering_is_dropped);

/// Two instances on one PostgreSQL database: a display connected to A is
/// online on B, with A's instance id, and offline on B once it leaves A.
#[actix_web::test]
#[cfg_attr(not(pg_tests), ignore = "STAGEHAND_TEST_POSTGRES_URL is not set")]
async fn presence_is_shared_by_every_instance() {
    let db = TestDb::fresh(Backend::Postgres).await;
    let sim = start_sim(fast_sim()).await;
    let a = Instance::start(&db, &sim.url(), |_| {}).await;
    let b = Instance::start(&db, &sim.url(), |_| {}).await;
    let http = reqwest::Client::new();
    let slug = support::create_experience(&http, &a.base, 5).await;
    let (terminal_id, token) = support::create_terminal(&http, &a.base, &slug).await;
    let mut display = Socket::connect(a.port, &terminal_id, &token, 0).await;
    assert_eq!(display.next_json(WITHIN).await.unwrap()["type"], "hello");
    let seen = wait_presence(&http, &b.base, &slug, "A's display on B", |p| {
        p["online"] == true
    })
    .await;
    assert_eq!(seen["instances"], json!([a.state.instance_id.clone()]));
    drop(display);
    wait_presence(&http, &b.base, &slug, "the booth offline on B", |p| {
        p["online"] == false
    })
    .await;
    a.stop().await;
    b.stop().await;
}

/// Scores 10, 30, 20: the display receives `ranking` frames, the last of
/// which is the experience's top 10 as the public ranking shows it.
async fn the_display_gets_the_ranking(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let slug = app.experience(5).await;
    let (terminal_id, token) = app.terminal(&slug).await;
    let mut display = app.terminal_socket(&terminal_id, &token, 0).await;
    let mut sessions = Vec::new();
    for (name, score) in [("jo", 10), ("kim", 30), ("lee", 20)] {
        let (sid, tok) = app.session(&slug, Some(&terminal_id), name).await;
        let body = json!({"prompt": "x", "score": score});
        assert_eq!(app.submit(&sid, &tok, body, "k").await.status(), 202);
        sessions.push((sid, tok));
    }
    support::wait_all_final(&app.http, &app.base, &sessions, WITHIN)
        .await
        .unwrap();
    let nicknames = |frame: &Value| -> Vec<String> {
        frame["entries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["nickname"].as_str().unwrap().to_owned())
            .collect()
    };
    let deadline = tokio::time::Instant::now() + WITHIN;
    let last = loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let frame = display
            .next_of_type("ranking", left)
            .await
            .expect("a ranking frame with all three");
        if nicknames(&frame).len() == 3 {
            break frame;
        }
    };
    assert_eq!(nicknames(&last), vec!["kim", "lee", "jo"]);
    let public = app
        .get_json(&format!("/api/experiences/{slug}/ranking?limit=10"))
        .await;
    assert_eq!(last["entries"], public["entries"]);
    app.stop().await;
}
db_test!(the_display_gets_the_ranking);

/// Forty results in under a second or two, each a new leader: the display
/// gets at most one ranking frame per throttle period (300 ms), not one per
/// result, and the last frame is the final top 10. The bound uses the time
/// the test saw, which is never shorter than the server's own span, so it
/// cannot fail on a slow machine.
async fn ranking_frames_are_throttled(backend: Backend) {
    const RESULTS: usize = 40;
    let throttle = stagehand::actors::ranking_board::THROTTLE;
    let sim = stagehand::ai::simulator::SimConfig {
        latency: Duration::from_millis(50),
        ..fast_sim()
    };
    let app = TestApp::spawn_with(backend, sim, |_| {}).await;
    let slug = app.experience(100).await;
    let (terminal_id, token) = app.terminal(&slug).await;
    let mut sessions = Vec::new();
    for i in 0..RESULTS {
        sessions.push(
            app.session(&slug, Some(&terminal_id), &format!("r{i:02}"))
                .await,
        );
    }
    let mut display = app.terminal_socket(&terminal_id, &token, 0).await;
    assert_eq!(display.next_json(WITHIN).await.unwrap()["type"], "hello");
    // The ranking as it stands is sent on connect, outside the throttle.
    let current = display.next_of_type("ranking", WITHIN).await.unwrap();
    assert_eq!(current["entries"], json!([]));
    let started = std::time::Instant::now();
    // One submission every 20 ms, each with a higher score than the last.
    for (i, (sid, tok)) in sessions.iter().enumerate() {
        let body = json!({"prompt": "x", "score": i as f64});
        assert_eq!(app.submit(sid, tok, body, "k").await.status(), 202);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let top: Vec<String> = (RESULTS - 10..RESULTS)
        .rev()
        .map(|i| format!("r{i:02}"))
        .collect();
    let mut frames = 0;
    loop {
        let frame = display
            .next_of_type("ranking", WITHIN)
            .await
            .expect("the final top 10");
        frames += 1;
        let names: Vec<String> = frame["entries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["nickname"].as_str().unwrap().to_owned())
            .collect();
        if names == top {
            break;
        }
    }
    let seen = started.elapsed();
    let bound = (seen.as_millis() / throttle.as_millis()) as usize + 1;
    assert!(
        frames <= bound,
        "{frames} ranking frames in {seen:?} for {RESULTS} results: more than one per {throttle:?}"
    );
    app.stop().await;
}
db_test!(ranking_frames_are_throttled);

/// The QR code encodes `{public url}/p/{slug}?terminal={id}`; an unknown
/// experience or another experience's terminal is 404.
async fn the_qr_code_encodes_the_booths_participant_url(backend: Backend) {
    let app = TestApp::spawn_with(backend, fast_sim(), |config| {
        config.public_url = Some("https://event.example.org/".into());
    })
    .await;
    let slug = app.experience(5).await;
    let other = app.experience(5).await;
    let (terminal_id, _) = app.terminal(&slug).await;
    let (other_terminal, _) = app.terminal(&other).await;
    let resp = app
        .http
        .get(format!(
            "{}/api/experiences/{slug}/qr.svg?terminal={terminal_id}",
            app.base
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "image/svg+xml");
    let svg = resp.text().await.unwrap();
    let expected = qrcode::QrCode::new(
        format!("https://event.example.org/p/{slug}?terminal={terminal_id}").as_bytes(),
    )
    .unwrap()
    .render::<qrcode::render::svg::Color>()
    .min_dimensions(256, 256)
    .quiet_zone(true)
    .build();
    assert_eq!(svg, expected, "the QR code of the booth's participant URL");

    for (path, status) in [
        (
            format!("/api/experiences/nope/qr.svg?terminal={terminal_id}"),
            404,
        ),
        (
            format!("/api/experiences/{slug}/qr.svg?terminal={other_terminal}"),
            404,
        ),
        (format!("/api/experiences/{slug}/qr.svg"), 200),
    ] {
        let resp = app
            .http
            .get(format!("{}{path}", app.base))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), status, "{path}");
    }
    app.stop().await;
}
db_test!(the_qr_code_encodes_the_booths_participant_url);

/// The pages and their files are served from the binary; an experience
/// reads publicly without its operator fields.
async fn the_pages_are_served(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let slug = app.experience(5).await;
    for (path, kind, needle) in [
        ("/".to_owned(), "text/html", "<html"),
        (format!("/p/{slug}"), "text/html", "participant.js"),
        ("/terminal/some-id".to_owned(), "text/html", "terminal.js"),
        ("/ops".to_owned(), "text/html", "ops-main.js"),
        ("/static/app.js".to_owned(), "text/javascript", "function"),
        ("/static/app.css".to_owned(), "text/css", "{"),
        ("/i18n/ko.json".to_owned(), "application/json", "{"),
    ] {
        let resp = app
            .http
            .get(format!("{}{path}", app.base))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "{path}");
        let content_type = resp.headers()["content-type"].to_str().unwrap().to_owned();
        assert!(content_type.starts_with(kind), "{path}: {content_type}");
        assert!(resp.text().await.unwrap().contains(needle), "{path}");
    }
    let missing = app
        .http
        .get(format!("{}/static/nope.js", app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);
    let public = app.get_json(&format!("/api/experiences/{slug}")).await;
    assert_eq!(public["slug"], slug.as_str());
    assert!(public.get("credits").is_none(), "{public}");
    let listed = app.get_json("/api/experiences").await;
    assert_eq!(listed["experiences"][0]["slug"], slug.as_str());
    assert!(listed["experiences"][0].get("max_in_flight").is_none());
    let (status, full) = app.operator_get(&format!("/api/experiences/{slug}")).await;
    assert_eq!(status, 200);
    assert_eq!(full["max_in_flight"], 5);
    app.stop().await;
}
db_test!(the_pages_are_served);

/// A display that closes before it registered with the hub (its stream
/// ended before `Connect`) must not unregister anyone: its `Disconnect`
/// once dropped the experience's watcher count to 0, which dropped the
/// ranking channel and so closed every other display of the experience on
/// the instance.
#[actix_web::test]
async fn a_display_that_never_connected_disconnects_nobody() {
    use actix::Actor;
    use stagehand::actors::terminal_hub::{
        Connect, ConnectedCount, Disconnect, TerminalHub, WatchedExperiences,
    };
    use stagehand::actors::wakeups::Doorbell;
    let db = support::TestDb::fresh(support::Backend::Sqlite).await;
    let hub = TerminalHub::new(
        db.store().await,
        std::sync::Arc::new(stagehand::clock::SystemClock),
        "instance".into(),
    )
    .start();
    let mut ranking = hub
        .send(Connect {
            terminal_id: "t1".into(),
            experience_id: "e".into(),
            socket_id: "staying".into(),
            bell: Doorbell::default(),
        })
        .await
        .unwrap()
        .ranking;
    // A second display of the same experience closes before it connected.
    hub.send(Disconnect {
        terminal_id: "t2".into(),
        experience_id: "e".into(),
        socket_id: "never-connected".into(),
    })
    .await
    .unwrap();
    assert_eq!(
        hub.send(WatchedExperiences).await.unwrap(),
        vec!["e".to_owned()]
    );
    assert_eq!(hub.send(ConnectedCount).await.unwrap(), 1);
    assert!(
        ranking.has_changed().is_ok(),
        "the staying display's ranking channel was closed"
    );
    // Its own Disconnect, twice, unregisters it once.
    for _ in 0..2 {
        hub.send(Disconnect {
            terminal_id: "t1".into(),
            experience_id: "e".into(),
            socket_id: "staying".into(),
        })
        .await
        .unwrap();
    }
    assert!(hub.send(WatchedExperiences).await.unwrap().is_empty());
    let _ = ranking.borrow_and_update();
}

/// A wake-up that never came is repaired within about a second: an event
/// numbered without ringing this instance's displays (as when another
/// instance's NOTIFY is lost) still reaches the display, through the hub's
/// catch-up tick. Before, the display showed nothing until its terminal's
/// next event.
async fn a_lost_wake_up_costs_a_display_at_most_a_second(backend: Backend) {
    use sea_orm::ConnectionTrait;
    let app = TestApp::spawn(backend).await;
    let slug = app.experience(5).await;
    let (terminal, terminal_token) = app.terminal(&slug).await;
    let mut display = app.terminal_socket(&terminal, &terminal_token, 0).await;
    let (sid, token) = app.session(&slug, Some(&terminal), "first").await;
    let resp = app.submit(&sid, &token, json!({"prompt": "x"}), "k").await;
    assert_eq!(resp.status(), 202);
    let first = display
        .next_session_event(Duration::from_secs(10))
        .await
        .expect("the first event");
    assert_eq!(first["seq"], 1);
    // Another instance numbers an event of this terminal, and its wake-up
    // is lost: the row and the terminal's last_seq change, nothing rings.
    let store = &app.state.store;
    let tx_sql = [
        format!("UPDATE terminals SET last_seq = 2 WHERE id = '{terminal}'"),
        format!(
            "INSERT INTO terminal_events (terminal_id, seq, session_id, saga_id, event_type, \
             payload, created_at_ms) SELECT terminal_id, 2, session_id, saga_id, event_type, \
             payload, created_at_ms FROM terminal_events WHERE terminal_id = '{terminal}' AND seq = 1"
        ),
    ];
    for sql in tx_sql {
        store.db().execute_unprepared(&sql).await.unwrap();
    }
    let started = std::time::Instant::now();
    let second = display
        .next_session_event(Duration::from_secs(5))
        .await
        .expect("the event whose wake-up was lost");
    assert_eq!(second["seq"], 2, "{second}");
    assert!(
        started.elapsed() < Duration::from_millis(2_500),
        "it took {:?}",
        started.elapsed()
    );
    app.stop().await;
}
db_test!(a_lost_wake_up_costs_a_display_at_most_a_second);
