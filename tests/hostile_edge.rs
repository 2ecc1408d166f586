//! The public edge against a hostile guest (issue 45, items 8 to 10),
//! black box over HTTP, on SQLite and on PostgreSQL:
//!
//! - one client address, everywhere: `X-Forwarded-For` and `Forwarded`
//!   count only as `--trusted-proxies` says, in the audit trail too;
//! - no outside client of the server takes a proxy from the environment
//!   (a proxy resolves names itself, past the SSRF guard);
//! - the gallery PIN cannot be guessed during an event: 6 digits at least,
//!   a ceiling of guesses per gallery over every address and instance
//!   past which the gallery is locked (the right PIN too), /ops told, and
//!   the slow hash off the HTTP workers.

mod support;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use stagehand::config::{Config, ProxyHeader};
use support::{fast_sim, Backend, TestApp, OPERATOR};

/// `GET path` as the bootstrap admin, with `headers`.
async fn admin_get(app: &TestApp, path: &str, headers: &[(&str, &str)]) -> reqwest::Response {
    let mut req = app
        .http
        .get(format!("{}{path}", app.base))
        .bearer_auth(OPERATOR);
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    req.send().await.expect("an answer")
}

/// Exports `slug` with `headers` and returns the detail of the audit
/// record the export left ("from <address>").
async fn export_recorded_from(app: &TestApp, slug: &str, headers: &[(&str, &str)]) -> String {
    let resp = admin_get(
        app,
        &format!("/api/admin/experiences/{slug}/export"),
        headers,
    )
    .await;
    assert_eq!(resp.status(), 200);
    resp.bytes().await.expect("the whole export");
    let resp = admin_get(
        app,
        "/api/admin/audit?action=experience.export&limit=1",
        &[],
    )
    .await;
    assert_eq!(resp.status(), 200);
    let page: Value = resp.json().await.expect("the trail");
    page["items"][0]["detail"]
        .as_str()
        .expect("the export's record")
        .to_owned()
}

/// Headers sent with an export, and the address its record must name.
type Recorded<'a> = (&'a [(&'a str, &'a str)], &'a str);

