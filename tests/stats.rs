//! STAT against memcached's meaning, through the real server with two shards: counters summed
//! once across shards (`cmd_flush` per FLUSH, `large_*`), `total_items` per successful store,
//! memcached's general names with what is true of Headroom, and memcached's groups `settings`,
//! `items`, `slabs`, `sizes`, `conns`, `reset` and `detail on|off|dump`.

mod common;

use common::pattern;
use std::io::{Read, Write};

use common::server::{frame, Client, Server};

const STAT: u8 = 0x10;
const FLUSH: u8 = 0x08;

fn stat_map(c: &mut Client, group: &str) -> std::collections::HashMap<String, String> {
    c.stats(group).into_iter().collect()
}

/// Keys that land on both shards (the test sets several and checks the sum).
fn keys(prefix: &str, n: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| format!("{prefix}{i}").into_bytes())
        .collect()
}

#[test]
fn counters_are_counted_once_and_summed_over_shards() {
    let server = Server::start(&["--threads", "2", "--segment", "mem:size=64M,numa=0"]);
    let mut c = server.client();
    let before = c.stat("", "cmd_flush");
    assert_eq!(c.call(&frame(FLUSH, &[], b"", &[], 0, 0)).status, 0);
    assert_eq!(
        c.stat("", "cmd_flush"),
        before + 1,
        "one FLUSH is one command, whatever the shard count"
    );

    // Every successful store counts, new key or not (memcached's total_items).
    let total = c.stat("", "total_items");
    assert_eq!(c.set(b"t", b"1", 0, 0).status, 0);
    assert_eq!(c.set(b"t", b"2", 0, 0).status, 0);
    assert_eq!(c.stat("", "total_items"), total + 2);

    // Large values on both shards are all counted.
    let big = 300 << 10;
    for key in keys("large", 8) {
        assert_eq!(c.set_streamed(0x01, &key, &pattern(1, big), 0).status, 0);
    }
    assert_eq!(c.stat("", "large_items"), 8);
    assert_eq!(c.stat("", "large_bytes"), 8 * big as u64);
    let settings = stat_map(&mut c, "settings");
    assert_eq!(settings["flush_enabled"], "yes");
    assert_eq!(settings["evictions"], "on");
    assert_eq!(settings["cas_enabled"], "yes");
    assert_eq!(settings["receive_timestamps"], "on");
    let multishot = std::env::var("HEADROOM_TEST_MULTISHOT").unwrap_or("on".into());
    assert_eq!(settings["multishot_receive"], multishot);
    let sleep = std::env::var("HEADROOM_TEST_RING_SLEEP").unwrap_or("on".into());
    assert_eq!(settings["ring_sleep"], sleep);
    assert_eq!(settings["pin_shards"], "core");
}

/// The CPUs each shard thread may run on (`/proc/PID/task/*/status`), by shard name.
fn shard_cpus(pid: u32) -> std::collections::BTreeMap<String, String> {
    let mut shards = std::collections::BTreeMap::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let task = task.unwrap().path();
        let Ok(name) = std::fs::read_to_string(task.join("comm")) else {
            continue;
        };
        let name = name.trim().to_string();
        if !name.starts_with("shard-") {
            continue;
        }
        let status = std::fs::read_to_string(task.join("status")).unwrap();
        let cpus = status
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
            .unwrap()
            .trim()
            .to_string();
        shards.insert(name, cpus);
    }
    shards
}

/// `--pin-shards core` (the default) binds each shard's thread to its own CPU; `node` lets
/// each run on any of the shards' CPUs. Both serve, and STAT `settings` says which.
#[test]
fn shards_are_pinned_to_their_core_or_fenced_into_the_node() {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cpus < 2 {
        println!("skipped: one CPU");
        return;
    }
    for pin in ["core", "node"] {
        let server = Server::start(&["--threads", "2", "--pin-shards", pin]);
        let mut c = server.client();
        for key in keys("pin", 20) {
            assert_eq!(c.set(&key, b"v", 0, 0).status, 0);
            assert_eq!(c.get(&key).value, b"v");
        }
        assert_eq!(stat_map(&mut c, "settings")["pin_shards"], pin);
        let shards = shard_cpus(server.pid());
        assert_eq!(shards.len(), 2, "{shards:?}");
        let sets: Vec<&String> = shards.values().collect();
        match pin {
            "core" => {
                assert!(
                    sets.iter().all(|s| s.parse::<usize>().is_ok()),
                    "{shards:?}"
                );
                assert_ne!(sets[0], sets[1], "two shards on one CPU: {shards:?}");
            }
            _ => {
                assert_eq!(sets[0], sets[1], "{shards:?}");
                assert!(
                    sets[0].parse::<usize>().is_err(),
                    "one CPU only: {shards:?}"
                );
            }
        }
    }
}

