//! One io_uring ring per shard, beside glommio's own (DESIGN.md, "Spike notes"): glommio
//! schedules, but it cannot register our memory or send zero-copy. This ring holds the arena as
//! fixed buffers and runs the data path's socket sends and segment reads and writes.
//!
//! - **Driving**: entries are queued, not submitted one by one: the first entry of a pass
//!   schedules a flush task behind every task already runnable, so all the entries of one
//!   executor pass (every connection's replies, and one-shot receives) go to the kernel in one
//!   `io_uring_enter`, with the ring's eventfd notifications off for its duration, and are
//!   reaped right after it. Completions that come later (a receive's data) signal the eventfd,
//!   which a driver task reads through glommio's own ring (so glommio sleeps until then), and
//!   the driver reaps.
//! - **Bounded**: at most [`RING_IN_FLIGHT_MAX`] operations other than receives are in flight
//!   (a zero-copy send counts until its notification); a submission beyond that waits for
//!   room. Receives are not bounded: each connection has at most one, and an idle connection
//!   holds it for as long as it is idle, so counting them let 256 idle connections take every
//!   slot and stall the shard. The completion queue has room for every completion the bounded
//!   operations can post (two for a zero-copy send, plus a cancellation each) and two for each
//!   of `--max-connections` receives (up to the kernel's limit), and an overflow is still
//!   detected and flushed (`IORING_FEAT_NODROP`), never waited on.
//! - **Memory safety**: every operation owns the memory it uses ([`Buf`]) until its *last*
//!   completion: dropping the future that waits for it (a timeout, a closing connection)
//!   cancels the operation but keeps the memory alive until the kernel is done with it.
//! - **Sockets**: [`Ring::quiesce`] waits until no operation on a descriptor is left, so a
//!   connection is closed only after everything on it has completed. A connection's socket is
//!   registered in the ring's file table while it is served ([`Ring::register_fd`]), so its
//!   operations skip the kernel's per-operation descriptor lookup and reference count; a slot
//!   goes to another socket only once nothing that names it is in flight ([`files`]).
//!
//! This is one of the modules that may hold `unsafe` (it touches a ring); each block says why
//! it is sound.

mod buf;
pub mod buffers;
pub mod doorbell;
pub mod files;
pub mod multishot;
pub mod pool;
mod socket;

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

use io_uring::{cqueue, opcode, squeue, types, IoUring};

use crate::lent::Lent;
use buf::timestamp_in;
pub use buf::{Buf, Pair, Stamped};
pub use buffers::FixedBuffers;
pub use doorbell::Doorbell;
use files::FileTable;
use multishot::{Inbox, ProvidedBuffers, BUFFER_GROUP};
pub use pool::{PoolChunk, StreamPool};

/// Most operations one shard's ring has in flight.
pub const RING_IN_FLIGHT_MAX: usize = 256;
/// Most slots of a ring's registered-file table (one per connection of the shard; a
/// connection beyond them runs on its plain descriptor).
const FILE_SLOTS_MAX: usize = 65_536;

/// The kernel's largest completion queue (`IORING_MAX_CQ_ENTRIES`).
const CQ_ENTRIES_MAX: usize = 65_536;
/// `IORING_SEND_ZC_REPORT_USAGE`: the notification says whether the kernel copied anyway.
const SEND_ZC_REPORT_USAGE: u16 = 1 << 3;
/// `IORING_NOTIF_USAGE_ZC_COPIED`, in a notification's result.
const NOTIF_USAGE_ZC_COPIED: u32 = 1 << 31;
/// `IORING_ENTER_GETEVENTS` (the crate keeps its constants private).
const ENTER_GETEVENTS: u32 = 1;
/// `IORING_ENTER_NO_IOWAIT` (kernel 6.15+, `IORING_FEAT_NO_IOWAIT`): the wait is idle time, not
/// I/O wait, in the kernel's accounting.
const ENTER_NO_IOWAIT: u32 = 1 << 7;
/// The user data of cancellation requests: their completions are only counted.
const CANCEL_USER_DATA: u64 = u64::MAX;
/// The user data of the polls of glommio's rings that a shard sleeping in this ring keeps
/// armed ([`Ring::spawn_driver`]).
const GLOMMIO_POLL_USER_DATA: u64 = u64::MAX - 1;

/// What an operation does, for the counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpKind {
    Send,
    SendZc,
    ReadFixed,
    WriteFixed,
    Recv,
}

impl OpKind {
    /// A read or write of a file segment (the rest are socket operations).
    fn is_file_io(self) -> bool {
        matches!(self, OpKind::ReadFixed | OpKind::WriteFixed)
    }

    pub const ALL: [OpKind; 5] = [
        OpKind::Send,
        OpKind::SendZc,
        OpKind::ReadFixed,
        OpKind::WriteFixed,
        OpKind::Recv,
    ];

    pub fn name(self) -> &'static str {
        match self {
            OpKind::Send => "send",
            OpKind::SendZc => "send_zc",
            OpKind::ReadFixed => "read_fixed",
            OpKind::WriteFixed => "write_fixed",
            OpKind::Recv => "recv",
        }
    }
}

/// One ring's counters (STAT `io`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RingStats {
    /// Operations completed, by [`OpKind`] (index as in `OpKind::ALL`).
    pub ops: [u64; 5],
    /// Bytes moved, by kind.
    pub bytes: [u64; 5],
    /// Operations that completed with an error (a cancellation included).
    pub errors: u64,
    pub zc_notifications: u64,
    /// Zero-copy notifications saying the kernel copied the bytes after all (always, on
    /// loopback).
    pub zc_copied: u64,
    /// Lent sends that went out as plain `SEND` because the bytes sit on huge pages
    /// (zero-copy from huge pages stalls: docs/io.md).
    pub lent_sends_huge_pages: u64,
    /// Lent sends that went out as plain `SEND` because the connection's notifications said
    /// the kernel copies anyway (loopback, a device without scatter-gather).
    pub lent_sends_kernel_copies: u64,
    /// Lent sends that went out as plain `SEND` because the socket is no TCP socket (a unix
    /// socket's client): only TCP takes `SEND_ZC`.
    pub lent_sends_not_tcp: u64,
    pub in_flight: u64,
    pub in_flight_max: u64,
    /// Times a submission waited for room.
    pub full_waits: u64,
    /// Times the completion queue had overflowed (the kernel kept the completions; they were
    /// flushed).
    pub cq_overflows: u64,
    pub cancels: u64,
    /// Wake-ups for this ring: sleeps in it (`--ring-sleep on`), or eventfd wake-ups of its
    /// driver.
    pub wakeups: u64,
    /// `io_uring_enter` calls that submitted queued entries, and the entries they carried.
    pub submits: u64,
    pub entries_submitted: u64,
    /// `io_uring_enter` calls made only to run completions waiting for this thread.
    pub task_runs: u64,
    /// Sockets in the registered-file table now.
    pub files_registered: u64,
    /// Connections that found the registered-file table full (they use their descriptor).
    pub files_full: u64,
    /// Multishot receives armed (a connection's first read, and again after each pause or
    /// end below).
    pub receives_armed: u64,
    /// Multishot receives that ended because every provided buffer was taken.
    pub receives_out_of_buffers: u64,
    /// Multishot receives cancelled because their connection held too much unread.
    pub receives_paused: u64,
}

