//! Warm restart: large values on file segments and the values held in RAM survive a clean
//! shutdown (SIGTERM) and a start on the same `--data-dir`, byte-exact, with other `--threads`;
//! expired items stay gone; a crash, a damaged snapshot, a changed segment or damaged data
//! never brings back wrong bytes (a damaged RAM chunk loses its items only); `--warm-restart
//! off` restores nothing.

mod common;

use std::os::unix::fs::FileExt;
use std::path::Path;

use common::pattern;
use common::server::{fresh_data_dir, Client, Server};

const ARGS: &[&str] = &["--threads", "2", "--ram-head", "256K"];

/// (key, length, flags): sizes around chunk and alignment edges.
const VALUES: &[(&str, usize, u32)] = &[
    ("a", 300 << 10, 1),
    ("b", (1 << 20) + 1, 2),
    ("c", (5 << 20) + 17, 3),
    ("d", 24 << 20, 4),
];

fn fill(c: &mut Client) {
    for (i, &(key, len, flags)) in VALUES.iter().enumerate() {
        let r = c.set_streamed(0x01, key.as_bytes(), &pattern(i as u64, len), flags);
        assert_eq!(r.status, 0, "SET {key}");
    }
}

fn assert_all_back(c: &mut Client) {
    for (i, &(key, len, flags)) in VALUES.iter().enumerate() {
        let got = c.get(key.as_bytes());
        assert_eq!(
            (got.status, got.value.len()),
            (0, len),
            "{key} after restart"
        );
        assert_eq!(got.flags(), flags);
        assert!(
            got.value == pattern(i as u64, len),
            "{key} came back different"
        );
    }
}

fn snapshot_parts(dir: &Path) -> Vec<std::path::PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir.join("snapshot")) else {
        return Vec::new();
    };
    entries
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "bin"))
        .collect()
}

