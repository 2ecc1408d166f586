//! Test support: a fresh database per test (SQLite temp file, or a new
//! PostgreSQL database when `STAGEHAND_TEST_POSTGRES_URL` is set), the real
//! application on a random port, the built-in simulator as the AI provider,
//! and small clients for HTTP and the terminal socket. Waiting is always on a
//! condition with a deadline.
#![allow(dead_code)]

pub mod multipart;
pub mod printer;
pub mod smtp;
pub mod webhooks;

use std::fs::File;
use std::future::Future;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use sea_orm::{ConnectionTrait, Database};
use serde_json::{json, Value};
use stagehand::ai::simulator::{self, RunningSim, SimConfig, SimControl};
use stagehand::config::Config;
use stagehand::http::AppState;
use stagehand::startup::Application;
use stagehand::store::Store;
use tokio_tungstenite::tungstenite::Message;

pub const OPERATOR: &str = "test-operator-token";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

pub fn postgres_admin_url() -> Option<String> {
    std::env::var("STAGEHAND_TEST_POSTGRES_URL")
        .ok()
        .filter(|u| !u.is_empty())
}

/// Generates `mod NAME { sqlite, postgres }` tests that run `async fn
/// NAME(backend: Backend)`. The PostgreSQL one is reported ignored when
/// `STAGEHAND_TEST_POSTGRES_URL` was not set at build time (`build.rs`),
/// never passed without running (CI always sets it, and fails if any was
/// ignored).
#[macro_export]
macro_rules! db_test {
    ($name:ident) => {
        mod $name {
            #[actix_web::test]
            async fn sqlite() {
                super::$name($crate::support::Backend::Sqlite).await
            }
            #[actix_web::test]
            #[cfg_attr(not(pg_tests), ignore = "STAGEHAND_TEST_POSTGRES_URL is not set")]
            async fn postgres() {
                super::$name($crate::support::Backend::Postgres).await
            }
        }
    };
}

/// A fresh, empty database. SQLite's is deleted with the value; a
/// PostgreSQL one is left (the app may still hold connections to it when
/// the value goes), and `.ci/run` drops the `stagehand_test_*` databases
/// of earlier runs before it starts.
pub struct TestDb {
    pub url: String,
    pub backend: Backend,
    _dir: Option<tempfile::TempDir>,
}

impl TestDb {
    pub async fn fresh(backend: Backend) -> TestDb {
        match backend {
            Backend::Sqlite => {
                let dir = tempfile::tempdir().expect("temp dir");
                let url = format!("sqlite://{}/stagehand.db?mode=rwc", dir.path().display());
                TestDb {
                    url,
                    backend,
                    _dir: Some(dir),
                }
            }
            Backend::Postgres => {
                let admin = postgres_admin_url().expect("STAGEHAND_TEST_POSTGRES_URL");
                let name = format!("stagehand_test_{}", uuid::Uuid::new_v4().simple());
                let conn = Database::connect(&admin)
                    .await
                    .expect("connect to PostgreSQL admin URL");
                conn.execute_unprepared(&format!("CREATE DATABASE \"{name}\""))
                    .await
                    .expect("create test database");
                conn.close().await.ok();
                let base = admin
                    .rsplit_once('/')
                    .map(|(b, _)| b.to_owned())
                    .unwrap_or(admin);
                TestDb {
                    url: format!("{base}/{name}"),
                    backend,
                    _dir: None,
                }
            }
        }
    }

    /// A migrated store on this database.
    pub async fn store(&self) -> Store {
        let store = Store::connect(&self.url, 20).await.expect("connect");
        store.migrate().await.expect("migrate");
        store
    }

    /// The database name (PostgreSQL).
    pub fn name(&self) -> &str {
        self.url.rsplit('/').next().unwrap_or_default()
    }
}

/// Logs of the app under test, when `RUST_LOG` asks for them.
pub fn init_logs() {
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
    }
}

/// Short durations so every path runs in well under a second or two.
pub fn test_config(db: &TestDb, ai_url: &str) -> Config {
    let mut c = Config::defaults();
    c.database_url = db.url.clone();
    c.bind = "127.0.0.1:0".into();
    c.ai_url = Some(ai_url.to_owned());
    c.operator_token = Some(OPERATOR.into());
    // Media in a folder of the test's own (beside the SQLite file would do,
    // but a PostgreSQL test has no file).
    c.media_url = Some(
        std::env::temp_dir()
            .join(format!(
                "stagehand-test-media-{}",
                uuid::Uuid::new_v4().simple()
            ))
            .display()
            .to_string(),
    );
    // The server's secret: one per database, so its instances agree.
    c.secret_file = Some(secret_file_of(&db.url).into());
    c.poll_interval = Duration::from_millis(200);
    c.lease = Duration::from_secs(3);
    c.cleanup_interval = Duration::from_secs(3600);
    c.ai_timeout = Duration::from_secs(60);
    c.ai_poll_interval = Duration::from_millis(50);
    c.backoff_base = Duration::from_millis(100);
    c.backoff_max = Duration::from_millis(400);
    c.saga_deadline = Duration::from_secs(120);
    c.db_pool = 10;
    // Every test client is 127.0.0.1 and many tests fire hundreds of
    // requests at once: rate limits are off unless a test sets them
    // (tests/hostile.rs).
    c.session_rate_limit = stagehand::config::RateLimit::Off;
    c.submission_rate_limit = stagehand::config::RateLimit::Off;
    c.upload_rate_limit = stagehand::config::RateLimit::Off;
    c
}

pub fn fast_sim() -> SimConfig {
    SimConfig {
        latency: Duration::from_millis(100),
        reject_word: Some("forbidden".into()),
        fail_rate: 0.0,
        unavailable_rate: 0.0,
        refuse_cancel: false,
        delete_outputs_after: None,
    }
}