/// Zero-copy sends a connection probes before it trusts what their notifications say.
pub const ZC_PROBE_NOTIFICATIONS: u64 = 8;

/// What one connection's zero-copy notifications said: once most of the first
/// [`ZC_PROBE_NOTIFICATIONS`] report that the kernel copied anyway, the connection's lent
/// bytes go out with plain `SEND` instead (cheaper when a copy happens regardless: docs/io.md).
#[derive(Debug, Default)]
pub struct ZcReport {
    notifications: Cell<u64>,
    copied: Cell<u64>,
    /// The socket takes no `SEND_ZC` at all (only TCP sockets do).
    unsupported: bool,
}

impl ZcReport {
    /// For a socket that takes no zero-copy sends.
    pub fn unsupported() -> ZcReport {
        ZcReport {
            unsupported: true,
            ..ZcReport::default()
        }
    }

    pub fn kernel_copies(&self) -> bool {
        let n = self.notifications.get();
        n >= ZC_PROBE_NOTIFICATIONS && self.copied.get() * 2 > n
    }

    fn record(&self, copied: bool) {
        self.notifications.set(self.notifications.get() + 1);
        if copied {
            self.copied.set(self.copied.get() + 1);
        }
    }
}

/// Sees the bytes of each receive as a reap takes it, before the task it wakes runs. A shard's
/// look ahead starts loading what those requests will read, so the cache misses of every
/// connection one reap wakes overlap (`server::lookahead::ReceiveLookahead`).
pub trait ReceiveWatch {
    /// The bytes one receive brought. Must not use the ring.
    fn received(&self, bytes: &[u8]);
    /// The reap has taken every receive it saw (at least one); the tasks they wake run next.
    /// Must not use the ring.
    fn reaped(&self);
}

/// The executor's [`glommio::SleepHook`] while it sleeps in a [`Ring`].
struct SleepHere(Rc<Ring>);

impl glommio::SleepHook for SleepHere {
    fn poll(&self) -> usize {
        self.0.reap()
    }

    fn sleep(&self) -> usize {
        self.0.sleep()
    }
}

/// One operation's state, from submission to its last completion.
struct Slot {
    generation: u32,
    busy: bool,
    kind: OpKind,
    fd: RawFd,
    /// The registered-file slot the operation names instead of `fd`.
    file: Option<u32>,
    /// The operation's result (its first completion).
    result: Option<i32>,
    /// A notification is still to come (zero-copy sends).
    notification_due: bool,
    /// Nobody waits for the result any more: the slot frees itself at the last completion.
    detached: bool,
    waker: Option<Waker>,
    buf: Option<Buf>,
    /// Where a zero-copy send's notification is reported.
    report: Option<Rc<ZcReport>>,
    /// A multishot receive's connection: each completion's bytes go there.
    inbox: Option<Rc<Inbox>>,
}

impl Slot {
    fn empty() -> Slot {
        Slot {
            generation: 0,
            busy: false,
            kind: OpKind::Send,
            fd: -1,
            file: None,
            result: None,
            notification_due: false,
            detached: false,
            waker: None,
            buf: None,
            report: None,
            inbox: None,
        }
    }

    fn finished(&self) -> bool {
        self.result.is_some() && !self.notification_due
    }
}

fn user_data(index: usize, generation: u32) -> u64 {
    (u64::from(generation) << 32) | index as u64
}

/// Completions (user data, result, flags) and the wakers they wake.
type ReapScratch = (Vec<(u64, i32, u32)>, Vec<Waker>);

/// One shard's ring.
pub struct Ring {
    uring: RefCell<IoUring>,
    eventfd: OwnedFd,
    buffers: FixedBuffers,
    /// Registered memory on huge pages (hugetlb or transparent): never sent zero-copy.
    huge_page_ranges: Vec<(usize, usize)>,
    slots: RefCell<Vec<Slot>>,
    free: RefCell<Vec<usize>>,
    /// Submissions waiting for room.
    room_waiters: RefCell<VecDeque<Waker>>,
    /// Operations in flight other than receives (what [`RING_IN_FLIGHT_MAX`] bounds).
    bounded_in_flight: Cell<usize>,
    /// File reads and writes in flight: a sleep while one is out is I/O wait.
    file_ops_in_flight: Cell<usize>,
    /// Operations in flight per descriptor, and who waits for one to reach zero.
    /// (Indexed by descriptor: they are small and dense, and this is looked up per operation.)
    fd_ops: RefCell<Vec<usize>>,
    fd_waiters: RefCell<Vec<(RawFd, Waker)>>,
    /// The registered-file table's slots (`None`: the kernel refused one; plain descriptors).
    files: RefCell<Option<FileTable>>,
    file_slots: usize,
    /// What [`Ring::reap`] collects (completions, then wakers), kept for the next reap.
    reap_scratch: RefCell<ReapScratch>,
    stats: RefCell<RingStats>,
    stopping: Cell<bool>,
    /// Entries queued since the last submission, and whether a flush task is on its way.
    queued: Cell<u32>,
    /// Sleeping here: glommio's main and latency rings, and whether their polls are armed.
    glommio_rings: Cell<Option<(RawFd, RawFd)>>,
    glommio_polled: Cell<bool>,
    flush_scheduled: Cell<bool>,
    /// The flusher task, while it waits for a flush to be asked.
    flusher: RefCell<Option<Waker>>,
    /// Completions wait for this thread to run them, and the kernel says when some do
    /// (`IORING_SETUP_COOP_TASKRUN` with `TASKRUN_FLAG`): a reap that sees the flag enters.
    taskrun_flag: bool,
    /// The kernel can count a sleep as idle time (`IORING_FEAT_NO_IOWAIT`, 6.15+). It counts
    /// any wait with operations in flight as I/O wait, armed receives included, so an idle
    /// server showed its CPUs in iowait, not idle (`top`, `/proc/stat`).
    no_iowait: bool,
    /// When the last reap that took a receive ran (see [`Ring::reaped_at`]).
    reaped_at: Cell<ReapClock>,
    /// Shown the bytes of every receive reaped (see [`Ring::watch_receives`]).
    receive_watch: RefCell<Option<Box<dyn ReceiveWatch>>>,
    /// The buffers multishot receives complete into (see [`Ring::provide_receive_buffers`]).
    provided: RefCell<Option<ProvidedBuffers>>,
}

