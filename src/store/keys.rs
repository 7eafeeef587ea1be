//! The index (key -> record locator) and the CLOCK eviction hand over the records.

use hashbrown::{HashMap, HashTable};

use crate::arena::{AdmissionHost, BlockId, HeadLoc, Relocation, ShardArena};
use crate::placement::TargetId;
use crate::segment::Extent;

use super::item::{self, ValueAt};
use super::stats::{ItemClass, StoreStats};

/// The key hash every partition shares: it picks the key's partition and its index bucket.
#[derive(Clone, Debug)]
pub struct KeyHasher(foldhash::fast::FixedState, u64);

impl KeyHasher {
    pub fn with_seed(seed: u64) -> KeyHasher {
        KeyHasher(foldhash::fast::FixedState::with_seed(seed), seed)
    }

    /// The seed: a warm restart keeps it, so a key stays in its partition.
    pub fn seed(&self) -> u64 {
        self.1
    }

    pub fn hash(&self, key: &[u8]) -> u64 {
        use std::hash::BuildHasher;
        self.0.hash_one(key)
    }

    /// The partition of a key hash: the high half scaled to `partitions` (independent of the
    /// low bits the index uses for buckets).
    pub fn partition_of(hash: u64, partitions: usize) -> usize {
        (((hash >> 32) * partitions as u64) >> 32) as usize
    }
}

/// Where the index keeps a hash's first probe, so a connection can prefetch it before it takes
/// the partition's lock: a pipelined batch then waits for its index misses together, not one
/// after another. Only ever a hint: a stale layout (the table grew since) prefetches lines that
/// do not help, and nothing is read through it.
///
/// hashbrown's tables are one allocation, entries in reverse order below the control bytes:
/// bucket `i`'s control byte is at `ctrl_addr + i` and its entry ends `i` entries below
/// `ctrl_addr`; a probe starts at bucket `hash & bucket_mask`. `index_layout_matches_hashbrowns_table`
/// checks this against every full bucket, so a hashbrown that changes it fails a test rather
/// than quietly prefetching the wrong lines.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IndexLayout {
    pub ctrl_addr: usize,
    pub bucket_mask: usize,
}

impl IndexLayout {
    /// Lines a probe for `hash` reads first: both ends of its first control group (16 bytes
    /// that may straddle two lines) and the entries of that group's first eight buckets (one
    /// line's worth, so one or two lines). A key sits in its probe's first few buckets unless
    /// the table is nearly full; the first bucket's entry alone missed about half the time.
    pub fn probe_addrs(&self, hash: u64) -> [usize; 4] {
        let bucket = hash as usize & self.bucket_mask;
        let entry = |bucket: usize| {
            self.ctrl_addr
                .wrapping_sub(((bucket & self.bucket_mask) + 1) * std::mem::size_of::<HeadLoc>())
        };
        [
            self.ctrl_addr.wrapping_add(bucket),
            self.ctrl_addr.wrapping_add(bucket + GROUP_BYTES - 1),
            entry(bucket),
            entry(bucket + ENTRIES_PER_LINE - 1),
        ]
    }
}

/// hashbrown's SSE2 control group.
const GROUP_BYTES: usize = 16;
const ENTRIES_PER_LINE: usize = 64 / std::mem::size_of::<HeadLoc>();

/// `table`'s [`IndexLayout`], read off its first full bucket's address.
fn layout_of(table: &HashTable<HeadLoc>) -> Option<IndexLayout> {
    let buckets = table.num_buckets();
    let (bucket, entry) =
        (0..buckets).find_map(|bucket| table.get_bucket(bucket).map(|entry| (bucket, entry)))?;
    let entry_end = entry as *const HeadLoc as usize + std::mem::size_of::<HeadLoc>();
    Some(IndexLayout {
        ctrl_addr: entry_end + bucket * std::mem::size_of::<HeadLoc>(),
        bucket_mask: buckets - 1,
    })
}

/// A cursor over the live small objects of one core, block by block, in address order.
#[derive(Debug, Default)]
pub(super) struct Hand {
    blocks: Vec<BlockId>,
    at: usize,
    offset: u32,
    generation: u64,
}

impl Hand {
    /// The block the hand is in, if it is in one.
    pub fn block(&self) -> Option<BlockId> {
        self.blocks.get(self.at).copied()
    }

