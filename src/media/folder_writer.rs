//! Writes into a local media folder: one thread of its own per folder,
//! fed through a bounded queue, instead of a task of the runtime's
//! blocking pool per file. Under load the keep stage writes hundreds of
//! small files a second into one directory; one blocking task each made
//! the pool grow to a hundred threads that spun on the directory's lock
//! and paid a thread hand-off per file (docs/BENCHMARKS.md §30). One
//! writer takes the files in turn, each as a temporary file beside its
//! place renamed into it, so a reader never sees half a file and a
//! re-run's overwrite replaces the whole object at once.
//!
//! When the queue is full (`QUEUE` files waiting), a writer's caller
//! waits for a place: nothing is dropped. When the thread is gone, every
//! put fails as unavailable, which the keep stage retries.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};

/// Files waiting for the writer at most; the next caller waits.
const QUEUE: usize = 1_024;

/// One file to write, and who waits for it.
struct Job {
    path: PathBuf,
    bytes: Bytes,
    done: oneshot::Sender<std::io::Result<()>>,
}

/// The writer of one folder. Cheap to clone; the thread ends when the
/// last clone is dropped.
#[derive(Clone)]
pub(super) struct FolderWriter {
    jobs: mpsc::Sender<Job>,
}

impl FolderWriter {
    /// Starts the writer thread of `folder`.
    pub(super) fn start(folder: &Path) -> std::io::Result<FolderWriter> {
        let (jobs, queue) = mpsc::channel(QUEUE);
        tracing::debug!(folder = %folder.display(), "media writer thread started");
        std::thread::Builder::new()
            .name("media-writer".to_owned())
            .spawn(move || write_in_turn(queue))?;
        Ok(FolderWriter { jobs })
    }

    /// Writes `bytes` to `path` (inside the folder), replacing what was
    /// there, and answers once the file is in place.
    pub(super) async fn write(&self, path: PathBuf, bytes: Bytes) -> std::io::Result<()> {
        let (done, answer) = oneshot::channel();
        let gone = || std::io::Error::other("the media folder's writer thread has stopped");
        self.jobs
            .send(Job { path, bytes, done })
            .await
            .map_err(|_| gone())?;
        answer.await.map_err(|_| gone())?
    }
}

/// The thread: each file as it comes, until every sender is gone.
fn write_in_turn(mut queue: mpsc::Receiver<Job>) {
    let staged = AtomicU64::new(0);
    while let Some(job) = queue.blocking_recv() {
        let written = write_whole(&job.path, &job.bytes, &staged);
        // The caller may have given up waiting: the file stays written.
        let _ = job.done.send(written);
    }
}

/// `bytes` into a temporary file beside `path` (its parent folders made
/// when missing), then renamed over `path`. The temporary name carries a
/// `#`, which no key has ([`super::object_path`]) and `object_store`'s
/// listings skip, as its own staged uploads do.
fn write_whole(path: &Path, bytes: &[u8], staged: &AtomicU64) -> std::io::Result<()> {
    let suffix = staged.fetch_add(1, Ordering::Relaxed);
    let mut temporary = path.as_os_str().to_owned();
    temporary.push(format!("#{}.{suffix}", std::process::id()));
    let temporary = PathBuf::from(temporary);
    let mut file = match std::fs::File::create(&temporary) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::File::create(&temporary)?
        }
        Err(e) => return Err(e),
    };
    let written = file
        .write_all(bytes)
        .and_then(|()| std::fs::rename(&temporary, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    written
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn files_land_whole_in_new_folders_and_overwrite() {
        let dir = tempfile::tempdir().unwrap();
        let writer = FolderWriter::start(dir.path()).unwrap();
        let path = dir.path().join("r/deep/a.svg");
        writer
            .write(path.clone(), Bytes::from_static(b"first"))
            .await
            .unwrap();
        writer
            .write(path.clone(), Bytes::from_static(b"second"))
            .await
            .unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"second");
        let left: Vec<_> = std::fs::read_dir(dir.path().join("r/deep"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(
            left,
            vec![std::ffi::OsString::from("a.svg")],
            "no temporary file stays"
        );
    }

    #[tokio::test]
    async fn a_full_queue_makes_callers_wait_and_loses_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let writer = FolderWriter::start(dir.path()).unwrap();
        let files = QUEUE * 3;
        let writes = (0..files).map(|i| {
            let writer = writer.clone();
            let path = dir.path().join(format!("q/{i}.txt"));
            async move { writer.write(path, Bytes::from(i.to_string())).await }
        });
        for written in futures_util::future::join_all(writes).await {
            written.unwrap();
        }
        for i in 0..files {
            let text = std::fs::read_to_string(dir.path().join(format!("q/{i}.txt"))).unwrap();
            assert_eq!(text, i.to_string());
        }
    }

    #[tokio::test]
    async fn a_write_that_cannot_happen_says_why() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("taken"), b"a file, not a folder").unwrap();
        let writer = FolderWriter::start(dir.path()).unwrap();
        let refused = writer
            .write(dir.path().join("taken/a.svg"), Bytes::from_static(b"x"))
            .await;
        assert!(refused.is_err());
    }
}
