//! The data path: the io_uring ring is on by default and its counters prove it ran;
//! `--io-ring off` forces the plain path; a ring the kernel refuses (here: registration over an
//! unprivileged user's memlock limit) is said once and the server serves on the plain path.

mod common;

use std::time::{Duration, Instant};

use common::pattern;
use common::server::{fresh_data_dir, read_text_reply, Client, Server};

/// `shardN_name` summed over shards.
fn io_sum(c: &mut Client, name: &str) -> u64 {
    c.stats("io")
        .iter()
        .filter(|(n, _)| n.split_once('_').is_some_and(|(_, rest)| rest == name))
        .map(|(_, v)| v.parse::<u64>().unwrap())
        .sum()
}

fn paths(c: &mut Client) -> Vec<String> {
    c.stats("io")
        .into_iter()
        .filter(|(n, _)| n.ends_with("_path"))
        .map(|(_, v)| v)
        .collect()
}

/// Small and large values round trip, byte-exact.
fn exercise(c: &mut Client) {
    for i in 0..50u64 {
        let value = pattern(i, 100 + 997 * i as usize);
        assert_eq!(c.set(format!("k{i}").as_bytes(), &value, 0, 0).status, 0);
        assert!(c.get(format!("k{i}").as_bytes()).value == value);
    }
    let big = pattern(7, (3 << 20) + 5);
    assert_eq!(c.set_streamed(0x01, b"big", &big, 0).status, 0);
    assert!(c.get(b"big").value == big);
}

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Whether a test that needs the ring may run here (says why not when it may not).
fn ring_allowed() -> bool {
    if !is_root() {
        println!("skipped: this machine's memlock limit may refuse the ring for non-root users");
    }
    is_root()
}

#[test]
fn the_ring_path_is_on_by_default_and_counted() {
    if !ring_allowed() {
        return;
    }
    let server = Server::start(&["--threads", "2", "--io-ring", "on"]);
    let mut c = server.client();
    exercise(&mut c);
    assert!(
        paths(&mut c).iter().all(|p| p.starts_with("ring")),
        "{:?}",
        paths(&mut c)
    );
    assert!(
        io_sum(&mut c, "ops_send") > 0,
        "replies went out through the ring"
    );
    // The 3 MiB value: written to the file segment and read back with fixed buffers, its
    // segment part sent zero-copy.
    let streamed = (3 << 20) + 5 - (256 << 10);
    assert!(io_sum(&mut c, "bytes_write_fixed") >= (3 << 20) + 5);
    assert!(io_sum(&mut c, "bytes_read_fixed") >= streamed);
    // Lent bytes go out with SEND_ZC, or SEND once the connection has learnt that the kernel
    // copies anyway (loopback) or when they sit on huge pages.
    assert!(io_sum(&mut c, "bytes_send_zc") + io_sum(&mut c, "bytes_send") >= streamed);
    assert_eq!(io_sum(&mut c, "op_errors"), 0);
    assert_eq!(io_sum(&mut c, "fallbacks"), 0);
    // Every chunk came home (after the last notification).
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(
        io_sum(&mut c, "pool_chunks"),
        io_sum(&mut c, "pool_chunks_free")
    );
}

#[test]
fn io_ring_off_forces_the_plain_path() {
    let server = Server::start(&["--threads", "2", "--io-ring", "off"]);
    let mut c = server.client();
    exercise(&mut c);
    assert!(
        paths(&mut c).iter().all(|p| p == "plain (--io-ring off)"),
        "{:?}",
        paths(&mut c)
    );
    for kind in ["send", "send_zc", "read_fixed", "write_fixed"] {
        assert_eq!(
            io_sum(&mut c, &format!("ops_{kind}")),
            0,
            "{kind} ran on the plain path"
        );
    }
}