pub async fn start_sim(config: SimConfig) -> RunningSim {
    simulator::start("127.0.0.1:0", SimControl::new(config))
        .await
        .expect("start simulator")
}

/// The application running in this process.
pub struct TestApp {
    pub base: String,
    pub port: u16,
    pub state: AppState,
    pub app_cleanup: actix::Addr<stagehand::actors::cleanup::CleanupActor>,
    pub sim: RunningSim,
    pub db: TestDb,
    pub http: reqwest::Client,
    server: actix_web::dev::ServerHandle,
}

impl TestApp {
    pub async fn spawn(backend: Backend) -> TestApp {
        Self::spawn_with(backend, fast_sim(), |_| {}).await
    }

    pub async fn spawn_with(
        backend: Backend,
        sim: SimConfig,
        tweak: impl FnOnce(&mut Config),
    ) -> TestApp {
        let clock = std::sync::Arc::new(stagehand::clock::SystemClock);
        Self::spawn_with_clock(backend, sim, tweak, clock).await
    }

    /// The application on an injected clock (e.g. a `ManualClock`).
    pub async fn spawn_with_clock(
        backend: Backend,
        sim: SimConfig,
        tweak: impl FnOnce(&mut Config),
        clock: stagehand::clock::SharedClock,
    ) -> TestApp {
        init_logs();
        let db = TestDb::fresh(backend).await;
        let sim = start_sim(sim).await;
        let mut config = test_config(&db, &sim.url());
        tweak(&mut config);
        let app = Application::build_with_clock(config, clock)
            .await
            .expect("build application");
        let port = app.port();
        let state = app.state().clone();
        let app_cleanup = app.cleanup();
        let (server, _) = app.into_server();
        let handle = server.handle();
        actix_web::rt::spawn(server);
        TestApp {
            base: format!("http://127.0.0.1:{port}"),
            port,
            state,
            app_cleanup,
            sim,
            db,
            http: reqwest::Client::new(),
            server: handle,
        }
    }

    pub async fn stop(self) {
        self.server.stop(false).await;
    }

    pub async fn experience(&self, max_in_flight: i32) -> String {
        create_experience(&self.http, &self.base, max_in_flight).await
    }

    /// An experience made from `body` with `extra`'s fields laid over it
    /// (201 asserted): its slug, which `body` names.
    pub async fn experience_from(&self, body: Value, extra: Value) -> String {
        let mut body = body;
        for (k, v) in extra.as_object().expect("extra is an object") {
            body[k] = v.clone();
        }
        let resp = self
            .http
            .post(format!("{}/api/experiences", self.base))
            .bearer_auth(OPERATOR)
            .json(&body)
            .send()
            .await
            .expect("POST experiences");
        let status = resp.status();
        assert_eq!(status, 201, "{}", resp.text().await.unwrap_or_default());
        body["slug"].as_str().expect("a slug").to_owned()
    }

    pub async fn terminal(&self, slug: &str) -> (String, String) {
        create_terminal(&self.http, &self.base, slug).await
    }

    pub async fn session(
        &self,
        slug: &str,
        terminal: Option<&str>,
        nickname: &str,
    ) -> (String, String) {
        create_session(&self.http, &self.base, slug, terminal, nickname).await
    }

    pub async fn submit(
        &self,
        sid: &str,
        token: &str,
        body: Value,
        key: &str,
    ) -> reqwest::Response {
        submit(&self.http, &self.base, sid, token, body, key).await
    }

    /// A submission with full control: no token or key when `None`, the body
    /// sent as raw bytes.
    pub async fn submit_raw(
        &self,
        sid: &str,
        token: Option<&str>,
        key: Option<&str>,
        body: String,
    ) -> reqwest::Response {
        let mut req = self
            .http
            .post(format!("{}/api/sessions/{sid}/submission", self.base))
            .header("content-type", "application/json")
            .body(body);
        if let Some(token) = token {
            req = req.bearer_auth(token);
        }
        if let Some(key) = key {
            req = req.header("Idempotency-Key", key);
        }
        req.send().await.expect("POST submission")
    }

    /// GET a public path and parse its JSON.
    pub async fn get_json(&self, path: &str) -> Value {
        let resp = self
            .http
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .expect("GET");
        assert_eq!(resp.status(), 200, "GET {path}");
        resp.json().await.expect("JSON body")
    }

