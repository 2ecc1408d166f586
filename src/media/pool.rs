//! The photo pool: image decoding and encoding (uploads, thumbnails) run
//! here, on tokio's blocking threads, never on the HTTP workers, at most
//! `workers` at a time. Past that, up to `queue` jobs wait for a worker;
//! a job that finds the queue full is refused at once ([`PoolFull`]), and
//! the upload answers 503 with `Retry-After` (it takes its place with
//! [`PhotoPool::admit`] before it reads its body): a burst of uploads never
//! holds more than `workers` decoders' memory, and never slows the other
//! requests' answers.

use std::sync::Arc;

use tokio::sync::Semaphore;

/// Every worker is busy and the queue is full: try again shortly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the photo pool is full ({workers} decoding, {queue} waiting)")]
pub struct PoolFull {
    pub workers: usize,
    pub queue: usize,
}

/// A bounded pool for CPU-heavy media work.
#[derive(Clone, Debug)]
pub struct PhotoPool {
    /// Permits to run (one per worker).
    running: Arc<Semaphore>,
    /// Permits to be in the pool at all (workers plus the queue).
    admitted: Arc<Semaphore>,
    workers: usize,
    queue: usize,
}

impl PhotoPool {
    /// A pool of `workers` (at least 1) with room for `queue` more jobs to
    /// wait.
    pub fn new(workers: usize, queue: usize) -> PhotoPool {
        let workers = workers.max(1);
        PhotoPool {
            running: Arc::new(Semaphore::new(workers)),
            admitted: Arc::new(Semaphore::new(workers + queue)),
            workers,
            queue,
        }
    }

    pub fn workers(&self) -> usize {
        self.workers
    }

    /// A place in the pool (a worker or the queue), taken at once or
    /// refused: an upload takes it before it reads its body, so a request
    /// past the queue costs neither the body's memory nor its bandwidth.
    pub fn admit(&self) -> Result<Admitted, PoolFull> {
        match self.admitted.clone().try_acquire_owned() {
            Ok(place) => Ok(Admitted {
                pool: self.clone(),
                _place: place,
            }),
            Err(_) => {
                metrics::counter!(crate::metrics::PHOTO_POOL_REFUSED).increment(1);
                Err(PoolFull {
                    workers: self.workers,
                    queue: self.queue,
                })
            }
        }
    }

    /// Runs `job` on a blocking thread once a worker is free; refused at
    /// once when the queue is full.
    pub async fn run<T, F>(&self, job: F) -> Result<T, PoolFull>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        self.admit()?.run(job).await
    }
}

/// A place taken in the pool; given back when dropped.
#[derive(Debug)]
pub struct Admitted {
    pool: PhotoPool,
    _place: tokio::sync::OwnedSemaphorePermit,
}

impl Admitted {
    /// Runs `job` on a blocking thread once a worker is free.
    pub async fn run<T, F>(self, job: F) -> Result<T, PoolFull>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        let full = PoolFull {
            workers: self.pool.workers,
            queue: self.pool.queue,
        };
        let Ok(running) = self.pool.running.clone().acquire_owned().await else {
            return Err(full);
        };
        // The permit goes with the job: a request that gives up waiting
        // for it does not free a worker that still decodes.
        let done = tokio::task::spawn_blocking(move || {
            let answer = job();
            drop(running);
            answer
        });
        match done.await {
            Ok(answer) => Ok(answer),
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(_) => Err(full),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    #[tokio::test]
    async fn past_the_workers_and_the_queue_a_job_is_refused_at_once() {
        let pool = PhotoPool::new(1, 1);
        let (release, held) = mpsc::channel::<()>();
        let (started, running) = tokio::sync::oneshot::channel::<()>();
        let busy = {
            let pool = pool.clone();
            tokio::spawn(async move {
                pool.run(move || {
                    started.send(()).expect("the test waits");
                    held.recv_timeout(Duration::from_secs(10))
                        .expect("released");
                    1
                })
                .await
            })
        };
        tokio::time::timeout(Duration::from_secs(10), running)
            .await
            .expect("the first job runs in time")
            .expect("the first job runs");
        // One waits in the queue...
        let queued = {
            let pool = pool.clone();
            tokio::spawn(async move { pool.run(|| 2).await })
        };
        tokio::time::timeout(Duration::from_secs(10), async {
            while pool.admitted.available_permits() > 0 {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the second job is admitted");
        // ...and the third finds no room.
        assert_eq!(
            pool.run(|| 3).await,
            Err(PoolFull {
                workers: 1,
                queue: 1
            })
        );
        release.send(()).expect("the job waits");
        assert_eq!(busy.await.expect("joined"), Ok(1));
        assert_eq!(queued.await.expect("joined"), Ok(2));
        assert_eq!(pool.run(|| 4).await, Ok(4), "room again once they ended");
    }
}
