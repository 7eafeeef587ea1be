//! Large values under misuse and failure: leases end when a connection dies with large GETs
//! queued, stalled large SETs and GETs respect --idle-timeout and shutdown, pipelined large GETs
//! stay within the output cap, swept items free their extents at once, large heads give way
//! to small values, and a mixed pipeline keeps its order.

mod common;

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use common::server::{frame, set_extras, Client, Server};

fn set_large(c: &mut Client, key: &[u8], len: usize) -> common::server::Response {
    let mut head = frame(0x01, &set_extras(7, 0), key, &[], 0, 1);
    head[8..12].copy_from_slice(&((8 + key.len() + len) as u32).to_be_bytes());
    c.send(&head);
    c.stream.write_all(&vec![0xabu8; len]).unwrap();
    c.recv().expect("a reply")
}

fn rss_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find(|l| l.starts_with("VmRSS:"))
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap()
}

/// Stops the server and says whether it exited within `limit`.
fn stops_within(server: Server, limit: Duration) -> bool {
    let (tx, rx) = std::sync::mpsc::channel();
    let pid = server.pid();
    std::thread::spawn(move || {
        let _ = tx.send(server.stop());
    });
    let ok = rx.recv_timeout(limit).is_ok();
    if !ok {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::SIGKILL,
        );
    }
    ok
}

/// A client pipelines several large GETs and goes away: only the GET being streamed releases
/// its lease; the others are dropped. The extents are then never freed after a DELETE.
fn lease_leak(threads: &str) {
    let server = Server::start(&["--threads", threads, "--segment", "mem:size=256M,numa=0"]);
    let mut c = server.client();
    let before = c.segment_used();
    assert_eq!(set_large(&mut c, b"big", 8 << 20).status, 0);
    {
        let mut d = server.client();
        let mut pipeline = Vec::new();
        for i in 0..4 {
            pipeline.extend(frame(0x00, &[], b"big", &[], 0, i));
        }
        d.send(&pipeline);
        let mut some = [0u8; 1024];
        d.stream.read_exact(&mut some).unwrap();
        // dropped with unread data: RST
    }
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(c.call(&frame(0x04, &[], b"big", &[], 0, 0)).status, 0);
    std::thread::sleep(Duration::from_millis(500));
    let _ = c.segment_used(); // lets pending frees go out
    std::thread::sleep(Duration::from_millis(300));
    let after = c.segment_used();
    assert_eq!(after, before, "extents leaked: {before} -> {after}");
}

#[test]
fn leases_end_when_a_connection_dies_local_owner() {
    lease_leak("1");
}

#[test]
fn leases_end_when_a_connection_dies_remote_owner() {
    lease_leak("2");
}

/// A client that sends a large SET header and part of the body, then stalls: idle timeout does
/// not apply, and SIGTERM cannot stop the server.
#[test]
fn a_stalled_large_set_is_closed_by_the_idle_timeout_and_shutdown() {
    let server = Server::start(&[
        "--threads",
        "1",
        "--idle-timeout",
        "1",
        "--segment",
        "mem:size=256M,numa=0",
    ]);
    let mut d = server.client();
    let mut head = frame(0x01, &set_extras(0, 0), b"slow", &[], 0, 1);
    head[8..12].copy_from_slice(&((8 + 4 + (8 << 20)) as u32).to_be_bytes());
    d.send(&head);
    d.stream.write_all(&vec![1u8; 1 << 20]).unwrap();
    d.stream
        .set_read_timeout(Some(Duration::from_secs(4)))
        .unwrap();
    let t = Instant::now();
    let closed = d.closed();
    eprintln!("closed by idle timeout: {closed} after {:?}", t.elapsed());
    let mut c = server.client();
    eprintln!("segment used while stalled: {}", c.segment_used());
    drop(c);
    let stopped = stops_within(server, Duration::from_secs(5));
    assert!(closed, "idle timeout did not close a stalled large SET");
    assert!(stopped, "SIGTERM did not stop the server within 5 s");
}

/// A client that asks for a large value and never reads: idle timeout does not apply, and
/// SIGTERM cannot stop the server.
#[test]
fn a_stalled_large_get_reader_is_closed_and_does_not_block_shutdown() {
    let server = Server::start(&[
        "--threads",
        "1",
        "--idle-timeout",
        "1",
        "--segment",
        "mem:size=256M,numa=0",
    ]);
    let mut c = server.client();
    assert_eq!(set_large(&mut c, b"big", 64 << 20).status, 0);
    drop(c);
    let mut d = server.client();
    d.send(&frame(0x00, &[], b"big", &[], 0, 1));
    std::thread::sleep(Duration::from_secs(4));
    let mut c = server.client();
    let conns = c.stat("", "curr_connections");
    eprintln!("curr_connections after 4 s with idle-timeout 1: {conns}");
    drop(c);
    let stopped = stops_within(server, Duration::from_secs(5));
    drop(d);
    assert!(stopped, "SIGTERM did not stop the server within 5 s");
    assert!(conns <= 1, "stalled reader not closed by the idle timeout");
}

