//! The OpenAPI document, black box: `GET /api/openapi.json` is a
//! well-formed OpenAPI 3.1 document (every `$ref` resolves, every path
//! parameter is declared, every operation has an id and answers) and it
//! documents every route the server answers: each (method, path) of the
//! router is in it (the two WebSockets' frames in its description). The
//! router's list is read from `src/http/mod.rs` too, so a route added there
//! and not here fails this test. On SQLite and on PostgreSQL.

mod support;

use std::collections::BTreeSet;

use serde_json::Value;
use support::{Backend, TestApp};

/// Every route of `stagehand::http::routes`, as OpenAPI writes it.
const ROUTES: &[(&str, &str)] = &[
    ("get", "/healthz"),
    ("get", "/readyz"),
    ("get", "/metrics"),
    ("get", "/api/openapi.json"),
    ("get", "/api/experiences"),
    ("post", "/api/experiences"),
    ("get", "/api/experiences/{slug}"),
    ("patch", "/api/experiences/{slug}"),
    ("get", "/api/experiences/{slug}/qr.svg"),
    ("get", "/api/terminals"),
    ("post", "/api/terminals"),
    ("get", "/api/admin/sagas"),
    ("get", "/api/admin/sagas/{id}"),
    ("post", "/api/admin/sagas/{id}/retry"),
    ("post", "/api/admin/sagas/{id}/cancel"),
    ("post", "/api/admin/sagas/{id}/approve"),
    ("post", "/api/admin/sagas/{id}/reject"),
    ("post", "/api/admin/sagas/bulk"),
    ("get", "/api/admin/review"),
    ("get", "/api/admin/breaker"),
    ("get", "/api/admin/providers"),
    ("post", "/api/admin/breaker/open"),
    ("post", "/api/admin/breaker/close"),
    ("get", "/api/admin/me"),
    ("get", "/api/admin/operators"),
    ("post", "/api/admin/operators"),
    ("delete", "/api/admin/operators/{id}"),
    ("get", "/api/admin/audit"),
    ("get", "/ws/operators"),
    ("post", "/api/experiences/{slug}/sessions"),
    ("get", "/api/experiences/{slug}/ranking"),
    ("post", "/api/sessions/{id}/submission"),
    ("post", "/api/sessions/{id}/print"),
    ("put", "/api/admin/experiences/{slug}/brand/{part}"),
    ("delete", "/api/admin/experiences/{slug}/brand/{part}"),
    ("post", "/api/admin/experiences/{slug}/brand/preview"),
    ("get", "/api/admin/printers"),
    ("post", "/api/admin/printers"),
    ("delete", "/api/admin/printers/{id}"),
    ("post", "/api/admin/sessions/{id}/print"),
    ("post", "/api/admin/prints/{id}/cancel"),
    ("post", "/api/admin/prints/{id}/approve"),
    ("get", "/api/admin/webhooks"),
    ("post", "/api/admin/webhooks"),
    ("delete", "/api/admin/webhooks/{id}"),
    ("post", "/api/admin/webhooks/{id}/enable"),
    ("get", "/api/admin/webhooks/{id}/deliveries"),
    (
        "post",
        "/api/admin/webhooks/{id}/deliveries/{delivery_id}/redeliver",
    ),
    ("post", "/api/sessions/{id}/email"),
    ("get", "/api/admin/mails"),
    ("post", "/api/admin/mails/retry"),
    ("get", "/api/admin/mail/templates"),
    ("put", "/api/admin/mail/templates/{locale}"),
    ("delete", "/api/admin/mail/templates/{locale}"),
    ("post", "/api/sessions/{id}/photo"),
    ("get", "/media/r/{name}"),
    ("get", "/media/p/{name}"),
    ("get", "/api/sessions/{id}"),
    ("delete", "/api/sessions/{id}"),
    ("get", "/api/share/{share_id}"),
    ("get", "/r/{share_id}"),
    ("get", "/r/{share_id}/download"),
    ("get", "/r/{share_id}/qr.svg"),
    ("get", "/api/experiences/{slug}/gallery"),
    ("get", "/g/{slug}"),
    ("get", "/api/admin/sessions"),
    ("delete", "/api/admin/sessions/{id}"),
    ("post", "/api/admin/sessions/{id}/hide"),
    ("post", "/api/admin/sessions/{id}/unhide"),
    ("get", "/api/admin/experiences/{slug}/held"),
    ("get", "/api/admin/experiences/{slug}/export"),
    ("get", "/ws/terminals/{id}"),
    ("get", "/"),
    ("get", "/p/{slug}"),
    ("get", "/terminal/{id}"),
    ("get", "/ops"),
    ("get", "/static/{name}"),
    ("get", "/i18n/{name}"),
];

