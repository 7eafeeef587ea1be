//! One serving executor (a shard): its connections, its ring and streaming pool, its per-core
//! block batch, the background work for the partitions it looks after, and its place in the
//! channel mesh.
//!
//! Requests never cross the mesh: a connection runs each request against the key's partition
//! on its own core (`execute.rs`). The mesh carries the control plane only: placement (the
//! master decides where a large value goes), statistics gathered from every core, and storage
//! changes every core must learn (mounts). A receiver never blocks on sending a reply (it hands
//! a full channel to a task), so two peers replying to each other cannot deadlock.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use glommio::channels::channel_mesh::Senders;
use glommio::channels::local_channel::{self, LocalSender};

use crate::placement::{Placed, PlacementError, PlacementRequest, PlacementStats, TargetId};
use crate::segment::{Extent, MountedTarget, SegmentSpec, TargetSpec, TargetStorage};

use super::counters::ConnCounters;
use super::event::LocalEvent;
use super::shared::unix_now;
use super::shared::{Peers, Shared};

/// A STAT group every shard answers for its own core (its connections and counters).
#[derive(Clone, Copy, Debug)]
pub enum StatQuery {
    Reset,
    Conns,
}

pub enum StatAnswer {
    Done,
    Conns(Vec<ConnRow>),
}

/// One connection's row.
#[derive(Clone, Debug)]
pub struct ConnRow {
    pub fd: i32,
    /// memcached's `addr` and `listen_addr` (`tcp:IP:PORT`, `unix:PATH`).
    pub addr: String,
    pub listen_addr: String,
    pub state: &'static str,
    pub idle_seconds: u64,
}

/// Messages between peers of the mesh (shards and the placement master).
pub enum Message {
    Request {
        from: usize,
        token: u64,
        request: ShardRequest,
    },
    Reply {
        token: u64,
        reply: ShardReply,
    },
}

/// Control-plane requests: to the placement master, or to every shard.
pub enum ShardRequest {
    /// To a shard: its per-core figures (STAT).
    Stats,
    /// To a shard: serve this accepted connection (its descriptor is the receiver's now),
    /// with what it came in over and its address's TLS.
    Adopt(
        std::os::fd::OwnedFd,
        super::endpoint::Endpoint,
        crate::config::ListenerTls,
    ),
    /// To a shard: a STAT group answered per core (connections).
    StatQuery(StatQuery),
    /// To the placement master: extents for a large value of `key`.
    Place {
        request: PlacementRequest,
        key: Vec<u8>,
    },
    /// To the placement master: an extent was just read (LRU order).
    Touch { target: TargetId, offset: u64 },
    /// To the placement master: extents no object uses any more.
    Free(Vec<(TargetId, Extent)>),
    /// To the placement master: its figures.
    PlacementStats,
    /// To the master: take exactly these extents for `key` (a warm restart), all or none.
    Claim {
        key: Vec<u8>,
        extents: Vec<(TargetId, Extent)>,
    },
    /// To the master: mount a segment (its targets start draining until activated).
    Mount(SegmentSpec),
    /// To the master: let placements use these targets.
    Activate(Vec<TargetId>),
    /// To the master: no new placements on a target.
    UnmountPrepare(TargetId),
    /// To the master: is the target prepared (draining)?
    UnmountCheck(TargetId),
    /// To the master: forget the target.
    UnmountCommit(TargetId),
    /// To every shard: the storage of newly mounted targets.
    AddStorage(Vec<(TargetId, TargetStorage)>),
    /// To every shard: forget this target's storage.
    RemoveStorage(TargetId),
}

impl ShardRequest {
    /// The counter this request is sent under (STAT `mesh_messages_*`): large values'
    /// placement, a connection handed over, or administration.
    fn counter<'a>(&self, sent: &'a mut MeshCounters) -> &'a mut u64 {
        match self {
            ShardRequest::Place { .. }
            | ShardRequest::Touch { .. }
            | ShardRequest::Free(_)
            | ShardRequest::Claim { .. } => &mut sent.placement,
            ShardRequest::Adopt(..) => &mut sent.connection,
            _ => &mut sent.control,
        }
    }
}

