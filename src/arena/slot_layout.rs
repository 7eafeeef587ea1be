//! How bytes lie in a fixed slot: rotated by [`SLOT_ROTATION_BYTES`].
//!
//! A slot's logical byte `i` (a value's, or a large value's head copy's) is stored at slot
//! offset `(SLOT_ROTATION_BYTES + i) % slot_bytes`. So a value starts half a page into its
//! page-aligned slot, and one that reaches the slot's end wraps around to its start.
//!
//! Why: the kernel copies a reply into the socket's page fragment after the reply's header
//! (28 bytes for a binary GET). A page-aligned value would put each copied byte 28 bytes ahead
//! of where it was read, modulo a page, and `rep movsb` stalls on 4K aliasing at that short
//! distance (measured when the layout came in: `git show 2415658 -- docs/benchmarks.md`). At
//! half a page the distance is long for any header a protocol writes (at most about 300 bytes).
//!
//! Readers see a value as [`SlotBytes`]: one or two runs in order. Writers fill it through a
//! [`SlotWriter`]. Nothing else reads a fixed slot's bytes.

use std::ops::Range;

/// Where in its slot a value's first byte is stored: half a page.
pub const SLOT_ROTATION_BYTES: usize = 2048;

/// The slot offsets holding logical bytes `0..len` of a `slot_bytes` slot, in order: the run
/// from the rotation point, then the run that wrapped to the slot's start (empty unless the
/// value reaches the slot's end).
pub fn spans(slot_bytes: usize, len: usize) -> [Range<usize>; 2] {
    spans_of(slot_bytes, 0..len)
}

/// The slot offsets holding logical bytes `logical`, in order (as [`spans`]).
pub fn spans_of(slot_bytes: usize, logical: Range<usize>) -> [Range<usize>; 2] {
    assert!(
        logical.start <= logical.end && logical.end <= slot_bytes,
        "bytes {logical:?} do not fit a {slot_bytes}-byte slot"
    );
    let start = SLOT_ROTATION_BYTES % slot_bytes;
    // Logical bytes below `wrap` lie from `start` on; the rest from the slot's start.
    let wrap = slot_bytes - start;
    let first = logical.start.min(wrap)..logical.end.min(wrap);
    let second = logical.start.max(wrap)..logical.end.max(wrap);
    [
        start + first.start..start + first.end,
        second.start - wrap..second.end - wrap,
    ]
}

/// A slot's logical bytes in order: `first`, then `second` (empty unless they wrap).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SlotBytes<'a> {
    pub first: &'a [u8],
    pub second: &'a [u8],
}

impl<'a> SlotBytes<'a> {
    /// Logical bytes `0..len` of `slot` (a whole fixed slot's bytes).
    pub fn of_slot(slot: &'a [u8], len: usize) -> SlotBytes<'a> {
        let [first, second] = spans(slot.len(), len);
        SlotBytes {
            first: &slot[first],
            second: &slot[second],
        }
    }

    /// Bytes that lie in one run.
    pub fn whole(bytes: &'a [u8]) -> SlotBytes<'a> {
        SlotBytes {
            first: bytes,
            second: &[],
        }
    }

    pub fn len(&self) -> usize {
        self.first.len() + self.second.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The runs, in order.
    pub fn parts(&self) -> [&'a [u8]; 2] {
        [self.first, self.second]
    }

    /// The bytes in one slice: borrowed when they lie in one run, else copied.
    pub fn contiguous(&self) -> std::borrow::Cow<'a, [u8]> {
        if self.second.is_empty() {
            std::borrow::Cow::Borrowed(self.first)
        } else {
            std::borrow::Cow::Owned(self.to_vec())
        }
    }

    pub fn to_vec(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.len());
        self.append_to(&mut out);
        out
    }

    /// Appends the bytes, in order, to `out`.
    pub fn append_to(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.first);
        out.extend_from_slice(self.second);
    }
}

impl PartialEq<[u8]> for SlotBytes<'_> {
    fn eq(&self, other: &[u8]) -> bool {
        other.len() == self.len()
            && other[..self.first.len()] == *self.first
            && other[self.first.len()..] == *self.second
    }
}

/// Fills a slot's logical bytes in order, across the wrap.
pub struct SlotWriter<'a> {
    first: &'a mut [u8],
    second: &'a mut [u8],
    written: usize,
}

