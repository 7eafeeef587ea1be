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

use std::path::Path;
use std::rc::Rc;

use futures_lite::{AsyncReadExt, AsyncWriteExt};

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
                let report = super::shard::promote(&ctx.shared, index);
                exchanges += report.exchanged.len();
                bytes += report.bytes_moved;
                skipped += report.skipped_pinned;
            }
            Ok(format!(
                "promoted: {exchanges} block exchanges, {bytes} bytes moved, {skipped} blocks skipped for pins"
            ))
        }
        ["where", key] => {
            ctx.shared.partitions.lock_key(key.as_bytes()).1.locate(key.as_bytes(), super::unix_now())
        }
        _ => Err(format!(
            "unknown command '{command}': use 'mount SPEC', 'unmount prepare TARGET', 'unmount commit TARGET', 'promote' or 'where KEY'"
        )),
    }
}

/// Longest admin command line.
const ADMIN_LINE_MAX_BYTES: usize = 4096;
/// The admin socket's file mode: its owner only (the operator widens it on purpose).
const ADMIN_SOCKET_MODE: u32 = 0o600;

/// The admin socket's directory, opened, and the socket's name in it. A directory other users
/// may write without the sticky bit is refused: they could move our names around.
fn socket_dir(path: &Path) -> Result<(crate::dir::Dir, &std::ffi::OsStr), String> {
    let fail = |why: String| format!("--admin-socket {}: {why}", path.display());
    let (parent, name) = crate::dir::split(path).map_err(|err| fail(err.to_string()))?;
    let dir = crate::dir::Dir::open(parent, false)
        .map_err(|err| fail(format!("cannot open its directory: {err}")))?;
    let stat = dir.stat().map_err(|err| fail(err.to_string()))?;
    crate::dir::refuse_writable_by_others(
        stat.st_mode,
        true,
        &format!(
            "--admin-socket {}: its directory {}",
            path.display(),
            parent.display()
        ),
        "use a directory only its owner can write, or one with the sticky bit",
    )?;
    Ok((dir, name))
}

/// Checks that `path` can become the admin socket before anything is mapped: a stale socket
/// left by a crashed server is removed; a live one (another server) or any other file is
/// refused, never deleted.
pub fn prepare_socket(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::FileTypeExt;
    let fail = |why: String| format!("--admin-socket {}: {why}", path.display());
    socket_dir(path)?;
    match std::fs::symlink_metadata(path) {
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
        Err(err) => return Err(fail(err.to_string())),
        Ok(meta) if !meta.file_type().is_socket() => {
            return Err(fail(
                "exists and is not a socket; it is left alone".to_string(),
            ))
        }
        Ok(_) => match std::os::unix::net::UnixStream::connect(path) {
            Ok(stream) if listener_alive(&stream) => {
                return Err(fail("another server is serving it".to_string()))
            }
            // Refused, or accepted by the socket of a server that just died (the kernel tears
            // its io_uring rings down, and the listener their accept holds, a few
            // milliseconds after the process is gone): stale.
            _ => std::fs::remove_file(path)
                .map_err(|err| fail(format!("a stale socket that cannot be removed: {err}")))?,
        },
    }
    Ok(())
}

/// Whether the process that listens on the socket `stream` reached is alive (SO_PEERCRED
/// names it). When it cannot be told, it is taken for alive: never delete a live socket.
fn listener_alive(stream: &std::os::unix::net::UnixStream) -> bool {
    match crate::sys::peer_pid(stream) {
        Some(pid) => std::path::Path::new(&format!("/proc/{pid}")).exists(),
        None => true,
    }
}

/// Binds the admin socket, before the server drops root (`--user`), readable and writable
/// by its owner only and never reachable with any other mode, whatever the umask: it is bound
/// inside a private directory (an unpredictable name made `mkdirat` exclusive, mode 0700 set
/// through its descriptor) beside `path`, given mode 0600 and to `run_as` there, and only then
/// renamed into place (never over anything that appeared meanwhile). Its directory must not
/// be writable by other users unless it has the sticky bit (`/tmp`), so nobody can move the
/// private directory or the socket. The umask is left alone: it is process-wide.
pub fn bind_socket(
    path: &Path,
    run_as: super::user::RunAs,
) -> Result<std::os::unix::net::UnixListener, String> {
    use nix::fcntl::{renameat2, OFlag, RenameFlags};
    use nix::sys::stat::Mode;
    let fail = |why: String| format!("--admin-socket {}: {why}", path.display());
    let (dir, name) = socket_dir(path)?;
    let parent = dir.path();
    // An unpredictable name, made exclusively: nobody can take it first to block the start.
    let (private_name, private) = (0..16)
        .find_map(|_| {
            let private_name = format!(".hr-{:016x}", super::random_seed());
            match nix::sys::stat::mkdirat(dir.fd(), private_name.as_str(), Mode::S_IRWXU) {
                Ok(()) => Some(Ok(private_name)),
                Err(nix::errno::Errno::EEXIST) => None,
                Err(errno) => Some(Err(errno)),
            }
        })
        .unwrap_or(Err(nix::errno::Errno::EEXIST))
        .and_then(|private_name| {
            let fd = nix::fcntl::openat(
                dir.fd(),
                private_name.as_str(),
                OFlag::O_DIRECTORY | OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                Mode::empty(),
            )?;
            nix::sys::stat::fchmod(&fd, Mode::S_IRWXU)?;
            Ok((private_name, fd))
        })
        .map_err(|errno| {
            fail(format!(
                "cannot make a private directory beside it: {errno}"
            ))
        })?;
    let bound = (|| {
        // Short, so the socket's path inside it stays within the kernel's 108 bytes.
        let inner = parent.join(&private_name).join(name);
        let listener = std::os::unix::net::UnixListener::bind(&inner)?;
        // A socket's mode and owner are its file's: set relative to the private directory,
        // which only we can enter, so the name cannot be another file by now.
        nix::sys::stat::fchmodat(
            &private,
            name,
            crate::dir::mode(ADMIN_SOCKET_MODE),
            nix::sys::stat::FchmodatFlags::FollowSymlink,
        )?;
        nix::unistd::fchownat(
            &private,
            name,
            Some(run_as.uid),
            Some(run_as.gid),
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        )?;
        renameat2(
            &private,
            name,
            dir.fd(),
            name,
            RenameFlags::RENAME_NOREPLACE,
        )?;
        Ok::<_, std::io::Error>(listener)
    })();
    let _ = nix::unistd::unlinkat(&private, name, nix::unistd::UnlinkatFlags::NoRemoveDir);
    let _ = nix::unistd::unlinkat(
        dir.fd(),
        private_name.as_str(),
        nix::unistd::UnlinkatFlags::RemoveDir,
    );
    bound.map_err(|err| fail(err.to_string()))
}

/// The admin listener bound by [`bind_socket`], on the current executor.
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
