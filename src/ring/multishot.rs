//! Receives armed once per connection: a multishot `RECV` (or `RECVMSG`, to bring the
//! kernel's receive timestamps) completes into buffers the shard provides through a buffer
//! ring, each arrival one completion, with no entry submitted per receive. The ring copies
//! each arrival into its connection's [`Inbox`] as it reaps it and hands the buffer straight
//! back, so the buffers are never held by a connection that is not reading.
//!
//! - **Into the reader's buffer**: a connection waiting for bytes lends the inbox its read
//!   buffer, and an arrival is copied there directly; bytes that find no waiting reader (or
//!   more than its buffer holds) wait in the inbox's spill and are copied at the next read.
//!   An idle connection lends none: its arrival goes into a free buffer of the shard's cache
//!   ([`crate::buffer_cache`]) when one is kept, else it waits in the spill, at its own size,
//!   and the connection takes a buffer when it runs. So a burst that wakes thousands of idle
//!   connections at once takes at most the cache's free buffers, and an idle connection holds
//!   neither buffer nor spill.
//! - **Bounded**: a connection whose spill passes [`SPILL_HIGH_BYTES`] (its client sends
//!   while it writes) has its receive cancelled: the socket buffer fills and TCP holds the
//!   client back, as with one-shot receives. The next read that finds the spill empty arms
//!   it again. What arrives before the cancel takes effect is bounded by the provided
//!   buffers (each arrival holds one until a reap): [`SPILL_OVERSHOOT_MAX_BYTES`], shared
//!   by all of a shard's connections.
//! - **Out of buffers**: a receive that finds every provided buffer taken ends with
//!   `ENOBUFS`; the next read arms it again (the reap has given every buffer back by then).
//!
//! This module touches memory the kernel writes (the buffer ring), so it holds `unsafe`;
//! each block says why it is sound.

use std::cell::RefCell;
use std::io;
use std::sync::atomic::{AtomicU16, Ordering};
use std::task::Waker;

use io_uring::{types, IoUring};

use crate::buffer_cache::BufferCache;

/// Buffers a shard provides, and the bytes of each. Each completion takes one, and the reap
/// gives it back, so they bound the arrivals between two reaps, not the connections.
pub const PROVIDED_BUFFERS: u16 = 512;
pub const PROVIDED_BUFFER_BYTES: usize = 8 << 10;
/// The buffer group the receives take from (one group per ring).
pub const BUFFER_GROUP: u16 = 0;
/// Received bytes a connection may hold unread before its receive is paused.
pub const SPILL_HIGH_BYTES: usize = 64 << 10;
/// Most bytes that can still arrive once a spill has passed its bound: the rest of the reap
/// that saw it pass, and one more reap's before the cancel reaches the kernel.
pub const SPILL_OVERSHOOT_MAX_BYTES: usize = 2 * PROVIDED_BUFFERS as usize * PROVIDED_BUFFER_BYTES;
/// Control space of a stamped receive: one `SCM_TIMESTAMPNS` message (its 16-byte header
/// and 16-byte `timespec`), with room to spare.
const CONTROL_BYTES: u32 = 64;

/// One entry of a buffer ring, as the kernel lays it out (`struct io_uring_buf`). The ring's
/// tail overlays the first entry's `resv` (`struct io_uring_buf_ring`).
#[repr(C)]
struct RawBufEntry {
    addr: u64,
    len: u32,
    bid: u16,
    resv: u16,
}

/// The buffer ring one shard's receives complete into, and the memory it hands out. Both are
/// anonymous mappings reached only through raw pointers: the kernel writes the buffers and
/// reads the entries while this owns them, so no Rust reference spans either, except a shared
/// one to the bytes of one buffer the kernel has completed into and not been given back.
pub struct ProvidedBuffers {
    /// `PROVIDED_BUFFERS` entries the kernel reads (page-aligned).
    entries: *mut RawBufEntry,
    /// The next tail to publish.
    tail: u16,
    /// The buffers, `PROVIDED_BUFFER_BYTES` each.
    memory: *mut u8,
    /// The header every stamped receive is armed with (no name, [`CONTROL_BYTES`] of control
    /// space): one per ring, not per connection. Every completion lays its buffer out by it,
    /// and it lives as long as the buffers, so as long as any receive.
    stamped_header: Box<libc::msghdr>,
}

