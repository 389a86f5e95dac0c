//! Retrying calls while a cluster changes under them: which errors are
//! worth a retry, how long to wait before the next one, and a `sleep` that
//! works on any executor.
//!
//! A leader moving (failover, controlled shutdown, leader balancing) or a
//! broker restarting answers `NotLeader`, `BrokerUnavailable`, `Timeout` or
//! a broken connection for a few seconds; the client waits a doubling
//! backoff between attempts (so a partition between leaders is not asked
//! hundreds of times a second) and gives up only at the call's deadline.
//!
//! Runs on: the callers' threads; [`sleep`]'s deadlines are kept by one
//! thread per process (`strand-client timer`), started on first use, which
//! wakes the waiting tasks — so a consumer can back off under tokio, glommio
//! or [`crate::block_on`] alike, without a runtime's timer.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Condvar, Mutex, OnceLock};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use strand_wire::ErrorCode;

use crate::error::ClientError;

/// The first backoff after a failed attempt (consumers and group calls).
pub const RETRY_BACKOFF: Duration = Duration::from_millis(50);
/// The longest backoff between two attempts.
pub const RETRY_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// Whether the same call may succeed later without anything changed by
/// the caller: the connection broke, or the cluster is moving (a leader
/// changing, a broker restarting, too few replicas in sync for now).
pub fn retriable(e: &ClientError) -> bool {
    match e {
        ClientError::Io { .. } => true,
        ClientError::Broker { code, .. } => matches!(
            code.0,
            ErrorCode::NotLeader
                | ErrorCode::UnknownPartition
                | ErrorCode::Overloaded
                | ErrorCode::Timeout
                | ErrorCode::NotEnoughReplicas
                | ErrorCode::ControllerUnavailable
                | ErrorCode::BrokerUnavailable
        ),
        _ => false,
    }
}

/// The wait before attempt `attempt + 1` (1-based: after the first
/// failure, `base`), doubling up to `max`.
pub fn backoff(attempt: u32, base: Duration, max: Duration) -> Duration {
    let shift = attempt.clamp(1, 16) - 1;
    base.saturating_mul(1 << shift).min(max)
}

/// A run of failed attempts at one call: when it began and how many.
#[derive(Debug, Default, Clone, Copy)]
pub struct Failing {
    since: Option<Instant>,
    attempts: u32,
}

impl Failing {
    /// Counts a failure; returns the backoff before the next attempt, or
    /// `None` once the run has lasted `limit` (the caller gives up).
    pub fn failed(&mut self, limit: Duration) -> Option<Duration> {
        let since = *self.since.get_or_insert_with(Instant::now);
        self.attempts += 1;
        (since.elapsed() < limit).then(|| backoff(self.attempts, RETRY_BACKOFF, RETRY_BACKOFF_MAX))
    }

    /// An attempt succeeded: the next failure starts a new run.
    pub fn succeeded(&mut self) {
        *self = Failing::default();
    }
}

/// A future that is ready once `duration` has passed.
pub fn sleep(duration: Duration) -> Sleep {
    Sleep {
        deadline: Instant::now() + duration,
    }
}

/// See [`sleep`].
#[derive(Debug)]
pub struct Sleep {
    deadline: Instant,
}

impl Future for Sleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if Instant::now() >= self.deadline {
            return Poll::Ready(());
        }
        // Registered at every poll, so the newest waker is woken (a task
        // moved between threads has another); an older entry wakes a task
        // that then finds itself early and waits again. Entries leave at
        // their deadline, so they stay few. Without a timer thread (it
        // could not start) the task is polled again at once: a busy wait,
        // never a hang.
        match timer() {
            Some(t) => t.add(self.deadline, cx.waker().clone()),
            None => cx.waker().wake_by_ref(),
        }
        Poll::Pending
    }
}

/// The deadlines of every [`Sleep`] in the process, and the thread that
/// wakes them.
struct Timer {
    due: Mutex<Vec<(Instant, Waker)>>,
    changed: Condvar,
}

