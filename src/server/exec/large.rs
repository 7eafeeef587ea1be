//! Large values: a SET's body streamed into its segment extents, and a GET's head sent from
//! RAM at once with the rest streamed from the segment. Memory segments are copied into and
//! out of; file segments are read and written with `READ_FIXED`/`WRITE_FIXED` on the shard's
//! ring (positioned O_DIRECT calls on glommio's blocking pool on the plain path). The bytes
//! come from a [`ValueSource`] and go to a [`ValueSink`]: the connection (`net/stream.rs`) is
//! the one that touches the socket, under its time limits.

use std::io;
use std::rc::Rc;
use std::sync::Arc;

use crate::command::Command;
use crate::config::VerifyReads;
use crate::lent::Lent;
use crate::placement::{LocalityHint, PlacementError, PlacementRequest, TargetId};
use crate::proto::{PlacementHints, StoreMode};
use crate::ring::PoolChunk;
use crate::segment::storage::AlignedBuf;
use crate::segment::{Extent, TargetStorage};
use crate::store::{ConcatBase, ConcatValue, LargeHit, LargeLink, StoreOutcome};

use super::deferred::{unpin, HeldLarge};
use super::execute::{watched_store, WatchedStore};
use crate::server::shard::ctx::{ShardCtx, ShardReply, ShardRequest};
use crate::server::shard::shared::unix_now;

/// Where a streamed value's bytes come from: the connection (`net/stream.rs`), which owns the
/// socket and its time limits. An error ends the connection.
#[allow(async_fn_in_trait)] // one executor per thread: nothing here crosses threads
pub trait ValueSource {
    /// Fills part of `into` with the value's next bytes (never past its end): how many, 0
    /// only when the value is all read.
    async fn read(&mut self, into: &mut [u8]) -> io::Result<usize>;
    /// After the value: reads what frames it (text's `\r\n`) and says whether it is intact.
    async fn end(&mut self) -> io::Result<bool>;
    /// Reads and drops the value's bytes not read yet, and what frames it.
    async fn skip_rest(&mut self) -> io::Result<()>;
}

/// Where a large GET's reply goes: the connection, which owns the socket and its time limits.
/// An error ends the connection.
#[allow(async_fn_in_trait)] // one executor per thread: nothing here crosses threads
pub trait ValueSink {
    /// Writes `bytes` whole and hands the buffer back.
    async fn write(&mut self, bytes: Vec<u8>) -> io::Result<Vec<u8>>;
    /// Writes lent bytes from where they are (released when the kernel is done with them).
    async fn write_lent(&mut self, lent: Lent) -> io::Result<()>;
    /// Writes `head`, then the lent bytes.
    async fn write_head_and_lent(&mut self, head: Vec<u8>, lent: Lent) -> io::Result<()>;
}

/// A store whose value is streamed to a segment, as the executor holds it while the value
/// arrives (its key copied: the connection moves on from the line that named it).
#[derive(Clone, Debug)]
pub struct LargeSet {
    pub mode: StoreMode,
    pub key: Vec<u8>,
    pub flags: u32,
    pub expiry: u32,
    pub cas: u64,
    /// `ms ... E<cas>`: the CAS the stored item takes (0: one is drawn).
    pub new_cas: u64,
    /// `ms ... MA|MP N<ttl>`: an append onto a missing key stores the value alone, with this
    /// expiry.
    pub vivify: Option<u32>,
    pub value_len: u64,
    /// From a SETX (or an `ms` with placement flags): replicas and where to put them.
    pub hints: Option<PlacementHints>,
    /// Whether a store refused for want of room (no segment space, a failed segment write, no
    /// RAM for its record) drops the key's current item: `command::Command::Store`'s rule
    /// (for an APPEND or PREPEND, only `ms`'s: the new bytes alone found no room, as when
    /// memcached cannot allocate them).
    pub drop_on_failure: bool,
}

impl LargeSet {
    /// The streamed form of `command`, a store whose value goes to a segment (streamed, or an
    /// APPEND or PREPEND whose sum outgrows RAM), with a SETX's or an `ms`'s placement hints.
    /// `None` for any other command.
    pub fn of(command: &Command<'_>, hints: Option<PlacementHints>) -> Option<LargeSet> {
        let Command::Store {
            mode,
            key,
            value,
            flags,
            expiry,
            cas,
            explicit_cas,
            vivify,
            drop_on_failure,
            ..
        } = *command
        else {
            return None;
        };
        Some(LargeSet {
            mode,
            key: key.to_vec(),
            flags,
            expiry,
            cas,
            new_cas: explicit_cas,
            vivify,
            value_len: value.len(),
            hints,
            drop_on_failure,
        })
    }
}

