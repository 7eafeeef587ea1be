//! A target's extent allocator: contiguous extents, best fit, O(log n) allocate and free with
//! coalescing, and an exact largest free region.
//!
//! Sizes are rounded up to the granule (the device block: 4 KiB), the only rounding there is:
//! an object above the default 256 KiB `ram_head` wastes under 1.6 % (at most one granule less a
//! byte), and under 0.4 % above 1 MiB. Free space is kept twice, by start (to coalesce
//! neighbours) and by (length, start) (to find the tightest hole), so
//! `largest_free_region()` is exact at every moment: allocating that many bytes succeeds and one
//! granule more fails.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::ops::RangeBounds;

/// A contiguous range of a target, in bytes from the target's start.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Extent {
    pub offset: u64,
    pub len: u64,
}

impl Extent {
    pub fn end(&self) -> u64 {
        self.offset + self.len
    }
}

/// No hole is large enough.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NoSpace {
    pub requested: u64,
    pub largest_hole: u64,
    pub free: u64,
}

impl fmt::Display for NoSpace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "no hole of {} bytes (largest {}, {} free in all)",
            self.requested, self.largest_hole, self.free
        )
    }
}

/// Holes kept in the allocator itself, sorted by start, while there are at most this many...
const INLINE_MAX: usize = 4;
/// ... and taken back inline from the trees once there are this few.
const INLINE_AGAIN: usize = 2;

/// The free holes, as (start, length).
#[derive(Clone, Debug)]
enum Holes {
    /// A few, sorted by start, inline: a target whose free space is in a few pieces (every
    /// fresh target, a target being filled from its start) is read without chasing a pointer,
    /// and none of it lives anywhere else.
    Inline {
        count: u8,
        holes: [(u64, u64); INLINE_MAX],
    },
    /// More: by start (to coalesce neighbours) and by (length, start) (the tightest hole).
    Trees {
        by_start: BTreeMap<u64, u64>,
        by_len: BTreeSet<(u64, u64)>,
    },
}

impl Holes {
    /// In start order.
    fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        let (inline, trees) = match self {
            Holes::Inline { count, holes } => {
                (Some(holes[..*count as usize].iter().copied()), None)
            }
            Holes::Trees { by_start, .. } => (None, Some(by_start.iter().map(|(&s, &l)| (s, l)))),
        };
        inline
            .into_iter()
            .flatten()
            .chain(trees.into_iter().flatten())
    }

    fn largest(&self) -> u64 {
        match self {
            Holes::Inline { count, holes } => holes[..*count as usize]
                .iter()
                .map(|&(_, len)| len)
                .max()
                .unwrap_or(0),
            Holes::Trees { by_len, .. } => by_len.last().map_or(0, |&(len, _)| len),
        }
    }

    /// The smallest hole of at least `len` bytes, lowest start among equals.
    fn best_fit(&self, len: u64) -> Option<(u64, u64)> {
        match self {
            Holes::Inline { count, holes } => holes[..*count as usize]
                .iter()
                .copied()
                .filter(|&(_, l)| l >= len)
                .min_by_key(|&(s, l)| (l, s)),
            Holes::Trees { by_len, .. } => by_len.range((len, 0)..).next().map(|&(l, s)| (s, l)),
        }
    }

    /// The hole with the greatest start in `range`.
    fn last_in(&self, range: impl RangeBounds<u64>) -> Option<(u64, u64)> {
        match self {
            Holes::Inline { count, holes } => holes[..*count as usize]
                .iter()
                .rev()
                .copied()
                .find(|(s, _)| range.contains(s)),
            Holes::Trees { by_start, .. } => {
                by_start.range(range).next_back().map(|(&s, &l)| (s, l))
            }
        }
    }

    /// The hole with the least start in `range`.
    fn first_in(&self, range: impl RangeBounds<u64>) -> Option<(u64, u64)> {
        match self {
            Holes::Inline { count, holes } => holes[..*count as usize]
                .iter()
                .copied()
                .find(|(s, _)| range.contains(s)),
            Holes::Trees { by_start, .. } => by_start.range(range).next().map(|(&s, &l)| (s, l)),
        }
    }

    fn insert(&mut self, start: u64, len: u64) {
        if let Holes::Inline { count, holes } = self {
            let n = *count as usize;
            if n < INLINE_MAX {
                let at = holes[..n].partition_point(|&(s, _)| s < start);
                holes.copy_within(at..n, at + 1);
                holes[at] = (start, len);
                *count += 1;
                return;
            }
            *self = Holes::Trees {
                by_start: holes.iter().copied().collect(),
                by_len: holes.iter().map(|&(s, l)| (l, s)).collect(),
            };
        }
        let Holes::Trees { by_start, by_len } = self else {
            unreachable!("holes past the inline ones are in trees")
        };
        by_start.insert(start, len);
        by_len.insert((len, start));
    }

    fn remove(&mut self, start: u64, len: u64) {
        match self {
            Holes::Inline { count, holes } => {
                let n = *count as usize;
                let at = holes[..n]
                    .iter()
                    .position(|&hole| hole == (start, len))
                    .expect("free lists disagree");
                holes.copy_within(at + 1..n, at);
                *count -= 1;
            }
            Holes::Trees { by_start, by_len } => {
                by_start.remove(&start);
                assert!(by_len.remove(&(len, start)), "free lists disagree");
                if by_start.len() <= INLINE_AGAIN {
                    let mut inline = [(0, 0); INLINE_MAX];
                    for (slot, (&s, &l)) in inline.iter_mut().zip(by_start.iter()) {
                        *slot = (s, l);
                    }
                    *self = Holes::Inline {
                        count: by_start.len() as u8,
                        holes: inline,
                    };
                }
            }
        }
    }
}

