//! One client connection: read frames, run them on their owning shards, write the replies in
//! request order.
//!
//! Frames are taken in *segments*: keyed requests this shard owns run at once; those of
//! other shards are gathered into one batch per shard, sent, and awaited together; the
//! replies are then stitched back into request order. FLUSH, STAT and QUIT end a segment (they
//! see everything before them and nothing after). See `docs/server.md`.

use std::rc::Rc;
use std::time::Duration;

use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::net::TcpStream;

use crate::proto::{decode_streaming, Decoded, FrameError, Request, ResponseWriter, Status};
use crate::store::KeyHasher;

use super::deferred::Held;
use super::execute::execute_keyed;
use super::large::{self, LargeSet};
use super::shard::{RemoteOp, ShardCtx, ShardReply, ShardRequest};
use super::stats::{write_stats, ConnInfo};
use super::unix_now;
use super::wire::Wire;

/// Read buffer a connection starts with (and shrinks back to when idle).
const READ_BUFFER_BYTES: usize = 16 << 10;
/// Replies gathered before they are written, so a pipeline of large GETs stays bounded.
pub(super) const OUTPUT_CAP_BYTES: usize = 1 << 20;
/// Frames per segment at most (bounds a batch's bookkeeping).
const SEGMENT_MAX_FRAMES: usize = 4096;

/// Where a reply of the current segment comes from.
enum Piece {
    /// `local[start..end]`.
    Local { start: usize, end: usize },
    /// Op `index` of the batch sent to `shard`.
    Remote { shard: usize, index: usize },
    /// A value sent by the connection itself (large, or lent zero-copy), run here.
    Held(Held),
}

/// A batch's replies: bytes, op ends, and the values the connection sends itself.
type BatchReply = (Vec<u8>, Vec<u32>, Vec<(u32, Held)>);

/// A segment being assembled.
#[derive(Default)]
struct Segment {
    pieces: Vec<Piece>,
    local: Vec<u8>,
    /// Per shard: the frames to send and their ops.
    batches: Vec<(Vec<u8>, Vec<RemoteOp>)>,
    /// Bytes held for values the connection sends itself (large heads, pinned values): they
    /// count against the output cap.
    held_bytes: usize,
}

impl Segment {
    fn new(shards: usize) -> Segment {
        Segment {
            batches: (0..shards).map(|_| (Vec::new(), Vec::new())).collect(),
            ..Segment::default()
        }
    }

    fn is_empty(&self) -> bool {
        self.pieces.is_empty()
    }

    fn local_reply(&mut self, write: impl FnOnce(&mut Vec<u8>)) {
        let start = self.local.len();
        write(&mut self.local);
        let end = self.local.len();
        if end > start {
            self.pieces.push(Piece::Local { start, end });
        }
    }

    fn remote(&mut self, shard: usize, op_bytes: &[u8], make: impl FnOnce(u32, u32) -> RemoteOp) {
        let (buf, ops) = &mut self.batches[shard];
        let start = buf.len() as u32;
        buf.extend_from_slice(op_bytes);
        ops.push(make(start, buf.len() as u32));
        self.pieces.push(Piece::Remote {
            shard,
            index: ops.len() - 1,
        });
    }

