//! Memory lent to an I/O operation by its owner (an arena head, a segment's mapping, a pool
//! chunk): the operation reads it in place, and the owner's release runs when the last user
//! is done. It sits below `arena`, `segment` and `ring`, which lend and send it.

/// Memory lent to an operation by its owner: valid until it is dropped, when the owner's
/// release runs (an arena head's unpin, say). One run of bytes, or two sent one after the
/// other (a fixed slot's value that wraps around the slot: `arena::slot_layout`).
pub struct Lent {
    /// (address, length) of each run, in order; the second is empty unless the bytes wrap.
    runs: [(*const u8, usize); 2],
    release: Option<Box<dyn FnOnce()>>,
}

impl Lent {
    /// # Safety
    ///
    /// `ptr..ptr + len` must stay mapped and must not be written or reused until `release`
    /// has run (it runs when the last operation using these bytes is done).
    pub unsafe fn new(ptr: *const u8, len: usize, release: Box<dyn FnOnce()>) -> Lent {
        Lent {
            runs: [(ptr, len), (ptr, 0)],
            release: Some(release),
        }
    }

    /// # Safety
    ///
    /// As [`Lent::new`], for each run.
    pub unsafe fn from_runs(runs: [(*const u8, usize); 2], release: Box<dyn FnOnce()>) -> Lent {
        Lent {
            runs,
            release: Some(release),
        }
    }

    pub fn len(&self) -> usize {
        self.runs[0].1 + self.runs[1].1
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// (address, length) of each run, in order.
    pub fn runs(&self) -> [(*const u8, usize); 2] {
        self.runs
    }

    /// Where the bytes start.
    pub fn first_addr(&self) -> *const u8 {
        self.runs[0].0
    }

    /// The runs' bytes, in order.
    pub fn slices(&self) -> [&[u8]; 2] {
        self.runs.map(|(ptr, len)| {
            // SAFETY: the contract of `new` and `from_runs`: each run's bytes stay mapped and
            // unchanged while this lives.
            unsafe { std::slice::from_raw_parts(ptr, len) }
        })
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        if let Some(release) = self.release.take() {
            release();
        }
    }
}
