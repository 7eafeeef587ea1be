//! Per-shard store counters, summed by the server for STAT.

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
    pub cmd_flush: u64,
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
            cmd_flush,
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
            too_large,
            large_refusals,
            out_of_memory
        );
    }
}
