//! The operators' audit trail (issue 35), black box through HTTP: a
//! scripted hour of operator actions comes back newest first, paged and
//! filtered, each record naming who, what and on what, and the
//! experience's export carries its records (audit.csv); no token (nor a
//! guest's prompt) is ever stored in the database or shown in a record; a
//! refused action leaves no record; and the cleanup drops records past
//! `audit_retention`.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::{json, Value};
use support::{fast_sim, Backend, OperatorAccount as Op, TestApp, OPERATOR};

const WITHIN: Duration = Duration::from_secs(20);

/// One expected record: (operator name, action, target).
type Entry = (String, String, String);

fn entry(operator: &str, action: &str, target: impl Into<String>) -> Entry {
    (operator.to_owned(), action.to_owned(), target.into())
}

/// One request to the app with `token` as bearer, an optional JSON body
/// and an optional Idempotency-Key.
async fn call_keyed(
    app: &TestApp,
    method: &str,
    path: &str,
    token: &str,
    body: Option<Value>,
    key: Option<&str>,
) -> (u16, Value) {
    support::api_call(&app.http, &app.base, method, path, token, body, key).await
}

async fn call(
    app: &TestApp,
    method: &str,
    path: &str,
    token: &str,
    body: Option<Value>,
) -> (u16, Value) {
    call_keyed(app, method, path, token, body, None).await
}

/// Creates an operator with `by`'s token.
async fn create_operator(app: &TestApp, by: &str, name: &str, role: &str, key: Option<&str>) -> Op {
    support::create_operator(&app.http, &app.base, by, name, role, key).await
}

/// Waits until the wall clock (the application's) is past the
/// millisecond it shows now, so that the next action's record is stamped
/// strictly later than every record before it (the trail orders by time,
/// then by a random id).
async fn next_millisecond() {
    let now = chrono::Utc::now().timestamp_millis();
    support::wait_for(Duration::from_secs(1), || async move {
        (chrono::Utc::now().timestamp_millis() > now).then_some(())
    })
    .await
    .expect("the clock moves on");
}

/// The whole trail (or a filtered one), newest first, read with `token`
/// a page of `limit` at a time following `next` until it is null.
async fn audit_all(app: &TestApp, token: &str, filter: &str, limit: u64) -> Vec<Value> {
    let mut items = Vec::new();
    let mut after: Option<String> = None;
    for _ in 0..1_000 {
        let mut path = format!("/api/admin/audit?limit={limit}{filter}");
        if let Some(after) = &after {
            path.push_str(&format!("&after={}", urlencoding(after)));
        }
        let (status, page) = call(app, "GET", &path, token, None).await;
        assert_eq!(status, 200, "GET {path}: {page}");
        let got = page["items"].as_array().expect("items").clone();
        assert!(got.len() as u64 <= limit, "{page}");
        items.extend(got);
        match page["next"].as_str() {
            Some(next) => after = Some(next.to_owned()),
            None => {
                assert!(page["next"].is_null(), "{page}");
                return items;
            }
        }
    }
    panic!("the trail's pages never ended");
}

/// `text` encoded as a query string value (the URL crate's encoder).
fn urlencoding(text: &str) -> String {
    let mut url = reqwest::Url::parse("http://query.invalid/").expect("a URL");
    url.query_pairs_mut().append_pair("v", text);
    url.query().unwrap_or_default()["v=".len()..].to_owned()
}

fn as_entry(item: &Value) -> Entry {
    (
        item["operator"].as_str().unwrap_or("?").to_owned(),
        item["action"].as_str().unwrap_or("?").to_owned(),
        item["target"].as_str().unwrap_or("?").to_owned(),
    )
}

/// Checks `items` (newest first) against `groups` (oldest first; the
/// records of one group share an action, so their order among themselves
/// is not asserted).
fn assert_trail(items: &[Value], groups: &[Vec<Entry>], what: &str) {
    let expected_len: usize = groups.iter().map(Vec::len).sum();
    let shown: Vec<Entry> = items.iter().map(as_entry).collect();
    assert_eq!(
        items.len(),
        expected_len,
        "{what}: {} records, expected {expected_len}:\n{shown:#?}\nexpected (oldest first):\n{groups:#?}",
        items.len()
    );
    let mut at = 0;
    for group in groups.iter().rev() {
        let mut got: Vec<Entry> = shown[at..at + group.len()].to_vec();
        let mut want = group.clone();
        got.sort();
        want.sort();
        assert_eq!(
            got, want,
            "{what}: records {at}.. (newest first) differ;\nall shown:\n{shown:#?}"
        );
        at += group.len();
    }
}

