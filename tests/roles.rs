//! Operators with roles (issue 35), black box through HTTP and the
//! operators' WebSocket, on SQLite and on PostgreSQL: what a moderator
//! and a viewer may and may not do (403 `forbidden` naming the role
//! needed, and the refused action leaves everything as it was), a revoked
//! token refused at once and its dashboard closed with 4401 (on the same
//! instance and, on PostgreSQL, on another one within the news' delay,
//! not a poll's), `GET /api/admin/me`, and the creation rules.

mod support;

use std::time::Duration;

use serde_json::{json, Value};
use support::{
    fast_sim, Backend, Frame, Instance, OperatorAccount as Op, Socket, TestApp, TestDb, OPERATOR,
};

const WITHIN: Duration = Duration::from_secs(20);

/// One request with `token` as bearer (none when empty) and an optional
/// JSON body: the status and the JSON body (Null when not JSON).
async fn call(
    http: &reqwest::Client,
    base: &str,
    method: &str,
    path: &str,
    token: &str,
    body: Option<Value>,
) -> (u16, Value) {
    support::api_call(http, base, method, path, token, body, None).await
}

async fn app_call(
    app: &TestApp,
    method: &str,
    path: &str,
    token: &str,
    body: Option<Value>,
) -> (u16, Value) {
    call(&app.http, &app.base, method, path, token, body).await
}

/// Creates an operator with the bootstrap token on `base`.
async fn create_operator(http: &reqwest::Client, base: &str, name: &str, role: &str) -> Op {
    support::create_operator(http, base, OPERATOR, name, role, None).await
}

/// An experience (kind image) with `extra` settings, created with the
/// bootstrap token.
async fn experience(app: &TestApp, extra: Value) -> String {
    let slug = format!("roles-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let mut body = json!({"slug": slug, "title": "Booth", "kind": "image", "max_in_flight": 5});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    let (status, resp) = app_call(app, "POST", "/api/experiences", OPERATOR, Some(body)).await;
    assert_eq!(status, 201, "{resp}");
    slug
}

/// Sessions on `slug`, each submitted: (session id, participant token).
async fn submitted(app: &TestApp, slug: &str, nicknames: &[&str]) -> Vec<(String, String)> {
    let mut sessions = Vec::new();
    for name in nicknames {
        let (sid, token) = app.session(slug, None, name).await;
        let resp = app
            .submit(
                &sid,
                &token,
                json!({"prompt": format!("{name}'s dog")}),
                "k",
            )
            .await;
        assert_eq!(resp.status(), 202);
        sessions.push((sid, token));
    }
    sessions
}

/// The saga's step as the admin view shows it.
async fn saga_step(app: &TestApp, saga_id: &str) -> Value {
    let (status, body) = app
        .operator_get(&format!("/api/admin/sagas/{saga_id}"))
        .await;
    assert_eq!(status, 200, "{body}");
    body["saga"]["step"].clone()
}

/// Asserts a 403 `forbidden` that names the role needed.
fn assert_forbidden(what: &str, (status, body): &(u16, Value), needs: &str) {
    assert_eq!(*status, 403, "{what}: {body}");
    assert_eq!(body["error"], "forbidden", "{what}: {body}");
    assert_eq!(body["needs"], needs, "{what}: {body}");
}

/// Reads the socket until the server closes it; the close as text, or
/// None when it stays open `within`.
async fn closed_within(socket: &mut Socket, within: Duration) -> Option<String> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let left = deadline.checked_duration_since(tokio::time::Instant::now())?;
        match socket.next_frame(left).await {
            Frame::Json(_) => continue,
            Frame::Closed(how) => return Some(how),
            Frame::TimedOut => return None,
        }
    }
}

