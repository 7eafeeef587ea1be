//! Block ids, head locators and the block table that resolves them to memory.
//!
//! A global block id resolves through the table to its region and address, so regions need
//! not be virtually contiguous. The table is fixed at start-up and shared read-only; which
//! shard may touch a block's bytes is decided by the block pools (one owner at a time).

use std::fmt;
use std::sync::Arc;

use super::region::Region;

/// A global block number, dense from 0 across all regions in plan order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockId(pub u32);

impl fmt::Display for BlockId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "b{}", self.0)
    }
}

/// Where a head lives: a block and a byte offset inside it (ADR-0018: the only way to reach a
/// head). For a fixed head the offset is its buddy slot; for a packed small object it is the
/// object's start (its 4-byte header). Eight bytes, so an index entry stays small.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HeadLoc {
    pub block: BlockId,
    pub offset: u32,
}

impl fmt::Display for HeadLoc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}+{}", self.block, self.offset)
    }
}

#[derive(Clone, Copy, Debug)]
struct BlockEntry {
    addr: usize,
    region: u32,
}

/// Block id -> (region, address). Owns the mapped regions, so every address it hands out
/// stays valid while the table lives. Immutable after the arena is mapped.
#[derive(Debug)]
pub struct BlockTable {
    block_bytes: u64,
    entries: Vec<BlockEntry>,
    regions: Vec<Region>,
}

impl BlockTable {
    /// Builds the table over mapped regions, given in plan order.
    pub(crate) fn new(block_bytes: u64, regions: Vec<Region>) -> BlockTable {
        let mut entries = Vec::new();
        for (index, region) in regions.iter().enumerate() {
            assert_eq!(region.plan.index, index, "regions arrive in plan order");
            assert_eq!(region.plan.first_block.0 as usize, entries.len());
            assert_eq!(region.base_addr() % 4096, 0, "regions are page aligned");
            assert!(region.mapping().len() as u64 >= region.plan.blocks as u64 * block_bytes);
            entries.extend((0..region.plan.blocks as usize).map(|i| BlockEntry {
                addr: region.base_addr() + i * block_bytes as usize,
                region: index as u32,
            }));
        }
        BlockTable {
            block_bytes,
            entries,
            regions,
        }
    }

    pub fn regions(&self) -> &[Region] {
        &self.regions
    }

    pub fn block_bytes(&self) -> u64 {
        self.block_bytes
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn region_of(&self, block: BlockId) -> usize {
        self.entries[block.0 as usize].region as usize
    }

    /// The address of the block's first byte.
    pub fn addr_of(&self, block: BlockId) -> usize {
        self.entries[block.0 as usize].addr
    }
}

/// Byte access to blocks through the table, for the allocator that owns them.
///
/// Sound because only a `ShardArena` makes one (it is crate-private), the block pools hand
/// each block to exactly one `ShardArena` at a time, and its allocators only ask for blocks
/// they hold; the table owns the regions, so the memory stays mapped while this accessor lives.
#[derive(Debug)]
pub(crate) struct TableMemory {
    table: Arc<BlockTable>,
}

impl TableMemory {
    pub(crate) fn new(table: Arc<BlockTable>) -> TableMemory {
        TableMemory { table }
    }

    pub(crate) fn addr_of(&self, block: BlockId) -> usize {
        self.table.addr_of(block)
    }
}

impl super::bump::BlockMemory for TableMemory {
    fn bytes(&self, block: BlockId) -> &[u8] {
        let addr = self.table.addr_of(block);
        // SAFETY: `addr` starts a mapped block of `block_bytes` that stays mapped as long as
        // the table; the caller owns the block and the borrow of `self` keeps `bytes_mut`
        // from being called while this view lives.
        unsafe { std::slice::from_raw_parts(addr as *const u8, self.table.block_bytes as usize) }
    }

    fn bytes_mut(&mut self, block: BlockId) -> &mut [u8] {
        let addr = self.table.addr_of(block);
        // SAFETY: as in `bytes`; `&mut self` keeps this the only live view made through this
        // accessor, and the owning shard is the only one with an accessor for this block.
        unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, self.table.block_bytes as usize) }
    }
}
