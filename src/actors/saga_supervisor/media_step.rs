//! The saga's media: the participant's photo read for its provider before
//! a submit ([`input_photo`]), and the result's files kept before the step
//! records them ([`keep_result`]). Both run with the saga's lease held and
//! no transaction open; neither makes an AI job.

use bytes::Bytes;

use std::sync::Arc;

use super::{ExperienceOf, SagaDeps};
use crate::ai::InputPhoto;
use crate::domain::failure::AiResult;
use crate::domain::media::{photo_url_expiry, sign_media_url};
use crate::media::brand::{read_brand, BrandArt};
use crate::media::keep::{KeepError, KeptFor, ListsKept};
use crate::media::MediaError;
use crate::store::entities::sagas;
use crate::store::transitions::SagaWrite;
use crate::store::StoreError;

/// What reading the saga's photo found.
pub(super) enum PhotoRead {
    /// The photo for the order (None: the saga names no photo).
    Ready(Option<SagaPhoto>),
    /// It is gone: the saga aborts `INPUT_MISSING`, with this detail.
    Missing(String),
    /// The media store cannot answer now: wait and ask again.
    Unavailable(String),
}

/// The saga's photo, read once: its bytes, its key, and where its
/// provider reaches this server (None: it cannot, and gets the bytes).
#[derive(Debug, Clone)]
pub(super) struct SagaPhoto {
    /// The photo, with no URL yet.
    photo: InputPhoto,
    key: String,
    base: Option<String>,
}

impl SagaPhoto {
    /// The photo as the send of a key first sent at `first_sent_ms`
    /// carries it at `now_ms`: with a signed URL good for minutes
    /// ([`photo_url_expiry`]: the same for every send of the key while it
    /// is young) when the provider can reach this server.
    pub(super) fn for_send(
        &self,
        signing_key: &[u8],
        first_sent_ms: i64,
        now_ms: i64,
    ) -> InputPhoto {
        let url = self.base.as_ref().map(|base| {
            let expires = photo_url_expiry(first_sent_ms, now_ms);
            let query = sign_media_url(signing_key, &self.key, expires);
            format!("{base}/media/{}?{query}", self.key)
        });
        InputPhoto {
            url,
            ..self.photo.clone()
        }
    }
}

/// The saga's photo (see [`SagaPhoto`]), or why there is none to send.
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
    Ok(PhotoRead::Ready(Some(SagaPhoto {
        photo: InputPhoto {
            url: None,
            bytes,
            content_type: photo.content_type,
        },
        key: photo.object_key,
        base: deps.media.photo_base(provider).map(str::to_owned),
    })))
}

/// Keeps the files of call `call`'s `result` in the media store, each
/// listed for the saga under its lease first: the result comes back with
/// this server's URLs.
pub(super) async fn keep_result(
    saga: &sagas::Model,
    experience: &ExperienceOf,
    call: i32,
    result: AiResult,
    deps: &SagaDeps,
) -> Result<AiResult, KeepError> {
    if result.content.iter().all(|item| item.url.is_none()) {
        return Ok(result);
    }
    let provider = experience.provider.as_str();
    let brand = brand_of(&saga.experience_id, experience.brand_version, deps).await?;
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
                lists: &ListedInBatches(deps),
                saga_id: &saga.id,
                token: saga.lock_token.as_deref().unwrap_or_default(),
            },
            call.max(0) as u32,
            result.content,
            brand.as_ref(),
        )
        .await?;
    metrics::histogram!(crate::metrics::KEEP_DURATION).record(started.elapsed().as_secs_f64());
    tracing::info!(saga_id = %saga.id, call, files = content.iter().filter(|i| i.url.is_some()).count(), "result files kept");
    Ok(AiResult {
        content,
        score: result.score,
    })
}

/// The brand the experience's results carry now (None: none), from
/// memory when it is held at `version` or later, else read once.
async fn brand_of(
    experience_id: &str,
    version: i64,
    deps: &SagaDeps,
) -> Result<Option<Arc<BrandArt>>, KeepError> {
    if version == 0 {
        return Ok(None);
    }
    if let Some(held) = deps.media.brands.get(experience_id, version) {
        return Ok(held);
    }
    let unreadable = |detail: String| {
        KeepError::Transient(format!(
            "the experience's brand cannot be read now: {detail}"
        ))
    };
    let Some(row) = deps
        .store
        .experience_by_id(experience_id)
        .await
        .map_err(|e| unreadable(e.to_string()))?
    else {
        return Ok(None);
    };
    let keeper = &deps.media.keeper;
    let art = read_brand(&row, keeper.store(), keeper.pool())
        .await
        .map_err(unreadable)?;
    tracing::info!(
        experience_id,
        version = row.brand_version,
        draws = art.is_some(),
        "brand read"
    );
    deps.media
        .brands
        .put(experience_id, row.brand_version, art.clone());
    Ok(art)
}

/// A saga worker lists what its keep is about to write through its
/// group-committed writes ([`SagaWrite::ListKept`]): under load one
/// transaction lists for many sagas, and a keep adds none of its own.
struct ListedInBatches<'a>(&'a SagaDeps);

impl ListsKept for ListedInBatches<'_> {
    fn list<'a>(
        &'a self,
        saga_id: &'a str,
        token: &'a str,
        keys: Vec<String>,
    ) -> futures_util::future::LocalBoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let write = SagaWrite::ListKept {
                saga_id: saga_id.to_owned(),
                token: token.to_owned(),
                keys,
            };
            match super::write(self.0, write).await {
                Ok(written) => written.map(|_| ()),
                // The writer is gone (the instance is stopping): nothing
                // is listed, so nothing may be written.
                Err(_) => Err(StoreError::Conflict(
                    "the saga writer has stopped; the result's files are not listed".to_owned(),
                )),
            }
        })
    }
}
