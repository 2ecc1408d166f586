//! The event's brand (issue 47): an overlay, a logo and a caption drawn
//! on every result in the keep stage, at the original's size, with the
//! original kept underneath. Through HTTP and the display socket, on
//! SQLite and PostgreSQL: the display, the share page, the download and
//! the export show the branded rendition; bad uploads are refused with a
//! 4xx that names the problem; erasure deletes the branded files too.

mod support;

use std::time::Duration;

use image::{Rgba, RgbaImage};
use serde_json::{json, Value};
use support::{Backend, TestApp, OPERATOR};

const WITHIN: Duration = Duration::from_secs(30);

/// A frame: an opaque red border, a tenth of each side, clear inside.
fn frame_png(side: u32) -> Vec<u8> {
    let edge = side / 10;
    let frame = RgbaImage::from_fn(side, side, |x, y| {
        if x < edge || y < edge || x >= side - edge || y >= side - edge {
            Rgba([230, 20, 20, 255])
        } else {
            Rgba([0, 0, 0, 0])
        }
    });
    png(&frame)
}

fn png(image: &RgbaImage) -> Vec<u8> {
    let mut out = std::io::Cursor::new(Vec::new());
    image.write_to(&mut out, image::ImageFormat::Png).unwrap();
    out.into_inner()
}

async fn photo_experience(app: &TestApp, extra: Value) -> String {
    let slug = format!("br-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    app.experience_from(
        json!({"slug": slug, "title": "Branded comic", "kind": "comic", "input": "photo"}),
        extra,
    )
    .await
}

