//! The global block pools: per reservation, one free list per region, searched local-first.
//!
//! Whole-block allocation and free are O(1): each region keeps a stack of its free blocks,
//! and a block returns to its own region's stack, so local blocks are handed out before
//! foreign ones however blocks come back. Reservations never lend to one another.
//! Shards reach the pool only in bulk (see [`super::batch`]).

use super::block::BlockId;
use super::plan::{MemoryPlan, ReservationKind};

#[derive(Debug)]
struct RegionFree {
    region: usize,
    first_block: u32,
    blocks: u32,
    /// Free blocks; popped from the end, seeded so the lowest ids go first.
    free: Vec<BlockId>,
}

#[derive(Debug)]
struct ReservationPool {
    kind: ReservationKind,
    /// In allocation order: rank 0 first.
    regions: Vec<RegionFree>,
}

/// Free blocks of every reservation. One instance per process.
#[derive(Debug)]
pub struct BlockPool {
    reservations: Vec<ReservationPool>,
    /// `(first block, reservation index, rank)` per region, sorted by first block.
    region_starts: Vec<(u32, usize, usize)>,
    /// One bit per block: set while the block sits in this pool (catches double frees).
    in_pool: Vec<u64>,
}

/// Free-block counts of one region, for stats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegionFreeCount {
    pub region: usize,
    pub blocks_total: u32,
    pub blocks_free: u32,
}

impl BlockPool {
    /// A pool holding every block of the plan, all free.
    pub fn new(plan: &MemoryPlan) -> BlockPool {
        let mut reservations: Vec<ReservationPool> = Vec::new();
        let mut region_starts = Vec::new();
        for region in &plan.regions {
            let res_index = match reservations
                .iter()
                .position(|r| r.kind == region.reservation)
            {
                Some(index) => index,
                None => {
                    reservations.push(ReservationPool {
                        kind: region.reservation,
                        regions: Vec::new(),
                    });
                    reservations.len() - 1
                }
            };
            let pool = &mut reservations[res_index];
            assert_eq!(
                pool.regions.len(),
                region.rank,
                "regions arrive in rank order"
            );
            pool.regions.push(RegionFree {
                region: region.index,
                first_block: region.first_block.0,
                blocks: region.blocks,
                free: region.block_ids().rev().collect(),
            });
            region_starts.push((region.first_block.0, res_index, region.rank));
        }
        assert!(region_starts.windows(2).all(|w| w[0].0 < w[1].0));
        let total = plan.total_blocks() as usize;
        let mut in_pool = vec![0u64; total.div_ceil(64)];
        for block in 0..total {
            in_pool[block / 64] |= 1 << (block % 64);
        }
        BlockPool {
            reservations,
            region_starts,
            in_pool,
        }
    }

    fn reservation(&self, kind: ReservationKind) -> &ReservationPool {
        self.reservations
            .iter()
            .find(|r| r.kind == kind)
            .unwrap_or_else(|| panic!("no {kind} reservation in this plan"))
    }

    fn reservation_mut(&mut self, kind: ReservationKind) -> &mut ReservationPool {
        self.reservations
            .iter_mut()
            .find(|r| r.kind == kind)
            .unwrap_or_else(|| panic!("no {kind} reservation in this plan"))
    }

    pub fn has_reservation(&self, kind: ReservationKind) -> bool {
        self.reservations.iter().any(|r| r.kind == kind)
    }

    /// How many regions (ranks) a reservation has.
    pub fn ranks(&self, kind: ReservationKind) -> usize {
        self.reservation(kind).regions.len()
    }

    /// The global region index of a reservation's region at `rank`.
    pub fn region_at(&self, kind: ReservationKind, rank: usize) -> usize {
        self.reservation(kind).regions[rank].region
    }

    /// The reservation and rank a block belongs to.
    pub fn home_of(&self, block: BlockId) -> (ReservationKind, usize) {
        let at = self
            .region_starts
            .partition_point(|&(first, _, _)| first <= block.0)
            - 1;
        let (first, res_index, rank) = self.region_starts[at];
        let reservation = &self.reservations[res_index];
        assert!(
            block.0 - first < reservation.regions[rank].blocks,
            "{block} is not a block of this arena"
        );
        (reservation.kind, rank)
    }

    fn mark(&mut self, block: BlockId, in_pool: bool) {
        let (word, bit) = (block.0 as usize / 64, block.0 % 64);
        let was = self.in_pool[word] & (1 << bit) != 0;
        assert_ne!(
            was,
            in_pool,
            "{block} {} twice",
            if in_pool { "freed" } else { "taken" }
        );
        self.in_pool[word] ^= 1 << bit;
    }

    pub fn is_free(&self, block: BlockId) -> bool {
        self.in_pool[block.0 as usize / 64] & (1 << (block.0 % 64)) != 0
    }

    /// Takes up to `max` blocks of one reservation, local-first: rank 0 until it is empty, then
    /// rank 1, and so on. Returns how many were appended to `out`.
    pub fn take(&mut self, kind: ReservationKind, max: usize, out: &mut Vec<BlockId>) -> usize {
        let ranks = self.ranks(kind);
        let mut taken = 0;
        for rank in 0..ranks {
            taken += self.take_from(kind, rank, max - taken, out);
            if taken == max {
                break;
            }
        }
        taken
    }

    /// Takes up to `max` blocks from one region of a reservation.
    pub fn take_from(
        &mut self,
        kind: ReservationKind,
        rank: usize,
        max: usize,
        out: &mut Vec<BlockId>,
    ) -> usize {
        let region = &mut self.reservation_mut(kind).regions[rank];
        let count = max.min(region.free.len());
        let start = region.free.len() - count;
        let taken: Vec<BlockId> = region.free.drain(start..).rev().collect();
        for &block in &taken {
            self.mark(block, false);
        }
        out.extend_from_slice(&taken);
        count
    }

    /// Returns a block to its own region's free list.
    pub fn give(&mut self, block: BlockId) {
        let (kind, rank) = self.home_of(block);
        self.mark(block, true);
        self.reservation_mut(kind).regions[rank].free.push(block);
    }

    /// Free blocks in one region of a reservation.
    pub fn free_in(&self, kind: ReservationKind, rank: usize) -> usize {
        self.reservation(kind).regions[rank].free.len()
    }

    /// Free and total blocks of every region.
    pub fn region_counts(&self) -> Vec<RegionFreeCount> {
        let mut counts: Vec<RegionFreeCount> = self
            .reservations
            .iter()
            .flat_map(|r| r.regions.iter())
            .map(|region| RegionFreeCount {
                region: region.region,
                blocks_total: region.blocks,
                blocks_free: region.free.len() as u32,
            })
            .collect();
        counts.sort_by_key(|c| c.region);
        counts
    }

    /// Checks every invariant; used by tests after each step and by debug builds.
    pub fn check_invariants(&self) {
        let mut seen = vec![false; self.in_pool.len() * 64];
        for reservation in &self.reservations {
            for region in &reservation.regions {
                assert!(region.free.len() <= region.blocks as usize);
                for block in &region.free {
                    let index = block.0 as usize;
                    assert!(
                        block.0 >= region.first_block
                            && block.0 < region.first_block + region.blocks,
                        "{block} sits in a foreign region's free list"
                    );
                    assert!(!seen[index], "{block} is free twice");
                    seen[index] = true;
                    assert!(self.is_free(*block));
                }
            }
        }
        let marked: u32 = self.in_pool.iter().map(|w| w.count_ones()).sum();
        assert_eq!(marked as usize, seen.iter().filter(|s| **s).count());
    }
}
