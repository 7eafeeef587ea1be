//! A shard's I/O equipment: its io_uring ring (when the kernel allows one), its streaming
//! pool, and how a connection's bytes reach its socket.
//!
//! On the ring path every write goes through the
//! shard's io_uring ring: reply buffers with `SEND`, arena heads and pool chunks with
//! `SEND_ZC`. On the plain path (`--io-ring off`, or a ring the kernel refused) glommio
//! writes them. A connection uses one path for its whole life, so ring writes and glommio
//! writes are never in flight together on one socket. On the ring path a connection's
//! receive is armed once and stays armed (`ring::multishot`), or is one `RECV` per read
//! (`--multishot-receive off`, or a kernel before 6.0); a large value's body is
//! read by glommio, with the multishot receive paused first.

use std::cell::{Cell, RefCell};
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use futures_lite::AsyncWriteExt;
use glommio::net::TcpStream;

use crate::arena::BlockId;
use crate::buffer_cache::{BufferCache, BufferKind};
use crate::lent::Lent;
use crate::ring::buffers::FIXED_BUFFER_MAX_BYTES;
use crate::ring::multishot::Inbox;
use crate::ring::{Buf, FixedBuffers, ReapClock, Ring, Stamped, StreamPool, ZcReport};

use super::shared::Shared;
use super::tls_stage::{Opened, TlsStage};

/// Counters of the choices the data path made (STAT `io`, beside the ring's own).
#[derive(Clone, Debug, Default)]
pub struct PathCounters {
    /// Values (or heads) sent from their arena bytes, pinned, without a user-space copy
    /// (`SEND_ZC`, or `SEND` where zero-copy does not pay), and their bytes.
    pub heads_lent: u64,
    pub head_bytes_lent: u64,
    /// Times the ring path wanted a fixed buffer and the memory was not registered.
    pub fallbacks: u64,
    /// Large GETs that waited for a streaming pool chunk (the pool dry, the GET holding
    /// none of it).
    pub pool_waits: u64,
}

/// What STAT `io` shows of one shard.
#[derive(Clone, Debug, Default)]
pub struct IoSnapshot {
    pub path: String,
    pub ring: Option<crate::ring::RingStats>,
    pub counters: PathCounters,
    /// Streaming pool chunks: total, free now.
    pub pool_chunks: (usize, usize),
    /// Client connections this shard serves now (accepted here or handed to it).
    pub connections: usize,
}

impl IoSnapshot {
    /// `shardN_name value` pairs.
    pub fn pairs(&self, shard: usize) -> Vec<(String, String)> {
        let mut out = Vec::new();
        let mut put = |name: &str, value: String| out.push((format!("shard{shard}_{name}"), value));
        put("path", self.path.clone());
        put("connections", self.connections.to_string());
        put("pool_chunks", self.pool_chunks.0.to_string());
        put("pool_chunks_free", self.pool_chunks.1.to_string());
        put("heads_lent", self.counters.heads_lent.to_string());
        put("head_bytes_lent", self.counters.head_bytes_lent.to_string());
        put("fallbacks", self.counters.fallbacks.to_string());
        put("pool_waits", self.counters.pool_waits.to_string());
        let ring = self.ring.clone().unwrap_or_default();
        for (i, kind) in crate::ring::OpKind::ALL.iter().enumerate() {
            put(&format!("ops_{}", kind.name()), ring.ops[i].to_string());
            put(&format!("bytes_{}", kind.name()), ring.bytes[i].to_string());
        }
        put("op_errors", ring.errors.to_string());
        put("zc_notifications", ring.zc_notifications.to_string());
        put("zc_copied", ring.zc_copied.to_string());
        put(
            "lent_sends_huge_pages",
            ring.lent_sends_huge_pages.to_string(),
        );
        put(
            "lent_sends_kernel_copies",
            ring.lent_sends_kernel_copies.to_string(),
        );
        put("lent_sends_not_tcp", ring.lent_sends_not_tcp.to_string());
        put("in_flight", ring.in_flight.to_string());
        put("in_flight_max", ring.in_flight_max.to_string());
        put("ring_full_waits", ring.full_waits.to_string());
        put("cq_overflows", ring.cq_overflows.to_string());
        put("cancels", ring.cancels.to_string());
        put("ring_wakeups", ring.wakeups.to_string());
        put("ring_submits", ring.submits.to_string());
        put("ring_entries_submitted", ring.entries_submitted.to_string());
        put("ring_task_runs", ring.task_runs.to_string());
        put("ring_files_registered", ring.files_registered.to_string());
        put("ring_files_full", ring.files_full.to_string());
        put("receives_armed", ring.receives_armed.to_string());
        put(
            "receives_out_of_buffers",
            ring.receives_out_of_buffers.to_string(),
        );
        put("receives_paused", ring.receives_paused.to_string());
        out
    }
}