/// How a large store ended, for the connection's codec to answer.
#[derive(Debug)]
pub enum LargeOutcome {
    Stored {
        cas: u64,
        len: u64,
        replicas: u8,
    },
    Refused(StoreOutcome),
    NotPlaced(PlacementError),
    /// Writing the value to its segment failed; `no_space`: for lack of room on the
    /// segment's filesystem (ENOSPC, EDQUOT).
    SegmentFailed {
        no_space: bool,
    },
    /// Text: the two bytes after the value were not `\r\n`.
    BadChunk,
}

/// The placement request for a large value: the server's defaults (one replica, the serving
/// node as the hint), or what a SETX asked for.
fn placement_request(ctx: &ShardCtx, op: &LargeSet, value_len: u64) -> PlacementRequest {
    let mut request = PlacementRequest::new(value_len);
    let serving = ctx.shared.settings.arena.numa.serving_node();
    request.hint = LocalityHint {
        node: serving,
        strict: false,
    };
    if let Some(hints) = &op.hints {
        request.replicas = u32::from(hints.replicas.max(1));
        request.hint = LocalityHint {
            node: match hints.node {
                None => serving,
                Some(node) => node.map(u32::from),
            },
            strict: hints.strict,
        };
        request.preferred = hints.preferred.iter().map(|&t| TargetId(t)).collect();
        request.excluded = hints.excluded.iter().map(|&t| TargetId(t)).collect();
    }
    request
}

/// A mounted target's storage, as this shard knows it.
fn storage_of(ctx: &ShardCtx, target: TargetId) -> io::Result<TargetStorage> {
    ctx.storage
        .borrow()
        .get(target.0 as usize)
        .cloned()
        .flatten()
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("target {target} is unmounted"),
            )
        })
}

/// A target's segment as a log line names it: its file, or `memory`.
fn segment_name(ctx: &ShardCtx, target: TargetId) -> String {
    match storage_of(ctx, target) {
        Ok(TargetStorage::File(file)) => file.path.display().to_string(),
        Ok(TargetStorage::Mem(_)) => "memory".to_string(),
        Err(_) => "unmounted".to_string(),
    }
}

/// Where a large SET's bytes wait between the socket and the segment: a streaming pool chunk
/// on the ring path (written with `WRITE_FIXED`), a heap buffer on the plain path.
enum Staging {
    Pool(PoolChunk),
    Heap(Vec<u8>),
}

impl Staging {
    fn bytes(&self) -> &[u8] {
        match self {
            Staging::Pool(chunk) => chunk.as_slice(),
            Staging::Heap(v) => v,
        }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        match self {
            Staging::Pool(chunk) => chunk.as_mut_slice(),
            Staging::Heap(v) => v,
        }
    }
}

/// Segment I/O for one shard. On the ring path file segments are read and written with
/// `READ_FIXED`/`WRITE_FIXED` from streaming pool chunks; on the plain path with positioned
/// O_DIRECT calls on glommio's blocking pool (glommio's own DMA reads failed on this machine's
/// ext4 with EOPNOTSUPP from its iopoll probe). Memory segments are copied into and out of.
pub struct SegmentFiles;

impl SegmentFiles {
    /// Writes the first `len` bytes of `staging` at `at` bytes into an extent, and hands the
    /// staging back. A final short chunk is padded to the device alignment (the extent is
    /// whole granules, so the padding fits).
    async fn write(
        &self,
        ctx: &ShardCtx,
        target: TargetId,
        extent: Extent,
        at: u64,
        staging: Staging,
        len: usize,
    ) -> (io::Result<()>, Staging) {
        let storage = match storage_of(ctx, target) {
            Ok(storage) => storage,
            Err(err) => return (Err(err), staging),
        };
        let offset = extent.offset + at;
        match (&storage, staging) {
            (TargetStorage::Mem(mem), staging) => {
                mem.write(offset, &staging.bytes()[..len]);
                (Ok(()), staging)
            }
            (TargetStorage::File(file), Staging::Pool(mut chunk)) => {
                let ring = ctx.io.ring.as_ref().expect("pool staging runs on the ring");
                let padded = len.next_multiple_of(file.dio_align as usize);
                chunk.as_mut_slice()[len..padded].fill(0);
                let (written, chunk) = ring.write_fixed(file.raw_fd(), chunk, padded, offset).await;
                let result = match written {
                    Ok(n) if n >= padded => Ok(()),
                    // A short write (the filesystem ran out of room partway, say): the rest
                    // goes the plain way, which finishes it or says why it cannot.
                    Ok(n) => {
                        let align = file.dio_align as usize;
                        let done = n - n % align;
                        let mut rest = AlignedBuf::zeroed(padded - done, align);
                        rest.as_mut_slice()
                            .copy_from_slice(&chunk.as_slice()[done..padded]);
                        let file = Arc::clone(file);
                        glommio::executor()
                            .spawn_blocking(move || file.write_at(&rest, offset + done as u64))
                            .await
                    }
                    Err(err) => Err(err),
                };
                (result, Staging::Pool(chunk))
            }
            (TargetStorage::File(file), Staging::Heap(data)) => {
                let align = file.dio_align as usize;
                let mut buf = AlignedBuf::zeroed(len.next_multiple_of(align), align);
                buf.as_mut_slice()[..len].copy_from_slice(&data[..len]);
                let file = Arc::clone(file);
                let result = glommio::executor()
                    .spawn_blocking(move || file.write_at(&buf, offset))
                    .await;
                (result, Staging::Heap(data))
            }
        }
    }

