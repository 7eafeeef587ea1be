//! One shard: its store, its place in the channel mesh, its listener and its background
//! tasks. Cross-shard traffic is two kinds of message on one full mesh: requests (a batch of
//! frames for keys this shard owns, a flush, a stats snapshot) and replies. A receiver never
//! blocks on sending a reply (it hands a full channel to a task), so two shards replying to
//! each other cannot deadlock.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use glommio::channels::channel_mesh::{Receivers, Senders};
use glommio::channels::local_channel::{self, LocalSender};
use glommio::net::TcpListener;

use crate::arena::ShardArenaStats;
use crate::placement::{Placed, PlacementError, PlacementRequest, PlacementStats, TargetId};
use crate::proto::{decode, Decoded, StoreMode};
use crate::segment::{Extent, MountedTarget, SegmentSpec, TargetSpec, TargetStorage};
use crate::store::{LargeLink, Store, StoreOutcome, StoreStats};

use super::event::LocalEvent;
use super::execute::{execute_keyed, Deferred};
use super::large::SegmentFiles;
use super::{unix_now, ConnCounters, Shared};

/// Messages between shards.
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

pub enum ShardRequest {
    /// Frames for keys the receiver owns, to run in order; `buf` holds them back to back.
    Batch {
        buf: Vec<u8>,
        ops: Vec<RemoteOp>,
        /// Values of at least this many bytes are pinned and lent to the caller's zero-copy
        /// send instead of copied (the caller's ring decides).
        lend_from: Option<usize>,
    },
    Flush {
        delay: u32,
    },
    Stats,
    /// A STAT group every shard answers for itself (detail, reset, sizes, conns).
    StatQuery(super::stats::StatQuery),
    /// To the placement master: extents for a large value of `key`.
    Place {
        request: PlacementRequest,
        key: Vec<u8>,
    },
    /// To the placement master: an extent was just read (LRU order).
    Touch {
        target: TargetId,
        offset: u64,
    },
    /// To a key's owner: evict this large value if it still lives at that extent; answer with
    /// every extent now free.
    EvictLarge {
        key: Vec<u8>,
        target: TargetId,
        offset: u64,
    },
    /// To the placement master: extents no object uses any more.
    Free(Vec<(TargetId, Extent)>),
    /// To the placement master: its figures.
    PlacementStats,
    /// To a key's owner: link a large value already written to its extents.
    LinkLarge {
        mode: StoreMode,
        key: Vec<u8>,
        flags: u32,
        expiry: u32,
        cas: u64,
        link: LargeLink,
    },
    /// To a key's owner: would a large SET/ADD/REPLACE be refused right now? (Checked again
    /// at the link.)
    CheckLarge {
        mode: StoreMode,
        key: Vec<u8>,
        cas: u64,
    },
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
    /// To every shard: drop every item with a replica on this target.
    DropTarget(TargetId),
    /// To every shard: forget this target's storage.
    RemoveStorage(TargetId),
    /// To a key's owner: a reader is done with a large item's extents.
    Release {
        lease: u64,
    },
    /// To a key's owner: a zero-copy send of a value it pinned is done.
    Unpin {
        pin: crate::arena::SendPin,
    },
    /// To every shard: run a promotion pass now.
    Promote,
    /// To a key's owner: where is the key's fixed head (ADMIN `where`)?
    Where(Vec<u8>),
}

/// One operation of a batch.
pub enum RemoteOp {
    /// A whole request frame at `buf[start..end]`.
    Frame { start: u32, end: u32 },
    /// A store over the size limit whose value was never read: refuse it (and for SET drop the
    /// old value) under the key at `buf[start..end]`.
    TooLarge {
        start: u32,
        end: u32,
        drop_existing: bool,
        opcode: u8,
        opaque: u32,
    },
}