/// A connection's read buffer, taken when bytes arrive for it. A frame or line that needs
/// more doubles it (at least), so a long line takes a few reads of growing size, never one
/// read per byte. memcached's is the same size.
pub(crate) const READ_BUFFER_BYTES: usize = 16 << 10;

/// Read and reply buffers a shard keeps free for its connections, at most (a burst of busy
/// connections past this gives the rest back to the allocator).
const CACHED_BUFFERS_MAX: usize = 256;
/// A reply buffer that grew past this (a big multiget) is not kept for the next connection.
const REPLY_BUFFER_KEPT_MAX_BYTES: usize = 64 << 10;
/// A reply buffer's first capacity: most passes' replies fit, and a pass whose replies do
/// not grows it (and a grown one, up to `REPLY_BUFFER_KEPT_MAX_BYTES`, is kept for reuse).
const REPLY_BUFFER_BYTES: usize = 1 << 10;

/// One shard's ring, streaming pool and counters.
pub struct ShardIo {
    pub ring: Option<Rc<Ring>>,
    pub pool: Rc<StreamPool>,
    /// Connections' read buffers and reply buffers, lent while they have requests to run.
    pub read_buffers: Rc<BufferCache>,
    pub reply_buffers: Rc<BufferCache>,
    /// Which path runs, and why.
    pub path: String,
    pub counters: RefCell<PathCounters>,
    stream_blocks: Vec<BlockId>,
    zero_copy_min_bytes: usize,
}