const ENTRIES_BYTES: usize = PROVIDED_BUFFERS as usize * std::mem::size_of::<RawBufEntry>();
const MEMORY_BYTES: usize = PROVIDED_BUFFERS as usize * PROVIDED_BUFFER_BYTES;

/// A private anonymous mapping of `bytes` (zeroed, page-aligned).
fn map_anonymous(bytes: usize) -> io::Result<*mut u8> {
    // SAFETY: an anonymous private mapping; the result is checked.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(base.cast())
}

/// Whether the running kernel has multishot receives (`IORING_RECV_MULTISHOT`, Linux 6.0).
/// Buffer rings came a release earlier, so registering one proves nothing: on 5.19 every
/// multishot receive would fail with `EINVAL`.
fn kernel_has_multishot_receives() -> Result<(), String> {
    let release = crate::sys::kernel_release().ok_or("uname failed")?;
    if crate::sys::kernel_version(&release) >= (6, 0) {
        Ok(())
    } else {
        Err(format!(
            "multishot receives need Linux 6.0; this kernel is {release}"
        ))
    }
}

impl ProvidedBuffers {
    /// Maps the buffer ring and its buffers, registers the ring with `uring` as
    /// [`BUFFER_GROUP`] and provides every buffer. Fails, with the reason, on a kernel
    /// without multishot receives (before 6.0) or when the kernel refuses the ring.
    pub fn register(uring: &IoUring) -> Result<ProvidedBuffers, String> {
        kernel_has_multishot_receives()?;
        let mapped = |bytes| map_anonymous(bytes).map_err(|err| format!("mmap: {err}"));
        // SAFETY: a zeroed msghdr is a valid empty one.
        let mut stamped_header: Box<libc::msghdr> = Box::new(unsafe { std::mem::zeroed() });
        stamped_header.msg_controllen = CONTROL_BYTES as _;
        let mut provided = ProvidedBuffers {
            entries: std::ptr::null_mut(),
            tail: 0,
            memory: std::ptr::null_mut(),
            stamped_header,
        };
        // Unmapped by `Drop` if anything below fails.
        provided.entries = mapped(ENTRIES_BYTES)?.cast();
        provided.memory = mapped(MEMORY_BYTES)?;
        // SAFETY: the entries' mapping is page-aligned, zeroed and `PROVIDED_BUFFERS` entries
        // long; it and the buffers stay until `Drop`, which the ring runs only once no receive
        // is in flight (it leaks them otherwise).
        unsafe {
            uring.submitter().register_buf_ring_with_flags(
                provided.entries as u64,
                PROVIDED_BUFFERS,
                BUFFER_GROUP,
                0,
            )
        }
        .map_err(|err| format!("registering a provided-buffer ring: {err}"))?;
        for id in 0..PROVIDED_BUFFERS {
            provided.give_back(id);
        }
        Ok(provided)
    }

    /// The `len` bytes a completion put in buffer `id`. Valid until the buffer is given back.
    /// The header stamped receives are armed with.
    pub(super) fn stamped_header(&self) -> &libc::msghdr {
        &self.stamped_header
    }

    pub fn bytes(&self, id: u16, len: usize) -> &[u8] {
        assert!(id < PROVIDED_BUFFERS && len <= PROVIDED_BUFFER_BYTES);
        // SAFETY: buffer `id` lies inside the mapping; the kernel completed into it and does
        // not touch it again until `give_back(id)`, which takes `&mut self` and so ends this
        // borrow first.
        unsafe {
            std::slice::from_raw_parts(self.memory.add(id as usize * PROVIDED_BUFFER_BYTES), len)
        }
    }

