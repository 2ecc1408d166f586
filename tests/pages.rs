//! The pages' answers, black box, on SQLite and on PostgreSQL: every page,
//! script, style sheet and language table the server serves carries the
//! Content-Security-Policy (scripts from the server only, no framing),
//! `X-Content-Type-Options: nosniff` and a `Referrer-Policy`; and the
//! pages hold nothing that policy would refuse (no inline script, no
//! inline style or event handler attribute).

mod support;

use support::{Backend, TestApp};

/// Every page and asset path the server answers.
const PATHS: &[&str] = &[
    "/",
    "/p/some-booth",
    "/terminal/00000000-0000-0000-0000-000000000000",
    "/ops",
    "/static/app.css",
    "/static/app.js",
    "/static/index.js",
    "/static/participant.js",
    "/static/terminal.js",
    "/static/ops-main.js",
    "/i18n/en.json",
    "/i18n/ko.json",
];

/// The directives the pages rely on, each as it must read.
const DIRECTIVES: &[&str] = &[
    "default-src 'self'",
    "script-src 'self'",
    "style-src 'self'",
    "connect-src 'self'",
    "object-src 'none'",
    "base-uri 'none'",
    "form-action 'self'",
    "frame-ancestors 'none'",
];

async fn every_page_answer_carries_the_security_headers(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    for path in PATHS {
        for head in [false, true] {
            let url = format!("{}{path}", app.base);
            let req = if head {
                app.http.head(&url)
            } else {
                app.http.get(&url)
            };
            let resp = req.send().await.expect("page");
            assert_eq!(resp.status(), 200, "{path}");
            let header = |name: &str| {
                resp.headers()
                    .get(name)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned)
                    .unwrap_or_else(|| panic!("{path} (HEAD {head}) has no {name}"))
            };
            let csp = header("content-security-policy");
            let directives: Vec<&str> = csp.split(';').map(str::trim).collect();
            for wanted in DIRECTIVES {
                assert!(
                    directives.contains(wanted),
                    "{path}: no `{wanted}` in {csp}"
                );
            }
            assert!(!csp.contains("unsafe-inline"), "{path}: {csp}");
            assert!(!csp.contains("unsafe-eval"), "{path}: {csp}");
            assert_eq!(header("x-content-type-options"), "nosniff", "{path}");
            assert_eq!(header("referrer-policy"), "no-referrer", "{path}");
            assert_eq!(header("x-frame-options"), "DENY", "{path}");
            if head {
                continue;
            }
            let html = resp
                .headers()
                .get("content-type")
                .is_some_and(|t| t.to_str().unwrap_or("").starts_with("text/html"));
            if html {
                let text = resp.text().await.unwrap();
                refused_by_the_policy(path, &text);
            }
        }
    }
    app.stop().await;
}
db_test!(every_page_answer_carries_the_security_headers);

/// Panics on what `script-src 'self'` and `style-src 'self'` refuse in a
/// page: a `<script>` without `src`, a `<style>` element, a `style` or
/// `on…` attribute, a `javascript:` URL.
fn refused_by_the_policy(path: &str, html: &str) {
    let lower = html.to_ascii_lowercase();
    for (at, _) in lower.match_indices("<script") {
        let tag = &lower[at..at + lower[at..].find('>').expect("a closed tag")];
        assert!(tag.contains(" src="), "{path}: an inline script: {tag}>");
    }
    assert!(!lower.contains("<style"), "{path}: a style element");
    assert!(!lower.contains("javascript:"), "{path}: a javascript: URL");
    let mut rest = lower.as_str();
    while let Some(open) = rest.find('<') {
        let tag_end = rest[open..].find('>').map_or(rest.len(), |e| open + e);
        let tag = &rest[open..tag_end];
        for attr in tag.split_whitespace().skip(1) {
            let handler = attr.starts_with("on") && attr.contains('=');
            let style = attr.starts_with("style=");
            assert!(!handler && !style, "{path}: `{attr}` in {tag}>");
        }
        rest = &rest[tag_end..];
    }
}

/// Every script and style sheet in `static/` is served (a page that
/// imports a module the binary does not embed would load without it).
async fn every_static_file_is_served(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let folder = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("static");
    let mut names: Vec<String> = std::fs::read_dir(&folder)
        .expect("static/")
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .filter(|name| name.ends_with(".js") || name.ends_with(".css"))
        .collect();
    names.sort();
    assert!(names.len() >= 10, "{names:?}");
    for name in names {
        let resp = app
            .http
            .get(format!("{}/static/{name}", app.base))
            .send()
            .await
            .expect("GET static");
        assert_eq!(resp.status(), 200, "/static/{name} is not served");
        let served = resp.bytes().await.unwrap();
        let on_disk = std::fs::read(folder.join(&name)).unwrap();
        assert_eq!(
            served.as_ref(),
            on_disk.as_slice(),
            "/static/{name} is not the file"
        );
    }
    app.stop().await;
}
db_test!(every_static_file_is_served);
