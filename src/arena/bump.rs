//! Packed small objects: a byte-granular bump arena per block, with sliding compaction.
//!
//! Objects smaller than `ram_head` are packed contiguously at `--small-min-alloc` granularity:
//! a 4-byte header (payload length, and a dead bit) then the payload, rounded up to the
//! granule. A free only marks the object dead; the frontier never rewinds except by
//! compaction, which slides a block's live objects down over the dead ones in place (no spare
//! block, so it works at 100 % full), reports every move so the owner can rewrite its locator,
//! and rewinds the frontier. A block holding a pinned object (a reader sending it zero-copy,
//! ADR-0017) or an unpublished reservation is never compacted.

use hashbrown::HashMap;

use super::block::{BlockId, HeadLoc};

/// Bytes of the per-object header in front of every packed payload.
pub const SMALL_HEADER_BYTES: u32 = 4;
const DEAD_BIT: u32 = 1 << 31;
const LEN_MASK: u32 = DEAD_BIT - 1;
/// Tail-room buckets: bucket `b` holds blocks whose free tail is in `[2^b, 2^(b+1))`.
const BUCKETS: usize = 32;
/// Blocks examined in the one bucket whose members may or may not fit a request.
const NEAR_FIT_PROBES: usize = 8;

/// The bytes of the blocks an allocator works on.
pub trait BlockMemory {
    fn bytes(&self, block: BlockId) -> &[u8];
    fn bytes_mut(&mut self, block: BlockId) -> &mut [u8];
}

/// One object moved by compaction: its locator must be rewritten from `from` to `to`.
#[derive(Debug)]
pub struct Relocation<'a> {
    pub from: HeadLoc,
    pub to: HeadLoc,
    /// The payload at its new place (the owner may need it to find its index entry).
    pub payload: &'a [u8],
}

/// What one compaction run did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CompactionReport {
    pub blocks_compacted: u32,
    pub objects_moved: u64,
    pub bytes_moved: u64,
    pub bytes_reclaimed: u64,
}

#[derive(Debug)]
struct SmallBlock {
    rank: usize,
    /// Bytes from the block start that hold objects, live or dead.
    frontier: u32,
    live_bytes: u32,
    dead_bytes: u32,
    live_objects: u32,
    pinned: u32,
    unpublished: u32,
    /// (bucket, position) in the tail-room index, when the block has any tail room.
    room_slot: Option<(u8, u32)>,
}

impl SmallBlock {
    fn movable(&self) -> bool {
        self.pinned == 0 && self.unpublished == 0
    }
}

/// One core's packed-small-object blocks.
#[derive(Debug)]
pub struct Bump {
    block_bytes: u32,
    granule: u32,
    blocks: HashMap<BlockId, SmallBlock>,
    /// `room[rank][bucket]`: blocks of that rank by tail room.
    room: Vec<Vec<Vec<BlockId>>>,
    /// Bumped by every compaction and every block release: object offsets saved before it may
    /// no longer be object boundaries.
    layout_generation: u64,
}

fn bucket_of(tail_bytes: u32) -> Option<u8> {
    (tail_bytes > 0).then(|| tail_bytes.ilog2() as u8)
}

impl Bump {
    pub fn new(block_bytes: u64, granule: u32) -> Bump {
        assert!(granule.is_power_of_two() && granule >= SMALL_HEADER_BYTES);
        let block_bytes = u32::try_from(block_bytes).expect("blocks are at most 1 GiB");
        Bump {
            block_bytes,
            granule,
            blocks: HashMap::new(),
            room: Vec::new(),
            layout_generation: 0,
        }
    }

    /// Bytes an object of `payload_len` occupies: header plus payload, rounded to the granule.
    pub fn footprint(&self, payload_len: u32) -> u32 {
        // Saturates for impossible lengths (over a block), which then fit nowhere.
        SMALL_HEADER_BYTES
            .saturating_add(payload_len)
            .checked_next_multiple_of(self.granule)
            .unwrap_or(u32::MAX)
    }

    /// The largest payload a block can take.
    pub fn max_payload(&self) -> u32 {
        self.block_bytes - SMALL_HEADER_BYTES
    }

    fn room_lists(&mut self, rank: usize) -> &mut Vec<Vec<BlockId>> {
        if self.room.len() <= rank {
            self.room
                .resize_with(rank + 1, || vec![Vec::new(); BUCKETS]);
        }
        &mut self.room[rank]
    }

