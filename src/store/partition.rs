//! The key space in partitions: many more than cores, each a store (index, records, expiry
//! hand, eviction state) behind a short lock. Any executor runs any key's request on the spot,
//! holding the key's partition: no request ever travels to another core.
//!
//! The lock is taken only in synchronous code and never held across an await; a holder runs one
//! store operation (a lookup and a copy, or an admission with at most one block compacted and a
//! bounded eviction walk) and lets go. `docs/server.md` names the bound and the measured hold
//! times; every 64th hold is timed into a log2 histogram, and every acquisition that found the
//! lock taken is counted.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use super::{IndexLayout, KeyHasher, Store, StoreConfig, PARTITIONS_MAX};
use crate::arena::{Arena, MemoryPlan};

/// Partitions per serving core by default, when the arena has blocks enough for them.
pub const PARTITIONS_PER_CORE: usize = 16;
/// Blocks of each reservation a partition stores in that it should be able to hold by default.
/// A partition keeps at least one partly used block per class it stores in, so with few
/// blocks each, those partly used blocks are a large share of memory: at 4 blocks a partition
/// (32 partitions in 256 MiB), a store filled with 32 B values until it evicted held 2.82M
/// items; at 8 (16 partitions) 3.24M, as many as with 8 partitions (`scripts/bench-items`).
const BLOCKS_PER_PARTITION_MIN: u64 = 8;
/// One hold in this many is timed.
const HOLD_SAMPLE_EVERY: u32 = 64;
/// Buckets of the hold-time histogram: bucket `i` counts holds of [2^i, 2^(i+1)) ns.
pub const HOLD_BUCKETS: usize = 40;

/// How many partitions a server with `cores` serving cores gets by default when the scarcest
/// reservation its partitions store in has `blocks` blocks (see [`default_count_for`], which
/// finds that reservation in a plan): `PARTITIONS_PER_CORE` per core, fewer when memory is too
/// small for each to hold a few blocks, at least one.
pub fn default_count(cores: usize, blocks: u64) -> usize {
    let by_memory = (blocks / BLOCKS_PER_PARTITION_MIN).max(1) as usize;
    (cores * PARTITIONS_PER_CORE)
        .min(by_memory)
        .clamp(1, PARTITIONS_MAX)
}

/// The default partition count over `plan`: [`default_count`] of the scarcest reservation a
/// partition stores in. A block in use belongs to one partition, and every item has a record
/// in the small-object class, so in split mode (`--small-memory`) the small reservation bounds
/// the count as much as the fixed-head one does.
pub fn default_count_for(cores: usize, plan: &MemoryPlan) -> usize {
    default_count(cores, scarcest_blocks(plan))
}

/// The most partitions `plan` can hold: each must be able to take a block of every
/// reservation it stores in, so no more than the scarcest of them has blocks. A partition
/// beyond that could never hold a block of it and would refuse every store (in split mode,
/// every item's record is a small object: with one `--small-memory` block, a second partition
/// answers "out of memory" to every SET while the first holds that block).
pub fn max_count(plan: &MemoryPlan) -> usize {
    usize::try_from(scarcest_blocks(plan))
        .unwrap_or(usize::MAX)
        .clamp(1, PARTITIONS_MAX)
}

/// Blocks of the smallest reservation partitions allocate from: fixed heads' and small
/// objects' (one reservation in shared mode, two in split mode; streaming pools are per shard).
fn scarcest_blocks(plan: &MemoryPlan) -> u64 {
    let blocks = |kind| {
        plan.reservation_regions(kind)
            .map(|region| u64::from(region.blocks))
            .sum::<u64>()
    };
    blocks(plan.config.head_reservation()).min(blocks(plan.config.small_reservation()))
}

/// Threads whose lock counters have lines of their own; more threads share slots (still
/// counted exactly: the counters are atomic).
const COUNTER_SLOTS: usize = 64;

/// One partition: its store and the hint a prefetch reads.
#[repr(align(128))] // one cache line pair each: two cores locking neighbours do not share one
pub struct Partition {
    store: Mutex<Store>,
    /// The store's [`IndexLayout`] as its last holder saw it (0, 0 before the first insert):
    /// a hint read without the lock, so each half may be stale or from different layouts.
    index_ctrl_addr: AtomicUsize,
    index_bucket_mask: AtomicUsize,
}

