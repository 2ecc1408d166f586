//! The event's brand (admin): `PUT`/`DELETE
//! /api/admin/experiences/{slug}/brand/overlay` (and `/logo`) set and
//! remove its images, and `POST …/brand/preview` draws it on a sample so
//! /ops shows it before the event. Its placement, caption and surfaces
//! are experience settings (`brand_fit`, `brand_caption`,
//! `brand_applies_to`).
//!
//! An upload is refused with a 4xx that names the problem before
//! anything is stored: not a PNG (415), more bytes than
//! [`MAX_BRAND_FILE_BYTES`] (413), more pixels than [`BRAND_LIMITS`] or a
//! file that does not decode (422). The file goes to the media store
//! first, then the row names it and raises the brand's version (with the
//! audit record), so a result made after the answer carries the new
//! brand, and one made before keeps the old: a brand change never
//! touches results already kept.

use actix_web::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use actix_web::{web, HttpRequest, HttpResponse};
use serde_json::json;

use super::auth::signed_in;
use super::error::ApiError;
use super::media::{declared_length, read_photo_body, refuse_declared_length};
use super::AppState;
use crate::domain::audit::{AuditAction, AuditEntry};
use crate::domain::brand::{brand_file_key, BrandPart};
use crate::media::brand::{
    check_upload, read_brand, sample_result, BrandUploadError, MAX_BRAND_FILE_BYTES,
};
use crate::media::photo::{decode_rgb, jpeg_of, PhotoLimits};

/// The path's part (`overlay` or `logo`), or 404.
fn part_of(name: &str) -> Result<BrandPart, ApiError> {
    name.parse().map_err(|_| ApiError::NotFound("brand part"))
}

/// `PUT /api/admin/experiences/{slug}/brand/{part}`: the PNG is the body.
#[utoipa::path(
    put,
    path = "/api/admin/experiences/{slug}/brand/{part}",
    tag = "operators",
    summary = "Set the brand's overlay (the frame) or its corner logo: a PNG, alpha kept.",
    security(("operator" = [])),
    params(("slug" = String, Path), ("part" = String, Path, description = "`overlay` or `logo`.")),
    request_body(content = Vec<u8>, content_type = "image/png"),
    responses(
        (status = 200, description = "Taken: the image's size. Results made from now on carry it.", body = super::schema::BrandImage),
        (status = 401, description = "`unauthorized`.", body = super::schema::ErrorBody),
        (status = 403, description = "`forbidden`: only an admin sets the brand.", body = super::schema::ErrorBody),
        (status = 404, description = "`not_found`: no such experience or part.", body = super::schema::ErrorBody),
        (status = 408, description = "`upload_too_slow`: the image arrived too slowly.", body = super::schema::ErrorBody),
        (status = 413, description = "`payload_too_large`: more than 20 MiB.", body = super::schema::ErrorBody),
        (status = 415, description = "`unsupported_media_type`: not a PNG.", body = super::schema::ErrorBody),
        (status = 422, description = "`validation_failed`: more than 25 megapixels or 8,192 a side, or it does not decode.", body = super::schema::ErrorBody),
    )
)]
pub async fn put_brand_image(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(String, String)>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let operator = signed_in(&req)?;
    let (slug, part) = path.into_inner();
    let part = part_of(&part)?;
    let max = MAX_BRAND_FILE_BYTES as u64;
    refuse_declared_length(&req, max)?;
    let experience = state.experience(&slug).await?;
    let body = read_photo_body(payload, declared_length(&req), max, state.photos.pace).await?;
    let checked = body.clone();
    let (width, height) = state
        .photos
        .pool
        .run(move |memory| check_upload(&checked, part.as_str(), memory))
        .await?
        .map_err(upload_refused)?;
    let key = brand_file_key(&experience.id, part);
    state.media.put(&key, body).await?;
    let audit = AuditEntry::new(
        &operator,
        AuditAction::ExperienceUpdate,
        format!("experience:{}", experience.slug),
    )
    .detail(format!(
        "brand {} set: {width} × {height} PNG",
        part.as_str()
    ));
    state
        .store
        .set_brand_file(
            &experience.id,
            part,
            Some((key, width, height)),
            &audit,
            state.clock.now_ms(),
        )
        .await?;
    tracing::info!(experience = %experience.slug, part = part.as_str(), width, height, operator = %operator.name, "brand image set");
    Ok(HttpResponse::Ok().json(json!({ "width": width, "height": height })))
}

