//! The bytes behind store targets: anonymous memory bound to a node, or a file (or block
//! device) used with O_DIRECT. This layer prepares them at mount; the shards do the I/O.

use std::fs::{self, OpenOptions};
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::dir::Dir;

pub use crate::sys::AlignedBuf;
use crate::sys::{self, Mapping};

use super::label::{random_id, Label, LABEL_BYTES};
use crate::topology::{NodeId, Topology};

/// Alignment assumed when the kernel cannot tell (the common device block).
pub const DEFAULT_DIO_ALIGN_BYTES: u64 = 4096;

/// Memory segment bytes: one mapping bound to its node, faulted in as it is written.
#[derive(Debug)]
pub struct MemStorage {
    mapping: Mapping,
}

impl MemStorage {
    pub fn map(size: u64, node: Option<NodeId>) -> io::Result<MemStorage> {
        let mapping = Mapping::anonymous(size as usize, DEFAULT_DIO_ALIGN_BYTES as usize, None)?;
        if let Some(node) = node {
            mapping.bind_to_node(node)?;
        }
        Ok(MemStorage { mapping })
    }

    pub fn len(&self) -> u64 {
        self.mapping.len() as u64
    }

    pub fn is_empty(&self) -> bool {
        self.mapping.is_empty()
    }

    fn check(&self, offset: u64, len: usize) {
        assert!(
            offset + len as u64 <= self.len(),
            "access beyond the memory segment"
        );
    }

    /// Copies `data` into the segment at `offset`.
    ///
    /// The caller must own `offset..offset + data.len()` exclusively (an extent placed for it
    /// and not yet published): that is what keeps two writers, or a writer and a reader, apart.
    pub fn write(&self, offset: u64, data: &[u8]) {
        self.check(offset, data.len());
        // SAFETY: in bounds (checked above) of a mapping this value owns; the caller owns the
        // extent exclusively, so nothing else reads or writes these bytes meanwhile.
        unsafe {
            std::ptr::copy_nonoverlapping(
                data.as_ptr(),
                self.mapping.base().as_ptr().add(offset as usize),
                data.len(),
            );
        }
    }

    /// Lends `offset..offset + len` to a zero-copy send. `lease` must keep the extent from
    /// being freed (and so rewritten) until it is dropped, which happens when the kernel is
    /// done with the bytes; the storage itself is kept alive the same way.
    pub fn lend(
        self: &std::sync::Arc<Self>,
        offset: u64,
        len: usize,
        lease: Box<dyn std::any::Any>,
    ) -> crate::lent::Lent {
        self.check(offset, len);
        let ptr = self.mapping.base().as_ptr().wrapping_add(offset as usize);
        let keep = (std::sync::Arc::clone(self), lease);
        // SAFETY: in bounds of our mapping, which `keep` holds; the extent is published and
        // leased until `keep` drops, so no writer touches these bytes meanwhile.
        unsafe { crate::lent::Lent::new(ptr, len, Box::new(move || drop(keep))) }
    }

    /// Copies bytes out of the segment.
    ///
    /// The caller must hold the extent against being freed (a lease) while it reads.
    pub fn read(&self, offset: u64, out: &mut [u8]) {
        self.check(offset, out.len());
        // SAFETY: in bounds of our mapping; the extent is published and leased, so no writer
        // touches it until the reader lets go.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.mapping.base().as_ptr().add(offset as usize),
                out.as_mut_ptr(),
                out.len(),
            );
        }
    }
}

/// A file or block device segment, checked at mount: it exists with at least `size` bytes and
/// is open with O_DIRECT (shared by every shard: positioned reads and writes need no lock).
#[derive(Debug)]
pub struct FileStorage {
    pub path: PathBuf,
    /// Bytes the extents may use: the size given, less the label's block on a block device
    /// (a file's label lies past them).
    pub size: u64,
    /// The segment's identity, from its label (`label.rs`).
    pub id: u128,
    /// The O_DIRECT offset and length alignment the device wants.
    pub dio_align: u64,
    pub block_device: bool,
    file: fs::File,
    /// Held for as long as any shard can still do I/O here: no other process may use the file.
    _lock: std::sync::Arc<crate::lockfile::FileLock>,
}

