//! Warm restart: at a clean shutdown each shard writes, for the partitions it looks after, the
//! large items on file segments to a snapshot part (`src/snapshot.rs`) and the items held in RAM
//! to a RAM part (`src/ram_snapshot.rs`, checksummed chunks), each written whole or not at all
//! (a temporary file, synced, renamed). At start-up each shard restores, from every part, the
//! items of the partitions it looks after now (by key: any `--threads`, any partition count)
//! that have not expired: RAM items through the store (what does not fit is evicted as at run
//! time), large objects whose segment is mounted with the same identity, whose extents are free
//! and whose data still checks. The parts are deleted once every shard has read them, so a
//! later crash never resurrects anything. `--warm-restart off` writes and restores nothing.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::path::Path;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::dir::Dir;
use crate::placement::TargetId;
use crate::proto::StoreMode;
use crate::ram_snapshot::Layout;
use crate::segment::mount::legacy_path_uuid;
use crate::segment::{Extent, TargetKind, TargetSpec, TargetStorage};
use crate::snapshot::{self, Snapshot, SnapshotObject, SnapshotTarget, TargetIds};
use crate::store::{LargeLink, StoreOutcome};
use crate::units::ByteSize;

use super::part_file;
use crate::server::shard::ctx::{ShardCtx, ShardReply, ShardRequest, TargetRow};
use crate::server::shard::shared::unix_now;
use crate::server::shard::warm_report::Skip;

/// The snapshot directory's name in the data directory.
const SNAPSHOT_DIR: &str = crate::server::shard::data_dir::SNAPSHOT_DIR;

/// The snapshot directory, opened through the data directory (never through a link); `None`
/// when there is none.
fn snapshot_dir(ctx: &ShardCtx, create: bool) -> std::io::Result<Option<Dir>> {
    ctx.shared
        .data_dir
        .dir
        .sub_dir(OsStr::new(SNAPSHOT_DIR), create)
}

async fn target_rows(ctx: &ShardCtx) -> Vec<TargetRow> {
    match ctx.call_master(ShardRequest::PlacementStats).await {
        ShardReply::PlacementStats(master) => master.targets,
        _ => Vec::new(),
    }
}

fn to_snapshot_target(spec: &TargetSpec) -> SnapshotTarget {
    SnapshotTarget {
        uuid: spec.uuid,
        kind: u8::from(spec.kind == TargetKind::File),
        base: spec.base,
        size: spec.size,
        node: spec.locality,
        name: spec.name.clone(),
    }
}

/// Writes this shard's part: the large items of its partitions, with their replicas on file
/// segments.
async fn write_part(ctx: &Rc<ShardCtx>) {
    let rows = target_rows(ctx).await;
    let files: HashMap<TargetId, &TargetSpec> = rows
        .iter()
        .filter(|r| r.spec.kind == TargetKind::File)
        .map(|r| (r.id, &r.spec))
        .collect();
    let now = unix_now();
    let partitions = &ctx.shared.partitions;
    let items: Vec<_> = partitions
        .owned_by(ctx.id, ctx.shards)
        .flat_map(|index| partitions.lock(index).large_items(now))
        .collect();
    let mut snapshot = Snapshot {
        ids: TargetIds::SegmentId,
        targets: files.values().map(|s| to_snapshot_target(s)).collect(),
        objects: Vec::new(),
    };
    for (key, flags, expiry, large) in items {
        let replicas: Vec<(u128, Extent)> = large
            .replicas
            .iter()
            .filter_map(|(t, e)| files.get(t).map(|spec| (spec.uuid, *e)))
            .collect();
        if !replicas.is_empty() {
            snapshot.objects.push(SnapshotObject {
                key,
                flags,
                expiry,
                value_len: large.value_len,
                checksum: large.checksum,
                replicas,
            });
        }
    }
    if snapshot.objects.is_empty() {
        return;
    }
    let data_dir = Arc::clone(&ctx.shared.data_dir.dir);
    let path = data_dir
        .path()
        .join(SNAPSHOT_DIR)
        .join(format!("part-{}.bin", ctx.id));
    let (name, tmp) = (
        OsString::from(format!("part-{}.bin", ctx.id)),
        OsString::from(format!(".part-{}.tmp", ctx.id)),
    );
    let bytes = snapshot::encode(&snapshot);
    // The values reach the device before the snapshot that names them does.
    let files: Vec<Arc<crate::segment::FileStorage>> = ctx
        .storage
        .borrow()
        .iter()
        .filter_map(|s| match s {
            Some(TargetStorage::File(f)) => Some(Arc::clone(f)),
            _ => None,
        })
        .collect();
    let (shown, objects) = (path.display().to_string(), snapshot.objects.len());
    let written = glommio::executor()
        .spawn_blocking(move || {
            for file in &files {
                file.sync_data()?;
            }
            write_atomically(&data_dir, &name, &tmp, &bytes)
        })
        .await;
    match written {
        Ok(()) => tracing::info!(shard = ctx.id, objects, path = %shown, "snapshot written"),
        Err(err) => {
            let values = if objects == 1 { "value" } else { "values" };
            snapshot_failed(ctx, &shown, &err, format!("{objects} large {values}"));
        }
    }
}