impl<'a> SlotWriter<'a> {
    /// A writer of logical bytes `0..len` of `slot` (a whole fixed slot's bytes).
    pub fn of_slot(slot: &'a mut [u8], len: usize) -> SlotWriter<'a> {
        let [first, second] = spans(slot.len(), len);
        // The first run lies after the second in the slot (or alone).
        debug_assert!(second.is_empty() || second.end <= first.start);
        let (low, high) = slot.split_at_mut(first.start);
        SlotWriter {
            first: &mut high[..first.len()],
            second: &mut low[second],
            written: 0,
        }
    }

    /// Bytes that lie in one run.
    pub fn whole(bytes: &'a mut [u8]) -> SlotWriter<'a> {
        SlotWriter {
            first: bytes,
            second: &mut [],
            written: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.first.len() + self.second.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends `bytes` after what was written so far.
    pub fn write(&mut self, bytes: &[u8]) {
        let at = self.written;
        assert!(
            at + bytes.len() <= self.len(),
            "writing {} bytes at {at} of {}",
            bytes.len(),
            self.len()
        );
        let first_at = at.min(self.first.len());
        let in_first = bytes.len().min(self.first.len() - first_at);
        self.first[first_at..first_at + in_first].copy_from_slice(&bytes[..in_first]);
        let rest = &bytes[in_first..];
        let second_at = (at + in_first).saturating_sub(self.first.len());
        self.second[second_at..second_at + rest.len()].copy_from_slice(rest);
        self.written += bytes.len();
    }

    /// Bytes written so far.
    pub fn written(&self) -> usize {
        self.written
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every length of a few slot sizes: the runs cover the value once, in the slot, starting
    /// at the rotation point, and what a writer puts in reads back in order.
    #[test]
    fn every_length_reads_back_what_was_written() {
        for slot_bytes in [4096usize, 8192, 3 * 2048] {
            let mut slot = vec![0u8; slot_bytes];
            for len in (0..=slot_bytes)
                .step_by(97)
                .chain([slot_bytes - 2048, slot_bytes])
            {
                let [first, second] = spans(slot_bytes, len);
                assert_eq!(first.len() + second.len(), len);
                assert_eq!(first.start, SLOT_ROTATION_BYTES % slot_bytes);
                assert!(first.end <= slot_bytes);
                assert!(
                    second.is_empty() || second.end <= first.start,
                    "the runs overlap"
                );
                let value: Vec<u8> = (0..len).map(|i| (i * 7 + len) as u8).collect();
                slot.fill(0xEE);
                let mut writer = SlotWriter::of_slot(&mut slot, len);
                // In uneven pieces, so some cross the wrap.
                for piece in value.chunks(1000) {
                    writer.write(piece);
                }
                assert_eq!(writer.written(), len);
                let read = SlotBytes::of_slot(&slot, len);
                assert!(read == value[..], "slot {slot_bytes}, len {len}");
                assert_eq!(read.to_vec(), value);
                // Outside the runs the slot is untouched.
                let used = slot_bytes.min(len);
                let untouched = slot.iter().filter(|&&b| b == 0xEE).count();
                assert!(untouched >= slot_bytes - used);
            }
        }
    }

    /// Any logical range maps to the same slot bytes as the whole value's runs hold for it.
    #[test]
    fn a_logical_range_maps_inside_the_whole_values_runs() {
        let slot_bytes = 8192;
        let place = |i: usize| (SLOT_ROTATION_BYTES + i) % slot_bytes;
        for (from, to) in [
            (0, 0),
            (0, 8192),
            (100, 6144),
            (6143, 6145),
            (6144, 8192),
            (7000, 7001),
        ] {
            let [first, second] = spans_of(slot_bytes, from..to);
            let mapped: Vec<usize> = first.chain(second).collect();
            let expected: Vec<usize> = (from..to).map(place).collect();
            assert_eq!(mapped, expected, "{from}..{to}");
        }
    }

    #[test]
    fn a_value_below_the_wrap_lies_in_one_run_half_a_page_in() {
        let [first, second] = spans(256 << 10, 1000);
        assert_eq!(first, 2048..3048);
        assert!(second.is_empty());
        let [first, second] = spans(256 << 10, 256 << 10);
        assert_eq!(first, 2048..256 << 10);
        assert_eq!(second, 0..2048);
    }

    #[test]
    #[should_panic(expected = "writing 2 bytes at 3 of 4")]
    fn a_writer_refuses_to_overrun() {
        let mut slot = vec![0u8; 4096];
        let mut writer = SlotWriter::of_slot(&mut slot, 4);
        writer.write(b"abc");
        writer.write(b"de");
    }
}