/// The O_DIRECT alignment of the open segment `file` (at `path`): what `statx` reports
/// (`STATX_DIOALIGN`), else the logical block size sysfs gives for the device behind it, else
/// (said in the log) the common 4096.
fn dio_alignment(file: &fs::File, path: &Path) -> u64 {
    let from_statx = sys::statx_dio_offset_align(file)
        .filter(|align| align.is_power_of_two())
        .map(|align| u64::from(align).max(512));
    if let Some(align) = from_statx {
        return align;
    }
    if let Some(align) = sysfs_logical_block_bytes(file) {
        return align;
    }
    tracing::warn!(
        path = %path.display(),
        "neither statx nor sysfs gives this segment's O_DIRECT alignment; assuming {DEFAULT_DIO_ALIGN_BYTES}"
    );
    DEFAULT_DIO_ALIGN_BYTES
}

/// `queue/logical_block_size` of the block device behind `file` (the device itself, or the
/// one holding the file; a partition's queue is its parent's).
fn sysfs_logical_block_bytes(file: &fs::File) -> Option<u64> {
    let meta = file.metadata().ok()?;
    let dev = if meta.file_type().is_block_device() {
        meta.rdev()
    } else {
        meta.dev()
    };
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let base = PathBuf::from(format!("/sys/dev/block/{major}:{minor}"));
    [
        base.join("queue/logical_block_size"),
        base.join("../queue/logical_block_size"),
    ]
    .iter()
    .find_map(|p| fs::read_to_string(p).ok()?.trim().parse::<u64>().ok())
    .filter(|bytes| bytes.is_power_of_two() && *bytes >= 512)
}

/// Who asks for a file segment, which decides what may be mounted and how it is opened.
#[derive(Clone, Debug)]
pub enum MountOrigin {
    /// `--segment` on the command line (or in `--config`): the operator named the file, so an
    /// existing file or block device is taken (and a file gets Headroom's label). A file directly
    /// in the data directory (the default `segment-0`, or one the operator put there) is reached
    /// through `data_dir` and never through a link; elsewhere the path is followed as the
    /// operator wrote it (a link such as `/dev/disk/by-id/...` is the operator's own).
    CommandLine { data_dir: Arc<Dir> },
    /// ADMIN `mount` at runtime: only a file inside one of these directories, which Headroom
    /// created itself (its label says so), or a new file there; never a block device, never
    /// through a link.
    Runtime { allowed_dirs: Vec<PathBuf> },
}

fn refuse(path: &Path, why: impl std::fmt::Display) -> io::Error {
    io::Error::new(
        io::ErrorKind::PermissionDenied,
        format!("{}: {why}", path.display()),
    )
}

/// Opens `path`'s directory and checks that it is inside one of `dirs` (the open directory's
/// own resolved path is compared, so `..` and symlinked directories cannot lead out, and
/// nothing can be swapped in after the check).
fn open_inside_allowed_dirs(path: &Path, dirs: &[PathBuf]) -> io::Result<Dir> {
    let listed = || {
        dirs.iter()
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let (parent, _) = crate::dir::split(path)?;
    let dir = Dir::open(parent, false)
        .and_then(|dir| Ok((dir.resolved_path()?, dir)))
        .map_err(|err| {
            refuse(
                path,
                format!(
                    "its directory cannot be opened ({err}); a runtime mount takes files inside {}",
                    listed()
                ),
            )
        });
    let (resolved, dir) = dir?;
    let inside = dirs
        .iter()
        .filter_map(|dir| fs::canonicalize(dir).ok())
        .any(|dir| resolved.starts_with(dir));
    if inside {
        Ok(dir)
    } else {
        Err(refuse(
            path,
            format!(
                "a runtime mount takes only files inside {} (--data-dir, --mount-dir)",
                listed()
            ),
        ))
    }
}

/// Where a segment file is opened from: a directory Headroom holds (never through a link), or
/// the path the operator wrote (followed as written).
enum Opener<'a> {
    In(&'a Dir, &'a std::ffi::OsStr),
    Path(&'a Path),
}

impl Opener<'_> {
    /// Opens the file read-write, creating it (mode 0600, `O_EXCL`) when missing; returns
    /// whether it was created.
    fn open(&self) -> io::Result<(fs::File, bool)> {
        match self {
            Opener::In(dir, name) => dir.open_file(name, true),
            Opener::Path(path) => crate::dir::open_path(path, true),
        }
    }

    /// The same file again, with O_DIRECT (checked to be the same inode as `like`).
    fn reopen_direct(&self, like: &fs::File) -> io::Result<fs::File> {
        match self {
            Opener::In(dir, name) => dir.reopen_file(name, like, nix::fcntl::OFlag::O_DIRECT),
            Opener::Path(path) => {
                let file = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .custom_flags(libc::O_DIRECT)
                    .open(path)?;
                crate::dir::same_file(&file, like, path)?;
                Ok(file)
            }
        }
    }

    /// Removes the file this opener created (a mount that failed leaves nothing behind).
    fn remove(&self) {
        let _ = match self {
            Opener::In(dir, name) => dir.remove_file(name),
            Opener::Path(path) => fs::remove_file(path),
        };
    }
}