/// Records that a part of the snapshot was not written (`what`: what it would have held):
/// the stop then writes no manifest, removes the parts, and ends with one ERROR line that
/// gives these (`Running::stop`).
fn snapshot_failed(ctx: &ShardCtx, path: &str, err: &std::io::Error, what: String) {
    tracing::warn!(shard = ctx.id, %err, path, not_written = %what, "warm-restart snapshot part not written");
    let failure = format!("{path}: {err}; not written: {what}");
    let mut failures = ctx
        .shared
        .snapshot_failures
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    failures.push(failure);
}

/// Writes `bytes` as `name` in the snapshot directory, whole or not at all: into `tmp`, synced,
/// then renamed over `name` and the directory synced. A crash before the rename leaves the
/// previous part (or none), never half of one.
fn write_atomically(
    data_dir: &Dir,
    name: &OsStr,
    tmp: &OsStr,
    bytes: &[u8],
) -> std::io::Result<()> {
    let dir = data_dir
        .sub_dir(OsStr::new(SNAPSHOT_DIR), true)?
        .ok_or_else(|| {
            std::io::Error::other(format!(
                "{} could not be created",
                data_dir.path().join(SNAPSHOT_DIR).display()
            ))
        })?;
    // A leftover of ours (or anything planted) is removed, never written through.
    dir.remove_file(tmp)?;
    let (mut out, created) = dir.open_regular_file(tmp, true)?;
    if !created {
        return Err(std::io::Error::other(format!(
            "{} appeared while it was being written",
            dir.path().join(tmp).display()
        )));
    }
    let written = std::io::Write::write_all(&mut out, bytes)
        .and_then(|()| out.sync_all())
        .and_then(|()| dir.rename(tmp, name));
    if written.is_err() {
        // Its room back (a full disk is the likely cause).
        let _ = dir.remove_file(tmp);
    }
    written?;
    dir.sync()
}

/// Writes this shard's parts (large items, then RAM items); the last shard to finish writes
/// the manifest that makes the snapshot whole.
pub async fn write_parts(ctx: &Rc<ShardCtx>) {
    // A manifest left from before (its removal at start failed) must not vouch for these parts.
    if let Ok(Some(dir)) = snapshot_dir(ctx, false) {
        let _ = dir.remove_file(OsStr::new(MANIFEST));
    }
    write_part(ctx).await;
    write_ram_part(ctx).await;
    if ctx.shared.snapshot_written.fetch_add(1, Ordering::AcqRel) + 1 != ctx.shards {
        return;
    }
    let failed = !ctx
        .shared
        .snapshot_failures
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .is_empty();
    let data_dir = Arc::clone(&ctx.shared.data_dir.dir);
    if failed {
        // Never a snapshot in part: without a manifest nothing is restored, and the parts
        // that were written go, to give their room back.
        glommio::executor()
            .spawn_blocking(move || {
                if let Ok(Some(dir)) = data_dir.sub_dir(OsStr::new(SNAPSHOT_DIR), false) {
                    for name in dir.names().unwrap_or_default() {
                        let _ = dir.remove_file(&name);
                    }
                }
            })
            .await;
        return;
    }
    let layout = layout_of(ctx);
    let path = data_dir.path().join(SNAPSHOT_DIR).join(MANIFEST);
    let sealed = glommio::executor()
        .spawn_blocking(move || write_manifest(&data_dir, layout))
        .await;
    match sealed {
        Ok(0) => {}
        Ok(parts) => tracing::info!(parts, "warm-restart snapshot complete"),
        Err(err) => snapshot_failed(
            ctx,
            &path.display().to_string(),
            &err,
            "the manifest (every part is there, but none will be restored without it)".into(),
        ),
    }
}

/// The file whose presence makes a snapshot whole: it lists every part, written last (after
/// every part was synced and renamed). A stop cut short (kill -9, power loss) leaves parts
/// without one, and the next start restores none of them: the previous state or none, never
/// a mix.
const MANIFEST: &str = "manifest";
const MANIFEST_FIRST_LINE: &str = "headroom snapshot 1";

/// How this server spreads keys over partitions.
fn layout_of(ctx: &ShardCtx) -> Layout {
    let partitions = &ctx.shared.partitions;
    Layout {
        partitions: partitions.len() as u32,
        seed: partitions.hasher().seed(),
    }
}