impl ShardIo {
    /// Takes this shard's streaming blocks and, unless `--io-ring off`, creates its ring with
    /// the whole arena registered. A refused ring is said once per process, with the reason,
    /// and the shard runs on the plain path.
    pub fn setup(shared: &Shared, shard: usize) -> ShardIo {
        let settings = &shared.settings;
        let arena = &shared.arena;
        let stream_blocks = arena.take_stream_blocks(settings.io_pool_bytes);
        let ranges: Vec<(usize, usize)> = stream_blocks
            .iter()
            .map(|&b| arena.block_range(b))
            .collect();
        let (ring, path) = if !settings.io_ring {
            (None, "plain (--io-ring off)".to_string())
        } else {
            let piece = FIXED_BUFFER_MAX_BYTES
                - FIXED_BUFFER_MAX_BYTES % settings.arena.block_bytes as usize;
            let ring = FixedBuffers::cut(
                &arena.region_ranges(),
                piece
                    .max(settings.arena.block_bytes as usize)
                    .min(FIXED_BUFFER_MAX_BYTES),
            )
            .and_then(|buffers| {
                Ring::new(buffers, arena.huge_page_ranges(), settings.max_connections)
            });
            match ring {
                Ok(ring) => {
                    let receives = if !settings.multishot_receive {
                        "one-shot receives (--multishot-receive off)".to_string()
                    } else {
                        match ring.provide_receive_buffers() {
                            Ok(()) => "multishot receives".to_string(),
                            Err(reason) => {
                                if !shared.multishot_fallback_said.swap(true, Ordering::AcqRel) {
                                    tracing::info!(shard, %reason, "multishot receives are unavailable; one receive per read");
                                }
                                format!("one-shot receives ({reason})")
                            }
                        }
                    };
                    // glommio's own sleep (`--ring-sleep off`) asks the same of the kernel.
                    let sleeps = if ring.sleeps_idle() {
                        "sleeps count as idle"
                    } else {
                        "sleeps count as I/O wait"
                    };
                    let path = format!(
                        "ring ({} bytes of arena in {} fixed buffers, {} registered-file slots, {sleeps}, {receives})",
                        ring.buffers().total_bytes(),
                        ring.buffers().len(),
                        ring.file_slots()
                    );
                    (Some(ring), path)
                }
                Err(reason) => {
                    if !shared.io_fallback_said.swap(true, Ordering::AcqRel) {
                        tracing::warn!(shard, %reason, "the io_uring data path is unavailable; serving on the plain path");
                    }
                    (None, format!("plain ({reason})"))
                }
            }
        };
        if let Some(ring) = &ring {
            ring.spawn_driver(settings.ring_sleep);
        }
        if shard == 0 {
            tracing::info!(path = %path, io_pool_bytes = settings.io_pool_bytes, "data path");
        }
        // SAFETY: the blocks were taken out of the arena's pool for this shard alone, are
        // aligned to the block size (a multiple of the chunk), and go back only in `close`,
        // after every chunk has come home.
        let pool = unsafe {
            StreamPool::new(
                &ranges,
                settings.arena.io_chunk_bytes as usize,
                ring.as_ref().map(|r| r.buffers()),
            )
        };
        let read_bytes = READ_BUFFER_BYTES;
        ShardIo {
            ring,
            pool,
            read_buffers: Rc::new(BufferCache::new(
                BufferKind::Read { bytes: read_bytes },
                read_bytes,
                CACHED_BUFFERS_MAX,
            )),
            reply_buffers: Rc::new(BufferCache::new(
                BufferKind::Reply {
                    bytes: REPLY_BUFFER_BYTES,
                },
                REPLY_BUFFER_KEPT_MAX_BYTES,
                CACHED_BUFFERS_MAX,
            )),
            path,
            counters: RefCell::new(PathCounters::default()),
            stream_blocks,
            zero_copy_min_bytes: settings.zero_copy_min_bytes as usize,
        }
    }

    /// GET values from this size up are lent zero-copy (`None` on the plain path).
    pub fn lend_from(&self) -> Option<usize> {
        self.ring.as_ref().map(|_| self.zero_copy_min_bytes)
    }

    /// This shard's figures; `connections` is how many client connections it serves now.
    pub fn snapshot(&self, connections: usize) -> IoSnapshot {
        IoSnapshot {
            connections,
            path: self.path.clone(),
            ring: self.ring.as_ref().map(|r| r.stats()),
            counters: self.counters.borrow().clone(),
            pool_chunks: self.pool.counts(),
        }
    }

    /// At shutdown: waits for the ring's last operations, stops its driver and gives the
    /// streaming blocks back.
    pub async fn close(&self, shared: &Shared) {
        if let Some(ring) = &self.ring {
            let drained = glommio::timer::timeout(std::time::Duration::from_secs(10), async {
                ring.drain().await;
                Ok(())
            })
            .await;
            if drained.is_err() {
                tracing::error!(stats = ?ring.stats(), "ring operations still in flight at shutdown");
            }
            ring.stop();
        }
        let (total, free) = self.pool.counts();
        if total == free {
            shared.arena.give_stream_blocks(&self.stream_blocks);
        }
    }
}

pub struct Wire {
    ring: Option<Rc<Ring>>,
    fd: RawFd,
    /// What this connection's zero-copy notifications said.
    zc: Rc<ZcReport>,
    /// Ring path with multishot receives: what the connection's receive brought.
    inbox: Option<Rc<Inbox>>,
    /// Ring path: the receive's message header and control space, reused (none while a
    /// receive holds it), and whether the socket timestamps what it receives.
    stamped: RefCell<Option<Box<Stamped>>>,
    stamps: bool,
    /// When the bytes of the last completed read reached the socket (see [`Wire::arrived`]).
    arrived: Cell<Option<Instant>>,
    /// Whether the socket is in the ring's registered-file table.
    registered: Cell<bool>,
    /// A TLS connection's session: every byte read is opened by it, every byte written sealed
    /// (boxed: a plain connection holds a pointer, not a session's worth of bytes).
    tls: Option<Box<TlsStage>>,
    /// Where a read into an idle connection's empty buffer takes one.
    read_buffers: Rc<BufferCache>,
}