/// Pipelined large GETs are not counted against the 1 MiB output cap: each one holds a
/// ram_head copy (and a lease) until it is streamed.
#[test]
fn pipelined_large_gets_stay_within_the_output_cap() {
    let server = Server::start(&[
        "--threads",
        "1",
        "--ram-head",
        "2M",
        "--segment",
        "mem:size=256M,numa=0",
    ]);
    let mut c = server.client();
    assert_eq!(set_large(&mut c, b"big", 4 << 20).status, 0);
    let base = rss_kib(server.pid());
    let mut d = server.client();
    let mut pipeline = Vec::new();
    for i in 0..600 {
        pipeline.extend(frame(0x00, &[], b"big", &[], 0, i));
    }
    d.send(&pipeline);
    std::thread::sleep(Duration::from_secs(2));
    let grown = rss_kib(server.pid()) - base;
    eprintln!("RSS grew by {} MiB for one connection", grown >> 10);
    assert!(grown < 64 << 10, "RSS grew by {} MiB", grown >> 10);
}

/// The expiry sweep frees a large item's extents into pending_frees; nothing sends them to
/// the master until some other traffic passes on that shard.
#[test]
fn swept_large_items_free_their_extents_at_once() {
    let server = Server::start(&["--threads", "1", "--segment", "mem:size=256M,numa=0"]);
    let mut c = server.client();
    let before = c.segment_used();
    let mut head = frame(0x01, &set_extras(0, 1), b"exp", &[], 0, 1);
    head[8..12].copy_from_slice(&((8 + 3 + (8 << 20)) as u32).to_be_bytes());
    c.send(&head);
    c.stream.write_all(&vec![1u8; 8 << 20]).unwrap();
    assert_eq!(c.recv().unwrap().status, 0);
    std::thread::sleep(Duration::from_secs(4));
    let first = c.segment_used();
    std::thread::sleep(Duration::from_millis(200));
    let second = c.segment_used();
    eprintln!("before {before} first STAT {first} second STAT {second}");
    assert_eq!(first, before, "swept extents wait for unrelated traffic");
}

#[test]
fn a_single_large_get_then_close_does_not_leak() {
    let server = Server::start(&["--threads", "1", "--segment", "mem:size=256M,numa=0"]);
    let mut c = server.client();
    let before = c.segment_used();
    assert_eq!(set_large(&mut c, b"big", 8 << 20).status, 0);
    {
        let mut d = server.client();
        d.send(&frame(0x00, &[], b"big", &[], 0, 1));
        let mut some = [0u8; 1024];
        d.stream.read_exact(&mut some).unwrap();
    }
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(c.call(&frame(0x04, &[], b"big", &[], 0, 0)).status, 0);
    std::thread::sleep(Duration::from_millis(300));
    let _ = c.segment_used();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(c.segment_used(), before);
}

#[test]
fn a_stalled_large_set_does_not_block_shutdown() {
    let server = Server::start(&["--threads", "1", "--segment", "mem:size=256M,numa=0"]);
    let mut d = server.client();
    let mut head = frame(0x01, &set_extras(0, 0), b"slow", &[], 0, 1);
    head[8..12].copy_from_slice(&((8 + 4 + (8 << 20)) as u32).to_be_bytes());
    d.send(&head);
    d.stream.write_all(&vec![1u8; 1 << 20]).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        stops_within(server, Duration::from_secs(5)),
        "SIGTERM did not stop the server"
    );
}

