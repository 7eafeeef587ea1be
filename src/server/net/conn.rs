//! One client connection's shell: the bytes received and how far they are processed, the
//! replies composed for them, and what the connection does next. It knows no protocol: the
//! codecs (`binary.rs`, `text.rs`) take commands out of its buffer and put replies into its
//! [`Replies`]; `serve.rs` moves the bytes between it and the socket.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::large_reply::LargeReply;
use super::lookahead::{Framing, Lookahead};
use crate::server::exec::large::LargeSet;
use crate::server::exec::replies::Replies;
use crate::server::shard::auth_gate::{
    AuthGate, Source, AUTH_SOURCE_FAILURES_PER_SECOND, AUTH_SOURCE_FAILURE_BURST,
};
use crate::server::shard::ctx::ShardCtx;
use crate::server::shard::latency::BatchCounts;
use crate::server::shard::shared::unix_now;
use crate::store::partition::Partitions;

/// Geometric growth of a read buffer stops here: the longest text line accepted (a multiget
/// line of `MULTIGET_LINE_MAX_BYTES`, newline included) fits, so doubling past it would only
/// waste memory (4 MiB a connection). A frame or value block that needs more gets exactly
/// what it needs.
pub(crate) const READ_BUFFER_GROWTH_MAX_BYTES: usize =
    crate::proto::text::MULTIGET_LINE_MAX_BYTES + 1;

/// The size a read buffer of `len` bytes grows to so that it holds `needed`: at least twice
/// its size (a frame arriving in pieces costs a few reads, not one per byte), but doubling
/// stops at [`READ_BUFFER_GROWTH_MAX_BYTES`]; `needed` is always given.
pub(crate) fn grown_buffer_len(len: usize, needed: usize) -> usize {
    needed.max(len.saturating_mul(2).min(READ_BUFFER_GROWTH_MAX_BYTES))
}

/// What the connection does after writing its replies.
pub(crate) enum After {
    /// Every whole frame is done: read more.
    Read,
    /// Stopped at the output cap with whole frames still buffered: write, then process again.
    Process,
    /// A large value follows in the stream: receive it, then process again.
    LargeSet(LargeSet, LargeReply),
    /// `watch`: the connection streams log lines from now on.
    Watch(std::sync::Arc<crate::server::shard::watch::Watcher>),
    /// Close after the replies: a protocol error.
    Close,
    /// Close after the replies: the client asked (QUIT).
    Quit,
}

pub(crate) struct Conn {
    /// Received bytes: one of the shard's read buffers while any wait to be processed, empty
    /// (no allocation) while the connection is idle.
    pub(crate) buf: Vec<u8>,
    /// Where `buf` comes from and goes back to.
    pub(crate) read_buffers: std::rc::Rc<crate::buffer_cache::BufferCache>,
    /// Bytes of `buf` holding received data, and how many of those are processed.
    pub(crate) filled: usize,
    pub(crate) consumed: usize,
    /// Text: where the search for the unfinished line at `buf[consumed..]` resumes, relative
    /// to `consumed` (moved by [`Conn::consume`]), and the bytes it examined not yet added to
    /// the shard's counters. The decoder fuzz drives the same type the same way.
    pub(crate) line_scan: crate::proto::LineScan,
    /// Passes that ended inside an unfinished line, not yet added to the shard's counters.
    pub(crate) line_incomplete_reads: u64,
    /// Prefetching for the received frames not yet run.
    pub(crate) lookahead: Lookahead,
    /// Stream bytes still to discard (the rest of a rejected or too-large frame).
    pub(crate) skip: u64,
    /// The pass's replies, and the values sent in place among them.
    pub(crate) replies: Replies,
    /// SASL done, or not required (`--sasl-password-file` unset).
    pub(crate) authenticated: bool,
    /// Failed authentications so far (`auth::after_failure`).
    pub(crate) auth_failures: u32,
    /// How its requests are framed: unknown until the first byte arrives.
    pub(crate) framing: Option<Framing>,
    /// Requests run since the last replies were handed to the kernel, by kind (latency).
    pub(crate) batch: BatchCounts,
    /// What STAT `conns` shows of the connection; its client's address names it in log lines.
    pub(crate) info: std::rc::Rc<crate::server::shard::ctx::ConnInfo>,
    /// The socket, as `watch` lines and `stats conns` name the connection.
    pub(crate) fd: i32,
}

