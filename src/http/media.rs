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

use actix_web::body::SizedStream;
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
use crate::domain::session::SessionStatus;
use crate::media::photo::{normalize, PhotoLimits};
use crate::store::photos::{NewPhoto, PhotoBound};

/// The query of an upload.
#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct UploadQuery {
    /// The session's unsubmitted photo this one replaces (a retake): it
    /// is given up when this one is stored, and no longer counts against
    /// `max_photos_per_session`. A photo a submission named stays.
    replaces: Option<String>,
}

/// How slowly a photo's body may arrive (`--upload-timeout`,
/// `--upload-min-rate`, `--upload-grace`).
#[derive(Debug, Clone, Copy)]
pub struct UploadPace {
    /// From the first byte to the last.
    pub timeout: std::time::Duration,
    /// Bytes a second on average, once `grace` has passed; 0: no minimum.
    pub min_rate: u64,
    pub grace: std::time::Duration,
}

impl UploadPace {
    /// The latest instant by which more than `received` bytes must have
    /// arrived, for a body whose first byte was awaited from `started`.
    fn due(&self, started: tokio::time::Instant, received: usize) -> tokio::time::Instant {
        let deadline = started + self.timeout;
        if self.min_rate == 0 {
            return deadline;
        }
        let earned = std::time::Duration::from_secs_f64(received as f64 / self.min_rate as f64);
        (started + earned.max(self.grace)).min(deadline)
    }

    /// The 408 of a body that missed its pace.
    fn missed(&self, received: usize, waited: std::time::Duration) -> ApiError {
        ApiError::UploadTooSlow(format!(
            "the photo arrived too slowly ({received} bytes in {:.1} s): it must arrive whole within {} s, at least {} bytes a second after the first {} s",
            waited.as_secs_f64(),
            self.timeout.as_secs(),
            self.min_rate,
            self.grace.as_secs(),
        ))
    }
}

/// `POST /api/sessions/{id}/photo`
#[utoipa::path(
    post,
    path = "/api/sessions/{id}/photo",
    tag = "participants",
    summary = "Upload the participant's photo (the image is the body); a submission then names its photo_id.",
    security(("participant" = [])),
    params(
        ("id" = String, Path, description = "The session's id."),
        UploadQuery,
        super::schema::SubmissionKey,
    ),
    request_body(content = Vec<u8>, content_type = "image/jpeg", description = "A JPEG, PNG or WebP image, at most `max_photo_bytes` (10 MiB by default). The format is read from the bytes, not the Content-Type."),
    responses(
        (status = 201, description = "Stored: upright, at most the experience's `photo_max_px` on its long side, re-encoded as JPEG with no metadata (no EXIF, no GPS).", body = super::schema::PhotoStored),
        (status = 400, description = "`idempotency_key_required`.", body = super::schema::ErrorBody),
        (status = 401, description = "`unauthorized`: the token does not open this session.", body = super::schema::ErrorBody),
        (status = 404, description = "`not_found`: no such session.", body = super::schema::ErrorBody),
        (status = 408, description = "`upload_too_slow`: the body did not arrive whole within `--upload-timeout`, or slower than `--upload-min-rate` after `--upload-grace`.", body = super::schema::ErrorBody),
        (status = 409, description = "`photo_not_taken`: the experience takes only a prompt; `already_submitted`: the session's saga runs or it completed (both answered before the body is read); `photo_limit`: the session holds its `max_photos_per_session` photos; `request_in_progress`.", body = super::schema::ErrorBody),
        (status = 410, description = "`gone`: the session's data was erased (answered before the body is read).", body = super::schema::ErrorBody),
        (status = 413, description = "`payload_too_large`: past `max_photo_bytes`; refused before the body is read whole.", body = super::schema::ErrorBody),
        (status = 415, description = "`unsupported_media_type`: not JPEG, PNG or WebP (HEIC is named).", body = super::schema::ErrorBody),
        (status = 422, description = "`photo_unreadable`: truncated, corrupt, or past a decoding limit (named: pixels, or the memory its decoding would take at its bit depth); `validation_failed`: a malformed `replaces`; `idempotency_key_reused`.", body = super::schema::ErrorBody),
        (status = 429, description = "`rate_limited`: too many uploads from this client address (answered before the body is read).", body = super::schema::ErrorBody, headers(("Retry-After" = u64, description = "Seconds to wait."))),
        (status = 503, description = "`photo_pool_full` (every photo worker busy and the upload queue full) or `media_unavailable` (the media store does not answer).", body = super::schema::ErrorBody, headers(("Retry-After" = u64, description = "Seconds to wait."))),
    )
)]
pub async fn upload_photo(
    state: web::Data<AppState>,
    req: HttpRequest,
    session_id: web::Path<String>,
    query: web::Query<UploadQuery>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let desk = &state.photos;
    refuse_declared_length(&req, desk.max_bytes)?;
    let (session, experience) = open_upload(&state, &req, &session_id).await?;
    let key = key_of(&req)?.ok_or(ApiError::IdempotencyKeyRequired)?;
    let bound = PhotoBound {
        max_per_session: experience.max_photos_per_session,
        replaces: replaced_photo(&query)?,
    };
    // The body first, bounded in size and time, holding no shared place:
    // a slow client costs its own connection and what it sent, nothing
    // another guest needs.
    let body = read_photo_body(payload, declared_length(&req), desk.max_bytes, desk.pace).await?;
    let (body_hash, place) = hash_in_the_pool(desk.pool.admit()?, body.clone()).await?;
    let token = bearer(&req).unwrap_or_default().to_owned();
    let scope = format!("photo:{}", session.id);
    let place = std::sync::Mutex::new(Some(place));
    let upload = Upload {
        session: &session,
        experience: &experience,
        bound: &bound,
    };
    let (reply, replayed) = run_idempotent_hashed(&state, &scope, &token, key, body_hash, || {
        let place = place.lock().ok().and_then(|mut p| p.take());
        store_photo(&state, &upload, body.clone(), place)
    })
    .await?;
    Ok(respond(reply, replayed, None))
}