/// Exports with each case's headers on a server set by `settings`, and
/// checks the address each record names.
async fn exports_record(
    backend: Backend,
    settings: impl FnOnce(&mut Config),
    cases: &[Recorded<'_>],
) {
    let app = TestApp::spawn_with(backend, fast_sim(), settings).await;
    let slug = app.experience(1).await;
    for (headers, expected) in cases {
        let detail = export_recorded_from(&app, &slug, headers).await;
        assert_eq!(detail, *expected, "{headers:?}");
    }
    app.stop().await;
}

/// The export's audit record names the client as `--trusted-proxies`
/// says: with no proxy trusted, whatever the client wrote in
/// `X-Forwarded-For` or `Forwarded` is not its address; behind one trusted
/// proxy, the address that proxy appended is (in the header the proxy
/// writes, and only there).
async fn the_audit_trail_records_the_address_the_proxies_vouch_for(backend: Backend) {
    let peer = "from 127.0.0.1";
    exports_record(
        backend,
        |_| {},
        &[
            (&[("X-Forwarded-For", "203.0.113.66")], peer),
            (&[("Forwarded", "for=198.51.100.77")], peer),
            (
                &[
                    ("Forwarded", "for=\"[2001:db8::66]:4711\";proto=https"),
                    ("X-Forwarded-For", "203.0.113.66, 203.0.113.67"),
                ],
                peer,
            ),
        ],
    )
    .await;
    let trusting = |header: ProxyHeader| {
        move |c: &mut Config| {
            c.trusted_proxies = 1;
            c.trusted_proxy_header = header;
        }
    };
    exports_record(
        backend,
        trusting(ProxyHeader::XForwardedFor),
        &[
            (
                &[("X-Forwarded-For", "6.6.6.6, 203.0.113.9")],
                "from 203.0.113.9",
            ),
            (
                &[
                    ("X-Forwarded-For", "6.6.6.6"),
                    ("X-Forwarded-For", "[2001:db8::9]:443"),
                ],
                "from 2001:db8::9",
            ),
            // Not the header this proxy writes: the client's own words.
            (&[("Forwarded", "for=198.51.100.77")], peer),
            // Not an address: the peer.
            (&[("X-Forwarded-For", "unknown")], peer),
        ],
    )
    .await;
    exports_record(
        backend,
        trusting(ProxyHeader::Forwarded),
        &[
            (
                &[(
                    "Forwarded",
                    "for=6.6.6.6;proto=http, for=\"[2001:db8::7]:4711\";by=203.0.113.1",
                )],
                "from 2001:db8::7",
            ),
            (
                &[
                    ("Forwarded", "for=6.6.6.6"),
                    ("Forwarded", "For=203.0.113.8;proto=https"),
                ],
                "from 203.0.113.8",
            ),
            (&[("X-Forwarded-For", "203.0.113.66")], peer),
            // An obfuscated or unknown node (RFC 7239, 6.3): the peer.
            (&[("Forwarded", "for=_hidden")], peer),
        ],
    )
    .await;
}
db_test!(the_audit_trail_records_the_address_the_proxies_vouch_for);

/// Set in the child process of
/// [`the_outside_clients_ignore_a_proxy_in_the_environment`]: the backend
/// it runs on.
const PROXY_CHILD: &str = "STAGEHAND_TEST_PROXY_CHILD";
/// The path only the child's control request asks for.
const THROUGH_THE_PROXY: &str = "/only-the-control-goes-through-the-proxy";

/// A stand-in proxy on a port of its own: it records the request line of
/// every request it is sent and answers each 502.
fn recording_proxy() -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a port");
    let url = format!("http://{}", listener.local_addr().expect("bound"));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let lines = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut reader = BufReader::new(stream.try_clone().expect("a stream"));
            let mut line = String::new();
            if reader.read_line(&mut line).is_ok() && !line.is_empty() {
                lines.lock().unwrap().push(line.trim_end().to_owned());
            }
            let _ = stream.write_all(
                b"HTTP/1.1 502 Bad Gateway\r\nx-recording-proxy: 1\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
            );
        }
    });
    (url, seen)
}

/// Every client the server makes to the outside (the job API's, the
/// keeping of result files, OpenAI's and Replicate's) goes straight to its
/// target with `HTTP_PROXY`, `HTTPS_PROXY` and `ALL_PROXY` set: a proxy
/// would resolve the names itself, past the keep stage's public-only
/// resolver, and reach whatever it can reach. The environment is the
/// process's, so the test runs again as a child process with the proxy
/// set, and no other test of this binary sees it; the child shows first
/// that a default client does take the proxy.
async fn the_outside_clients_ignore_a_proxy_in_the_environment(backend: Backend) {
    if std::env::var_os(PROXY_CHILD).is_some() {
        return with_a_proxy_in_the_environment(backend).await;
    }
    let (proxy, seen) = recording_proxy();
    let name = match backend {
        Backend::Sqlite => "sqlite",
        Backend::Postgres => "postgres",
    };
    let test = format!("the_outside_clients_ignore_a_proxy_in_the_environment::{name}");
    let mut child = std::process::Command::new(std::env::current_exe().expect("this test binary"));
    child
        .args(["--exact", &test, "--nocapture", "--include-ignored"])
        .env(PROXY_CHILD, name);
    for var in [
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
    ] {
        child.env(var, &proxy);
    }
    for var in ["NO_PROXY", "no_proxy"] {
        child.env_remove(var);
    }
    let out = tokio::task::spawn_blocking(move || child.output().expect("the child runs"))
        .await
        .expect("the child's output");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the child failed:\n{text}");
    assert!(text.contains("1 passed"), "the child ran its test:\n{text}");
    let seen = seen.lock().unwrap().clone();
    assert!(
        seen.iter().any(|line| line.contains(THROUGH_THE_PROXY)),
        "the control went through the proxy: {seen:?}"
    );
    let others: Vec<&String> = seen
        .iter()
        .filter(|line| !line.contains(THROUGH_THE_PROXY))
        .collect();
    assert!(
        others.is_empty(),
        "requests that took the proxy: {others:?}"
    );
}
db_test!(the_outside_clients_ignore_a_proxy_in_the_environment);