#[derive(Clone, Debug)]
pub struct ExtentAllocator {
    capacity: u64,
    granule: u64,
    free: u64,
    holes: Holes,
}

impl ExtentAllocator {
    /// An allocator over `capacity` bytes (a whole number of granules), all free.
    pub fn new(capacity: u64, granule: u64) -> ExtentAllocator {
        assert!(granule.is_power_of_two(), "granule must be a power of two");
        assert_eq!(capacity % granule, 0, "capacity must be whole granules");
        let mut alloc = ExtentAllocator {
            capacity,
            granule,
            free: 0,
            holes: Holes::Inline {
                count: 0,
                holes: [(0, 0); INLINE_MAX],
            },
        };
        if capacity > 0 {
            alloc.insert_free(0, capacity);
        }
        alloc
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    pub fn granule(&self) -> u64 {
        self.granule
    }

    pub fn free_bytes(&self) -> u64 {
        self.free
    }

    pub fn used_bytes(&self) -> u64 {
        self.capacity - self.free
    }

    /// The largest extent that can be allocated now.
    pub fn largest_free_region(&self) -> u64 {
        self.holes.largest()
    }

    /// Bytes an allocation of `bytes` takes (rounded up to the granule); `None` if it
    /// overflows.
    pub fn rounded(&self, bytes: u64) -> Option<u64> {
        bytes.max(1).checked_next_multiple_of(self.granule)
    }

    fn insert_free(&mut self, offset: u64, len: u64) {
        debug_assert!(len > 0);
        self.holes.insert(offset, len);
        self.free += len;
    }

    fn remove_free(&mut self, offset: u64, len: u64) {
        self.holes.remove(offset, len);
        self.free -= len;
    }

    /// Best fit: the smallest hole that holds `bytes` (rounded), lowest offset among equals.
    pub fn allocate(&mut self, bytes: u64) -> Result<Extent, NoSpace> {
        let no_space = |alloc: &Self| NoSpace {
            requested: bytes,
            largest_hole: alloc.largest_free_region(),
            free: alloc.free,
        };
        let len = self.rounded(bytes).ok_or_else(|| no_space(self))?;
        let (hole_start, hole_len) = self.holes.best_fit(len).ok_or_else(|| no_space(self))?;
        self.remove_free(hole_start, hole_len);
        if hole_len > len {
            self.insert_free(hole_start + len, hole_len - len);
        }
        Ok(Extent {
            offset: hole_start,
            len,
        })
    }

    /// Takes a specific extent (restoring a snapshot). Fails if any of it is not free.
    pub fn allocate_at(&mut self, extent: Extent) -> Result<(), NoSpace> {
        let fail = NoSpace {
            requested: extent.len,
            largest_hole: self.largest_free_region(),
            free: self.free,
        };
        if extent.len == 0 || extent.offset % self.granule != 0 || extent.len % self.granule != 0 {
            return Err(fail);
        }
        let Some((start, len)) = self.holes.last_in(..=extent.offset) else {
            return Err(fail);
        };
        if start + len < extent.end() {
            return Err(fail);
        }
        self.remove_free(start, len);
        if extent.offset > start {
            self.insert_free(start, extent.offset - start);
        }
        if start + len > extent.end() {
            self.insert_free(extent.end(), start + len - extent.end());
        }
        Ok(())
    }

    /// Returns an extent, merging it with free neighbours.
    pub fn free(&mut self, extent: Extent) {
        assert!(
            extent.len > 0 && extent.end() <= self.capacity,
            "extent {extent:?} is not of this target"
        );
        let mut start = extent.offset;
        let mut len = extent.len;
        if let Some((prev_start, prev_len)) = self.holes.last_in(..start) {
            assert!(
                prev_start + prev_len <= start,
                "freeing {extent:?}, part of which is free"
            );
            if prev_start + prev_len == start {
                self.remove_free(prev_start, prev_len);
                start = prev_start;
                len += prev_len;
            }
        }
        if let Some((next_start, next_len)) = self.holes.first_in(extent.offset..) {
            assert!(
                next_start >= extent.end(),
                "freeing {extent:?}, part of which is free"
            );
            if next_start == extent.end() {
                self.remove_free(next_start, next_len);
                len += next_len;
            }
        }
        self.insert_free(start, len);
    }

    /// Free holes in offset order.
    pub fn holes(&self) -> impl Iterator<Item = Extent> + '_ {
        self.holes
            .iter()
            .map(|(offset, len)| Extent { offset, len })
    }