    fn unlist(&mut self, block: BlockId) {
        let state = self.blocks.get_mut(&block).expect("known block");
        let Some((bucket, pos)) = state.room_slot.take() else {
            return;
        };
        let rank = state.rank;
        let list = &mut self.room[rank][bucket as usize];
        assert_eq!(list[pos as usize], block);
        list.swap_remove(pos as usize);
        if let Some(&moved) = list.get(pos as usize) {
            self.blocks.get_mut(&moved).expect("known block").room_slot = Some((bucket, pos));
        }
    }

    fn relist(&mut self, block: BlockId) {
        let state = &self.blocks[&block];
        let (bucket, rank) = (bucket_of(self.block_bytes - state.frontier), state.rank);
        if state.room_slot.map(|(b, _)| b) == bucket {
            return; // still in the right bucket: the common case on the allocation path
        }
        self.unlist(block);
        let Some(bucket) = bucket else {
            return;
        };
        let list = &mut self.room_lists(rank)[bucket as usize];
        let pos = list.len() as u32;
        list.push(block);
        self.blocks.get_mut(&block).expect("known block").room_slot = Some((bucket, pos));
    }

    /// Adopts an empty block from region `rank`.
    pub fn add_block(&mut self, block: BlockId, rank: usize) {
        let previous = self.blocks.insert(
            block,
            SmallBlock {
                rank,
                frontier: 0,
                live_bytes: 0,
                dead_bytes: 0,
                live_objects: 0,
                pinned: 0,
                unpublished: 0,
                room_slot: None,
            },
        );
        assert!(previous.is_none(), "{block} added to the small arena twice");
        self.relist(block);
    }

    pub fn owns(&self, block: BlockId) -> bool {
        self.blocks.contains_key(&block)
    }

    /// A block of region `rank` whose tail fits `footprint` bytes: the smallest fitting
    /// bucket first, so partly used blocks fill before fresh ones.
    fn find_room(&self, rank: usize, footprint: u32) -> Option<BlockId> {
        let lists = self.room.get(rank)?;
        let sure = footprint.next_power_of_two().ilog2() as usize;
        if let Some(block) = (sure..BUCKETS).find_map(|b| lists[b].last().copied()) {
            return Some(block);
        }
        let near = footprint.ilog2() as usize;
        lists[near]
            .iter()
            .take(NEAR_FIT_PROBES)
            .copied()
            .find(|block| self.block_bytes - self.blocks[block].frontier >= footprint)
    }

    /// Reserves room for a payload of `payload_len` bytes in region `rank`. The object starts
    /// unpublished: it cannot move until [`Bump::publish`] (or [`Bump::abort`]).
    pub fn alloc(
        &mut self,
        rank: usize,
        payload_len: u32,
        mem: &mut dyn BlockMemory,
    ) -> Option<HeadLoc> {
        if payload_len > self.max_payload() {
            return None;
        }
        let footprint = self.footprint(payload_len);
        let block = self.find_room(rank, footprint)?;
        let state = self.blocks.get_mut(&block).expect("known block");
        let offset = state.frontier;
        state.frontier += footprint;
        state.live_bytes += footprint;
        state.live_objects += 1;
        state.unpublished += 1;
        let header = &mut mem.bytes_mut(block)[offset as usize..offset as usize + 4];
        header.copy_from_slice(&payload_len.to_le_bytes());
        self.relist(block);
        Some(HeadLoc { block, offset })
    }

    fn header(&self, loc: HeadLoc, mem: &dyn BlockMemory) -> u32 {
        let at = loc.offset as usize;
        let bytes = &mem.bytes(loc.block)[at..at + 4];
        u32::from_le_bytes(bytes.try_into().expect("4 bytes"))
    }

    /// The payload length of a live object.
    pub fn payload_len(&self, loc: HeadLoc, mem: &dyn BlockMemory) -> u32 {
        let header = self.header(loc, mem);
        assert_eq!(header & DEAD_BIT, 0, "{loc} is dead");
        header & LEN_MASK
    }

    /// Byte range of a live object's payload inside its block.
    pub fn payload_range(&self, loc: HeadLoc, mem: &dyn BlockMemory) -> std::ops::Range<usize> {
        let start = loc.offset as usize + SMALL_HEADER_BYTES as usize;
        start..start + self.payload_len(loc, mem) as usize
    }

    /// Marks a reserved object published: it is now live in the index and may be moved.
    pub fn publish(&mut self, loc: HeadLoc) {
        let state = self
            .blocks
            .get_mut(&loc.block)
            .expect("publish in an unknown block");
        assert!(state.unpublished > 0, "{loc} published twice");
        state.unpublished -= 1;
    }

    /// Drops a reservation that will never be published. Returns the block if it emptied.
    pub fn abort(&mut self, loc: HeadLoc, mem: &mut dyn BlockMemory) -> Option<BlockId> {
        self.publish(loc);
        self.free(loc, mem)
    }

