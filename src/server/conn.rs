//! One client connection: read bytes, decode frames, run each request on the spot against its
//! key's partition (on this core, under the partition's lock), and write the replies in
//! request order. A GET reads in one direction: socket -> `proto::decode` -> `execute` against
//! the partition -> reply bytes (or a value lent from the arena) -> `Wire` -> socket.
//!
//! The first byte decides the connection's protocol, as in memcached: `0x80` is binary (this
//! module and `execute`), anything else text and meta (`text`, the same store calls).
//!
//! FLUSH and STAT see everything before them and nothing after (they run in order like every
//! other request); a large SET's value is streamed into its segment before the next frame is
//! decoded. See `docs/server.md`.

use std::rc::Rc;
use std::time::Duration;

use futures_lite::AsyncWriteExt;
use glommio::net::TcpStream;

use crate::proto::{decode_streaming, Decoded, FrameError, Request, ResponseWriter, Status};

use super::deferred::Held;
use super::execute::execute_keyed;
use super::large::{self, LargeReply, LargeSet};
use super::latency::{BatchCounts, CommandKind};
use super::limits::{idle_closed, with_limits, Io};
use super::lookahead::{Framing, Lookahead};
use super::replies::Replies;
use super::shard::ConnInfo;
use super::shard::ShardCtx;
use super::stats::write_stats;
use super::unix_now;
use super::wire::Wire;

/// Read buffer a connection starts with (and shrinks back to when idle). A frame or line that
/// needs more doubles it (at least), so a long line takes a few reads of growing size, never
/// one read per byte.
const READ_BUFFER_BYTES: usize = 16 << 10;
/// Geometric growth of a read buffer stops here: the longest text line accepted (a multiget
/// line of `MULTIGET_LINE_MAX_BYTES`, newline included) fits, so doubling past it would only
/// waste memory (4 MiB a connection). A frame or value block that needs more gets exactly
/// what it needs.
pub(super) const READ_BUFFER_GROWTH_MAX_BYTES: usize =
    crate::proto::text::MULTIGET_LINE_MAX_BYTES + 1;

/// The size a read buffer of `len` bytes grows to so that it holds `needed`: at least twice
/// its size (a frame arriving in pieces costs a few reads, not one per byte), but doubling
/// stops at [`READ_BUFFER_GROWTH_MAX_BYTES`]; `needed` is always given.
pub(super) fn grown_buffer_len(len: usize, needed: usize) -> usize {
    needed.max(len.saturating_mul(2).min(READ_BUFFER_GROWTH_MAX_BYTES))
}

/// What the connection does after writing its replies.
pub(super) enum After {
    /// Every whole frame is done: read more.
    Read,
    /// Stopped at the output cap with whole frames still buffered: write, then process again.
    Process,
    /// A large value follows in the stream: receive it, then process again.
    LargeSet(LargeSet),
    /// `watch`: the connection streams log lines from now on.
    Watch(std::sync::Arc<super::watch::Watcher>),
    Close,
}

/// The last replies of a pass, sent while the connection waits for its next bytes (ring path;
/// with one-shot receives, queued together with its next receive).
enum Pending {
    /// Reply bytes.
    Bytes(Vec<u8>),
    /// The replies up to a lent value, then the value, sent from where it lies.
    Lent(Vec<u8>, super::deferred::HeldLent),
}

/// The protocol a connection speaks, from its first byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Protocol {
    Binary,
    Text,
}