impl Partition {
    /// Asks the CPU to start loading the index lines a lookup of `hash` reads first. Reads
    /// nothing itself: a prefetch of a stale or torn address is only a wasted hint.
    fn prefetch_index(&self, hash: u64) {
        let ctrl_addr = self.index_ctrl_addr.load(Ordering::Relaxed);
        if ctrl_addr == 0 {
            return;
        }
        let layout = IndexLayout {
            ctrl_addr,
            bucket_mask: self.index_bucket_mask.load(Ordering::Relaxed),
        };
        for addr in layout.probe_addrs(hash) {
            crate::sys::prefetch_line(addr);
        }
    }
}

/// What the partition locks one thread took saw. Kept per thread, not per partition: a
/// counter in the partition is one more line that moves between the cores locking it. With
/// two cores sharing the partitions that was about 11 of the 45 ns sharing added to a
/// pipelined GET (`cargo bench --bench cores`).
#[repr(align(128))]
struct LockCounters {
    acquisitions: AtomicU64,
    /// Acquisitions that found the lock held by another thread.
    contended: AtomicU64,
    /// Sampled hold times, log2 nanosecond buckets.
    hold_ns: [AtomicU64; HOLD_BUCKETS],
}

impl LockCounters {
    fn new() -> LockCounters {
        LockCounters {
            acquisitions: AtomicU64::new(0),
            contended: AtomicU64::new(0),
            hold_ns: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

/// Every partition, and the hash that picks one for a key.
pub struct Partitions {
    parts: Box<[Partition]>,
    hasher: KeyHasher,
    /// Lock counters by thread slot ([`COUNTER_SLOT`]).
    counters: Box<[LockCounters]>,
}

/// A held partition: its store, for as long as this lives.
pub struct Held<'a> {
    store: MutexGuard<'a, Store>,
    part: &'a Partition,
    counters: &'a LockCounters,
    /// When the hold began, for a sampled hold.
    since: Option<Instant>,
}

impl std::ops::Deref for Held<'_> {
    type Target = Store;
    fn deref(&self) -> &Store {
        &self.store
    }
}

impl std::ops::DerefMut for Held<'_> {
    fn deref_mut(&mut self) -> &mut Store {
        &mut self.store
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        HOLDING.with(|h| h.set(false));
        if let Some(layout) = self.store.take_moved_index_layout() {
            self.part
                .index_ctrl_addr
                .store(layout.ctrl_addr, Ordering::Relaxed);
            self.part
                .index_bucket_mask
                .store(layout.bucket_mask, Ordering::Relaxed);
        }
        // Only ever written here, under the lock, so a holder reads a settled pair.
        debug_assert!(
            self.store.index_layout().is_none_or(|layout| {
                layout.ctrl_addr == self.part.index_ctrl_addr.load(Ordering::Relaxed)
                    && layout.bucket_mask == self.part.index_bucket_mask.load(Ordering::Relaxed)
            }),
            "a partition's published index layout is stale"
        );
        if let Some(since) = self.since.take() {
            let ns = since.elapsed().as_nanos().max(1) as u64;
            let bucket = (63 - ns.leading_zeros() as usize).min(HOLD_BUCKETS - 1);
            self.counters.hold_ns[bucket].fetch_add(1, Ordering::Relaxed);
        }
    }
}

thread_local! {
    static HOLDS: Cell<u32> = const { Cell::new(0) };
    /// Whether this thread holds a partition now: a thread never holds two (no lock order to
    /// get wrong, no self-deadlock), which debug builds assert.
    static HOLDING: Cell<bool> = const { Cell::new(false) };
    /// This thread's slot of [`Partitions::counters`].
    static COUNTER_SLOT: usize = NEXT_COUNTER_SLOT.fetch_add(1, Ordering::Relaxed) % COUNTER_SLOTS;
}

static NEXT_COUNTER_SLOT: AtomicUsize = AtomicUsize::new(0);