    /// GET with the operator token: the status and the JSON body.
    pub async fn operator_get(&self, path: &str) -> (u16, Value) {
        let resp = self
            .http
            .get(format!("{}{path}", self.base))
            .bearer_auth(OPERATOR)
            .send()
            .await
            .expect("GET");
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    /// POST (empty body) with the operator token and an optional
    /// Idempotency-Key: the status, whether it was a replay, the body.
    pub async fn operator_post(&self, path: &str, key: Option<&str>) -> (u16, bool, Value) {
        let mut req = self
            .http
            .post(format!("{}{path}", self.base))
            .bearer_auth(OPERATOR);
        if let Some(key) = key {
            req = req.header("Idempotency-Key", key);
        }
        let resp = req.send().await.expect("POST");
        let status = resp.status().as_u16();
        let replayed = resp.headers().get("Idempotent-Replayed").is_some();
        (status, replayed, resp.json().await.unwrap_or(Value::Null))
    }

    /// The saga of a session, as the admin list shows it.
    /// Waits (20 s at most) until each session's saga waits in review;
    /// their saga ids, in the order of `sessions`.
    pub async fn in_review(&self, sessions: &[(String, String)]) -> Vec<String> {
        wait_for(Duration::from_secs(20), || async {
            let (status, body) = self.operator_get("/api/admin/review?limit=500").await;
            assert_eq!(status, 200, "{body}");
            let items = body["items"].as_array()?.clone();
            sessions
                .iter()
                .map(|(sid, _)| {
                    items
                        .iter()
                        .find(|i| i["session_id"] == sid.as_str())
                        .map(|i| i["saga_id"].as_str().unwrap().to_owned())
                })
                .collect::<Option<Vec<String>>>()
        })
        .await
        .unwrap_or_else(|| panic!("{} sessions never all waited in review", sessions.len()))
    }

    pub async fn saga_of(&self, session_id: &str) -> Value {
        let (status, body) = self.operator_get("/api/admin/sagas?limit=500").await;
        assert_eq!(status, 200, "{body}");
        body["sagas"]
            .as_array()
            .and_then(|all| all.iter().find(|s| s["session_id"] == session_id).cloned())
            .unwrap_or_else(|| panic!("no saga of session {session_id} in {body}"))
    }

    pub async fn status(&self, sid: &str, token: &str) -> Value {
        session_status(&self.http, &self.base, sid, token).await
    }

    pub async fn terminal_socket(&self, terminal_id: &str, token: &str, after: i64) -> Socket {
        Socket::connect(self.port, terminal_id, token, after).await
    }

    /// Waits until the session is COMPLETED or ABORTED and returns it.
    pub async fn wait_final(&self, sid: &str, token: &str, within: Duration) -> Value {
        wait_final(&self.http, &self.base, sid, token, within).await
    }

    /// A photo session of the photo experience `slug` (at `terminal`)
    /// run to COMPLETED with the fixture photo: its id, token and final
    /// view.
    pub async fn photo_session(
        &self,
        slug: &str,
        terminal: Option<&str>,
    ) -> (String, String, Value) {
        let (sid, token) = self.session(slug, terminal, "ana").await;
        let photo = self
            .http
            .post(format!("{}/api/sessions/{sid}/photo", self.base))
            .bearer_auth(&token)
            .header("Idempotency-Key", uuid::Uuid::new_v4().to_string())
            .body(include_bytes!("../fixtures/photo-gps-rotated.jpg").to_vec())
            .send()
            .await
            .expect("POST photo");
        assert_eq!(photo.status(), 201);
        let photo: Value = photo.json().await.unwrap();
        let key = uuid::Uuid::new_v4().to_string();
        let resp = self
            .submit(&sid, &token, json!({"photo_id": photo["photo_id"]}), &key)
            .await;
        assert_eq!(resp.status(), 202);
        let done = self.wait_final(&sid, &token, Duration::from_secs(60)).await;
        assert_eq!(done["status"], "COMPLETED", "{done}");
        (sid, token, done)
    }
}

/// One request to `base` with `token` as bearer (none when empty), an
/// optional JSON body and an optional Idempotency-Key: the status and the
/// JSON body (Null when not JSON).
pub async fn api_call(
    http: &reqwest::Client,
    base: &str,
    method: &str,
    path: &str,
    token: &str,
    body: Option<Value>,
    key: Option<&str>,
) -> (u16, Value) {
    let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
    let mut req = http.request(method.clone(), format!("{base}{path}"));
    if !token.is_empty() {
        req = req.bearer_auth(token);
    }
    if let Some(body) = body {
        req = req.json(&body);
    }
    if let Some(key) = key {
        req = req.header("Idempotency-Key", key);
    }
    let resp = req
        .send()
        .await
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// An operator account as a test holds it.
#[derive(Debug, Clone)]
pub struct OperatorAccount {
    pub id: String,
    pub name: String,
    pub token: String,
}

/// Creates an operator with `by`'s token (and `key` as its
/// Idempotency-Key): answered 201 with the name and role asked for, not
/// revoked, and a token shown this once.
pub async fn create_operator(
    http: &reqwest::Client,
    base: &str,
    by: &str,
    name: &str,
    role: &str,
    key: Option<&str>,
) -> OperatorAccount {
    let (status, body) = api_call(
        http,
        base,
        "POST",
        "/api/admin/operators",
        by,
        Some(json!({"name": name, "role": role})),
        key,
    )
    .await;
    assert_eq!(status, 201, "create operator {name}: {body}");
    assert_eq!(body["name"], name, "{body}");
    assert_eq!(body["role"], role, "{body}");
    assert_eq!(body["revoked_at"], Value::Null, "{body}");
    OperatorAccount {
        id: body["operator_id"]
            .as_str()
            .expect("operator_id")
            .to_owned(),
        name: name.to_owned(),
        token: body["token"].as_str().expect("token").to_owned(),
    }
}

pub async fn create_experience(http: &reqwest::Client, base: &str, max_in_flight: i32) -> String {
    let slug = format!("exp-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let resp = http
        .post(format!("{base}/api/experiences"))
        .bearer_auth(OPERATOR)
        .json(&json!({"slug": slug, "title": "Booth", "kind": "comic", "ai_calls": 1, "max_in_flight": max_in_flight}))
        .send()
        .await
        .expect("POST /api/experiences");
    assert_eq!(resp.status(), 201, "{:?}", resp.text().await);
    slug
}

pub async fn create_terminal(http: &reqwest::Client, base: &str, slug: &str) -> (String, String) {
    let resp = http
        .post(format!("{base}/api/terminals"))
        .bearer_auth(OPERATOR)
        .json(&json!({"experience": slug, "name": "booth 1"}))
        .send()
        .await
        .expect("POST /api/terminals");
    assert_eq!(resp.status(), 201);
    let body: Value = resp.json().await.unwrap();
    (
        body["terminal_id"].as_str().unwrap().to_owned(),
        body["token"].as_str().unwrap().to_owned(),
    )
}

pub async fn create_session(
    http: &reqwest::Client,
    base: &str,
    slug: &str,
    terminal: Option<&str>,
    nickname: &str,
) -> (String, String) {
    let mut body = json!({"nickname": nickname});
    if let Some(t) = terminal {
        body["terminal_id"] = t.into();
    }
    let resp = http
        .post(format!("{base}/api/experiences/{slug}/sessions"))
        .json(&body)
        .send()
        .await
        .expect("POST sessions");
    assert_eq!(resp.status(), 201);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["status"], "OPEN");
    (
        body["session_id"].as_str().unwrap().to_owned(),
        body["participant_token"].as_str().unwrap().to_owned(),
    )
}

pub async fn submit(
    http: &reqwest::Client,
    base: &str,
    sid: &str,
    token: &str,
    body: Value,
    key: &str,
) -> reqwest::Response {
    http.post(format!("{base}/api/sessions/{sid}/submission"))
        .bearer_auth(token)
        .header("Idempotency-Key", key)
        .json(&body)
        .send()
        .await
        .expect("POST submission")
}

pub async fn session_status(http: &reqwest::Client, base: &str, sid: &str, token: &str) -> Value {
    let resp = http
        .get(format!("{base}/api/sessions/{sid}"))
        .bearer_auth(token)
        .send()
        .await
        .expect("GET session");
    assert_eq!(resp.status(), 200);
    resp.json().await.unwrap()
}

pub async fn wait_final(
    http: &reqwest::Client,
    base: &str,
    sid: &str,
    token: &str,
    within: Duration,
) -> Value {
    let found = wait_for(within, || {
        let http = http.clone();
        async move {
            let s = session_status(&http, base, sid, token).await;
            let done = matches!(s["status"].as_str(), Some("COMPLETED") | Some("ABORTED"));
            Some(s).filter(|_| done)
        }
    })
    .await;
    match found {
        Some(s) => s,
        None => {
            let last = session_status(http, base, sid, token).await;
            panic!("session {sid} did not end within {within:?}: {last}")
        }
    }
}

/// Backends of the store's PostgreSQL database waiting for a heavyweight
/// lock now (a write that waits on another transaction's row).
pub async fn lock_waiters(store: &Store) -> i64 {
    let row = store
        .db()
        .query_one_raw(store.sql(
            "SELECT COUNT(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
             AND datname = current_database()",
            vec![],
        ))
        .await
        .unwrap()
        .unwrap();
    row.try_get_by_index(0).unwrap()
}

/// Polls `probe` every 25 ms until it yields `Some`, or gives up after
/// `within` (None).
pub async fn wait_for<T, F, Fut>(within: Duration, mut probe: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if let Some(v) = probe().await {
            return Some(v);
        }
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// A terminal display's socket.
pub struct Socket {
    ws: tokio_tungstenite::WebSocketStream<
        tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
    >,
}

impl Socket {
    pub async fn connect(port: u16, terminal_id: &str, token: &str, after: i64) -> Socket {
        let url =
            format!("ws://127.0.0.1:{port}/ws/terminals/{terminal_id}?token={token}&after={after}");
        let (ws, _) = tokio_tungstenite::connect_async(url)
            .await
            .expect("terminal socket");
        Socket { ws }
    }

    /// The operators' socket (`GET /ws/operators?token=`).
    pub async fn operators(port: u16, token: &str) -> Result<Socket, String> {
        let url = format!("ws://127.0.0.1:{port}/ws/operators?token={token}");
        match tokio_tungstenite::connect_async(url).await {
            Ok((ws, _)) => Ok(Socket { ws }),
            Err(e) => Err(e.to_string()),
        }
    }

    /// Sends one JSON text frame (a display's ack).
    pub async fn send_json(&mut self, frame: Value) {
        self.ws
            .send(Message::Text(frame.to_string().into()))
            .await
            .expect("send a frame");
    }

    /// The next JSON frame of this `type`, skipping others, or None after
    /// `within`.
    pub async fn next_of_type(&mut self, kind: &str, within: Duration) -> Option<Value> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let left = deadline.checked_duration_since(tokio::time::Instant::now())?;
            let frame = self.next_json(left).await?;
            if frame["type"] == kind {
                return Some(frame);
            }
        }
    }

    /// The next JSON text frame, or None after `within`.
    pub async fn next_json(&mut self, within: Duration) -> Option<Value> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let left = deadline.checked_duration_since(tokio::time::Instant::now())?;
            match tokio::time::timeout(left, self.ws.next()).await {
                Ok(Some(Ok(Message::Text(text)))) => return serde_json::from_str(&text).ok(),
                Ok(Some(Ok(Message::Ping(p)))) => {
                    let _ = self.ws.send(Message::Pong(p)).await;
                }
                Ok(Some(Ok(_))) => {}
                _ => return None,
            }
        }
    }

    /// The next frame whose type starts with `session.`.
    pub async fn next_session_event(&mut self, within: Duration) -> Option<Value> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let left = deadline.checked_duration_since(tokio::time::Instant::now())?;
            let frame = self.next_json(left).await?;
            if frame["type"]
                .as_str()
                .is_some_and(|t| t.starts_with("session."))
            {
                return Some(frame);
            }
        }
    }
}

