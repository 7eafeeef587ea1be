//! One partition's store: the index, the item records in the arena, admission and eviction,
//! expiry. The one place that combines the arena with keys (see `docs/store.md`).
//!
//! Every operation is synchronous; the server runs it on whichever core serves the request,
//! holding the partition's lock, and passes the current Unix time so expiry is testable.

pub mod detail;
pub mod item;
mod keys;
mod large;
pub mod partition;
mod stats;

use crate::arena::{
    AllocError, HeadClass, HeadLoc, Reserved, SendPin, ShardArena, SlotBytes, SlotWriter,
};
pub use crate::command::{ArithOutcome, DeleteOutcome, MetaGet, StoreOutcome};
use crate::command::{StoreMode, ARITH_NO_CREATE};
use crate::placement::TargetId;
use crate::segment::Extent;

use item::{Meta, ValueAt};

/// How recently an item was used: what a warm restart carries over, so the CLOCK finds the
/// items that were cold as cold.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Recency {
    /// CLOCK's referenced bit.
    pub referenced: bool,
    /// Fetched since stored (meta `h`).
    pub fetched: bool,
    /// Unix seconds of the last store or fetch (meta `l`).
    pub accessed: u32,
}
use keys::Keys;
pub use keys::{Evicted, IndexLayout, KeyHasher};
pub use stats::{ClassStats, ItemClass, StoreStats};

pub use crate::command::{CAS_NEVER_ISSUED, RELATIVE_EXPIRY_MAX_SECONDS};

pub use crate::config::PARTITIONS_MAX;

/// Settings a store needs.
#[derive(Clone, Debug)]
pub struct StoreConfig {
    /// Values longer than this are refused as too large.
    pub max_item_bytes: u64,
    /// Partition number and how many partitions there are: CAS values are interleaved by
    /// them, unique across partitions ([`Partitions::new`](partition::Partitions::new) sets
    /// the count it made).
    pub partition: usize,
    pub partitions: usize,
    /// Fixed heads' access scores halve once per this many seconds (at least 1).
    pub promotion_half_life_seconds: u32,
    /// `--evictions`: admission evicts the coldest items to make room; off, it only reclaims
    /// expired ones and refuses the store when that is not enough (memcached's `-M`).
    pub evictions: bool,
}

/// A large value already written to its extents, to be linked under a key.
#[derive(Clone, Debug)]
pub struct LargeLink {
    pub value_len: u64,
    /// CRC32C of the whole value.
    pub checksum: u32,
    pub replicas: Vec<(TargetId, Extent)>,
    /// Its first bytes, for a head copy in RAM (empty: none).
    pub head: Vec<u8>,
}

/// The item an APPEND or PREPEND built in a segment starts from ([`Store::concat_base`]).
#[derive(Debug)]
pub struct ConcatBase {
    pub cas: u64,
    pub flags: u32,
    /// Absolute (0: never).
    pub expiry: u32,
    pub value: ConcatValue,
}

/// Its value: copied out of RAM, or in a segment with its extents leased.
#[derive(Debug)]
pub enum ConcatValue {
    Ram(Vec<u8>),
    Segment {
        value_len: u64,
        /// CRC32C of the whole value, as it was stored.
        checksum: u32,
        replicas: Vec<(TargetId, Extent)>,
        lease: u64,
    },
}

impl ConcatValue {
    pub fn len(&self) -> u64 {
        match self {
            ConcatValue::Ram(bytes) => bytes.len() as u64,
            ConcatValue::Segment { value_len, .. } => *value_len,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What a lookup found.
#[derive(Debug, PartialEq, Eq)]
pub enum Lookup<'a> {
    Miss,
    Small(Hit<'a>),
    Large(LargeHit),
}

/// What a meta get found of the item's state, before this request changed it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MetaState {
    pub found: bool,
    /// `h`: read before this request.
    pub fetched: bool,
    /// `l`: Unix seconds of the last access before this request.
    pub accessed: u32,
    /// `X`: stale.
    pub stale: bool,
    /// `Z`: another reader already holds the token.
    pub token_sent: bool,
    /// Created empty by this request (`N`).
    pub created: bool,
    /// `W`: this request won the token to refill the item.
    pub won: bool,
    /// Absolute expiry after this request (0: never).
    pub expiry: u32,
    /// The value was asked for but is left out: the item's CAS is the one the reader holds
    /// (`mg ... v C<cas>`).
    pub value_withheld: bool,
}

/// A hit on a large item: its value lives in segment extents; its head is copied here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LargeHit {
    /// The item's key (a reader that finds the value damaged drops the item by it).
    pub key: Vec<u8>,
    pub flags: u32,
    pub cas: u64,
    pub value_len: u64,
    /// CRC32C of the whole value, computed as it was stored.
    pub checksum: u32,
    pub replicas: Vec<(TargetId, Extent)>,
    /// The head copy in RAM, when a reader asked for the value: its fixed slot and how many
    /// of the value's first bytes it holds.
    pub head_at: Option<(HeadLoc, usize)>,
    /// Those bytes, once the caller copied them ([`Store::fixed_bytes`]); empty when the head
    /// is lent pinned instead, or when there is no head copy.
    pub head: Vec<u8>,
    /// Held extents, to release when the reader is done.
    pub lease: Option<u64>,
}

/// One item as `lru_crawler metadump` lists it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DumpedItem {
    /// Unix seconds, 0 never.
    pub expiry: u32,
    /// Unix seconds of the last store or fetch.
    pub accessed: u32,
    pub cas: u64,
    /// The client's flags.
    pub flags: u32,
    pub fetched: bool,
    pub class: ItemClass,
    /// Key plus value bytes (`stats items`' `mem_requested` counts the same).
    pub bytes: u64,
}

/// A GET hit, borrowed from the store until the next mutation.
#[derive(Debug, PartialEq, Eq)]
pub struct Hit<'a> {
    pub flags: u32,
    pub cas: u64,
    /// The value's bytes, in one run or (a fixed slot's, wrapping: `arena::slot_layout`) two.
    pub value: SlotBytes<'a>,
    /// Where the value's bytes are: the arena allocation holding them and their offset in
    /// it (for [`Store::pin_for_send`]; a fixed slot's offset is logical).
    pub at: (HeadLoc, usize),
}

/// memcached's expiry rule: 0 never; up to 30 days relative; beyond, an absolute Unix time
/// (one in the past expires at once).
pub fn absolute_expiry(exptime: u32, now: u32) -> u32 {
    match exptime {
        0 => 0,
        t if t <= RELATIVE_EXPIRY_MAX_SECONDS => now.saturating_add(t).max(1),
        t => t,
    }
}

pub fn is_expired(expiry: u32, now: u32) -> bool {
    expiry != 0 && expiry <= now
}

