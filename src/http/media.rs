//! Media over HTTP: a participant's photo upload (`POST
//! /api/sessions/{id}/photo`) and the files this server keeps (`GET
//! /media/{key}`).
//!
//! An upload is refused before it is read whole when its `Content-Length`
//! (or the bytes that actually come) pass `max_photo_bytes` (413); its
//! format is judged by its bytes (415 but for JPEG, PNG and WebP); it is
//! decoded in the photo pool, off the HTTP workers, with pixel and memory
//! limits (a bomb is 422), turned upright, downscaled to the experience's
//! `photo_max_px` and re-encoded with no metadata. A full pool is 503 with
//! `Retry-After`; so is a media store that does not answer.
//!
//! Serving: results (`r/…`) are public to whoever has the unguessable key
//! and cached for a year (`immutable`: a key never changes meaning); a
//! photo (`p/…`) is read only with its session's participant token, the
//! operator token, or a signed URL (`?exp=&sig=`, what a provider gets).
//! Strong ETags, `Range`, `nosniff`. With S3 the bytes stream through this
//! server (one origin for the pages, the same access rules for every
//! store), rather than redirecting to a presigned URL.

use actix_web::http::header::{self, HeaderValue};
use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::json;

use super::auth::{bearer, require_session, same_secret};
use super::body::request_hash;
use super::error::ApiError;
use super::idempotency::{key_of, respond, run_idempotent_hashed, Reply};
use super::AppState;
use crate::domain::keys::token_hash;
use crate::domain::media::{is_photo_key, photo_object_key, signature_holds, InputKind, KeptType};
use crate::media::photo::{normalize, PhotoLimits};
use crate::store::photos::NewPhoto;

/// `POST /api/sessions/{id}/photo`
#[utoipa::path(
    post,
    path = "/api/sessions/{id}/photo",
    tag = "participants",
    summary = "Upload the participant's photo (the image is the body); a submission then names its photo_id.",
    security(("participant" = [])),
    params(
        ("id" = String, Path, description = "The session's id."),
        super::schema::SubmissionKey,
    ),
    request_body(content = Vec<u8>, content_type = "image/jpeg", description = "A JPEG, PNG or WebP image, at most `max_photo_bytes` (10 MiB by default). The format is read from the bytes, not the Content-Type."),
    responses(
        (status = 201, description = "Stored: upright, at most the experience's `photo_max_px` on its long side, re-encoded as JPEG with no metadata (no EXIF, no GPS).", body = super::schema::PhotoStored),
        (status = 400, description = "`idempotency_key_required`.", body = super::schema::ErrorBody),
        (status = 401, description = "`unauthorized`: the token does not open this session.", body = super::schema::ErrorBody),
        (status = 404, description = "`not_found`: no such session.", body = super::schema::ErrorBody),
        (status = 413, description = "`payload_too_large`: past `max_photo_bytes`; refused before the body is read whole.", body = super::schema::ErrorBody),
        (status = 415, description = "`unsupported_media_type`: not JPEG, PNG or WebP (HEIC is named).", body = super::schema::ErrorBody),
        (status = 422, description = "`photo_unreadable`: truncated, corrupt, or past a decoding limit (named); `validation_failed`: the experience takes no photo; `idempotency_key_reused`.", body = super::schema::ErrorBody),
        (status = 503, description = "`photo_pool_full` (every photo worker busy and the queue full) or `media_unavailable` (the media store does not answer).", body = super::schema::ErrorBody, headers(("Retry-After" = u64, description = "Seconds to wait."))),
    )
)]
pub async fn upload_photo(
    state: web::Data<AppState>,
    req: HttpRequest,
    session_id: web::Path<String>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let max = state.photos.max_bytes;
    refuse_declared_length(&req, max)?;
    let session = require_session(&state, &req, &session_id, false).await?;
    let key = key_of(&req)?.ok_or(ApiError::IdempotencyKeyRequired)?;
    // A place in the pool before the body is read: past the queue, 503 at
    // once, with nothing read.
    let place = state.photos.pool.admit()?;
    let body = read_photo_body(payload, declared_length(&req), max).await?;
    let (body_hash, place) = hash_in_the_pool(place, body.clone()).await?;
    let token = bearer(&req).unwrap_or_default().to_owned();
    let scope = format!("photo:{}", session.id);
    let place = std::sync::Mutex::new(Some(place));
    let (reply, replayed) = run_idempotent_hashed(&state, &scope, &token, key, body_hash, || {
        let place = place.lock().ok().and_then(|mut p| p.take());
        store_photo(&state, &session, body.clone(), place)
    })
    .await?;
    Ok(respond(reply, replayed, None))
}