/// What [`Socket::next_frame`] saw.
#[derive(Debug)]
pub enum Frame {
    /// A JSON text frame.
    Json(Value),
    /// The server closed the socket (close frame, end of stream or error).
    Closed(String),
    /// Nothing within the time given; the socket is still open.
    TimedOut,
}

impl Socket {
    /// Like [`Socket::connect`], but a refused connection is an error, not a
    /// panic (a display retries).
    pub async fn try_connect(
        port: u16,
        terminal_id: &str,
        token: &str,
        after: i64,
    ) -> Result<Socket, String> {
        let url =
            format!("ws://127.0.0.1:{port}/ws/terminals/{terminal_id}?token={token}&after={after}");
        match tokio_tungstenite::connect_async(url).await {
            Ok((ws, _)) => Ok(Socket { ws }),
            Err(e) => Err(e.to_string()),
        }
    }

    /// The next frame, telling a closed socket apart from a quiet one.
    pub async fn next_frame(&mut self, within: Duration) -> Frame {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let Some(left) = deadline.checked_duration_since(tokio::time::Instant::now()) else {
                return Frame::TimedOut;
            };
            match tokio::time::timeout(left, self.ws.next()).await {
                Err(_) => return Frame::TimedOut,
                Ok(None) => return Frame::Closed("end of stream".into()),
                Ok(Some(Err(e))) => return Frame::Closed(format!("error: {e}")),
                Ok(Some(Ok(Message::Text(text)))) => match serde_json::from_str(&text) {
                    Ok(v) => return Frame::Json(v),
                    Err(e) => panic!("terminal sent a text frame that is not JSON ({e}): {text}"),
                },
                Ok(Some(Ok(Message::Close(c)))) => return Frame::Closed(format!("close {c:?}")),
                // Pings are answered by tungstenite itself while reading.
                Ok(Some(Ok(_))) => {}
            }
        }
    }
}