    /// The next live small object, wrapping around; `None` when a fresh pass finds none.
    pub fn next(&mut self, arena: &ShardArena) -> Option<HeadLoc> {
        let mut refreshed = false;
        loop {
            if self.generation != arena.small_layout_generation() {
                // Compaction moved objects: the saved offset may sit inside one. Move on.
                self.generation = arena.small_layout_generation();
                self.at += 1;
                self.offset = 0;
            }
            if self.at >= self.blocks.len() {
                if refreshed {
                    return None;
                }
                self.blocks = arena.small_blocks();
                self.at = 0;
                self.offset = 0;
                refreshed = true;
                if self.blocks.is_empty() {
                    return None;
                }
            }
            match arena.next_small_object(self.blocks[self.at], self.offset) {
                Some((loc, next)) => {
                    self.offset = next;
                    return Some(loc);
                }
                None => {
                    self.at += 1;
                    self.offset = 0;
                }
            }
        }
    }
}

/// The index and everything eviction needs. Separate from the arena so admission can borrow
/// both (`ShardArena::admit_*` calls back into this as its `AdmissionHost`).
pub(super) struct Keys {
    table: HashTable<HeadLoc>,
    pub hasher: KeyHasher,
    clock: Hand,
    pub sweep_hand: Hand,
    pub stats: StoreStats,
    /// Extents of removed large items, for the placement master.
    pub pending_frees: Vec<(TargetId, Extent)>,
    /// Extents of removed large items that a reader still streams.
    parked: Vec<(TargetId, Extent)>,
    /// Leases by id, and how many leases hold each extent (by target and offset).
    leases: HashMap<u64, Vec<(TargetId, Extent)>>,
    leased: HashMap<(TargetId, u64), u32>,
    next_lease: u64,
    /// Set when an insert grew the table (the index moved); taken by
    /// [`Keys::take_moved_layout`].
    layout_moved: bool,
    /// While on (`watch evictions`): what eviction removed, for the caller to log.
    pub evicted_log: Option<Vec<Evicted>>,
    /// `--evictions`: admission may evict live items; off, it takes only what loses none
    /// ([`Keys::reclaim_one`]).
    evictions: bool,
    /// The time admission runs at (Unix seconds): what has expired by then may be reclaimed.
    pub now: u32,
}

/// An item eviction removed, as `watch evictions` reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Evicted {
    pub key: Vec<u8>,
    /// Whether it was read since it was stored.
    pub fetched: bool,
    /// Its expiry (Unix seconds; 0: none) and last access (Unix seconds).
    pub expiry: u32,
    pub accessed: u32,
    pub class: ItemClass,
    pub value_bytes: u64,
}

/// Evictions one operation logs at most (one store evicts a handful; a bound all the same).
const EVICTED_LOG_MAX: usize = 1024;

/// Records the hand visits per call for room when evictions are off: a refused store walks
/// this many at most under the partition's lock (memcached's tail search is bounded too), and
/// the next call goes on from there.
const RECLAIM_SEARCH_MAX: usize = 64;

impl Keys {
    pub fn new(hasher: KeyHasher, evictions: bool) -> Keys {
        Keys {
            table: HashTable::new(),
            hasher,
            clock: Hand::default(),
            sweep_hand: Hand::default(),
            stats: StoreStats::default(),
            pending_frees: Vec::new(),
            parked: Vec::new(),
            leases: HashMap::new(),
            leased: HashMap::new(),
            next_lease: 0,
            layout_moved: false,
            evicted_log: None,
            evictions,
            now: 0,
        }
    }

    /// The table's layout (see [`IndexLayout`]), if it has any entry to read it from.
    pub fn index_layout(&self) -> Option<IndexLayout> {
        layout_of(&self.table)
    }

    /// The layout, when an insert has moved the table since the last call.
    pub fn take_moved_layout(&mut self) -> Option<IndexLayout> {
        std::mem::take(&mut self.layout_moved)
            .then(|| self.index_layout())
            .flatten()
    }

    pub fn len(&self) -> usize {
        self.table.len()
    }

    pub fn allocation_bytes(&self) -> usize {
        self.table.allocation_size()
    }

    pub fn find(&self, arena: &ShardArena, key: &[u8]) -> Option<HeadLoc> {
        let hash = self.hasher.hash(key);
        self.table
            .find(hash, |loc| item::key(arena.bytes(*loc)) == key)
            .copied()
    }

    /// Starts loading the record of every entry `hash`'s probe matches (usually the one the
    /// lookup will compare), without reading any.
    pub fn prefetch_records(&self, arena: &ShardArena, hash: u64) {
        let _ = self.table.find(hash, |loc| {
            crate::sys::prefetch_line(arena.head_addr(*loc));
            false
        });
    }

