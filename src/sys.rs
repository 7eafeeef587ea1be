//! The few system calls Headroom needs to map, bind, populate, lock and inspect memory (the
//! arena's regions and memory segments), and to abort a socket, and the CPU's prefetch hint.
//! One of the modules that may hold `unsafe`: each call says why it is sound.

use std::io;
use std::ptr::{self, NonNull};

use crate::topology::NodeId;

const MPOL_BIND: libc::c_int = 2;
const MPOL_F_STATIC_NODES: libc::c_int = 1 << 15;
const MPOL_MF_STRICT: libc::c_uint = 1 << 0;
/// `madvise` advice that faults pages in writable and reports failure instead of SIGBUS
/// (Linux 5.14). Hugetlb pages missing from a node's pool then give ENOMEM, not a crash.
const MADV_POPULATE_WRITE: libc::c_int = 23;
const MAP_HUGE_SHIFT: libc::c_int = 26;
/// Node mask width handed to the kernel: enough for any node id it accepts.
const NODE_MASK_BITS: usize = 1024;
/// Pages asked about per `move_pages` call.
const MOVE_PAGES_BATCH: usize = 4096;
const CAP_IPC_LOCK: u32 = 14;

/// Asks the CPU to start loading the cache line holding `addr`. Only a hint: it never
/// faults and reads nothing a program can see, so any address will do, stale ones included.
#[inline]
pub fn prefetch_line(addr: usize) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHT0 never faults and has no effect a program can observe, whatever the
    // address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(addr as *const i8)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = addr;
}

/// An anonymous private mapping, unmapped on drop.
#[derive(Debug)]
pub struct Mapping {
    base: NonNull<u8>,
    len: usize,
    /// Backed by hugetlb pages (which must never be faulted by a plain touch: a short node
    /// pool would SIGBUS).
    huge: bool,
}

