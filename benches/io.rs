//! io_uring data-path benchmark: what a head send costs (plain copy + write, SEND, SEND_ZC from
//! a registered buffer) for heads of 4 KiB to 1 MiB, on 4 KiB pages and on hugetlb pages, and
//! whether SEND_ZC from a huge page slows down as the offset inside the page grows; then the
//! real server, ring against plain path, for heads and for large-object GETs beside the
//! device's sequential read bandwidth measured in the same run.
//!
//!   cargo bench --bench io [-- --rounds N] [-- --only primitives|offsets|heads|large]
//!
//! Every figure is measured in this run; timings are medians of `--rounds` interleaved rounds.
//! Everything goes over loopback TCP, where the kernel copies a zero-copy send anyway (every
//! notification says so, and the tables count them): loopback shows the CPU cost and the
//! correctness of each path, not the gain a NIC with scatter-gather DMA would give.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use io_uring::{cqueue, opcode, types, IoUring};

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;
/// `IORING_SEND_ZC_REPORT_USAGE` and `IORING_NOTIF_USAGE_ZC_COPIED`.
const SEND_ZC_REPORT_USAGE: u16 = 1 << 3;
const NOTIF_USAGE_ZC_COPIED: u32 = 1 << 31;
const NR_HUGEPAGES: &str = "/proc/sys/vm/nr_hugepages";

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(|a, b| a.partial_cmp(b).unwrap());
    values[values.len() / 2]
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn size_name(bytes: usize) -> String {
    if bytes >= MIB {
        format!("{} MiB", bytes / MIB)
    } else {
        format!("{} KiB", bytes / KIB)
    }
}

/// CPU seconds this thread has used.
fn thread_cpu_seconds() -> f64 {
    // SAFETY: getrusage fills the struct it is given.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut usage) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// Huge pages reserved for the benchmark; the old `nr_hugepages` comes back on drop.
struct HugePages {
    old: Option<usize>,
}

impl HugePages {
    fn reserve(pages: usize) -> HugePages {
        let read = || {
            std::fs::read_to_string(NR_HUGEPAGES)
                .ok()?
                .trim()
                .parse::<usize>()
                .ok()
        };
        let Some(old) = read() else {
            return HugePages { old: None };
        };
        let free = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| {
                m.lines()
                    .find(|l| l.starts_with("HugePages_Free:"))
                    .and_then(|l| l.split_whitespace().nth(1)?.parse::<usize>().ok())
            })
            .unwrap_or(0);
        if free >= pages {
            return HugePages { old: None };
        }
        if std::fs::write(NR_HUGEPAGES, (old + pages - free).to_string()).is_err() {
            return HugePages { old: None };
        }
        HugePages { old: Some(old) }
    }
}

impl Drop for HugePages {
    fn drop(&mut self) {
        if let Some(old) = self.old {
            let _ = std::fs::write(NR_HUGEPAGES, old.to_string());
        }
    }
}

/// Anonymous memory, populated, on 4 KiB or huge pages.
struct Memory {
    ptr: *mut u8,
    len: usize,
    pages: Pages,
}

#[derive(Clone, Copy, PartialEq)]
enum Pages {
    Base,
    /// Transparent huge pages (madvised), as a mapping gets under THP `always`.
    Transparent,
    HugeTlb,
}

impl Memory {
    fn map(len: usize, pages: Pages) -> Option<Memory> {
        let flags = libc::MAP_PRIVATE
            | libc::MAP_ANONYMOUS
            | if pages == Pages::HugeTlb {
                libc::MAP_HUGETLB
            } else {
                0
            };
        // Room to align a transparent huge page mapping to 2 MiB.
        let mapped = len
            + if pages == Pages::Transparent {
                2 * MIB
            } else {
                0
            };
        // SAFETY: a fresh anonymous mapping, owned by the returned value and unmapped on drop
        // (a transparent one leaks its alignment slack: a benchmark's few MiB).
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                mapped,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return None;
        }
        let mut ptr = ptr as *mut u8;
        if pages == Pages::Transparent {
            ptr = ptr.wrapping_add((2 * MIB - ptr as usize % (2 * MIB)) % (2 * MIB));
            // SAFETY: advice on our own mapping.
            unsafe { libc::madvise(ptr as *mut libc::c_void, len, libc::MADV_HUGEPAGE) };
        }
        let mut memory = Memory { ptr, len, pages };
        for (i, byte) in memory.slice_mut().iter_mut().enumerate() {
            *byte = (i % 251) as u8;
        }
        Some(memory)
    }

    fn slice_mut(&mut self) -> &mut [u8] {
        // SAFETY: the mapping is `len` bytes, readable and writable, alive as long as `self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    fn slice(&self) -> &[u8] {
        // SAFETY: as above, shared.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    fn pages(&self) -> &'static str {
        match self.pages {
            Pages::Base => "4 KiB",
            Pages::Transparent => "2 MiB THP",
            Pages::HugeTlb => "2 MiB hugetlb",
        }
    }
}