/// A receive timestamp further back than this is taken for a clock step, not a wait.
const STAMP_AGE_MAX: Duration = Duration::from_secs(10);

impl Wire {
    /// The data path of a new connection on `stream`, through the shard's `io`; with
    /// `receive_timestamps` (and a ring, and a TCP client) the kernel's receive time starts
    /// each request's latency. Sends are zero-copy only where `endpoint`'s socket takes them.
    pub fn new(
        io: &ShardIo,
        receive_timestamps: bool,
        stream: &TcpStream,
        endpoint: &super::endpoint::Endpoint,
        tls: Option<Box<TlsStage>>,
    ) -> Wire {
        let fd = stream.as_raw_fd();
        let ring = io.ring.clone();
        // The kernel's receive time starts a request's latency where the bytes arrived,
        // before this shard woke up to reap them (docs/server.md, "Latency").
        let stamps = ring.is_some()
            && receive_timestamps
            && endpoint.receive_timestamps()
            && crate::sys::enable_receive_timestamps(fd)
                .inspect_err(|err| tracing::debug!(%err, "no receive timestamps"))
                .is_ok();
        // Taken out again by `finish`, or when this is dropped, in both cases before the
        // descriptor is closed (glommio's `close` only shuts the socket down; the descriptor
        // goes when the stream is dropped): a descriptor number reused by the next
        // connection must find no stale slot.
        let registered = ring.as_ref().is_some_and(|ring| ring.register_fd(fd));
        let inbox = ring
            .as_ref()
            .filter(|ring| ring.multishot())
            .map(|_| Rc::new(Inbox::new(stamps, Rc::clone(&io.read_buffers))));
        Wire {
            ring,
            inbox,
            fd,
            zc: Rc::new(match endpoint.zero_copy() {
                true => ZcReport::default(),
                false => ZcReport::unsupported(),
            }),
            stamped: RefCell::new(None),
            stamps,
            arrived: Cell::new(None),
            registered: Cell::new(registered),
            tls,
            read_buffers: Rc::clone(&io.read_buffers),
        }
    }

    /// What the wire holds apart from itself: its inbox, zero-copy report and TLS session
    /// (their structs; a TLS session's own buffers are not counted).
    pub fn state_bytes(&self) -> usize {
        let inbox = self
            .inbox
            .as_ref()
            .map_or(0, |_| std::mem::size_of::<Inbox>());
        let tls = self
            .tls
            .as_ref()
            .map_or(0, |_| std::mem::size_of::<TlsStage>());
        inbox + std::mem::size_of::<ZcReport>() + tls
    }

    /// Takes the socket out of the ring's registered-file table (once).
    fn unregister(&self) {
        if let (Some(ring), true) = (&self.ring, self.registered.replace(false)) {
            ring.unregister_fd(self.fd);
        }
    }

    /// When the bytes of the last completed read arrived: the kernel's receive timestamp
    /// where the socket has one (ring path), else the read's completion. A request's latency
    /// runs from here.
    pub fn arrived(&self) -> Instant {
        self.arrived.get().unwrap_or_else(Instant::now)
    }

    /// Seconds since the Unix epoch, for the requests a connection runs right after a read. On
    /// the ring path the clock the reap that took the receive read (at most one executor pass
    /// old), else the clock.
    pub fn unix_now(&self) -> u32 {
        match &self.ring {
            Some(ring) => ring.reaped_at().unix_s(),
            None => super::shared::unix_now(),
        }
    }

