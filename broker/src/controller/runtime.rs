//! openraft's `AsyncRuntime` on glommio: openraft spawns its tasks, sleeps
//! and timeouts through this, on the executor of shard 0.
//!
//! - `spawn` = `glommio::spawn_local(..).detach()`: the handle resolves when
//!   the task ends and dropping it does not cancel the task (openraft drops
//!   many handles).
//! - sleeps and timeouts are glommio timers; instants are
//!   `tokio::time::Instant` (plain `std` time, no tokio runtime involved);
//!   oneshots are tokio's `sync` channels, which need no runtime either.
//! - glommio does not catch task panics (they unwind the shard's thread), so
//!   `is_panic` is never true.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use openraft::async_runtime::TokioOneShotSender;
use openraft::AsyncRuntime;

#[derive(Debug, Default, PartialEq, Eq, Clone, Copy)]
pub struct GlommioRuntime;

/// A spawned task that ended without a value (it was cancelled).
#[derive(Debug)]
pub struct TaskGone;

impl std::fmt::Display for TaskGone {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("task ended without a result")
    }
}

pub struct JoinHandle<T>(glommio::task::JoinHandle<T>);

impl<T> Future for JoinHandle<T> {
    type Output = Result<T, TaskGone>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.0).poll(cx).map(|o| o.ok_or(TaskGone))
    }
}

pub struct Sleep(glommio::timer::Timer);

impl Future for Sleep {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        Pin::new(&mut self.0).poll(cx).map(|_| ())
    }
}

#[derive(Debug)]
pub struct Elapsed;

impl std::fmt::Display for Elapsed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("deadline elapsed")
    }
}

/// A future with a deadline: the future first, then the timer.
pub struct Timeout<F> {
    future: Pin<Box<F>>,
    timer: glommio::timer::Timer,
}

impl<F: Future> Future for Timeout<F> {
    type Output = Result<F::Output, Elapsed>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if let Poll::Ready(v) = self.future.as_mut().poll(cx) {
            return Poll::Ready(Ok(v));
        }
        Pin::new(&mut self.timer).poll(cx).map(|_| Err(Elapsed))
    }
}

fn until(deadline: tokio::time::Instant) -> Duration {
    deadline.saturating_duration_since(tokio::time::Instant::now())
}

impl AsyncRuntime for GlommioRuntime {
    type JoinError = TaskGone;
    type JoinHandle<T: 'static> = JoinHandle<T>;
    type Sleep = Sleep;
    type Instant = tokio::time::Instant;
    type TimeoutError = Elapsed;
    type Timeout<R, T: Future<Output = R>> = Timeout<T>;
    type ThreadLocalRng = rand::rngs::ThreadRng;
    type OneshotSender<T> = TokioOneShotSender<T>;
    type OneshotReceiverError = tokio::sync::oneshot::error::RecvError;
    type OneshotReceiver<T> = tokio::sync::oneshot::Receiver<T>;

    fn spawn<T>(future: T) -> Self::JoinHandle<T::Output>
    where
        T: Future + 'static,
        T::Output: 'static,
    {
        JoinHandle(glommio::spawn_local(future).detach())
    }

    fn sleep(duration: Duration) -> Self::Sleep {
        Sleep(glommio::timer::Timer::new(duration))
    }

    fn sleep_until(deadline: Self::Instant) -> Self::Sleep {
        Sleep(glommio::timer::Timer::new(until(deadline)))
    }

    fn timeout<R, F: Future<Output = R>>(duration: Duration, future: F) -> Self::Timeout<R, F> {
        Timeout {
            future: Box::pin(future),
            timer: glommio::timer::Timer::new(duration),
        }
    }

    fn timeout_at<R, F: Future<Output = R>>(deadline: Self::Instant, future: F) -> Self::Timeout<R, F> {
        Self::timeout(until(deadline), future)
    }

    fn is_panic(_: &Self::JoinError) -> bool {
        false
    }

    fn thread_rng() -> Self::ThreadLocalRng {
        rand::thread_rng()
    }

    fn oneshot<T>() -> (Self::OneshotSender<T>, Self::OneshotReceiver<T>) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        (TokioOneShotSender(tx), rx)
    }
}
