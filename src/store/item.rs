//! The item record: what the store keeps in the arena for every key.
//!
//! A record is a packed small object (`arena::bump`) laid out as
//!
//! ```text
//! 0   cas      u64 LE
//! 8   flags    u32 LE
//! 12  expiry   u32 LE   absolute Unix seconds, 0 = never
//! 16  key_len  u8
//! 17  bits     u8       0x01 referenced (CLOCK), 0x02 value in a fixed head slot, 0x04 large,
//!                       0x08 fetched since stored, 0x10 stale (meta invalidate), 0x20 a
//!                       recache token was sent (meta win)
//! 18  accessed u32 LE   Unix seconds of the last store or fetch (meta `l`)
//! 22  key      key_len bytes
//! ..  value    inline: the rest of the record
//!              fixed:  slot block u32 LE, slot offset u32 LE, value_len u32 LE
//!              large:  value_len u64 LE, head slot block u32 LE (u32::MAX: no head copy),
//!                      head slot offset u32 LE, CRC32C of the value u32 LE, replica count
//!                      u8, then per replica: target u32 LE, extent offset u64 LE, extent
//!                      length u64 LE
//! ```
//!
//! So an index entry is only the record's 8-byte `HeadLoc`, and compaction can find the entry of a
//! moved record from the key inside it.

use crate::arena::{BlockId, HeadLoc};
use crate::placement::TargetId;
use crate::segment::Extent;

pub const RECORD_HEADER_BYTES: usize = 22;
const FIXED_TAIL_BYTES: usize = 12;
pub const BIT_REFERENCED: u8 = 0x01;
pub const BIT_FIXED: u8 = 0x02;
pub const BIT_LARGE: u8 = 0x04;
/// Read (a GET, a meta get) at least once since it was stored.
pub const BIT_FETCHED: u8 = 0x08;
/// Marked stale by a meta invalidation: served, with its recache token handed out once.
pub const BIT_STALE: u8 = 0x10;
/// A meta get has handed out the token to recache this item.
pub const BIT_TOKEN_SENT: u8 = 0x20;
const NO_HEAD: u32 = u32::MAX;
const REPLICA_BYTES: usize = 20;

/// Metadata of an item, as stored in its record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Meta {
    pub cas: u64,
    pub flags: u32,
    pub expiry: u32,
}

/// Where an item's value lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValueAt {
    /// In the record itself.
    Inline,
    /// In a fixed head slot, its `len` logical bytes (stored rotated: `arena::slot_layout`).
    Fixed { slot: HeadLoc, len: u32 },
    /// Whole in segment extents (one per replica), its first `ram_head` bytes perhaps also
    /// in a fixed head slot.
    Large,
}

/// Where a large value lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LargeValue {
    pub value_len: u64,
    pub head: Option<HeadLoc>,
    /// CRC32C of the whole value, computed as it streamed in (checked on warm restart, and by
    /// every GET as the value streams out: `--verify-reads`).
    pub checksum: u32,
    pub replicas: Vec<(TargetId, Extent)>,
}

/// Bytes of a large item's record.
pub fn large_record_len(key_len: usize, replicas: usize) -> usize {
    RECORD_HEADER_BYTES + key_len + 8 + 8 + 4 + 1 + REPLICA_BYTES * replicas
}

/// Writes a large item's record.
pub fn write_large(record: &mut [u8], meta: Meta, key: &[u8], large: &LargeValue) {
    let at = write_header(record, meta, key, ValueAt::Inline);
    record[17] = BIT_LARGE;
    record[at..at + 8].copy_from_slice(&large.value_len.to_le_bytes());
    let (block, offset) = large.head.map_or((NO_HEAD, 0), |h| (h.block.0, h.offset));
    record[at + 8..at + 12].copy_from_slice(&block.to_le_bytes());
    record[at + 12..at + 16].copy_from_slice(&offset.to_le_bytes());
    record[at + 16..at + 20].copy_from_slice(&large.checksum.to_le_bytes());
    record[at + 20] = large.replicas.len() as u8;
    for (i, (target, extent)) in large.replicas.iter().enumerate() {
        let r = at + 21 + i * REPLICA_BYTES;
        record[r..r + 4].copy_from_slice(&target.0.to_le_bytes());
        record[r + 4..r + 12].copy_from_slice(&extent.offset.to_le_bytes());
        record[r + 12..r + 20].copy_from_slice(&extent.len.to_le_bytes());
    }
}

/// Points a record's fixed slot (a value's slot, or a large value's head copy) that is at
/// `from` at `to` instead (promotion exchanged the slot's block).
pub fn move_slot(record: &mut [u8], from: HeadLoc, to: HeadLoc) {
    let at = RECORD_HEADER_BYTES + record[16] as usize;
    let field = if record[17] & BIT_FIXED != 0 {
        at
    } else {
        assert!(record[17] & BIT_LARGE != 0, "a record without a fixed slot");
        at + 8
    };
    assert_eq!(
        (u32_at(record, field), u32_at(record, field + 4)),
        (from.block.0, from.offset),
        "the record does not point at the slot that moved"
    );
    record[field..field + 4].copy_from_slice(&to.block.0.to_le_bytes());
    record[field + 4..field + 8].copy_from_slice(&to.offset.to_le_bytes());
}