#[test]
fn a_mixed_pipeline_of_small_and_large_keeps_its_order() {
    let server = Server::start(&["--threads", "2", "--segment", "mem:size=512M,numa=0"]);
    let mut c = server.client();
    let large = |i: u8| vec![i; (1 << 20) + 4097 * i as usize];
    for i in 0..6u8 {
        assert_eq!(c.set(format!("s{i}").as_bytes(), &[i; 10], 0, 0).status, 0);
        assert_eq!(
            set_large(&mut c, format!("l{i}").as_bytes(), large(i).len()).status,
            0
        );
    }
    // rewrite large values with their pattern
    for i in 0..6u8 {
        let key = format!("l{i}");
        let v = large(i);
        let mut head = frame(0x01, &set_extras(0, 0), key.as_bytes(), &[], 0, 1);
        head[8..12].copy_from_slice(&((8 + key.len() + v.len()) as u32).to_be_bytes());
        c.send(&head);
        c.stream.write_all(&v).unwrap();
        assert_eq!(c.recv().unwrap().status, 0);
    }
    let mut pipe = Vec::new();
    let mut expect: Vec<(u32, Vec<u8>)> = Vec::new();
    let mut op = 100u32;
    for round in 0..2 {
        for i in 0..6u8 {
            pipe.extend(frame(0x00, &[], format!("s{i}").as_bytes(), &[], 0, op));
            expect.push((op, vec![i; 10]));
            op += 1;
            pipe.extend(frame(0x00, &[], format!("l{i}").as_bytes(), &[], 0, op));
            expect.push((op, large(i)));
            op += 1;
        }
        if round == 0 {
            // a large SET in the middle, overwriting l0 with l5's pattern
            let v = large(5);
            let mut head = frame(0x01, &set_extras(0, 0), b"l0", &[], 0, op);
            head[8..12].copy_from_slice(&((8 + 2 + v.len()) as u32).to_be_bytes());
            pipe.extend(head);
            pipe.extend(&v);
            expect.push((op, vec![]));
            op += 1;
        }
    }
    // after the SET, l0 holds large(5)
    let set_at = expect.iter().position(|(_, v)| v.is_empty()).unwrap();
    for (o, v) in expect.iter_mut().skip(set_at + 1) {
        let _ = o;
        if *v == large(0) {
            *v = large(5);
        }
    }
    let writer = {
        let mut s = c.stream.try_clone().unwrap();
        std::thread::spawn(move || s.write_all(&pipe).unwrap())
    };
    for (o, v) in &expect {
        let r = c.recv().unwrap();
        assert_eq!(r.opaque, *o, "reply out of order");
        assert_eq!(r.status, 0);
        assert!(r.value == *v, "value of op {o} differs");
    }
    writer.join().unwrap();
}

/// Head copies of large items take fixed slots (whole arena blocks in shared mode): they must
/// give way when small values need the room, or enough large values wedge the RAM cache.
#[test]
fn large_heads_give_way_to_small_sets() {
    const LARGES: usize = 48;
    let server = Server::start(&[
        "--threads",
        "1",
        "--memory",
        "8M",
        "--segment",
        "mem:size=256M,numa=0",
    ]);
    let mut c = server.client();
    for i in 0..LARGES {
        let r = set_large(&mut c, format!("large-{i}").as_bytes(), 300 << 10);
        assert_eq!(r.status, 0, "large {i}: {r:?}");
    }
    let mut failed = 0;
    for i in 0..60000 {
        let r = c.set(format!("small-{i}").as_bytes(), &[1u8; 100], 0, 0);
        if r.status != 0 {
            failed += 1;
        }
    }
    eprintln!(
        "small SETs failed: {failed} of 60000; evictions {}",
        c.stat("", "evictions")
    );
    assert_eq!(
        failed, 0,
        "small SETs fail: large heads/records are unevictable"
    );
}

/// A client that asks for a large value and never reads, with no idle timeout: the stop lets
/// a connection finish writing for a grace of one second, then shuts its socket down, so
/// SIGTERM still stops the server.
#[test]
fn a_reader_that_never_reads_is_cut_off_after_the_stop() {
    let server = Server::start(&["--threads", "1", "--segment", "mem:size=256M,numa=0"]);
    let mut c = server.client();
    assert_eq!(set_large(&mut c, b"big", 64 << 20).status, 0);
    let mut d = server.client();
    d.send(&frame(0x00, &[], b"big", &[], 0, 1));
    // Long enough for the socket buffers to fill and the send to wait for room.
    std::thread::sleep(Duration::from_millis(500));
    let stopped = stops_within(server, Duration::from_secs(5));
    drop(d);
    drop(c);
    assert!(stopped, "SIGTERM did not stop the server within 5 s");
}

/// With a streaming pool of two chunks and eight large GETs at once from a file segment, a GET
/// that finds the pool dry waits for a chunk (never holding one while it waits, so no two
/// GETs wait on each other): every value comes back whole, and the waits are counted.
#[test]
fn large_gets_wait_their_turn_for_a_dry_streaming_pool() {
    let server = Server::start(&["--threads", "1", "--io-pool", "2M"]);
    let values: Vec<Vec<u8>> = (0..8).map(|i| common::pattern(i, 6 << 20)).collect();
    let mut c = server.client();
    for (i, value) in values.iter().enumerate() {
        let r = c.set_streamed(0x01, format!("pooled{i}").as_bytes(), value, 0);
        assert_eq!(r.status, 0);
    }
    std::thread::scope(|scope| {
        for (i, value) in values.iter().enumerate() {
            let server = &server;
            scope.spawn(move || {
                let mut c = server.client();
                for _ in 0..3 {
                    let got = c.get(format!("pooled{i}").as_bytes());
                    assert_eq!(got.status, 0);
                    assert!(got.value == *value, "pooled{i} came back different");
                }
            });
        }
    });
    let on_ring = std::env::var("HEADROOM_TEST_IO_RING").map_or(true, |v| v != "off");
    if on_ring {
        assert!(
            c.stat("io", "shard0_pool_waits") > 0,
            "no GET found the pool dry"
        );
    }
}