    /// Reads `len` bytes from `at` bytes into an extent.
    async fn read(
        &self,
        ctx: &ShardCtx,
        target: TargetId,
        extent: Extent,
        at: u64,
        len: usize,
        out: &mut Vec<u8>,
    ) -> io::Result<()> {
        out.clear();
        match &storage_of(ctx, target)? {
            TargetStorage::Mem(mem) => {
                out.resize(len, 0);
                mem.read(extent.offset + at, out);
                Ok(())
            }
            TargetStorage::File(storage) => {
                self.read_file(storage, extent.offset + at, len, out).await
            }
        }
    }

    /// Reads `len` bytes at `offset` of a file segment with a blocking O_DIRECT read of the
    /// aligned span around them.
    async fn read_file(
        &self,
        storage: &Arc<crate::segment::FileStorage>,
        offset: u64,
        len: usize,
        out: &mut Vec<u8>,
    ) -> io::Result<()> {
        out.clear();
        let align = storage.dio_align;
        let start = offset - offset % align;
        let end = (offset + len as u64).next_multiple_of(align);
        let mut buf = AlignedBuf::zeroed((end - start) as usize, align as usize);
        let storage = Arc::clone(storage);
        let buf = glommio::executor()
            .spawn_blocking(move || storage.read_at(&mut buf, start).map(|()| buf))
            .await?;
        let skip = (offset - start) as usize;
        out.extend_from_slice(&buf.as_slice()[skip..skip + len]);
        Ok(())
    }
}

/// Places a large value. With `--segment-eviction lru` a full store answers with the least
/// recently used large values to evict first: they leave their partitions, their extents go
/// back, and the placement is asked once more.
async fn place(
    ctx: &Rc<ShardCtx>,
    op: &LargeSet,
    value_len: u64,
) -> Result<crate::placement::Placed, PlacementError> {
    for attempt in 0..2 {
        let request = ShardRequest::Place {
            request: placement_request(ctx, op, value_len),
            key: op.key.clone(),
        };
        match ctx.call_master(request).await {
            ShardReply::Placed(outcome) => return outcome,
            ShardReply::EvictFirst(victims) if attempt == 0 => {
                let mut freed = Vec::new();
                for victim in victims {
                    let (_, mut store) = ctx.shared.partitions.lock_key(&victim.key);
                    store.evict_large(&victim.key, victim.target, victim.offset);
                    freed.extend(store.take_pending_frees());
                }
                if !freed.is_empty() {
                    ctx.call_master(ShardRequest::Free(freed)).await;
                }
            }
            _ => break,
        }
    }
    Err(PlacementError::NoSpace {
        size: value_len,
        free: 0,
        largest_hole: 0,
    })
}

/// Whether an APPEND or PREPEND of `add_len` bytes onto `key` is built in a segment
/// ([`receive_set`]) rather than in RAM by the executor.
pub fn concat_needs_segment(ctx: &ShardCtx, key: &[u8], add_len: usize, now: u32) -> bool {
    let (_, mut store) = ctx.shared.partitions.lock_key(key);
    store.concat_needs_segment(key, add_len as u64, now)
}

/// Ends the lease an APPEND or PREPEND took on the segment value it started from.
fn release_base(ctx: &ShardCtx, key: &[u8], base: Option<&ConcatBase>) {
    if let Some(ConcatBase {
        value: ConcatValue::Segment { lease, .. },
        ..
    }) = base
    {
        ctx.shared.partitions.lock_key(key).1.release_lease(*lease);
    }
}

/// Reads the value an APPEND or PREPEND starts from, in order, into the new value's chunks:
/// copied from RAM, or read from the first replica of its segment and summed against the
/// CRC32C it was stored with. A read that fails leaves zeros and marks the value damaged, so
/// the new value is never linked.
struct BaseReader<'b> {
    base: Option<&'b ConcatBase>,
    crc: u32,
    read: u64,
    failed: bool,
    scratch: Vec<u8>,
}

