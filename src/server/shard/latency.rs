//! Server-side request latency: one histogram per command kind, per shard.
//!
//! A request's latency runs from its arrival (the kernel's receive timestamp of the read that
//! brought its last byte, on the ring path; that read's completion on the plain path: see
//! `Wire::arrived`) to the moment its reply is handed to the kernel (the send is submitted). Each
//! shard records into its own [`LatencyHistograms`] (in `ShardCtx`): plain `Cell`s, no lock, no
//! atomic, no allocation. STAT's per-shard gathering (`ShardRequest::Stats`) carries a
//! [`LatencySnapshot`] of it; the metrics endpoint merges the shards' snapshots and exposes them
//! as the Prometheus histograms `headroom_request_duration_seconds{command="..."}`.
//!
//! Buckets are fixed and log-spaced in 1-2-5 steps from 1 µs to 10 s ([`BOUNDS_NS`]), plus the
//! overflow bucket (`+Inf`). A bucket counts the requests whose latency is at most its bound and
//! above the previous one, as Prometheus's `le` means.

use std::cell::Cell;

/// Upper bounds of the finite buckets, in nanoseconds: 1, 2, 5 µs ... 1, 2, 5, 10 s.
pub const BOUNDS_NS: [u64; 22] = [
    1_000,
    2_000,
    5_000,
    10_000,
    20_000,
    50_000,
    100_000,
    200_000,
    500_000,
    1_000_000,
    2_000_000,
    5_000_000,
    10_000_000,
    20_000_000,
    50_000_000,
    100_000_000,
    200_000_000,
    500_000_000,
    1_000_000_000,
    2_000_000_000,
    5_000_000_000,
    10_000_000_000,
];

/// Buckets per command kind: every finite bound, then the overflow bucket.
pub const BUCKETS: usize = BOUNDS_NS.len() + 1;

/// What a request was, for its latency row. Every protocol maps onto these (see
/// [`CommandKind::of_opcode`] and [`CommandKind::of_text`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum CommandKind {
    /// Binary GET/GETQ/GETK/GETKQ and GAT/GATQ/GATK/GATKQ; text `get`, `gets`, `gat`,
    /// `gats`.
    Get,
    /// Binary SET/ADD/REPLACE/APPEND/PREPEND (quiet forms too) and SETX; text `set`, `add`,
    /// `replace`, `append`, `prepend`, `cas`.
    Set,
    /// Binary DELETE/DELETEQ; text `delete`.
    Delete,
    /// Binary INCREMENT/DECREMENT (quiet forms too); text `incr`, `decr`.
    IncrDecr,
    /// Binary TOUCH; text `touch`.
    Touch,
    /// Binary FLUSH/FLUSHQ; text `flush_all`.
    Flush,
    /// Binary STAT; text `stats`.
    Stats,
    /// `mg`.
    MetaGet,
    /// `ms`.
    MetaSet,
    /// `md`.
    MetaDelete,
    /// `ma`.
    MetaArith,
    /// Everything else: NOOP, VERSION, QUIT, VERBOSITY, SASL, ADMIN, `mn`, `me`, unknown
    /// opcodes.
    Other,
}

impl CommandKind {
    /// Every kind, in row order.
    pub const ALL: [CommandKind; 12] = [
        CommandKind::Get,
        CommandKind::Set,
        CommandKind::Delete,
        CommandKind::IncrDecr,
        CommandKind::Touch,
        CommandKind::Flush,
        CommandKind::Stats,
        CommandKind::MetaGet,
        CommandKind::MetaSet,
        CommandKind::MetaDelete,
        CommandKind::MetaArith,
        CommandKind::Other,
    ];
    /// How many kinds there are (rows of a histogram set).
    pub const COUNT: usize = CommandKind::ALL.len();

