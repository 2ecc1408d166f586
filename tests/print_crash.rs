//! A print is never printed twice (issue 47): stagehand killed with
//! SIGKILL after the printer took the print and before stagehand heard
//! its job id; after a restart on the same database, the printer holds
//! exactly one document and the print is COMPLETED.
//!
//! The printer is real (`ippeveprinter`); a TCP proxy in front of it
//! holds its answers (tests/support/printer.rs, `HoldingProxy`), which is
//! how the kill lands in that window every time. On SQLite and
//! PostgreSQL, with `stagehand serve` as a process.

mod support;

use std::time::Duration;

use serde_json::{json, Value};
use support::printer::{HoldingProxy, TestPrinter};
use support::{http_client, Backend, Logs, Server, TestDb, OPERATOR};

const WITHIN: Duration = Duration::from_secs(60);

async fn post_json(http: &reqwest::Client, url: String, token: &str, body: Value) -> (u16, Value) {
    let resp = http
        .post(url)
        .bearer_auth(token)
        .header("Idempotency-Key", uuid::Uuid::new_v4().to_string())
        .json(&body)
        .send()
        .await
        .unwrap();
    (
        resp.status().as_u16(),
        resp.json().await.unwrap_or(Value::Null),
    )
}

/// A completed photo session on `base`: its id and token.
async fn completed_photo_session(
    http: &reqwest::Client,
    base: &str,
    slug: &str,
) -> (String, String) {
    let (sid, token) = support::create_session(http, base, slug, None, "ana").await;
    let photo = http
        .post(format!("{base}/api/sessions/{sid}/photo"))
        .bearer_auth(&token)
        .header("Idempotency-Key", uuid::Uuid::new_v4().to_string())
        .body(include_bytes!("fixtures/photo-gps-rotated.jpg").to_vec())
        .send()
        .await
        .unwrap();
    assert_eq!(photo.status(), 201);
    let photo: Value = photo.json().await.unwrap();
    let resp = support::submit(
        http,
        base,
        &sid,
        &token,
        json!({"photo_id": photo["photo_id"]}),
        &uuid::Uuid::new_v4().to_string(),
    )
    .await;
    assert_eq!(resp.status(), 202);
    let done = support::wait_final(http, base, &sid, &token, WITHIN).await;
    assert_eq!(done["status"], "COMPLETED", "{done}");
    (sid, token)
}

async fn kill9_while_the_printer_answers_prints_once(backend: Backend) {
    let printer = TestPrinter::start("Crash booth");
    let proxy = HoldingProxy::start(printer.port);
    let mut logs = Logs::new();
    let http = http_client();
    let db = TestDb::fresh(backend).await;
    let sim = support::start_sim(support::fast_sim()).await;
    let mut first = Server::start(&db.url, &sim.url(), &logs.next(), &http).await;

    let slug = format!("kp-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let (status, body) = post_json(
        &http,
        format!("{}/api/experiences", first.base),
        OPERATOR,
        json!({"slug": slug, "title": "Crash print", "kind": "comic", "input": "photo"}),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let (status, body) = post_json(
        &http,
        format!("{}/api/admin/printers", first.base),
        OPERATOR,
        json!({"name": "Crash booth", "uri": proxy.uri(), "media": "na_index-4x6_4x6in"}),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let (sid, token) = completed_photo_session(&http, &first.base, &slug).await;

    // The printer takes the job; its answer (the job id) never reaches
    // stagehand, which is killed meanwhile.
    proxy.hold(true);
    let (status, print) = post_json(
        &http,
        format!("{}/api/sessions/{sid}/print", first.base),
        &token,
        json!({}),
    )
    .await;
    assert_eq!(status, 202, "{print}");
    let print_id = print["print_id"].as_str().unwrap().to_owned();
    assert!(
        printer.holds_documents(1, WITHIN).await,
        "the printer got the job: {}",
        printer.log()
    );
    let view = support::session_status(&http, &first.base, &sid, &token).await;
    assert_eq!(
        view["prints"][0]["status"], "SENDING",
        "the answer is held: {view}"
    );
    first.kill9();
    drop(first);
    proxy.hold(false);

    // Restarted on the same database: the print queue asks the printer for
    // the job by its name before sending anything again.
    let second_log = logs.next();
    let second = Server::start(&db.url, &sim.url(), &second_log, &http).await;
    let finished = support::wait_for(WITHIN, || async {
        let view = support::session_status(&http, &second.base, &sid, &token).await;
        let print = view["prints"]
            .as_array()?
            .iter()
            .find(|p| p["print_id"] == print_id.as_str())?
            .clone();
        (print["status"] == "COMPLETED").then_some(print)
    })
    .await;
    assert!(finished.is_some(), "the print completed after the restart");
    let documents = printer.documents();
    assert_eq!(
        documents.len(),
        1,
        "exactly one document after the crash: {documents:?}"
    );
    let log = std::fs::read_to_string(&second_log).unwrap_or_default();
    assert!(
        log.contains("the printer has the print already"),
        "the restarted server found the job by its name instead of sending again"
    );
}
db_test!(kill9_while_the_printer_answers_prints_once);