/// The child's part: a session through the job API, its result kept, and
/// OpenAI's and Replicate's clients asked something (at a closed port:
/// only the proxy would answer).
async fn with_a_proxy_in_the_environment(backend: Backend) {
    stagehand::ai::client::ensure_crypto_provider();
    let mut app = TestApp::spawn(backend).await;
    let control = reqwest::Client::new()
        .get(format!("{}{THROUGH_THE_PROXY}", app.base))
        .send()
        .await
        .expect("the proxy answers");
    assert!(
        control.headers().contains_key("x-recording-proxy"),
        "a default client takes the proxy from the environment"
    );
    app.http = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("the test's own client");
    let slug = app.experience(1).await;
    let (sid, token) = app.session(&slug, None, "ana").await;
    let resp = app
        .submit(
            &sid,
            &token,
            json!({"prompt": "a boat"}),
            &uuid::Uuid::new_v4().to_string(),
        )
        .await;
    assert_eq!(resp.status(), 202);
    let done = app.wait_final(&sid, &token, Duration::from_secs(30)).await;
    assert_eq!(done["status"], "COMPLETED", "{done}");
    let kept = done["result"]["content"][0]["url"]
        .as_str()
        .unwrap_or_default();
    assert!(kept.starts_with("/media/r/"), "kept: {done}");

    let closed = {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a port");
        format!("http://{}", listener.local_addr().expect("bound"))
    };
    let openai = stagehand::ai::openai::OpenAiClient::new(&stagehand::ai::openai::OpenAiSettings {
        base_url: closed.clone(),
        api_key: None,
        chat_model: "chat".into(),
        image_model: "image".into(),
        image_size: "1024x1024".into(),
        connect_timeout: Duration::from_secs(2),
        request_timeout: Duration::from_secs(2),
    });
    // Read as "no notices" when nothing answers: only the proxy sees it.
    let _ = openai.check_models(chrono::Utc::now().date_naive()).await;
    let mut settings = stagehand::ai::replicate::ReplicateSettings::new(None);
    settings.base_url = closed;
    settings.request_timeout = Duration::from_secs(2);
    let replicate = stagehand::ai::replicate::ReplicateClient::new(&settings);
    assert!(
        replicate.poll("p-1").await.is_err(),
        "nothing listens there"
    );
    app.stop().await;
}

// ---------------------------------------------------------------------------
// The gallery PIN
// ---------------------------------------------------------------------------

/// A PIN gallery's experience with `pin`; its slug.
async fn pin_gallery(app_base: &str, http: &reqwest::Client, pin: &str) -> String {
    let slug = format!("g-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let (status, body) = create_with(
        app_base,
        http,
        &slug,
        json!({"gallery": "pin", "gallery_pin": pin}),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    slug
}

/// `POST /api/experiences` of `slug` with `settings`.
async fn create_with(
    base: &str,
    http: &reqwest::Client,
    slug: &str,
    settings: Value,
) -> (u16, Value) {
    let mut body = json!({"slug": slug, "title": "Comic booth", "kind": "comic"});
    for (k, v) in settings.as_object().expect("an object") {
        body[k] = v.clone();
    }
    let key = uuid::Uuid::new_v4().to_string();
    support::api_call(
        http,
        base,
        "POST",
        "/api/experiences",
        OPERATOR,
        Some(body),
        Some(&key),
    )
    .await
}

/// `PATCH /api/experiences/{slug}` with `body`.
async fn patch(base: &str, http: &reqwest::Client, slug: &str, body: Value) -> (u16, Value) {
    let key = uuid::Uuid::new_v4().to_string();
    let path = format!("/api/experiences/{slug}");
    support::api_call(http, base, "PATCH", &path, OPERATOR, Some(body), Some(&key)).await
}

/// The gallery of `slug` asked with `pin`, from `client` behind the one
/// trusted proxy.
async fn gallery_with(
    base: &str,
    http: &reqwest::Client,
    slug: &str,
    pin: &str,
    client: &str,
) -> reqwest::Response {
    http.get(format!("{base}/api/experiences/{slug}/gallery"))
        .header("X-Gallery-Pin", pin)
        .header("X-Forwarded-For", format!("6.6.6.6, {client}"))
        .send()
        .await
        .expect("an answer")
}

/// The status, `error` code and `Retry-After` of an answer.
async fn answer_of(resp: reqwest::Response) -> (u16, String, Option<u64>) {
    let status = resp.status().as_u16();
    let retry_after = resp
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().parse().expect("whole seconds"));
    let body: Value = resp.json().await.unwrap_or(Value::Null);
    (
        status,
        body["error"].as_str().unwrap_or_default().to_owned(),
        retry_after,
    )
}