/// A counter's value as memcached reads it: `safe_strtoull` over the item's bytes (which end in
/// `\r\n` there, so the number may end the value): blanks, a sign, digits, then the end or a
/// blank, anything after that ignored (`84 abc` is 84: an INCR/DECR that shortened a counter in
/// place padded it with spaces, and an APPEND may follow).
fn parse_counter(value: &[u8]) -> Option<u64> {
    crate::numbers::safe_strtoull(value)
}

/// Where a new value will live.
enum Placement {
    Inline,
    Fixed,
}

/// One shard's store.
pub struct Store {
    arena: ShardArena,
    keys: Keys,
    config: StoreConfig,
    next_cas: u64,
    /// A pending `flush_all` with a delay: every item stored before it dies at this time.
    flush_at: Option<u32>,
    large_refusal_logged: bool,
    /// The time the current operation runs at (set as it starts; new records take it as
    /// their last access).
    clock: u32,
    /// STAT `detail`: per-prefix counters, while switched on.
    pub detail: detail::PrefixStats,
}

impl Store {
    pub fn new(arena: ShardArena, hasher: KeyHasher, config: StoreConfig) -> Store {
        Store {
            arena,
            keys: Keys::new(hasher, config.evictions),
            next_cas: 0,
            flush_at: None,
            large_refusal_logged: false,
            clock: 0,
            detail: detail::PrefixStats::default(),
            config,
        }
    }

    /// Starts loading the records whose index entries match `hash` (a key's possible
    /// records), reading none of them.
    pub fn prefetch_records(&self, hash: u64) {
        self.keys.prefetch_records(&self.arena, hash);
    }

    /// The index's layout now, if it has an entry to read it from (see [`IndexLayout`]).
    pub fn index_layout(&self) -> Option<IndexLayout> {
        self.keys.index_layout()
    }

    /// The index's layout when it has moved since the last call (a table that grew), for
    /// the partition to publish as its prefetch hint.
    pub fn take_moved_index_layout(&mut self) -> Option<IndexLayout> {
        self.keys.take_moved_layout()
    }

    /// STAT `reset`: every counter back to zero, as memcached resets them; gauges (items,
    /// bytes, the index) and the per-prefix counters' switch stay.
    pub fn reset_stats(&mut self) {
        let s = &mut self.keys.stats;
        *s = StoreStats {
            bytes: s.bytes,
            large_items: s.large_items,
            large_bytes: s.large_bytes,
            classes: s.classes.map(|c| ClassStats {
                number: c.number,
                requested_bytes: c.requested_bytes,
                ..ClassStats::default()
            }),
            ..StoreStats::default()
        };
        self.detail.clear();
    }

    /// STAT `sizes`: linked items by size (key plus value bytes), in 32-byte buckets labelled
    /// by their upper bound as memcached labels them. Walks the whole index.
    pub fn sizes(&self) -> std::collections::BTreeMap<u64, u64> {
        let mut buckets = std::collections::BTreeMap::new();
        self.keys.for_each(|loc| {
            let record = self.arena.bytes(loc);
            let bytes = item::key(record).len() as u64 + keys::class_of(record).1;
            *buckets.entry(bytes.div_ceil(32) * 32).or_insert(0) += 1;
        });
        buckets
    }

    /// `lru_crawler metadump`: calls `f` with each live item in index buckets
    /// `from..from + count` (`Keys::for_each_in`: a walk in slices is not a snapshot);
    /// returns the next bucket to visit, or `None` past the last.
    pub fn dump_meta(
        &self,
        from: usize,
        count: usize,
        now: u32,
        mut f: impl FnMut(&[u8], DumpedItem),
    ) -> Option<usize> {
        self.keys.for_each_in(from, count, |loc| {
            let record = self.arena.bytes(loc);
            let meta = item::meta(record);
            if is_expired(meta.expiry, now) {
                return;
            }
            let key = item::key(record);
            let (class, value_bytes) = keys::class_of(record);
            f(
                key,
                DumpedItem {
                    expiry: meta.expiry,
                    accessed: item::accessed(record),
                    cas: meta.cas,
                    flags: meta.flags,
                    fetched: item::bit(record, item::BIT_FETCHED),
                    class,
                    bytes: key.len() as u64 + value_bytes,
                },
            );
        })
    }

