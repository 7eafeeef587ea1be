//! Model-based test of the partition / per-core-batch layer under concurrent access: two real
//! threads, each a "core" with its own block batch installed, run seeded operations (SET, GET,
//! DELETE, CAS, INCR, APPEND, a warm restart's restore of an item with its own CAS, expiry sweeps, `lru_crawler` crawls and metadumps walking a
//! partition's index in slices, promotion passes, pins held across steps) against
//! shared partitions over a two-node arena small enough that admission compacts and evicts. A
//! seeded scheduler decides which thread runs each step, so an interleaving replays from its
//! seed (`HEADROOM_SEED`). After every step: every GET hit is byte-exact against the model,
//! every CAS has its one winner, INCR totals are exact, pinned heads never move, every block is
//! in exactly one place (the pool, one core's batch, or one partition), and every store's
//! invariants hold. A crawl leaves exactly the unexpired items; a dump lists each key once, from
//! its own partition, at the model's CAS. With evictions off (`--evictions off`) the model is
//! exact: nothing is evicted, a key without an expiry is never lost, a refused store leaves the
//! key as it was, and a store is refused only when no free block is left to take.

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::mpsc;
use std::sync::Arc;

use common::{for_each_seed, Rng};
use headroom::arena::batch::{install_core_batch, with_core_batch};
use headroom::arena::{Arena, ArenaConfig, BlockId, MemoryPlan, NumaMode, SendPin, UnlockedMapper};
use headroom::proto::StoreMode;
use headroom::store::item::{self, Meta};
use headroom::store::partition::Partitions;
use headroom::store::{
    ArithOutcome, KeyHasher, Lookup, Recency, StoreConfig, StoreOutcome, PARTITIONS_MAX,
};
use headroom::topology::Topology;

const HUGE: u64 = 64 << 10;
/// `--ram-head`: the longest value a store keeps in RAM.
const RAM_HEAD_BYTES: usize = 8192;
const CORES: usize = 2;
const KEYS: u64 = 48;

fn topology() -> Topology {
    Topology::synthetic(&[1, 1], vec![vec![10, 21], vec![21, 10]], HUGE).unwrap()
}

fn config(rng: &mut Rng) -> ArenaConfig {
    ArenaConfig {
        numa: NumaMode::Explicit(0),
        memory_bytes: (3 + rng.below(3)) * HUGE,
        sub_memory_bytes: (2 + rng.below(3)) * HUGE,
        small_memory_bytes: None,
        small_sub_memory_bytes: 0,
        block_bytes: HUGE,
        ram_head_bytes: RAM_HEAD_BYTES as u64,
        small_min_alloc_bytes: 16,
        io_chunk_bytes: 4096,
        stream_bytes: 0,
        perverse: false,
    }
}

/// One step a core runs.
enum Op {
    /// `ttl` 0: never expires; else it dies at the sweeps' later clock.
    Set {
        key: Vec<u8>,
        value: Vec<u8>,
        ttl: u32,
    },
    Get {
        key: Vec<u8>,
    },
    Delete {
        key: Vec<u8>,
    },
    /// CAS with the token the model last saw: exactly one of racing CASes can win.
    Cas {
        key: Vec<u8>,
        cas: u64,
        value: Vec<u8>,
    },
    Incr {
        key: Vec<u8>,
    },
    /// A warm restart's store of an item with its own CAS (from a range no partition issues)
    /// and recency.
    Restore {
        key: Vec<u8>,
        value: Vec<u8>,
        cas: u64,
        referenced: bool,
    },
    Append {
        key: Vec<u8>,
        token: Vec<u8>,
    },
    Sweep {
        partition: usize,
        now: u32,
    },
    /// `lru_crawler crawl` of one partition: every expired item, `slice` index buckets per
    /// lock hold.
    Crawl {
        partition: usize,
        now: u32,
        slice: usize,
    },
    /// `lru_crawler metadump` of one partition, `slice` index buckets per lock hold.
    Dump {
        partition: usize,
        slice: usize,
    },
    Promote {
        partition: usize,
    },
    /// Pin a hit's bytes (a lent send in flight) and keep the pin for later steps.
    Pin {
        key: Vec<u8>,
    },
    Unpin,
    Stop,
}

