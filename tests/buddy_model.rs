//! Model-based test of the buddy allocator alone, at every order: chunks never overlap, are
//! aligned to their size, come only from the asked region rank, free buddies always merge,
//! and a block leaves exactly when its last chunk is freed.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::{for_each_seed, Rng};
use headroom::arena::buddy::Buddy;
use headroom::arena::BlockId;

#[test]
fn buddy_model() {
    for_each_seed("buddy_model", 300, |seed| {
        let mut rng = Rng::new(seed);
        let min_chunk = 4096u64 << rng.below(3);
        let max_order = rng.below(7) as u32;
        let block_bytes = min_chunk << max_order;
        let ranks = 1 + rng.below(3) as usize;
        let mut buddy = Buddy::new(block_bytes, min_chunk);
        let mut next_block = 0u32;
        // (block, offset) -> order
        let mut live: BTreeMap<(BlockId, u32), u32> = BTreeMap::new();
        let mut block_rank: BTreeMap<BlockId, usize> = BTreeMap::new();
        let mut owned: BTreeSet<BlockId> = BTreeSet::new();
        for step in 0..500 {
            if rng.chance(55) || live.is_empty() {
                let rank = rng.below(ranks as u64) as usize;
                let order = rng.below(u64::from(max_order) + 1) as u32;
                let slot = match buddy.alloc(rank, order) {
                    Some(slot) => slot,
                    None => {
                        assert!(
                            !buddy.has_free(rank, order),
                            "step {step}: alloc failed with room"
                        );
                        let block = BlockId(next_block);
                        next_block += 1;
                        buddy.add_block(block, rank);
                        block_rank.insert(block, rank);
                        owned.insert(block);
                        buddy.alloc(rank, order).expect("fresh block")
                    }
                };
                let (block, offset) = slot;
                assert_eq!(
                    block_rank[&block], rank,
                    "step {step}: chunk from another rank"
                );
                let size = (min_chunk << order) as u32;
                assert_eq!(offset % size, 0, "step {step}: misaligned chunk");
                assert!(u64::from(offset + size) <= block_bytes);
                // No overlap with any live chunk of the same block.
                for (&(b, o), &ord) in live.range((block, 0)..=(block, u32::MAX)) {
                    let other = (min_chunk << ord) as u32;
                    assert!(
                        o + other <= offset || offset + size <= o,
                        "step {step}: overlap in {b}"
                    );
                }
                live.insert((block, offset), order);
            } else {
                let keys: Vec<(BlockId, u32)> = live.keys().copied().collect();
                let key = *rng.pick(&keys).unwrap();
                let order = live.remove(&key).unwrap();
                let emptied = buddy.free(key.0, key.1, order);
                let still_used = live.keys().any(|(b, _)| *b == key.0);
                assert_eq!(
                    emptied.is_some(),
                    !still_used,
                    "step {step}: block release mismatch"
                );
                if emptied.is_some() {
                    owned.remove(&key.0);
                }
            }
            buddy.check_invariants();
            for block in &owned {
                let used: u32 = live
                    .iter()
                    .filter(|((b, _), _)| b == block)
                    .map(|(_, order)| 1u32 << order)
                    .sum();
                assert_eq!(buddy.used_chunks(*block), used, "step {step}");
                assert_eq!(buddy.is_full(*block), used == 1 << max_order);
            }
        }
    });
}
