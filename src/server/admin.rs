//! Administrative commands (the ADMIN extension): mounting store targets at runtime, and
//! unmounting them in two phases. The connection that receives the command drives it: the
//! placement master decides, every shard learns of the change.
//!
//! ```text
//! mount <segment spec>        e.g. mount file:/data/seg7,size=64G,numa=1
//! unmount prepare <target>    no new placements; reads go on
//! unmount commit <target>     its objects leave every index; the target is forgotten
//! promote                     every shard runs a promotion pass now (tests, operators)
//! where <key>                 the key's fixed head: slot, rank, NUMA node (move_pages), score
//! ```

use std::rc::Rc;

use crate::placement::TargetId;
use crate::segment::SegmentSpec;

use super::shard::{ShardCtx, ShardReply, ShardRequest};

/// Every shard, this one included, runs `request` (made per shard); returns the replies.
async fn broadcast(ctx: &Rc<ShardCtx>, make: impl Fn() -> ShardRequest) -> Vec<ShardReply> {
    let mut replies = Vec::with_capacity(ctx.shards);
    for shard in 0..ctx.shards {
        replies.push(if shard == ctx.id {
            ctx.serve_local(make())
        } else {
            ctx.call(shard, make()).await
        });
    }
    replies
}

fn target_id(text: &str) -> Result<TargetId, String> {
    text.trim_start_matches('t')
        .parse()
        .map(TargetId)
        .map_err(|_| format!("'{text}' is not a target id (see STAT segments)"))
}

/// Runs one command; `Ok` is the text to answer, `Err` the reason to refuse.
pub async fn run(ctx: &Rc<ShardCtx>, command: &[u8]) -> Result<String, String> {
    let command =
        std::str::from_utf8(command).map_err(|_| "the command is not UTF-8".to_string())?;
    let words: Vec<&str> = command.split_whitespace().collect();
    match words.as_slice() {
        ["mount", spec] => {
            let spec: SegmentSpec = spec.parse()?;
            let ShardReply::Mounted(mounted) = ctx.call_master(ShardRequest::Mount(spec)).await else {
                unreachable!("the master answers a mount with its outcome");
            };
            let mounted = mounted?;
            // Every shard learns the new storage before the master may place on it.
            let added: Vec<_> = mounted.iter().map(|(id, t)| (*id, t.storage.clone())).collect();
            broadcast(ctx, || ShardRequest::AddStorage(added.clone())).await;
            let ids: Vec<TargetId> = mounted.iter().map(|(id, _)| *id).collect();
            ctx.call_master(ShardRequest::Activate(ids.clone())).await;
            let names: Vec<String> = ids.iter().map(ToString::to_string).collect();
            tracing::info!(targets = %names.join(" "), "segment mounted at runtime");
            Ok(format!("mounted {}", names.join(" ")))
        }
        ["unmount", "prepare", id] => {
            let id = target_id(id)?;
            let ShardReply::Unmounted(outcome) = ctx.call_master(ShardRequest::UnmountPrepare(id)).await else {
                unreachable!("the master answers an unmount with its outcome");
            };
            outcome?;
            tracing::info!(target = %id, "unmount prepared: no new placements");
            Ok(format!("draining {id}"))
        }
        ["unmount", "commit", id] => {
            let id = target_id(id)?;
            let ShardReply::Unmounted(ready) = ctx.call_master(ShardRequest::UnmountCheck(id)).await else {
                unreachable!("the master answers an unmount with its outcome");
            };
            ready?;
            // Its objects leave every index; extents they held elsewhere go back.
            let mut freed = Vec::new();
            let mut dropped = 0u64;
            for reply in broadcast(ctx, || ShardRequest::DropTarget(id)).await {
                if let ShardReply::Dropped { items, extents } = reply {
                    dropped += items;
                    freed.extend(extents);
                }
            }
            ctx.call_master(ShardRequest::Free(freed)).await;
            let ShardReply::Unmounted(outcome) = ctx.call_master(ShardRequest::UnmountCommit(id)).await else {
                unreachable!("the master answers an unmount with its outcome");
            };
            outcome?;
            broadcast(ctx, || ShardRequest::RemoveStorage(id)).await;
            tracing::info!(target = %id, objects = dropped, "segment unmounted");
            Ok(format!("unmounted {id}, {dropped} objects dropped"))
        }
        ["promote"] => {
            let (mut exchanges, mut bytes, mut skipped) = (0, 0, 0);
            for reply in broadcast(ctx, || ShardRequest::Promote).await {
                if let ShardReply::Promoted {
                    exchanges: e,
                    bytes_moved: b,
                    skipped_pinned: s,
                } = reply
                {
                    exchanges += e;
                    bytes += b;
                    skipped += s;
                }
            }
            Ok(format!(
                "promoted: {exchanges} block exchanges, {bytes} bytes moved, {skipped} blocks skipped for pins"
            ))
        }
        ["where", key] => {
            let key = key.as_bytes().to_vec();
            let hash = ctx.store.borrow().hash(&key);
            let owner = crate::store::KeyHasher::shard_of(hash, ctx.shards);
            let reply = if owner == ctx.id {
                ctx.serve_local(ShardRequest::Where(key))
            } else {
                ctx.call(owner, ShardRequest::Where(key)).await
            };
            match reply {
                ShardReply::Located(located) => located,
                _ => unreachable!("a shard answers where with a location"),
            }
        }
        _ => Err(format!(
            "unknown command '{command}': use 'mount SPEC', 'unmount prepare TARGET', 'unmount commit TARGET', 'promote' or 'where KEY'"
        )),
    }
}