pub(super) struct Conn {
    pub(super) buf: Vec<u8>,
    /// Bytes of `buf` holding received data, and how many of those are processed.
    pub(super) filled: usize,
    pub(super) consumed: usize,
    /// Text: where the search for the unfinished line at `buf[consumed..]` resumes, relative
    /// to `consumed` (moved by [`Conn::consume`]), and the bytes it examined not yet added to
    /// the shard's counters. The decoder fuzz drives the same type the same way.
    pub(super) line_scan: crate::proto::LineScan,
    /// Passes that ended inside an unfinished line, not yet added to the shard's counters.
    pub(super) line_incomplete_reads: u64,
    /// Prefetching for the received frames not yet run.
    pub(super) lookahead: Lookahead,
    /// Stream bytes still to discard (the rest of a rejected or too-large frame).
    pub(super) skip: u64,
    /// The pass's replies, and the values sent in place among them.
    pub(super) replies: Replies,
    /// SASL done, or not required (`--sasl-password-file` unset).
    pub(super) authenticated: bool,
    /// Failed authentications so far (`auth::after_failure`).
    pub(super) auth_failures: u32,
    /// Unknown until the first byte arrives.
    protocol: Option<Protocol>,
    /// Requests run since the last replies were handed to the kernel, by kind (latency).
    pub(super) batch: BatchCounts,
    /// The client's address, for log lines.
    pub(super) peer: String,
    /// The socket, as `watch` lines and `stats conns` name the connection.
    pub(super) fd: i32,
    /// An `lru_crawler metadump` under way: it goes out a buffer at a time, before the
    /// commands after it.
    pub(super) metadump: Option<super::text::Metadump>,
}

/// The body of the refusal ADMIN gets on a data connection.
const ADMIN_REFUSAL: &str =
    "ADMIN is served only on the admin socket (--admin-socket PATH), not on data connections";

/// What a connection may do before SASL authentication, as memcached allows (its
/// `authenticated()`): anything else is answered `Auth failure.` and the connection closed.
fn allowed_before_auth(request: &Request) -> bool {
    matches!(
        request,
        Request::Version | Request::SaslListMechs | Request::SaslAuth { .. }
    )
}

