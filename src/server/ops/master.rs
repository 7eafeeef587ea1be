//! The placement master: a dedicated executor that serves no connections. It owns every
//! target's extent allocator (the `Placer`) and answers the shards' placement requests over
//! the channel mesh; every decision is a synchronous call into `placement`.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use glommio::channels::channel_mesh::{Full, MeshBuilder};

use std::collections::HashMap;

use crate::placement::{PlacementError, Placer, TargetId, TargetStatus};
use crate::segment::{mount_all, MountOrigin, MountedTarget, SegmentSpec, TargetSpec};

use crate::server::shard::ctx::{
    send_reply, Calls, MasterSnapshot, Message, ShardReply, ShardRequest, TargetRow, Victim,
};
use crate::server::shard::shared::Shared;

/// Most large values one placement may evict (`--segment-eviction lru`).
const EVICTIONS_PER_PLACEMENT_MAX: usize = 64;

/// The master's state: the placer, and (for LRU eviction) who owns each placed extent.
struct Master {
    placer: Placer,
    lru: bool,
    shared: Arc<Shared>,
    /// Every target ever mounted, by uuid: a remount must keep its identity.
    history: HashMap<u128, TargetSpec>,
    /// (target, extent offset) -> the key of the value there.
    owners: HashMap<(TargetId, u64), Vec<u8>>,
    evictions: u64,
}

/// Memory per node that a new memory segment cannot have: the arena's regions on ordinary
/// pages (those on huge pages come out of the pool, which memory segments never use) and the
/// memory segments in `mounted`. Unbound memory (`--no-numa`) counts on the first node.
pub(crate) fn memory_held<'a>(
    arena: &crate::arena::Arena,
    topology: &crate::topology::Topology,
    mounted: impl Iterator<Item = &'a crate::segment::TargetSpec>,
) -> crate::segment::mount::NodeBytes {
    let first = topology.node_ids().first().copied().unwrap_or(0);
    let mut held = crate::segment::mount::NodeBytes::new();
    for region in arena.regions() {
        if !matches!(region.backing, crate::arena::Backing::HugeTlb { .. }) {
            *held.entry(region.plan.node.unwrap_or(first)).or_insert(0) += region.plan.bytes;
        }
    }
    for spec in mounted.filter(|s| s.kind == crate::segment::TargetKind::Mem) {
        *held.entry(spec.locality.unwrap_or(first)).or_insert(0) += spec.size;
    }
    held
}

/// Mounts a segment at runtime: its targets are placed in `Draining` (no placements) until
/// every shard knows their storage and they are activated. A target mounted before (same
/// uuid) must keep its base, size, kind and host, and a known node; an unknown one may be
/// filled in.
fn mount(
    master: &mut Master,
    spec: &SegmentSpec,
) -> Result<Vec<(TargetId, MountedTarget)>, String> {
    let origin = MountOrigin::Runtime {
        allowed_dirs: master.shared.settings.mount_dirs.clone(),
    };
    let held = memory_held(
        &master.shared.arena,
        &master.shared.topology,
        master.placer.targets().map(|(_, t)| &t.spec),
    );
    let targets = mount_all(
        std::slice::from_ref(spec),
        &master.shared.topology,
        master.placer.local_host(),
        &origin,
        &held,
    )
    .map_err(|e| e.to_string())?;
    for target in &targets {
        let new = &target.spec;
        if let Some(old) = master.history.get(&new.uuid) {
            let same = old.base == new.base
                && old.size == new.size
                && old.kind == new.kind
                && old.host == new.host;
            let node_ok =
                old.locality.is_none() || new.locality.is_none() || old.locality == new.locality;
            if !same || !node_ok {
                return Err(format!(
                    "{} was mounted before as {:?} at base {} size {} node {:?}; a remount cannot change that",
                    new.name, old.kind, old.base, old.size, old.locality
                ));
            }
        }
    }
    let mut mounted = Vec::new();
    for mut target in targets {
        if let Some(old) = master.history.get(&target.spec.uuid) {
            target.spec.locality = target.spec.locality.or(old.locality);
        }
        let id = master
            .placer
            .mount(target.spec.clone())
            .map_err(|e| e.to_string())?;
        master.placer.set_status(id, TargetStatus::Draining);
        master.history.insert(target.spec.uuid, target.spec.clone());
        mounted.push((id, target));
    }
    Ok(mounted)
}

