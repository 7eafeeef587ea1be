//! The RAM arena (ADR-0008): bounded, preallocated, NUMA-regioned block pools; fixed-head
//! buddy slots; a byte-granular bump arena for small objects with sliding compaction.
//!
//! Layers, bottom up: [`plan`] (what to map, pure), [`region`] and `sys` (mapping it),
//! [`block`] (ids, locators, the table), [`pool`] (global free lists, local-first),
//! [`batch`] (per-core bulk exchange), [`buddy`] and [`bump`] (the two allocators inside
//! blocks), [`slot_layout`] (how bytes lie in a fixed slot), [`shard`] (one core's allocator
//! and admission). `docs/arena.md` tells the story.

pub mod batch;
pub mod block;
pub mod buddy;
pub mod bump;
pub mod plan;
pub mod pool;
pub mod promote;
pub mod region;
pub mod shard;
pub mod slot_layout;
pub mod stats;

use std::sync::Arc;

pub use block::{BlockId, BlockTable, HeadLoc};
pub use bump::{CompactionReport, Relocation, SMALL_HEADER_BYTES};
pub use plan::{ArenaConfig, Locality, MemoryPlan, NumaMode, RegionPlan, ReservationKind};
pub use promote::{FixedMove, Heat, PromotionReport};
pub use region::{
    check_memlock, Backing, MapError, NumaMapper, Region, RegionMapper, UnlockedMapper,
};
pub use shard::{AdmissionHost, AllocError, HeadClass, Reserved, SendPin, ShardArena};
pub use slot_layout::{SlotBytes, SlotWriter};
pub use stats::{ArenaStats, RegionStats, ReservationStats, ShardArenaStats, ShardRegionStats};

use batch::SharedPool;
use pool::BlockPool;

/// The process-wide arena: the mapped regions behind the block table, and the global pool.
/// Shared read-only between cores (`Arc`); the pool is reached only in bulk.
#[derive(Debug)]
pub struct Arena {
    plan: MemoryPlan,
    table: Arc<BlockTable>,
    pool: SharedPool,
    /// (reservation, rank) of every region, by region index.
    homes: Vec<(ReservationKind, usize)>,
}

impl Arena {
    /// Maps every region of the plan with `mapper` and builds the pools for `shards` cores.
    pub fn map(
        plan: MemoryPlan,
        mapper: &dyn RegionMapper,
        shards: usize,
    ) -> Result<Arc<Arena>, MapError> {
        let mut regions = Vec::with_capacity(plan.regions.len());
        for region_plan in &plan.regions {
            let region = mapper.map(region_plan, plan.huge_page_bytes)?;
            tracing::info!(
                region = region_plan.index,
                reservation = %region_plan.reservation,
                order = region_plan.rank,
                node = %region_plan.node.map_or("any".to_string(), |n| n.to_string()),
                locality = %region_plan.locality,
                bytes = region_plan.bytes,
                blocks = region_plan.blocks,
                backing = %region.backing,
                map_ms = region.map_duration.as_millis() as u64,
                "region mapped"
            );
            regions.push(region);
        }
        let table = Arc::new(BlockTable::new(plan.config.block_bytes, regions));
        let pool = SharedPool::new(BlockPool::new(&plan), shards);
        let homes = plan
            .regions
            .iter()
            .map(|r| (r.reservation, r.rank))
            .collect();
        Ok(Arc::new(Arena {
            plan,
            table,
            pool,
            homes,
        }))
    }

    /// Maps a plan for serving: checks the memlock budget first, then maps with
    /// [`NumaMapper`] (hugetlb from each node's pool, else bound and locked ordinary pages).
    pub fn map_for_serving(
        plan: MemoryPlan,
        topology: &crate::topology::Topology,
        shards: usize,
    ) -> Result<Arc<Arena>, MapError> {
        check_memlock(plan.total_bytes())?;
        Arena::map(plan, &NumaMapper::new(topology), shards)
    }

    pub fn plan(&self) -> &MemoryPlan {
        &self.plan
    }

    pub fn table(&self) -> &BlockTable {
        &self.table
    }

