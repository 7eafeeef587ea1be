//! A warm-restart part file moved in big aligned pieces. With a ring, pieces go through the
//! shard's streaming pool chunks (registered buffers) with `WRITE_FIXED` and `READ_FIXED`,
//! several in flight; the file is opened with O_DIRECT where the filesystem allows it (tmpfs
//! does not), so the bytes do not pass through the page cache. Without a ring the same pieces
//! go through positioned calls on glommio's blocking pool.

use std::collections::VecDeque;
use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::rc::Rc;
use std::sync::Arc;

use glommio::task::JoinHandle;

use crate::dir::Dir;
use crate::ram_snapshot::ALIGN_BYTES;
use crate::ring::{Ring, StreamPool};

use crate::server::shard::wire::ShardIo;

/// Pieces in flight at once (each holds one pool chunk).
const DEPTH_MAX: usize = 4;
/// A piece without a ring.
const PLAIN_PIECE_BYTES: usize = 1 << 20;

/// The ring and pool a part moves through, when both can do fixed-buffer I/O.
#[derive(Clone)]
struct RingPath {
    ring: Rc<Ring>,
    pool: Rc<StreamPool>,
    depth: usize,
}

fn ring_path(io: &ShardIo) -> Option<RingPath> {
    let ring = io.ring.as_ref()?;
    let (chunks, _) = io.pool.counts();
    (chunks >= 2 && io.pool.registered() && io.pool.chunk_bytes() % ALIGN_BYTES == 0).then(|| {
        RingPath {
            ring: Rc::clone(ring),
            pool: Rc::clone(&io.pool),
            depth: DEPTH_MAX.min(chunks - 1),
        }
    })
}

/// `file` (named `name` in `dir`) again with O_DIRECT when a ring will move it and the
/// filesystem takes O_DIRECT; else `file` itself (the plain path's buffers are not aligned).
fn for_io(io: &ShardIo, dir: &Dir, name: &OsStr, file: File) -> (Arc<File>, bool) {
    if ring_path(io).is_none() {
        return (Arc::new(file), false);
    }
    match dir.reopen_file(name, &file, nix::fcntl::OFlag::O_DIRECT) {
        Ok(direct) => (Arc::new(direct), true),
        Err(_) => (Arc::new(file), false),
    }
}

/// How a part's bytes move, as the log says it.
fn how(ring: bool, direct: bool, writing: bool) -> &'static str {
    match (ring, direct, writing) {
        (true, true, true) => "WRITE_FIXED, O_DIRECT",
        (true, false, true) => "WRITE_FIXED, page cache",
        (true, true, false) => "READ_FIXED, O_DIRECT",
        (true, false, false) => "READ_FIXED, page cache",
        (false, _, true) => "positioned writes",
        (false, _, false) => "positioned reads",
    }
}

fn short(what: &str, done: usize, want: usize) -> io::Error {
    io::Error::new(
        io::ErrorKind::WriteZero,
        format!("short {what}: {done} of {want} bytes"),
    )
}

/// Writes a part from its start, in order. Every append is whole blocks, so every write is
/// aligned.
pub struct PartWriter {
    path: Option<RingPath>,
    file: Arc<File>,
    /// Where the staged bytes go in the file.
    at: u64,
    staged: Vec<u8>,
    piece_bytes: usize,
    in_flight: VecDeque<JoinHandle<io::Result<()>>>,
    how: &'static str,
}

impl PartWriter {
    /// A writer into `file`, just created as `name` in `dir`.
    pub fn new(io: &ShardIo, dir: &Dir, name: &OsStr, file: File) -> PartWriter {
        let (file, direct) = for_io(io, dir, name, file);
        let path = ring_path(io);
        let piece_bytes = path
            .as_ref()
            .map_or(PLAIN_PIECE_BYTES, |p| p.pool.chunk_bytes());
        PartWriter {
            how: how(path.is_some(), direct, true),
            path,
            file,
            at: 0,
            staged: Vec::with_capacity(piece_bytes),
            piece_bytes,
            in_flight: VecDeque::new(),
        }
    }