/// Writes the manifest naming every part in the snapshot directory, with the layout (the next
/// start keeps the key hash seed, so a part's chunks are each one of its partitions); returns
/// how many parts.
fn write_manifest(data_dir: &Dir, layout: Layout) -> std::io::Result<usize> {
    let Some(dir) = data_dir.sub_dir(OsStr::new(SNAPSHOT_DIR), false)? else {
        return Ok(0);
    };
    let mut parts: Vec<String> = dir
        .names()?
        .into_iter()
        .filter_map(|n| n.into_string().ok())
        .filter(|n| is_part(n))
        .collect();
    if parts.is_empty() {
        return Ok(0);
    }
    parts.sort();
    let mut text = format!(
        "{MANIFEST_FIRST_LINE}\npartitions {}\nseed {:016x}\n",
        layout.partitions, layout.seed
    );
    for name in &parts {
        text.push_str(name);
        text.push('\n');
    }
    text.push_str(&format!("crc32c {:08x}\n", crc32c::crc32c(text.as_bytes())));
    write_atomically(
        data_dir,
        OsStr::new(MANIFEST),
        OsStr::new(".manifest.tmp"),
        text.as_bytes(),
    )?;
    Ok(parts.len())
}

/// A part's name: `part-N.bin` (large items) or `ram-N.part` (RAM items).
fn is_part(name: &str) -> bool {
    (name.starts_with("part-") && name.ends_with(".bin"))
        || (name.starts_with("ram-") && name.ends_with(".part"))
}

/// What a whole snapshot's manifest says.
struct Manifest {
    layout: Layout,
    parts: Vec<OsString>,
}

/// The manifest, or why the snapshot is not whole.
fn read_manifest(dir: &Dir) -> Result<Manifest, String> {
    let mut text = String::new();
    dir.open_regular_file_to_read(OsStr::new(MANIFEST))
        .and_then(|mut f| std::io::Read::read_to_string(&mut f, &mut text))
        .map_err(|err| format!("no manifest ({err}): the stop that wrote it was cut short"))?;
    let (body, crc_line) = text
        .trim_end_matches('\n')
        .rsplit_once('\n')
        .ok_or("an empty manifest")?;
    let body = format!("{body}\n");
    let want = crc_line
        .strip_prefix("crc32c ")
        .and_then(|hex| u32::from_str_radix(hex, 16).ok())
        .ok_or("a manifest without its checksum")?;
    if crc32c::crc32c(body.as_bytes()) != want {
        return Err("a manifest whose checksum fails".into());
    }
    let mut lines = body.lines();
    let mut field = |name: &str| {
        lines
            .next()
            .and_then(|line| line.strip_prefix(name))
            .map(str::to_owned)
    };
    let (Some(_), Some(partitions), Some(seed)) = (
        field(MANIFEST_FIRST_LINE),
        field("partitions "),
        field("seed "),
    ) else {
        return Err("a manifest of another format".into());
    };
    let layout = partitions
        .parse()
        .ok()
        .zip(u64::from_str_radix(&seed, 16).ok())
        .map(|(partitions, seed)| Layout { partitions, seed })
        .ok_or("a manifest of another format")?;
    Ok(Manifest {
        layout,
        parts: lines.filter(|n| is_part(n)).map(OsString::from).collect(),
    })
}

/// At start, before the key space is built: the key hash seed of the whole snapshot in
/// `data_dir`, if one will be restored (keeping it keeps every key in its partition, so each
/// shard reads only its own partitions' chunks).
pub fn kept_seed(data_dir: &Dir, warm_restart: bool) -> Option<u64> {
    if !warm_restart {
        return None;
    }
    let dir = data_dir.sub_dir(OsStr::new(SNAPSHOT_DIR), false).ok()??;
    read_manifest(&dir).ok().map(|m| m.layout.seed)
}

/// Index buckets walked under one partition lock while writing (the sealed chunks of one
/// slice wait in memory for the writes).
const SLICE_BUCKETS: usize = 1024;

/// Writes this shard's RAM part: every live item its partitions hold in RAM, in checksummed
/// chunks of one partition each (`ram_snapshot`), through `part_file` (the ring when there is
/// one). The server has stopped serving, so nothing changes the index between two slices.
async fn write_ram_part(ctx: &Rc<ShardCtx>) {
    let started = std::time::Instant::now();
    let name = OsString::from(format!("ram-{}.part", ctx.id));
    let tmp = OsString::from(format!(".ram-{}.tmp", ctx.id));
    let shown = ctx
        .shared
        .data_dir
        .dir
        .path()
        .join(SNAPSHOT_DIR)
        .join(&name);
    match write_ram_items(ctx, &name, &tmp).await {
        Ok(None) => {}
        Ok(Some((items, bytes, how))) => tracing::info!(
            shard = ctx.id,
            items,
            bytes,
            ms = started.elapsed().as_millis() as u64,
            io = how,
            path = %shown.display(),
            "RAM items written for the warm restart"
        ),
        Err(err) => {
            if let Ok(Some(dir)) = snapshot_dir(ctx, false) {
                let _ = dir.remove_file(&tmp);
            }
            // What this shard held in RAM, the part's whole worth.
            let partitions = &ctx.shared.partitions;
            let (items, bytes) = partitions
                .owned_by(ctx.id, ctx.shards)
                .map(|index| {
                    let stats = partitions.lock(index).stats();
                    (
                        stats.curr_items.saturating_sub(stats.large_items),
                        stats.bytes,
                    )
                })
                .fold((0, 0), |(i, b), (items, bytes)| (i + items, b + bytes));
            let what = format!("{items} RAM items ({} of RAM)", ByteSize(bytes));
            snapshot_failed(ctx, &shown.display().to_string(), &err, what);
        }
    }
}