/// The clocks read once by a reap that took receives, for every task those receives wake: a
/// connection resumed by one reads its time here instead of the clock (a request read the
/// clock five times, 3-4 % of a small request's CPU).
#[derive(Clone, Copy, Debug)]
pub struct ReapClock {
    pub instant: std::time::Instant,
    /// `CLOCK_REALTIME`, nanoseconds since the Unix epoch (0 before it).
    pub unix_ns: u64,
}

impl ReapClock {
    pub fn now() -> ReapClock {
        ReapClock {
            instant: std::time::Instant::now(),
            unix_ns: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64),
        }
    }

    /// Seconds since the Unix epoch, as the protocol's expiry times count them.
    pub fn unix_s(&self) -> u32 {
        (self.unix_ns / 1_000_000_000) as u32
    }
}

impl Ring {
    /// Creates a ring and registers `buffers` with it. Fails (with the reason) when the kernel
    /// refuses the ring or the registration: the caller then runs on the plain path.
    /// `huge_page_ranges` are the parts of that memory on huge pages.
    pub fn new(
        buffers: FixedBuffers,
        huge_page_ranges: Vec<(usize, usize)>,
        receives_max: usize,
    ) -> Result<Rc<Ring>, String> {
        let entries = RING_IN_FLIGHT_MAX as u32;
        // Multishot receives post one completion per arrival, each taking a provided buffer
        // until the reap gives it back.
        let cq_entries = (RING_IN_FLIGHT_MAX * 4
            + receives_max.saturating_mul(2)
            + usize::from(multishot::PROVIDED_BUFFERS))
        .min(CQ_ENTRIES_MAX) as u32;
        // Completions run on this thread, at its next entry into the kernel, without an
        // interrupt (COOP_TASKRUN, one issuer): a receive completes in the shard's own context,
        // not inside the softirq that brought its data (where it would fight the sender for
        // the socket's lock), and the eventfd is signalled from there. Not DEFER_TASKRUN: its
        // eventfd signal for a receive came an RCU grace period late here (16 ms on kernel
        // 6.18.44), so a sleeping shard answered a lone client 60 times a second
        // (docs/io.md). Older kernels get the default.
        let cooperative = IoUring::builder()
            .setup_cqsize(cq_entries)
            .setup_single_issuer()
            .setup_coop_taskrun()
            .setup_taskrun_flag()
            .build(entries);
        let (uring, taskrun_flag) = match cooperative {
            Ok(uring) => (uring, true),
            Err(_) => (
                IoUring::builder()
                    .setup_cqsize(cq_entries)
                    .build(entries)
                    .map_err(|err| format!("io_uring_setup: {err}"))?,
                false,
            ),
        };
        let no_iowait = uring.params().is_feature_no_iowait();
        // SAFETY: a plain eventfd syscall; the descriptor is owned right away.
        let raw = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if raw < 0 {
            return Err(format!("eventfd: {}", io::Error::last_os_error()));
        }
        // SAFETY: `raw` is a fresh descriptor nobody else owns.
        let eventfd = unsafe { OwnedFd::from_raw_fd(raw) };
        uring
            .submitter()
            .register_eventfd(eventfd.as_raw_fd())
            .map_err(|err| format!("registering the eventfd: {err}"))?;
        // A sparse table (5.19+): slots are filled as connections arrive. The kernel refuses
        // a table larger than the open-files limit.
        let open_files_max =
            nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
                .map_or(1024, |(soft, _)| soft.min(usize::MAX as u64) as usize);
        let file_slots = receives_max.min(open_files_max).clamp(1, FILE_SLOTS_MAX);
        let files = match uring.submitter().register_files_sparse(file_slots as u32) {
            Ok(()) => Some(FileTable::new(file_slots as u32)),
            Err(err) => {
                tracing::info!(%err, "no registered-file table: sockets are named by descriptor");
                None
            }
        };
        let file_slots = if files.is_some() { file_slots } else { 0 };
        if !buffers.is_empty() {
            let iovecs: Vec<libc::iovec> = buffers
                .pieces()
                .iter()
                .map(|&(start, len)| libc::iovec {
                    iov_base: start as *mut libc::c_void,
                    iov_len: len,
                })
                .collect();
            // SAFETY: the pieces are the arena's mappings, which live as long as the process
            // serves (the arena outlives every shard and its ring).
            unsafe { uring.submitter().register_buffers(&iovecs) }.map_err(|err| {
                format!(
                    "registering {} bytes of arena as {} fixed buffers: {err}",
                    buffers.total_bytes(),
                    buffers.len()
                )
            })?;
        }
        Ok(Rc::new(Ring {
            uring: RefCell::new(uring),
            eventfd,
            buffers,
            huge_page_ranges,
            slots: RefCell::new(Vec::new()),
            free: RefCell::new(Vec::new()),
            room_waiters: RefCell::new(VecDeque::new()),
            bounded_in_flight: Cell::new(0),
            file_ops_in_flight: Cell::new(0),
            fd_ops: RefCell::new(Vec::new()),
            fd_waiters: RefCell::new(Vec::new()),
            files: RefCell::new(files),
            file_slots,
            reap_scratch: RefCell::new(ReapScratch::default()),
            stats: RefCell::new(RingStats::default()),
            stopping: Cell::new(false),
            queued: Cell::new(0),
            glommio_rings: Cell::new(None),
            glommio_polled: Cell::new(false),
            flush_scheduled: Cell::new(false),
            flusher: RefCell::new(None),
            taskrun_flag,
            no_iowait,
            reaped_at: Cell::new(ReapClock::now()),
            receive_watch: RefCell::new(None),
            provided: RefCell::new(None),
        }))
    }

    /// The clocks as the last reap that took a receive read them. A task woken by a receive
    /// runs after the reap that took it, so for that task this is at most one executor pass
    /// old: the time its bytes came in.
    pub fn reaped_at(&self) -> ReapClock {
        self.reaped_at.get()
    }

    /// Registers the buffers multishot receives complete into ([`Ring::recv_multishot`]).
    /// Fails, with the reason, where the kernel has no multishot receives (before 6.0).
    pub fn provide_receive_buffers(&self) -> Result<(), String> {
        let provided = ProvidedBuffers::register(&self.uring.borrow())?;
        *self.provided.borrow_mut() = Some(provided);
        Ok(())
    }

    /// Whether receives are multishot ([`Ring::provide_receive_buffers`] succeeded).
    pub fn multishot(&self) -> bool {
        self.provided.borrow().is_some()
    }

    /// Shows `watch` the bytes of every receive from now on, as each is reaped.
    pub fn watch_receives(&self, watch: Box<dyn ReceiveWatch>) {
        *self.receive_watch.borrow_mut() = Some(watch);
    }

    pub fn buffers(&self) -> &FixedBuffers {
        &self.buffers
    }

    pub fn stats(&self) -> RingStats {
        let mut stats = self.stats.borrow().clone();
        stats.files_registered = self
            .files
            .borrow()
            .as_ref()
            .map_or(0, |t| t.registered() as u64);
        stats
    }