impl Drop for Memory {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `map`.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
    }
}

/// A loopback connection whose far end a thread drains; the byte count comes back on join.
struct Loopback {
    sender: TcpStream,
    drain: std::thread::JoinHandle<u64>,
}

impl Loopback {
    fn open() -> Loopback {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let sender = TcpStream::connect(listener.local_addr().unwrap()).expect("connect");
        sender.set_nodelay(true).unwrap();
        let (mut receiver, _) = listener.accept().expect("accept");
        let drain = std::thread::spawn(move || {
            let mut buf = vec![0u8; 4 * MIB];
            let mut total = 0u64;
            loop {
                match receiver.read(&mut buf) {
                    Ok(0) | Err(_) => return total,
                    Ok(n) => total += n as u64,
                }
            }
        });
        Loopback { sender, drain }
    }

    fn close(self) -> u64 {
        drop(self.sender);
        self.drain.join().unwrap()
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    /// What the plain path does: copy the head into the reply buffer, then write(2).
    CopyWrite,
    /// io_uring SEND straight from the head's bytes (the kernel copies into the socket).
    Send,
    /// io_uring SEND_ZC from the registered buffer; the bytes are lent until the notification.
    SendZc,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::CopyWrite => "copy + write",
            Mode::Send => "SEND",
            Mode::SendZc => "SEND_ZC fixed",
        }
    }
}

/// One measured series of sends.
struct Series {
    gbps: f64,
    cpu_s_per_gb: f64,
    /// Submission to the completion that lets the connection go on (µs).
    send_us: Vec<f64>,
    /// Submission to the notification that frees the bytes (SEND_ZC only; µs).
    notif_us: Vec<f64>,
    copied: usize,
    notifications: usize,
}