    /// Removes `key`'s entry, returning its record (still allocated).
    pub fn unlink(&mut self, arena: &ShardArena, key: &[u8]) -> Option<HeadLoc> {
        let hash = self.hasher.hash(key);
        let entry = self
            .table
            .find_entry(hash, |loc| item::key(arena.bytes(*loc)) == key)
            .ok()?;
        Some(entry.remove().0)
    }

    /// Points `key` at `new`; returns the record it pointed at before, if any.
    pub fn replace(&mut self, arena: &mut ShardArena, key: &[u8], new: HeadLoc) -> Option<HeadLoc> {
        let hash = self.hasher.hash(key);
        if let Some(slot) = self.table.find_mut(hash, |loc| {
            *loc != new && item::key(arena.bytes(*loc)) == key
        }) {
            return Some(std::mem::replace(slot, new));
        }
        let hasher = &self.hasher;
        let arena = &*arena;
        let buckets = self.table.num_buckets();
        self.table
            .insert_unique(hash, new, |loc| hasher.hash(item::key(arena.bytes(*loc))));
        // The first insert allocates; a later one may grow the table into a new allocation.
        self.layout_moved |= buckets != self.table.num_buckets() || self.table.len() == 1;
        None
    }

    /// Bytes an item holds in the arena: its record, plus its fixed slot.
    pub fn item_bytes(&self, arena: &ShardArena, loc: HeadLoc) -> u64 {
        let record = arena.bytes(loc);
        let slot = match item::value_at(record) {
            ValueAt::Inline => 0,
            ValueAt::Fixed { .. } => arena.ram_head_bytes(),
            ValueAt::Large => item::large(record)
                .and_then(|l| l.head)
                .map_or(0, |_| arena.ram_head_bytes()),
        };
        u64::from(arena.small_footprint(record.len() as u32)) + slot
    }

    /// Counts an item that is being linked: its bytes and its class.
    pub fn count_linked(&mut self, arena: &ShardArena, loc: HeadLoc) {
        self.stats.bytes += self.item_bytes(arena, loc);
        let record = arena.bytes(loc);
        let (class, value_len) = class_of(record);
        let counts = self.stats.class_mut(class);
        counts.number += 1;
        counts.requested_bytes += item::key(record).len() as u64 + value_len;
        if class == ItemClass::Large {
            self.stats.large_items += 1;
            self.stats.large_bytes += value_len;
        }
    }

    /// Frees an item that was linked (now unlinked): its counts go, then its memory.
    pub fn free_item(&mut self, arena: &mut ShardArena, loc: HeadLoc) {
        self.stats.bytes -= self.item_bytes(arena, loc);
        let record = arena.bytes(loc);
        let (class, value_len) = class_of(record);
        let counts = self.stats.class_mut(class);
        counts.number -= 1;
        counts.requested_bytes -= item::key(record).len() as u64 + value_len;
        if class == ItemClass::Large {
            self.stats.large_items -= 1;
            self.stats.large_bytes -= value_len;
        }
        self.free_unlinked(arena, loc);
    }

    /// Frees an item's record, fixed slot or head and extents (slots deferred while pinned),
    /// without counts: for one never linked.
    pub fn free_unlinked(&mut self, arena: &mut ShardArena, loc: HeadLoc) {
        match item::value_at(arena.bytes(loc)) {
            ValueAt::Fixed { slot, .. } => arena.free(slot),
            ValueAt::Large => {
                let large = item::large(arena.bytes(loc)).expect("a large record");
                if let Some(head) = large.head {
                    arena.free(head);
                }
                for replica in large.replicas {
                    self.release_extent(replica);
                }
            }
            ValueAt::Inline => {}
        }
        arena.free(loc);
    }

    /// An extent no item holds any more: to the master now, or when its last lease ends.
    pub fn release_extent(&mut self, replica: (TargetId, Extent)) {
        if self
            .leased
            .get(&(replica.0, replica.1.offset))
            .copied()
            .unwrap_or(0)
            > 0
        {
            self.parked.push(replica);
        } else {
            self.pending_frees.push(replica);
        }
    }

