//! io_uring data-path benchmark: what a head send costs (plain copy + write, SEND, SEND_ZC from
//! a registered buffer) for heads of 4 KiB to 1 MiB, on 4 KiB pages and on hugetlb pages, and
//! whether SEND_ZC from a huge page slows down as the offset inside the page grows; then the
//! real server, ring against plain path, for heads and for large-object GETs beside the
//! device's sequential read bandwidth measured in the same run.
//!
//!   cargo bench --bench io [-- --rounds N] [-- --only primitives|offsets|heads|large|depth]
//!
//! `depth`: large GETs from a file segment with 1, 4 and 16 in flight over as many
//! connections, beside the device read by as many sequential readers in the same run, and
//! the first byte of a 4 MiB and a 64 MiB GET while those stream.
//!
//! Every figure is measured in this run; timings are medians of `--rounds` interleaved rounds.
//! Everything goes over loopback TCP, where the kernel copies a zero-copy send anyway (every
//! notification says so, and the tables count them): loopback shows the CPU cost and the
//! correctness of each path, not the gain a NIC with scatter-gather DMA would give.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::Instant;

use headroom::bench::process::{self, Started};
use io_uring::{cqueue, opcode, types, IoUring};

mod common;
use common::median;

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;
/// `IORING_SEND_ZC_REPORT_USAGE` and `IORING_NOTIF_USAGE_ZC_COPIED`.
const SEND_ZC_REPORT_USAGE: u16 = 1 << 3;
const NOTIF_USAGE_ZC_COPIED: u32 = 1 << 31;
const NR_HUGEPAGES: &str = "/proc/sys/vm/nr_hugepages";

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
    println!("| pages | head | offset | SEND_ZC p50 µs | SEND_ZC p99 µs | notification p50 µs | notification max ms | SEND p50 µs | SEND_ZC GB/s | SEND GB/s |");
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
                    n(&zc, 1.0) / 1e3,
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
    let rounds = common::arg(&args, "--rounds").unwrap_or(3);
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
    if wants("heads") || wants("large") || wants("depth") {
        let dir = std::env::temp_dir().join(format!("headroom-io-bench-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("bench directory");
        if wants("heads") {
            server_heads(rounds, &dir);
        }
        if wants("large") {
            server_large(rounds, &dir);
        }
        if wants("depth") {
            server_depth(rounds, &dir);
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// A headroom server started for the benchmark (`headroom::bench::process`); stopped on drop.
struct Server(Started);

impl Server {
    fn start(data_dir: &std::path::Path, args: &[&str]) -> Server {
        std::fs::create_dir_all(data_dir).expect("data dir");
        let mut all: Vec<String> = vec!["--log-level".into(), "info".into(), "--data-dir".into()];
        all.push(data_dir.display().to_string());
        all.extend(args.iter().map(|a| a.to_string()));
        let binary = std::path::Path::new(env!("CARGO_BIN_EXE_headroom"));
        Server(process::start_headroom(binary, &all).unwrap_or_else(|e| panic!("{e}")))
    }

    /// User + system CPU seconds of the whole server process so far.
    fn cpu_seconds(&self) -> f64 {
        process::process_cpu_seconds(self.0.pid()).expect("the server's /proc stat")
    }

    fn connect(&self) -> TcpStream {
        let stream = TcpStream::connect(self.0.addr).expect("connect");
        stream.set_nodelay(true).unwrap();
        stream
    }
}

fn request(opcode: u8, extras: &[u8], key: &[u8], value: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    headroom::proto::write_request(&mut out, opcode, (extras, key, value), 0, 0);
    out
}

/// Reads one response; returns (status, value length), checking the value's length and its
/// first and last byte against `expect`.
fn response(stream: &mut TcpStream, sink: &mut Vec<u8>, expect: Option<&[u8]>) -> (u16, usize) {
    let mut header = [0u8; 24];
    stream.read_exact(&mut header).expect("response header");
    let status = u16::from_be_bytes([header[6], header[7]]);
    let body = u32::from_be_bytes(header[8..12].try_into().unwrap()) as usize;
    let skip = header[4] as usize + u16::from_be_bytes([header[2], header[3]]) as usize;
    sink.resize(body, 0);
    stream.read_exact(sink).expect("response body");
    let value = &sink[skip..];
    if let (Some(expect), 0) = (expect, status) {
        assert_eq!(value.len(), expect.len(), "value length");
        assert!(value[0] == expect[0] && value[value.len() - 1] == expect[expect.len() - 1]);
    }
    (status, value.len())
}

fn set(stream: &mut TcpStream, key: &[u8], value: &[u8]) {
    let mut extras = [0u8; 8];
    extras[..4].copy_from_slice(&7u32.to_be_bytes());
    stream
        .write_all(&request(0x01, &extras, key, value))
        .unwrap();
    let (status, _) = response(stream, &mut Vec::new(), None);
    assert_eq!(status, 0, "SET of {} bytes failed", value.len());
}

fn value_of(len: usize, seed: usize) -> Vec<u8> {
    (0..len)
        .map(|i| ((i * 31 + seed * 7) % 251) as u8)
        .collect()
}

/// One measured window of GETs: bytes of values per second and server CPU per GB.
struct Window {
    gbps: f64,
    cpu_s_per_gb: f64,
    ops_per_s: f64,
}

/// GETs `keys` round-robin for `seconds`, `depth` requests in flight on one connection.
fn get_window(server: &Server, keys: &[(Vec<u8>, Vec<u8>)], depth: usize, seconds: f64) -> Window {
    let mut stream = server.connect();
    let mut sink = Vec::new();
    let (mut bytes, mut ops, mut k) = (0usize, 0usize, 0usize);
    let cpu = server.cpu_seconds();
    let started = Instant::now();
    while started.elapsed().as_secs_f64() < seconds {
        let mut batch = Vec::new();
        let mut expected = Vec::new();
        for _ in 0..depth {
            let (key, value) = &keys[k % keys.len()];
            k += 1;
            batch.extend_from_slice(&request(0x00, &[], key, &[]));
            expected.push((key, value));
        }
        stream.write_all(&batch).unwrap();
        for (key, value) in expected {
            let (status, len) = response(&mut stream, &mut sink, Some(value));
            assert_eq!(
                status,
                0,
                "GET {} missed ({} B value)",
                String::from_utf8_lossy(key),
                value.len()
            );
            bytes += len;
            ops += 1;
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    let cpu = server.cpu_seconds() - cpu;
    Window {
        gbps: bytes as f64 / elapsed / 1e9,
        cpu_s_per_gb: cpu / (bytes as f64 / 1e9),
        ops_per_s: ops as f64 / elapsed,
    }
}

/// A STAT `io` figure summed over shards.
fn io_stat(server: &Server, name: &str) -> u64 {
    let mut stream = server.connect();
    stream.write_all(&request(0x10, &[], b"io", &[])).unwrap();
    let mut sink = Vec::new();
    let mut total = 0;
    loop {
        let mut header = [0u8; 24];
        stream.read_exact(&mut header).unwrap();
        let key_len = u16::from_be_bytes([header[2], header[3]]) as usize;
        let body = u32::from_be_bytes(header[8..12].try_into().unwrap()) as usize;
        sink.resize(body, 0);
        stream.read_exact(&mut sink).unwrap();
        if key_len == 0 {
            return total;
        }
        let key = String::from_utf8_lossy(&sink[..key_len]);
        if key.split_once('_').is_some_and(|(_, rest)| rest == name) {
            total += String::from_utf8_lossy(&sink[key_len..])
                .parse::<u64>()
                .unwrap_or(0);
        }
    }
}

fn lent_plain_sends(server: &Server) -> u64 {
    io_stat(server, "lent_sends_kernel_copies") + io_stat(server, "lent_sends_huge_pages")
}

/// Heads through the real server: the plain path (copied into the reply, written by
/// glommio), the ring with heads copied into the reply (SEND), and the ring with heads lent
/// from the arena.
fn server_heads(rounds: usize, dir: &std::path::Path) {
    println!("\n## GET heads through the server: plain path, ring + copy, ring + lent\n");
    println!(
        "One shard (`--threads 1 --ram-head 1M --memory 256M`), one client connection, 4 GETs"
    );
    println!("in flight, 1.5 s windows; {rounds} rounds interleaved, medians. CPU is the server");
    println!("process's, per GB of values served.\n");
    let configs: [(&str, &[&str]); 3] = [
        ("plain (--io-ring off)", &["--io-ring", "off"]),
        (
            "ring, copied + SEND (--zero-copy-min 4095M)",
            &["--zero-copy-min", "4095M"],
        ),
        (
            "ring, lent (--zero-copy-min 4K)",
            &["--zero-copy-min", "4K"],
        ),
    ];
    let servers: Vec<Server> = configs
        .iter()
        .enumerate()
        .map(|(i, (_, args))| {
            // Room for every size's keys at once (about 234 MiB of heads): with less, the
            // 1 MiB heads' class evicts its own newest items, and their GETs miss.
            let mut all = vec![
                "--threads",
                "1",
                "--ram-head",
                "1M",
                "--memory",
                "512M",
                "--io-pool",
                "2M",
            ];
            all.extend_from_slice(args);
            Server::start(&dir.join(format!("heads-{i}")), &all)
        })
        .collect();
    println!("| head | path | GB/s | ops/s | server CPU s/GB | lent sends: SEND_ZC / SEND |");
    println!("| --- | --- | --- | --- | --- | --- |");
    for len in [4 * KIB, 16 * KIB, 64 * KIB, 128 * KIB, 256 * KIB, MIB] {
        let count = (64 * MIB / len).clamp(16, 512);
        let keys: Vec<(Vec<u8>, Vec<u8>)> = (0..count)
            .map(|i| (format!("h{len}-{i}").into_bytes(), value_of(len, i)))
            .collect();
        for server in &servers {
            let mut stream = server.connect();
            for (key, value) in &keys {
                set(&mut stream, key, value);
            }
        }
        let before: Vec<(u64, u64)> = servers
            .iter()
            .map(|s| (io_stat(s, "ops_send_zc"), lent_plain_sends(s)))
            .collect();
        let mut windows: Vec<Vec<Window>> = servers.iter().map(|_| Vec::new()).collect();
        for _ in 0..rounds {
            for (i, server) in servers.iter().enumerate() {
                windows[i].push(get_window(server, &keys, 4, 1.5));
            }
        }
        for (i, server) in servers.iter().enumerate() {
            let w = &windows[i];
            println!(
                "| {} | {} | {:.2} | {:.0} | {:.3} | {} / {} |",
                size_name(len),
                configs[i].0,
                median(w.iter().map(|x| x.gbps).collect()),
                median(w.iter().map(|x| x.ops_per_s).collect()),
                median(w.iter().map(|x| x.cpu_s_per_gb).collect()),
                io_stat(server, "ops_send_zc") - before[i].0,
                lent_plain_sends(server) - before[i].1,
            );
        }
    }
}

/// Sequential O_DIRECT read bandwidth of `path` over its first `bytes`: `depth` reads of
/// `chunk` bytes in flight (io_uring, as the server reads), GB/s.
fn device_read_gbps(path: &std::path::Path, bytes: usize, chunk: usize, depth: usize) -> f64 {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .expect("open the segment O_DIRECT");
    let memory = Memory::map(chunk * depth, Pages::Base).expect("buffers");
    let mut ring = IoUring::new(64).unwrap();
    let (mut next, mut done, mut in_flight) = (0usize, 0usize, 0usize);
    let started = Instant::now();
    while done < bytes {
        while in_flight < depth && next < bytes {
            let slot = (next / chunk) % depth;
            let entry = opcode::Read::new(
                types::Fd(file.as_raw_fd()),
                memory.ptr.wrapping_add(slot * chunk),
                chunk as u32,
            )
            .offset(next as u64)
            .build();
            // SAFETY: the buffer slot is not reused until its read completes.
            unsafe { ring.submission().push(&entry).unwrap() };
            next += chunk;
            in_flight += 1;
        }
        ring.submit_and_wait(1).unwrap();
        for cqe in ring.completion() {
            assert!(cqe.result() > 0, "O_DIRECT read failed: {}", cqe.result());
            done += chunk;
            in_flight -= 1;
        }
    }
    bytes as f64 / started.elapsed().as_secs_f64() / 1e9
}

/// CRC32C over `bytes` on one core, GB/s (best of three passes: the check's own cost).
fn crc32c_gbps(bytes: &[u8]) -> f64 {
    (0..3)
        .map(|_| {
            let started = Instant::now();
            std::hint::black_box(crc32c::crc32c(std::hint::black_box(bytes)));
            bytes.len() as f64 / started.elapsed().as_secs_f64() / 1e9
        })
        .fold(0.0, f64::max)
}

/// Large-object GETs from a file segment, ring against plain path, each with and without
/// `--verify-reads` (the CRC32C check on the way out), beside the device's sequential read
/// bandwidth measured on the same file and the CRC32C's own rate, in the same rounds.
fn server_large(rounds: usize, dir: &std::path::Path) {
    const OBJECT_BYTES: usize = 256 * MIB;
    const OBJECTS: usize = 3;
    println!("\n## Large-object GETs from a file segment, ring against plain path\n");
    println!("{OBJECTS} objects of 256 MiB on the default 1 GiB O_DIRECT file segment, one shard,");
    println!(
        "one connection, one GET at a time; {rounds} rounds interleaved (device, ring, plain),"
    );
    println!("medians. Device: sequential O_DIRECT reads of the same segment file, as the server");
    println!("reads (1 MiB, 4 in flight) and with 4 MiB reads 8 in flight. Each GET row runs with");
    println!("the read check on and with --verify-reads off. CRC32C: one core over");
    println!("one object in memory, the check's own cost.\n");
    // The memory segment takes the device out: what loopback and the client allow.
    let configs: [(&str, &[&str]); 6] = [
        ("ring", &[]),
        ("ring, --verify-reads off", &["--verify-reads", "off"]),
        ("plain (--io-ring off)", &["--io-ring", "off"]),
        (
            "plain, --verify-reads off",
            &["--io-ring", "off", "--verify-reads", "off"],
        ),
        // The default (`files`) checks file segments only: ask for the check here.
        (
            "ring, memory segment instead",
            &["--segment", "mem:size=1G,numa=0", "--verify-reads", "on"],
        ),
        (
            "ring, memory segment, --verify-reads off",
            &["--segment", "mem:size=1G,numa=0", "--verify-reads", "off"],
        ),
    ];
    let servers: Vec<(Server, std::path::PathBuf)> = configs
        .iter()
        .enumerate()
        .map(|(i, (_, args))| {
            let data = dir.join(format!("large-{i}"));
            let mut all = vec!["--threads", "1"];
            all.extend_from_slice(args);
            (Server::start(&data, &all), data.join("segment-0"))
        })
        .collect();
    let keys: Vec<(Vec<u8>, Vec<u8>)> = (0..OBJECTS)
        .map(|i| (format!("large-{i}").into_bytes(), value_of(OBJECT_BYTES, i)))
        .collect();
    for (server, _) in &servers {
        let mut stream = server.connect();
        for (key, value) in &keys {
            set(&mut stream, key, value);
        }
    }
    let segment = &servers[0].1;
    let (mut device, mut device_wide, mut crc) = (Vec::new(), Vec::new(), Vec::new());
    let mut windows: Vec<Vec<Window>> = servers.iter().map(|_| Vec::new()).collect();
    for _ in 0..rounds {
        device.push(device_read_gbps(segment, OBJECTS * OBJECT_BYTES, MIB, 4));
        device_wide.push(device_read_gbps(
            segment,
            OBJECTS * OBJECT_BYTES,
            4 * MIB,
            8,
        ));
        crc.push(crc32c_gbps(&keys[0].1));
        for (i, (server, _)) in servers.iter().enumerate() {
            windows[i].push(get_window(server, &keys, 1, 3.0));
        }
    }
    println!("| what | GB/s | server CPU s/GB |");
    println!("| --- | --- | --- |");
    println!(
        "| device, 1 MiB x 4 in flight | {:.2} | - |",
        median(device)
    );
    println!(
        "| device, 4 MiB x 8 in flight | {:.2} | - |",
        median(device_wide)
    );
    let crc = median(crc);
    println!(
        "| CRC32C, one core, in memory | {crc:.2} | {:.3} (CPU) |",
        1.0 / crc
    );
    for (i, (name, _)) in configs.iter().enumerate() {
        let w = &windows[i];
        println!(
            "| GET, {} | {:.2} | {:.3} |",
            name,
            median(w.iter().map(|x| x.gbps).collect()),
            median(w.iter().map(|x| x.cpu_s_per_gb).collect())
        );
    }
    let (server, _) = &servers[0];
    println!(
        "\nring server: read_fixed {} ops, send_zc {} ops, send {} ops, zc_copied {} of {} notifications, lent sends as SEND: {} (huge pages), {} (kernel copies); at most {} operations in flight.",
        io_stat(server, "ops_read_fixed"),
        io_stat(server, "ops_send_zc"),
        io_stat(server, "ops_send"),
        io_stat(server, "zc_copied"),
        io_stat(server, "zc_notifications"),
        io_stat(server, "lent_sends_huge_pages"),
        io_stat(server, "lent_sends_kernel_copies"),
        io_stat(server, "in_flight_max"),
    );
}

/// O_DIRECT read bandwidth of `path` by `streams` sequential readers at once, each over its
/// own `region` bytes (reader `i` from `i * region`, again from its start at the end) with
/// `depth` reads of `chunk` bytes in flight, all on one io_uring ring, for `seconds`: what the
/// server's GETs ask of the device when `streams` of them read ahead at once, reading the
/// same bytes again as GETs of the same objects do. GB/s over every reader's bytes.
fn device_streams_gbps(
    path: &std::path::Path,
    streams: usize,
    region: usize,
    (chunk, depth): (usize, usize),
    seconds: f64,
) -> f64 {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .expect("open the segment O_DIRECT");
    let memory = Memory::map(chunk * depth * streams, Pages::Base).expect("buffers");
    let mut ring = IoUring::new((streams * depth).next_power_of_two() as u32).unwrap();
    // Per reader: the next offset in its region, reads in flight.
    let mut next = vec![0usize; streams];
    let mut in_flight = vec![0usize; streams];
    let mut done = 0usize;
    let started = Instant::now();
    loop {
        let reading = started.elapsed().as_secs_f64() < seconds;
        if !reading && in_flight.iter().all(|&n| n == 0) {
            break;
        }
        for s in 0..streams {
            while reading && in_flight[s] < depth {
                if next[s] >= region {
                    next[s] = 0;
                }
                let slot = s * depth + (next[s] / chunk) % depth;
                let entry = opcode::Read::new(
                    types::Fd(file.as_raw_fd()),
                    memory.ptr.wrapping_add(slot * chunk),
                    chunk as u32,
                )
                .offset((s * region + next[s]) as u64)
                .build()
                .user_data(s as u64);
                // SAFETY: a slot is not reused until its read completes.
                unsafe { ring.submission().push(&entry).unwrap() };
                next[s] += chunk;
                in_flight[s] += 1;
            }
        }
        ring.submit_and_wait(1).unwrap();
        for cqe in ring.completion() {
            assert!(cqe.result() > 0, "O_DIRECT read failed: {}", cqe.result());
            done += chunk;
            in_flight[cqe.user_data() as usize] -= 1;
        }
    }
    done as f64 / started.elapsed().as_secs_f64() / 1e9
}

/// `connections` clients, one GET in flight each, each GETting its own objects of `keys`
/// (client `c` takes keys `c`, `c + connections`, ...) for `seconds`: GB/s of values and the
/// server's CPU per GB.
fn get_window_parallel(
    server: &Server,
    keys: &[(Vec<u8>, Vec<u8>)],
    connections: usize,
    seconds: f64,
) -> Window {
    let cpu = server.cpu_seconds();
    let started = Instant::now();
    let totals: Vec<(usize, usize)> = std::thread::scope(|scope| {
        let clients: Vec<_> = (0..connections)
            .map(|c| {
                let mine: Vec<&(Vec<u8>, Vec<u8>)> =
                    keys.iter().skip(c).step_by(connections).collect();
                let mut stream = server.connect();
                scope.spawn(move || {
                    let (mut bytes, mut ops, mut sink) = (0usize, 0usize, Vec::new());
                    while started.elapsed().as_secs_f64() < seconds {
                        let (key, value) = mine[ops % mine.len()];
                        stream.write_all(&request(0x00, &[], key, &[])).unwrap();
                        let (status, len) = response(&mut stream, &mut sink, Some(value));
                        assert_eq!(status, 0, "GET {} missed", String::from_utf8_lossy(key));
                        bytes += len;
                        ops += 1;
                    }
                    (bytes, ops)
                })
            })
            .collect();
        clients.into_iter().map(|c| c.join().unwrap()).collect()
    });
    let elapsed = started.elapsed().as_secs_f64();
    let cpu = server.cpu_seconds() - cpu;
    let bytes: usize = totals.iter().map(|t| t.0).sum();
    let ops: usize = totals.iter().map(|t| t.1).sum();
    Window {
        gbps: bytes as f64 / elapsed / 1e9,
        cpu_s_per_gb: cpu / (bytes as f64 / 1e9),
        ops_per_s: ops as f64 / elapsed,
    }
}

/// Time to the first byte and to the last of one GET of `key` on a fresh connection (µs).
fn first_and_last_byte_us(server: &Server, key: &[u8], len: usize) -> (f64, f64) {
    let mut stream = server.connect();
    let mut sink = vec![0u8; 1 << 20];
    let started = Instant::now();
    stream.write_all(&request(0x00, &[], key, &[])).unwrap();
    let mut got = stream.read(&mut sink).expect("the reply's first bytes");
    assert!(got > 0, "closed");
    let first = started.elapsed().as_secs_f64() * 1e6;
    let want = 24 + 4 + len;
    while got < want {
        let n = stream.read(&mut sink).expect("the reply");
        assert!(n > 0, "closed mid-reply");
        got += n;
    }
    (first, started.elapsed().as_secs_f64() * 1e6)
}

/// Large GETs from a file segment at several depths beside the device, then first-byte
/// latency of a 4 MiB and a 64 MiB GET while other GETs stream.
fn server_depth(rounds: usize, dir: &std::path::Path) {
    const OBJECT_BYTES: usize = 48 * MIB;
    const OBJECTS: usize = 16;
    const DEPTHS: [usize; 3] = [1, 4, 16];
    println!("\n## Large GETs from a file segment, 1, 4 and 16 in flight, beside the device\n");
    println!("{OBJECTS} objects of 48 MiB on the default 1 GiB O_DIRECT file segment, a shard per");
    println!("CPU; N connections with one GET in flight each, each GETting its own objects, 2 s");
    println!("windows. Device: N sequential O_DIRECT readers at once for 2 s, each over 48 MiB of");
    println!("the same file again and again (as GETs of the same objects read them), 1 MiB reads");
    println!(
        "4 in flight each (as each GET reads ahead), on one ring. {rounds} rounds interleaved,"
    );
    println!("medians; client, server and device reader share the CPUs.\n");
    let server = Server::start(&dir.join("depth"), &[]);
    let segment = dir.join("depth").join("segment-0");
    let keys: Vec<(Vec<u8>, Vec<u8>)> = (0..OBJECTS)
        .map(|i| (format!("deep-{i}").into_bytes(), value_of(OBJECT_BYTES, i)))
        .collect();
    {
        let mut stream = server.connect();
        for (key, value) in &keys {
            set(&mut stream, key, value);
        }
    }
    let mut device: Vec<Vec<f64>> = DEPTHS.iter().map(|_| Vec::new()).collect();
    let mut gets: Vec<Vec<Window>> = DEPTHS.iter().map(|_| Vec::new()).collect();
    for _ in 0..rounds {
        for (d, &n) in DEPTHS.iter().enumerate() {
            device[d].push(device_streams_gbps(
                &segment,
                n,
                OBJECT_BYTES,
                (MIB, 4),
                2.0,
            ));
            gets[d].push(get_window_parallel(&server, &keys, n, 2.0));
        }
    }
    println!("| GETs in flight | device GB/s | GET GB/s | GET / device | server CPU s/GB |");
    println!("| --- | --- | --- | --- | --- |");
    for (d, &n) in DEPTHS.iter().enumerate() {
        let dev = median(device[d].clone());
        let get = median(gets[d].iter().map(|w| w.gbps).collect());
        println!(
            "| {n} | {dev:.2} | {get:.2} | {:.2} | {:.3} |",
            get / dev,
            median(gets[d].iter().map(|w| w.cpu_s_per_gb).collect())
        );
    }
    // First byte while 4 other GETs stream.
    let probes: Vec<(Vec<u8>, usize)> = vec![
        (b"probe-4m".to_vec(), 4 * MIB),
        (b"probe-64m".to_vec(), 64 * MIB),
    ];
    {
        let mut stream = server.connect();
        for (i, (key, len)) in probes.iter().enumerate() {
            set(&mut stream, key, &value_of(*len, 100 + i));
        }
    }
    println!("\nFirst byte and last byte of one GET on a fresh connection while 4 connections");
    println!(
        "stream 48 MiB GETs from the same segment; 40 probes each per round ({rounds} rounds).\n"
    );
    println!("| value | first byte p50 µs | p99 µs | last byte p50 µs | p99 µs |");
    println!("| --- | --- | --- | --- | --- |");
    for (key, len) in &probes {
        let stop = std::sync::atomic::AtomicBool::new(false);
        let (mut firsts, mut lasts) = (Vec::new(), Vec::new());
        std::thread::scope(|scope| {
            for c in 0..4 {
                let (server, keys, stop) = (&server, &keys, &stop);
                scope.spawn(move || {
                    let mut stream = server.connect();
                    let mut sink = Vec::new();
                    let mut k = c;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let (key, value) = &keys[k % keys.len()];
                        stream.write_all(&request(0x00, &[], key, &[])).unwrap();
                        response(&mut stream, &mut sink, Some(value));
                        k += 4;
                    }
                });
            }
            for _ in 0..rounds * 40 {
                let (first, last) = first_and_last_byte_us(&server, key, *len);
                firsts.push(first);
                lasts.push(last);
            }
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
        });
        firsts.sort_by(f64::total_cmp);
        lasts.sort_by(f64::total_cmp);
        println!(
            "| {} | {:.0} | {:.0} | {:.0} | {:.0} |",
            size_name(*len),
            percentile(&firsts, 0.5),
            percentile(&firsts, 0.99),
            percentile(&lasts, 0.5),
            percentile(&lasts, 0.99)
        );
    }
    println!(
        "\nring: read_fixed {} ops, GETs that waited for a pool chunk {}, at most {} operations in flight.",
        io_stat(&server, "ops_read_fixed"),
        io_stat(&server, "pool_waits"),
        io_stat(&server, "in_flight_max"),
    );
}