impl<'b> BaseReader<'b> {
    fn new(base: Option<&'b ConcatBase>) -> BaseReader<'b> {
        BaseReader {
            base,
            crc: 0,
            read: 0,
            failed: false,
            scratch: Vec::new(),
        }
    }

    /// Fills `into` with the base's bytes from `at` (reads come in order).
    async fn read(&mut self, ctx: &ShardCtx, at: u64, into: &mut [u8]) {
        let Some(base) = self.base else {
            return;
        };
        match &base.value {
            ConcatValue::Ram(bytes) => {
                into.copy_from_slice(&bytes[at as usize..at as usize + into.len()]);
            }
            ConcatValue::Segment { replicas, .. } => {
                let (target, extent) = replicas[0];
                let read = SegmentFiles
                    .read(ctx, target, extent, at, into.len(), &mut self.scratch)
                    .await;
                match read {
                    Ok(()) => {
                        into.copy_from_slice(&self.scratch);
                        self.crc = crc32c::crc32c_append(self.crc, into);
                    }
                    Err(err) => {
                        tracing::warn!(%err, target = target.0, "segment value unreadable for an append");
                        into.fill(0);
                        self.failed = true;
                    }
                }
            }
        }
        debug_assert_eq!(self.read, at, "the base is read in order");
        self.read = at + into.len() as u64;
    }

    /// Whether every byte read is the value as it was stored.
    fn intact(&self) -> bool {
        match self.base.map(|b| &b.value) {
            Some(ConcatValue::Segment {
                checksum,
                value_len,
                ..
            }) => !self.failed && self.read == *value_len && self.crc == *checksum,
            _ => true,
        }
    }
}

/// Drops the item a store refused for want of room meant to replace, when its command says so
/// ([`LargeSet::drop_on_failure`]). Its extents go back once its last reader is done.
fn drop_stale(ctx: &Rc<ShardCtx>, op: &LargeSet) {
    if !op.drop_on_failure {
        return;
    }
    let frees = {
        let (_, mut store) = ctx.shared.partitions.lock_key(&op.key);
        store.drop_stale(&op.key);
        store.take_pending_frees()
    };
    ctx.free_extents(frees);
}

/// Why a large SET stopped before linking.
enum Interrupted {
    /// The value an APPEND or PREPEND started from could not be read back intact.
    BaseDamaged,
    /// The client went away, idled out, or the server is stopping: close the connection.
    Connection(io::Error),
    /// A segment write to this target failed: the body was drained; answer and keep the
    /// connection.
    Segment(TargetId, io::Error),
    /// Text: the value did not end in `\r\n`; answer and keep the connection.
    BadChunk,
}

/// Counts a failed segment write and logs it (one line per second per shard at most: every
/// SET on a full disk fails). Returns whether it failed for lack of space.
fn segment_write_failed(ctx: &ShardCtx, target: TargetId, err: &io::Error, value_len: u64) -> bool {
    let no_space = matches!(err.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT));
    {
        let mut counters = ctx.counters.borrow_mut();
        counters.segment_write_errors += 1;
        counters.segment_write_no_space += u64::from(no_space);
    }
    if let Some(held_back) = ctx.segment_write_log.allow(unix_now()) {
        let segment = segment_name(ctx, target);
        tracing::error!(
            shard = ctx.id,
            %target,
            segment,
            value_len,
            held_back,
            "writing a large value to segment {segment} failed: {err}; the SET was refused \
             (one line per second per shard at most)"
        );
    }
    no_space
}

/// Whether `key` holds a live item now.
fn key_is_live(ctx: &ShardCtx, key: &[u8]) -> bool {
    let (_, mut store) = ctx.shared.partitions.lock_key(key);
    store.meta_of(key, unix_now()).is_some()
}