pub enum ShardReply {
    Done,
    /// A handed-off connection is served by the shard that answers.
    Adopted,
    Stats(Box<ShardSnapshot>),
    StatAnswer(StatAnswer),
    Placed(Result<Placed, PlacementError>),
    /// No room: evict these large values (least recently used) and ask again.
    EvictFirst(Vec<Victim>),
    Mounted(Result<Vec<(TargetId, MountedTarget)>, String>),
    Claimed(bool),
    Unmounted(Result<(), String>),
    PlacementStats(Box<MasterSnapshot>),
}

/// A large value the master wants evicted to make room.
#[derive(Clone, Debug)]
pub struct Victim {
    pub key: Vec<u8>,
    pub target: TargetId,
    pub offset: u64,
}

/// The placement master's figures, for STAT `segments` and `placement`.
#[derive(Clone, Debug, Default)]
pub struct MasterSnapshot {
    pub stats: PlacementStats,
    pub segment_evictions: u64,
    pub policy: &'static str,
    pub targets: Vec<TargetRow>,
}

/// One target's row in STAT `segments`.
#[derive(Clone, Debug)]
pub struct TargetRow {
    pub id: TargetId,
    pub spec: TargetSpec,
    pub capacity: u64,
    pub used: u64,
    pub largest_free: u64,
    pub objects: u64,
    pub draining: bool,
}

/// Mesh messages a shard sent, by purpose (STAT `mesh_*`): requests never send any.
#[derive(Clone, Copy, Debug, Default)]
pub struct MeshCounters {
    /// Placement of large values (to the master).
    pub placement: u64,
    /// Administration and statistics.
    pub control: u64,
    /// Accepted connections handed to another shard (one each, never per request).
    pub connection: u64,
}

/// One shard's figures, for STAT.
#[derive(Clone, Debug, Default)]
pub struct ShardSnapshot {
    pub conn: ConnCounters,
    pub io: super::wire::IoSnapshot,
    pub mesh: MeshCounters,
    /// Idle blocks in this core's batch.
    pub idle_blocks: u64,
    /// This shard's request latency histograms.
    pub latency: super::latency::LatencySnapshot,
    /// What its connections hold.
    pub conn_memory: ConnMemory,
}

/// What STAT `conns` shows of a live client connection (shared by the connection, which
/// updates it, and its shard's table).
#[derive(Debug)]
pub struct ConnInfo {
    pub fd: i32,
    pub endpoint: super::endpoint::Endpoint,
    /// memcached's state names: `conn_waiting`, `conn_parse_cmd`, `conn_nread`, `conn_write`.
    pub state: Cell<&'static str>,
    pub last_command: Cell<Instant>,
    /// Why it closed, for `watch connevents` (normal unless a protocol error closed it).
    pub close_reason: Cell<super::watch::CloseReason>,
    /// What the server holds for the connection besides buffers: its task, its state, its
    /// addresses (STAT `conn_bytes`), set when it starts.
    pub state_bytes: Cell<usize>,
    /// The capacity of the read buffer and the reply buffer it holds now (none while idle).
    pub buffers_held: Cell<(usize, usize)>,
}

/// What a shard's connections hold, and its buffer caches keep free (STAT `conn_bytes`,
/// `read_buf_*`).
#[derive(Clone, Debug, Default)]
pub struct ConnMemory {
    pub state_bytes: u64,
    /// Read buffers held by connections now, and their bytes.
    pub read_buffers_held: u64,
    pub read_buffer_bytes_held: u64,
    pub reply_buffer_bytes_held: u64,
    /// Read buffers kept free for the next connection that needs one, and their bytes.
    pub read_buffers_free: u64,
    pub read_buffer_bytes_free: u64,
    pub reply_buffer_bytes_free: u64,
}

