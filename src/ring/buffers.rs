//! The fixed-buffer table: the arena's regions cut into pieces the kernel accepts (at most
//! 1 GiB each, at most 16,384 of them), and the lookup from an address range to the piece
//! that holds it whole.

/// Largest buffer io_uring registers.
pub const FIXED_BUFFER_MAX_BYTES: usize = 1 << 30;
/// Most buffers one ring registers.
pub const FIXED_BUFFERS_MAX: usize = 16_384;

/// Registered pieces, sorted by address, never overlapping.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FixedBuffers {
    /// (start address, length); the index in this list is the kernel's buffer index.
    pieces: Vec<(usize, usize)>,
}

impl FixedBuffers {
    /// Cuts `ranges` (start, length) into registrable pieces. Ranges must not overlap. A range
    /// is cut at multiples of `piece_bytes` from its start, so a piece boundary falls on a
    /// block boundary whenever blocks divide `piece_bytes` (no head straddles two pieces).
    pub fn cut(ranges: &[(usize, usize)], piece_bytes: usize) -> Result<FixedBuffers, String> {
        assert!(piece_bytes > 0 && piece_bytes <= FIXED_BUFFER_MAX_BYTES);
        let mut pieces = Vec::new();
        for &(start, len) in ranges {
            let mut at = 0;
            while at < len {
                let piece = (len - at).min(piece_bytes);
                pieces.push((start + at, piece));
                at += piece;
            }
        }
        if pieces.len() > FIXED_BUFFERS_MAX {
            return Err(format!(
                "the arena needs {} fixed buffers of at most {piece_bytes} bytes; io_uring registers at most {FIXED_BUFFERS_MAX}",
                pieces.len()
            ));
        }
        pieces.sort_unstable();
        for pair in pieces.windows(2) {
            assert!(
                pair[0].0 + pair[0].1 <= pair[1].0,
                "fixed buffers overlap: {pair:?}"
            );
        }
        Ok(FixedBuffers { pieces })
    }

    pub fn len(&self) -> usize {
        self.pieces.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pieces.is_empty()
    }

    pub fn pieces(&self) -> &[(usize, usize)] {
        &self.pieces
    }

    pub fn total_bytes(&self) -> usize {
        self.pieces.iter().map(|p| p.1).sum()
    }

    /// The index of the piece holding `[addr, addr + len)` whole, if one does.
    pub fn find(&self, addr: usize, len: usize) -> Option<u16> {
        let after = self.pieces.partition_point(|&(start, _)| start <= addr);
        let index = after.checked_sub(1)?;
        let (start, piece) = self.pieces[index];
        let end = addr.checked_add(len)?;
        (end <= start + piece).then_some(index as u16)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn cuts_at_the_piece_size_and_refuses_too_many() {
        let b = FixedBuffers::cut(&[(1 << 40, 5 << 20), (1 << 20, 1 << 20)], 2 << 20).unwrap();
        assert_eq!(
            b.pieces(),
            &[
                (1 << 20, 1 << 20),
                (1 << 40, 2 << 20),
                ((1 << 40) + (2 << 20), 2 << 20),
                ((1 << 40) + (4 << 20), 1 << 20)
            ]
        );
        assert_eq!(b.find((1 << 40) + (2 << 20) - 1, 1), Some(1));
        assert_eq!(
            b.find((1 << 40) + (2 << 20) - 1, 2),
            None,
            "straddles two pieces"
        );
        assert_eq!(b.find(0, 1), None);
        assert!(FixedBuffers::cut(&[(0, (FIXED_BUFFERS_MAX + 1) * 4096)], 4096).is_err());
    }

    proptest! {
        /// Against a scan of every piece: `find` names the one piece holding the range whole,
        /// or none when no piece does.
        #[test]
        fn find_agrees_with_a_scan(
            ranges in proptest::collection::vec((0usize..64, 1usize..20), 1..6),
            piece in 1usize..8,
            probes in proptest::collection::vec((0usize..2000, 1usize..40), 1..60),
        ) {
            // Disjoint ranges: each starts at its own 128-unit slot.
            let unit = 4096;
            let ranges: Vec<(usize, usize)> = ranges
                .iter()
                .enumerate()
                .map(|(i, &(off, len))| ((i * 128 + off) * unit, len * unit))
                .collect();
            let b = FixedBuffers::cut(&ranges, piece * unit).unwrap();
            prop_assert!(b.pieces().iter().all(|&(_, len)| len <= piece * unit));
            prop_assert_eq!(b.total_bytes(), ranges.iter().map(|r| r.1).sum::<usize>());
            for (addr, len) in probes {
                let (addr, len) = (addr * unit / 3, len * unit / 2);
                let scan = b
                    .pieces()
                    .iter()
                    .position(|&(s, l)| addr >= s && addr + len <= s + l)
                    .map(|i| i as u16);
                prop_assert_eq!(b.find(addr, len), scan);
            }
        }
    }
}
