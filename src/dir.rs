//! Directories opened once, and the files Headroom names itself in them (in the data directory
//! and the `--mount-dir`s), reached so that nothing anyone else planted there is followed or
//! written through.
//!
//! A [`Dir`] is a descriptor (`O_DIRECTORY`); every file in it is reached relative to that
//! descriptor with `O_NOFOLLOW`, a new one is created `O_CREAT|O_EXCL` (which never follows a
//! link either), and modes are set explicitly (directories 0700, files 0600) whatever the
//! umask. Renames and removals are `renameat`/`unlinkat` relative to the same descriptor.

use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::Mode;
use nix::unistd::{Gid, Uid};

/// Directories Headroom creates: their owner only.
pub const DIR_MODE: u32 = 0o700;
/// Files Headroom creates: their owner only.
pub const FILE_MODE: u32 = 0o600;
/// Missing parents of a path the operator named: traversable (a user the server drops to must
/// reach its data directory through them), never writable by others, whatever the umask.
pub const PARENT_MODE: u32 = 0o755;

/// Creates `path` and its missing parents with [`PARENT_MODE`], each set through its own
/// descriptor after the `mkdir` (the umask may have taken bits away: under root's 077 a
/// parent would be 0700 and the user the server drops to could not reach the data directory).
/// Directories that already exist are left as they are.
pub fn create_parents(path: &Path) -> io::Result<()> {
    let mut prefix = PathBuf::new();
    for part in path.components() {
        prefix.push(part);
        match nix::unistd::mkdir(&prefix, mode(PARENT_MODE)) {
            Ok(()) => {
                let fd = nix::fcntl::open(
                    &prefix,
                    OFlag::O_DIRECTORY | OFlag::O_RDONLY | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW,
                    Mode::empty(),
                )
                .map_err(io_err)?;
                nix::sys::stat::fchmod(&fd, mode(PARENT_MODE)).map_err(io_err)?;
            }
            Err(Errno::EEXIST) => {}
            Err(errno) => {
                return Err(io::Error::new(
                    io_err(errno).kind(),
                    format!("{}: {errno}", prefix.display()),
                ))
            }
        }
    }
    Ok(())
}

/// Permission bits as nix's [`Mode`] (bits it does not know are dropped).
pub fn mode(bits: u32) -> Mode {
    Mode::from_bits_truncate(bits as libc::mode_t)
}

fn io_err(errno: Errno) -> io::Error {
    io::Error::from(errno)
}

/// Refuses a directory others may write into: group- or world-writable, without the sticky
/// bit when `sticky_ok` (where the sticky bit stops them removing or renaming our names).
/// `what` names the flag and path in the one sentence returned.
pub fn refuse_writable_by_others(
    stat_mode: u32,
    sticky_ok: bool,
    what: &str,
    fix: &str,
) -> Result<(), String> {
    let perm = stat_mode & 0o7777;
    let sticky = sticky_ok && perm & 0o1000 != 0;
    if perm & 0o022 != 0 && !sticky {
        return Err(format!(
            "{what} is mode {perm:04o} (group- or world-writable): another user could plant links or files in it; {fix}"
        ));
    }
    Ok(())
}

/// Splits `path` into its directory (`.` for a bare name) and its last component.
pub fn split(path: &Path) -> io::Result<(&Path, &OsStr)> {
    let name = path.file_name().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} names no file", path.display()),
        )
    })?;
    let parent = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    Ok((parent, name))
}

/// Opens `name` relative to `at` read-write (following a final link only with `follow`); with
/// `create`, makes it `O_CREAT|O_EXCL` (mode 0600, set again through the descriptor, whatever
/// the umask) when missing. Returns the file and whether it was created. Only a regular file
/// with one link, or a block device, is kept: a hard link (another name for a file someone
/// else chose) and anything else (a FIFO would hang the first read) are refused.
fn open_at<Fd: AsFd>(
    at: Fd,
    name: &Path,
    follow: bool,
    create: bool,
    shown: &Path,
) -> io::Result<(File, bool)> {
    open_at_as(at, name, follow, create, shown, OFlag::O_RDWR)
}