fn serve(master: &mut Master, request: ShardRequest) -> ShardReply {
    let placer = &mut master.placer;
    match request {
        ShardRequest::Place { request: req, key } => {
            let outcome = placer.place(&req);
            if let Ok(placed) = &outcome {
                if master.lru {
                    for (target, extent) in &placed.replicas {
                        master.owners.insert((*target, extent.offset), key.clone());
                    }
                }
            }
            if let Err(PlacementError::NoSpace { .. }) = &outcome {
                if master.lru {
                    if let Some((target, extents)) =
                        placer.eviction_plan(&req, EVICTIONS_PER_PLACEMENT_MAX)
                    {
                        let victims: Vec<Victim> = extents
                            .iter()
                            .filter_map(|e| {
                                let key = master.owners.get(&(target, e.offset))?.clone();
                                tracing::debug!(target: "placement", %target, offset = e.offset, len = e.len, key = %String::from_utf8_lossy(&key), "evict");
                                Some(Victim { key, target, offset: e.offset })
                            })
                            .collect();
                        master.evictions += victims.len() as u64;
                        return ShardReply::EvictFirst(victims);
                    }
                }
            }
            match &outcome {
                Ok(placed) => {
                    let chosen: Vec<String> = placed
                        .replicas
                        .iter()
                        .map(|(t, e)| format!("{t}@{}+{}", e.offset, e.len))
                        .collect();
                    tracing::debug!(target: "placement", size = req.size, targets = %chosen.join(","), "put_allocated");
                }
                Err(err) => {
                    let (free, largest) = placer.free_and_largest_hole();
                    tracing::debug!(target: "placement", size = req.size, free, largest_hole = largest, %err, "alloc_failed");
                }
            }
            ShardReply::Placed(outcome)
        }
        ShardRequest::Mount(spec) => ShardReply::Mounted(mount(master, &spec)),
        ShardRequest::Claim { key, extents } => {
            let mut claimed = Vec::new();
            for (target, extent) in &extents {
                if !master.placer.claim(*target, *extent) {
                    for (t, e) in claimed {
                        master.placer.free(t, e);
                    }
                    return ShardReply::Claimed(false);
                }
                claimed.push((*target, *extent));
            }
            if master.lru {
                for (target, extent) in extents {
                    master.owners.insert((target, extent.offset), key.clone());
                }
            }
            ShardReply::Claimed(true)
        }
        ShardRequest::Activate(ids) => {
            for id in ids {
                master.placer.set_status(id, TargetStatus::Active);
            }
            ShardReply::Done
        }
        ShardRequest::UnmountPrepare(id) => ShardReply::Unmounted(match master.placer.target(id) {
            None => Err(format!("{id} is not mounted")),
            Some(_) => {
                master.placer.set_status(id, TargetStatus::Draining);
                Ok(())
            }
        }),
        ShardRequest::UnmountCheck(id) => ShardReply::Unmounted(match master.placer.target(id) {
            None => Err(format!("{id} is not mounted")),
            Some(t) if t.status != TargetStatus::Draining => Err(format!(
                "{id} is not draining: run 'unmount prepare {}' first",
                id.0
            )),
            Some(_) => Ok(()),
        }),
        ShardRequest::UnmountCommit(id) => ShardReply::Unmounted(match master.placer.unmount(id) {
            None => Err(format!("{id} is not mounted")),
            Some(_) => {
                master.owners.retain(|(t, _), _| *t != id);
                Ok(())
            }
        }),
        ShardRequest::Free(extents) => {
            // Extents of a target unmounted meanwhile (a reader held them) are simply gone.
            let extents: Vec<_> = extents
                .into_iter()
                .filter(|(t, _)| master.placer.target(*t).is_some())
                .collect();
            let placer = &mut master.placer;
            for (target, extent) in extents {
                tracing::debug!(target: "placement", %target, offset = extent.offset, len = extent.len, "remove");
                master.owners.remove(&(target, extent.offset));
                placer.free(target, extent);
            }
            ShardReply::Done
        }
        ShardRequest::Touch { target, offset } => {
            placer.touch(target, offset);
            ShardReply::Done
        }
        ShardRequest::PlacementStats => ShardReply::PlacementStats(Box::new(snapshot(master))),
        ShardRequest::Stats
        | ShardRequest::StatQuery(_)
        | ShardRequest::Adopt(..)
        | ShardRequest::AddStorage(_)
        | ShardRequest::RemoveStorage(_) => {
            unreachable!("shard requests never go to the master")
        }
    }
}