    /// Runs the flusher, and the completion driver, on the current glommio executor until
    /// [`Ring::stop`].
    ///
    /// With `sleep_here`, the executor sleeps in this ring (glommio patch 9, a
    /// [`glommio::SleepHook`]): every executor pass reaps it, and a sleep is one
    /// `io_uring_enter` that submits what is queued and waits for a completion here, where
    /// most wake-ups come from, or on glommio's main or latency ring (this ring polls both,
    /// multishot). Without it, the executor sleeps in glommio's ring and a driver task reads an
    /// eventfd that this ring signals: a wake-up then takes the eventfd's signal, the read's
    /// completion in glommio's ring, and that task's pass.
    pub fn spawn_driver(self: &Rc<Self>, sleep_here: bool) {
        let flusher = Rc::clone(self);
        glommio::spawn_local(async move {
            loop {
                std::future::poll_fn(|cx| {
                    if flusher.flush_scheduled.get() || flusher.stopping.get() {
                        Poll::Ready(())
                    } else {
                        *flusher.flusher.borrow_mut() = Some(cx.waker().clone());
                        Poll::Pending
                    }
                })
                .await;
                flusher.flush();
                if flusher.stopping.get() {
                    break;
                }
            }
        })
        .detach();
        if sleep_here {
            self.glommio_rings.set(Some(glommio::ring_fds()));
            // Completions are taken by the executor's passes and sleeps: no signal needed.
            if let Err(err) = self.uring.borrow().submitter().unregister_eventfd() {
                tracing::warn!(%err, "unregistering the ring's eventfd");
            }
            glommio::set_sleep_hook(Some(Rc::new(SleepHere(Rc::clone(self)))));
            return;
        }
        let ring = Rc::clone(self);
        glommio::spawn_local(async move {
            // SAFETY: dup of our own eventfd; the duplicate is owned by the glommio file.
            let dup = unsafe { libc::dup(ring.eventfd.as_raw_fd()) };
            if dup < 0 {
                tracing::error!(err = %io::Error::last_os_error(), "ring driver: dup of the eventfd failed");
                return;
            }
            // SAFETY: `dup` is a fresh descriptor handed to the file, which closes it.
            let file = unsafe { glommio::io::BufferedFile::from_raw_fd(dup) };
            while !ring.stopping.get() {
                if let Err(err) = file.read_at(0, 8).await {
                    tracing::error!(%err, "ring driver: reading the eventfd failed");
                    break;
                }
                ring.stats.borrow_mut().wakeups += 1;
                ring.reap();
            }
            let _ = file.close().await;
        })
        .detach();
    }

    /// The executor's sleep in this ring ([`Ring::spawn_driver`]): arms the polls of glommio's
    /// rings if they are not armed, submits everything queued and waits for one completion in
    /// the same `io_uring_enter`, then reaps.
    fn sleep(&self) -> usize {
        if let (Some((main, latency)), false) =
            (self.glommio_rings.get(), self.glommio_polled.get())
        {
            for fd in [main, latency] {
                let poll = opcode::PollAdd::new(types::Fd(fd), libc::POLLIN as u32)
                    .multi(true)
                    .build()
                    .user_data(GLOMMIO_POLL_USER_DATA);
                self.queue(&poll);
            }
            self.glommio_polled.set(true);
        }
        let queued = self.queued.replace(0);
        {
            let uring = self.uring.borrow_mut();
            // A completion already posted (or one the submission posts) ends the wait at once.
            // SAFETY: no signal mask or argument is passed.
            let entered = unsafe {
                uring
                    .submitter()
                    .enter::<libc::sigset_t>(queued, 1, self.sleep_flags(), None)
            };
            if let Err(err) = entered {
                if err.raw_os_error() != Some(libc::EINTR) {
                    tracing::error!(%err, "io_uring sleep failed");
                }
            }
            let mut stats = self.stats.borrow_mut();
            stats.wakeups += 1;
            if queued > 0 {
                stats.submits += 1;
                stats.entries_submitted += u64::from(queued);
            }
        }
        self.reap()
    }

    /// Stops the driver (after [`Ring::drain`]).
    pub fn stop(&self) {
        if self.glommio_rings.get().is_some() {
            // The executor sleeps in glommio's own ring again (and the hook lets go of us).
            glommio::set_sleep_hook(None);
        }
        self.stopping.set(true);
        if let Some(waker) = self.flusher.borrow_mut().take() {
            waker.wake();
        }
        let one = 1u64;
        // SAFETY: writes 8 bytes from a live u64 to our own eventfd.
        unsafe {
            libc::write(
                self.eventfd.as_raw_fd(),
                (&one as *const u64).cast(),
                std::mem::size_of::<u64>(),
            )
        };
    }

    /// Waits until no operation is in flight.
    pub async fn drain(&self) {
        std::future::poll_fn(|cx| {
            self.reap();
            if self.stats.borrow().in_flight == 0 {
                Poll::Ready(())
            } else {
                self.room_waiters.borrow_mut().push_back(cx.waker().clone());
                Poll::Pending
            }
        })
        .await
    }

    /// Slots in the registered-file table (0: none; every socket is named by descriptor).
    pub fn file_slots(&self) -> usize {
        self.file_slots
    }

    /// Whether a shard sleeping in this ring with no file I/O in flight is idle, not in I/O
    /// wait, to the kernel's accounting (`IORING_ENTER_NO_IOWAIT`, kernel 6.15+).
    pub fn sleeps_idle(&self) -> bool {
        self.no_iowait
    }

    /// A sleep's enter flags now: I/O wait only while a file read or write is out.
    fn sleep_flags(&self) -> u32 {
        if self.no_iowait && self.file_ops_in_flight.get() == 0 {
            ENTER_GETEVENTS | ENTER_NO_IOWAIT
        } else {
            ENTER_GETEVENTS
        }
    }

    /// Puts `fd` in a slot of the registered-file table, so the operations on it name the slot.
    /// Returns false, and the operations name the descriptor, when there is no table, no free
    /// slot, or the kernel refuses. Undo with [`Ring::unregister_fd`] before `fd` is closed.
    pub fn register_fd(&self, fd: RawFd) -> bool {
        let mut files = self.files.borrow_mut();
        let Some(table) = files.as_mut() else {
            return false;
        };
        let Some(slot) = table.assign(fd) else {
            self.stats.borrow_mut().files_full += 1;
            return false;
        };
        match self
            .uring
            .borrow()
            .submitter()
            .register_files_update(slot, &[fd])
        {
            Ok(_) => true,
            Err(err) => {
                tracing::debug!(%err, fd, slot, "registering a socket in the file table");
                table.unassign(fd);
                false
            }
        }
    }

    /// Takes `fd` out of the registered-file table. Its slot is emptied now, or after the
    /// last operation that names it completes; only then may another socket have it.
    pub fn unregister_fd(&self, fd: RawFd) {
        self.update_files(|table| table.unregister(fd));
    }