/// Their handshakes are operations; their frames are in `info.description`
/// (a socket's frames are no OpenAPI operation).
const WEBSOCKETS: &[&str] = &["/ws/operators", "/ws/terminals/{id}"];

const METHODS: &[&str] = &[
    "get", "put", "post", "delete", "options", "head", "patch", "trace",
];

/// The (method, path) pairs that `src/http/mod.rs` registers: each
/// `Endpoint::new("PATH")` with its `.get(web::..)`/`.post(web::..)` calls
/// up to its `.build()`, or a plain `.route("PATH", web::METHOD()..)`.
fn routes_in_source() -> BTreeSet<(String, String)> {
    let source = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/src/http/mod.rs"))
        .expect("read src/http/mod.rs");
    let quoted = |text: &str| -> String {
        let text = text.trim_start();
        assert!(
            text.starts_with('"'),
            "a path literal: {}",
            &text[..40.min(text.len())]
        );
        text[1..text[1..].find('"').expect("closing quote") + 1].to_owned()
    };
    let mut found = BTreeSet::new();
    for (at, _) in source.match_indices("Endpoint::new(") {
        let rest = &source[at + "Endpoint::new(".len()..];
        if !rest.trim_start().starts_with('"') {
            continue; // the definition, not a use
        }
        let path = quoted(rest);
        let segment = &rest[..rest.find(".build()").expect("Endpoint without .build()")];
        for method in METHODS {
            let call = format!(".{method}(");
            for (i, _) in segment.match_indices(&call) {
                if segment[i + call.len()..].trim_start().starts_with("web::") {
                    found.insert((method.to_string(), path.clone()));
                }
            }
        }
    }
    for (at, _) in source.match_indices(".route(") {
        let rest = &source[at + ".route(".len()..];
        if !rest.trim_start().starts_with('"') {
            continue;
        }
        let path = quoted(rest);
        let after = rest.trim_start()[path.len() + 2..].trim_start_matches([',', ' ', '\n']);
        for method in METHODS {
            if after.starts_with(&format!("web::{method}()")) {
                found.insert((method.to_string(), path.clone()));
            }
        }
    }
    assert!(!found.is_empty(), "no route found in src/http/mod.rs");
    found
}

/// Every `$ref` in `value`.
fn refs(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                match (k.as_str(), v) {
                    ("$ref", Value::String(r)) => out.push(r.clone()),
                    _ => refs(v, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| refs(v, out)),
        _ => {}
    }
}

