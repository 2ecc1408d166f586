//! The AI provider's request rate limit, shared by every saga (and every
//! instance: it lives in the database): a burst of participants never sends
//! the provider more than the limit in any window. The fake provider here
//! records the time of every request it gets. On SQLite and on PostgreSQL.

mod support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix_web::{web, App, HttpResponse, HttpServer};
use serde_json::json;
use stagehand::config::RateLimit;
use support::{Backend, TestApp};

/// A job API whose jobs succeed at once, recording when each request came.
async fn start_recording_provider() -> (String, Arc<Mutex<Vec<Instant>>>) {
    let seen: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let data = web::Data::new(seen.clone());
    let server = HttpServer::new(move || {
        App::new()
            .app_data(data.clone())
            .route(
                "/v1/jobs",
                web::post().to(|seen: web::Data<Arc<Mutex<Vec<Instant>>>>, req: actix_web::HttpRequest| async move {
                    seen.lock().unwrap().push(Instant::now());
                    let key = req
                        .headers()
                        .get("Idempotency-Key")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("none")
                        .to_owned();
                    HttpResponse::Ok().json(json!({"job_id": key, "status": "running"}))
                }),
            )
            .route(
                "/v1/jobs/{id}",
                web::get().to(|seen: web::Data<Arc<Mutex<Vec<Instant>>>>, id: web::Path<String>| async move {
                    seen.lock().unwrap().push(Instant::now());
                    HttpResponse::Ok().json(json!({
                        "job_id": id.into_inner(),
                        "status": "succeeded",
                        "result": {"content": [{"type": "text", "text": "ok"}], "score": 1.0}
                    }))
                }),
            )
    })
    .workers(1)
    .bind("127.0.0.1:0")
    .unwrap();
    let port = server.addrs()[0].port();
    actix_web::rt::spawn(server.run());
    (format!("http://127.0.0.1:{port}"), seen)
}

/// 15 participants at once against a limit of 10 requests a second (each
/// saga makes a submit and a poll): the provider never gets more than 10
/// requests in any second, and every session completes.
async fn a_burst_never_exceeds_the_provider_rate_limit(backend: Backend) {
    const PER_SECOND: usize = 10;
    let (url, seen) = start_recording_provider().await;
    let app = TestApp::spawn_with(backend, support::fast_sim(), |config| {
        config.ai_url = Some(url);
        config.ai_rate_limit = RateLimit::Every {
            count: std::num::NonZeroU32::new(PER_SECOND as u32).unwrap(),
            per: Duration::from_secs(1),
        };
    })
    .await;
    let slug = app.experience(100).await;
    let mut sessions = Vec::new();
    for i in 0..15 {
        sessions.push(app.session(&slug, None, &format!("b{i}")).await);
    }
    let answers = futures_util::future::join_all(
        sessions
            .iter()
            .map(|(sid, tok)| app.submit(sid, tok, json!({"prompt": "x"}), "k")),
    )
    .await;
    assert!(answers.iter().all(|r| r.status() == 202));
    support::wait_all_final(&app.http, &app.base, &sessions, Duration::from_secs(60))
        .await
        .unwrap();
    let times = seen.lock().unwrap().clone();
    assert!(
        times.len() >= 30,
        "a submit and a poll per saga: {}",
        times.len()
    );
    let busiest = times
        .iter()
        .map(|start| {
            times
                .iter()
                .filter(|t| **t >= *start && t.duration_since(*start) < Duration::from_secs(1))
                .count()
        })
        .max()
        .unwrap();
    eprintln!(
        "provider requests: {} in all, at most {busiest} in one second",
        times.len()
    );
    assert!(
        busiest <= PER_SECOND,
        "{busiest} requests in one second against a limit of {PER_SECOND}"
    );
    app.stop().await;
}
db_test!(a_burst_never_exceeds_the_provider_rate_limit);
