//! The media store: where stagehand keeps the files it owns (the photos
//! guests upload, the files of kept results), over the `object_store`
//! crate. This module owns where media lives ([`MediaStore::open`] reads
//! `STAGEHAND_MEDIA_URL`), the one API the rest of the server writes and
//! reads objects with, and the probe `/readyz` runs. It knows nothing of
//! sagas or HTTP.
//!
//! Two kinds of place:
//! - a local folder (`file:///path`, or a plain path; the default is a
//!   folder beside the SQLite file): one instance, or several on one
//!   shared filesystem;
//! - an S3 bucket (`s3://bucket[?endpoint=URL&region=R]`), for several
//!   instances. The endpoint and region come from the URL or the
//!   environment (`AWS_ENDPOINT_URL`, `AWS_REGION`); the credentials only
//!   from the environment (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`):
//!   never in the database, never in a log line ([`MediaStore::describe`]
//!   shows the bucket and the endpoint only).

pub mod brand;
mod folder_writer;
pub mod jpeg;
pub mod keep;
pub mod photo;
pub mod pool;
pub mod purge;
pub mod secret;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use futures_util::StreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

use folder_writer::FolderWriter;

/// Why the media store could not be opened or used.
#[derive(Debug, thiserror::Error)]
pub enum MediaError {
    /// `STAGEHAND_MEDIA_URL` names nothing this server can open.
    #[error("media store {url}: {reason}")]
    Config { url: String, reason: String },
    /// No object under this key.
    #[error("no media object {0}")]
    NotFound(String),
    /// The store did not do what was asked (down, refused, full).
    #[error("media store unavailable: {0}")]
    Unavailable(String),
}

/// Where media lives, as configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MediaPlace {
    Folder(PathBuf),
    S3 { bucket: String },
}

/// An object being read ([`MediaStore::read`]).
pub struct MediaStream {
    /// The whole object's size.
    pub size: u64,
    /// The bytes `body` yields (the range's, or the whole object's).
    pub length: u64,
    pub body: futures_util::stream::BoxStream<'static, Result<Bytes, MediaError>>,
}

/// The store. Cheap to clone.
#[derive(Clone)]
pub struct MediaStore {
    store: Arc<dyn ObjectStore>,
    place: MediaPlace,
    /// A local folder's writes go through its own thread; None: S3.
    writer: Option<FolderWriter>,
    /// For logs and errors: the folder, or the bucket and endpoint.
    shown: String,
}

impl std::fmt::Debug for MediaStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MediaStore")
            .field("at", &self.shown)
            .finish()
    }
}

impl MediaStore {
    /// Opens `url`: `s3://bucket` (the rest from the environment), or
    /// `file:///path` / a plain path (created when missing).
    pub fn open(url: &str) -> Result<MediaStore, MediaError> {
        let config = |reason: String| MediaError::Config {
            url: url.to_owned(),
            reason,
        };
        if let Some(rest) = url.strip_prefix("s3://") {
            return Self::open_s3(url, rest);
        }
        let path = url.strip_prefix("file://").unwrap_or(url);
        if path.is_empty() || url.contains("://") && !url.starts_with("file://") {
            return Err(config(
                "use s3://bucket, file:///path or a folder's path".to_owned(),
            ));
        }
        let folder = Path::new(path);
        std::fs::create_dir_all(folder)
            .map_err(|e| config(format!("cannot create the folder: {e}")))?;
        let store = object_store::local::LocalFileSystem::new_with_prefix(folder)
            .map_err(|e| config(e.to_string()))?;
        let writer = FolderWriter::start(folder)
            .map_err(|e| config(format!("cannot start its writer thread: {e}")))?;
        Ok(MediaStore {
            store: Arc::new(store),
            place: MediaPlace::Folder(folder.to_owned()),
            writer: Some(writer),
            shown: folder.display().to_string(),
        })
    }