    /// Sends the batches, waits for every reply, and appends all replies in order to `out`;
    /// values the connection sends itself are noted in `held` at their output offset.
    async fn finish(
        &mut self,
        ctx: &Rc<ShardCtx>,
        out: &mut Vec<u8>,
        held: &mut Vec<(usize, Held)>,
    ) {
        let lend_from = ctx.io.lend_from();
        let calls: Vec<_> = self
            .batches
            .iter_mut()
            .enumerate()
            .filter(|(_, (_, ops))| !ops.is_empty())
            .map(|(shard, (buf, ops))| {
                let request = ShardRequest::Batch {
                    buf: std::mem::take(buf),
                    ops: std::mem::take(ops),
                    lend_from,
                };
                (shard, request)
            })
            .collect();
        let mut replies: Vec<Option<BatchReply>> = (0..self.batches.len()).map(|_| None).collect();
        // Every batch is in flight before the first reply is awaited.
        let mut pending = Vec::with_capacity(calls.len());
        for (shard, request) in calls {
            pending.push((shard, ctx.start_call(shard, request).await));
        }
        for (shard, call) in pending {
            if let ShardReply::Batch {
                out,
                ends,
                deferred,
            } = call.reply().await
            {
                let parts = deferred
                    .into_iter()
                    .map(|(i, part)| (i, Held::new(ctx, part)))
                    .collect();
                replies[shard] = Some((out, ends, parts));
            }
        }
        for piece in self.pieces.drain(..) {
            match piece {
                Piece::Local { start, end } => out.extend_from_slice(&self.local[start..end]),
                Piece::Held(part) => held.push((out.len(), part)),
                Piece::Remote { shard, index } => {
                    let (bytes, ends, remote_parts) =
                        replies[shard].as_mut().expect("a reply per batch");
                    let start = if index == 0 {
                        0
                    } else {
                        ends[index - 1] as usize
                    };
                    // The op's own bytes (a lent value's header), then its part if it has one.
                    out.extend_from_slice(&bytes[start..ends[index] as usize]);
                    if let Some(at) = remote_parts.iter().position(|(i, _)| *i as usize == index) {
                        let (_, part) = remote_parts.swap_remove(at);
                        held.push((out.len(), part));
                    }
                }
            }
        }
        self.local.clear();
        self.held_bytes = 0;
    }
}

/// What the connection does after writing its replies.
enum After {
    /// Every whole frame is done: read more.
    Read,
    /// Stopped at the output cap with whole frames still buffered: write, then process again.
    Process,
    /// A large value follows in the stream: receive it, then process again.
    LargeSet(LargeSet),
    Close,
}

struct Conn {
    buf: Vec<u8>,
    /// Bytes of `buf` holding received data, and how many of those are processed.
    filled: usize,
    consumed: usize,
    /// Stream bytes still to discard (the rest of a rejected or too-large frame).
    skip: u64,
    out: Vec<u8>,
    /// Values the connection sends itself, at their offsets in `out` (each lease or pin ends
    /// when it is dropped).
    held: Vec<(usize, Held)>,
    /// SASL done, or not required (`--sasl-password-file` unset).
    authenticated: bool,
}

/// The body of the refusal ADMIN gets on a data connection.
const ADMIN_REFUSAL: &str =
    "ADMIN is served only on the admin socket (--admin-socket PATH), not on data connections";