/// A booth display as a real one behaves: it remembers the last `seq` it
/// saw and, when the server closes its socket, reconnects with
/// `after=<that seq>`. It records every `session.*` frame in arrival order.
pub struct Display {
    pub name: String,
    port: u16,
    terminal_id: String,
    token: String,
    socket: Option<Socket>,
    /// `seq` of the last event received (the `after` of the next connect).
    pub last_seq: i64,
    /// Every `session.*` frame received, in order.
    pub events: Vec<Value>,
    /// Every `hello` frame received.
    pub hellos: Vec<Value>,
    /// Times the server closed the socket and the display reconnected.
    pub reconnects: u32,
    /// Why the server closed the socket, each time.
    pub close_reasons: Vec<String>,
}

impl Display {
    /// Opens the socket (the WebSocket handshake only: nothing is read).
    pub async fn connect(
        name: &str,
        port: u16,
        terminal_id: &str,
        token: &str,
        after: i64,
    ) -> Display {
        let socket = Socket::try_connect(port, terminal_id, token, after)
            .await
            .unwrap_or_else(|e| panic!("display {name}: cannot connect: {e}"));
        Display {
            name: name.to_owned(),
            port,
            terminal_id: terminal_id.to_owned(),
            token: token.to_owned(),
            socket: Some(socket),
            last_seq: after,
            events: Vec::new(),
            hellos: Vec::new(),
            reconnects: 0,
            close_reasons: Vec::new(),
        }
    }

    /// The next `session.*` frame (recorded), reconnecting with the last
    /// seen `seq` whenever the server closes the socket; None after `within`.
    pub async fn next_event(&mut self, within: Duration) -> Option<Value> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let left = deadline.checked_duration_since(tokio::time::Instant::now())?;
            let socket = match self.socket.as_mut() {
                Some(s) => s,
                None => {
                    match Socket::try_connect(
                        self.port,
                        &self.terminal_id,
                        &self.token,
                        self.last_seq,
                    )
                    .await
                    {
                        Ok(s) => {
                            self.reconnects += 1;
                            self.socket = Some(s);
                        }
                        // A retry pause, not an assertion: a real display
                        // backs off before reconnecting.
                        Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                    }
                    continue;
                }
            };
            match socket.next_frame(left).await {
                Frame::TimedOut => return None,
                Frame::Closed(reason) => {
                    self.close_reasons.push(reason);
                    self.socket = None;
                }
                Frame::Json(v) => {
                    let kind = v["type"].as_str().unwrap_or_default();
                    if kind == "hello" {
                        self.hellos.push(v);
                    } else if kind.starts_with("session.") {
                        if let Some(seq) = v["seq"].as_i64() {
                            self.last_seq = seq;
                        }
                        self.events.push(v.clone());
                        return Some(v);
                    }
                }
            }
        }
    }

    /// Reads until `count` events have been received in all, or `within`
    /// has passed; true when the count was reached.
    pub async fn read_until_count(&mut self, count: usize, within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        while self.events.len() < count {
            let Some(left) = deadline.checked_duration_since(tokio::time::Instant::now()) else {
                return false;
            };
            if self.next_event(left).await.is_none() {
                return self.events.len() >= count;
            }
        }
        true
    }

    /// `seq` of every event received, in order (-1 for a frame without one).
    pub fn seqs(&self) -> Vec<i64> {
        self.events
            .iter()
            .map(|e| e["seq"].as_i64().unwrap_or(-1))
            .collect()
    }

    /// Checks what every display owes: each expected session exactly once,
    /// nothing else, `seq` strictly increasing over everything received, and
    /// the last `seq` equal to `last_seq`.
    pub fn check_delivery(&self, expected: &[String], last_seq: i64) -> Result<(), String> {
        let name = &self.name;
        let seqs = self.seqs();
        if let Some(i) = seqs.iter().position(|s| *s < 1) {
            return Err(format!(
                "display {name}: frame #{i} has no valid seq: {}",
                self.events[i]
            ));
        }
        if let Some(w) = seqs.windows(2).position(|w| w[1] <= w[0]) {
            return Err(format!(
                "display {name}: seq not strictly increasing: frame #{} has seq {} after {}",
                w + 1,
                seqs[w + 1],
                seqs[w]
            ));
        }
        let mut seen = std::collections::HashMap::<&str, usize>::new();
        for e in &self.events {
            *seen
                .entry(e["session_id"].as_str().unwrap_or("?"))
                .or_default() += 1;
        }
        let duplicated = seen.values().filter(|n| **n > 1).count();
        let want: std::collections::HashSet<&str> = expected.iter().map(String::as_str).collect();
        let missing = want.iter().filter(|s| !seen.contains_key(**s)).count();
        let unexpected = seen.keys().filter(|s| !want.contains(**s)).count();
        if duplicated > 0 || missing > 0 || unexpected > 0 {
            return Err(format!(
                "display {name}: received {} events for {} sessions: {missing} of {} expected sessions missing, \
                 {duplicated} sessions received more than once, {unexpected} unexpected (reconnects: {}, \
                 closes: {:?})",
                self.events.len(),
                seen.len(),
                want.len(),
                self.reconnects,
                self.close_reasons.iter().take(3).collect::<Vec<_>>()
            ));
        }
        if seqs.last().copied() != Some(last_seq) {
            return Err(format!(
                "display {name}: last seq is {:?}, expected {last_seq}",
                seqs.last()
            ));
        }
        Ok(())
    }
}