/// What a core answers, with the idle blocks its batch holds after the step.
struct Done {
    outcome: Outcome,
    batch: Vec<BlockId>,
}

#[derive(Debug)]
enum Outcome {
    Stored(StoreOutcome),
    Value(Option<(Vec<u8>, u64)>),
    Counter(Option<u64>),
    Deleted(bool),
    /// A pin taken: its bytes as seen now.
    Pinned(Option<Vec<u8>>),
    /// Pins ended; each pinned range's bytes just before the unpin.
    Unpinned(Vec<(Vec<u8>, Vec<u8>)>),
    /// A crawl: the items it should have left (every unexpired one), and those it left.
    Crawled {
        expected: Vec<(Vec<u8>, u32)>,
        left: Vec<(Vec<u8>, u32)>,
    },
    /// The keys a dump listed, with their CAS, and the partition they came from.
    Dumped(usize, Vec<(Vec<u8>, u64)>),
    Nothing,
}

const NOW: u32 = 1_000_000;

fn core(
    arena: Arc<Arena>,
    partitions: Arc<Partitions>,
    ops: mpsc::Receiver<Op>,
    done: mpsc::Sender<Done>,
) {
    install_core_batch();
    // Pins this core holds: (partition, pin, the bytes when pinned).
    let mut pins: Vec<(usize, SendPin, Vec<u8>)> = Vec::new();
    for op in ops {
        let outcome = match op {
            Op::Stop => break,
            Op::Set { key, value, ttl } => {
                let (_, mut store) = partitions.lock_key(&key);
                Outcome::Stored(store.store(StoreMode::Set, &key, &value, 0, ttl, 0, NOW))
            }
            Op::Cas { key, cas, value } => {
                let (_, mut store) = partitions.lock_key(&key);
                Outcome::Stored(store.store(StoreMode::Set, &key, &value, 0, 0, cas, NOW))
            }
            Op::Append { key, token } => {
                let (_, mut store) = partitions.lock_key(&key);
                Outcome::Stored(store.store(StoreMode::Append, &key, &token, 0, 0, 0, NOW))
            }
            Op::Restore {
                key,
                value,
                cas,
                referenced,
            } => {
                let (_, mut store) = partitions.lock_key(&key);
                let meta = Meta {
                    cas,
                    flags: 0,
                    expiry: 0,
                };
                let recency = Recency {
                    referenced,
                    fetched: referenced,
                    accessed: NOW - 5,
                };
                Outcome::Stored(store.restore_item(&key, &value, meta, recency))
            }
            Op::Get { key } => {
                // As a pipelined batch's look ahead does: read the published index layout
                // while the other core may be growing the table, then probe for the records.
                let hash = partitions.hasher().hash(&key);
                partitions.prefetch_index(hash);
                partitions.prefetch_records(hash);
                let (_, mut store) = partitions.lock_key(&key);
                match store.lookup(&key, None, NOW, false) {
                    Lookup::Small(hit) => Outcome::Value(Some((hit.value.to_vec(), hit.cas))),
                    _ => Outcome::Value(None),
                }
            }
            Op::Delete { key } => {
                let (_, mut store) = partitions.lock_key(&key);
                Outcome::Deleted(matches!(
                    store.delete(&key, 0, NOW),
                    headroom::store::DeleteOutcome::Deleted
                ))
            }
            Op::Incr { key } => {
                let (_, mut store) = partitions.lock_key(&key);
                match store.arith(true, &key, 1, 0, 0, 0, NOW) {
                    ArithOutcome::Value { value, .. } => Outcome::Counter(Some(value)),
                    _ => Outcome::Counter(None),
                }
            }
            Op::Sweep { partition, now } => {
                partitions.lock(partition).sweep_expired(64, now);
                Outcome::Nothing
            }
            Op::Crawl {
                partition,
                now,
                slice,
            } => {
                // Every item with its expiry (a dump at time 0 lists expired ones too).
                let items = || {
                    let store = partitions.lock(partition);
                    let mut all = Vec::new();
                    let mut from = Some(0);
                    while let Some(bucket) = from {
                        from = store.dump_meta(bucket, usize::MAX, 0, |key, item| {
                            all.push((key.to_vec(), item.expiry));
                        });
                    }
                    all.sort_unstable();
                    all
                };
                let mut expected = items();
                expected.retain(|&(_, expiry)| expiry == 0 || expiry > now);
                let mut from = Some(0);
                while let Some(bucket) = from {
                    let mut store = partitions.lock(partition);
                    from = store.reclaim_expired_in(bucket, slice, now, |_| true);
                }
                Outcome::Crawled {
                    expected,
                    left: items(),
                }
            }
            Op::Dump { partition, slice } => {
                let mut listed = Vec::new();
                let mut from = Some(0);
                while let Some(bucket) = from {
                    let store = partitions.lock(partition);
                    from = store.dump_meta(bucket, slice, NOW, |key, item| {
                        listed.push((key.to_vec(), item.cas));
                    });
                }
                Outcome::Dumped(partition, listed)
            }
            Op::Promote { partition } => {
                partitions.lock(partition).promote(2, NOW);
                Outcome::Nothing
            }
            Op::Pin { key } => {
                let (partition, mut store) = partitions.lock_key(&key);
                let found = match store.lookup(&key, None, NOW, false) {
                    Lookup::Small(hit) if !hit.value.is_empty() => {
                        Some((hit.at, hit.value.len(), hit.value.to_vec()))
                    }
                    _ => None,
                };
                match found {
                    Some((at, len, bytes)) => {
                        let pin = store.pin_for_send(at, len);
                        pins.push((partition, pin, bytes.clone()));
                        Outcome::Pinned(Some(bytes))
                    }
                    None => Outcome::Pinned(None),
                }
            }
            Op::Unpin => {
                let mut seen = Vec::new();
                for (partition, pin, bytes) in pins.drain(..) {
                    // The pinned bytes, read where the pin says they are (as a send would),
                    // then the pin back, as the send's completion hands it back.
                    let back = std::rc::Rc::new(std::cell::RefCell::new(None));
                    let slot = std::rc::Rc::clone(&back);
                    let lent = pin.lend(move |pin| *slot.borrow_mut() = Some(pin));
                    let now = lent.slices().concat();
                    drop(lent);
                    let pin = back.borrow_mut().take().expect("the pin comes back");
                    seen.push((bytes, now));
                    partitions.lock(partition).unpin_sent(pin);
                }
                Outcome::Unpinned(seen)
            }
        };
        let batch = with_core_batch(|b| b.all_held().collect()).unwrap_or_default();
        if done.send(Done { outcome, batch }).is_err() {
            break;
        }
    }
    // Give the idle blocks back, as a shard does at shutdown.
    headroom::arena::batch::retire_core_batch(arena.pool());
}

