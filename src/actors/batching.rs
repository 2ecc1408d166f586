//! Group commit for the actors that write: writes that arrive while a batch
//! is being written wait together and go in the next batch, so under load
//! one transaction carries many sagas' writes, and at rest a lone write goes
//! out at once. Not an actor: the queue and its runner task, owned by the
//! actor that uses it.
//!
//! Bounds: the queue holds at most `capacity` writes; when it is full,
//! senders wait for room (backpressure reaches the supervisors; nothing is
//! dropped). At most `concurrent` batches are written at once, each of at
//! most `max_batch` writes, so saga work holds at most `concurrent`
//! connections for its writes.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, Semaphore};

use crate::store::{StoreError, StoreResult};

/// Sizes of a [`BatchQueue`].
#[derive(Debug, Clone, Copy)]
pub struct BatchLimits {
    pub capacity: usize,
    pub max_batch: usize,
    pub concurrent: usize,
    /// After the first write of a batch, wait this long for more (zero: go
    /// at once). For writes whose cost is per batch rather than per write.
    pub linger: Duration,
}

/// The runner stopped (the runtime is shutting down).
#[derive(Debug, thiserror::Error)]
#[error("the batch writer has stopped")]
pub struct BatchWriterStopped;

/// A queue of writes of type `W`, each answered with an `R`.
pub struct BatchQueue<W, R> {
    sender: mpsc::Sender<(W, oneshot::Sender<R>)>,
}

impl<W, R> Clone for BatchQueue<W, R> {
    fn clone(&self) -> Self {
        BatchQueue {
            sender: self.sender.clone(),
        }
    }
}

impl<W: Send + 'static, R: Send + 'static> BatchQueue<W, R> {
    /// Starts the runner. `apply` writes one batch and returns one answer
    /// per write, in the batch's order.
    pub fn start<F, Fut>(name: &'static str, limits: BatchLimits, apply: F) -> Self
    where
        F: Fn(Vec<W>) -> Fut + Send + 'static,
        Fut: Future<Output = Vec<R>> + Send + 'static,
    {
        let (sender, mut receiver) = mpsc::channel::<(W, oneshot::Sender<R>)>(limits.capacity);
        let running = Arc::new(Semaphore::new(limits.concurrent.max(1)));
        crate::metrics::task_spawned("batch.runner");
        tokio::spawn(async move {
            let mut queued = Vec::with_capacity(limits.max_batch);
            loop {
                // Wait for a free writer first: what arrives meanwhile joins
                // the batch.
                let Ok(permit) = running.clone().acquire_owned().await else {
                    return;
                };
                if receiver.recv_many(&mut queued, limits.max_batch).await == 0 {
                    return; // every sender is gone
                }
                if !limits.linger.is_zero() && queued.len() < limits.max_batch {
                    tokio::time::sleep(limits.linger).await;
                    while queued.len() < limits.max_batch {
                        match receiver.try_recv() {
                            Ok(write) => queued.push(write),
                            Err(_) => break,
                        }
                    }
                }
                let (writes, replies): (Vec<W>, Vec<oneshot::Sender<R>>) =
                    std::mem::take(&mut queued).into_iter().unzip();
                let size = writes.len();
                let batch = apply(writes);
                crate::metrics::task_spawned("batch.write");
                tokio::spawn(async move {
                    let started = std::time::Instant::now();
                    let answers = batch.await;
                    tracing::debug!(
                        batch = name,
                        size,
                        ms = started.elapsed().as_secs_f64() * 1e3,
                        "batch written"
                    );
                    for (reply, answer) in replies.into_iter().zip(answers) {
                        // A sender that stopped waiting needs no answer.
                        let _ = reply.send(answer);
                    }
                    drop(permit);
                });
            }
        });
        BatchQueue { sender }
    }

    /// Queues `write` (waiting for room when the queue is full) and waits
    /// for its answer.
    pub async fn submit(&self, write: W) -> Result<R, BatchWriterStopped> {
        let (reply, answer) = oneshot::channel();
        self.sender
            .send((write, reply))
            .await
            .map_err(|_| BatchWriterStopped)?;
        answer.await.map_err(|_| BatchWriterStopped)
    }
}

impl<W: Send + 'static, T: Send + 'static> BatchQueue<W, StoreResult<T>> {
    /// [`submit`](Self::submit) for store writes: a stopped writer reads
    /// as a database error.
    pub async fn write(&self, write: W) -> StoreResult<T> {
        self.submit(write)
            .await
            .map_err(|e| StoreError::Db(sea_orm::DbErr::Custom(e.to_string())))?
    }
}

/// The answers of a batch whose transaction failed: every write gets the
/// error (and was not written).
pub fn batch_failed<T>(writes: usize, error: &StoreError) -> Vec<StoreResult<T>> {
    let (failure, message) = (error.failure(), error.to_string());
    (0..writes)
        .map(|_| {
            Err(StoreError::BatchFailed {
                failure,
                message: message.clone(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[tokio::test]
    async fn writes_that_arrive_during_a_batch_go_together_in_the_next() {
        let sizes = Arc::new(Mutex::new(Vec::new()));
        let gate = Arc::new(tokio::sync::Notify::new());
        let (seen, open) = (sizes.clone(), gate.clone());
        let queue = BatchQueue::start(
            "test",
            BatchLimits {
                capacity: 100,
                max_batch: 10,
                concurrent: 1,
                linger: Duration::ZERO,
            },
            move |writes: Vec<u32>| {
                let (seen, open) = (seen.clone(), open.clone());
                async move {
                    seen.lock().unwrap().push(writes.len());
                    if writes == [0] {
                        open.notified().await; // hold the first batch
                    }
                    writes.iter().map(|w| w * 2).collect()
                }
            },
        );
        let first = tokio::spawn({
            let q = queue.clone();
            async move { q.submit(0).await.unwrap() }
        });
        while sizes.lock().unwrap().is_empty() {
            tokio::task::yield_now().await;
        }
        let rest: Vec<_> = (1..=12)
            .map(|i| {
                let q = queue.clone();
                tokio::spawn(async move { q.submit(i).await.unwrap() })
            })
            .collect();
        // Let the twelve reach the queue while the first batch is held.
        for _ in 0..50 {
            tokio::task::yield_now().await;
        }
        gate.notify_one();
        assert_eq!(first.await.unwrap(), 0);
        let mut answers = Vec::new();
        for r in rest {
            answers.push(r.await.unwrap());
        }
        assert_eq!(answers, (1..=12).map(|i| i * 2).collect::<Vec<_>>());
        assert_eq!(
            *sizes.lock().unwrap(),
            vec![1, 10, 2],
            "one lone write, then the waiting ones in batches of at most 10"
        );
    }
}
