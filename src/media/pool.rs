//! The photo pool: image decoding and encoding (uploads, thumbnails of kept
//! results) run here, on `workers` threads of its own, never on the HTTP
//! workers. It owns three bounds:
//!
//! - **Places, per lane.** An upload takes a place in the upload lane
//!   ([`PhotoPool::admit`]) only once its body has arrived whole, so a
//!   slow client never holds one while it waits on the network. Past the
//!   workers, up to `queue` uploads wait; one that finds the lane full is
//!   refused at once ([`PoolFull`]: 503 with `Retry-After`). The keep lane
//!   ([`PhotoPool::admit_keep`]) has places of its own that uploads never
//!   take: a saga keeping its result waits its turn among other results,
//!   never behind uploads, and is never refused.
//! - **Order.** A free worker takes the oldest keep job before any upload,
//!   so a result waits for at most the jobs already running.
//! - **Memory.** A job reads its image's header, then reserves the memory
//!   its decoding will take at the peak ([`Memory::reserve`]) before it
//!   decodes a pixel: the jobs running hold at most `memory` bytes
//!   together, whatever the number of workers. Uploads may take all but a
//!   quarter of it ([`PoolSizes::keep_reserve`]), which only results use.
//!   A job that needs more than its lane's budget is refused
//!   ([`OverBudget`]); one that needs less waits, on its worker, until
//!   running jobs give back enough.
//!
//! The workers run at a lower CPU priority than the rest of the server
//! (nice [`WORKER_NICE`] on Linux): when the cores are busy, the HTTP
//! workers, the actors and the database driver run first and the decoding
//! takes what is left. The server's default leaves one core without a
//! worker (`--photo-workers`), since a priority alone does not keep a
//! waking thread from waiting behind a decoder. (A burst still slows other
//! people's 202s somewhat: docs/BENCHMARKS.md §25 to §27.)

use std::collections::VecDeque;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

use tokio::sync::{oneshot, Semaphore};

/// The nice level of a photo worker thread (0 is the server's own): at 10
/// a worker gets about a tenth of a core that a normal thread also wants
/// (CFS weights 110 against 1024), and all of an idle one.
pub const WORKER_NICE: i32 = 10;

/// Keep jobs that may wait for a worker besides those running; past them a
/// keep job waits for a place (its saga waits, holding no AI slot).
const KEEP_QUEUE: usize = 16;

/// Every worker is busy and the upload queue is full: try again shortly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the photo pool is full ({workers} decoding, {queue} waiting)")]
pub struct PoolFull {
    pub workers: usize,
    pub queue: usize,
}

/// A job needs more memory than its lane may ever hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("decoding it would take {needed} bytes of memory; this server decodes at most {budget} bytes of such images at once")]
pub struct OverBudget {
    pub needed: u64,
    pub budget: u64,
}

/// Who a job is for: a guest's upload, or a result being kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lane {
    Upload,
    Keep,
}

/// The pool's sizes, as configured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolSizes {
    /// Threads (at least 1).
    pub workers: usize,
    /// Uploads that may wait for a worker.
    pub queue: usize,
    /// Bytes the running jobs may hold at once, all lanes together.
    pub memory: u64,
}

impl PoolSizes {
    /// The share of `memory` that only keep jobs may use: a quarter.
    pub fn keep_reserve(&self) -> u64 {
        self.memory / 4
    }
}

/// A job as a worker runs it: the caller's closure, its answer sent back.
type Job = Box<dyn FnOnce() + Send + 'static>;

/// A bounded pool for CPU-heavy media work. Cheap to clone.
#[derive(Clone, Debug)]
pub struct PhotoPool {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    work: Arc<Work>,
    memory: Arc<MemoryGate>,
    /// Places in the upload lane (running or waiting).
    uploads: Arc<Semaphore>,
    /// Places in the keep lane.
    keeps: Arc<Semaphore>,
    sizes: PoolSizes,
}

impl Drop for Inner {
    /// The last clone of the pool is gone: the workers end once the jobs
    /// already queued have run.
    fn drop(&mut self) {
        self.work.lock().closed = true;
        self.work.ready.notify_all();
    }
}