fn value_for(key: u64, version: u64, rng: &mut Rng) -> Vec<u8> {
    // Sizes on both sides of the small class's reach and exactly ram_head (a fixed slot).
    let len = match rng.below(10) {
        0 => 8192,
        1..=3 => 1 + rng.below(400) as usize,
        _ => 1 + rng.below(40) as usize,
    };
    let mut v = format!("{key}:{version}:").into_bytes();
    v.resize(len.max(v.len()), b'a' + (version % 26) as u8);
    v
}

/// What a run saw that the test checks it exercised.
#[derive(Default)]
struct Seen {
    /// Stores refused for want of room.
    refusals: u64,
}

fn run(seed: u64, steps: usize, evictions: bool) -> Seen {
    let mut seen = Seen::default();
    let mut rng = Rng::new(seed);
    let topo = topology();
    let arena = Arena::map(
        MemoryPlan::new(&config(&mut rng), &topo),
        &UnlockedMapper,
        CORES,
    )
    .expect("map");
    let count = 1 + rng.below(4) as usize;
    let partitions = Arc::new(Partitions::new(
        &arena,
        KeyHasher::with_seed(seed),
        count,
        |index| StoreConfig {
            evictions,
            ..store_config(index)
        },
    ));
    let total_blocks = arena.table().len();
    let mut to_core = Vec::new();
    let mut from_core = Vec::new();
    let mut threads = Vec::new();
    for _ in 0..CORES {
        let (op_tx, op_rx) = mpsc::channel();
        let (done_tx, done_rx) = mpsc::channel();
        let partitions = Arc::clone(&partitions);
        let arena = Arc::clone(&arena);
        threads.push(std::thread::spawn(move || {
            core(arena, partitions, op_rx, done_tx)
        }));
        to_core.push(op_tx);
        from_core.push(done_rx);
    }
    let mut batches: Vec<Vec<BlockId>> = vec![Vec::new(); CORES];
    // The model: what each key holds, its CAS, and whether eviction may have taken it.
    let mut model: HashMap<Vec<u8>, (Vec<u8>, u64)> = HashMap::new();
    let mut uncertain: HashSet<Vec<u8>> = HashSet::new();
    // Keys whose item has an expiry: the sweeps and crawls (at a later clock) may take them.
    let mut expiring: HashSet<Vec<u8>> = HashSet::new();
    let mut issued: HashSet<u64> = HashSet::new();
    let mut versions = 0u64;
    let mut counter = 0u64;
    let mut counter_known = false;
    let mut pins_held = [false; CORES];
    let key = |i: u64| format!("k{i}").into_bytes();
    for step in 0..steps {
        let who = rng.below(CORES as u64) as usize;
        let k = rng.below(KEYS);
        let op = match rng.below(100) {
            0..=29 => {
                versions += 1;
                Op::Set {
                    key: key(k),
                    value: value_for(k, versions, &mut rng),
                    ttl: if rng.chance(15) { NOW + 1 } else { 0 },
                }
            }
            30..=54 => Op::Get { key: key(k) },
            55..=61 => Op::Delete { key: key(k) },
            62..=69 => match model.get(&key(k)) {
                Some((_, cas)) => {
                    versions += 1;
                    Op::Cas {
                        key: key(k),
                        cas: *cas,
                        value: value_for(k, versions, &mut rng),
                    }
                }
                None => Op::Get { key: key(k) },
            },
            70..=75 => Op::Incr {
                key: b"counter".to_vec(),
            },
            76..=79 => {
                versions += 1;
                Op::Restore {
                    key: key(k),
                    value: value_for(k, versions, &mut rng),
                    // Above anything a partition issues in a run.
                    cas: (1 << 40) + versions,
                    referenced: rng.chance(50),
                }
            }
            80..=85 => Op::Append {
                key: key(k),
                token: format!("+{step}").into_bytes(),
            },
            86..=87 => Op::Sweep {
                partition: rng.below(count as u64) as usize,
                now: NOW + 1,
            },
            88 => Op::Crawl {
                partition: rng.below(count as u64) as usize,
                now: NOW + 1,
                slice: 1 + rng.below(8) as usize,
            },
            89..=92 => Op::Promote {
                partition: rng.below(count as u64) as usize,
            },
            93..=95 if !pins_held[who] => Op::Pin { key: key(k) },
            96 => Op::Dump {
                partition: rng.below(count as u64) as usize,
                slice: 1 + rng.below(8) as usize,
            },
            _ => Op::Unpin,
        };
        let described = match &op {
            Op::Set { key, .. } => format!("set {}", String::from_utf8_lossy(key)),
            Op::Get { key } => format!("get {}", String::from_utf8_lossy(key)),
            Op::Delete { key } => format!("delete {}", String::from_utf8_lossy(key)),
            Op::Cas { key, .. } => format!("cas {}", String::from_utf8_lossy(key)),
            Op::Incr { .. } => "incr".into(),
            Op::Append { key, .. } => format!("append {}", String::from_utf8_lossy(key)),
            Op::Restore { key, .. } => format!("restore {}", String::from_utf8_lossy(key)),
            Op::Sweep { partition, .. } => format!("sweep {partition}"),
            Op::Crawl { partition, .. } => format!("crawl {partition}"),
            Op::Dump { partition, .. } => format!("dump {partition}"),
            Op::Promote { partition } => format!("promote {partition}"),
            Op::Pin { key } => format!("pin {}", String::from_utf8_lossy(key)),
            Op::Unpin => "unpin".into(),
            Op::Stop => unreachable!(),
        };
        let context = format!("seed {seed} step {step} core {who}: {described}");
        let (set_key, set_value) = match &op {
            Op::Set { key, value, .. }
            | Op::Cas { key, value, .. }
            | Op::Restore { key, value, .. } => (Some(key.clone()), Some(value.clone())),
            Op::Append { key, token } => (Some(key.clone()), Some(token.clone())),
            Op::Get { key } | Op::Delete { key } | Op::Pin { key } => (Some(key.clone()), None),
            _ => (None, None),
        };
        let sets_expiry = match &op {
            Op::Set { ttl, .. } => Some(*ttl != 0),
            Op::Cas { .. } | Op::Restore { .. } => Some(false),
            _ => None,
        };
        let is_cas = matches!(op, Op::Cas { .. });
        let restored_cas = match op {
            Op::Restore { cas, .. } => Some(cas),
            _ => None,
        };
        let is_append = matches!(op, Op::Append { .. });
        // The new value's length, where the model knows it: a store of one that takes a
        // fixed slot needs two blocks of their own classes when no slot or record room is
        // left, one for the slot and one for the record.
        let stored_len = match &op {
            Op::Set { value, .. } | Op::Cas { value, .. } | Op::Restore { value, .. } => {
                Some(value.len())
            }
            Op::Append { key, token } => model.get(key).map(|(old, _)| old.len() + token.len()),
            _ => None,
        };
        let takes_fixed_slot = match (&set_key, stored_len) {
            (Some(key), Some(len)) => {
                len == RAM_HEAD_BYTES || item::record_len(key.len(), Some(len)) >= RAM_HEAD_BYTES
            }
            _ => false,
        };
        let is_delete = matches!(op, Op::Delete { .. });
        to_core[who].send(op).unwrap();
        let done = from_core[who].recv().expect("the core answers");
        if let (Ok(watch), Some(k)) = (std::env::var("HEADROOM_TRACE_KEY"), &set_key) {
            if watch.as_bytes() == k.as_slice() {
                eprintln!("{context} -> {:?}", done.outcome);
            }
        }
        batches[who] = done.batch;
        // Evictions off: a refusal for room is right only when no block is left to take (the
        // pool is empty and so is the refusing core's batch; another core's idle blocks are
        // out of its reach, as with evictions on), or, for a value that takes a fixed slot,
        // when one is: its slot took that block, and its record found none (the slot is
        // given back, and the block with it).
        let free_blocks = || {
            arena.pool().with(|pool| {
                (0..total_blocks as u32)
                    .filter(|&b| pool.is_free(BlockId(b)))
                    .count()
            })
        };
        let mut refused_for_room = |what: &str| {
            seen.refusals += 1;
            let free = free_blocks();
            assert!(
                free == 0 || (free == 1 && takes_fixed_slot),
                "{context}: {what} refused with {free} free blocks in the pool \
                 (a fixed slot: {takes_fixed_slot})"
            );
            assert!(
                batches[who].is_empty(),
                "{context}: {what} refused with blocks in its core's batch"
            );
        };
        // Evictions off: whether the model's key may be gone (it has an expiry, or the model
        // had already lost it); never a key it holds without one.
        let may_be_gone = |key: &Vec<u8>,
                           model: &HashMap<Vec<u8>, (Vec<u8>, u64)>,
                           expiring: &HashSet<Vec<u8>>| {
            evictions || expiring.contains(key) || !model.contains_key(key)
        };
        // A hit must be exactly the model's value; for a key whose state the model lost (a
        // store refused for memory may or may not have kept the old value) it must at least
        // be one of this key's values, and the model adopts it.
        let mut check_hit = |key: &Vec<u8>, bytes: &[u8], cas: Option<u64>, what: &str| {
            if let Some((want, want_cas)) = model.get(key) {
                assert!(
                    bytes == want.as_slice(),
                    "{context}: {what} returned other bytes"
                );
                if let Some(cas) = cas {
                    assert_eq!(cas, *want_cas, "{context}: CAS changed without a store");
                }
            } else if uncertain.remove(key) {
                let own = format!("{}:", String::from_utf8_lossy(&key[1..]));
                assert!(
                    bytes.starts_with(own.as_bytes()),
                    "{context}: {what} returned another key's bytes"
                );
                match cas {
                    Some(cas) => {
                        model.insert(key.clone(), (bytes.to_vec(), cas));
                    }
                    None => {
                        uncertain.insert(key.clone());
                    }
                }
            } else {
                panic!("{context}: {what} hit a key the model holds absent");
            }
        };
        match done.outcome {
            Outcome::Stored(outcome) => {
                let key = set_key.unwrap();
                let value = set_value.unwrap();
                // CAS values are unique across partitions, and small (clients parse them
                // into 32 bits): each partition issues every `count`-th value.
                match (outcome, restored_cas) {
                    // A restored item keeps the CAS it was written with.
                    (StoreOutcome::Stored { cas, .. }, Some(want)) => {
                        assert_eq!(cas, want, "{context}: the restored CAS");
                    }
                    (StoreOutcome::Stored { cas, .. }, None) => {
                        assert!(issued.insert(cas), "{context}: CAS {cas} issued twice");
                        assert!(
                            cas <= (step as u64 + 1) * count as u64,
                            "{context}: CAS {cas} after {step} operations on {count} partitions"
                        );
                    }
                    _ => {}
                }
                if let (StoreOutcome::Stored { .. }, Some(expires)) = (outcome, sets_expiry) {
                    match expires {
                        true => expiring.insert(key.clone()),
                        false => expiring.remove(&key),
                    };
                }
                match outcome {
                    StoreOutcome::Stored { cas, len } if is_append => match model.get(&key) {
                        Some((old, _)) => {
                            let new = [old.clone(), value].concat();
                            assert_eq!(len, new.len() as u64, "{context}: APPEND's length");
                            model.insert(key, (new, cas));
                        }
                        None => {
                            assert!(
                                uncertain.contains(&key),
                                "{context}: APPEND stored on a key the model holds absent"
                            );
                        }
                    },
                    StoreOutcome::Stored { cas, len } => {
                        assert_eq!(len, value.len() as u64, "{context}: the stored length");
                        uncertain.remove(&key);
                        model.insert(key, (value, cas));
                    }
                    // The model's CAS is the key's current one: only its loss (eviction,
                    // expiry) may fail the race, never another token.
                    StoreOutcome::Exists if is_cas => {
                        panic!("{context}: CAS with the current token lost")
                    }
                    // Evictions off: a refusal for room leaves the key as it was (an APPEND's
                    // "not stored" onto a key the model holds is one).
                    StoreOutcome::OutOfMemory if !evictions => {
                        refused_for_room("a store");
                    }
                    // (One whose sum would outgrow --ram-head is refused for that.)
                    StoreOutcome::NotStored
                        if !evictions && is_append && !may_be_gone(&key, &model, &expiring) =>
                    {
                        let old = model[&key].0.len();
                        if old + value.len() <= RAM_HEAD_BYTES {
                            refused_for_room("an APPEND");
                        }
                    }
                    _ if !evictions => {
                        assert!(
                            may_be_gone(&key, &model, &expiring),
                            "{context}: {outcome:?} for a key held without expiry, evictions off"
                        );
                        model.remove(&key);
                        uncertain.insert(key);
                    }
                    // A key gone meanwhile, or a store refused for memory: state unknown.
                    _ => {
                        model.remove(&key);
                        uncertain.insert(key);
                    }
                }
            }
            Outcome::Value(found) => {
                let key = set_key.unwrap();
                match found {
                    Some((bytes, cas)) => check_hit(&key, &bytes, Some(cas), "GET"),
                    // Eviction or expiry may have taken it.
                    None => {
                        assert!(
                            may_be_gone(&key, &model, &expiring),
                            "{context}: a key held without expiry was lost, evictions off"
                        );
                        model.remove(&key);
                        uncertain.remove(&key);
                    }
                }
            }
            Outcome::Deleted(deleted) => {
                let key = set_key.unwrap();
                let had = model.remove(&key).is_some() | uncertain.remove(&key);
                assert!(
                    !deleted || had,
                    "{context}: DELETE found a key the model holds absent"
                );
                let _ = is_delete;
            }
            Outcome::Counter(value) => match value {
                // 0: the counter was missing (never made, or evicted) and is created at 0.
                Some(v) => {
                    // 0 after a known value: evicted and made again, never with evictions off.
                    if counter_known && (v != 0 || !evictions) {
                        assert_eq!(v, counter + 1, "{context}: an INCR was lost or doubled");
                    }
                    counter = v;
                    counter_known = true;
                }
                None => counter_known = false,
            },
            Outcome::Pinned(bytes) => {
                let key = set_key.unwrap();
                match bytes {
                    Some(bytes) => {
                        pins_held[who] = true;
                        check_hit(&key, &bytes, None, "a pin");
                    }
                    None => {
                        assert!(
                            may_be_gone(&key, &model, &expiring),
                            "{context}: a key held without expiry was lost, evictions off"
                        );
                        model.remove(&key);
                        uncertain.remove(&key);
                    }
                }
            }
            Outcome::Unpinned(pinned) => {
                pins_held[who] = false;
                for (then, now) in pinned {
                    assert!(then == now, "{context}: a pinned head moved or changed");
                }
            }
            // Nothing runs between a dump's slices here, so it is exact: each key once, in
            // its own partition, never one the model holds absent, and at the model's CAS.
            Outcome::Dumped(partition, listed) => {
                let mut once = HashSet::new();
                for (key, cas) in listed {
                    let name = String::from_utf8_lossy(&key).into_owned();
                    assert!(once.insert(key.clone()), "{context}: {name} listed twice");
                    assert_eq!(
                        partitions.of_key(&key),
                        partition,
                        "{context}: {name} listed from another partition"
                    );
                    if key == b"counter" {
                        continue;
                    }
                    match model.get(&key) {
                        Some((_, want)) => {
                            assert_eq!(cas, *want, "{context}: {name} listed at another CAS")
                        }
                        None => assert!(
                            uncertain.contains(&key),
                            "{context}: {name} listed, but the model holds it absent"
                        ),
                    }
                }
            }
            Outcome::Crawled { expected, left } => {
                assert_eq!(left, expected, "{context}: a crawl left other items");
            }
            Outcome::Nothing => {}
        }
        // Every block is in exactly one place.
        let mut placed: Vec<BlockId> = Vec::new();
        for index in 0..partitions.len() {
            let store = partitions.lock(index);
            store.check_invariants();
            if !evictions {
                assert_eq!(
                    store.stats().evictions,
                    0,
                    "{context}: evicted, evictions off"
                );
            }
            placed.extend(store.arena().blocks_held());
        }
        for batch in &batches {
            placed.extend(batch.iter().copied());
        }
        let free = arena.pool().with(|pool| {
            (0..total_blocks as u32)
                .filter(|&b| pool.is_free(BlockId(b)))
                .count()
        });
        let unique: HashSet<BlockId> = placed.iter().copied().collect();
        assert_eq!(
            unique.len(),
            placed.len(),
            "{context}: a block is held twice"
        );
        assert_eq!(
            placed.len() + free,
            total_blocks,
            "{context}: blocks lost or made up ({} held, {free} free of {total_blocks})",
            placed.len()
        );
    }
    for (core, tx) in to_core.iter().enumerate() {
        if pins_held[core] {
            tx.send(Op::Unpin).unwrap();
            let _ = from_core[core].recv();
        }
        tx.send(Op::Stop).unwrap();
    }
    for thread in threads {
        thread.join().expect("a core panicked");
    }
    seen
}