    pub(super) fn counters_mut(&mut self, block: BlockId) -> (&mut u32, &mut u32) {
        let b = self.blocks.get_mut(&block).expect("known block");
        (&mut b.pinned, &mut b.unpublished)
    }

    pub fn pinned(&self, block: BlockId) -> u32 {
        self.blocks.get(&block).map_or(0, |b| b.pinned)
    }

    /// Returns the block if it is wholly dead and nothing holds it: it has left the arena
    /// and the caller gives it back to its pool.
    pub fn release_if_empty(&mut self, block: BlockId) -> Option<BlockId> {
        let state = &self.blocks[&block];
        if state.live_objects > 0 || !state.movable() {
            return None;
        }
        self.unlist(block);
        self.blocks.remove(&block);
        // The block may come back with a different layout (or class): saved offsets into it
        // must not be trusted.
        self.layout_generation += 1;
        Some(block)
    }

    /// Marks an object dead. Returns its block when the block emptied and left the arena.
    pub fn free(&mut self, loc: HeadLoc, mem: &mut dyn BlockMemory) -> Option<BlockId> {
        let header = self.header(loc, mem);
        assert_eq!(header & DEAD_BIT, 0, "{loc} freed twice");
        let footprint = self.footprint(header & LEN_MASK);
        let at = loc.offset as usize;
        mem.bytes_mut(loc.block)[at..at + 4].copy_from_slice(&(header | DEAD_BIT).to_le_bytes());
        let state = self
            .blocks
            .get_mut(&loc.block)
            .expect("free in an unknown block");
        state.live_bytes -= footprint;
        state.dead_bytes += footprint;
        state.live_objects -= 1;
        self.release_if_empty(loc.block)
    }

    /// Dead bytes that compaction could reclaim now (blocks without pins or reservations),
    /// leaving out `exempt`.
    pub fn reclaimable_dead_bytes(&self, exempt: Option<BlockId>) -> u64 {
        self.blocks
            .iter()
            .filter(|(id, b)| b.movable() && Some(**id) != exempt)
            .map(|(_, b)| u64::from(b.dead_bytes))
            .sum()
    }

    /// Dead bytes in all blocks.
    pub fn dead_bytes(&self) -> u64 {
        self.blocks.values().map(|b| u64::from(b.dead_bytes)).sum()
    }

    /// Whether compacting some block of a region would make room for `payload_len`.
    pub fn compaction_would_fit(&self, payload_len: u32, exempt: Option<BlockId>) -> bool {
        let footprint = self.footprint(payload_len);
        self.blocks.iter().any(|(id, b)| {
            b.movable()
                && Some(*id) != exempt
                && b.dead_bytes > 0
                && self.block_bytes - b.live_bytes >= footprint
        })
    }

