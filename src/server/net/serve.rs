//! Serving one connection: bytes from the socket into the connection's buffer, the codec its
//! first byte chose over them (`binary.rs`, `text.rs`), and the replies back out in request
//! order (bytes, values lent from the arena, large values streamed from their segments), over
//! the shard's ring or plain socket calls (`wire.rs`). A request's path reads down this file:
//! read, process, write.
//!
//! FLUSH and STAT see everything before them and nothing after (they run in order like every
//! other request); a large SET's value is streamed into its segment before the next frame is
//! decoded. See `docs/server.md`.

use std::rc::Rc;
use std::time::Duration;

use futures_lite::AsyncWriteExt;
use glommio::net::TcpStream;

use super::binary;
use super::conn::{After, Conn};
use super::lookahead::{Framing, Lookahead};
use super::stream::{SocketBody, SocketReply};
use super::text::TextSession;
use crate::server::exec::deferred::Held;
use crate::server::exec::large;
use crate::server::exec::replies::Replies;
use crate::server::shard::ctx::{ConnInfo, ShardCtx};
use crate::server::shard::endpoint::Endpoint;
use crate::server::shard::latency::BatchCounts;
use crate::server::shard::limits::{idle_closed, with_limits, Io};
use crate::server::shard::shared::unix_now;
use crate::server::shard::tls_stage::TlsStage;
use crate::server::shard::watch;
use crate::server::shard::wire::Wire;

/// The protocol a connection speaks, chosen by its first byte as in memcached (`0x80` is
/// binary, anything else text and meta), and that protocol's state between passes.
enum Session {
    New,
    Binary,
    Text(TextSession),
}

impl Session {
    /// Runs every whole command buffered, in the connection's protocol, up to the output cap.
    /// Returns what to do next.
    /// `now`: the time the commands run at, in Unix seconds.
    async fn process(&mut self, conn: &mut Conn, ctx: &Rc<ShardCtx>, now: u32) -> After {
        if let Session::New = self {
            let Some(&first) = conn.buf[conn.consumed..conn.filled].first() else {
                return After::Read;
            };
            *self = if crate::proto::is_binary(first) {
                conn.framing = Some(Framing::Binary);
                Session::Binary
            } else {
                conn.framing = Some(Framing::Text);
                Session::Text(TextSession::default())
            };
        }
        match self {
            Session::New => unreachable!("chosen above"),
            Session::Binary => binary::process(conn, ctx, now).await,
            Session::Text(text) => text.process(conn, ctx, now).await,
        }
    }
}

/// Serves one connection until the client leaves, a protocol error closes it, it idles out,
/// or the server stops. The socket is closed only after every ring operation on it is done.
/// `stream` is any stream socket (glommio's TCP stream type does only plain socket calls):
/// a TCP client or a unix socket client; `tls`, a TLS client's session after its handshake;
/// `admitted` counts the connection until this ends.
///
/// The setup runs here, before the future: the future holds the connection's parts in one
/// box, since an `async fn` keeps its arguments beside its locals (the socket and endpoint
/// twice) for the connection's life.
pub fn serve(
    ctx: Rc<ShardCtx>,
    stream: TcpStream,
    endpoint: Endpoint,
    tls: Option<Box<TlsStage>>,
    admitted: super::conn::Admitted,
) -> impl std::future::Future<Output = ()> {
    if endpoint.is_tcp_socket() {
        if let Err(err) = stream.set_nodelay(true) {
            tracing::debug!(%err, "TCP_NODELAY refused");
        }
    }
    let wire = Wire::new(
        &ctx.io,
        ctx.shared.settings.receive_timestamps,
        &stream,
        &endpoint,
        tls,
    );
    let info = Rc::new(ConnInfo {
        fd: std::os::fd::AsRawFd::as_raw_fd(&stream),
        endpoint,
        state: std::cell::Cell::new("conn_waiting"),
        last_command: std::cell::Cell::new(std::time::Instant::now()),
        close_reason: std::cell::Cell::new(watch::CloseReason::Normal),
        state_bytes: std::cell::Cell::new(0),
        buffers_held: std::cell::Cell::new((0, 0)),
    });
    ctx.conns.borrow_mut().insert(info.fd, Rc::clone(&info));
    ctx.shared.watchers.conn_new(&info.endpoint, info.fd);
    let wire_bytes = wire.state_bytes();
    let future = serve_connection(Box::new(Connection {
        wire,
        stream,
        ctx,
        info: Rc::clone(&info),
        _admitted: admitted,
    }));
    info.state_bytes.set(
        std::mem::size_of_val(&future)
            + std::mem::size_of::<Connection>()
            + std::mem::size_of::<ConnInfo>()
            + info.endpoint.peer.capacity()
            + info.endpoint.local.capacity()
            + wire_bytes,
    );
    future
}

