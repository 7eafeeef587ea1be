//! Unix domain sockets the server listens on (`--admin-socket`, `--unix-socket`): taken
//! exclusively (a live server's socket is refused, a crashed one's removed), bound with their
//! mode whatever the umask, and owned by the `--user` the server drops to.

use std::path::Path;

/// A socket's directory, opened, and the socket's name in it. A directory other users may
/// write without the sticky bit is refused: they could move our names around. `flag` names
/// the option in messages.
fn socket_dir<'p>(
    flag: &str,
    path: &'p Path,
) -> Result<(crate::dir::Dir, &'p std::ffi::OsStr), String> {
    let fail = |why: String| format!("{flag} {}: {why}", path.display());
    let (parent, name) = crate::dir::split(path).map_err(|err| fail(err.to_string()))?;
    let dir = crate::dir::Dir::open(parent, false)
        .map_err(|err| fail(format!("cannot open its directory: {err}")))?;
    let stat = dir.stat().map_err(|err| fail(err.to_string()))?;
    crate::dir::refuse_writable_by_others(
        stat.st_mode,
        true,
        &format!(
            "{flag} {}: its directory {}",
            path.display(),
            parent.display()
        ),
        "use a directory only its owner can write, or one with the sticky bit",
    )?;
    Ok((dir, name))
}

/// Checks that `path` can become a socket before anything is mapped: a stale socket left by a
/// crashed server is removed; a live one (another server) or any other file is refused, never
/// deleted.
pub fn prepare(flag: &str, path: &Path) -> Result<(), String> {
    use std::os::unix::fs::FileTypeExt;
    let fail = |why: String| format!("{flag} {}: {why}", path.display());
    socket_dir(flag, path)?;
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

/// Binds a socket at `path` before the server drops root (`--user`), never reachable with any
/// mode but `mode`, whatever the umask: it is bound inside a private directory (an
/// unpredictable name made `mkdirat` exclusive, mode 0700 set through its descriptor) beside
/// `path`, given `mode` and to `run_as` there, and only then renamed into place (never over
/// anything that appeared meanwhile). Its directory must not
/// be writable by other users unless it has the sticky bit (`/tmp`), so nobody can move the
/// private directory or the socket. The umask is left alone: it is process-wide.
pub fn bind(
    flag: &str,
    path: &Path,
    mode: u32,
    run_as: super::user::RunAs,
) -> Result<std::os::unix::net::UnixListener, String> {
    use nix::fcntl::{renameat2, OFlag, RenameFlags};
    use nix::sys::stat::Mode;
    let fail = |why: String| format!("{flag} {}: {why}", path.display());
    let (dir, name) = socket_dir(flag, path)?;
    let parent = dir.path();
    // An unpredictable name, made exclusively: nobody can take it first to block the start.
    let (private_name, private) = (0..16)
        .find_map(|_| {
            let private_name = format!(".hr-{:016x}", super::shared::random_seed());
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
            crate::dir::mode(mode),
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