    /// Checks every invariant: the views agree (a few holes inline and sorted, more in two
    /// trees), holes are granule-aligned, disjoint, never adjacent (always coalesced), inside
    /// the capacity, and sum to the free count.
    pub fn check_invariants(&self) {
        match &self.holes {
            Holes::Inline { count, .. } => assert!(*count as usize <= INLINE_MAX),
            Holes::Trees { by_start, by_len } => {
                assert_eq!(by_start.len(), by_len.len());
                assert!(by_start.len() > INLINE_AGAIN, "few holes left in trees");
                for (&start, &len) in by_start {
                    assert!(by_len.contains(&(len, start)));
                }
            }
        }
        let mut total = 0;
        let mut prev_end: Option<u64> = None;
        for (start, len) in self.holes.iter() {
            assert!(len > 0 && start % self.granule == 0 && len % self.granule == 0);
            if let Some(end) = prev_end {
                assert!(end < start, "holes overlap or touch without coalescing");
            }
            prev_end = Some(start + len);
            total += len;
        }
        assert!(prev_end.unwrap_or(0) <= self.capacity);
        assert_eq!(total, self.free);
        assert_eq!(
            self.largest_free_region(),
            self.holes.iter().map(|(_, len)| len).max().unwrap_or(0)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The allocator as it was before holes were kept inline: both trees, always.
    #[derive(Default)]
    struct Trees {
        by_start: BTreeMap<u64, u64>,
        by_len: BTreeSet<(u64, u64)>,
    }

    impl Trees {
        fn insert(&mut self, start: u64, len: u64) {
            self.by_start.insert(start, len);
            self.by_len.insert((len, start));
        }

        fn remove(&mut self, start: u64, len: u64) {
            self.by_start.remove(&start);
            assert!(self.by_len.remove(&(len, start)));
        }

        fn allocate(&mut self, len: u64) -> Option<Extent> {
            let &(hole_len, start) = self.by_len.range((len, 0)..).next()?;
            self.remove(start, hole_len);
            if hole_len > len {
                self.insert(start + len, hole_len - len);
            }
            Some(Extent { offset: start, len })
        }

        fn allocate_at(&mut self, e: Extent) -> bool {
            let Some((&start, &len)) = self.by_start.range(..=e.offset).next_back() else {
                return false;
            };
            if start + len < e.end() {
                return false;
            }
            self.remove(start, len);
            if e.offset > start {
                self.insert(start, e.offset - start);
            }
            if start + len > e.end() {
                self.insert(e.end(), start + len - e.end());
            }
            true
        }

        fn free(&mut self, e: Extent) {
            let (mut start, mut len) = (e.offset, e.len);
            if let Some((&s, &l)) = self.by_start.range(..start).next_back() {
                if s + l == start {
                    self.remove(s, l);
                    (start, len) = (s, len + l);
                }
            }
            if let Some((&s, &l)) = self.by_start.range(e.offset..).next() {
                if s == e.end() {
                    self.remove(s, l);
                    len += l;
                }
            }
            self.insert(start, len);
        }
    }

    /// Every choice (which extent, which refusal) and every hole list equals the two trees'
    /// across many moves between inline holes and trees.
    #[test]
    fn inline_holes_choose_what_the_trees_choose() {
        let mut state = 11u64;
        let mut next = |n: u64| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 33) % n
        };
        let (granule, granules) = (4096, 64);
        let mut alloc = ExtentAllocator::new(granules * granule, granule);
        let mut model = Trees::default();
        model.insert(0, granules * granule);
        let (mut live, mut inline, mut trees) = (Vec::new(), 0, 0);
        for step in 0..200_000 {
            match next(10) {
                0..=4 => {
                    let len = (1 + next(if step % 3000 < 1500 { 4 } else { 12 })) * granule;
                    let got = alloc.allocate(len).ok();
                    assert_eq!(got, model.allocate(len), "step {step}");
                    live.extend(got);
                }
                5..=8 => {
                    if !live.is_empty() {
                        let e = live.swap_remove(next(live.len() as u64) as usize);
                        alloc.free(e);
                        model.free(e);
                    }
                }
                _ => {
                    let e = Extent {
                        offset: next(granules) * granule,
                        len: (1 + next(3)) * granule,
                    };
                    if e.end() <= granules * granule {
                        let ok = alloc.allocate_at(e).is_ok();
                        assert_eq!(ok, model.allocate_at(e), "step {step}");
                        if ok {
                            live.push(e);
                        }
                    }
                }
            }
            alloc.check_invariants();
            let holes: Vec<(u64, u64)> = alloc.holes().map(|e| (e.offset, e.len)).collect();
            let expected: Vec<(u64, u64)> = model.by_start.iter().map(|(&s, &l)| (s, l)).collect();
            assert_eq!(holes, expected, "step {step}");
            match alloc.holes {
                Holes::Inline { .. } => inline += 1,
                Holes::Trees { .. } => trees += 1,
            }
        }
        assert!(
            inline > 10_000 && trees > 10_000,
            "{inline} inline, {trees} trees"
        );
    }
}
