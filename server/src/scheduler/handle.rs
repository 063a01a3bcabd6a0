//! The HTTP side's handle on the engine thread: the request channel, the admission count it
//! keeps without locking, and shutdown.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::mpsc;

use super::{GenRequest, SchedulerError};

/// Counters the HTTP layer reads without locking, and the shutdown flag it sets.
#[derive(Debug, Default)]
pub(super) struct Shared {
    /// Requests accepted by [`SchedulerHandle::submit`] and not yet dropped by the engine thread
    /// (queued in the channel, waiting, or running): what admission counts.
    pub(super) accepted: AtomicUsize,
    pub(super) alive: AtomicBool,
    /// Set at shutdown past the drain deadline: fail everything still in flight.
    pub(super) abort: AtomicBool,
    /// The engine thread, unparked after each message so that a thread parked until a
    /// re-prefill is due wakes for a request at once.
    pub(super) engine_thread: std::sync::OnceLock<std::thread::Thread>,
}

impl Shared {
    /// Wakes the engine thread if it is parked.
    pub(super) fn wake(&self) {
        if let Some(t) = self.engine_thread.get() {
            t.unpark();
        }
    }
}

/// What the engine thread receives.
pub(super) enum Msg {
    Request(Box<GenRequest>),
    /// Fail whatever is left, drop the engine and end the thread.
    Stop,
}

/// Cheap, cloneable handle on the scheduler thread.
#[derive(Clone)]
pub struct SchedulerHandle {
    pub(super) tx: mpsc::Sender<Msg>,
    pub(super) shared: Arc<Shared>,
    pub(super) max_num_seqs: usize,
    pub(super) max_queue: usize,
}

/// One accepted request's place in the admission count, given back when the engine thread drops
/// the request (finished, failed, cancelled or timed out) or it never reaches the thread.
#[derive(Debug)]
pub struct Ticket(Arc<Shared>);

impl Drop for Ticket {
    fn drop(&mut self) {
        self.0.accepted.fetch_sub(1, Ordering::SeqCst);
    }
}

impl SchedulerHandle {
    /// Queues a request, or refuses it at once when `max_num_seqs` requests could run and
    /// `max_queue` more already wait: free slots count as room, so `--max-queue 0` means no
    /// waiting line, not "refuse everything".
    pub fn submit(&self, mut req: GenRequest) -> Result<(), SchedulerError> {
        let prev = self.shared.accepted.fetch_add(1, Ordering::SeqCst);
        req.ticket = Some(Ticket(self.shared.clone()));
        if prev >= self.max_num_seqs + self.max_queue {
            return Err(SchedulerError::QueueFull { in_flight: prev, slots: self.max_num_seqs, queue: self.max_queue });
        }
        // The channel holds as many requests as the count admits, so it is full only if the
        // engine thread is gone or behind on dropping finished requests: the same answer.
        match self.tx.try_send(Msg::Request(Box::new(req))) {
            Ok(()) => {
                self.shared.wake();
                Ok(())
            }
            Err(mpsc::error::TrySendError::Full(_)) => {
                Err(SchedulerError::QueueFull { in_flight: prev, slots: self.max_num_seqs, queue: self.max_queue })
            }
            Err(mpsc::error::TrySendError::Closed(_)) => Err(SchedulerError::Stopped),
        }
    }

    /// Requests accepted and not yet done: on their way to the engine thread, waiting or running.
    pub fn in_flight(&self) -> usize {
        self.shared.accepted.load(Ordering::SeqCst)
    }

    /// Whether the engine thread is still running.
    pub fn alive(&self) -> bool {
        self.shared.alive.load(Ordering::SeqCst)
    }

    /// Fails every waiting and running request (shutdown past its deadline).
    pub fn abort_all(&self) {
        self.shared.abort.store(true, Ordering::SeqCst);
    }

    /// Ends the engine thread: what is still in flight fails, the engine and its pool are
    /// dropped (GPU memory, NCCL communicators) before this returns, so that nothing of them is
    /// left to the process's exit. False if the thread was still running after `timeout`.
    pub async fn shut_down(&self, timeout: std::time::Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        // The channel may be full of requests; the thread reads them all before the stop.
        let _ = tokio::time::timeout_at(deadline, self.tx.send(Msg::Stop)).await;
        self.shared.wake();
        while self.alive() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        !self.alive()
    }
}