/// What is judged before a byte of the body is read: the client's upload
/// limit (429), the token (401), the session (404; erased: 410; one that
/// takes no submission now: 409 `already_submitted`) and whether its
/// experience takes a photo (409 `photo_not_taken`).
async fn open_upload(
    state: &AppState,
    req: &HttpRequest,
    session_id: &str,
) -> Result<
    (
        crate::store::entities::sessions::Model,
        crate::store::entities::experiences::Model,
    ),
    ApiError,
> {
    state
        .limits
        .check_upload(req)
        .map_err(|retry_after| ApiError::RateLimited { retry_after })?;
    let session = require_session(state, req, session_id, false).await?;
    if session.forgotten_at_ms.is_some() {
        return Err(ApiError::Gone(
            "this session's data was erased; start a new session to take a photo",
        ));
    }
    // A photo is for a submission: a session that takes none (its saga
    // runs, or it completed) takes no photo either.
    let takes_submission = SessionStatus::ALL
        .iter()
        .any(|status| status.as_str() == session.status && status.accepts_submission());
    if !takes_submission {
        return Err(ApiError::AlreadySubmitted);
    }
    let experience = state
        .store
        .experience_by_id(&session.experience_id)
        .await?
        .ok_or(ApiError::NotFound("experience"))?;
    if !InputKind::of(&experience.input).takes_photo() {
        return Err(ApiError::PhotoNotTaken);
    }
    Ok((session, experience))
}

/// `?replaces=`, when given: a photo id.
fn replaced_photo(query: &UploadQuery) -> Result<Option<String>, ApiError> {
    match &query.replaces {
        None => Ok(None),
        Some(id) if uuid::Uuid::try_parse(id).is_ok() => Ok(Some(id.clone())),
        Some(_) => Err(ApiError::Validation(
            "replaces must be the photo_id of the photo this one replaces".into(),
        )),
    }
}

/// The body's hash for its Idempotency-Key, made in the photo pool with
/// the upload's own place: SHA-256 of a 3 MB photo takes about 7 ms of CPU,
/// which on an HTTP worker would hold up every request that worker serves,
/// and at the server's priority would take it from other people's 202s.
async fn hash_in_the_pool(
    place: crate::media::pool::Admitted,
    body: web::Bytes,
) -> Result<(String, crate::media::pool::Admitted), ApiError> {
    Ok(place.run_keeping(move |_| request_hash(&body)).await?)
}

/// The `Content-Length` the client declared, if any.
pub(super) fn declared_length(req: &HttpRequest) -> Option<u64> {
    req.headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
}

/// 413 at once when the declared length is past `max`.
pub(super) fn refuse_declared_length(req: &HttpRequest, max: u64) -> Result<(), ApiError> {
    if declared_length(req).is_some_and(|n| n > max) {
        return Err(ApiError::PayloadTooLarge(max as usize));
    }
    Ok(())
}