    /// Hands buffer `id` back to the kernel.
    pub fn give_back(&mut self, id: u16) {
        assert!(id < PROVIDED_BUFFERS, "a provided buffer's id");
        let mask = PROVIDED_BUFFERS - 1;
        // SAFETY (of the pointer arithmetic): buffer `id` lies inside the mapping.
        let addr = self
            .memory
            .wrapping_add(id as usize * PROVIDED_BUFFER_BYTES) as u64;
        // SAFETY: the masked tail indexes an entry inside the mapping, one the kernel has
        // consumed (as many entries as buffers) and reads again only once the tail published
        // below covers it. Its fields are written through raw pointers: the kernel may read
        // the tail, which overlays the first entry's `resv`, at any time.
        unsafe {
            let entry = self.entries.add((self.tail & mask) as usize);
            std::ptr::addr_of_mut!((*entry).addr).write(addr);
            std::ptr::addr_of_mut!((*entry).len).write(PROVIDED_BUFFER_BYTES as u32);
            std::ptr::addr_of_mut!((*entry).bid).write(id);
        }
        self.tail = self.tail.wrapping_add(1);
        // SAFETY: the tail is the first entry's `resv`, in the live mapping and 2-byte
        // aligned; the kernel reads it concurrently, so it is published with a release store.
        unsafe {
            let tail = std::ptr::addr_of_mut!((*self.entries).resv) as *const AtomicU16;
            (*tail).store(self.tail, Ordering::Release);
        }
    }
}

impl Drop for ProvidedBuffers {
    fn drop(&mut self) {
        // SAFETY: our own mappings (null if never made); the ring that used them is gone or
        // holds no receive (the ring leaks them otherwise).
        unsafe {
            if !self.entries.is_null() {
                libc::munmap(self.entries.cast(), ENTRIES_BYTES);
            }
            if !self.memory.is_null() {
                libc::munmap(self.memory.cast(), MEMORY_BYTES);
            }
        }
    }
}

/// What a connection's multishot receive brought and the connection has not read yet, and
/// the state of that receive.
pub struct Inbox {
    state: RefCell<InboxState>,
    /// Whether the receive brings timestamps (`RECVMSG` with the ring's stamped header).
    stamped: bool,
    /// Where a reader that lent no buffer (an idle connection) gets one when bytes come.
    read_buffers: std::rc::Rc<BufferCache>,
}

#[derive(Default)]
struct InboxState {
    /// Received bytes not read yet: `spill[spill_at..]`.
    spill: Vec<u8>,
    spill_at: usize,
    /// The reader's buffer while it waits: the buffer, where its bytes go, how many came.
    target: Option<(Vec<u8>, usize, usize)>,
    /// When the kernel received the latest bytes (`CLOCK_REALTIME` ns), if stamped.
    received_ns: Option<u64>,
    /// The armed receive's user data (`None`: not armed), and whether a cancel was asked.
    armed: Option<u64>,
    cancelling: bool,
    /// The stream's end: 0 (the peer closed, or the socket was shut down) or `-errno`.
    ended: Option<i32>,
    /// The reader waits lending no buffer (an idle connection, [`Inbox::wait_idle`]).
    idle_reader: bool,
    waker: Option<Waker>,
}

impl Inbox {
    /// An inbox for a receive that brings timestamps (`RECVMSG`) or not (`RECV`); a reader
    /// that lends an empty buffer gets one from `read_buffers` when bytes come.
    pub fn new(stamped: bool, read_buffers: std::rc::Rc<BufferCache>) -> Inbox {
        Inbox {
            state: RefCell::new(InboxState::default()),
            stamped,
            read_buffers,
        }
    }

    /// Whether the receive is armed with the ring's stamped header (else a plain `RECV`).
    pub(super) fn stamped(&self) -> bool {
        self.stamped
    }

