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
use crate::segment::{Extent, TargetKind, TargetSpec, TargetStorage};
use crate::snapshot::{self, Snapshot, SnapshotObject, SnapshotTarget};
use crate::store::{LargeLink, StoreOutcome};

use super::shard::{ShardCtx, ShardReply, ShardRequest, TargetRow};
use super::unix_now;

/// The snapshot directory's name in the data directory.
const SNAPSHOT_DIR: &str = super::data_dir::SNAPSHOT_DIR;

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
pub async fn write_part(ctx: &Rc<ShardCtx>) {
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
            tracing::error!(shard = ctx.id, %err, path = %shown, "snapshot not written: these objects will not survive the restart")
        }
    }
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
    std::io::Write::write_all(&mut out, bytes)?;
    out.sync_all()?;
    dir.rename(tmp, name)?;
    dir.sync()
}

/// Writes this shard's RAM part: every live item its partitions hold in RAM, in checksummed
/// chunks (`ram_snapshot`). The server has stopped serving, so each partition is walked under
/// its lock at once.
pub async fn write_ram_part(ctx: &Rc<ShardCtx>) {
    let started = std::time::Instant::now();
    let now = unix_now();
    let mut bytes = crate::ram_snapshot::header();
    let mut encoder = crate::ram_snapshot::ChunkEncoder::default();
    let mut items = 0u64;
    for index in ctx.shared.partitions.owned_by(ctx.id, ctx.shards) {
        let store = ctx.shared.partitions.lock(index);
        store.ram_items(now, |key, meta, value| {
            items += 1;
            let value = value.parts();
            if let Some(chunk) = encoder.push(key, meta.flags, meta.expiry, meta.cas, &value) {
                bytes.extend_from_slice(&chunk);
            }
        });
    }
    if let Some(chunk) = encoder.finish() {
        bytes.extend_from_slice(&chunk);
    }
    if items == 0 {
        return;
    }
    let data_dir = Arc::clone(&ctx.shared.data_dir.dir);
    let name = OsString::from(format!("ram-{}.part", ctx.id));
    let tmp = OsString::from(format!(".ram-{}.tmp", ctx.id));
    let size = bytes.len();
    let written = glommio::executor()
        .spawn_blocking(move || write_atomically(&data_dir, &name, &tmp, &bytes))
        .await;
    match written {
        Ok(()) => tracing::info!(
            shard = ctx.id,
            items,
            bytes = size,
            ms = started.elapsed().as_millis() as u64,
            "RAM items written for the warm restart"
        ),
        Err(err) => {
            tracing::error!(shard = ctx.id, %err, "RAM items not written: they will not survive the restart")
        }
    }
}

