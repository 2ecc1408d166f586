//! The pages in `static/`, embedded in the binary so the server serves them
//! from any working directory.

use actix_web::HttpResponse;

const INDEX: &str = include_str!("../../static/index.html");

pub async fn index() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/html; charset=utf-8")
        .body(INDEX)
}