/// [`open_at`] with the access mode `access` (`O_RDWR`, or `O_RDONLY` for a file only read).
fn open_at_as<Fd: AsFd>(
    at: Fd,
    name: &Path,
    follow: bool,
    create: bool,
    shown: &Path,
    access: OFlag,
) -> io::Result<(File, bool)> {
    let mut base = access | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK;
    if !follow {
        base |= OFlag::O_NOFOLLOW;
    }
    let open = |flags: OFlag| nix::fcntl::openat(at.as_fd(), name, flags, mode(FILE_MODE));
    let opened = if create {
        match open(base | OFlag::O_CREAT | OFlag::O_EXCL) {
            Ok(fd) => {
                // The umask may have taken bits away; the mode is ours to say.
                nix::sys::stat::fchmod(&fd, mode(FILE_MODE)).map_err(io_err)?;
                Ok((fd, true))
            }
            Err(Errno::EEXIST) => open(base).map(|fd| (fd, false)),
            Err(errno) => Err(errno),
        }
    } else {
        open(base).map(|fd| (fd, false))
    };
    let (fd, created) = opened.map_err(|errno| match errno {
        Errno::ELOOP if !follow => refuse_link(&shown.display().to_string()),
        errno => io::Error::new(
            io_err(errno).kind(),
            format!("{}: {errno}", shown.display()),
        ),
    })?;
    check_kind(&fd, shown, true)?;
    // Back to blocking I/O (O_NONBLOCK only kept a FIFO from holding the open).
    nix::fcntl::fcntl(&fd, nix::fcntl::FcntlArg::F_SETFL(OFlag::empty())).map_err(io_err)?;
    Ok((File::from(fd), created))
}

/// Fails unless the open `fd` is a regular file with exactly one link (or, with
/// `block_device_ok`, a block device): one sentence naming `shown`.
fn check_kind(fd: &OwnedFd, shown: &Path, block_device_ok: bool) -> io::Result<()> {
    let stat = nix::sys::stat::fstat(fd).map_err(io_err)?;
    let kind = stat.st_mode & libc::S_IFMT;
    if kind == libc::S_IFBLK && block_device_ok {
        return Ok(());
    }
    if kind != libc::S_IFREG {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{} is not a regular file{}; it is left alone",
                shown.display(),
                if block_device_ok {
                    " or a block device"
                } else {
                    ""
                }
            ),
        ));
    }
    if stat.st_nlink > 1 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{} has {} hard links (another name for a file someone else may have chosen); Headroom writes only a file with one name, and left it alone",
                shown.display(),
                stat.st_nlink
            ),
        ));
    }
    Ok(())
}

/// Opens the file at `path` as the operator wrote it (links followed), read-write, creating it
/// as [`Dir::open_file`] does; the same kinds are refused.
pub fn open_path(path: &Path, create: bool) -> io::Result<(File, bool)> {
    open_at(nix::fcntl::AT_FDCWD, path, true, create, path)
}

/// A directory opened once; names inside it are resolved against the descriptor.
#[derive(Debug)]
pub struct Dir {
    path: PathBuf,
    fd: OwnedFd,
}

/// Whether `name` is one plain name (no `/`, not `.` or `..`): the only kind a [`Dir`] opens.
fn plain_name(name: &OsStr) -> io::Result<&OsStr> {
    let bytes = name.as_bytes();
    if bytes.is_empty() || bytes.contains(&b'/') || name == "." || name == ".." {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("'{}' is not a plain file name", name.to_string_lossy()),
        ));
    }
    Ok(name)
}