    /// Reads into `buf[at..]`: on the ring a `RECV` queued with the pass's other entries, else
    /// glommio's read; over TLS, the plaintext of what arrived. Returns the bytes read (0: the
    /// peer closed). `buf` may be an idle connection's empty buffer (at 0): it gets one of the
    /// shard's read buffers when bytes come (with multishot receives and on the plain path; a
    /// one-shot receive or a TLS session needs it while waiting). If this future is dropped
    /// midway on the ring path, `buf` is left empty (the connection is ending anyway).
    pub async fn read(
        &self,
        stream: &mut TcpStream,
        buf: &mut Vec<u8>,
        at: usize,
    ) -> io::Result<usize> {
        if buf.is_empty() && self.waits_with_buffer() {
            *buf = self.read_buffers.take();
        }
        match &self.tls {
            Some(tls) => self.tls_read(tls, stream, &mut buf[at..]).await,
            None => self.socket_read(stream, buf, at).await,
        }
    }

    /// Whether a read holds its buffer while it waits: a one-shot receive (the kernel needs
    /// somewhere to put the bytes) or a TLS session's. Multishot receives and the plain path
    /// wait without one.
    pub fn waits_with_buffer(&self) -> bool {
        self.tls.is_some() || (self.ring.is_some() && self.inbox.is_none())
    }

    /// [`Wire::read`] for an idle connection (`buf` empty, nothing buffered): with multishot
    /// receives and on the plain path it waits holding no buffer and its future is a few
    /// words, since it is all an idle connection's task holds; a one-shot receive or a TLS
    /// session reads as [`Wire::read`] does, boxed.
    pub async fn read_idle(&self, stream: &mut TcpStream, buf: &mut Vec<u8>) -> io::Result<usize> {
        debug_assert!(
            buf.is_empty() || self.waits_with_buffer(),
            "an idle connection buffers nothing"
        );
        match (&self.tls, &self.ring, &self.inbox) {
            (None, Some(ring), Some(inbox)) => {
                self.arrived.set(None);
                ring.wait_received(self.fd, inbox).await;
                let result = inbox.take_received(buf);
                self.multishot_arrived(ring, inbox);
                result
            }
            (None, None, _) => {
                self.arrived.set(None);
                self.plain_read_idle(stream, buf).await
            }
            _ => Box::pin(self.read(stream, buf, 0)).await,
        }
    }

    /// Sets when a multishot receive's bytes arrived: its kernel timestamp, placed against the
    /// reap that took it, else the reap.
    fn multishot_arrived(&self, ring: &Ring, inbox: &Inbox) {
        let reaped = ring.reaped_at();
        self.arrived.set(Some(match inbox.received_ns() {
            Some(received_ns) => arrival(received_ns, reaped),
            None => reaped.instant,
        }));
    }

    /// Opens records into `into` until some plaintext comes (0: the client ended the session
    /// or closed), reading the socket for more ciphertext when no whole record is left. What
    /// the session has to say back (an alert, a key update) goes out before.
    async fn tls_read(
        &self,
        tls: &TlsStage,
        stream: &mut TcpStream,
        into: &mut [u8],
    ) -> io::Result<usize> {
        loop {
            let opened = tls.open(into);
            if tls.wants_send() {
                self.send_sealed(tls, Some(stream), 0).await?;
            }
            match opened? {
                Opened::Plain(n) => return Ok(n),
                Opened::End => return Ok(0),
                Opened::NeedBytes => {}
            }
            let (mut buf, filled) = tls.receive_room();
            let read = self.socket_read(stream, &mut buf, filled).await;
            let n = *read.as_ref().unwrap_or(&0);
            tls.received(buf, filled + n);
            if read? == 0 {
                return Ok(0);
            }
        }
    }