/// A display read all the time by a background task (on this test's
/// thread), which stamps each event with its arrival time. It stops when it
/// has `count` events or at its cut-off.
pub struct DisplayReader {
    pub arrivals: tokio::sync::mpsc::UnboundedReceiver<(std::time::Instant, Value)>,
    cutoff: std::rc::Rc<std::cell::Cell<std::time::Instant>>,
    handle: tokio::task::JoinHandle<Display>,
}

impl DisplayReader {
    pub fn spawn(mut display: Display, count: usize, within: Duration) -> DisplayReader {
        let (tx, arrivals) = tokio::sync::mpsc::unbounded_channel();
        let cutoff = std::rc::Rc::new(std::cell::Cell::new(std::time::Instant::now() + within));
        let stop_at = cutoff.clone();
        let handle = actix_web::rt::spawn(async move {
            while display.events.len() < count && std::time::Instant::now() < stop_at.get() {
                if let Some(event) = display.next_event(Duration::from_millis(250)).await {
                    let _ = tx.send((std::time::Instant::now(), event));
                }
            }
            display
        });
        DisplayReader {
            arrivals,
            cutoff,
            handle,
        }
    }

    /// Moves the cut-off earlier (never later), e.g. to fail fast once
    /// everything is known to be final.
    pub fn cut_off_at(&self, at: std::time::Instant) {
        if at < self.cutoff.get() {
            self.cutoff.set(at);
        }
    }

    /// Waits for the task to stop (count reached or cut-off) and returns the display.
    pub async fn finish(self) -> Display {
        self.handle.await.expect("display reader task")
    }
}

/// One more application instance on an existing database (multi-instance
/// tests build two on one PostgreSQL database).
pub struct Instance {
    pub base: String,
    pub port: u16,
    pub state: AppState,
    server: actix_web::dev::ServerHandle,
}

impl Instance {
    pub async fn start(db: &TestDb, ai_url: &str, tweak: impl FnOnce(&mut Config)) -> Instance {
        init_logs();
        let mut config = test_config(db, ai_url);
        tweak(&mut config);
        let app = Application::build(config).await.expect("instance");
        let port = app.port();
        let state = app.state().clone();
        let (server, _) = app.into_server();
        let handle = server.handle();
        actix_web::rt::spawn(server);
        Instance {
            base: format!("http://127.0.0.1:{port}"),
            port,
            state,
            server: handle,
        }
    }

    pub async fn stop(self) {
        self.server.stop(false).await;
    }
}

/// `count` sessions of `slug` made and submitted (a prompt) on `bases` in
/// turn, then waited on until each ended: each one's base, id and token.
pub async fn sessions_across(
    http: &reqwest::Client,
    bases: &[&str],
    slug: &str,
    count: usize,
) -> Vec<(String, String, String)> {
    let mut sessions = Vec::with_capacity(count);
    for i in 0..count {
        let base = bases[i % bases.len()];
        let (sid, token) = create_session(http, base, slug, None, &format!("g{i}")).await;
        let key = uuid::Uuid::new_v4().to_string();
        let resp = submit(http, base, &sid, &token, json!({"prompt": "a kite"}), &key).await;
        assert_eq!(resp.status(), 202);
        sessions.push((base.to_owned(), sid, token));
    }
    let pairs: Vec<(String, String)> = sessions
        .iter()
        .map(|(_, s, t)| (s.clone(), t.clone()))
        .collect();
    wait_all_final(http, bases[0], &pairs, Duration::from_secs(60))
        .await
        .expect("every session ends");
    sessions
}

/// Waits until every session is final (COMPLETED or ABORTED), checking them
/// one after the other against one shared deadline. Err says how many were
/// still not final when it passed.
pub async fn wait_all_final(
    http: &reqwest::Client,
    base: &str,
    sessions: &[(String, String)],
    within: Duration,
) -> Result<Vec<Value>, String> {
    let deadline = tokio::time::Instant::now() + within;
    let mut finals = Vec::with_capacity(sessions.len());
    for (i, (sid, tok)) in sessions.iter().enumerate() {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let found = wait_for(left, || {
            let http = http.clone();
            async move {
                let s = session_status(&http, base, sid, tok).await;
                let done = matches!(s["status"].as_str(), Some("COMPLETED") | Some("ABORTED"));
                Some(s).filter(|_| done)
            }
        })
        .await;
        match found {
            Some(s) => finals.push(s),
            None => {
                let mut not_final = 0;
                for (sid, tok) in &sessions[i..] {
                    let s = session_status(http, base, sid, tok).await;
                    if !matches!(s["status"].as_str(), Some("COMPLETED") | Some("ABORTED")) {
                        not_final += 1;
                    }
                }
                return Err(format!(
                    "{not_final} of {} sessions were still not final after {within:?}",
                    sessions.len()
                ));
            }
        }
    }
    Ok(finals)
}

/// reqwest is built without a default TLS provider; the application installs
/// one when it starts, but here it runs in another process.
/// The peak resident memory of process `pid` (`VmHWM`), in KiB.
pub fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM")
}

pub fn http_client() -> reqwest::Client {
    stagehand::ai::client::ensure_crypto_provider();
    reqwest::Client::new()
}