/// Partition `index`'s store: 1 MiB items, a 10 s promotion half-life, evictions on.
fn store_config(index: usize) -> StoreConfig {
    StoreConfig {
        max_item_bytes: 1 << 20,
        partition: index,
        // (Partitions::new sets the count it made.)
        partitions: PARTITIONS_MAX,
        promotion_half_life_seconds: 10,
        evictions: true,
    }
}

#[test]
fn partitions_and_core_batches_hold_every_invariant_under_seeded_interleavings() {
    for_each_seed("partition_model", 48, |seed| {
        run(seed, 3000, true);
    });
}

/// `--evictions off`: the same operations never evict, never lose a key held without expiry,
/// and refuse a store only when no block is left; the seeds must reach that point.
#[test]
fn with_evictions_off_nothing_is_evicted_and_only_a_full_arena_refuses() {
    let mut refusals = 0;
    for_each_seed("partition_model_evictions_off", 48, |seed| {
        refusals += run(seed, 3000, false).refusals;
    });
    assert!(refusals > 0, "no store was refused: the arena never filled");
}

/// Split mode with a small-object reservation of one block under ten fixed-head blocks (the
/// three-node plan of `tests/numa_vm.rs`'s promotion test): the server's default asked for two
/// partitions (ten fixed-head blocks, four each), but every item's record is a small object and
/// a block in use belongs to one partition, so the second partition refused every store.
/// `Partitions::new` keeps no more partitions than the scarcest reservation has blocks, and 48
/// heads of exactly `ram_head` fit in 4 MiB + 8 MiB without an eviction.
#[test]
fn one_small_block_means_one_partition() {
    use headroom::store::partition::{default_count, default_count_for, max_count};
    const MIB: u64 = 1 << 20;
    let distances = vec![vec![10, 21, 31], vec![21, 10, 21], vec![31, 21, 10]];
    let topo = Topology::synthetic(&[1, 1, 1], distances, 2 * MIB).unwrap();
    let config = ArenaConfig {
        numa: NumaMode::Explicit(0),
        memory_bytes: 4 * MIB,
        sub_memory_bytes: 8 * MIB,
        small_memory_bytes: Some(2 * MIB),
        small_sub_memory_bytes: 0,
        block_bytes: 2 * MIB,
        ram_head_bytes: 256 << 10,
        small_min_alloc_bytes: 16,
        io_chunk_bytes: 64 << 10,
        stream_bytes: 0,
        perverse: false,
    };
    let plan = MemoryPlan::new(&config, &topo);
    assert_eq!(default_count_for(1, &plan), 1);
    assert_eq!(max_count(&plan), 1);
    let arena = Arena::map(plan, &UnlockedMapper, 1).expect("map");
    // What a caller counting only the fixed-head blocks would ask for with more of them.
    let asked = default_count(1, 16);
    assert_eq!(asked, 2);
    let partitions = Partitions::new(&arena, KeyHasher::with_seed(7), asked, store_config);
    assert_eq!(partitions.len(), 1);
    install_core_batch();
    let value = |i: u64| -> Vec<u8> {
        let mut rng = Rng::new(i);
        (0..256 << 10).map(|_| rng.below(256) as u8).collect()
    };
    for i in 0..48u64 {
        let key = format!("head{i:02}").into_bytes();
        let (_, mut store) = partitions.lock_key(&key);
        let outcome = store.store(StoreMode::Set, &key, &value(i), 0, 0, 0, NOW);
        assert!(
            matches!(outcome, StoreOutcome::Stored { .. }),
            "head{i:02}: {outcome:?}"
        );
        store.check_invariants();
    }
    for i in 0..48u64 {
        let key = format!("head{i:02}").into_bytes();
        let (_, mut store) = partitions.lock_key(&key);
        match store.lookup(&key, None, NOW, false) {
            Lookup::Small(hit) => assert!(hit.value == value(i)[..], "head{i:02} changed"),
            _ => panic!("head{i:02} is missing"),
        }
    }
    headroom::arena::batch::retire_core_batch(arena.pool());
}

