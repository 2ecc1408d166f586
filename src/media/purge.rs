//! Deleting what a forgotten session or a given-up photo left in the media
//! store (the second step of forgetting, see `store::guests`): the objects
//! first, then the rows that named them. An object already gone counts as
//! deleted, so a purge that a crash cut short is simply run again.

use super::{MediaError, MediaStore};
use crate::store::guests::PurgeItem;
use crate::store::{Store, StoreError};

/// Why a purge stopped (it is claimed again once its lease runs out).
#[derive(Debug, thiserror::Error)]
pub enum PurgeError {
    #[error("the media store refused a delete: {0}")]
    Media(#[from] MediaError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The keys `item` deletes.
pub fn keys_of(item: &PurgeItem) -> Vec<&str> {
    match item {
        PurgeItem::Session { keys, .. } => keys.iter().map(String::as_str).collect(),
        PurgeItem::Photo { key, .. } => vec![key.as_str()],
    }
}

/// Deletes `item`'s objects, then marks it done; returns the objects
/// deleted.
pub async fn purge(
    store: &Store,
    media: &MediaStore,
    item: &PurgeItem,
) -> Result<usize, PurgeError> {
    let keys = keys_of(item);
    for key in &keys {
        // A key already gone is no error (a purge run again).
        media.delete(key).await?;
    }
    store.purged(item).await?;
    Ok(keys.len())
}