/// Sends `count` heads of `len` bytes from `memory` at `offsets` (cycled) with `mode`.
fn send_series(memory: &Memory, len: usize, offsets: &[usize], count: usize, mode: Mode) -> Series {
    let link = Loopback::open();
    let fd = link.sender.as_raw_fd();
    let mut ring = IoUring::new(256).expect("io_uring");
    let iovec = libc::iovec {
        iov_base: memory.ptr as *mut libc::c_void,
        iov_len: memory.len,
    };
    // SAFETY: the registered memory outlives the ring (both live to the end of this function).
    unsafe {
        ring.submitter()
            .register_buffers(&[iovec])
            .expect("register buffers")
    };
    let mut copy = vec![0u8; len];
    let source = memory.slice();
    let mut send_us = Vec::with_capacity(count);
    let mut notif_us = Vec::new();
    let mut submitted_at: Vec<Instant> = Vec::with_capacity(count);
    let (copied, notifications) = (std::cell::Cell::new(0), std::cell::Cell::new(0));
    let cpu = thread_cpu_seconds();
    let started = Instant::now();
    let reap = |ring: &mut IoUring, submitted_at: &[Instant], notif_us: &mut Vec<f64>| {
        let mut done = None;
        for cqe in ring.completion() {
            let i = cqe.user_data() as usize;
            if cqueue::notif(cqe.flags()) {
                notifications.set(notifications.get() + 1);
                notif_us.push(submitted_at[i].elapsed().as_secs_f64() * 1e6);
                if cqe.result() as u32 & NOTIF_USAGE_ZC_COPIED != 0 {
                    copied.set(copied.get() + 1);
                }
            } else {
                assert!(cqe.result() >= 0, "send failed: {}", cqe.result());
                done = Some(cqe.result() as usize);
            }
        }
        done
    };
    for i in 0..count {
        let offset = offsets[i % offsets.len()];
        let head = &source[offset..offset + len];
        let at = Instant::now();
        submitted_at.push(at);
        if mode == Mode::CopyWrite {
            copy.copy_from_slice(head);
            (&link.sender).write_all(&copy).expect("write");
            send_us.push(at.elapsed().as_secs_f64() * 1e6);
            continue;
        }
        let mut sent = 0;
        while sent < len {
            let ptr = head[sent..].as_ptr();
            let left = (len - sent) as u32;
            let entry = match mode {
                Mode::Send => opcode::Send::new(types::Fd(fd), ptr, left).build(),
                _ => opcode::SendZc::new(types::Fd(fd), ptr, left)
                    .buf_index(Some(0))
                    .zc_flags(SEND_ZC_REPORT_USAGE)
                    .build(),
            }
            .user_data(i as u64);
            // SAFETY: the bytes stay mapped and unchanged until every completion is reaped.
            unsafe { ring.submission().push(&entry).expect("sq room") };
            ring.submit_and_wait(1).expect("submit");
            loop {
                if let Some(n) = reap(&mut ring, &submitted_at, &mut notif_us) {
                    sent += n;
                    break;
                }
                ring.submit_and_wait(1).expect("wait");
            }
        }
        send_us.push(at.elapsed().as_secs_f64() * 1e6);
    }
    // The notifications still due free their bytes; the series ends when the last has come.
    while mode == Mode::SendZc && notifications.get() < count {
        ring.submit_and_wait(1).expect("wait");
        reap(&mut ring, &submitted_at, &mut notif_us);
    }
    let seconds = started.elapsed().as_secs_f64();
    if std::env::var("IO_BENCH_DEBUG").is_ok() {
        let (imax, max) =
            notif_us
                .iter()
                .enumerate()
                .fold((0, 0.0), |a, (i, v)| if *v > a.1 { (i, *v) } else { a });
        let slow: Vec<usize> = notif_us
            .iter()
            .enumerate()
            .filter(|(_, v)| **v > 10_000.0)
            .map(|(i, _)| i)
            .collect();
        eprintln!(
            "debug: {} notifs, max {max:.0} us at #{imax}, over 10 ms: {slow:?}, {seconds:.3}s",
            notif_us.len()
        );
    }
    let cpu = thread_cpu_seconds() - cpu;
    let bytes = (len * count) as f64;
    let received = link.close();
    assert_eq!(received, bytes as u64, "the far end got every byte");
    Series {
        gbps: bytes / seconds / 1e9,
        cpu_s_per_gb: cpu / (bytes / 1e9),
        send_us,
        notif_us,
        copied: copied.get(),
        notifications: notifications.get(),
    }
}

/// Plain copy, SEND and SEND_ZC for heads of 4 KiB to 1 MiB, on both page kinds.
fn primitives(rounds: usize, memories: &[&Memory]) {
    println!("\n## Head sends over loopback: copy + write, SEND, SEND_ZC (sender thread)\n");
    println!(
        "{} rounds interleaved, medians; 64 MiB per series; offsets cycle through the buffer.",
        rounds
    );
    println!("CPU is the sending thread's (user + system, which on loopback includes delivery).\n");
    println!("| pages | head | mode | GB/s | CPU s/GB | send p50 µs | send p99 µs | notification p50 µs | copied by kernel |");
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    let modes = [Mode::CopyWrite, Mode::Send, Mode::SendZc];
    for memory in memories {
        for len in [4 * KIB, 16 * KIB, 64 * KIB, 256 * KIB, MIB] {
            let count = (64 * MIB / len).max(2000);
            let offsets: Vec<usize> = (0..memory.len / len).map(|k| k * len).collect();
            let mut results: Vec<Vec<Series>> = modes.iter().map(|_| Vec::new()).collect();
            for _ in 0..rounds {
                for (m, mode) in modes.iter().enumerate() {
                    results[m].push(send_series(memory, len, &offsets, count, *mode));
                }
            }
            for (m, mode) in modes.iter().enumerate() {
                let series = &results[m];
                let gbps = median(series.iter().map(|s| s.gbps).collect());
                let cpu = median(series.iter().map(|s| s.cpu_s_per_gb).collect());
                let mut sends: Vec<f64> = series.iter().flat_map(|s| s.send_us.clone()).collect();
                sends.sort_by(|a, b| a.partial_cmp(b).unwrap());
                let mut notifs: Vec<f64> = series.iter().flat_map(|s| s.notif_us.clone()).collect();
                notifs.sort_by(|a, b| a.partial_cmp(b).unwrap());
                let notif = if notifs.is_empty() {
                    "-".to_string()
                } else {
                    format!("{:.1}", percentile(&notifs, 0.5))
                };
                let copied = if *mode == Mode::SendZc {
                    let (c, n) = series
                        .iter()
                        .fold((0, 0), |(c, n), s| (c + s.copied, n + s.notifications));
                    format!("{c} of {n}")
                } else {
                    "-".to_string()
                };
                println!(
                    "| {} | {} | {} | {:.2} | {:.3} | {:.1} | {:.1} | {} | {} |",
                    memory.pages(),
                    size_name(len),
                    mode.name(),
                    gbps,
                    cpu,
                    percentile(&sends, 0.5),
                    percentile(&sends, 0.99),
                    notif,
                    copied
                );
            }
        }
    }
}