#[test]
fn a_refused_ring_is_said_once_and_the_plain_path_serves() {
    if !is_root() {
        println!("skipped: switching to an unprivileged user needs root");
        return;
    }
    // An unprivileged user may lock 8 MiB here (the container's hard limit): enough for a
    // 4 MiB arena and two 2 MiB streaming pools, not for registering them with every ring as well.
    let dir = fresh_data_dir();
    std::fs::create_dir_all(&dir).unwrap();
    // The data directory must be the server's user's own (and not group- or world-writable).
    nix::unistd::chown(
        &dir,
        Some(nix::unistd::Uid::from_raw(65534)),
        Some(nix::unistd::Gid::from_raw(65534)),
    )
    .unwrap();
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    let limit = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_MEMLOCK)
        .unwrap()
        .1;
    if limit == nix::sys::resource::RLIM_INFINITY || limit > 16 << 20 {
        println!("skipped: the memlock hard limit ({limit}) lets an unprivileged ring register");
        return;
    }
    let server = Server::start_command(
        &[
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
        ],
        &dir,
        &[
            "--threads",
            "2",
            "--memory",
            "4M",
            "--io-pool",
            "2M",
            "--io-ring",
            "on",
        ],
    );
    assert!(
        server.logs("the io_uring data path is unavailable"),
        "{}",
        server.log_text()
    );
    let said = server
        .log_text()
        .matches("the io_uring data path is unavailable")
        .count();
    assert_eq!(said, 1, "said once, not per shard");
    let mut c = server.client();
    exercise(&mut c);
    assert!(
        paths(&mut c)
            .iter()
            .all(|p| p.starts_with("plain (registering")),
        "{:?}",
        paths(&mut c)
    );
    assert_eq!(io_sum(&mut c, "ops_send"), 0);
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A client that asks for a large value and never reads: the idle timeout cuts it, the
/// connection is reset so its queued zero-copy sends are released, and every streaming chunk
/// comes home with nothing left in flight.
#[test]
fn a_stalled_reader_gives_its_chunks_back_when_cut() {
    let server = Server::start(&["--threads", "1", "--idle-timeout", "1"]);
    let mut c = server.client();
    let big = pattern(3, 48 << 20);
    assert_eq!(c.set_streamed(0x01, b"big", &big, 0).status, 0);
    let mut stalled = server.client();
    stalled.send(&common::server::frame(0x00, &[], b"big", &[], 0, 1));
    std::thread::sleep(Duration::from_secs(4));
    let mut c = server.client();
    assert_eq!(
        c.stat("", "curr_connections"),
        1,
        "the stalled reader was not cut"
    );
    // Nothing but the asking connection's own receive, where it stays armed.
    let own_receive = u64::from(paths(&mut c)[0].ends_with("multishot receives)"));
    assert_eq!(io_sum(&mut c, "in_flight"), own_receive);
    assert_eq!(
        io_sum(&mut c, "pool_chunks"),
        io_sum(&mut c, "pool_chunks_free")
    );
    // Its socket's registered-file slot (ring path) was emptied with it.
    assert!(io_sum(&mut c, "ring_files_registered") <= 1);
    drop(stalled);
    // The value is intact for the next reader.
    assert!(c.get(b"big").value == big);
}

#[test]
fn a_connection_stops_zero_copy_once_the_kernel_says_it_copies() {
    if !ring_allowed() {
        return;
    }
    let server = Server::start(&["--threads", "1", "--io-ring", "on", "--zero-copy-min", "4K"]);
    let mut c = server.client();
    let values: Vec<Vec<u8>> = (0..40).map(|i| pattern(i, 64 << 10)).collect();
    for (i, value) in values.iter().enumerate() {
        assert_eq!(c.set(format!("v{i}").as_bytes(), value, 0, 0).status, 0);
    }
    let lent_before = io_sum(&mut c, "heads_lent");
    for (i, value) in values.iter().enumerate() {
        assert!(c.get(format!("v{i}").as_bytes()).value == *value);
    }
    assert_eq!(io_sum(&mut c, "heads_lent") - lent_before, 40);
    if io_sum(&mut c, "lent_sends_huge_pages") > 0 {
        println!("skipped the rest: the arena is on huge pages, never sent zero-copy");
        return;
    }
    // Loopback: every notification says the kernel copied; after the probe the connection
    // sends its lent bytes with plain SEND.
    let (notifications, copied) = (
        io_sum(&mut c, "zc_notifications"),
        io_sum(&mut c, "zc_copied"),
    );
    assert!(notifications >= 8, "{notifications} notifications");
    assert_eq!(copied, notifications, "loopback always copies");
    let switched = io_sum(&mut c, "lent_sends_kernel_copies");
    assert!(
        switched > 0 && switched <= 40 - 8,
        "{switched} sends switched to SEND"
    );
    // A new connection probes afresh.
    let zc_before = io_sum(&mut c, "ops_send_zc");
    let mut d = server.client();
    assert!(d.get(b"v0").value == values[0]);
    assert_eq!(io_sum(&mut c, "ops_send_zc"), zc_before + 1);
}

