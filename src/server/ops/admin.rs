//! Administrative commands: mounting store targets at runtime, unmounting them in two phases,
//! promotion and head locations. They are served only on the admin socket the operator opens
//! (`--admin-socket PATH`, one command per line, answered `OK ...` or `ERROR ...`), whose file
//! permissions decide who may use it; data connections are refused. Shard 0 serves the
//! socket and drives each command: the placement master decides, every shard learns of
//! storage changes, and partitions are changed under their locks.
//!
//! ```text
//! mount <segment spec>        e.g. mount file:/data/seg7,size=64G,numa=1
//! unmount prepare <target>    no new placements; reads go on
//! unmount commit <target>     its objects leave every index; the target is forgotten
//! promote                     every shard runs a promotion pass now (tests, operators)
//! where <key>                 the key's fixed head: slot, rank, NUMA node (move_pages), score
//! ```

use std::rc::Rc;

use futures_lite::{AsyncReadExt, AsyncWriteExt};

use crate::placement::TargetId;
use crate::segment::SegmentSpec;

use crate::server::shard::ctx::{ShardCtx, ShardReply, ShardRequest};

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
            let partitions = &ctx.shared.partitions;
            for index in 0..partitions.len() {
                let mut store = partitions.lock(index);
                dropped += store.drop_target(id);
                freed.extend(store.take_pending_frees());
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
            for index in 0..ctx.shared.partitions.len() {
                let report = crate::server::shard::ctx::promote(&ctx.shared, index);
                exchanges += report.exchanged.len();
                bytes += report.bytes_moved;
                skipped += report.skipped_pinned;
            }
            Ok(format!(
                "promoted: {exchanges} block exchanges, {bytes} bytes moved, {skipped} blocks skipped for pins"
            ))
        }
        ["where", key] => {
            ctx.shared.partitions.lock_key(key.as_bytes()).1.locate(key.as_bytes(), crate::server::shard::shared::unix_now())
        }
        _ => Err(format!(
            "unknown command '{command}': use 'mount SPEC', 'unmount prepare TARGET', 'unmount commit TARGET', 'promote' or 'where KEY'"
        )),
    }
}

/// Longest admin command line.
const ADMIN_LINE_MAX_BYTES: usize = 4096;
/// The admin socket's file mode: its owner only (the operator widens it on purpose).
pub const ADMIN_SOCKET_MODE: u32 = 0o600;

/// The admin listener bound by `unix_socket::bind`, on the current executor.
pub fn into_glommio(listener: std::os::unix::net::UnixListener) -> glommio::net::UnixListener {
    use std::os::fd::{FromRawFd, IntoRawFd};
    // SAFETY: the descriptor is a bound, listening Unix socket that nothing else owns once
    // `into_raw_fd` gave it up; the glommio listener closes it.
    unsafe { glommio::net::UnixListener::from_raw_fd(listener.into_raw_fd()) }
}

/// Serves the admin socket until the shard stops, one connection at a time per task.
pub async fn serve_socket(ctx: Rc<ShardCtx>, listener: glommio::net::UnixListener) {
    loop {
        let accepted = futures_lite::future::or(async { Some(listener.accept().await) }, async {
            ctx.stop.wait().await;
            None
        })
        .await;
        match accepted {
            None => break,
            Some(Ok(stream)) => {
                glommio::spawn_local(serve_admin_connection(Rc::clone(&ctx), stream)).detach();
            }
            Some(Err(err)) => {
                tracing::warn!(%err, "admin socket: accept failed");
                glommio::timer::sleep(std::time::Duration::from_millis(10)).await;
            }
        }
    }
    // Bound in a private directory and renamed: its own address names that directory.
    if let Some(path) = &ctx.shared.settings.admin_socket {
        let _ = std::fs::remove_file(path);
    }
}

/// One admin connection: a command per line, a reply line each, until EOF or shutdown.
async fn serve_admin_connection(ctx: Rc<ShardCtx>, mut stream: glommio::net::UnixStream) {
    let mut buf = Vec::with_capacity(256);
    let mut chunk = [0u8; 1024];
    loop {
        while let Some(end) = buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = buf.drain(..=end).collect();
            let command = line.trim_ascii();
            if command.is_empty() {
                continue;
            }
            let reply = match run(&ctx, command).await {
                Ok(text) => format!("OK {text}\n"),
                Err(reason) => format!("ERROR {reason}\n"),
            };
            tracing::info!(command = %String::from_utf8_lossy(command), reply = reply.trim_end(), "admin");
            if stream.write_all(reply.as_bytes()).await.is_err() {
                return;
            }
        }
        if buf.len() > ADMIN_LINE_MAX_BYTES {
            let _ = stream
                .write_all(
                    format!("ERROR a command is at most {ADMIN_LINE_MAX_BYTES} bytes\n").as_bytes(),
                )
                .await;
            return;
        }
        let read = futures_lite::future::or(async { Some(stream.read(&mut chunk).await) }, async {
            ctx.stop.wait().await;
            None
        })
        .await;
        match read {
            Some(Ok(n)) if n > 0 => buf.extend_from_slice(&chunk[..n]),
            _ => return,
        }
    }
}