impl Partitions {
    /// `count` empty stores over `arena`, keys spread by `hasher`; at most [`max_count`] of
    /// them (a larger count is lowered, with a warning: the partitions beyond it could never
    /// store anything).
    pub fn new(
        arena: &Arc<Arena>,
        hasher: KeyHasher,
        count: usize,
        config: impl Fn(usize) -> StoreConfig,
    ) -> Partitions {
        assert!((1..=PARTITIONS_MAX).contains(&count), "{count} partitions");
        let most = max_count(arena.plan());
        if count > most {
            tracing::warn!(
                requested = count,
                partitions = most,
                "more partitions than the scarcest reservation they store in has blocks: \
                 the rest could never hold one (a block in use belongs to one partition)"
            );
        }
        let count = count.min(most);
        let parts = (0..count)
            .map(|index| Partition {
                store: Mutex::new(Store::new(
                    arena.shard(index),
                    hasher.clone(),
                    StoreConfig {
                        partitions: count,
                        ..config(index)
                    },
                )),
                index_ctrl_addr: AtomicUsize::new(0),
                index_bucket_mask: AtomicUsize::new(0),
            })
            .collect();
        Partitions {
            parts,
            hasher,
            counters: (0..COUNTER_SLOTS).map(|_| LockCounters::new()).collect(),
        }
    }

    pub fn len(&self) -> usize {
        self.parts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.parts.is_empty()
    }

    pub fn hasher(&self) -> &KeyHasher {
        &self.hasher
    }

    /// The partition holding `key`.
    pub fn of_key(&self, key: &[u8]) -> usize {
        KeyHasher::partition_of(self.hasher.hash(key), self.parts.len())
    }

    /// Takes partition `index`'s lock (counting a wait, timing a sample of holds).
    pub fn lock(&self, index: usize) -> Held<'_> {
        HOLDING.with(|h| {
            debug_assert!(
                !h.get(),
                "a partition lock taken while this thread holds one"
            );
            h.set(true);
        });
        let part = &self.parts[index];
        let counters = &self.counters[COUNTER_SLOT.with(|slot| *slot)];
        counters.acquisitions.fetch_add(1, Ordering::Relaxed);
        let store = match part.store.try_lock() {
            Ok(store) => store,
            Err(std::sync::TryLockError::WouldBlock) => {
                counters.contended.fetch_add(1, Ordering::Relaxed);
                part.store.lock().unwrap_or_else(|e| e.into_inner())
            }
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
        };
        let sampled = HOLDS.with(|n| {
            let next = n.get().wrapping_add(1);
            n.set(next);
            next % HOLD_SAMPLE_EVERY == 0
        });
        Held {
            store,
            part,
            counters,
            since: sampled.then(Instant::now),
        }
    }

    /// Starts loading the index lines a lookup of the key hashed to `hash` will read, without
    /// taking its partition's lock (see [`IndexLayout`]).
    pub fn prefetch_index(&self, hash: u64) {
        self.parts[KeyHasher::partition_of(hash, self.parts.len())].prefetch_index(hash);
    }

    /// Starts loading the records a lookup of `hash` will compare keys with. It reads the
    /// index, so it holds the partition for that probe; best after [`Partitions::prefetch_index`]
    /// has had time to bring the index lines in.
    pub fn prefetch_records(&self, hash: u64) {
        self.lock(KeyHasher::partition_of(hash, self.parts.len()))
            .prefetch_records(hash);
    }

    /// [`Partitions::prefetch_records`] when the partition is free and this thread holds none;
    /// otherwise nothing (a look ahead never waits for a lock). Not counted as an acquisition:
    /// it reads the index and changes nothing.
    pub fn prefetch_records_if_free(&self, hash: u64) {
        if HOLDING.with(|h| h.get()) {
            return;
        }
        let part = &self.parts[KeyHasher::partition_of(hash, self.parts.len())];
        if let Ok(store) = part.store.try_lock() {
            store.prefetch_records(hash);
        }
    }

    /// The partition of `key`, locked.
    pub fn lock_key(&self, key: &[u8]) -> (usize, Held<'_>) {
        let index = self.of_key(key);
        (index, self.lock(index))
    }

    /// The partitions core `core` of `cores` runs background work for (expiry sweeps,
    /// promotion, the warm-restart snapshot): every `cores`-th one.
    pub fn owned_by(&self, core: usize, cores: usize) -> impl Iterator<Item = usize> {
        (core..self.parts.len()).step_by(cores.max(1))
    }

    /// Lock figures over every partition: (acquisitions, contended, hold-time histogram).
    pub fn lock_stats(&self) -> (u64, u64, [u64; HOLD_BUCKETS]) {
        let mut holds = [0u64; HOLD_BUCKETS];
        let (mut acquisitions, mut contended) = (0, 0);
        for counters in self.counters.iter() {
            acquisitions += counters.acquisitions.load(Ordering::Relaxed);
            contended += counters.contended.load(Ordering::Relaxed);
            for (sum, bucket) in holds.iter_mut().zip(&counters.hold_ns) {
                *sum += bucket.load(Ordering::Relaxed);
            }
        }
        (acquisitions, contended, holds)
    }
}

