//! The placement master: a dedicated executor that serves no connections. It owns every
//! target's extent allocator (the `Placer`) and answers the shards' placement requests over
//! the channel mesh; every decision is a synchronous call into `placement`.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use glommio::channels::channel_mesh::{Full, MeshBuilder};

use crate::placement::{Placer, TargetStatus};

use super::shard::{send_reply, MasterSnapshot, Message, ShardReply, ShardRequest, TargetRow};
use super::Shared;

fn serve(placer: &mut Placer, request: ShardRequest) -> ShardReply {
    match request {
        ShardRequest::Place(req) => {
            let outcome = placer.place(&req);
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
                    let free: u64 = placer.targets().map(|(_, t)| t.alloc.free_bytes()).sum();
                    let largest = placer
                        .targets()
                        .map(|(_, t)| t.alloc.largest_free_region())
                        .max()
                        .unwrap_or(0);
                    tracing::debug!(target: "placement", size = req.size, free, largest_hole = largest, %err, "alloc_failed");
                }
            }
            ShardReply::Placed(outcome)
        }
        ShardRequest::Free(extents) => {
            for (target, extent) in extents {
                tracing::debug!(target: "placement", %target, offset = extent.offset, len = extent.len, "remove");
                placer.free(target, extent);
            }
            ShardReply::Done
        }
        ShardRequest::PlacementStats => ShardReply::PlacementStats(Box::new(MasterSnapshot {
            stats: placer.stats.clone(),
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
        })),
        ShardRequest::Batch { .. }
        | ShardRequest::Flush { .. }
        | ShardRequest::Stats
        | ShardRequest::LinkLarge { .. }
        | ShardRequest::CheckLarge { .. }
        | ShardRequest::Release { .. } => unreachable!("shard requests never go to the master"),
    }
}

pub async fn master_main(shared: Arc<Shared>, mesh: MeshBuilder<Message, Full>, placer: Placer) {
    let (senders, mut receivers) = mesh.join().await.expect("the mesh forms");
    shared.register_master(senders.peer_id());
    let senders = Rc::new(senders);
    let placer = Rc::new(RefCell::new(placer));
    for (_peer, stream) in receivers.streams() {
        let (senders, placer) = (Rc::clone(&senders), Rc::clone(&placer));
        glommio::spawn_local(async move {
            while let Some(message) = stream.recv().await {
                if let Message::Request {
                    from,
                    token,
                    request,
                } = message
                {
                    let reply = serve(&mut placer.borrow_mut(), request);
                    send_reply(&senders, from, token, reply);
                }
            }
        })
        .detach();
    }
    // Serve until every shard is done, its last frees included.
    while shared.finished.load(Ordering::Acquire) < shared.settings.cpus.len() {
        glommio::timer::sleep(Duration::from_millis(5)).await;
    }
}
