//! The data path under fire: readers GET a handful of hot keys (small values lent zero-copy
//! from the arena, `ram_head`-sized values from fixed slots, large values from the file
//! segment) in pipelines, while writers overwrite and delete those keys and fill the arena so
//! compaction and eviction run. Every value is self-describing (its version is in its first
//! bytes and the rest derives from key and version), so each byte a reader receives is checked
//! against what was stored for that version: a pinned head reused or moved under a send would
//! show as a mismatch. Afterwards every pin and streaming chunk is home and nothing is in
//! flight. Runs on whichever data path the server uses (`HEADROOM_TEST_IO_RING`).

mod common;

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::server::{frame, set_extras, Client, Server};
use common::Rng;

const HOT_KEYS: u64 = 6;
const RAM_HEAD: usize = 64 << 10;

/// The value of `key` at `version`: its length and bytes follow from both.
fn value_of(key: u64, version: u64) -> Vec<u8> {
    let len = match version % 4 {
        0 => 17 << 10,                                       // lent zero-copy
        1 => RAM_HEAD,                                       // a fixed slot
        2 => 40 << 10,                                       // lent zero-copy
        _ => (300 << 10) + (version as usize % 7) * 100_003, // large: head + segment
    };
    let mut out = Vec::with_capacity(len);
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&key.to_le_bytes());
    let mut x = (key << 32 | version).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.push(x as u8);
    }
    out
}

fn set_value(c: &mut Client, key: u64, value: &[u8]) -> u16 {
    let k = format!("hot{key}");
    let mut head = frame(0x01, &set_extras(0, 0), k.as_bytes(), &[], 0, 0);
    head[8..12].copy_from_slice(&((8 + k.len() + value.len()) as u32).to_be_bytes());
    c.send(&head);
    c.stream.write_all(value).unwrap();
    c.recv().unwrap().status
}

#[test]
fn readers_see_whole_versions_while_writers_overwrite_delete_and_compact() {
    let seed = common::seeds("io_stress", 1)[0];
    let server = Server::start(&[
        "--threads",
        "2",
        "--memory",
        "8M",
        "--ram-head",
        "64K",
        "--zero-copy-min",
        "16K",
    ]);
    let addr = server.addr;
    let stop = Arc::new(AtomicBool::new(false));
    let checked = Arc::new(AtomicU64::new(0));
    let mut threads = Vec::new();
    // Writers: overwrite and delete the hot keys, and fill the arena with cold values.
    for w in 0..3u64 {
        let stop = Arc::clone(&stop);
        threads.push(std::thread::spawn(move || {
            let mut rng = Rng::new(seed ^ (w + 1));
            let mut c = Client::connect(addr);
            let mut version = w;
            while !stop.load(Ordering::Relaxed) {
                let key = rng.below(HOT_KEYS);
                if rng.chance(15) {
                    let k = format!("hot{key}");
                    c.call(&frame(0x04, &[], k.as_bytes(), &[], 0, 0));
                } else {
                    version += 3;
                    let status = set_value(&mut c, key, &value_of(key, version));
                    assert!(status == 0 || status == 0x82, "SET status {status:#x}");
                }
                let filler = vec![w as u8; 1000 + rng.below(30_000) as usize];
                let k = format!("cold{w}-{}", rng.below(2000));
                c.set(k.as_bytes(), &filler, 0, 0);
            }
        }));
    }
    // Readers: pipelines of GETs on the hot keys, every hit checked byte for byte.
    for r in 0..5u64 {
        let (stop, checked) = (Arc::clone(&stop), Arc::clone(&checked));
        threads.push(std::thread::spawn(move || {
            let mut rng = Rng::new(seed ^ (r + 100));
            let mut c = Client::connect(addr);
            while !stop.load(Ordering::Relaxed) {
                let keys: Vec<u64> = (0..4).map(|_| rng.below(HOT_KEYS)).collect();
                for (i, key) in keys.iter().enumerate() {
                    let k = format!("hot{key}");
                    c.send(&frame(0x00, &[], k.as_bytes(), &[], 0, i as u32));
                }
                for (i, key) in keys.iter().enumerate() {
                    let reply = c.recv().expect("a GET reply");
                    assert_eq!(reply.opaque, i as u32, "replies out of order");
                    if reply.status != 0 {
                        assert_eq!(reply.status, 1, "GET status");
                        continue;
                    }
                    let v = &reply.value;
                    assert!(v.len() >= 16, "a {}-byte value", v.len());
                    let version = u64::from_le_bytes(v[..8].try_into().unwrap());
                    let expected = value_of(*key, version);
                    assert!(
                        *v == expected,
                        "seed {seed}: hot{key} version {version}: {} bytes received, {} stored, first difference at {:?}",
                        v.len(),
                        expected.len(),
                        v.iter().zip(&expected).position(|(a, b)| a != b)
                    );
                    checked.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(6) && !threads.iter().any(|t| t.is_finished()) {
        std::thread::sleep(Duration::from_millis(50));
    }
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        if let Err(panic) = t.join() {
            std::panic::resume_unwind(panic);
        }
    }
    let checked = checked.load(Ordering::Relaxed);
    eprintln!("io_stress: {checked} values checked byte for byte");
    assert!(checked > 500, "too few reads to mean anything: {checked}");
    let mut c = server.client();
    std::thread::sleep(Duration::from_millis(200));
    let arena = c.stats("arena");
    let stat = |name: &str| -> u64 {
        arena
            .iter()
            .find(|(n, _)| n == name)
            .map_or(0, |(_, v)| v.parse().unwrap())
    };
    eprintln!(
        "io_stress: compactions {}, evictions {}, zero-copy sends {}",
        stat("compactions"),
        c.stat("", "evictions"),
        c.stats("io")
            .iter()
            .filter(|(n, _)| n.ends_with("_heads_lent"))
            .map(|(_, v)| v.parse::<u64>().unwrap())
            .sum::<u64>()
    );
    assert!(
        stat("compactions") > 0,
        "compaction never ran under the readers"
    );
    assert!(
        c.stat("", "evictions") > 0,
        "eviction never ran under the readers"
    );
    assert_eq!(stat("heads_pinned"), 0, "pins left behind");
    let io = c.stats("io");
    let sum = |suffix: &str| -> u64 {
        io.iter()
            .filter(|(n, _)| n.ends_with(suffix))
            .map(|(_, v)| v.parse::<u64>().unwrap())
            .sum()
    };
    // Nothing but the asking connection's own receive, where it stays armed.
    let own_receive = u64::from(
        io.iter()
            .any(|(n, v)| n.ends_with("_path") && v.ends_with("multishot receives)")),
    );
    assert_eq!(
        sum("_in_flight"),
        own_receive,
        "ring operations left in flight"
    );
    assert_eq!(
        sum("_pool_chunks"),
        sum("_pool_chunks_free"),
        "chunks not home"
    );
    if io
        .iter()
        .any(|(n, v)| n.ends_with("_path") && v.starts_with("ring"))
    {
        assert!(sum("_heads_lent") > 0, "no value went out zero-copy");
        // Lent bytes on huge pages (a hugetlb pool on this machine) go out as plain sends by
        // design (docs/io.md); otherwise they go zero-copy.
        assert!(
            sum("_ops_send_zc") > 0 || sum("_lent_sends_huge_pages") > 0,
            "lent heads went out neither zero-copy nor as plain sends from huge pages"
        );
    }
    assert_eq!(server.stop().code(), Some(0));
}
