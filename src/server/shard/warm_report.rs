//! What the warm restart brought back and what it did not, by reason: the counts every shard
//! adds to (STAT `warm_restart_*`, `/metrics`), and the one WARN line per reason, with its
//! count and what to do, that the last shard to finish restoring writes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Why an item was not restored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Skip {
    /// A large value whose segment (by its id) is not mounted.
    SegmentMissing,
    /// A large value whose segment is mounted with another size or base.
    SegmentChanged,
    /// A large value whose bytes no longer match its checksum.
    DataChanged,
    /// A large value whose extents another restored value holds.
    ExtentsTaken,
    /// A large value whose record in its snapshot part is damaged.
    RecordDamaged,
    /// A large value the store had no RAM for.
    NotStored,
    /// RAM items in a damaged or unreadable stretch of a RAM part.
    RamDamaged,
    /// RAM items the store refused.
    RamNotStored,
}

impl Skip {
    pub const ALL: [Skip; 8] = [
        Skip::SegmentMissing,
        Skip::SegmentChanged,
        Skip::DataChanged,
        Skip::ExtentsTaken,
        Skip::RecordDamaged,
        Skip::NotStored,
        Skip::RamDamaged,
        Skip::RamNotStored,
    ];

    fn index(self) -> usize {
        Skip::ALL.iter().position(|&s| s == self).expect("listed")
    }

    /// Its STAT name (`/metrics`: `warm_restart_skipped{reason="..."}`).
    pub fn stat_name(self) -> &'static str {
        match self {
            Skip::SegmentMissing => "warm_restart_skipped_segment_missing",
            Skip::SegmentChanged => "warm_restart_skipped_segment_changed",
            Skip::DataChanged => "warm_restart_skipped_data_changed",
            Skip::ExtentsTaken => "warm_restart_skipped_extents_taken",
            Skip::RecordDamaged => "warm_restart_skipped_record_damaged",
            Skip::NotStored => "warm_restart_skipped_not_stored",
            Skip::RamDamaged => "warm_restart_skipped_ram_damaged",
            Skip::RamNotStored => "warm_restart_skipped_ram_not_stored",
        }
    }

    /// The log line for `count` items skipped for this reason; `example` names the segment
    /// or file concerned (the first one seen).
    fn line(self, count: u64, example: &str) -> String {
        let values = if count == 1 { "value" } else { "values" };
        let items = if count == 1 { "item" } else { "items" };
        match self {
            Skip::SegmentMissing => format!(
                "{count} large {values} not restored: their segment {example}; start with it \
                 (--segment) to restore them, at any path"
            ),
            Skip::SegmentChanged => format!(
                "{count} large {values} not restored: their segment {example}; its old \
                 contents are not trusted"
            ),
            Skip::DataChanged => format!(
                "{count} large {values} not restored: their bytes in segment {example} no \
                 longer match their checksums (written behind Headroom's back, or damaged)"
            ),
            Skip::ExtentsTaken => format!(
                "{count} large {values} not restored: their extents in segment {example} \
                 are held by values restored before them (two snapshot parts name them)"
            ),
            Skip::RecordDamaged => format!(
                "{count} large {values} not restored: their records in {example} are damaged"
            ),
            Skip::NotStored => format!(
                "{count} large {values} not restored: no RAM was left for their records \
                 (raise --memory)"
            ),
            Skip::RamDamaged => format!(
                "{count} RAM {items} (or damaged stretches) not restored: {example} is \
                 damaged or unreadable there"
            ),
            Skip::RamNotStored => format!(
                "{count} RAM {items} not restored: the store had no room for them (raise \
                 --memory)"
            ),
        }
    }
}

/// What the warm restart at start brought back: items restored (RAM and large), items or
/// damaged stretches not restored (in all, and by reason, with one example of each), the
/// longest shard's restore in nanoseconds, and the restored items evicted again because they
/// did not all fit.
#[derive(Default)]
pub(crate) struct WarmRestartFigures {
    pub restored: AtomicU64,
    pub dropped: AtomicU64,
    pub restore_ns: AtomicU64,
    pub evicted: AtomicU64,
    skipped: [AtomicU64; Skip::ALL.len()],
    examples: Mutex<[Option<String>; Skip::ALL.len()]>,
}

impl WarmRestartFigures {
    /// Counts `count` items not restored for `why` (also in `dropped`); `example` says which
    /// segment or file, kept if it is the first of its reason.
    pub fn skip(&self, why: Skip, count: u64, example: impl FnOnce() -> String) {
        if count == 0 {
            return;
        }
        self.dropped.fetch_add(count, Ordering::Relaxed);
        self.skipped[why.index()].fetch_add(count, Ordering::Relaxed);
        let mut examples = self.examples.lock().unwrap_or_else(|e| e.into_inner());
        examples[why.index()].get_or_insert_with(example);
    }

    /// How many items were not restored for `why`.
    pub fn skipped(&self, why: Skip) -> u64 {
        self.skipped[why.index()].load(Ordering::Relaxed)
    }

    /// One WARN line per reason that skipped anything (once every shard has restored).
    pub fn log_skips(&self) {
        let examples = self.examples.lock().unwrap_or_else(|e| e.into_inner());
        for why in Skip::ALL {
            let count = self.skipped(why);
            if count > 0 {
                let example = examples[why.index()].as_deref().unwrap_or("?");
                tracing::warn!(
                    reason = why.stat_name(),
                    count,
                    "warm restart: {}",
                    why.line(count, example)
                );
            }
        }
    }
}