#[test]
fn idle_connections_beyond_the_rings_operation_bound_never_stall_a_shard() {
    // One shard; each idle connection keeps a receive in flight on its ring. With receives
    // counted against the ring's 256-operation bound, the 256th idle connection left the
    // shard unable to send a single reply (memcached's t/maxconns.t found it).
    let server = Server::start(&["--threads", "1", "--max-connections", "1024"]);
    let idle: Vec<Client> = (0..600).map(|_| server.client()).collect();
    // Every idle connection is accepted and has its receive posted: each answers once.
    let mut idle = idle;
    for (i, c) in idle.iter_mut().enumerate().step_by(50) {
        assert_eq!(c.set(format!("idle{i}").as_bytes(), b"v", 0, 0).status, 0);
    }
    let mut fresh = server.client();
    exercise(&mut fresh);
    for (i, c) in idle.iter_mut().enumerate().rev().step_by(37) {
        assert_eq!(c.get(b"k3").status, 0, "idle connection {i}");
    }
    drop(idle);
    assert_eq!(server.stop().code(), Some(0));
}

#[test]
fn connections_sockets_are_registered_files_while_served_and_only_then() {
    if !ring_allowed() {
        return;
    }
    let server = Server::start(&["--threads", "1", "--io-ring", "on"]);
    let mut c = server.client();
    let registered = |c: &mut Client| io_sum(c, "ring_files_registered");
    if registered(&mut c) == 0 {
        println!("skipped: this kernel has no sparse registered-file table");
        return;
    }
    assert_eq!(registered(&mut c), 1, "the stats connection");
    // Three rounds of connections on reused slots (and reused descriptor numbers): each sees
    // only its own replies, byte-exact, and a QUIT closes its socket.
    for round in 0..3u64 {
        let mut clients: Vec<Client> = (0..20).map(|_| server.client()).collect();
        for (i, client) in clients.iter_mut().enumerate() {
            let value = pattern(round * 100 + i as u64, 10 + i * 13);
            let key = format!("r{round}c{i}");
            assert_eq!(client.set(key.as_bytes(), &value, 0, 0).status, 0);
            assert!(client.get(key.as_bytes()).value == value, "{key}");
        }
        assert_eq!(registered(&mut c), 21, "round {round}");
        for client in &mut clients {
            assert_eq!(
                client
                    .call(&common::server::frame(0x07, &[], &[], &[], 0, 0))
                    .status,
                0
            );
            assert!(client.recv().is_none(), "QUIT closes the socket");
        }
        drop(clients);
        let deadline = Instant::now() + Duration::from_secs(5);
        while registered(&mut c) != 1 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(registered(&mut c), 1, "round {round}: slots emptied");
    }
    assert_eq!(io_sum(&mut c, "ring_files_full"), 0);
    assert_eq!(io_sum(&mut c, "op_errors"), 0);
}

