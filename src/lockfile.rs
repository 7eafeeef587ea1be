//! Exclusive ownership of files for the life of the process: the data directory's lock file and
//! every file or device segment. A second process that wants them is refused with the holder's
//! pid; inside one process a file is locked once and shared (an unmounted segment mounted
//! again reuses the lock it still holds).
//!
//! The locks are `flock`s: they belong to the open file, so closing some other descriptor of
//! the same file (as POSIX record locks would) never drops them, and the kernel releases them
//! when the process dies, however it dies.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::sync::{Arc, Mutex, Weak};

use nix::fcntl::{Flock, FlockArg};

/// A file this process holds an exclusive lock on (released when the last clone is dropped).
#[derive(Debug)]
pub struct FileLock {
    file: Flock<File>,
    /// (device, inode): the identity the process-wide table knows it by.
    id: (u64, u64),
}

impl FileLock {
    pub fn file(&self) -> &File {
        &self.file
    }
}

/// Why a lock was not taken.
#[derive(Debug)]
pub enum LockError {
    /// Another process holds it; its pid when `/proc/locks` tells.
    Held {
        pid: Option<u32>,
    },
    Io(io::Error),
}

impl std::fmt::Display for LockError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LockError::Held { pid: Some(pid) } => {
                write!(f, "in use by another process (pid {pid})")
            }
            LockError::Held { pid: None } => write!(f, "in use by another process"),
            LockError::Io(err) => write!(f, "cannot lock it: {err}"),
        }
    }
}

/// Files this process holds, by (device, inode).
type Held = Mutex<HashMap<(u64, u64), Weak<FileLock>>>;

/// Every file this process holds.
fn held() -> &'static Held {
    static HELD: std::sync::OnceLock<Held> = std::sync::OnceLock::new();
    HELD.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Locks `file` exclusively for this process, without waiting. A file this process already
/// holds (through another descriptor) gives back the existing lock.
pub fn lock_exclusive(file: File) -> Result<Arc<FileLock>, LockError> {
    let meta = file.metadata().map_err(LockError::Io)?;
    let id = (meta.dev(), meta.ino());
    let mut table = held().lock().unwrap_or_else(|e| e.into_inner());
    table.retain(|_, lock| lock.strong_count() > 0);
    if let Some(lock) = table.get(&id).and_then(Weak::upgrade) {
        return Ok(lock);
    }
    match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(file) => {
            let lock = Arc::new(FileLock { file, id });
            table.insert(id, Arc::downgrade(&lock));
            Ok(lock)
        }
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => Err(LockError::Held {
            pid: flock_holder(id),
        }),
        Err((_, errno)) => Err(LockError::Io(io::Error::from(errno))),
    }
}

impl Drop for FileLock {
    fn drop(&mut self) {
        let mut table = held().lock().unwrap_or_else(|e| e.into_inner());
        if table.get(&self.id).is_some_and(|w| w.strong_count() == 0) {
            table.remove(&self.id);
        }
    }
}

/// The pid holding a flock on (device, inode), from `/proc/locks`.
fn flock_holder((dev, ino): (u64, u64)) -> Option<u32> {
    let text = std::fs::read_to_string("/proc/locks").ok()?;
    let me = std::process::id();
    parse_proc_locks(&text)
        .into_iter()
        .find(|l| l.kind == "FLOCK" && l.dev == dev && l.ino == ino && l.pid != me)
        .map(|l| l.pid)
}

/// One row of `/proc/locks`.
#[derive(Debug, PartialEq, Eq)]
pub struct ProcLock {
    pub kind: String,
    pub pid: u32,
    pub dev: u64,
    pub ino: u64,
}

/// Parses `/proc/locks`: `1: FLOCK  ADVISORY  WRITE 1234 fd:01:5678 0 EOF` (device as
/// major:minor in hex; blocked waiters, marked `->`, are skipped).
pub fn parse_proc_locks(text: &str) -> Vec<ProcLock> {
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.get(1) == Some(&"->") || fields.len() < 6 {
                return None;
            }
            let pid = fields[4].parse().ok()?;
            let mut parts = fields[5].split(':');
            let major = u32::from_str_radix(parts.next()?, 16).ok()?;
            let minor = u32::from_str_radix(parts.next()?, 16).ok()?;
            let ino = parts.next()?.parse().ok()?;
            Some(ProcLock {
                kind: fields[1].to_string(),
                pid,
                dev: libc::makedev(major, minor),
                ino,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_locks_rows() {
        let text = "1: FLOCK  ADVISORY  WRITE 4242 fd:01:1234567 0 EOF\n\
                    1: -> FLOCK  ADVISORY  WRITE 4343 fd:01:1234567 0 EOF\n\
                    2: POSIX  ADVISORY  WRITE 77 00:1f:99 0 EOF\n";
        let rows = parse_proc_locks(text);
        assert_eq!(
            rows,
            vec![
                ProcLock {
                    kind: "FLOCK".into(),
                    pid: 4242,
                    dev: libc::makedev(0xfd, 1),
                    ino: 1234567
                },
                ProcLock {
                    kind: "POSIX".into(),
                    pid: 77,
                    dev: libc::makedev(0, 0x1f),
                    ino: 99
                },
            ]
        );
    }

    #[test]
    fn one_lock_per_file_per_process() {
        let path = std::env::temp_dir().join(format!("headroom-lockfile-{}", std::process::id()));
        let open = || {
            std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .read(true)
                .write(true)
                .open(&path)
                .unwrap()
        };
        let first = lock_exclusive(open()).unwrap();
        let again = lock_exclusive(open()).unwrap();
        assert!(
            Arc::ptr_eq(&first, &again),
            "the process shares its own lock"
        );
        drop((first, again));
        // Released: a fresh lock is taken (and would conflict with another process).
        let fresh = lock_exclusive(open()).unwrap();
        drop(fresh);
        std::fs::remove_file(&path).unwrap();
    }
}
