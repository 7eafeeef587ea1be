//! The data directory: opened once (`O_DIRECTORY|O_NOFOLLOW`), checked, and locked for the
//! life of the process. It must belong to the user the server runs as, with no group or world
//! write bit, so only that user (and root) can put a name in it; every file Headroom keeps
//! there is then reached through [`crate::dir::Dir`], never through a link.

use std::ffi::OsStr;
use std::io;
use std::path::Path;
use std::sync::Arc;

use nix::errno::Errno;
use nix::unistd::Uid;

use crate::dir::{mode, Dir, DIR_MODE};

use super::user::RunAs;

/// The lock file's name in the data directory.
pub const LOCK_FILE: &str = "headroom.lock";

/// The data directory, opened, checked and locked for the life of the process.
#[derive(Debug)]
pub struct DataDir {
    pub dir: Arc<Dir>,
    /// The lock: held for as long as this value lives.
    _lock: Arc<crate::lockfile::FileLock>,
}

impl DataDir {
    /// Takes the data directory at `path` for a server that will run as `run_as`: creates it
    /// (mode 0700) when missing, refuses it when it is a link, group- or world-writable, or
    /// owned by another user (root's own is accepted when root starts the server, and handed
    /// to `run_as` with the files Headroom names in it), then locks it with `headroom.lock`,
    /// which holds our pid. Every refusal is one sentence naming the path.
    pub fn take(path: &Path, run_as: RunAs) -> Result<DataDir, String> {
        let fail = |why: String| format!("--data-dir {}: {why}", path.display());
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            crate::dir::create_parents(parent)
                .map_err(|err| fail(format!("cannot create its parent: {err}")))?;
        }
        let created = match nix::unistd::mkdir(path, mode(DIR_MODE)) {
            Ok(()) => true,
            Err(Errno::EEXIST) => false,
            Err(errno) => return Err(fail(format!("cannot create it: {errno}"))),
        };
        let dir = Dir::open(path, true).map_err(|err| match err.raw_os_error() {
            Some(libc::ELOOP) | Some(libc::ENOTDIR) => fail(
                "is not a directory (a symbolic link or a file); the data directory must be a real directory".to_string(),
            ),
            _ => fail(format!("cannot open it: {err}")),
        })?;
        if created {
            nix::sys::stat::fchmod(dir.fd(), mode(DIR_MODE))
                .map_err(|err| fail(format!("cannot set its mode: {err}")))?;
        }
        let stat = dir.stat().map_err(|err| fail(err.to_string()))?;
        crate::dir::refuse_writable_by_others(
            stat.st_mode,
            false,
            &format!("--data-dir {}", path.display()),
            &format!("chmod 700 {}", path.display()),
        )?;
        let me = Uid::effective();
        let owner = Uid::from_raw(stat.st_uid);
        let handed_over = owner != run_as.uid && owner == me && me.is_root();
        if owner != run_as.uid && !handed_over {
            return Err(format!(
                "--data-dir {} is owned by uid {owner}, not by uid {} that the server runs as: only its owner may keep files there; chown {} {}",
                path.display(),
                run_as.uid,
                run_as.uid,
                path.display()
            ));
        }
        let lock = lock(&dir).map_err(fail)?;
        Ok(DataDir {
            dir: Arc::new(dir),
            _lock: lock,
        })
    }

    /// Hands the directory, the regular files in it (the lock file, segment files, earlier
    /// runtime mounts) and the snapshot directory with its parts to `run_as`, before the
    /// server drops root. Links and devices in it are left as they are.
    pub fn hand_to(&self, run_as: RunAs) -> io::Result<()> {
        self.dir.hand_entries_to(run_as.uid, run_as.gid)?;
        if let Some(snapshot) = self.dir.sub_dir(OsStr::new(SNAPSHOT_DIR), false)? {
            snapshot.hand_entries_to(run_as.uid, run_as.gid)?;
        }
        Ok(())
    }
}

/// The warm-restart snapshot's directory inside the data directory.
pub const SNAPSHOT_DIR: &str = "snapshot";

/// Locks `dir` with its `headroom.lock`, writing our pid into it.
fn lock(dir: &Dir) -> Result<Arc<crate::lockfile::FileLock>, String> {
    use std::io::{Read, Seek, Write};
    let path = dir.path().join(LOCK_FILE);
    let (file, _) = dir
        .open_regular_file(OsStr::new(LOCK_FILE), true)
        .map_err(|err| format!("cannot open the lock file: {err}"))?;
    let lock = crate::lockfile::lock_exclusive(file).map_err(|err| match err {
        crate::lockfile::LockError::Held { pid } => {
            // The holder wrote its pid into the file; /proc/locks is the fallback.
            let written = dir
                .open_regular_file(OsStr::new(LOCK_FILE), false)
                .ok()
                .and_then(|(mut file, _)| {
                    let mut text = String::new();
                    file.read_to_string(&mut text).ok()?;
                    text.trim().parse::<u32>().ok()
                });
            match written.or(pid) {
                Some(pid) => format!(
                    "in use by another Headroom ({}, pid {pid}); two servers on one data directory would hand out the same extents",
                    crate::server::shard::listen::process_name(pid)
                ),
                None => "in use by another process".to_string(),
            }
        }
        crate::lockfile::LockError::Io(err) => format!("cannot lock {}: {err}", path.display()),
    })?;
    let mut file = lock.file();
    file.set_len(0)
        .and_then(|()| file.seek(std::io::SeekFrom::Start(0)))
        .and_then(|_| writeln!(file, "{}", std::process::id()))
        .map_err(|err| format!("cannot write {}: {err}", path.display()))?;
    Ok(lock)
}