// SAFETY: the mapping is plain memory owned by this value; which thread touches which bytes is
// decided by the block pools above (a block belongs to one shard at a time).
unsafe impl Send for Mapping {}
// SAFETY: as above; `&Mapping` only hands out the base address.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len` bytes of anonymous memory, aligned to `align` bytes. With `huge_page_bytes`
    /// the mapping comes from the hugetlb pool of that page size (already aligned to it).
    pub fn anonymous(
        len: usize,
        align: usize,
        huge_page_bytes: Option<u64>,
    ) -> io::Result<Mapping> {
        assert!(len > 0 && align.is_power_of_two());
        let mut flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
        let map_len = match huge_page_bytes {
            Some(page) => {
                assert!(page.is_power_of_two() && len as u64 % page == 0);
                flags &= !libc::MAP_NORESERVE;
                flags |=
                    libc::MAP_HUGETLB | ((page.trailing_zeros() as libc::c_int) << MAP_HUGE_SHIFT);
                len
            }
            // Over-map so an aligned window of `len` bytes exists, then trim both ends.
            None => len + align,
        };
        // SAFETY: a fresh anonymous mapping at an address of the kernel's choosing aliases
        // nothing; the result is checked before use.
        let raw = unsafe {
            libc::mmap(
                ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let raw = raw as usize;
        if huge_page_bytes.is_some() {
            debug_assert_eq!(raw % align.min(huge_page_bytes.unwrap_or(0) as usize), 0);
            let base = NonNull::new(raw as *mut u8).expect("mmap never returns null on success");
            return Ok(Mapping {
                base,
                len,
                huge: true,
            });
        }
        let start = (raw + align - 1) & !(align - 1);
        let head = start - raw;
        let tail = map_len - head - len;
        // SAFETY: both trimmed ranges lie inside the mapping just made and hold nothing yet.
        unsafe {
            if head > 0 {
                libc::munmap(raw as *mut libc::c_void, head);
            }
            if tail > 0 {
                libc::munmap((start + len) as *mut libc::c_void, tail);
            }
        }
        // Ordinary memory stays on base pages even under THP `always`: zero-copy sends from
        // huge pages stall (docs/io.md), and the ring tells huge from base by hugetlb alone.
        // SAFETY: advice on the mapping just made; it changes no contents.
        if unsafe { libc::madvise(start as *mut libc::c_void, len, libc::MADV_NOHUGEPAGE) } != 0 {
            tracing::debug!(err = %io::Error::last_os_error(), "madvise(MADV_NOHUGEPAGE) refused");
        }
        let base = NonNull::new(start as *mut u8).expect("aligned start inside a mapping");
        Ok(Mapping {
            base,
            len,
            huge: false,
        })
    }

    pub fn base(&self) -> NonNull<u8> {
        self.base
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Binds the mapping to `node` strictly: `MPOL_BIND | MPOL_F_STATIC_NODES`, and
    /// `MPOL_MF_STRICT` so pages already present elsewhere make the call fail.
    pub fn bind_to_node(&self, node: NodeId) -> io::Result<()> {
        let node = node as usize;
        if node >= NODE_MASK_BITS {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "node id beyond the mask",
            ));
        }
        let mut mask = [0u64; NODE_MASK_BITS / 64];
        mask[node / 64] |= 1 << (node % 64);
        // SAFETY: mbind only changes the policy of our own mapping; the mask outlives the call
        // and its bit count matches its length.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_mbind,
                self.base.as_ptr(),
                self.len,
                MPOL_BIND | MPOL_F_STATIC_NODES,
                mask.as_ptr(),
                // The kernel reads maxnode - 1 bits.
                (NODE_MASK_BITS + 1) as libc::c_ulong,
                MPOL_MF_STRICT,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    /// Faults every page in, writable, under the mapping's policy. Errors (ENOMEM when a
    /// node's hugetlb pool is short) come back instead of a SIGBUS on first touch.
    pub fn populate(&self) -> io::Result<()> {
        // SAFETY: advice on our own mapping; it writes nothing we can observe except zeroes.
        let rc = unsafe {
            libc::madvise(
                self.base.as_ptr() as *mut libc::c_void,
                self.len,
                MADV_POPULATE_WRITE,
            )
        };
        if rc == 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EINVAL) || self.huge {
            return Err(err);
        }
        // A kernel before 5.14 lacks the advice: fault ordinary pages in by writing to each.
        let page = base_page_bytes();
        for offset in (0..self.len).step_by(page) {
            // SAFETY: `offset` is inside our own writable mapping, which nothing else uses yet.
            unsafe { self.base.as_ptr().add(offset).write_volatile(0) };
        }
        Ok(())
    }

    /// Locks the mapping resident so the head is never paged out to the disk it avoids.
    pub fn lock(&self) -> io::Result<()> {
        // SAFETY: mlock on our own mapping changes residency only.
        let rc = unsafe { libc::mlock(self.base.as_ptr() as *const libc::c_void, self.len) };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    /// The node of every `page_bytes` page (kernel `move_pages` with no target: a query).
    /// A negative entry is an errno: `-ENOENT` for a page that is not present.
    pub fn page_nodes(&self, page_bytes: usize) -> io::Result<Vec<i32>> {
        assert!(page_bytes.is_power_of_two() && self.len % page_bytes == 0);
        let pages = self.len / page_bytes;
        let mut status = vec![i32::MIN; pages];
        let mut addrs: Vec<*mut libc::c_void> = Vec::with_capacity(MOVE_PAGES_BATCH);
        for first in (0..pages).step_by(MOVE_PAGES_BATCH) {
            let count = MOVE_PAGES_BATCH.min(pages - first);
            addrs.clear();
            // wrapping_add keeps this free of unsafe; every address is inside the mapping.
            addrs.extend((first..first + count).map(|page| {
                self.base.as_ptr().wrapping_add(page * page_bytes) as *mut libc::c_void
            }));
            // SAFETY: a query (null target nodes) on addresses of our own mapping; the kernel
            // writes `count` entries into a slice of exactly that length.
            let rc = unsafe {
                libc::syscall(
                    libc::SYS_move_pages,
                    0,
                    count as libc::c_ulong,
                    addrs.as_ptr(),
                    ptr::null::<libc::c_int>(),
                    status[first..first + count].as_mut_ptr(),
                    0,
                )
            };
            if rc != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(status)
    }
}

/// The NUMA node of the page holding `addr` in this process (`move_pages` as a query).
pub fn node_of_address(addr: usize) -> io::Result<i32> {
    let page = base_page_bytes();
    let addrs = [(addr - addr % page) as *mut libc::c_void];
    let mut status = [i32::MIN];
    // SAFETY: a query (null target nodes) of one address; the kernel writes one status entry.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_move_pages,
            0,
            1 as libc::c_ulong,
            addrs.as_ptr(),
            ptr::null::<libc::c_int>(),
            status.as_mut_ptr(),
            0,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    if status[0] < 0 {
        return Err(io::Error::from_raw_os_error(-status[0]));
    }
    Ok(status[0])
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: we own the mapping; nothing borrowed from it outlives `self`.
        unsafe {
            libc::munmap(self.base.as_ptr() as *mut libc::c_void, self.len);
        }
    }
}

/// The soft RLIMIT_MEMLOCK in bytes (`None` when unlimited).
pub fn memlock_limit_bytes() -> Option<u64> {
    let limit = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_MEMLOCK)
        .map(|(soft, _hard)| soft)
        .unwrap_or(0);
    if limit == libc::RLIM_INFINITY {
        None
    } else {
        Some(limit)
    }
}

