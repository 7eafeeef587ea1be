//! Thousands of client connections against the real server: every one is served, idle ones
//! hold little memory (the RSS bound of issue 54: `--memory` + 100 MiB + 2 KiB per
//! connection, and a growth per connection far below the 27 KiB a connection once took),
//! and STAT says what they hold. The figure itself (1.9 KiB on the ring path here) is the
//! many-connections benchmark's (`scripts/bench-conns`); this asserts the behaviour.

mod common;

use std::collections::HashMap;
use std::io::Write;
use std::net::TcpStream;
use std::time::Duration;

use common::server::Server;

/// Connections opened in all.
const CONNECTIONS: usize = 4000;
/// RSS growth per connection above which something holds a busy connection's worth again.
const GROWTH_MAX_BYTES: u64 = 3 << 10;
/// With one-shot receives (`--multishot-receive off`, kernels before 6.0) a receive needs its
/// buffer while it waits: an idle connection holds its 16 KiB read buffer (docs/server.md).
const ONE_SHOT_GROWTH_MAX_BYTES: u64 = 20 << 10;

fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/PID/status");
    kib << 10
}

/// The open-files limit of this process, raised to its hard limit (the server, a child,
/// raises its own).
fn raise_open_files() -> u64 {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard).unwrap();
    hard
}

/// Sends `request` and reads until the reply ends with `end`.
fn ask(c: &mut TcpStream, request: &[u8], end: &[u8]) -> Vec<u8> {
    c.write_all(request).unwrap();
    read_until(c, end)
}

fn read_until(c: &mut TcpStream, end: &[u8]) -> Vec<u8> {
    common::server::read_text_reply(c, end, 0)
}

/// The general STAT group, numbers only, from a fresh connection.
fn stats(server: &Server) -> HashMap<String, u64> {
    server
        .client()
        .stats("")
        .into_iter()
        .filter_map(|(name, value)| Some((name, value.parse().ok()?)))
        .collect()
}

/// Opens connections until there are `to`, each storing its own key.
fn open_to(server: &Server, conns: &mut Vec<TcpStream>, to: usize) {
    while conns.len() < to {
        let i = conns.len();
        let mut c = TcpStream::connect(server.addr).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let reply = ask(
            &mut c,
            format!("set k{i} 0 0 5\r\nv{i:04}\r\n").as_bytes(),
            b"\r\n",
        );
        assert_eq!(reply, b"STORED\r\n", "connection {i}");
        conns.push(c);
    }
}

#[test]
fn thousands_of_connections_are_served_and_idle_ones_hold_little() {
    let hard = raise_open_files();
    if hard < CONNECTIONS as u64 + 512 {
        println!("skipped: an open-files hard limit of {hard} is too low here");
        return;
    }
    let server = Server::start(&["--threads", "2", "--max-connections", "5000"]);
    let pid = server.pid();
    let mut conns = Vec::new();
    // A thousand first, each asking twice: every shard's receive buffers (512 of 8 KiB, taken
    // in turn by arrivals) are touched before the growth is measured.
    open_to(&server, &mut conns, 1000);
    for (i, c) in conns.iter_mut().enumerate() {
        let reply = ask(c, format!("get k{i}\r\n").as_bytes(), b"END\r\n");
        assert!(reply.starts_with(b"VALUE"), "connection {i}");
    }
    std::thread::sleep(Duration::from_millis(300));
    let (first, rss_first) = (conns.len(), rss_bytes(pid));
    open_to(&server, &mut conns, CONNECTIONS);
    std::thread::sleep(Duration::from_millis(300));
    let rss_all = rss_bytes(pid);
    let growth = rss_all.saturating_sub(rss_first) / (CONNECTIONS - first) as u64;
    println!(
        "RSS {} MiB with {first} connections, {} MiB with {CONNECTIONS}: {growth} bytes per connection",
        rss_first >> 20,
        rss_all >> 20
    );
    let one_shot = std::env::var("HEADROOM_TEST_MULTISHOT").is_ok_and(|v| v == "off")
        && std::env::var("HEADROOM_TEST_IO_RING").map_or(true, |v| v != "off");
    let growth_max = match one_shot {
        true => ONE_SHOT_GROWTH_MAX_BYTES,
        false => GROWTH_MAX_BYTES,
    };
    // Under AddressSanitizer (scripts/test-asan) the RSS is mostly the sanitizer's.
    let asan = std::env::var_os("HEADROOM_TEST_ASAN").is_some();
    assert!(
        asan || growth <= growth_max,
        "an idle connection holds {growth} bytes"
    );

    // Every connection asks at once, then every one reads its own value.
    for (i, c) in conns.iter_mut().enumerate() {
        c.write_all(format!("get k{i}\r\n").as_bytes()).unwrap();
    }
    for (i, c) in conns.iter_mut().enumerate() {
        let expected = format!("VALUE k{i} 0 5\r\nv{i:04}\r\nEND\r\n");
        assert_eq!(
            read_until(c, b"END\r\n"),
            expected.as_bytes(),
            "connection {i}"
        );
    }
    std::thread::sleep(Duration::from_millis(300));
    let rss_after_burst = rss_bytes(pid);
    let per_connection_max = if one_shot { 18 << 10 } else { 2048 };
    let bound = (64u64 << 20) + (100 << 20) + (CONNECTIONS as u64) * per_connection_max;
    println!("RSS {} MiB after the burst", rss_after_burst >> 20);
    assert!(
        asan || rss_after_burst <= bound,
        "RSS {rss_after_burst} over --memory + 100 MiB + 2 KiB a connection ({bound})"
    );

    // STAT: the idle connections hold their state and no buffer; only the one asking holds a
    // read buffer (and the free ones are kept within the caches' bound).
    let s = stats(&server);
    assert!(s["curr_connections"] > CONNECTIONS as u64, "{s:?}");
    let per_connection = s["conn_bytes"] / CONNECTIONS as u64;
    assert!(
        (256..=per_connection_max).contains(&per_connection),
        "conn_bytes says {per_connection} bytes a connection"
    );
    let free = s["read_buf_bytes_free"] / (16 << 10);
    let held = s["read_buf_count"] - free;
    match one_shot {
        true => assert!(held >= CONNECTIONS as u64, "{s:?}"),
        false => assert!(held <= 1, "read buffers held by idle connections: {s:?}"),
    }
    assert!(
        free <= 2 * 256,
        "free read buffers past the caches' bound: {free}"
    );
    assert_eq!(
        s["read_buf_bytes"],
        s["read_buf_count"] * (16 << 10),
        "read buffers are 16 KiB"
    );

    // Closing them all: the server counts them out and serves on.
    drop(conns);
    let mut waited = 0;
    while stats(&server)["curr_connections"] > 1 {
        std::thread::sleep(Duration::from_millis(50));
        waited += 1;
        assert!(waited < 200, "connections still counted 10 s after closing");
    }
    let left = stats(&server)["conn_bytes"];
    assert!(
        left < 64 << 10,
        "the one connection asking holds {left} bytes"
    );
}