    pub(crate) fn table_arc(&self) -> Arc<BlockTable> {
        Arc::clone(&self.table)
    }

    pub fn pool(&self) -> &SharedPool {
        &self.pool
    }

    pub fn regions(&self) -> &[Region] {
        self.table.regions()
    }

    /// The reservation and allocation rank a block belongs to.
    pub fn home_of(&self, block: BlockId) -> (ReservationKind, usize) {
        self.homes[self.table.region_of(block)]
    }

    /// How many regions a reservation spans.
    pub fn ranks(&self, kind: ReservationKind) -> usize {
        self.homes.iter().filter(|(k, _)| *k == kind).count()
    }

    /// Takes `bytes` of the streaming reservation for one shard's pool, in whole blocks;
    /// fewer when the reservation runs short.
    pub fn take_stream_blocks(&self, bytes: u64) -> Vec<BlockId> {
        if !self.plan.reservations().contains(&ReservationKind::Stream) {
            return Vec::new();
        }
        let wanted = (bytes / self.plan.config.block_bytes) as usize;
        let mut blocks = Vec::with_capacity(wanted);
        self.pool
            .with(|pool| pool.take(ReservationKind::Stream, wanted, &mut blocks));
        blocks
    }

    /// Gives a shard's streaming blocks back (its pool is gone).
    pub fn give_stream_blocks(&self, blocks: &[BlockId]) {
        self.pool
            .with(|pool| blocks.iter().for_each(|&block| pool.give(block)));
    }

    /// The address range of a block.
    pub fn block_range(&self, block: BlockId) -> (usize, usize) {
        (
            self.table.addr_of(block),
            self.plan.config.block_bytes as usize,
        )
    }

    /// Every region's (address, length): what a ring registers.
    pub fn region_ranges(&self) -> Vec<(usize, usize)> {
        self.regions()
            .iter()
            .map(|r| (r.base_addr(), r.plan.bytes as usize))
            .collect()
    }

    /// The (address, length) of every region on hugetlb pages: what a ring never sends
    /// zero-copy from (docs/io.md).
    pub fn huge_page_ranges(&self) -> Vec<(usize, usize)> {
        self.regions()
            .iter()
            .filter(|r| matches!(r.backing, Backing::HugeTlb { .. }))
            .map(|r| (r.base_addr(), r.plan.bytes as usize))
            .collect()
    }

    /// One core's allocator.
    pub fn shard(self: &Arc<Arena>, index: usize) -> ShardArena {
        ShardArena::new(Arc::clone(self), index)
    }

    /// Stats over the whole arena, given every core's own figures.
    pub fn stats(&self, shards: &[ShardArenaStats]) -> ArenaStats {
        let counts = self.pool.with(|pool| pool.region_counts());
        let regions: Vec<RegionStats> = self
            .regions()
            .iter()
            .zip(counts)
            .map(|(region, count)| {
                let plan = &region.plan;
                RegionStats {
                    index: plan.index,
                    reservation: plan.reservation,
                    rank: plan.rank,
                    node: plan.node,
                    locality: plan.locality,
                    backing: region.backing.name(),
                    backing_detail: region.backing.to_string(),
                    bytes: plan.bytes,
                    blocks_total: count.blocks_total.into(),
                    blocks_free: count.blocks_free.into(),
                    blocks_used: u64::from(count.blocks_total - count.blocks_free),
                    usage: ShardRegionStats::default(),
                }
            })
            .collect();
        let reservations = self
            .plan
            .reservations()
            .into_iter()
            .map(|kind| {
                let of_kind = || regions.iter().filter(move |r| r.reservation == kind);
                ReservationStats {
                    kind,
                    bytes: of_kind().map(|r| r.bytes).sum(),
                    blocks_total: of_kind().map(|r| r.blocks_total).sum(),
                    blocks_free: of_kind().map(|r| r.blocks_free).sum(),
                    blocks_used: of_kind().map(|r| r.blocks_used).sum(),
                    small_dead_bytes: 0,
                }
            })
            .collect();
        let mut stats = ArenaStats {
            regions,
            reservations,
            totals: ShardArenaStats::default(),
        };
        stats.absorb(shards);
        stats
    }
}