/// Receives a large value from `source`: checks ADD/REPLACE/CAS with the owner, places it,
/// streams it into its extents chunk by chunk (never more than one `--io-chunk` of it in
/// memory), keeps its head, then links it (the rules checked again). A value refused before it
/// is read is skipped. The store is logged to `watch`ers as the connection on socket `fd`
/// (when it is refused or linked; a value never linked for an I/O error is not). An error
/// means the connection is to be closed; a store whose body did not arrive whole leaves the
/// key's item as it was.
pub async fn receive_set<S: ValueSource>(
    ctx: &Rc<ShardCtx>,
    source: &mut S,
    fd: i32,
    op: &LargeSet,
) -> io::Result<LargeOutcome> {
    // `ms ... MA N<ttl>` onto a missing key: a SET of the value with that expiry. (An item
    // stored by another client before this one links is replaced, as by a SET after it.)
    let vivified;
    let op = match op.vivify {
        Some(expiry) if !key_is_live(ctx, &op.key) => {
            vivified = LargeSet {
                mode: StoreMode::Set,
                expiry,
                vivify: None,
                ..op.clone()
            };
            &vivified
        }
        _ => op,
    };
    let watched = |now| WatchedStore {
        key: &op.key,
        mode: op.mode,
        with_cas: op.cas != 0,
        exptime: op.expiry,
        bytes: op.value_len,
        now,
    };
    // An ADD of a live key (say) is refused before a byte goes to a segment. An APPEND or
    // PREPEND starts from the live item's value (`base`), refused when it is missing or the
    // sum is over the item size limit.
    let concat = matches!(op.mode, StoreMode::Append | StoreMode::Prepend);
    let (refused, base) = {
        let (_, mut store) = ctx.shared.partitions.lock_key(&op.key);
        let now = unix_now();
        let (refused, base) = if concat {
            match store.concat_base(&op.key, op.cas, now) {
                Ok(base)
                    if base.value.len() + op.value_len > ctx.shared.settings.max_item_bytes =>
                {
                    if let ConcatValue::Segment { lease, .. } = base.value {
                        store.release_lease(lease);
                    }
                    (Some(StoreOutcome::NotStored), None)
                }
                Ok(base) => (None, Some(base)),
                Err(refused) => (Some(refused), None),
            }
        } else {
            (store.check_large(op.mode, &op.key, op.cas, now), None)
        };
        if let Some(refused) = refused {
            let watchers = (&ctx.shared.watchers, fd);
            watched_store(&mut store, watchers, watched(now), |_| refused);
        }
        (refused, base)
    };
    if let Some(refused) = refused {
        source.skip_rest().await?;
        return Ok(LargeOutcome::Refused(refused));
    }
    // The whole value's bytes, and where the base's lie among them.
    let base_len = base.as_ref().map_or(0, |b| b.value.len());
    let value_len = op.value_len + base_len;
    let base_at = match op.mode {
        StoreMode::Prepend => op.value_len,
        _ => 0,
    };
    let replicas = match place(ctx, op, value_len).await {
        Ok(placed) => placed.replicas,
        Err(err) => {
            tracing::debug!(key_len = op.key.len(), value_len, %err, "large value not placed");
            release_base(ctx, &op.key, base.as_ref());
            // No room (anywhere, or on the node a strict hint named); a bad hint is the
            // client's error and replaces nothing.
            if !matches!(err, PlacementError::Invalid(_)) {
                drop_stale(ctx, op);
            }
            source.skip_rest().await?;
            return Ok(LargeOutcome::NotPlaced(err));
        }
    };
    let chunk_bytes = ctx.shared.settings.arena.io_chunk_bytes as usize;
    let head_bytes = value_len.min(ctx.shared.settings.arena.ram_head_bytes) as usize;
    let mut head = Vec::with_capacity(head_bytes);
    // A SET never waits for a chunk: with the pool dry it stages on the heap (plain path).
    let mut staging = match ctx.io.ring.as_ref().and_then(|_| ctx.io.pool.try_take()) {
        Some(chunk) => Staging::Pool(chunk),
        None => {
            if ctx.io.ring.is_some() {
                ctx.io.counters.borrow_mut().fallbacks += 1;
            }
            Staging::Heap(vec![0u8; chunk_bytes])
        }
    };
    let mut received = 0u64;
    let mut checksum = 0u32;
    let mut segment_error: Option<(TargetId, io::Error)> = None;
    let mut base_reader = BaseReader::new(base.as_ref());
    let outcome: Result<(), Interrupted> = async {
        while received < value_len {
            let want = ((value_len - received) as usize).min(chunk_bytes);
            let mut filled = 0;
            while filled < want {
                let at = received + filled as u64;
                let chunk = staging.bytes_mut();
                if (base_at..base_at + base_len).contains(&at) {
                    let n = ((base_at + base_len - at) as usize).min(want - filled);
                    let into = &mut chunk[filled..filled + n];
                    base_reader.read(ctx, at - base_at, into).await;
                    filled += n;
                } else {
                    // The source stops at the client's bytes' end: a PREPEND's base follows.
                    let n = source
                        .read(&mut chunk[filled..want])
                        .await
                        .map_err(Interrupted::Connection)?;
                    if n == 0 {
                        return Err(Interrupted::Connection(io::ErrorKind::UnexpectedEof.into()));
                    }
                    filled += n;
                }
            }
            let chunk = &staging.bytes()[..filled];
            if head.len() < head_bytes {
                let take = (head_bytes - head.len()).min(filled);
                head.extend_from_slice(&chunk[..take]);
            }
            checksum = crc32c::crc32c_append(checksum, chunk);
            // After a segment error the rest of the body is still read (and dropped), so the
            // connection stays in step and can be answered.
            if segment_error.is_none() {
                for &(target, extent) in &replicas {
                    let (written, back) = SegmentFiles
                        .write(ctx, target, extent, received, staging, filled)
                        .await;
                    staging = back;
                    if let Err(err) = written {
                        segment_error = Some((target, err));
                        break;
                    }
                }
            }
            received += filled as u64;
        }
        // Text: the data block's `\r\n` (the two bytes are consumed whatever they are).
        let framed = source.end().await.map_err(Interrupted::Connection)?;
        match segment_error.take() {
            Some((target, err)) => Err(Interrupted::Segment(target, err)),
            None if !framed => Err(Interrupted::BadChunk),
            None if !base_reader.intact() => Err(Interrupted::BaseDamaged),
            None => Ok(()),
        }
    }
    .await;
    release_base(ctx, &op.key, base.as_ref());
    if let Err(interrupted) = outcome {
        // An aborted SET leaves nothing behind: its extents go straight back.
        ctx.call_master(ShardRequest::Free(replicas)).await;
        return match interrupted {
            Interrupted::Connection(err) => Err(err),
            Interrupted::Segment(target, err) => {
                let no_space = segment_write_failed(ctx, target, &err, op.value_len);
                drop_stale(ctx, op);
                Ok(LargeOutcome::SegmentFailed { no_space })
            }
            Interrupted::BadChunk => Ok(LargeOutcome::BadChunk),
            Interrupted::BaseDamaged => Ok(LargeOutcome::Refused(StoreOutcome::NotStored)),
        };
    }
    let placed_replicas = replicas.len() as u8;
    let link = LargeLink {
        value_len,
        checksum,
        replicas,
        head,
    };
    let (outcome, frees) = {
        let (_, mut store) = ctx.shared.partitions.lock_key(&op.key);
        let now = unix_now();
        let watchers = (&ctx.shared.watchers, fd);
        let outcome = watched_store(&mut store, watchers, watched(now), |store| {
            let outcome = match &base {
                // The new value replaces the item it was built from, keeping its flags and
                // expiry, unless that item changed meanwhile: then, as for an APPEND onto a
                // missing key, NOT_STORED (EXISTS when the client gave the CAS).
                Some(base) => {
                    let (flags, expiry) = (base.flags, base.expiry);
                    let set = StoreMode::Set;
                    match store.link_large(set, &op.key, flags, expiry, base.cas, now, link) {
                        StoreOutcome::Exists | StoreOutcome::NotFound if op.cas == 0 => {
                            StoreOutcome::NotStored
                        }
                        outcome => outcome,
                    }
                }
                None => store.link_large(op.mode, &op.key, op.flags, op.expiry, op.cas, now, link),
            };
            // No RAM for the item's record.
            if op.drop_on_failure && outcome.for_want_of_room() {
                store.drop_stale(&op.key);
            }
            store.with_client_cas(&op.key, now, outcome, op.new_cas)
        });
        (outcome, store.take_pending_frees())
    };
    ctx.free_extents(frees);
    Ok(match outcome {
        StoreOutcome::Stored { cas, len } => LargeOutcome::Stored {
            cas,
            len,
            replicas: placed_replicas,
        },
        refused => LargeOutcome::Refused(refused),
    })
}