/// Writes the RAM part into `tmp`, then syncs it and renames it to `name`; returns the items
/// and bytes written and how (`None`: no item, no part).
async fn write_ram_items(
    ctx: &Rc<ShardCtx>,
    name: &OsStr,
    tmp: &OsStr,
) -> std::io::Result<Option<(u64, u64, &'static str)>> {
    use crate::ram_snapshot::{self as format, ChunkEncoder, ChunkRef, SealedChunk};
    let now = unix_now();
    let partitions = &ctx.shared.partitions;
    let mut writer: Option<(Dir, part_file::PartWriter)> = None;
    let mut chunks: Vec<ChunkRef> = Vec::new();
    let mut encoder = ChunkEncoder::default();
    let mut items = 0u64;
    // Places a sealed chunk: opens the part on the first one.
    async fn place(
        ctx: &ShardCtx,
        tmp: &OsStr,
        writer: &mut Option<(Dir, part_file::PartWriter)>,
        chunks: &mut Vec<ChunkRef>,
        sealed: SealedChunk,
    ) -> std::io::Result<()> {
        if writer.is_none() {
            let dir = snapshot_dir(ctx, true)?.ok_or_else(|| {
                std::io::Error::other("the snapshot directory could not be created")
            })?;
            // A leftover of ours (or anything planted) is removed, never written through.
            dir.remove_file(tmp)?;
            let (file, created) = dir.open_regular_file(tmp, true)?;
            if !created {
                return Err(std::io::Error::other(format!(
                    "{} appeared while it was being written",
                    dir.path().join(tmp).display()
                )));
            }
            let mut part = part_file::PartWriter::new(&ctx.io, &dir, tmp, file);
            part.append(&format::header_block(layout_of(ctx))).await?;
            *writer = Some((dir, part));
        }
        let (_, part) = writer.as_mut().expect("opened above");
        chunks.push(ChunkRef {
            offset: part.position(),
            partition: sealed.partition,
            hot: sealed.hot,
            count: sealed.count,
            body_len: sealed.body_len,
        });
        part.append(&sealed.bytes).await
    }
    // Each partition twice: its cold items, then its referenced ones, in chunks of their own.
    for (index, hot) in partitions
        .owned_by(ctx.id, ctx.shards)
        .flat_map(|index| [(index, false), (index, true)])
    {
        let mut from = Some(0);
        while let Some(bucket) = from {
            let mut sealed = Vec::new();
            {
                let store = partitions.lock(index);
                from = store.ram_items_in(
                    (bucket, SLICE_BUCKETS),
                    now,
                    |key, meta, recency, value| {
                        if recency.referenced != hot {
                            return;
                        }
                        items += 1;
                        let meta = (meta.flags, meta.expiry, meta.cas, recency);
                        sealed.extend(encoder.push(index as u32, key, meta, &value.parts()));
                    },
                );
            }
            for chunk in sealed {
                place(ctx, tmp, &mut writer, &mut chunks, chunk).await?;
            }
        }
    }
    if let Some(last) = encoder.finish() {
        place(ctx, tmp, &mut writer, &mut chunks, last).await?;
    }
    let Some((dir, mut part)) = writer else {
        return Ok(None);
    };
    let index = format::index_blocks(&chunks, part.position());
    part.append(&index).await?;
    let how = part.how();
    let bytes = part.finish().await?;
    let (tmp, name) = (tmp.to_owned(), name.to_owned());
    glommio::executor()
        .spawn_blocking(move || {
            dir.open_regular_file_to_read(&tmp)?.sync_all()?;
            dir.rename(&tmp, &name)?;
            dir.sync()
        })
        .await?;
    Ok(Some((items, bytes, how)))
}

/// What restoring the RAM parts did (what it did not is counted in `warm_report`).
#[derive(Default)]
struct RamRestore {
    /// How the parts were read, for the log.
    io: &'static str,
    restored: u64,
    bytes_read: u64,
}