/// The body's hash for its Idempotency-Key, made in the photo pool with
/// the upload's own place: SHA-256 of a 3 MB photo takes about 7 ms of CPU,
/// which on an HTTP worker would hold up every request that worker serves,
/// and at the server's priority would take it from other people's 202s.
async fn hash_in_the_pool(
    place: crate::media::pool::Admitted,
    body: web::Bytes,
) -> Result<(String, crate::media::pool::Admitted), ApiError> {
    Ok(place.run_keeping(move || request_hash(&body)).await?)
}

/// The `Content-Length` the client declared, if any.
fn declared_length(req: &HttpRequest) -> Option<u64> {
    req.headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
}

/// 413 at once when the declared length is past `max`.
fn refuse_declared_length(req: &HttpRequest, max: u64) -> Result<(), ApiError> {
    if declared_length(req).is_some_and(|n| n > max) {
        return Err(ApiError::PayloadTooLarge(max as usize));
    }
    Ok(())
}

/// The body, refused (413) as soon as more than `max` bytes came. Room for
/// the declared length (at most `max`) is taken once, so a 3 MB photo is
/// not copied again each time its buffer grows.
async fn read_photo_body(
    mut payload: web::Payload,
    declared: Option<u64>,
    max: u64,
) -> Result<web::Bytes, ApiError> {
    let room = declared.unwrap_or(0).min(max);
    let mut body = web::BytesMut::with_capacity(usize::try_from(room).unwrap_or(0));
    while let Some(chunk) = payload.next().await {
        let chunk =
            chunk.map_err(|e| ApiError::Validation(format!("the photo could not be read: {e}")))?;
        if (body.len() + chunk.len()) as u64 > max {
            return Err(ApiError::PayloadTooLarge(max as usize));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body.freeze())
}

/// Decodes, cleans and stores one photo of `session`: 201 with its id and
/// size.
async fn store_photo(
    state: &AppState,
    session: &crate::store::entities::sessions::Model,
    body: web::Bytes,
    place: Option<crate::media::pool::Admitted>,
) -> Result<Reply, ApiError> {
    let experience = state
        .store
        .experience_by_id(&session.experience_id)
        .await?
        .ok_or(ApiError::NotFound("experience"))?;
    if !InputKind::of(&experience.input).takes_photo() {
        return Err(ApiError::Validation(
            "this experience takes no photo (its input is \"prompt\")".into(),
        ));
    }
    let max_px = experience.photo_max_px.max(1) as u32;
    let started = std::time::Instant::now();
    let place = match place {
        Some(place) => place,
        None => state.photos.pool.admit()?,
    };
    let photo = place
        .run(move || normalize(&body, max_px, &PhotoLimits::default()))
        .await??;
    metrics::histogram!(crate::metrics::PHOTO_DECODE_DURATION)
        .record(started.elapsed().as_secs_f64());
    let object_key = photo_object_key(rand::random());
    let stored = web::Bytes::from(photo.bytes);
    let bytes = stored.len() as u64;
    state.media.put(&object_key, stored).await?;
    let row = state
        .store
        .insert_photo(
            NewPhoto {
                id: crate::store::new_id(),
                session_id: session.id.clone(),
                object_key,
                content_type: photo.content_type.to_owned(),
                width: photo.width,
                height: photo.height,
                bytes,
            },
            state.clock.now_ms(),
        )
        .await?;
    tracing::info!(session_id = %session.id, photo_id = %row.id, width = row.width, height = row.height, bytes, "photo stored");
    Ok(Reply {
        status: StatusCode::CREATED,
        body: json!({
            "photo_id": row.id,
            "width": row.width,
            "height": row.height,
            "bytes": row.bytes,
        }),
    })
}

/// A signed URL's query.
#[derive(Deserialize)]
pub struct Signed {
    exp: Option<i64>,
    sig: Option<String>,
}

/// `GET /media/r/{name}`: a kept result file (or its thumbnail).
#[utoipa::path(
    get,
    path = "/media/r/{name}",
    tag = "participants",
    summary = "A kept result file: public to whoever has its unguessable name, cached for a year.",
    params(
        ("name" = String, Path, description = "`<32 hex>.<ext>`; `<32 hex>.t.jpg` is its display thumbnail."),
        ("Range" = Option<String>, Header, description = "One byte range (`bytes=0-1023`); several, or one outside the file, get the whole file."),
    ),
    responses(
        (status = 200, description = "The file, with its stored Content-Type, a strong ETag, `X-Content-Type-Options: nosniff` and `Cache-Control: public, max-age=31536000, immutable`.", content_type = "application/octet-stream"),
        (status = 206, description = "The requested range."),
        (status = 304, description = "Not modified (`If-None-Match`)."),
        (status = 404, description = "`not_found`: no such file.", body = super::schema::ErrorBody),
        (status = 422, description = "`validation_failed`: a malformed query parameter.", body = super::schema::ErrorBody),
        (status = 503, description = "`media_unavailable`.", body = super::schema::ErrorBody),
    )
)]
pub async fn serve_result(
    state: web::Data<AppState>,
    req: HttpRequest,
    name: web::Path<String>,
    signed: web::Query<Signed>,
) -> Result<HttpResponse, ApiError> {
    serve_media(&state, &req, format!("r/{}", name.into_inner()), &signed).await
}