impl ConnMemory {
    pub fn add(&mut self, o: &ConnMemory) {
        self.state_bytes += o.state_bytes;
        self.read_buffers_held += o.read_buffers_held;
        self.read_buffer_bytes_held += o.read_buffer_bytes_held;
        self.reply_buffer_bytes_held += o.reply_buffer_bytes_held;
        self.read_buffers_free += o.read_buffers_free;
        self.read_buffer_bytes_free += o.read_buffer_bytes_free;
        self.reply_buffer_bytes_free += o.reply_buffer_bytes_free;
    }

    /// What the connections hold: state and buffers lent to them (not the free ones).
    pub fn conn_bytes(&self) -> u64 {
        self.state_bytes + self.read_buffer_bytes_held + self.reply_buffer_bytes_held
    }
}

/// Everything a shard's tasks share (single-threaded; `Rc`).
pub struct ShardCtx {
    pub id: usize,
    pub shards: usize,
    pub shared: Arc<Shared>,
    pub counters: RefCell<ConnCounters>,
    /// Limits the log lines failed authentications provoke.
    pub auth_log: super::log_limit::LogLimiter,
    /// Lines for refused connections and for protocol errors from peers (each at most one
    /// per second per shard, saying how many were held back).
    pub refusal_log: super::log_limit::LogLimiter,
    pub peer_error_log: super::log_limit::LogLimiter,
    pub idle_log: super::log_limit::LogLimiter,
    /// Lines for large values: damaged on read, bodies that stalled, segment writes that
    /// failed (a client can provoke each of them over and over).
    pub crc_log: super::log_limit::LogLimiter,
    pub body_timeout_log: super::log_limit::LogLimiter,
    pub segment_write_log: super::log_limit::LogLimiter,
    /// This shard's client connections, by socket, for STAT `conns`.
    pub conns: RefCell<HashMap<i32, Rc<ConnInfo>>>,
    pub stop: LocalEvent,
    pub live_connections: Cell<usize>,
    /// The storage of every mounted target, by target id (`None`: unmounted).
    pub storage: RefCell<Vec<Option<TargetStorage>>>,
    /// The ring (if any), the streaming pool, and the data path's counters.
    pub io: super::wire::ShardIo,
    /// Request latency per command kind, recorded by this shard's connections
    /// ([`super::latency::LatencyHistograms::record`] says how).
    pub latency: super::latency::LatencyHistograms,
    mesh_sent: Cell<MeshCounters>,
    mesh: Rc<Senders<Message>>,
    peers: Peers,
    calls: Calls,
}

/// A peer's requests in flight: each waits, by token, for the reply its receiver delivers.
#[derive(Default)]
pub struct Calls {
    waiters: RefCell<HashMap<u64, LocalSender<ShardReply>>>,
    next_token: Cell<u64>,
}

impl Calls {
    /// Sends `request` to mesh peer `to` and waits for its reply (`Done` when the peer is gone).
    pub async fn call(
        &self,
        mesh: &Senders<Message>,
        to: usize,
        request: ShardRequest,
    ) -> ShardReply {
        let token = self.next_token.get();
        self.next_token.set(token + 1);
        let (tx, rx) = local_channel::new_bounded(1);
        self.waiters.borrow_mut().insert(token, tx);
        let message = Message::Request {
            from: mesh.peer_id(),
            token,
            request,
        };
        if mesh.send_to(to, message).await.is_err() {
            // Only at shutdown, after the peer finished: nothing will answer.
            tracing::debug!(peer = to, "a request found its peer gone");
            self.waiters.borrow_mut().remove(&token);
            return ShardReply::Done;
        }
        rx.recv().await.unwrap_or(ShardReply::Done)
    }

    /// Hands a reply to the request waiting for it.
    pub fn deliver(&self, token: u64, reply: ShardReply) {
        if let Some(tx) = self.waiters.borrow_mut().remove(&token) {
            let _ = tx.try_send(reply);
        }
    }
}