/// The CRC32C of a large value as its bytes go out (the head from RAM, the rest from its
/// segment), held against the one computed as it was stored. Every path feeds a piece before
/// it sends it, so the piece that completes a damaged value is never sent: the client gets a
/// short reply and a closed connection, never the whole value.
struct ReadCheck {
    want: u32,
    crc: u32,
    /// Value bytes not fed yet.
    left: u64,
    /// Whether the sum is computed: `--verify-reads on`, or `files` and the value is read
    /// from a file segment.
    on: bool,
    /// The CRC32C the value went out with, when it was not `want`.
    failed: Option<u32>,
}

impl ReadCheck {
    fn new(ctx: &ShardCtx, hit: &LargeHit) -> ReadCheck {
        // The first replica is the one streamed (`send_value`).
        let from_file = || {
            hit.replicas.first().is_some_and(|&(target, _)| {
                let storage = ctx.storage.borrow();
                let slot = storage.get(target.0 as usize);
                matches!(slot, Some(Some(TargetStorage::File(_))))
            })
        };
        let on = match ctx.shared.settings.verify_reads {
            VerifyReads::Off => false,
            VerifyReads::Files => from_file(),
            VerifyReads::On => true,
        };
        ReadCheck {
            want: hit.checksum,
            crc: 0,
            left: hit.value_len,
            on,
            failed: None,
        }
    }

    /// Adds the value's next bytes; an error when they complete it with the wrong sum.
    fn feed(&mut self, bytes: &[u8]) -> io::Result<()> {
        if !self.on {
            return Ok(());
        }
        debug_assert!(bytes.len() as u64 <= self.left, "fed past the value's end");
        self.crc = crc32c::crc32c_append(self.crc, bytes);
        self.left = self.left.saturating_sub(bytes.len() as u64);
        if self.left > 0 || self.crc == self.want {
            return Ok(());
        }
        self.failed = Some(self.crc);
        Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "the value read back has CRC32C {:08x}, stored as {:08x}",
                self.crc, self.want
            ),
        ))
    }

    /// [`ReadCheck::feed`] for lent bytes (one run, or two where a head wraps in its slot).
    fn feed_lent(&mut self, lent: &Lent) -> io::Result<()> {
        let [first, second] = lent.slices();
        self.feed(first)?;
        self.feed(second)
    }
}