    /// Applies `change` to the registered-file table, then empties the slot it says is done
    /// with (outside the table's borrow: emptying updates it again).
    fn update_files(&self, change: impl FnOnce(&mut FileTable) -> Option<u32>) {
        let done = self.files.borrow_mut().as_mut().and_then(change);
        if let Some(slot) = done {
            self.empty_file_slot(slot);
        }
    }

    /// Empties `slot` in the kernel (dropping its reference to the socket) and frees it.
    fn empty_file_slot(&self, slot: u32) {
        match self
            .uring
            .borrow()
            .submitter()
            .register_files_update(slot, &[-1])
        {
            Ok(_) => {
                if let Some(table) = self.files.borrow_mut().as_mut() {
                    table.emptied(slot);
                }
            }
            // Never reused: a slot the kernel may still fill must not name another socket.
            Err(err) => {
                tracing::error!(%err, slot, "emptying a registered-file slot; it stays out of use")
            }
        }
    }

    fn ops_on(&self, fd: RawFd) -> usize {
        usize::try_from(fd)
            .ok()
            .and_then(|at| self.fd_ops.borrow().get(at).copied())
            .unwrap_or(0)
    }

    /// Whether any operation on `fd` is in flight (a notification still due included).
    pub fn busy(&self, fd: RawFd) -> bool {
        self.ops_on(fd) > 0
    }

    /// Cancels every operation on `fd` (their completions still arrive).
    pub fn cancel_fd(&self, fd: RawFd) {
        if self.ops_on(fd) == 0 {
            return;
        }
        let slot = self.files.borrow().as_ref().and_then(|t| t.slot(fd));
        let target = match slot {
            Some(slot) => types::CancelBuilder::fd(types::Fixed(slot)),
            None => types::CancelBuilder::fd(types::Fd(fd)),
        };
        let cancel = opcode::AsyncCancel2::new(target.all())
            .build()
            .user_data(CANCEL_USER_DATA);
        self.queue(&cancel);
        self.stats.borrow_mut().cancels += 1;
        self.flush();
    }

    /// Waits until every operation on `fd` has completed, notifications included.
    pub async fn quiesce(&self, fd: RawFd) {
        std::future::poll_fn(|cx| {
            self.reap();
            if self.ops_on(fd) == 0 {
                Poll::Ready(())
            } else {
                self.fd_waiters.borrow_mut().push((fd, cx.waker().clone()));
                Poll::Pending
            }
        })
        .await
    }

    /// Queues a cancellation of the operation with `user_data`.
    fn cancel(&self, user_data: u64) {
        let entry = opcode::AsyncCancel::new(user_data)
            .build()
            .user_data(CANCEL_USER_DATA);
        self.queue(&entry);
        self.schedule_flush();
        self.stats.borrow_mut().cancels += 1;
    }

    /// Reads `len` bytes at `offset` of `fd` into `chunk` (`READ_FIXED`; O_DIRECT wants the
    /// chunk, the offset and the length aligned). Returns the chunk and the bytes read.
    pub async fn read_fixed(
        self: &Rc<Self>,
        fd: RawFd,
        chunk: PoolChunk,
        len: usize,
        offset: u64,
    ) -> (io::Result<usize>, PoolChunk) {
        self.chunk_io(OpKind::ReadFixed, fd, chunk, len, offset)
            .await
    }

    /// Writes the first `len` bytes of `chunk` at `offset` of `fd` (`WRITE_FIXED`).
    pub async fn write_fixed(
        self: &Rc<Self>,
        fd: RawFd,
        chunk: PoolChunk,
        len: usize,
        offset: u64,
    ) -> (io::Result<usize>, PoolChunk) {
        self.chunk_io(OpKind::WriteFixed, fd, chunk, len, offset)
            .await
    }

    /// One positioned fixed-buffer read or write of a pool chunk; the chunk comes back.
    async fn chunk_io(
        self: &Rc<Self>,
        kind: OpKind,
        fd: RawFd,
        chunk: PoolChunk,
        len: usize,
        offset: u64,
    ) -> (io::Result<usize>, PoolChunk) {
        assert!(len <= chunk.len());
        let index = chunk.buf_index();
        let (result, back) = self
            .submit(kind, fd, Buf::Chunk(chunk), None, |b, target| {
                let len = len as u32;
                match kind {
                    OpKind::ReadFixed => {
                        opcode::ReadFixed::new(target, b.ptr() as *mut u8, len, index)
                            .offset(offset)
                            .build()
                    }
                    OpKind::WriteFixed => opcode::WriteFixed::new(target, b.ptr(), len, index)
                        .offset(offset)
                        .build(),
                    _ => unreachable!("chunk I/O is a fixed read or write"),
                }
            })
            .await;
        match back {
            Some(Buf::Chunk(chunk)) => (result, chunk),
            _ => unreachable!("chunk I/O hands its chunk back"),
        }
    }

    /// Submits one operation on `buf` once there is room, and waits for its result. The
    /// buffer comes back with the result unless a notification is still due (it is then
    /// released at the notification).
    async fn submit(
        self: &Rc<Self>,
        kind: OpKind,
        fd: RawFd,
        buf: Buf,
        report: Option<Rc<ZcReport>>,
        entry: impl FnOnce(&Buf, types::Fd) -> squeue::Entry,
    ) -> (io::Result<usize>, Option<Buf>) {
        self.submit_with(kind, fd, (buf, report), false, entry)
            .await
    }

    /// [`Ring::submit`], and with `at_once` the entry goes to the kernel now, with whatever is
    /// queued before it, instead of at the end of the executor pass.
    async fn submit_with(
        self: &Rc<Self>,
        kind: OpKind,
        fd: RawFd,
        (buf, report): (Buf, Option<Rc<ZcReport>>),
        at_once: bool,
        entry: impl FnOnce(&Buf, types::Fd) -> squeue::Entry,
    ) -> (io::Result<usize>, Option<Buf>) {
        let entry = |b: Option<&Buf>, target| entry(b.expect("an operation's buffer"), target);
        if kind != OpKind::Recv {
            self.room().await;
            self.bounded_in_flight.set(self.bounded_in_flight.get() + 1);
        }
        if kind.is_file_io() {
            self.file_ops_in_flight
                .set(self.file_ops_in_flight.get() + 1);
        }
        let (index, generation) = self.start(kind, fd, Some(buf), report, None, entry);
        if at_once {
            self.submit_queued(&mut self.uring.borrow_mut());
        }
        Op {
            ring: Rc::clone(self),
            index,
            generation,
            done: false,
        }
        .await
    }

