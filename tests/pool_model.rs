//! Model-based test of the global block pools and per-core batches: random take / give /
//! refill / release sequences never hand a block out twice, never cross reservations, never
//! exceed a reservation's blocks, and always hand out local blocks before foreign ones.

mod common;

use std::collections::HashSet;

use common::{for_each_seed, Rng};
use headroom::arena::batch::{BlockBatch, BlockSource, SharedPool};
use headroom::arena::pool::BlockPool;
use headroom::arena::{ArenaConfig, BlockId, MemoryPlan, NumaMode, ReservationKind};
use headroom::topology::Topology;

const BLOCK: u64 = 2 << 20;

fn three_nodes() -> Topology {
    Topology::synthetic(
        &[1, 1, 1],
        vec![vec![10, 20, 30], vec![20, 10, 20], vec![30, 20, 10]],
        BLOCK,
    )
    .unwrap()
}

fn plan(rng: &mut Rng) -> MemoryPlan {
    let blocks = |rng: &mut Rng| (1 + rng.below(6)) * BLOCK;
    let split = rng.chance(50);
    let config = ArenaConfig {
        numa: NumaMode::Explicit(rng.below(3) as u32),
        memory_bytes: blocks(rng),
        sub_memory_bytes: if rng.chance(80) { blocks(rng) } else { 0 },
        small_memory_bytes: split.then(|| blocks(rng)),
        small_sub_memory_bytes: if split && rng.chance(50) {
            blocks(rng)
        } else {
            0
        },
        block_bytes: BLOCK,
        ram_head_bytes: 256 << 10,
        small_min_alloc_bytes: 16,
        io_chunk_bytes: 1 << 20,
        stream_bytes: 0,
        perverse: rng.chance(30),
    };
    MemoryPlan::new(&config, &three_nodes())
}

/// Blocks per (reservation, rank) in the plan.
fn capacity(plan: &MemoryPlan, kind: ReservationKind, rank: usize) -> usize {
    plan.reservation_regions(kind).nth(rank).unwrap().blocks as usize
}

#[test]
fn pool_hands_out_local_first_and_never_twice() {
    for_each_seed("pool_model", 200, |seed| {
        let mut rng = Rng::new(seed);
        let plan = plan(&mut rng);
        let kinds = plan.reservations();
        let mut pool = BlockPool::new(&plan);
        let mut held: HashSet<BlockId> = HashSet::new();
        for step in 0..400 {
            let kind = *rng.pick(&kinds).unwrap();
            let ranks = pool.ranks(kind);
            match rng.below(3) {
                0 => {
                    let free_before: Vec<usize> =
                        (0..ranks).map(|r| pool.free_in(kind, r)).collect();
                    let mut out = Vec::new();
                    let want = 1 + rng.below(5) as usize;
                    let got = pool.take(kind, want, &mut out);
                    assert_eq!(got, out.len());
                    assert_eq!(got, want.min(free_before.iter().sum()), "step {step}");
                    for (i, block) in out.iter().enumerate() {
                        let (home, rank) = pool.home_of(*block);
                        assert_eq!(home, kind, "step {step}: {block} crossed reservations");
                        // Local first: every block taken before this one in lower ranks drained them.
                        let taken_below = out[..i]
                            .iter()
                            .filter(|b| pool.home_of(**b).1 < rank)
                            .count();
                        assert_eq!(
                            taken_below,
                            free_before[..rank].iter().sum::<usize>(),
                            "step {step}: foreign before local"
                        );
                        assert!(held.insert(*block), "step {step}: {block} handed out twice");
                    }
                }
                1 => {
                    let rank = rng.below(ranks as u64) as usize;
                    let mut out = Vec::new();
                    pool.take_from(kind, rank, 1 + rng.below(3) as usize, &mut out);
                    for block in out {
                        assert_eq!(pool.home_of(block), (kind, rank));
                        assert!(held.insert(block), "step {step}: {block} handed out twice");
                    }
                }
                _ => {
                    let mine: Vec<BlockId> = held
                        .iter()
                        .copied()
                        .filter(|b| pool.home_of(*b).0 == kind)
                        .collect();
                    if let Some(&block) = rng.pick(&mine) {
                        held.remove(&block);
                        pool.give(block);
                    }
                }
            }
            pool.check_invariants();
            for kind in &kinds {
                for rank in 0..pool.ranks(*kind) {
                    let out = held
                        .iter()
                        .filter(|b| pool.home_of(**b) == (*kind, rank))
                        .count();
                    assert_eq!(
                        out + pool.free_in(*kind, rank),
                        capacity(&plan, *kind, rank),
                        "step {step}: blocks leaked"
                    );
                }
            }
        }
    });
}

#[test]
fn batches_exchange_in_bulk_and_conserve_blocks() {
    for_each_seed("batch_model", 200, |seed| {
        let mut rng = Rng::new(seed);
        let plan = plan(&mut rng);
        let kinds = plan.reservations();
        let cores = 1 + rng.below(3) as usize;
        let source = SharedPool::new(BlockPool::new(&plan), cores);
        let mut batches: Vec<BlockBatch> = (0..cores).map(|_| BlockBatch::new()).collect();
        let mut in_use: Vec<Vec<BlockId>> = vec![Vec::new(); cores];
        for step in 0..400 {
            let core = rng.below(cores as u64) as usize;
            let kind = *rng.pick(&kinds).unwrap();
            let rank = rng.below(source.with(|p| p.ranks(kind)) as u64) as usize;
            if rng.chance(55) {
                let pool_free = source.with(|p| p.free_in(kind, rank));
                let idle = batches[core].held(kind, rank);
                match batches[core].acquire(&source, kind, rank) {
                    Some(block) => {
                        assert_eq!(
                            source.with(|p| p.home_of(block)),
                            (kind, rank),
                            "step {step}"
                        );
                        in_use[core].push(block);
                    }
                    None => {
                        assert_eq!(pool_free + idle, 0, "step {step}: refused with blocks free")
                    }
                }
            } else if !in_use[core].is_empty() {
                let at = rng.below(in_use[core].len() as u64) as usize;
                let block = in_use[core].swap_remove(at);
                let (kind, rank) = source.with(|p| p.home_of(block));
                batches[core].release(&source, kind, rank, block);
                assert!(
                    batches[core].held(kind, rank)
                        <= headroom::arena::batch::BATCH_HIGH_WATER_BLOCKS
                );
            }
            source.with(|p| p.check_invariants());
            let mut seen = HashSet::new();
            for c in 0..cores {
                for block in batches[c].all_held().chain(in_use[c].iter().copied()) {
                    assert!(seen.insert(block), "step {step}: {block} held twice");
                    assert!(
                        !source.with(|p| p.is_free(block)),
                        "step {step}: {block} held and free"
                    );
                }
            }
            let free: usize = source.with(|p| {
                kinds
                    .iter()
                    .map(|k| (0..p.ranks(*k)).map(|r| p.free_in(*k, r)).sum::<usize>())
                    .sum()
            });
            assert_eq!(
                seen.len() + free,
                plan.total_blocks() as usize,
                "step {step}: blocks leaked"
            );
        }
        for (core, batch) in batches.iter_mut().enumerate() {
            batch.return_all(&source as &dyn BlockSource);
            for block in in_use[core].drain(..) {
                source.give_back(&[block]);
            }
        }
        let free: usize = source.with(|p| {
            p.region_counts()
                .iter()
                .map(|c| c.blocks_free as usize)
                .sum()
        });
        assert_eq!(free, plan.total_blocks() as usize);
    });
}