impl ShardCtx {
    pub fn new(
        id: usize,
        shared: Arc<Shared>,
        mesh: Senders<Message>,
        peers: Peers,
        io: super::wire::ShardIo,
    ) -> ShardCtx {
        let storage = shared
            .targets
            .iter()
            .map(|t| Some(t.storage.clone()))
            .collect();
        ShardCtx {
            id,
            shards: peers.shards.len(),
            peers,
            mesh: Rc::new(mesh),
            shared,
            counters: RefCell::new(ConnCounters::default()),
            auth_log: Default::default(),
            refusal_log: Default::default(),
            peer_error_log: Default::default(),
            idle_log: Default::default(),
            crc_log: Default::default(),
            body_timeout_log: Default::default(),
            segment_write_log: Default::default(),
            conns: RefCell::new(HashMap::new()),
            stop: LocalEvent::new(),
            live_connections: Cell::new(0),
            io,
            latency: super::latency::LatencyHistograms::new(),
            storage: RefCell::new(storage),
            mesh_sent: Cell::new(MeshCounters::default()),
            calls: Calls::default(),
        }
    }

    /// Answers a peer's request `token` without blocking ([`send_reply`]).
    pub fn reply_to(&self, peer: usize, token: u64, reply: ShardReply) {
        send_reply(&self.mesh, peer, token, reply);
    }

    /// Hands a peer's reply to the request of this shard waiting for it.
    pub fn deliver(&self, token: u64, reply: ShardReply) {
        self.calls.deliver(token, reply);
    }

    /// Sends a request to shard `to` and waits for its reply.
    pub async fn call(&self, to: usize, request: ShardRequest) -> ShardReply {
        self.call_peer(self.peers.shards[to], request).await
    }

    /// Sends a request to the placement master and waits for its reply.
    pub async fn call_master(&self, request: ShardRequest) -> ShardReply {
        self.call_peer(self.peers.master, request).await
    }

    async fn call_peer(&self, to: usize, request: ShardRequest) -> ShardReply {
        let mut sent = self.mesh_sent.get();
        *request.counter(&mut sent) += 1;
        self.mesh_sent.set(sent);
        self.calls.call(&self.mesh, to, request).await
    }

    /// Runs a request from another peer, synchronously (statistics queries aside: the
    /// receivers answer them, `tasks::spawn_receivers`).
    pub fn serve(&self, request: ShardRequest) -> ShardReply {
        match request {
            ShardRequest::Stats => ShardReply::Stats(Box::new(self.snapshot())),
            ShardRequest::StatQuery(_) => unreachable!("the receivers answer statistics queries"),
            ShardRequest::AddStorage(added) => {
                let mut table = self.storage.borrow_mut();
                for (id, storage) in added {
                    let at = id.0 as usize;
                    if table.len() <= at {
                        table.resize(at + 1, None);
                    }
                    table[at] = Some(storage);
                }
                ShardReply::Done
            }
            ShardRequest::RemoveStorage(target) => {
                if let Some(slot) = self.storage.borrow_mut().get_mut(target.0 as usize) {
                    *slot = None;
                }
                ShardReply::Done
            }
            ShardRequest::Adopt(..) => unreachable!("the receiver adopts connections"),
            ShardRequest::Place { .. }
            | ShardRequest::Touch { .. }
            | ShardRequest::Free(_)
            | ShardRequest::PlacementStats
            | ShardRequest::Mount(_)
            | ShardRequest::Claim { .. }
            | ShardRequest::Activate(_)
            | ShardRequest::UnmountPrepare(_)
            | ShardRequest::UnmountCheck(_)
            | ShardRequest::UnmountCommit(_) => {
                unreachable!("placement requests go to the master")
            }
        }
    }

    /// Serves `request` here as a peer would (storage changes every shard must learn).
    pub fn serve_local(&self, request: ShardRequest) -> ShardReply {
        self.serve(request)
    }

