//! Eviction in a full store (one partition, the real `Store` and its CLOCK): once admission has
//! had to evict for room, each store pays for the bytes it adds by evicting about as much
//! (`ShardArena::admit_small`, the eviction debt), so a full store evicts about one item per
//! store, as memcached does, while the hand still empties its block whole.
//!
//! The model test runs seeded SETs of mixed sizes (packed values and fixed heads, so shared
//! mode's fixed-head admission evicts too), GETs (which set referenced bits the hand passes
//! over), DELETEs and pins held across steps (lent sends in flight), against a map of what
//! each key must hold. After every step: every invariant of the store and its arena holds,
//! each eviction is logged once (`watch evictions`) and names a key the model held, nothing
//! else is lost, every GET is byte-exact, and the first eviction found no free block to take
//! first. A SET may be refused only while pins are held (a block holding a pinned head is
//! never compacted, so a few blocks each holding one can leave no room to make), and then
//! the old value stays. Replay a seed with `HEADROOM_SEED`.

mod common;

use std::collections::HashMap;
use std::sync::Arc;

use common::{for_each_seed, Rng};
use headroom::arena::{Arena, ArenaConfig, MemoryPlan, NumaMode, SendPin, UnlockedMapper};
use headroom::proto::StoreMode;
use headroom::store::{KeyHasher, Store, StoreConfig, StoreOutcome};
use headroom::topology::Topology;

const BLOCK_BYTES: u64 = 64 << 10;
const RAM_HEAD_BYTES: usize = 8192;
const NOW: u32 = 1_000_000;

/// One partition's store over `blocks` blocks of 64 KiB (shared mode, 8 KiB heads).
fn store(blocks: u64) -> Store {
    let topology = Topology::synthetic(&[1], vec![vec![10]], BLOCK_BYTES).unwrap();
    let config = ArenaConfig {
        numa: NumaMode::Explicit(0),
        memory_bytes: blocks * BLOCK_BYTES,
        sub_memory_bytes: 0,
        small_memory_bytes: None,
        small_sub_memory_bytes: 0,
        block_bytes: BLOCK_BYTES,
        ram_head_bytes: RAM_HEAD_BYTES as u64,
        small_min_alloc_bytes: 16,
        io_chunk_bytes: 4096,
        stream_bytes: 0,
        perverse: false,
    };
    let arena: Arc<Arena> =
        Arena::map(MemoryPlan::new(&config, &topology), &UnlockedMapper, 1).expect("map");
    let config = StoreConfig {
        max_item_bytes: 1 << 20,
        partition: 0,
        partitions: 1,
        promotion_half_life_seconds: 10,
        evictions: true,
    };
    Store::new(arena.shard(0), KeyHasher::with_seed(7), config)
}

fn key(i: u64) -> Vec<u8> {
    format!("key:{i}").into_bytes()
}

fn set(store: &mut Store, key: &[u8], value: &[u8]) {
    let outcome = store.store(StoreMode::Set, key, value, 0, 0, 0, NOW);
    assert!(
        matches!(outcome, StoreOutcome::Stored { .. }),
        "set {}: {outcome:?}",
        String::from_utf8_lossy(key)
    );
}

fn holds(store: &mut Store, key: &[u8], value: &[u8]) -> bool {
    store
        .get(key, None, NOW)
        .is_some_and(|hit| hit.value.to_vec() == value)
}

/// Free blocks anyone could take: the pool's and the partition's idle ones.
fn free_blocks(store: &Store) -> u64 {
    let stats = store.arena().arena().stats(&[store.arena().stats()]);
    stats
        .regions
        .iter()
        .map(|r| r.blocks_free + r.usage.blocks_idle)
        .sum()
}

fn value_len(rng: &mut Rng) -> usize {
    match rng.below(10) {
        0 => RAM_HEAD_BYTES, // a fixed head
        1..=3 => rng.between(1, 64) as usize,
        4..=7 => rng.between(100, 1500) as usize,
        _ => rng.between(2000, RAM_HEAD_BYTES as u64 - 200) as usize,
    }
}