/// The last `lines` lines of a log file.
pub fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| format!("<cannot read: {e}>"));
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// The log files of the server runs of one test; on panic, prints their tails.
pub struct Logs {
    dir: tempfile::TempDir,
    files: Vec<PathBuf>,
}

impl Logs {
    pub fn new() -> Logs {
        Logs {
            dir: tempfile::tempdir().expect("log dir"),
            files: Vec::new(),
        }
    }

    pub fn next(&mut self) -> PathBuf {
        let path = self
            .dir
            .path()
            .join(format!("server-{}.log", self.files.len() + 1));
        self.files.push(path.clone());
        path
    }
}

impl Drop for Logs {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for file in &self.files {
                eprintln!(
                    "----- tail of {} -----\n{}\n-----",
                    file.display(),
                    tail(file, 80)
                );
            }
        }
    }
}

/// A free loopback port: bind port 0, read it, let it go.
/// Runs the built `stagehand` with `args` (a subcommand and its flags) to
/// its end, its stdout and stderr in one file; its exit code and that
/// output when it exits within `deadline`, a panic with the output
/// otherwise.
pub fn run_stagehand(args: &[&str], deadline: Duration) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("out.log");
    let file = File::create(&out).expect("log file");
    let mut child = Command::new(env!("CARGO_BIN_EXE_stagehand"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(file.try_clone().expect("log file"))
        .stderr(file)
        .spawn()
        .expect("start stagehand");
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if start.elapsed() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "stagehand {} still running after {deadline:?}:\n{}",
                args.first().unwrap_or(&""),
                std::fs::read_to_string(&out).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    (
        status.code(),
        std::fs::read_to_string(&out).unwrap_or_default(),
    )
}

pub fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("local addr").port()
}

/// The port a `stagehand serve` child listens on, from its log line
/// `stagehand listening on http://127.0.0.1:<port>`; panics (with the log)
/// if the child exits first or says nothing within 30 s.
async fn listening_port(child: &mut Child, log: &Path) -> u16 {
    const SAYS: &str = "stagehand listening on http://127.0.0.1:";
    let port = wait_for(Duration::from_secs(30), || {
        let exited = child.try_wait().ok().flatten();
        let said = std::fs::read_to_string(log).ok().and_then(|text| {
            let (_, after) = text.split_once(SAYS)?;
            let digits: String = after.chars().take_while(char::is_ascii_digit).collect();
            digits.parse::<u16>().ok()
        });
        async move {
            match (said, exited) {
                (Some(port), _) => Some(Ok(port)),
                (None, Some(status)) => Some(Err(status)),
                (None, None) => None,
            }
        }
    })
    .await;
    match port {
        Some(Ok(port)) => port,
        Some(Err(status)) => panic!(
            "stagehand serve exited ({status}) before listening:\n{}",
            tail(log, 40)
        ),
        None => panic!(
            "stagehand serve did not say its port within 30 s:\n{}",
            tail(log, 40)
        ),
    }
}

/// A `stagehand serve` child process; killed (SIGKILL) when dropped, so a
/// failing test never leaves a server behind.
/// A folder for the media of the servers on `db_url`.
pub fn media_folder_of(db_url: &str) -> String {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    db_url.hash(&mut hasher);
    std::env::temp_dir()
        .join(format!("stagehand-test-media-{:016x}", hasher.finish()))
        .display()
        .to_string()
}

/// Every file under `root`, as paths relative to it (a media folder's
/// keys; an S3 server's folder holds each bucket as a directory).
pub fn files_under(root: &Path) -> std::collections::BTreeSet<String> {
    let mut found = std::collections::BTreeSet::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if let Ok(rel) = path.strip_prefix(root) {
                found.insert(rel.display().to_string());
            }
        }
    }
    found
}

/// The server secret's file for the servers on `db_url` (made by the
/// first to start): beside their media, never the working directory.
pub fn secret_file_of(db_url: &str) -> String {
    format!("{}.secret", media_folder_of(db_url))
}

pub struct Server {
    child: Child,
    pub base: String,
    pub pid: u32,
}

impl Server {
    pub async fn start(db_url: &str, ai_url: &str, log: &Path, http: &reqwest::Client) -> Server {
        Self::start_with(db_url, ai_url, log, http, &[]).await
    }

    /// Like [`Server::start`], with `env` set over the test settings (an
    /// empty value removes a setting, so the server's default applies).
    pub async fn start_with(
        db_url: &str,
        ai_url: &str,
        log: &Path,
        http: &reqwest::Client,
        env: &[(&str, &str)],
    ) -> Server {
        let out = File::create(log).expect("log file");
        let err = out.try_clone().expect("log file");
        let mut command = Command::new(env!("CARGO_BIN_EXE_stagehand"));
        command
            .arg("serve")
            .env("STAGEHAND_DATABASE_URL", db_url)
            // The server takes a port of its own (port 0) and logs it. A
            // port picked here and freed could be taken before the child
            // binds it, by another test's server: the test would then talk
            // to that one (seen: a server that could not listen, and a
            // test that got another server's answers).
            .env("STAGEHAND_BIND", "127.0.0.1:0")
            .env("STAGEHAND_AI_URL", ai_url)
            .env("STAGEHAND_OPERATOR_TOKEN", OPERATOR)
            .env("STAGEHAND_POLL_INTERVAL", "200ms")
            .env("STAGEHAND_LEASE", "2s")
            .env("STAGEHAND_CLEANUP_INTERVAL", "1h")
            .env("STAGEHAND_AI_POLL_INTERVAL", "100ms")
            .env("STAGEHAND_BACKOFF_BASE", "100ms")
            .env("STAGEHAND_BACKOFF_MAX", "500ms")
            .env("STAGEHAND_MAX_RECOVERIES", "2")
            .env("RUST_LOG", "info")
            // The media beside the database: the same folder for every
            // server of one database (a restart finds what was kept), never
            // the working directory (PostgreSQL has no file to put it by).
            .env("STAGEHAND_MEDIA_URL", media_folder_of(db_url))
            .env("STAGEHAND_SECRET_FILE", secret_file_of(db_url))
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        for (name, value) in env {
            if value.is_empty() {
                command.env_remove(name);
            } else {
                command.env(name, value);
            }
        }
        let mut child = command.spawn().expect("start stagehand serve");
        let pid = child.id();
        let port = listening_port(&mut child, log).await;
        let mut server = Server {
            child,
            base: format!("http://127.0.0.1:{port}"),
            pid,
        };
        let url = format!("{}/healthz", server.base);
        let healthy = wait_for(Duration::from_secs(30), || {
            let http = http.clone();
            let url = url.clone();
            async move {
                let resp = http.get(url).send().await.ok()?;
                (resp.status() == 200).then_some(())
            }
        })
        .await;
        if healthy.is_none() {
            let exited = server.child.try_wait().ok().flatten();
            panic!(
                "server pid {} did not answer /healthz within 30 s (exit status: {exited:?})",
                server.pid
            );
        }
        server
    }

