//! Arena benchmark: ns per block, fixed-head and small allocation and free; compaction
//! throughput; RAM per item for 32- and 100-byte values with 14-byte keys, beside what a real
//! memcached on this machine uses for the same items.
//!
//!   cargo bench --bench arena [-- --rounds N]
//!
//! Every figure is measured in this run; timings are the median of `--rounds` rounds.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use headroom::arena::{
    Arena, ArenaConfig, MemoryPlan, NumaMode, Relocation, Reserved, UnlockedMapper,
};
use headroom::config::ByteSize;

mod common;
use common::{arena, median};
use headroom::topology::Topology;

const KEY_BYTES: u32 = 14;

/// ns per operation of `op`, run `count` times.
fn time_ns(count: usize, mut op: impl FnMut(usize)) -> f64 {
    let started = Instant::now();
    for i in 0..count {
        op(i);
    }
    started.elapsed().as_nanos() as f64 / count as f64
}

fn bench_blocks(rounds: usize) -> (f64, f64) {
    let arena = arena(1 << 30, 16);
    let blocks = arena.plan().total_blocks() as usize;
    let (mut take, mut give) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let mut batch = headroom::arena::batch::BlockBatch::new();
        let mut held = Vec::with_capacity(blocks);
        take.push(time_ns(blocks, |_| {
            held.push(
                batch
                    .acquire(arena.pool(), headroom::arena::ReservationKind::Shared, 0)
                    .unwrap(),
            )
        }));
        give.push(time_ns(blocks, |i| {
            batch.release(
                arena.pool(),
                headroom::arena::ReservationKind::Shared,
                0,
                held[i],
            )
        }));
        batch.return_all(arena.pool());
    }
    (median(take), median(give))
}

fn bench_fixed(rounds: usize) -> (f64, f64) {
    let arena = arena(1 << 30, 16);
    let mut shard = arena.shard(0);
    let count = (arena.plan().total_bytes() / (256 << 10)) as usize;
    let (mut alloc, mut free) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let mut locs = Vec::with_capacity(count);
        alloc.push(time_ns(count, |_| {
            let reserved = shard.try_reserve_fixed().unwrap();
            locs.push(shard.publish(reserved));
        }));
        free.push(time_ns(count, |i| shard.free(locs[i])));
    }
    (median(alloc), median(free))
}

fn bench_small(rounds: usize, payload: u32) -> (f64, f64) {
    let arena = arena(1 << 30, 16);
    let mut shard = arena.shard(0);
    let count = 2_000_000;
    let (mut alloc, mut free) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let mut locs = Vec::with_capacity(count);
        alloc.push(time_ns(count, |_| {
            let reserved: Reserved = shard.try_reserve_small(payload).unwrap();
            locs.push(shard.publish(reserved));
        }));
        free.push(time_ns(count, |i| shard.free(locs[i])));
    }
    (median(alloc), median(free))
}

/// Compaction: fill 256 MiB with 100-byte objects, free every other one, compact everything.
fn bench_compaction(rounds: usize) -> (f64, f64, u64) {
    let mut moved_gbps = Vec::new();
    let mut scanned_gbps = Vec::new();
    let mut moved_bytes = 0;
    for _ in 0..rounds {
        let arena = arena(256 << 20, 16);
        let mut shard = arena.shard(0);
        let mut locs = Vec::new();
        while let Ok(reserved) = shard.try_reserve_small(100) {
            shard.reserved_mut(&reserved).fill(1);
            locs.push(shard.publish(reserved));
        }
        for loc in locs.iter().step_by(2) {
            shard.free(*loc);
        }
        let frontier_bytes = arena.plan().total_bytes();
        let mut relocated = 0u64;
        let started = Instant::now();
        let report = shard.compact_all(&mut |moved: Relocation<'_>| {
            relocated += moved.payload.len() as u64;
        });
        let seconds = started.elapsed().as_secs_f64();
        assert!(relocated > 0);
        moved_bytes = report.bytes_moved;
        moved_gbps.push(report.bytes_moved as f64 / seconds / 1e9);
        scanned_gbps.push(frontier_bytes as f64 / seconds / 1e9);
    }
    (median(moved_gbps), median(scanned_gbps), moved_bytes)
}

