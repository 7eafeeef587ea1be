//! The connection's side of a streamed value, the only place a large value meets the socket:
//! a large SET's body read from the connection's buffer, then its socket, under
//! `--idle-timeout` and `--body-timeout` ([`SocketBody`], the executor's `ValueSource`), and a
//! large GET's reply written to the socket under `--idle-timeout` ([`SocketReply`], its
//! `ValueSink`). `exec/large.rs` moves the bytes between these and the segments.

use std::io;
use std::time::{Duration, Instant};

use glommio::net::TcpStream;

use crate::lent::Lent;
use crate::server::exec::large::{ValueSink, ValueSource};
use crate::server::shard::ctx::ShardCtx;
use crate::server::shard::limits::{with_limits, Io};
use crate::server::shard::shared::unix_now;
use crate::server::shard::wire::Wire;

/// The least a large SET's body must bring within each `--body-timeout` window (or the rest of
/// the body, if less): a body that brings less is dropped as stalled. One byte every few
/// seconds would otherwise hold its whole value's segment space for ever; 64 KiB a window is
/// 2 KiB/s at the default 30 s, far below any working link.
pub const BODY_PROGRESS_MIN_BYTES: u64 = 64 << 10;

/// Bytes a skipped body is read in at a time.
const SKIP_CHUNK_BYTES: usize = 64 << 10;

/// One bounded socket read or write; anything but progress is an error that ends the
/// connection (a timeout is counted).
async fn step<F>(ctx: &ShardCtx, idle: Option<Duration>, io: F) -> io::Result<usize>
where
    F: std::future::Future<Output = io::Result<usize>>,
{
    with_limits(idle, io).await.into_result(ctx)
}

/// The limits on a large SET's body: `--idle-timeout` bounds each read, and `--body-timeout`
/// each window in which the body must bring [`BODY_PROGRESS_MIN_BYTES`] (a window starts when
/// the body does and again each time the minimum is reached).
#[derive(Clone, Copy, Debug)]
struct BodyLimit {
    idle: Option<Duration>,
    body: Option<Duration>,
    /// When the current window ends, and the bytes it has brought so far.
    window_end: Option<Instant>,
    window_bytes: u64,
}

impl BodyLimit {
    fn new(ctx: &ShardCtx, idle: Option<Duration>) -> BodyLimit {
        let body = match ctx.shared.settings.body_timeout_seconds {
            0 => None,
            seconds => Some(Duration::from_secs(seconds)),
        };
        BodyLimit {
            idle,
            body,
            window_end: body.map(|body| Instant::now() + body),
            window_bytes: 0,
        }
    }

    /// The next read's wait, and whether it is the body window's (else the idle timeout's,
    /// which wins when shorter).
    fn wait(&self) -> (Option<Duration>, bool) {
        let window_left = self
            .window_end
            .map(|end| end.saturating_duration_since(Instant::now()));
        match (self.idle, window_left) {
            (Some(idle), Some(left)) if idle < left => (Some(idle), false),
            (idle, None) => (idle, false),
            (_, Some(left)) => (Some(left), true),
        }
    }

    /// A read brought `bytes`: once the window has its minimum, the next window starts.
    fn progress(&mut self, bytes: usize) {
        self.window_bytes += bytes as u64;
        if let Some(body) = self.body {
            if self.window_bytes >= BODY_PROGRESS_MIN_BYTES {
                self.window_end = Some(Instant::now() + body);
                self.window_bytes = 0;
            }
        }
    }
}

/// A large value's body on its way in: what the connection had buffered after the command,
/// then the socket. `frame_bytes` follow the value and belong to it (text's `\r\n`).
pub struct SocketBody<'c> {
    ctx: &'c ShardCtx,
    stream: &'c mut TcpStream,
    wire: &'c Wire,
    limit: BodyLimit,
    buffered: &'c [u8],
    /// Buffered bytes taken so far (the connection consumes them after).
    used: usize,
    /// Value bytes not read yet.
    value_left: u64,
    frame_bytes: usize,
}