/// Raises RLIMIT_MEMLOCK as far as the process may: unlimited (with CAP_SYS_RESOURCE), else
/// the soft limit to the hard one; says what it did.
pub fn lift_memlock_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let infinity = libc::RLIM_INFINITY;
    if setrlimit(Resource::RLIMIT_MEMLOCK, infinity, infinity).is_ok() {
        tracing::info!("RLIMIT_MEMLOCK lifted to unlimited (CAP_SYS_RESOURCE) to lock the arena");
        return;
    }
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_MEMLOCK) {
        if soft < hard && setrlimit(Resource::RLIMIT_MEMLOCK, hard, hard).is_ok() {
            tracing::info!(
                bytes = hard,
                "RLIMIT_MEMLOCK raised to its hard limit to lock the arena"
            );
        }
    }
}

/// Whether the process holds CAP_IPC_LOCK, which exempts it from RLIMIT_MEMLOCK.
pub fn has_cap_ipc_lock() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let line = status.lines().find(|line| line.starts_with("CapEff:"))?;
            u64::from_str_radix(line["CapEff:".len()..].trim(), 16).ok()
        })
        .is_some_and(|caps| caps & (1 << CAP_IPC_LOCK) != 0)
}

/// The base page size of this machine.
pub fn base_page_bytes() -> usize {
    nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .map_or(4096, |size| size as usize)
}

/// The O_DIRECT file-offset alignment the kernel reports for an open file (statx
/// `STATX_DIOALIGN`, Linux 6.1); `None` when it cannot tell.
pub fn statx_dio_offset_align(file: &std::fs::File) -> Option<u32> {
    // SAFETY: an all-zero statx is a valid value to pass for the kernel to fill.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: the empty path is NUL-terminated, the descriptor is open for the call (borrowed
    // from `file`), and `stx` is a valid, writable statx.
    let rc = unsafe {
        libc::statx(
            std::os::fd::AsRawFd::as_raw_fd(file),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_DIOALIGN,
            &mut stx,
        )
    };
    if rc != 0 || stx.stx_mask & libc::STATX_DIOALIGN == 0 || stx.stx_dio_offset_align == 0 {
        return None;
    }
    Some(stx.stx_dio_offset_align)
}