/// A gallery PIN has 6 to 12 digits: a shorter one is refused, at
/// creation and in a change, with a 422 that names `gallery_pin`.
async fn a_gallery_pin_has_six_digits_at_least(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    for short in ["1234", "12345"] {
        let slug = format!("short-{short}");
        let (status, body) = create_with(
            &app.base,
            &app.http,
            &slug,
            json!({"gallery": "pin", "gallery_pin": short}),
        )
        .await;
        assert_eq!(status, 422, "{short}: {body}");
        assert_eq!(body["error"], "validation_failed");
        assert!(
            body["message"].as_str().unwrap().contains("gallery_pin"),
            "{body}"
        );
    }
    let slug = pin_gallery(&app.base, &app.http, "123456").await;
    let (status, body) = patch(&app.base, &app.http, &slug, json!({"gallery_pin": "2468"})).await;
    assert_eq!(status, 422, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("gallery_pin"),
        "{body}"
    );
    // A change that keeps the PIN, and one that sets a good one.
    let (status, body) = patch(&app.base, &app.http, &slug, json!({"title": "Comics"})).await;
    assert_eq!(status, 200, "{body}");
    let open = |pin: &'static str| gallery_with(&app.base, &app.http, &slug, pin, "192.0.2.1");
    assert_eq!(answer_of(open("123456").await).await.0, 200);
    let (status, body) = patch(
        &app.base,
        &app.http,
        &slug,
        json!({"gallery_pin": "24681357"}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(answer_of(open("24681357").await).await.0, 200);
    assert_eq!(answer_of(open("123456").await).await.0, 401);
    app.stop().await;
}
db_test!(a_gallery_pin_has_six_digits_at_least);

/// The lock of the gallery `slug` as the operators' live dashboard shows
/// it, once it shows `locked` (within a few seconds).
async fn ops_shows(port: u16, slug: &str, want: impl Fn(&Value) -> bool) -> Value {
    let mut socket = support::Socket::operators(port, OPERATOR)
        .await
        .expect("the operators' socket");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    let mut last = Value::Null;
    while let Some(left) = deadline.checked_duration_since(tokio::time::Instant::now()) {
        let Some(frame) = socket.next_of_type("stats", left).await else {
            break;
        };
        let mine = frame["experiences"]
            .as_array()
            .and_then(|list| list.iter().find(|e| e["slug"] == slug).cloned())
            .unwrap_or(Value::Null);
        if want(&mine) {
            return mine;
        }
        last = mine;
    }
    panic!("the dashboard never showed it for {slug}: {last}");
}

/// The case: 1,000 wrong guesses from 100 addresses behind the
/// trusted proxy (10 each, under the per-address limit). The gallery
/// answers the ceiling's 50 of them and locks: the other 950 are 429
/// `gallery_locked` with `Retry-After`, and so is the right PIN until the
/// lock ends (the injected clock ends it), from an address that never
/// guessed. Another gallery is not locked; /ops says which one is.
async fn guessing_a_gallery_pin_locks_that_gallery_only(backend: Backend) {
    let clock = stagehand::clock::ManualClock::new(chrono::Utc::now().timestamp_millis());
    let app = TestApp::spawn_with_clock(
        backend,
        fast_sim(),
        |c| {
            c.trusted_proxies = 1;
            c.gallery_pin_guesses = stagehand::config::parse_rate_limit("50/30m").unwrap();
        },
        clock.clone(),
    )
    .await;
    let (base, http) = (&app.base, &app.http);
    let target = pin_gallery(base, http, "24681357").await;
    let other = pin_gallery(base, http, "97531864").await;
    let mut answers: Vec<(u16, String, Option<u64>)> = Vec::new();
    for round in 0..10 {
        let target = &target;
        let guesses = (1..=100).map(|address| {
            let pin = format!("{:08}", round * 100 + address);
            let client = format!("198.51.100.{address}");
            async move { answer_of(gallery_with(base, http, target, &pin, &client).await).await }
        });
        answers.extend(futures_util::future::join_all(guesses).await);
    }
    let wrong = answers
        .iter()
        .filter(|a| a.0 == 401 && a.1 == "gallery_pin_wrong")
        .count();
    let locked: Vec<_> = answers.iter().filter(|a| a.0 == 429).collect();
    assert_eq!(wrong, 50, "the ceiling's guesses are answered");
    assert_eq!(
        locked.len(),
        950,
        "the rest are refused: {:?}",
        &answers[..5]
    );
    for (_, code, retry_after) in &locked {
        assert_eq!(code, "gallery_locked");
        let retry_after = retry_after.expect("Retry-After");
        assert!((1..=1800).contains(&retry_after), "{retry_after}");
    }
    // The right PIN, from an address that never guessed: locked too.
    let (status, code, retry_after) =
        answer_of(gallery_with(base, http, &target, "24681357", "192.0.2.10").await).await;
    assert_eq!((status, code.as_str()), (429, "gallery_locked"));
    assert!(retry_after.is_some_and(|s| s > 1700), "{retry_after:?}");
    // Another gallery opens, and is told a wrong PIN as usual.
    let other_open = gallery_with(base, http, &other, "97531864", "192.0.2.11").await;
    assert_eq!(answer_of(other_open).await.0, 200);
    let other_wrong = gallery_with(base, http, &other, "11111111", "192.0.2.11").await;
    assert_eq!(answer_of(other_wrong).await.1, "gallery_pin_wrong");
    // /ops says which gallery is under attack.
    let shown = ops_shows(app.port, &target, |e| e["gallery_locked_until"].is_string()).await;
    assert_eq!(shown["gallery_pin_outdated"], false);
    let calm = ops_shows(app.port, &other, |e| e.is_object()).await;
    assert!(calm["gallery_locked_until"].is_null(), "{calm}");
    // Just before the lock ends: still locked. Then it ends.
    clock.advance_ms(30 * 60_000 - 2_000);
    let (status, _, _) =
        answer_of(gallery_with(base, http, &target, "24681357", "192.0.2.12").await).await;
    assert_eq!(status, 429);
    clock.advance_ms(2_000);
    let (status, code, _) =
        answer_of(gallery_with(base, http, &target, "24681357", "192.0.2.13").await).await;
    assert_eq!((status, code.as_str()), (200, ""));
    ops_shows(app.port, &target, |e| e["gallery_locked_until"].is_null()).await;
    app.stop().await;
}
db_test!(guessing_a_gallery_pin_locks_that_gallery_only);

/// A gallery whose PIN was set with fewer than 6 digits (an older server
/// took 4) no longer opens with it: its guests are told the PIN changed,
/// /ops says a new PIN is needed, and a new PIN ends both.
async fn a_pin_of_fewer_than_six_digits_no_longer_opens_its_gallery(backend: Backend) {
    use sea_orm::sea_query::Expr;
    use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
    use stagehand::store::entities::experiences;
    let app = TestApp::spawn_with(backend, fast_sim(), |c| c.trusted_proxies = 1).await;
    let (base, http) = (&app.base, &app.http);
    let slug = pin_gallery(base, http, "11223344").await;
    // What an older server stored for "2468".
    let old = stagehand::domain::guests::hash_pin("2468", [9; 16]);
    experiences::Entity::update_many()
        .col_expr(experiences::Column::GalleryPinHash, Expr::value(old))
        .filter(experiences::Column::Slug.eq(slug.as_str()))
        .exec(app.state.store.db())
        .await
        .expect("the old PIN written");
    let (status, code, _) =
        answer_of(gallery_with(base, http, &slug, "2468", "192.0.2.1").await).await;
    assert_eq!((status, code.as_str()), (401, "gallery_pin_outdated"));
    let (status, code, _) =
        answer_of(gallery_with(base, http, &slug, "1357", "192.0.2.1").await).await;
    assert_eq!((status, code.as_str()), (401, "gallery_pin_wrong"));
    ops_shows(app.port, &slug, |e| e["gallery_pin_outdated"] == true).await;
    let (status, body) = patch(base, http, &slug, json!({"gallery_pin": "86427531"})).await;
    assert_eq!(status, 200, "{body}");
    let (status, _, _) =
        answer_of(gallery_with(base, http, &slug, "86427531", "192.0.2.2").await).await;
    assert_eq!(status, 200);
    ops_shows(app.port, &slug, |e| e["gallery_pin_outdated"] == false).await;
    app.stop().await;
}
db_test!(a_pin_of_fewer_than_six_digits_no_longer_opens_its_gallery);

/// Two instances on one PostgreSQL database share the ceiling: 40 wrong
/// guesses at each get 50 answers between them, and both then refuse the
/// right PIN.
#[actix_web::test]
#[cfg_attr(not(pg_tests), ignore = "STAGEHAND_TEST_POSTGRES_URL is not set")]
async fn the_gallery_ceiling_holds_across_instances() {
    let db = support::TestDb::fresh(Backend::Postgres).await;
    let sim = support::start_sim(fast_sim()).await;
    let tweak = |c: &mut Config| {
        c.trusted_proxies = 1;
        c.gallery_pin_guesses = stagehand::config::parse_rate_limit("50/30m").unwrap();
    };
    let a = support::Instance::start(&db, &sim.url(), tweak).await;
    let b = support::Instance::start(&db, &sim.url(), tweak).await;
    let http = reqwest::Client::new();
    let slug = pin_gallery(&a.base, &http, "24681357").await;
    let guesses = (1..=80).map(|n| {
        let base = if n % 2 == 0 { &a.base } else { &b.base };
        let (http, slug) = (&http, &slug);
        async move {
            let pin = format!("{n:08}");
            let client = format!("198.51.100.{n}");
            answer_of(gallery_with(base, http, slug, &pin, &client).await).await
        }
    });
    let answers = futures_util::future::join_all(guesses).await;
    let wrong = answers.iter().filter(|a| a.0 == 401).count();
    let locked = answers.iter().filter(|a| a.1 == "gallery_locked").count();
    assert_eq!((wrong, locked), (50, 30), "{answers:?}");
    for base in [&a.base, &b.base] {
        let (status, code, _) =
            answer_of(gallery_with(base, &http, &slug, "24681357", "192.0.2.1").await).await;
        assert_eq!((status, code.as_str()), (429, "gallery_locked"), "{base}");
    }
    a.stop().await;
    b.stop().await;
}

/// The slow hash runs off the HTTP workers. A single wrong guess on an
/// idle server takes about one hash (the yardstick); while 200 wrong
/// guesses are being hashed (under a ceiling raised for the test), twenty
/// plain requests one after the other take less than three yardsticks in
/// all. With the hash on the workers, each of them waits for the hash its
/// worker is running: about a yardstick each. The guesses past the places
/// for hashing (2 running, 64 waiting) are answered 503 `busy` at once.
async fn the_pin_hash_leaves_the_http_workers_free(backend: Backend) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Instant;
    const GUESSES: usize = 200;
    let app = TestApp::spawn_with(backend, fast_sim(), |c| {
        c.trusted_proxies = 1;
        c.gallery_pin_guesses = stagehand::config::parse_rate_limit("1000/30m").unwrap();
    })
    .await;
    let (base, http) = (&app.base, &app.http);
    let slug = pin_gallery(base, http, "24681357").await;
    let mut singles = Vec::new();
    for n in 0..3 {
        let started = Instant::now();
        let client = format!("192.0.2.{n}");
        let status = answer_of(gallery_with(base, http, &slug, "00000000", &client).await)
            .await
            .0;
        assert_eq!(status, 401);
        singles.push(started.elapsed());
    }
    singles.sort();
    let yardstick = singles[1];
    let answered = Arc::new(AtomicUsize::new(0));
    let guesses: Vec<_> = (1..=GUESSES)
        .map(|n| {
            let (base, http, slug) = (base.clone(), http.clone(), slug.clone());
            let answered = answered.clone();
            tokio::spawn(async move {
                let client = format!("198.51.100.{n}");
                let pin = format!("{n:08}");
                let answer =
                    answer_of(gallery_with(&base, &http, &slug, &pin, &client).await).await;
                answered.fetch_add(1, Ordering::SeqCst);
                answer
            })
        })
        .collect();
    support::wait_for(Duration::from_secs(30), || {
        let answered = answered.clone();
        async move { (answered.load(Ordering::SeqCst) > 0).then_some(()) }
    })
    .await
    .expect("the hashing began");
    let started = Instant::now();
    for _ in 0..20 {
        let health = http
            .get(format!("{base}/healthz"))
            .send()
            .await
            .expect("/healthz");
        assert_eq!(health.status(), 200);
    }
    let twenty = started.elapsed();
    let still_hashing = answered.load(Ordering::SeqCst) < GUESSES;
    assert!(
        twenty < yardstick * 3,
        "twenty /healthz took {twenty:?} while PINs were hashed; one guess takes {yardstick:?}"
    );
    assert!(
        still_hashing,
        "the guesses were all answered before /healthz was"
    );
    let mut hashed = 0;
    for guess in guesses {
        match guess.await.expect("a guess") {
            (401, code, _) if code == "gallery_pin_wrong" => hashed += 1,
            (503, code, Some(1)) if code == "busy" => {}
            other => panic!("{other:?}"),
        }
    }
    let places = stagehand::http::gallery_pin::PIN_CHECKS_AT_ONCE
        + stagehand::http::gallery_pin::PIN_CHECKS_WAITING;
    assert!(hashed >= places, "{hashed} hashed");
    app.stop().await;
}
db_test!(the_pin_hash_leaves_the_http_workers_free);

/// A new PIN ends the lock at once (the guesses were at the old one) and
/// starts a new count: what /ops tells an organiser to do.
async fn a_new_pin_ends_the_lock(backend: Backend) {
    let app = TestApp::spawn_with(backend, fast_sim(), |c| {
        c.trusted_proxies = 1;
        c.gallery_pin_guesses = stagehand::config::parse_rate_limit("3/30m").unwrap();
    })
    .await;
    let (base, http) = (&app.base, &app.http);
    let slug = pin_gallery(base, http, "24681357").await;
    for n in 1..=3 {
        let client = format!("198.51.100.{n}");
        let answer = answer_of(gallery_with(base, http, &slug, "11111111", &client).await).await;
        assert_eq!(answer.1, "gallery_pin_wrong");
    }
    let answer = answer_of(gallery_with(base, http, &slug, "24681357", "192.0.2.1").await).await;
    assert_eq!(answer.1, "gallery_locked");
    let (status, body) = patch(base, http, &slug, json!({"gallery_pin": "86421357"})).await;
    assert_eq!(status, 200, "{body}");
    let answer = answer_of(gallery_with(base, http, &slug, "86421357", "192.0.2.2").await).await;
    assert_eq!(answer.0, 200, "{answer:?}");
    let answer = answer_of(gallery_with(base, http, &slug, "24681357", "192.0.2.3").await).await;
    assert_eq!(
        answer.1, "gallery_pin_wrong",
        "the old PIN is just wrong now"
    );
    app.stop().await;
}
db_test!(a_new_pin_ends_the_lock);