    /// Reads the socket into `buf[at..]`: [`Wire::read`] without TLS.
    async fn socket_read(
        &self,
        stream: &mut TcpStream,
        buf: &mut Vec<u8>,
        at: usize,
    ) -> io::Result<usize> {
        self.arrived.set(None);
        match (&self.ring, &self.inbox) {
            (Some(ring), Some(inbox)) => {
                let result = ring.recv_multishot(self.fd, inbox, buf, at).await;
                self.multishot_arrived(ring, inbox);
                result
            }
            (Some(ring), None) if self.stamps => {
                let mut stamped = self.stamped.take().unwrap_or_else(Stamped::new);
                stamped.buf = std::mem::take(buf);
                let (result, mut back) = ring.recv_stamped(self.fd, stamped, at).await;
                *buf = std::mem::take(&mut back.buf);
                let reaped = ring.reaped_at();
                self.arrived.set(Some(match back.received_ns() {
                    Some(received_ns) => arrival(received_ns, reaped),
                    None => reaped.instant,
                }));
                self.stamped.replace(Some(back));
                result
            }
            (Some(ring), None) => {
                let (result, back) = ring.recv(self.fd, std::mem::take(buf), at).await;
                *buf = back;
                self.arrived.set(Some(ring.reaped_at().instant));
                result
            }
            (None, _) if buf.is_empty() => self.plain_read_idle(stream, buf).await,
            (None, _) => futures_lite::AsyncReadExt::read(stream, &mut buf[at..]).await,
        }
    }

    /// The plain path's read for an idle connection: a read buffer is taken only while glommio
    /// tries the socket, and given back while it waits for the socket to be readable (its
    /// `poll_read` tries a non-blocking receive, then waits for readiness holding no buffer).
    async fn plain_read_idle(
        &self,
        stream: &mut TcpStream,
        buf: &mut Vec<u8>,
    ) -> io::Result<usize> {
        std::future::poll_fn(|cx| {
            let mut taken = self.read_buffers.take();
            match futures_lite::AsyncRead::poll_read(
                std::pin::Pin::new(&mut *stream),
                cx,
                &mut taken,
            ) {
                std::task::Poll::Ready(Ok(n)) if n > 0 => {
                    *buf = taken;
                    std::task::Poll::Ready(Ok(n))
                }
                other => {
                    self.read_buffers.give(taken);
                    other
                }
            }
        })
        .await
    }

    /// Reads into `into` outside the connection's read buffer (a large value's body): with
    /// glommio, after pausing a multishot receive and taking what it had brought first.
    pub async fn read_into(&self, stream: &mut TcpStream, into: &mut [u8]) -> io::Result<usize> {
        // Over TLS the ciphertext comes in the stage's buffer, through the same receive.
        if let Some(tls) = &self.tls {
            return self.tls_read(tls, stream, into).await;
        }
        if let (Some(ring), Some(inbox)) = (&self.ring, &self.inbox) {
            if inbox.armed() {
                ring.pause_receive(inbox).await;
            }
            let n = inbox.take_spilled(into);
            if n > 0 {
                return Ok(n);
            }
            if let Some(end) = inbox.ended() {
                return end;
            }
        }
        futures_lite::AsyncReadExt::read(stream, into).await
    }

    /// Writes all of `bytes` and hands the buffer back for reuse.
    pub async fn write(&self, stream: &mut TcpStream, bytes: Vec<u8>) -> io::Result<Vec<u8>> {
        if let Some(tls) = &self.tls {
            self.seal_and_send(tls, Some(stream), &[&bytes]).await?;
            return Ok(bytes);
        }
        self.socket_write(Some(stream), bytes).await
    }

    /// Writes all of `bytes` to the socket (`stream` is the plain path's) and hands the buffer
    /// back: [`Wire::write`] without TLS.
    async fn socket_write(
        &self,
        stream: Option<&mut TcpStream>,
        bytes: Vec<u8>,
    ) -> io::Result<Vec<u8>> {
        match &self.ring {
            Some(ring) => ring.send_all(self.fd, bytes).await,
            None => {
                let stream = stream.expect("the plain path writes through its stream");
                stream.write_all(&bytes).await?;
                Ok(bytes)
            }
        }
    }

