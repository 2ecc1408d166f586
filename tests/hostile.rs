//! Hostile input, black box over HTTP, on SQLite and on PostgreSQL: a table
//! of requests (method, path, headers, body) with the status and `error`
//! code each must get. Every answer must be a JSON error with a 4xx: never a
//! 5xx, never an empty or HTML body. Then the rate limits: the (n+1)th
//! session creation from one address is 429 with `Retry-After`, the
//! submission limit is per session and token, and `off` never limits.

mod support;

use std::time::Duration;

use futures_util::future::join_all;
use reqwest::header::{HeaderName, HeaderValue};
use reqwest::Method;
use serde_json::{json, Value};
use stagehand::config::{parse_rate_limit, Config, RateLimit};
use support::{fast_sim, wait_for, Backend, TestApp, OPERATOR};

/// One hostile request and what it must be answered.
struct Case {
    name: String,
    method: Method,
    path: String,
    headers: Vec<(HeaderName, HeaderValue)>,
    body: Option<Vec<u8>>,
    status: u16,
    code: &'static str,
    /// The `Allow` header a 405 must carry.
    allow: Option<&'static str>,
}

fn case(name: impl Into<String>, method: Method, path: impl Into<String>) -> Case {
    Case {
        name: name.into(),
        method,
        path: path.into(),
        headers: Vec::new(),
        body: None,
        status: 0,
        code: "",
        allow: None,
    }
}

impl Case {
    /// A body sent as `application/json` (whatever the bytes are).
    fn json(self, body: impl Into<Vec<u8>>) -> Case {
        self.header("content-type", b"application/json").raw(body)
    }

    /// A body with no `Content-Type` unless one is set.
    fn raw(mut self, body: impl Into<Vec<u8>>) -> Case {
        self.body = Some(body.into());
        self
    }

    fn header(mut self, name: &str, value: &[u8]) -> Case {
        let name = HeaderName::from_bytes(name.as_bytes()).expect("header name");
        let value = HeaderValue::from_bytes(value).expect("a header value reqwest can send");
        self.headers.retain(|(n, _)| *n != name);
        self.headers.push((name, value));
        self
    }

    fn bearer(self, token: &str) -> Case {
        self.header("authorization", format!("Bearer {token}").as_bytes())
    }

    fn key(self, key: &str) -> Case {
        self.header("idempotency-key", key.as_bytes())
    }

    fn expect(mut self, status: u16, code: &'static str) -> Case {
        self.status = status;
        self.code = code;
        self
    }

    fn allow(mut self, allow: &'static str) -> Case {
        self.allow = Some(allow);
        self
    }
}

/// Sends `case`; Err describes how its answer broke the rules.
async fn run(app: &TestApp, case: &Case) -> Result<(), String> {
    let mut req = app
        .http
        .request(case.method.clone(), format!("{}{}", app.base, case.path));
    for (name, value) in &case.headers {
        req = req.header(name.clone(), value.clone());
    }
    if let Some(body) = &case.body {
        req = req.body(body.clone());
    }
    let resp = req.send().await.map_err(|e| format!("no answer: {e}"))?;
    let status = resp.status().as_u16();
    let allow = resp
        .headers()
        .get("allow")
        .map(|v| v.to_str().unwrap_or("?").to_owned());
    let content_type = resp
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap_or("?").to_owned());
    let bytes = resp.bytes().await.map_err(|e| format!("body: {e}"))?;
    let text = String::from_utf8_lossy(&bytes[..bytes.len().min(300)]).into_owned();
    let body: Value = serde_json::from_slice(&bytes)
        .map_err(|_| format!("{status}: the body is not JSON ({content_type:?}): {text:?}"))?;
    let mut problems = Vec::new();
    if !(400..500).contains(&status) {
        problems.push(format!("status {status} is not a 4xx"));
    }
    if status != case.status {
        problems.push(format!("status {status}, expected {}", case.status));
    }
    if body["error"] != case.code {
        problems.push(format!("error {}, expected {:?}", body["error"], case.code));
    }
    if body["message"].as_str().is_none_or(str::is_empty) {
        problems.push("no message".into());
    }
    if content_type.as_deref() != Some("application/json") {
        problems.push(format!("content-type {content_type:?}"));
    }
    if let Some(expected) = case.allow {
        if allow.as_deref() != Some(expected) {
            problems.push(format!("Allow {allow:?}, expected {expected:?}"));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(format!("{} ({text})", problems.join("; ")))
    }
}

/// What the table's requests aim at.
struct Fixture {
    slug: String,
    sid: String,
    token: String,
    other_token: String,
    terminal_id: String,
    terminal_token: String,
}

/// `[[[...]]]`, `depth` deep.
fn nested(depth: usize) -> String {
    format!("{}{}", "[".repeat(depth), "]".repeat(depth))
}