/// Forgets a large item's head copy (its slot is being freed); the value still streams whole
/// from its segment.
pub fn clear_large_head(record: &mut [u8]) {
    debug_assert!(record[17] & BIT_LARGE != 0);
    let at = RECORD_HEADER_BYTES + record[16] as usize;
    record[at + 8..at + 12].copy_from_slice(&NO_HEAD.to_le_bytes());
}

/// A large item's placement, if the record is one.
pub fn large(record: &[u8]) -> Option<LargeValue> {
    if record[17] & BIT_LARGE == 0 {
        return None;
    }
    let at = RECORD_HEADER_BYTES + record[16] as usize;
    let u64_at = |i: usize| u64::from_le_bytes(record[i..i + 8].try_into().expect("8 bytes"));
    let block = u32_at(record, at + 8);
    let head = (block != NO_HEAD).then(|| HeadLoc {
        block: BlockId(block),
        offset: u32_at(record, at + 12),
    });
    let replicas = (0..record[at + 20] as usize)
        .map(|i| {
            let r = at + 21 + i * REPLICA_BYTES;
            (
                TargetId(u32_at(record, r)),
                Extent {
                    offset: u64_at(r + 4),
                    len: u64_at(r + 12),
                },
            )
        })
        .collect();
    Some(LargeValue {
        value_len: u64_at(at),
        head,
        checksum: u32_at(record, at + 16),
        replicas,
    })
}

/// Bytes of a record for a key and value placement.
pub fn record_len(key_len: usize, inline_value_len: Option<usize>) -> usize {
    RECORD_HEADER_BYTES + key_len + inline_value_len.unwrap_or(FIXED_TAIL_BYTES)
}

/// Writes a record's header and key; returns the offset where the value (or fixed tail) goes.
pub fn write_header(record: &mut [u8], meta: Meta, key: &[u8], value_at: ValueAt) -> usize {
    record[0..8].copy_from_slice(&meta.cas.to_le_bytes());
    record[8..12].copy_from_slice(&meta.flags.to_le_bytes());
    record[12..16].copy_from_slice(&meta.expiry.to_le_bytes());
    record[16] = key.len() as u8;
    record[18..22].copy_from_slice(&0u32.to_le_bytes());
    let at = RECORD_HEADER_BYTES + key.len();
    record[RECORD_HEADER_BYTES..at].copy_from_slice(key);
    match value_at {
        ValueAt::Inline | ValueAt::Large => record[17] = 0,
        ValueAt::Fixed { slot, len } => {
            record[17] = BIT_FIXED;
            record[at..at + 4].copy_from_slice(&slot.block.0.to_le_bytes());
            record[at + 4..at + 8].copy_from_slice(&slot.offset.to_le_bytes());
            record[at + 8..at + 12].copy_from_slice(&len.to_le_bytes());
        }
    }
    at
}

fn u32_at(record: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(record[at..at + 4].try_into().expect("4 bytes"))
}

/// The record's key. Never panics: a record too short for its key length (which a correct
/// store never writes) gives a truncated key that matches nothing.
pub fn key(record: &[u8]) -> &[u8] {
    let Some(&key_len) = record.get(16) else {
        return &[];
    };
    let end = (RECORD_HEADER_BYTES + key_len as usize).min(record.len());
    record.get(RECORD_HEADER_BYTES..end).unwrap_or(&[])
}

pub fn meta(record: &[u8]) -> Meta {
    Meta {
        cas: u64::from_le_bytes(record[0..8].try_into().expect("8 bytes")),
        flags: u32_at(record, 8),
        expiry: u32_at(record, 12),
    }
}

pub fn value_at(record: &[u8]) -> ValueAt {
    if record[17] & BIT_LARGE != 0 {
        return ValueAt::Large;
    }
    if record[17] & BIT_FIXED == 0 {
        return ValueAt::Inline;
    }
    let at = RECORD_HEADER_BYTES + record[16] as usize;
    ValueAt::Fixed {
        slot: HeadLoc {
            block: BlockId(u32_at(record, at)),
            offset: u32_at(record, at + 4),
        },
        len: u32_at(record, at + 8),
    }
}

/// The inline value (empty for a fixed-slot record).
pub fn inline_value(record: &[u8]) -> &[u8] {
    match value_at(record) {
        ValueAt::Inline => &record[RECORD_HEADER_BYTES + record[16] as usize..],
        ValueAt::Fixed { .. } | ValueAt::Large => &[],
    }
}

pub fn set_expiry(record: &mut [u8], expiry: u32) {
    record[12..16].copy_from_slice(&expiry.to_le_bytes());
}

