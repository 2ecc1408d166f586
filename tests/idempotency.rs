//! The Idempotency-Key edge, on SQLite and on PostgreSQL: the anonymous key
//! rule, keys per caller and endpoint, the takeover of a record whose
//! request died, and database errors classified once — a lock held by
//! another connection is transient (retried, then 503 with Retry-After, and
//! the key is not pinned), a unique violation is a duplicate. Expired
//! records are purged in bounded batches.

mod support;

use std::time::Duration;

use sea_orm::{ConnectionTrait, Database, DatabaseTransaction, TransactionTrait};
use serde_json::{json, Value};
use stagehand::http::idempotency::key_request;
use stagehand::store::idempotency::{KeyClaim, StoredAnswer, KEY_LEASE_MS};
use stagehand::store::{DbFailure, Store};
use support::{fast_sim, Backend, TestApp, TestDb, OPERATOR};

const T0: i64 = 1_800_000_000_000;
const DAY: i64 = 24 * 3_600_000;

async fn create_session(app: &TestApp, slug: &str, key: Option<&str>) -> (u16, bool, Value) {
    let mut req = app
        .http
        .post(format!("{}/api/experiences/{slug}/sessions", app.base))
        .json(&json!({"nickname": "same"}));
    if let Some(key) = key {
        req = req.header("Idempotency-Key", key);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let replayed = resp.headers().get("Idempotent-Replayed").is_some();
    (status, replayed, resp.json().await.unwrap_or(Value::Null))
}

/// Session creation has no caller token: a guessable key (the README's old
/// `1`) is refused, so two phones can never share a participant token; a
/// UUID or 32+ hex digits is replayed to whoever holds it.
async fn anonymous_keys_must_be_unguessable(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let slug = app.experience(5).await;
    for weak in [
        "1",
        "abc",
        "0123456789abcdef0123456789abcde",
        "not-a-uuid-but-long-enough-0000000",
    ] {
        let (status, _, body) = create_session(&app, &slug, Some(weak)).await;
        assert_eq!(status, 400, "{weak}: {body}");
        assert_eq!(body["error"], "idempotency_key_too_weak");
        assert!(body["message"].as_str().unwrap().contains("122"));
    }
    for strong in [
        uuid::Uuid::new_v4().to_string(),
        uuid::Uuid::new_v4().simple().to_string(),
        format!("{}{}", uuid::Uuid::new_v4().simple(), "ff"),
    ] {
        let (status, replayed, first) = create_session(&app, &slug, Some(&strong)).await;
        assert_eq!((status, replayed), (201, false), "{first}");
        let (status, replayed, again) = create_session(&app, &slug, Some(&strong)).await;
        assert_eq!((status, replayed), (201, true));
        assert_eq!(again, first, "the holder of the key gets its answer again");
    }
    let (a, b) = (
        create_session(&app, &slug, None).await,
        create_session(&app, &slug, None).await,
    );
    assert_eq!((a.0, b.0), (201, 201));
    assert_ne!(a.2["participant_token"], b.2["participant_token"]);
    app.stop().await;
}
db_test!(anonymous_keys_must_be_unguessable);

/// One operator key on two endpoints is two requests.
async fn operator_keys_are_per_endpoint(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let key = "same-key";
    let slug = format!(
        "per-endpoint-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..6]
    );
    let experience = app
        .http
        .post(format!("{}/api/experiences", app.base))
        .bearer_auth(OPERATOR)
        .header("Idempotency-Key", key)
        .json(&json!({"slug": slug, "title": "t", "kind": "comic"}))
        .send()
        .await
        .unwrap();
    assert_eq!(experience.status(), 201);
    let terminal = app
        .http
        .post(format!("{}/api/terminals", app.base))
        .bearer_auth(OPERATOR)
        .header("Idempotency-Key", key)
        .json(&json!({"experience": slug, "name": "booth"}))
        .send()
        .await
        .unwrap();
    assert_eq!(terminal.status(), 201, "{:?}", terminal.text().await);
    app.stop().await;
}
db_test!(operator_keys_are_per_endpoint);

/// A request that took its key and died leaves it IN_PROGRESS: retries get
/// 409 until its lease runs out, then one takes it over and runs. The dead
/// request's late write of its answer changes nothing.
async fn a_dead_requests_key_is_taken_over_after_its_lease(backend: Backend) {
    let db = TestDb::fresh(backend).await;
    let store = db.store().await;
    let dead = key_request("anonymous /x", "k", "", b"{}");
    assert_eq!(
        store.claim_key(&dead, T0, DAY).await.unwrap(),
        KeyClaim::Fresh
    );
    let retry = key_request("anonymous /x", "k", "", b"{}");
    assert_eq!(
        store
            .claim_key(&retry, T0 + KEY_LEASE_MS - 1, DAY)
            .await
            .unwrap(),
        KeyClaim::InProgress,
        "within the lease the first request may still answer"
    );
    let late = key_request("anonymous /x", "k", "", b"{}");
    assert_eq!(
        store
            .claim_key(&late, T0 + KEY_LEASE_MS + 1, DAY)
            .await
            .unwrap(),
        KeyClaim::Fresh,
        "past the lease a retry takes the key over"
    );
    let stale_answer = StoredAnswer {
        status: 201,
        body: "{\"from\":\"dead\"}".into(),
    };
    store.finish_key(&dead, &stale_answer).await.unwrap();
    store.release_keys(&[&dead]).await.unwrap();
    let answer = StoredAnswer {
        status: 201,
        body: "{\"from\":\"late\"}".into(),
    };
    store.finish_key(&late, &answer).await.unwrap();
    let again = key_request("anonymous /x", "k", "", b"{}");
    assert_eq!(
        store
            .claim_key(&again, T0 + KEY_LEASE_MS + 2, DAY)
            .await
            .unwrap(),
        KeyClaim::Replay(answer),
        "the owner's answer, not the dead request's"
    );
}
db_test!(a_dead_requests_key_is_taken_over_after_its_lease);

/// The same through HTTP: a key left IN_PROGRESS by a request that died
/// (taken an hour ago) does not pin the session creation.
async fn a_pinned_key_does_not_block_a_retry(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let slug = app.experience(5).await;
    let key = uuid::Uuid::new_v4().to_string();
    let body = serde_json::to_vec(&json!({"nickname": "same"})).unwrap();
    let path = format!("/api/experiences/{slug}/sessions");
    let died = key_request(&format!("anonymous {path}"), &key, "", &body);
    let an_hour_ago = app.state.clock.now_ms() - 3_600_000;
    assert_eq!(
        app.state
            .store
            .claim_key(&died, an_hour_ago, DAY)
            .await
            .unwrap(),
        KeyClaim::Fresh
    );
    let (status, replayed, created) = create_session(&app, &slug, Some(&key)).await;
    assert_eq!((status, replayed), (201, false), "{created}");
    app.stop().await;
}
db_test!(a_pinned_key_does_not_block_a_retry);

/// A request that runs longer than its key's lease (a bulk action over
/// thousands of sagas) keeps its key while it runs: the same request sent
/// again past the first lease is answered 409 `request_in_progress`, never
/// run a second time. The request's lease is renewed while it runs (a
/// bulk `retry` run twice would retry and charge again).
async fn a_long_request_keeps_its_key_while_it_runs(backend: Backend) {
    use stagehand::http::error::ApiError;
    use stagehand::http::idempotency::{run_idempotent, Reply, KEY_RENEW_EVERY};

    let t0 = 1_800_000_000_000;
    let clock = stagehand::clock::ManualClock::new(t0);
    let app = TestApp::spawn_with_clock(backend, fast_sim(), |_| {}, clock.clone()).await;
    let state = app.state.clone();
    let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
    let first = {
        let state = state.clone();
        actix_web::rt::spawn(async move {
            let mut done = Some(done_rx);
            run_idempotent(&state, "bulk", OPERATOR, Some("k".into()), b"{}", || {
                let done = done.take();
                async move {
                    if let Some(done) = done {
                        let _ = done.await;
                    }
                    Ok(Reply {
                        status: actix_web::http::StatusCode::OK,
                        body: json!({"run": 1}),
                    })
                }
            })
            .await
        })
    };
    // The first request has its key; its clock moves on past the lease.
    let store = app.db.store().await;
    let lease_of = || async {
        store
            .db()
            .query_one_raw(store.sql(
                "SELECT locked_until_ms FROM idempotency_records WHERE scope = 'bulk'",
                vec![],
            ))
            .await
            .unwrap()
            .and_then(|r| r.try_get_by_index::<Option<i64>>(0).ok().flatten())
    };
    let taken = support::wait_for(Duration::from_secs(5), || async { lease_of().await }).await;
    assert_eq!(
        taken,
        Some(t0 + KEY_LEASE_MS),
        "the first request took the key"
    );
    clock.advance_ms(KEY_LEASE_MS - 1_000);
    let renewed = support::wait_for(KEY_RENEW_EVERY * 3, || async {
        lease_of().await.filter(|&until| until > t0 + KEY_LEASE_MS)
    })
    .await;
    assert!(
        renewed.is_some(),
        "the running request's key was not renewed"
    );
    clock.advance_ms(2_000);
    let second = run_idempotent(
        &state,
        "bulk",
        OPERATOR,
        Some("k".into()),
        b"{}",
        || async {
            Ok(Reply {
                status: actix_web::http::StatusCode::OK,
                body: json!({"run": 2}),
            })
        },
    )
    .await;
    assert!(
        matches!(second, Err(ApiError::RequestInProgress)),
        "the same request past the first lease ran again: {:?}",
        second.map(|(r, replayed)| (r.body, replayed))
    );
    done_tx.send(()).unwrap();
    let (reply, replayed) = first.await.unwrap().unwrap();
    assert_eq!((reply.body, replayed), (json!({"run": 1}), false));
    app.stop().await;
}
db_test!(a_long_request_keeps_its_key_while_it_runs);

/// Another connection holds a lock on the experiences table (SQLite: the
/// write lock). A create waits the lock timeout, is retried, and is then
/// answered 503 `busy` with `Retry-After`; its key is released, so the
/// same request succeeds once the lock is gone. The store says the error
/// is transient; a duplicate row is a duplicate.
async fn a_held_lock_is_transient_and_a_unique_violation_a_duplicate(backend: Backend) {
    let app = TestApp::spawn_with(backend, fast_sim(), |config| {
        config.db_lock_timeout = Duration::from_millis(100);
    })
    .await;
    let holder = Database::connect(&app.db.url).await.unwrap();
    let lock = hold_write_lock(&holder, backend).await;

    let store = Store::connect_with(&app.db.url, 2, Some(Duration::from_millis(100)))
        .await
        .unwrap();
    let blocked = store
        .db()
        .execute_unprepared(
            "INSERT INTO experiences (id, slug, title, kind, ai_calls, max_in_flight, locale, \
             created_at_ms) VALUES ('x', 'x', 'x', 'comic', 1, 1, 'en', 0)",
        )
        .await
        .map_err(stagehand::store::StoreError::from)
        .unwrap_err();
    assert_eq!(blocked.failure(), DbFailure::Transient, "{blocked}");

    let key = "create-while-locked";
    let body = json!({"slug": "locked", "title": "t", "kind": "comic"});
    let post = || {
        app.http
            .post(format!("{}/api/experiences", app.base))
            .bearer_auth(OPERATOR)
            .header("Idempotency-Key", key)
            .json(&body)
            .send()
    };
    let busy = post().await.unwrap();
    assert_eq!(busy.status(), 503);
    assert_eq!(busy.headers()["retry-after"], "1");
    let error: Value = busy.json().await.unwrap();
    assert_eq!(error["error"], "busy");

    lock.rollback().await.unwrap();
    let created = post().await.unwrap();
    assert_eq!(created.status(), 201, "the key was not pinned by the 503");

    let duplicate = store
        .db()
        .execute_unprepared(
            "INSERT INTO experiences (id, slug, title, kind, ai_calls, max_in_flight, locale, \
             created_at_ms) VALUES ('y', 'locked', 'x', 'comic', 1, 1, 'en', 0)",
        )
        .await
        .map_err(stagehand::store::StoreError::from)
        .unwrap_err();
    assert_eq!(duplicate.failure(), DbFailure::Duplicate, "{duplicate}");
    // A data error is permanent (PostgreSQL's 22021 once read as SQLite BUSY).
    let data_error = match backend {
        Backend::Postgres => "SELECT convert_from('\\x00'::bytea, 'UTF8')",
        Backend::Sqlite => "SELECT abs(-9223372036854775808)",
    };
    let bad = store
        .db()
        .execute_unprepared(data_error)
        .await
        .map_err(stagehand::store::StoreError::from)
        .unwrap_err();
    assert_eq!(bad.failure(), DbFailure::Other, "{bad}");
    let taken = post().await.unwrap();
    assert_eq!(taken.status(), 201, "a replay, not a second insert");
    assert!(taken.headers().get("Idempotent-Replayed").is_some());
    app.stop().await;
}
db_test!(a_held_lock_is_transient_and_a_unique_violation_a_duplicate);

/// A transaction on `conn` that holds what an insert into `experiences`
/// needs: the table (PostgreSQL) or the database's write lock (SQLite).
async fn hold_write_lock(
    conn: &sea_orm::DatabaseConnection,
    backend: Backend,
) -> DatabaseTransaction {
    let tx = conn.begin().await.unwrap();
    let sql = match backend {
        Backend::Postgres => "LOCK TABLE experiences IN ACCESS EXCLUSIVE MODE",
        Backend::Sqlite => "CREATE TABLE lock_holder (x INTEGER)",
    };
    tx.execute_unprepared(sql).await.unwrap();
    tx
}

/// 2,500 expired records and 10 live ones: purged 1,000 at a time, the live
/// ones kept.
async fn expired_keys_are_purged_in_bounded_batches(backend: Backend) {
    let db = TestDb::fresh(backend).await;
    let store = db.store().await;
    let old: Vec<_> = (0..2_500)
        .map(|i| key_request("s", &format!("old-{i}"), "", b""))
        .collect();
    for chunk in old.chunks(500) {
        store.claim_keys(chunk, T0, DAY).await.unwrap();
    }
    let live: Vec<_> = (0..10)
        .map(|i| key_request("s", &format!("live-{i}"), "", b""))
        .collect();
    store.claim_keys(&live, T0 + DAY, DAY).await.unwrap();
    let now = T0 + DAY + 1;
    let mut batches = Vec::new();
    loop {
        let n = store.purge_expired_keys(now, 1_000).await.unwrap();
        batches.push(n);
        if n < 1_000 {
            break;
        }
    }
    assert_eq!(batches, vec![1_000, 1_000, 500]);
    let left = store
        .db()
        .query_one_raw(store.sql("SELECT COUNT(*) FROM idempotency_records", vec![]))
        .await
        .unwrap()
        .unwrap()
        .try_get_by_index::<i64>(0)
        .unwrap();
    assert_eq!(left, 10);
}
db_test!(expired_keys_are_purged_in_bounded_batches);

/// Keys are any visible text: on PostgreSQL a batch's keys travel as one
/// array literal, so quotes, backslashes, braces and commas must come
/// back as they went, and a repeat gets the stored answer.
async fn keys_with_quotes_and_braces_replay(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let slug = app.experience(5).await;
    for (i, key) in [r#"a"b"#, r#"c\d"#, "{e,f}", "NULL", r#" "\{,}"#]
        .iter()
        .enumerate()
    {
        let (sid, tok) = app.session(&slug, None, &format!("odd{i}")).await;
        let body = json!({"prompt": "odd key"});
        let first = app.submit(&sid, &tok, body.clone(), key).await;
        assert_eq!(first.status().as_u16(), 202, "{key}");
        assert!(first.headers().get("Idempotent-Replayed").is_none());
        let first: Value = first.json().await.unwrap();
        let again = app.submit(&sid, &tok, body, key).await;
        assert_eq!(again.status().as_u16(), 202, "{key}");
        assert!(
            again.headers().get("Idempotent-Replayed").is_some(),
            "the repeat of {key} is the stored answer"
        );
        let again: Value = again.json().await.unwrap();
        assert_eq!(again["saga_id"], first["saga_id"], "{key}");
    }
    app.stop().await;
}
db_test!(keys_with_quotes_and_braces_replay);

/// A key claim commits (another connection finds it taken) and, on
/// PostgreSQL, its commit skips the WAL flush only for itself: the one
/// pooled connection it ran on still commits synchronously afterwards, so
/// the request's own transaction flushes the claim with its commit.
async fn a_claim_commits_and_leaves_its_connection_flushing(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let store = Store::connect_with(&app.db.url, 1, None).await.unwrap();
    let claim = key_request("session:s1", "k1", "token", b"{}");
    let now = chrono::Utc::now().timestamp_millis();
    let claims = store
        .claim_keys(std::slice::from_ref(&claim), now, DAY)
        .await
        .unwrap();
    assert_eq!(claims, vec![KeyClaim::Fresh]);
    let other = &app.state.store;
    let again = other.claim_keys(&[claim], now, DAY).await.unwrap();
    assert_eq!(again, vec![KeyClaim::InProgress], "the claim was committed");
    if backend == Backend::Postgres {
        let setting = store
            .db()
            .query_one_raw(store.sql("SHOW synchronous_commit", vec![]))
            .await
            .unwrap()
            .unwrap()
            .try_get_by_index::<String>(0)
            .unwrap();
        assert_eq!(
            setting, "on",
            "the claim's setting outlived its transaction"
        );
    }
    app.stop().await;
}
db_test!(a_claim_commits_and_leaves_its_connection_flushing);

/// The same submission fired 50 times at once: one saga, and every answer
/// is that 202 (once fresh, the rest replays) or 409 `request_in_progress`.
/// Then 20 submissions with 20 different keys at once on a new session:
/// one 202, the others 409 `already_submitted`.
async fn duplicates_fired_at_once_make_one_saga(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let slug = app.experience(5).await;
    let (sid, tok) = app.session(&slug, None, "dup").await;
    let body = json!({"prompt": "once"});
    let answers = futures_util::future::join_all(
        (0..50).map(|_| app.submit(&sid, &tok, body.clone(), "the-key")),
    )
    .await;
    let mut fresh = 0;
    let mut saga_ids = std::collections::HashSet::new();
    for resp in answers {
        let status = resp.status().as_u16();
        let replayed = resp.headers().get("Idempotent-Replayed").is_some();
        let body: Value = resp.json().await.unwrap();
        match status {
            202 => {
                fresh += usize::from(!replayed);
                saga_ids.insert(body["saga_id"].as_str().unwrap().to_owned());
            }
            409 => assert_eq!(body["error"], "request_in_progress", "{body}"),
            other => panic!("answer {other}: {body}"),
        }
    }
    assert_eq!(fresh, 1, "exactly one request ran");
    assert_eq!(saga_ids.len(), 1, "every 202 names the same saga");
    let (_, list) = app
        .operator_get(&format!("/api/admin/sagas?experience={slug}"))
        .await;
    assert_eq!(list["sagas"].as_array().unwrap().len(), 1);

    let (sid, tok) = app.session(&slug, None, "mixed").await;
    let keys: Vec<String> = (0..20).map(|i| format!("key-{i}")).collect();
    let answers = futures_util::future::join_all(
        keys.iter()
            .map(|key| app.submit(&sid, &tok, json!({"prompt": "x"}), key)),
    )
    .await;
    let mut statuses: Vec<u16> = answers.iter().map(|r| r.status().as_u16()).collect();
    statuses.sort();
    assert_eq!(statuses[0], 202);
    assert!(statuses[1..].iter().all(|&s| s == 409), "{statuses:?}");
    app.stop().await;
}
db_test!(duplicates_fired_at_once_make_one_saga);

/// A submission whose key already has a record, while its session still
/// takes a submission, is decided by that record, never by the session:
/// a key held by a request that died a second ago (its lease runs) answers
/// 409 `request_in_progress`; a key whose body was refused (422) answers
/// that again for the same body and 422 `idempotency_key_reused` for
/// another; a record past its time is taken over and runs. Only that last
/// one starts a saga. (On PostgreSQL a batch first tries to record its
/// keys in the statement that writes its sagas, without claiming them:
/// these are the keys that statement must leave to the claim.)
async fn a_submission_key_with_a_record_is_decided_by_it(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let slug = app.experience(5).await;
    let (sid, tok) = app.session(&slug, None, "keyed").await;
    let scope = format!("session:{sid}");
    let now = app.state.clock.now_ms();
    let body = json!({"prompt": "held"});
    let held = key_request(&scope, "held", &tok, &serde_json::to_vec(&body).unwrap());
    let claim = app.state.store.claim_key(&held, now - 1_000, DAY).await;
    assert_eq!(claim.unwrap(), KeyClaim::Fresh);
    let resp = app.submit(&sid, &tok, body, "held").await;
    assert_eq!(resp.status().as_u16(), 409);
    let answer: Value = resp.json().await.unwrap();
    assert_eq!(answer["error"], "request_in_progress", "{answer}");

    let resp = app
        .submit(&sid, &tok, json!({"prompt": ""}), "refused")
        .await;
    assert_eq!(resp.status().as_u16(), 422);
    let resp = app
        .submit(&sid, &tok, json!({"prompt": ""}), "refused")
        .await;
    assert_eq!(resp.status().as_u16(), 422);
    assert!(
        resp.headers().get("Idempotent-Replayed").is_some(),
        "the refusal is answered again"
    );
    let resp = app
        .submit(&sid, &tok, json!({"prompt": "ok"}), "refused")
        .await;
    assert_eq!(resp.status().as_u16(), 422);
    let answer: Value = resp.json().await.unwrap();
    assert_eq!(answer["error"], "idempotency_key_reused", "{answer}");
    let (_, list) = app
        .operator_get(&format!("/api/admin/sagas?experience={slug}"))
        .await;
    assert_eq!(list["sagas"].as_array().unwrap().len(), 0, "{list}");

    let body = json!({"prompt": "late"});
    let old = key_request(&scope, "old", &tok, &serde_json::to_vec(&body).unwrap());
    let claim = app.state.store.claim_key(&old, now - 2 * DAY, DAY).await;
    assert_eq!(claim.unwrap(), KeyClaim::Fresh);
    let resp = app.submit(&sid, &tok, body, "old").await;
    assert_eq!(resp.status().as_u16(), 202);
    assert!(resp.headers().get("Idempotent-Replayed").is_none());
    let (_, list) = app
        .operator_get(&format!("/api/admin/sagas?experience={slug}"))
        .await;
    assert_eq!(list["sagas"].as_array().unwrap().len(), 1, "{list}");
    app.stop().await;
}
db_test!(a_submission_key_with_a_record_is_decided_by_it);

/// After a flow in which every create carries an Idempotency-Key (as the
/// pages always send), no token the server issued, nor the operator's, nor
/// any Idempotency-Key, is anywhere in the database: not in the SQLite file
/// and its WAL, not in a `pg_dump`. Replays still hand each caller its
/// answer. Before, every 201 with a token was kept in clear for 24 h as
/// the key's replay body (5 of 5 tokens were found in the file).
async fn no_token_is_stored_in_clear(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let (http, base) = (&app.http, app.base.as_str());
    let post = |path: String, bearer: Option<String>, key: String, body: Value| {
        let http = http.clone();
        async move {
            let mut req = http
                .post(format!("{base}{path}"))
                .header("Idempotency-Key", key)
                .json(&body);
            if let Some(bearer) = bearer {
                req = req.bearer_auth(bearer);
            }
            let resp = req.send().await.expect("POST");
            let replayed = resp.headers().contains_key("idempotent-replayed");
            (
                resp.status().as_u16(),
                replayed,
                resp.json::<Value>().await.unwrap(),
            )
        }
    };
    let operator = Some(OPERATOR.to_owned());
    let mut secrets: Vec<String> = vec![OPERATOR.to_owned()];
    let experience_key = "experience-key-1".to_owned();
    let body = json!({"slug": "sealed", "title": "Sealed", "kind": "image"});
    let (status, _, _) = post(
        "/api/experiences".into(),
        operator.clone(),
        experience_key.clone(),
        body,
    )
    .await;
    assert_eq!(status, 201);
    secrets.push(experience_key);
    let mut tokens = Vec::new();
    for i in 0..2 {
        let key = format!("terminal-key-{i}");
        let body = json!({"experience": "sealed", "name": format!("booth {i}")});
        let (status, _, first) = post(
            "/api/terminals".into(),
            operator.clone(),
            key.clone(),
            body.clone(),
        )
        .await;
        assert_eq!(status, 201);
        let (status, replayed, again) =
            post("/api/terminals".into(), operator.clone(), key.clone(), body).await;
        assert_eq!((status, replayed), (201, true));
        assert_eq!(
            again["token"], first["token"],
            "the replay hands the operator the same token"
        );
        tokens.push(first["token"].as_str().unwrap().to_owned());
        secrets.push(key);
    }
    for i in 0..3 {
        let key = uuid::Uuid::new_v4().to_string();
        let body = json!({"nickname": format!("p{i}")});
        let path = "/api/experiences/sealed/sessions".to_owned();
        let (status, _, first) = post(path.clone(), None, key.clone(), body.clone()).await;
        assert_eq!(status, 201);
        let (status, replayed, again) = post(path, None, key.clone(), body).await;
        assert_eq!((status, replayed), (201, true));
        assert_eq!(again["participant_token"], first["participant_token"]);
        let (sid, token) = (
            first["session_id"].as_str().unwrap().to_owned(),
            first["participant_token"].as_str().unwrap().to_owned(),
        );
        let submit_key = format!("submit-key-{i}");
        let (status, _, _) = post(
            format!("/api/sessions/{sid}/submission"),
            Some(token.clone()),
            submit_key.clone(),
            json!({"prompt": "a cat"}),
        )
        .await;
        assert_eq!(status, 202);
        tokens.push(token);
        secrets.push(key);
        secrets.push(submit_key);
    }
    assert_eq!(tokens.len(), 5);
    secrets.extend(tokens);
    // Everything the database holds, as bytes.
    let stored: Vec<u8> = match backend {
        Backend::Sqlite => {
            let file = app.db.url.trim_start_matches("sqlite://");
            let file = file.split('?').next().unwrap().to_owned();
            let mut bytes = Vec::new();
            for suffix in ["", "-wal", "-shm"] {
                if let Ok(b) = std::fs::read(format!("{file}{suffix}")) {
                    bytes.extend(b);
                }
            }
            assert!(!bytes.is_empty());
            bytes
        }
        Backend::Postgres => {
            let out = std::process::Command::new("pg_dump")
                .arg("--data-only")
                .arg(&app.db.url)
                .output()
                .expect("pg_dump runs");
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            out.stdout
        }
    };
    let text = String::from_utf8_lossy(&stored);
    for secret in &secrets {
        assert!(
            !text.contains(secret.as_str()),
            "{secret:?} is stored in clear"
        );
    }
    app.stop().await;
}
db_test!(no_token_is_stored_in_clear);

/// A key whose request died with its instance is taken over at once when
/// the instance is known dead (PostgreSQL: its liveness row is gone or
/// stale), not at the end of the key's 30 s lease; a key held by a live
/// instance still answers 409. Before, a phone got 409
/// `request_in_progress` for up to 30 s after a kill -9.
#[actix_web::test]
#[cfg_attr(not(pg_tests), ignore = "STAGEHAND_TEST_POSTGRES_URL is not set")]
async fn a_key_of_a_dead_instance_is_taken_over_at_once() {
    let app = TestApp::spawn(Backend::Postgres).await;
    let slug = app.experience(5).await;
    let path = format!("/api/experiences/{slug}/sessions");
    let scope = format!("anonymous {path}");
    let store = &app.state.store;
    let now = chrono::Utc::now().timestamp_millis();
    let hold = |key: &str, instance: &str| {
        store.sql(
            "INSERT INTO idempotency_records (scope, key, request_hash, state, created_at_ms, \
             expires_at_ms, owner, locked_until_ms, instance_id) \
             VALUES ($1, $2, $7, 'in_progress', $3, $4, 'a-request', $5, $6)",
            vec![
                scope.clone().into(),
                stagehand::domain::keys::idempotency_key_digest(&scope, key).into(),
                now.into(),
                (now + 86_400_000).into(),
                (now + 30_000).into(),
                instance.into(),
                // The same body as the retry below.
                stagehand::http::body::request_hash(br#"{"nickname":"retry"}"#).into(),
            ],
        )
    };
    let (dead_key, live_key) = (
        uuid::Uuid::new_v4().to_string(),
        uuid::Uuid::new_v4().to_string(),
    );
    store
        .db()
        .execute_raw(hold(&dead_key, "an-instance-killed-9"))
        .await
        .unwrap();
    store
        .db()
        .execute_raw(hold(&live_key, &app.state.instance_id))
        .await
        .unwrap();
    let create = |key: String| {
        let (http, url) = (app.http.clone(), format!("{}{path}", app.base));
        async move {
            http.post(url)
                .header("Idempotency-Key", key)
                .json(&json!({"nickname": "retry"}))
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    assert_eq!(
        create(dead_key).await,
        201,
        "the dead instance's key is taken over"
    );
    assert_eq!(
        create(live_key).await,
        409,
        "a live instance's key is still in progress"
    );
    app.stop().await;
}
