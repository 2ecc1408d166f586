//! The saga's media: the participant's photo read for its provider before
//! a submit ([`input_photo`]), and the result's files kept before the step
//! records them ([`keep_result`]). Both run with the saga's lease held and
//! no transaction open; neither makes an AI job.

use bytes::Bytes;

use super::SagaDeps;
use crate::ai::InputPhoto;
use crate::domain::failure::AiResult;
use crate::domain::media::sign_media_url;
use crate::media::keep::{KeepError, KeptFor};
use crate::media::MediaError;
use crate::store::entities::sagas;
use crate::store::StoreError;

/// How long after the saga's deadline a photo URL a provider got still
/// opens: a job that runs to the end of its saga can still read it. The
/// expiry comes from the saga, not the clock, so every send of one key
/// carries the same URL.
const PHOTO_URL_GRACE_MS: i64 = 10 * 60_000;

/// What reading the saga's photo found.
pub(super) enum PhotoRead {
    /// The photo for the order (None: the saga names no photo).
    Ready(Option<InputPhoto>),
    /// It is gone: the saga aborts `INPUT_MISSING`, with this detail.
    Missing(String),
    /// The media store cannot answer now: wait and ask again.
    Unavailable(String),
}

/// The saga's photo as its provider gets it: the stored bytes and, when
/// the provider can reach this server, a signed URL good until a while
/// after the saga's deadline.
pub(super) async fn input_photo(
    saga: &sagas::Model,
    provider: &str,
    deps: &SagaDeps,
) -> Result<PhotoRead, StoreError> {
    let Some(photo_id) = &saga.photo_id else {
        return Ok(PhotoRead::Ready(None));
    };
    let Some(photo) = deps.store.photo(photo_id).await? else {
        return Ok(PhotoRead::Missing(format!(
            "photo {photo_id} is no longer recorded"
        )));
    };
    let bytes: Bytes = match deps.media.keeper.store().get(&photo.object_key).await {
        Ok(bytes) => bytes,
        Err(MediaError::NotFound(_)) => {
            return Ok(PhotoRead::Missing(format!(
                "photo {photo_id} is gone from the media store"
            )))
        }
        Err(e) => return Ok(PhotoRead::Unavailable(e.to_string())),
    };
    let url = deps.media.photo_base(provider).map(|base| {
        let expires = saga.deadline_at_ms + PHOTO_URL_GRACE_MS;
        let query = sign_media_url(&deps.media.secret, &photo.object_key, expires);
        format!("{base}/media/{}?{query}", photo.object_key)
    });
    Ok(PhotoRead::Ready(Some(InputPhoto {
        url,
        bytes,
        content_type: photo.content_type,
    })))
}

/// Keeps the files of call `call`'s `result` in the media store, each
/// listed for the saga under its lease first: the result comes back with
/// this server's URLs.
pub(super) async fn keep_result(
    saga: &sagas::Model,
    provider: &str,
    call: i32,
    result: AiResult,
    deps: &SagaDeps,
) -> Result<AiResult, KeepError> {
    if result.content.iter().all(|item| item.url.is_none()) {
        return Ok(result);
    }
    let origins = deps.media.origins(provider).ok_or_else(|| {
        KeepError::Permanent(format!(
            "provider {provider} has no result origins configured"
        ))
    })?;
    let started = std::time::Instant::now();
    let content = deps
        .media
        .keeper
        .keep(
            origins,
            KeptFor {
                store: &deps.store,
                saga_id: &saga.id,
                token: saga.lock_token.as_deref().unwrap_or_default(),
            },
            call.max(0) as u32,
            result.content,
        )
        .await?;
    metrics::histogram!(crate::metrics::KEEP_DURATION).record(started.elapsed().as_secs_f64());
    tracing::info!(saga_id = %saga.id, call, files = content.iter().filter(|i| i.url.is_some()).count(), "result files kept");
    Ok(AiResult {
        content,
        score: result.score,
    })
}