#[test]
fn a_sleeping_shard_wakes_for_a_lone_clients_request_not_for_a_timer() {
    // One client, one request at a time, a pause before each: the shard sleeps between them
    // and must wake for the receive itself. With DEFER_TASKRUN the ring's eventfd signal for
    // a receive came an RCU grace period late on kernel 6.18.44, so every request waited about
    // 16 ms for an unrelated wake-up; a healthy round trip here is tens of microseconds. The
    // bound is 100 times that, so a loaded machine cannot fail it, a timer-paced wake must.
    let server = Server::start(&["--threads", "1"]);
    let mut c = server.client();
    assert_eq!(c.set(b"lone", b"value", 0, 0).status, 0);
    let mut round_trips: Vec<Duration> = (0..41)
        .map(|_| {
            std::thread::sleep(Duration::from_millis(2));
            let started = Instant::now();
            assert!(c.get(b"lone").value == b"value");
            started.elapsed()
        })
        .collect();
    round_trips.sort();
    let median = round_trips[round_trips.len() / 2];
    println!(
        "round trips: median {median:?}, fastest {:?}, slowest {:?}",
        round_trips[0],
        round_trips[round_trips.len() - 1]
    );
    assert!(
        median < Duration::from_millis(4),
        "a lone request waited {median:?} (median): the shard slept through its receive"
    );
    assert_eq!(server.stop().code(), Some(0));
}

/// A connection's receive is armed once and serves every request after (multishot), armed
/// again only after a large value's body was read past it; `--multishot-receive off`
/// receives one read at a time.
#[test]
fn a_connections_receive_is_armed_once_unless_multishot_is_off() {
    if !ring_allowed() {
        return;
    }
    for multishot in ["on", "off"] {
        let server = Server::start(&[
            "--threads",
            "1",
            "--io-ring",
            "on",
            "--multishot-receive",
            multishot,
        ]);
        let mut c = server.client();
        let path = paths(&mut c).remove(0);
        if multishot == "on" && !path.ends_with("multishot receives)") {
            println!("skipped: no multishot receives here ({path})");
            return;
        }
        let armed_before = io_sum(&mut c, "receives_armed");
        let received_before = io_sum(&mut c, "ops_recv");
        for i in 0..200u64 {
            let value = pattern(i, 10 + i as usize);
            assert_eq!(c.set(format!("k{i}").as_bytes(), &value, 0, 0).status, 0);
            assert!(c.get(format!("k{i}").as_bytes()).value == value);
        }
        let armed = io_sum(&mut c, "receives_armed") - armed_before;
        assert!(io_sum(&mut c, "ops_recv") - received_before >= 400);
        // A large value's body is read by glommio past the paused receive, byte-exact, and
        // the next request arms it again.
        let big = pattern(9, (2 << 20) + 3);
        assert_eq!(c.set_streamed(0x01, b"big", &big, 0).status, 0);
        assert!(c.get(b"big").value == big);
        let armed_after_large = io_sum(&mut c, "receives_armed") - armed_before;
        match multishot {
            "on" => {
                assert_eq!(armed, 0, "armed by the connection's first read, before");
                assert_eq!(armed_after_large, 1, "armed again after the large value");
            }
            _ => {
                assert!(
                    path.contains("one-shot receives (--multishot-receive off)"),
                    "{path}"
                );
                assert_eq!(armed_after_large, 0);
            }
        }
        assert_eq!(io_sum(&mut c, "op_errors"), 0);
    }
}

/// STAT `io`'s received bytes are the bytes the client sent, exactly: with receive timestamps
/// on, each multishot buffer also holds the message header, the address and the control space,
/// and those were counted too (about 80 bytes a receive).
#[test]
fn received_bytes_are_the_bytes_sent() {
    if !ring_allowed() {
        return;
    }
    for timestamps in ["on", "off"] {
        let server = Server::start(&[
            "--threads",
            "1",
            "--io-ring",
            "on",
            "--receive-timestamps",
            timestamps,
        ]);
        let mut c = server.client();
        // Each STAT `io` request is 24 bytes of header and its 2-byte key; the one that reads
        // `before` is already counted in it, the one that reads `after` is in `after`.
        let before = io_sum(&mut c, "bytes_recv");
        let mut sent = 24 + 2;
        for i in 0..100u64 {
            let key = format!("key{i}");
            let value = pattern(i, 1 + i as usize * 7);
            assert_eq!(c.set(key.as_bytes(), &value, 0, 0).status, 0);
            assert!(c.get(key.as_bytes()).value == value);
            sent += (24 + 8 + key.len() + value.len()) + (24 + key.len());
        }
        let after = io_sum(&mut c, "bytes_recv");
        assert_eq!(
            after - before,
            sent as u64,
            "receive timestamps {timestamps}"
        );
    }
}