    /// Seals `parts` (one reply) and sends their records, sealing at most
    /// `--tls-write-buffer` of plaintext ahead of what the socket has taken: a large value's
    /// records are never all held at once. A connection writes one reply at a time, so no
    /// other reply's records come between the pieces.
    async fn seal_and_send(
        &self,
        tls: &TlsStage,
        mut stream: Option<&mut TcpStream>,
        parts: &[&[u8]],
    ) -> io::Result<()> {
        let reply_bytes: usize = parts.iter().map(|part| part.len()).sum();
        let ahead_max = tls.write_buffer_bytes();
        if reply_bytes <= ahead_max {
            tls.seal(parts);
            return self.send_sealed(tls, stream, reply_bytes).await;
        }
        let mut ahead = 0;
        for part in parts {
            let mut rest = *part;
            while !rest.is_empty() {
                let (piece, after) = rest.split_at(rest.len().min(ahead_max - ahead));
                ahead += tls.seal(&[piece]);
                rest = after;
                if ahead == ahead_max {
                    // The whole reply's size picks how its records are sent.
                    self.send_sealed(tls, stream.as_deref_mut(), reply_bytes)
                        .await?;
                    ahead = 0;
                }
            }
        }
        if ahead > 0 {
            self.send_sealed(tls, stream, reply_bytes).await?;
        }
        Ok(())
    }

    /// Sends every record the session has sealed, in order, in this connection's send turn
    /// (`tls_stage.rs`). `stream` is the plain path's. `sealed_bytes`: the plaintext just
    /// sealed; from [`SEND_NOW_FROM_BYTES`] the records go straight from the session as far as
    /// the socket takes them, and each wait for room is followed by another try.
    async fn send_sealed(
        &self,
        tls: &TlsStage,
        mut stream: Option<&mut TcpStream>,
        sealed_bytes: usize,
    ) -> io::Result<()> {
        let _turn = tls.send_turn().await;
        loop {
            if sealed_bytes >= SEND_NOW_FROM_BYTES {
                tls.send_now(self.fd)?;
            }
            let records = tls.next_records()?;
            if records.is_empty() {
                tls.sent(records);
                return Ok(());
            }
            let back = self.socket_write(stream.as_deref_mut(), records).await?;
            tls.sent(back);
        }
    }

    /// A TLS connection that ends politely (QUIT, a protocol error) tells the client so
    /// (close_notify), as far as the socket takes it.
    pub async fn end_session(&self, stream: &mut TcpStream) {
        if let Some(tls) = &self.tls {
            tls.seal_close();
            if let Err(err) = self.send_sealed(tls, Some(stream), 0).await {
                tracing::debug!(%err, "close_notify not sent");
            }
        }
    }

    /// Writes lent bytes (an arena head, a pool chunk, a memory segment's extent) from
    /// where they are: on the ring with `SEND_ZC`, or `SEND` from huge pages or when the
    /// kernel copies anyway; the memory is released when the kernel is done with it.
    pub async fn write_lent(&self, stream: &mut TcpStream, lent: Lent) -> io::Result<()> {
        if let Some(tls) = &self.tls {
            // Sealing reads the lent bytes where they are; they are released once the last
            // part is sealed and sent.
            return self.seal_and_send(tls, Some(stream), &lent.slices()).await;
        }
        match &self.ring {
            Some(ring) => {
                ring.send_lent_all(self.fd, Buf::Lent(Rc::new(lent)), &self.zc)
                    .await
            }
            None => {
                for run in lent.slices() {
                    stream.write_all(run).await?;
                }
                Ok(())
            }
        }
    }

    /// Writes `head` then the lent bytes: on the ring, where a zero-copy send does not pay,
    /// as one `SENDMSG` of both (no copy of the lent bytes, one operation); else the head,
    /// then the lent bytes as [`Wire::write_lent`] sends them.
    pub async fn write_head_and_lent(
        &self,
        stream: &mut TcpStream,
        head: Vec<u8>,
        lent: Lent,
    ) -> io::Result<()> {
        if let Some(tls) = &self.tls {
            let [first, second] = lent.slices();
            return self
                .seal_and_send(tls, Some(stream), &[&head, first, second])
                .await;
        }
        if self.ring.is_some() {
            return self.write_head_and_lent_queued(head, lent).await.map(drop);
        }
        if !head.is_empty() {
            self.write(stream, head).await?;
        }
        self.write_lent(stream, lent).await
    }