    /// `s3://bucket[?endpoint=URL&region=R]`: the endpoint and region in
    /// the URL (they are not secrets) or from the environment; the
    /// credentials only from the environment. A plain-HTTP endpoint (a
    /// local S3-compatible server) is allowed as written.
    fn open_s3(url: &str, rest: &str) -> Result<MediaStore, MediaError> {
        let config = |reason: String| MediaError::Config {
            url: url.to_owned(),
            reason,
        };
        let (bucket, query) = rest.split_once('?').unwrap_or((rest, ""));
        let bucket = bucket.trim_end_matches('/');
        if bucket.is_empty() || bucket.contains('/') {
            return Err(config(
                "an S3 media URL is s3://bucket[?endpoint=URL&region=R]".to_owned(),
            ));
        }
        // Its HTTP client is reqwest with rustls, like the AI clients', but
        // object_store builds it: it reaches only the configured endpoint
        // (never a URL a guest or a provider chose), so the proxy a
        // deployment may set for it (`HTTPS_PROXY`, `AWS_PROXY_URL`) is the
        // operator's choice and opens nothing to the outside.
        crate::ai::client::ensure_crypto_provider();
        let mut builder = object_store::aws::AmazonS3Builder::from_env().with_bucket_name(bucket);
        let mut endpoint = std::env::var("AWS_ENDPOINT_URL")
            .or_else(|_| std::env::var("AWS_ENDPOINT"))
            .ok();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            match pair.split_once('=') {
                Some(("endpoint", value)) => endpoint = Some(value.to_owned()),
                Some(("region", value)) => builder = builder.with_region(value),
                _ => {
                    return Err(config(format!(
                        "unknown setting {pair:?} (endpoint=, region=)"
                    )))
                }
            }
        }
        if let Some(endpoint) = &endpoint {
            builder = builder
                .with_endpoint(endpoint)
                .with_allow_http(endpoint.starts_with("http://"));
        }
        let store = builder.build().map_err(|e| config(e.to_string()))?;
        let at = endpoint.as_deref().unwrap_or("the AWS default endpoint");
        Ok(MediaStore {
            store: Arc::new(store),
            place: MediaPlace::S3 {
                bucket: bucket.to_owned(),
            },
            writer: None,
            shown: format!("s3://{bucket} at {at}"),
        })
    }

    /// The default place for a database URL: a folder beside the SQLite
    /// file (`stagehand.db` -> `stagehand-media/`), else `stagehand-media`
    /// in the working folder.
    pub fn default_url(database_url: &str) -> String {
        let file = database_url
            .strip_prefix("sqlite://")
            .map(|rest| rest.split('?').next().unwrap_or(rest))
            .filter(|path| !path.is_empty() && !path.contains(":memory:"));
        match file {
            Some(file) => {
                let path = Path::new(file);
                let stem = path
                    .file_stem()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_else(|| "stagehand".to_owned());
                path.with_file_name(format!("{stem}-media"))
                    .display()
                    .to_string()
            }
            None => "stagehand-media".to_owned(),
        }
    }

    pub fn place(&self) -> &MediaPlace {
        &self.place
    }

    /// Where it is, for logs: never a credential.
    pub fn describe(&self) -> &str {
        &self.shown
    }

    /// Stores `bytes` under `key`, replacing what was there (the same key
    /// is the same object: a re-run overwrites, never adds).
    pub async fn put(&self, key: &str, bytes: Bytes) -> Result<(), MediaError> {
        let path = object_path(key)?;
        if let (Some(writer), MediaPlace::Folder(folder)) = (&self.writer, &self.place) {
            return writer
                .write(folder.join(path.as_ref()), bytes)
                .await
                .map_err(|e| MediaError::Unavailable(format!("writing {key}: {e}")));
        }
        self.store
            .put(&path, PutPayload::from_bytes(bytes))
            .await
            .map(|_| ())
            .map_err(|e| unavailable(&e))
    }

    /// The object under `key`.
    pub async fn get(&self, key: &str) -> Result<Bytes, MediaError> {
        let path = object_path(key)?;
        match self.store.get(&path).await {
            Ok(found) => found.bytes().await.map_err(|e| unavailable(&e)),
            Err(object_store::Error::NotFound { .. }) => Err(MediaError::NotFound(key.to_owned())),
            Err(e) => Err(unavailable(&e)),
        }
    }

    /// `key`'s bytes as they come from the store, all of them or `range`,
    /// without holding the object in memory: what the media routes serve.
    pub async fn read(
        &self,
        key: &str,
        range: Option<std::ops::Range<u64>>,
    ) -> Result<MediaStream, MediaError> {
        let path = object_path(key)?;
        let options = object_store::GetOptions {
            range: range.map(object_store::GetRange::Bounded),
            ..Default::default()
        };
        let found = match self.store.get_opts(&path, options).await {
            Ok(found) => found,
            Err(object_store::Error::NotFound { .. }) => {
                return Err(MediaError::NotFound(key.to_owned()))
            }
            Err(e) => return Err(unavailable(&e)),
        };
        let (size, length) = (found.meta.size, found.range.end - found.range.start);
        let body = found
            .into_stream()
            .map(|chunk| chunk.map_err(|e| unavailable(&e)))
            .boxed();
        Ok(MediaStream { size, length, body })
    }

    /// The size of `key` in bytes.
    pub async fn size(&self, key: &str) -> Result<u64, MediaError> {
        let path = object_path(key)?;
        match self.store.head(&path).await {
            Ok(meta) => Ok(meta.size),
            Err(object_store::Error::NotFound { .. }) => Err(MediaError::NotFound(key.to_owned())),
            Err(e) => Err(unavailable(&e)),
        }
    }

    /// Bytes `range` of `key`.
    pub async fn get_range(
        &self,
        key: &str,
        range: std::ops::Range<u64>,
    ) -> Result<Bytes, MediaError> {
        let path = object_path(key)?;
        match self.store.get_range(&path, range).await {
            Ok(bytes) => Ok(bytes),
            Err(object_store::Error::NotFound { .. }) => Err(MediaError::NotFound(key.to_owned())),
            Err(e) => Err(unavailable(&e)),
        }
    }

    /// Deletes `key`; a key that is not there is not an error.
    pub async fn delete(&self, key: &str) -> Result<(), MediaError> {
        match self.store.delete(&object_path(key)?).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(unavailable(&e)),
        }
    }

    /// `/readyz`'s check: writes, reads back and deletes a small object of
    /// this instance's.
    pub async fn probe(&self, instance_id: &str) -> Result<(), MediaError> {
        let key = format!("probe/{instance_id}");
        let body = Bytes::from(format!("stagehand probe {instance_id}"));
        self.put(&key, body.clone()).await?;
        let read = self.get(&key).await?;
        if read != body {
            return Err(MediaError::Unavailable(
                "the probe object read back differs from what was written".to_owned(),
            ));
        }
        self.delete(&key).await
    }
}