/// A large value failed its CRC32C on the way out: it is counted, dropped (unless a newer
/// value took its key meanwhile), and logged (one line per second per shard at most).
fn value_damaged(ctx: &Rc<ShardCtx>, hit: &LargeHit, got: u32) {
    ctx.counters.borrow_mut().segment_read_crc_errors += 1;
    let (target, extent) = *hit.replicas.first().expect("a large item has a replica");
    let (dropped, frees) = {
        let (_, mut store) = ctx.shared.partitions.lock_key(&hit.key);
        let dropped = store.remove_large_at(&hit.key, target, extent.offset);
        (dropped, store.take_pending_frees())
    };
    ctx.free_extents(frees);
    if let Some(held_back) = ctx.crc_log.allow(unix_now()) {
        let segment = segment_name(ctx, target);
        tracing::error!(
            shard = ctx.id,
            key = %String::from_utf8_lossy(&hit.key).escape_debug(),
            %target,
            segment,
            offset = extent.offset,
            value_len = hit.value_len,
            stored_crc32c = format_args!("{:08x}", hit.checksum),
            read_crc32c = format_args!("{got:08x}"),
            dropped,
            held_back,
            "a large value read from segment {segment} at offset {} failed its CRC32C: the \
             connection was closed before the value's last bytes and the item dropped (one \
             line per second per shard at most)",
            extent.offset
        );
    }
}

/// Streams a large GET's reply: header, flags and key, the head from RAM at once, then the
/// rest of the value from the first replica, a chunk at a time, its CRC32C checked on the way
/// (`--verify-reads`). The lease ends when `held` is dropped. A segment read failing midway, or
/// a value failing its check (then dropped), leaves the reply short: the connection is closed.
pub async fn send_get<W: ValueSink>(
    ctx: &Rc<ShardCtx>,
    sink: &mut W,
    mut held: HeldLarge,
) -> io::Result<()> {
    let mut check = ReadCheck::new(ctx, &held.get.hit);
    // A pinned head goes out lent, right after the header; its pin ends with the send.
    let head_pin = held.get.head_pin.take();
    let held = Rc::new(held);
    let sent = send_value(ctx, sink, &held, head_pin, &mut check).await;
    if let Some(got) = check.failed {
        value_damaged(ctx, &held.get.hit, got);
    }
    sent
}

async fn send_value<W: ValueSink>(
    ctx: &Rc<ShardCtx>,
    sink: &mut W,
    held: &Rc<HeldLarge>,
    head_pin: Option<crate::arena::SendPin>,
    check: &mut ReadCheck,
) -> io::Result<()> {
    let head_len = held.get.hit.head.len() + head_pin.as_ref().map_or(0, |p| p.len());
    let get = &held.get;
    let hit = &get.hit;
    let mut header = Vec::with_capacity(get.prefix.len() + hit.head.len());
    header.extend_from_slice(&get.prefix);
    header.extend_from_slice(&hit.head);
    // Time to first byte is a RAM hit's: the head leaves before the segment is touched.
    let header_bytes = header.len() as u64;
    match head_pin {
        // One send for the header and the lent head where the ring sends them together.
        Some(pin) => {
            let len = pin.len();
            {
                let mut counters = ctx.io.counters.borrow_mut();
                counters.heads_lent += 1;
                counters.head_bytes_lent += len as u64;
            }
            let (unpin_ctx, owner) = (Rc::clone(ctx), get.owner);
            let lent = pin.lend(move |pin| unpin(&unpin_ctx, owner, pin));
            check.feed_lent(&lent)?;
            sink.write_head_and_lent(header, lent).await?;
        }
        None => {
            check.feed(&hit.head)?;
            sink.write(header).await?;
        }
    }
    let (target, extent) = *hit.replicas.first().expect("a large item has a replica");
    let (from, value_len) = (head_len as u64, hit.value_len);
    let rest = Rest {
        extent,
        from,
        value_len,
    };
    match (&ctx.io.ring, storage_of(ctx, target)?) {
        (Some(ring), TargetStorage::File(file)) => {
            send_file_ring(ctx, sink, (ring, &file), rest, check).await?
        }
        (Some(_), TargetStorage::Mem(mem)) => {
            let mut at = from;
            while at < value_len {
                let len = (value_len - at).min(MEM_SEND_MAX_BYTES) as usize;
                let lent = mem.lend(extent.offset + at, len, Box::new(Rc::clone(held)));
                check.feed_lent(&lent)?;
                sink.write_lent(lent).await?;
                at += len as u64;
            }
        }
        (None, _) => send_copied(ctx, sink, target, rest, check).await?,
    }
    let suffix = get.suffix;
    if !suffix.is_empty() {
        sink.write(suffix.to_vec()).await?;
    }
    ctx.counters.borrow_mut().bytes_written +=
        header_bytes + value_len - from + suffix.len() as u64;
    if ctx.shared.settings.segment_eviction_lru {
        // The read makes this value the most recently used one of its target.
        let ctx = Rc::clone(ctx);
        glommio::spawn_local(async move {
            ctx.call_master(ShardRequest::Touch {
                target,
                offset: extent.offset,
            })
            .await;
        })
        .detach();
    }
    Ok(())
}

/// The part of a large value that streams from its segment: `from..value_len` of `extent`.
#[derive(Clone, Copy)]
struct Rest {
    extent: Extent,
    from: u64,
    value_len: u64,
}

