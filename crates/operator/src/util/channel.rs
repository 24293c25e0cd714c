//! Bounded queues whose sender never waits and whose losses are never
//! silent: a full queue drops what is sent and counts it, and the receiver,
//! told how many it lost, redoes what they could have asked for (the
//! operator resyncs). Memory stays bounded under an event storm; nothing
//! is lost unseen.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::mpsc;

/// The sending half; cheap to clone.
pub struct Sender<T> {
    tx: mpsc::Sender<T>,
    dropped: Arc<AtomicU64>,
}

impl<T> Clone for Sender<T> {
    fn clone(&self) -> Self {
        Self {
            tx: self.tx.clone(),
            dropped: self.dropped.clone(),
        }
    }
}

/// The receiving half.
pub struct Receiver<T> {
    rx: mpsc::Receiver<T>,
    dropped: Arc<AtomicU64>,
}

/// A queue of at most `capacity` items.
pub fn bounded<T>(capacity: usize) -> (Sender<T>, Receiver<T>) {
    let (tx, rx) = mpsc::channel(capacity.max(1));
    let dropped = Arc::new(AtomicU64::new(0));
    (
        Sender {
            tx,
            dropped: dropped.clone(),
        },
        Receiver { rx, dropped },
    )
}

/// What became of an item sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sent {
    Queued,
    /// The queue was full: dropped, and counted for the receiver.
    Dropped,
    /// Nobody receives any more.
    Closed,
}

impl<T> Sender<T> {
    /// Queue `item` without waiting.
    pub fn send(&self, item: T) -> Sent {
        match self.tx.try_send(item) {
            Ok(()) => Sent::Queued,
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.dropped.fetch_add(1, Ordering::AcqRel);
                Sent::Dropped
            }
            Err(mpsc::error::TrySendError::Closed(_)) => Sent::Closed,
        }
    }
}

impl<T> Receiver<T> {
    /// The next item; `None` once every sender is gone.
    pub async fn recv(&mut self) -> Option<T> {
        self.rx.recv().await
    }

    /// The next item if one is waiting.
    pub fn try_recv(&mut self) -> Option<T> {
        self.rx.try_recv().ok()
    }

    /// How many items were dropped since the last call (the queue full).
    pub fn take_dropped(&self) -> u64 {
        self.dropped.swap(0, Ordering::AcqRel)
    }

    /// The items as a stream (for a receiver that does not need to know
    /// of drops: one whose every item asks for the same thing).
    pub fn into_stream(self) -> impl futures::Stream<Item = T> + Send + 'static
    where
        T: Send + 'static,
    {
        futures::stream::unfold(
            self.rx,
            |mut rx| async move { rx.recv().await.map(|x| (x, rx)) },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_full_queue_drops_and_counts_what_does_not_fit() {
        let (tx, mut rx) = bounded::<u32>(2);
        assert_eq!(tx.send(1), Sent::Queued);
        assert_eq!(tx.send(2), Sent::Queued);
        assert_eq!(tx.send(3), Sent::Dropped);
        assert_eq!(tx.clone().send(4), Sent::Dropped);
        assert_eq!(rx.recv().await, Some(1));
        assert_eq!(rx.take_dropped(), 2);
        assert_eq!(rx.take_dropped(), 0, "told once");
        assert_eq!(tx.send(5), Sent::Queued);
        assert_eq!(rx.recv().await, Some(2));
        assert_eq!(rx.recv().await, Some(5));
        drop(rx);
        assert_eq!(tx.send(6), Sent::Closed);
    }
}