/// SEND_ZC (and SEND, for contrast) of 64 KiB and 1 MiB at growing offsets inside a huge page,
/// beside the same offsets in 4 KiB-page memory.
fn offsets(rounds: usize, memories: &[&Memory]) {
    println!("\n## SEND_ZC by offset inside a 2 MiB page (the spike saw hugetlb stall here)\n");
    println!("Per-send latency, submission to the completion; medians over {rounds} rounds of 500 sends.\n");
    println!("| pages | head | offset | SEND_ZC p50 µs | SEND_ZC p99 µs | notification p50 µs | notification p99 µs | SEND p50 µs | SEND_ZC GB/s | SEND GB/s |");
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    for memory in memories {
        for (len, offsets) in [
            (
                64 * KIB,
                vec![0, 256 * KIB, 1024 * KIB, 1536 * KIB, 1984 * KIB],
            ),
            (MIB, vec![0, 512 * KIB, 1024 * KIB]),
        ] {
            for offset in offsets {
                let (mut zc, mut send) = (Vec::new(), Vec::new());
                for _ in 0..rounds {
                    zc.push(send_series(memory, len, &[offset], 500, Mode::SendZc));
                    send.push(send_series(memory, len, &[offset], 500, Mode::Send));
                }
                let p = |series: &[Series], q: f64| {
                    median(
                        series
                            .iter()
                            .map(|s| {
                                let mut v = s.send_us.clone();
                                v.sort_by(|a, b| a.partial_cmp(b).unwrap());
                                percentile(&v, q)
                            })
                            .collect(),
                    )
                };
                let n = |series: &[Series], q: f64| {
                    median(
                        series
                            .iter()
                            .map(|s| {
                                let mut v = s.notif_us.clone();
                                v.sort_by(|a, b| a.partial_cmp(b).unwrap());
                                percentile(&v, q)
                            })
                            .collect(),
                    )
                };
                println!(
                    "| {} | {} | {} KiB | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.2} | {:.2} |",
                    memory.pages(),
                    size_name(len),
                    offset / KIB,
                    p(&zc, 0.5),
                    p(&zc, 0.99),
                    n(&zc, 0.5),
                    n(&zc, 0.99),
                    p(&send, 0.5),
                    median(zc.iter().map(|s| s.gbps).collect()),
                    median(send.iter().map(|s| s.gbps).collect()),
                );
            }
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let rounds = args
        .iter()
        .position(|a| a == "--rounds")
        .and_then(|i| args.get(i + 1)?.parse().ok())
        .unwrap_or(3);
    let only = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1).cloned());
    let wants = |section: &str| only.as_deref().is_none_or(|o| o == section);

    println!("# io_uring data path benchmark");
    let _reserved = HugePages::reserve(4);
    let small = Memory::map(4 * MIB, Pages::Base).expect("map 4 KiB pages");
    let transparent = Memory::map(4 * MIB, Pages::Transparent).expect("map THP");
    let huge = Memory::map(4 * MIB, Pages::HugeTlb);
    if huge.is_none() {
        println!("\nnote: no huge pages could be reserved (not root?); hugetlb rows are left out");
    }
    let mut memories = vec![&small, &transparent];
    if let Some(huge) = &huge {
        memories.push(huge);
    }
    if wants("primitives") {
        primitives(rounds, &memories);
    }
    if wants("offsets") {
        offsets(rounds, &memories);
    }
    let _ = (
        Duration::ZERO,
        Stdio::null(),
        std::any::type_name::<Child>(),
        Command::new("true"),
    );
}