/// Most bytes of a memory segment one send lends. The memory is there already, so a chunk
/// limit would only cost an operation and a wake-up per chunk (a 4 MiB value went out in five
/// sends); the bound keeps an idle timeout seeing progress at each send on a slow reader.
const MEM_SEND_MAX_BYTES: u64 = 16 << 20;

/// Most chunks one GET reads ahead on the ring path.
const READ_AHEAD_CHUNKS: usize = 4;

/// Plain path: each chunk read (a blocking O_DIRECT read, or a copy from memory) into a heap
/// buffer and written.
async fn send_copied<W: ValueSink>(
    ctx: &Rc<ShardCtx>,
    sink: &mut W,
    target: TargetId,
    rest: Rest,
    check: &mut ReadCheck,
) -> io::Result<()> {
    let chunk_bytes = ctx.shared.settings.arena.io_chunk_bytes as usize;
    let mut at = rest.from;
    let mut chunk = Vec::with_capacity(chunk_bytes);
    while at < rest.value_len {
        let len = ((rest.value_len - at) as usize).min(chunk_bytes);
        SegmentFiles.read(ctx, target, rest.extent, at, len, &mut chunk).await.inspect_err(|err| {
            tracing::error!(%err, "reading a large value from its segment failed; closing the connection");
        })?;
        check.feed(&chunk)?;
        chunk = sink.write(std::mem::take(&mut chunk)).await?;
        at += len as u64;
    }
    Ok(())
}

/// Ring path for a file segment: up to [`READ_AHEAD_CHUNKS`] `READ_FIXED`s in flight into
/// pool chunks, each chunk sent with `SEND_ZC` as soon as it and every chunk before it are in
/// (the chunk goes back to the pool at the send's notification). A read never waits for a
/// chunk while this GET holds others (that could deadlock two GETs): when the pool is dry and
/// nothing is in flight, that chunk is read the plain way (counted as a fallback).
async fn send_file_ring<W: ValueSink>(
    ctx: &Rc<ShardCtx>,
    sink: &mut W,
    (ring, file): (&Rc<crate::ring::Ring>, &Arc<crate::segment::FileStorage>),
    rest: Rest,
    check: &mut ReadCheck,
) -> io::Result<()> {
    let pool = &ctx.io.pool;
    let chunk_bytes = pool.chunk_bytes();
    let align = file.dio_align;
    let depth = READ_AHEAD_CHUNKS.min(pool.counts().0 / 2).max(1);
    let mut reads = std::collections::VecDeque::new();
    let mut next = rest.from;
    // Starts reads until `depth` are in flight, the value is all asked for, or the pool is
    // dry; the first into `first` when given.
    let start_reads = |reads: &mut std::collections::VecDeque<_>,
                       next: &mut u64,
                       mut first: Option<crate::ring::PoolChunk>| {
        while reads.len() < depth && *next < rest.value_len {
            let start = rest.extent.offset + *next;
            let aligned = start - start % align;
            let skip = (start - aligned) as usize;
            let len = ((rest.value_len - *next) as usize).min(chunk_bytes - skip);
            let Some(chunk) = first.take().or_else(|| pool.try_take()) else {
                break;
            };
            let read_len = (skip + len).next_multiple_of(align as usize);
            let (ring, file) = (Rc::clone(ring), Arc::clone(file));
            let read = glommio::spawn_local(async move {
                let done = ring
                    .read_fixed(file.raw_fd(), chunk, read_len, aligned)
                    .await;
                drop(file);
                done
            })
            .detach();
            reads.push_back((read, skip, len));
            *next += len as u64;
        }
    };
    loop {
        start_reads(&mut reads, &mut next, None);
        let Some((read, skip, len)) = reads.pop_front() else {
            if next >= rest.value_len {
                return Ok(());
            }
            // The pool is dry and this GET holds none of it: it waits its turn for a chunk
            // (it cannot deadlock: whoever holds one is reading or sending, and gives it
            // back). Counted, as a GET that had to wait.
            ctx.io.counters.borrow_mut().pool_waits += 1;
            let chunk = pool.take().await;
            start_reads(&mut reads, &mut next, Some(chunk));
            continue;
        };
        let (result, chunk) = read
            .await
            .ok_or_else(|| io::Error::other("a segment read was cancelled"))?;
        // Topped up before this chunk is checked and sent: the device is never idle while
        // the socket drains (the chunk in hand is the one more this GET holds).
        start_reads(&mut reads, &mut next, None);
        match result {
            Ok(n) if n >= skip + len => {}
            Ok(n) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("short segment read: {n} of {} bytes", skip + len),
                ))
            }
            Err(err) => {
                tracing::error!(%err, "reading a large value from its segment failed; closing the connection");
                return Err(err);
            }
        }
        check.feed(&chunk.as_slice()[skip..skip + len])?;
        sink.write_lent(Lent::from_chunk(chunk, skip, len)).await?;
    }
}
