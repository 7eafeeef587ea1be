//! Fixed-head slots: a binary buddy allocator inside each block.
//!
//! A block of `2^k` minimum chunks is an implicit binary tree (node 1 is the whole block,
//! nodes `2n` and `2n+1` its halves). Free chunks sit in one list per (region rank, order),
//! so allocation searches the local region before foreign ones; split and merge walk one
//! path of the tree, O(log blocks/chunk). A block whose chunks are all free again leaves the
//! buddy and goes back to its pool. Heads always take order 0 (exactly `ram_head`), so a
//! completely occupied block has no free chunk in any list and its state can be exchanged
//! with another completely occupied block's by swapping bytes and rewriting locators only.

use hashbrown::HashMap;

use super::block::BlockId;

/// Marks a tree node that is handed out.
const ALLOCATED: u32 = u32::MAX - 1;
/// Marks a tree node that is neither free nor allocated (split, or inside a larger chunk).
const NOT_A_CHUNK: u32 = u32::MAX;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ChunkRef {
    block: BlockId,
    node: u32,
}

#[derive(Debug)]
struct BuddyBlock {
    rank: usize,
    /// Per tree node: its position in its free list, or ALLOCATED / NOT_A_CHUNK.
    node_state: Box<[u32]>,
    /// Minimum chunks currently handed out.
    used_chunks: u32,
    /// Handed-out heads that are pinned by a reader (ADR-0017).
    pub(super) pinned: u32,
    /// Handed-out heads not yet published into the index.
    pub(super) unpublished: u32,
}

/// The buddy allocator over one core's fixed-head blocks.
#[derive(Debug)]
pub struct Buddy {
    min_chunk_shift: u32,
    /// Orders per block: a block is `1 << max_order` minimum chunks.
    max_order: u32,
    blocks: HashMap<BlockId, BuddyBlock>,
    /// `free[rank][order]`: free chunks of that order in blocks of that region rank.
    free: Vec<Vec<Vec<ChunkRef>>>,
}

impl Buddy {
    pub fn new(block_bytes: u64, min_chunk_bytes: u64) -> Buddy {
        assert!(block_bytes.is_power_of_two() && min_chunk_bytes.is_power_of_two());
        assert!(min_chunk_bytes <= block_bytes);
        Buddy {
            min_chunk_shift: min_chunk_bytes.trailing_zeros(),
            max_order: (block_bytes / min_chunk_bytes).trailing_zeros(),
            blocks: HashMap::new(),
            free: Vec::new(),
        }
    }

    pub fn min_chunk_bytes(&self) -> u64 {
        1 << self.min_chunk_shift
    }

    pub fn chunks_per_block(&self) -> u32 {
        1 << self.max_order
    }

    fn lists(&mut self, rank: usize) -> &mut Vec<Vec<ChunkRef>> {
        if self.free.len() <= rank {
            let orders = self.max_order as usize + 1;
            self.free.resize_with(rank + 1, || vec![Vec::new(); orders]);
        }
        &mut self.free[rank]
    }

    fn push_free(&mut self, rank: usize, order: u32, chunk: ChunkRef) {
        let list = &mut self.lists(rank)[order as usize];
        let pos = list.len() as u32;
        list.push(chunk);
        let block = self
            .blocks
            .get_mut(&chunk.block)
            .expect("chunk of a known block");
        block.node_state[chunk.node as usize] = pos;
    }

    fn remove_free(&mut self, rank: usize, order: u32, chunk: ChunkRef) {
        let pos = self.blocks[&chunk.block].node_state[chunk.node as usize];
        assert!(pos < ALLOCATED, "removing a chunk that is not free");
        let list = &mut self.free[rank][order as usize];
        assert_eq!(list[pos as usize], chunk);
        list.swap_remove(pos as usize);
        if let Some(&moved) = list.get(pos as usize) {
            self.blocks
                .get_mut(&moved.block)
                .expect("known block")
                .node_state[moved.node as usize] = pos;
        }
        self.blocks
            .get_mut(&chunk.block)
            .expect("known block")
            .node_state[chunk.node as usize] = NOT_A_CHUNK;
    }

    /// Adopts a whole free block from region `rank`.
    pub fn add_block(&mut self, block: BlockId, rank: usize) {
        let nodes = 2usize << self.max_order;
        let previous = self.blocks.insert(
            block,
            BuddyBlock {
                rank,
                node_state: vec![NOT_A_CHUNK; nodes].into_boxed_slice(),
                used_chunks: 0,
                pinned: 0,
                unpublished: 0,
            },
        );
        assert!(previous.is_none(), "{block} added to the buddy twice");
        self.push_free(rank, self.max_order, ChunkRef { block, node: 1 });
    }

    pub fn owns(&self, block: BlockId) -> bool {
        self.blocks.contains_key(&block)
    }

    /// Whether region `rank` has a free chunk of at least `order`.
    pub fn has_free(&self, rank: usize, order: u32) -> bool {
        self.free
            .get(rank)
            .is_some_and(|lists| lists[order as usize..].iter().any(|l| !l.is_empty()))
    }

    /// A chunk of `order` from region `rank` only, as (block, byte offset).
    pub fn alloc(&mut self, rank: usize, order: u32) -> Option<(BlockId, u32)> {
        assert!(order <= self.max_order);
        let lists = self.free.get(rank)?;
        let found = (order..=self.max_order).find(|&o| !lists[o as usize].is_empty())?;
        let chunk = *self.free[rank][found as usize].last().expect("nonempty");
        self.remove_free(rank, found, chunk);
        // Split down to the wanted order, keeping the left half and freeing the right one.
        let mut node = chunk.node;
        for split_order in (order..found).rev() {
            let right = ChunkRef {
                block: chunk.block,
                node: 2 * node + 1,
            };
            self.push_free(rank, split_order, right);
            node *= 2;
        }
        let block = self.blocks.get_mut(&chunk.block).expect("known block");
        block.node_state[node as usize] = ALLOCATED;
        block.used_chunks += 1 << order;
        let level = self.max_order - order;
        let index = node - (1 << level);
        Some((chunk.block, index << (order + self.min_chunk_shift)))
    }