/// The process's timer, started on first use; `None` if its thread could
/// not start.
fn timer() -> Option<&'static Timer> {
    static TIMER: OnceLock<Option<&'static Timer>> = OnceLock::new();
    *TIMER.get_or_init(|| {
        let t: &'static Timer = Box::leak(Box::new(Timer {
            due: Mutex::new(Vec::new()),
            changed: Condvar::new(),
        }));
        std::thread::Builder::new()
            .name("strand-client timer".into())
            .spawn(move || t.run())
            .ok()
            .map(|_| t)
    })
}

impl Timer {
    fn add(&self, deadline: Instant, waker: Waker) {
        let mut due = self.due.lock().unwrap_or_else(|p| p.into_inner());
        let earliest = due.iter().all(|(d, _)| deadline < *d);
        due.push((deadline, waker));
        drop(due);
        if earliest {
            self.changed.notify_one();
        }
    }

    fn run(&self) {
        let mut due = self.due.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            let now = Instant::now();
            let (ready, waiting): (Vec<_>, Vec<_>) = due.drain(..).partition(|(d, _)| *d <= now);
            *due = waiting;
            if ready.is_empty() {
                let next = due.iter().map(|(d, _)| *d).min();
                let wait = next.map_or(Duration::from_secs(3600), |n| n.saturating_duration_since(now));
                due = self
                    .changed
                    .wait_timeout(due, wait)
                    .map_or_else(|p| p.into_inner().0, |r| r.0);
                continue;
            }
            // Outside the lock: a woken task may sleep again at once.
            drop(due);
            for (_, w) in ready {
                w.wake();
            }
            due = self.due.lock().unwrap_or_else(|p| p.into_inner());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_its_maximum() {
        let (base, max) = (Duration::from_millis(50), Duration::from_secs(1));
        let waits: Vec<u128> = (1..=7).map(|a| backoff(a, base, max).as_millis()).collect();
        assert_eq!(waits, [50, 100, 200, 400, 800, 1000, 1000]);
        assert_eq!(backoff(0, base, max), base);
        assert_eq!(backoff(u32::MAX, base, max), max);
    }

    #[test]
    fn a_failing_run_gives_up_at_its_limit_and_starts_over_after_a_success() {
        let mut f = Failing::default();
        assert_eq!(f.failed(Duration::from_secs(60)), Some(RETRY_BACKOFF));
        assert_eq!(f.failed(Duration::from_secs(60)), Some(RETRY_BACKOFF * 2));
        assert_eq!(f.failed(Duration::ZERO), None);
        f.succeeded();
        assert_eq!(f.failed(Duration::from_secs(60)), Some(RETRY_BACKOFF));
    }

    #[test]
    fn only_a_moving_cluster_or_a_broken_connection_is_retried() {
        let io = ClientError::Io {
            addr: "a:1".into(),
            message: "reset".into(),
        };
        assert!(retriable(&io));
        assert!(retriable(&ClientError::broker(ErrorCode::NotLeader, "")));
        assert!(retriable(&ClientError::broker(ErrorCode::BrokerUnavailable, "")));
        assert!(!retriable(&ClientError::broker(ErrorCode::UnknownQueue, "")));
        assert!(!retriable(&ClientError::broker(ErrorCode::OffsetOutOfRange, "")));
        assert!(!retriable(&ClientError::Invalid("x".into())));
    }

    #[test]
    fn sleeps_end_after_their_time_in_deadline_order() {
        let start = Instant::now();
        crate::block_on(sleep(Duration::from_millis(30)));
        assert!(start.elapsed() >= Duration::from_millis(30));
        // Many sleepers on threads of their own each wake, none early.
        let threads: Vec<_> = (0..8u64)
            .map(|i| {
                std::thread::spawn(move || {
                    let t = Instant::now();
                    let d = Duration::from_millis(10 * (8 - i));
                    crate::block_on(sleep(d));
                    t.elapsed() >= d
                })
            })
            .collect();
        for t in threads {
            assert!(t.join().unwrap());
        }
        // A sleep already over is ready at once.
        crate::block_on(sleep(Duration::ZERO));
    }
}