impl<'c> SocketBody<'c> {
    pub fn new(
        ctx: &'c ShardCtx,
        (stream, wire): (&'c mut TcpStream, &'c Wire),
        idle: Option<Duration>,
        buffered: &'c [u8],
        (value_len, frame_bytes): (u64, usize),
    ) -> SocketBody<'c> {
        SocketBody {
            ctx,
            stream,
            wire,
            limit: BodyLimit::new(ctx, idle),
            buffered,
            used: 0,
            value_left: value_len,
            frame_bytes,
        }
    }

    /// How many of the connection's buffered bytes the body took.
    pub fn used(&self) -> usize {
        self.used
    }

    /// Fills part of `into` from the buffer, else with one bounded socket read.
    async fn fill(&mut self, into: &mut [u8]) -> io::Result<usize> {
        if self.used < self.buffered.len() {
            let n = (self.buffered.len() - self.used).min(into.len());
            into[..n].copy_from_slice(&self.buffered[self.used..self.used + n]);
            self.used += n;
            return Ok(n);
        }
        self.body_step(into).await
    }

    /// One bounded read of the body from the socket. A body that brings less than
    /// [`BODY_PROGRESS_MIN_BYTES`] within a `--body-timeout` window ends the connection (and
    /// so the SET: its extents go back), counted and logged.
    async fn body_step(&mut self, into: &mut [u8]) -> io::Result<usize> {
        let (wait, body_window) = self.limit.wait();
        let ctx = self.ctx;
        match with_limits(wait, self.wire.read_into(self.stream, into)).await {
            Io::Done(n) => {
                self.limit.progress(n);
                Ok(n)
            }
            Io::TimedOut if body_window => {
                ctx.counters.borrow_mut().body_timeouts += 1;
                let seconds = ctx.shared.settings.body_timeout_seconds;
                let brought = self.limit.window_bytes;
                if let Some(held_back) = ctx.body_timeout_log.allow(unix_now()) {
                    tracing::warn!(
                        shard = ctx.id,
                        held_back,
                        "a large SET's body brought {brought} bytes in --body-timeout ({seconds} \
                         s), less than the {BODY_PROGRESS_MIN_BYTES} required: the value is \
                         dropped, its segment space returned and the connection closed (one line \
                         per second per shard at most)"
                    );
                }
                Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "the body brought {brought} bytes in --body-timeout ({seconds} s), less \
                         than {BODY_PROGRESS_MIN_BYTES}"
                    ),
                ))
            }
            other => other.into_result(ctx),
        }
    }
}

impl ValueSource for SocketBody<'_> {
    async fn read(&mut self, into: &mut [u8]) -> io::Result<usize> {
        let want = (self.value_left as usize).min(into.len());
        if want == 0 {
            return Ok(0);
        }
        let n = self.fill(&mut into[..want]).await?;
        self.value_left -= n as u64;
        Ok(n)
    }

    async fn end(&mut self) -> io::Result<bool> {
        debug_assert_eq!(self.value_left, 0, "the value is read before its end");
        debug_assert!(
            matches!(self.frame_bytes, 0 | 2),
            "text's `\\r\\n`, or nothing"
        );
        let mut frame = [0u8; 2];
        let want = self.frame_bytes.min(frame.len());
        let mut filled = 0;
        while filled < want {
            filled += self.fill(&mut frame[filled..want]).await?;
        }
        self.frame_bytes = 0;
        Ok(want == 0 || frame == *b"\r\n")
    }

    async fn skip_rest(&mut self) -> io::Result<()> {
        let mut left = self.value_left + self.frame_bytes as u64;
        self.value_left = 0;
        self.frame_bytes = 0;
        let mut sink = vec![0u8; SKIP_CHUNK_BYTES.min(left as usize)];
        while left > 0 {
            let want = (left as usize).min(sink.len());
            left -= self.fill(&mut sink[..want]).await? as u64;
        }
        Ok(())
    }
}

/// A large GET's reply on its way out: every write bounded by `--idle-timeout`.
pub struct SocketReply<'c> {
    ctx: &'c ShardCtx,
    stream: &'c mut TcpStream,
    wire: &'c Wire,
    idle: Option<Duration>,
}

impl<'c> SocketReply<'c> {
    pub fn new(
        ctx: &'c ShardCtx,
        (stream, wire): (&'c mut TcpStream, &'c Wire),
        idle: Option<Duration>,
    ) -> SocketReply<'c> {
        SocketReply {
            ctx,
            stream,
            wire,
            idle,
        }
    }
}

impl ValueSink for SocketReply<'_> {
    async fn write(&mut self, bytes: Vec<u8>) -> io::Result<Vec<u8>> {
        let (wire, stream) = (self.wire, &mut *self.stream);
        let mut back = None;
        step(self.ctx, self.idle, async {
            let sent = wire.write(stream, bytes).await?;
            let n = sent.len().max(1);
            back = Some(sent);
            Ok(n)
        })
        .await?;
        Ok(back.unwrap_or_default())
    }

    async fn write_lent(&mut self, lent: Lent) -> io::Result<()> {
        let len = lent.len().max(1);
        let (wire, stream) = (self.wire, &mut *self.stream);
        step(self.ctx, self.idle, async {
            wire.write_lent(stream, lent).await.map(|()| len)
        })
        .await
        .map(drop)
    }

    async fn write_head_and_lent(&mut self, head: Vec<u8>, lent: Lent) -> io::Result<()> {
        let len = head.len() + lent.len();
        let (wire, stream) = (self.wire, &mut *self.stream);
        step(self.ctx, self.idle, async {
            wire.write_head_and_lent(stream, head, lent)
                .await
                .map(|()| len.max(1))
        })
        .await
        .map(drop)
    }
}
