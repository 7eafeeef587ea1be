//! One serving core's view of the arena: its block batch, its fixed-head buddy, its packed
//! small-object arena, the pins readers hold, and admission (compact first, evict last).

use std::sync::Arc;

use std::sync::atomic::{AtomicU64, Ordering};

use hashbrown::{HashMap, HashSet};

use super::batch::BlockBatch;
use super::block::{BlockId, HeadLoc, TableMemory};
use super::buddy::Buddy;
use super::bump::{BlockMemory, Bump, CompactionReport, Relocation};
use super::plan::ReservationKind;
use super::promote::{pair_blocks, FixedMove, Heat, PromotionReport};
use super::slot_layout::{self, SlotBytes, SlotWriter};
use super::stats::{ShardArenaStats, ShardRegionStats};
use super::Arena;

/// Which allocator a head belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeadClass {
    /// An exact `ram_head` buddy slot.
    Fixed,
    /// A packed small object in the bump arena.
    Small,
}

/// Room reserved for a head that is being filled and is not yet in the index. It cannot move
/// (compaction skips its block) until [`ShardArena::publish`] or [`ShardArena::abort`].
#[must_use = "a reservation must be published or aborted"]
#[derive(Debug, PartialEq, Eq)]
pub struct Reserved {
    loc: HeadLoc,
    class: HeadClass,
    /// The `ShardArena` instance that made it: only that one may fill, publish or abort it.
    owner: u64,
}

impl Reserved {
    pub fn loc(&self) -> HeadLoc {
        self.loc
    }

    pub fn class(&self) -> HeadClass {
        self.class
    }
}

/// Why an allocation failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AllocError {
    /// The payload can never fit this class.
    TooLarge { payload_bytes: u64, max_bytes: u64 },
    /// No room, after compaction and every eviction the caller could make.
    OutOfMemory { class: HeadClass },
}

impl std::fmt::Display for AllocError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AllocError::TooLarge {
                payload_bytes,
                max_bytes,
            } => write!(
                f,
                "a {payload_bytes}-byte payload exceeds the {max_bytes}-byte limit of its class"
            ),
            AllocError::OutOfMemory { class } => write!(f, "no {class:?} head space left"),
        }
    }
}

impl std::error::Error for AllocError {}