/// `GET /media/p/{name}`: a participant's photo.
#[utoipa::path(
    get,
    path = "/media/p/{name}",
    tag = "participants",
    summary = "A participant's photo: its session's token, the operator token, or a signed URL (what a provider gets).",
    security((), ("participant" = []), ("operator" = [])),
    params(
        ("name" = String, Path, description = "`<32 hex>.jpg`."),
        ("exp" = Option<i64>, Query, description = "A signed URL's expiry (epoch ms)."),
        ("sig" = Option<String>, Query, description = "A signed URL's signature."),
        ("Range" = Option<String>, Header, description = "One byte range."),
    ),
    responses(
        (status = 200, description = "The photo (`image/jpeg`, `Cache-Control: private, no-store`).", content_type = "image/jpeg"),
        (status = 206, description = "The requested range."),
        (status = 304, description = "Not modified (`If-None-Match`)."),
        (status = 401, description = "`unauthorized`: no token of its session, and no valid signature (a signature expires, and one good for more than 15 minutes is refused).", body = super::schema::ErrorBody),
        (status = 404, description = "`not_found`: no such photo, or it was given up (retention, erasure, the orphan sweep).", body = super::schema::ErrorBody),
        (status = 422, description = "`validation_failed`: a malformed `exp` or `sig`.", body = super::schema::ErrorBody),
        (status = 503, description = "`media_unavailable`.", body = super::schema::ErrorBody),
    )
)]
pub async fn serve_photo(
    state: web::Data<AppState>,
    req: HttpRequest,
    name: web::Path<String>,
    signed: web::Query<Signed>,
) -> Result<HttpResponse, ApiError> {
    serve_media(&state, &req, format!("p/{}", name.into_inner()), &signed).await
}

/// Serves the object at `key` (see the module doc).
async fn serve_media(
    state: &AppState,
    req: &HttpRequest,
    key: String,
    signed: &Signed,
) -> Result<HttpResponse, ApiError> {
    let kept = KeptType::of_key(&key)
        .filter(|_| valid_key(&key))
        .ok_or(ApiError::NotFound("media"))?;
    if is_photo_key(&key) {
        allow_photo(state, req, &key, signed).await?;
    }
    let etag = format!("\"{}\"", key.replace(['/', '.'], "-"));
    if req
        .headers()
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == etag))
    {
        return Ok(HttpResponse::NotModified()
            .insert_header((header::ETAG, etag))
            .finish());
    }
    let size = state.media.size(&key).await?;
    // A range outside the file is ignored (RFC 9110 allows it): the whole
    // file comes.
    let range = requested_range(req, size).unwrap_or(None);
    let bytes = match &range {
        Some((start, end)) => state.media.get_range(&key, *start..*end + 1).await?,
        None => state.media.get(&key).await?,
    };
    let mut answer = match &range {
        Some((start, end)) => {
            let mut partial = HttpResponse::build(StatusCode::PARTIAL_CONTENT);
            partial.insert_header((header::CONTENT_RANGE, format!("bytes {start}-{end}/{size}")));
            partial
        }
        None => HttpResponse::Ok(),
    };
    answer
        .insert_header((header::CONTENT_TYPE, kept.content_type))
        .insert_header((header::ETAG, etag))
        .insert_header((header::ACCEPT_RANGES, "bytes"))
        .insert_header(("X-Content-Type-Options", "nosniff"))
        .insert_header((
            header::CACHE_CONTROL,
            if is_photo_key(&key) {
                "private, no-store"
            } else {
                "public, max-age=31536000, immutable"
            },
        ));
    if kept.content_type == "image/svg+xml" {
        // An SVG opened as a page runs nothing.
        answer.insert_header((
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static("default-src 'none'; style-src 'unsafe-inline'; sandbox"),
        ));
    }
    Ok(answer.body(bytes))
}

