//! Large values: a SET's body streamed from the socket into its segment extents, and a GET's
//! head sent from RAM at once with the rest streamed from the segment. Memory segments are
//! copied into and out of; file segments use glommio's O_DIRECT DMA files (the io_uring data
//! path issue moves them onto the shard's own ring).

use std::io;
use std::rc::Rc;
use std::sync::Arc;

use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::net::TcpStream;

use crate::placement::{LocalityHint, PlacementError, PlacementRequest, TargetId};
use crate::proto::{PlacementHints, ResponseWriter, Status, StoreMode};
use crate::segment::storage::AlignedBuf;
use crate::segment::{Extent, TargetStorage};
use crate::store::StoreOutcome;

use super::execute::LargeGet;
use super::shard::{ShardCtx, ShardReply, ShardRequest};

/// A SET, ADD or REPLACE whose value is being streamed to a segment.
#[derive(Clone, Debug)]
pub struct LargeSet {
    pub mode: StoreMode,
    pub key: Vec<u8>,
    pub flags: u32,
    pub expiry: u32,
    pub cas: u64,
    pub quiet: bool,
    pub value_len: u64,
    pub opcode: u8,
    pub opaque: u32,
    /// From a SETX: replicas and where to put them.
    pub hints: Option<PlacementHints>,
}

