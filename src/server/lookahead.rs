//! Prefetching for a pipelined batch: before a connection runs the requests it has received,
//! it asks the CPU for the lines their lookups will miss on, so the misses of a batch overlap
//! instead of stalling one request after another.
//!
//! A lookup of a key not in any cache misses two or three times in a row: the index's control
//! group and entry, then the record it compares the key with. With many requests in hand, the
//! look ahead prefetches every request's index lines at once (no lock: see
//! [`crate::store::IndexLayout`]), then, just before running request `i`, the records of request
//! `i + RECORD_DISTANCE` (this probes the index, by now in cache, under that key's partition
//! lock, briefly, like any lookup). Nothing here changes what a request does or sees.

use crate::proto::frame_keys;

use super::partition::Partitions;

/// Frames looked ahead at once: a memtier pipeline's depth, within the CPU's outstanding-miss
/// budget (two lines a frame).
pub const FRAMES: usize = 16;
/// How many requests ahead of the one running the records are asked for: enough for a miss
/// to memory to complete while those requests run.
const RECORD_DISTANCE: usize = 4;

/// The hashes of the frames looked ahead at, by position after the frame being run.
#[derive(Debug, Default)]
pub struct Lookahead {
    /// `None` for a frame without a key.
    hashes: [Option<u64>; FRAMES],
    len: usize,
    /// The next frame to run, as an index into `hashes`.
    next: usize,
    /// Where, in the connection's buffer, the frames looked at end.
    end: usize,
}

impl Lookahead {
    /// Before the frame at `at` of `buf` runs: looks ahead from it when the frames looked at
    /// so far are used up, and asks for the records of the frame `RECORD_DISTANCE` later.
    pub fn before_frame(&mut self, partitions: &Partitions, buf: &[u8], at: usize) {
        if at >= self.end {
            self.look_from(partitions, buf, at);
        }
        if let Some(Some(hash)) = self.hashes[..self.len].get(self.next + RECORD_DISTANCE) {
            partitions.prefetch_records(*hash);
        }
        self.next += 1;
    }

    /// Forgets the frames looked at (the buffer moved or emptied).
    pub fn reset(&mut self) {
        self.len = 0;
        self.next = 0;
        self.end = 0;
    }

    fn look_from(&mut self, partitions: &Partitions, buf: &[u8], at: usize) {
        let mut keys: [&[u8]; FRAMES] = [&[]; FRAMES];
        let mut len = 0;
        let ahead = frame_keys(&buf[at..], FRAMES, |key| {
            keys[len] = key;
            len += 1;
        });
        // A lone request would wait for its prefetch at once: nothing to overlap, and no
        // hash to spend on the unpipelined path.
        if len < 2 {
            len = 0;
        }
        for (hash, key) in self.hashes.iter_mut().zip(&keys[..len]) {
            *hash = (!key.is_empty()).then(|| partitions.hasher().hash(key));
            if let Some(hash) = *hash {
                partitions.prefetch_index(hash);
            }
        }
        self.len = len;
        self.next = 0;
        // A partial frame: look again once it has run (it is whole by then).
        self.end = at + ahead.max(1);
    }
}
