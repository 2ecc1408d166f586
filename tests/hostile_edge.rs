//! The public edge against a hostile guest (issue 45, items 8 to 10),
//! black box over HTTP, on SQLite and on PostgreSQL:
//!
//! - one client address, everywhere: `X-Forwarded-For` and `Forwarded`
//!   count only as `--trusted-proxies` says, in the audit trail too;
//! - no outside client of the server takes a proxy from the environment
//!   (a proxy resolves names itself, past the SSRF guard);

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

/// The export's audit record names the client as `--trusted-proxies`
/// says: with no proxy trusted, whatever the client wrote in
/// `X-Forwarded-For` or `Forwarded` is not its address; behind one trusted
/// proxy, the address that proxy appended is (in the header the proxy
/// writes, and only there).
async fn the_audit_trail_records_the_address_the_proxies_vouch_for(backend: Backend) {
    let spoofs: [&[(&str, &str)]; 3] = [
        &[("X-Forwarded-For", "203.0.113.66")],
        &[("Forwarded", "for=198.51.100.77")],
        &[
            ("Forwarded", "for=\"[2001:db8::66]:4711\";proto=https"),
            ("X-Forwarded-For", "203.0.113.66, 203.0.113.67"),
        ],
    ];
    let app = TestApp::spawn(backend).await;
    let slug = app.experience(1).await;
    for spoof in spoofs {
        let detail = export_recorded_from(&app, &slug, spoof).await;
        assert_eq!(detail, "from 127.0.0.1", "{spoof:?}");
    }
    app.stop().await;

    let trusting = |header: ProxyHeader| {
        move |c: &mut Config| {
            c.trusted_proxies = 1;
            c.trusted_proxy_header = header;
        }
    };
    let app = TestApp::spawn_with(backend, fast_sim(), trusting(ProxyHeader::XForwardedFor)).await;
    let slug = app.experience(1).await;
    let cases: [(&[(&str, &str)], &str); 4] = [
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
        (&[("Forwarded", "for=198.51.100.77")], "from 127.0.0.1"),
        // Not an address: the peer.
        (&[("X-Forwarded-For", "unknown")], "from 127.0.0.1"),
    ];
    for (headers, expected) in cases {
        let detail = export_recorded_from(&app, &slug, headers).await;
        assert_eq!(detail, expected, "{headers:?}");
    }
    app.stop().await;

    let app = TestApp::spawn_with(backend, fast_sim(), trusting(ProxyHeader::Forwarded)).await;
    let slug = app.experience(1).await;
    let cases: [(&[(&str, &str)], &str); 4] = [
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
        (&[("X-Forwarded-For", "203.0.113.66")], "from 127.0.0.1"),
        // An obfuscated or unknown node (RFC 7239, 6.3): the peer.
        (&[("Forwarded", "for=_hidden")], "from 127.0.0.1"),
    ];
    for (headers, expected) in cases {
        let detail = export_recorded_from(&app, &slug, headers).await;
        assert_eq!(detail, expected, "{headers:?}");
    }
    app.stop().await;
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