/// Unix seconds of the record's last store or fetch.
pub fn accessed(record: &[u8]) -> u32 {
    u32_at(record, 18)
}

/// A read: referenced (CLOCK), fetched since stored, accessed `now`; each byte written only if
/// it changes, so a record read many times a second is written at most once a second.
pub fn mark_fetched(record: &mut [u8], now: u32) {
    let bits = record[17] | BIT_REFERENCED | BIT_FETCHED;
    if record[17] != bits {
        record[17] = bits;
    }
    if record[18..22] != now.to_le_bytes() {
        set_accessed(record, now);
    }
}

/// Marks the item fetched since stored (a warm restart carrying the mark over).
pub fn set_fetched(record: &mut [u8]) {
    record[17] |= BIT_FETCHED;
}

pub fn set_accessed(record: &mut [u8], now: u32) {
    record[18..22].copy_from_slice(&now.to_le_bytes());
}

/// Whether one of the meta bits (`BIT_FETCHED`, `BIT_STALE`, `BIT_TOKEN_SENT`) is set.
pub fn bit(record: &[u8], bit: u8) -> bool {
    record[17] & bit != 0
}

pub fn set_bit(record: &mut [u8], bit: u8, on: bool) {
    if on {
        record[17] |= bit;
    } else {
        record[17] &= !bit;
    }
}

pub fn set_cas(record: &mut [u8], cas: u64) {
    record[0..8].copy_from_slice(&cas.to_le_bytes());
}

pub fn referenced(record: &[u8]) -> bool {
    record[17] & BIT_REFERENCED != 0
}

pub fn set_referenced(record: &mut [u8], on: bool) {
    if on {
        record[17] |= BIT_REFERENCED;
    } else {
        record[17] &= !BIT_REFERENCED;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_marks_the_record_once_and_then_leaves_it_alone() {
        let mut record = vec![0u8; RECORD_HEADER_BYTES + 4];
        mark_fetched(&mut record, 1_000);
        assert!(referenced(&record) && bit(&record, BIT_FETCHED));
        assert_eq!(accessed(&record), 1_000);
        let marked = record.clone();
        mark_fetched(&mut record, 1_000);
        assert_eq!(
            record, marked,
            "a second read in the same second changes nothing"
        );
        set_referenced(&mut record, false); // the CLOCK hand passed
        mark_fetched(&mut record, 1_001);
        assert!(referenced(&record));
        assert_eq!(accessed(&record), 1_001);
    }

    #[test]
    fn round_trips_large_records() {
        let meta = Meta {
            cas: 9,
            flags: 1,
            expiry: 0,
        };
        let large = LargeValue {
            checksum: 0xdead_beef,
            value_len: 5 << 30,
            head: Some(HeadLoc {
                block: BlockId(3),
                offset: 1 << 18,
            }),
            replicas: vec![
                (
                    TargetId(1),
                    Extent {
                        offset: 4096,
                        len: 5 << 30,
                    },
                ),
                (
                    TargetId(7),
                    Extent {
                        offset: 0,
                        len: 5 << 30,
                    },
                ),
            ],
        };
        let mut record = vec![0u8; large_record_len(4, 2)];
        write_large(&mut record, meta, b"big!", &large);
        assert_eq!(value_at(&record), ValueAt::Large);
        assert_eq!(super::large(&record), Some(large.clone()));
        assert_eq!(key(&record), b"big!");
        set_referenced(&mut record, true);
        assert_eq!(super::large(&record), Some(large));
        let no_head = LargeValue {
            checksum: 7,
            value_len: 10,
            head: None,
            replicas: vec![],
        };
        let mut record = vec![0u8; large_record_len(1, 0)];
        write_large(&mut record, meta, b"k", &no_head);
        assert_eq!(super::large(&record), Some(no_head));
    }

    #[test]
    fn round_trips_both_placements() {
        let meta = Meta {
            cas: 0x0102_0304_0506_0708,
            flags: 7,
            expiry: 99,
        };
        let mut record = vec![0u8; record_len(3, Some(5))];
        let at = write_header(&mut record, meta, b"key", ValueAt::Inline);
        record[at..].copy_from_slice(b"hello");
        assert_eq!(
            (key(&record), super::meta(&record), inline_value(&record)),
            (&b"key"[..], meta, &b"hello"[..])
        );
        let slot = HeadLoc {
            block: BlockId(4),
            offset: 1 << 18,
        };
        let mut fixed = vec![0u8; record_len(3, None)];
        write_header(
            &mut fixed,
            meta,
            b"abc",
            ValueAt::Fixed { slot, len: 12345 },
        );
        assert_eq!(value_at(&fixed), ValueAt::Fixed { slot, len: 12345 });
        set_referenced(&mut fixed, true);
        assert!(referenced(&fixed));
        assert_eq!(value_at(&fixed), ValueAt::Fixed { slot, len: 12345 });
        set_expiry(&mut fixed, 5);
        assert_eq!(super::meta(&fixed).expiry, 5);
    }
}