pub enum ShardReply {
    /// Replies of a batch, back to back: op `i` answered `out[ends[i-1]..ends[i]]`.
    Batch {
        out: Vec<u8>,
        ends: Vec<u32>,
        /// Ops whose value the caller sends itself (large, or lent), after the op's bytes.
        deferred: Vec<(u32, Deferred)>,
    },
    Done,
    Linked(StoreOutcome),
    Stats(Box<ShardSnapshot>),
    StatAnswer(super::stats::StatAnswer),
    Placed(Result<Placed, PlacementError>),
    /// No room: evict these large values (least recently used) and ask again.
    EvictFirst(Vec<Victim>),
    /// Extents freed by an eviction.
    Evicted(Vec<(TargetId, Extent)>),
    Mounted(Result<Vec<(TargetId, MountedTarget)>, String>),
    Claimed(bool),
    Unmounted(Result<(), String>),
    /// Items dropped with an unmounted target, and the extents they held.
    Dropped {
        items: u64,
        extents: Vec<(TargetId, Extent)>,
    },
    PlacementStats(Box<MasterSnapshot>),
    /// A promotion pass: exchanges, bytes moved, blocks skipped for pins.
    Promoted {
        exchanges: u64,
        bytes_moved: u64,
        skipped_pinned: u64,
    },
    /// The sentence answering ADMIN `where`.
    Located(Result<String, String>),
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

/// Mesh peer ids: each shard's (by key-space index) and the placement master's.
#[derive(Clone, Debug)]
pub struct Peers {
    pub shards: Vec<usize>,
    pub master: usize,
}

/// One shard's figures, for STAT.
#[derive(Clone, Debug, Default)]
pub struct ShardSnapshot {
    pub store: StoreStats,
    pub arena: ShardArenaStats,
    pub conn: ConnCounters,
    pub io: super::wire::IoSnapshot,
}

/// Everything a shard's tasks share (single-threaded; `Rc`).
pub struct ShardCtx {
    pub id: usize,
    pub shards: usize,
    pub store: RefCell<Store>,
    pub shared: Arc<Shared>,
    pub counters: RefCell<ConnCounters>,
    /// Limits the log lines failed authentications provoke.
    pub auth_log: super::log_limit::LogLimiter,
    /// This shard's client connections, by socket, for STAT `conns`.
    pub conns: RefCell<HashMap<i32, Rc<super::stats::ConnInfo>>>,
    pub stop: LocalEvent,
    pub live_connections: Cell<usize>,
    pub files: SegmentFiles,
    /// The storage of every mounted target, by target id (`None`: unmounted).
    pub storage: RefCell<Vec<Option<TargetStorage>>>,
    /// The ring (if any), the streaming pool, and the data path's counters.
    pub io: super::wire::ShardIo,
    mesh: Rc<Senders<Message>>,
    peers: Peers,
    waiters: RefCell<HashMap<u64, LocalSender<ShardReply>>>,
    next_token: Cell<u64>,
}

impl ShardCtx {
    pub fn new(
        id: usize,
        store: Store,
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
            store: RefCell::new(store),
            shared,
            counters: RefCell::new(ConnCounters::default()),
            auth_log: Default::default(),
            conns: RefCell::new(HashMap::new()),
            stop: LocalEvent::new(),
            live_connections: Cell::new(0),
            files: SegmentFiles,
            io,
            storage: RefCell::new(storage),
            waiters: RefCell::new(HashMap::new()),
            next_token: Cell::new(0),
        }
    }

    /// Sends a request to shard `to` (its key-space index) and waits for its reply.
    pub async fn call(&self, to: usize, request: ShardRequest) -> ShardReply {
        self.call_peer(self.peers.shards[to], request).await
    }

    /// Sends a request to the placement master and waits for its reply.
    pub async fn call_master(&self, request: ShardRequest) -> ShardReply {
        self.call_peer(self.peers.master, request).await
    }

    async fn call_peer(&self, to: usize, request: ShardRequest) -> ShardReply {
        self.start_peer(to, request).await.reply().await
    }

    /// Sends a request to shard `to` without waiting for the reply (so several can be in
    /// flight at once); the reply comes from [`PendingCall::reply`].
    pub async fn start_call(&self, to: usize, request: ShardRequest) -> PendingCall {
        self.start_peer(self.peers.shards[to], request).await
    }

    async fn start_peer(&self, to: usize, request: ShardRequest) -> PendingCall {
        let token = self.next_token.get();
        self.next_token.set(token + 1);
        let (tx, rx) = local_channel::new_bounded(1);
        self.waiters.borrow_mut().insert(token, tx);
        let message = Message::Request {
            from: self.mesh.peer_id(),
            token,
            request,
        };
        if self.mesh.send_to(to, message).await.is_err() {
            // Only at shutdown, after the peer finished: nothing will answer.
            tracing::debug!(peer = to, "a request found its peer gone");
            if let Some(tx) = self.waiters.borrow_mut().remove(&token) {
                let _ = tx.try_send(ShardReply::Done);
            }
        }
        PendingCall { rx }
    }

    /// Runs a request from another shard, synchronously.
    /// Runs a request here, as another shard would have it run (large links, leases).
    /// One promotion pass on this shard's store, logged when it moved anything.
    pub fn promote(&self) -> crate::arena::PromotionReport {
        let budget = self.shared.settings.promotion_budget_blocks;
        let report = self.store.borrow_mut().promote(budget, super::unix_now());
        if !report.exchanged.is_empty() {
            tracing::debug!(
                shard = self.id,
                exchanges = report.exchanged.len(),
                bytes_moved = report.bytes_moved,
                skipped_pinned = report.skipped_pinned,
                "promotion: hot heads exchanged into local blocks"
            );
        }
        report
    }