fn table(f: &Fixture) -> Vec<Case> {
    use Method as M;
    let sessions = format!("/api/experiences/{}/sessions", f.slug);
    let submission = format!("/api/sessions/{}/submission", f.sid);
    let session = format!("/api/sessions/{}", f.sid);
    let ranking = format!("/api/experiences/{}/ranking", f.slug);
    let long_id = "a".repeat(8_000);
    let big = |n: usize| format!("{{\"nickname\": \"{}\"}}", "x".repeat(n)).into_bytes();
    let big_prompt = |n: usize| format!("{{\"prompt\": \"{}\"}}", "x".repeat(n)).into_bytes();
    // A fresh, valid key for each submission case (4xx answers are stored
    // under their key).
    let mut n = 0;
    let mut key = move || {
        n += 1;
        format!("hostile-{n}-{}", uuid::Uuid::new_v4())
    };
    let submit = |name: &str, key: String| {
        case(name, M::POST, submission.clone())
            .bearer(&f.token)
            .key(&key)
    };

    vec![
        // Session creation: the body.
        case("malformed JSON", M::POST, &sessions)
            .json(r#"{"nickname": "#)
            .expect(400, "invalid_json"),
        case("JSON that is not an object", M::POST, &sessions)
            .json("[1, 2]")
            .expect(400, "invalid_json"),
        case("empty body", M::POST, &sessions)
            .json("")
            .expect(400, "invalid_json"),
        case("nickname of the wrong type", M::POST, &sessions)
            .json(r#"{"nickname": 42}"#)
            .expect(400, "invalid_json"),
        case("nickname null", M::POST, &sessions)
            .json(r#"{"nickname": null}"#)
            .expect(400, "invalid_json"),
        case("unknown field", M::POST, &sessions)
            .json(r#"{"nickname": "eve", "admin": true}"#)
            .expect(400, "invalid_json"),
        case("duplicate field", M::POST, &sessions)
            .json(r#"{"nickname": "eve", "nickname": "mallory"}"#)
            .expect(400, "invalid_json"),
        case("body just over 64 KiB", M::POST, &sessions)
            .json(big(64 * 1024))
            .expect(413, "payload_too_large"),
        case("1 MiB body", M::POST, &sessions)
            .json(big(1024 * 1024))
            .expect(413, "payload_too_large"),
        case("10,000 nested arrays", M::POST, &sessions)
            .json(nested(10_000))
            .expect(400, "invalid_json"),
        case("nested arrays in a field", M::POST, &sessions)
            .json(format!(r#"{{"nickname": {}}}"#, nested(5_000)))
            .expect(400, "invalid_json"),
        case("invalid UTF-8 in the nickname", M::POST, &sessions)
            .json(b"{\"nickname\": \"\xff\xfe\xc3\"}".to_vec())
            .expect(400, "invalid_json"),
        case("a lone surrogate escape", M::POST, &sessions)
            .json(r#"{"nickname": "\ud800"}"#)
            .expect(400, "invalid_json"),
        case("a raw NUL byte in a string", M::POST, &sessions)
            .json(b"{\"nickname\": \"a\x00b\"}".to_vec())
            .expect(400, "invalid_json"),
        case("an escaped NUL in the nickname", M::POST, &sessions)
            .json(r#"{"nickname": "a\u0000b"}"#)
            .expect(422, "validation_failed"),
        case("an escape sequence in the nickname", M::POST, &sessions)
            .json(r#"{"nickname": "\u001b[31mred"}"#)
            .expect(422, "validation_failed"),
        case("a DEL in the nickname", M::POST, &sessions)
            .json(r#"{"nickname": "a\u007fb"}"#)
            .expect(422, "validation_failed"),
        case("a newline in the nickname", M::POST, &sessions)
            .json(r#"{"nickname": "a\nb"}"#)
            .expect(422, "validation_failed"),
        case("nickname of 41 characters", M::POST, &sessions)
            .json(format!(r#"{{"nickname": "{}"}}"#, "é".repeat(41)))
            .expect(422, "validation_failed"),
        case("blank nickname", M::POST, &sessions)
            .json(r#"{"nickname": "   "}"#)
            .expect(422, "validation_failed"),
        case("terminal_id of the wrong type", M::POST, &sessions)
            .json(r#"{"nickname": "eve", "terminal_id": 7}"#)
            .expect(400, "invalid_json"),
        case("terminal_id that is no terminal", M::POST, &sessions)
            .json(r#"{"nickname": "eve", "terminal_id": "not-a-terminal"}"#)
            .expect(422, "validation_failed"),
        case("terminal_id with a NUL", M::POST, &sessions)
            .json(format!(
                r#"{{"nickname": "eve", "terminal_id": "{}\u0000"}}"#,
                f.terminal_id
            ))
            .expect(422, "validation_failed"),
        case("terminal_id of 8,000 characters", M::POST, &sessions)
            .json(format!(
                r#"{{"nickname": "eve", "terminal_id": "{long_id}"}}"#
            ))
            .expect(422, "validation_failed"),
        // Session creation: the envelope.
        case("text/plain body", M::POST, &sessions)
            .raw(r#"{"nickname": "eve"}"#)
            .header("content-type", b"text/plain")
            .expect(415, "unsupported_media_type"),
        case("form body", M::POST, &sessions)
            .raw("nickname=eve")
            .header("content-type", b"application/x-www-form-urlencoded")
            .expect(415, "unsupported_media_type"),
        case("unparsable content type", M::POST, &sessions)
            .raw(r#"{"nickname": "eve"}"#)
            .header("content-type", b"}{ not a type")
            .expect(415, "unsupported_media_type"),
        case("non-ASCII content type", M::POST, &sessions)
            .raw(r#"{"nickname": "eve"}"#)
            .header("content-type", b"application/j\xe9son")
            .expect(415, "unsupported_media_type"),
        case("Idempotency-Key of 300 characters", M::POST, &sessions)
            .json(r#"{"nickname": "eve"}"#)
            .key(&"k".repeat(300))
            .expect(400, "idempotency_key_required"),
        case("Idempotency-Key of 4 KiB", M::POST, &sessions)
            .json(r#"{"nickname": "eve"}"#)
            .key(&"k".repeat(4096))
            .expect(400, "idempotency_key_required"),
        case("non-ASCII Idempotency-Key", M::POST, &sessions)
            .json(r#"{"nickname": "eve"}"#)
            .header("idempotency-key", b"cl\xe9-\xff")
            .expect(400, "idempotency_key_required"),
        case("GET on session creation", M::GET, &sessions)
            .expect(405, "method_not_allowed")
            .allow("POST"),
        case("PUT on session creation", M::PUT, &sessions)
            .json(r#"{"nickname": "eve"}"#)
            .expect(405, "method_not_allowed")
            .allow("POST"),
        case("DELETE on session creation", M::DELETE, &sessions)
            .expect(405, "method_not_allowed")
            .allow("POST"),
        // Bad path parameters.
        case(
            "unknown experience",
            M::POST,
            "/api/experiences/nope/sessions",
        )
        .json(r#"{"nickname": "eve"}"#)
        .expect(404, "not_found"),
        case(
            "slug of 8,000 characters",
            M::POST,
            format!("/api/experiences/{long_id}/sessions"),
        )
        .json(r#"{"nickname": "eve"}"#)
        .expect(404, "not_found"),
        case(
            "unicode slug",
            M::POST,
            "/api/experiences/%EC%8A%A4%ED%85%8C%EC%9D%B4%EC%A7%80/sessions",
        )
        .json(r#"{"nickname": "eve"}"#)
        .expect(404, "not_found"),
        case(
            "slug with an encoded slash",
            M::POST,
            format!("/api/experiences/{}%2Fx/sessions", f.slug),
        )
        .json(r#"{"nickname": "eve"}"#)
        .expect(404, "not_found"),
        case(
            "slug with an encoded NUL",
            M::POST,
            "/api/experiences/a%00b/sessions",
        )
        .json(r#"{"nickname": "eve"}"#)
        .expect(404, "not_found"),
        case(
            "slug that is not UTF-8",
            M::POST,
            "/api/experiences/%FF%FE/sessions",
        )
        .json(r#"{"nickname": "eve"}"#)
        .expect(404, "not_found"),
        case(
            "session id of 8,000 characters",
            M::GET,
            format!("/api/sessions/{long_id}"),
        )
        .bearer(&f.token)
        .expect(404, "not_found"),
        case("unicode session id", M::GET, "/api/sessions/%E2%98%83")
            .bearer(&f.token)
            .expect(404, "not_found"),
        case(
            "session id with an encoded slash",
            M::GET,
            format!("/api/sessions/{}%2Fx", f.sid),
        )
        .bearer(&f.token)
        .expect(404, "not_found"),
        case(
            "session id with an encoded NUL",
            M::GET,
            "/api/sessions/%00",
        )
        .bearer(&f.token)
        .expect(404, "not_found"),
        case(
            "session id that is not UTF-8",
            M::GET,
            "/api/sessions/%C3%28",
        )
        .bearer(&f.token)
        .expect(404, "not_found"),
        case(
            "submission to an unknown session",
            M::POST,
            "/api/sessions/00000000-0000-4000-8000-000000000000/submission",
        )
        .bearer(&f.token)
        .key(&key())
        .json(r#"{"prompt": "a cat"}"#)
        .expect(404, "not_found"),
        case(
            "submission to a session id of 8,000 characters",
            M::POST,
            format!("/api/sessions/{long_id}/submission"),
        )
        .bearer(&f.token)
        .key(&key())
        .json(r#"{"prompt": "a cat"}"#)
        .expect(404, "not_found"),
        case(
            "submission to a session id with a NUL",
            M::POST,
            "/api/sessions/a%00/submission",
        )
        .bearer(&f.token)
        .key(&key())
        .json(r#"{"prompt": "a cat"}"#)
        .expect(404, "not_found"),
        // Tokens.
        case("submission without a token", M::POST, &submission)
            .key(&key())
            .json(r#"{"prompt": "a cat"}"#)
            .expect(401, "unauthorized"),
        case(
            "submission with another session's token",
            M::POST,
            &submission,
        )
        .bearer(&f.other_token)
        .key(&key())
        .json(r#"{"prompt": "a cat"}"#)
        .expect(401, "unauthorized"),
        case("submission with the operator token", M::POST, &submission)
            .bearer(OPERATOR)
            .key(&key())
            .json(r#"{"prompt": "a cat"}"#)
            .expect(401, "unauthorized"),
        case("submission with an empty bearer", M::POST, &submission)
            .header("authorization", b"Bearer ")
            .key(&key())
            .json(r#"{"prompt": "a cat"}"#)
            .expect(401, "unauthorized"),
        case("submission with basic auth", M::POST, &submission)
            .header("authorization", b"Basic dXNlcjpwYXNz")
            .key(&key())
            .json(r#"{"prompt": "a cat"}"#)
            .expect(401, "unauthorized"),
        case("submission with a token of 4 KiB", M::POST, &submission)
            .bearer(&"t".repeat(4096))
            .key(&key())
            .json(r#"{"prompt": "a cat"}"#)
            .expect(401, "unauthorized"),
        case("submission with a non-ASCII token", M::POST, &submission)
            .header("authorization", b"Bearer \xe9\xff")
            .key(&key())
            .json(r#"{"prompt": "a cat"}"#)
            .expect(401, "unauthorized"),
        case("reading a session without a token", M::GET, &session).expect(401, "unauthorized"),
        case(
            "reading a session with another session's token",
            M::GET,
            &session,
        )
        .bearer(&f.other_token)
        .expect(401, "unauthorized"),
        // Submission: the key.
        case(
            "submission without an Idempotency-Key",
            M::POST,
            &submission,
        )
        .bearer(&f.token)
        .json(r#"{"prompt": "a cat"}"#)
        .expect(400, "idempotency_key_required"),
        submit("Idempotency-Key of 256 characters", "k".repeat(256))
            .json(r#"{"prompt": "a cat"}"#)
            .expect(400, "idempotency_key_required"),
        submit("Idempotency-Key of 4 KiB", "k".repeat(4096))
            .json(r#"{"prompt": "a cat"}"#)
            .expect(400, "idempotency_key_required"),
        case("non-ASCII Idempotency-Key", M::POST, &submission)
            .bearer(&f.token)
            .header("idempotency-key", b"\xc3\xa9t\xc3\xa9")
            .json(r#"{"prompt": "a cat"}"#)
            .expect(400, "idempotency_key_required"),
        // Submission: the body.
        submit("malformed JSON", key())
            .json(r#"{"prompt": "a cat""#)
            .expect(400, "invalid_json"),
        submit("prompt of the wrong type", key())
            .json(r#"{"prompt": ["a", "cat"]}"#)
            .expect(400, "invalid_json"),
        submit("unknown field", key())
            .json(r#"{"prompt": "a cat", "credits": 1000000}"#)
            .expect(400, "invalid_json"),
        submit("prompt of 2,001 characters", key())
            .json(format!(r#"{{"prompt": "{}"}}"#, "가".repeat(2_001)))
            .expect(422, "validation_failed"),
        submit("empty prompt", key())
            .json(r#"{"prompt": ""}"#)
            .expect(422, "validation_failed"),
        submit("an escaped NUL in the prompt", key())
            .json(r#"{"prompt": "a\u0000cat"}"#)
            .expect(422, "validation_failed"),
        submit("score NaN", key())
            .json(r#"{"prompt": "a cat", "score": NaN}"#)
            .expect(400, "invalid_json"),
        submit("score Infinity", key())
            .json(r#"{"prompt": "a cat", "score": Infinity}"#)
            .expect(400, "invalid_json"),
        submit("score 1e999", key())
            .json(r#"{"prompt": "a cat", "score": 1e999}"#)
            .expect(400, "invalid_json"),
        submit("score -1e999", key())
            .json(r#"{"prompt": "a cat", "score": -1e999}"#)
            .expect(400, "invalid_json"),
        submit("score as a string", key())
            .json(r#"{"prompt": "a cat", "score": "12"}"#)
            .expect(400, "invalid_json"),
        submit("body just over 64 KiB", key())
            .json(big_prompt(64 * 1024))
            .expect(413, "payload_too_large"),
        submit("10,000 nested arrays", key())
            .json(nested(10_000))
            .expect(400, "invalid_json"),
        submit("text/plain body", key())
            .raw(r#"{"prompt": "a cat"}"#)
            .header("content-type", b"text/plain; charset=utf-8")
            .expect(415, "unsupported_media_type"),
        case("GET on the submission", M::GET, &submission)
            .bearer(&f.token)
            .expect(405, "method_not_allowed")
            .allow("POST"),
        case("POST on a session", M::POST, &session)
            .bearer(&f.token)
            .json("{}")
            .expect(405, "method_not_allowed")
            .allow("GET, HEAD, DELETE"),
        case("PATCH on a session", M::PATCH, &session)
            .bearer(&f.token)
            .json("{}")
            .expect(405, "method_not_allowed")
            .allow("GET, HEAD, DELETE"),
        // Query parameters.
        case("ranking limit=-1", M::GET, format!("{ranking}?limit=-1"))
            .expect(422, "validation_failed"),
        case("ranking limit=abc", M::GET, format!("{ranking}?limit=abc"))
            .expect(422, "validation_failed"),
        case(
            "ranking limit past u64",
            M::GET,
            format!("{ranking}?limit=99999999999999999999999"),
        )
        .expect(422, "validation_failed"),
        case("ranking limit=1e3", M::GET, format!("{ranking}?limit=1e3"))
            .expect(422, "validation_failed"),
        case(
            "ranking of an unknown experience",
            M::GET,
            "/api/experiences/nope/ranking",
        )
        .expect(404, "not_found"),
        case("POST on the ranking", M::POST, &ranking)
            .json("{}")
            .expect(405, "method_not_allowed")
            .allow("GET, HEAD"),
        case(
            "QR code of a terminal with a NUL",
            M::GET,
            format!("/api/experiences/{}/qr.svg?terminal=%00", f.slug),
        )
        .expect(422, "validation_failed"),
        case(
            "QR code of a terminal that is none",
            M::GET,
            format!("/api/experiences/{}/qr.svg?terminal=nope", f.slug),
        )
        .expect(404, "not_found"),
        case(
            "QR code of a terminal id of 8,000 characters",
            M::GET,
            format!("/api/experiences/{}/qr.svg?terminal={long_id}", f.slug),
        )
        .expect(404, "not_found"),
        case("saga list limit=-1", M::GET, "/api/admin/sagas?limit=-1")
            .bearer(OPERATOR)
            .expect(422, "validation_failed"),
        case("saga list limit=abc", M::GET, "/api/admin/sagas?limit=abc")
            .bearer(OPERATOR)
            .expect(422, "validation_failed"),
        case(
            "saga list step with a NUL",
            M::GET,
            "/api/admin/sagas?step=%00",
        )
        .bearer(OPERATOR)
        .expect(422, "validation_failed"),
        case(
            "saga list cursor that was never handed out",
            M::GET,
            "/api/admin/sagas?cursor=%FF%00garbage",
        )
        .bearer(OPERATOR)
        .expect(422, "validation_failed"),
        case(
            "saga list experience with a NUL",
            M::GET,
            "/api/admin/sagas?experience=a%00b",
        )
        .bearer(OPERATOR)
        .expect(422, "validation_failed"),
        case(
            "saga id of 8,000 characters",
            M::GET,
            format!("/api/admin/sagas/{long_id}"),
        )
        .bearer(OPERATOR)
        .expect(404, "not_found"),
        case("saga id with a NUL", M::POST, "/api/admin/sagas/%00/cancel")
            .bearer(OPERATOR)
            .expect(404, "not_found"),
        // Operator endpoints without the operator token.
        case(
            "creating an experience without a token",
            M::POST,
            "/api/experiences",
        )
        .json(r#"{"slug": "x", "title": "t", "kind": "comic"}"#)
        .expect(401, "unauthorized"),
        case(
            "creating an experience with a participant token",
            M::POST,
            "/api/experiences",
        )
        .bearer(&f.token)
        .json(r#"{"slug": "x", "title": "t", "kind": "comic"}"#)
        .expect(401, "unauthorized"),
        case(
            "creating an experience with a bad body and no token",
            M::POST,
            "/api/experiences",
        )
        .raw("garbage")
        .header("content-type", b"text/plain")
        .expect(401, "unauthorized"),
        case(
            "creating a terminal without a token",
            M::POST,
            "/api/terminals",
        )
        .json(format!(r#"{{"experience": "{}", "name": "x"}}"#, f.slug))
        .expect(401, "unauthorized"),
        case(
            "listing terminals without a token",
            M::GET,
            "/api/terminals",
        )
        .expect(401, "unauthorized"),
        case("listing sagas without a token", M::GET, "/api/admin/sagas")
            .expect(401, "unauthorized"),
        case(
            "listing sagas with a bad query and no token",
            M::GET,
            "/api/admin/sagas?limit=abc",
        )
        .expect(401, "unauthorized"),
        case(
            "reading a saga with a wrong token",
            M::GET,
            "/api/admin/sagas/00000000-0000-4000-8000-000000000000",
        )
        .bearer("not-the-operator")
        .expect(401, "unauthorized"),
        case(
            "retrying a saga without a token",
            M::POST,
            "/api/admin/sagas/00000000-0000-4000-8000-000000000000/retry",
        )
        .expect(401, "unauthorized"),
        case(
            "cancelling a saga with a participant token",
            M::POST,
            "/api/admin/sagas/00000000-0000-4000-8000-000000000000/cancel",
        )
        .bearer(&f.token)
        .expect(401, "unauthorized"),
        case("operator socket without a token", M::GET, "/ws/operators")
            .expect(401, "unauthorized"),
        case(
            "operator socket with a wrong token",
            M::GET,
            "/ws/operators?token=nope",
        )
        .expect(401, "unauthorized"),
        case(
            "terminal socket with a wrong token",
            M::GET,
            format!("/ws/terminals/{}?token=nope", f.terminal_id),
        )
        .expect(401, "unauthorized"),
        case(
            "terminal socket of an id of 8,000 characters",
            M::GET,
            format!("/ws/terminals/{long_id}?token=nope"),
        )
        .expect(401, "unauthorized"),
        case(
            "terminal socket with its token but no WebSocket handshake",
            M::GET,
            format!("/ws/terminals/{}?token={}", f.terminal_id, f.terminal_token),
        )
        .expect(426, "upgrade_required"),
        case(
            "operator socket with the token but no WebSocket handshake",
            M::GET,
            format!("/ws/operators?token={OPERATOR}"),
        )
        .expect(426, "upgrade_required"),
        // Operator endpoints with the token, bad input.
        case(
            "creating an experience from malformed JSON",
            M::POST,
            "/api/experiences",
        )
        .bearer(OPERATOR)
        .json("{")
        .expect(400, "invalid_json"),
        case(
            "creating an experience from a form",
            M::POST,
            "/api/experiences",
        )
        .bearer(OPERATOR)
        .raw("slug=x")
        .header("content-type", b"application/x-www-form-urlencoded")
        .expect(415, "unsupported_media_type"),
        case(
            "creating an experience with a 1 MiB body",
            M::POST,
            "/api/experiences",
        )
        .bearer(OPERATOR)
        .json(big(1024 * 1024))
        .expect(413, "payload_too_large"),
        case(
            "creating a terminal with an unknown field",
            M::POST,
            "/api/terminals",
        )
        .bearer(OPERATOR)
        .json(format!(
            r#"{{"experience": "{}", "name": "x", "token": "mine"}}"#,
            f.slug
        ))
        .expect(400, "invalid_json"),
        case("experience ai_calls past i32", M::POST, "/api/experiences")
            .bearer(OPERATOR)
            .json(r#"{"slug": "big", "title": "t", "kind": "comic", "ai_calls": 1099511627776}"#)
            .expect(400, "invalid_json"),
        case("experience credits 1e999", M::POST, "/api/experiences")
            .bearer(OPERATOR)
            .json(r#"{"slug": "big", "title": "t", "kind": "comic", "credits": 1e999}"#)
            .expect(400, "invalid_json"),
        case("experience max_in_flight -1", M::POST, "/api/experiences")
            .bearer(OPERATOR)
            .json(r#"{"slug": "neg", "title": "t", "kind": "comic", "max_in_flight": -1}"#)
            .expect(422, "validation_failed"),
        case("experience closing in year 99999", M::POST, "/api/experiences")
            .bearer(OPERATOR)
            .json(r#"{"slug": "far", "title": "t", "kind": "comic", "closes_at": "99999-01-01T00:00:00Z"}"#)
            .expect(422, "validation_failed"),
        case("experience slug of 300 characters", M::POST, "/api/experiences")
            .bearer(OPERATOR)
            .json(format!(r#"{{"slug": "{}", "title": "t", "kind": "comic"}}"#, "a".repeat(300)))
            .expect(422, "validation_failed"),
        case("experience slug with a slash", M::POST, "/api/experiences")
            .bearer(OPERATOR)
            .json(r#"{"slug": "a/b", "title": "t", "kind": "comic"}"#)
            .expect(422, "validation_failed"),
        case("experience title with a NUL", M::POST, "/api/experiences")
            .bearer(OPERATOR)
            .json(r#"{"slug": "nul", "title": "a\u0000b", "kind": "comic"}"#)
            .expect(422, "validation_failed"),
        case("terminal name of 8,000 characters", M::POST, "/api/terminals")
            .bearer(OPERATOR)
            .json(format!(r#"{{"experience": "{}", "name": "{long_id}"}}"#, f.slug))
            .expect(422, "validation_failed"),
        case("terminal of an unknown experience", M::POST, "/api/terminals")
            .bearer(OPERATOR)
            .json(r#"{"experience": "nope", "name": "x"}"#)
            .expect(404, "not_found"),
        // Wrong methods elsewhere, unknown routes.
        case("DELETE on experiences", M::DELETE, "/api/experiences")
            .bearer(OPERATOR)
            .expect(405, "method_not_allowed")
            .allow("GET, HEAD, POST"),
        case("PATCH on terminals", M::PATCH, "/api/terminals")
            .bearer(OPERATOR)
            .expect(405, "method_not_allowed")
            .allow("GET, HEAD, POST"),
        case("OPTIONS on experiences", M::OPTIONS, "/api/experiences")
            .expect(405, "method_not_allowed")
            .allow("GET, HEAD, POST"),
        case("PUT on an experience", M::PUT, "/api/experiences/nope")
            .bearer(OPERATOR)
            .json("{}")
            .expect(405, "method_not_allowed")
            .allow("GET, HEAD, PATCH"),
        case("PATCH an experience without a token", M::PATCH, "/api/experiences/nope")
            .json(r#"{"title": "x"}"#)
            .expect(401, "unauthorized"),
        case("PATCH an experience as text", M::PATCH, "/api/experiences/nope")
            .bearer(OPERATOR)
            .raw(r#"{"title": "x"}"#)
            .header("content-type", b"text/plain")
            .expect(415, "unsupported_media_type"),
        case("PATCH an unknown experience", M::PATCH, "/api/experiences/nope")
            .bearer(OPERATOR)
            .json(r#"{"title": "x"}"#)
            .expect(404, "not_found"),
        case("PATCH an experience with a list", M::PATCH, "/api/experiences/nope")
            .bearer(OPERATOR)
            .json("[1, 2]")
            .expect(400, "invalid_json"),
        case("a revoked-looking operator token", M::GET, "/api/admin/me")
            .bearer("not-an-operator")
            .expect(401, "unauthorized"),
        case("GET on a saga retry", M::GET, "/api/admin/sagas/x/retry")
            .bearer(OPERATOR)
            .expect(405, "method_not_allowed")
            .allow("POST"),
        case("POST on healthz", M::POST, "/healthz")
            .expect(405, "method_not_allowed")
            .allow("GET, HEAD"),
        case("POST on a page", M::POST, "/ops")
            .expect(405, "method_not_allowed")
            .allow("GET, HEAD"),
        case("an unknown route", M::GET, "/api/nope").expect(404, "not_found"),
        case(
            "an unknown route with an unknown method",
            M::DELETE,
            "/nope/nope",
        )
        .expect(404, "not_found"),
        case("a path of 8,000 characters", M::GET, format!("/{long_id}")).expect(404, "not_found"),
        case(
            "a static file outside static/",
            M::GET,
            "/static/..%2F..%2FCargo.toml",
        )
        .expect(404, "not_found"),
    ]
}

/// Creates the fixture: an experience, a terminal and two sessions.
async fn fixture(app: &TestApp) -> Fixture {
    let slug = app.experience(5).await;
    let (terminal_id, terminal_token) = app.terminal(&slug).await;
    let (sid, token) = app.session(&slug, None, "target").await;
    let (_, other_token) = app.session(&slug, None, "other").await;
    Fixture {
        slug,
        sid,
        token,
        other_token,
        terminal_id,
        terminal_token,
    }
}

/// The production defaults of both rate limits apply: the table never
/// trips them, so every answer is the one its input deserves.
async fn hostile_inputs_get_json_4xx_errors(backend: Backend) {
    let defaults = Config::defaults();
    let app = TestApp::spawn_with(backend, fast_sim(), |c| {
        c.session_rate_limit = defaults.session_rate_limit;
        c.submission_rate_limit = defaults.submission_rate_limit;
    })
    .await;
    let f = fixture(&app).await;
    let cases = table(&f);
    let mut failures = Vec::new();
    for case in &cases {
        if let Err(problem) = run(&app, case).await {
            failures.push(format!(
                "{}: {} {}: {problem}",
                case.name,
                case.method,
                &case.path[..case.path.len().min(80)]
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} hostile requests were answered wrongly:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );

    // JSON with parameters or a +json type is JSON.
    for content_type in [
        "application/json; charset=utf-8",
        "application/vnd.api+json",
    ] {
        let resp = app
            .http
            .post(format!("{}/api/experiences/{}/sessions", app.base, f.slug))
            .header("content-type", content_type)
            .body(r#"{"nickname": "typed"}"#)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 201, "{content_type}");
    }
    // HEAD is GET without the body.
    let head = app
        .http
        .head(format!("{}/api/experiences/{}/ranking", app.base, f.slug))
        .send()
        .await
        .unwrap();
    assert_eq!(head.status(), 200);
    assert!(head.bytes().await.unwrap().is_empty());
    // Nothing hostile changed the session: it still takes a submission,
    // and the operator may read it.
    let resp = app
        .submit(
            &f.sid,
            &f.token,
            json!({"prompt": "a cat", "score": 3.5}),
            "after-the-table",
        )
        .await;
    assert_eq!(resp.status(), 202, "{:?}", resp.text().await);
    assert_eq!(app.status(&f.sid, OPERATOR).await["status"], "SUBMITTING");
    app.stop().await;
}
db_test!(hostile_inputs_get_json_4xx_errors);

/// A session creation from the test client.
async fn create(
    app: &TestApp,
    slug: &str,
    forwarded_for: Option<&str>,
    key: Option<&str>,
) -> reqwest::Response {
    let mut req = app
        .http
        .post(format!("{}/api/experiences/{slug}/sessions", app.base))
        .json(&json!({"nickname": "crowd"}));
    if let Some(ip) = forwarded_for {
        req = req.header("x-forwarded-for", ip);
    }
    if let Some(key) = key {
        req = req.header("idempotency-key", key);
    }
    req.send().await.expect("POST sessions")
}

/// The `Retry-After` of a 429, after checking its JSON error.
async fn rate_limited(resp: reqwest::Response) -> u64 {
    assert_eq!(resp.status(), 429);
    let retry_after: u64 = resp.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .expect("Retry-After in whole seconds");
    assert!(retry_after >= 1);
    let body: Value = resp.json().await.expect("a JSON error");
    assert_eq!(body["error"], "rate_limited");
    assert!(body["message"].as_str().is_some_and(|m| !m.is_empty()));
    retry_after
}

fn limit(text: &str) -> RateLimit {
    parse_rate_limit(text).unwrap()
}

async fn session_creation_is_limited_per_client_address(backend: Backend) {
    let app = TestApp::spawn_with(backend, fast_sim(), |c| {
        c.session_rate_limit = limit("3/min");
    })
    .await;
    let slug = app.experience(5).await;
    for _ in 0..3 {
        assert_eq!(create(&app, &slug, None, None).await.status(), 201);
    }
    let retry_after = rate_limited(create(&app, &slug, None, None).await).await;
    assert!(
        (1..=20).contains(&retry_after),
        "one back every 20 s: {retry_after}"
    );
    // X-Forwarded-For is the client's own word: not trusted by default.
    rate_limited(create(&app, &slug, Some("198.51.100.7"), None).await).await;
    // Refused before anything runs: another experience, a bad body, all
    // the same address.
    rate_limited(create(&app, "nope", None, None).await).await;
    app.stop().await;
}
db_test!(session_creation_is_limited_per_client_address);

async fn behind_a_trusted_proxy_the_forwarded_address_counts(backend: Backend) {
    let app = TestApp::spawn_with(backend, fast_sim(), |c| {
        c.session_rate_limit = limit("2/min");
        c.trusted_proxies = 1;
    })
    .await;
    let slug = app.experience(5).await;
    // The proxy appends the address it saw; what the client wrote before
    // it does not count.
    for spoof in ["1.1.1.1", "2.2.2.2"] {
        let header = format!("{spoof}, 203.0.113.5");
        assert_eq!(create(&app, &slug, Some(&header), None).await.status(), 201);
    }
    rate_limited(create(&app, &slug, Some("3.3.3.3, 203.0.113.5"), None).await).await;
    // Another client behind the same proxy has its own bucket, and so has
    // the proxy's own address (no header).
    assert_eq!(
        create(&app, &slug, Some("203.0.113.6"), None)
            .await
            .status(),
        201
    );
    assert_eq!(create(&app, &slug, None, None).await.status(), 201);
    // IPv6 clients count by their /64.
    assert_eq!(
        create(&app, &slug, Some("2001:db8:0:1::1"), None)
            .await
            .status(),
        201
    );
    assert_eq!(
        create(&app, &slug, Some("2001:db8:0:1::2"), None)
            .await
            .status(),
        201
    );
    rate_limited(create(&app, &slug, Some("2001:db8:0:1:ffff::3"), None).await).await;
    assert_eq!(
        create(&app, &slug, Some("2001:db8:0:2::1"), None)
            .await
            .status(),
        201
    );
    app.stop().await;
}
db_test!(behind_a_trusted_proxy_the_forwarded_address_counts);

async fn a_refused_request_keeps_nothing_and_the_bucket_refills(backend: Backend) {
    let app = TestApp::spawn_with(backend, fast_sim(), |c| {
        c.session_rate_limit = limit("1/2s");
    })
    .await;
    let slug = app.experience(5).await;
    assert_eq!(create(&app, &slug, None, None).await.status(), 201);
    let key = uuid::Uuid::new_v4().to_string();
    let retry_after = rate_limited(create(&app, &slug, None, Some(&key)).await).await;
    assert!((1..=2).contains(&retry_after), "{retry_after}");
    // Retry-After is true: within a few seconds the same request (same
    // key) runs, and is not a replay of the 429.
    let created = wait_for(Duration::from_secs(6), || async {
        let resp = create(&app, &slug, None, Some(&key)).await;
        (resp.status() != 429).then_some(resp)
    })
    .await
    .expect("the bucket refills within its period");
    assert_eq!(created.status(), 201);
    assert!(created.headers().get("idempotent-replayed").is_none());
    app.stop().await;
}
db_test!(a_refused_request_keeps_nothing_and_the_bucket_refills);

async fn submission_is_limited_per_session_and_token(backend: Backend) {
    let app = TestApp::spawn_with(backend, fast_sim(), |c| {
        c.submission_rate_limit = limit("2/min");
    })
    .await;
    let slug = app.experience(5).await;
    let (sid, token) = app.session(&slug, None, "tapper").await;
    let (other_sid, other_token) = app.session(&slug, None, "bystander").await;
    let body = json!({"prompt": "a cat"});
    // Someone who knows the session id (rankings show it) but not its
    // token hammers it: refused before the limit, they take no bucket...
    let guessed = "guessed-token";
    for _ in 0..5 {
        let resp = app.submit(&sid, guessed, body.clone(), "k").await;
        assert_eq!(resp.status(), 401);
    }
    // ...and the participant's bucket is untouched: two requests, then 429.
    let first = app.submit(&sid, &token, body.clone(), "k1").await;
    assert_eq!(first.status(), 202);
    let replay = app.submit(&sid, &token, body.clone(), "k1").await;
    assert_eq!(replay.status(), 202);
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    let retry_after = rate_limited(app.submit(&sid, &token, body.clone(), "k1").await).await;
    assert!(
        (1..=30).contains(&retry_after),
        "one back every 30 s: {retry_after}"
    );
    // Another session is not limited by this one.
    let other = app
        .submit(&other_sid, &other_token, body.clone(), "k1")
        .await;
    assert_eq!(other.status(), 202);
    app.stop().await;
}
db_test!(submission_is_limited_per_session_and_token);

/// A flood of submissions with random bearer tokens takes no key of the
/// limiter (they are refused 401 before it), so it cannot fill the key
/// store and push real sessions into the shared overflow bucket. Before,
/// the limiter ran ahead of authentication and the participant's first
/// submission after such a flood was 429.
async fn random_tokens_do_not_fill_the_submission_limiter(backend: Backend) {
    let app = TestApp::spawn_with(backend, fast_sim(), |c| {
        c.submission_rate_limit = limit("3/min");
        c.rate_limit_keys = 5;
    })
    .await;
    let slug = app.experience(5).await;
    let (sid, token) = app.session(&slug, None, "real").await;
    let body = json!({"prompt": "a cat"});
    for i in 0..40 {
        let random = format!("random-token-{i}");
        let resp = app.submit(&sid, &random, body.clone(), "k").await;
        assert_eq!(resp.status(), 401, "random token {i}");
    }
    let resp = app.submit(&sid, &token, body.clone(), "real-key").await;
    assert_eq!(resp.status(), 202, "{:?}", resp.text().await);
    app.stop().await;
}
db_test!(random_tokens_do_not_fill_the_submission_limiter);

async fn off_never_limits(backend: Backend) {
    let app = TestApp::spawn_with(backend, fast_sim(), |c| {
        c.session_rate_limit = limit("off");
        c.submission_rate_limit = limit("off");
    })
    .await;
    let slug = app.experience(5).await;
    let answers = join_all((0..200).map(|_| create(&app, &slug, None, None))).await;
    let statuses: Vec<u16> = answers.iter().map(|r| r.status().as_u16()).collect();
    assert!(statuses.iter().all(|s| *s == 201), "{statuses:?}");
    let (sid, token) = app.session(&slug, None, "double-tapper").await;
    let body = json!({"prompt": "a cat"});
    let answers = join_all((0..200).map(|_| app.submit(&sid, &token, body.clone(), "same"))).await;
    for resp in answers {
        assert!(
            matches!(resp.status().as_u16(), 202 | 409),
            "{}",
            resp.status()
        );
    }
    app.stop().await;
}
db_test!(off_never_limits);
