//! The memory plan: which regions to map, on which node, of how many blocks, in which order.
//!
//! A pure function of the validated settings and the topology, so `--dry-run` prints exactly
//! what a real start maps, and both are tested on a one-node machine with synthetic topologies.

use std::fmt::{self, Write as _};

use crate::topology::{NodeId, Topology};
use crate::units::ByteSize;

use super::block::BlockId;

/// A reservation: a fixed budget of blocks that never lends to another (ADR-0008).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ReservationKind {
    /// Default mode: fixed heads and packed small objects share `--memory`/`--sub-memory`.
    Shared,
    /// Split mode (`--small-memory` given): fixed heads only.
    Heads,
    /// Split mode: packed small objects only (`--small-memory`/`--small-sub-memory`).
    Small,
    /// The shards' streaming pools (`--io-pool` each): large values move through them.
    Stream,
}

impl ReservationKind {
    pub fn name(self) -> &'static str {
        match self {
            ReservationKind::Shared => "shared",
            ReservationKind::Heads => "heads",
            ReservationKind::Small => "small",
            ReservationKind::Stream => "stream",
        }
    }
}

impl fmt::Display for ReservationKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How the serving node was chosen, which decides what the plan may commit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NumaMode {
    /// `--numa N`: the operator named the node; subordinate budgets are allowed.
    Explicit(NodeId),
    /// `--numa auto` (or no flag): the node was picked for the operator (NIC of `--listen`,
    /// else node 0); only the local budgets are mapped.
    Automatic(NodeId),
    /// `--no-numa`: no binding at all; memory comes from wherever the kernel gives it.
    Unbound,
}

impl NumaMode {
    pub fn serving_node(self) -> Option<NodeId> {
        match self {
            NumaMode::Explicit(node) | NumaMode::Automatic(node) => Some(node),
            NumaMode::Unbound => None,
        }
    }
}

/// Everything the arena needs from the configuration (validated by `config`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArenaConfig {
    pub numa: NumaMode,
    pub memory_bytes: u64,
    pub sub_memory_bytes: u64,
    /// `Some` selects split mode.
    pub small_memory_bytes: Option<u64>,
    pub small_sub_memory_bytes: u64,
    pub block_bytes: u64,
    pub ram_head_bytes: u64,
    pub small_min_alloc_bytes: u64,
    pub io_chunk_bytes: u64,
    /// Every shard's streaming pool together, on the serving node (0: none).
    pub stream_bytes: u64,
    pub perverse: bool,
}

impl ArenaConfig {
    pub fn split_mode(&self) -> bool {
        self.small_memory_bytes.is_some()
    }

    /// The reservation fixed heads draw from.
    pub fn head_reservation(&self) -> ReservationKind {
        if self.split_mode() {
            ReservationKind::Heads
        } else {
            ReservationKind::Shared
        }
    }

    /// The reservation packed small objects draw from.
    pub fn small_reservation(&self) -> ReservationKind {
        if self.split_mode() {
            ReservationKind::Small
        } else {
            ReservationKind::Shared
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Locality {
    /// On the serving node.
    Local,
    /// On another node.
    Foreign,
    /// `--no-numa`: not bound to any node.
    Unbound,
}

impl fmt::Display for Locality {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Locality::Local => "local",
            Locality::Foreign => "foreign",
            Locality::Unbound => "unbound",
        })
    }
}

/// One independently mapped range: a (reservation, node) pair.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegionPlan {
    /// Position in [`MemoryPlan::regions`]; also the region's id in the block table.
    pub index: usize,
    pub reservation: ReservationKind,
    /// Allocation order inside its reservation: 0 is searched first.
    pub rank: usize,
    /// `None` when unbound (`--no-numa`).
    pub node: Option<NodeId>,
    pub locality: Locality,
    pub bytes: u64,
    pub blocks: u32,
    pub first_block: BlockId,
    /// Huge pages the hugetlb attempt needs, and how many the pool had free when planned.
    pub huge_pages_needed: u64,
    pub huge_pages_free: Option<u64>,
}