/// An admitted connection, counted until its task ends (however it ends).
pub(crate) struct Admitted(std::rc::Rc<ShardCtx>);

impl Admitted {
    /// Counts a connection `ctx` serves (its `live_connections`), until dropped; it is in
    /// `connections_by_shard` and `curr_connections` already.
    pub(crate) fn new(ctx: &std::rc::Rc<ShardCtx>) -> Admitted {
        ctx.live_connections.set(ctx.live_connections.get() + 1);
        Admitted(std::rc::Rc::clone(ctx))
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let ctx = &self.0;
        ctx.live_connections.set(ctx.live_connections.get() - 1);
        let shared = &ctx.shared;
        shared.connections_by_shard[ctx.id].fetch_sub(1, Ordering::AcqRel);
        shared.curr_connections.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Runs one authentication attempt from the client at `peer` within its source's budget
/// (`auth_gate.rs`): holds it, right password or wrong, until the source has a token (saying
/// nothing to the client meanwhile), runs `attempt`, and gives the token back when
/// `accepted` says its outcome authenticated. `None`: the server stops or the client closes its
/// end (`fd`) while the attempt is held, and the connection closes without an answer.
pub(crate) async fn within_auth_budget<T>(
    ctx: &ShardCtx,
    (peer, fd): (&str, i32),
    attempt: impl FnOnce() -> T,
    accepted: impl FnOnce(&T) -> bool,
) -> Option<T> {
    let source = Source::of_peer(peer);
    let gate = &ctx.shared.auth_gate;
    let mut held: Option<Held<'_>> = None;
    let token = loop {
        let taken = gate.try_take(source, Instant::now());
        let wait = match taken {
            Ok(token) => break Some(token),
            Err(wait) => wait,
        };
        if held.is_none() {
            gate.hold(source, Instant::now());
            held = Some(Held { gate, source });
            ctx.counters.borrow_mut().auth_held += 1;
            log_held_sources(ctx);
        }
        // The server stops, or the client gave up (nothing to tell it, and its connection
        // must not keep a slot of `--max-connections` until a token comes).
        if ctx.shared.stop.load(Ordering::Acquire) || peer_gone(fd) {
            break None;
        }
        // Rechecked at least this often, for the stop.
        glommio::timer::sleep(wait.min(AUTH_HOLD_RECHECK)).await;
    };
    drop(held);
    let token = token?;
    let outcome = attempt();
    if accepted(&outcome) {
        gate.succeeded(token);
    } else {
        gate.failed(token);
    }
    Some(outcome)
}

/// Whether the client at the far end of `fd` has closed or reset its connection (looked at
/// without taking any byte it sent: bytes it sent and nobody read hide a close behind them).
pub(crate) fn peer_gone(fd: i32) -> bool {
    use nix::errno::Errno;
    use nix::sys::socket::{recv, MsgFlags};
    let mut byte = [0u8; 1];
    match recv(fd, &mut byte, MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT) {
        Ok(0) => true,
        Ok(_) | Err(Errno::EAGAIN) | Err(Errno::EINTR) => false,
        Err(_) => true,
    }
}

/// An attempt counted as held (`AuthGate::hold`): released when dropped, so a connection
/// dropped mid-wait (its task cancelled at the stop) still gives its place back.
struct Held<'a> {
    gate: &'a AuthGate,
    source: Source,
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.gate.released(self.source);
    }
}

/// How often a held authentication looks again at the stop, at the longest.
const AUTH_HOLD_RECHECK: Duration = Duration::from_millis(250);

