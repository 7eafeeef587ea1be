//! A shard's streaming pool: its blocks of the arena's `stream` reservation cut into
//! `--io-chunk` chunks, aligned for O_DIRECT (blocks are aligned to themselves, chunks to
//! their size) and registered with the ring as part of the arena. A large value moves
//! through these chunks: from the socket into a chunk and onto the segment, from the segment
//! into a chunk and onto the socket. A chunk is owned by one operation at a time and goes
//! back to the pool when dropped; a taker waits when every chunk is out.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;
use std::task::{Poll, Waker};

use super::FixedBuffers;

pub struct StreamPool {
    chunk_bytes: usize,
    /// Free chunks: (address, fixed-buffer index if registered).
    free: RefCell<Vec<(usize, Option<u16>)>>,
    waiters: RefCell<VecDeque<Waker>>,
    total: usize,
    /// Every chunk is part of a registered buffer (fixed-buffer I/O works on any of them).
    registered: bool,
}

impl StreamPool {
    /// A pool over `ranges` (start, length), cut into `chunk_bytes` pieces.
    ///
    /// # Safety
    ///
    /// The ranges must be mapped, writable, aligned to `chunk_bytes`, and used by nothing but
    /// this pool for as long as it or any of its chunks lives.
    pub unsafe fn new(
        ranges: &[(usize, usize)],
        chunk_bytes: usize,
        registered: Option<&FixedBuffers>,
    ) -> Rc<StreamPool> {
        assert!(chunk_bytes.is_power_of_two());
        let mut free = Vec::new();
        for &(start, len) in ranges {
            assert!(
                start % chunk_bytes == 0 && len % chunk_bytes == 0,
                "chunk-aligned ranges"
            );
            for at in (start..start + len).step_by(chunk_bytes).rev() {
                free.push((at, registered.and_then(|b| b.find(at, chunk_bytes))));
            }
        }
        let total = free.len();
        let registered = free.iter().all(|(_, index)| index.is_some());
        Rc::new(StreamPool {
            chunk_bytes,
            free: RefCell::new(free),
            waiters: RefCell::new(VecDeque::new()),
            total,
            registered,
        })
    }

    pub fn chunk_bytes(&self) -> usize {
        self.chunk_bytes
    }

    /// Whether every chunk can do fixed-buffer I/O.
    pub fn registered(&self) -> bool {
        self.registered
    }

    /// Chunks in the pool, and how many are free now.
    pub fn counts(&self) -> (usize, usize) {
        (self.total, self.free.borrow().len())
    }

    /// A free chunk, waiting for one if every chunk is out.
    pub async fn take(self: &Rc<Self>) -> PoolChunk {
        std::future::poll_fn(|cx| match self.try_take() {
            Some(chunk) => Poll::Ready(chunk),
            None => {
                self.waiters.borrow_mut().push_back(cx.waker().clone());
                Poll::Pending
            }
        })
        .await
    }

    pub fn try_take(self: &Rc<Self>) -> Option<PoolChunk> {
        let (addr, buf_index) = self.free.borrow_mut().pop()?;
        Some(PoolChunk {
            pool: Rc::clone(self),
            addr,
            buf_index,
        })
    }
}

/// One chunk, owned exclusively until dropped.
pub struct PoolChunk {
    pool: Rc<StreamPool>,
    addr: usize,
    buf_index: Option<u16>,
}

impl PoolChunk {
    pub fn as_ptr(&self) -> *const u8 {
        self.addr as *const u8
    }

    pub fn len(&self) -> usize {
        self.pool.chunk_bytes
    }

    pub fn is_empty(&self) -> bool {
        false
    }

    /// The chunk's fixed buffer (a registered pool).
    pub fn buf_index(&self) -> u16 {
        self.buf_index
            .expect("fixed-buffer I/O on a chunk of an unregistered pool")
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the pool's contract: the chunk is mapped and, while this value lives, ours.
        unsafe { std::slice::from_raw_parts(self.addr as *const u8, self.len()) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.addr as *mut u8, self.len()) }
    }
}

impl Drop for PoolChunk {
    fn drop(&mut self) {
        self.pool
            .free
            .borrow_mut()
            .push((self.addr, self.buf_index));
        if let Some(waker) = self.pool.waiters.borrow_mut().pop_front() {
            waker.wake();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_are_exclusive_and_come_back() {
        let mut backing = crate::sys::AlignedBuf::zeroed(4 << 12, 4 << 12);
        let start = backing.as_mut_slice().as_mut_ptr() as usize;
        // SAFETY: the buffer is ours, aligned, and outlives the pool in this test.
        let pool = unsafe { StreamPool::new(&[(start, 4 << 12)], 1 << 12, None) };
        let mut chunks: Vec<PoolChunk> = (0..4).map(|_| pool.try_take().unwrap()).collect();
        assert!(pool.try_take().is_none());
        let mut addrs: Vec<usize> = chunks.iter().map(|c| c.as_ptr() as usize).collect();
        addrs.sort();
        addrs.dedup();
        assert_eq!(addrs.len(), 4, "no chunk handed out twice");
        assert_eq!(addrs[0], start, "lowest address first");
        chunks[1].as_mut_slice().fill(7);
        assert!(chunks[1].as_slice().iter().all(|&b| b == 7));
        chunks.pop();
        assert_eq!(pool.counts(), (4, 1));
        drop(chunks);
        assert_eq!(pool.counts(), (4, 4));
    }
}