    /// SIGTERM: the graceful stop.
    pub fn sigterm(&self) {
        // SAFETY: kill(2) on our own child's pid; it is not reaped yet.
        let sent = unsafe { libc::kill(self.pid as i32, libc::SIGTERM) };
        assert_eq!(sent, 0, "SIGTERM the server");
    }

    /// Waits until the process exits (None when it is still running after
    /// `within`).
    pub async fn exited(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let child = &mut self.child;
        let started = std::time::Instant::now();
        loop {
            if let Some(status) = child.try_wait().expect("wait for the server") {
                return Some(status);
            }
            if started.elapsed() > within {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// SIGKILL (what `Child::kill` sends on Unix), then reap it.
    pub fn kill9(&mut self) {
        self.child.kill().expect("SIGKILL the server");
        let status = self.child.wait().expect("reap the server");
        assert!(
            !status.success(),
            "a killed server does not exit 0: {status}"
        );
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Every log line of this test binary, as text: the global subscriber is
/// installed once, writing here (see [`captured_logs`]).
#[derive(Clone, Default)]
pub struct CapturedLogs(pub std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for CapturedLogs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The logs of this test binary at `filter`, captured from the first call
/// on (a test binary captures at one filter: the first caller's).
pub fn captured_logs(filter: &'static str) -> CapturedLogs {
    static LOGS: std::sync::OnceLock<CapturedLogs> = std::sync::OnceLock::new();
    LOGS.get_or_init(|| {
        let logs = CapturedLogs::default();
        let writer = logs.clone();
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .try_init();
        logs
    })
    .clone()
}

/// A real S3-compatible server (s3s-fs, from crates.io) on 127.0.0.1 over a
/// folder of its own, for the media store's tests: never a mock of S3.
/// `.ci/run` installs it into `target/s3s`; `STAGEHAND_S3S_FS` names
/// another binary. Its access and secret keys are [`S3_ACCESS_KEY`] and
/// [`S3_SECRET_KEY`], which [`S3Server::credentials_in_env`] puts in the
/// `AWS_*` variables the media store reads.
pub struct S3Server {
    pub port: u16,
    pub root: tempfile::TempDir,
    child: Option<std::process::Child>,
}

pub const S3_ACCESS_KEY: &str = "stagehand-test-access";
pub const S3_SECRET_KEY: &str = "stagehand-test-secret-0123456789";

impl S3Server {
    fn binary() -> PathBuf {
        match std::env::var("STAGEHAND_S3S_FS") {
            Ok(path) if !path.is_empty() => PathBuf::from(path),
            _ => Path::new(env!("CARGO_MANIFEST_DIR")).join("target/s3s/bin/s3s-fs"),
        }
    }

    /// Starts it with one bucket, `bucket`, and waits until it answers.
    pub async fn start(bucket: &str) -> S3Server {
        let binary = Self::binary();
        assert!(
            binary.exists(),
            "no S3 server at {}: install it with `cargo install s3s-fs --version 0.14.1 \
             --features binary --locked --root target/s3s` (.ci/run does), or set STAGEHAND_S3S_FS",
            binary.display()
        );
        let root = tempfile::tempdir().expect("the S3 server's folder");
        std::fs::create_dir(root.path().join(bucket)).expect("the bucket's folder");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let mut server = S3Server {
            port,
            root,
            child: None,
        };
        server.resume().await;
        server
    }

    /// The media URL of `bucket` on this server.
    pub fn media_url(&self, bucket: &str) -> String {
        format!(
            "s3://{bucket}?endpoint=http://127.0.0.1:{}&region=us-east-1",
            self.port
        )
    }

    /// The credentials of every test server, in the environment the media
    /// store reads (the same values for all: safe to set from any test).
    pub fn credentials_in_env() {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            std::env::set_var("AWS_ACCESS_KEY_ID", S3_ACCESS_KEY);
            std::env::set_var("AWS_SECRET_ACCESS_KEY", S3_SECRET_KEY);
        });
    }

    /// Stops it (SIGKILL): the store is down.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port and folder, and waits until it
    /// answers.
    pub async fn resume(&mut self) {
        let child = std::process::Command::new(Self::binary())
            .args(["--host", "127.0.0.1", "--port", &self.port.to_string()])
            .args(["--access-key", S3_ACCESS_KEY, "--secret-key", S3_SECRET_KEY])
            .arg(self.root.path())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start the S3 server");
        self.child = Some(child);
        let port = self.port;
        let up = wait_for(Duration::from_secs(20), || async move {
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .ok()
                .map(|_| ())
        })
        .await;
        assert!(up.is_some(), "the S3 server did not listen on {port}");
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        self.stop();
    }
}