/// What a scripted hour did and left.
struct Script {
    slug: String,
    ada: Op,
    mo: Op,
    tmp: Op,
    /// ann (approved, hidden, shown again), bob (rejected, erased), cyd and
    /// dan (bulk approved), eve (cancelled, retried).
    sessions: Vec<(String, String)>,
    sagas: Vec<String>,
    terminal_id: String,
    terminal_token: String,
    /// Every record, oldest first, in groups of one action.
    groups: Vec<Vec<Entry>>,
    /// The word in every guest's prompt.
    prompt_word: String,
    /// The export's audit.csv.
    audit_csv: String,
}

/// The scripted hour: an admin (Ada) and a moderator (Mo) made with the
/// bootstrap token, then settings, a terminal, review decisions, hiding,
/// a cancel and a retry, a bulk approval, the breaker, an erasure, an
/// export, and an operator made and revoked.
async fn scripted_hour(app: &TestApp) -> Script {
    let mut groups: Vec<Vec<Entry>> = Vec::new();
    let prompt_word = format!("quokka{}", &uuid::Uuid::new_v4().simple().to_string()[..10]);

    let ada = create_operator(app, OPERATOR, "Ada", "admin", Some("make-ada")).await;
    groups.push(vec![entry(
        "bootstrap",
        "operator.create",
        format!("operator:{}", ada.id),
    )]);
    next_millisecond().await;
    let mo = create_operator(app, OPERATOR, "Mo", "moderator", None).await;
    groups.push(vec![entry(
        "bootstrap",
        "operator.create",
        format!("operator:{}", mo.id),
    )]);
    next_millisecond().await;

    let slug = format!("hour-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let target = format!("experience:{slug}");
    let (status, body) = call(
        app,
        "POST",
        "/api/experiences",
        &ada.token,
        Some(json!({
            "slug": slug, "title": "Booth", "kind": "image",
            "max_in_flight": 5, "review": "before_display",
        })),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    groups.push(vec![entry("Ada", "experience.create", &target)]);
    next_millisecond().await;

    let (status, body) = call_keyed(
        app,
        "PATCH",
        &format!("/api/experiences/{slug}"),
        &ada.token,
        Some(json!({"max_in_flight": 3, "title": "Comic booth"})),
        Some("patch-1"),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["max_in_flight"], 3, "{body}");
    assert_eq!(body["title"], "Comic booth", "{body}");
    groups.push(vec![entry("Ada", "experience.update", &target)]);
    next_millisecond().await;

    let (status, body) = call(
        app,
        "POST",
        "/api/terminals",
        &ada.token,
        Some(json!({"experience": slug, "name": "booth 1"})),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let terminal_id = body["terminal_id"].as_str().unwrap().to_owned();
    let terminal_token = body["token"].as_str().unwrap().to_owned();
    groups.push(vec![entry(
        "Ada",
        "terminal.create",
        format!("terminal:{terminal_id}"),
    )]);

    // Four guests; their results wait for review.
    let mut sessions = Vec::new();
    for name in ["ann", "bob", "cyd", "dan"] {
        let (sid, token) = app.session(&slug, Some(&terminal_id), name).await;
        let resp = app
            .submit(
                &sid,
                &token,
                json!({"prompt": format!("{name}'s {prompt_word} on a bike")}),
                "k",
            )
            .await;
        assert_eq!(resp.status(), 202);
        sessions.push((sid, token));
    }
    let mut sagas = app.in_review(&sessions).await;
    next_millisecond().await;

    // Mo approves ann's, rejects bob's.
    let (status, body) = call_keyed(
        app,
        "POST",
        &format!("/api/admin/sagas/{}/approve", sagas[0]),
        &mo.token,
        None,
        Some("approve-ann"),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    groups.push(vec![entry(
        "Mo",
        "saga.approve",
        format!("saga:{}", sagas[0]),
    )]);
    let done = app.wait_final(&sessions[0].0, &sessions[0].1, WITHIN).await;
    assert_eq!(done["status"], "COMPLETED", "{done}");
    next_millisecond().await;
    let (status, body) = call(
        app,
        "POST",
        &format!("/api/admin/sagas/{}/reject", sagas[1]),
        &mo.token,
        None,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    groups.push(vec![entry(
        "Mo",
        "saga.reject",
        format!("saga:{}", sagas[1]),
    )]);
    let done = app.wait_final(&sessions[1].0, &sessions[1].1, WITHIN).await;
    assert_eq!(done["abort_reason"], "REVIEW_REJECTED", "{done}");
    next_millisecond().await;

    // Mo hides ann's result and shows it again.
    for (what, action) in [("hide", "session.hide"), ("unhide", "session.unhide")] {
        let (status, body) = call(
            app,
            "POST",
            &format!("/api/admin/sessions/{}/{what}", sessions[0].0),
            &mo.token,
            None,
        )
        .await;
        assert_eq!(status, 200, "{what}: {body}");
        groups.push(vec![entry(
            "Mo",
            action,
            format!("session:{}", sessions[0].0),
        )]);
        next_millisecond().await;
    }

    // Mo approves the rest in bulk.
    let (status, body) = call(
        app,
        "POST",
        "/api/admin/sagas/bulk",
        &mo.token,
        Some(json!({"action": "approve", "filter": {"experience": slug, "step": "IN_REVIEW"}})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["done"], 2, "{body}");
    groups.push(vec![
        entry("Mo", "saga.approve", format!("saga:{}", sagas[2])),
        entry("Mo", "saga.approve", format!("saga:{}", sagas[3])),
        entry("Mo", "sagas.bulk", "sagas"),
    ]);
    for (sid, token) in &sessions[2..4] {
        let done = app.wait_final(sid, token, WITHIN).await;
        assert_eq!(done["status"], "COMPLETED", "{done}");
    }
    next_millisecond().await;

    // Eve's AI job takes a minute: Ada cancels it, then retries it.
    app.sim.control.set_latency(Duration::from_secs(60));
    let jobs_before = app.sim.control.stats().jobs_created;
    let (eve, eve_token) = app.session(&slug, Some(&terminal_id), "eve").await;
    let resp = app
        .submit(
            &eve,
            &eve_token,
            json!({"prompt": format!("eve's {prompt_word} in space")}),
            "k",
        )
        .await;
    assert_eq!(resp.status(), 202);
    support::wait_for(WITHIN, || async {
        (app.sim.control.stats().jobs_created > jobs_before).then_some(())
    })
    .await
    .expect("eve's AI job started");
    let eve_saga = app.saga_of(&eve).await["saga_id"]
        .as_str()
        .unwrap()
        .to_owned();
    sessions.push((eve.clone(), eve_token.clone()));
    sagas.push(eve_saga.clone());
    next_millisecond().await;
    let (status, body) = call(
        app,
        "POST",
        &format!("/api/admin/sagas/{eve_saga}/cancel"),
        &ada.token,
        None,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["saga"]["step"], "ABORTED", "{body}");
    assert_eq!(body["saga"]["abort_reason"], "CANCELLED", "{body}");
    groups.push(vec![entry(
        "Ada",
        "saga.cancel",
        format!("saga:{eve_saga}"),
    )]);
    next_millisecond().await;
    app.sim.control.set_latency(Duration::from_millis(100));
    let (status, body) = call(
        app,
        "POST",
        &format!("/api/admin/sagas/{eve_saga}/retry"),
        &ada.token,
        None,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_ne!(body["saga"]["step"], "ABORTED", "{body}");
    groups.push(vec![entry("Ada", "saga.retry", format!("saga:{eve_saga}"))]);
    next_millisecond().await;

    // Ada opens and closes the breaker.
    for (what, action) in [("open", "breaker.open"), ("close", "breaker.close")] {
        let (status, body) = call(
            app,
            "POST",
            &format!("/api/admin/breaker/{what}"),
            &ada.token,
            None,
        )
        .await;
        assert_eq!(status, 200, "{what}: {body}");
        groups.push(vec![entry("Ada", action, "provider:default")]);
        next_millisecond().await;
    }

    // Ada erases bob's session (asked by e-mail).
    let (status, body) = call(
        app,
        "DELETE",
        &format!("/api/admin/sessions/{}", sessions[1].0),
        &ada.token,
        None,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    groups.push(vec![entry(
        "Ada",
        "session.erase",
        format!("session:{}", sessions[1].0),
    )]);
    next_millisecond().await;

    // Ada exports the experience: the whole ZIP is read.
    let resp = app
        .http
        .get(format!("{}/api/admin/experiences/{slug}/export", app.base))
        .bearer_auth(&ada.token)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let bytes = resp.bytes().await.expect("the whole export");
    groups.push(vec![entry("Ada", "experience.export", &target)]);
    let mut zip = zip::ZipArchive::new(std::io::Cursor::new(bytes.to_vec())).expect("a ZIP");
    let mut audit_csv = String::new();
    std::io::Read::read_to_string(
        &mut zip.by_name("audit.csv").expect("audit.csv in the export"),
        &mut audit_csv,
    )
    .unwrap();
    next_millisecond().await;

    // Ada makes an operator and revokes it.
    let tmp = create_operator(app, &ada.token, "Tmp", "viewer", None).await;
    groups.push(vec![entry(
        "Ada",
        "operator.create",
        format!("operator:{}", tmp.id),
    )]);
    next_millisecond().await;
    let (status, body) = call(
        app,
        "DELETE",
        &format!("/api/admin/operators/{}", tmp.id),
        &ada.token,
        None,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    groups.push(vec![entry(
        "Ada",
        "operator.revoke",
        format!("operator:{}", tmp.id),
    )]);

    Script {
        slug,
        ada,
        mo,
        tmp,
        sessions,
        sagas,
        terminal_id,
        terminal_token,
        groups,
        prompt_word,
        audit_csv,
    }
}

/// The scripted hour comes back newest first, a page of 3 at a time,
/// each record naming its operator, action and target; the filters by
/// operator (name or id) and by action narrow it; the export's audit.csv
/// lists the experience's records.
async fn a_scripted_hour_comes_back_in_the_trail(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let s = scripted_hour(&app).await;
    let ada = &s.ada;

    let items = audit_all(&app, &ada.token, "", 3).await;
    assert_trail(&items, &s.groups, "the whole trail");
    // Newest first by time, and each record whole.
    let ats: Vec<chrono::DateTime<chrono::FixedOffset>> = items
        .iter()
        .map(|i| chrono::DateTime::parse_from_rfc3339(i["at"].as_str().unwrap()).expect("RFC 3339"))
        .collect();
    assert!(
        ats.windows(2).all(|w| w[0] >= w[1]),
        "newest first: {ats:?}"
    );
    let ids: BTreeSet<&str> = items.iter().map(|i| i["id"].as_str().unwrap()).collect();
    assert_eq!(ids.len(), items.len(), "every record its own id");
    for item in &items {
        let expected_id = match item["operator"].as_str().unwrap() {
            "bootstrap" => Value::Null,
            "Ada" => json!(s.ada.id),
            "Mo" => json!(s.mo.id),
            other => panic!("an unexpected operator {other}: {item}"),
        };
        assert_eq!(item["operator_id"], expected_id, "{item}");
        assert!(item["detail"].is_string(), "{item}");
    }
    // The page size does not change the list.
    let all_at_once = audit_all(&app, &ada.token, "", 200).await;
    assert_eq!(all_at_once, items);
    let by_default = call(&app, "GET", "/api/admin/audit", &ada.token, None).await;
    assert_eq!(by_default.0, 200);
    assert_eq!(
        by_default.1["items"].as_array().unwrap(),
        &items,
        "default limit 50"
    );
    assert!(by_default.1["next"].is_null(), "{}", by_default.1);

    // Details.
    let detail_of = |action: &str| -> String {
        items
            .iter()
            .find(|i| i["action"] == action)
            .unwrap_or_else(|| panic!("no {action}"))["detail"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    assert_eq!(
        detail_of("experience.update"),
        "title: Booth -> Comic booth; max_in_flight: 5 -> 3"
    );
    assert_eq!(
        detail_of("sagas.bulk"),
        format!(
            "approve experience={} step=IN_REVIEW: matched 2, done 2",
            s.slug
        )
    );
    // The bulk's records come after the approvals it made.
    let bulk_at = items
        .iter()
        .position(|i| i["action"] == "sagas.bulk")
        .unwrap();
    for item in items.iter().filter(|i| i["detail"] == "bulk") {
        assert!(
            item["at"].as_str() <= items[bulk_at]["at"].as_str(),
            "{item}"
        );
    }

    // Filters.
    let mo_groups: Vec<Vec<Entry>> = s
        .groups
        .iter()
        .filter(|g| g.iter().all(|e| e.0 == "Mo"))
        .cloned()
        .collect();
    assert_eq!(mo_groups.iter().map(Vec::len).sum::<usize>(), 7);
    let by_mo = audit_all(&app, &ada.token, "&operator=Mo", 3).await;
    assert_trail(&by_mo, &mo_groups, "operator=Mo");
    let by_mo_id = audit_all(&app, &ada.token, &format!("&operator={}", s.mo.id), 3).await;
    assert_eq!(by_mo_id, by_mo, "by the operator's id as by its name");
    let by_bootstrap = audit_all(&app, &ada.token, "&operator=bootstrap", 3).await;
    assert_trail(&by_bootstrap, &s.groups[..2], "operator=bootstrap");
    let updates = audit_all(&app, &ada.token, "&action=experience.update", 3).await;
    assert_trail(
        &updates,
        &[vec![entry(
            "Ada",
            "experience.update",
            format!("experience:{}", s.slug),
        )]],
        "action=experience.update",
    );
    let mo_approvals = audit_all(&app, &ada.token, "&operator=Mo&action=saga.approve", 2).await;
    let approved: BTreeSet<String> = mo_approvals.iter().map(|i| as_entry(i).2).collect();
    let expected: BTreeSet<String> = [0, 2, 3]
        .iter()
        .map(|k| format!("saga:{}", s.sagas[*k]))
        .collect();
    assert_eq!(approved, expected, "operator=Mo and action=saga.approve");
    let nobody = audit_all(&app, &ada.token, "&operator=Nobody", 3).await;
    assert!(nobody.is_empty(), "{nobody:?}");
    let (status, body) = call(
        &app,
        "GET",
        "/api/admin/audit?action=saga.delete",
        &ada.token,
        None,
    )
    .await;
    assert_eq!(status, 422, "an unknown action: {body}");
    for limit in ["0", "201"] {
        let (status, body) = call(
            &app,
            "GET",
            &format!("/api/admin/audit?limit={limit}"),
            &ada.token,
            None,
        )
        .await;
        assert_eq!(status, 422, "limit={limit}: {body}");
    }

    // The export's audit.csv: the experience's records up to the export
    // (itself included), and nothing of the breaker or the operators.
    let mut csv = csv::Reader::from_reader(s.audit_csv.as_bytes());
    let header: Vec<String> = csv.headers().unwrap().iter().map(str::to_owned).collect();
    assert_eq!(
        header,
        [
            "at",
            "operator",
            "operator_id",
            "action",
            "target",
            "detail"
        ]
    );
    let rows: Vec<csv::StringRecord> = csv.records().map(Result::unwrap).collect();
    let of_experience = |target: &str| {
        target == format!("experience:{}", s.slug)
            || target == format!("terminal:{}", s.terminal_id)
            || s.sagas.iter().any(|id| target == format!("saga:{id}"))
            || s.sessions
                .iter()
                .any(|(sid, _)| target == format!("session:{sid}"))
    };
    let export_at = s
        .groups
        .iter()
        .position(|g| g[0].1 == "experience.export")
        .unwrap();
    let mut expected_rows: Vec<Entry> = s.groups[..=export_at]
        .iter()
        .flatten()
        .filter(|e| of_experience(&e.2))
        .cloned()
        .collect();
    // A bulk's summary (target `sagas`) may or may not be counted among an
    // experience's records; the spec does not say.
    let mut csv_rows: Vec<Entry> = rows
        .iter()
        .map(|r| (r[1].to_owned(), r[3].to_owned(), r[4].to_owned()))
        .filter(|e| e.1 != "sagas.bulk")
        .collect();
    for r in &rows {
        if &r[1] == "Ada" {
            assert_eq!(&r[2], s.ada.id.as_str(), "{r:?}");
        }
        chrono::DateTime::parse_from_rfc3339(&r[0]).expect("at is RFC 3339");
    }
    expected_rows.sort();
    csv_rows.sort();
    assert_eq!(
        csv_rows, expected_rows,
        "audit.csv lists the experience's records:\n{}",
        s.audit_csv
    );
    app.stop().await;
}
db_test!(a_scripted_hour_comes_back_in_the_trail);

/// The database path of a SQLite test database.
fn sqlite_path(url: &str) -> std::path::PathBuf {
    let path = url
        .strip_prefix("sqlite://")
        .expect("a SQLite URL")
        .split('?')
        .next()
        .unwrap();
    std::path::PathBuf::from(path)
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}

/// After the scripted hour, no token (the bootstrap one, the accounts',
/// a revoked one, the guests', the terminal's) is anywhere in the SQLite
/// database's files, nor in the trail; and no record holds a guest's
/// prompt.
#[actix_web::test]
async fn no_token_is_kept_in_the_database() {
    let app = TestApp::spawn(Backend::Sqlite).await;
    let s = scripted_hour(&app).await;
    let mut tokens: Vec<(String, String)> = vec![
        ("bootstrap".into(), OPERATOR.into()),
        ("Ada".into(), s.ada.token.clone()),
        ("Mo".into(), s.mo.token.clone()),
        ("Tmp (revoked)".into(), s.tmp.token.clone()),
        ("the terminal".into(), s.terminal_token.clone()),
    ];
    for (sid, token) in &s.sessions {
        tokens.push((format!("guest of {sid}"), token.clone()));
    }
    for (who, token) in &tokens {
        assert!(
            token.len() >= 16,
            "{who}'s token {token:?} is a real secret"
        );
    }

    // The trail.
    let items = audit_all(&app, OPERATOR, "", 200).await;
    assert!(items.len() >= 20, "{items:?}");
    let text = serde_json::to_string(&items).unwrap();
    for (who, token) in &tokens {
        assert!(
            !text.contains(token.as_str()),
            "{who}'s token in the trail: {text}"
        );
    }
    assert!(
        !text.contains(&s.prompt_word),
        "a guest's prompt in the trail: {text}"
    );

    // The database files, as they are on disk now (the WAL too).
    let db = sqlite_path(&app.db.url);
    let mut files = Vec::new();
    for suffix in ["", "-wal", "-shm", "-journal"] {
        let path = std::path::PathBuf::from(format!("{}{suffix}", db.display()));
        if path.exists() {
            files.push((
                path.clone(),
                std::fs::read(&path).expect("read the database file"),
            ));
        }
    }
    let sizes: Vec<(String, usize)> = files
        .iter()
        .map(|(p, b)| (p.display().to_string(), b.len()))
        .collect();
    assert!(
        files.iter().map(|(_, b)| b.len()).sum::<usize>() > 8192,
        "the database's files are there: {sizes:?}"
    );
    eprintln!("searched the database's files: {sizes:?}");
    // The check itself finds what is there: the prompt word is in the
    // sagas' rows (kept for the AI), so it must be found.
    assert!(
        files
            .iter()
            .any(|(_, bytes)| contains(bytes, s.prompt_word.as_bytes())),
        "the byte search finds the guests' prompts (kept with their sagas)"
    );
    for (path, bytes) in &files {
        for (who, token) in &tokens {
            assert!(
                !contains(bytes, token.as_bytes()),
                "{who}'s token is in {} ({} bytes)",
                path.display(),
                bytes.len()
            );
        }
    }
    app.stop().await;
}

/// A refused action writes no record: a decision on a saga not in review
/// (409), a cancel or retry the saga's state refuses (409), a setting
/// with a bad value (422), an unknown or fixed setting (400, 409), a role
/// that may not (403), an unknown target (404).
async fn a_refused_action_leaves_no_record(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let ada = create_operator(&app, OPERATOR, "Ada", "admin", None).await;
    let mo = create_operator(&app, OPERATOR, "Mo", "moderator", None).await;
    let vi = create_operator(&app, OPERATOR, "Vi", "viewer", None).await;
    let slug = app.experience(5).await;
    let (sid, token) = app.session(&slug, None, "zed").await;
    let resp = app
        .submit(&sid, &token, json!({"prompt": "a fox"}), "k")
        .await;
    assert_eq!(resp.status(), 202);
    let done = app.wait_final(&sid, &token, WITHIN).await;
    assert_eq!(done["status"], "COMPLETED", "{done}");
    let saga = app.saga_of(&sid).await["saga_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let before = audit_all(&app, OPERATOR, "", 200).await;
    assert_eq!(before.len(), 4, "3 operators and 1 experience: {before:?}");

    let unknown = uuid::Uuid::new_v4().to_string();
    let refusals: Vec<(&Op, &str, String, Option<Value>, u16)> = vec![
        (
            &mo,
            "POST",
            format!("/api/admin/sagas/{saga}/approve"),
            None,
            409,
        ),
        (
            &mo,
            "POST",
            format!("/api/admin/sagas/{saga}/reject"),
            None,
            409,
        ),
        (
            &ada,
            "POST",
            format!("/api/admin/sagas/{saga}/cancel"),
            None,
            409,
        ),
        (
            &ada,
            "POST",
            format!("/api/admin/sagas/{saga}/retry"),
            None,
            409,
        ),
        (
            &ada,
            "POST",
            format!("/api/admin/sagas/{unknown}/cancel"),
            None,
            404,
        ),
        (
            &mo,
            "POST",
            format!("/api/admin/sagas/{unknown}/approve"),
            None,
            404,
        ),
        (
            &ada,
            "PATCH",
            format!("/api/experiences/{slug}"),
            Some(json!({"max_in_flight": 0})),
            422,
        ),
        (
            &ada,
            "PATCH",
            format!("/api/experiences/{slug}"),
            Some(json!({"title": "ok", "review_timeout": "soon"})),
            422,
        ),
        (
            &ada,
            "PATCH",
            format!("/api/experiences/{slug}"),
            Some(json!({"slug": "new-slug"})),
            409,
        ),
        (
            &ada,
            "PATCH",
            format!("/api/experiences/{slug}"),
            Some(json!({"colour": "red"})),
            400,
        ),
        (
            &ada,
            "PATCH",
            "/api/experiences/no-such-experience".to_owned(),
            Some(json!({"title": "x"})),
            404,
        ),
        (
            &mo,
            "PATCH",
            format!("/api/experiences/{slug}"),
            Some(json!({"title": "Mo's"})),
            403,
        ),
        (
            &mo,
            "POST",
            format!("/api/admin/sagas/{saga}/cancel"),
            None,
            403,
        ),
        (
            &vi,
            "POST",
            format!("/api/admin/sessions/{sid}/hide"),
            None,
            403,
        ),
        (&vi, "POST", "/api/admin/breaker/open".into(), None, 403),
        (
            &mo,
            "DELETE",
            format!("/api/admin/sessions/{sid}"),
            None,
            403,
        ),
        (
            &mo,
            "GET",
            format!("/api/admin/experiences/{slug}/export"),
            None,
            403,
        ),
        (
            &mo,
            "POST",
            format!("/api/admin/sessions/{unknown}/hide"),
            None,
            404,
        ),
        (
            &ada,
            "DELETE",
            format!("/api/admin/sessions/{unknown}"),
            None,
            404,
        ),
        (
            &ada,
            "DELETE",
            format!("/api/admin/operators/{unknown}"),
            None,
            404,
        ),
        (
            &ada,
            "GET",
            "/api/admin/experiences/no-such-experience/export".into(),
            None,
            404,
        ),
        (
            &ada,
            "POST",
            "/api/admin/operators".into(),
            Some(json!({"name": "X", "role": "root"})),
            422,
        ),
        (
            &mo,
            "POST",
            "/api/admin/operators".into(),
            Some(json!({"name": "X", "role": "viewer"})),
            403,
        ),
        (
            &ada,
            "POST",
            "/api/admin/breaker/open?provider=nope".into(),
            None,
            404,
        ),
        (
            &ada,
            "POST",
            "/api/experiences".into(),
            Some(json!({"slug": slug, "title": "again", "kind": "image"})),
            409,
        ),
        (
            &ada,
            "POST",
            "/api/experiences".into(),
            Some(json!({"slug": "bad-one", "title": "x", "kind": "image", "max_in_flight": 0})),
            422,
        ),
        (
            &mo,
            "POST",
            "/api/admin/sagas/bulk".into(),
            Some(json!({"action": "approve", "filter": {"step": "SOMETIMES"}})),
            422,
        ),
        (
            &mo,
            "POST",
            "/api/admin/sagas/bulk".into(),
            Some(json!({"action": "retry", "filter": {"experience": slug}})),
            403,
        ),
    ];
    for (op, method, path, body, expected) in refusals {
        let (status, answer) = call(&app, method, &path, &op.token, body.clone()).await;
        assert_eq!(
            status, expected,
            "{} {method} {path} {body:?}: {answer}",
            op.name
        );
        let after = audit_all(&app, OPERATOR, "", 200).await;
        assert_eq!(
            after, before,
            "{} {method} {path} {body:?} ({status}) left a record",
            op.name
        );
    }
    // The saga and the settings are as they were.
    assert_eq!(app.saga_of(&sid).await["step"], "COMPLETED");
    let exp = app
        .operator_get(&format!("/api/experiences/{slug}"))
        .await
        .1;
    assert_eq!(
        (exp["title"].as_str(), exp["max_in_flight"].as_i64()),
        (Some("Booth"), Some(5)),
        "{exp}"
    );
    // And an action that happens is recorded (the check above can see one).
    let (status, body) = call(
        &app,
        "PATCH",
        &format!("/api/experiences/{slug}"),
        &ada.token,
        Some(json!({"max_in_flight": 2})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let after = audit_all(&app, OPERATOR, "", 200).await;
    assert_eq!(after.len(), before.len() + 1);
    assert_eq!(
        as_entry(&after[0]),
        entry("Ada", "experience.update", format!("experience:{slug}"))
    );
    assert_eq!(after[0]["detail"], "max_in_flight: 5 -> 2");
    app.stop().await;
}
db_test!(a_refused_action_leaves_no_record);

/// Records older than `audit_retention` are dropped by the cleanup; a
/// newer one stays.
async fn the_cleanup_drops_records_past_the_retention(backend: Backend) {
    let clock = stagehand::clock::ManualClock::new(1_800_000_000_000);
    let app = TestApp::spawn_with_clock(
        backend,
        fast_sim(),
        |c| c.audit_retention = Duration::from_secs(60),
        clock.clone(),
    )
    .await;
    let slug = app.experience(5).await;
    let created = audit_all(&app, OPERATOR, "", 200).await;
    assert_eq!(created.len(), 1, "{created:?}");
    assert_eq!(
        as_entry(&created[0]),
        entry(
            "bootstrap",
            "experience.create",
            format!("experience:{slug}")
        )
    );
    assert_eq!(
        created[0]["at"], "2027-01-15T08:00:00.000Z",
        "stamped by the app's clock"
    );

    clock.advance_ms(30_000);
    let (status, body) = call(
        &app,
        "PATCH",
        &format!("/api/experiences/{slug}"),
        OPERATOR,
        Some(json!({"title": "Later"})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    // A round before anything is past the retention drops nothing.
    let report = app
        .app_cleanup
        .send(stagehand::actors::cleanup::RunCleanup)
        .await
        .unwrap();
    assert_eq!(report.old_audit, 0, "{report:?}");
    assert_eq!(audit_all(&app, OPERATOR, "", 200).await.len(), 2);

    // 61 s after the first record, 31 s after the second.
    clock.advance_ms(31_000);
    let report = app
        .app_cleanup
        .send(stagehand::actors::cleanup::RunCleanup)
        .await
        .unwrap();
    assert_eq!(report.old_audit, 1, "{report:?}");
    let left = audit_all(&app, OPERATOR, "", 200).await;
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(
        as_entry(&left[0]),
        entry(
            "bootstrap",
            "experience.update",
            format!("experience:{slug}")
        )
    );
    app.stop().await;
}
db_test!(the_cleanup_drops_records_past_the_retention);
