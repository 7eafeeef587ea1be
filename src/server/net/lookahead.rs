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
//!
//! Binary frames and text command lines are looked ahead at alike (`Framing`); a text line not
//! ended within `proto::text::LOOKAHEAD_WINDOW_BYTES` stops the look, so a long line arriving
//! in pieces costs the look ahead a bounded search per pass.
//!
//! Connections that are not pipelining get the same across connections: [`ReceiveLookahead`]
//! sees each receive as the shard's ring reaps it, before the connection it wakes runs.

use std::cell::RefCell;
use std::sync::Arc;

use crate::proto::{command_keys, first_key, frame_keys, is_binary};
use crate::ring::ReceiveWatch;

use crate::server::shard::shared::Shared;
use crate::store::partition::Partitions;

/// How the requests in a connection's buffer are framed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    /// Binary protocol frames ([`frame_keys`]).
    Binary,
    /// Text and meta command lines and their data blocks ([`command_keys`]).
    Text,
}

/// Frames looked ahead at once: a memtier pipeline's depth, within the CPU's outstanding-miss
/// budget (two lines a frame).
pub const FRAMES: usize = 16;
/// How many requests ahead of the one running the records are asked for: enough for a miss
/// to memory to complete while those requests run.
const RECORD_DISTANCE: usize = 4;

/// The hashes of the frames looked ahead at, by position after the frame being run. Every
/// connection holds one, idle or not, so it is kept small: the hashes are boxed, and only a
/// batch of two frames or more (a pipelined one) takes them; [`Lookahead::release`] gives
/// them back when the connection goes idle.
#[derive(Debug, Default)]
pub struct Lookahead {
    hashes: Option<Box<[u64; FRAMES]>>,
    /// Bit `i` set: frame `i` has a key (and `hashes[i]` is its hash).
    keyed: u16,
    len: u8,
    /// The next frame to run, as an index into `hashes`.
    next: u8,
    /// Where, in the connection's buffer, the frames looked at end.
    end: usize,
}

const _: () = assert!(FRAMES <= 16, "`keyed` has a bit per frame");

impl Lookahead {
    /// Before the frame at `at` of `buf` runs: looks ahead from it when the frames looked at
    /// so far are used up, and asks for the records of the frame `RECORD_DISTANCE` later.
    pub fn before_frame(
        &mut self,
        partitions: &Partitions,
        framing: Framing,
        buf: &[u8],
        at: usize,
    ) {
        if at >= self.end {
            self.look_from(partitions, framing, buf, at);
        }
        let ahead = usize::from(self.next) + RECORD_DISTANCE;
        if let Some(hashes) = self.hashes.as_deref() {
            if ahead < usize::from(self.len) && self.keyed & (1 << ahead) != 0 {
                partitions.prefetch_records(hashes[ahead]);
            }
        }
        self.next = self.next.saturating_add(1);
    }

    /// Forgets the frames looked at (the buffer moved or emptied).
    pub fn reset(&mut self) {
        self.len = 0;
        self.next = 0;
        self.end = 0;
    }

    /// [`Lookahead::reset`], and gives the hashes' box back: the connection is idle.
    pub fn release(&mut self) {
        *self = Lookahead::default();
    }

    fn look_from(&mut self, partitions: &Partitions, framing: Framing, buf: &[u8], at: usize) {
        let mut keys: [&[u8]; FRAMES] = [&[]; FRAMES];
        let mut len = 0;
        let found = |key| {
            keys[len] = key;
            len += 1;
        };
        let ahead = match framing {
            Framing::Binary => frame_keys(&buf[at..], FRAMES, found),
            Framing::Text => command_keys(&buf[at..], FRAMES, found),
        };
        // A lone request would wait for its prefetch at once: nothing to overlap, and no
        // hash to spend on the unpipelined path.
        if len < 2 {
            len = 0;
        }
        self.keyed = 0;
        if len > 0 {
            let hashes = self.hashes.get_or_insert_with(|| Box::new([0; FRAMES]));
            for (i, key) in keys[..len].iter().enumerate() {
                if key.is_empty() {
                    continue;
                }
                let hash = partitions.hasher().hash(key);
                hashes[i] = hash;
                self.keyed |= 1 << i;
                partitions.prefetch_index(hash);
            }
        }
        self.len = len as u8;
        self.next = 0;
        // A partial frame: look again once it has run (it is whole by then).
        self.end = at + ahead.max(1);
    }
}

/// The look ahead across connections. Shown every receive as the shard's ring reaps it, it
/// prefetches the index lines of the receive's first request; once the reap has seen them all
/// (and it saw two or more), the records those requests will compare keys with. The tasks the
/// reap wakes run next, so a pass that serves several connections waits for memory about once,
/// not two or three times a request. It never waits for a partition: one held is skipped.
pub struct ReceiveLookahead {
    shared: Arc<Shared>,
    /// The hashes of this reap's first requests, and how many.
    hashes: RefCell<([u64; FRAMES], usize)>,
}

impl ReceiveLookahead {
    pub fn new(shared: Arc<Shared>) -> ReceiveLookahead {
        ReceiveLookahead {
            shared,
            hashes: RefCell::new(([0; FRAMES], 0)),
        }
    }
}

/// The key of the request at the start of `bytes`, in either protocol, if it has one whole.
fn first_request_key(bytes: &[u8]) -> Option<&[u8]> {
    if is_binary(*bytes.first()?) {
        let mut first = None;
        frame_keys(bytes, 1, |key| first = Some(key));
        first.filter(|key| !key.is_empty())
    } else {
        first_key(bytes)
    }
}

impl ReceiveWatch for ReceiveLookahead {
    fn received(&self, bytes: &[u8]) {
        let Some(key) = first_request_key(bytes) else {
            return;
        };
        let partitions = &self.shared.partitions;
        let hash = partitions.hasher().hash(key);
        partitions.prefetch_index(hash);
        let (hashes, len) = &mut *self.hashes.borrow_mut();
        if *len < FRAMES {
            hashes[*len] = hash;
            *len += 1;
        }
    }

    fn reaped(&self) {
        let (hashes, len) = std::mem::take(&mut *self.hashes.borrow_mut());
        // A lone request's task runs next: its index lines come in while it is woken, and
        // probing for its record here would only move its wait.
        if len < 2 {
            return;
        }
        for &hash in &hashes[..len] {
            self.shared.partitions.prefetch_records_if_free(hash);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_request_key_is_found_in_either_protocol() {
        let mut get = Vec::new();
        crate::proto::write_request(
            &mut get,
            crate::proto::opcode::GET,
            (&[], b"abc", &[]),
            0,
            0,
        );
        assert_eq!(first_request_key(&get), Some(&b"abc"[..]));
        // A frame cut short names no key.
        assert_eq!(first_request_key(&get[..get.len() - 1]), None);
        assert_eq!(first_request_key(b"get abc\r\n"), Some(&b"abc"[..]));
        assert_eq!(first_request_key(b"set k 0 0 1\r\nx\r\n"), Some(&b"k"[..]));
        assert_eq!(first_request_key(b"mg key v\r\n"), Some(&b"key"[..]));
        assert_eq!(first_request_key(b"stats items\r\n"), None);
        assert_eq!(first_request_key(b"get abc"), None, "a key not yet ended");
        assert_eq!(first_request_key(b""), None);
        let long = [b"get ".as_slice(), &[b'k'; 251], b"\r\n"].concat();
        assert_eq!(first_request_key(&long), None, "longer than a key can be");
    }
}