/// Restores, from every RAM part, the items of this shard's partitions that have not expired.
/// A part whose writer spread keys as this server does is read only where its chunks hold
/// this shard's partitions (the index says where); otherwise every chunk is read and each
/// item's key decides. The chunks of items that were cold go first, then the referenced ones,
/// so when not everything fits the store evicts the coldest first. A chunk that does not
/// check is dropped whole and its items counted.
async fn restore_ram_parts(ctx: &Rc<ShardCtx>, dir: &Dir, names: &[OsString]) -> RamRestore {
    let mut done = RamRestore::default();
    let mut parts = Vec::new();
    for name in names
        .iter()
        .filter(|n| n.to_string_lossy().ends_with(".part"))
    {
        match plan_ram_part(ctx, dir, name).await {
            Ok((reader, chunks)) => {
                done.io = reader.how();
                parts.push((name, reader, chunks));
            }
            Err(err) => {
                if ctx.id == 0 {
                    tracing::warn!(part = %dir.path().join(name).display(), %err, "RAM part unreadable: its items start empty");
                    skipped_ram(ctx, dir, name, 1);
                }
            }
        }
    }
    let order: Vec<(usize, crate::ram_snapshot::ChunkRef)> = [false, true]
        .into_iter()
        .flat_map(|hot| {
            parts
                .iter()
                .enumerate()
                .flat_map(move |(part, (_, _, chunks))| {
                    chunks
                        .iter()
                        .filter(move |c| c.hot == hot)
                        .map(move |c| (part, *c))
                })
        })
        .collect();
    let mut dropped_chunks = vec![0u64; parts.len()];
    let depth = parts.first().map_or(1, |(_, reader, _)| reader.depth());
    let mut reads = std::collections::VecDeque::new();
    let mut next = order.into_iter();
    let now = unix_now();
    loop {
        while reads.len() < depth {
            let Some((part, chunk)) = next.next() else {
                break;
            };
            let read = parts[part].1.read(chunk.offset, chunk.len() as usize);
            reads.push_back((part, chunk, read));
        }
        let Some((part, chunk, read)) = reads.pop_front() else {
            break;
        };
        let bytes = read
            .await
            .unwrap_or_else(|| Err(std::io::Error::other("a snapshot read was cancelled")));
        match bytes
            .ok()
            .as_deref()
            .and_then(|b| crate::ram_snapshot::chunk_items(&chunk, b))
        {
            Some(items) => {
                done.bytes_read += chunk.len();
                store_items(ctx, &items, now, &mut done);
            }
            // Every chunk has one shard that counts it.
            None if chunk.partition as usize % ctx.shards == ctx.id => {
                dropped_chunks[part] += 1;
                skipped_ram(ctx, dir, parts[part].0, u64::from(chunk.count));
            }
            None => {}
        }
    }
    for ((name, _, _), chunks) in parts.iter().zip(dropped_chunks) {
        if chunks > 0 {
            tracing::warn!(
                shard = ctx.id,
                part = %dir.path().join(name).display(),
                chunks,
                "RAM part chunks that do not check were dropped with their items"
            );
        }
    }
    done
}

/// Plans the reading of one RAM part: a reader, and the chunks this shard reads from it.
async fn plan_ram_part(
    ctx: &Rc<ShardCtx>,
    dir: &Dir,
    name: &OsStr,
) -> std::io::Result<(part_file::PartReader, Vec<crate::ram_snapshot::ChunkRef>)> {
    use crate::ram_snapshot as format;
    let file = dir.open_regular_file_to_read(name)?;
    let planned = {
        let file = file.try_clone()?;
        glommio::executor()
            .spawn_blocking(move || {
                let len = file.metadata()?.len();
                format::plan(len, |at, want| {
                    let mut bytes = vec![0u8; want];
                    let mut got = 0;
                    while got < want {
                        match std::os::unix::fs::FileExt::read_at(
                            &file,
                            &mut bytes[got..],
                            at + got as u64,
                        )? {
                            0 => break,
                            n => got += n,
                        }
                    }
                    bytes.truncate(got);
                    Ok::<_, std::io::Error>(bytes)
                })
            })
            .await?
    };
    let plan = planned.map_err(std::io::Error::other)?;
    let (shards, id) = (ctx.shards, ctx.id);
    if id == 0 && (!plan.indexed || plan.damaged_stretches > 0) {
        tracing::warn!(
            part = %dir.path().join(name).display(),
            chunks = plan.chunks.len(),
            damaged_stretches = plan.damaged_stretches,
            damaged_bytes = plan.damaged_bytes,
            "RAM part without its index (damaged or truncated): its chunk headers were walked; what does not check is dropped, the rest restored"
        );
        skipped_ram(ctx, dir, name, plan.damaged_stretches);
    }
    let same_layout = plan.layout == layout_of(ctx);
    let wanted = plan
        .chunks
        .into_iter()
        .filter(|chunk| !same_layout || chunk.partition as usize % shards == id)
        .collect();
    Ok((part_file::PartReader::new(&ctx.io, dir, name, file), wanted))
}

/// Counts `count` RAM items (or damaged stretches) of part `name` not restored.
fn skipped_ram(ctx: &ShardCtx, dir: &Dir, name: &OsStr, count: u64) {
    let part = || dir.path().join(name).display().to_string();
    ctx.shared.warm_restart.skip(Skip::RamDamaged, count, part);
}