/// A moderator may read the dashboards and decide what the public sees
/// (approve, reject, hide, unhide, bulk approve/reject); every admin
/// action is 403 naming the admin role, and changes nothing.
async fn a_moderator_decides_but_changes_no_settings(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let slug = experience(&app, json!({"review": "before_display"})).await;
    let mo = create_operator(&app.http, &app.base, "Mo", "moderator").await;
    let victim = create_operator(&app.http, &app.base, "Vic", "viewer").await;
    let t = mo.token.as_str();

    // Reads.
    for path in ["/api/admin/review", "/api/admin/sagas"] {
        let (status, body) = app_call(&app, "GET", path, t, None).await;
        assert_eq!(status, 200, "GET {path}: {body}");
    }

    let sessions = submitted(&app, &slug, &["ann", "bob", "cyd", "dan"]).await;
    let sagas = app.in_review(&sessions).await;
    let (status, body) = app_call(&app, "GET", "/api/admin/review", t, None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["items"].as_array().unwrap().len(), 4, "{body}");

    // Approve and reject, each a real decision.
    let (status, body) = app_call(
        &app,
        "POST",
        &format!("/api/admin/sagas/{}/approve", sagas[0]),
        t,
        None,
    )
    .await;
    assert_eq!(status, 200, "approve: {body}");
    let done = app.wait_final(&sessions[0].0, &sessions[0].1, WITHIN).await;
    assert_eq!(done["status"], "COMPLETED", "{done}");
    let (status, body) = app_call(
        &app,
        "POST",
        &format!("/api/admin/sagas/{}/reject", sagas[1]),
        t,
        None,
    )
    .await;
    assert_eq!(status, 200, "reject: {body}");
    let rejected = app.wait_final(&sessions[1].0, &sessions[1].1, WITHIN).await;
    assert_eq!(rejected["abort_reason"], "REVIEW_REJECTED", "{rejected}");

    // Everything only an admin may do.
    let title_before = app.get_json(&format!("/api/experiences/{slug}")).await["title"].clone();
    let refused: Vec<(&str, String, Option<Value>)> = vec![
        (
            "PATCH",
            format!("/api/experiences/{slug}"),
            Some(json!({"title": "Taken over"})),
        ),
        ("POST", "/api/admin/breaker/open".into(), None),
        ("POST", "/api/admin/breaker/close".into(), None),
        (
            "POST",
            "/api/admin/operators".into(),
            Some(json!({"name": "Sneaky", "role": "admin"})),
        ),
        ("GET", "/api/admin/operators".into(), None),
        (
            "DELETE",
            format!("/api/admin/operators/{}", victim.id),
            None,
        ),
        (
            "DELETE",
            format!("/api/admin/sessions/{}", sessions[3].0),
            None,
        ),
        ("GET", format!("/api/admin/experiences/{slug}/export"), None),
        ("GET", "/api/admin/audit".into(), None),
        (
            "POST",
            format!("/api/admin/sagas/{}/cancel", sagas[2]),
            None,
        ),
        ("POST", format!("/api/admin/sagas/{}/retry", sagas[1]), None),
        (
            "POST",
            "/api/experiences".into(),
            Some(json!({"slug": "mo-made", "title": "x", "kind": "image"})),
        ),
        (
            "POST",
            "/api/terminals".into(),
            Some(json!({"experience": slug, "name": "booth 9"})),
        ),
        (
            "POST",
            "/api/admin/sagas/bulk".into(),
            Some(json!({"action": "retry", "filter": {"experience": slug}})),
        ),
        (
            "POST",
            "/api/admin/sagas/bulk".into(),
            Some(json!({"action": "cancel", "filter": {"experience": slug}})),
        ),
    ];
    for (method, path, body) in refused {
        let answer = app_call(&app, method, &path, t, body.clone()).await;
        assert_forbidden(
            &format!("moderator {method} {path} {body:?}"),
            &answer,
            "admin",
        );
        assert_eq!(
            answer.1["message"],
            format!("this needs the admin role; {} is a moderator", mo.name),
            "{method} {path}"
        );
    }
    // Nothing of it happened.
    assert_eq!(
        app.get_json(&format!("/api/experiences/{slug}")).await["title"],
        title_before
    );
    assert_eq!(
        saga_step(&app, &sagas[2]).await,
        "IN_REVIEW",
        "not cancelled"
    );
    assert_eq!(saga_step(&app, &sagas[1]).await, "ABORTED", "not retried");
    let (_, ops) = app.operator_get("/api/admin/operators").await;
    let names: Vec<&str> = ops["operators"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["Mo", "Vic"], "no operator made by the moderator");
    let vic = ops["operators"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["name"] == "Vic")
        .unwrap();
    assert_eq!(vic["revoked_at"], Value::Null, "not revoked: {vic}");
    let (status, _) = app.operator_get("/api/experiences/mo-made").await;
    assert_eq!(status, 404, "no experience made by the moderator");
    let (_, breaker) = app.operator_get("/api/admin/breaker").await;
    assert_eq!(breaker["state"], "closed", "{breaker}");
    let (_, terminals) = app.operator_get("/api/terminals").await;
    assert_eq!(
        terminals["terminals"].as_array().unwrap().len(),
        0,
        "{terminals}"
    );
    let (_, found) = app.operator_get("/api/admin/sessions?nickname=dan").await;
    let found = found.to_string();
    assert!(
        found.contains(&sessions[3].0),
        "dan's session is not erased: {found}"
    );

    // Hide and unhide.
    let hide = format!("/api/admin/sessions/{}/hide", sessions[0].0);
    let (status, body) = app_call(&app, "POST", &hide, t, None).await;
    assert_eq!(status, 200, "hide: {body}");
    assert_eq!(body["hidden"], true, "{body}");
    let unhide = format!("/api/admin/sessions/{}/unhide", sessions[0].0);
    let (status, body) = app_call(&app, "POST", &unhide, t, None).await;
    assert_eq!(status, 200, "unhide: {body}");
    assert_eq!(body["hidden"], false, "{body}");

    // Bulk approve (and a bulk reject that matches nothing).
    let (status, body) = app_call(
        &app,
        "POST",
        "/api/admin/sagas/bulk",
        t,
        Some(json!({"action": "approve", "filter": {"experience": slug, "step": "IN_REVIEW"}})),
    )
    .await;
    assert_eq!(status, 200, "bulk approve: {body}");
    assert_eq!(
        (body["matched"].as_i64(), body["done"].as_i64()),
        (Some(2), Some(2)),
        "{body}"
    );
    for (sid, token) in &sessions[2..] {
        let done = app.wait_final(sid, token, WITHIN).await;
        assert_eq!(done["status"], "COMPLETED", "{done}");
    }
    let (status, body) = app_call(
        &app,
        "POST",
        "/api/admin/sagas/bulk",
        t,
        Some(json!({"action": "reject", "filter": {"experience": slug, "step": "IN_REVIEW"}})),
    )
    .await;
    assert_eq!(status, 200, "bulk reject: {body}");
    assert_eq!(body["matched"], 0, "{body}");
    app.stop().await;
}
db_test!(a_moderator_decides_but_changes_no_settings);