/// The body, refused as soon as more than `max` bytes came (413) or as
/// soon as it falls behind `pace` (408). Room for the declared length (at
/// most `max`) is taken once, so a 3 MB photo is not copied again each
/// time its buffer grows; the memory behind it is touched only as the
/// bytes come.
pub(super) async fn read_photo_body(
    mut payload: web::Payload,
    declared: Option<u64>,
    max: u64,
    pace: UploadPace,
) -> Result<web::Bytes, ApiError> {
    let room = declared.unwrap_or(0).min(max);
    let mut body = web::BytesMut::with_capacity(usize::try_from(room).unwrap_or(0));
    let started = tokio::time::Instant::now();
    loop {
        let due = pace.due(started, body.len());
        let Ok(next) = tokio::time::timeout_at(due, payload.next()).await else {
            return Err(pace.missed(body.len(), started.elapsed()));
        };
        let Some(chunk) = next else {
            return Ok(body.freeze());
        };
        let chunk =
            chunk.map_err(|e| ApiError::Validation(format!("the photo could not be read: {e}")))?;
        if (body.len() + chunk.len()) as u64 > max {
            return Err(ApiError::PayloadTooLarge(max as usize));
        }
        body.extend_from_slice(&chunk);
    }
}

/// One upload's session, experience and bound.
struct Upload<'a> {
    session: &'a crate::store::entities::sessions::Model,
    experience: &'a crate::store::entities::experiences::Model,
    bound: &'a PhotoBound,
}

/// Decodes, cleans and stores one photo of the session within its bound:
/// 201 with its id and size. The row is written before the object, so a
/// photo past the bound is never stored, and an object whose put fails
/// leaves a row that is given up (or swept) rather than an object no row
/// names.
async fn store_photo(
    state: &AppState,
    upload: &Upload<'_>,
    body: web::Bytes,
    place: Option<crate::media::pool::Admitted>,
) -> Result<Reply, ApiError> {
    let (session, bound) = (upload.session, upload.bound);
    let held = state
        .store
        .photos_held(&session.id, bound.replaces.as_deref())
        .await?;
    if held >= u64::try_from(bound.max_per_session).unwrap_or(0) {
        return Err(ApiError::PhotoLimit(bound.max_per_session));
    }
    let max_px = upload.experience.photo_max_px.max(1) as u32;
    let started = std::time::Instant::now();
    let place = match place {
        Some(place) => place,
        None => state.photos.pool.admit()?,
    };
    let photo = place
        .run(move |memory| normalize(&body, max_px, &PhotoLimits::default(), memory))
        .await??;
    metrics::histogram!(crate::metrics::PHOTO_DECODE_DURATION)
        .record(started.elapsed().as_secs_f64());
    let stored = web::Bytes::from(photo.bytes);
    let bytes = stored.len() as u64;
    let sha256 = crate::domain::media::photo_sha256(&stored);
    let now = state.clock.now_ms();
    let new = NewPhoto {
        id: crate::store::new_id(),
        session_id: session.id.clone(),
        object_key: photo_object_key(rand::random()),
        content_type: photo.content_type.to_owned(),
        width: photo.width,
        height: photo.height,
        bytes,
        sha256,
    };
    let row = state.store.insert_photo(new, bound, now).await?;
    if let Err(e) = state.media.put(&row.object_key, stored).await {
        if let Err(lost) = state.store.give_up_photo(&row, now).await {
            tracing::warn!(error = %lost, photo_id = %row.id, "a photo whose object could not be stored is left to the orphan sweep");
        }
        return Err(e.into());
    }
    tracing::info!(session_id = %session.id, photo_id = %row.id, width = row.width, height = row.height, bytes, replaced = bound.replaces.is_some(), "photo stored");
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
    let read = read_media(state, req, &key).await?;
    let range = read.range;
    let mut answer = match &range {
        Some((start, end)) => {
            let mut partial = HttpResponse::build(StatusCode::PARTIAL_CONTENT);
            partial.insert_header((
                header::CONTENT_RANGE,
                format!("bytes {start}-{end}/{}", read.stream.size),
            ));
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
    Ok(answer.body(SizedStream::new(read.stream.length, read.stream.body)))
}

/// An object as a route serves it: streamed from the store, and the one
/// byte range asked for, if any.
pub struct MediaRead {
    pub stream: crate::media::MediaStream,
    /// `(first, last)`, inclusive: a 206.
    pub range: Option<(u64, u64)>,
}

/// Opens `key` for a GET: a `Range` asks the store for the size first; a
/// range outside the file is ignored (RFC 9110 allows it) and the whole
/// file comes. Never more than a chunk is in memory at once.
pub async fn read_media(
    state: &AppState,
    req: &HttpRequest,
    key: &str,
) -> Result<MediaRead, ApiError> {
    let range = match req.headers().contains_key(header::RANGE) {
        true => requested_range(req, state.media.size(key).await?).unwrap_or(None),
        false => None,
    };
    let stream = state
        .media
        .read(key, range.map(|(first, last)| first..last + 1))
        .await?;
    Ok(MediaRead { stream, range })
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