    /// Takes a slot for one operation, and queues its entry for the pass's submission.
    /// Returns the slot's index and generation.
    fn start(
        &self,
        kind: OpKind,
        fd: RawFd,
        buf: Option<Buf>,
        report: Option<Rc<ZcReport>>,
        inbox: Option<Rc<Inbox>>,
        entry: impl FnOnce(Option<&Buf>, types::Fd) -> squeue::Entry,
    ) -> (usize, u32) {
        let (index, generation) = {
            let mut slots = self.slots.borrow_mut();
            let index = self.free.borrow_mut().pop().unwrap_or_else(|| {
                slots.push(Slot::empty());
                slots.len() - 1
            });
            let slot = &mut slots[index];
            debug_assert!(!slot.busy);
            slot.generation = slot.generation.wrapping_add(1);
            slot.busy = true;
            slot.kind = kind;
            slot.fd = fd;
            slot.file = None;
            slot.result = None;
            slot.notification_due = false;
            slot.detached = false;
            slot.waker = None;
            slot.buf = buf;
            slot.report = report;
            slot.inbox = inbox;
            (index, slot.generation)
        };
        // A registered socket is named by its slot (what `types::Fixed` builds: the slot in
        // the descriptor's place, and the fixed-file flag).
        let file = self.files.borrow_mut().as_mut().and_then(|table| {
            let slot = table.slot(fd)?;
            table.op_started(slot);
            Some(slot)
        });
        let sqe = {
            let mut slots = self.slots.borrow_mut();
            slots[index].file = file;
            let target = types::Fd(file.map_or(fd, |slot| slot as RawFd));
            let sqe =
                entry(slots[index].buf.as_ref(), target).user_data(user_data(index, generation));
            match file {
                Some(_) => sqe.flags(squeue::Flags::FIXED_FILE),
                None => sqe,
            }
        };
        {
            let mut fd_ops = self.fd_ops.borrow_mut();
            let at = usize::try_from(fd).expect("a descriptor");
            if fd_ops.len() <= at {
                fd_ops.resize(at + 1, 0);
            }
            fd_ops[at] += 1;
        }
        {
            let mut stats = self.stats.borrow_mut();
            stats.in_flight += 1;
            stats.in_flight_max = stats.in_flight_max.max(stats.in_flight);
        }
        self.queue(&sqe);
        self.schedule_flush();
        (index, generation)
    }

    /// Queues one entry for the next submission (submitting at once only when the queue is
    /// full).
    fn queue(&self, sqe: &squeue::Entry) {
        let mut uring = self.uring.borrow_mut();
        loop {
            // SAFETY: every buffer an entry names is owned by its slot until the operation's
            // last completion (or, for a cancellation, names nothing).
            let pushed = unsafe { uring.submission().push(sqe) };
            if pushed.is_ok() {
                self.queued.set(self.queued.get() + 1);
                break;
            }
            self.submit_queued(&mut uring);
        }
    }

    fn submit_queued(&self, uring: &mut IoUring) {
        let queued = self.queued.replace(0);
        if queued == 0 {
            return;
        }
        // Completions the kernel posts inside this very call (a send that fits the socket
        // buffer) are reaped right after it: they need no eventfd signal to wake the driver.
        uring.completion().disable_eventfd();
        let submitted = if self.taskrun_flag {
            // The same call runs the completions waiting for us.
            // SAFETY: no signal mask or argument is passed.
            unsafe {
                uring
                    .submitter()
                    .enter::<libc::sigset_t>(queued, 0, ENTER_GETEVENTS, None)
            }
        } else {
            uring.submit()
        };
        uring.completion().enable_eventfd();
        if let Err(err) = submitted {
            tracing::error!(%err, "io_uring submit failed");
        }
        let mut stats = self.stats.borrow_mut();
        stats.submits += 1;
        stats.entries_submitted += u64::from(queued);
    }

    /// Makes sure the queued entries are submitted at the end of this executor pass: the
    /// flusher task is woken, and a woken task runs behind every task already runnable, so
    /// they all queue first. (A task spawned now would run at once: glommio runs a new task
    /// eagerly.)
    fn schedule_flush(&self) {
        if self.flush_scheduled.replace(true) {
            return;
        }
        if let Some(waker) = self.flusher.borrow_mut().take() {
            waker.wake();
        }
    }

    /// Submits every queued entry now, and reaps.
    pub fn flush(&self) {
        self.flush_scheduled.set(false);
        self.submit_queued(&mut self.uring.borrow_mut());
        self.reap();
    }

    /// Waits until fewer than [`RING_IN_FLIGHT_MAX`] operations other than receives are in
    /// flight.
    async fn room(&self) {
        let mut waited = false;
        std::future::poll_fn(|cx| {
            if self.bounded_in_flight.get() < RING_IN_FLIGHT_MAX {
                return Poll::Ready(());
            }
            if !waited {
                waited = true;
                self.stats.borrow_mut().full_waits += 1;
            }
            self.room_waiters.borrow_mut().push_back(cx.waker().clone());
            // Whatever is queued must reach the kernel for room to come back.
            self.submit_queued(&mut self.uring.borrow_mut());
            self.reap();
            Poll::Pending
        })
        .await
    }

