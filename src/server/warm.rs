//! Warm restart: each shard writes the large items on file segments of the partitions it looks
//! after to a snapshot part at a clean shutdown, and at start-up restores, from every part, the
//! objects of the partitions it looks after now (by key: any `--threads`, any partition count)
//! whose segment is mounted with the same identity, whose extents are free and whose data still
//! checks. The parts are deleted once every shard has read them, so a later crash never
//! resurrects anything. See `src/snapshot.rs` for the format.

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
            let dir = data_dir
                .sub_dir(OsStr::new(SNAPSHOT_DIR), true)?
                .ok_or_else(|| {
                    std::io::Error::other(format!(
                        "{} could not be created",
                        data_dir.path().join(SNAPSHOT_DIR).display()
                    ))
                })?;
            // A leftover of ours (or anything planted) is removed, never written through.
            dir.remove_file(&tmp)?;
            let (mut out, created) = dir.open_regular_file(&tmp, true)?;
            if !created {
                return Err(std::io::Error::other(format!(
                    "{} appeared while it was being written",
                    dir.path().join(&tmp).display()
                )));
            }
            std::io::Write::write_all(&mut out, &bytes)?;
            out.sync_all()?;
            dir.rename(&tmp, &name)?;
            dir.sync()
        })
        .await;
    match written {
        Ok(()) => tracing::info!(shard = ctx.id, objects, path = %shown, "snapshot written"),
        Err(err) => {
            tracing::error!(shard = ctx.id, %err, path = %shown, "snapshot not written: these objects will not survive the restart")
        }
    }
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
    let rows = target_rows(ctx).await;
    let by_uuid: HashMap<u128, &TargetRow> = rows.iter().map(|r| (r.spec.uuid, r)).collect();
    let (mut restored, mut skipped) = (0u64, 0u64);
    let now = unix_now();
    let head_bytes = ctx.shared.settings.arena.ram_head_bytes as usize;
    let mut parts: Vec<OsString> = names
        .into_iter()
        .filter(|n| Path::new(n).extension().is_some_and(|x| x == "bin"))
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