    pub fn serve_local(&self, request: ShardRequest) -> ShardReply {
        self.serve(request)
    }

    fn serve(&self, request: ShardRequest) -> ShardReply {
        match request {
            ShardRequest::Batch {
                buf,
                ops,
                lend_from,
            } => {
                let mut out = Vec::new();
                let mut deferred = Vec::new();
                let mut head_bytes = 0;
                let mut ends = Vec::with_capacity(ops.len());
                let now = unix_now();
                let mut store = self.store.borrow_mut();
                let max_item = self.shared.settings.max_item_bytes as usize;
                for op in ops {
                    match op {
                        RemoteOp::Frame { start, end } => {
                            let frame = &buf[start as usize..end as usize];
                            if let Decoded::Request {
                                request,
                                opcode,
                                opaque,
                                ..
                            } = decode(frame, max_item)
                            {
                                // Past one output cap of held bytes, values are copied.
                                let lend = lend_from
                                    .filter(|_| head_bytes <= super::conn::OUTPUT_CAP_BYTES);
                                let part = execute_keyed(
                                    &mut store, self.id, &request, opcode, opaque, now, &mut out,
                                    lend,
                                );
                                match part {
                                    Some(Deferred::Large(mut large)) => {
                                        // Heads are a latency device: past one output cap of them
                                        // in a batch, the rest stream from their segment from 0.
                                        head_bytes += large.head_len();
                                        if head_bytes > super::conn::OUTPUT_CAP_BYTES {
                                            large.hit.head = Vec::new();
                                            if let Some(pin) = large.head_pin.take() {
                                                store.unpin_sent(pin);
                                            }
                                        }
                                        deferred.push((ends.len() as u32, Deferred::Large(large)));
                                    }
                                    Some(Deferred::Lent(lent)) => {
                                        head_bytes += lent.pin.len();
                                        deferred.push((ends.len() as u32, Deferred::Lent(lent)));
                                    }
                                    None => {}
                                }
                            }
                        }
                        RemoteOp::TooLarge {
                            start,
                            end,
                            drop_existing,
                            opcode,
                            opaque,
                        } => {
                            let key = &buf[start as usize..end as usize];
                            let request = crate::proto::Request::TooLarge { key, drop_existing };
                            execute_keyed(
                                &mut store, self.id, &request, opcode, opaque, now, &mut out, None,
                            );
                        }
                    }
                    ends.push(out.len() as u32);
                }
                ShardReply::Batch {
                    out,
                    ends,
                    deferred,
                }
            }
            ShardRequest::LinkLarge {
                mode,
                key,
                flags,
                expiry,
                cas,
                link,
            } => {
                let outcome = self.store.borrow_mut().link_large(
                    mode,
                    &key,
                    flags,
                    expiry,
                    cas,
                    unix_now(),
                    link,
                );
                ShardReply::Linked(outcome)
            }
            ShardRequest::CheckLarge { mode, key, cas } => match self
                .store
                .borrow_mut()
                .check_large(mode, &key, cas, unix_now())
            {
                Some(refused) => ShardReply::Linked(refused),
                None => ShardReply::Done,
            },
            ShardRequest::Release { lease } => {
                self.store.borrow_mut().release_lease(lease);
                ShardReply::Done
            }
            ShardRequest::Unpin { pin } => {
                self.store.borrow_mut().unpin_sent(pin);
                ShardReply::Done
            }
            ShardRequest::Flush { delay } => {
                self.store.borrow_mut().flush(delay, unix_now());
                ShardReply::Done
            }
            ShardRequest::Stats => ShardReply::Stats(Box::new(self.snapshot())),
            ShardRequest::StatQuery(query) => {
                ShardReply::StatAnswer(super::stats::answer(self, query))
            }
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
            ShardRequest::Promote => {
                let report = self.promote();
                ShardReply::Promoted {
                    exchanges: report.exchanged.len() as u64,
                    bytes_moved: report.bytes_moved,
                    skipped_pinned: report.skipped_pinned,
                }
            }
            ShardRequest::Where(key) => ShardReply::Located(self.store.borrow().locate(&key)),
            ShardRequest::DropTarget(target) => {
                let mut store = self.store.borrow_mut();
                let items = store.drop_target(target);
                ShardReply::Dropped {
                    items,
                    extents: store.take_pending_frees(),
                }
            }
            ShardRequest::RemoveStorage(target) => {
                if let Some(slot) = self.storage.borrow_mut().get_mut(target.0 as usize) {
                    *slot = None;
                }
                ShardReply::Done
            }
            ShardRequest::EvictLarge {
                key,
                target,
                offset,
            } => {
                let mut store = self.store.borrow_mut();
                store.evict_large(&key, target, offset);
                ShardReply::Evicted(store.take_pending_frees())
            }
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

    pub fn snapshot(&self) -> ShardSnapshot {
        let store = self.store.borrow();
        ShardSnapshot {
            store: store.stats(),
            arena: store.arena().stats(),
            conn: self.counters.borrow().clone(),
            io: self.io.snapshot(),
        }
    }

    fn deliver(self: &Rc<Self>, token: u64, reply: ShardReply) {
        let Some(tx) = self.waiters.borrow_mut().remove(&token) else {
            return;
        };
        // The waiter may be gone (its connection closed): then the reply is dropped, but the
        // leases of any large values in it must still end.
        if let Err(glommio::GlommioError::Closed(glommio::ResourceType::Channel(
            ShardReply::Batch { deferred, .. },
        ))) = tx.try_send(reply)
        {
            for (_, part) in deferred {
                drop(super::deferred::Held::new(self, part));
            }
        }
    }
}

/// A request in flight.
pub struct PendingCall {
    rx: glommio::channels::local_channel::LocalReceiver<ShardReply>,
}

impl PendingCall {
    pub async fn reply(self) -> ShardReply {
        self.rx.recv().await.unwrap_or(ShardReply::Done)
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

/// The promotion pass every `--promotion-interval` (never with 0, or with one fixed-head
/// region, where the arena has nothing to exchange).
pub async fn promotion_loop(ctx: Rc<ShardCtx>) {
    let interval = ctx.shared.settings.promotion_interval_ms;
    // An arena whose fixed heads have one region has nothing to exchange: no timer at all.
    if interval == 0 || !ctx.store.borrow().arena().can_promote() {
        return;
    }
    while tick_or_stop(&ctx, Duration::from_millis(interval)).await {
        ctx.promote();
    }
}

/// Sleeps `period`; `false` when the shard is told to stop meanwhile.
async fn tick_or_stop(ctx: &ShardCtx, period: Duration) -> bool {
    futures_lite::future::or(
        async {
            glommio::timer::sleep(period).await;
            true
        },
        async {
            ctx.stop.wait().await;
            false
        },
    )
    .await
}

/// Receives from every peer: runs requests, delivers replies.
pub fn spawn_receivers(ctx: &Rc<ShardCtx>, mut receivers: Receivers<Message>) {
    for (_peer, stream) in receivers.streams() {
        let ctx = Rc::clone(ctx);
        glommio::spawn_local(async move {
            while let Some(message) = stream.recv().await {
                match message {
                    Message::Request {
                        from,
                        token,
                        request,
                    } => {
                        send_reply(&ctx.mesh, from, token, ctx.serve(request));
                        super::large::send_frees(&ctx);
                    }
                    Message::Reply { token, reply } => ctx.deliver(token, reply),
                }
            }
        })
        .detach();
    }
}

/// Accepts connections until the stop event fires.
pub async fn accept_loop(ctx: Rc<ShardCtx>, listener: TcpListener) {
    loop {
        let accepted = futures_lite::future::or(async { Some(listener.accept().await) }, async {
            ctx.stop.wait().await;
            None
        })
        .await;
        let stream = match accepted {
            None => break,
            Some(Ok(stream)) => stream,
            Some(Err(err)) => {
                tracing::warn!(shard = ctx.id, %err, "accept failed");
                glommio::timer::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let shared = &ctx.shared;
        let open = shared.curr_connections.fetch_add(1, Ordering::AcqRel) + 1;
        if open > shared.settings.max_connections {
            shared.curr_connections.fetch_sub(1, Ordering::AcqRel);
            shared.rejected_connections.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(
                shard = ctx.id,
                "connection refused: --max-connections reached"
            );
            drop(stream);
            continue;
        }
        shared.total_connections.fetch_add(1, Ordering::Relaxed);
        ctx.live_connections.set(ctx.live_connections.get() + 1);
        let conn_ctx = Rc::clone(&ctx);
        glommio::spawn_local(async move {
            super::conn::serve(Rc::clone(&conn_ctx), stream).await;
            conn_ctx
                .live_connections
                .set(conn_ctx.live_connections.get() - 1);
            conn_ctx
                .shared
                .curr_connections
                .fetch_sub(1, Ordering::AcqRel);
        })
        .detach();
    }
}

/// Bounded background sweep of expired items, once a second.
pub async fn sweep_loop(ctx: Rc<ShardCtx>) {
    const SWEEP_ITEMS_PER_TICK: usize = 10_000;
    while tick_or_stop(&ctx, Duration::from_secs(1)).await {
        ctx.store
            .borrow_mut()
            .sweep_expired(SWEEP_ITEMS_PER_TICK, unix_now());
        // Expired large items give their extents back now, not at the next request.
        super::large::send_frees(&ctx);
    }
}