/// What a connection may do before SASL authentication, as memcached allows.
fn allowed_before_auth(request: &Request) -> bool {
    matches!(
        request,
        Request::Version | Request::Quit { .. } | Request::SaslListMechs | Request::SaslAuth { .. }
    )
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
    /// Runs every whole frame buffered, up to the output cap. Returns what to do next.
    async fn process(&mut self, ctx: &Rc<ShardCtx>) -> After {
        let max_item = ctx.shared.settings.max_item_bytes as usize;
        // Values above ram_head live in segments: they are streamed, never buffered whole.
        let stream_from = ctx.shared.settings.arena.ram_head_bytes as usize;
        let mut segment = Segment::new(ctx.shards);
        let now = unix_now();
        let mut after = After::Read;
        loop {
            if self.skip > 0 {
                let drop = (self.skip as usize).min(self.filled - self.consumed);
                self.consumed += drop;
                self.skip -= drop as u64;
                if self.skip > 0 {
                    break;
                }
            }
            if self.out.len() + segment.local.len() + segment.held_bytes > OUTPUT_CAP_BYTES
                || segment.pieces.len() >= SEGMENT_MAX_FRAMES
            {
                after = After::Process;
                break;
            }
            let frame = &self.buf[self.consumed..self.filled];
            match decode_streaming(frame, max_item, stream_from) {
                Decoded::Incomplete { needed } => {
                    self.make_room(needed);
                    break;
                }
                Decoded::Close { error } => {
                    count(ctx, error);
                    after = After::Close;
                    break;
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
                    segment
                        .local_reply(|out| ResponseWriter::new(out).error(opcode, opaque, status));
                    let available = (self.filled - self.consumed) as u64;
                    let now_dropped = skip.min(available);
                    self.consumed += now_dropped as usize;
                    self.skip = skip - now_dropped;
                    if close {
                        after = After::Close;
                        break;
                    }
                }
                Decoded::Request {
                    request,
                    opcode,
                    opaque,
                    consumed,
                    skip_after,
                } => {
                    let frame_bytes = &frame[..consumed];
                    self.skip = skip_after;
                    ctx.counters.borrow_mut().commands += 1;
                    if !self.authenticated && !allowed_before_auth(&request) {
                        // Refused without running; a streamed value that follows is skipped.
                        if let Request::LargeStore { value_len, .. } = request {
                            self.skip += value_len;
                        }
                        segment.local_reply(|out| {
                            ResponseWriter::new(out).reply(
                                opcode,
                                opaque,
                                Status::AuthError,
                                0,
                                &[],
                                &[],
                                b"Authentication required",
                            )
                        });
                        self.consumed += consumed;
                        continue;
                    }
                    match &request {
                        Request::Noop | Request::Version | Request::Verbosity { .. } => {
                            let version = ctx.shared.version.as_bytes();
                            segment.local_reply(|out| {
                                let value: &[u8] = if request == Request::Version {
                                    version
                                } else {
                                    &[]
                                };
                                ResponseWriter::new(out).reply(
                                    opcode,
                                    opaque,
                                    Status::Ok,
                                    0,
                                    &[],
                                    &[],
                                    value,
                                )
                            });
                        }
                        Request::Quit { quiet } => {
                            if !quiet {
                                segment.local_reply(|out| {
                                    ResponseWriter::new(out).reply(
                                        opcode,
                                        opaque,
                                        Status::Ok,
                                        0,
                                        &[],
                                        &[],
                                        &[],
                                    )
                                });
                            }
                            self.consumed += consumed;
                            after = After::Close;
                            break;
                        }
                        Request::Flush { delay, quiet } => {
                            let (delay, quiet) = (*delay, *quiet);
                            ctx.counters.borrow_mut().cmd_flush += 1;
                            self.consumed += consumed;
                            segment.finish(ctx, &mut self.out, &mut self.held).await;
                            for shard in (0..ctx.shards).filter(|&s| s != ctx.id) {
                                ctx.call(shard, ShardRequest::Flush { delay }).await;
                            }
                            ctx.store.borrow_mut().flush(delay, now);
                            if !quiet {
                                ResponseWriter::new(&mut self.out).reply(
                                    opcode,
                                    opaque,
                                    Status::Ok,
                                    0,
                                    &[],
                                    &[],
                                    &[],
                                );
                            }
                            continue;
                        }
                        Request::Stat { group } => {
                            let group = group.to_vec();
                            self.consumed += consumed;
                            segment.finish(ctx, &mut self.out, &mut self.held).await;
                            write_stats(ctx, &group, opcode, opaque, &mut self.out).await;
                            continue;
                        }
                        Request::Admin { .. } => {
                            segment.local_reply(|out| {
                                ResponseWriter::new(out).reply(
                                    opcode,
                                    opaque,
                                    Status::NotSupported,
                                    0,
                                    &[],
                                    &[],
                                    ADMIN_REFUSAL.as_bytes(),
                                )
                            });
                        }
                        Request::SaslListMechs | Request::SaslAuth { .. } => {
                            let reply = sasl(ctx, &mut self.authenticated, &request);
                            segment.local_reply(|out| {
                                let (status, body) = reply;
                                ResponseWriter::new(out).reply(
                                    opcode,
                                    opaque,
                                    status,
                                    0,
                                    &[],
                                    &[],
                                    body.as_bytes(),
                                )
                            });
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
                                quiet: *quiet,
                                value_len: *value_len,
                                opcode,
                                opaque,
                            };
                            self.consumed += consumed;
                            segment.finish(ctx, &mut self.out, &mut self.held).await;
                            return After::LargeSet(set);
                        }
                        keyed => {
                            let key = keyed.key().expect("keyed requests have keys");
                            let hash = ctx.store.borrow().hash(key);
                            let owner = KeyHasher::shard_of(hash, ctx.shards);
                            if owner == ctx.id {
                                let mut store = ctx.store.borrow_mut();
                                let start = segment.local.len();
                                let part = execute_keyed(
                                    &mut store,
                                    ctx.id,
                                    keyed,
                                    opcode,
                                    opaque,
                                    now,
                                    &mut segment.local,
                                    ctx.io.lend_from(),
                                );
                                drop(store);
                                if segment.local.len() > start {
                                    segment.pieces.push(Piece::Local {
                                        start,
                                        end: segment.local.len(),
                                    });
                                }
                                if let Some(part) = part {
                                    let part = Held::new(ctx, part);
                                    segment.held_bytes += part.held_bytes();
                                    segment.pieces.push(Piece::Held(part));
                                }
                            } else if let Request::TooLarge { key, drop_existing } = keyed {
                                let drop_existing = *drop_existing;
                                segment.remote(owner, key, |start, end| RemoteOp::TooLarge {
                                    start,
                                    end,
                                    drop_existing,
                                    opcode,
                                    opaque,
                                });
                            } else {
                                segment.remote(owner, frame_bytes, |start, end| RemoteOp::Frame {
                                    start,
                                    end,
                                });
                            }
                        }
                    }
                    self.consumed += consumed;
                }
            }
        }
        if !segment.is_empty() {
            segment.finish(ctx, &mut self.out, &mut self.held).await;
        }
        after
    }

    /// Makes the buffer able to hold a frame of `needed` bytes from `consumed`.
    fn make_room(&mut self, needed: usize) {
        if self.consumed > 0 {
            self.buf.copy_within(self.consumed..self.filled, 0);
            self.filled -= self.consumed;
            self.consumed = 0;
        }
        if self.buf.len() < needed {
            self.buf.resize(needed, 0);
        }
    }

    /// Forgets processed bytes, and gives back a big buffer once it is empty.
    fn settle(&mut self) {
        if self.consumed == self.filled {
            self.consumed = 0;
            self.filled = 0;
            if self.buf.len() > 4 * READ_BUFFER_BYTES {
                self.buf = vec![0; READ_BUFFER_BYTES];
            }
        } else if self.filled == self.buf.len() {
            self.make_room(self.filled - self.consumed + 1);
        }
        if self.filled == self.buf.len() {
            let grow = self.buf.len() + READ_BUFFER_BYTES;
            self.buf.resize(grow, 0);
        }
    }
}