#[derive(Debug, Default)]
struct Coverage {
    evictions: u64,
    paced: u64,
    pinned_while_evicting: u64,
    refused_while_pinned: u64,
}

fn run(seed: u64, coverage: &mut Coverage) {
    let mut rng = Rng::new(seed);
    let blocks = 3 + rng.below(6);
    let keys = 200 + rng.below(600);
    let steps = 4000;
    let mut store = store(blocks);
    store.log_evictions(true);
    let mut model: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
    let mut pins: Vec<(Vec<u8>, SendPin)> = Vec::new();
    let mut salt = 0u64;
    for step in 0..steps {
        let k = key(rng.below(keys));
        match rng.below(100) {
            0..=59 => {
                salt += 1;
                let value = common::pattern(seed ^ salt, value_len(&mut rng));
                let (evictions, free) = (store.stats().evictions, free_blocks(&store));
                let outcome = store.store(StoreMode::Set, &k, &value, 0, 0, 0, NOW);
                let stored = matches!(outcome, StoreOutcome::Stored { .. });
                // A block holding a pinned head is never compacted (docs/arena.md), so in a
                // partition of a few blocks the pins held can leave no room to make: a
                // refusal is allowed then, and only then. The old value stays.
                assert!(
                    stored || (matches!(outcome, StoreOutcome::OutOfMemory) && !pins.is_empty()),
                    "step {step}: set {} with {} pins held: {outcome:?}",
                    String::from_utf8_lossy(&k),
                    pins.len()
                );
                coverage.refused_while_pinned += u64::from(!stored);
                let evicted = store.take_evicted();
                let now = store.stats().evictions;
                assert_eq!(
                    evicted.len() as u64,
                    now - evictions,
                    "step {step}: each eviction is logged once"
                );
                if !evicted.is_empty() && evictions == 0 {
                    // The first eviction is for room: no free block was left (a fixed head
                    // may take the last one and its record then evict). Later ones may pay a
                    // full store's debt while the block the hand emptied is free.
                    let heads = u64::from(value.len() >= RAM_HEAD_BYTES);
                    assert!(
                        free <= heads,
                        "step {step}: evicted first with {free} free blocks"
                    );
                }
                if !evicted.is_empty() {
                    coverage.pinned_while_evicting += u64::from(!pins.is_empty());
                }
                for gone in &evicted {
                    assert!(
                        model.remove(&gone.key).is_some(),
                        "step {step}: evicted {} which the model did not hold",
                        String::from_utf8_lossy(&gone.key)
                    );
                }
                if stored {
                    model.insert(k, value);
                }
            }
            60..=79 => {
                let expected = model.get(&k).cloned();
                let got = store.get(&k, None, NOW).map(|hit| hit.value.to_vec());
                assert_eq!(
                    got,
                    expected,
                    "step {step}: GET {}",
                    String::from_utf8_lossy(&k)
                );
            }
            80..=89 => {
                let deleted = store.delete(&k, 0, NOW);
                assert_eq!(
                    deleted == headroom::store::DeleteOutcome::Deleted,
                    model.remove(&k).is_some(),
                    "step {step}: DELETE"
                );
            }
            90..=94 if pins.len() < 4 => {
                if let Some(hit) = store.get(&k, None, NOW) {
                    let (at, len) = (hit.at, hit.value.len());
                    pins.push((k, store.pin_for_send(at, len)));
                }
            }
            _ => {
                if !pins.is_empty() {
                    let (_, pin) = pins.swap_remove(rng.below(pins.len() as u64) as usize);
                    store.unpin_sent(pin);
                }
            }
        }
        store.check_invariants();
        if step % 500 == 499 {
            for (k, v) in &model {
                assert!(
                    holds(&mut store, k, v),
                    "step {step}: {} lost",
                    String::from_utf8_lossy(k)
                );
            }
            assert_eq!(store.stats().curr_items, model.len() as u64);
        }
    }
    for (_, pin) in pins.drain(..) {
        store.unpin_sent(pin);
    }
    store.check_invariants();
    coverage.evictions += store.stats().evictions;
    coverage.paced += store.arena().stats().paced_evictions;
}