/// A viewer reads every operator view and opens the dashboard socket, and
/// is refused (403) every write, which then changes nothing.
async fn a_viewer_reads_everything_and_writes_nothing(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let slug = experience(&app, json!({"review": "before_display"})).await;
    let (terminal_id, _) = app.terminal(&slug).await;
    let vi = create_operator(&app.http, &app.base, "Vera", "viewer").await;
    let other = create_operator(&app.http, &app.base, "Otto", "moderator").await;
    let t = vi.token.as_str();
    let sessions = submitted(&app, &slug, &["eve"]).await;
    let saga = app.in_review(&sessions).await.remove(0);
    let sid = sessions[0].0.clone();

    // Writes, with the role each needs.
    let refused: Vec<(&str, String, Option<Value>, &str)> = vec![
        (
            "PATCH",
            format!("/api/experiences/{slug}"),
            Some(json!({"max_in_flight": 1})),
            "admin",
        ),
        (
            "POST",
            "/api/experiences".into(),
            Some(json!({"slug": "vera-made", "title": "x", "kind": "image"})),
            "admin",
        ),
        (
            "POST",
            "/api/terminals".into(),
            Some(json!({"experience": slug, "name": "booth 9"})),
            "admin",
        ),
        (
            "POST",
            format!("/api/admin/sagas/{saga}/approve"),
            None,
            "moderator",
        ),
        (
            "POST",
            format!("/api/admin/sagas/{saga}/reject"),
            None,
            "moderator",
        ),
        (
            "POST",
            format!("/api/admin/sagas/{saga}/cancel"),
            None,
            "admin",
        ),
        (
            "POST",
            format!("/api/admin/sagas/{saga}/retry"),
            None,
            "admin",
        ),
        (
            "POST",
            "/api/admin/sagas/bulk".into(),
            Some(json!({"action": "approve", "filter": {"experience": slug}})),
            "moderator",
        ),
        (
            "POST",
            "/api/admin/sagas/bulk".into(),
            Some(json!({"action": "reject", "filter": {"experience": slug}})),
            "moderator",
        ),
        (
            "POST",
            "/api/admin/sagas/bulk".into(),
            Some(json!({"action": "retry"})),
            "moderator",
        ),
        (
            "POST",
            format!("/api/admin/sessions/{sid}/hide"),
            None,
            "moderator",
        ),
        (
            "POST",
            format!("/api/admin/sessions/{sid}/unhide"),
            None,
            "moderator",
        ),
        (
            "DELETE",
            format!("/api/admin/sessions/{sid}"),
            None,
            "admin",
        ),
        ("POST", "/api/admin/breaker/open".into(), None, "admin"),
        ("POST", "/api/admin/breaker/close".into(), None, "admin"),
        (
            "POST",
            "/api/admin/operators".into(),
            Some(json!({"name": "Vera II", "role": "admin"})),
            "admin",
        ),
        (
            "DELETE",
            format!("/api/admin/operators/{}", other.id),
            None,
            "admin",
        ),
        // The admin's reads.
        ("GET", "/api/admin/operators".into(), None, "admin"),
        ("GET", "/api/admin/audit".into(), None, "admin"),
        (
            "GET",
            format!("/api/admin/experiences/{slug}/export"),
            None,
            "admin",
        ),
    ];
    for (method, path, body, needs) in refused {
        let answer = app_call(&app, method, &path, t, body.clone()).await;
        assert_forbidden(&format!("viewer {method} {path} {body:?}"), &answer, needs);
        assert_eq!(
            answer.1["message"],
            format!("this needs the {needs} role; {} is a viewer", vi.name),
            "{method} {path}"
        );
    }
    // Nothing changed: still in review, still shown, settings as they were.
    assert_eq!(saga_step(&app, &saga).await, "IN_REVIEW");
    let exp = app
        .operator_get(&format!("/api/experiences/{slug}"))
        .await
        .1;
    assert_eq!(exp["max_in_flight"], 5, "{exp}");
    let (_, ops) = app.operator_get("/api/admin/operators").await;
    assert_eq!(ops["operators"].as_array().unwrap().len(), 2, "{ops}");
    assert!(
        ops["operators"]
            .as_array()
            .unwrap()
            .iter()
            .all(|o| o["revoked_at"].is_null()),
        "{ops}"
    );
    let (_, found) = app.operator_get("/api/admin/sessions?nickname=eve").await;
    assert!(found.to_string().contains(&sid), "{found}");
    let (_, breaker) = app.operator_get("/api/admin/breaker").await;
    assert_eq!(breaker["state"], "closed", "{breaker}");

    // Reads.
    let reads = [
        "/api/admin/sagas".to_owned(),
        format!("/api/admin/sagas/{saga}"),
        "/api/admin/review".to_owned(),
        "/api/admin/providers".to_owned(),
        "/api/admin/breaker".to_owned(),
        "/api/terminals".to_owned(),
        "/api/admin/sessions?nickname=eve".to_owned(),
        format!("/api/admin/experiences/{slug}/held"),
        "/api/admin/me".to_owned(),
        "/api/experiences".to_owned(),
        format!("/api/experiences/{slug}"),
    ];
    for path in &reads {
        let (status, body) = app_call(&app, "GET", path, t, None).await;
        assert_eq!(status, 200, "viewer GET {path}: {body}");
    }
    let (_, review) = app_call(&app, "GET", "/api/admin/review", t, None).await;
    assert_eq!(review["items"][0]["saga_id"], saga.as_str(), "{review}");
    let (_, terminals) = app_call(&app, "GET", "/api/terminals", t, None).await;
    assert!(terminals.to_string().contains(&terminal_id), "{terminals}");
    let (_, one) = app_call(&app, "GET", &format!("/api/experiences/{slug}"), t, None).await;
    assert_eq!(
        one["max_in_flight"], 5,
        "an operator's view, all fields: {one}"
    );
    assert_eq!(one["review"], "before_display", "{one}");
    let (_, me) = app_call(&app, "GET", "/api/admin/me", t, None).await;
    assert_eq!(me["role"], "viewer", "{me}");

    // The dashboard socket opens and stays open, with its stats.
    let mut socket = Socket::operators(app.port, t)
        .await
        .expect("a viewer opens the operators' socket");
    let stats = socket.next_of_type("stats", Duration::from_secs(5)).await;
    assert!(stats.is_some(), "the viewer's dashboard gets its stats");
    assert!(
        closed_within(&mut socket, Duration::from_millis(500))
            .await
            .is_none(),
        "the viewer's dashboard stays open"
    );
    app.stop().await;
}
db_test!(a_viewer_reads_everything_and_writes_nothing);