    /// [`Wire::write_head_and_lent`] on the ring path, which needs no stream: queued with the
    /// pass's other entries, so it can go out together with the connection's next receive.
    /// Hands the header's buffer back, emptied, for reuse.
    pub async fn write_head_and_lent_queued(
        &self,
        head: Vec<u8>,
        lent: Lent,
    ) -> io::Result<Vec<u8>> {
        if let Some(tls) = &self.tls {
            let [first, second] = lent.slices();
            self.seal_and_send(tls, None, &[&head, first, second])
                .await?;
            drop(lent);
            let mut head = head;
            head.clear();
            return Ok(head);
        }
        let ring = self
            .ring
            .as_ref()
            .expect("queued writes are the ring path's");
        if ring.lent_goes_plain(lent.first_addr(), &self.zc) {
            return ring.send_pair_all(self.fd, head, lent).await;
        }
        let mut head = if head.is_empty() {
            head
        } else {
            ring.send_all(self.fd, head).await?
        };
        ring.send_lent_all(self.fd, Buf::Lent(Rc::new(lent)), &self.zc)
            .await?;
        head.clear();
        Ok(head)
    }

    /// Waits until no ring operation on the socket is left, notifications included, so the
    /// socket may be closed. A connection being cut off (client gone, idle, shutdown) has its
    /// operations cancelled and the connection reset at once: zero-copy sends still queued
    /// would otherwise hold their memory until a stalled peer reads. A polite close (QUIT)
    /// lets the peer take what was sent for up to [`POLITE_CLOSE_SECONDS`] first. Then the
    /// socket leaves the ring's registered-file table, before the caller closes it.
    pub async fn finish(&self, cut: bool) {
        self.quiesce(cut).await;
        self.unregister();
    }

    async fn quiesce(&self, cut: bool) {
        let Some(ring) = &self.ring else {
            return;
        };
        // An armed receive would keep the socket busy for as long as it is open.
        if let Some(inbox) = &self.inbox {
            ring.cancel_receive(inbox);
        }
        if !cut {
            let limit = std::time::Duration::from_secs(POLITE_CLOSE_SECONDS);
            let drained = glommio::timer::timeout(limit, async {
                ring.quiesce(self.fd).await;
                Ok(())
            })
            .await;
            if drained.is_ok() {
                return;
            }
        }
        if ring.busy(self.fd) {
            ring.cancel_fd(self.fd);
            if let Err(err) = crate::sys::tcp_abort(self.fd) {
                tracing::debug!(%err, "resetting a connection with sends in flight");
            }
        }
        ring.quiesce(self.fd).await;
    }
}

impl Drop for Wire {
    /// A connection whose task was dropped before `finish` (operations may still be in flight:
    /// the ring empties the slot after the last one). An armed receive is cancelled: it would
    /// otherwise keep the socket's slot, and so the socket, open for good.
    fn drop(&mut self) {
        if let (Some(ring), Some(inbox)) = (&self.ring, &self.inbox) {
            ring.cancel_receive(inbox);
        }
        self.unregister();
    }
}

/// The monotonic instant of a receive timestamp (`CLOCK_REALTIME` nanoseconds): the reap that
/// took the receive, less how long before it the realtime clock says the bytes came. A
/// timestamp in the future or implausibly old (the realtime clock stepped) counts as the reap.
fn arrival(received_ns: u64, reaped: ReapClock) -> Instant {
    let now = reaped.instant;
    let waited = Duration::from_nanos(reaped.unix_ns.saturating_sub(received_ns));
    if waited > STAMP_AGE_MAX {
        return now;
    }
    now.checked_sub(waited).unwrap_or(now)
}

/// A TLS reply of at least this much plaintext is sent straight from the session's records
/// ([`TlsStage::send_now`]): below it, copying the records into the send buffer, sent with
/// the pass's other sends, costs less than a system call of its own.
const SEND_NOW_FROM_BYTES: usize = 64 << 10;

/// How long a QUIT waits for its peer to take the replies before the connection is reset.
pub const POLITE_CLOSE_SECONDS: u64 = 5;