    /// Warm restart: calls `f` with the key, meta, recency and value of every live item held
    /// in RAM (inline or in a fixed slot; large values have their own snapshot) in index
    /// buckets `from..from + count`; returns the next bucket, or `None` past the last. A walk
    /// in slices sees every item once only while nothing is stored between the slices.
    pub fn ram_items_in(
        &self,
        (from, count): (usize, usize),
        now: u32,
        mut f: impl FnMut(&[u8], item::Meta, Recency, SlotBytes<'_>),
    ) -> Option<usize> {
        self.keys.for_each_in(from, count, |loc| {
            let record = self.arena.bytes(loc);
            let meta = item::meta(record);
            if is_expired(meta.expiry, now) || matches!(item::value_at(record), ValueAt::Large) {
                return;
            }
            let recency = Recency {
                referenced: item::referenced(record),
                fetched: item::bit(record, item::BIT_FETCHED),
                accessed: item::accessed(record),
            };
            f(item::key(record), meta, recency, self.value_of(loc));
        })
    }

    /// Warm restart: stores an item as a graceful stop wrote it: its flags, absolute expiry,
    /// CAS and recency kept, admitted like any SET (what does not fit evicts the coldest),
    /// with one probe of the index instead of a SET's three (a snapshot holds each key once;
    /// a key already here is replaced all the same).
    pub fn restore_item(
        &mut self,
        key: &[u8],
        value: &[u8],
        meta: Meta,
        recency: Recency,
    ) -> StoreOutcome {
        let meta = Meta {
            cas: if meta.cas == 0 {
                self.new_cas()
            } else {
                meta.cas
            },
            ..meta
        };
        match self.write_item(key, meta, value.len(), |dst| dst.write(value)) {
            Ok(loc) => {
                let record = self.arena.bytes_mut(loc);
                item::set_referenced(record, recency.referenced);
                if recency.fetched {
                    item::set_fetched(record);
                }
                item::set_accessed(record, recency.accessed);
                let (_, len) = keys::class_of(self.arena.bytes(loc));
                self.link(key, loc);
                StoreOutcome::Stored { cas: meta.cas, len }
            }
            Err(outcome) => outcome,
        }
    }

    /// STAT `cachedump`: calls `f` with the key, value length and expiry (a Unix time, 0
    /// never) of every live item of `class` whose key prints on a line (memcached leaves
    /// binary keys out too), until `f` answers false. Walks the whole index.
    pub fn dump_class(
        &self,
        class: ItemClass,
        now: u32,
        mut f: impl FnMut(&[u8], u64, u32) -> bool,
    ) {
        let mut more = true;
        self.keys.for_each(|loc| {
            if !more {
                return;
            }
            let record = self.arena.bytes(loc);
            let (item_class, len) = keys::class_of(record);
            let key = item::key(record);
            let expiry = item::meta(record).expiry;
            if item_class == class
                && !is_expired(expiry, now)
                && key.iter().all(|b| b.is_ascii_graphic() || *b >= 0x80)
            {
                more = f(key, len, expiry);
            }
        });
    }

    pub fn arena(&self) -> &ShardArena {
        &self.arena
    }

    pub fn arena_mut(&mut self) -> &mut ShardArena {
        &mut self.arena
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.len() == 0
    }

    pub fn stats(&self) -> StoreStats {
        let mut stats = self.keys.stats.clone();
        stats.curr_items = self.keys.len() as u64;
        stats.index_bytes = self.keys.allocation_bytes() as u64;
        stats
    }

    pub fn hash(&self, key: &[u8]) -> u64 {
        self.keys.hasher.hash(key)
    }

    fn new_cas(&mut self) -> u64 {
        // Unique across partitions and small, as memcached's one counter is (clients parse
        // CAS tokens into 32 bits): partition p of n issues p+1, p+1+n, p+1+2n, ... so with
        // writes spread over the partitions the values grow by about one per write.
        let (index, count) = (self.config.partition as u64, self.config.partitions as u64);
        assert!(index < count, "partition {index} of {count}");
        let cas = self.next_cas * count + index + 1;
        self.next_cas += 1;
        if cas == CAS_NEVER_ISSUED {
            return self.new_cas();
        }
        cas
    }

    /// Applies a delayed flush whose time has come.
    fn settle_clock(&mut self, now: u32) {
        self.clock = now;
        if self.flush_at.is_some_and(|at| at <= now) {
            self.flush_at = None;
            self.flush_now();
        }
    }

    /// The live record of `key`, dropping it first if it has expired.
    fn live(&mut self, key: &[u8], now: u32) -> Option<HeadLoc> {
        self.settle_clock(now);
        let loc = self.keys.find(&self.arena, key)?;
        if is_expired(item::meta(self.arena.bytes(loc)).expiry, now) {
            self.keys.stats.get_expired += 1;
            let class = keys::class_of(self.arena.bytes(loc)).0;
            self.reclaim_expired(key, class);
            return None;
        }
        Some(loc)
    }

    /// Unlinks and frees `key`'s item.
    fn remove(&mut self, key: &[u8]) -> bool {
        match self.keys.unlink(&self.arena, key) {
            Some(loc) => {
                self.keys.free_item(&mut self.arena, loc);
                true
            }
            None => false,
        }
    }

    /// GET / GAT / TOUCH of a small item: marks it referenced; `touch` sets a new expiry
    /// first. A large item is a miss here: use [`Store::lookup`].
    pub fn get(&mut self, key: &[u8], touch: Option<u32>, now: u32) -> Option<Hit<'_>> {
        match self.lookup(key, touch, now, false) {
            Lookup::Small(hit) => Some(hit),
            Lookup::Large(_) | Lookup::Miss => None,
        }
    }

