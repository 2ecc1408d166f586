//! The photo pool: image decoding and encoding (uploads, thumbnails) run
//! here, on `workers` threads of its own, never on the HTTP workers.
//! Past the workers, up to `queue` jobs wait; a job that finds the queue
//! full is refused at once ([`PoolFull`]), and the upload answers 503 with
//! `Retry-After` (it takes its place with [`PhotoPool::admit`] before it
//! reads its body): a burst of uploads never holds more than `workers`
//! decoders' memory.
//!
//! The workers run at a lower CPU priority than the rest of the server
//! (nice [`WORKER_NICE`] on Linux): when the cores are busy, the HTTP
//! workers, the actors and the database driver run first and the decoding
//! takes what is left. The server's default leaves one core without a
//! worker (`--photo-workers`), since a priority alone does not keep a
//! waking thread from waiting behind a decoder. (A burst still slows other
//! people's 202s somewhat: docs/BENCHMARKS.md §25 to §27.)

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::{oneshot, Semaphore};

/// The nice level of a photo worker thread (0 is the server's own): at 10
/// a worker gets about a tenth of a core that a normal thread also wants
/// (CFS weights 110 against 1024), and all of an idle one.
pub const WORKER_NICE: i32 = 10;

/// Every worker is busy and the queue is full: try again shortly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the photo pool is full ({workers} decoding, {queue} waiting)")]
pub struct PoolFull {
    pub workers: usize,
    pub queue: usize,
}

/// A job as a worker runs it: the caller's closure, its answer sent back.
type Job = Box<dyn FnOnce() + Send + 'static>;

/// A bounded pool for CPU-heavy media work.
#[derive(Clone, Debug)]
pub struct PhotoPool {
    /// To the workers. Unbounded as a channel, but nothing is sent without
    /// a place from `admitted`, so it never holds more than
    /// `workers + queue` jobs.
    jobs: mpsc::Sender<Job>,
    /// Permits to be in the pool at all (running or waiting).
    admitted: Arc<Semaphore>,
    workers: usize,
    queue: usize,
}

impl PhotoPool {
    /// A pool of `workers` threads (at least 1) with room for `queue` more
    /// jobs to wait. The threads end once the last clone of the pool is
    /// dropped and the jobs sent before it have run.
    pub fn new(workers: usize, queue: usize) -> std::io::Result<PhotoPool> {
        let workers = workers.max(1);
        Ok(PhotoPool {
            jobs: spawn_workers(workers)?,
            admitted: Arc::new(Semaphore::new(workers + queue)),
            workers,
            queue,
        })
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
                Err(self.full())
            }
        }
    }

    /// Runs `job` on a worker once one is free; refused at once when the
    /// queue is full.
    pub async fn run<T, F>(&self, job: F) -> Result<T, PoolFull>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        self.admit()?.run(job).await
    }

    fn full(&self) -> PoolFull {
        PoolFull {
            workers: self.workers,
            queue: self.queue,
        }
    }
}

/// A place taken in the pool; given back when dropped (after its last
/// job has run).
#[derive(Debug)]
pub struct Admitted {
    pool: PhotoPool,
    _place: tokio::sync::OwnedSemaphorePermit,
}

impl Admitted {
    /// Runs `job` on a worker once one is free. The place goes with the
    /// job and is given back when the job ends, so a request that stops
    /// waiting does not free room that a job still holds; a job whose
    /// request stopped waiting before a worker took it is skipped.
    pub async fn run<T, F>(self, job: F) -> Result<T, PoolFull>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        let (answer, place) = self.run_keeping(job).await?;
        // Given back before the caller goes on: its next job finds the room.
        drop(place);
        Ok(answer)
    }

    /// [`Admitted::run`], and the place comes back with the answer for the
    /// caller's next job (an upload's hash, then its decoding): the request
    /// keeps its place from its first job to its last.
    pub async fn run_keeping<T, F>(self, job: F) -> Result<(T, Admitted), PoolFull>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        let full = self.pool.full();
        let jobs = self.pool.jobs.clone();
        let (answer, answered) = oneshot::channel();
        let job: Job = Box::new(move || {
            if answer.is_closed() {
                return;
            }
            let outcome = catch_unwind(AssertUnwindSafe(job));
            // An Err here is the request gone meanwhile: the place is
            // dropped with it.
            answer.send((outcome, self)).ok();
        });
        jobs.send(job).map_err(|_| full)?;
        match answered.await {
            Ok((Ok(answer), place)) => Ok((answer, place)),
            Ok((Err(panic), _place)) => resume_unwind(panic),
            // The worker ended without answering: no worker is left.
            Err(_) => Err(full),
        }
    }
}

/// Starts `workers` threads at [`WORKER_NICE`] that run the jobs sent on
/// the returned channel, one at a time each.
fn spawn_workers(workers: usize) -> std::io::Result<mpsc::Sender<Job>> {
    let (jobs, queued) = mpsc::channel::<Job>();
    let queued = Arc::new(Mutex::new(queued));
    for n in 0..workers {
        let queued = queued.clone();
        std::thread::Builder::new()
            .name(format!("photo-{n}"))
            .spawn(move || {
                lower_own_priority();
                while let Some(job) = next_job(&queued) {
                    job();
                }
            })?;
    }
    Ok(jobs)
}