/// A fixed slot holds its value rotated, wrapping around the slot's end (`arena::slot_layout`):
/// values that fill their slot, a large value's head copy, and an APPEND that rewrites a fixed
/// value read back byte-exact through the binary, text and meta GETs, lent from the arena
/// (zero-copy or plain sends of two runs) and copied, on the ring and on the plain path.
#[test]
fn values_that_wrap_around_their_fixed_slot_read_back_exact_on_every_path() {
    let ram_head = 16usize << 10;
    let setups: &[&[&str]] = &[
        &["--io-ring", "on", "--zero-copy-min", "4K"],
        &["--io-ring", "on", "--zero-copy-min", "1M"],
        &["--io-ring", "off"],
    ];
    for &setup in setups {
        if setup[1] == "on" && !ring_allowed() {
            continue;
        }
        let mut args = vec!["--threads", "1", "--memory", "64M", "--ram-head", "16K"];
        args.extend_from_slice(setup);
        let server = Server::start(&args);
        let mut c = server.client();
        // A value fills a fixed slot when its record would not fit one: every such value
        // reaches the slot's end and wraps.
        let mut values: Vec<(String, Vec<u8>)> = [ram_head - 20, ram_head - 7, ram_head]
            .iter()
            .enumerate()
            .map(|(i, &len)| (format!("fixed{i}"), pattern(i as u64, len)))
            .collect();
        for (key, value) in &values {
            assert_eq!(c.set(key.as_bytes(), value, 5, 0).status, 0, "{setup:?}");
        }
        // APPEND rewrites a fixed value into a new slot, across the wrap.
        let tail = pattern(40, 11);
        let append = common::server::frame(0x0e, &[], b"fixed0", &tail, 0, 0);
        assert_eq!(c.call(&append).status, 0, "{setup:?}");
        values[0].1.extend_from_slice(&tail);
        // A large value's head copy (its first `ram_head` bytes) sits in a fixed slot too.
        let big = pattern(41, 3 * ram_head + 5);
        assert_eq!(c.set_streamed(0x01, b"big", &big, 0).status, 0);
        values.push(("big".to_string(), big));
        assert_eq!(
            c.stat("items", "items:2:number"),
            3,
            "{setup:?}: not in fixed slots"
        );

        let mut text = std::net::TcpStream::connect(server.addr).unwrap();
        for (key, value) in &values {
            let got = c.get(key.as_bytes());
            assert!(got.value == *value, "{setup:?}: binary GET {key} differs");
            std::io::Write::write_all(&mut text, format!("get {key}\r\n").as_bytes()).unwrap();
            let mut want = format!("VALUE {key} {} {}\r\n", got.flags(), value.len()).into_bytes();
            want.extend_from_slice(value);
            want.extend_from_slice(b"\r\nEND\r\n");
            assert!(
                read_text_reply(&mut text, b"END\r\n", want.len()) == want,
                "{setup:?}: text get {key} differs"
            );
            std::io::Write::write_all(&mut text, format!("mg {key} v\r\nmn\r\n").as_bytes())
                .unwrap();
            let mut want = format!("VA {}\r\n", value.len()).into_bytes();
            want.extend_from_slice(value);
            want.extend_from_slice(b"\r\nMN\r\n");
            assert!(
                read_text_reply(&mut text, b"MN\r\n", want.len()) == want,
                "{setup:?}: meta get {key} differs"
            );
        }
        if setup == ["--io-ring", "on", "--zero-copy-min", "4K"] {
            // 4 values of 3 protocols, each lent from its slot.
            assert!(io_sum(&mut c, "heads_lent") >= 12, "{setup:?}: not lent");
        }
        assert_eq!(server.stop().code(), Some(0));
    }
}