    /// GET / GAT / TOUCH of any item. A large hit copies its head and, with `lease`, holds its
    /// extents until [`Store::release_lease`] (so a reader can stream them).
    pub fn lookup(&mut self, key: &[u8], touch: Option<u32>, now: u32, lease: bool) -> Lookup<'_> {
        self.lookup_inner(key, touch, now, lease, true)
    }

    /// [`Store::lookup`]; `bump: false` leaves the item's recency, fetched bit and last-access
    /// time as they were (meta `u`).
    fn lookup_inner(
        &mut self,
        key: &[u8],
        touch: Option<u32>,
        now: u32,
        lease: bool,
        bump: bool,
    ) -> Lookup<'_> {
        let found = self.live(key, now);
        self.detail.record(
            key,
            detail::KeyOp::Get {
                hit: found.is_some(),
            },
        );
        let Some(loc) = found else {
            if touch.is_some() {
                self.keys.stats.touch_misses += 1;
            } else {
                self.keys.stats.get_misses += 1;
            }
            return Lookup::Miss;
        };
        self.hit_at(key, loc, touch, now, lease, bump)
    }

    /// The hit on the record at `loc` (live, or just created by a meta get).
    fn hit_at(
        &mut self,
        key: &[u8],
        loc: HeadLoc,
        touch: Option<u32>,
        now: u32,
        lease: bool,
        bump: bool,
    ) -> Lookup<'_> {
        let record = self.arena.bytes_mut(loc);
        if let Some(exptime) = touch {
            item::set_expiry(record, absolute_expiry(exptime, now));
            self.keys.stats.touch_hits += 1;
        } else {
            self.keys.stats.get_hits += 1;
        }
        if bump {
            // Written only when it changes: a record read again and again (by both cores, the
            // partitions being shared) stays a clean line in each core's cache.
            item::mark_fetched(record, now);
        }
        // A read of a value in a fixed slot (or of a large value's head copy) bumps the slot's
        // score (promotion).
        let period = self.promotion_period(now);
        let meta = item::meta(self.arena.bytes(loc));
        let (value, at) = match item::value_at(self.arena.bytes(loc)) {
            ValueAt::Inline => {
                let record = self.arena.bytes(loc);
                let value = item::inline_value(record);
                (SlotBytes::whole(value), (loc, record.len() - value.len()))
            }
            ValueAt::Fixed { slot, len } => {
                if touch.is_none() {
                    self.arena.touch_fixed(slot, period, u64::from(len));
                }
                (self.arena.slot_bytes(slot, len as usize), (slot, 0))
            }
            ValueAt::Large => {
                let large = item::large(self.arena.bytes(loc)).expect("a large record");
                // Only a reader of the value needs the head (TOUCH does not).
                let head_at = large.head.filter(|_| lease).map(|slot| {
                    let len = (large.value_len.min(self.arena.ram_head_bytes())) as usize;
                    (slot, len)
                });
                if let Some((slot, len)) = head_at {
                    self.arena.touch_fixed(slot, period, len as u64);
                }
                let lease = lease.then(|| self.keys.lease(&large.replicas));
                return Lookup::Large(LargeHit {
                    key: key.to_vec(),
                    flags: meta.flags,
                    cas: meta.cas,
                    value_len: large.value_len,
                    checksum: large.checksum,
                    replicas: large.replicas,
                    head_at,
                    head: Vec::new(),
                    lease,
                });
            }
        };
        Lookup::Small(Hit {
            flags: meta.flags,
            cas: meta.cas,
            value,
            at,
        })
    }

    /// Meta get (`mg`): a lookup that also reports and updates the item's meta state, as
    /// memcached 1.6 does. On a miss with `vivify`, an empty item is created with that TTL and
    /// this caller wins the token to fill it. A win is handed out once per item: to the first
    /// reader of a stale item, to the first reader whose `recache` TTL exceeds what the item has
    /// left, or to the creator of a vivified one.
    pub fn meta_get(&mut self, key: &[u8], now: u32, opts: &MetaGet) -> (MetaState, Lookup<'_>) {
        let mut created = None;
        if let Some(ttl) = opts.vivify {
            if self.live(key, now).is_none() {
                let meta = Meta {
                    cas: match opts.vivify_cas {
                        0 => self.new_cas(),
                        cas => cas,
                    },
                    flags: 0,
                    expiry: absolute_expiry(ttl, now),
                };
                if let Ok(loc) = self.write_item(key, meta, 0, |_| {}) {
                    self.link(key, loc);
                    created = Some(loc);
                }
            }
        }
        // An item this request created is answered even when its TTL has already passed
        // (`N-99`: memcached 1.6.45 answers `VA 0 W`, and the next reader misses).
        let Some(loc) = created.or_else(|| self.live(key, now)) else {
            return (
                MetaState::default(),
                self.lookup_inner(key, None, now, false, false),
            );
        };
        let record = self.arena.bytes(loc);
        let meta = item::meta(record);
        let mut state = MetaState {
            found: true,
            fetched: item::bit(record, item::BIT_FETCHED),
            accessed: item::accessed(record),
            stale: item::bit(record, item::BIT_STALE),
            token_sent: item::bit(record, item::BIT_TOKEN_SENT) && created.is_none(),
            created: created.is_some(),
            won: created.is_some(),
            expiry: opts.touch.map_or(meta.expiry, |t| absolute_expiry(t, now)),
            value_withheld: opts.lease && opts.unless_cas == Some(meta.cas),
        };
        if let Some(recache) = opts.recache {
            if !state.token_sent
                && created.is_none()
                && meta.expiry != 0
                && meta.expiry < absolute_expiry(recache, now)
            {
                state.won = true;
            }
        }
        if state.stale && !state.token_sent {
            state.won = true;
        }
        if state.won {
            item::set_bit(self.arena.bytes_mut(loc), item::BIT_TOKEN_SENT, true);
        }
        let lease = opts.lease && !state.value_withheld;
        let hit = match created {
            Some(loc) => self.hit_at(key, loc, opts.touch, now, lease, opts.bump),
            None => self.lookup_inner(key, opts.touch, now, lease, opts.bump),
        };
        (state, hit)
    }

    /// Meta delete (`md`): with `invalidate`, the item stays, marked stale with a new CAS (and
    /// `ttl` if given) so the next reader wins the token to refill it; else it is deleted.
    /// `cas` nonzero must match.
    pub fn meta_delete(
        &mut self,
        key: &[u8],
        cas: u64,
        invalidate: bool,
        ttl: Option<u32>,
        now: u32,
    ) -> DeleteOutcome {
        if !invalidate {
            return self.delete(key, cas, now);
        }
        self.detail.record(key, detail::KeyOp::Delete);
        let Some(loc) = self.live(key, now) else {
            self.keys.stats.delete_misses += 1;
            return DeleteOutcome::NotFound;
        };
        if cas != 0 && item::meta(self.arena.bytes(loc)).cas != cas {
            return DeleteOutcome::Exists;
        }
        let new_cas = self.new_cas();
        let record = self.arena.bytes_mut(loc);
        item::set_bit(record, item::BIT_STALE, true);
        item::set_bit(record, item::BIT_TOKEN_SENT, false);
        item::set_cas(record, new_cas);
        if let Some(ttl) = ttl {
            item::set_expiry(record, absolute_expiry(ttl, now));
        }
        self.keys.stats.delete_hits += 1;
        DeleteOutcome::Deleted
    }

    /// The meta state of a live item, for what `ms`, `md` and `ma` return (TTL left, CAS).
    pub fn meta_of(&mut self, key: &[u8], now: u32) -> Option<Meta> {
        let loc = self.live(key, now)?;
        Some(item::meta(self.arena.bytes(loc)))
    }

    /// `E`: a store that succeeded gives the item the client's CAS `cas` instead of the one
    /// drawn for it (0: keeps the drawn one). Other outcomes pass through.
    pub fn with_client_cas(
        &mut self,
        key: &[u8],
        now: u32,
        outcome: StoreOutcome,
        cas: u64,
    ) -> StoreOutcome {
        match outcome {
            StoreOutcome::Stored { len, .. } if cas != 0 => {
                self.meta_mark(key, now, Some(cas), false, false);
                StoreOutcome::Stored { cas, len }
            }
            outcome => outcome,
        }
    }

    /// Meta set's extras on a stored item: an explicit CAS (`E`), the stale mark (`I`, a
    /// compare-and-swap that lost to a newer CAS) and the recache token already handed out
    /// (carried over from the item it replaced).
    pub fn meta_mark(
        &mut self,
        key: &[u8],
        now: u32,
        cas: Option<u64>,
        stale: bool,
        token_sent: bool,
    ) {
        if let Some(loc) = self.live(key, now) {
            let record = self.arena.bytes_mut(loc);
            if let Some(cas) = cas {
                item::set_cas(record, cas);
            }
            if stale {
                item::set_bit(record, item::BIT_STALE, true);
            }
            if token_sent {
                item::set_bit(record, item::BIT_TOKEN_SENT, true);
            }
        }
    }

    /// Whether a live item's recache token was handed out (meta `Z`).
    pub fn token_sent(&mut self, key: &[u8], now: u32) -> bool {
        self.live(key, now)
            .is_some_and(|loc| item::bit(self.arena.bytes(loc), item::BIT_TOKEN_SENT))
    }

    /// A meta TTL update (`ma T`) on a live item.
    pub fn set_ttl(&mut self, key: &[u8], ttl: u32, now: u32) {
        if let Some(loc) = self.live(key, now) {
            item::set_expiry(self.arena.bytes_mut(loc), absolute_expiry(ttl, now));
        }
    }

    /// Where `key`'s value (or head copy) sits in a fixed slot: the slot, its block's rank
    /// (0: local), the NUMA node the kernel reports for its page, and its score now.
    pub fn locate(&self, key: &[u8], now: u32) -> Result<String, String> {
        let loc = self
            .keys
            .find(&self.arena, key)
            .ok_or_else(|| "no such key".to_string())?;
        let record = self.arena.bytes(loc);
        let slot = match item::value_at(record) {
            ValueAt::Fixed { slot, .. } => slot,
            ValueAt::Large => item::large(record)
                .and_then(|l| l.head)
                .ok_or_else(|| "a large value without a head copy in RAM".to_string())?,
            ValueAt::Inline => return Err("a small value, packed with its record".into()),
        };
        let node = self
            .arena
            .slot_node(slot)
            .map_err(|e| format!("move_pages: {e}"))?;
        let rank = self.arena.fixed_rank(slot.block).unwrap_or(usize::MAX);
        let period = self.promotion_period(now);
        Ok(format!(
            "slot {slot} rank {rank} node {node} score {}",
            self.arena.heat_of(slot, period)
        ))
    }

    /// The score decay period `now` (seconds) falls in.
    fn promotion_period(&self, now: u32) -> u32 {
        now / self.config.promotion_half_life_seconds.max(1)
    }

    /// One promotion pass (`arena/promote.rs`) of at most `budget` block exchanges; every
    /// record whose fixed slot moved is pointed at its new slot before this returns.
    pub fn promote(&mut self, budget: usize, now: u32) -> crate::arena::PromotionReport {
        let period = self.promotion_period(now);
        let report = self.arena.promote(period, budget);
        for m in &report.moves {
            item::move_slot(self.arena.bytes_mut(m.owner), m.from, m.to);
        }
        report
    }

    /// The first `len` logical bytes of a fixed slot (a large value's head copy, to copy out).
    pub fn fixed_bytes(&self, slot: HeadLoc, len: usize) -> SlotBytes<'_> {
        self.arena.slot_bytes(slot, len)
    }

    /// Pins the `len` value bytes a hit found at `at` for a zero-copy send: until the pin is
    /// handed back to [`Store::unpin_sent`], an overwrite, delete, eviction or compaction
    /// leaves those bytes alone (a free of them waits for the unpin).
    pub fn pin_for_send(&mut self, at: (HeadLoc, usize), len: usize) -> SendPin {
        self.arena.pin_for_send(at.0, at.1, len)
    }

    pub fn unpin_sent(&mut self, pin: SendPin) {
        self.arena.unpin_sent(pin);
    }

    /// Links a freshly written item, unless it was a REPLACE or CAS whose target admission
    /// evicted meanwhile: then the new item is freed and the answer is "not found".
    fn link_checked(
        &mut self,
        key: &[u8],
        loc: HeadLoc,
        mode: StoreMode,
        cas: u64,
        new_cas: u64,
    ) -> StoreOutcome {
        let still_there = self.keys.find(&self.arena, key).is_some();
        if !still_there && (cas != 0 || matches!(mode, StoreMode::Replace)) {
            self.keys.free_unlinked(&mut self.arena, loc);
            return StoreOutcome::NotFound;
        }
        let (_, len) = keys::class_of(self.arena.bytes(loc));
        self.link(key, loc);
        StoreOutcome::Stored { cas: new_cas, len }
    }

    fn placement(&self, key_len: usize, value_len: u64) -> Result<Placement, StoreOutcome> {
        let ram_head = self.arena.ram_head_bytes();
        if value_len > self.config.max_item_bytes {
            return Err(StoreOutcome::TooLarge);
        }
        if value_len > ram_head {
            return Err(StoreOutcome::TooLarge);
        }
        let inline = item::record_len(key_len, Some(value_len as usize));
        if value_len < ram_head && inline <= self.arena.small_max_payload() as usize {
            Ok(Placement::Inline)
        } else {
            Ok(Placement::Fixed)
        }
    }

    /// Notes a small-path value refused for being over `ram_head` (an APPEND or PREPEND that
    /// would outgrow it: values in segments are written once, never appended to), logging
    /// the reason once.
    fn refuse_large(&mut self, value_len: u64) {
        if value_len <= self.arena.ram_head_bytes() || value_len > self.config.max_item_bytes {
            return;
        }
        self.keys.stats.large_refusals += 1;
        if !self.large_refusal_logged {
            self.large_refusal_logged = true;
            tracing::warn!(
                value_len,
                ram_head = self.arena.ram_head_bytes(),
                "refusing an APPEND/PREPEND whose result outgrows --ram-head: values in segments \
                 are written whole, never appended to (logged once per shard)"
            );
        }
    }

    /// Reserves room and writes a new item; the caller links it. `value` is written by
    /// `fill` into the value bytes (so APPEND can assemble it in place).
    fn write_item(
        &mut self,
        key: &[u8],
        meta: Meta,
        value_len: usize,
        fill: impl FnOnce(&mut SlotWriter),
    ) -> Result<HeadLoc, StoreOutcome> {
        let placement = self.placement(key.len(), value_len as u64)?;
        let slot = match placement {
            Placement::Inline => None,
            Placement::Fixed => Some(self.admit(None)?),
        };
        let record_len = item::record_len(key.len(), slot.is_none().then_some(value_len));
        let record = match self.admit(Some(record_len as u32)) {
            Ok(record) => record,
            Err(outcome) => {
                if let Some(slot) = slot {
                    self.arena.abort(slot);
                }
                return Err(outcome);
            }
        };
        let value_at = match &slot {
            None => ValueAt::Inline,
            Some(slot) => ValueAt::Fixed {
                slot: slot.loc(),
                len: value_len as u32,
            },
        };
        let bytes = self.arena.reserved_mut(&record);
        let at = item::write_header(bytes, meta, key, value_at);
        item::set_accessed(bytes, self.clock);
        let mut writer = match &slot {
            None => SlotWriter::whole(&mut bytes[at..at + value_len]),
            Some(slot) => self.arena.reserved_slot_writer(slot, value_len),
        };
        fill(&mut writer);
        assert_eq!(writer.written(), value_len, "a value filled short");
        let slot = slot.map(|slot| self.arena.publish(slot));
        let record = self.arena.publish(record);
        if let Some(slot) = slot {
            self.arena.link_fixed_owner(slot, record);
        }
        Ok(record)
    }

    /// Admission of a record (`Some(len)`) or a fixed slot (`None`): compaction first, then
    /// eviction of CLOCK victims (with evictions off, of expired items only).
    fn admit(&mut self, record_len: Option<u32>) -> Result<Reserved, StoreOutcome> {
        self.keys.now = self.clock;
        let result = match record_len {
            Some(len) => self.arena.admit_small(len, &mut self.keys),
            None => self.arena.admit_fixed(&mut self.keys),
        };
        result.map_err(|err| match err {
            AllocError::TooLarge { .. } => StoreOutcome::TooLarge,
            AllocError::OutOfMemory { class } => {
                self.keys.stats.out_of_memory += 1;
                tracing::debug!(?class, "admission failed: nothing left to evict");
                StoreOutcome::OutOfMemory
            }
        })
    }

    /// Links a freshly written item under `key`, replacing (and freeing) any old one.
    fn link(&mut self, key: &[u8], loc: HeadLoc) {
        self.keys.count_linked(&self.arena, loc);
        // memcached counts every successful store, new key or not.
        self.keys.stats.total_items += 1;
        if let Some(old) = self.keys.replace(&mut self.arena, key, loc) {
            self.keys.free_item(&mut self.arena, old);
        }
    }

    /// SET, ADD, REPLACE, APPEND, PREPEND, with memcached's CAS and existence rules.
    #[allow(clippy::too_many_arguments)]
    pub fn store(
        &mut self,
        mode: StoreMode,
        key: &[u8],
        value: &[u8],
        flags: u32,
        exptime: u32,
        cas: u64,
        now: u32,
    ) -> StoreOutcome {
        self.keys.stats.cmd_set += 1;
        self.detail.record(key, detail::KeyOp::Set);
        let existing = self
            .live(key, now)
            .map(|loc| item::meta(self.arena.bytes(loc)));
        // memcached: any SET/ADD/REPLACE carrying a CAS is a compare-and-swap.
        let concat = matches!(mode, StoreMode::Append | StoreMode::Prepend);
        if cas != 0 {
            match existing {
                None => {
                    self.keys.stats.cas_misses += 1;
                    return if concat {
                        StoreOutcome::NotStored
                    } else {
                        StoreOutcome::NotFound
                    };
                }
                Some(old) if old.cas != cas => {
                    self.keys.stats.cas_badval += 1;
                    return StoreOutcome::Exists;
                }
                Some(_) => self.keys.stats.cas_hits += 1,
            }
        } else {
            match (mode, existing) {
                (StoreMode::Add, Some(_)) => return StoreOutcome::Exists,
                (StoreMode::Replace, None) => return StoreOutcome::NotFound,
                (StoreMode::Append | StoreMode::Prepend, None) => return StoreOutcome::NotStored,
                _ => {}
            }
        }
        let new_cas = self.new_cas();
        let outcome = if concat {
            self.concat(mode, key, value, new_cas)
        } else {
            let meta = Meta {
                cas: new_cas,
                flags,
                expiry: absolute_expiry(exptime, now),
            };
            self.write_item(key, meta, value.len(), |dst| dst.write(value))
        };
        match outcome {
            Ok(loc) => self.link_checked(key, loc, mode, cas, new_cas),
            Err(outcome) => {
                if matches!(outcome, StoreOutcome::TooLarge) {
                    self.keys.stats.too_large += 1;
                    self.refuse_large(value.len() as u64);
                }
                if concat && matches!(outcome, StoreOutcome::TooLarge | StoreOutcome::OutOfMemory) {
                    return StoreOutcome::NotStored;
                }
                outcome
            }
        }
    }

    /// APPEND/PREPEND: a new item holding old and new bytes, keeping flags and expiry.
    fn concat(
        &mut self,
        mode: StoreMode,
        key: &[u8],
        data: &[u8],
        cas: u64,
    ) -> Result<HeadLoc, StoreOutcome> {
        let loc = self
            .keys
            .find(&self.arena, key)
            .ok_or(StoreOutcome::NotStored)?;
        if item::value_at(self.arena.bytes(loc)) == ValueAt::Large {
            // Appending to a value in a segment would mean rewriting it whole: not supported.
            return Err(StoreOutcome::NotStored);
        }
        let old = self.value_of(loc).to_vec();
        let meta = item::meta(self.arena.bytes(loc));
        let len = old.len() + data.len();
        let (first, second) = match mode {
            StoreMode::Append => (&old[..], data),
            _ => (data, &old[..]),
        };
        self.write_item(key, Meta { cas, ..meta }, len, |dst| {
            dst.write(first);
            dst.write(second);
        })
    }

    /// A small item's value (empty for a large one, whose bytes are not in RAM).
    fn value_of(&self, loc: HeadLoc) -> SlotBytes<'_> {
        let record = self.arena.bytes(loc);
        match item::value_at(record) {
            ValueAt::Inline => SlotBytes::whole(item::inline_value(record)),
            ValueAt::Fixed { slot, len } => self.arena.slot_bytes(slot, len as usize),
            ValueAt::Large => SlotBytes::default(),
        }
    }

    /// A value over `--max-item-size`: refused before its bytes are read; a SET also drops the
    /// old value.
    pub fn refuse_too_large(&mut self, key: &[u8], drop_existing: bool) {
        self.keys.stats.cmd_set += 1;
        self.detail.record(key, detail::KeyOp::Set);
        self.keys.stats.too_large += 1;
        if drop_existing {
            self.drop_stale(key);
        }
    }

    /// Drops `key`'s item because a store meant to replace it was refused for want of room
    /// (`Command::Store`'s `drop_on_failure`): no reader is served the value the writer was
    /// told it replaced. A large value's extents go back when its last reader is done.
    /// Returns whether there was an item.
    pub fn drop_stale(&mut self, key: &[u8]) -> bool {
        self.remove(key)
    }

    pub fn delete(&mut self, key: &[u8], cas: u64, now: u32) -> DeleteOutcome {
        self.detail.record(key, detail::KeyOp::Delete);
        let Some(loc) = self.live(key, now) else {
            self.keys.stats.delete_misses += 1;
            return DeleteOutcome::NotFound;
        };
        if cas != 0 && item::meta(self.arena.bytes(loc)).cas != cas {
            return DeleteOutcome::Exists;
        }
        self.remove(key);
        self.keys.stats.delete_hits += 1;
        DeleteOutcome::Deleted
    }

    /// INCR/DECR: a decimal counter; incr wraps at 2^64, decr stops at 0. A missing key is
    /// created with `initial` unless `exptime` is 0xffffffff.
    #[allow(clippy::too_many_arguments)]
    pub fn arith(
        &mut self,
        incr: bool,
        key: &[u8],
        delta: u64,
        initial: u64,
        exptime: u32,
        cas: u64,
        now: u32,
    ) -> ArithOutcome {
        let Some(loc) = self.live(key, now) else {
            if incr {
                self.keys.stats.incr_misses += 1;
            } else {
                self.keys.stats.decr_misses += 1;
            }
            if exptime == ARITH_NO_CREATE {
                return ArithOutcome::NotFound;
            }
            let new_cas = self.new_cas();
            let text = initial.to_string();
            let meta = Meta {
                cas: new_cas,
                flags: 0,
                expiry: absolute_expiry(exptime, now),
            };
            return match self.write_item(key, meta, text.len(), |dst| dst.write(text.as_bytes())) {
                Ok(loc) => {
                    self.link(key, loc);
                    ArithOutcome::Value {
                        value: initial,
                        cas: new_cas,
                    }
                }
                Err(_) => ArithOutcome::OutOfMemory,
            };
        };
        let meta = item::meta(self.arena.bytes(loc));
        if cas != 0 && cas != meta.cas {
            return ArithOutcome::Exists;
        }
        let Some(current) = parse_counter(&self.value_of(loc).contiguous()) else {
            return ArithOutcome::NonNumeric;
        };
        let value = if incr {
            current.wrapping_add(delta)
        } else {
            current.saturating_sub(delta)
        };
        if incr {
            self.keys.stats.incr_hits += 1;
        } else {
            self.keys.stats.decr_hits += 1;
        }
        let new_cas = self.new_cas();
        let mut text = value.to_string().into_bytes();
        // memcached rewrites a counter in place when the new number is no longer, padding it
        // with spaces to the old length; clients see the same bytes here.
        let old_len = self.value_of(loc).len();
        if text.len() < old_len {
            text.resize(old_len, b' ');
        }
        match self.write_item(
            key,
            Meta {
                cas: new_cas,
                ..meta
            },
            text.len(),
            |dst| dst.write(&text),
        ) {
            Ok(loc) => {
                self.link(key, loc);
                ArithOutcome::Value {
                    value,
                    cas: new_cas,
                }
            }
            Err(_) => ArithOutcome::OutOfMemory,
        }
    }

    /// `flush_all`: now, or every item stored before `now + delay` dies at that time (the
    /// connection counts the command: one FLUSH reaches every shard).
    pub fn flush(&mut self, delay: u32, now: u32) {
        if delay == 0 {
            self.flush_at = None;
            self.flush_now();
        } else {
            self.flush_at = Some(absolute_expiry(delay, now));
        }
    }

    fn flush_now(&mut self) {
        for loc in self.keys.drain() {
            self.keys.free_item(&mut self.arena, loc);
        }
    }

    /// Reclaims up to `budget` expired items with a hand that walks the records; returns how
    /// many were reclaimed.
    pub fn sweep_expired(&mut self, budget: usize, now: u32) -> usize {
        self.settle_clock(now);
        let mut reclaimed = 0;
        for _ in 0..budget {
            let Some(loc) = self.keys.sweep_hand.next(&self.arena) else {
                break;
            };
            let record = self.arena.bytes(loc);
            if !is_expired(item::meta(record).expiry, now) {
                continue;
            }
            let key = item::key(record).to_vec();
            if self.keys.find(&self.arena, &key) == Some(loc) {
                let class = keys::class_of(self.arena.bytes(loc)).0;
                self.reclaim_expired(&key, class);
                reclaimed += 1;
            }
        }
        reclaimed
    }

    /// `lru_crawler crawl`: reclaims the expired items of the classes `wanted` accepts among
    /// index buckets `from..from + count`; returns the next bucket, or `None` past the last.
    pub fn reclaim_expired_in(
        &mut self,
        from: usize,
        count: usize,
        now: u32,
        wanted: impl Fn(ItemClass) -> bool,
    ) -> Option<usize> {
        self.settle_clock(now);
        let mut expired = Vec::new();
        let next = self.keys.for_each_in(from, count, |loc| {
            let record = self.arena.bytes(loc);
            if !is_expired(item::meta(record).expiry, now) {
                return;
            }
            let class = keys::class_of(record).0;
            if wanted(class) {
                expired.push((item::key(record).to_vec(), class));
            }
        });
        for (key, class) in expired {
            self.reclaim_expired(&key, class);
        }
        next
    }

    /// Removes `key`, found expired, and counts it (STAT `reclaimed`, `items:N:reclaimed`).
    fn reclaim_expired(&mut self, key: &[u8], class: ItemClass) {
        self.remove(key);
        self.keys.stats.expired_reclaimed += 1;
        self.keys.stats.class_mut(class).reclaimed += 1;
    }

    /// Checks that every index entry resolves to a record holding its own key (tests).
    pub fn check_invariants(&self) {
        self.arena.check_invariants();
        self.keys.check(&self.arena);
    }

    /// A live item's class (1 small, 2 fixed head, 3 large) and value bytes, changing nothing
    /// (`watch deletions` says what a delete removed).
    pub fn value_size(&self, key: &[u8], now: u32) -> Option<(u8, u64)> {
        let loc = self.keys.find(&self.arena, key)?;
        let record = self.arena.bytes(loc);
        if is_expired(item::meta(record).expiry, now) {
            return None;
        }
        let (class, bytes) = keys::class_of(record);
        Some((class as u8, bytes))
    }

    /// Turns on (or off) the log of what eviction removes (`watch evictions`); while on, each
    /// eviction is kept for [`Store::take_evicted`].
    pub fn log_evictions(&mut self, on: bool) {
        self.keys.evicted_log = on.then(Vec::new);
    }

    /// What eviction removed since the log was turned on or last taken.
    pub fn take_evicted(&mut self) -> Vec<Evicted> {
        self.keys
            .evicted_log
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// The class a live key's value uses (tests and stats).
    pub fn value_class(&self, key: &[u8]) -> Option<HeadClass> {
        let loc = self.keys.find(&self.arena, key)?;
        match item::value_at(self.arena.bytes(loc)) {
            ValueAt::Inline => Some(HeadClass::Small),
            ValueAt::Fixed { .. } => Some(HeadClass::Fixed),
            ValueAt::Large => None,
        }
    }
}