    /// The `command` label value.
    pub const fn label(self) -> &'static str {
        match self {
            CommandKind::Get => "get",
            CommandKind::Set => "set",
            CommandKind::Delete => "delete",
            CommandKind::IncrDecr => "incr_decr",
            CommandKind::Touch => "touch",
            CommandKind::Flush => "flush",
            CommandKind::Stats => "stats",
            CommandKind::MetaGet => "meta_get",
            CommandKind::MetaSet => "meta_set",
            CommandKind::MetaDelete => "meta_delete",
            CommandKind::MetaArith => "meta_arith",
            CommandKind::Other => "other",
        }
    }

    /// The kind of a binary request by its opcode.
    pub fn of_opcode(opcode: u8) -> CommandKind {
        use crate::proto::opcode::*;
        match opcode {
            GET | GETQ | GETK | GETKQ | GAT | GATQ | GATK | GATKQ => CommandKind::Get,
            SET | SETQ | ADD | ADDQ | REPLACE | REPLACEQ | APPEND | APPENDQ | PREPEND
            | PREPENDQ | SETX | SETXQ => CommandKind::Set,
            DELETE | DELETEQ => CommandKind::Delete,
            INCREMENT | INCREMENTQ | DECREMENT | DECREMENTQ => CommandKind::IncrDecr,
            TOUCH => CommandKind::Touch,
            FLUSH | FLUSHQ => CommandKind::Flush,
            STAT => CommandKind::Stats,
            _ => CommandKind::Other,
        }
    }

    /// The kind of a decoded text or meta command.
    pub fn of_text(command: &crate::proto::TextCommand<'_>) -> CommandKind {
        use crate::proto::TextCommand as T;
        match command {
            T::Get { .. } => CommandKind::Get,
            T::Store { store, .. } => CommandKind::of_text_store(store),
            T::Run { command, .. } => match command {
                crate::command::Command::Arith { .. } => CommandKind::IncrDecr,
                crate::command::Command::Delete { .. } => CommandKind::Delete,
                crate::command::Command::Get { .. } => CommandKind::Touch,
                crate::command::Command::Flush { .. } => CommandKind::Flush,
                _ => CommandKind::Other,
            },
            T::Stats { .. } => CommandKind::Stats,
            T::MetaGet { .. } => CommandKind::MetaGet,
            T::MetaDelete { .. } => CommandKind::MetaDelete,
            T::MetaArith { .. } => CommandKind::MetaArith,
            T::RefreshCerts
            | T::Watch { .. }
            | T::MetaDebug { .. }
            | T::LruCrawler(_)
            | T::Shutdown { .. }
            | T::Malformed { .. } => CommandKind::Other,
        }
    }

    /// The kind of a text storage command (also a streamed one, `TextDecoded::LargeStore`):
    /// `ms` or a classic storage line.
    pub fn of_text_store(store: &crate::proto::TextStore<'_>) -> CommandKind {
        if store.meta.is_some() {
            CommandKind::MetaSet
        } else {
            CommandKind::Set
        }
    }
}

/// The bucket a latency of `elapsed_ns` falls in: the first whose bound is at least it, else
/// the overflow bucket.
#[inline]
pub fn bucket_of(elapsed_ns: u64) -> usize {
    BOUNDS_NS.partition_point(|&bound| bound < elapsed_ns)
}

/// One command kind's counts.
struct Row {
    buckets: [Cell<u64>; BUCKETS],
    /// Sum of every recorded latency, in nanoseconds (u128: never wraps in practice).
    sum_ns: Cell<u128>,
}

/// One shard's latency histograms, a row per [`CommandKind`]. Single-threaded: it lives in the
/// shard's `ShardCtx` and only that shard's tasks touch it.
pub struct LatencyHistograms {
    rows: [Row; CommandKind::COUNT],
}

impl Default for LatencyHistograms {
    fn default() -> Self {
        LatencyHistograms::new()
    }
}

impl LatencyHistograms {
    pub fn new() -> LatencyHistograms {
        LatencyHistograms {
            rows: std::array::from_fn(|_| Row {
                buckets: std::array::from_fn(|_| Cell::new(0)),
                sum_ns: Cell::new(0),
            }),
        }
    }

    /// Records `count` requests of `kind` that each took `elapsed_ns` nanoseconds, from their
    /// arrival to their reply being handed to the kernel. No lock, no allocation: a bucket
    /// lookup (a binary search over 22 bounds) and two `Cell` updates.
    ///
    /// How the connection loop (`conn.rs`, `serve_frames`) calls it, once per pass:
    ///
    /// - *arrival*: the `Instant` taken when a read completes (where `info.last_command` is set
    ///   after `wire.read`): every request decoded from the buffer after that read has arrived
    ///   by then (one left incomplete arrives with the read that completes it);
    /// - *counting*: as `conn.process` runs each request, add its kind to a [`BatchCounts`]
    ///   kept in the connection (`counts.add(CommandKind::of_opcode(opcode))` for a binary
    ///   frame, `CommandKind::of_text(&command)` or `of_text_store(&store)` for text and meta);
    /// - *hand-off*: where the pass's last replies are submitted, that is just before the final
    ///   `write_out(.., written, end)` or where they become `pending` (sent with the next
    ///   receive, submitted right after), call
    ///   `ctx.latency.record_batch(&counts.take(), arrived.elapsed().as_nanos() as u64)`.
    ///   Requests behind a streamed or lent value thus include its send; quiet requests that
    ///   send nothing count with the pass they were in.
    ///
    /// `record(kind, elapsed_ns, count)` is the same for one kind at a time.
    #[inline]
    pub fn record(&self, kind: CommandKind, elapsed_ns: u64, count: u64) {
        if count == 0 {
            return;
        }
        let row = &self.rows[kind as usize];
        let bucket = &row.buckets[bucket_of(elapsed_ns)];
        bucket.set(bucket.get().wrapping_add(count));
        row.sum_ns
            .set(row.sum_ns.get() + u128::from(elapsed_ns) * u128::from(count));
    }