/// Stores a chunk's items that belong to this shard and have not expired, their CAS kept;
/// what the store refuses is counted. Consecutive items of one partition share one
/// hold of its lock.
fn store_items(
    ctx: &Rc<ShardCtx>,
    items: &[crate::ram_snapshot::ItemRef<'_>],
    now: u32,
    done: &mut RamRestore,
) {
    let partitions = &ctx.shared.partitions;
    let mut frees = Vec::new();
    let mut held = None;
    let mut not_stored = 0;
    for item in items {
        let partition = partitions.of_key(item.key);
        if partition % ctx.shards != ctx.id || (item.expiry != 0 && item.expiry <= now) {
            continue;
        }
        let store = match &mut held {
            Some((p, store)) if *p == partition => store,
            _ => {
                held = None; // one lock at a time
                &mut held.insert((partition, partitions.lock(partition))).1
            }
        };
        let meta = crate::store::item::Meta {
            cas: item.cas,
            flags: item.flags,
            expiry: item.expiry,
        };
        let outcome = store.restore_item(item.key, item.value, meta, item.recency);
        frees.extend(store.take_pending_frees());
        match outcome {
            StoreOutcome::Stored { .. } => done.restored += 1,
            _ => not_stored += 1,
        }
    }
    drop(held);
    let warm = &ctx.shared.warm_restart;
    warm.skip(Skip::RamNotStored, not_stored, String::new);
    ctx.free_extents(frees);
}

/// Reads a value back from a file target and checks its CRC32C; returns its head if it holds.
async fn verify(
    ctx: &Rc<ShardCtx>,
    target: TargetId,
    extent: Extent,
    object: &SnapshotObject,
    head_bytes: usize,
) -> Option<Vec<u8>> {
    let want = object.checksum;
    let Some(TargetStorage::File(storage)) = ctx
        .storage
        .borrow()
        .get(target.0 as usize)
        .cloned()
        .flatten()
    else {
        return None;
    };
    let chunk = ctx.shared.settings.arena.io_chunk_bytes;
    let (value_len, offset) = (object.value_len, extent.offset);
    let storage = Arc::clone(&storage);
    glommio::executor()
        .spawn_blocking(move || {
            let align = storage.dio_align;
            let mut crc = 0u32;
            let mut head = Vec::with_capacity(head_bytes);
            let mut at = 0u64;
            while at < value_len {
                let len = (value_len - at).min(chunk);
                let mut buf = crate::segment::storage::AlignedBuf::zeroed(
                    len.next_multiple_of(align) as usize,
                    align as usize,
                );
                storage.read_at(&mut buf, offset + at).ok()?;
                let bytes = &buf.as_slice()[..len as usize];
                crc = crc32c::crc32c_append(crc, bytes);
                if head.len() < head_bytes {
                    let take = (head_bytes - head.len()).min(bytes.len());
                    head.extend_from_slice(&bytes[..take]);
                }
                at += len;
            }
            (crc == want).then_some(head)
        })
        .await
}

/// Restores the objects of this shard's partitions from every snapshot part.
pub async fn restore(ctx: &Rc<ShardCtx>) {
    let started = std::time::Instant::now();
    let dir = match snapshot_dir(ctx, false) {
        Ok(Some(dir)) => dir,
        Ok(None) => {
            finish_restore(ctx, None);
            return;
        }
        Err(err) => {
            if ctx.id == 0 {
                tracing::warn!(%err, "snapshot directory unusable: every object starts empty");
            }
            finish_restore(ctx, None);
            return;
        }
    };
    let names = dir.names().unwrap_or_default();
    if !ctx.shared.settings.warm_restart {
        if ctx.id == 0 && !names.is_empty() {
            tracing::info!("--warm-restart off: the snapshot found is removed, nothing restored");
        }
        finish_restore(ctx, Some(&dir));
        return;
    }
    let names = match read_manifest(&dir) {
        Ok(manifest) => manifest.parts,
        Err(reason) => {
            if ctx.id == 0 && names.iter().any(|n| is_part(&n.to_string_lossy())) {
                tracing::warn!(%reason, "warm-restart snapshot incomplete: nothing restored, it is removed");
            }
            finish_restore(ctx, Some(&dir));
            return;
        }
    };
    let evictions = |ctx: &ShardCtx| -> u64 {
        let partitions = &ctx.shared.partitions;
        partitions
            .owned_by(ctx.id, ctx.shards)
            .map(|index| partitions.lock(index).stats().evictions)
            .sum()
    };
    let evictions_before = evictions(ctx);
    let ram = restore_ram_parts(ctx, &dir, &names).await;
    let evicted = evictions(ctx) - evictions_before;
    let warm = &ctx.shared.warm_restart;
    warm.evicted.fetch_add(evicted, Ordering::Relaxed);
    if evicted > 0 {
        tracing::info!(
            shard = ctx.id,
            evicted,
            "warm restart: restored items evicted again, the coldest first: they do not all fit --memory"
        );
    }
    warm.restored.fetch_add(ram.restored, Ordering::Relaxed);
    if ram.restored > 0 {
        let ms = started.elapsed().as_millis() as u64;
        tracing::info!(
            shard = ctx.id,
            restored = ram.restored,
            bytes_read = ram.bytes_read,
            io = ram.io,
            ms,
            "warm restart: RAM items"
        );
    }
    let rows = target_rows(ctx).await;
    let mut restored = 0u64;
    let mut parts: Vec<OsString> = names
        .iter()
        .filter(|n| Path::new(n).extension().is_some_and(|x| x == "bin"))
        .cloned()
        .collect();
    parts.sort();
    for name in parts {
        let part = dir.path().join(&name);
        let decoded = dir
            .open_regular_file_to_read(&name)
            .and_then(|mut file| {
                let mut bytes = Vec::new();
                std::io::Read::read_to_end(&mut file, &mut bytes).map(|_| bytes)
            })
            .map_err(|e| e.to_string())
            .and_then(|b| snapshot::decode(&b).map_err(|e| e.to_string()));
        let (snap, bad_records) = match decoded {
            Ok(decoded) => decoded,
            Err(reason) => {
                if ctx.id == 0 {
                    tracing::warn!(part = %part.display(), %reason, "snapshot part unusable: its objects start empty");
                }
                continue;
            }
        };
        if ctx.id == 0 {
            let shown = || part.display().to_string();
            warm.skip(Skip::RecordDamaged, bad_records, shown);
        }
        restored += restore_large_part(ctx, &snap, &rows).await;
    }
    if restored > 0 {
        tracing::info!(shard = ctx.id, restored, "warm restart: large values");
    }
    warm.restored.fetch_add(restored, Ordering::Relaxed);
    warm.restore_ns
        .fetch_max(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
    finish_restore(ctx, Some(&dir));
}

/// The mounted file segment a snapshot's target names, or why none is its segment now. A
/// version 2 snapshot names a segment by the id in its label, wherever the file lies now; a
/// version 1 snapshot by a hash of its path.
fn segment_of<'r>(
    snap: &Snapshot,
    was: &SnapshotTarget,
    rows: &'r [TargetRow],
) -> Result<&'r TargetRow, (Skip, String)> {
    let files = || rows.iter().filter(|r| r.spec.kind == TargetKind::File);
    let id = |uuid: u128| format!("{uuid:032x}");
    let found = match snap.ids {
        TargetIds::SegmentId => files().find(|r| r.spec.uuid == was.uuid),
        TargetIds::PathHash => {
            files().find(|r| legacy_path_uuid(Path::new(&r.spec.name)) == was.uuid)
        }
    };
    let Some(row) = found else {
        let named = match snap.ids {
            TargetIds::SegmentId => format!("{} (id {}) is not mounted", was.name, id(was.uuid)),
            TargetIds::PathHash => format!(
                "{} is not mounted at that path (a snapshot an older build wrote names it by its \
                 path: start once with the segment there)",
                was.name
            ),
        };
        // Another segment where this one was: say so.
        let there = files().find(|r| r.spec.name == was.name);
        let detail = match there {
            Some(r) if snap.ids == TargetIds::SegmentId => format!(
                "{named}; {} now holds another segment, id {}",
                was.name,
                id(r.spec.uuid)
            ),
            _ => named,
        };
        return Err((Skip::SegmentMissing, detail));
    };
    if row.spec.size != was.size || row.spec.base != was.base {
        return Err((
            Skip::SegmentChanged,
            format!(
                "{} (id {}) is mounted with {} bytes at base {}, not the {} at base {} they \
                 were written in",
                row.spec.name,
                id(row.spec.uuid),
                row.spec.size,
                row.spec.base,
                was.size,
                was.base
            ),
        ));
    }
    Ok(row)
}