    /// Takes every completion the kernel has posted (flushing an overflow first), records
    /// results and notifications, wakes waiters and frees finished slots. Returns how many it
    /// took.
    pub fn reap(&self) -> usize {
        // Scratch vectors kept between reaps, so reaping allocates nothing once they have
        // grown (a reap runs at least once per executor pass). Taken out while in use: a reap
        // re-entered from a waker or a release just starts with empty ones.
        let (mut completions, mut wake) = std::mem::take(&mut *self.reap_scratch.borrow_mut());
        {
            let mut uring = self.uring.borrow_mut();
            if self.taskrun_flag && uring.submission().taskrun() {
                self.stats.borrow_mut().task_runs += 1;
                // Completions are waiting to be run on this thread: one enter runs them.
                // SAFETY: no signal mask or argument is passed.
                let _ = unsafe {
                    uring
                        .submitter()
                        .enter::<libc::sigset_t>(0, 0, ENTER_GETEVENTS, None)
                };
            }
            if uring.submission().cq_overflow() {
                self.stats.borrow_mut().cq_overflows += 1;
                // With IORING_FEAT_NODROP the kernel kept them; an enter flushes them.
                let _ = uring.submit();
            }
            completions.extend(
                uring
                    .completion()
                    .map(|c| (c.user_data(), c.result(), c.flags())),
            );
        }
        if completions.is_empty() {
            *self.reap_scratch.borrow_mut() = (completions, wake);
            return 0;
        }
        let taken = completions.len();
        let mut release = Vec::new();
        // Multishot receives whose connections hold too much unread (cancelled below).
        let mut pause = Vec::new();
        let watch = self.receive_watch.borrow();
        let mut received = false;
        // Read at the reap's first receive: only a connection resumed by a receive uses it, so a
        // reap of sends and notifications alone reads no clock.
        let mut clock_read = false;
        {
            let mut slots = self.slots.borrow_mut();
            let mut stats = self.stats.borrow_mut();
            for (data, result, flags) in completions.drain(..) {
                if data == CANCEL_USER_DATA {
                    continue;
                }
                if data == GLOMMIO_POLL_USER_DATA {
                    // It only ends a sleep; one that ended (no `MORE`) is armed again.
                    if !cqueue::more(flags) {
                        self.glommio_polled.set(false);
                    }
                    continue;
                }
                let (index, generation) = ((data & 0xFFFF_FFFF) as usize, (data >> 32) as u32);
                let slot = &mut slots[index];
                assert!(
                    slot.busy && slot.generation == generation,
                    "a completion for an operation that is not in flight"
                );
                if let Some(inbox) = slot.inbox.clone() {
                    // A multishot receive: one arrival, or its end (no more to come).
                    let k = OpKind::ALL.len() - 1;
                    debug_assert_eq!(OpKind::ALL[k], OpKind::Recv);
                    if result >= 0 {
                        stats.ops[k] += 1;
                    } else if result == -libc::ENOBUFS {
                        stats.receives_out_of_buffers += 1;
                    } else if result != -libc::ECANCELED {
                        stats.errors += 1;
                    }
                    if !clock_read {
                        self.reaped_at.set(ReapClock::now());
                        clock_read = true;
                    }
                    // What the receive's end says: a stamped receive's last completion at the
                    // end of the stream carries its header and no payload.
                    let mut outcome = result;
                    if let (1.., Some(id)) = (result, cqueue::buffer_select(flags)) {
                        let mut provided = self.provided.borrow_mut();
                        let provided = provided.as_mut().expect("a ring with multishot receives");
                        let (payload, stamp) = inbox.parse(
                            provided.bytes(id, result as usize),
                            provided.stamped_header(),
                        );
                        outcome = payload.len() as i32;
                        // The payload only: a stamped receive's buffer also holds the message
                        // header, the address and the control space (about 80 bytes).
                        stats.bytes[k] += payload.len() as u64;
                        if let (Some(watch), false) = (&*watch, payload.is_empty()) {
                            watch.received(payload);
                            received = true;
                        }
                        wake.extend(inbox.deliver(payload, stamp));
                        provided.give_back(id);
                        if let Some(armed) = inbox.over_high_water() {
                            stats.receives_paused += 1;
                            pause.push(armed);
                        }
                    }
                    if !cqueue::more(flags) {
                        slot.result = Some(result);
                        wake.extend(inbox.disarmed(data, outcome));
                        release.extend(self.free_slot(&mut slots, &mut stats, index));
                    }
                    continue;
                }
                if cqueue::notif(flags) {
                    stats.zc_notifications += 1;
                    let copied = result as u32 & NOTIF_USAGE_ZC_COPIED != 0;
                    if copied {
                        stats.zc_copied += 1;
                    }
                    if let Some(report) = &slot.report {
                        report.record(copied);
                    }
                    slot.notification_due = false;
                } else {
                    slot.result = Some(result);
                    slot.notification_due = cqueue::more(flags);
                    let k = OpKind::ALL
                        .iter()
                        .position(|&k| k == slot.kind)
                        .expect("a kind");
                    stats.ops[k] += 1;
                    if result >= 0 {
                        stats.bytes[k] += result as u64;
                    } else {
                        stats.errors += 1;
                    }
                    if slot.kind == OpKind::Recv && !clock_read {
                        self.reaped_at.set(ReapClock::now());
                        clock_read = true;
                    }
                    if let (OpKind::Recv, Some(watch), 1..) = (slot.kind, &*watch, result) {
                        let bytes = slot.buf.as_ref().and_then(|b| b.received(result as usize));
                        if let Some(bytes) = bytes {
                            watch.received(bytes);
                            received = true;
                        }
                    }
                    if let Some(w) = slot.waker.take() {
                        wake.push(w);
                    }
                }
                if slot.finished() && slot.detached {
                    release.extend(self.free_slot(&mut slots, &mut stats, index));
                }
            }
        }
        if let (true, Some(watch)) = (received, &*watch) {
            watch.reaped();
        }
        drop(watch);
        for armed in pause {
            self.cancel(armed);
        }
        // Outside the borrows: a release may run an owner's code, a waker may poll at once.
        drop(release);
        for w in wake.drain(..) {
            w.wake();
        }
        *self.reap_scratch.borrow_mut() = (completions, wake);
        self.wake_room();
        taken
    }

    /// Frees a finished slot; returns its buffer (to be dropped outside the borrows).
    fn free_slot(&self, slots: &mut [Slot], stats: &mut RingStats, index: usize) -> Option<Buf> {
        let slot = &mut slots[index];
        slot.busy = false;
        slot.waker = None;
        let buf = slot.buf.take();
        slot.report = None;
        slot.inbox = None;
        stats.in_flight -= 1;
        if slot.kind != OpKind::Recv {
            self.bounded_in_flight.set(self.bounded_in_flight.get() - 1);
        }
        if slot.kind.is_file_io() {
            self.file_ops_in_flight
                .set(self.file_ops_in_flight.get() - 1);
        }
        let fd = slot.fd;
        if let Some(file) = slot.file.take() {
            self.update_files(|table| table.op_finished(file));
        }
        let mut fd_ops = self.fd_ops.borrow_mut();
        let left = &mut fd_ops[fd as usize];
        assert!(*left > 0, "an operation counted at submission");
        *left -= 1;
        if *left == 0 {
            let mut waiters = self.fd_waiters.borrow_mut();
            let mut i = 0;
            while i < waiters.len() {
                if waiters[i].0 == fd {
                    waiters.swap_remove(i).1.wake();
                } else {
                    i += 1;
                }
            }
        }
        self.free.borrow_mut().push(index);
        buf
    }

    fn wake_room(&self) {
        // Runs at every reap and every finished operation; nearly always nobody waits.
        if self.room_waiters.borrow().is_empty() {
            return;
        }
        let waiters: Vec<Waker> = self.room_waiters.borrow_mut().drain(..).collect();
        for w in waiters {
            w.wake();
        }
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        let in_flight = self.stats.borrow().in_flight;
        if in_flight > 0 {
            // The memory of these operations is leaked rather than freed under the kernel.
            tracing::error!(in_flight, "ring dropped with operations in flight");
            for slot in self.slots.borrow_mut().iter_mut() {
                if let Some(buf) = slot.buf.take() {
                    std::mem::forget(buf);
                }
            }
            if let Some(provided) = self.provided.borrow_mut().take() {
                std::mem::forget(provided);
            }
        }
    }
}

impl Lent {
    /// `len` bytes of a pool chunk from `start`; the chunk goes back to its pool when this is
    /// dropped.
    pub fn from_chunk(chunk: PoolChunk, start: usize, len: usize) -> Lent {
        assert!(start + len <= chunk.len(), "a range inside the chunk");
        let ptr = chunk.as_ptr().wrapping_add(start);
        // SAFETY: the chunk is owned by the release closure, so these bytes stay the pool's
        // and untouched by anyone else until it runs.
        unsafe { Lent::new(ptr, len, Box::new(move || drop(chunk))) }
    }