    /// Records every kind counted in `batch` with the same latency (one reply batch).
    #[inline]
    pub fn record_batch(&self, batch: &BatchCounts, elapsed_ns: u64) {
        for (kind, &count) in CommandKind::ALL.iter().zip(&batch.counts) {
            self.record(*kind, elapsed_ns, u64::from(count));
        }
    }

    /// A copy of every count, for exposition.
    pub fn snapshot(&self) -> LatencySnapshot {
        LatencySnapshot {
            rows: std::array::from_fn(|kind| {
                let row = &self.rows[kind];
                RowSnapshot {
                    buckets: std::array::from_fn(|b| row.buckets[b].get()),
                    sum_ns: row.sum_ns.get(),
                }
            }),
        }
    }

    /// Every count back to zero (STAT `reset`).
    pub fn reset(&self) {
        for row in &self.rows {
            for bucket in &row.buckets {
                bucket.set(0);
            }
            row.sum_ns.set(0);
        }
    }
}

/// Requests of each kind in one reply batch, counted as they are decoded: plain integers on
/// the stack, handed to [`LatencyHistograms::record_batch`] at the batch's hand-off.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BatchCounts {
    counts: [u32; CommandKind::COUNT],
}

impl BatchCounts {
    #[inline]
    pub fn add(&mut self, kind: CommandKind) {
        let count = &mut self.counts[kind as usize];
        *count = count.saturating_add(1);
    }

    pub fn is_empty(&self) -> bool {
        self.counts.iter().all(|&c| c == 0)
    }

    /// The counts so far, leaving zero behind.
    pub fn take(&mut self) -> BatchCounts {
        std::mem::take(self)
    }
}

/// One kind's histogram, copied out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RowSnapshot {
    /// Per bucket (not cumulative), the last one the overflow.
    pub buckets: [u64; BUCKETS],
    pub sum_ns: u128,
}

impl RowSnapshot {
    /// Requests recorded.
    pub fn count(&self) -> u64 {
        self.buckets.iter().sum()
    }

    /// Their summed latency, in seconds.
    pub fn sum_seconds(&self) -> f64 {
        self.sum_ns as f64 / 1e9
    }
}

/// Every kind's histogram, copied out of one shard (or merged over several).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LatencySnapshot {
    pub rows: [RowSnapshot; CommandKind::COUNT],
}

impl LatencySnapshot {
    pub fn row(&self, kind: CommandKind) -> &RowSnapshot {
        &self.rows[kind as usize]
    }