/// Headroom's RAM per item with the real store: (arena bytes of the blocks the items fill,
/// index bytes) per item, after storing `count` items with 14-byte keys.
/// Promotion: a pass exchanging `pairs` block pairs (2 MiB blocks, 256 KiB heads) on a
/// synthetic two-node plan over unlocked memory: ms per pass and GB/s of block bytes moved.
fn bench_promotion(rounds: usize, pairs: u64) -> (f64, f64) {
    let block = 2u64 << 20;
    let topology =
        Topology::synthetic(&[1, 1], vec![vec![10, 21], vec![21, 10]], block).expect("topology");
    let mut results = Vec::new();
    let mut moved = 0;
    for _ in 0..rounds {
        let config = ArenaConfig {
            numa: NumaMode::Explicit(0),
            memory_bytes: pairs * block,
            sub_memory_bytes: pairs * block,
            small_memory_bytes: Some(2 * block),
            small_sub_memory_bytes: 0,
            block_bytes: block,
            ram_head_bytes: 256 << 10,
            small_min_alloc_bytes: 16,
            io_chunk_bytes: 1 << 20,
            stream_bytes: 0,
            perverse: false,
        };
        let arena = Arena::map(MemoryPlan::new(&config, &topology), &UnlockedMapper, 1).unwrap();
        let mut shard = arena.shard(0);
        let mut foreign = Vec::new();
        for i in 0..2 * pairs * 8 {
            let slot = shard.try_reserve_fixed().expect("room for every head");
            shard.reserved_mut(&slot).fill(i as u8);
            let owner = shard.try_reserve_small(24).expect("room for the records");
            let (slot, owner) = (shard.publish(slot), shard.publish(owner));
            shard.link_fixed_owner(slot, owner);
            if i >= pairs * 8 {
                foreign.push(slot);
            }
        }
        for &slot in &foreign {
            shard.touch_fixed(slot, 1, 1);
        }
        let started = Instant::now();
        let report = shard.promote(1, pairs as usize);
        results.push(started.elapsed().as_secs_f64());
        assert_eq!(report.exchanged.len() as u64, pairs, "every pair exchanged");
        moved = report.bytes_moved;
    }
    let seconds = median(results);
    (seconds * 1e3, moved as f64 / seconds / 1e9)
}

fn headroom_bytes_per_item(value: u32, granule: u64, count: u64) -> (f64, f64) {
    let arena = arena(256 << 20, granule);
    let hasher = headroom::store::KeyHasher::with_seed(1);
    let config = headroom::store::StoreConfig {
        max_item_bytes: 1 << 20,
        partition: 0,
        partitions: 1,
        promotion_half_life_seconds: 10,
        evictions: true,
    };
    let mut store = headroom::store::Store::new(arena.shard(0), hasher, config);
    let body = vec![b'v'; value as usize];
    for i in 0..count {
        let key = format!("k{value:03}{i:010}");
        assert_eq!(key.len(), KEY_BYTES as usize);
        let outcome = store.store(
            headroom::proto::StoreMode::Set,
            key.as_bytes(),
            &body,
            0,
            0,
            0,
            0,
        );
        assert!(matches!(
            outcome,
            headroom::store::StoreOutcome::Stored { .. }
        ));
    }
    let stats = store.stats();
    assert_eq!(stats.evictions, 0, "the arena must hold every item");
    (
        stats.bytes as f64 / count as f64,
        stats.index_bytes as f64 / count as f64,
    )
}

struct Memcached {
    child: Child,
    port: u16,
}