/// Restores the large values of one snapshot part that belong to this shard's partitions and
/// have not expired: each replica on its segment if that is mounted as it was and its bytes
/// still check; what is not restored is counted by reason. Returns how many were restored.
async fn restore_large_part(ctx: &Rc<ShardCtx>, snap: &Snapshot, rows: &[TargetRow]) -> u64 {
    let warm = &ctx.shared.warm_restart;
    let now = unix_now();
    let head_bytes = ctx.shared.settings.arena.ram_head_bytes as usize;
    let known: HashMap<u128, &SnapshotTarget> = snap.targets.iter().map(|t| (t.uuid, t)).collect();
    let mut restored = 0;
    for object in &snap.objects {
        let partition = ctx.shared.partitions.of_key(&object.key);
        if partition % ctx.shards != ctx.id {
            continue;
        }
        if object.expiry != 0 && object.expiry <= now {
            continue;
        }
        // Replicas whose segment is mounted as it was; else why not (the first replica's).
        let mut replicas: Vec<(TargetId, Extent, &str)> = Vec::new();
        let mut missing = None;
        for (uuid, extent) in &object.replicas {
            let found = known
                .get(uuid)
                .ok_or_else(|| {
                    let why = format!("id {uuid:032x}, which the part does not describe");
                    (Skip::RecordDamaged, why)
                })
                .and_then(|was| segment_of(snap, was, rows));
            match found {
                Ok(row) => replicas.push((row.id, *extent, &row.spec.name)),
                Err(why) => {
                    missing.get_or_insert(why);
                }
            }
        }
        // Every replica is read back: only those whose bytes still check are kept.
        let mut kept = Vec::with_capacity(replicas.len());
        let mut head = None;
        for &(target, extent, segment) in &replicas {
            match verify(ctx, target, extent, object, head_bytes).await {
                Some(bytes) => {
                    head.get_or_insert(bytes);
                    kept.push((target, extent));
                }
                None => {
                    tracing::debug!(key = %String::from_utf8_lossy(&object.key), %target, offset = extent.offset, "snapshot object's data no longer matches its checksum: replica not restored");
                    missing.get_or_insert((Skip::DataChanged, segment.to_string()));
                }
            }
        }
        let Some(head) = head else {
            let (why, example) = missing.unwrap_or((Skip::SegmentMissing, String::new()));
            warm.skip(why, 1, || example);
            continue;
        };
        let taken_in = replicas.first().map_or("", |r| r.2).to_string();
        let claim = ShardRequest::Claim {
            key: object.key.clone(),
            extents: kept.clone(),
        };
        let ShardReply::Claimed(true) = ctx.call_master(claim).await else {
            warm.skip(Skip::ExtentsTaken, 1, || taken_in);
            continue;
        };
        let link = LargeLink {
            value_len: object.value_len,
            checksum: object.checksum,
            replicas: kept,
            head,
        };
        let mut store = ctx.shared.partitions.lock(partition);
        let outcome = store.link_large(
            StoreMode::Set,
            &object.key,
            object.flags,
            object.expiry,
            0,
            now,
            link,
        );
        let frees = store.take_pending_frees();
        drop(store);
        ctx.free_extents(frees);
        match outcome {
            StoreOutcome::Stored { .. } => restored += 1,
            _ => warm.skip(Skip::NotStored, 1, String::new),
        }
    }
    restored
}