/// The next job, or None once every sender is gone.
fn next_job(queued: &Mutex<mpsc::Receiver<Job>>) -> Option<Job> {
    queued
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .recv()
        .ok()
}

/// Lowers the calling thread's CPU priority to [`WORKER_NICE`] (never
/// raises it: a server started niced stays so). On Linux a nice level is
/// a thread's own (`setpriority` on its thread id). A refusal leaves the
/// thread as it was: slower 202s under a burst, with a warning, rather
/// than no photos.
fn lower_own_priority() {
    #[cfg(target_os = "linux")]
    {
        let me = Some(rustix::thread::gettid());
        let lowered = match rustix::process::getpriority_process(me) {
            Ok(nice) if nice >= WORKER_NICE => Ok(()),
            _ => rustix::process::setpriority_process(me, WORKER_NICE),
        };
        if let Err(e) = lowered {
            tracing::warn!(error = %e, "could not lower a photo worker's CPU priority");
        }
    }
}

/// The nice level of the calling thread (Linux; 0 elsewhere), for tests.
#[cfg(test)]
fn own_nice() -> i32 {
    #[cfg(target_os = "linux")]
    return rustix::process::getpriority_process(Some(rustix::thread::gettid())).unwrap_or(0);
    #[cfg(not(target_os = "linux"))]
    0
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const DEADLINE: Duration = Duration::from_secs(10);

    /// A request whose job runs until released, once a worker runs it.
    async fn held_job<T: Send + 'static>(
        pool: &PhotoPool,
        value: T,
    ) -> (
        tokio::task::JoinHandle<Result<T, PoolFull>>,
        mpsc::Sender<()>,
    ) {
        let (release, held) = mpsc::channel::<()>();
        let (started, running) = oneshot::channel::<()>();
        let pool = pool.clone();
        let request = tokio::spawn(async move {
            pool.run(move || {
                started.send(()).expect("the test waits");
                held.recv_timeout(DEADLINE).expect("released");
                value
            })
            .await
        });
        tokio::time::timeout(DEADLINE, running)
            .await
            .expect("the job runs in time")
            .expect("the job runs");
        (request, release)
    }

    #[tokio::test]
    async fn past_the_workers_and_the_queue_a_job_is_refused_at_once() {
        let pool = PhotoPool::new(1, 1).expect("pool");
        let (busy, release) = held_job(&pool, 1).await;
        // One waits in the queue...
        let queued = {
            let pool = pool.clone();
            tokio::spawn(async move { pool.run(|| 2).await })
        };
        tokio::time::timeout(DEADLINE, async {
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

    #[tokio::test]
    async fn jobs_run_on_the_pools_own_threads_below_the_servers_priority() {
        let pool = PhotoPool::new(2, 0).expect("pool");
        let caller = (std::thread::current().id(), own_nice());
        let (thread, name, nice) = tokio::time::timeout(
            DEADLINE,
            pool.run(|| {
                let me = std::thread::current();
                (me.id(), me.name().map(str::to_owned), own_nice())
            }),
        )
        .await
        .expect("the job runs in time")
        .expect("a worker is free");
        assert_ne!(thread, caller.0, "never on the caller's thread");
        assert!(
            name.is_some_and(|n| n.starts_with("photo-")),
            "a photo worker"
        );
        if cfg!(target_os = "linux") {
            assert_eq!(nice, caller.1.max(WORKER_NICE), "lowered, never raised");
        }
    }

    #[tokio::test]
    async fn a_place_is_held_until_its_job_ends_even_when_the_request_stops_waiting() {
        let pool = PhotoPool::new(1, 0).expect("pool");
        let (request, release) = held_job(&pool, ()).await;
        request.abort();
        assert!(request.await.is_err(), "the request stopped waiting");
        assert!(
            pool.admit().is_err(),
            "the running job still holds its place"
        );
        release.send(()).expect("the job waits");
        let admitted = tokio::time::timeout(DEADLINE, async {
            loop {
                match pool.admit() {
                    Ok(place) => return place,
                    Err(_) => tokio::task::yield_now().await,
                }
            }
        })
        .await
        .expect("the place comes back once the job ended");
        assert_eq!(admitted.run(|| 5).await, Ok(5));
    }

    #[tokio::test]
    async fn a_panicking_job_reaches_its_caller_and_the_worker_lives_on() {
        let pool = PhotoPool::new(1, 0).expect("pool");
        let caught = tokio::spawn({
            let pool = pool.clone();
            async move { pool.run(|| panic!("a decoder bug")).await }
        })
        .await;
        assert!(
            caught.is_err_and(|e| e.is_panic()),
            "the caller sees the panic"
        );
        let after = tokio::time::timeout(DEADLINE, pool.run(|| 6)).await;
        assert_eq!(
            after.expect("in time"),
            Ok(6),
            "the one worker still runs jobs"
        );
    }
}