impl RegionPlan {
    pub fn block_ids(&self) -> impl DoubleEndedIterator<Item = BlockId> {
        let first = self.first_block.0;
        (first..first + self.blocks).map(BlockId)
    }

    /// Whether the pool looked big enough when the plan was made (the mapping decides).
    pub fn huge_pool_suffices(&self) -> bool {
        self.huge_pages_free
            .is_some_and(|free| free >= self.huge_pages_needed)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryPlan {
    pub config: ArenaConfig,
    pub huge_page_bytes: u64,
    pub regions: Vec<RegionPlan>,
}

impl MemoryPlan {
    /// Lays out the regions for validated settings. Order inside a reservation: the preferred
    /// node first (the serving node, or with `--perverse` the node farthest from it), then
    /// every other online node by distance from the serving node.
    pub fn new(config: &ArenaConfig, topology: &Topology) -> MemoryPlan {
        assert!(config.block_bytes.is_power_of_two());
        assert!(config.block_bytes % topology.huge_page_bytes() == 0);
        let mut plan = MemoryPlan {
            config: config.clone(),
            huge_page_bytes: topology.huge_page_bytes(),
            regions: Vec::new(),
        };
        let (head_local, head_sub) = (config.memory_bytes, config.sub_memory_bytes);
        plan.add_reservation(config.head_reservation(), head_local, head_sub, topology);
        if let Some(small_local) = config.small_memory_bytes {
            let small_sub = config.small_sub_memory_bytes;
            plan.add_reservation(ReservationKind::Small, small_local, small_sub, topology);
        }
        if config.stream_bytes > 0 {
            plan.add_reservation(ReservationKind::Stream, config.stream_bytes, 0, topology);
        }
        plan
    }

    fn add_reservation(
        &mut self,
        reservation: ReservationKind,
        local_bytes: u64,
        sub_bytes: u64,
        topology: &Topology,
    ) {
        let nodes: Vec<(Option<NodeId>, u64)> = match self.config.numa.serving_node() {
            None => vec![(None, local_bytes)],
            Some(serving) => {
                // Streaming pools stay beside the serving threads, --perverse or not.
                let preferred = if self.config.perverse && reservation != ReservationKind::Stream {
                    topology
                        .farthest_from(serving)
                        .expect("--perverse was validated against a multi-node topology")
                } else {
                    serving
                };
                let mut nodes = vec![(Some(preferred), local_bytes)];
                if sub_bytes > 0 {
                    nodes.extend(
                        topology
                            .nodes_by_distance(serving)
                            .into_iter()
                            .filter(|&node| node != preferred)
                            .map(|node| (Some(node), sub_bytes)),
                    );
                }
                nodes
            }
        };
        for (rank, (node, bytes)) in nodes.into_iter().filter(|&(_, b)| b > 0).enumerate() {
            assert!(
                bytes % self.config.block_bytes == 0,
                "budgets are whole blocks"
            );
            let first_block = self
                .regions
                .last()
                .map_or(0, |last| last.first_block.0 + last.blocks);
            let blocks = u32::try_from(bytes / self.config.block_bytes)
                .expect("block count fits in 32 bits (validated)");
            let locality = match (node, self.config.numa.serving_node()) {
                (None, _) | (_, None) => Locality::Unbound,
                (Some(n), Some(s)) if n == s => Locality::Local,
                _ => Locality::Foreign,
            };
            // Regions planned earlier on the same pool take their pages first.
            let claimed: u64 = self
                .regions
                .iter()
                .filter(|r| r.node == node)
                .map(|r| r.huge_pages_needed)
                .sum();
            let huge_pages_free = match node {
                Some(node) => topology.node(node).and_then(|n| n.huge_pages_free),
                None => topology.huge_pages_free_total(),
            }
            .map(|free| free.saturating_sub(claimed));
            self.regions.push(RegionPlan {
                index: self.regions.len(),
                reservation,
                rank,
                node,
                locality,
                bytes,
                blocks,
                first_block: BlockId(first_block),
                huge_pages_needed: bytes / self.huge_page_bytes,
                huge_pages_free,
            });
        }
    }

    pub fn total_bytes(&self) -> u64 {
        self.regions.iter().map(|region| region.bytes).sum()
    }

    /// The bytes that hold cached data: everything but the streaming pools.
    pub fn cache_bytes(&self) -> u64 {
        self.regions
            .iter()
            .filter(|region| region.reservation != ReservationKind::Stream)
            .map(|region| region.bytes)
            .sum()
    }

    pub fn total_blocks(&self) -> u32 {
        self.regions.iter().map(|region| region.blocks).sum()
    }

    /// The regions of one reservation, in allocation order.
    pub fn reservation_regions(
        &self,
        reservation: ReservationKind,
    ) -> impl Iterator<Item = &RegionPlan> {
        self.regions
            .iter()
            .filter(move |region| region.reservation == reservation)
    }

    pub fn reservations(&self) -> Vec<ReservationKind> {
        let mut kinds: Vec<ReservationKind> = self.regions.iter().map(|r| r.reservation).collect();
        kinds.dedup();
        kinds
    }

    /// The plan as `--dry-run` prints it: a summary line, then one line per region.
    pub fn render(&self) -> String {
        let config = &self.config;
        let mut out = String::new();
        let serving = match config.numa {
            NumaMode::Explicit(node) => format!("node {node} (--numa {node})"),
            NumaMode::Automatic(node) => format!("node {node} (automatic)"),
            NumaMode::Unbound => "unbound (--no-numa)".to_string(),
        };
        let _ = writeln!(
            out,
            "memory plan: serving {serving}; {} mode{}; block {}, ram-head {} ({} heads/block), \
             small-min-alloc {} B, io-chunk {}, huge page {}",
            if config.split_mode() {
                "split"
            } else {
                "shared"
            },
            if config.perverse {
                ", PERVERSE (preferred regions on the farthest node)"
            } else {
                ""
            },
            ByteSize(config.block_bytes),
            ByteSize(config.ram_head_bytes),
            config.block_bytes / config.ram_head_bytes,
            config.small_min_alloc_bytes,
            ByteSize(config.io_chunk_bytes),
            ByteSize(self.huge_page_bytes),
        );
        let _ = writeln!(
            out,
            "{:<11} {:>5} {:>6} {:<8} {:>12} {:>7}  backing to attempt",
            "reservation", "order", "node", "locality", "bytes", "blocks"
        );
        for region in &self.regions {
            let node = region.node.map_or("any".to_string(), |n| n.to_string());
            let pool = match region.node {
                Some(n) => format!("node {n} pool"),
                None => "machine pool".to_string(),
            };
            let free = region
                .huge_pages_free
                .map_or("unknown".to_string(), |f| f.to_string());
            let outlook = if region.huge_pool_suffices() {
                ""
            } else {
                "; short, so expect the fallback"
            };
            let fallback = if region.node.is_some() {
                "normal pages + mbind(BIND|STATIC_NODES) + mlock"
            } else {
                "normal pages + mlock"
            };
            let _ = writeln!(
                out,
                "{:<11} {:>5} {:>6} {:<8} {:>12} {:>7}  hugetlb {} pages from the {pool} \
                 ({} needed, {free} free{outlook}), else {fallback}",
                region.reservation.name(),
                region.rank,
                node,
                region.locality.to_string(),
                ByteSize(region.bytes).to_string(),
                region.blocks,
                ByteSize(self.huge_page_bytes),
                region.huge_pages_needed,
            );
        }
        let _ = writeln!(
            out,
            "total: {} in {} regions, {} blocks, all of it locked resident",
            ByteSize(self.total_bytes()),
            self.regions.len(),
            self.total_blocks()
        );
        out
    }
}
