//! The public edge against a hostile guest (issue 45, items 8 to 10),
//! black box over HTTP, on SQLite and on PostgreSQL:
//!
//! - one client address, everywhere: `X-Forwarded-For` and `Forwarded`
//!   count only as `--trusted-proxies` says, in the audit trail too;

mod support;

use serde_json::Value;
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