/// Says which sources have attempts held: one line per second per shard at most.
fn log_held_sources(ctx: &ShardCtx) {
    let Some(held_back) = ctx.auth_log.allow(unix_now()) else {
        return;
    };
    let (sources, count) = ctx.shared.auth_gate.held_sources(Instant::now(), 8);
    let shown: Vec<String> = sources.iter().map(ToString::to_string).collect();
    tracing::warn!(
        shard = ctx.id,
        held_back,
        sources = count,
        "SASL attempts held: these sources spent their failure budget ({} failures at once, \
         then {} a second): {} (one line per second per shard at most)",
        AUTH_SOURCE_FAILURE_BURST,
        AUTH_SOURCE_FAILURES_PER_SECOND,
        shown.join(", ")
    );
}

/// Logs a protocol error a peer caused: one line per second per shard at most, so a flood
/// cannot fill the disk (the STAT counters count every one).
pub(crate) fn log_peer_error(ctx: &ShardCtx, peer: &str, what: &str, closed: bool) {
    if let Some(held_back) = ctx.peer_error_log.allow(unix_now()) {
        tracing::info!(
            shard = ctx.id,
            peer,
            held_back,
            closed,
            "protocol error from a client: {what} (one line per second per shard at most)"
        );
    }
}

impl Conn {
    /// Shows STAT `conn_bytes` the buffers this connection holds now.
    pub(crate) fn count_buffers_held(&self) {
        self.info
            .buffers_held
            .set((self.buf.capacity(), self.replies.out.capacity()));
    }

    /// The client's address, for log lines.
    pub(crate) fn peer(&self) -> &str {
        &self.info.endpoint.peer
    }

    /// Marks `bytes` more of the buffer processed; the line search's resume point, relative to
    /// the buffer's front, moves with it.
    pub(crate) fn consume(&mut self, bytes: usize) {
        self.consumed += bytes;
        self.line_scan.consumed(bytes);
    }

    /// Drops buffered bytes still to be skipped; false while more are to come.
    pub(crate) fn skip_buffered(&mut self) -> bool {
        if self.skip > 0 {
            let drop = (self.skip as usize).min(self.filled - self.consumed);
            self.consume(drop);
            self.skip -= drop as u64;
        }
        self.skip == 0
    }

    /// Skips `skip` bytes of the stream from the current command's start: what is buffered
    /// now, the rest as it arrives.
    pub(crate) fn skip_stream(&mut self, skip: u64) {
        let available = (self.filled - self.consumed) as u64;
        let now_dropped = skip.min(available);
        self.consume(now_dropped as usize);
        self.skip += skip - now_dropped;
    }