/// A key as the store's path: letters, digits, `-`, `_`, `.` in segments
/// separated by `/`, none empty, none `.` or `..`.
fn object_path(key: &str) -> Result<ObjectPath, MediaError> {
    let fine = |segment: &str| {
        !segment.is_empty()
            && segment != "."
            && segment != ".."
            && segment
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    };
    if key.split('/').all(fine) {
        ObjectPath::parse(key).map_err(|e| MediaError::Config {
            url: key.to_owned(),
            reason: e.to_string(),
        })
    } else {
        Err(MediaError::NotFound(key.to_owned()))
    }
}

fn unavailable(error: &object_store::Error) -> MediaError {
    MediaError::Unavailable(error.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_sits_beside_the_sqlite_file() {
        assert_eq!(
            MediaStore::default_url("sqlite:///var/lib/stagehand/stagehand.db?mode=rwc"),
            "/var/lib/stagehand/stagehand-media"
        );
        assert_eq!(
            MediaStore::default_url("sqlite://stagehand.db?mode=rwc"),
            "stagehand-media"
        );
        assert_eq!(
            MediaStore::default_url("postgres://postgres@127.0.0.1/x"),
            "stagehand-media"
        );
    }

    #[test]
    fn keys_are_plain_segments() {
        assert!(object_path("results/abc/0.png").is_ok());
        for bad in ["", "a//b", "../etc/passwd", "a/../b", "a b", "a/%2e%2e"] {
            assert!(object_path(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn bad_urls_say_what_works() {
        for bad in ["s3://", "s3://a/b", "ftp://x", "s3://b?secret=x"] {
            let e = MediaStore::open(bad).unwrap_err().to_string();
            assert!(e.contains(bad), "{e}");
        }
    }

    #[tokio::test]
    async fn a_folder_stores_reads_overwrites_and_deletes() {
        let dir = tempfile::tempdir().unwrap();
        let store = MediaStore::open(&format!("file://{}", dir.path().display())).unwrap();
        assert_eq!(store.place(), &MediaPlace::Folder(dir.path().to_owned()));
        store
            .put("results/s1/0.png", Bytes::from_static(b"one"))
            .await
            .unwrap();
        store
            .put("results/s1/0.png", Bytes::from_static(b"two"))
            .await
            .unwrap();
        assert_eq!(
            store.get("results/s1/0.png").await.unwrap(),
            Bytes::from_static(b"two")
        );
        store.delete("results/s1/0.png").await.unwrap();
        store.delete("results/s1/0.png").await.unwrap();
        assert!(matches!(
            store.get("results/s1/0.png").await,
            Err(MediaError::NotFound(_))
        ));
        store.probe("i1").await.unwrap();
    }
}