impl Dir {
    /// Opens the directory at `path`. The path's earlier components are the operator's and are
    /// resolved as written; with `no_follow`, its last component must not be a link.
    pub fn open(path: &Path, no_follow: bool) -> io::Result<Dir> {
        let mut flags = OFlag::O_DIRECTORY | OFlag::O_RDONLY | OFlag::O_CLOEXEC;
        if no_follow {
            flags |= OFlag::O_NOFOLLOW;
        }
        let fd = nix::fcntl::open(path, flags, Mode::empty()).map_err(io_err)?;
        Ok(Dir {
            path: path.to_path_buf(),
            fd,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What the kernel says the directory is now (resolved, absolute), from its descriptor.
    pub fn resolved_path(&self) -> io::Result<PathBuf> {
        std::fs::read_link(format!("/proc/self/fd/{}", self.fd.as_raw_fd()))
    }

    /// The descriptor.
    pub fn fd(&self) -> &OwnedFd {
        &self.fd
    }

    pub fn stat(&self) -> io::Result<nix::sys::stat::FileStat> {
        nix::sys::stat::fstat(&self.fd).map_err(io_err)
    }

    /// [`Dir::open_file`] for a regular file only: a block device is refused too.
    pub fn open_regular_file(&self, name: &OsStr, create: bool) -> io::Result<(File, bool)> {
        let (file, created) = self.open_file(name, create)?;
        Ok((regular_only(file, &self.path.join(name))?, created))
    }

    /// Opens the regular file `name` read-only, never through a link (a snapshot part that is
    /// only read). Refused as [`Dir::open_regular_file`] refuses.
    pub fn open_regular_file_to_read(&self, name: &OsStr) -> io::Result<File> {
        let name = plain_name(name)?;
        let shown = self.path.join(name);
        let (file, _) = open_at_as(
            &self.fd,
            Path::new(name),
            false,
            false,
            &shown,
            OFlag::O_RDONLY,
        )?;
        regular_only(file, &shown)
    }

    /// Opens `name` read-write without following a link; with `create`, makes it (mode 0600)
    /// when it does not exist. Returns the file and whether it was created. Only a regular
    /// file with one link or a block device is opened; anything else is refused.
    pub fn open_file(&self, name: &OsStr, create: bool) -> io::Result<(File, bool)> {
        let name = plain_name(name)?;
        open_at(
            &self.fd,
            Path::new(name),
            false,
            create,
            &self.path.join(name),
        )
    }

    /// Opens `name` again with `extra` flags (`O_DIRECT`), never through a link, and checks it
    /// is the very file `like` is (nobody swapped it in between).
    pub fn reopen_file(&self, name: &OsStr, like: &File, extra: OFlag) -> io::Result<File> {
        let name = plain_name(name)?;
        let fd = nix::fcntl::openat(
            &self.fd,
            name,
            OFlag::O_RDWR | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW | extra,
            Mode::empty(),
        )
        .map_err(|errno| match errno {
            Errno::ELOOP => refuse_link(&self.path.join(name).display().to_string()),
            errno => io_err(errno),
        })?;
        let file = File::from(fd);
        same_file(&file, like, &self.path.join(name))?;
        Ok(file)
    }

    /// Opens (with `create`, makes, mode 0700) the directory `name` inside this one, never
    /// through a link. `None` when it does not exist and `create` is off.
    pub fn sub_dir(&self, name: &OsStr, create: bool) -> io::Result<Option<Dir>> {
        let name = plain_name(name)?;
        let mut made = false;
        if create {
            match nix::sys::stat::mkdirat(&self.fd, name, mode(DIR_MODE)) {
                Ok(()) => made = true,
                Err(Errno::EEXIST) => {}
                Err(errno) => return Err(io_err(errno)),
            }
        }
        let path = self.path.join(name);
        let fd = match nix::fcntl::openat(
            &self.fd,
            name,
            OFlag::O_DIRECTORY | OFlag::O_RDONLY | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(Errno::ENOENT) if !create => return Ok(None),
            Err(Errno::ELOOP) | Err(Errno::ENOTDIR) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "{} is not a directory (a symbolic link or a file); it is left alone",
                        path.display()
                    ),
                ))
            }
            Err(errno) => return Err(io_err(errno)),
        };
        if made {
            nix::sys::stat::fchmod(&fd, mode(DIR_MODE)).map_err(io_err)?;
        }
        Ok(Some(Dir { path, fd }))
    }

    /// The names in the directory.
    pub fn names(&self) -> io::Result<Vec<std::ffi::OsString>> {
        // A descriptor of its own: a clone would share (and move) the held one's offset.
        let fd = nix::fcntl::openat(
            &self.fd,
            ".",
            OFlag::O_DIRECTORY | OFlag::O_RDONLY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(io_err)?;
        let mut dir = nix::dir::Dir::from_fd(fd).map_err(io_err)?;
        let mut names = Vec::new();
        for entry in dir.iter() {
            let entry = entry.map_err(io_err)?;
            let name = OsStr::from_bytes(entry.file_name().to_bytes());
            if name != "." && name != ".." {
                names.push(name.to_os_string());
            }
        }
        Ok(names)
    }

    /// Renames `from` to `to`, both in this directory (replacing `to`; a link named `to` is
    /// replaced, never followed).
    pub fn rename(&self, from: &OsStr, to: &OsStr) -> io::Result<()> {
        nix::fcntl::renameat(&self.fd, plain_name(from)?, &self.fd, plain_name(to)?).map_err(io_err)
    }

    /// Removes the file (or link) `name`; a missing one is no error.
    pub fn remove_file(&self, name: &OsStr) -> io::Result<()> {
        match nix::unistd::unlinkat(
            &self.fd,
            plain_name(name)?,
            nix::unistd::UnlinkatFlags::NoRemoveDir,
        ) {
            Ok(()) | Err(Errno::ENOENT) => Ok(()),
            Err(errno) => Err(io_err(errno)),
        }
    }

    /// Removes the empty directory `name`; a missing one is no error.
    pub fn remove_dir(&self, name: &OsStr) -> io::Result<()> {
        match nix::unistd::unlinkat(
            &self.fd,
            plain_name(name)?,
            nix::unistd::UnlinkatFlags::RemoveDir,
        ) {
            Ok(()) | Err(Errno::ENOENT) => Ok(()),
            Err(errno) => Err(io_err(errno)),
        }
    }

    /// Makes the directory's entries durable.
    pub fn sync(&self) -> io::Result<()> {
        nix::unistd::fsync(&self.fd).map_err(io_err)
    }

    /// Hands the directory, and the regular files and directories directly in it, to
    /// `uid:gid`. Links, devices and FIFOs are left as they are; a regular file with more than
    /// one link is refused (chowning it would hand over a file someone else named). Each entry
    /// is opened `O_PATH|O_NOFOLLOW` (nothing is read or triggered), checked through that
    /// descriptor and changed through it, so nothing can be swapped in between.
    pub fn hand_entries_to(&self, uid: Uid, gid: Gid) -> io::Result<()> {
        nix::unistd::fchown(&self.fd, Some(uid), Some(gid)).map_err(io_err)?;
        for name in self.names()? {
            let fd = match nix::fcntl::openat(
                &self.fd,
                name.as_os_str(),
                OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                Mode::empty(),
            ) {
                Ok(fd) => fd,
                Err(Errno::ENOENT) => continue,
                Err(errno) => return Err(io_err(errno)),
            };
            let stat = nix::sys::stat::fstat(&fd).map_err(io_err)?;
            let shown = self.path.join(&name);
            match stat.st_mode & libc::S_IFMT {
                libc::S_IFDIR => {}
                libc::S_IFREG => check_kind(&fd, &shown, false)?,
                _ => continue,
            }
            nix::unistd::fchownat(&fd, "", Some(uid), Some(gid), AtFlags::AT_EMPTY_PATH).map_err(
                |errno| {
                    io::Error::new(
                        io_err(errno).kind(),
                        format!("{}: {errno}", shown.display()),
                    )
                },
            )?;
        }
        Ok(())
    }
}