    /// What STAT `conns` shows while the connection waits for bytes, as memcached names it:
    /// discarding the rest of a refused request (`conn_swallow`), in the middle of a request
    /// whose command is in (its value still coming: `conn_nread`), or between requests
    /// (`conn_waiting`).
    pub(crate) fn waiting_state(&self) -> &'static str {
        let buffered = &self.buf[self.consumed..self.filled];
        let command_in = match self.framing {
            Some(Framing::Binary) => buffered.len() >= crate::proto::HEADER_BYTES,
            // Where the last search for the line's end stopped (after a pass, that is the
            // buffer's end when no line is in, or the `\n` itself): nothing is searched twice.
            Some(Framing::Text) => {
                let from = (self.consumed + self.line_scan.newline_free).min(self.filled);
                memchr::memchr(b'\n', &self.buf[from..self.filled]).is_some()
            }
            None => false,
        };
        if self.skip > 0 {
            "conn_swallow"
        } else if command_in {
            "conn_nread"
        } else {
            "conn_waiting"
        }
    }

    /// Makes the buffer able to hold a frame of `needed` bytes from `consumed`.
    /// The buffer grows geometrically ([`grown_buffer_len`]), so a frame or line that arrives
    /// in many pieces costs a few reads of growing size, not a read per byte.
    pub(crate) fn make_room(&mut self, needed: usize) {
        self.lookahead.reset();
        if self.buf.is_empty() {
            self.buf = self.read_buffers.take();
        }
        if self.consumed > 0 {
            self.buf.copy_within(self.consumed..self.filled, 0);
            self.filled -= self.consumed;
            self.consumed = 0;
        }
        if self.buf.len() < needed {
            self.buf.resize(grown_buffer_len(self.buf.len(), needed), 0);
        }
    }

    /// Before a codec takes the next request: `Read` while the rest of a refused request is
    /// still to be skipped, `Process` when the replies are full (write them first); otherwise
    /// nothing, after looking ahead from here ([`Lookahead::before_frame`]).
    pub(crate) fn before_next(&mut self, partitions: &Partitions) -> Option<After> {
        if !self.skip_buffered() {
            return Some(After::Read);
        }
        if self.replies.full() {
            return Some(After::Process);
        }
        if let Some(framing) = self.framing {
            let buffered = &self.buf[..self.filled];
            self.lookahead
                .before_frame(partitions, framing, buffered, self.consumed);
        }
        None
    }

    /// Runs the policy after a failed authentication (`auth::after_failure`): whether the
    /// connection must now close.
    pub(crate) async fn authentication_failed(&mut self, ctx: &ShardCtx) -> bool {
        crate::server::shard::auth::after_failure(&ctx.counters, &mut self.auth_failures).await
    }

    /// Adds the line-scan counts gathered since the last call to the shard's counters.
    pub(crate) fn count_line_scans(&mut self, ctx: &ShardCtx) {
        let mut counters = ctx.counters.borrow_mut();
        counters.read_buffer_max_bytes = counters.read_buffer_max_bytes.max(self.buf.len() as u64);
        if self.line_scan.bytes_examined == 0 && self.line_incomplete_reads == 0 {
            return;
        }
        counters.line_scan_bytes += std::mem::take(&mut self.line_scan.bytes_examined);
        counters.line_incomplete_reads += std::mem::take(&mut self.line_incomplete_reads);
    }

    /// Forgets processed bytes. With none left the read buffer goes back to the shard's cache
    /// (grown or not: a grown one goes on to the allocator), so an idle connection holds none;
    /// a full buffer makes room for more of its unfinished frame.
    pub(crate) fn settle(&mut self) {
        if self.consumed == self.filled {
            self.lookahead.release();
            self.consumed = 0;
            self.filled = 0;
            if !self.buf.is_empty() {
                self.read_buffers.give(std::mem::take(&mut self.buf));
            }
        } else if self.filled == self.buf.len() {
            self.make_room(self.filled - self.consumed + 1);
        }
    }
}

impl Drop for Conn {
    /// A connection that ends gives its read buffer back (it is counted as lent until then).
    fn drop(&mut self) {
        if !self.buf.is_empty() {
            self.read_buffers.give(std::mem::take(&mut self.buf));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffer_growth_doubles_up_to_the_longest_line_and_gives_what_is_needed() {
        assert_eq!(grown_buffer_len(16 << 10, (16 << 10) + 1), 32 << 10);
        // A small value block's exact size: doubling from it stops at the longest line.
        assert_eq!(grown_buffer_len(40_024, 40_025), 80_048);
        assert_eq!(
            grown_buffer_len(1_280_768, 1_280_769),
            READ_BUFFER_GROWTH_MAX_BYTES
        );
        assert_eq!(
            grown_buffer_len(
                READ_BUFFER_GROWTH_MAX_BYTES - 1,
                READ_BUFFER_GROWTH_MAX_BYTES
            ),
            READ_BUFFER_GROWTH_MAX_BYTES
        );
        // A frame that needs more than the cap gets exactly what it needs.
        assert_eq!(grown_buffer_len(2 << 20, (3 << 20) + 7), (3 << 20) + 7);
        assert_eq!(grown_buffer_len(16 << 10, 5 << 20), 5 << 20);
    }
}
