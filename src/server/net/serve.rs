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
use super::conn::{After, Conn, READ_BUFFER_BYTES};
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

/// The last replies of a pass, sent while the connection waits for its next bytes (ring path;
/// with one-shot receives, queued together with its next receive).
enum Pending {
    /// Reply bytes.
    Bytes(Vec<u8>),
    /// The replies up to a lent value, then the value, sent from where it lies.
    Lent(Vec<u8>, crate::server::exec::deferred::HeldLent),
}

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
/// a TCP client or a unix socket client; `tls`, a TLS client's session after its handshake.
pub async fn serve(
    ctx: Rc<ShardCtx>,
    mut stream: TcpStream,
    endpoint: Endpoint,
    tls: Option<TlsStage>,
) {
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
    });
    ctx.conns.borrow_mut().insert(info.fd, Rc::clone(&info));
    let watchers = &ctx.shared.watchers;
    watchers.conn_new(&info.endpoint, info.fd);
    let ended = serve_frames(&ctx, &mut stream, &wire, &info).await;
    ctx.conns.borrow_mut().remove(&info.fd);
    if ctx.stop.fired() {
        info.close_reason.set(watch::CloseReason::Shutdown);
    }
    watchers.conn_close(&info.endpoint, info.fd, info.close_reason.get());
    if ended == Ended::Quit {
        wire.end_session(&mut stream).await;
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
        framing: None,
        batch: BatchCounts::default(),
        peer: info.endpoint.peer.clone(),
        fd: info.fd,
    };
    let mut session = Session::New;
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
            let after = session
                .process(&mut conn, ctx, now.take().unwrap_or_else(unix_now))
                .await;
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
                        large::send_get(ctx, &mut SocketReply::new(ctx, (stream, wire), idle), get)
                            .await
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
                After::LargeSet(set, reply) => {
                    info.state.set("conn_nread");
                    let buffered = &conn.buf[conn.consumed..conn.filled];
                    let framing = (set.value_len, reply.trailer_bytes() as usize);
                    let mut body = SocketBody::new(ctx, (stream, wire), idle, buffered, framing);
                    let outcome = large::receive_set(ctx, &mut body, conn.fd, &set).await;
                    let used = body.used();
                    match outcome {
                        Ok(outcome) => {
                            reply.write(&mut conn.replies.out, outcome, set.hints.is_some());
                            conn.consume(used);
                        }
                        Err(err) => {
                            tracing::debug!(%err, "large value not received");
                            return Ended::Cut;
                        }
                    }
                    After::Process
                }
                other => other,
            };
            match after {
                After::Close => {
                    info.close_reason.set(watch::CloseReason::Error);
                    return Ended::Quit;
                }
                After::Quit => return Ended::Quit,
                _ => {}
            }
            if let After::Watch(watcher) = after {
                let ended = stream_watch(ctx, stream, wire, &watcher, conn.fd).await;
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