/// The lock counters (STAT `partition_locks`, `_contended`, the sampled hold times) live in
/// per-thread slots, not in the partitions: with more threads than slots, and every thread
/// locking every partition, the totals must still be exact.
#[test]
fn lock_counts_are_exact_across_more_threads_than_counter_slots() {
    const THREADS: u64 = 80; // above the 64 counter slots
    const LOCKS_PER_THREAD: u64 = 640;
    let mut rng = Rng::new(1);
    let arena = Arena::map(
        MemoryPlan::new(&config(&mut rng), &topology()),
        &UnlockedMapper,
        1,
    )
    .expect("map");
    let partitions = Arc::new(Partitions::new(
        &arena,
        KeyHasher::with_seed(3),
        4,
        store_config,
    ));
    let (before, _, holds_before) = partitions.lock_stats();
    let threads: Vec<_> = (0..THREADS)
        .map(|_| {
            let partitions = Arc::clone(&partitions);
            std::thread::spawn(move || {
                for n in 0..LOCKS_PER_THREAD {
                    drop(partitions.lock(n as usize % partitions.len()));
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    let (after, contended, holds_after) = partitions.lock_stats();
    assert_eq!(after - before, THREADS * LOCKS_PER_THREAD);
    assert!(contended <= after);
    // Each new thread times its 64th, 128th, ... hold.
    let sampled: u64 = holds_after.iter().sum::<u64>() - holds_before.iter().sum::<u64>();
    assert_eq!(sampled, THREADS * (LOCKS_PER_THREAD / 64));
}
