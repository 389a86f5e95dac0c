//! A broadcast wake-up for tasks of one executor: every waiter that read
//! the epoch before a `notify_all` is woken by it. Used for durability
//! waiters (the log's I/O locks) and, in the broker, for long-polling
//! fetches waiting for new data. A waiter that gives up (its future is
//! dropped, say on a timeout) removes its registration, so the set of
//! registered wakers never outgrows the live waiters.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

#[derive(Default)]
pub struct Notify {
    epoch: Cell<u64>,
    next_id: Cell<u64>,
    wakers: RefCell<BTreeMap<u64, Waker>>,
}

impl Notify {
    /// The current epoch; pass it to [`Notify::wait`] after checking the
    /// condition, so a notification in between is not missed.
    pub fn epoch(&self) -> u64 {
        self.epoch.get()
    }

    /// Wakes every waiter.
    pub fn notify_all(&self) {
        self.epoch.set(self.epoch.get() + 1);
        let wakers = std::mem::take(&mut *self.wakers.borrow_mut());
        for w in wakers.into_values() {
            w.wake();
        }
    }

    /// Resolves once `notify_all` ran after the epoch `seen` was read.
    pub fn wait(&self, seen: u64) -> Wait<'_> {
        Wait {
            notify: self,
            seen,
            id: None,
        }
    }

    /// Wakers registered now (for tests and metrics).
    pub fn waiters(&self) -> usize {
        self.wakers.borrow().len()
    }
}

/// The future of [`Notify::wait`].
pub struct Wait<'a> {
    notify: &'a Notify,
    seen: u64,
    id: Option<u64>,
}

impl Future for Wait<'_> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.notify.epoch.get() != self.seen {
            return Poll::Ready(());
        }
        let id = match self.id {
            Some(id) => id,
            None => {
                let id = self.notify.next_id.get();
                self.notify.next_id.set(id + 1);
                self.id = Some(id);
                id
            }
        };
        self.notify.wakers.borrow_mut().insert(id, cx.waker().clone());
        Poll::Pending
    }
}

impl Drop for Wait<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.id {
            self.notify.wakers.borrow_mut().remove(&id);
        }
    }
}
