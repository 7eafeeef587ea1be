//! A socket read or write bounded by the connection's idle timeout, and what it came back
//! with: the one way a connection's I/O waits, whether it carries requests or a large value.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use super::ctx::ShardCtx;
use super::shared::unix_now;

/// Counts a connection closed for idling past `--idle-timeout`, with a debug line (at most one
/// per second per shard).
pub(crate) fn idle_closed(ctx: &ShardCtx) {
    ctx.counters.borrow_mut().idle_closed += 1;
    if let Some(held_back) = ctx.idle_log.allow(unix_now()) {
        tracing::debug!(
            shard = ctx.id,
            held_back,
            "connection closed: idle past --idle-timeout"
        );
    }
}

/// What a read or a write came back with.
pub(crate) enum Io {
    Done(usize),
    /// The peer left, the socket failed, or the server stops (`shard::shut_connections` shut
    /// the socket down).
    Closed,
    TimedOut,
}

impl Io {
    /// The outcome as an I/O result, for a path that ends the connection on anything but
    /// progress: a timeout is counted ([`idle_closed`]) and is `TimedOut`, a close
    /// `UnexpectedEof`.
    pub(crate) fn into_result(self, ctx: &ShardCtx) -> std::io::Result<usize> {
        match self {
            Io::Done(n) => Ok(n),
            Io::TimedOut => {
                idle_closed(ctx);
                Err(std::io::ErrorKind::TimedOut.into())
            }
            Io::Closed => Err(std::io::ErrorKind::UnexpectedEof.into()),
        }
    }
}

/// Runs one socket read or write, bounded by the idle timeout. Shutdown needs no waiter here:
/// it shuts the socket down, which ends the read or fails the write.
pub(crate) fn with_limits<F>(idle: Option<Duration>, io: F) -> WithLimits<F>
where
    F: Future<Output = std::io::Result<usize>>,
{
    WithLimits {
        io,
        timer: idle.map(glommio::timer::Timer::new),
    }
}

pin_project_lite::pin_project! {
    /// [`with_limits`]'s future. Polled by hand, not through `glommio::timer::timeout` or an
    /// `async fn`: a connection's task holds two of these at its read (the read, and the last
    /// replies' send), and each nested `async fn` kept another copy of the I/O future, 5 KiB
    /// in all per connection.
    pub(crate) struct WithLimits<F> {
        #[pin]
        io: F,
        timer: Option<glommio::timer::Timer>,
    }
}

impl<F> Future for WithLimits<F>
where
    F: Future<Output = std::io::Result<usize>>,
{
    type Output = Io;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Io> {
        let this = self.project();
        if let Poll::Ready(done) = this.io.poll(cx) {
            return Poll::Ready(match done {
                Ok(0) | Err(_) => Io::Closed,
                Ok(n) => Io::Done(n),
            });
        }
        match this.timer.as_mut().map(|timer| Pin::new(timer).poll(cx)) {
            Some(Poll::Ready(_)) => Poll::Ready(Io::TimedOut),
            _ => Poll::Pending,
        }
    }
}
