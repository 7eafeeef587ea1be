//! Score-based promotion (ADR-0008, 2026-07 revision): once foreign fixed-head blocks are in
//! use, local-first admission alone strands hot heads on a remote node. Every fixed head
//! carries an access score; a bounded pass exchanges a completely occupied local block whose
//! heads are colder with a completely occupied foreign block whose heads are hotter.
//!
//! - **Score**: a count of reads that halves every decay period (`--promotion-half-life`). A
//!   head stores its score and the period it was last brought up to date in; a read or the
//!   pass first decays it (`score >> periods elapsed`), then a read adds one. No clock is read
//!   on the request path: the caller passes the current period, and nothing leaves the core.
//! - **Candidates**: only completely occupied fixed-head blocks, with no pinned head and no
//!   unpublished reservation. Full blocks carry no free-list state, so their allocator state
//!   is identical and an exchange is bytes plus locators. Partial blocks and the small-object
//!   bump arena are never candidates.
//! - **Pairing**: foreign blocks hottest first against local blocks coldest first; a pair is
//!   exchanged when the foreign block is hotter. Once exchanged, a pair's contents are in the
//!   right order, so they trade places again only when the reads themselves change order; the
//!   budget bounds what that can cost per pass. When passes stop exchanging, no full foreign
//!   block is hotter than any full local block.
//! - **Budget**: at most `budget` exchanges per pass, so a pass never stalls serving.
//! - "Local" is rank 0 of the fixed-head reservation: the preferred node, which `--perverse`
//!   maps on the farthest node, so promotion then works against the inverted locality.

use super::block::{BlockId, HeadLoc};

/// One head's access score.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Heat {
    pub score: u32,
    /// The decay period the score was last brought up to date in.
    pub period: u32,
}

impl Heat {
    /// The score as of `period` (halved once per period elapsed).
    pub fn at(self, period: u32) -> u32 {
        let elapsed = period.saturating_sub(self.period);
        if elapsed >= 32 {
            0
        } else {
            self.score >> elapsed
        }
    }

    /// One read in `period`.
    pub fn bump(&mut self, period: u32) {
        self.score = self.at(period).saturating_add(1);
        self.period = self.period.max(period);
    }
}

/// A head an exchange moved: its owner (the small record that points at it, as linked with
/// [`super::ShardArena::link_fixed_owner`]) must now point at `to`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FixedMove {
    pub owner: HeadLoc,
    pub from: HeadLoc,
    pub to: HeadLoc,
}

/// What one pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PromotionReport {
    /// (local block, foreign block) pairs whose contents were exchanged.
    pub exchanged: Vec<(BlockId, BlockId)>,
    pub bytes_moved: u64,
    /// Full blocks passed over because a head in them was pinned (retried next pass).
    pub skipped_pinned: u64,
    /// Heads whose owners must be rewritten.
    pub moves: Vec<FixedMove>,
}

/// Pairs foreign blocks (hottest first) with local blocks (coldest first) while the foreign
/// one is hotter, at most `budget` pairs. Inputs are
/// (block, heat); ties break by block id so a pass is deterministic.
pub fn pair_blocks(
    local: &[(BlockId, u64)],
    foreign: &[(BlockId, u64)],
    budget: usize,
) -> Vec<(BlockId, BlockId)> {
    let mut local = local.to_vec();
    let mut foreign = foreign.to_vec();
    local.sort_by_key(|&(b, heat)| (heat, b));
    foreign.sort_by_key(|&(b, heat)| (std::cmp::Reverse(heat), b));
    local
        .iter()
        .zip(&foreign)
        .take(budget)
        .take_while(|((_, cold), (_, hot))| hot > cold)
        .map(|(&(l, _), &(f, _))| (l, f))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scores_halve_per_period_and_count_reads() {
        let mut h = Heat::default();
        for _ in 0..8 {
            h.bump(10);
        }
        assert_eq!(h.at(10), 8);
        assert_eq!(h.at(11), 4);
        assert_eq!(h.at(13), 1);
        assert_eq!(h.at(50), 0);
        h.bump(12);
        assert_eq!(
            h,
            Heat {
                score: 3,
                period: 12
            }
        );
        // A period from the past never raises a score.
        assert_eq!(h.at(5), 3);
    }

    #[test]
    fn pairs_only_while_the_foreign_block_is_hotter() {
        let b = BlockId;
        let local = [(b(0), 10), (b(1), 0), (b(2), 50)];
        let foreign = [(b(10), 5), (b(11), 100), (b(12), 11)];
        // Coldest local 0 with hottest foreign 100; then 10 with 11; then 50 with 5: no.
        assert_eq!(
            pair_blocks(&local, &foreign, 8),
            vec![(b(1), b(11)), (b(0), b(12))]
        );
        assert_eq!(pair_blocks(&local, &foreign, 1), vec![(b(1), b(11))]);
        assert!(pair_blocks(&local, &[], 8).is_empty());
        assert!(
            pair_blocks(&[(b(0), 10)], &[(b(9), 10)], 8).is_empty(),
            "equal heat stays"
        );
    }
}
