//! Filling the arena several times over: the server keeps serving, compaction (not eviction)
//! reclaims space when dead bytes suffice, eviction is the backstop beyond that, STAT says
//! which happened, no reply is ever wrong, and resident memory stays within the arena plus the
//! index and a fixed allowance for the process itself.

mod common;

use common::server::{frame, set_extras, Client, Server};
use common::Rng;

const MIB: u64 = 1 << 20;
/// Binary, thread stacks, glommio rings, connection buffers: what the process holds besides
/// the arena and the index (measured about 20 MiB; the bound leaves room for noise).
const PROCESS_ALLOWANCE_BYTES: u64 = 48 * MIB;

fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace()
        .nth(1)
        .unwrap()
        .parse::<u64>()
        .unwrap()
        * 1024
}

fn value_for(key: u64, len: usize) -> Vec<u8> {
    (0..len).map(|i| (key as usize * 31 + i) as u8).collect()
}

/// Sets in pipelined batches of quiet SETs, then one NOOP; every SET must succeed.
fn set_many(c: &mut Client, keys: impl Iterator<Item = (u64, usize)>) {
    let mut batch = Vec::new();
    let mut count = 0;
    let flush = |c: &mut Client, batch: &mut Vec<u8>| {
        batch.extend(frame(0x0a, &[], &[], &[], 0, 0));
        c.send(batch);
        let r = c.recv().unwrap();
        assert_eq!((r.opcode, r.status), (0x0a, 0), "a quiet SET failed: {r:?}");
        batch.clear();
    };
    for (key, len) in keys {
        batch.extend(frame(
            0x11,
            &set_extras(key as u32, 0),
            format!("key:{key}").as_bytes(),
            &value_for(key, len),
            0,
            0,
        ));
        count += 1;
        if count % 256 == 0 {
            flush(c, &mut batch);
        }
    }
    flush(c, &mut batch);
}

#[test]
fn compaction_reclaims_dead_space_before_anything_is_evicted() {
    let server = Server::start(&["--threads", "2", "--memory", "8M", "--ram-head", "16K"]);
    let mut c = server.client();
    // ~144 arena bytes per item: 45,000 items fill about 77 % of the 8 MiB.
    set_many(&mut c, (0..45_000).map(|k| (k, 100)));
    // Delete every other one: dead holes everywhere, no block empties.
    let mut batch = Vec::new();
    for k in (0..45_000).step_by(2) {
        batch.extend(frame(0x14, &[], format!("key:{k}").as_bytes(), &[], 0, 0));
    }
    batch.extend(frame(0x0a, &[], &[], &[], 0, 0));
    c.send(&batch);
    assert_eq!(c.recv().unwrap().opcode, 0x0a);
    // As many new items as were deleted: more than the free tails hold (~1.9 MB of 3.2 MB
    // needed), so only reusing the holes makes room for them.
    set_many(&mut c, (100_000..122_500).map(|k| (k, 100)));
    let evictions = c.stat("", "evictions");
    let compactions = c.stat("", "compactions");
    assert_eq!(
        evictions, 0,
        "dead space sufficed; nothing should have been evicted"
    );
    assert!(compactions > 0, "compaction must have run");
    for k in (1..45_000).step_by(2).chain(100_000..122_500).step_by(97) {
        let r = c.get(format!("key:{k}").as_bytes());
        assert_eq!((r.status, r.value), (0, value_for(k, 100)), "key {k}");
    }
}

#[test]
fn filling_the_arena_many_times_over_keeps_serving_within_the_memory_bound() {
    let arena_bytes = 16 * MIB;
    let server = Server::start(&["--threads", "2", "--memory", "16M", "--ram-head", "16K"]);
    let mut c = server.client();
    let mut rng = Rng::new(7);
    let mut written = 0u64;
    let mut key = 0u64;
    // Mixed sizes, small to exactly ram_head, until six arenas' worth went in.
    while written < 6 * arena_bytes {
        let batch: Vec<(u64, usize)> = (0..512)
            .map(|_| {
                key += 1;
                let len = match rng.below(100) {
                    0..=59 => rng.below(64) as usize,
                    60..=94 => 64 + rng.below(2000) as usize,
                    _ => 16 * 1024,
                };
                written += len as u64;
                (key, len)
            })
            .collect();
        let lens: Vec<(u64, usize)> = batch.clone();
        set_many(&mut c, batch.into_iter());
        // Spot-check the newest keys: a hit must be byte-exact.
        for &(k, len) in lens.iter().rev().take(3) {
            let r = c.get(format!("key:{k}").as_bytes());
            if r.status == 0 {
                assert_eq!(r.value, value_for(k, len), "key {k} came back wrong");
            }
        }
    }
    let evictions = c.stat("", "evictions");
    let index_bytes = c.stat("", "index_bytes");
    let items = c.stat("", "curr_items");
    assert!(evictions > 0, "six arenas of data must have evicted");
    assert!(items > 1000);
    let rss = rss_bytes(server.pid());
    let bound = arena_bytes + index_bytes + PROCESS_ALLOWANCE_BYTES;
    println!(
        "rss {rss} bytes, arena {arena_bytes}, index {index_bytes} ({items} items), bound {bound}"
    );
    assert!(
        rss <= bound,
        "resident {rss} exceeds arena + index + allowance = {bound}"
    );
    // Still serving after all that.
    assert_eq!(c.set(b"after", b"ok", 0, 0).status, 0);
    assert_eq!(c.get(b"after").value, b"ok");
}