/// `DELETE /api/admin/experiences/{slug}/brand/{part}`.
#[utoipa::path(
    delete,
    path = "/api/admin/experiences/{slug}/brand/{part}",
    tag = "operators",
    summary = "Remove the brand's overlay or logo: results made from now on are without it.",
    security(("operator" = [])),
    params(("slug" = String, Path), ("part" = String, Path, description = "`overlay` or `logo`.")),
    responses(
        (status = 204, description = "Removed (or there was none)."),
        (status = 401, description = "`unauthorized`.", body = super::schema::ErrorBody),
        (status = 403, description = "`forbidden`: only an admin sets the brand.", body = super::schema::ErrorBody),
        (status = 404, description = "`not_found`: no such experience or part.", body = super::schema::ErrorBody),
    )
)]
pub async fn delete_brand_image(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let operator = signed_in(&req)?;
    let (slug, part) = path.into_inner();
    let part = part_of(&part)?;
    let experience = state.experience(&slug).await?;
    let audit = AuditEntry::new(
        &operator,
        AuditAction::ExperienceUpdate,
        format!("experience:{}", experience.slug),
    )
    .detail(format!("brand {} removed", part.as_str()));
    state
        .store
        .set_brand_file(&experience.id, part, None, &audit, state.clock.now_ms())
        .await?;
    // After the row no longer names it: a keep that read the brand
    // before keeps drawing it from memory, never from a missing file.
    let key = brand_file_key(&experience.id, part);
    if let Err(e) = state.media.delete(&key).await {
        tracing::warn!(%key, error = %e, "the removed brand file could not be deleted; it is replaced on the next upload");
    }
    Ok(HttpResponse::NoContent().finish())
}

/// `POST /api/admin/experiences/{slug}/brand/preview`: the brand drawn on
/// the body's image (a JPEG, PNG or WebP), or on a 1024² sample without
/// one.
#[utoipa::path(
    post,
    path = "/api/admin/experiences/{slug}/brand/preview",
    tag = "operators",
    summary = "Draw the brand on a sample (or on the image sent) and answer the JPEG.",
    security(("operator" = [])),
    params(("slug" = String, Path)),
    responses(
        (status = 200, description = "The branded sample.", content_type = "image/jpeg", body = Vec<u8>),
        (status = 401, description = "`unauthorized`.", body = super::schema::ErrorBody),
        (status = 404, description = "`not_found`: no such experience.", body = super::schema::ErrorBody),
        (status = 409, description = "`conflict`: the experience has no brand yet.", body = super::schema::ErrorBody),
        (status = 413, description = "`payload_too_large`: a sample of more than 20 MiB.", body = super::schema::ErrorBody),
        (status = 408, description = "`upload_too_slow`: the sample arrived too slowly.", body = super::schema::ErrorBody),
        (status = 415, description = "`unsupported_media_type`: the sample is not a JPEG, PNG or WebP.", body = super::schema::ErrorBody),
        (status = 422, description = "`photo_unreadable`: the sample does not decode, or is past the photo limits.", body = super::schema::ErrorBody),
    )
)]
pub async fn preview_brand(
    state: web::Data<AppState>,
    req: HttpRequest,
    slug: web::Path<String>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let max = MAX_BRAND_FILE_BYTES as u64;
    refuse_declared_length(&req, max)?;
    let experience = state.experience(&slug).await?;
    let sample = read_photo_body(payload, declared_length(&req), max, state.photos.pace).await?;
    let art = read_brand(&experience, &state.media, &state.photos.pool)
        .await
        .map_err(ApiError::MediaUnavailable)?
        .ok_or_else(|| {
            ApiError::Conflict(
                "this experience has no brand yet: upload an overlay or a logo, or set brand_caption"
                    .into(),
            )
        })?;
    let jpeg = state
        .photos
        .pool
        .run(move |memory| {
            let mut image = if sample.is_empty() {
                sample_result(1024)
            } else {
                decode_rgb(&sample, &PhotoLimits::default(), memory)?.image
            };
            art.draw(&mut image);
            jpeg_of(&image, 85)
        })
        .await??;
    Ok(HttpResponse::Ok()
        .insert_header((CONTENT_TYPE, "image/jpeg"))
        .insert_header((CACHE_CONTROL, "no-store"))
        .body(jpeg.bytes))
}

/// An upload refused, as the API says it.
fn upload_refused(e: BrandUploadError) -> ApiError {
    match e {
        BrandUploadError::NotPng(_) => ApiError::UnsupportedMediaType(e.to_string()),
        BrandUploadError::TooManyPixels { .. } | BrandUploadError::Unreadable { .. } => {
            ApiError::Validation(e.to_string())
        }
    }
}