    /// Holds a large item's extents against being freed while a reader streams them.
    pub fn lease(&mut self, replicas: &[(TargetId, Extent)]) -> u64 {
        let id = self.next_lease;
        self.next_lease += 1;
        for (target, extent) in replicas {
            *self.leased.entry((*target, extent.offset)).or_default() += 1;
        }
        self.leases.insert(id, replicas.to_vec());
        id
    }

    /// Ends a lease; extents freed meanwhile go to the master now.
    pub fn release_lease(&mut self, id: u64) {
        let Some(replicas) = self.leases.remove(&id) else {
            return;
        };
        for (target, extent) in replicas {
            let key = (target, extent.offset);
            let count = self.leased.get_mut(&key).expect("leased extent");
            *count -= 1;
            if *count == 0 {
                self.leased.remove(&key);
                if let Some(at) = self.parked.iter().position(|p| *p == (target, extent)) {
                    let freed = self.parked.swap_remove(at);
                    self.pending_frees.push(freed);
                }
            }
        }
    }

    /// The keys of large items with a replica on `target` (a scan of the index: unmounts only).
    pub fn large_keys_on(&self, arena: &ShardArena, target: TargetId) -> Vec<Vec<u8>> {
        self.table
            .iter()
            .filter_map(|&loc| {
                let record = arena.bytes(loc);
                let large = item::large(record)?;
                large
                    .replicas
                    .iter()
                    .any(|(t, _)| *t == target)
                    .then(|| item::key(record).to_vec())
            })
            .collect()
    }

    /// Every large item: (key, metadata, placement), for a snapshot.
    pub fn large_items(&self, arena: &ShardArena) -> Vec<(Vec<u8>, item::Meta, item::LargeValue)> {
        self.table
            .iter()
            .filter_map(|&loc| {
                let record = arena.bytes(loc);
                let large = item::large(record)?;
                Some((item::key(record).to_vec(), item::meta(record), large))
            })
            .collect()
    }

    /// Empties the index, returning every record.
    /// Calls `f` with every linked record.
    pub fn for_each(&self, mut f: impl FnMut(HeadLoc)) {
        for &loc in &self.table {
            f(loc);
        }
    }

    /// Calls `f` with the entries in buckets `from..from + count`; returns the next bucket,
    /// or `None` past the last. Between two calls the table may change, so a walk in slices
    /// is not a snapshot: an entry inserted, removed or moved by a resize meanwhile may be
    /// seen twice or not at all.
    pub fn for_each_in(
        &self,
        from: usize,
        count: usize,
        mut f: impl FnMut(HeadLoc),
    ) -> Option<usize> {
        let end = from.saturating_add(count).min(self.table.num_buckets());
        for bucket in from..end {
            if let Some(&loc) = self.table.get_bucket(bucket) {
                f(loc);
            }
        }
        (end < self.table.num_buckets()).then_some(end)
    }

    pub fn drain(&mut self) -> Vec<HeadLoc> {
        self.table.drain().collect()
    }

    /// Every entry resolves to a record holding a key that finds that same entry; with
    /// evictions off, nothing was ever evicted.
    pub fn check(&self, arena: &ShardArena) {
        assert!(
            self.evictions || self.stats.evictions == 0,
            "{} items evicted with evictions off",
            self.stats.evictions
        );
        for &loc in &self.table {
            let key = item::key(arena.bytes(loc));
            assert_eq!(
                self.find(arena, key),
                Some(loc),
                "index entry {loc} is not found by its own key"
            );
            if let ValueAt::Fixed { slot, len } = item::value_at(arena.bytes(loc)) {
                assert!(u64::from(len) <= arena.ram_head_bytes());
                assert_eq!(arena.bytes(slot).len() as u64, arena.ram_head_bytes());
                assert_eq!(
                    arena.fixed_owner(slot),
                    Some(loc),
                    "{slot} not linked to {loc}"
                );
            }
            if let Some(head) = item::large(arena.bytes(loc)).and_then(|l| l.head) {
                assert_eq!(
                    arena.fixed_owner(head),
                    Some(loc),
                    "{head} not linked to {loc}"
                );
            }
            if let Some(large) = item::large(arena.bytes(loc)) {
                assert!(large.value_len > arena.ram_head_bytes());
                assert!(large.replicas.iter().all(|(_, e)| e.len >= large.value_len));
            }
        }
    }
}

impl Keys {
    /// Drops a large item's head copy to make room: the item stays, its value whole in its
    /// segment (a reader streams it all from there).
    fn drop_head(&mut self, arena: &mut ShardArena, loc: HeadLoc, head: HeadLoc) {
        item::clear_large_head(arena.bytes_mut(loc));
        arena.free(head);
        self.stats.bytes = self.stats.bytes.saturating_sub(arena.ram_head_bytes());
        self.stats.large_heads_dropped += 1;
    }

