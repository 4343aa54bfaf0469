//! The ready queue of a running scan: morsels waiting for a partition,
//! taken by whichever partition asks first.
//!
//! Why not a channel behind an async mutex, as the first version had: a
//! partition waiting for the mutex is woken by the one that held it, and
//! tokio runs a task woken so on the waker's own worker once the waker's
//! current work is done (its "LIFO slot", which other workers cannot
//! steal) — here, decoding a morsel. Hand-offs then went one partition
//! after another: on a 16-core machine, Q6 at SF 10 took 2.2 s while its
//! partitions waited 2.2 s each and downloaded morsels waited too. Here a
//! partition takes a morsel under a lock held for a `pop_front`, without
//! waiting for any other partition, and only an empty queue makes it wait,
//! for the fetcher's next push.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use datafusion::common::Result;
use tokio::sync::Notify;

use super::morsel::Morsel;

/// Morsels (or the error that ended the downloads) waiting for a partition.
#[derive(Default)]
pub(super) struct ReadyQueue {
    items: Mutex<VecDeque<Result<Morsel>>>,
    /// No more will come: the fetcher finished, failed or was dropped.
    closed: AtomicBool,
    /// Something was pushed, or the queue closed.
    pushed: Notify,
}

impl ReadyQueue {
    fn items(&self) -> std::sync::MutexGuard<'_, VecDeque<Result<Morsel>>> {
        // A push or a pop cannot be left half done by a panic.
        self.items.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `items` and wakes the partitions waiting.
    pub(super) fn push_all(&self, items: impl IntoIterator<Item = Result<Morsel>>) {
        self.items().extend(items);
        self.pushed.notify_waiters();
    }

    /// The next item; `None` once the queue is empty and closed.
    pub(super) async fn take(&self) -> Option<Result<Morsel>> {
        loop {
            // Registered before looking, so a push in between wakes it.
            let notified = self.pushed.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            if let Some(item) = self.items().pop_front() {
                return Some(item);
            }
            if self.closed.load(Ordering::Acquire) {
                // Whatever was pushed before closing is visible now.
                return self.items().pop_front();
            }
            notified.await;
        }
    }

    fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.pushed.notify_waiters();
    }
}

/// The fetcher's end of the queue: closes it when dropped — the fetcher
/// finished, failed, or was aborted with the scan — so that no partition
/// waits for ever.
pub(super) struct Producer(pub(super) Arc<ReadyQueue>);

impl Producer {
    pub(super) fn push_all(&self, items: impl IntoIterator<Item = Result<Morsel>>) {
        self.0.push_all(items)
    }
}

impl Drop for Producer {
    fn drop(&mut self) {
        self.0.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::common::DataFusionError;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn waiting_partitions_get_what_is_pushed_then_the_end() {
        let queue = Arc::new(ReadyQueue::default());
        let producer = Producer(queue.clone());
        let waiters: Vec<_> = (0..4).map(|_| {
            let q = queue.clone();
            tokio::spawn(async move { q.take().await.map(|r| r.err().map(|e| e.to_string())) })
        }).collect();
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        producer.push_all([Err(DataFusionError::Internal("one".into())), Err(DataFusionError::Internal("two".into()))]);
        drop(producer);
        let mut got: Vec<Option<Option<String>>> = Vec::new();
        for w in waiters {
            got.push(w.await.unwrap());
        }
        let items = got.iter().filter(|g| g.is_some()).count();
        assert_eq!(items, 2, "each pushed item reaches one partition: {got:?}");
        assert_eq!(got.iter().filter(|g| g.is_none()).count(), 2, "the others see the end: {got:?}");
        assert!(queue.take().await.is_none(), "closed and empty");
    }
}