/// The upper bound in nanoseconds of the bucket holding quantile `q` of a log2 histogram.
pub fn quantile_ns(holds: &[u64; HOLD_BUCKETS], q: f64) -> u64 {
    let total: u64 = holds.iter().sum();
    if total == 0 {
        return 0;
    }
    let rank = ((total as f64) * q).ceil() as u64;
    let mut seen = 0;
    for (bucket, &count) in holds.iter().enumerate() {
        seen += count;
        if seen >= rank.max(1) {
            return 1u64 << (bucket + 1);
        }
    }
    1u64 << HOLD_BUCKETS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_counts() {
        assert_eq!(default_count(2, 32), 4, "64 MiB of 2 MiB blocks");
        assert_eq!(default_count(2, 128), 16, "256 MiB: 8 blocks a partition");
        assert_eq!(default_count(2, 2048), 32, "16 per core");
        assert_eq!(default_count(1, 2), 1, "at least one");
        assert_eq!(default_count(64, 1 << 30), 1024);
    }

    /// The plan of `tests/numa_vm.rs`'s promotion test on three nodes: heads 4 MiB on node 0
    /// and 8 MiB on each other node (10 blocks), small objects (split mode) `small_memory`.
    fn vm_plan(small_memory: Option<u64>) -> MemoryPlan {
        use crate::arena::{ArenaConfig, NumaMode};
        const MIB: u64 = 1 << 20;
        let distances = vec![vec![10, 21, 31], vec![21, 10, 21], vec![31, 21, 10]];
        let topology =
            crate::topology::Topology::synthetic(&[1, 1, 1], distances, 2 * MIB).unwrap();
        let config = ArenaConfig {
            numa: NumaMode::Explicit(0),
            memory_bytes: 4 * MIB,
            sub_memory_bytes: 8 * MIB,
            small_memory_bytes: small_memory,
            small_sub_memory_bytes: 0,
            block_bytes: 2 * MIB,
            ram_head_bytes: 256 << 10,
            small_min_alloc_bytes: 16,
            io_chunk_bytes: 64 << 10,
            stream_bytes: 2 * MIB,
            perverse: false,
        };
        MemoryPlan::new(&config, &topology)
    }

    #[test]
    fn the_scarcest_reservation_bounds_the_count() {
        // Split mode: the one small block, not the ten fixed-head blocks, decides.
        let plan = vm_plan(Some(2 << 20));
        assert_eq!(default_count_for(1, &plan), 1);
        assert_eq!(max_count(&plan), 1);
        // Small objects plentiful: the ten fixed-head blocks decide (one partition by default
        // at eight blocks each; at most ten).
        let plan = vm_plan(Some(64 << 20));
        assert_eq!(default_count_for(1, &plan), 1);
        assert_eq!(default_count_for(4, &plan), 1);
        assert_eq!(max_count(&plan), 10);
        // Shared mode: one reservation holds both classes.
        let plan = vm_plan(None);
        assert_eq!(default_count_for(1, &plan), 1);
        assert_eq!(max_count(&plan), 10);
    }

    #[test]
    fn quantiles_of_a_log2_histogram() {
        let mut holds = [0u64; HOLD_BUCKETS];
        holds[9] = 98; // 512..1024 ns
        holds[14] = 2; // 16..32 us
        assert_eq!(quantile_ns(&holds, 0.5), 1024);
        assert_eq!(quantile_ns(&holds, 0.98), 1024);
        assert_eq!(quantile_ns(&holds, 0.99), 32768);
        assert_eq!(quantile_ns(&[0; HOLD_BUCKETS], 0.99), 0);
    }
}