/// A revoked token: refused (401) on the next request, its open dashboard
/// closed with 4401, a new socket refused; revoking again is 200 with the
/// same account; an unknown id 404.
async fn a_revoked_token_is_refused_at_once(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let rev = create_operator(&app.http, &app.base, "Rex", "moderator").await;
    let (status, me) = app_call(&app, "GET", "/api/admin/me", &rev.token, None).await;
    assert_eq!(status, 200, "{me}");
    assert_eq!(me["name"], "Rex", "{me}");
    let (status, body) = app_call(&app, "GET", "/api/admin/sagas", &rev.token, None).await;
    assert_eq!(status, 200, "{body}");
    let mut socket = Socket::operators(app.port, &rev.token)
        .await
        .expect("the operator's dashboard opens");
    // The socket is up (its first stats frame came) before the revocation.
    socket
        .next_of_type("stats", Duration::from_secs(5))
        .await
        .expect("a first stats frame");

    let path = format!("/api/admin/operators/{}", rev.id);
    let (status, first) = app_call(&app, "DELETE", &path, OPERATOR, None).await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["operator_id"], rev.id.as_str(), "{first}");
    assert_eq!(first["name"], "Rex", "{first}");
    assert_eq!(first["role"], "moderator", "{first}");
    assert!(first["revoked_at"].is_string(), "{first}");
    assert!(first.get("token").is_none(), "{first}");

    let (status, body) = app_call(&app, "GET", "/api/admin/me", &rev.token, None).await;
    assert_eq!(status, 401, "{body}");
    assert_eq!(body["error"], "unauthorized", "{body}");
    let (status, body) = app_call(&app, "GET", "/api/admin/sagas", &rev.token, None).await;
    assert_eq!(status, 401, "{body}");

    let closed = closed_within(&mut socket, Duration::from_secs(5))
        .await
        .expect("the revoked operator's dashboard closes within 5 s");
    assert!(closed.contains("4401"), "closed with 4401: {closed}");
    assert!(
        Socket::operators(app.port, &rev.token).await.is_err(),
        "a revoked token opens no dashboard"
    );

    let (status, again) = app_call(&app, "DELETE", &path, OPERATOR, None).await;
    assert_eq!(status, 200, "revoking again: {again}");
    assert_eq!(again, first, "the same account");
    let (status, body) = app_call(
        &app,
        "DELETE",
        &format!("/api/admin/operators/{}", uuid::Uuid::new_v4()),
        OPERATOR,
        None,
    )
    .await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"], "not_found", "{body}");
    let (_, ops) = app.operator_get("/api/admin/operators").await;
    assert_eq!(
        ops["operators"][0]["revoked_at"], first["revoked_at"],
        "{ops}"
    );
    app.stop().await;
}
db_test!(a_revoked_token_is_refused_at_once);