/// A key as this server makes them: `r/` or `p/`, then hex, then its
/// extension(s); nothing else reaches the store.
fn valid_key(key: &str) -> bool {
    let Some(rest) = key.strip_prefix("r/").or_else(|| key.strip_prefix("p/")) else {
        return false;
    };
    let (stem, extension) = rest.split_once('.').unwrap_or((rest, ""));
    stem.len() == 32
        && stem.bytes().all(|b| b.is_ascii_hexdigit())
        && matches!(extension.split('.').count(), 1 | 2)
        && extension
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.')
}

/// A photo is read with its session's participant token, the operator
/// token, or a signed URL that has not expired (and is good for 15
/// minutes at most); by none of them once it was given up (retention,
/// erasure, the orphan sweep), even while its object waits for the purge.
async fn allow_photo(
    state: &AppState,
    req: &HttpRequest,
    key: &str,
    signed: &Signed,
) -> Result<(), ApiError> {
    let denied =
        ApiError::Unauthorized("a photo is read only with its session's token or a signed URL");
    let kept = || async {
        match state.store.photo_by_key(key).await? {
            Some(photo) => Ok(photo),
            None => Err(ApiError::NotFound("media")),
        }
    };
    if let (Some(exp), Some(sig)) = (signed.exp, &signed.sig) {
        if signature_holds(&state.photos.secret, key, exp, sig, state.clock.now_ms()) {
            return kept().await.map(drop);
        }
        return Err(denied);
    }
    let Some(token) = bearer(req) else {
        return Err(denied);
    };
    if super::auth::operator_by_token(state, token)
        .await?
        .is_some()
    {
        return kept().await.map(drop);
    }
    let photo = kept().await?;
    let session = state
        .store
        .session(&photo.session_id)
        .await?
        .ok_or(ApiError::NotFound("media"))?;
    if same_secret(&token_hash(token), &session.participant_token_hash) {
        Ok(())
    } else {
        Err(denied)
    }
}

/// One byte range of a file of `size` bytes (`bytes=a-b`, `bytes=a-`,
/// `bytes=-n`), inclusive; None: the whole file (no Range, or one this
/// server does not split, such as several ranges); Err: outside the file.
fn requested_range(req: &HttpRequest, size: u64) -> Result<Option<(u64, u64)>, ()> {
    let Some(spec) = req
        .headers()
        .get(header::RANGE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().strip_prefix("bytes="))
    else {
        return Ok(None);
    };
    if spec.contains(',') {
        return Ok(None);
    }
    let Some((first, last)) = spec.split_once('-') else {
        return Ok(None);
    };
    let (start, end) = match (
        first.trim().parse::<u64>().ok(),
        last.trim().parse::<u64>().ok(),
    ) {
        (Some(start), Some(end)) => (start, end.min(size.saturating_sub(1))),
        (Some(start), None) => (start, size.saturating_sub(1)),
        (None, Some(suffix)) if suffix > 0 => (size.saturating_sub(suffix), size.saturating_sub(1)),
        _ => return Ok(None),
    };
    if size == 0 || start > end || start >= size {
        return Err(());
    }
    Ok(Some((start, end)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_keys_this_server_makes_are_served() {
        let hex = "0123456789abcdef0123456789abcdef";
        assert!(valid_key(&format!("r/{hex}.png")));
        assert!(valid_key(&format!("r/{hex}.t.jpg")));
        assert!(valid_key(&format!("p/{hex}.jpg")));
        assert!(!valid_key(&format!("probe/{hex}")));
        assert!(!valid_key(&format!("r/../{hex}.png")));
        assert!(!valid_key("r/short.png"));
        assert!(!valid_key(&format!("r/{hex}.png/../x")));
    }

    #[test]
    fn ranges_are_read_within_the_file() {
        let with = |range: &str| {
            let req = actix_web::test::TestRequest::default()
                .insert_header((header::RANGE, range))
                .to_http_request();
            requested_range(&req, 100)
        };
        assert_eq!(with("bytes=0-9"), Ok(Some((0, 9))));
        assert_eq!(with("bytes=90-"), Ok(Some((90, 99))));
        assert_eq!(with("bytes=-10"), Ok(Some((90, 99))));
        assert_eq!(with("bytes=95-200"), Ok(Some((95, 99))));
        assert_eq!(with("bytes=100-"), Err(()));
        assert_eq!(with("bytes=0-1,5-6"), Ok(None));
    }
}
