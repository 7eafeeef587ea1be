//! An idle server is idle to the kernel's accounting, not waiting for I/O. The kernel counts a
//! task that sleeps in `io_uring_enter` with any operation in flight (an armed receive, a poll)
//! as in I/O wait, and the CPU it sleeps on as `iowait` in `/proc/stat`: an idle Headroom made
//! its machine look disk-bound (`top` showed 50-100 % wa). Its sleeps ask for idle time
//! instead (`IORING_ENTER_NO_IOWAIT`, kernel 6.15+): the shards' ring, and glommio's own ring
//! for the placement executor and `--ring-sleep off` (glommio PATCHES.md, 10).
//!
//! Alone in its test binary, so no other test's server or file I/O shares the window: CI runs
//! test binaries one at a time. The server tests' passes (`scripts/test`) run it on every data
//! path.

mod common;

use std::time::Duration;

use common::server::Server;

/// (idle, iowait) clock ticks of the whole machine so far.
fn idle_and_iowait_ticks() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").expect("read /proc/stat");
    let cpu = stat
        .lines()
        .find(|line| line.starts_with("cpu "))
        .expect("the cpu line of /proc/stat");
    // cpu  user nice system idle iowait irq softirq steal ...
    let fields: Vec<u64> = cpu
        .split_whitespace()
        .skip(1)
        .map(|field| field.parse().expect("a tick count"))
        .collect();
    (fields[3], fields[4])
}

/// Whether the kernel can take a wait off the I/O-wait books: the feature bit the server
/// checks too (`IORING_FEAT_NO_IOWAIT`, kernel 6.15+).
fn kernel_has_no_iowait() -> bool {
    io_uring::IoUring::new(2).is_ok_and(|ring| ring.params().is_feature_no_iowait())
}

#[test]
fn an_idle_server_leaves_its_cpus_idle_not_in_iowait() {
    if !kernel_has_no_iowait() {
        eprintln!("skipped: this kernel counts every io_uring wait with work in flight as iowait");
        return;
    }
    let server = Server::start(&["--threads", "2", "--segment", "mem:size=64M,numa=0"]);
    // A connection with its receive armed, as a client between requests leaves one.
    let mut idle_client = server.client();
    assert_eq!(idle_client.set(b"k", b"v", 0, 0).status, 0);
    std::thread::sleep(Duration::from_millis(300));

    // Windows until one had enough idle time to judge (a busy host leaves little).
    let mut judged = Vec::new();
    for _ in 0..30 {
        let (idle_before, iowait_before) = idle_and_iowait_ticks();
        std::thread::sleep(Duration::from_secs(1));
        let (idle_after, iowait_after) = idle_and_iowait_ticks();
        let (idle, iowait) = (idle_after - idle_before, iowait_after - iowait_before);
        judged.push((idle, iowait));
        if idle + iowait >= 50 {
            // Before the fix every sleeping shard's CPU was all iowait: about half the
            // not-busy time or more on this 2-CPU machine.
            assert!(
                iowait * 5 < idle + iowait,
                "{iowait} of {} not-busy ticks in iowait with only an idle server running \
                 (windows: {judged:?})",
                idle + iowait
            );
            eprintln!("idle {idle} ticks, iowait {iowait} ticks over 1 s");
            return;
        }
    }
    // Other work held the CPUs for all 30 s: nothing was measured, so nothing is claimed
    // either way (a host too busy to measure is not a defect of the server).
    eprintln!(
        "NOT JUDGED: no 1 s window had 50 ticks of idle or iowait time, other work held the \
         CPUs: {judged:?}"
    );
}