    /// Splits a completed buffer into its payload and receive timestamp; `msg` is the header
    /// a stamped receive was armed with.
    pub(super) fn parse<'a>(&self, raw: &'a [u8], msg: &libc::msghdr) -> (&'a [u8], Option<u64>) {
        if !self.stamped {
            return (raw, None);
        }
        match types::RecvMsgOut::parse(raw, msg) {
            Ok(out) => {
                // The payload ends the buffer (after the header, name and control space).
                let len = out.payload_data().len();
                (
                    &raw[raw.len() - len..],
                    control_timestamp(out.control_data()),
                )
            }
            // The kernel lays every buffer out by the header; a short one carries nothing.
            Err(()) => (&[], None),
        }
    }

    /// Takes an arrival: into the waiting reader's buffer while nothing is spilled before
    /// it, the rest into the spill. Returns the waker to wake.
    pub(super) fn deliver(&self, payload: &[u8], received_ns: Option<u64>) -> Option<Waker> {
        let mut s = self.state.borrow_mut();
        if received_ns.is_some() {
            s.received_ns = received_ns;
        }
        let mut rest = payload;
        if s.spill_at == s.spill.len() && s.target.is_none() && s.idle_reader {
            // An idle reader's arrival: into a free read buffer, so the common case copies once
            // and allocates nothing; with none free it spills.
            if let Some(buf) = self.read_buffers.take_free() {
                s.target = Some((buf, 0, 0));
            }
        }
        if s.spill_at == s.spill.len() {
            if let Some((buf, at, got)) = s.target.as_mut() {
                let room = &mut buf[*at + *got..];
                let n = room.len().min(rest.len());
                room[..n].copy_from_slice(&rest[..n]);
                *got += n;
                rest = &rest[n..];
            }
        }
        if !rest.is_empty() {
            if s.spill_at == s.spill.len() {
                s.spill.clear();
                s.spill_at = 0;
            }
            s.spill.extend_from_slice(rest);
        }
        s.waker.take()
    }

    /// The receive with `user_data` completed for the last time with `result` (its payload's
    /// bytes, or `-errno`). Returns the waker to wake.
    pub(super) fn disarmed(&self, user_data: u64, result: i32) -> Option<Waker> {
        let mut s = self.state.borrow_mut();
        debug_assert_eq!(s.armed, Some(user_data), "the inbox's own receive");
        s.armed = None;
        s.cancelling = false;
        // Out of buffers, cancelled (paused or ending), or stopped with data: armed again at
        // the next read. Anything else ends the stream.
        if result == 0 || (result < 0 && result != -libc::ENOBUFS && result != -libc::ECANCELED) {
            s.ended.get_or_insert(result);
        }
        s.waker.take()
    }

    /// The armed receive to cancel because the spill passed its bound, if not asked already.
    pub(super) fn over_high_water(&self) -> Option<u64> {
        let mut s = self.state.borrow_mut();
        let unread = s.spill.len() - s.spill_at;
        match s.armed {
            Some(user_data) if unread > SPILL_HIGH_BYTES && !s.cancelling => {
                s.cancelling = true;
                Some(user_data)
            }
            _ => None,
        }
    }

    /// The armed receive to cancel (the connection ends or reads elsewhere), if not asked.
    pub(super) fn to_cancel(&self) -> Option<u64> {
        let mut s = self.state.borrow_mut();
        match s.armed {
            Some(user_data) if !s.cancelling => {
                s.cancelling = true;
                Some(user_data)
            }
            _ => None,
        }
    }

    pub(super) fn set_armed(&self, user_data: u64) {
        let mut s = self.state.borrow_mut();
        debug_assert!(s.armed.is_none(), "one receive per inbox");
        s.armed = Some(user_data);
    }

    /// Whether a receive is armed (a cancelled one counts until its last completion).
    pub fn armed(&self) -> bool {
        self.state.borrow().armed.is_some()
    }

    /// When the kernel received the latest bytes taken (`CLOCK_REALTIME` ns), if stamped.
    pub fn received_ns(&self) -> Option<u64> {
        self.state.borrow().received_ns
    }

    /// Received bytes waiting in the spill.
    pub fn spilled_bytes(&self) -> usize {
        let s = self.state.borrow();
        s.spill.len() - s.spill_at
    }

    /// Copies spilled bytes into `into`; 0 when none wait.
    pub fn take_spilled(&self, into: &mut [u8]) -> usize {
        let mut s = self.state.borrow_mut();
        let s = &mut *s;
        let unread = &s.spill[s.spill_at..];
        let n = unread.len().min(into.len());
        into[..n].copy_from_slice(&unread[..n]);
        s.spill_at += n;
        if s.spill_at == s.spill.len() && s.spill.capacity() > SPILL_HIGH_BYTES {
            // A burst's spill is not kept for the connection's life.
            s.spill = Vec::new();
            s.spill_at = 0;
        }
        n
    }

    /// What an idle reader finds once [`Inbox::ready`], in `buf` (empty until now): the
    /// buffer an arrival took from the cache, with any spill after it; or a buffer taken now
    /// for what spilled, the spill then freed, so the connection holds none once idle again;
    /// or how the stream ended.
    pub fn take_received(&self, buf: &mut Vec<u8>) -> io::Result<usize> {
        debug_assert!(buf.is_empty(), "an idle reader lends no buffer");
        let idle_fill = {
            let mut s = self.state.borrow_mut();
            s.idle_reader = false;
            s.target.take()
        };
        // Only bytes before any spill go into the arrival's buffer: the spill follows them.
        if let Some((filled, _, got)) = idle_fill {
            *buf = filled;
            let more = self.take_spilled(&mut buf[got..]);
            return Ok(got + more);
        }
        if self.spilled_bytes() == 0 {
            return self.ended().unwrap_or(Ok(0));
        }
        *buf = self.read_buffers.take();
        let n = self.take_spilled(buf);
        let mut s = self.state.borrow_mut();
        if s.spill_at == s.spill.len() {
            s.spill = Vec::new();
            s.spill_at = 0;
        }
        Ok(n)
    }

    /// Whether a read would find something now: spilled bytes, bytes in the buffer an idle
    /// reader's arrival took, or the stream's end.
    pub fn ready(&self) -> bool {
        self.spilled_bytes() > 0 || self.filled() || self.ended().is_some()
    }

    /// The reader waits for its next bytes lending no buffer: an arrival may take a free one
    /// of the cache ([`Inbox::take_received`] hands it over).
    pub fn wait_idle(&self) {
        self.state.borrow_mut().idle_reader = true;
    }

    /// How the stream ended, once no spilled bytes are left before the end.
    pub fn ended(&self) -> Option<io::Result<usize>> {
        let s = self.state.borrow();
        if s.spill_at < s.spill.len() {
            return None;
        }
        s.ended.map(|result| match result {
            0 => Ok(0),
            e => Err(io::Error::from_raw_os_error(-e)),
        })
    }

    /// Lends the reader's buffer, to be filled from `at` (see [`Inbox::reclaim`]).
    pub fn lend(&self, buf: Vec<u8>, at: usize) {
        let mut s = self.state.borrow_mut();
        debug_assert!(s.target.is_none(), "one reader at a time");
        s.target = Some((buf, at, 0));
    }

    /// Whether the lent buffer has received bytes.
    pub fn filled(&self) -> bool {
        self.state
            .borrow()
            .target
            .as_ref()
            .is_some_and(|&(_, _, got)| got > 0)
    }

    /// Takes the lent buffer back, with how many bytes came into it.
    pub fn reclaim(&self) -> Option<(Vec<u8>, usize)> {
        let mut s = self.state.borrow_mut();
        s.target.take().map(|(buf, _, got)| (buf, got))
    }

    /// Who to wake at the next arrival or end.
    pub fn wait(&self, waker: &Waker) {
        let mut s = self.state.borrow_mut();
        if !s.waker.as_ref().is_some_and(|w| w.will_wake(waker)) {
            s.waker = Some(waker.clone());
        }
    }
}

/// The `SCM_TIMESTAMPNS` time in a receive's control messages (ns since the epoch).
fn control_timestamp(control: &[u8]) -> Option<u64> {
    if control.is_empty() || control.len() > CONTROL_BYTES as usize {
        return None;
    }
    // Copied out first: in the provided buffer the messages need not be aligned for reading.
    let mut aligned = [0u64; CONTROL_BYTES as usize / 8];
    // SAFETY: `aligned` has room for `control` (checked above); the two do not overlap.
    unsafe {
        std::ptr::copy_nonoverlapping(
            control.as_ptr(),
            aligned.as_mut_ptr().cast::<u8>(),
            control.len(),
        )
    };
    // SAFETY: a zeroed msghdr is a valid empty one; it only names `aligned`, which the CMSG
    // macros read within `msg_controllen`.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_control = aligned.as_mut_ptr().cast();
    msg.msg_controllen = control.len() as _;
    super::timestamp_in(&msg)
}
