//! Publishing to the remote without holding the user's build back: puts go to one background
//! thread through a bounded queue, and the caller waits for its own put at most
//! `KPC_CACHE_REMOTE_TIMEOUT`, so in the common case the entry is on the remote when the build
//! returns (and a fleet waiter polling for it finds it), and a slow remote costs the build at most the
//! timeout. A put that outlives the wait finishes in the background; a put that finds the queue full
//! is dropped (the remote is not keeping up; the entry is on the local disk anyway).
//!
//! When the store is dropped the queue is given one more timeout to drain, then left: a process that
//! exits does not wait on a dead remote.

use std::sync::Arc;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::time::Duration;

use parking_lot::Mutex;

use super::ops::{Failure, Ops};

/// Puts waiting for the background thread at most: beyond this the remote is not keeping up.
const QUEUE: usize = 64;

/// What became of one put, as the caller saw it.
#[derive(Debug)]
pub(crate) enum Publish {
    /// It finished within the wait: stored, or failed with this.
    Done(Result<(), Failure>),
    /// Still running when the wait ran out; it finishes (or fails) in the background.
    Pending,
    /// The queue was full, or the thread is gone: not published.
    Dropped,
}

struct Job {
    path: String,
    value: Vec<u8>,
    /// `None`: nobody waits for it, and it is neither counted nor seen by the breaker (a last-served
    /// record, `Ops::write_note`).
    done: Option<mpsc::Sender<Result<(), Failure>>>,
}

/// Told of every background put's result (its size and the result) twice at most: to count it, before
/// its caller wakes, so that counters read as soon as a build returns include its put; and, for a put
/// whose caller had stopped waiting, to warn about a failure (a caller still waiting warns itself, on
/// its own thread).
pub(crate) type Report = Arc<dyn Fn(usize, &Result<(), Failure>, Told) + Send + Sync>;

/// Which of its calls a [`Report`] gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Told {
    /// Every put, once, before its caller is told.
    Count,
    /// A put whose caller was no longer waiting.
    Unclaimed,
}

/// The background publisher of one remote store.
pub(crate) struct Publisher {
    tx: Mutex<Option<SyncSender<Job>>>,
    finished: Mutex<Option<Receiver<()>>>,
    wait: Duration,
}

impl Publisher {
    /// Starts the thread that writes through `ops`; callers wait at most `wait` for their put.
    /// `None` if no thread could be started.
    pub fn start(ops: Arc<Ops>, report: Report, wait: Duration) -> Option<Publisher> {
        let (tx, rx) = mpsc::sync_channel::<Job>(QUEUE);
        let (fin_tx, fin_rx) = mpsc::channel();
        std::thread::Builder::new()
            .name("kpc-remote-publish".into())
            .spawn(move || {
                for job in rx {
                    let len = job.value.len();
                    let Some(done) = job.done else {
                        ops.write_note(&job.path, job.value);
                        continue;
                    };
                    let r = ops.write(&job.path, job.value);
                    report(len, &r, Told::Count);
                    // The caller may have stopped waiting: then the report warns.
                    if done.send(r.clone()).is_err() {
                        report(len, &r, Told::Unclaimed);
                    }
                }
                let _ = fin_tx.send(());
            })
            .ok()?;
        Some(Publisher {
            tx: Mutex::new(Some(tx)),
            finished: Mutex::new(Some(fin_rx)),
            wait,
        })
    }

    /// Queues `value` for `path` and waits for it at most the configured bound.
    pub fn publish(&self, path: String, value: Vec<u8>) -> Publish {
        let (done, result) = mpsc::channel();
        let sent = match self.tx.lock().as_ref() {
            Some(tx) => tx.try_send(Job {
                path,
                value,
                done: Some(done),
            }),
            None => return Publish::Dropped,
        };
        match sent {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => return Publish::Dropped,
        }
        match result.recv_timeout(self.wait) {
            Ok(r) => Publish::Done(r),
            Err(RecvTimeoutError::Timeout) => Publish::Pending,
            Err(RecvTimeoutError::Disconnected) => Publish::Dropped,
        }
    }
}

impl Publisher {
    /// Queues `value` for `path` without waiting, counting or reporting: a best-effort write (a
    /// last-served record) that is dropped when the queue is full.
    pub fn submit(&self, path: String, value: Vec<u8>) {
        if let Some(tx) = self.tx.lock().as_ref() {
            let _ = tx.try_send(Job {
                path,
                value,
                done: None,
            });
        }
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        // Closing the queue ends the thread once it has written what is queued.
        self.tx.lock().take();
        if let Some(fin) = self.finished.lock().take() {
            let _ = fin.recv_timeout(self.wait);
        }
    }
}