async fn put_brand(app: &TestApp, slug: &str, part: &str, body: Vec<u8>) -> (u16, Value) {
    let resp = app
        .http
        .put(format!(
            "{}/api/admin/experiences/{slug}/brand/{part}",
            app.base
        ))
        .bearer_auth(OPERATOR)
        .body(body)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

async fn fetch(app: &TestApp, path: &str) -> (u16, Vec<u8>) {
    let resp = app
        .http
        .get(format!("{}{path}", app.base))
        .send()
        .await
        .unwrap();
    (resp.status().as_u16(), resp.bytes().await.unwrap().to_vec())
}

fn decoded(bytes: &[u8]) -> image::RgbImage {
    image::load_from_memory(bytes)
        .expect("an image")
        .into_rgb8()
}

fn near(a: [u8; 3], b: [u8; 3], within: i32) -> bool {
    a.iter()
        .zip(b)
        .all(|(x, y)| (i32::from(*x) - i32::from(y)).abs() <= within)
}

/// The frame lies where `cover` places it (the square frame of side
/// `frame_side` scaled to the result's long side, centred: its top and
/// bottom bands are on the result, its sides cut on a portrait result),
/// the original shows through in the middle, and the rendition is the
/// original's size.
fn check_pixels(original: &image::RgbImage, branded: &image::RgbImage, frame_side: u32) {
    assert_eq!(
        branded.dimensions(),
        original.dimensions(),
        "at the original's size"
    );
    let (w, h) = branded.dimensions();
    let scale = f64::from(w.max(h)) / f64::from(frame_side);
    let band = (f64::from(frame_side / 10) * scale) as i64;
    let (left, top) = (
        (i64::from(w) - i64::from(w.max(h))) / 2,
        (i64::from(h) - i64::from(w.max(h))) / 2,
    );
    let on_frame = [
        (i64::from(w) / 2, top + band / 2),
        (i64::from(w) / 2, top + i64::from(w.max(h)) - band / 2),
        (left + band / 2, i64::from(h) / 2),
        (left + i64::from(w.max(h)) - band / 2, i64::from(h) / 2),
    ];
    for (x, y) in on_frame
        .into_iter()
        .filter(|&(x, y)| x >= 0 && y >= 0 && x < i64::from(w) && y < i64::from(h))
    {
        let (x, y) = (x as u32, y as u32);
        assert!(
            near(branded.get_pixel(x, y).0, [230, 20, 20], 24),
            "the frame at ({x}, {y}): {:?}",
            branded.get_pixel(x, y)
        );
    }
    for (x, y) in [(w / 2, h / 2), (w / 3, h / 3), (2 * w / 3, 2 * h / 3)] {
        assert!(
            near(branded.get_pixel(x, y).0, original.get_pixel(x, y).0, 24),
            "the original under the frame at ({x}, {y}): {:?} against {:?}",
            branded.get_pixel(x, y),
            original.get_pixel(x, y)
        );
    }
}

async fn a_branded_result_shows_everywhere_with_the_original_kept(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let slug = photo_experience(&app, json!({"gallery": "public"})).await;
    let (status, size) = put_brand(&app, &slug, "overlay", frame_png(200)).await;
    assert_eq!(
        (status, &size),
        (200, &json!({"width": 200, "height": 200}))
    );
    let preview = app
        .http
        .post(format!(
            "{}/api/admin/experiences/{slug}/brand/preview",
            app.base
        ))
        .bearer_auth(OPERATOR)
        .send()
        .await
        .unwrap();
    assert_eq!(preview.status(), 200);
    assert_eq!(preview.headers()["content-type"], "image/jpeg");
    let sample = decoded(&preview.bytes().await.unwrap());
    assert_eq!(sample.dimensions(), (1024, 1024));
    assert!(
        near(sample.get_pixel(10, 512).0, [230, 20, 20], 24),
        "the preview carries the frame"
    );

    let (terminal_id, terminal_token) = app.terminal(&slug).await;
    let mut display = app.terminal_socket(&terminal_id, &terminal_token, 0).await;
    let (_sid, _token, done) = app.photo_session(&slug, Some(&terminal_id)).await;
    let item = &done["result"]["content"][0];
    let url = item["url"].as_str().expect("url");
    let original_url = item["original_url"].as_str().expect("the original is kept");
    assert!(
        url.ends_with(".b.jpg") && original_url.ends_with(".png"),
        "{item}"
    );
    assert_eq!(
        item["print_url"], url,
        "the print takes the branded rendition: {item}"
    );
    assert!(
        item["thumb_url"].as_str().unwrap().ends_with(".bt.jpg"),
        "{item}"
    );

    let (status, original) = fetch(&app, original_url).await;
    assert_eq!(status, 200);
    let original = decoded(&original);
    let (status, branded) = fetch(&app, url).await;
    assert_eq!(status, 200);
    if let Ok(dir) = std::env::var("STAGEHAND_TEST_DUMP") {
        std::fs::write(format!("{dir}/branded.jpg"), &branded).unwrap();
    }
    check_pixels(&original, &decoded(&branded), 200);

    // The display shows the branded display-size copy.
    let shown = display
        .next_session_event(WITHIN)
        .await
        .expect("the display's event");
    assert_eq!(
        shown["result"]["content"][0]["thumb_url"], item["thumb_url"],
        "{shown}"
    );
    let (_, thumb) = fetch(&app, item["thumb_url"].as_str().unwrap()).await;
    let thumb = decoded(&thumb);
    assert_eq!(
        thumb.width().max(thumb.height()),
        640.min(original.width().max(original.height()))
    );
    assert!(
        near(thumb.get_pixel(thumb.width() / 2, 2).0, [230, 20, 20], 30),
        "the display copy is framed"
    );

    // The share page, the download and the export: the branded file.
    let share_url = done["share_url"].as_str().unwrap();
    let share_id = &share_url[3..];
    let (_, view) = fetch(&app, &format!("/api/share/{share_id}")).await;
    let view: Value = serde_json::from_slice(&view).unwrap();
    assert_eq!(view["content"][0]["url"], url, "{view}");
    let (status, downloaded) = fetch(&app, &format!("/r/{share_id}/download")).await;
    assert_eq!(status, 200);
    assert_eq!(downloaded, branded, "the download is the branded rendition");
    let export = app
        .http
        .get(format!("{}/api/admin/experiences/{slug}/export", app.base))
        .bearer_auth(OPERATOR)
        .send()
        .await
        .unwrap();
    assert_eq!(export.status(), 200);
    let mut zip =
        zip::ZipArchive::new(std::io::Cursor::new(export.bytes().await.unwrap().to_vec())).unwrap();
    let names: Vec<String> = zip
        .file_names()
        .map(|n| n.expect("a file name").into_owned())
        .collect();
    let branded_name = format!("files/{}", url.rsplit('/').next().unwrap());
    assert!(names.contains(&branded_name), "{names:?}");
    assert!(
        !names.iter().any(|n| n.ends_with(".png")),
        "the export shares the branded file only: {names:?}"
    );
    let mut inside = Vec::new();
    std::io::Read::read_to_end(&mut zip.by_name(&branded_name).unwrap(), &mut inside).unwrap();
    assert_eq!(inside, branded);
    app.stop().await;
}
db_test!(a_branded_result_shows_everywhere_with_the_original_kept);

/// `brand_applies_to: ["print"]` with a caption: the phone and the
/// display show the original, only the print takes the branded one; a
/// brand removed affects only the results made after.
async fn a_brand_for_print_only_leaves_the_screens_alone(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let slug = photo_experience(
        &app,
        json!({"brand_applies_to": ["print"], "brand_caption": "서울 디자인 위크 2026 #stagehand"}),
    )
    .await;
    let (_, _, done) = app.photo_session(&slug, None).await;
    let item = &done["result"]["content"][0];
    let url = item["url"].as_str().unwrap();
    assert!(
        url.ends_with(".png"),
        "the phone shows the original: {item}"
    );
    assert!(
        item["thumb_url"].as_str().unwrap().ends_with(".t.jpg"),
        "{item}"
    );
    assert_eq!(item["original_url"], url, "{item}");
    let print_url = item["print_url"].as_str().expect("a print rendition");
    assert!(print_url.ends_with(".b.jpg"), "{item}");
    let (_, original) = fetch(&app, url).await;
    let (_, printed) = fetch(&app, print_url).await;
    let (original, printed) = (decoded(&original), decoded(&printed));
    let (w, h) = printed.dimensions();
    // The caption's band darkens the foot; the top is the original.
    let foot = printed.get_pixel(w / 20, h - 2).0;
    let under = original.get_pixel(w / 20, h - 2).0;
    assert!(
        foot.iter()
            .zip(under)
            .all(|(b, o)| i32::from(*b) <= i32::from(o) * 60 / 100 + 12),
        "the band at the foot: {foot:?} over {under:?}"
    );
    assert!(near(
        printed.get_pixel(w / 2, h / 4).0,
        original.get_pixel(w / 2, h / 4).0,
        24
    ));

    // The caption cleared: the next result has no branded rendition.
    let patch = app
        .http
        .patch(format!("{}/api/experiences/{slug}", app.base))
        .bearer_auth(OPERATOR)
        .header("Idempotency-Key", uuid::Uuid::new_v4().to_string())
        .json(&json!({"brand_caption": null}))
        .send()
        .await
        .unwrap();
    assert_eq!(patch.status(), 200, "{}", patch.text().await.unwrap());
    let (_, _, next) = app.photo_session(&slug, None).await;
    let item = &next["result"]["content"][0];
    assert!(
        item.get("print_url").is_none() && item.get("original_url").is_none(),
        "{item}"
    );
    // The first result keeps its branded rendition.
    assert_eq!(fetch(&app, print_url).await.0, 200);
    app.stop().await;
}
db_test!(a_brand_for_print_only_leaves_the_screens_alone);

/// Every bad brand input is a 4xx naming the problem; nothing is stored.
async fn bad_brand_uploads_are_refused_with_the_reason(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let slug = photo_experience(&app, json!({})).await;
    let (status, body) = put_brand(
        &app,
        &slug,
        "overlay",
        include_bytes!("fixtures/photo-gps-rotated.jpg").to_vec(),
    )
    .await;
    assert_eq!(status, 415, "{body}");
    assert!(body["message"].as_str().unwrap().contains("PNG"), "{body}");
    let (status, body) = put_brand(&app, &slug, "overlay", b"not an image at all".to_vec()).await;
    assert_eq!(status, 415, "{body}");
    let wide = png(&RgbaImage::from_pixel(9000, 2, Rgba([0, 0, 0, 0])));
    let (status, body) = put_brand(&app, &slug, "overlay", wide).await;
    assert_eq!(status, 422, "{body}");
    assert!(body["message"].as_str().unwrap().contains("9000"), "{body}");
    let mut cut = frame_png(300);
    cut.truncate(cut.len() / 2);
    let (status, body) = put_brand(&app, &slug, "logo", cut).await;
    assert_eq!(status, 422, "{body}");
    assert!(body["message"].as_str().unwrap().contains("logo"), "{body}");
    let (status, body) = put_brand(&app, &slug, "overlay", vec![0u8; 21 * 1024 * 1024]).await;
    assert_eq!(status, 413, "{body}");
    let (status, _) = put_brand(&app, &slug, "sticker", frame_png(10)).await;
    assert_eq!(status, 404);
    let (status, _) = put_brand(&app, "no-such-experience", "overlay", frame_png(10)).await;
    assert_eq!(status, 404);
    for (patch, names) in [
        (json!({"brand_caption": "가".repeat(81)}), "brand_caption"),
        (json!({"brand_fit": "stretch"}), "brand_fit"),
        (json!({"brand_applies_to": ["screen"]}), "brand_applies_to"),
        (json!({"prints_per_guest": 21}), "prints_per_guest"),
    ] {
        let resp = app
            .http
            .patch(format!("{}/api/experiences/{slug}", app.base))
            .bearer_auth(OPERATOR)
            .header("Idempotency-Key", uuid::Uuid::new_v4().to_string())
            .json(&patch)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 422, "{patch}");
        let body: Value = resp.json().await.unwrap();
        assert!(body["message"].as_str().unwrap().contains(names), "{body}");
    }
    // Nothing was taken: no brand to preview.
    let preview = app
        .http
        .post(format!(
            "{}/api/admin/experiences/{slug}/brand/preview",
            app.base
        ))
        .bearer_auth(OPERATOR)
        .send()
        .await
        .unwrap();
    assert_eq!(preview.status(), 409);
    let (_, experience) = app.operator_get(&format!("/api/experiences/{slug}")).await;
    assert_eq!(experience["brand_overlay"], Value::Null, "{experience}");
    app.stop().await;
}
db_test!(bad_brand_uploads_are_refused_with_the_reason);

/// A guest's erasure deletes the branded rendition and its display copy
/// with the original.
async fn erasure_deletes_the_branded_files(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let slug = photo_experience(&app, json!({"brand_caption": "Erase me"})).await;
    let (sid, token, done) = app.photo_session(&slug, None).await;
    let item = done["result"]["content"][0].clone();
    let urls: Vec<String> = ["url", "thumb_url", "original_url"]
        .iter()
        .map(|f| item[*f].as_str().expect("a kept file").to_owned())
        .collect();
    for url in &urls {
        assert_eq!(fetch(&app, url).await.0, 200, "{url}");
    }
    let erased = app
        .http
        .delete(format!("{}/api/sessions/{sid}", app.base))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(erased.status(), 200);
    for url in &urls {
        let gone = support::wait_for(WITHIN, || async {
            (fetch(&app, url).await.0 == 404).then_some(())
        })
        .await;
        assert!(gone.is_some(), "{url} is deleted with the session");
    }
    app.stop().await;
}
db_test!(erasure_deletes_the_branded_files);