/// `file` when it is a regular file (not a block device); refused otherwise.
fn regular_only(file: File, shown: &Path) -> io::Result<File> {
    if !file.metadata()?.file_type().is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{} is not a regular file; it is left alone",
                shown.display()
            ),
        ));
    }
    Ok(file)
}

fn refuse_link(shown: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("{shown} is a symbolic link; Headroom never follows a link for a file it names itself, and left it alone"),
    )
}

/// Fails unless `a` and `b` are the same file (device and inode).
pub fn same_file(a: &File, b: &File, shown: &Path) -> io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let (ma, mb) = (a.metadata()?, b.metadata()?);
    if (ma.dev(), ma.ino()) != (mb.dev(), mb.ino()) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} was replaced while it was being opened", shown.display()),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(name: &str) -> PathBuf {
        let path = std::env::temp_dir().join(format!("headroom-dir-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        path
    }

    #[test]
    fn files_are_never_opened_through_a_link_and_get_0600() {
        let path = temp("links");
        std::fs::create_dir_all(&path).unwrap();
        let target = path.join("target");
        std::fs::write(&target, b"keep").unwrap();
        std::os::unix::fs::symlink(&target, path.join("link")).unwrap();
        let dir = Dir::open(&path, true).unwrap();
        let err = dir.open_file(OsStr::new("link"), true).unwrap_err();
        assert!(err.to_string().contains("symbolic link"), "{err}");
        assert!(dir.open_file(OsStr::new("../x"), true).is_err());
        assert_eq!(std::fs::read(&target).unwrap(), b"keep");
        let (_, created) = dir.open_file(OsStr::new("new"), true).unwrap();
        assert!(created);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(path.join("new"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        std::fs::remove_dir_all(&path).unwrap();
    }
}