/// Logs a protocol error a peer caused: one line per second per shard at most, so a flood
/// cannot fill the disk (the STAT counters count every one).
pub(super) fn log_peer_error(ctx: &ShardCtx, peer: &str, what: &str, closed: bool) {
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

fn count(ctx: &ShardCtx, error: FrameError) {
    let mut c = ctx.counters.borrow_mut();
    match error {
        FrameError::BadMagic => c.bad_magic += 1,
        FrameError::BodyTooShort => c.body_too_short += 1,
        FrameError::KeyTooLong => c.key_too_long += 1,
        FrameError::BadShape => c.invalid_frames += 1,
        FrameError::UnknownOpcode => c.unknown_opcodes += 1,
        FrameError::TooLarge => c.too_large_frames += 1,
    }
}

/// Answers a SASL command (updating whether the connection is authenticated): the status and
/// body of its reply.
fn sasl(ctx: &ShardCtx, authenticated: &mut bool, request: &Request) -> (Status, String) {
    use super::auth::{AuthOutcome, MECHANISMS};
    let Some(credentials) = &ctx.shared.credentials else {
        return (
            Status::UnknownCommand,
            Status::UnknownCommand.message().into(),
        );
    };
    let Request::SaslAuth {
        mechanism, data, ..
    } = request
    else {
        return (Status::Ok, MECHANISMS.to_string());
    };
    ctx.counters.borrow_mut().auth_cmds += 1;
    match credentials.authenticate(mechanism, data) {
        AuthOutcome::Authenticated { user } => {
            *authenticated = true;
            tracing::debug!(shard = ctx.id, %user, "SASL: authenticated");
            (Status::Ok, "Authenticated".into())
        }
        outcome => {
            *authenticated = false;
            ctx.counters.borrow_mut().auth_errors += 1;
            if let Some(held_back) = ctx.auth_log.allow(unix_now()) {
                let reason = match outcome {
                    AuthOutcome::UnknownMechanism => "an unknown mechanism".to_string(),
                    AuthOutcome::Refused { user } => format!("user '{user}' refused"),
                    AuthOutcome::Authenticated { .. } => unreachable!(),
                };
                tracing::warn!(
                        shard = ctx.id,
                        held_back,
                        "SASL authentication failed: {reason} (one line per second per shard at most; auth_errors counts every failure)"
                    );
            }
            (Status::AuthError, Status::AuthError.message().into())
        }
    }
}

impl Conn {
    /// Runs every whole command buffered, in the connection's protocol, up to the output cap.
    /// Returns what to do next.
    /// `now`: the time the commands run at, in Unix seconds.
    async fn process(&mut self, ctx: &Rc<ShardCtx>, now: u32) -> After {
        let protocol = match self.protocol {
            Some(protocol) => protocol,
            None => {
                let Some(&first) = self.buf[self.consumed..self.filled].first() else {
                    return After::Read;
                };
                let protocol = if crate::proto::is_binary(first) {
                    Protocol::Binary
                } else {
                    Protocol::Text
                };
                self.protocol = Some(protocol);
                protocol
            }
        };
        match protocol {
            Protocol::Binary => self.process_binary(ctx, now).await,
            Protocol::Text => self.process_text(ctx, now).await,
        }
    }

    /// Marks `bytes` more of the buffer processed; the line search's resume point, relative to
    /// the buffer's front, moves with it.
    pub(super) fn consume(&mut self, bytes: usize) {
        self.consumed += bytes;
        self.line_scan.consumed(bytes);
    }

    /// Drops buffered bytes still to be skipped; false while more are to come.
    pub(super) fn skip_buffered(&mut self) -> bool {
        if self.skip > 0 {
            let drop = (self.skip as usize).min(self.filled - self.consumed);
            self.consume(drop);
            self.skip -= drop as u64;
        }
        self.skip == 0
    }

    /// Skips `skip` bytes of the stream from the current command's start: what is buffered
    /// now, the rest as it arrives.
    pub(super) fn skip_stream(&mut self, skip: u64) {
        let available = (self.filled - self.consumed) as u64;
        let now_dropped = skip.min(available);
        self.consume(now_dropped as usize);
        self.skip += skip - now_dropped;
    }

    /// The binary protocol's [`Conn::process`].
    async fn process_binary(&mut self, ctx: &Rc<ShardCtx>, now: u32) -> After {
        let max_item = ctx.shared.settings.max_item_bytes as usize;
        // Values above ram_head live in segments: they are streamed, never buffered whole.
        let stream_from = ctx.shared.settings.arena.ram_head_bytes as usize;
        let lend_from = ctx.io.lend_from();
        loop {
            if !self.skip_buffered() {
                return After::Read;
            }
            if self.replies.full() {
                return After::Process;
            }
            self.lookahead.before_frame(
                &ctx.shared.partitions,
                Framing::Binary,
                &self.buf[..self.filled],
                self.consumed,
            );
            let frame = &self.buf[self.consumed..self.filled];
            let (request, opcode, opaque, consumed) =
                match decode_streaming(frame, max_item, stream_from) {
                    Decoded::Incomplete { needed } => {
                        self.make_room(needed);
                        return After::Read;
                    }
                    Decoded::Close { error } => {
                        count(ctx, error);
                        log_peer_error(ctx, &self.peer, &format!("binary frame: {error:?}"), true);
                        return After::Close;
                    }
                    Decoded::Reject {
                        opcode,
                        opaque,
                        status,
                        skip,
                        close,
                        error,
                    } => {
                        count(ctx, error);
                        let what = format!("binary frame: {error:?} (opcode {opcode:#04x})");
                        log_peer_error(ctx, &self.peer, &what, close);
                        if !self.authenticated {
                            // Before authentication nothing else is answered (memcached).
                            ResponseWriter::new(&mut self.replies.out).error(
                                opcode,
                                opaque,
                                Status::AuthError,
                            );
                            return After::Close;
                        }
                        ResponseWriter::new(&mut self.replies.out).error(opcode, opaque, status);
                        self.skip_stream(skip);
                        if close {
                            return After::Close;
                        }
                        continue;
                    }
                    Decoded::Request {
                        request,
                        opcode,
                        opaque,
                        consumed,
                        skip_after,
                    } => {
                        self.skip = skip_after;
                        (request, opcode, opaque, consumed)
                    }
                };
            ctx.counters.borrow_mut().commands += 1;
            self.batch.add(CommandKind::of_opcode(opcode));
            if !self.authenticated && !allowed_before_auth(&request) {
                // Refused without running, and the connection closed, as memcached does.
                ResponseWriter::new(&mut self.replies.out).error(opcode, opaque, Status::AuthError);
                self.consume(consumed);
                return After::Close;
            }
            let mut w = ResponseWriter::new(&mut self.replies.out);
            match &request {
                Request::Noop | Request::Version | Request::Verbosity { .. } => {
                    let value: &[u8] = if request == Request::Version {
                        ctx.shared.version.as_bytes()
                    } else {
                        &[]
                    };
                    w.reply(opcode, opaque, Status::Ok, 0, &[], &[], value);
                }
                Request::Quit { quiet } => {
                    if !quiet {
                        w.reply(opcode, opaque, Status::Ok, 0, &[], &[], &[]);
                    }
                    self.consume(consumed);
                    return After::Close;
                }
                Request::Flush { delay, quiet } => {
                    ctx.counters.borrow_mut().cmd_flush += 1;
                    super::flush_all(&ctx.shared, *delay, now);
                    if !quiet {
                        w.reply(opcode, opaque, Status::Ok, 0, &[], &[], &[]);
                    }
                }
                Request::Stat { group } => {
                    let group = group.to_vec();
                    self.consume(consumed);
                    write_stats(ctx, &group, opcode, opaque, &mut self.replies.out).await;
                    continue;
                }
                Request::Admin { .. } => w.reply(
                    opcode,
                    opaque,
                    Status::NotSupported,
                    0,
                    &[],
                    &[],
                    ADMIN_REFUSAL.as_bytes(),
                ),
                Request::SaslListMechs | Request::SaslAuth { .. } => {
                    let (status, body) = sasl(ctx, &mut self.authenticated, &request);
                    ResponseWriter::new(&mut self.replies.out).reply(
                        opcode,
                        opaque,
                        status,
                        0,
                        &[],
                        &[],
                        body.as_bytes(),
                    );
                    if status == Status::AuthError {
                        self.consume(consumed);
                        if super::auth::after_failure(
                            &ctx.auth_failure_budget,
                            &ctx.counters,
                            &mut self.auth_failures,
                        )
                        .await
                        {
                            return After::Close;
                        }
                        continue;
                    }
                }
                Request::LargeStore {
                    mode,
                    key,
                    flags,
                    expiry,
                    cas,
                    quiet,
                    value_len,
                    hints,
                } => {
                    let set = LargeSet {
                        hints: hints.clone(),
                        mode: *mode,
                        key: key.to_vec(),
                        flags: *flags,
                        expiry: *expiry,
                        cas: *cas,
                        value_len: *value_len,
                        reply: LargeReply::Binary {
                            opcode,
                            opaque,
                            quiet: *quiet,
                        },
                    };
                    self.consume(consumed);
                    return After::LargeSet(set);
                }
                keyed => {
                    let key = keyed.key().expect("keyed requests have keys");
                    let (watchers, fd) = (&ctx.shared.watchers, self.fd);
                    self.replies.run_keyed(
                        ctx,
                        key,
                        lend_from,
                        b"",
                        |store, partition, out, lend| {
                            let (request, at) = (keyed, partition);
                            execute_keyed(
                                store, at, request, opcode, opaque, now, out, lend, watchers, fd,
                            )
                        },
                    );
                }
            }
            self.consume(consumed);
        }
    }

    /// What STAT `conns` shows while the connection waits for bytes, as memcached names it:
    /// discarding the rest of a refused request (`conn_swallow`), in the middle of a request
    /// whose command is in (its value still coming: `conn_nread`), or between requests
    /// (`conn_waiting`).
    fn waiting_state(&self) -> &'static str {
        let buffered = &self.buf[self.consumed..self.filled];
        let command_in = match self.protocol {
            Some(Protocol::Binary) => buffered.len() >= crate::proto::HEADER_BYTES,
            // Where the last search for the line's end stopped (after a pass, that is the
            // buffer's end when no line is in, or the `\n` itself): nothing is searched twice.
            Some(Protocol::Text) => {
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
    pub(super) fn make_room(&mut self, needed: usize) {
        self.lookahead.reset();
        if self.consumed > 0 {
            self.buf.copy_within(self.consumed..self.filled, 0);
            self.filled -= self.consumed;
            self.consumed = 0;
        }
        if self.buf.len() < needed {
            self.buf.resize(grown_buffer_len(self.buf.len(), needed), 0);
        }
    }

    /// Adds the line-scan counts gathered since the last call to the shard's counters.
    pub(super) fn count_line_scans(&mut self, ctx: &ShardCtx) {
        let mut counters = ctx.counters.borrow_mut();
        counters.read_buffer_max_bytes = counters.read_buffer_max_bytes.max(self.buf.len() as u64);
        if self.line_scan.bytes_examined == 0 && self.line_incomplete_reads == 0 {
            return;
        }
        counters.line_scan_bytes += std::mem::take(&mut self.line_scan.bytes_examined);
        counters.line_incomplete_reads += std::mem::take(&mut self.line_incomplete_reads);
    }

    /// Forgets processed bytes, and gives back a big buffer once it is empty.
    fn settle(&mut self) {
        if self.consumed == self.filled {
            self.lookahead.reset();
            self.consumed = 0;
            self.filled = 0;
            if self.buf.len() > 4 * READ_BUFFER_BYTES {
                self.buf = vec![0; READ_BUFFER_BYTES];
            }
        } else if self.filled == self.buf.len() {
            self.make_room(self.filled - self.consumed + 1);
        }
        if self.filled == self.buf.len() {
            self.make_room(self.buf.len() + 1);
        }
    }
}

/// Serves one connection until the client leaves, a protocol error closes it, it idles out,
/// or the server stops. The socket is closed only after every ring operation on it is done.
pub async fn serve(ctx: Rc<ShardCtx>, mut stream: TcpStream) {
    if let Err(err) = stream.set_nodelay(true) {
        tracing::debug!(%err, "TCP_NODELAY refused");
    }
    let wire = Wire::new(&ctx.io, ctx.shared.settings.receive_timestamps, &stream);
    let info = Rc::new(ConnInfo {
        fd: std::os::fd::AsRawFd::as_raw_fd(&stream),
        peer: stream.peer_addr().map_or("?".into(), |a| a.to_string()),
        local: stream.local_addr().map_or("?".into(), |a| a.to_string()),
        state: std::cell::Cell::new("conn_waiting"),
        last_command: std::cell::Cell::new(std::time::Instant::now()),
    });
    ctx.conns.borrow_mut().insert(info.fd, Rc::clone(&info));
    let ended = serve_frames(&ctx, &mut stream, &wire, &info).await;
    ctx.conns.borrow_mut().remove(&info.fd);
    wire.finish(ended == Ended::Cut).await;
    if ended == Ended::Quit {
        if ctx.stop.fired() {
            replies_landed(info.fd).await;
        }
        let _ = stream.close().await;
    }
}

/// Waits, up to [`super::STOP_WRITE_GRACE`], until the peer has acknowledged every byte sent.
/// At the stop a connection closes with requests it will not read still in its socket, and
/// closing such a socket resets it, which throws away replies not yet delivered.
async fn replies_landed(fd: i32) {
    let deadline = std::time::Instant::now() + super::STOP_WRITE_GRACE;
    while crate::sys::unacknowledged_bytes(fd).is_ok_and(|bytes| bytes > 0)
        && std::time::Instant::now() < deadline
    {
        glommio::timer::sleep(Duration::from_millis(1)).await;
    }
}

/// How a connection ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ended {
    /// QUIT or a protocol error: replies written, close politely.
    Quit,
    /// The client left, idled out, or the server stops: anything in flight is cancelled.
    Cut,
}

/// Writes `out[from..]`: on the ring the buffer itself when it is whole (it comes back for
/// reuse), a copy of the tail otherwise.
async fn write_out(
    ctx: &ShardCtx,
    stream: &mut TcpStream,
    wire: &Wire,
    idle: Option<Duration>,
    out: &mut Vec<u8>,
    from: usize,
    to: usize,
) -> Result<(), Ended> {
    if to <= from {
        return Ok(());
    }
    let len = to - from;
    let whole = from == 0 && to == out.len();
    let bytes = if whole {
        std::mem::take(out)
    } else {
        out[from..to].to_vec()
    };
    let mut back = None;
    let result = with_limits(idle, async {
        let b = wire.write(stream, bytes).await?;
        back = Some(b);
        Ok(len.max(1))
    })
    .await;
    if let (true, Some(mut b)) = (whole, back) {
        b.clear();
        *out = b;
    }
    match result {
        Io::Done(_) => {
            ctx.counters.borrow_mut().bytes_written += len as u64;
            Ok(())
        }
        Io::TimedOut => {
            idle_closed(ctx);
            Err(Ended::Cut)
        }
        Io::Closed => Err(Ended::Cut),
    }
}

async fn serve_frames(
    ctx: &Rc<ShardCtx>,
    stream: &mut TcpStream,
    wire: &Wire,
    info: &ConnInfo,
) -> Ended {
    let idle = match ctx.shared.settings.idle_timeout_seconds {
        0 => None,
        seconds => Some(Duration::from_secs(seconds)),
    };
    let mut conn = Conn {
        buf: vec![0; READ_BUFFER_BYTES],
        filled: 0,
        line_scan: Default::default(),
        line_incomplete_reads: 0,
        lookahead: Lookahead::default(),
        consumed: 0,
        skip: 0,
        replies: Replies::default(),
        authenticated: ctx.shared.credentials.is_none(),
        auth_failures: 0,
        protocol: None,
        batch: BatchCounts::default(),
        peer: info.peer.clone(),
        fd: info.fd,
        metadump: None,
    };
    // When the bytes of the requests being run arrived (the read that brought them).
    let mut arrived;
    // On the ring path the last replies of a pass are queued, and submitted with every other
    // connection's of the same pass, while the connection waits for its next bytes (its
    // multishot receive stays armed; a one-shot receive is queued in the same submission).
    let mut pending: Option<Pending> = None;
    // The other reply buffer: one is in flight while the next pass fills the other.
    let mut spare: Vec<u8> = Vec::new();
    loop {
        // The server stops: no more reads (a connection that started after the stop was
        // never shut down); the last pass's replies go out, then the connection closes.
        if ctx.stop.fired() {
            return match pending.take() {
                Some(last) => match send_pending(ctx, stream, wire, idle, last).await {
                    Ok(()) => Ended::Quit,
                    Err(ended) => ended,
                },
                None => Ended::Quit,
            };
        }
        info.state.set(conn.waiting_state());
        let read = match pending.take() {
            Some(Pending::Lent(head, lent)) => {
                let (len, head_len) = (lent.len(), head.len());
                let Conn { buf, filled, .. } = &mut conn;
                let mut back = None;
                let (sent, read) = futures_lite::future::zip(
                    with_limits(idle, async {
                        let head = wire
                            .write_head_and_lent_queued(head, lent.into_lent())
                            .await?;
                        back = Some(head);
                        Ok(len.max(1))
                    }),
                    with_limits(idle, wire.read(stream, buf, *filled)),
                )
                .await;
                if let Some(head) = back.filter(|head| head.capacity() > 0) {
                    spare = head;
                }
                if lent_sent(ctx, sent, head_len, len).is_err() {
                    return Ended::Cut;
                }
                read
            }
            Some(Pending::Bytes(bytes)) => {
                let len = bytes.len();
                let Conn { buf, filled, .. } = &mut conn;
                let mut back = None;
                let (written, read) = futures_lite::future::zip(
                    with_limits(idle, async {
                        let sent = wire.write_queued(bytes).await?;
                        let n = sent.len().max(1);
                        back = Some(sent);
                        Ok(n)
                    }),
                    with_limits(idle, wire.read(stream, buf, *filled)),
                )
                .await;
                if let Some(mut sent) = back {
                    sent.clear();
                    spare = sent;
                }
                match written {
                    Io::Done(_) => ctx.counters.borrow_mut().bytes_written += len as u64,
                    Io::TimedOut => {
                        idle_closed(ctx);
                        return Ended::Cut;
                    }
                    Io::Closed => return Ended::Cut,
                }
                read
            }
            None => {
                let Conn { buf, filled, .. } = &mut conn;
                with_limits(idle, wire.read(stream, buf, *filled)).await
            }
        };
        info.state.set("conn_parse_cmd");
        arrived = wire.arrived();
        info.last_command.set(arrived);
        // The first pass after a read runs at the read's time (see `Wire::unix_now`); a pass
        // after other waits (a large value, the output cap) reads the clock.
        let mut now = Some(wire.unix_now());
        match read {
            Io::Done(n) => {
                conn.filled += n;
                ctx.counters.borrow_mut().bytes_read += n as u64;
            }
            Io::TimedOut => {
                idle_closed(ctx);
                return Ended::Cut;
            }
            // The stop ended the read: what was sent still lands before the close.
            Io::Closed if ctx.stop.fired() => return Ended::Quit,
            Io::Closed => return Ended::Cut,
        }
        loop {
            let after = conn.process(ctx, now.take().unwrap_or_else(unix_now)).await;
            conn.count_line_scans(ctx);
            info.state.set("conn_write");
            // Replies in order: bytes up to each large value, the large value streamed, ...
            let mut written = 0;
            conn.replies.held_bytes = 0;
            // Drained, and put back below: its room serves the next pass without allocating.
            let mut held = std::mem::take(&mut conn.replies.held);
            let parts = held.len();
            for (i, (at, part)) in held.drain(..).enumerate() {
                let sent = match part {
                    Held::Large(get) => {
                        if let Err(ended) =
                            write_out(ctx, stream, wire, idle, &mut conn.replies.out, written, at)
                                .await
                        {
                            return ended;
                        }
                        large::send_get(ctx, stream, wire, idle, get).await
                    }
                    // The replies before it, its header included, leave with it.
                    Held::Lent(lent) => {
                        let last = i + 1 == parts && at == conn.replies.out.len();
                        if last && matches!(after, After::Read) && wire.on_ring() {
                            // The pass's last reply: it goes out with the next receive, its
                            // header from the reply buffer itself when that is all of it (the
                            // spare takes its place, and it comes back as the spare).
                            let head = if written == 0 {
                                std::mem::replace(&mut conn.replies.out, std::mem::take(&mut spare))
                            } else {
                                conn.replies.out[written..at].to_vec()
                            };
                            pending = Some(Pending::Lent(head, lent));
                            Ok(())
                        } else {
                            let head = conn.replies.out[written..at].to_vec();
                            send_lent(ctx, stream, wire, idle, head, lent).await
                        }
                    }
                };
                written = at;
                if let Err(err) = sent {
                    tracing::debug!(%err, "value not sent");
                    return Ended::Cut;
                }
            }
            conn.replies.held = held;
            let end = conn.replies.out.len();
            if matches!(after, After::Read) && wire.on_ring() && end > written {
                // Sent together with the next receive (above); the buffer itself when whole.
                pending = Some(Pending::Bytes(if written == 0 {
                    std::mem::replace(&mut conn.replies.out, std::mem::take(&mut spare))
                } else {
                    conn.replies.out[written..end].to_vec()
                }));
            } else if let Err(ended) =
                write_out(ctx, stream, wire, idle, &mut conn.replies.out, written, end).await
            {
                return ended;
            }
            // Every reply of the pass is with the kernel (or queued with the next receive,
            // submitted right after): the pass's requests took this long.
            if !conn.batch.is_empty() {
                let elapsed_ns = arrived.elapsed().as_nanos() as u64;
                ctx.latency.record_batch(&conn.batch.take(), elapsed_ns);
            }
            conn.replies.out.clear();
            let after = match after {
                After::LargeSet(set) => {
                    info.state.set("conn_nread");
                    let buffered = &conn.buf[conn.consumed..conn.filled];
                    match large::receive_set(
                        ctx,
                        (stream, wire),
                        (idle, conn.fd),
                        buffered,
                        &set,
                        &mut conn.replies.out,
                    )
                    .await
                    {
                        Ok(used) => conn.consume(used),
                        Err(err) => {
                            tracing::debug!(%err, "large value not received");
                            return Ended::Cut;
                        }
                    }
                    After::Process
                }
                other => other,
            };
            if matches!(after, After::Close) {
                return Ended::Quit;
            }
            if let After::Watch(watcher) = after {
                let ended = stream_watch(ctx, stream, wire, &watcher).await;
                ctx.shared.watchers.remove(&watcher);
                return ended;
            }
            // More whole frames may wait behind the output cap (or a large value); otherwise
            // read more.
            let more = matches!(after, After::Process);
            conn.settle();
            if !more {
                break;
            }
        }
    }
}

/// Sends a pass's last replies on their own, without the next receive.
async fn send_pending(
    ctx: &ShardCtx,
    stream: &mut TcpStream,
    wire: &Wire,
    idle: Option<Duration>,
    pending: Pending,
) -> Result<(), Ended> {
    match pending {
        Pending::Bytes(mut bytes) => {
            let end = bytes.len();
            write_out(ctx, stream, wire, idle, &mut bytes, 0, end).await
        }
        Pending::Lent(head, lent) => send_lent(ctx, stream, wire, idle, head, lent)
            .await
            .map_err(|_| Ended::Cut),
    }
}

/// Streams a watcher's lines until the client leaves or the server stops (a watching
/// connection reads no more commands, as in memcached).
async fn stream_watch(
    ctx: &ShardCtx,
    stream: &mut TcpStream,
    wire: &Wire,
    watcher: &super::watch::Watcher,
) -> Ended {
    loop {
        if ctx.stop.fired() {
            return Ended::Cut;
        }
        glommio::timer::sleep(super::watch::DRAIN_INTERVAL).await;
        let mut out = watcher.take();
        let end = out.len();
        if let Err(ended) = write_out(ctx, stream, wire, None, &mut out, 0, end).await {
            return ended;
        }
    }
}

/// Sends `head` (the replies before a lent value, its header included) and the value lent
/// from the arena; the value's pin ends when the kernel is done with its bytes.
async fn send_lent(
    ctx: &ShardCtx,
    stream: &mut TcpStream,
    wire: &Wire,
    idle: Option<Duration>,
    head: Vec<u8>,
    lent: super::deferred::HeldLent,
) -> std::io::Result<()> {
    let (len, head_len) = (lent.len(), head.len());
    let lent = lent.into_lent();
    let sent = with_limits(idle, async {
        wire.write_head_and_lent(stream, head, lent)
            .await
            .map(|()| len.max(1))
    })
    .await;
    lent_sent(ctx, sent, head_len, len)
}

/// Counts a lent send that went out (`head_len` bytes of replies, then `len` lent), or says how
/// it failed.
fn lent_sent(ctx: &ShardCtx, sent: Io, head_len: usize, len: usize) -> std::io::Result<()> {
    match sent {
        Io::Done(_) => {
            ctx.counters.borrow_mut().bytes_written += (head_len + len) as u64;
            let mut counters = ctx.io.counters.borrow_mut();
            counters.heads_lent += 1;
            counters.head_bytes_lent += len as u64;
            Ok(())
        }
        Io::TimedOut => {
            idle_closed(ctx);
            Err(std::io::ErrorKind::TimedOut.into())
        }
        Io::Closed => Err(std::io::ErrorKind::UnexpectedEof.into()),
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