impl FileStorage {
    /// Opens (creating it when missing) and locks a segment file or block device, checks it may
    /// be mounted from `origin`, sizes and labels a file, and reopens it with O_DIRECT. Nothing
    /// is written to a file that is refused, and a file created here is removed again when
    /// the mount fails.
    pub fn prepare(path: &Path, size: u64, origin: &MountOrigin) -> io::Result<FileStorage> {
        let runtime = matches!(origin, MountOrigin::Runtime { .. });
        let (parent, name) = crate::dir::split(path)?;
        let held_dir;
        let opener = match origin {
            MountOrigin::Runtime { allowed_dirs } => {
                held_dir = open_inside_allowed_dirs(path, allowed_dirs)?;
                // Where others may write, they could have left a labelled file of their own.
                crate::dir::refuse_writable_by_others(
                    held_dir.stat()?.st_mode,
                    false,
                    &format!("its directory {}", parent.display()),
                    "a runtime mount takes files only where no other user can put one",
                )
                .map_err(|why| refuse(path, why))?;
                Opener::In(&held_dir, name)
            }
            MountOrigin::CommandLine { data_dir } => {
                // The data directory is recognised by its inode, not by how the path is
                // spelt (`DATA/x/../segment-0`, a linked prefix): its files are never reached
                // through a link.
                crate::dir::create_parents(parent)?;
                let here = Dir::open(parent, false)?.stat()?;
                let data = data_dir.stat()?;
                if (here.st_dev, here.st_ino) == (data.st_dev, data.st_ino) {
                    Opener::In(data_dir, name)
                } else {
                    Opener::Path(path)
                }
            }
        };
        let (file, created) = opener.open()?;
        let prepared = Self::prepare_opened(path, size, runtime, file, created, &opener);
        if prepared.is_err() && created {
            opener.remove();
        }
        prepared
    }

    fn prepare_opened(
        path: &Path,
        size: u64,
        runtime: bool,
        file: fs::File,
        created: bool,
        opener: &Opener,
    ) -> io::Result<FileStorage> {
        let meta = file.metadata()?;
        let block_device = meta.file_type().is_block_device();
        if runtime && !meta.file_type().is_file() {
            return Err(refuse(
                path,
                "not a regular file; block devices are mounted only from the command line (--segment)",
            ));
        }
        let me = nix::unistd::Uid::effective().as_raw();
        if runtime && meta.uid() != me {
            return Err(refuse(
                path,
                format!(
                    "owned by uid {}, not by uid {me} that the server runs as; a runtime mount takes only the server's own files",
                    meta.uid()
                ),
            ));
        }
        let lock = crate::lockfile::lock_exclusive(file).map_err(|err| {
            io::Error::new(
                io::ErrorKind::WouldBlock,
                format!("{}: {err}", path.display()),
            )
        })?;
        let file = lock.file();
        let (id, extent_bytes) = if block_device {
            (Self::device_label(path, size, file)?, size - LABEL_BYTES)
        } else {
            (Self::file_label(path, size, runtime, file, created)?, size)
        };
        // O_DIRECT must work here: tmpfs and some network filesystems refuse it.
        let direct = opener.reopen_direct(file).map_err(|err| {
            io::Error::new(
                err.kind(),
                format!("{} cannot be opened with O_DIRECT: {err}", path.display()),
            )
        })?;
        Ok(FileStorage {
            path: path.to_path_buf(),
            size: extent_bytes,
            id,
            dio_align: dio_alignment(&direct, path),
            block_device,
            file: direct,
            _lock: lock,
        })
    }

