//! A shard's cache of connection buffers: a connection takes one when bytes arrive for it (a
//! read buffer) or when it has replies to compose (a reply buffer), and gives it back once
//! its requests are done, so an idle connection holds none (memcached keeps its read buffers
//! in a per-thread cache the same way).
//!
//! A cache is one shard's alone (not `Sync`). It keeps at most `keep_max` free buffers; more
//! go back to the allocator. Buffers that grew past `capacity_max_bytes` (a long line, a
//! big reply) are never kept: the next connection gets the usual size.
//!
//! The cache counts only what it keeps: what connections hold is theirs to say (a buffer in a
//! send that is cut off goes back to the allocator, not here).
//!
//! A read buffer given back keeps the bytes of its last connection: the connection that takes
//! it next reads only what it received itself (`filled` starts at 0), so they are never seen.

use std::cell::RefCell;

/// What the cache hands out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BufferKind {
    /// `len() == bytes` from the start: a read lands anywhere in it.
    Read { bytes: usize },
    /// Empty, with at least `bytes` of capacity: replies are appended.
    Reply { bytes: usize },
}

/// What one cache keeps free, for STAT (`read_buf_bytes_free` as memcached names it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BufferCounts {
    /// Buffers kept free, and their capacity in bytes.
    pub free: usize,
    pub free_bytes: usize,
}

pub struct BufferCache {
    kind: BufferKind,
    /// A buffer of more capacity than this is not kept when given back.
    capacity_max_bytes: usize,
    keep_max: usize,
    free: RefCell<Vec<Vec<u8>>>,
}

impl BufferCache {
    /// A cache of buffers of `kind`, keeping up to `keep_max` free ones of at most
    /// `capacity_max_bytes` each.
    pub fn new(kind: BufferKind, capacity_max_bytes: usize, keep_max: usize) -> BufferCache {
        let (BufferKind::Read { bytes } | BufferKind::Reply { bytes }) = kind;
        assert!(
            bytes > 0 && capacity_max_bytes >= bytes,
            "a cache keeps buffers of its own size at least"
        );
        BufferCache {
            kind,
            capacity_max_bytes,
            keep_max,
            free: RefCell::new(Vec::new()),
        }
    }

    /// A buffer, from the free ones when there is one.
    pub fn take(&self) -> Vec<u8> {
        let buf = match self.free.borrow_mut().pop() {
            Some(buf) => buf,
            None => match self.kind {
                BufferKind::Read { bytes } => vec![0; bytes],
                BufferKind::Reply { bytes } => Vec::with_capacity(bytes),
            },
        };
        debug_assert!(self.fits(&buf), "a free buffer is of the cache's kind");
        buf
    }

    /// A free buffer, if one is kept: never allocates.
    pub fn take_free(&self) -> Option<Vec<u8>> {
        let buf = self.free.borrow_mut().pop()?;
        debug_assert!(self.fits(&buf), "a free buffer is of the cache's kind");
        Some(buf)
    }

    /// Takes back a buffer, grown or not: kept if it is of the cache's kind and room is left,
    /// else freed.
    pub fn give(&self, mut buf: Vec<u8>) {
        if let BufferKind::Reply { .. } = self.kind {
            buf.clear();
        }
        let mut free = self.free.borrow_mut();
        if free.len() < self.keep_max && self.fits(&buf) {
            free.push(buf);
        }
    }

    /// Whether `buf` can be handed out as this cache's: a read buffer of its exact length, a
    /// reply buffer empty, each of the usual capacity or up to the maximum.
    fn fits(&self, buf: &Vec<u8>) -> bool {
        let capacity_ok = buf.capacity() <= self.capacity_max_bytes;
        match self.kind {
            BufferKind::Read { bytes } => buf.len() == bytes && capacity_ok,
            BufferKind::Reply { bytes } => buf.is_empty() && buf.capacity() >= bytes && capacity_ok,
        }
    }

    /// The usual size of a buffer.
    pub fn buffer_bytes(&self) -> usize {
        match self.kind {
            BufferKind::Read { bytes } | BufferKind::Reply { bytes } => bytes,
        }
    }

    pub fn counts(&self) -> BufferCounts {
        let free = self.free.borrow();
        BufferCounts {
            free: free.len(),
            free_bytes: free.iter().map(Vec::capacity).sum(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_buffers_come_back_and_are_reused_at_their_size() {
        let cache = BufferCache::new(BufferKind::Read { bytes: 64 }, 64, 2);
        let a = cache.take();
        assert_eq!(a.len(), 64);
        let a_ptr = a.as_ptr();
        assert_eq!(cache.counts(), BufferCounts::default());
        cache.give(a);
        assert_eq!(
            cache.counts(),
            BufferCounts {
                free: 1,
                free_bytes: 64
            }
        );
        let b = cache.take();
        assert_eq!(b.as_ptr(), a_ptr, "the free buffer is handed out again");
        let mut grown = b;
        grown.resize(200, 0);
        cache.give(grown);
        assert_eq!(
            cache.counts(),
            BufferCounts::default(),
            "a grown buffer goes back to the allocator"
        );
        // A buffer of another length is not a read buffer of this cache.
        cache.give(vec![0; 10]);
        assert_eq!(cache.counts().free, 0);
    }

    #[test]
    fn reply_buffers_come_back_empty_and_the_free_list_is_bounded() {
        let cache = BufferCache::new(BufferKind::Reply { bytes: 32 }, 128, 1);
        let mut a = cache.take();
        assert!(a.is_empty() && a.capacity() >= 32);
        a.extend_from_slice(b"VALUE k 0 1\r\nx\r\nEND\r\n");
        let b = cache.take();
        cache.give(a);
        cache.give(b);
        assert_eq!(cache.counts().free, 1, "kept up to keep_max");
        assert!(
            cache.take().is_empty(),
            "a reply buffer is handed out empty"
        );
        // Too small to be one of the cache's.
        cache.give(Vec::with_capacity(4));
        assert_eq!(cache.counts().free, 0);
    }
}