impl PhotoPool {
    /// A pool of `sizes.workers` threads (at least 1).
    pub fn new(sizes: PoolSizes) -> std::io::Result<PhotoPool> {
        let sizes = PoolSizes {
            workers: sizes.workers.max(1),
            ..sizes
        };
        let work = Arc::new(Work::default());
        spawn_workers(sizes.workers, &work)?;
        Ok(PhotoPool {
            inner: Arc::new(Inner {
                work,
                memory: Arc::new(MemoryGate::new(sizes.memory, sizes.keep_reserve())),
                uploads: Arc::new(Semaphore::new(sizes.workers + sizes.queue)),
                keeps: Arc::new(Semaphore::new(sizes.workers + KEEP_QUEUE)),
                sizes,
            }),
        })
    }

    pub fn sizes(&self) -> PoolSizes {
        self.inner.sizes
    }

    pub fn workers(&self) -> usize {
        self.inner.sizes.workers
    }

    /// Bytes the running jobs hold now.
    pub fn memory_in_use(&self) -> u64 {
        *self.inner.memory.lock()
    }

    /// A place in the upload lane (a worker or the queue), taken at once
    /// or refused.
    pub fn admit(&self) -> Result<Admitted, PoolFull> {
        match self.inner.uploads.clone().try_acquire_owned() {
            Ok(place) => Ok(self.admitted(Lane::Upload, place)),
            Err(_) => {
                metrics::counter!(crate::metrics::PHOTO_POOL_REFUSED).increment(1);
                Err(self.full())
            }
        }
    }

    /// A place in the keep lane: waits, in order, while the lane is full
    /// (uploads never take its places).
    pub async fn admit_keep(&self) -> Admitted {
        let place = self
            .inner
            .keeps
            .clone()
            .acquire_owned()
            .await
            .expect("the keep lane's semaphore is never closed");
        self.admitted(Lane::Keep, place)
    }

    /// Runs `job` in the upload lane once a worker is free; refused at
    /// once when the lane is full.
    pub async fn run<T, F>(&self, job: F) -> Result<T, PoolFull>
    where
        F: FnOnce(&Memory) -> T + Send + 'static,
        T: Send + 'static,
    {
        self.admit()?.run(job).await
    }

    /// Runs `job` in the keep lane, waiting its turn.
    pub async fn run_keep<T, F>(&self, job: F) -> Result<T, PoolFull>
    where
        F: FnOnce(&Memory) -> T + Send + 'static,
        T: Send + 'static,
    {
        self.admit_keep().await.run(job).await
    }

    fn admitted(&self, lane: Lane, place: tokio::sync::OwnedSemaphorePermit) -> Admitted {
        Admitted {
            pool: self.clone(),
            lane,
            _place: place,
        }
    }

    fn full(&self) -> PoolFull {
        PoolFull {
            workers: self.inner.sizes.workers,
            queue: self.inner.sizes.queue,
        }
    }
}

/// A place taken in the pool; given back when dropped (after its last
/// job has run).
#[derive(Debug)]
pub struct Admitted {
    pool: PhotoPool,
    lane: Lane,
    _place: tokio::sync::OwnedSemaphorePermit,
}

impl Admitted {
    /// Runs `job` on a worker once one is free. The place goes with the
    /// job and is given back when the job ends, so a request that stops
    /// waiting does not free room that a job still holds; a job whose
    /// request stopped waiting before a worker took it is skipped.
    pub async fn run<T, F>(self, job: F) -> Result<T, PoolFull>
    where
        F: FnOnce(&Memory) -> T + Send + 'static,
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
        F: FnOnce(&Memory) -> T + Send + 'static,
        T: Send + 'static,
    {
        let full = self.pool.full();
        let lane = self.lane;
        let work = self.pool.inner.work.clone();
        let memory = Memory {
            gate: Some(self.pool.inner.memory.clone()),
            lane,
        };
        let (answer, answered) = oneshot::channel();
        let job: Job = Box::new(move || {
            if answer.is_closed() {
                return;
            }
            let outcome = catch_unwind(AssertUnwindSafe(|| job(&memory)));
            // An Err here is the request gone meanwhile: the place is
            // dropped with it.
            answer.send((outcome, self)).ok();
        });
        work.push(lane, job);
        match answered.await {
            Ok((Ok(answer), place)) => Ok((answer, place)),
            Ok((Err(panic), _place)) => resume_unwind(panic),
            // The worker ended without answering: no worker is left.
            Err(_) => Err(full),
        }
    }
}