    fn node_of(&self, offset: u32, order: u32) -> u32 {
        let chunk_shift = order + self.min_chunk_shift;
        assert_eq!(
            offset & ((1 << chunk_shift) - 1),
            0,
            "offset not aligned to its order"
        );
        (1 << (self.max_order - order)) + (offset >> chunk_shift)
    }

    /// Whether `offset` in `block` is a handed-out chunk of `order`.
    pub fn is_allocated(&self, block: BlockId, offset: u32, order: u32) -> bool {
        self.blocks.get(&block).is_some_and(|b| {
            offset < (1u64 << (self.max_order + self.min_chunk_shift)) as u32
                && offset & ((1 << (order + self.min_chunk_shift)) - 1) == 0
                && b.node_state[self.node_of(offset, order) as usize] == ALLOCATED
        })
    }

    /// Frees a chunk, merging with free buddies. Returns the block when it became wholly
    /// free: it has left the buddy and the caller gives it back to its pool.
    pub fn free(&mut self, block: BlockId, offset: u32, order: u32) -> Option<BlockId> {
        let mut node = self.node_of(offset, order);
        let state = self
            .blocks
            .get_mut(&block)
            .expect("free of a chunk in an unknown block");
        assert_eq!(
            state.node_state[node as usize], ALLOCATED,
            "{block}+{offset} freed twice"
        );
        state.node_state[node as usize] = NOT_A_CHUNK;
        state.used_chunks -= 1 << order;
        let rank = state.rank;
        let mut order = order;
        while order < self.max_order {
            let buddy = node ^ 1;
            if self.blocks[&block].node_state[buddy as usize] >= ALLOCATED {
                break;
            }
            self.remove_free(rank, order, ChunkRef { block, node: buddy });
            node /= 2;
            order += 1;
        }
        if order == self.max_order {
            let gone = self.blocks.remove(&block).expect("known block");
            assert_eq!(gone.used_chunks, 0);
            assert_eq!(
                gone.pinned + gone.unpublished,
                0,
                "{block} released while in use"
            );
            return Some(block);
        }
        self.push_free(rank, order, ChunkRef { block, node });
        None
    }

    /// Whether every chunk of the block is handed out (a promotion candidate).
    pub fn is_full(&self, block: BlockId) -> bool {
        self.blocks
            .get(&block)
            .is_some_and(|b| b.used_chunks == self.chunks_per_block())
    }

    pub fn used_chunks(&self, block: BlockId) -> u32 {
        self.blocks.get(&block).map_or(0, |b| b.used_chunks)
    }

    pub fn rank_of(&self, block: BlockId) -> Option<usize> {
        self.blocks.get(&block).map(|b| b.rank)
    }

    pub(super) fn counters_mut(&mut self, block: BlockId) -> (&mut u32, &mut u32) {
        let b = self.blocks.get_mut(&block).expect("known block");
        (&mut b.pinned, &mut b.unpublished)
    }

    pub fn pinned(&self, block: BlockId) -> u32 {
        self.blocks.get(&block).map_or(0, |b| b.pinned)
    }

    pub fn unpublished(&self, block: BlockId) -> u32 {
        self.blocks.get(&block).map_or(0, |b| b.unpublished)
    }

    /// Every block held, with its rank.
    pub fn blocks(&self) -> impl Iterator<Item = (BlockId, usize)> + '_ {
        self.blocks.iter().map(|(&id, b)| (id, b.rank))
    }

    /// Checks every invariant: free lists and node states agree, no chunk overlaps another,
    /// used counts add up, and no two free buddies were left unmerged.
    pub fn check_invariants(&self) {
        for (rank, lists) in self.free.iter().enumerate() {
            for (order, list) in lists.iter().enumerate() {
                for (pos, chunk) in list.iter().enumerate() {
                    let block = &self.blocks[&chunk.block];
                    assert_eq!(block.rank, rank, "chunk listed under the wrong rank");
                    assert_eq!(block.node_state[chunk.node as usize], pos as u32);
                    let level = chunk.node.ilog2();
                    assert_eq!(
                        self.max_order - level,
                        order as u32,
                        "chunk in the wrong order"
                    );
                }
            }
        }
        let leaves = 1usize << self.max_order;
        for (id, block) in &self.blocks {
            // Every leaf is covered by exactly one free or allocated chunk.
            let mut cover = vec![0u8; leaves];
            let mut used = 0u32;
            for node in 1..(2 * leaves) {
                let state = block.node_state[node];
                if state == NOT_A_CHUNK {
                    continue;
                }
                let level = (node as u32).ilog2();
                let span = leaves >> level;
                let first = (node - (1 << level)) * span;
                cover[first..first + span].iter_mut().for_each(|c| *c += 1);
                if state == ALLOCATED {
                    used += span as u32;
                } else if node > 1 {
                    let buddy_state = block.node_state[node ^ 1];
                    assert!(
                        buddy_state >= ALLOCATED,
                        "{id}: free buddies {node} and {} were not merged",
                        node ^ 1
                    );
                }
            }
            assert!(
                cover.iter().all(|&c| c == 1),
                "{id}: chunks overlap or leave gaps"
            );
            assert_eq!(used, block.used_chunks, "{id}: used count drifted");
            assert!(used > 0 || block.pinned + block.unpublished == 0);
        }
    }
}