    /// How the bytes go out, for the log.
    pub fn how(&self) -> &'static str {
        self.how
    }

    /// Where the next append lands.
    pub fn position(&self) -> u64 {
        self.at + self.staged.len() as u64
    }

    /// Appends whole blocks.
    pub async fn append(&mut self, mut bytes: &[u8]) -> io::Result<()> {
        debug_assert_eq!(bytes.len() % ALIGN_BYTES, 0, "appends are whole blocks");
        while !bytes.is_empty() {
            let take = (self.piece_bytes - self.staged.len()).min(bytes.len());
            self.staged.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            if self.staged.len() == self.piece_bytes {
                self.flush().await?;
            }
        }
        Ok(())
    }

    /// Sends the staged piece on its way; waits for the oldest one when enough are in flight.
    async fn flush(&mut self) -> io::Result<()> {
        if self.staged.is_empty() {
            return Ok(());
        }
        let (at, len) = (self.at, self.staged.len());
        self.at += len as u64;
        let file = Arc::clone(&self.file);
        match self.path.clone() {
            Some(path) => {
                while self.in_flight.len() >= path.depth {
                    self.wait_oldest().await?;
                }
                let mut chunk = path.pool.take().await;
                chunk.as_mut_slice()[..len].copy_from_slice(&self.staged);
                self.staged.clear();
                let ring = Rc::clone(&path.ring);
                let write = glommio::spawn_local(async move {
                    let (written, chunk) = ring.write_fixed(file.as_raw_fd(), chunk, len, at).await;
                    drop(chunk);
                    match written? {
                        n if n == len => Ok(()),
                        n => Err(short("write", n, len)),
                    }
                })
                .detach();
                self.in_flight.push_back(write);
                Ok(())
            }
            None => {
                let mut piece = crate::sys::AlignedBuf::zeroed(len, ALIGN_BYTES);
                piece.as_mut_slice().copy_from_slice(&self.staged);
                self.staged.clear();
                glommio::executor()
                    .spawn_blocking(move || file.write_all_at(piece.as_slice(), at))
                    .await
            }
        }
    }

    async fn wait_oldest(&mut self) -> io::Result<()> {
        match self.in_flight.pop_front() {
            Some(write) => write
                .await
                .unwrap_or_else(|| Err(io::Error::other("a snapshot write was cancelled"))),
            None => Ok(()),
        }
    }

    /// Writes what is staged and waits for every write; returns the part's length.
    pub async fn finish(mut self) -> io::Result<u64> {
        let flushed = self.flush().await;
        // Every write is awaited, even after a failure: none outlives its pool chunk's owner.
        let mut result = flushed;
        while !self.in_flight.is_empty() {
            let done = self.wait_oldest().await;
            if result.is_ok() {
                result = done;
            }
        }
        result.map(|()| self.at)
    }
}

/// Reads spans of a part, several at once.
pub struct PartReader {
    path: Option<RingPath>,
    file: Arc<File>,
    how: &'static str,
}

impl PartReader {
    /// A reader of `name` in `dir`, opened (never through a link) as `file`.
    pub fn new(io: &ShardIo, dir: &Dir, name: &OsStr, file: File) -> PartReader {
        let (file, direct) = for_io(io, dir, name, file);
        let path = ring_path(io);
        PartReader {
            how: how(path.is_some(), direct, false),
            file,
            path,
        }
    }

    /// How the bytes come in, for the log.
    pub fn how(&self) -> &'static str {
        self.how
    }

    /// How many spans to keep in flight.
    pub fn depth(&self) -> usize {
        self.path.as_ref().map_or(2, |p| p.depth)
    }

    /// Starts reading `len` bytes at `offset` (a multiple of [`ALIGN_BYTES`]); the task gives
    /// them back, or an error (a span past the end of the file is one).
    pub fn read(&self, offset: u64, len: usize) -> JoinHandle<io::Result<Vec<u8>>> {
        let file = Arc::clone(&self.file);
        let path = self.path.clone();
        glommio::spawn_local(async move {
            let mut out = Vec::with_capacity(len);
            match path {
                Some(path) => {
                    let piece_bytes = path.pool.chunk_bytes();
                    while out.len() < len {
                        let want = (len - out.len()).min(piece_bytes);
                        let at = offset + out.len() as u64;
                        let chunk = path.pool.take().await;
                        let (read, chunk) = path
                            .ring
                            .read_fixed(
                                file.as_raw_fd(),
                                chunk,
                                want.next_multiple_of(ALIGN_BYTES),
                                at,
                            )
                            .await;
                        match read? {
                            n if n >= want => out.extend_from_slice(&chunk.as_slice()[..want]),
                            n => return Err(short("read", n, want)),
                        }
                    }
                    Ok(out)
                }
                None => {
                    glommio::executor()
                        .spawn_blocking(move || {
                            out.resize(len, 0);
                            file.read_exact_at(&mut out, offset).map(|()| out)
                        })
                        .await
                }
            }
        })
        .detach()
    }
}