    /// Adds `other`'s counts (another shard's) to these.
    pub fn merge(&mut self, other: &LatencySnapshot) {
        for (mine, theirs) in self.rows.iter_mut().zip(&other.rows) {
            for (m, t) in mine.buckets.iter_mut().zip(&theirs.buckets) {
                *m = m.wrapping_add(*t);
            }
            mine.sum_ns += theirs.sum_ns;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_one_two_five_from_a_microsecond_to_ten_seconds() {
        assert_eq!(BOUNDS_NS[0], 1_000);
        assert_eq!(*BOUNDS_NS.last().unwrap(), 10_000_000_000);
        for pair in BOUNDS_NS.windows(2) {
            let ratio = pair[1] as f64 / pair[0] as f64;
            assert!(ratio == 2.0 || ratio == 2.5, "{pair:?}");
        }
    }

    #[test]
    fn a_latency_lands_in_the_first_bucket_whose_bound_holds_it() {
        assert_eq!(bucket_of(0), 0);
        assert_eq!(bucket_of(1_000), 0, "le is inclusive");
        assert_eq!(bucket_of(1_001), 1);
        assert_eq!(bucket_of(4_999), 2);
        assert_eq!(bucket_of(1_000_000), 9);
        assert_eq!(bucket_of(10_000_000_000), BUCKETS - 2);
        assert_eq!(bucket_of(10_000_000_001), BUCKETS - 1, "overflow");
        assert_eq!(bucket_of(u64::MAX), BUCKETS - 1);
        // Against a linear scan, at and around every bound.
        for &bound in &BOUNDS_NS {
            for ns in [bound - 1, bound, bound + 1] {
                let linear = BOUNDS_NS
                    .iter()
                    .position(|&b| ns <= b)
                    .unwrap_or(BUCKETS - 1);
                assert_eq!(bucket_of(ns), linear, "{ns}");
            }
        }
    }

    #[test]
    fn record_snapshot_merge_and_reset() {
        let h = LatencyHistograms::new();
        h.record(CommandKind::Get, 3_000, 4);
        h.record(CommandKind::Get, 700, 1);
        h.record(CommandKind::MetaSet, 20_000_000_000, 2);
        h.record(CommandKind::Set, 5, 0);
        let s = h.snapshot();
        let get = s.row(CommandKind::Get);
        assert_eq!(get.count(), 5);
        assert_eq!(get.buckets[0], 1);
        assert_eq!(get.buckets[2], 4);
        assert_eq!(get.sum_ns, 12_700);
        assert_eq!(s.row(CommandKind::MetaSet).buckets[BUCKETS - 1], 2);
        assert_eq!(
            s.row(CommandKind::Set).count(),
            0,
            "a zero count records nothing"
        );

        let mut merged = s.clone();
        merged.merge(&s);
        assert_eq!(merged.row(CommandKind::Get).count(), 10);
        assert_eq!(merged.row(CommandKind::Get).sum_ns, 25_400);
        assert!((merged.row(CommandKind::MetaSet).sum_seconds() - 80.0).abs() < 1e-9);

        h.reset();
        assert_eq!(h.snapshot(), LatencySnapshot::default());
    }

    #[test]
    fn batch_counts_record_every_kind_once() {
        let h = LatencyHistograms::new();
        let mut batch = BatchCounts::default();
        assert!(batch.is_empty());
        for _ in 0..3 {
            batch.add(CommandKind::Get);
        }
        batch.add(CommandKind::Delete);
        let taken = batch.take();
        assert!(batch.is_empty());
        h.record_batch(&taken, 1_500);
        let s = h.snapshot();
        assert_eq!(s.row(CommandKind::Get).buckets[1], 3);
        assert_eq!(s.row(CommandKind::Delete).buckets[1], 1);
        let total: u64 = CommandKind::ALL.iter().map(|k| s.row(*k).count()).sum();
        assert_eq!(total, 4);
    }

    #[test]
    fn labels_are_distinct_and_kinds_in_row_order() {
        let labels: std::collections::HashSet<_> =
            CommandKind::ALL.iter().map(|k| k.label()).collect();
        assert_eq!(labels.len(), CommandKind::COUNT);
        for (i, kind) in CommandKind::ALL.iter().enumerate() {
            assert_eq!(*kind as usize, i);
        }
    }

    #[test]
    fn opcodes_and_text_commands_map_to_their_kinds() {
        use crate::proto::opcode;
        assert_eq!(CommandKind::of_opcode(opcode::GATKQ), CommandKind::Get);
        assert_eq!(CommandKind::of_opcode(opcode::SETXQ), CommandKind::Set);
        assert_eq!(CommandKind::of_opcode(opcode::PREPENDQ), CommandKind::Set);
        assert_eq!(
            CommandKind::of_opcode(opcode::DECREMENT),
            CommandKind::IncrDecr
        );
        assert_eq!(CommandKind::of_opcode(opcode::FLUSHQ), CommandKind::Flush);
        assert_eq!(CommandKind::of_opcode(opcode::STAT), CommandKind::Stats);
        assert_eq!(CommandKind::of_opcode(opcode::NOOP), CommandKind::Other);
        assert_eq!(CommandKind::of_opcode(0xff), CommandKind::Other);
        let kind = |line: &[u8]| match crate::proto::decode_text(line, 1 << 20, 1 << 20) {
            crate::proto::TextDecoded::Command { command, .. } => CommandKind::of_text(&command),
            other => panic!("{:?}: {other:?}", String::from_utf8_lossy(line)),
        };
        assert_eq!(kind(b"get a b\r\n"), CommandKind::Get);
        assert_eq!(kind(b"set a 0 0 1\r\nx\r\n"), CommandKind::Set);
        assert_eq!(kind(b"ms a 1\r\nx\r\n"), CommandKind::MetaSet);
        assert_eq!(kind(b"mg a v\r\n"), CommandKind::MetaGet);
        assert_eq!(kind(b"md a\r\n"), CommandKind::MetaDelete);
        assert_eq!(kind(b"ma a\r\n"), CommandKind::MetaArith);
        assert_eq!(kind(b"incr a 1\r\n"), CommandKind::IncrDecr);
        assert_eq!(kind(b"touch a 1\r\n"), CommandKind::Touch);
        assert_eq!(kind(b"flush_all\r\n"), CommandKind::Flush);
        assert_eq!(kind(b"stats\r\n"), CommandKind::Stats);
        assert_eq!(kind(b"mn\r\n"), CommandKind::Other);
    }
}