    /// Admission's step with evictions off (memcached's `-M`): makes room without losing a
    /// live item, by reclaiming the next expired item, or dropping the next head copy, among
    /// the next [`RECLAIM_SEARCH_MAX`] records the hand visits (pinned ones passed over, no
    /// referenced bit touched). `false`: none there, and the store is refused.
    fn reclaim_one(&mut self, arena: &mut ShardArena) -> bool {
        debug_assert!(
            !self.evictions,
            "reclaim_one stands in for eviction only when off"
        );
        for _ in 0..RECLAIM_SEARCH_MAX {
            let Some(loc) = self.clock.next(arena) else {
                return false;
            };
            if arena.is_pinned(loc) {
                continue;
            }
            let record = arena.bytes(loc);
            let hash = self.hasher.hash(item::key(record));
            if self.table.find(hash, |l| *l == loc).is_none() {
                continue;
            }
            let head = item::large(record).and_then(|large| large.head);
            if let Some(head) = head.filter(|&head| !arena.is_pinned(head)) {
                self.drop_head(arena, loc, head);
                return true;
            }
            let slot_pinned = match item::value_at(record) {
                ValueAt::Fixed { slot, .. } => arena.is_pinned(slot),
                _ => false,
            };
            if slot_pinned || !super::is_expired(item::meta(record).expiry, self.now) {
                continue;
            }
            if let Ok(entry) = self.table.find_entry(hash, |l| *l == loc) {
                entry.remove();
            }
            let class = class_of(arena.bytes(loc)).0;
            self.free_item(arena, loc);
            self.stats.expired_reclaimed += 1;
            self.stats.class_mut(class).reclaimed += 1;
            return true;
        }
        false
    }
}

impl AdmissionHost for Keys {
    /// The CLOCK's block while it evicts; none with evictions off (nothing is being emptied,
    /// so compaction may take any block).
    fn evicting_block(&self) -> Option<BlockId> {
        self.clock.block().filter(|_| self.evictions)
    }

    fn paces_evictions(&self) -> bool {
        self.evictions
    }

    fn relocate(&mut self, moved: Relocation<'_>) {
        let hash = self.hasher.hash(item::key(moved.payload));
        match self.table.find_mut(hash, |loc| *loc == moved.from) {
            Some(loc) => *loc = moved.to,
            None => {
                debug_assert!(
                    false,
                    "compaction moved {} which the index does not hold",
                    moved.from
                );
                tracing::error!(from = %moved.from, "compaction moved a record the index does not hold");
            }
        }
    }

    /// CLOCK: a referenced record loses its bit and is passed over; the first unreferenced,
    /// unpinned, indexed record is evicted. Each step clears a bit or evicts, so the cost is
    /// O(1) amortised; two full turns without a victim mean nothing can be evicted. With
    /// evictions off, [`Keys::reclaim_one`] instead.
    fn evict_one(&mut self, arena: &mut ShardArena) -> bool {
        if !self.evictions {
            return self.reclaim_one(arena);
        }
        let turns = 2 * self.table.len() + 64;
        for _ in 0..turns {
            let Some(loc) = self.clock.next(arena) else {
                return false;
            };
            if arena.is_pinned(loc) {
                self.stats.lrutail_reflocked += 1;
                continue;
            }
            let record = arena.bytes(loc);
            let hash = self.hasher.hash(item::key(record));
            if self.table.find(hash, |l| *l == loc).is_none() {
                continue; // not (or no longer) an indexed record
            }
            match item::value_at(record) {
                ValueAt::Fixed { slot, .. } if arena.is_pinned(slot) => {
                    self.stats.lrutail_reflocked += 1;
                    continue;
                }
                // A large object is never evicted to make RAM room: its record is tiny and its
                // data (rollout data, say) may not be read yet. Its head copy, a latency device,
                // is: the value then streams whole from its segment.
                ValueAt::Large => {
                    let large = item::large(record).expect("a large record");
                    match large.head {
                        Some(head) if !arena.is_pinned(head) && !item::referenced(record) => {
                            self.drop_head(arena, loc, head);
                            return true;
                        }
                        Some(_) if item::referenced(record) => {
                            item::set_referenced(arena.bytes_mut(loc), false);
                            continue;
                        }
                        // Unreferenced, so its head is pinned.
                        Some(_) => {
                            self.stats.lrutail_reflocked += 1;
                            continue;
                        }
                        None => continue,
                    }
                }
                _ => {}
            }
            if item::referenced(record) {
                item::set_referenced(arena.bytes_mut(loc), false);
                continue;
            }
            if let Ok(entry) = self.table.find_entry(hash, |l| *l == loc) {
                entry.remove();
            }
            let (class, value_bytes) = class_of(arena.bytes(loc));
            if let Some(log) = self
                .evicted_log
                .as_mut()
                .filter(|l| l.len() < EVICTED_LOG_MAX)
            {
                let record = arena.bytes(loc);
                log.push(Evicted {
                    key: item::key(record).to_vec(),
                    fetched: item::bit(record, item::BIT_FETCHED),
                    expiry: item::meta(record).expiry,
                    accessed: item::accessed(record),
                    class,
                    value_bytes,
                });
            }
            self.free_item(arena, loc);
            self.stats.evictions += 1;
            self.stats.class_mut(class).evicted += 1;
            return true;
        }
        false
    }
}