/// The structural rules of OpenAPI 3.1 that a generator can get wrong.
fn check_document(doc: &Value) {
    let version = doc["openapi"].as_str().expect("openapi version");
    assert!(version.starts_with("3."), "not OpenAPI 3: {version}");
    assert!(doc["info"]["title"].is_string() && doc["info"]["version"].is_string());
    let paths = doc["paths"].as_object().expect("paths");
    let mut refs_found = Vec::new();
    refs(doc, &mut refs_found);
    for r in &refs_found {
        let pointer = r
            .strip_prefix('#')
            .unwrap_or_else(|| panic!("external $ref {r}"));
        assert!(doc.pointer(pointer).is_some(), "$ref {r} does not resolve");
    }
    let schemes = doc["components"]["securitySchemes"]
        .as_object()
        .expect("securitySchemes");
    for name in ["operator", "participant"] {
        assert_eq!(schemes[name]["type"], "http", "{name}");
        assert_eq!(schemes[name]["scheme"], "bearer", "{name}");
    }
    let mut ids = BTreeSet::new();
    for (path, item) in paths {
        assert!(path.starts_with('/'), "{path}");
        let templated: BTreeSet<&str> = path
            .split('{')
            .skip(1)
            .map(|s| &s[..s.find('}').expect("closing brace")])
            .collect();
        for (method, op) in item.as_object().expect("path item") {
            assert!(METHODS.contains(&method.as_str()), "{method} {path}");
            let id = op["operationId"].as_str().expect("operationId");
            assert!(ids.insert(id.to_owned()), "operationId {id} twice");
            let params = op["parameters"].as_array().cloned().unwrap_or_default();
            let declared: BTreeSet<&str> = params
                .iter()
                .filter(|p| p["in"] == "path")
                .map(|p| {
                    assert_eq!(p["required"], true, "path parameter of {method} {path}");
                    p["name"].as_str().expect("name")
                })
                .collect();
            assert_eq!(declared, templated, "path parameters of {method} {path}");
            for p in &params {
                let place = p["in"].as_str().expect("in");
                assert!(
                    ["path", "query", "header", "cookie"].contains(&place),
                    "{p}"
                );
            }
            let answers = op["responses"].as_object().expect("responses");
            assert!(!answers.is_empty(), "{method} {path} answers nothing");
            for (status, answer) in answers {
                let code: u16 = status.parse().unwrap_or_else(|_| panic!("status {status}"));
                assert!((100..600).contains(&code), "{status}");
                assert!(
                    answer["description"].is_string(),
                    "{method} {path} {status}"
                );
                if code >= 400 {
                    assert_eq!(
                        answer["content"]["application/json"]["schema"]["$ref"],
                        "#/components/schemas/Error",
                        "{method} {path} {status}: errors are the JSON error shape"
                    );
                }
            }
            for requirement in op["security"].as_array().cloned().unwrap_or_default() {
                for scheme in requirement.as_object().expect("requirement").keys() {
                    assert!(schemes.contains_key(scheme), "{method} {path}: {scheme}");
                }
            }
        }
    }
}

async fn openapi_documents_every_route(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let resp = app
        .http
        .get(format!("{}/api/openapi.json", app.base))
        .send()
        .await
        .expect("GET /api/openapi.json");
    assert_eq!(resp.status(), 200);
    assert!(resp.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("application/json"));
    let doc: Value = resp.json().await.expect("JSON");
    check_document(&doc);

    // The list here is the router's.
    let expected: BTreeSet<(String, String)> = ROUTES
        .iter()
        .map(|(m, p)| (m.to_string(), p.to_string()))
        .collect();
    let in_source = routes_in_source();
    assert_eq!(
        in_source, expected,
        "src/http/mod.rs registers other routes than ROUTES lists: update ROUTES and the OpenAPI document"
    );

    // Every route is documented, and nothing else is.
    let description = doc["info"]["description"].as_str().expect("description");
    let mut documented = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            documented.insert((method.clone(), path.clone()));
        }
    }
    for (method, path) in &expected {
        assert!(
            documented.contains(&(method.clone(), path.clone())),
            "{method} {path} is not documented"
        );
    }
    for path in WEBSOCKETS {
        let written = path.replace("{id}", "{terminal_id}");
        assert!(
            description.contains(&format!("`GET {written}")),
            "the frames of the WebSocket {path} are not in the description"
        );
    }
    for (method, path) in &documented {
        assert!(
            expected.contains(&(method.clone(), path.clone())),
            "{method} {path} is documented but not routed"
        );
    }

    // And the server answers each documented operation on its route (not
    // the JSON 404 of unknown paths, nor 405).
    for (method, path) in &documented {
        let url = format!(
            "{}{}",
            app.base,
            path.replace("{slug}", "nope")
                .replace("{id}", "nope")
                .replace("{name}", "nope")
                .replace("{share_id}", "nope")
                .replace("{part}", "overlay")
        );
        let resp = match method.as_str() {
            "get" => app.http.get(&url),
            "post" => app
                .http
                .post(&url)
                .header("content-type", "application/json")
                .body("{}"),
            "delete" => app.http.delete(&url),
            "put" => app.http.put(&url).body("not a png"),
            "patch" => app
                .http
                .patch(&url)
                .header("content-type", "application/json")
                .body("{}"),
            other => panic!("no probe for {other}"),
        }
        .send()
        .await
        .expect("probe");
        let status = resp.status().as_u16();
        assert_ne!(status, 405, "{method} {path}");
        if status == 404 {
            let body: Value = resp.json().await.expect("JSON 404");
            assert_ne!(
                body["message"], "route not found",
                "{method} {path} is not routed"
            );
        }
    }
    app.stop().await;
}

db_test!(openapi_documents_every_route);
