//! Arena statistics: per region and per reservation, as the server reports them.

use std::fmt::Write as _;

use crate::topology::NodeId;
use crate::units::ByteSize;

use super::plan::{Locality, ReservationKind};

/// One core's figures for one region.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ShardRegionStats {
    pub blocks_fixed: u64,
    pub blocks_small: u64,
    pub blocks_idle: u64,
    pub fixed_heads_live: u64,
    pub small_objects_live: u64,
    pub small_live_bytes: u64,
    pub small_dead_bytes: u64,
}

impl ShardRegionStats {
    fn add(&mut self, other: &ShardRegionStats) {
        self.blocks_fixed += other.blocks_fixed;
        self.blocks_small += other.blocks_small;
        self.blocks_idle += other.blocks_idle;
        self.fixed_heads_live += other.fixed_heads_live;
        self.small_objects_live += other.small_objects_live;
        self.small_live_bytes += other.small_live_bytes;
        self.small_dead_bytes += other.small_dead_bytes;
    }
}

/// One core's figures.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ShardArenaStats {
    /// Indexed by region.
    pub per_region: Vec<ShardRegionStats>,
    pub compactions: u64,
    pub compaction_blocks: u64,
    pub compaction_objects_moved: u64,
    pub compaction_bytes_moved: u64,
    pub compaction_bytes_reclaimed: u64,
    pub fixed_alloc_failures: u64,
    pub small_alloc_failures: u64,
    pub evictions_requested: u64,
    /// Victims evicted to pay a full partition's eviction debt, store by store.
    pub paced_evictions: u64,
    pub batch_refills: u64,
    pub batch_returns: u64,
    pub heads_pinned: u64,
    pub promotion_passes: u64,
    pub promotion_exchanges: u64,
    pub promotion_bytes_moved: u64,
    pub promotion_skipped_pinned: u64,
    pub head_bytes_read_local: u64,
    pub head_bytes_read_foreign: u64,
}

/// One region, across all cores.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegionStats {
    pub index: usize,
    pub reservation: ReservationKind,
    pub rank: usize,
    pub node: Option<NodeId>,
    pub locality: Locality,
    /// `hugetlb`, `fallback` or `unlocked`.
    pub backing: &'static str,
    pub backing_detail: String,
    pub bytes: u64,
    pub blocks_total: u64,
    /// Free in the global pool.
    pub blocks_free: u64,
    /// Held by some core: in use by a class, or idle in its batch.
    pub blocks_used: u64,
    pub usage: ShardRegionStats,
}

/// One reservation, across its regions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReservationStats {
    pub kind: ReservationKind,
    pub bytes: u64,
    pub blocks_total: u64,
    pub blocks_free: u64,
    pub blocks_used: u64,
    pub small_dead_bytes: u64,
}

/// The whole arena.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArenaStats {
    pub regions: Vec<RegionStats>,
    pub reservations: Vec<ReservationStats>,
    /// Sum over cores of their counters (`per_region` left empty).
    pub totals: ShardArenaStats,
}

impl ArenaStats {
    /// Adds every core's counters into `totals` and each region's usage.
    pub(super) fn absorb(&mut self, shards: &[ShardArenaStats]) {
        for shard in shards {
            for (region, usage) in self.regions.iter_mut().zip(&shard.per_region) {
                region.usage.add(usage);
            }
            let t = &mut self.totals;
            t.compactions += shard.compactions;
            t.compaction_blocks += shard.compaction_blocks;
            t.compaction_objects_moved += shard.compaction_objects_moved;
            t.compaction_bytes_moved += shard.compaction_bytes_moved;
            t.compaction_bytes_reclaimed += shard.compaction_bytes_reclaimed;
            t.fixed_alloc_failures += shard.fixed_alloc_failures;
            t.small_alloc_failures += shard.small_alloc_failures;
            t.evictions_requested += shard.evictions_requested;
            t.paced_evictions += shard.paced_evictions;
            t.batch_refills += shard.batch_refills;
            t.batch_returns += shard.batch_returns;
            t.heads_pinned += shard.heads_pinned;
            t.promotion_passes += shard.promotion_passes;
            t.promotion_exchanges += shard.promotion_exchanges;
            t.promotion_bytes_moved += shard.promotion_bytes_moved;
            t.promotion_skipped_pinned += shard.promotion_skipped_pinned;
            t.head_bytes_read_local += shard.head_bytes_read_local;
            t.head_bytes_read_foreign += shard.head_bytes_read_foreign;
        }
        for reservation in &mut self.reservations {
            reservation.small_dead_bytes = self
                .regions
                .iter()
                .filter(|r| r.reservation == reservation.kind)
                .map(|r| r.usage.small_dead_bytes)
                .sum();
        }
    }