#[test]
fn items_slabs_and_sizes_describe_the_arena_classes() {
    let server = Server::start(&["--threads", "2", "--segment", "mem:size=64M,numa=0"]);
    let mut c = server.client();
    for key in keys("small", 10) {
        assert_eq!(c.set(&key, &[7u8; 90], 0, 0).status, 0);
    }
    // Exactly --ram-head (256K): a fixed slot; above it: a segment.
    assert_eq!(c.set(b"fixed", &pattern(2, 256 << 10), 0, 0).status, 0);
    assert_eq!(
        c.set_streamed(0x01, b"large", &pattern(3, 1 << 20), 0)
            .status,
        0
    );

    let items = stat_map(&mut c, "items");
    assert_eq!(items["items:1:number"], "10");
    assert_eq!(items["items:1:mem_requested"], (10 * (6 + 90)).to_string());
    assert_eq!(items["items:2:number"], "1");
    assert_eq!(items["items:3:number"], "1");
    assert_eq!(items["items:3:mem_requested"], (5 + (1 << 20)).to_string());

    let slabs = stat_map(&mut c, "slabs");
    assert_eq!(slabs["1:chunk_size"], "16");
    assert_eq!(slabs["2:chunk_size"], (256 << 10).to_string());
    // The fixed value and the large value's head copy.
    assert_eq!(slabs["2:used_chunks"], "2");
    // The large value: class 3, a chunk per value.
    assert_eq!(slabs["3:used_chunks"], "1");
    assert_eq!(slabs["3:mem_requested"], (1 << 20).to_string());
    assert_eq!(slabs["active_slabs"], "3");
    assert!(slabs["total_malloced"].parse::<u64>().unwrap() >= 2 << 20);

    // Sizes: key + value in 32-byte buckets labelled by their upper bound.
    let sizes = stat_map(&mut c, "sizes");
    assert_eq!(sizes["96"], "10", "{sizes:?}");
    assert_eq!(
        sizes[&((5 + 256 * 1024u64).div_ceil(32) * 32).to_string()],
        "1"
    );
}