/// The jobs waiting for a worker, keep jobs first.
#[derive(Debug, Default)]
struct Work {
    queues: Mutex<Queues>,
    ready: Condvar,
}

#[derive(Default)]
struct Queues {
    keep: VecDeque<Job>,
    upload: VecDeque<Job>,
    closed: bool,
}

impl std::fmt::Debug for Queues {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queues")
            .field("keep", &self.keep.len())
            .field("upload", &self.upload.len())
            .field("closed", &self.closed)
            .finish()
    }
}

impl Work {
    fn lock(&self) -> MutexGuard<'_, Queues> {
        self.queues.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `job` in its lane (bounded by the lane's places, taken
    /// before) and wakes a worker.
    fn push(&self, lane: Lane, job: Job) {
        let mut queues = self.lock();
        match lane {
            Lane::Keep => queues.keep.push_back(job),
            Lane::Upload => queues.upload.push_back(job),
        }
        drop(queues);
        self.ready.notify_one();
    }

    /// The next job, keep jobs first; None once the pool is gone and
    /// nothing is left.
    fn next(&self) -> Option<Job> {
        let mut queues = self.lock();
        loop {
            if let Some(job) = queues
                .keep
                .pop_front()
                .or_else(|| queues.upload.pop_front())
            {
                return Some(job);
            }
            if queues.closed {
                return None;
            }
            queues = self
                .ready
                .wait(queues)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }
}

/// The memory the running jobs hold, against the pool's budget.
#[derive(Debug)]
struct MemoryGate {
    in_use: Mutex<u64>,
    freed: Condvar,
    total: u64,
    keep_reserve: u64,
}

impl MemoryGate {
    fn new(total: u64, keep_reserve: u64) -> MemoryGate {
        MemoryGate {
            in_use: Mutex::new(0),
            freed: Condvar::new(),
            total,
            keep_reserve,
        }
    }

    fn lock(&self) -> MutexGuard<'_, u64> {
        self.in_use.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// What `lane` may hold with the others: uploads leave the keep
    /// reserve free.
    fn budget(&self, lane: Lane) -> u64 {
        match lane {
            Lane::Keep => self.total,
            Lane::Upload => self.total - self.keep_reserve,
        }
    }
}

/// A running job's access to the pool's memory budget.
#[derive(Debug)]
pub struct Memory {
    /// None: a caller outside the pool (tests, tools), unbounded.
    gate: Option<Arc<MemoryGate>>,
    lane: Lane,
}

impl Memory {
    /// No budget: for work run outside the pool.
    pub fn unbounded() -> Memory {
        Memory {
            gate: None,
            lane: Lane::Keep,
        }
    }

    /// Reserves `bytes` for the rest of the job (until the answer is
    /// dropped). Waits, on this worker, while the running jobs hold too
    /// much for `bytes` more to fit; refused when `bytes` alone is past
    /// the lane's budget. A job waiting here holds nothing, so the jobs
    /// that do hold memory always finish and make room.
    pub fn reserve(&self, bytes: u64) -> Result<MemoryHeld, OverBudget> {
        let Some(gate) = &self.gate else {
            return Ok(MemoryHeld {
                gate: None,
                bytes: 0,
            });
        };
        let budget = gate.budget(self.lane);
        if bytes > budget {
            return Err(OverBudget {
                needed: bytes,
                budget,
            });
        }
        let mut in_use = gate.lock();
        while *in_use + bytes > budget {
            in_use = gate
                .freed
                .wait(in_use)
                .unwrap_or_else(PoisonError::into_inner);
        }
        *in_use += bytes;
        Ok(MemoryHeld {
            gate: Some(gate.clone()),
            bytes,
        })
    }
}

/// Memory reserved by a running job; given back when dropped.
#[derive(Debug)]
pub struct MemoryHeld {
    gate: Option<Arc<MemoryGate>>,
    bytes: u64,
}

impl Drop for MemoryHeld {
    fn drop(&mut self) {
        if let Some(gate) = &self.gate {
            *gate.lock() -= self.bytes;
            gate.freed.notify_all();
        }
    }
}

/// Starts `workers` threads at [`WORKER_NICE`] that run the queued jobs,
/// one at a time each.
fn spawn_workers(workers: usize, work: &Arc<Work>) -> std::io::Result<()> {
    for n in 0..workers {
        let work = work.clone();
        std::thread::Builder::new()
            .name(format!("photo-{n}"))
            .spawn(move || {
                lower_own_priority();
                while let Some(job) = work.next() {
                    job();
                }
            })?;
    }
    Ok(())
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
    use std::sync::mpsc;
    use std::time::Duration;

    const DEADLINE: Duration = Duration::from_secs(10);
    const MIB: u64 = 1024 * 1024;

    fn pool(workers: usize, queue: usize) -> PhotoPool {
        PhotoPool::new(PoolSizes {
            workers,
            queue,
            memory: 1024 * MIB,
        })
        .expect("pool")
    }

    /// A request in `lane` whose job runs until released, once a worker
    /// runs it.
    async fn held_job<T: Send + 'static>(
        pool: &PhotoPool,
        lane: Lane,
        value: T,
    ) -> (
        tokio::task::JoinHandle<Result<T, PoolFull>>,
        mpsc::Sender<()>,
    ) {
        let (release, held) = mpsc::channel::<()>();
        let (started, running) = oneshot::channel::<()>();
        let pool = pool.clone();
        let request = tokio::spawn(async move {
            let job = move |_: &Memory| {
                started.send(()).expect("the test waits");
                held.recv_timeout(DEADLINE).expect("released");
                value
            };
            match lane {
                Lane::Upload => pool.run(job).await,
                Lane::Keep => pool.run_keep(job).await,
            }
        });
        tokio::time::timeout(DEADLINE, running)
            .await
            .expect("the job runs in time")
            .expect("the job runs");
        (request, release)
    }

    /// Waits until `places` has no permit left.
    async fn until_taken(places: &Semaphore) {
        tokio::time::timeout(DEADLINE, async {
            while places.available_permits() > 0 {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the places are taken");
    }

    #[tokio::test]
    async fn past_the_workers_and_the_queue_an_upload_is_refused_at_once() {
        let pool = pool(1, 1);
        let (busy, release) = held_job(&pool, Lane::Upload, 1).await;
        // One waits in the queue...
        let queued = {
            let pool = pool.clone();
            tokio::spawn(async move { pool.run(|_| 2).await })
        };
        until_taken(&pool.inner.uploads).await;
        // ...and the third finds no room.
        assert_eq!(
            pool.run(|_| 3).await,
            Err(PoolFull {
                workers: 1,
                queue: 1
            })
        );
        release.send(()).expect("the job waits");
        assert_eq!(busy.await.expect("joined"), Ok(1));
        assert_eq!(queued.await.expect("joined"), Ok(2));
        assert_eq!(pool.run(|_| 4).await, Ok(4), "room again once they ended");
    }

    /// Uploads fill every place of their lane and the worker; a result to
    /// keep still gets a place at once and runs next, before the uploads
    /// that waited longer.
    #[tokio::test]
    async fn a_result_to_keep_runs_before_queued_uploads_and_is_never_refused() {
        let pool = pool(1, 2);
        let (busy, release) = held_job(&pool, Lane::Upload, "running").await;
        let order = Arc::new(Mutex::new(Vec::new()));
        let queued: Vec<_> = (0..2)
            .map(|n| {
                let (pool, order) = (pool.clone(), order.clone());
                tokio::spawn(async move {
                    pool.run(move |_| order.lock().unwrap().push(format!("upload {n}")))
                        .await
                })
            })
            .collect();
        until_taken(&pool.inner.uploads).await;
        assert!(pool.admit().is_err(), "the upload lane is full");
        let keep = {
            let (pool, order) = (pool.clone(), order.clone());
            tokio::spawn(async move {
                pool.run_keep(move |_| order.lock().unwrap().push("keep".into()))
                    .await
            })
        };
        // The keep job is queued (its place taken) before the worker frees.
        tokio::time::timeout(DEADLINE, async {
            while pool.inner.work.lock().keep.is_empty() {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the keep job is queued");
        release.send(()).expect("the job waits");
        assert_eq!(busy.await.expect("joined"), Ok("running"));
        assert_eq!(keep.await.expect("joined"), Ok(()));
        for upload in queued {
            assert_eq!(upload.await.expect("joined"), Ok(()));
        }
        assert_eq!(
            *order.lock().unwrap(),
            ["keep", "upload 0", "upload 1"],
            "the result first, then the uploads in order"
        );
    }

    /// Two workers, a budget of 100 MiB: a job that reserves 60 MiB makes
    /// a second one that needs 60 MiB wait until it ends, although a
    /// worker is free; past its lane's budget a job is refused; the keep
    /// lane may use the quarter uploads leave free.
    #[tokio::test]
    async fn running_jobs_hold_at_most_the_memory_budget() {
        let pool = PhotoPool::new(PoolSizes {
            workers: 2,
            queue: 2,
            memory: 100 * MIB,
        })
        .expect("pool");
        let (release, held) = mpsc::channel::<()>();
        let (reserved, first_holds) = oneshot::channel::<()>();
        let first = {
            let pool = pool.clone();
            tokio::spawn(async move {
                pool.run(move |memory| {
                    let _held = memory.reserve(60 * MIB).expect("fits");
                    reserved.send(()).expect("the test waits");
                    held.recv_timeout(DEADLINE).expect("released");
                })
                .await
            })
        };
        tokio::time::timeout(DEADLINE, first_holds)
            .await
            .expect("in time")
            .expect("reserved");
        assert_eq!(pool.memory_in_use(), 60 * MIB);
        let second = {
            let pool = pool.clone();
            tokio::spawn(async move {
                pool.run(|memory| {
                    let _held = memory.reserve(60 * MIB).expect("fits once freed");
                    memory_gate_in_use(memory)
                })
                .await
            })
        };
        // The second job runs on the other worker and waits for memory.
        tokio::time::timeout(DEADLINE, async {
            while !pool.inner.work.lock().upload.is_empty()
                || pool.inner.uploads.available_permits() > 2
            {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the second job is on a worker");
        assert_eq!(pool.memory_in_use(), 60 * MIB, "it waits, holding nothing");
        let upload = Memory {
            gate: Some(pool.inner.memory.clone()),
            lane: Lane::Upload,
        };
        assert_eq!(
            upload.reserve(80 * MIB).map(|_| ()),
            Err(OverBudget {
                needed: 80 * MIB,
                budget: 75 * MIB
            }),
            "an upload may hold three quarters, and is refused at once past them"
        );
        release.send(()).expect("the job waits");
        assert_eq!(first.await.expect("joined"), Ok(()));
        assert_eq!(
            second.await.expect("joined"),
            Ok(60 * MIB),
            "it ran once the first gave its memory back"
        );
        assert_eq!(pool.memory_in_use(), 0);
        assert_eq!(
            pool.run_keep(|memory| memory.reserve(80 * MIB).map(|_| ()))
                .await,
            Ok(Ok(())),
            "a result may use the reserve"
        );
    }

    fn memory_gate_in_use(memory: &Memory) -> u64 {
        *memory.gate.as_ref().expect("in the pool").lock()
    }

    #[tokio::test]
    async fn jobs_run_on_the_pools_own_threads_below_the_servers_priority() {
        let pool = pool(2, 0);
        let caller = (std::thread::current().id(), own_nice());
        let (thread, name, nice) = tokio::time::timeout(
            DEADLINE,
            pool.run(|_| {
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
        let pool = pool(1, 0);
        let (request, release) = held_job(&pool, Lane::Upload, ()).await;
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
        assert_eq!(admitted.run(|_| 5).await, Ok(5));
    }

    #[tokio::test]
    async fn a_panicking_job_reaches_its_caller_and_the_worker_lives_on() {
        let pool = pool(1, 0);
        let caught = tokio::spawn({
            let pool = pool.clone();
            async move { pool.run(|_| panic!("a decoder bug")).await }
        })
        .await;
        assert!(
            caught.is_err_and(|e| e.is_panic()),
            "the caller sees the panic"
        );
        let after = tokio::time::timeout(DEADLINE, pool.run(|_| 6)).await;
        assert_eq!(
            after.expect("in time"),
            Ok(6),
            "the one worker still runs jobs"
        );
    }

    #[tokio::test]
    async fn the_workers_end_once_the_pool_is_gone() {
        let pool = pool(2, 0);
        let work = Arc::downgrade(&pool.inner.work);
        assert_eq!(pool.run(|_| 7).await, Ok(7));
        drop(pool);
        tokio::time::timeout(DEADLINE, async {
            while work.strong_count() > 0 {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("every worker let go of the queue");
    }
}