    /// A segment file's id: from its label, or drawn and written into a new label (a file just
    /// created, an existing file the operator named, one labelled for another size, which
    /// keeps its id, or a version 1 label, which gets one). A runtime mount takes only a file
    /// whose label says it is a Headroom segment of this size.
    fn file_label(
        path: &Path,
        size: u64,
        runtime: bool,
        file: &fs::File,
        created: bool,
    ) -> io::Result<u128> {
        if created {
            file.set_len(size + LABEL_BYTES)?;
            let label = Label::new(size)?;
            label.write(file, size)?;
            return Ok(label.id.expect("a new label has an id"));
        }
        if let Some(label) = Label::read(file, size, size)? {
            return match label.id {
                Some(id) => Ok(id),
                None => {
                    let id = random_id()?;
                    Label {
                        id: Some(id),
                        ..label
                    }
                    .write(file, size)?;
                    tracing::info!(
                        path = %path.display(),
                        id = %format_args!("{id:032x}"),
                        "segment given an id: its label was written by an older build"
                    );
                    Ok(id)
                }
            };
        }
        let earlier = Label::find_any(file)?;
        if runtime {
            return Err(refuse(
                path,
                match earlier {
                    Some(label) => format!(
                        "Headroom created it as a segment of {} bytes, not {size}",
                        label.size
                    ),
                    None => "Headroom did not create this file (it has no segment label); a runtime mount never writes a file it did not create".to_string(),
                },
            ));
        }
        let id = match &earlier {
            Some(label) => {
                tracing::warn!(
                    path = %path.display(),
                    was_bytes = label.size,
                    now_bytes = size,
                    "segment file relabelled for another size: its old contents are not trusted"
                );
                label.id
            }
            None => {
                tracing::info!(
                    path = %path.display(),
                    "existing file named by --segment: labelled as a Headroom segment"
                );
                None
            }
        };
        let mut label = Label::new(size)?;
        label.id = id.or(label.id);
        if file.metadata()?.len() < size + LABEL_BYTES {
            file.set_len(size + LABEL_BYTES)?;
        }
        label.write(file, size)?;
        Ok(label.id.expect("the label has an id"))
    }

    /// A block device's id: from the label in the last block of its `size` bytes, or drawn
    /// and written there. The device must hold `size` bytes, more than the label's block.
    fn device_label(path: &Path, size: u64, file: &fs::File) -> io::Result<u128> {
        let device_bytes = sys::block_device_bytes(file)?;
        if device_bytes < size || size <= LABEL_BYTES {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{} holds {device_bytes} bytes; a segment of {size} needs that many, more than \
                     the {LABEL_BYTES} its label takes",
                    path.display()
                ),
            ));
        }
        let at = size - LABEL_BYTES;
        if let Some(Label { id: Some(id), .. }) = Label::read(file, size, at)? {
            return Ok(id);
        }
        let label = Label::new(size)?;
        label.write(file, at)?;
        tracing::info!(
            path = %path.display(),
            label_at = at,
            "block device labelled as a Headroom segment: its last 4 KiB hold the label"
        );
        Ok(label.id.expect("a new label has an id"))
    }

    /// Writes a whole aligned buffer at an aligned offset (O_DIRECT). Blocking: run it off the
    /// executor.
    pub fn write_at(&self, buf: &sys::AlignedBuf, offset: u64) -> io::Result<()> {
        use std::os::unix::fs::FileExt;
        self.file.write_all_at(buf.as_slice(), offset)
    }

    /// Fills an aligned buffer from an aligned offset (O_DIRECT). Blocking: run it off the
    /// executor.
    pub fn read_at(&self, buf: &mut sys::AlignedBuf, offset: u64) -> io::Result<()> {
        use std::os::unix::fs::FileExt;
        self.file.read_exact_at(buf.as_mut_slice(), offset)
    }

    /// The O_DIRECT descriptor, for the ring's fixed-buffer reads and writes (valid while this
    /// storage lives).
    pub fn raw_fd(&self) -> std::os::fd::RawFd {
        std::os::fd::AsRawFd::as_raw_fd(&self.file)
    }

    /// Makes every completed write durable (O_DIRECT bypasses the page cache, not the device's
    /// write cache). Blocking.
    pub fn sync_data(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    /// The node of the block device holding the file, from sysfs.
    pub fn device_node(&self, topology: &Topology) -> Option<NodeId> {
        let meta = self.file.metadata().ok()?;
        let dev = if self.block_device {
            meta.rdev()
        } else {
            meta.dev()
        };
        let (major, minor) = (libc::major(dev), libc::minor(dev));
        let link = fs::canonicalize(format!("/sys/dev/block/{major}:{minor}")).ok()?;
        // A partition's directory sits inside its disk's: try it, then the parent.
        let name = link.file_name()?.to_str()?.to_string();
        let parent = link.parent()?.file_name()?.to_str()?.to_string();
        topology
            .node_of_block_device(&name)
            .or_else(|| topology.node_of_block_device(&parent))
    }
}
