//! The memory an operation owns until its last completion: heap bytes, lent bytes, pool
//! chunks, a header with a lent value, or a receive's buffer with its message header.

use super::*;

/// The memory of one operation, owned by the ring until the operation's last completion.
pub enum Buf {
    /// Heap bytes, not registered: sent with `SEND`.
    Owned(Vec<u8>),
    /// Bytes lent by their owner (shared by the pieces of a send that went out in parts).
    Lent(Rc<Lent>),
    /// A chunk of the shard's streaming pool (registered).
    Chunk(PoolChunk),
    /// A reply's header and the lent value after it, sent as one `SENDMSG`.
    Pair(Box<Pair>),
    /// A receive's buffer behind a `RECVMSG` that brings the kernel's receive timestamp.
    Stamped(Box<Stamped>),
    /// A receive's buffer, filled from `at` (plain `RECV`).
    Received { buf: Vec<u8>, at: usize },
}

/// A receive's buffer with the message header, iovec and control space of a `RECVMSG` that
/// brings back the kernel's receive timestamp (`SO_TIMESTAMPNS` on the socket). A connection
/// keeps one and reuses it, so a receive allocates nothing; its buffer is moved in for the
/// receive and out after it.
pub struct Stamped {
    pub buf: Vec<u8>,
    /// Where in `buf` the receive puts its bytes.
    pub(super) at: usize,
    pub(super) iov: libc::iovec,
    pub(super) msg: libc::msghdr,
    /// Room for one `SCM_TIMESTAMPNS` control message (`u64`s for its alignment).
    pub(super) control: [u64; 8],
}

impl Stamped {
    pub fn new() -> Box<Stamped> {
        Box::new(Stamped {
            buf: Vec::new(),
            at: 0,
            iov: libc::iovec {
                iov_base: std::ptr::null_mut(),
                iov_len: 0,
            },
            // SAFETY: a zeroed msghdr is a valid empty one.
            msg: unsafe { std::mem::zeroed() },
            control: [0; 8],
        })
    }

    /// Points the message at `buf[at..]` and the control space (the kernel rewrites the
    /// control length at every receive).
    pub(super) fn aim(&mut self, at: usize) {
        self.at = at;
        // SAFETY (of the pointer arithmetic): the caller checked `at < len`.
        self.iov = libc::iovec {
            iov_base: self.buf.as_mut_ptr().wrapping_add(at) as *mut _,
            iov_len: self.buf.len() - at,
        };
        // SAFETY: a zeroed msghdr is a valid empty one.
        self.msg = unsafe { std::mem::zeroed() };
        self.msg.msg_iov = &mut self.iov;
        self.msg.msg_iovlen = 1;
        self.msg.msg_control = self.control.as_mut_ptr() as *mut _;
        self.msg.msg_controllen = std::mem::size_of_val(&self.control);
    }

    /// When the kernel received the last bytes of the completed receive (`CLOCK_REALTIME`,
    /// nanoseconds since the epoch), if its control messages carried the timestamp.
    pub fn received_ns(&self) -> Option<u64> {
        timestamp_in(&self.msg)
    }
}

/// The `SCM_TIMESTAMPNS` time among `msg`'s control messages (ns since the epoch), if any.
/// `msg` names control space that is aligned and `msg_controllen` bytes long.
pub(super) fn timestamp_in(msg: &libc::msghdr) -> Option<u64> {
    if msg.msg_controllen == 0 {
        return None;
    }
    // SAFETY: the caller's header names aligned control space of `msg_controllen` bytes (the
    // kernel set that length to what it wrote there); the CMSG macros stay within it.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_TIMESTAMPNS {
                let ts = std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const libc::timespec);
                return u64::try_from(ts.tv_sec)
                    .ok()
                    .map(|s| s * 1_000_000_000 + ts.tv_nsec as u64);
            }
            c = libc::CMSG_NXTHDR(msg, c);
        }
    }
    None
}

/// A header and lent bytes behind one `SENDMSG`: the message header and its iovecs (the
/// header, then the lent bytes' one or two runs) live here, beside the memory they name, until
/// the operation's last completion.
pub struct Pair {
    pub(super) head: Vec<u8>,
    pub(super) tail: Lent,
    pub(super) iov: [libc::iovec; 3],
    pub(super) msg: libc::msghdr,
}

impl Pair {
    /// Points the message at what is left after the first `sent` bytes of head then tail.
    pub(super) fn aim(&mut self, sent: usize) {
        let [first, second] = self.tail.runs();
        let mut skip = sent;
        let mut count = 0;
        for (ptr, len) in [(self.head.as_ptr(), self.head.len()), first, second] {
            let skipped = skip.min(len);
            skip -= skipped;
            if len > skipped {
                // SAFETY (of the pointer arithmetic): `skipped < len` of its run.
                self.iov[count] = libc::iovec {
                    iov_base: ptr.wrapping_add(skipped) as *mut _,
                    iov_len: len - skipped,
                };
                count += 1;
            }
        }
        // SAFETY: a zeroed msghdr is a valid empty one.
        self.msg = unsafe { std::mem::zeroed() };
        self.msg.msg_iov = self.iov.as_mut_ptr();
        self.msg.msg_iovlen = count;
    }
}

impl Buf {
    pub(super) fn ptr(&self) -> *const u8 {
        match self {
            Buf::Owned(v) => v.as_ptr(),
            Buf::Lent(l) => l.first_addr(),
            Buf::Chunk(c) => c.as_ptr(),
            Buf::Pair(p) => p.head.as_ptr(),
            Buf::Stamped(r) => r.buf.as_ptr(),
            Buf::Received { buf, .. } => buf.as_ptr(),
        }
    }

    /// The same memory as a shareable lent buffer: freed (or given back to its pool) when the
    /// last holder drops it.
    pub(super) fn into_lent(self) -> Rc<Lent> {
        match self {
            Buf::Lent(l) => l,
            Buf::Owned(v) => Rc::new(Lent::owned(v)),
            Buf::Chunk(c) => {
                let len = c.len();
                Rc::new(Lent::from_chunk(c, 0, len))
            }
            Buf::Pair(p) => Rc::new(p.tail),
            Buf::Stamped(r) => Rc::new(Lent::owned(r.buf)),
            Buf::Received { buf, .. } => Rc::new(Lent::owned(buf)),
        }
    }

    /// The `len` bytes a completed receive into this buffer brought.
    pub(super) fn received(&self, len: usize) -> Option<&[u8]> {
        let (buf, at) = match self {
            Buf::Stamped(r) => (&r.buf, r.at),
            Buf::Received { buf, at } => (buf, *at),
            _ => return None,
        };
        buf.get(at..at.checked_add(len)?)
    }
}
