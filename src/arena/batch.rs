//! Per-core block batches: each serving core keeps a few free blocks per region and refills or
//! returns them in bulk, so no per-allocation operation takes a cross-core lock.
//!
//! A serving executor installs its batch in a thread-local ([`install_core_batch`]); a
//! partition's allocator, run by whichever core holds the partition's lock, takes blocks from
//! and gives emptied blocks back to that core's batch. Blocks in use belong to one partition;
//! idle blocks to one core's batch (or, on a thread with no batch installed, such as a test or
//! the placement master, to the partition's own fallback batch).
//!
//! The global pool sits behind [`BlockSource`]: [`SharedPool`], a mutex taken once per bulk
//! exchange. It stays out of the placement master on purpose: a refill happens inside admission
//! and must answer synchronously (`docs/placement.md`). A refill asks for a fair share of what the region has left (never more than
//! [`BATCH_REFILL_MAX_BLOCKS`]) so one core cannot hoard a nearly empty region, and a batch
//! holding more than [`BATCH_HIGH_WATER_BLOCKS`] idle blocks of a region gives the excess back.

use std::cell::RefCell;
use std::sync::Mutex;

use super::block::BlockId;
use super::plan::ReservationKind;
use super::pool::BlockPool;

/// Most blocks one refill brings to a core.
pub const BATCH_REFILL_MAX_BLOCKS: usize = 4;
/// Most idle blocks of one region a core keeps before returning the excess.
pub const BATCH_HIGH_WATER_BLOCKS: usize = 4;

/// Where batches get blocks from and give them back to, in bulk.
pub trait BlockSource {
    /// Appends up to a fair share (at most `max`) of region `rank`'s free blocks to `out`.
    fn refill(&self, kind: ReservationKind, rank: usize, max: usize, out: &mut Vec<BlockId>);
    /// Returns blocks to their regions.
    fn give_back(&self, blocks: &[BlockId]);
    /// Free blocks left in region `rank` of a reservation.
    fn free_in(&self, kind: ReservationKind, rank: usize) -> usize;
}

/// The global pool behind one mutex, shared by `shards` cores.
#[derive(Debug)]
pub struct SharedPool {
    pool: Mutex<BlockPool>,
    shards: usize,
}

impl SharedPool {
    pub fn new(pool: BlockPool, shards: usize) -> SharedPool {
        SharedPool {
            pool: Mutex::new(pool),
            shards: shards.max(1),
        }
    }

    /// Runs `f` with the pool locked (stats, checks, tests).
    pub fn with<R>(&self, f: impl FnOnce(&mut BlockPool) -> R) -> R {
        let mut pool = self
            .pool
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        f(&mut pool)
    }
}

impl BlockSource for SharedPool {
    fn refill(&self, kind: ReservationKind, rank: usize, max: usize, out: &mut Vec<BlockId>) {
        self.with(|pool| {
            let share = (pool.free_in(kind, rank) / (2 * self.shards)).max(1);
            pool.take_from(kind, rank, max.min(share), out);
        });
    }

    fn give_back(&self, blocks: &[BlockId]) {
        self.with(|pool| blocks.iter().for_each(|&block| pool.give(block)));
    }

    fn free_in(&self, kind: ReservationKind, rank: usize) -> usize {
        self.with(|pool| pool.free_in(kind, rank))
    }
}

/// One core's idle blocks, per (reservation, rank).
#[derive(Debug, Default)]
pub struct BlockBatch {
    held: Vec<(ReservationKind, Vec<Vec<BlockId>>)>,
    pub refills: u64,
    pub returns: u64,
}

impl BlockBatch {
    pub fn new() -> BlockBatch {
        BlockBatch::default()
    }

    fn slot(&mut self, kind: ReservationKind, rank: usize) -> &mut Vec<BlockId> {
        let at = match self.held.iter().position(|(k, _)| *k == kind) {
            Some(at) => at,
            None => {
                self.held.push((kind, Vec::new()));
                self.held.len() - 1
            }
        };
        let ranks = &mut self.held[at].1;
        if ranks.len() <= rank {
            ranks.resize_with(rank + 1, Vec::new);
        }
        &mut ranks[rank]
    }

    /// A free block of region `rank`, from the batch or, when it is empty, from a bulk refill.
    pub fn acquire(
        &mut self,
        source: &dyn BlockSource,
        kind: ReservationKind,
        rank: usize,
    ) -> Option<BlockId> {
        if self.slot(kind, rank).is_empty() {
            let mut fresh = Vec::with_capacity(BATCH_REFILL_MAX_BLOCKS);
            source.refill(kind, rank, BATCH_REFILL_MAX_BLOCKS, &mut fresh);
            if fresh.is_empty() {
                return None;
            }
            self.refills += 1;
            // Keep the lowest id on top so blocks are used in address order.
            fresh.reverse();
            self.slot(kind, rank).extend(fresh);
        }
        self.slot(kind, rank).pop()
    }

    /// Takes back a now-empty block; returns the excess to the pool in one call.
    pub fn release(
        &mut self,
        source: &dyn BlockSource,
        kind: ReservationKind,
        rank: usize,
        block: BlockId,
    ) {
        // When the region has nothing left in the pool, another core may be starving for
        // exactly this block: give every idle block of the region back at once.
        let scarce = source.free_in(kind, rank) == 0;
        let slot = self.slot(kind, rank);
        slot.push(block);
        if scarce || slot.len() > BATCH_HIGH_WATER_BLOCKS {
            let keep = if scarce {
                0
            } else {
                BATCH_REFILL_MAX_BLOCKS / 2
            };
            let excess: Vec<BlockId> = slot.drain(..slot.len() - keep).collect();
            source.give_back(&excess);
            self.returns += 1;
        }
    }

    /// Idle blocks held for one region.
    pub fn held(&self, kind: ReservationKind, rank: usize) -> usize {
        self.held
            .iter()
            .find(|(k, _)| *k == kind)
            .and_then(|(_, ranks)| ranks.get(rank))
            .map_or(0, Vec::len)
    }

    /// Every held block, for invariant checks.
    pub fn all_held(&self) -> impl Iterator<Item = BlockId> + '_ {
        self.held
            .iter()
            .flat_map(|(_, ranks)| ranks.iter().flatten().copied())
    }

    /// Gives every idle block back (shutdown, or when another core starves).
    pub fn return_all(&mut self, source: &dyn BlockSource) {
        let all: Vec<BlockId> = self.all_held().collect();
        if !all.is_empty() {
            source.give_back(&all);
            self.returns += 1;
        }
        self.held.clear();
    }
}

thread_local! {
    /// The batch of the serving core this thread is (none on other threads).
    static CORE_BATCH: RefCell<Option<BlockBatch>> = const { RefCell::new(None) };
}

/// Installs an empty batch for the serving core running on this thread.
pub fn install_core_batch() {
    CORE_BATCH.with(|batch| *batch.borrow_mut() = Some(BlockBatch::new()));
}

/// Runs `f` on this core's batch; `None` when the thread has none.
pub fn with_core_batch<R>(f: impl FnOnce(&mut BlockBatch) -> R) -> Option<R> {
    CORE_BATCH.with(|batch| batch.try_borrow_mut().ok()?.as_mut().map(f))
}

/// Gives this core's idle blocks back to `source` and removes its batch (shutdown).
pub fn retire_core_batch(source: &dyn BlockSource) {
    CORE_BATCH.with(|batch| {
        if let Some(mut batch) = batch.borrow_mut().take() {
            batch.return_all(source);
        }
    });
}