/// What a read or a write came back with.
pub(super) enum Io {
    Done(usize),
    Closed,
    TimedOut,
    Stopped,
}

/// Runs one socket read or write, bounded by the idle timeout and cut short by shutdown.
pub(super) async fn with_limits<F>(ctx: &ShardCtx, idle: Option<Duration>, io: F) -> Io
where
    F: std::future::Future<Output = std::io::Result<usize>>,
{
    let io = async {
        match io.await {
            Ok(0) | Err(_) => Io::Closed,
            Ok(n) => Io::Done(n),
        }
    };
    let limited = async {
        match idle {
            Some(limit) => glommio::timer::timeout(limit, async { Ok(io.await) })
                .await
                .unwrap_or(Io::TimedOut),
            None => io.await,
        }
    };
    futures_lite::future::or(limited, async {
        ctx.stop.wait().await;
        Io::Stopped
    })
    .await
}

/// Serves one connection until the client leaves, a protocol error closes it, it idles out,
/// or the server stops. The socket is closed only after every ring operation on it is done.
pub async fn serve(ctx: Rc<ShardCtx>, mut stream: TcpStream) {
    if let Err(err) = stream.set_nodelay(true) {
        tracing::debug!(%err, "TCP_NODELAY refused");
    }
    let wire = Wire::new(&ctx, &stream);
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
        let _ = stream.close().await;
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
    let result = with_limits(ctx, idle, async {
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
            ctx.counters.borrow_mut().idle_closed += 1;
            Err(Ended::Cut)
        }
        Io::Closed | Io::Stopped => Err(Ended::Cut),
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
        consumed: 0,
        skip: 0,
        out: Vec::new(),
        held: Vec::new(),
        authenticated: ctx.shared.credentials.is_none(),
    };
    loop {
        info.state.set("conn_waiting");
        let read = {
            let Conn { buf, filled, .. } = &mut conn;
            with_limits(ctx, idle, stream.read(&mut buf[*filled..])).await
        };
        info.state.set("conn_parse_cmd");
        info.last_command.set(std::time::Instant::now());
        match read {
            Io::Done(n) => {
                conn.filled += n;
                ctx.counters.borrow_mut().bytes_read += n as u64;
            }
            Io::TimedOut => {
                ctx.counters.borrow_mut().idle_closed += 1;
                return Ended::Cut;
            }
            Io::Closed | Io::Stopped => return Ended::Cut,
        }
        loop {
            let after = conn.process(ctx).await;
            info.state.set("conn_write");
            // Replies in order: bytes up to each large value, the large value streamed, ...
            let mut written = 0;
            for (at, part) in std::mem::take(&mut conn.held) {
                if let Err(ended) =
                    write_out(ctx, stream, wire, idle, &mut conn.out, written, at).await
                {
                    return ended;
                }
                written = at;
                let sent = match part {
                    Held::Large(get) => large::send_get(ctx, stream, wire, idle, get).await,
                    Held::Lent(lent) => send_lent(ctx, stream, wire, idle, lent).await,
                };
                if let Err(err) = sent {
                    tracing::debug!(%err, "value not sent");
                    return Ended::Cut;
                }
            }
            let end = conn.out.len();
            if let Err(ended) =
                write_out(ctx, stream, wire, idle, &mut conn.out, written, end).await
            {
                return ended;
            }
            conn.out.clear();
            large::send_frees(ctx);
            let after = match after {
                After::LargeSet(set) => {
                    info.state.set("conn_nread");
                    let buffered = &conn.buf[conn.consumed..conn.filled];
                    match large::receive_set(ctx, stream, idle, buffered, &set, &mut conn.out).await
                    {
                        Ok(used) => conn.consumed += used,
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
            // More whole frames may wait behind the output cap (or a large value); otherwise
            // read more.
            let more = matches!(after, After::Process);
            conn.settle();
            if !more {
                break;
            }
        }
        if ctx.stop.fired() {
            return Ended::Cut;
        }
    }
}

/// Sends a value lent from the arena, zero-copy; its pin ends at the kernel's notification.
async fn send_lent(
    ctx: &ShardCtx,
    stream: &mut TcpStream,
    wire: &Wire,
    idle: Option<Duration>,
    lent: super::deferred::HeldLent,
) -> std::io::Result<()> {
    let len = lent.len();
    let lent = lent.into_lent();
    match with_limits(ctx, idle, async {
        wire.write_lent(stream, lent).await.map(|()| len.max(1))
    })
    .await
    {
        Io::Done(_) => {
            ctx.counters.borrow_mut().bytes_written += len as u64;
            let mut counters = ctx.io.counters.borrow_mut();
            counters.heads_lent += 1;
            counters.head_bytes_lent += len as u64;
            Ok(())
        }
        Io::TimedOut => {
            ctx.counters.borrow_mut().idle_closed += 1;
            Err(std::io::ErrorKind::TimedOut.into())
        }
        Io::Closed | Io::Stopped => Err(std::io::ErrorKind::UnexpectedEof.into()),
    }
}