/// Where a consumed snapshot waits for its removal (`snapshot.consumed-<ns>`).
const CONSUMED_PREFIX: &str = "snapshot.consumed-";

/// The last shard to finish reading retires the snapshot: nothing is restored twice. The
/// directory is renamed aside and the rename synced before any shard serves (that is the
/// commit: a crash from then on restarts empty); its files, gigabytes perhaps, are removed
/// on the blocking pool meanwhile, with any left by an earlier run. Entries are removed
/// through the directory (a link among them goes, its target stays).
fn finish_restore(ctx: &ShardCtx, dir: Option<&Dir>) {
    if ctx.shared.restored.fetch_add(1, Ordering::AcqRel) + 1 != ctx.shards {
        return;
    }
    ctx.shared.warm_restart.log_skips();
    let data_dir = Arc::clone(&ctx.shared.data_dir.dir);
    if dir.is_some() {
        let aside = format!("{CONSUMED_PREFIX}{}", started_ns());
        let retired = data_dir
            .rename(OsStr::new(SNAPSHOT_DIR), OsStr::new(&aside))
            .and_then(|()| data_dir.sync());
        if let Err(err) = retired {
            tracing::error!(%err, "the restored snapshot could not be retired; removing it in place");
            remove_snapshot_dir(&data_dir, OsStr::new(SNAPSHOT_DIR));
        }
    }
    let consumed: Vec<OsString> = data_dir
        .names()
        .unwrap_or_default()
        .into_iter()
        .filter(|n| n.to_string_lossy().starts_with(CONSUMED_PREFIX))
        .collect();
    if consumed.is_empty() {
        return;
    }
    let removal = glommio::executor().spawn_blocking(move || {
        for name in &consumed {
            remove_snapshot_dir(&data_dir, name);
        }
    });
    glommio::spawn_local(removal).detach();
}

fn started_ns() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

/// Removes the snapshot directory `name` of `data_dir` and every file in it.
fn remove_snapshot_dir(data_dir: &Dir, name: &OsStr) {
    if let Ok(Some(dir)) = data_dir.sub_dir(name, false) {
        for entry in dir.names().unwrap_or_default() {
            let _ = dir.remove_file(&entry);
        }
    }
    if let Err(err) = data_dir.remove_dir(name) {
        tracing::warn!(%err, dir = %data_dir.path().join(name).display(), "a consumed snapshot directory was not removed");
    }
}