#[cfg(test)]
mod counter_tests {
    use super::parse_counter;

    #[test]
    fn counters_read_as_memcached_reads_them() {
        assert_eq!(parse_counter(b"84"), Some(84));
        assert_eq!(parse_counter(b"84   "), Some(84));
        assert_eq!(parse_counter(b"84 abc"), Some(84));
        assert_eq!(parse_counter(b" +7"), Some(7));
        assert_eq!(parse_counter(b"-0"), Some(0));
        assert_eq!(parse_counter(b"18446744073709551615"), Some(u64::MAX));
        assert_eq!(parse_counter(b"18446744073709551616"), None);
        assert_eq!(parse_counter(b"-5"), None);
        assert_eq!(parse_counter(b"84abc"), None);
        assert_eq!(parse_counter(b""), None);
        assert_eq!(parse_counter(b"abc"), None);
        assert_eq!(parse_counter(b"   "), None);
    }
}

/// `--evictions off` (memcached's `-M`): admission takes room only from what loses no live
/// item, and a store is refused only when none is left.
#[cfg(test)]
mod evictions_off_tests {
    use std::sync::Arc;

    use super::*;
    use crate::arena::{Arena, ArenaConfig, MemoryPlan, NumaMode, UnlockedMapper};

    const BLOCK_BYTES: u64 = 64 << 10;
    const NOW: u32 = 1_000_000;