#[test]
fn conns_reset_and_detail() {
    let server = Server::start(&["--threads", "2"]);
    let mut c = server.client();
    let mut other = server.client();
    // A round trip: the other connection is accepted and waiting.
    assert_eq!(other.call(&frame(0x0a, &[], b"", &[], 0, 0)).status, 0);
    let conns = c.stats("conns");
    let addrs: Vec<_> = conns.iter().filter(|(n, _)| n.ends_with(":addr")).collect();
    assert!(addrs.len() >= 2, "{conns:?}");
    assert!(addrs.iter().all(|(_, v)| v.starts_with("tcp:127.0.0.1:")));
    assert!(conns
        .iter()
        .any(|(n, v)| n.ends_with(":state") && v == "conn_waiting"));
    assert!(conns
        .iter()
        .any(|(n, v)| n.ends_with(":listen_addr") && *v == format!("tcp:{}", server.addr)));
    assert!(conns
        .iter()
        .any(|(n, _)| n.ends_with(":secs_since_last_cmd")));

    // Reset: counters to zero, gauges kept.
    assert_eq!(c.set(b"kept", b"v", 0, 0).status, 0);
    c.get(b"kept");
    assert!(c.stat("", "get_hits") > 0);
    let r = c.stats("reset");
    assert!(
        r.is_empty(),
        "reset answers with the terminator only: {r:?}"
    );
    let general = stat_map(&mut c, "");
    assert_eq!(general["get_hits"], "0");
    assert_eq!(general["cmd_set"], "0");
    assert_eq!(general["total_items"], "0");
    assert_eq!(general["curr_items"], "1", "a gauge survives reset");

    // Detail: per-prefix counts while on.
    assert!(c.stats("detail on").is_empty());
    assert_eq!(c.set(b"user:1", b"a", 0, 0).status, 0);
    c.get(b"user:1");
    c.get(b"user:2");
    c.call(&frame(0x04, &[], b"user:3", &[], 0, 0));
    c.set(b"plain", b"no prefix", 0, 0);
    let dump = stat_map(&mut c, "detail dump");
    assert_eq!(
        dump["detailed"],
        "PREFIX user get 2 hit 1 set 1 del 1\r\nEND\r\n"
    );
    assert!(c.stats("detail off").is_empty());
    c.get(b"user:1");
    assert_eq!(
        stat_map(&mut c, "detail dump")["detailed"],
        "PREFIX user get 2 hit 1 set 1 del 1\r\nEND\r\n"
    );
    // Unknown groups (and detail subcommands): "not found", the connection goes on.
    for group in ["bogus", "detail bogus"] {
        let r = c.call(&frame(STAT, &[], group.as_bytes(), &[], 0, 0));
        assert_eq!(r.status, 1, "{group}");
    }
    assert_eq!(c.get(b"kept").value, b"v");
    // A connection whose command is in and whose value is still coming reads `conn_nread`,
    // as memcached's does (t/stats-conns.t); on its own value it answers as usual.
    let mut midway = std::net::TcpStream::connect(server.addr).unwrap();
    midway.write_all(b"set midway 0 0 10\r\n0123").unwrap();
    let nread = |c: &mut Client| {
        c.stats("conns")
            .iter()
            .any(|(n, v)| n.ends_with(":state") && v == "conn_nread")
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !nread(&mut c) {
        assert!(
            std::time::Instant::now() < deadline,
            "no connection in conn_nread"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    midway.write_all(b"456789\r\n").unwrap();
    let mut stored = [0u8; 8];
    midway.read_exact(&mut stored).unwrap();
    assert_eq!(&stored, b"STORED\r\n");
}

#[test]
fn memcached_general_and_settings_names() {
    let server = Server::start(&["--threads", "2"]);
    let mut c = server.client();
    let general = stat_map(&mut c, "");
    for (name, value) in [
        ("get_expired", "0"),
        ("get_flushed", "0"),
        ("accepting_conns", "1"),
        ("listen_disabled_num", "0"),
        ("time_in_listen_disabled_us", "0"),
        ("lrutail_reflocked", "0"),
    ] {
        assert_eq!(general.get(name).map(String::as_str), Some(value), "{name}");
    }

    // A lookup that finds its item expired counts (a Unix time in the past expires at once).
    for key in keys("gone", 4) {
        assert_eq!(c.set(&key, b"v", 0, 1_000_000_000).status, 0);
        assert_eq!(c.get(&key).status, 1, "expired");
    }
    assert_eq!(c.get(b"never-set").status, 1);
    assert_eq!(c.stat("", "get_expired"), 4);
    assert_eq!(c.stat("", "get_misses"), 5);
    // A FLUSH frees what it covers: no lookup finds a flushed item.
    assert_eq!(c.set(b"flushed", b"v", 0, 0).status, 0);
    assert_eq!(c.call(&frame(FLUSH, &[], b"", &[], 0, 0)).status, 0);
    assert_eq!(c.get(b"flushed").status, 1);
    assert_eq!(c.stat("", "get_flushed"), 0);
    assert_eq!(c.stat("", "get_expired"), 4);
    assert!(c.stats("reset").is_empty());
    assert_eq!(c.stat("", "get_expired"), 0);

    let settings = stat_map(&mut c, "settings");
    assert_eq!(settings["shutdown_command"], "no");
    assert_eq!(settings["dump_enabled"], "yes");
    assert_eq!(settings["udpport"], "0");
    assert_eq!(settings["ssl_enabled"], "no");
}

/// The kernel's SO_REUSEPORT hash puts connections on shards at random; the accept loops hand
/// a connection to the shard serving the fewest, so a few clients still use every core. Each
/// client is accepted (a round trip) before the next connects, as the hand-off assumes
/// nothing about the hash. The connections go on working after the hand-off, and closing them
/// brings the counts back down.
#[test]
fn connections_are_spread_evenly_over_shards() {
    let server = Server::start(&["--threads", "2"]);
    let per_shard = |c: &mut Client| {
        let io = stat_map(c, "io");
        let count =
            |shard: usize| -> usize { io[&format!("shard{shard}_connections")].parse().unwrap() };
        (count(0), count(1))
    };
    let mut clients: Vec<Client> = Vec::new();
    for i in 0..8u32 {
        let mut c = server.client();
        let key = format!("spread{i}");
        assert_eq!(c.set(key.as_bytes(), b"v", 0, 0).status, 0);
        clients.push(c);
        let (a, b) = per_shard(&mut clients[0]);
        assert_eq!(
            a + b,
            clients.len(),
            "every open connection is counted once"
        );
        assert!(
            a.abs_diff(b) <= 1,
            "after {} connections: {a} and {b}",
            clients.len()
        );
    }
    // Every connection, wherever it was handed, still serves every key.
    for c in clients.iter_mut() {
        for i in 0..8u32 {
            let key = format!("spread{i}");
            assert_eq!(c.get(key.as_bytes()).value, b"v".to_vec());
        }
    }
    clients.truncate(1);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let (a, b) = per_shard(&mut clients[0]);
        if a + b == 1 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "closed connections still counted: {a}, {b}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}