impl Drop for Memcached {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_memcached() -> Option<Memcached> {
    let port = 20000 + (std::process::id() % 20000) as u16;
    let mut command = Command::new("memcached");
    command.args([
        "-l",
        "127.0.0.1",
        "-p",
        &port.to_string(),
        "-U",
        "0",
        "-m",
        "1024",
        "-t",
        "1",
    ]);
    if nix::unistd::geteuid().is_root() {
        command.args(["-u", "nobody"]); // memcached refuses to run as root
    }
    let child = command
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let server = Memcached { child, port };
    for _ in 0..100 {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Some(server);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

fn stats(stream: &mut TcpStream, group: &str) -> Vec<(String, String)> {
    writeln!(stream, "stats {group}\r").unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut out = Vec::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        let line = line.trim_end();
        if line == "END" || line.is_empty() {
            return out;
        }
        let mut words = line.split_whitespace().skip(1);
        if let (Some(k), Some(v)) = (words.next(), words.next()) {
            out.push((k.to_string(), v.to_string()));
        }
    }
}

/// memcached's slab chunk for the item, and its slab bytes per item, measured by storing
/// `count` items with 14-byte keys.
fn memcached_bytes_per_item(server: &Memcached, value: u32, count: usize) -> (u64, f64) {
    let mut stream = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    writeln!(stream, "flush_all\r").unwrap();
    let mut ok = String::new();
    BufReader::new(stream.try_clone().unwrap())
        .read_line(&mut ok)
        .unwrap();
    let body = vec![b'v'; value as usize];
    let mut batch = Vec::new();
    for i in 0..count {
        let key = format!("k{value:03}{i:010}");
        assert_eq!(key.len(), KEY_BYTES as usize);
        write!(batch, "set {key} 0 0 {value} noreply\r\n").unwrap();
        batch.extend_from_slice(&body);
        batch.extend_from_slice(b"\r\n");
        if batch.len() > 1 << 20 {
            stream.write_all(&batch).unwrap();
            batch.clear();
        }
    }
    stream.write_all(&batch).unwrap();
    let slabs = stats(&mut stream, "slabs");
    let get = |name: &str| -> Vec<(u32, u64)> {
        slabs
            .iter()
            .filter_map(|(k, v)| {
                let (class, field) = k.split_once(':')?;
                if field != name {
                    return None;
                }
                Some((class.parse().ok()?, v.parse().ok()?))
            })
            .collect()
    };
    let used = get("used_chunks");
    let (class, _) = *used.iter().max_by_key(|(_, n)| *n).expect("items stored");
    let chunk = get("chunk_size")
        .into_iter()
        .find(|(c, _)| *c == class)
        .unwrap()
        .1;
    let pages = get("total_pages")
        .into_iter()
        .find(|(c, _)| *c == class)
        .unwrap()
        .1;
    let items = used.iter().find(|(c, _)| *c == class).unwrap().1;
    (chunk, (pages * (1 << 20)) as f64 / items as f64)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let rounds = common::arg(&args, "--rounds").unwrap_or(5);
    if common::listing_only(&args) {
        return; // `cargo test --benches` compiles and lists; the figures come from `cargo bench`
    }
    let backing = arena(2 << 20, 16).regions()[0].backing.to_string();
    println!("headroom arena benchmark: {rounds} rounds, median shown; backing: {backing}");

    let (take, give) = bench_blocks(rounds);
    println!("block   acquire {take:7.1} ns   release {give:7.1} ns   (per-core batch over the global pool, 512 blocks)");
    let (alloc, free) = bench_fixed(rounds);
    println!("fixed   alloc   {alloc:7.1} ns   free    {free:7.1} ns   (256 KiB buddy slots, 4096 per round)");
    for payload in [32u32, 200] {
        let (alloc, free) = bench_small(rounds, payload);
        println!("small   alloc   {alloc:7.1} ns   free    {free:7.1} ns   ({payload}-byte payloads, 2M per round)");
    }
    let (moved, scanned, bytes) = bench_compaction(rounds);
    println!(
        "compact {moved:5.2} GB/s moved, {scanned:5.2} GB/s of arena swept ({} moved per pass: 256 MiB of 100-byte objects, every other one dead)",
        ByteSize(bytes / (1 << 20) * (1 << 20))
    );
    let (pass_ms, gbps) = bench_promotion(rounds, 4);
    println!(
        "promote {pass_ms:7.2} ms per pass of 4 block exchanges ({gbps:5.2} GB/s of block bytes moved; 2 MiB blocks of 256 KiB heads, unlocked memory)"
    );

    println!("\nRAM per item, 14-byte key, 200,000 items (headroom: arena record + index entry)");
    let memcached = start_memcached();
    if memcached.is_none() {
        println!(
            "  memcached not found on PATH: install it (scripts/install-deps) for the side-by-side"
        );
    }
    for value in [32u32, 100] {
        let (arena16, index16) = headroom_bytes_per_item(value, 16, 200_000);
        let (arena8, index8) = headroom_bytes_per_item(value, 8, 200_000);
        let peer = memcached
            .as_ref()
            .map(|m| memcached_bytes_per_item(m, value, 200_000))
            .map_or("memcached: not measured".to_string(), |(chunk, per_item)| {
                format!("memcached: {chunk} B chunk, {per_item:.1} B/item of slab pages (+ its hash table)")
            });
        println!(
            "  {value:3} B value: headroom {:.1} B/item (granule 16: {arena16:.1} arena + {index16:.1} index), \
             {:.1} B/item (granule 8)   {peer}",
            arena16 + index16,
            arena8 + index8
        );
    }
}