/// Two instances on one PostgreSQL database, each polling only every
/// 10 s: a revocation on A is refused on B at the next request, and B
/// closes the operator's dashboard with 4401 within 3 s, so by the
/// cross-instance news, not by a poll.
#[actix_web::test]
#[cfg_attr(not(pg_tests), ignore = "STAGEHAND_TEST_POSTGRES_URL is not set")]
async fn a_revocation_on_one_instance_closes_the_dashboard_on_another() {
    if support::postgres_admin_url().is_none() {
        eprintln!(
            "SKIPPED a_revocation_on_one_instance_closes_the_dashboard_on_another: \
             it needs two instances on PostgreSQL and STAGEHAND_TEST_POSTGRES_URL is not set"
        );
        return;
    }
    let db = TestDb::fresh(Backend::Postgres).await;
    let sim = support::start_sim(fast_sim()).await;
    let slow_poll = |c: &mut stagehand::config::Config| c.poll_interval = Duration::from_secs(10);
    let a = Instance::start(&db, &sim.url(), slow_poll).await;
    let b = Instance::start(&db, &sim.url(), slow_poll).await;
    let http = reqwest::Client::new();
    let op = create_operator(&http, &a.base, "Remote", "viewer").await;

    let (status, me) = call(&http, &b.base, "GET", "/api/admin/me", &op.token, None).await;
    assert_eq!(status, 200, "B knows the operator A made: {me}");
    assert_eq!(me["operator_id"], op.id.as_str(), "{me}");
    let mut socket = Socket::operators(b.port, &op.token)
        .await
        .expect("the dashboard opens on B");
    socket
        .next_of_type("stats", Duration::from_secs(5))
        .await
        .expect("a first stats frame on B");

    let (status, body) = call(
        &http,
        &a.base,
        "DELETE",
        &format!("/api/admin/operators/{}", op.id),
        OPERATOR,
        None,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let revoked_at = std::time::Instant::now();
    let (status, body) = call(&http, &b.base, "GET", "/api/admin/me", &op.token, None).await;
    assert_eq!(status, 401, "B refuses the revoked token at once: {body}");
    let closed = closed_within(&mut socket, Duration::from_secs(3)).await;
    let took = revoked_at.elapsed();
    let closed = closed.unwrap_or_else(|| {
        panic!("B did not close the revoked operator's dashboard within 3 s of the revocation on A")
    });
    assert!(closed.contains("4401"), "closed with 4401: {closed}");
    eprintln!("B closed the revoked dashboard {took:?} after the revocation on A");
    a.stop().await;
    b.stop().await;
}

/// `GET /api/admin/me`: the bootstrap token is the admin "bootstrap" with
/// no operator id; an account shows its id, name and role.
async fn me_names_the_operator_and_its_role(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let (status, me) = app.operator_get("/api/admin/me").await;
    assert_eq!(status, 200, "{me}");
    assert_eq!(
        me,
        json!({"operator_id": null, "name": "bootstrap", "role": "admin"})
    );
    let mo = create_operator(&app.http, &app.base, "Mina (review desk)", "moderator").await;
    let (status, me) = app_call(&app, "GET", "/api/admin/me", &mo.token, None).await;
    assert_eq!(status, 200, "{me}");
    assert_eq!(
        me,
        json!({"operator_id": mo.id, "name": "Mina (review desk)", "role": "moderator"})
    );
    let (status, body) = app_call(&app, "GET", "/api/admin/me", "not-a-token", None).await;
    assert_eq!(status, 401, "{body}");
    assert_eq!(body["error"], "unauthorized", "{body}");
    let (status, _) = app_call(&app, "GET", "/api/admin/me", "", None).await;
    assert_eq!(status, 401);
    app.stop().await;
}
db_test!(me_names_the_operator_and_its_role);

/// Creation: a bad role, an empty (or blank) name, a name too long, and
/// the name "bootstrap" are 422; the list (oldest first) never holds a
/// token; the token from creation works as a bearer.
async fn creating_operators_checks_name_and_role(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    for (body, why) in [
        (json!({"name": "Root", "role": "root"}), "role"),
        (json!({"name": "Root", "role": "Admin"}), "role"),
        (json!({"name": "", "role": "viewer"}), "name"),
        (json!({"name": "   ", "role": "viewer"}), "name"),
        (json!({"name": "x".repeat(81), "role": "viewer"}), "name"),
        (json!({"name": "bootstrap", "role": "admin"}), "bootstrap"),
        (
            json!({"name": " bootstrap ", "role": "viewer"}),
            "bootstrap",
        ),
    ] {
        let (status, answer) = app_call(
            &app,
            "POST",
            "/api/admin/operators",
            OPERATOR,
            Some(body.clone()),
        )
        .await;
        assert_eq!(status, 422, "{body}: {answer}");
        assert_eq!(answer["error"], "validation_failed", "{body}: {answer}");
        assert!(
            answer["message"].as_str().unwrap_or_default().contains(why),
            "{body}: {answer}"
        );
    }
    let (_, ops) = app.operator_get("/api/admin/operators").await;
    assert_eq!(ops, json!({"operators": []}), "nothing was created");

    let (status, created) = app_call(
        &app,
        "POST",
        "/api/admin/operators",
        OPERATOR,
        Some(json!({"name": "Ada", "role": "admin"})),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    for field in ["operator_id", "name", "role", "token", "created_at"] {
        assert!(created[field].is_string(), "{field} in {created}");
    }
    let ada_token = created["token"].as_str().unwrap().to_owned();
    let vic = create_operator(&app.http, &app.base, "Vic", "viewer").await;
    // Ada (an admin) creates one too.
    let (status, mo) = app_call(
        &app,
        "POST",
        "/api/admin/operators",
        &ada_token,
        Some(json!({"name": "Mo", "role": "moderator"})),
    )
    .await;
    assert_eq!(status, 201, "{mo}");

    let (status, list) = app_call(&app, "GET", "/api/admin/operators", &ada_token, None).await;
    assert_eq!(status, 200, "{list}");
    let text = list.to_string();
    for token in [
        ada_token.as_str(),
        vic.token.as_str(),
        mo["token"].as_str().unwrap(),
    ] {
        assert!(!text.contains(token), "a token in the list: {text}");
    }
    let operators = list["operators"].as_array().unwrap();
    let names: Vec<&str> = operators
        .iter()
        .map(|o| o["name"].as_str().unwrap())
        .collect();
    // Oldest first. Two operators made within one millisecond have the
    // same time, and their order between them is not specified.
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(sorted, ["Ada", "Mo", "Vic"], "{list}");
    let times: Vec<&str> = operators
        .iter()
        .map(|o| o["created_at"].as_str().unwrap())
        .collect();
    assert!(
        times.windows(2).all(|w| w[0] <= w[1]),
        "oldest first: {list}"
    );
    for o in operators {
        assert!(o.get("token").is_none(), "{o}");
        let mut keys: Vec<&str> = o.as_object().unwrap().keys().map(String::as_str).collect();
        keys.sort();
        assert_eq!(
            keys,
            [
                "created_at",
                "created_by",
                "name",
                "operator_id",
                "revoked_at",
                "role"
            ],
            "{o}"
        );
    }
    assert_eq!(operators[0]["created_by"], "bootstrap");
    assert_eq!(operators[2]["created_by"], "Ada");
    assert_eq!(operators[2]["role"], "moderator");

    // Each token works as a bearer, with its role.
    let (status, me) = app_call(&app, "GET", "/api/admin/me", &ada_token, None).await;
    assert_eq!((status, me["role"].as_str()), (200, Some("admin")), "{me}");
    let (status, me) = app_call(
        &app,
        "GET",
        "/api/admin/me",
        mo["token"].as_str().unwrap(),
        None,
    )
    .await;
    assert_eq!((status, me["name"].as_str()), (200, Some("Mo")), "{me}");
    let slug = format!("ada-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let (status, body) = app_call(
        &app,
        "POST",
        "/api/experiences",
        &ada_token,
        Some(json!({"slug": slug, "title": "Ada's", "kind": "image"})),
    )
    .await;
    assert_eq!(status, 201, "an admin account creates experiences: {body}");
    app.stop().await;
}
db_test!(creating_operators_checks_name_and_role);