#[test]
fn eviction_model_holds_every_invariant() {
    let mut coverage = Coverage::default();
    for_each_seed("eviction_model", 12, |seed| run(seed, &mut coverage));
    println!("{coverage:?}");
    assert!(coverage.evictions > 0, "nothing evicted: {coverage:?}");
    assert!(
        coverage.paced > 0,
        "no eviction paid a store's debt: {coverage:?}"
    );
}

/// memcached's t/watcher.t, tests 14-15: fill the server past its memory with values of one
/// size, then watch one more store of that size evict. Every store once full evicts at least
/// one item (and, with nothing read, never more than two), and memory holds about as many
/// items as when eviction began.
#[test]
fn after_a_fill_each_store_of_the_same_size_evicts() {
    let mut store = store(6);
    let value = vec![b'x'; 330]; // about 190 records a block, as 11,000 B in 2 MiB
    let mut i = 0u64;
    while store.stats().evictions == 0 {
        set(&mut store, &key(i), &value);
        i += 1;
    }
    let per_block = i / 6;
    let held = store.stats().curr_items;
    store.log_evictions(true);
    for _ in 0..5 * per_block {
        let before = store.stats().evictions;
        set(&mut store, &key(i), &value);
        let evicted = store.take_evicted();
        let count = store.stats().evictions - before;
        assert!((1..=2).contains(&count), "store {i} evicted {count} items");
        assert_eq!(evicted.len() as u64, count, "store {i}: logged evictions");
        i += 1;
        store.check_invariants();
    }
    // The most recent stores are all there, and memory holds as many items as before.
    for j in i - per_block..i {
        assert!(holds(&mut store, &key(j), &value), "item {j} lost");
    }
    assert!(store.arena().stats().paced_evictions >= 4 * per_block);
    // Each eviction for room (one a block) is not paid back: at most a block's worth of items
    // less than when eviction began.
    assert!(
        store.stats().curr_items + per_block >= held,
        "{} items held, {held} when eviction began",
        store.stats().curr_items
    );
}

/// A store that is not full evicts nothing: neither while it fills, nor after deletes made
/// room again (a delete takes its bytes off the eviction debt).
#[test]
fn a_store_that_is_not_full_evicts_nothing() {
    let mut store = store(6);
    let value = vec![b'y'; 330];
    // Five of six blocks' worth: no eviction.
    let mut i = 0u64;
    while store.arena().stats().per_region[0].blocks_small < 5 {
        set(&mut store, &key(i), &value);
        i += 1;
    }
    assert_eq!(store.stats().evictions, 0);
    let per_block = i / 4; // four blocks full, the fifth just begun
                           // Fill until eviction, then delete every other item of the first 600: far more room than
                           // the stores below take.
    while store.stats().evictions == 0 {
        set(&mut store, &key(i), &value);
        i += 1;
    }
    let evictions = store.stats().evictions;
    let mut freed = 0;
    for j in (0..i).step_by(2).take(300) {
        if store.delete(&key(j), 0, NOW) == headroom::store::DeleteOutcome::Deleted {
            freed += 1;
        }
    }
    assert!(freed > 150, "{freed} deleted");
    // Stores up to the deleted count less one block's worth (the room the hand's block holds
    // until the hand moves on) evict nothing.
    for _ in 0..freed - per_block {
        set(&mut store, &key(i), &value);
        i += 1;
        store.check_invariants();
    }
    assert_eq!(
        store.stats().evictions,
        evictions,
        "evicted with room to spare"
    );
}