    /// Heap bytes as a lent buffer (the release frees them).
    fn owned(bytes: Vec<u8>) -> Lent {
        let bytes = std::mem::ManuallyDrop::new(bytes);
        let (ptr, len, cap) = (bytes.as_ptr(), bytes.len(), bytes.capacity());
        let free = Box::new(move || {
            // SAFETY: rebuilds the vector taken apart above, exactly once.
            drop(unsafe { Vec::from_raw_parts(ptr as *mut u8, len, cap) });
        });
        // SAFETY: the vector's heap bytes live until the release above frees them.
        unsafe { Lent::new(ptr, len, free) }
    }
}

/// Waits for one operation's result; dropped early, it cancels the operation and leaves its
/// memory to the slot until the kernel is done.
struct Op {
    ring: Rc<Ring>,
    index: usize,
    generation: u32,
    done: bool,
}

impl Future for Op {
    type Output = (io::Result<usize>, Option<Buf>);

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let ring = Rc::clone(&self.ring);
        let mut slots = ring.slots.borrow_mut();
        let slot = &mut slots[self.index];
        debug_assert!(slot.busy && slot.generation == self.generation);
        let Some(result) = slot.result else {
            // A join polls every part when one is woken: keep the waker it already left.
            if !slot.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                slot.waker = Some(cx.waker().clone());
            }
            return Poll::Pending;
        };
        self.done = true;
        let result = if result < 0 {
            Err(io::Error::from_raw_os_error(-result))
        } else {
            Ok(result as usize)
        };
        if slot.finished() {
            let mut stats = ring.stats.borrow_mut();
            let buf = ring.free_slot(&mut slots, &mut stats, self.index);
            drop(stats);
            drop(slots);
            ring.wake_room();
            Poll::Ready((result, buf))
        } else {
            // The notification frees it.
            slot.detached = true;
            Poll::Ready((result, None))
        }
    }
}

impl Drop for Op {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let cancel = {
            let mut slots = self.ring.slots.borrow_mut();
            let slot = &mut slots[self.index];
            if !slot.busy || slot.generation != self.generation {
                return;
            }
            slot.detached = true;
            slot.waker = None;
            !slot.finished()
        };
        if cancel {
            self.ring.cancel(user_data(self.index, self.generation));
        }
        // A result that already arrived (or arrives with this reap) frees the slot.
        let finished = {
            let slots = self.ring.slots.borrow();
            let slot = &slots[self.index];
            slot.busy && slot.generation == self.generation && slot.finished()
        };
        if finished {
            let buf = {
                let mut slots = self.ring.slots.borrow_mut();
                let mut stats = self.ring.stats.borrow_mut();
                self.ring.free_slot(&mut slots, &mut stats, self.index)
            };
            drop(buf);
        }
        self.ring.reap();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::net::UnixStream;

    /// What a test saw, in order: the watch's calls and the receiving tasks' resumptions.
    #[derive(Clone, Debug, PartialEq, Eq)]
    enum Seen {
        Received(Vec<u8>),
        Reaped,
        Resumed(&'static str),
    }

    struct Recorder(Rc<RefCell<Vec<Seen>>>);

    impl ReceiveWatch for Recorder {
        fn received(&self, bytes: &[u8]) {
            self.0.borrow_mut().push(Seen::Received(bytes.to_vec()));
        }
        fn reaped(&self) {
            self.0.borrow_mut().push(Seen::Reaped);
        }
    }

    /// The watch is shown exactly the bytes each receive brought (where they landed, past the
    /// receive's offset, by `RECV` and by `RECVMSG`), all of one reap's before `reaped`, and
    /// all of them before the task the receive wakes runs.
    #[test]
    fn a_receive_watch_sees_each_receives_bytes_before_its_task_runs() {
        glommio::LocalExecutorBuilder::default()
            .spawn(|| async move {
                let buffers = FixedBuffers::cut(&[], 4096).expect("no buffers");
                let ring = match Ring::new(buffers, Vec::new(), 8) {
                    Ok(ring) => ring,
                    Err(reason) => {
                        println!("skipped: no ring here ({reason})");
                        return;
                    }
                };
                ring.spawn_driver(false);
                let seen = Rc::new(RefCell::new(Vec::new()));
                ring.watch_receives(Box::new(Recorder(Rc::clone(&seen))));
                let (plain, mut plain_peer) = UnixStream::pair().unwrap();
                let (stamped, mut stamped_peer) = UnixStream::pair().unwrap();
                plain_peer.write_all(b"hello").unwrap();
                stamped_peer.write_all(b"stamped bytes").unwrap();
                let (plain_fd, stamped_fd) = (plain.as_raw_fd(), stamped.as_raw_fd());
                let log = Rc::clone(&seen);
                let plain_recv = async {
                    let (n, buf) = ring.recv(plain_fd, vec![0xAA; 16], 3).await;
                    log.borrow_mut().push(Seen::Resumed("plain"));
                    (n.unwrap(), buf)
                };
                let stamped_recv = async {
                    let mut to = Stamped::new();
                    to.buf = vec![0xAA; 32];
                    let (n, back) = ring.recv_stamped(stamped_fd, to, 7).await;
                    log.borrow_mut().push(Seen::Resumed("stamped"));
                    (n.unwrap(), back)
                };
                let ((n, buf), (m, back)) =
                    futures_lite::future::zip(plain_recv, stamped_recv).await;
                assert_eq!(
                    (n, &buf[3..8], buf[2], buf[8]),
                    (5, &b"hello"[..], 0xAA, 0xAA)
                );
                assert_eq!((m, &back.buf[7..20]), (13, &b"stamped bytes"[..]));
                let log = seen;
                let seen = log.borrow().clone();
                let received: Vec<&Seen> = seen
                    .iter()
                    .filter(|s| matches!(s, Seen::Received(_)))
                    .collect();
                assert_eq!(received.len(), 2, "one call per receive: {seen:?}");
                for bytes in [&b"hello"[..], b"stamped bytes"] {
                    let at = seen
                        .iter()
                        .position(|s| *s == Seen::Received(bytes.to_vec()));
                    let reaped =
                        at.and_then(|at| seen[at..].iter().position(|s| *s == Seen::Reaped));
                    assert!(
                        reaped.is_some(),
                        "{bytes:?} shown, then its reap ends: {seen:?}"
                    );
                }
                for task in ["plain", "stamped"] {
                    let resumed = seen.iter().position(|s| *s == Seen::Resumed(task)).unwrap();
                    assert!(
                        seen[..resumed].contains(&Seen::Reaped),
                        "{task}'s task ran after its reap was shown: {seen:?}"
                    );
                }
                // A receive that brings nothing (the peer closed) shows the watch nothing.
                drop(plain_peer);
                let (n, _) = ring.recv(plain_fd, vec![0; 16], 0).await;
                assert_eq!(n.unwrap(), 0);
                assert_eq!(
                    log.borrow().len(),
                    seen.len(),
                    "nothing received, nothing shown"
                );
                ring.stop();
                ring.drain().await;
            })
            .unwrap()
            .join()
            .unwrap();
    }
}