    /// One partition's store over `blocks` blocks of 64 KiB (shared mode, 8 KiB heads).
    fn store(blocks: u64, evictions: bool) -> Store {
        let topology =
            crate::topology::Topology::synthetic(&[1], vec![vec![10]], BLOCK_BYTES).unwrap();
        let config = ArenaConfig {
            numa: NumaMode::Explicit(0),
            memory_bytes: blocks * BLOCK_BYTES,
            sub_memory_bytes: 0,
            small_memory_bytes: None,
            small_sub_memory_bytes: 0,
            block_bytes: BLOCK_BYTES,
            ram_head_bytes: 8192,
            small_min_alloc_bytes: 16,
            io_chunk_bytes: 4096,
            stream_bytes: 0,
            perverse: false,
        };
        let arena: Arc<Arena> =
            Arena::map(MemoryPlan::new(&config, &topology), &UnlockedMapper, 1).expect("map");
        let config = StoreConfig {
            max_item_bytes: 1 << 20,
            partition: 0,
            partitions: 1,
            promotion_half_life_seconds: 10,
            evictions,
        };
        Store::new(arena.shard(0), KeyHasher::with_seed(7), config)
    }

    fn key(i: usize) -> Vec<u8> {
        format!("key:{i}").into_bytes()
    }