    pub fn snapshot(&self) -> ShardSnapshot {
        ShardSnapshot {
            conn: self.counters.borrow().clone(),
            io: self
                .io
                .snapshot(self.shared.connections_by_shard[self.id].load(Ordering::Acquire)),
            mesh: self.mesh_sent.get(),
            idle_blocks: crate::arena::batch::with_core_batch(|batch| batch.all_held().count())
                .unwrap_or(0) as u64,
            latency: self.latency.snapshot(),
            conn_memory: self.conn_memory(),
        }
    }

    /// What this shard's connections hold now, and its caches keep free.
    fn conn_memory(&self) -> ConnMemory {
        let mut memory = ConnMemory::default();
        for info in self.conns.borrow().values() {
            let (read, reply) = info.buffers_held.get();
            memory.state_bytes += info.state_bytes.get() as u64;
            memory.read_buffers_held += u64::from(read > 0);
            memory.read_buffer_bytes_held += read as u64;
            memory.reply_buffer_bytes_held += reply as u64;
        }
        let (read_free, reply_free) = (
            self.io.read_buffers.counts(),
            self.io.reply_buffers.counts(),
        );
        memory.read_buffers_free = read_free.free as u64;
        memory.read_buffer_bytes_free = read_free.free_bytes as u64;
        memory.reply_buffer_bytes_free = reply_free.free_bytes as u64;
        memory
    }

    /// Sends extents no item holds any more to the master, without waiting.
    pub fn free_extents(self: &Rc<Self>, extents: Vec<(TargetId, Extent)>) {
        if extents.is_empty() {
            return;
        }
        let ctx = Rc::clone(self);
        glommio::spawn_local(async move {
            ctx.call_master(ShardRequest::Free(extents)).await;
        })
        .detach();
    }
}

/// Sends a reply without ever blocking the receiver that produced it: a full channel hands
/// the reply to a task.
pub fn send_reply(mesh: &Rc<Senders<Message>>, to: usize, token: u64, reply: ShardReply) {
    let message = Message::Reply { token, reply };
    if let Err(err) = mesh.try_send_to(to, message) {
        let message = match err {
            glommio::GlommioError::WouldBlock(glommio::ResourceType::Channel(m)) => m,
            _ => return, // the peer is gone
        };
        let mesh = Rc::clone(mesh);
        glommio::spawn_local(async move {
            let _ = mesh.send_to(to, message).await;
        })
        .detach();
    }
}

/// How the stop reaches this shard's client connections. A connection waits on its socket
/// alone, with no stop waiter beside each read and write (that cost a map entry and a waker
/// clone per I/O), so the stop goes through the sockets: `Read` at the stop ends every
/// receive (0 bytes) and lets replies still being written go out; `Both`, after a grace, also
/// fails a send stuck on a peer that does not read. Each connection then cuts itself off.
/// A connection not yet registered here checks the stop event before its first read.
/// Returns how many connections it reached.
pub fn shut_connections(ctx: &ShardCtx, how: nix::sys::socket::Shutdown) -> usize {
    let conns = ctx.conns.borrow();
    for &fd in conns.keys() {
        if let Err(err) = nix::sys::socket::shutdown(fd, how) {
            tracing::debug!(shard = ctx.id, fd, %err, "shutting a connection down at stop");
        }
    }
    conns.len()
}

/// One promotion pass on a partition, logged when it moved anything.
pub fn promote(shared: &Shared, index: usize) -> crate::arena::PromotionReport {
    let budget = shared.settings.promotion_budget_blocks;
    let report = shared.partitions.lock(index).promote(budget, unix_now());
    if !report.exchanged.is_empty() {
        tracing::debug!(
            partition = index,
            exchanges = report.exchanged.len(),
            bytes_moved = report.bytes_moved,
            skipped_pinned = report.skipped_pinned,
            "promotion: hot heads exchanged into local blocks"
        );
    }
    report
}