    /// Compacts movable blocks other than `exempt` until one of them has room for
    /// `payload_len` (or every candidate is done): region rank by rank, so local blocks get room before foreign ones,
    /// and most dead bytes first within a rank. Each moved object is reported to `relocate`
    /// before the next one moves.
    pub fn compact_for(
        &mut self,
        payload_len: u32,
        exempt: Option<BlockId>,
        mem: &mut dyn BlockMemory,
        relocate: &mut dyn FnMut(Relocation<'_>),
    ) -> CompactionReport {
        let footprint = self.footprint(payload_len);
        let mut candidates: Vec<(usize, std::cmp::Reverse<u32>, BlockId)> = self
            .blocks
            .iter()
            .filter(|(id, b)| b.movable() && b.dead_bytes > 0 && Some(**id) != exempt)
            .map(|(&id, b)| (b.rank, std::cmp::Reverse(b.dead_bytes), id))
            .collect();
        candidates.sort_unstable();
        let mut report = CompactionReport::default();
        for (_, _, block) in candidates {
            self.compact_block(block, mem, relocate, &mut report);
            if self.block_bytes - self.blocks[&block].frontier >= footprint {
                break;
            }
        }
        report
    }

    /// Slides one block's live objects down over its dead ones and rewinds the frontier.
    pub fn compact_block(
        &mut self,
        block: BlockId,
        mem: &mut dyn BlockMemory,
        relocate: &mut dyn FnMut(Relocation<'_>),
        report: &mut CompactionReport,
    ) {
        let state = &self.blocks[&block];
        assert!(
            state.movable(),
            "{block} is pinned or has an unpublished reservation"
        );
        let frontier = state.frontier as usize;
        let bytes = mem.bytes_mut(block);
        let (mut src, mut dst) = (0usize, 0usize);
        let mut moved_live = 0u32;
        while src < frontier {
            let header = u32::from_le_bytes(bytes[src..src + 4].try_into().expect("4 bytes"));
            let footprint = self.footprint(header & LEN_MASK) as usize;
            if header & DEAD_BIT == 0 {
                if src != dst {
                    bytes.copy_within(src..src + footprint, dst);
                    report.objects_moved += 1;
                    report.bytes_moved += footprint as u64;
                    let payload_start = dst + SMALL_HEADER_BYTES as usize;
                    relocate(Relocation {
                        from: HeadLoc {
                            block,
                            offset: src as u32,
                        },
                        to: HeadLoc {
                            block,
                            offset: dst as u32,
                        },
                        payload: &bytes
                            [payload_start..payload_start + (header & LEN_MASK) as usize],
                    });
                }
                dst += footprint;
                moved_live += footprint as u32;
            }
            src += footprint;
        }
        let state = self.blocks.get_mut(&block).expect("known block");
        assert_eq!(moved_live, state.live_bytes, "{block}: live bytes drifted");
        report.bytes_reclaimed += u64::from(state.dead_bytes);
        report.blocks_compacted += 1;
        state.frontier = dst as u32;
        state.dead_bytes = 0;
        self.layout_generation += 1;
        self.relist(block);
    }

    /// Changes whenever compaction moves objects or a block leaves.
    pub fn layout_generation(&self) -> u64 {
        self.layout_generation
    }

    /// The first live object of `block` at or after `from`, which must be an object boundary
    /// (0, or an offset returned by an earlier call under the same layout generation), and the
    /// offset just past it. `None` at the frontier or when the block is not held here.
    pub fn next_live(
        &self,
        block: BlockId,
        from: u32,
        mem: &dyn BlockMemory,
    ) -> Option<(HeadLoc, u32)> {
        let state = self.blocks.get(&block)?;
        let bytes = mem.bytes(block);
        let mut at = from;
        while at < state.frontier {
            let header = u32::from_le_bytes(
                bytes[at as usize..at as usize + 4]
                    .try_into()
                    .expect("4 bytes"),
            );
            let next = at + self.footprint(header & LEN_MASK);
            if header & DEAD_BIT == 0 {
                return Some((HeadLoc { block, offset: at }, next));
            }
            at = next;
        }
        None
    }

    /// Every block held, with its rank.
    pub fn blocks(&self) -> impl Iterator<Item = (BlockId, usize)> + '_ {
        self.blocks.iter().map(|(&id, b)| (id, b.rank))
    }

    /// (live bytes, dead bytes, live objects) of one block.
    pub fn usage(&self, block: BlockId) -> Option<(u32, u32, u32)> {
        self.blocks
            .get(&block)
            .map(|b| (b.live_bytes, b.dead_bytes, b.live_objects))
    }

    /// Checks every invariant against the bytes: headers tile each block up to its frontier,
    /// counts match the headers, and the tail-room index matches every frontier.
    pub fn check_invariants(&self, mem: &dyn BlockMemory) {
        for (&id, state) in &self.blocks {
            assert!(state.frontier <= self.block_bytes);
            assert_eq!(state.frontier % self.granule, 0);
            assert_eq!(state.live_bytes + state.dead_bytes, state.frontier, "{id}");
            let bytes = mem.bytes(id);
            let (mut at, mut live, mut dead, mut objects) = (0usize, 0u32, 0u32, 0u32);
            while at < state.frontier as usize {
                let header = u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
                let footprint = self.footprint(header & LEN_MASK);
                if header & DEAD_BIT == 0 {
                    live += footprint;
                    objects += 1;
                } else {
                    dead += footprint;
                }
                at += footprint as usize;
            }
            assert_eq!(
                at, state.frontier as usize,
                "{id}: headers overrun the frontier"
            );
            assert_eq!(
                (live, dead, objects),
                (state.live_bytes, state.dead_bytes, state.live_objects),
                "{id}"
            );
            let expected = bucket_of(self.block_bytes - state.frontier);
            assert_eq!(
                state.room_slot.map(|(b, _)| b),
                expected,
                "{id}: room index stale"
            );
            if let Some((bucket, pos)) = state.room_slot {
                assert_eq!(self.room[state.rank][bucket as usize][pos as usize], id);
            }
        }
        let listed: usize = self.room.iter().flatten().map(Vec::len).sum();
        let with_room = self
            .blocks
            .values()
            .filter(|b| b.room_slot.is_some())
            .count();
        assert_eq!(listed, with_room, "room index lists blocks it should not");
    }
}