    /// `name value` pairs, the shape of a memcached STAT group.
    pub fn pairs(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for r in &self.reservations {
            let p = format!("reservation_{}", r.kind);
            out.push((format!("{p}_bytes"), r.bytes.to_string()));
            out.push((format!("{p}_blocks_total"), r.blocks_total.to_string()));
            out.push((format!("{p}_blocks_free"), r.blocks_free.to_string()));
            out.push((format!("{p}_blocks_used"), r.blocks_used.to_string()));
            out.push((format!("{p}_dead_bytes"), r.small_dead_bytes.to_string()));
        }
        for r in &self.regions {
            let p = format!("region_{}", r.index);
            let node = r.node.map_or("any".to_string(), |n| n.to_string());
            out.push((format!("{p}_reservation"), r.reservation.to_string()));
            out.push((format!("{p}_order"), r.rank.to_string()));
            out.push((format!("{p}_node"), node));
            out.push((format!("{p}_locality"), r.locality.to_string()));
            out.push((format!("{p}_backing"), r.backing.to_string()));
            out.push((format!("{p}_bytes"), r.bytes.to_string()));
            out.push((format!("{p}_blocks_total"), r.blocks_total.to_string()));
            out.push((format!("{p}_blocks_free"), r.blocks_free.to_string()));
            out.push((format!("{p}_blocks_used"), r.blocks_used.to_string()));
            out.push((
                format!("{p}_blocks_fixed"),
                r.usage.blocks_fixed.to_string(),
            ));
            out.push((
                format!("{p}_blocks_small"),
                r.usage.blocks_small.to_string(),
            ));
            out.push((format!("{p}_blocks_idle"), r.usage.blocks_idle.to_string()));
            out.push((
                format!("{p}_fixed_heads"),
                r.usage.fixed_heads_live.to_string(),
            ));
            out.push((
                format!("{p}_small_objects"),
                r.usage.small_objects_live.to_string(),
            ));
            out.push((
                format!("{p}_small_live_bytes"),
                r.usage.small_live_bytes.to_string(),
            ));
            out.push((
                format!("{p}_dead_bytes"),
                r.usage.small_dead_bytes.to_string(),
            ));
        }
        let t = &self.totals;
        for (name, value) in [
            ("compactions", t.compactions),
            ("compaction_blocks", t.compaction_blocks),
            ("compaction_objects_moved", t.compaction_objects_moved),
            ("compaction_bytes_moved", t.compaction_bytes_moved),
            ("compaction_bytes_reclaimed", t.compaction_bytes_reclaimed),
            ("fixed_alloc_failures", t.fixed_alloc_failures),
            ("small_alloc_failures", t.small_alloc_failures),
            ("evictions_requested", t.evictions_requested),
            ("paced_evictions", t.paced_evictions),
            ("batch_refills", t.batch_refills),
            ("batch_returns", t.batch_returns),
            ("heads_pinned", t.heads_pinned),
            ("promotion_passes", t.promotion_passes),
            ("promotion_exchanges", t.promotion_exchanges),
            ("promotion_bytes_moved", t.promotion_bytes_moved),
            ("promotion_skipped_pinned", t.promotion_skipped_pinned),
            ("head_bytes_read_local", t.head_bytes_read_local),
            ("head_bytes_read_foreign", t.head_bytes_read_foreign),
        ] {
            out.push((name.to_string(), value.to_string()));
        }
        out
    }

    /// A table for logs and the bench.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{:<7} {:<8} {:>5} {:>4} {:<8} {:<9} {:>10} {:>7} {:>6} {:>6} {:>6} {:>6} {:>10}",
            "region",
            "reserve",
            "order",
            "node",
            "locality",
            "backing",
            "bytes",
            "blocks",
            "free",
            "fixed",
            "small",
            "idle",
            "dead"
        );
        for r in &self.regions {
            let _ = writeln!(
                out,
                "{:<7} {:<8} {:>5} {:>4} {:<8} {:<9} {:>10} {:>7} {:>6} {:>6} {:>6} {:>6} {:>10}",
                r.index,
                r.reservation.name(),
                r.rank,
                r.node.map_or("any".to_string(), |n| n.to_string()),
                r.locality.to_string(),
                r.backing,
                ByteSize(r.bytes).to_string(),
                r.blocks_total,
                r.blocks_free,
                r.usage.blocks_fixed,
                r.usage.blocks_small,
                r.usage.blocks_idle,
                r.usage.small_dead_bytes,
            );
        }
        out
    }
}