/// Restores, from every RAM part, the items of this shard's partitions that have not expired;
/// a chunk that does not check is dropped whole and counted. Returns (restored, dropped).
fn restore_ram_parts(ctx: &Rc<ShardCtx>, dir: &Dir, names: &[OsString]) -> (u64, u64) {
    let now = unix_now();
    let (mut restored, mut dropped) = (0u64, 0u64);
    for name in names
        .iter()
        .filter(|n| Path::new(n).extension().is_some_and(|x| x == "part"))
    {
        let read = dir.open_regular_file_to_read(name).and_then(|mut file| {
            let mut bytes = Vec::new();
            std::io::Read::read_to_end(&mut file, &mut bytes).map(|_| bytes)
        });
        let decoded = match read.map(|b| crate::ram_snapshot::decode(&b)) {
            Ok(Ok(decoded)) => decoded,
            Ok(Err(err)) => {
                tracing::warn!(part = %dir.path().join(name).display(), %err, "RAM part unusable: its items start empty");
                dropped += 1;
                continue;
            }
            Err(err) => {
                tracing::warn!(part = %dir.path().join(name).display(), %err, "RAM part unreadable: its items start empty");
                dropped += 1;
                continue;
            }
        };
        if decoded.damaged_stretches > 0 && ctx.id == 0 {
            tracing::warn!(
                part = %dir.path().join(name).display(),
                stretches = decoded.damaged_stretches,
                bytes = decoded.damaged_bytes,
                "RAM part damaged: the chunks that do not check are dropped, the rest restored"
            );
        }
        dropped += decoded.damaged_stretches;
        for item in decoded.items {
            let partition = ctx.shared.partitions.of_key(&item.key);
            if partition % ctx.shards != ctx.id || (item.expiry != 0 && item.expiry <= now) {
                continue;
            }
            let mut store = ctx.shared.partitions.lock(partition);
            let outcome = store.store(
                StoreMode::Set,
                &item.key,
                &item.value,
                item.flags,
                item.expiry,
                0,
                now,
            );
            let outcome = store.with_client_cas(&item.key, now, outcome, item.cas);
            let frees = store.take_pending_frees();
            drop(store);
            ctx.free_extents(frees);
            match outcome {
                StoreOutcome::Stored { .. } => restored += 1,
                _ => dropped += 1,
            }
        }
    }
    (restored, dropped)
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
    let (ram_restored, ram_dropped) = restore_ram_parts(ctx, &dir, &names);
    let warm = &ctx.shared.warm_restart;
    warm.restored.fetch_add(ram_restored, Ordering::Relaxed);
    warm.dropped.fetch_add(ram_dropped, Ordering::Relaxed);
    if ram_restored + ram_dropped > 0 {
        tracing::info!(
            shard = ctx.id,
            restored = ram_restored,
            dropped = ram_dropped,
            ms = started.elapsed().as_millis() as u64,
            "warm restart: RAM items"
        );
    }
    let rows = target_rows(ctx).await;
    let by_uuid: HashMap<u128, &TargetRow> = rows.iter().map(|r| (r.spec.uuid, r)).collect();
    let (mut restored, mut skipped) = (0u64, 0u64);
    let now = unix_now();
    let head_bytes = ctx.shared.settings.arena.ram_head_bytes as usize;
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
        skipped += bad_records;
        let known: HashMap<u128, &SnapshotTarget> =
            snap.targets.iter().map(|t| (t.uuid, t)).collect();
        for object in snap.objects {
            let partition = ctx.shared.partitions.of_key(&object.key);
            if partition % ctx.shards != ctx.id {
                continue;
            }
            if object.expiry != 0 && object.expiry <= now {
                continue;
            }
            // Replicas whose segment is mounted again with the same identity.
            let replicas: Vec<(TargetId, Extent)> = object
                .replicas
                .iter()
                .filter_map(|(uuid, extent)| {
                    let was = known.get(uuid)?;
                    let row = by_uuid.get(uuid)?;
                    let same = row.spec.kind == TargetKind::File
                        && row.spec.size == was.size
                        && row.spec.base == was.base;
                    same.then_some((row.id, *extent))
                })
                .collect();
            // Every replica is read back: only those whose bytes still check are kept.
            let mut kept = Vec::with_capacity(replicas.len());
            let mut head = None;
            for &(target, extent) in &replicas {
                match verify(ctx, target, extent, &object, head_bytes).await {
                    Some(bytes) => {
                        head.get_or_insert(bytes);
                        kept.push((target, extent));
                    }
                    None => {
                        tracing::warn!(key = %String::from_utf8_lossy(&object.key), %target, offset = extent.offset, "snapshot object's data no longer matches its checksum: replica not restored")
                    }
                }
            }
            let Some(head) = head else {
                skipped += 1;
                continue;
            };
            let claim = ShardRequest::Claim {
                key: object.key.clone(),
                extents: kept.clone(),
            };
            let ShardReply::Claimed(true) = ctx.call_master(claim).await else {
                skipped += 1;
                continue;
            };
            let replicas = kept;
            let link = LargeLink {
                value_len: object.value_len,
                checksum: object.checksum,
                replicas,
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
                _ => skipped += 1,
            }
        }
    }
    if restored + skipped > 0 {
        tracing::info!(
            shard = ctx.id,
            restored,
            skipped,
            "warm restart from the snapshot"
        );
    }
    warm.restored.fetch_add(restored, Ordering::Relaxed);
    warm.dropped.fetch_add(skipped, Ordering::Relaxed);
    warm.restore_ns
        .fetch_max(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
    finish_restore(ctx, Some(&dir));
}

/// The last shard to finish reading deletes the parts: nothing is restored twice. Entries are
/// removed through the directory (a link among them goes, its target stays).
fn finish_restore(ctx: &ShardCtx, dir: Option<&Dir>) {
    if ctx.shared.restored.fetch_add(1, Ordering::AcqRel) + 1 == ctx.shards {
        let Some(dir) = dir else { return };
        for name in dir.names().unwrap_or_default() {
            let _ = dir.remove_file(&name);
        }
        let _ = ctx.shared.data_dir.dir.remove_dir(OsStr::new(SNAPSHOT_DIR));
    }
}