#[test]
fn large_values_survive_a_clean_restart_byte_exact() {
    let dir = fresh_data_dir();
    let server = Server::start_in(&dir, ARGS);
    let mut c = server.client();
    fill(&mut c);
    assert_eq!(c.set(b"small", b"lives in RAM only", 0, 0).status, 0);
    assert_eq!(
        c.set_streamed(0x01, b"gone", &pattern(99, 2 << 20), 0)
            .status,
        0
    );
    assert_eq!(
        c.call(&common::server::frame(0x04, &[], b"gone", &[], 0, 0))
            .status,
        0
    );
    std::thread::sleep(std::time::Duration::from_millis(100));
    let used_before = c.segment_used();
    assert_eq!(server.stop().code(), Some(0));
    assert!(!snapshot_parts(&dir).is_empty(), "no snapshot written");

    let server = Server::start_in(&dir, ARGS);
    assert!(
        server.logs("warm restart: large values"),
        "{}",
        server.log_text()
    );
    let mut c = server.client();
    assert_all_back(&mut c);
    let small = c.get(b"small");
    assert_eq!(
        (small.status, small.value.as_slice()),
        (0, &b"lives in RAM only"[..]),
        "a RAM value is restored too"
    );
    assert_eq!(c.get(b"gone").status, 1, "a deleted value came back");
    assert_eq!(
        c.segment_used(),
        used_before,
        "restored extents are claimed, no more, no less"
    );
    assert!(
        snapshot_parts(&dir).is_empty(),
        "the snapshot is consumed at start"
    );

    // New values go around the restored ones, which stay intact.
    assert_eq!(
        c.set_streamed(0x01, b"new", &pattern(7, 8 << 20), 0).status,
        0
    );
    assert_all_back(&mut c);
    assert!(c.get(b"new").value == pattern(7, 8 << 20));
    assert_eq!(server.stop().code(), Some(0));

    // And the second shutdown snapshots both again.
    let server = Server::start_in(&dir, ARGS);
    let mut c = server.client();
    assert_all_back(&mut c);
    assert!(c.get(b"new").value == pattern(7, 8 << 20));
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_crash_restarts_empty() {
    let dir = fresh_data_dir();
    let server = Server::start_in(&dir, ARGS);
    fill(&mut server.client());
    assert_eq!(server.stop().code(), Some(0));
    // Restored once, then killed: the consumed snapshot must not bring back what a later
    // (unsnapshotted) write could have overwritten.
    let server = Server::start_in(&dir, ARGS);
    assert_all_back(&mut server.client());
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(server.pid() as i32),
        nix::sys::signal::SIGKILL,
    )
    .unwrap();
    drop(server);
    let server = Server::start_in(&dir, ARGS);
    let mut c = server.client();
    for &(key, _, _) in VALUES {
        assert_eq!(
            c.get(key.as_bytes()).status,
            1,
            "{key} came back after a crash"
        );
    }
    assert_eq!(c.segment_used(), 0);
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_damaged_snapshot_starts_empty_with_a_warning() {
    let dir = fresh_data_dir();
    let server = Server::start_in(&dir, ARGS);
    fill(&mut server.client());
    assert_eq!(server.stop().code(), Some(0));
    for part in snapshot_parts(&dir) {
        let mut bytes = std::fs::read(&part).unwrap();
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0x10;
        std::fs::write(&part, bytes).unwrap();
    }
    let server = Server::start_in(&dir, ARGS);
    assert!(
        server.logs("snapshot part unusable"),
        "{}",
        server.log_text()
    );
    let mut c = server.client();
    for &(key, _, _) in VALUES {
        assert_eq!(c.get(key.as_bytes()).status, 1);
    }
    assert_eq!(c.segment_used(), 0);
    assert_eq!(c.set(b"still", b"works", 0, 0).status, 0);
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn damaged_data_skips_only_that_object() {
    let dir = fresh_data_dir();
    let server = Server::start_in(&dir, ARGS);
    fill(&mut server.client());
    assert_eq!(server.stop().code(), Some(0));
    // Find where "c" lives and flip one of its bytes in the segment file.
    let mut extent = None;
    for part in snapshot_parts(&dir) {
        let (snapshot, _) = headroom::snapshot::decode(&std::fs::read(part).unwrap()).unwrap();
        for object in snapshot.objects {
            if object.key == b"c" {
                extent = Some(object.replicas[0].1);
            }
        }
    }
    let extent = extent.expect("c is in the snapshot");
    let segment = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(dir.join("segment-0"))
        .unwrap();
    let at = extent.offset + 3 * (1 << 20) + 5;
    let mut byte = [0u8];
    segment.read_exact_at(&mut byte, at).unwrap();
    byte[0] ^= 0xFF;
    segment.write_all_at(&byte, at).unwrap();
    segment.sync_all().unwrap();
    drop(segment);

    let server = Server::start_in(&dir, ARGS);
    assert!(
        server.logs("no longer match their checksums"),
        "{}",
        server.log_text()
    );
    let mut c = server.client();
    assert_eq!(c.get(b"c").status, 1, "damaged data was served");
    for (i, &(key, len, _)) in VALUES.iter().enumerate().filter(|(_, v)| v.0 != "c") {
        assert!(
            c.get(key.as_bytes()).value == pattern(i as u64, len),
            "{key}"
        );
    }
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_segment_mounted_with_another_size_is_not_trusted() {
    let dir = fresh_data_dir();
    let server = Server::start_in(&dir, ARGS);
    fill(&mut server.client());
    assert_eq!(server.stop().code(), Some(0));
    let segment = format!("file:{},size=512M", dir.join("segment-0").display());
    let mut args = ARGS.to_vec();
    args.extend(["--segment", &segment]);
    let server = Server::start_in(&dir, &args);
    let mut c = server.client();
    for &(key, _, _) in VALUES {
        assert_eq!(
            c.get(key.as_bytes()).status,
            1,
            "{key} trusted on a resized segment"
        );
    }
    assert_eq!(c.segment_used(), 0);
    // The segment kept its id, so the log can say what changed.
    assert_eq!(c.stat("", "warm_restart_skipped_segment_changed"), 4);
    assert!(
        server.logs("4 large values not restored: their segment")
            && server.logs("is mounted with 536870912 bytes at base 0, not the 1073741824"),
        "{}",
        server.log_text()
    );
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn restored_values_can_be_evicted_like_any_other() {
    let dir = fresh_data_dir();
    let segment = format!("file:{},size=32M", dir.join("segment-0").display());
    let args = [ARGS, &["--segment", &segment, "--segment-eviction", "lru"]].concat();
    let server = Server::start_in(&dir, &args);
    let mut c = server.client();
    for key in ["a", "b"] {
        assert_eq!(
            c.set_streamed(0x01, key.as_bytes(), &pattern(1, 12 << 20), 0)
                .status,
            0
        );
    }
    assert_eq!(server.stop().code(), Some(0));
    let server = Server::start_in(&dir, &args);
    let mut c = server.client();
    assert_eq!(
        c.set_streamed(0x01, b"c", &pattern(2, 12 << 20), 0).status,
        0,
        "no room made"
    );
    let gone = ["a", "b"]
        .iter()
        .filter(|k| c.get(k.as_bytes()).status == 1)
        .count();
    assert_eq!(gone, 1, "one restored value made room");
    assert!(c.get(b"c").value == pattern(2, 12 << 20));
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

/// (key, value) of the small-value tests: every size up to the RAM head, flags from the index.
/// A key and its value.
type Item = (Vec<u8>, Vec<u8>);

fn small_items(count: usize) -> Vec<Item> {
    (0..count)
        .map(|i| {
            let len = match i % 7 {
                0 => 0,
                1 => 1,
                2 => 100,
                3 => 4096,
                4 => 65_536,
                5 => 256 << 10, // exactly the RAM head: a fixed slot
                _ => i % 3000,
            };
            (
                format!("small-{i}").into_bytes(),
                pattern(1000 + i as u64, len),
            )
        })
        .collect()
}

fn store_small(c: &mut Client, items: &[(Vec<u8>, Vec<u8>)], expiry: u32) {
    for (i, (key, value)) in items.iter().enumerate() {
        let r = c.set(key, value, i as u32, expiry);
        assert_eq!(r.status, 0, "SET {}", String::from_utf8_lossy(key));
    }
}

/// How many of `items` are back byte-exact with their flags; panics on a wrong byte.
fn small_back(c: &mut Client, items: &[(Vec<u8>, Vec<u8>)]) -> usize {
    let mut back = 0;
    for (i, (key, value)) in items.iter().enumerate() {
        let got = c.get(key);
        if got.status != 0 {
            continue;
        }
        assert_eq!(got.flags(), i as u32, "{}", String::from_utf8_lossy(key));
        assert!(
            got.value == *value,
            "{}: wrong bytes",
            String::from_utf8_lossy(key)
        );
        back += 1;
    }
    back
}

#[test]
fn small_values_survive_a_clean_restart_with_other_threads() {
    let dir = fresh_data_dir();
    let items = small_items(3000);
    let server = Server::start_in(&dir, &["--threads", "2", "--memory", "256M"]);
    let mut c = server.client();
    store_small(&mut c, &items, 0);
    // Expired by the restart: never restored.
    let r = c.set(b"short-lived", b"gone", 0, 1);
    assert_eq!(r.status, 0);
    let cas_before = c.get(b"small-7").cas;
    drop(c);
    // With a ring the parts leave with WRITE_FIXED and come back with READ_FIXED.
    let ring = std::env::var("HEADROOM_TEST_IO_RING").map_or(true, |v| v != "off");
    let (status, log) = server.stop_logged();
    assert_eq!(status.code(), Some(0));
    let wrote = if ring {
        "WRITE_FIXED"
    } else {
        "positioned writes"
    };
    assert!(
        log.lines()
            .any(|l| l.contains("RAM items written") && l.contains(wrote)),
        "{log}"
    );
    std::thread::sleep(std::time::Duration::from_millis(2100));
    let server = Server::start_in(&dir, &["--threads", "1", "--memory", "256M"]);
    let read = if ring {
        "READ_FIXED"
    } else {
        "positioned reads"
    };
    assert!(server.logs(read), "{}", server.log_text());
    let mut c = server.client();
    assert_eq!(small_back(&mut c, &items), items.len());
    assert_eq!(c.get(b"short-lived").status, 1, "an expired item came back");
    assert_eq!(c.get(b"small-7").cas, cas_before, "the CAS changed");
    assert_eq!(c.stat("", "warm_restart_restored"), items.len() as u64);
    assert_eq!(c.stat("", "warm_restart_dropped"), 0);
    // Twice in a row: the first start consumed the snapshot; a second clean stop writes it
    // again, and the next start restores the same.
    drop(c);
    assert_eq!(server.stop().code(), Some(0));
    let server = Server::start_in(&dir, &["--threads", "2", "--memory", "256M"]);
    let mut c = server.client();
    assert_eq!(small_back(&mut c, &items), items.len());
}

#[test]
fn a_damaged_ram_part_restores_its_other_chunks_and_off_restores_nothing() {
    let dir = fresh_data_dir();
    // About 6 MiB of items: several chunks in the one shard's part.
    let items = small_items(2000);
    let server = Server::start_in(&dir, &["--threads", "1", "--memory", "256M"]);
    store_small(&mut server.client(), &items, 0);
    assert_eq!(server.stop().code(), Some(0));
    let part = dir.join("snapshot").join("ram-0.part");
    let bytes = std::fs::read(&part).unwrap();
    assert!(bytes.len() > 3 << 20, "{} bytes", bytes.len());
    let mut damaged = bytes.clone();
    let at = bytes.len() / 2;
    damaged[at] ^= 0x40;
    std::fs::write(&part, &damaged).unwrap();
    let server = Server::start_in(&dir, &["--threads", "1", "--memory", "256M"]);
    let mut c = server.client();
    let back = small_back(&mut c, &items);
    assert!(
        back > items.len() / 2 && back < items.len(),
        "{back} of {} back",
        items.len()
    );
    // Every item is back or counted: the damaged chunk's, and no other.
    assert_eq!(
        c.stat("", "warm_restart_dropped"),
        (items.len() - back) as u64,
        "the damaged chunk's items"
    );
    assert!(server.logs("chunks that do not check were dropped"));
    drop(c);
    assert_eq!(server.stop().code(), Some(0));
    // Truncated: the chunks before the cut come back.
    let bytes = std::fs::read(&part).unwrap();
    std::fs::write(&part, &bytes[..bytes.len() / 3]).unwrap();
    let server = Server::start_in(&dir, &["--threads", "1", "--memory", "256M"]);
    let back = small_back(&mut server.client(), &items);
    assert!(
        back > 0 && back < items.len() / 2,
        "{back} back after the cut"
    );
    assert!(server.logs("RAM part without its index"));
    assert_eq!(server.stop().code(), Some(0));
    // Off: nothing written, nothing restored (and the snapshot found is removed).
    let server = Server::start_in(
        &dir,
        &[
            "--threads",
            "1",
            "--memory",
            "256M",
            "--warm-restart",
            "off",
        ],
    );
    let mut c = server.client();
    assert_eq!(small_back(&mut c, &items), 0);
    assert_eq!(c.stat("", "warm_restart_restored"), 0);
    drop(c);
    assert_eq!(server.stop().code(), Some(0));
    assert!(!dir.join("snapshot").join("ram-0.part").exists());
}

#[test]
fn a_flush_before_the_stop_is_honoured_and_a_smaller_memory_evicts() {
    let dir = fresh_data_dir();
    let items = small_items(2000);
    let server = Server::start_in(&dir, &["--threads", "1", "--memory", "256M"]);
    let mut c = server.client();
    store_small(&mut c, &items[..100], 0);
    assert_eq!(
        c.call(&common::server::frame(0x08, &[], b"", &[], 0, 0))
            .status,
        0
    );
    drop(c);
    assert_eq!(server.stop().code(), Some(0));
    let server = Server::start_in(&dir, &["--threads", "1", "--memory", "256M"]);
    let mut c = server.client();
    assert_eq!(
        small_back(&mut c, &items[..100]),
        0,
        "flushed items came back"
    );
    // About 110 MiB of values, restored into 16 MiB: the store evicts as it admits, the
    // coldest first, and what is back is byte-exact. Every 20th item is read before the stop
    // (referenced, as a hot item is at run time).
    store_small(&mut c, &items, 0);
    let is_hot = |i: usize| i % 20 == 0;
    for (_, (key, _)) in items.iter().enumerate().filter(|(i, _)| is_hot(*i)) {
        assert_eq!(c.get(key).status, 0);
    }
    drop(c);
    assert_eq!(server.stop().code(), Some(0));
    let server = Server::start_in(&dir, &["--threads", "1", "--memory", "16M"]);
    let mut c = server.client();
    let (hot, cold): (Vec<_>, Vec<_>) = items.iter().enumerate().partition(|(i, _)| is_hot(*i));
    // small_back checks flags against the position: look each half up with its own indices.
    let back_of = |c: &mut Client, wanted: &[(usize, &Item)]| {
        wanted
            .iter()
            .filter(|(_, (key, value))| {
                let got = c.get(key);
                assert!(got.status != 0 || got.value == *value, "wrong bytes");
                got.status == 0
            })
            .count()
    };
    let hot_back = back_of(&mut c, &hot);
    let cold_back = back_of(&mut c, &cold);
    println!(
        "back after a restart into 16M: {hot_back} of {} hot, {cold_back} of {} cold",
        hot.len(),
        cold.len()
    );
    assert!(
        cold_back > 0 && cold_back < cold.len(),
        "{cold_back} cold back"
    );
    assert!(
        hot_back * 10 >= hot.len() * 9,
        "the hot items were evicted: {hot_back} of {} back ({cold_back} of {} cold)",
        hot.len(),
        cold.len()
    );
    let evicted = c.stat("", "warm_restart_evicted");
    assert!(
        evicted > 0 && evicted <= c.stat("", "evictions"),
        "{evicted}"
    );
    assert_eq!(
        c.stat("", "warm_restart_restored") - evicted,
        (hot_back + cold_back) as u64,
        "every restored item is back or counted evicted"
    );
}

/// One text request's first reply line.
fn text_request(server: &Server, request: &[u8]) -> String {
    use std::io::{BufRead, Write};
    let stream = std::net::TcpStream::connect(server.addr).unwrap();
    (&stream).write_all(request).unwrap();
    let mut line = String::new();
    std::io::BufReader::new(&stream)
        .read_line(&mut line)
        .unwrap();
    line
}

/// Text multi-get of `keys`: each value found, by key.
fn text_multi_get(server: &Server, keys: &[&[u8]]) -> std::collections::HashMap<Vec<u8>, Vec<u8>> {
    use std::io::{BufRead, Read, Write};
    let stream = std::net::TcpStream::connect(server.addr).unwrap();
    let mut line = b"get".to_vec();
    for key in keys {
        line.push(b' ');
        line.extend_from_slice(key);
    }
    line.extend_from_slice(b"\r\n");
    (&stream).write_all(&line).unwrap();
    let mut reader = std::io::BufReader::new(&stream);
    let mut found = std::collections::HashMap::new();
    loop {
        let mut header = String::new();
        reader.read_line(&mut header).unwrap();
        if header == "END\r\n" {
            return found;
        }
        let words: Vec<&str> = header.split_whitespace().collect();
        assert_eq!(words[0], "VALUE", "{header:?}");
        let mut value = vec![0u8; words[3].parse::<usize>().unwrap() + 2];
        reader.read_exact(&mut value).unwrap();
        assert_eq!(&value[value.len() - 2..], b"\r\n");
        value.truncate(value.len() - 2);
        found.insert(words[1].as_bytes().to_vec(), value);
    }
}

#[test]
fn another_partition_count_restores_every_item_and_multi_gets_match() {
    let dir = fresh_data_dir();
    let items = small_items(1500);
    let args = |partitions| {
        [
            "--threads",
            "2",
            "--memory",
            "256M",
            "--partitions",
            partitions,
        ]
    };
    let server = Server::start_in(&dir, &args("8"));
    let mut c = server.client();
    store_small(&mut c, &items, 0);
    fill(&mut c);
    // A TTL goes on counting from where it was.
    assert_eq!(c.set(b"ttl-kept", b"hello", 7, 300).status, 0);
    drop(c);
    assert_eq!(server.stop().code(), Some(0));
    let server = Server::start_in(&dir, &args("32"));
    let reply = text_request(&server, b"mg ttl-kept v t f\r\n");
    let ttl: u32 = reply
        .split_whitespace()
        .find_map(|w| w.strip_prefix('t').and_then(|t| t.parse().ok()))
        .unwrap_or_else(|| panic!("{reply:?}"));
    assert!(
        reply.starts_with("VA 5 ") && reply.contains(" f7"),
        "{reply:?}"
    );
    assert!(
        (290..=300).contains(&ttl),
        "TTL {ttl} after the restart: {reply:?}"
    );
    let mut c = server.client();
    assert_eq!(small_back(&mut c, &items), items.len());
    assert_all_back(&mut c);
    let restored = c.stat("", "warm_restart_restored");
    assert_eq!(restored, (items.len() + VALUES.len() + 1) as u64);
    // One multi-get across partitions and both shards, small and large values mixed.
    let mut keys: Vec<&[u8]> = items.iter().step_by(7).map(|(k, _)| k.as_slice()).collect();
    keys.extend(VALUES.iter().map(|(k, _, _)| k.as_bytes()));
    let found = text_multi_get(&server, &keys);
    assert_eq!(found.len(), keys.len());
    for (key, value) in items.iter().step_by(7) {
        assert!(found[key] == *value, "{}", String::from_utf8_lossy(key));
    }
    for (i, &(key, len, _)) in VALUES.iter().enumerate() {
        assert!(found[key.as_bytes()] == pattern(i as u64, len), "{key}");
    }
}

/// A kill -9 at a seeded moment of the stop's snapshot write: the next start restores every
/// item (the manifest was written) or none of them, never one shard's part without the other.
#[test]
fn a_kill_during_the_snapshot_write_restores_all_or_nothing() {
    let mut outcomes = Vec::new();
    for seed in common::seeds("warm_restart_kill", 4) {
        let mut rng = common::Rng::new(seed);
        let dir = fresh_data_dir();
        // About 300 MB in fixed slots: a write long enough to be cut.
        let items: Vec<(Vec<u8>, Vec<u8>)> = (0..1200)
            .map(|i| (format!("k{i}").into_bytes(), pattern(seed ^ i, 256 << 10)))
            .collect();
        let server = Server::start_in(&dir, &["--threads", "2", "--memory", "512M"]);
        store_small(&mut server.client(), &items, 0);
        server.signal(nix::sys::signal::SIGTERM);
        let snapshot = dir.join("snapshot");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while !snapshot.exists() {
            assert!(std::time::Instant::now() < deadline, "no snapshot written");
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
        std::thread::sleep(std::time::Duration::from_millis(rng.below(400)));
        server.stop_with(nix::sys::signal::SIGKILL);
        let whole = snapshot.join("manifest").exists();
        let server = Server::start_in(&dir, &["--threads", "2", "--memory", "512M"]);
        let back = small_back(&mut server.client(), &items);
        if whole {
            assert_eq!(back, items.len(), "seed {seed}: the snapshot was whole");
        } else {
            assert_eq!(back, 0, "seed {seed}: a cut snapshot restored a part");
            if snapshot.exists() {
                assert!(server.logs("snapshot incomplete"), "seed {seed}");
            }
        }
        outcomes.push((seed, whole));
        drop(server);
        let _ = std::fs::remove_dir_all(&dir);
    }
    println!("(seed, snapshot whole at the kill): {outcomes:?}");
}