/// The placement request for a large value: the server's defaults (one replica, the serving
/// node as the hint), or what a SETX asked for.
fn placement_request(ctx: &ShardCtx, op: &LargeSet) -> PlacementRequest {
    let mut request = PlacementRequest::new(op.value_len);
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

/// Segment I/O for one shard. File segments are read and written with positioned O_DIRECT
/// calls on glommio's blocking pool (glommio's own DMA reads failed on this machine's ext4 with
/// EOPNOTSUPP from its iopoll probe); the io_uring data-path issue moves them onto the shard's
/// own ring.
pub struct SegmentFiles;

fn io_error(err: impl std::fmt::Display) -> io::Error {
    io::Error::other(err.to_string())
}

impl SegmentFiles {
    /// Writes `data` at `at` bytes into an extent. A final short chunk is padded to the
    /// device alignment (the extent is whole granules, so the padding fits).
    async fn write(
        &self,
        ctx: &ShardCtx,
        target: TargetId,
        extent: Extent,
        at: u64,
        data: &[u8],
    ) -> io::Result<()> {
        match &ctx.shared.targets[target.0 as usize].storage {
            TargetStorage::Mem(mem) => {
                mem.write(extent.offset + at, data);
                Ok(())
            }
            TargetStorage::File(storage) => {
                let align = storage.dio_align as usize;
                let mut buf = AlignedBuf::zeroed(data.len().next_multiple_of(align), align);
                buf.as_mut_slice()[..data.len()].copy_from_slice(data);
                let storage = Arc::clone(storage);
                let offset = extent.offset + at;
                glommio::executor()
                    .spawn_blocking(move || storage.write_at(&buf, offset))
                    .await
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
        match &ctx.shared.targets[target.0 as usize].storage {
            TargetStorage::Mem(mem) => {
                out.resize(len, 0);
                mem.read(extent.offset + at, out);
                Ok(())
            }
            TargetStorage::File(storage) => {
                // O_DIRECT wants aligned offsets and lengths: read the aligned span around it.
                let align = storage.dio_align;
                let offset = extent.offset + at;
                let start = offset - offset % align;
                let end = (offset + len as u64).next_multiple_of(align);
                let mut buf = AlignedBuf::zeroed((end - start) as usize, align as usize);
                let storage = Arc::clone(storage);
                let buf = glommio::executor()
                    .spawn_blocking(move || storage.read_at(&mut buf, start).map(|()| buf))
                    .await
                    .map_err(io_error)?;
                let skip = (offset - start) as usize;
                out.extend_from_slice(&buf.as_slice()[skip..skip + len]);
                Ok(())
            }
        }
    }
}

/// Sends extents no item holds any more to the master, without waiting.
pub fn send_frees(ctx: &Rc<ShardCtx>) {
    let frees = ctx.store.borrow_mut().take_pending_frees();
    if frees.is_empty() {
        return;
    }
    let ctx = Rc::clone(ctx);
    glommio::spawn_local(async move {
        ctx.call_master(ShardRequest::Free(frees)).await;
    })
    .detach();
}

/// Reads and drops `len` bytes of the stream (a value that will not be stored).
async fn discard(stream: &mut TcpStream, mut len: u64) -> io::Result<()> {
    let mut sink = vec![0u8; 64 << 10];
    while len > 0 {
        let want = (len as usize).min(sink.len());
        let n = stream.read(&mut sink[..want]).await?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        len -= n as u64;
    }
    Ok(())
}

/// Receives a large value: places it, streams it into its extents chunk by chunk (never more
/// than one `--io-chunk` of it in memory), keeps its head, then links it on its owner shard.
/// `buffered` holds value bytes that already arrived; returns how many of them it used. The
/// reply, if any, is appended to `out`. An error means the connection is broken.
pub async fn receive_set(
    ctx: &Rc<ShardCtx>,
    stream: &mut TcpStream,
    buffered: &[u8],
    op: &LargeSet,
    out: &mut Vec<u8>,
) -> io::Result<usize> {
    let from_buffer = buffered.len().min(op.value_len as usize);
    let request = placement_request(ctx, op);
    let ShardReply::Placed(placed) = ctx.call_master(ShardRequest::Place(request)).await else {
        unreachable!("the master answers a placement with a placement");
    };
    let replicas = match placed {
        Ok(placed) => placed.replicas,
        Err(err) => {
            tracing::debug!(key_len = op.key.len(), value_len = op.value_len, %err, "large value not placed");
            discard(stream, op.value_len - from_buffer as u64).await?;
            let status = match err {
                PlacementError::Strict { .. } => Status::StrictPlacement,
                PlacementError::Invalid(_) => Status::InvalidArguments,
                PlacementError::NoSpace { .. } => Status::OutOfMemory,
            };
            ResponseWriter::new(out).error(op.opcode, op.opaque, status);
            return Ok(from_buffer);
        }
    };
    let chunk_bytes = ctx.shared.settings.arena.io_chunk_bytes as usize;
    let head_bytes = op.value_len.min(ctx.shared.settings.arena.ram_head_bytes) as usize;
    let mut head = Vec::with_capacity(head_bytes);
    let mut chunk = vec![0u8; chunk_bytes];
    let mut written = 0u64;
    let mut used = 0usize;
    let outcome: io::Result<()> = async {
        while written < op.value_len {
            let want = ((op.value_len - written) as usize).min(chunk_bytes);
            let mut filled = 0;
            while filled < want {
                if used < from_buffer {
                    let n = (from_buffer - used).min(want - filled);
                    chunk[filled..filled + n].copy_from_slice(&buffered[used..used + n]);
                    used += n;
                    filled += n;
                } else {
                    let n = stream.read(&mut chunk[filled..want]).await?;
                    if n == 0 {
                        return Err(io::ErrorKind::UnexpectedEof.into());
                    }
                    filled += n;
                }
            }
            if head.len() < head_bytes {
                let take = (head_bytes - head.len()).min(filled);
                head.extend_from_slice(&chunk[..take]);
            }
            for &(target, extent) in &replicas {
                ctx.files
                    .write(ctx, target, extent, written, &chunk[..filled])
                    .await?;
            }
            written += filled as u64;
        }
        Ok(())
    }
    .await;
    if let Err(err) = outcome {
        // An aborted SET leaves nothing behind: its extents go straight back.
        ctx.call_master(ShardRequest::Free(replicas)).await;
        return Err(err);
    }
    let placed_replicas = replicas.len() as u8;
    let owner = crate::store::KeyHasher::shard_of(ctx.store.borrow().hash(&op.key), ctx.shards);
    let link = ShardRequest::LinkLarge {
        mode: op.mode,
        key: op.key.clone(),
        flags: op.flags,
        expiry: op.expiry,
        cas: op.cas,
        value_len: op.value_len,
        replicas,
        head,
    };
    let outcome = if owner == ctx.id {
        ctx.serve_local(link)
    } else {
        ctx.call(owner, link).await
    };
    let ShardReply::Linked(outcome) = outcome else {
        unreachable!("a link is answered with its outcome");
    };
    send_frees(ctx);
    let mut w = ResponseWriter::new(out);
    match outcome {
        StoreOutcome::Stored { cas } => {
            if !op.quiet {
                // A SETX reply says how many replicas were placed (fewer than asked: partial).
                let extras: &[u8] = if op.hints.is_some() {
                    &[placed_replicas]
                } else {
                    &[]
                };
                w.reply(op.opcode, op.opaque, Status::Ok, cas, extras, &[], &[]);
            }
        }
        StoreOutcome::Exists => w.error(op.opcode, op.opaque, Status::Exists),
        StoreOutcome::NotFound => w.error(op.opcode, op.opaque, Status::NotFound),
        StoreOutcome::NotStored => w.error(op.opcode, op.opaque, Status::NotStored),
        StoreOutcome::TooLarge => w.error(op.opcode, op.opaque, Status::TooLarge),
        StoreOutcome::OutOfMemory => w.error(op.opcode, op.opaque, Status::OutOfMemory),
    }
    Ok(from_buffer)
}

/// Streams a large GET's reply: header, flags and key, the head from RAM at once, then the
/// rest of the value from the first replica, a chunk at a time. Releases the lease after.
pub async fn send_get(ctx: &Rc<ShardCtx>, stream: &mut TcpStream, get: LargeGet) -> io::Result<()> {
    let result = stream_value(ctx, stream, &get).await;
    if let Some(lease) = get.hit.lease {
        if get.owner == ctx.id {
            ctx.store.borrow_mut().release_lease(lease);
            send_frees(ctx);
        } else {
            ctx.call(get.owner, ShardRequest::Release { lease }).await;
        }
    }
    result
}

async fn stream_value(
    ctx: &Rc<ShardCtx>,
    stream: &mut TcpStream,
    get: &LargeGet,
) -> io::Result<()> {
    let hit = &get.hit;
    let mut header = Vec::with_capacity(64 + get.key.len() + hit.head.len());
    ResponseWriter::new(&mut header).header(
        get.opcode,
        get.opaque,
        Status::Ok,
        hit.cas,
        4,
        get.key.len() as u16,
        hit.value_len as u32,
    );
    header.extend_from_slice(&hit.flags.to_be_bytes());
    header.extend_from_slice(&get.key);
    header.extend_from_slice(&hit.head);
    // Time to first byte is a RAM hit's: the head leaves before the segment is touched.
    stream.write_all(&header).await?;
    let (target, extent) = *hit.replicas.first().expect("a large item has a replica");
    let chunk_bytes = ctx.shared.settings.arena.io_chunk_bytes as usize;
    let mut at = hit.head.len() as u64;
    let mut chunk = Vec::with_capacity(chunk_bytes);
    while at < hit.value_len {
        let len = ((hit.value_len - at) as usize).min(chunk_bytes);
        ctx.files
            .read(ctx, target, extent, at, len, &mut chunk)
            .await?;
        stream.write_all(&chunk).await?;
        at += len as u64;
    }
    ctx.counters.borrow_mut().bytes_written +=
        header.len() as u64 + hit.value_len - hit.head.len() as u64;
    Ok(())
}