/// The size of a block device, in bytes.
pub fn block_device_bytes(file: &std::fs::File) -> io::Result<u64> {
    use std::os::fd::AsRawFd;
    const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
    let mut bytes: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes one u64 into the pointer we pass, which is valid and ours.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), BLKGETSIZE64, &mut bytes as *mut u64) };
    if rc == 0 {
        Ok(bytes)
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Bytes a TCP socket has queued to send that its peer has not acknowledged yet
/// (`SIOCOUTQ`).
pub fn unacknowledged_bytes(fd: std::os::fd::RawFd) -> io::Result<usize> {
    let mut bytes: libc::c_int = 0;
    // SAFETY: SIOCOUTQ (TIOCOUTQ's number) writes one int through the pointer, which points
    // at a live int.
    let rc = unsafe { libc::ioctl(fd, libc::TIOCOUTQ, &mut bytes as *mut libc::c_int) };
    if rc == 0 {
        Ok(bytes.max(0) as usize)
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Sends as much of `parts`, in order, as socket `fd` takes now, in one `sendmsg` that never
/// waits (`MSG_DONTWAIT`, and no SIGPIPE): the bytes taken, or `WouldBlock` when it takes none.
pub fn send_now(fd: std::os::fd::RawFd, parts: &[io::IoSlice<'_>]) -> io::Result<usize> {
    // SAFETY: a zeroed msghdr names no address and no control data.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    // IoSlice is ABI-compatible with iovec; the kernel only reads through these pointers.
    msg.msg_iov = parts.as_ptr() as *mut libc::iovec;
    msg.msg_iovlen = parts.len().min(libc::UIO_MAXIOV as usize) as _;
    // SAFETY: `msg` points at `parts`' live iovecs for the call's length and at nothing else.
    let rc = unsafe { libc::sendmsg(fd, &msg, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
    if rc >= 0 {
        Ok(rc as usize)
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Aborts a TCP connection without closing its descriptor: `connect(AF_UNSPEC)` makes the
/// kernel disconnect it (a reset), dropping whatever is still queued to send, so zero-copy
/// sends from it get their notifications now rather than when a stalled peer reads.
pub fn tcp_abort(fd: std::os::fd::RawFd) -> io::Result<()> {
    // SAFETY: a zeroed sockaddr with family AF_UNSPEC is a valid argument of its stated size.
    let rc = unsafe {
        let mut addr: libc::sockaddr = std::mem::zeroed();
        addr.sa_family = libc::AF_UNSPEC as libc::sa_family_t;
        libc::connect(
            fd,
            &addr,
            std::mem::size_of::<libc::sockaddr>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The pid of the process at the other end of a connected unix socket (for a socket a
/// listener accepted, the process that listened), from SO_PEERCRED.
pub fn peer_pid(stream: &std::os::unix::net::UnixStream) -> Option<i32> {
    use std::os::fd::AsRawFd;
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `cred`, a live ucred.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    (rc == 0 && cred.pid > 0).then_some(cred.pid)
}

/// Asks the kernel to timestamp what `fd` receives and hand the time to `recvmsg` as an
/// `SCM_TIMESTAMPNS` control message (`CLOCK_REALTIME`).
pub fn enable_receive_timestamps(fd: std::os::fd::RawFd) -> io::Result<()> {
    let on: libc::c_int = 1;
    // SAFETY: the option value is a c_int of the stated size, alive for the call.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_TIMESTAMPNS,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// A heap buffer aligned for O_DIRECT (the kernel wants the memory aligned, not only the
/// file offset), zero-filled, sent to the blocking pool and back.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
    layout: std::alloc::Layout,
}

// SAFETY: the buffer is plain owned memory; whoever holds the value owns the bytes.
unsafe impl Send for AlignedBuf {}

impl AlignedBuf {
    pub fn zeroed(len: usize, align: usize) -> AlignedBuf {
        let layout =
            std::alloc::Layout::from_size_align(len.max(align), align).expect("a valid layout");
        // SAFETY: the layout has a nonzero size (at least `align`, a power of two).
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        AlignedBuf { ptr, len, layout }
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` holds `len` (<= layout size) initialised bytes owned by this value.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` makes this the only view.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `zeroed` with this very layout, freed once.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

/// The running kernel's release (`uname -r`), `None` if `uname` fails.
pub fn kernel_release() -> Option<String> {
    let uts = nix::sys::utsname::uname().ok()?;
    Some(uts.release().to_string_lossy().into_owned())
}

/// The major and minor version a kernel release starts with (`6.18.44-foo`: (6, 18)); 0 for a
/// part that is not a number.
pub fn kernel_version(release: &str) -> (u32, u32) {
    let mut parts = release
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u32>().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_kernel_release_reads_as_its_major_and_minor() {
        assert_eq!(super::kernel_version("6.18.44-cloud-amd64"), (6, 18));
        assert_eq!(super::kernel_version("5.19.0"), (5, 19));
        assert_eq!(super::kernel_version("6.0"), (6, 0));
        assert_eq!(super::kernel_version("weird"), (0, 0));
        assert!(super::kernel_release().is_some_and(|r| super::kernel_version(&r) >= (5, 0)));
    }
}
