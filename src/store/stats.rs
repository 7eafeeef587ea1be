//! Per-shard store counters, summed by the server for STAT.

/// Where an item's value lives, as STAT `items` and `slabs` number them (memcached's slab
/// class ids start at 1 too).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ItemClass {
    /// Packed with its record in the small-object bump arena.
    Small = 1,
    /// In a fixed head slot of exactly `--ram-head` bytes.
    Fixed = 2,
    /// Whole in a segment (its head maybe copied in a fixed slot).
    Large = 3,
}

impl ItemClass {
    pub const ALL: [ItemClass; 3] = [ItemClass::Small, ItemClass::Fixed, ItemClass::Large];

    pub fn name(self) -> &'static str {
        match self {
            ItemClass::Small => "small",
            ItemClass::Fixed => "fixed",
            ItemClass::Large => "large",
        }
    }

    fn index(self) -> usize {
        self as usize - 1
    }
}

/// One item class's figures.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClassStats {
    /// Items linked now, and the bytes of their keys and values (memcached's `mem_requested`).
    pub number: u64,
    pub requested_bytes: u64,
    /// Items evicted to make room, and expired items reclaimed.
    pub evicted: u64,
    pub reclaimed: u64,
}

impl ClassStats {
    fn add(&mut self, other: &ClassStats) {
        self.number += other.number;
        self.requested_bytes += other.requested_bytes;
        self.evicted += other.evicted;
        self.reclaimed += other.reclaimed;
    }
}

/// Counters of one shard's store; the names are memcached's where memcached has one.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StoreStats {
    pub curr_items: u64,
    pub total_items: u64,
    /// Arena bytes held by items (records and fixed slots).
    pub bytes: u64,
    /// Bytes of the index table itself (the per-item overhead outside the arena).
    pub index_bytes: u64,
    pub cmd_set: u64,
    pub get_hits: u64,
    pub get_misses: u64,
    pub touch_hits: u64,
    pub touch_misses: u64,
    pub delete_hits: u64,
    pub delete_misses: u64,
    pub incr_hits: u64,
    pub incr_misses: u64,
    pub decr_hits: u64,
    pub decr_misses: u64,
    pub cas_hits: u64,
    pub cas_misses: u64,
    pub cas_badval: u64,
    pub evictions: u64,
    pub expired_reclaimed: u64,
    /// Lookups that found their key's item expired (and dropped it), memcached's
    /// `get_expired`.
    pub get_expired: u64,
    /// Records the CLOCK hand passed over because they (or their value's slot) were pinned
    /// for a send in flight: memcached's `lrutail_reflocked` (items at the LRU tail it could
    /// not evict because a reader held them).
    pub lrutail_reflocked: u64,
    pub too_large: u64,
    pub large_refusals: u64,
    pub out_of_memory: u64,
    /// Large items (values in segments) and their bytes.
    pub large_items: u64,
    pub large_bytes: u64,
    /// Head copies of large items given up to make RAM room.
    pub large_heads_dropped: u64,
    /// Large items evicted to make segment room (`--segment-eviction lru`).
    pub large_evictions: u64,
    /// By [`ItemClass`].
    pub classes: [ClassStats; 3],
}

impl StoreStats {
    pub fn add(&mut self, other: &StoreStats) {
        macro_rules! sum {
            ($($field:ident),*) => { $(self.$field += other.$field;)* };
        }
        sum!(
            curr_items,
            total_items,
            bytes,
            index_bytes,
            cmd_set,
            get_hits,
            get_misses,
            touch_hits,
            touch_misses,
            delete_hits,
            delete_misses,
            incr_hits,
            incr_misses,
            decr_hits,
            decr_misses,
            cas_hits,
            cas_misses,
            cas_badval,
            evictions,
            expired_reclaimed,
            get_expired,
            lrutail_reflocked,
            too_large,
            large_refusals,
            out_of_memory,
            large_items,
            large_bytes,
            large_heads_dropped,
            large_evictions
        );
        for (mine, theirs) in self.classes.iter_mut().zip(&other.classes) {
            mine.add(theirs);
        }
    }

    pub fn class(&self, class: ItemClass) -> &ClassStats {
        &self.classes[class.index()]
    }

    pub fn class_mut(&mut self, class: ItemClass) -> &mut ClassStats {
        &mut self.classes[class.index()]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every field is summed across shards (a field left out of `add` reads 0 in STAT).
    #[test]
    fn add_sums_every_field() {
        let mut one = StoreStats {
            classes: [ClassStats {
                number: 1,
                requested_bytes: 1,
                evicted: 1,
                reclaimed: 1,
            }; 3],
            ..StoreStats::default()
        };
        // Set every u64 field to 1 through the Debug listing's names.
        macro_rules! ones {
            ($($f:ident),*) => { $(one.$f = 1;)* };
        }
        ones!(
            curr_items,
            total_items,
            bytes,
            index_bytes,
            cmd_set,
            get_hits,
            get_misses,
            touch_hits,
            touch_misses,
            delete_hits,
            delete_misses,
            incr_hits,
            incr_misses,
            decr_hits,
            decr_misses,
            cas_hits,
            cas_misses,
            cas_badval,
            evictions,
            expired_reclaimed,
            get_expired,
            lrutail_reflocked,
            too_large,
            large_refusals,
            out_of_memory,
            large_items,
            large_bytes,
            large_heads_dropped,
            large_evictions
        );
        let mut sum = one.clone();
        sum.add(&one);
        let text = format!("{sum:?}");
        assert!(
            !text.contains(": 1,") && !text.contains(": 1 }"),
            "a field was not summed: {text}"
        );
    }
}