/// The master's figures (STAT `segments` and `placement`, the metrics endpoint).
fn snapshot(master: &Master) -> MasterSnapshot {
    let placer = &master.placer;
    MasterSnapshot {
        stats: placer.stats.clone(),
        segment_evictions: master.evictions,
        policy: placer.policy().name(),
        targets: placer
            .targets()
            .map(|(id, t)| TargetRow {
                id,
                spec: t.spec.clone(),
                capacity: t.alloc.capacity(),
                used: t.alloc.used_bytes(),
                largest_free: t.alloc.largest_free_region(),
                objects: t.objects,
                draining: t.status == TargetStatus::Draining,
            })
            .collect(),
    }
}

/// Runs the placement master, and the metrics endpoint when `metrics` is bound
/// (`--metrics-listen`: it runs here, never on a serving shard).
pub async fn master_main(
    shared: Arc<Shared>,
    mesh: MeshBuilder<Message, Full>,
    placer: Placer,
    metrics: Option<std::net::TcpListener>,
) {
    let (senders, mut receivers) = mesh.join().await.expect("the mesh forms");
    shared.register_master(senders.peer_id());
    let senders = Rc::new(senders);
    // The master's own requests to the shards (the metrics endpoint's): replies come back on
    // the streams below.
    let calls = Rc::new(Calls::default());
    let lru = shared.settings.segment_eviction_lru;
    let history = placer
        .targets()
        .map(|(_, t)| (t.spec.uuid, t.spec.clone()))
        .collect();
    let placer = Rc::new(RefCell::new(Master {
        placer,
        lru,
        shared: Arc::clone(&shared),
        history,
        owners: HashMap::new(),
        evictions: 0,
    }));
    for (_peer, stream) in receivers.streams() {
        let (senders, placer, calls) = (Rc::clone(&senders), Rc::clone(&placer), Rc::clone(&calls));
        glommio::spawn_local(async move {
            while let Some(message) = stream.recv().await {
                match message {
                    Message::Request {
                        from,
                        token,
                        request,
                    } => {
                        let reply = serve(&mut placer.borrow_mut(), request);
                        send_reply(&senders, from, token, reply);
                    }
                    Message::Reply { token, reply } => calls.deliver(token, reply),
                }
            }
        })
        .detach();
    }
    if let Some(listener) = metrics {
        let master = Rc::clone(&placer);
        let source = super::metrics::Source {
            shard_peers: shared.peer_map().shards,
            shared: Arc::clone(&shared),
            mesh: Rc::clone(&senders),
            calls: Rc::clone(&calls),
            master: Box::new(move || snapshot(&master.borrow())),
        };
        super::metrics::spawn(listener, source);
    }
    // Serve until every shard is done, its last frees included (each rings on finishing).
    let shards = shared.settings.cpus.len();
    while shared.finished.load(Ordering::Acquire) < shards {
        if let Err(err) = shared.doorbells[shards].wait().await {
            tracing::error!(%err, "waiting for the shards' doorbell failed; polling instead");
            glommio::timer::sleep(Duration::from_millis(5)).await;
        }
    }
}