/// What admission needs from the owner of the locators (the index).
pub trait AdmissionHost {
    /// Compaction moved a head: rewrite its locator from `moved.from` to `moved.to`.
    fn relocate(&mut self, moved: Relocation<'_>);
    /// Evicts one victim, freeing it through `arena`. `false` when nothing can be evicted.
    fn evict_one(&mut self, arena: &mut ShardArena) -> bool;
    /// The block the host is evicting from, if any. Compaction leaves it alone: the host is
    /// about to empty it, and sliding its survivors down would only be undone (without this,
    /// steady eviction pressure turns every eviction into a compaction of the same block).
    fn evicting_block(&self) -> Option<BlockId> {
        None
    }
    /// Whether a full partition paces its evictions (see [`ShardArena::admit_small`]): true
    /// where `evict_one` evicts, false where it only reclaims what loses no item.
    fn paces_evictions(&self) -> bool {
        false
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct PinState {
    readers: u32,
    /// The owner freed the head while it was pinned; free it at the last unpin.
    free_pending: bool,
}

#[derive(Clone, Copy, Debug, Default)]
struct Counters {
    promotion_passes: u64,
    promotion_exchanges: u64,
    promotion_bytes_moved: u64,
    promotion_skipped_pinned: u64,
    /// Bytes of fixed heads read from local (rank 0) and foreign blocks.
    head_bytes_read_local: u64,
    head_bytes_read_foreign: u64,
    compactions: u64,
    compaction: CompactionReport,
    fixed_alloc_failures: u64,
    small_alloc_failures: u64,
    evictions_requested: u64,
    /// Victims evicted to pay the eviction debt (see `eviction_debt_bytes`).
    paced_evictions: u64,
}

/// `ShardArena::block_class` values.
const BLOCK_NONE: u8 = 0;
const BLOCK_SMALL: u8 = 1;
const BLOCK_FIXED: u8 = 2;

/// Promotion swaps two blocks this many bytes at a time.
const EXCHANGE_PIECE_BYTES: usize = 64 << 10;

/// Numbers every `ShardArena`, so a reservation can name the one that made it.
static NEXT_INSTANCE: AtomicU64 = AtomicU64::new(0);

/// One partition's allocator over the shared arena. `Send` but not `Sync`: it lives behind its
/// partition's lock, and only the holder of that lock touches it or the blocks it holds.
pub struct ShardArena {
    shard: usize,
    instance: u64,
    /// Reservations handed out and not yet published or aborted.
    reserved: HashSet<HeadLoc>,
    arena: Arc<Arena>,
    mem: TableMemory,
    batch: BlockBatch,
    buddy: Buddy,
    bump: Bump,
    /// By block id: which of this partition's allocators holds the block (`BLOCK_*`): a
    /// lookup every read of a head makes, so an array, not a hash map.
    block_class: Vec<u8>,
    pins: HashMap<HeadLoc, PinState>,
    /// Access scores of fixed heads (absent: never read, score 0).
    heat: HashMap<HeadLoc, Heat>,
    /// Fixed slot -> the small record that points at it, and back (`link_fixed_owner`).
    fixed_owner: HashMap<HeadLoc, HeadLoc>,
    owned_slot: HashMap<HeadLoc, HeadLoc>,
    /// Room for promotion's exchanges, two pieces (allocated at the first one).
    scratch: Vec<u8>,
    fixed_reservation: ReservationKind,
    small_reservation: ReservationKind,
    counters: Counters,
    /// Pacing of eviction once the partition is full. `None` until admission first had to
    /// evict for room; from then on, the bytes of heads admitted less the bytes of heads freed
    /// other than by an eviction for room. Each admission pays a positive debt by evicting
    /// before it returns, so a full partition evicts about what each store adds, store by
    /// store, while the CLOCK hand still empties its block whole (compaction stays cheap).
    /// Set back to zero at each eviction for room: the partition is at capacity then.
    eviction_debt_bytes: Option<i64>,
    /// Set while admission evicts for room: those frees are not the debt's to count.
    evicting_for_room: bool,
}

impl ShardArena {
    pub(super) fn new(arena: Arc<Arena>, shard: usize) -> ShardArena {
        let config = &arena.plan().config;
        ShardArena {
            shard,
            instance: NEXT_INSTANCE.fetch_add(1, Ordering::Relaxed),
            reserved: HashSet::new(),
            mem: TableMemory::new(arena.table_arc()),
            batch: BlockBatch::new(),
            buddy: Buddy::new(config.block_bytes, config.ram_head_bytes),
            block_class: vec![BLOCK_NONE; arena.table().len()],
            bump: Bump::new(config.block_bytes, config.small_min_alloc_bytes as u32),
            pins: HashMap::new(),
            heat: HashMap::new(),
            fixed_owner: HashMap::new(),
            owned_slot: HashMap::new(),
            scratch: Vec::new(),
            fixed_reservation: config.head_reservation(),
            small_reservation: config.small_reservation(),
            counters: Counters::default(),
            eviction_debt_bytes: None,
            evicting_for_room: false,
            arena,
        }
    }

    pub fn shard(&self) -> usize {
        self.shard
    }

    pub fn arena(&self) -> &Arc<Arena> {
        &self.arena
    }

    pub fn ram_head_bytes(&self) -> u64 {
        self.arena.plan().config.ram_head_bytes
    }

    /// The largest payload the small class takes: below `ram_head`, and fitting a block with
    /// its header.
    pub fn small_max_payload(&self) -> u32 {
        (self.ram_head_bytes() - 1).min(u64::from(self.bump.max_payload())) as u32
    }

    /// Bytes a small payload occupies in the arena (header and granule rounding included).
    pub fn small_footprint(&self, payload_len: u32) -> u32 {
        self.bump.footprint(payload_len)
    }

    fn ranks(&self, kind: ReservationKind) -> usize {
        self.arena.ranks(kind)
    }

    /// Whether a promotion pass can ever exchange anything: fixed heads live in more than one
    /// region (local and foreign).
    pub fn can_promote(&self) -> bool {
        self.ranks(self.fixed_reservation) >= 2
    }

    /// A free block of region `rank`: from the batch of the core running this (the partition's
    /// own on a thread without one).
    fn acquire_block(&mut self, kind: ReservationKind, rank: usize) -> Option<BlockId> {
        let pool = self.arena.pool();
        match super::batch::with_core_batch(|batch| batch.acquire(pool, kind, rank)) {
            Some(block) => block,
            None => self.batch.acquire(pool, kind, rank),
        }
    }

    /// An emptied block goes to the running core's batch (or the partition's own).
    fn release_block(&mut self, block: BlockId) {
        self.block_class[block.0 as usize] = BLOCK_NONE;
        let (kind, rank) = self.arena.home_of(block);
        let pool = self.arena.pool();
        if super::batch::with_core_batch(|batch| batch.release(pool, kind, rank, block)).is_none() {
            self.batch.release(pool, kind, rank, block);
        }
    }

    /// One attempt at a small reservation: local region first (its partly used blocks, then
    /// a fresh block), then each foreign region in order. No compaction, no eviction.
    pub fn try_reserve_small(&mut self, payload_len: u32) -> Result<Reserved, AllocError> {
        let max = self.small_max_payload();
        if payload_len > max {
            return Err(AllocError::TooLarge {
                payload_bytes: payload_len.into(),
                max_bytes: max.into(),
            });
        }
        let kind = self.small_reservation;
        for rank in 0..self.ranks(kind) {
            if let Some(loc) = self.bump.alloc(rank, payload_len, &mut self.mem) {
                self.reserved.insert(loc);
                return Ok(Reserved {
                    loc,
                    class: HeadClass::Small,
                    owner: self.instance,
                });
            }
            if let Some(block) = self.acquire_block(kind, rank) {
                self.bump.add_block(block, rank);
                self.block_class[block.0 as usize] = BLOCK_SMALL;
                let loc = self
                    .bump
                    .alloc(rank, payload_len, &mut self.mem)
                    .expect("a fresh block fits any small payload");
                self.reserved.insert(loc);
                return Ok(Reserved {
                    loc,
                    class: HeadClass::Small,
                    owner: self.instance,
                });
            }
        }
        Err(AllocError::OutOfMemory {
            class: HeadClass::Small,
        })
    }

    /// One attempt at a fixed-head slot, local region first. No eviction.
    pub fn try_reserve_fixed(&mut self) -> Result<Reserved, AllocError> {
        let kind = self.fixed_reservation;
        for rank in 0..self.ranks(kind) {
            let (block, offset) = match self.buddy.alloc(rank, 0) {
                Some(slot) => slot,
                None => match self.acquire_block(kind, rank) {
                    Some(block) => {
                        self.buddy.add_block(block, rank);
                        self.block_class[block.0 as usize] = BLOCK_FIXED;
                        self.buddy.alloc(rank, 0).expect("a fresh block has a slot")
                    }
                    None => continue,
                },
            };
            *self.buddy.counters_mut(block).1 += 1;
            let loc = HeadLoc { block, offset };
            self.reserved.insert(loc);
            return Ok(Reserved {
                loc,
                class: HeadClass::Fixed,
                owner: self.instance,
            });
        }
        Err(AllocError::OutOfMemory {
            class: HeadClass::Fixed,
        })
    }

    /// Dead bytes that must be reclaimable before admission compacts: one `ram_head`
    /// (ADR-0008), but at most half a block, so the gate can open when `ram_head == block`.
    pub fn compaction_gate_bytes(&self) -> u64 {
        self.ram_head_bytes()
            .min(self.arena.plan().config.block_bytes / 2)
    }

    /// Whether compaction may run for a small payload now: enough dead space is reclaimable
    /// (see [`ShardArena::compaction_gate_bytes`]) and compacting some block would fit it.
    pub fn compaction_would_help(&self, payload_len: u32) -> bool {
        self.compaction_would_help_except(payload_len, None)
    }

    fn compaction_would_help_except(&self, payload_len: u32, exempt: Option<BlockId>) -> bool {
        self.bump.reclaimable_dead_bytes(exempt) >= self.compaction_gate_bytes()
            && self.bump.compaction_would_fit(payload_len, exempt)
    }

    /// Compacts until a block has room for `payload_len`, reporting every move.
    pub fn compact_for(
        &mut self,
        payload_len: u32,
        relocate: &mut dyn FnMut(Relocation<'_>),
    ) -> CompactionReport {
        let (owned, fixed_owner) = (&mut self.owned_slot, &mut self.fixed_owner);
        let report = self
            .bump
            .compact_for(payload_len, None, &mut self.mem, &mut |moved| {
                follow_owner(owned, fixed_owner, moved.from, moved.to);
                relocate(moved)
            });
        self.count_compaction(report);
        report
    }

    /// Compacts every block that has reclaimable dead space (maintenance and tests).
    pub fn compact_all(&mut self, relocate: &mut dyn FnMut(Relocation<'_>)) -> CompactionReport {
        self.compact_for(u32::MAX / 2, relocate)
    }

    fn count_compaction(&mut self, report: CompactionReport) {
        if report.blocks_compacted > 0 {
            self.counters.compactions += 1;
            let total = &mut self.counters.compaction;
            total.blocks_compacted += report.blocks_compacted;
            total.objects_moved += report.objects_moved;
            total.bytes_moved += report.bytes_moved;
            total.bytes_reclaimed += report.bytes_reclaimed;
        }
    }

    /// Admission of a small payload: allocate; when short, compact if old dead space
    /// suffices; otherwise evict one victim and, if that made enough dead space, compact
    /// before asking for another. When the host has nothing left to evict (everything pinned,
    /// or evictions off), any dead space that would fit the payload is compacted once, gate or
    /// not, before admission fails.
    pub fn admit_small(
        &mut self,
        payload_len: u32,
        host: &mut dyn AdmissionHost,
    ) -> Result<Reserved, AllocError> {
        let mut last_resort_done = false;
        loop {
            match self.try_reserve_small(payload_len) {
                Ok(reserved) => {
                    let footprint = self.bump.footprint(payload_len);
                    self.pay_eviction_debt(u64::from(footprint), host);
                    return Ok(reserved);
                }
                Err(AllocError::OutOfMemory { .. }) => {}
                Err(too_large) => return Err(too_large),
            }
            let exempt = host.evicting_block();
            if self.compaction_would_help_except(payload_len, exempt) {
                self.compact_small_for(payload_len, exempt, host);
                continue;
            }
            self.counters.evictions_requested += 1;
            if self.evict_for_room(host) {
                continue;
            }
            if !last_resort_done && self.bump.compaction_would_fit(payload_len, None) {
                last_resort_done = true;
                self.compact_small_for(payload_len, None, host);
                continue;
            }
            self.counters.small_alloc_failures += 1;
            return Err(AllocError::OutOfMemory {
                class: HeadClass::Small,
            });
        }
    }

    /// Admission's compaction: blocks other than `exempt` until one has room for
    /// `payload_len`, each move reported to `host`.
    fn compact_small_for(
        &mut self,
        payload_len: u32,
        exempt: Option<BlockId>,
        host: &mut dyn AdmissionHost,
    ) {
        let (owned, fixed_owner) = (&mut self.owned_slot, &mut self.fixed_owner);
        let report = self
            .bump
            .compact_for(payload_len, exempt, &mut self.mem, &mut |moved| {
                follow_owner(owned, fixed_owner, moved.from, moved.to);
                host.relocate(moved)
            });
        self.count_compaction(report);
    }

    /// Admission of a fixed head: allocate, evicting victims until a slot frees up.
    pub fn admit_fixed(&mut self, host: &mut dyn AdmissionHost) -> Result<Reserved, AllocError> {
        loop {
            if let Ok(reserved) = self.try_reserve_fixed() {
                self.pay_eviction_debt(self.ram_head_bytes(), host);
                return Ok(reserved);
            }
            self.counters.evictions_requested += 1;
            if !self.evict_for_room(host) {
                self.counters.fixed_alloc_failures += 1;
                return Err(AllocError::OutOfMemory {
                    class: HeadClass::Fixed,
                });
            }
        }
    }

    /// One eviction because nothing else makes room: the partition is full, so its debt
    /// starts (or starts over) at zero, and what this eviction frees is not counted.
    fn evict_for_room(&mut self, host: &mut dyn AdmissionHost) -> bool {
        if host.paces_evictions() {
            self.eviction_debt_bytes = Some(0);
        }
        self.evicting_for_room = true;
        let evicted = host.evict_one(self);
        self.evicting_for_room = false;
        evicted
    }

    /// A head of `bytes` was admitted: in a full partition it adds to the eviction debt, and
    /// victims are evicted (each free taking its bytes off) until the debt is paid, or until
    /// nothing can be evicted (then the debt is forgiven).
    fn pay_eviction_debt(&mut self, bytes: u64, host: &mut dyn AdmissionHost) {
        let Some(debt) = self.eviction_debt_bytes.as_mut() else {
            return;
        };
        *debt += bytes as i64;
        while self.eviction_debt_bytes.is_some_and(|debt| debt > 0) {
            let before = self.eviction_debt_bytes;
            if !host.evict_one(self) {
                self.eviction_debt_bytes = Some(0);
                break;
            }
            self.counters.paced_evictions += 1;
            // A victim whose free is deferred (pinned) pays nothing yet: stop rather than
            // evict on and on for one store.
            if self.eviction_debt_bytes == before {
                break;
            }
        }
    }

    fn check_owner(&self, reserved: &Reserved) {
        assert_eq!(
            reserved.owner, self.instance,
            "{} was reserved by another ShardArena",
            reserved.loc
        );
        assert!(
            self.reserved.contains(&reserved.loc),
            "{} is not an outstanding reservation",
            reserved.loc
        );
    }

    /// The bytes of a reservation, to fill before publishing. A fixed slot's are raw: fill its
    /// logical bytes through [`ShardArena::reserved_slot_writer`].
    pub fn reserved_mut(&mut self, reserved: &Reserved) -> &mut [u8] {
        self.check_owner(reserved);
        let range = self.range(reserved.loc, reserved.class);
        &mut self.mem.bytes_mut(reserved.loc.block)[range]
    }

    /// A writer of a reserved fixed slot's logical bytes `0..len` (`slot_layout`).
    pub fn reserved_slot_writer(&mut self, reserved: &Reserved, len: usize) -> SlotWriter<'_> {
        assert_eq!(
            reserved.class,
            HeadClass::Fixed,
            "{} is not a fixed slot",
            reserved.loc
        );
        SlotWriter::of_slot(self.reserved_mut(reserved), len)
    }

    /// A live fixed slot's logical bytes `0..len` (`slot_layout`).
    pub fn slot_bytes(&self, slot: HeadLoc, len: usize) -> SlotBytes<'_> {
        let class = self.class_of(slot);
        assert_eq!(class, HeadClass::Fixed, "{slot} is not a fixed slot");
        let range = self.range(slot, class);
        SlotBytes::of_slot(&self.mem.bytes(slot.block)[range], len)
    }

    /// Makes a reservation a live head: from now on compaction may move it.
    pub fn publish(&mut self, reserved: Reserved) -> HeadLoc {
        self.check_owner(&reserved);
        self.reserved.remove(&reserved.loc);
        match reserved.class {
            HeadClass::Small => self.bump.publish(reserved.loc),
            HeadClass::Fixed => {
                let unpublished = self.buddy.counters_mut(reserved.loc.block).1;
                assert!(*unpublished > 0, "{} published twice", reserved.loc);
                *unpublished -= 1;
            }
        }
        reserved.loc
    }

    /// Gives a reservation's room back without publishing it.
    pub fn abort(&mut self, reserved: Reserved) {
        let loc = self.publish(reserved);
        self.free_now(loc);
    }

    /// Which class owns the block of `loc`.
    pub fn class_of(&self, loc: HeadLoc) -> HeadClass {
        let class = self.block_class.get(loc.block.0 as usize).copied();
        debug_assert_eq!(class == Some(BLOCK_SMALL), self.bump.owns(loc.block));
        debug_assert_eq!(class == Some(BLOCK_FIXED), self.buddy.owns(loc.block));
        match class {
            Some(BLOCK_SMALL) => HeadClass::Small,
            Some(BLOCK_FIXED) => HeadClass::Fixed,
            _ => panic!("{loc} is not in this partition's arena"),
        }
    }

    fn range(&self, loc: HeadLoc, class: HeadClass) -> std::ops::Range<usize> {
        match class {
            HeadClass::Small => self.bump.payload_range(loc, &self.mem),
            HeadClass::Fixed => {
                debug_assert!(
                    self.buddy.is_allocated(loc.block, loc.offset, 0),
                    "{loc} not live"
                );
                let start = loc.offset as usize;
                start..start + self.ram_head_bytes() as usize
            }
        }
    }

    /// A live head's bytes: the payload of a small object, or the whole `ram_head` slot raw
    /// (its bytes rotated: read a value through [`ShardArena::slot_bytes`]).
    pub fn bytes(&self, loc: HeadLoc) -> &[u8] {
        let range = self.range(loc, self.class_of(loc));
        &self.mem.bytes(loc.block)[range]
    }

    /// The address a head starts at (its record's first byte), for a prefetch: reads nothing.
    pub fn head_addr(&self, loc: HeadLoc) -> usize {
        self.mem.addr_of(loc.block) + loc.offset as usize
    }

    /// A live head's bytes, writable (the owner updates its own metadata in place); a fixed
    /// slot's raw, as [`ShardArena::bytes`].
    pub fn bytes_mut(&mut self, loc: HeadLoc) -> &mut [u8] {
        let range = self.range(loc, self.class_of(loc));
        &mut self.mem.bytes_mut(loc.block)[range]
    }

    /// The blocks holding small objects, in id order (for scans such as eviction hands).
    pub fn small_blocks(&self) -> Vec<BlockId> {
        let mut blocks: Vec<BlockId> = self.bump.blocks().map(|(id, _)| id).collect();
        blocks.sort_unstable();
        blocks
    }

    /// The first live small object of `block` at or after the object boundary `from`, and the
    /// boundary after it (see [`ShardArena::small_layout_generation`]).
    pub fn next_small_object(&self, block: BlockId, from: u32) -> Option<(HeadLoc, u32)> {
        self.bump.next_live(block, from, &self.mem)
    }

    /// Changes whenever compaction moves small objects: saved offsets are then stale.
    pub fn small_layout_generation(&self) -> u64 {
        self.bump.layout_generation()
    }

    /// Pins a head for a reader (ADR-0017): until the last unpin it never moves, and a free
    /// of it only takes effect at the last unpin.
    pub fn pin(&mut self, loc: HeadLoc) {
        assert!(
            !self.reserved.contains(&loc),
            "{loc} is an unpublished reservation: nothing can read it yet"
        );
        let _ = self.range(loc, self.class_of(loc)); // asserts the head is live
        let state = self.pins.entry(loc).or_default();
        assert!(!state.free_pending, "{loc} pinned after it was freed");
        state.readers += 1;
        if state.readers == 1 {
            *self.block_counters(loc).0 += 1;
        }
    }

    /// Drops one reader's pin; frees the head if its owner freed it meanwhile.
    pub fn unpin(&mut self, loc: HeadLoc) {
        let state = self
            .pins
            .get_mut(&loc)
            .expect("unpin of a head that is not pinned");
        state.readers -= 1;
        if state.readers > 0 {
            return;
        }
        let free_pending = state.free_pending;
        self.pins.remove(&loc);
        *self.block_counters(loc).0 -= 1;
        if free_pending {
            self.free_now(loc);
        } else if self.bump.owns(loc.block) {
            // The last pin may have been all that kept a dead block from leaving.
            if let Some(block) = self.bump.release_if_empty(loc.block) {
                self.release_block(block);
            }
        }
    }

    /// Pins a head for a zero-copy send of `len` bytes from `offset` into it (a fixed slot's
    /// logical bytes, which may lie in two runs: `slot_layout`): the returned token is the
    /// only way to end that pin ([`ShardArena::unpin_sent`]), after the kernel is done with
    /// the bytes.
    pub fn pin_for_send(&mut self, loc: HeadLoc, offset: usize, len: usize) -> SendPin {
        let class = self.class_of(loc);
        let range = self.range(loc, class);
        assert!(offset + len <= range.len(), "a send inside the head");
        let runs = match class {
            HeadClass::Small => [offset..offset + len, 0..0],
            HeadClass::Fixed => slot_layout::spans_of(range.len(), offset..offset + len),
        };
        self.pin(loc);
        let base = self.mem.bytes(loc.block).as_ptr() as usize + range.start;
        SendPin {
            loc,
            runs: runs.map(|run| (base + run.start, run.len())),
            arena: self as *const ShardArena as usize,
        }
    }

    /// Ends a send's pin (on the shard whose arena made it).
    pub fn unpin_sent(&mut self, pin: SendPin) {
        assert_eq!(
            pin.arena, self as *const ShardArena as usize,
            "{} unpinned by an arena that did not pin it",
            pin.loc
        );
        self.unpin(pin.loc);
    }

    pub fn is_pinned(&self, loc: HeadLoc) -> bool {
        self.pins.contains_key(&loc)
    }

    fn block_counters(&mut self, loc: HeadLoc) -> (&mut u32, &mut u32) {
        if self.bump.owns(loc.block) {
            self.bump.counters_mut(loc.block)
        } else {
            self.buddy.counters_mut(loc.block)
        }
    }

    /// Frees a live head (deferred to the last unpin when pinned).
    pub fn free(&mut self, loc: HeadLoc) {
        assert!(
            !self.reserved.contains(&loc),
            "{loc} is a reservation: abort it instead of freeing it"
        );
        if let Some(state) = self.pins.get_mut(&loc) {
            assert!(!state.free_pending, "{loc} freed twice");
            state.free_pending = true;
            return;
        }
        self.free_now(loc);
    }

    fn free_now(&mut self, loc: HeadLoc) {
        // A freed slot loses its score and its owner; a freed record its slot link.
        self.heat.remove(&loc);
        if let Some(owner) = self.fixed_owner.remove(&loc) {
            self.owned_slot.remove(&owner);
        }
        if let Some(slot) = self.owned_slot.remove(&loc) {
            self.fixed_owner.remove(&slot);
        }
        let small = self.bump.owns(loc.block);
        if self.eviction_debt_bytes.is_some() && !self.evicting_for_room {
            let freed_bytes = if small {
                i64::from(self.bump.footprint(self.bump.payload_len(loc, &self.mem)))
            } else {
                self.ram_head_bytes() as i64
            };
            if let Some(debt) = self.eviction_debt_bytes.as_mut() {
                *debt -= freed_bytes;
            }
        }
        let emptied = if small {
            self.bump.free(loc, &mut self.mem)
        } else {
            self.buddy.free(loc.block, loc.offset, 0)
        };
        if let Some(block) = emptied {
            self.release_block(block);
        }
    }

    /// Gives every idle block in the batch back to the global pool.
    pub fn return_idle_blocks(&mut self) {
        self.batch.return_all(self.arena.pool());
    }

    /// Dead small-object bytes compaction could reclaim now.
    pub fn reclaimable_dead_bytes(&self) -> u64 {
        self.bump.reclaimable_dead_bytes(None)
    }

    /// Blocks this core holds: (in use by fixed heads, in use by small objects, idle).
    pub fn blocks_held(&self) -> Vec<BlockId> {
        let mut blocks: Vec<BlockId> = self
            .buddy
            .blocks()
            .chain(self.bump.blocks())
            .map(|(id, _)| id)
            .chain(self.batch.all_held())
            .collect();
        blocks.sort_unstable();
        blocks
    }

    /// Records that the small record `owner` points at the fixed slot `slot` (a value in a
    /// fixed slot, a large value's head). Promotion moves slots only when every slot of both
    /// blocks has an owner, and reports each move so the owner can be rewritten; compaction
    /// moving the record keeps the link.
    pub fn link_fixed_owner(&mut self, slot: HeadLoc, owner: HeadLoc) {
        assert_eq!(
            self.class_of(slot),
            HeadClass::Fixed,
            "{slot} is not a fixed slot"
        );
        assert_eq!(
            self.class_of(owner),
            HeadClass::Small,
            "{owner} is not a record"
        );
        if let Some(old) = self.fixed_owner.insert(slot, owner) {
            self.owned_slot.remove(&old);
        }
        if let Some(old) = self.owned_slot.insert(owner, slot) {
            if old != slot {
                self.fixed_owner.remove(&old);
            }
        }
    }

    /// The record linked to a fixed slot.
    pub fn fixed_owner(&self, slot: HeadLoc) -> Option<HeadLoc> {
        self.fixed_owner.get(&slot).copied()
    }

    /// A read of `served_bytes` from the fixed slot `slot` in decay period `period`: bumps its
    /// score and counts the bytes as read from a local or a foreign block. O(1), no clock, no
    /// other core.
    pub fn touch_fixed(&mut self, slot: HeadLoc, period: u32, served_bytes: u64) {
        self.heat.entry(slot).or_default().bump(period);
        if self.buddy.rank_of(slot.block) == Some(0) {
            self.counters.head_bytes_read_local += served_bytes;
        } else {
            self.counters.head_bytes_read_foreign += served_bytes;
        }
    }

    /// A fixed slot's score as of `period`.
    pub fn heat_of(&self, slot: HeadLoc, period: u32) -> u32 {
        self.heat.get(&slot).map_or(0, |h| h.at(period))
    }

    /// The NUMA node the kernel reports for the page holding a fixed slot (`move_pages`).
    pub fn slot_node(&self, slot: HeadLoc) -> std::io::Result<i32> {
        let addr = self.mem.bytes(slot.block).as_ptr() as usize + slot.offset as usize;
        crate::sys::node_of_address(addr)
    }

    /// The rank (0: local, the preferred region) of a fixed-head block this core holds.
    pub fn fixed_rank(&self, block: BlockId) -> Option<usize> {
        self.buddy.rank_of(block)
    }

    /// The promotion pass (`arena/promote.rs`): at most `budget` exchanges of a completely
    /// occupied local block with colder heads and a completely occupied foreign block with
    /// hotter ones. Returns every head it moved; the caller must point each owner at its new
    /// slot before anything else reads them. Nothing to do with a single fixed-head region.
    pub fn promote(&mut self, period: u32, budget: usize) -> PromotionReport {
        let mut report = PromotionReport::default();
        if self.ranks(self.fixed_reservation) < 2 || budget == 0 {
            return report;
        }
        self.counters.promotion_passes += 1;
        let head = self.ram_head_bytes() as u32;
        let slots = self.buddy.chunks_per_block();
        let (mut local, mut foreign) = (Vec::new(), Vec::new());
        for (block, rank) in self.buddy.blocks() {
            if !self.buddy.is_full(block) || self.buddy.unpublished(block) > 0 {
                continue;
            }
            if self.buddy.pinned(block) > 0 {
                report.skipped_pinned += 1;
                continue;
            }
            let at = |i: u32| HeadLoc {
                block,
                offset: i * head,
            };
            if (0..slots).any(|i| !self.fixed_owner.contains_key(&at(i))) {
                // A slot without a linked owner could not be rewritten: never move it.
                debug_assert!(false, "{block}: a fixed slot without an owner");
                continue;
            }
            let heat: u64 = (0..slots)
                .map(|i| u64::from(self.heat_of(at(i), period)))
                .sum();
            if rank == 0 {
                local.push((block, heat));
            } else {
                foreign.push((block, heat));
            }
        }
        for (l, f) in pair_blocks(&local, &foreign, budget) {
            self.exchange(l, f, &mut report);
        }
        self.counters.promotion_exchanges += report.exchanged.len() as u64;
        self.counters.promotion_bytes_moved += report.bytes_moved;
        self.counters.promotion_skipped_pinned += report.skipped_pinned;
        report
    }

    /// Swaps the contents of two completely occupied, unpinned fixed-head blocks: their
    /// bytes (64 KiB at a time), their heads' scores and owner links. Their buddy state is that of any full
    /// block, so it stays as it is.
    fn exchange(&mut self, a: BlockId, b: BlockId, report: &mut PromotionReport) {
        for block in [a, b] {
            assert!(
                self.buddy.is_full(block)
                    && self.buddy.pinned(block) == 0
                    && self.buddy.unpublished(block) == 0,
                "{block} exchanged while not full, pinned or unpublished"
            );
        }
        // Swap piece by piece through two cache-sized buffers: no block-sized allocation, and
        // each piece is still in cache when it is written back.
        let block_bytes = self.arena.plan().config.block_bytes as usize;
        let piece = EXCHANGE_PIECE_BYTES.min(block_bytes);
        self.scratch.resize(2 * piece, 0);
        for at in (0..block_bytes).step_by(piece) {
            let (from_a, from_b) = self.scratch.split_at_mut(piece);
            from_a.copy_from_slice(&self.mem.bytes(a)[at..at + piece]);
            from_b.copy_from_slice(&self.mem.bytes(b)[at..at + piece]);
            self.mem.bytes_mut(a)[at..at + piece].copy_from_slice(from_b);
            self.mem.bytes_mut(b)[at..at + piece].copy_from_slice(from_a);
        }
        let head = self.ram_head_bytes() as u32;
        for i in 0..self.buddy.chunks_per_block() {
            let (sa, sb) = (
                HeadLoc {
                    block: a,
                    offset: i * head,
                },
                HeadLoc {
                    block: b,
                    offset: i * head,
                },
            );
            let (ha, hb) = (self.heat.remove(&sa), self.heat.remove(&sb));
            if let Some(h) = ha {
                self.heat.insert(sb, h);
            }
            if let Some(h) = hb {
                self.heat.insert(sa, h);
            }
            let oa = self
                .fixed_owner
                .remove(&sa)
                .expect("candidates have owners");
            let ob = self
                .fixed_owner
                .remove(&sb)
                .expect("candidates have owners");
            for (owner, from, to) in [(oa, sa, sb), (ob, sb, sa)] {
                self.fixed_owner.insert(to, owner);
                self.owned_slot.insert(owner, to);
                report.moves.push(FixedMove { owner, from, to });
            }
        }
        report.exchanged.push((a, b));
        report.bytes_moved += 2 * block_bytes as u64;
    }

    /// Whether a fixed-head block is completely occupied (a promotion candidate).
    pub fn is_full_fixed_block(&self, block: BlockId) -> bool {
        self.buddy.is_full(block)
    }

    pub fn stats(&self) -> ShardArenaStats {
        let regions = self.arena.plan().regions.len();
        let mut per_region = vec![ShardRegionStats::default(); regions];
        for (block, _) in self.buddy.blocks() {
            let region = &mut per_region[self.arena.table().region_of(block)];
            region.blocks_fixed += 1;
            region.fixed_heads_live += u64::from(self.buddy.used_chunks(block));
        }
        for (block, _) in self.bump.blocks() {
            let region = &mut per_region[self.arena.table().region_of(block)];
            let (live, dead, objects) = self.bump.usage(block).expect("held block");
            region.blocks_small += 1;
            region.small_live_bytes += u64::from(live);
            region.small_dead_bytes += u64::from(dead);
            region.small_objects_live += u64::from(objects);
        }
        for block in self.batch.all_held() {
            per_region[self.arena.table().region_of(block)].blocks_idle += 1;
        }
        let c = &self.counters;
        ShardArenaStats {
            per_region,
            compactions: c.compactions,
            compaction_blocks: u64::from(c.compaction.blocks_compacted),
            compaction_objects_moved: c.compaction.objects_moved,
            compaction_bytes_moved: c.compaction.bytes_moved,
            compaction_bytes_reclaimed: c.compaction.bytes_reclaimed,
            fixed_alloc_failures: c.fixed_alloc_failures,
            small_alloc_failures: c.small_alloc_failures,
            evictions_requested: c.evictions_requested,
            paced_evictions: c.paced_evictions,
            batch_refills: self.batch.refills,
            batch_returns: self.batch.returns,
            heads_pinned: self.pins.len() as u64,
            promotion_passes: c.promotion_passes,
            promotion_exchanges: c.promotion_exchanges,
            promotion_bytes_moved: c.promotion_bytes_moved,
            promotion_skipped_pinned: c.promotion_skipped_pinned,
            head_bytes_read_local: c.head_bytes_read_local,
            head_bytes_read_foreign: c.head_bytes_read_foreign,
        }
    }

    /// Checks every allocator invariant of this core (tests; cheap enough for debug runs).
    pub fn check_invariants(&self) {
        self.buddy.check_invariants();
        self.bump.check_invariants(&self.mem);
        // Every admission pays its debt before it returns (each victim frees its bytes), and
        // frees between admissions only lower it.
        assert!(
            self.eviction_debt_bytes.is_none_or(|debt| debt <= 0),
            "an eviction debt of {:?} bytes outstanding",
            self.eviction_debt_bytes
        );
        assert!(!self.evicting_for_room, "left evicting for room");
        for (id, &class) in self.block_class.iter().enumerate() {
            let block = BlockId(id as u32);
            assert_eq!(
                class == BLOCK_SMALL,
                self.bump.owns(block),
                "{block}: class table"
            );
            assert_eq!(
                class == BLOCK_FIXED,
                self.buddy.owns(block),
                "{block}: class table"
            );
        }
        let held = self.blocks_held();
        assert!(
            held.windows(2).all(|w| w[0] != w[1]),
            "a block is held twice"
        );
        for &block in &held {
            let (kind, _) = self.arena.home_of(block);
            if self.buddy.owns(block) {
                assert_eq!(
                    kind, self.fixed_reservation,
                    "{block}: fixed head in wrong pool"
                );
                assert!(!self.bump.owns(block), "{block} has two classes");
            }
            if self.bump.owns(block) {
                assert_eq!(
                    kind, self.small_reservation,
                    "{block}: small object in wrong pool"
                );
            }
            assert!(
                !self.arena.pool().with(|pool| pool.is_free(block)),
                "{block} is free and held"
            );
        }
        assert_eq!(
            self.fixed_owner.len(),
            self.owned_slot.len(),
            "owner links are pairs"
        );
        for (&slot, &owner) in &self.fixed_owner {
            assert_eq!(
                self.owned_slot.get(&owner),
                Some(&slot),
                "{slot} <-> {owner} not mutual"
            );
            assert!(
                self.buddy.is_allocated(slot.block, slot.offset, 0),
                "{slot} linked but not live"
            );
            assert!(
                self.bump.owns(owner.block),
                "{owner}, owner of {slot}, is not a record"
            );
        }
        for slot in self.heat.keys() {
            assert!(
                self.buddy.is_allocated(slot.block, slot.offset, 0),
                "{slot} has a score but is not live"
            );
        }
        for (loc, pin) in &self.pins {
            assert!(pin.readers > 0);
            let pinned = if self.bump.owns(loc.block) {
                self.bump.pinned(loc.block)
            } else {
                self.buddy.pinned(loc.block)
            };
            assert!(pinned > 0, "{loc} pinned but its block does not count it");
        }
    }
}

/// A head pinned for a zero-copy send (ADR-0017): plain data, so it can travel to the shard
/// that sends it and back to the one that unpins it. While it exists (unless it is lost, which
/// only leaks the pin) the bytes it names neither move nor change.
#[derive(Debug, PartialEq, Eq)]
pub struct SendPin {
    loc: HeadLoc,
    /// (address, length) of the pinned bytes, in order: one run, or two where a fixed slot's
    /// bytes wrap.
    runs: [(usize, usize); 2],
    /// The arena that pinned it (checked at the unpin).
    arena: usize,
}

impl SendPin {
    pub fn len(&self) -> usize {
        self.runs[0].1 + self.runs[1].1
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Lends the pinned bytes to a send; `unpin` gets the pin back when the kernel is done
    /// with them and must hand it to [`ShardArena::unpin_sent`] on the owning shard.
    /// (`unpin` is boxed once, with the pin: a lent GET allocates nothing else for it.)
    pub fn lend(self, unpin: impl FnOnce(SendPin) + 'static) -> crate::lent::Lent {
        let runs = self.runs.map(|(addr, len)| (addr as *const u8, len));
        // SAFETY: both runs lie inside the pinned head (`pin_for_send` asserts it, and
        // `slot_layout::spans_of` keeps a fixed slot's runs in the slot). The head is pinned
        // until `unpin` ends the pin, which it can only do with this token, which the release
        // hands over only after the last use of the bytes; a pinned head is never moved, freed
        // or rewritten (compaction skips its block, eviction skips it, a free waits for the
        // last unpin), and its block stays mapped.
        unsafe { crate::lent::Lent::from_runs(runs, Box::new(move || unpin(self))) }
    }
}

/// Compaction moved the small object `from` to `to`: if it owns a fixed slot, the link follows.
fn follow_owner(
    owned_slot: &mut HashMap<HeadLoc, HeadLoc>,
    fixed_owner: &mut HashMap<HeadLoc, HeadLoc>,
    from: HeadLoc,
    to: HeadLoc,
) {
    if let Some(slot) = owned_slot.remove(&from) {
        owned_slot.insert(to, slot);
        fixed_owner.insert(slot, to);
    }
}