/// An item's class and value length, from its record.
pub fn class_of(record: &[u8]) -> (ItemClass, u64) {
    match item::value_at(record) {
        ValueAt::Inline => (ItemClass::Small, item::inline_value(record).len() as u64),
        ValueAt::Fixed { len, .. } => (ItemClass::Fixed, u64::from(len)),
        ValueAt::Large => (
            ItemClass::Large,
            item::large(record).map_or(0, |l| l.value_len),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mix(x: u64) -> u64 {
        let x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        let x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        x ^ (x >> 31)
    }

    /// [`IndexLayout`] reads hashbrown's table layout and probe start from outside. If a
    /// hashbrown release changes either, this fails, rather than the look ahead quietly
    /// prefetching lines no lookup reads.
    #[test]
    fn index_layout_matches_hashbrowns_table() {
        let hash_of = |loc: &HeadLoc| mix(loc.offset as u64);
        let mut table = HashTable::new();
        assert_eq!(
            layout_of(&table),
            None,
            "an empty table has no entry to read it from"
        );
        const ENTRIES: u32 = 3_100;
        for offset in 0..ENTRIES {
            let loc = HeadLoc {
                block: BlockId(3),
                offset,
            };
            table.insert_unique(hash_of(&loc), loc, hash_of);
        }
        let layout = layout_of(&table).expect("a full table");
        assert_eq!(layout.bucket_mask + 1, table.num_buckets());
        let entry_size = std::mem::size_of::<HeadLoc>();
        let bucket_of = |entry: &HeadLoc| {
            (layout.ctrl_addr - (entry as *const HeadLoc as usize)) / entry_size - 1
        };
        for bucket in 0..table.num_buckets() {
            if let Some(entry) = table.get_bucket(bucket) {
                assert_eq!(bucket_of(entry), bucket, "bucket {bucket}'s entry address");
            }
        }
        // A probe reads a group of 16 control bytes from its start, then the entries of the
        // buckets that match: every key's first group must be prefetched, and nearly every
        // key's entry, at the load a partition runs at (3,100 in 4,096 buckets).
        let line = |addr: usize| addr / 64;
        let (mut in_first_group, mut entry_prefetched) = (0, 0);
        for offset in 0..ENTRIES {
            let hash = mix(offset as u64);
            let entry = table.find(hash, |l| l.offset == offset).expect("inserted");
            let lines = layout.probe_addrs(hash).map(line);
            let start = hash as usize & layout.bucket_mask;
            for byte in start..start + 16 {
                assert!(
                    lines.contains(&line(layout.ctrl_addr + byte)),
                    "control byte {byte} of the first group of a probe from {start}"
                );
            }
            if (bucket_of(entry).wrapping_sub(start) & layout.bucket_mask) < 16 {
                in_first_group += 1;
            }
            let entry_addr = entry as *const HeadLoc as usize;
            if lines.contains(&line(entry_addr))
                && lines.contains(&line(entry_addr + entry_size - 1))
            {
                entry_prefetched += 1;
            }
        }
        assert!(
            in_first_group * 10 >= ENTRIES * 9,
            "{in_first_group} of {ENTRIES} keys in their probe's first group"
        );
        assert!(
            entry_prefetched * 10 >= ENTRIES * 9,
            "{entry_prefetched} of {ENTRIES} keys' entries prefetched"
        );
    }
}