    /// Item `i`'s value: mostly small (packed with its record), every fifth a fixed head.
    fn value(i: usize) -> Vec<u8> {
        let len = if i % 5 == 4 {
            8192
        } else {
            40 + (i * 37) % 700
        };
        (0..len).map(|at| (i * 31 + at) as u8).collect()
    }

    fn set(store: &mut Store, i: usize, exptime: u32, now: u32) -> StoreOutcome {
        store.store(StoreMode::Set, &key(i), &value(i), 0, exptime, 0, now)
    }

    fn holds(store: &mut Store, i: usize) -> bool {
        store
            .get(&key(i), None, NOW)
            .is_some_and(|hit| hit.value.to_vec() == value(i))
    }

    /// Sets items 0, 1, ... until one is refused; returns its number. Every store before it
    /// must succeed.
    fn fill(store: &mut Store, exptime: u32) -> usize {
        for i in 0..100_000 {
            match set(store, i, exptime, NOW) {
                StoreOutcome::Stored { .. } => store.check_invariants(),
                StoreOutcome::OutOfMemory => return i,
                other => panic!("set {i}: {other:?}"),
            }
        }
        panic!("100,000 items never filled the store");
    }

    #[test]
    fn a_full_store_refuses_and_keeps_every_item() {
        let mut store = store(4, false);
        let refused = fill(&mut store, 0);
        assert!(refused > 50, "refused after {refused} items");
        let stats = store.stats();
        assert_eq!(stats.evictions, 0);
        assert_eq!(stats.out_of_memory, 1);
        assert_eq!(stats.curr_items, refused as u64);
        for i in 0..refused {
            assert!(holds(&mut store, i), "item {i} lost");
        }
        // A refused SET of a key held leaves it as it was (the executor, not the store,
        // drops a stale value as memcached does).
        assert_eq!(
            store.store(StoreMode::Set, &key(0), &value(refused), 0, 0, 0, NOW),
            StoreOutcome::OutOfMemory
        );
        assert!(holds(&mut store, 0));
        store.check_invariants();
    }