/// What [`serve`] set up for a connection. Fields drop in order: the wire (its receive
/// cancelled, its registered-file slot given back) before the socket closes.
struct Connection {
    wire: Wire,
    stream: TcpStream,
    ctx: Rc<ShardCtx>,
    info: Rc<ConnInfo>,
    _admitted: super::conn::Admitted,
}

async fn serve_connection(mut connection: Box<Connection>) {
    let Connection {
        ctx,
        stream,
        wire,
        info,
        ..
    } = &mut *connection;
    let ended = serve_frames(ctx, stream, wire, info).await;
    ctx.conns.borrow_mut().remove(&info.fd);
    if ctx.stop.fired() {
        info.close_reason.set(watch::CloseReason::Shutdown);
    }
    let watchers = &ctx.shared.watchers;
    watchers.conn_close(&info.endpoint, info.fd, info.close_reason.get());
    if ended == Ended::Quit {
        wire.end_session(stream).await;
    }
    wire.finish(ended == Ended::Cut).await;
    if ended == Ended::Quit {
        if ctx.stop.fired() {
            replies_landed(info.fd).await;
        }
        let _ = stream.close().await;
    }
}

/// Waits, up to [`crate::server::shard::shared::STOP_WRITE_GRACE`], until the peer has acknowledged every byte sent.
/// At the stop a connection closes with requests it will not read still in its socket, and
/// closing such a socket resets it, which throws away replies not yet delivered.
async fn replies_landed(fd: i32) {
    let deadline = std::time::Instant::now() + crate::server::shard::shared::STOP_WRITE_GRACE;
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

/// Serves the connection's requests until it ends. The task holds only what an idle
/// connection needs: its shell (`Conn`, with no buffer while nothing is buffered) and the read
/// that waits for its next bytes. Everything a request's run needs from there on is in
/// [`serve_arrival`]'s future, boxed for as long as the connection is busy: a task is
/// allocated at its largest state's size, and idle connections are the many.
async fn serve_frames(
    ctx: &Rc<ShardCtx>,
    stream: &mut TcpStream,
    wire: &Wire,
    info: &Rc<ConnInfo>,
) -> Ended {
    let idle = match ctx.shared.settings.idle_timeout_seconds {
        0 => None,
        seconds => Some(Duration::from_secs(seconds)),
    };
    let mut conn = Conn {
        buf: Vec::new(),
        read_buffers: Rc::clone(&ctx.io.read_buffers),
        filled: 0,
        line_scan: Default::default(),
        line_incomplete_reads: 0,
        lookahead: Lookahead::default(),
        consumed: 0,
        skip: 0,
        replies: Replies::default(),
        authenticated: ctx.shared.credentials.is_none(),
        auth_failures: 0,
        framing: None,
        batch: BatchCounts::default(),
        info: Rc::clone(info),
        fd: info.fd,
    };
    let mut session = Session::New;
    loop {
        // The server stops: no more reads (a connection that started after the stop was
        // never shut down); every reply is with the kernel already.
        if ctx.stop.fired() {
            return Ended::Quit;
        }
        info.state.set(conn.waiting_state());
        // Waiting for bytes, the connection holds no reply buffer (nor, with nothing
        // buffered, a read buffer: `Conn::settle`).
        if conn.replies.out.capacity() > 0 {
            ctx.io
                .reply_buffers
                .give(std::mem::take(&mut conn.replies.out));
        }
        if conn.buf.is_empty() && wire.waits_with_buffer() {
            conn.buf = ctx.io.read_buffers.take();
        }
        conn.count_buffers_held();
        let read = with_limits(idle, wire.read_idle(stream, &mut conn.buf)).await;
        let arrival = serve_arrival(
            ctx,
            (stream, wire),
            info,
            idle,
            &mut conn,
            &mut session,
            read,
        );
        if let Err(ended) = Box::pin(arrival).await {
            return ended;
        }
    }
}

/// Runs what a read brought: every whole frame, each pass's replies written in order, until
/// only an unfinished frame (or nothing) is left and every reply is with the kernel; while a
/// frame is unfinished it reads the rest here. Nothing left: the connection waits for bytes
/// again. `Err`: the connection ends.
async fn serve_arrival(
    ctx: &Rc<ShardCtx>,
    (stream, wire): (&mut TcpStream, &Wire),
    info: &ConnInfo,
    idle: Option<Duration>,
    conn: &mut Conn,
    session: &mut Session,
    read: Io,
) -> Result<(), Ended> {
    let replies_cache = &ctx.io.reply_buffers;
    let mut read = read;
    loop {
        info.state.set("conn_parse_cmd");
        // When the bytes of the requests being run arrived (the read that brought them).
        let arrived = wire.arrived();
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
                return Err(Ended::Cut);
            }
            // The stop ended the read: what was sent still lands before the close.
            Io::Closed if ctx.stop.fired() => return Err(Ended::Quit),
            Io::Closed => return Err(Ended::Cut),
        }
        loop {
            if conn.replies.out.capacity() == 0 {
                conn.replies.out = replies_cache.take();
            }
            conn.count_buffers_held();
            let after = session
                .process(conn, ctx, now.take().unwrap_or_else(unix_now))
                .await;
            conn.count_line_scans(ctx);
            if matches!(after, After::Read) {
                // Every whole frame ran: the read buffer goes back before the replies' send is
                // waited on, so a burst over many connections holds one reply buffer each, not
                // a read buffer too.
                conn.settle();
            }
            info.state.set("conn_write");
            // Replies in order: bytes up to each large value, the large value streamed, ...
            let mut written = 0;
            conn.replies.held_bytes = 0;
            // Drained, and put back below: its room serves the next pass without allocating.
            let mut held = std::mem::take(&mut conn.replies.held);
            for (at, part) in held.drain(..) {
                let sent = match part {
                    Held::Large(get) => {
                        write_out(ctx, stream, wire, idle, &mut conn.replies.out, written, at)
                            .await?;
                        // Boxed, as every rare path here: a busy connection's future is as big
                        // as its biggest wait.
                        Box::pin(large::send_get(
                            ctx,
                            &mut SocketReply::new(ctx, (stream, wire), idle),
                            get,
                        ))
                        .await
                    }
                    // The replies before it, its header included, leave with it.
                    Held::Lent(lent) => {
                        let head = conn.replies.out[written..at].to_vec();
                        send_lent(ctx, stream, wire, idle, head, lent).await
                    }
                };
                written = at;
                if let Err(err) = sent {
                    tracing::debug!(%err, "value not sent");
                    return Err(Ended::Cut);
                }
            }
            conn.replies.held = held;
            let end = conn.replies.out.len();
            write_out(ctx, stream, wire, idle, &mut conn.replies.out, written, end).await?;
            // Every reply of the pass is with the kernel: the pass's requests took this long.
            if !conn.batch.is_empty() {
                let elapsed_ns = arrived.elapsed().as_nanos() as u64;
                ctx.latency.record_batch(&conn.batch.take(), elapsed_ns);
            }
            conn.replies.out.clear();
            let after = match after {
                After::LargeSet(set, reply) => {
                    info.state.set("conn_nread");
                    let buffered = &conn.buf[conn.consumed..conn.filled];
                    let framing = (set.value_len, reply.trailer_bytes() as usize);
                    let mut body = SocketBody::new(ctx, (stream, wire), idle, buffered, framing);
                    let outcome = Box::pin(large::receive_set(ctx, &mut body, conn.fd, &set)).await;
                    let used = body.used();
                    match outcome {
                        Ok(outcome) => {
                            reply.write(&mut conn.replies.out, outcome, set.hints.is_some());
                            conn.consume(used);
                        }
                        Err(err) => {
                            tracing::debug!(%err, "large value not received");
                            return Err(Ended::Cut);
                        }
                    }
                    After::Process
                }
                other => other,
            };
            match after {
                After::Close => {
                    info.close_reason.set(watch::CloseReason::Error);
                    return Err(Ended::Quit);
                }
                After::Quit => return Err(Ended::Quit),
                After::Watch(watcher) => {
                    let ended = Box::pin(stream_watch(ctx, stream, wire, &watcher, conn.fd)).await;
                    ctx.shared.watchers.remove(&watcher);
                    return Err(ended);
                }
                _ => {}
            }
            // More whole frames may wait behind the output cap (or a large value); otherwise
            // read more.
            let more = matches!(after, After::Process);
            conn.settle();
            if !more {
                break;
            }
        }
        // Nothing left: idle again. Else an unfinished frame waits for the rest of its bytes.
        if conn.buf.is_empty() {
            return Ok(());
        }
        if ctx.stop.fired() {
            return Err(Ended::Quit);
        }
        info.state.set(conn.waiting_state());
        let Conn { buf, filled, .. } = &mut *conn;
        read = with_limits(idle, wire.read(stream, buf, *filled)).await;
    }
}

/// Streams a watcher's lines until the client leaves or the server stops (a watching
/// connection reads no more commands, as in memcached). A client that leaves while no line
/// comes is seen gone by looking at its socket (`fd`), so `log_watchers` counts it out.
async fn stream_watch(
    ctx: &ShardCtx,
    stream: &mut TcpStream,
    wire: &Wire,
    watcher: &crate::server::shard::watch::Watcher,
    fd: i32,
) -> Ended {
    loop {
        if ctx.stop.fired() || super::conn::peer_gone(fd) {
            return Ended::Cut;
        }
        glommio::timer::sleep(crate::server::shard::watch::DRAIN_INTERVAL).await;
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
    lent: crate::server::exec::deferred::HeldLent,
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
    sent.into_result(ctx)?;
    ctx.counters.borrow_mut().bytes_written += (head_len + len) as u64;
    let mut counters = ctx.io.counters.borrow_mut();
    counters.heads_lent += 1;
    counters.head_bytes_lent += len as u64;
    Ok(())
}
