//! Print stations (issue 47) against a real IPP printer: CUPS's
//! `ippeveprinter` on 127.0.0.1 (tests/support/printer.rs), which keeps
//! every document it receives, so each test counts and measures what was
//! printed. On SQLite and PostgreSQL, through HTTP:
//! - a branded photo result printed once per press, at the media's size
//!   in pixels; `prints_per_guest` enforced; an operator's reprint;
//! - out of paper: the print waits with the reason the guest reads (and
//!   the booth's display), and prints once paper is loaded;
//! - a printer switched off: prints wait, and each prints once when it is
//!   back;
//! - the next print goes to a printer the moment its print ends, not at
//!   the next look;
//! - a printer that takes PWG raster and not JPEG gets PWG raster.

mod support;

use std::time::Duration;

use serde_json::{json, Value};
use stagehand::clock::ManualClock;
use stagehand::print::ipp::{IppPrinter, JobState};
use support::printer::TestPrinter;
use support::{Backend, TestApp, OPERATOR};

const WITHIN: Duration = Duration::from_secs(60);
const MEDIA: &str = "na_index-4x6_4x6in";
/// Both trays loaded, as the test printer starts: letter, and 4x6 in.
const LOADED: [&str; 2] = ["na_letter_8.5x11in", MEDIA];

async fn photo_experience(app: &TestApp, extra: Value) -> String {
    let slug = format!("pr-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    app.experience_from(
        json!({"slug": slug, "title": "Print me", "kind": "comic", "input": "photo",
        "brand_caption": "Stagehand Night 2026"}),
        extra,
    )
    .await
}

async fn add_printer(app: &TestApp, printer: &TestPrinter, name: &str, slug: &str) -> Value {
    let resp = app
        .http
        .post(format!("{}/api/admin/printers", app.base))
        .bearer_auth(OPERATOR)
        .json(&json!({"name": name, "uri": printer.uri, "media": MEDIA, "experiences": [slug]}))
        .send()
        .await
        .unwrap();
    let status = resp.status();
    let body: Value = resp.json().await.unwrap();
    assert_eq!(status, 201, "{body}");
    body
}

/// A completed photo session: its id and token.
async fn completed(app: &TestApp, slug: &str) -> (String, String) {
    let (sid, token, _) = app.photo_session(slug, None).await;
    (sid, token)
}

async fn guest_print(app: &TestApp, sid: &str, token: &str, key: &str) -> (u16, Value) {
    let resp = app
        .http
        .post(format!("{}/api/sessions/{sid}/print", app.base))
        .bearer_auth(token)
        .header("Idempotency-Key", key)
        .send()
        .await
        .unwrap();
    (
        resp.status().as_u16(),
        resp.json().await.unwrap_or(Value::Null),
    )
}