    /// Refused only when truly full: the room one delete frees takes the refused item (its
    /// dead bytes are under the compaction gate, so admission compacts them as a last
    /// resort), and an evicting store fills to no fewer items before it first evicts.
    #[test]
    fn a_store_is_refused_only_when_no_room_is_left() {
        let mut off = store(4, false);
        let refused = fill(&mut off, 0);
        let mut on = store(4, true);
        let first_eviction = (0..)
            .find(|&i| {
                assert!(matches!(
                    set(&mut on, i, 0, NOW),
                    StoreOutcome::Stored { .. }
                ));
                on.stats().evictions > 0
            })
            .unwrap();
        assert!(
            refused >= first_eviction,
            "refused at item {refused}, but eviction began only at {first_eviction}"
        );
        // Free as much room as the refused item needs (a small item for a small one, a head
        // for a head), and it fits.
        let like = (0..refused)
            .rev()
            .find(|&i| (i % 5 == 4) == (refused % 5 == 4) && value(i).len() >= value(refused).len())
            .expect("an item as large");
        assert_eq!(off.delete(&key(like), 0, NOW), DeleteOutcome::Deleted);
        assert!(matches!(
            set(&mut off, refused, 0, NOW),
            StoreOutcome::Stored { .. }
        ));
        off.check_invariants();
        assert_eq!(off.stats().evictions, 0);
        for i in (0..=refused).filter(|&i| i != like) {
            assert!(holds(&mut off, i), "item {i} lost");
        }
    }

    /// The few dead bytes one delete leaves (under the compaction gate, which holds compaction
    /// back while eviction can make room) are compacted to take the next store: with nothing
    /// to evict, admission compacts whatever fits before it refuses.
    #[test]
    fn dead_bytes_under_the_gate_are_compacted_before_a_refusal() {
        let mut store = store(2, false);
        let small = |i: usize| vec![i as u8; 300];
        let refused = (0..10_000)
            .find(|&i| {
                let outcome = store.store(StoreMode::Set, &key(i), &small(i), 0, 0, 0, NOW);
                !matches!(outcome, StoreOutcome::Stored { .. })
            })
            .expect("the store fills");
        assert_eq!(store.delete(&key(0), 0, NOW), DeleteOutcome::Deleted);
        let compactions = store.arena().stats().compactions;
        let outcome = store.store(StoreMode::Set, &key(refused), &small(refused), 0, 0, 0, NOW);
        assert!(
            matches!(outcome, StoreOutcome::Stored { .. }),
            "{outcome:?}"
        );
        assert_eq!(store.arena().stats().compactions, compactions + 1);
        store.check_invariants();
        for i in 1..=refused {
            let hit = store.get(&key(i), None, NOW).expect("held");
            assert!(hit.value.to_vec() == small(i), "item {i} changed");
        }
    }

    /// Expired items are not evicted but reclaimed, as memcached's `-M` reclaims them at the
    /// LRU's tail: a full store of expired items takes new ones.
    #[test]
    fn expired_items_make_room() {
        let mut store = store(4, false);
        let refused = fill(&mut store, 10);
        let later = NOW + 11;
        for i in refused..refused + 50 {
            assert!(
                matches!(set(&mut store, i, 0, later), StoreOutcome::Stored { .. }),
                "set {i} after the others expired"
            );
            store.check_invariants();
        }
        let stats = store.stats();
        assert_eq!(stats.evictions, 0);
        assert!(stats.expired_reclaimed > 0);
    }

    /// Items without an expiry are never taken, however many stores are refused (a smaller
    /// one may still fit where a larger one did not).
    #[test]
    fn refused_stores_take_nothing() {
        let mut store = store(3, false);
        let refused = fill(&mut store, 0);
        let mut held: Vec<usize> = (0..refused).collect();
        let mut refusals = 1;
        for i in refused + 1..refused + 400 {
            match set(&mut store, i, 0, NOW) {
                StoreOutcome::Stored { .. } => held.push(i),
                StoreOutcome::OutOfMemory => refusals += 1,
                other => panic!("set {i}: {other:?}"),
            }
            store.check_invariants();
        }
        assert!(refusals > 300, "{refusals} of 400 refused");
        let stats = store.stats();
        assert_eq!(stats.curr_items, held.len() as u64);
        assert_eq!(stats.out_of_memory, refusals);
        assert_eq!(stats.evictions, 0);
        for i in held {
            assert!(holds(&mut store, i), "item {i} lost");
        }
    }
}