/// Waits (with a deadline) until the session's print `print_id`
/// satisfies `done`.
async fn print_until(
    app: &TestApp,
    sid: &str,
    token: &str,
    print_id: &str,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = std::time::Instant::now() + WITHIN;
    let mut last = Value::Null;
    while std::time::Instant::now() < deadline {
        let view = app.status(sid, token).await;
        if let Some(print) = view["prints"]
            .as_array()
            .and_then(|all| all.iter().find(|p| p["print_id"] == print_id))
        {
            if done(print) {
                return print.clone();
            }
            last = print.clone();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("print {print_id} never got there; last seen {last}");
}

fn pixels_of(path: &std::path::Path) -> (u32, u32) {
    let bytes = std::fs::read(path).unwrap();
    image::load_from_memory(&bytes)
        .expect("a printed image")
        .into_rgb8()
        .dimensions()
}

async fn a_branded_photo_prints_once_at_the_media_size(backend: Backend) {
    let printer = TestPrinter::start("Booth A");
    let app = TestApp::spawn(backend).await;
    let slug = photo_experience(&app, json!({})).await;
    let added = add_printer(&app, &printer, "Booth A", &slug).await;
    assert_eq!(added["state"], "idle", "{added}");
    assert!(
        added["formats"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f == "image/jpeg"),
        "{added}"
    );
    let (sid, token) = completed(&app, &slug).await;

    let key = uuid::Uuid::new_v4().to_string();
    let (status, print) = guest_print(&app, &sid, &token, &key).await;
    assert_eq!(
        (status, print["status"].as_str()),
        (202, Some("QUEUED")),
        "{print}"
    );
    let print_id = print["print_id"].as_str().unwrap().to_owned();
    // The same press again (a retry): the same print.
    let (status, again) = guest_print(&app, &sid, &token, &key).await;
    assert_eq!(
        (status, &again["print_id"]),
        (202, &print["print_id"]),
        "{again}"
    );
    // Another press: past prints_per_guest (1).
    let (status, refused) =
        guest_print(&app, &sid, &token, &uuid::Uuid::new_v4().to_string()).await;
    assert_eq!(status, 409, "{refused}");
    assert_eq!(refused["error"], "print_limit", "{refused}");

    print_until(&app, &sid, &token, &print_id, |p| {
        p["status"] == "COMPLETED"
    })
    .await;
    let documents = printer.documents();
    assert_eq!(documents.len(), 1, "exactly one document: {documents:?}");
    // 4x6 in at the printer's resolution (1200 × 1800 at 300 dpi), turned
    // to the picture's orientation.
    let dpi = added["dpi"].as_u64().expect("the printer's dpi") as u32;
    let (short, long) = (4 * dpi, 6 * dpi);
    let size = pixels_of(&documents[0]);
    assert!(
        size == (short, long) || size == (long, short),
        "4x6 in at {dpi} dpi: {size:?}"
    );
    // In colour, as the printer was added.
    let job_id = app
        .state
        .store
        .print(&print_id)
        .await
        .unwrap()
        .unwrap()
        .ipp_job_id
        .unwrap();
    assert_eq!(
        printer.job_attribute(job_id, "print-color-mode").as_deref(),
        Some("color")
    );

    // An operator's reprint: no bound.
    let resp = app
        .http
        .post(format!("{}/api/admin/sessions/{sid}/print", app.base))
        .bearer_auth(OPERATOR)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 202);
    let reprint: Value = resp.json().await.unwrap();
    let reprint_id = reprint["print_id"].as_str().unwrap();
    print_until(&app, &sid, &token, reprint_id, |p| {
        p["status"] == "COMPLETED"
    })
    .await;
    assert_eq!(printer.documents().len(), 2);
    let (_, audit) = app
        .operator_get("/api/admin/audit?action=print.request")
        .await;
    assert_eq!(audit["items"].as_array().map(Vec::len), Some(1), "{audit}");
    app.stop().await;
}
db_test!(a_branded_photo_prints_once_at_the_media_size);

async fn out_of_paper_holds_the_print_until_paper_is_in(backend: Backend) {
    let printer = TestPrinter::start("Booth B");
    let app = TestApp::spawn(backend).await;
    let slug = photo_experience(&app, json!({})).await;
    add_printer(&app, &printer, "Booth B", &slug).await;
    let (sid, token) = completed(&app, &slug).await;
    // The booth's display.
    let (terminal_id, terminal_token) = app.terminal(&slug).await;
    let mut display = support::Socket::connect(app.port, &terminal_id, &terminal_token, 0).await;
    printer.set_media_ready(&[]);
    // /ops sees it.
    let held = support::wait_for(WITHIN, || async {
        let (_, view) = app.operator_get("/api/admin/printers").await;
        let reason = view["printers"][0]["waiting_because"].as_str()?.to_owned();
        reason.contains("out of paper").then_some(view)
    })
    .await;
    assert!(held.is_some(), "/ops says the printer is out of paper");

    let (status, print) = guest_print(&app, &sid, &token, &uuid::Uuid::new_v4().to_string()).await;
    assert_eq!(status, 202, "{print}");
    let print_id = print["print_id"].as_str().unwrap().to_owned();
    let waiting = print_until(&app, &sid, &token, &print_id, |p| {
        p["reason"]
            .as_str()
            .is_some_and(|r| r.contains("out of paper"))
    })
    .await;
    assert_eq!(waiting["status"], "QUEUED", "{waiting}");
    assert!(
        printer.documents().is_empty(),
        "nothing printed while it is out of paper"
    );
    // The display says it too: one print waits, for paper.
    let frame = display.next_of_type("print.waiting", WITHIN).await;
    assert_eq!(
        frame,
        Some(json!({"type": "print.waiting", "waiting": 1, "reason": "out_of_paper"})),
        "the display is told why the print waits"
    );

    printer.set_media_ready(&LOADED);
    print_until(&app, &sid, &token, &print_id, |p| {
        p["status"] == "COMPLETED"
    })
    .await;
    assert_eq!(printer.documents().len(), 1);
    let frame = display.next_of_type("print.waiting", WITHIN).await;
    assert_eq!(
        frame,
        Some(json!({"type": "print.waiting", "waiting": 0, "reason": null})),
        "the display is told that nothing waits any more"
    );
    app.stop().await;
}
db_test!(out_of_paper_holds_the_print_until_paper_is_in);

async fn a_printer_switched_off_holds_its_prints_and_each_prints_once_when_back(backend: Backend) {
    let mut printer = TestPrinter::start("Booth C");
    let app = TestApp::spawn(backend).await;
    let slug = photo_experience(&app, json!({"prints_per_guest": 2})).await;
    add_printer(&app, &printer, "Booth C", &slug).await;
    let (sid, token) = completed(&app, &slug).await;
    printer.stop();
    let mut ids = Vec::new();
    for _ in 0..2 {
        let (status, print) =
            guest_print(&app, &sid, &token, &uuid::Uuid::new_v4().to_string()).await;
        assert_eq!(status, 202, "{print}");
        ids.push(print["print_id"].as_str().unwrap().to_owned());
    }
    for id in &ids {
        let waiting = print_until(&app, &sid, &token, id, |p| {
            p["reason"]
                .as_str()
                .is_some_and(|r| r.contains("not answering"))
        })
        .await;
        assert_eq!(waiting["status"], "QUEUED", "{waiting}");
    }
    printer.restart();
    for id in &ids {
        print_until(&app, &sid, &token, id, |p| p["status"] == "COMPLETED").await;
    }
    let documents = printer.documents();
    assert_eq!(documents.len(), 2, "each printed once: {documents:?}");
    app.stop().await;
}
db_test!(a_printer_switched_off_holds_its_prints_and_each_prints_once_when_back);

/// A printer that cannot take what this server sends is refused with the
/// reason: a media it does not have.
async fn a_printer_without_the_media_is_refused(backend: Backend) {
    let printer = TestPrinter::start("Booth D");
    let app = TestApp::spawn(backend).await;
    let resp = app
        .http
        .post(format!("{}/api/admin/printers", app.base))
        .bearer_auth(OPERATOR)
        .json(&json!({"name": "D", "uri": printer.uri, "media": "iso_a3_297x420mm"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 422);
    let body: Value = resp.json().await.unwrap();
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("iso_a3_297x420mm"),
        "{body}"
    );
    let resp = app
        .http
        .post(format!("{}/api/admin/printers", app.base))
        .bearer_auth(OPERATOR)
        .json(&json!({"name": "nobody", "uri": format!("ipp://127.0.0.1:{}/ipp/print", support::free_port()), "media": MEDIA}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 422);
    let body: Value = resp.json().await.unwrap();
    assert!(
        body["message"].as_str().unwrap().contains("did not answer"),
        "{body}"
    );
    app.stop().await;
}
db_test!(a_printer_without_the_media_is_refused);

/// A print waiting for a busy printer is sent the moment the printer's
/// print ends, not at its own next look (a second later). The clock is
/// held still past the first print's follow-up (200 ms) and short of the
/// waiting print's next look: the printer still gets the second print.
async fn the_next_print_goes_the_moment_the_printer_is_free(backend: Backend) {
    let printer = TestPrinter::start("Booth E");
    let clock = ManualClock::new(1_800_000_000_000);
    let app = TestApp::spawn_with_clock(backend, support::fast_sim(), |_| {}, clock.clone()).await;
    let slug = photo_experience(&app, json!({"prints_per_guest": 2})).await;
    add_printer(&app, &printer, "Booth E", &slug).await;
    // The saga runs on a moving clock; the prints on one held still.
    let ticking = {
        let clock = clock.clone();
        tokio::spawn(async move {
            loop {
                clock.advance_ms(50);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    let (sid, token) = completed(&app, &slug).await;
    ticking.abort();
    let _ = ticking.await;

    for _ in 0..2 {
        let (status, print) =
            guest_print(&app, &sid, &token, &uuid::Uuid::new_v4().to_string()).await;
        assert_eq!(status, 202, "{print}");
    }
    // One is at the printer, the other waits its turn (both were asked at
    // the same instant: either may go first).
    let (sending, waiting) = support::wait_for(WITHIN, || async {
        let view = app.status(&sid, &token).await;
        let prints = view["prints"].as_array()?.clone();
        let at = prints.iter().find(|p| p["status"] == "PRINTING")?.clone();
        let queued = prints
            .iter()
            .find(|p| p["status"] == "QUEUED" && !p["reason"].is_null())?
            .clone();
        Some((at, queued))
    })
    .await
    .expect("one print at the printer, the other waiting its turn");
    assert_ne!(sending["print_id"], waiting["print_id"]);
    // The printer is done with the first (asked by the test itself).
    let first = sending["print_id"].as_str().unwrap();
    let job_id = app
        .state
        .store
        .print(first)
        .await
        .unwrap()
        .unwrap()
        .ipp_job_id
        .unwrap();
    let ipp = IppPrinter::new(&printer.uri).unwrap();
    let done = support::wait_for(WITHIN, || async {
        let job = ipp.job(job_id).await.ok()?;
        (job.state == JobState::Completed).then_some(())
    })
    .await;
    assert!(done.is_some(), "the printer finished the first print");
    assert_eq!(printer.documents().len(), 1);

    clock.advance_ms(300);
    assert!(
        printer.holds_documents(2, WITHIN).await,
        "the second print reached the printer without its next look: {:?}",
        app.status(&sid, &token).await["prints"]
    );
    app.stop().await;
}
db_test!(the_next_print_goes_the_moment_the_printer_is_free);

/// A printer that takes PWG raster and not JPEG is added, and gets one page
/// of PWG raster at the media's size in pixels at its resolution.
async fn a_printer_without_jpeg_gets_pwg_raster(backend: Backend) {
    let printer = TestPrinter::start_taking("Booth F", "image/pwg-raster");
    let app = TestApp::spawn(backend).await;
    let slug = photo_experience(&app, json!({})).await;
    let added = add_printer(&app, &printer, "Booth F", &slug).await;
    let formats = added["formats"].as_array().unwrap();
    assert!(
        formats.contains(&json!("image/pwg-raster")) && !formats.contains(&json!("image/jpeg")),
        "{added}"
    );
    let (sid, token) = completed(&app, &slug).await;
    let (status, print) = guest_print(&app, &sid, &token, &uuid::Uuid::new_v4().to_string()).await;
    assert_eq!(status, 202, "{print}");
    let print_id = print["print_id"].as_str().unwrap().to_owned();
    print_until(&app, &sid, &token, &print_id, |p| {
        p["status"] == "COMPLETED"
    })
    .await;
    let documents = printer.documents();
    assert_eq!(documents.len(), 1, "{documents:?}");
    let bytes = std::fs::read(&documents[0]).unwrap();
    assert_eq!(&bytes[..4], b"RaS2", "PWG raster's sync word");
    let field = |at: usize| u32::from_be_bytes(bytes[4 + at..8 + at].try_into().unwrap());
    // HWResolution, Width and Height, ColorSpace (sRGB) of PWG 5102.4: 4x6
    // in at the printer's resolution, turned to the picture's orientation.
    let dpi = added["dpi"].as_u64().expect("the printer's dpi") as u32;
    assert_eq!((field(276), field(280)), (dpi, dpi));
    let size = (field(372), field(376));
    assert!(
        size == (4 * dpi, 6 * dpi) || size == (6 * dpi, 4 * dpi),
        "4x6 in at {dpi} dpi: {size:?}"
    );
    assert_eq!(field(400), 19, "sRGB");
    app.stop().await;
}
db_test!(a_printer_without_jpeg_gets_pwg_raster);
