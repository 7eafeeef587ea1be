//! Promotion against a model: random admit / read (bumping scores) / free / pin / unpin /
//! compact / advance-time / run-pass sequences over synthetic two-node plans, shared and split,
//! normal and `--perverse`. Each fixed head has an owner record (a small object, as the store
//! links them). After every step: every head reads its own bytes at the locator the model
//! holds, every owner link points at its head, pinned heads never moved; every pass exchanged
//! only blocks that were completely occupied and unpinned, and reported every head it moved.
//! At the end, with traffic stopped and pins gone, passes run until they stop exchanging: then
//! no full foreign block is hotter than any full local block: the hottest heads sit in local
//! blocks whenever local full blocks with colder heads exist (block by block, as exchanges move
//! them).

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};

use common::{for_each_seed, Rng};
use headroom::arena::{
    Arena, ArenaConfig, BlockId, HeadLoc, MemoryPlan, NumaMode, Relocation, ShardArena,
    UnlockedMapper,
};
use headroom::topology::Topology;

const HUGE: u64 = 64 << 10;
const OWNER_BYTES: u32 = 24;

fn pattern(id: u64, i: usize) -> u8 {
    (id as usize)
        .wrapping_mul(151)
        .wrapping_add(i.wrapping_mul(13)) as u8
}

#[derive(Debug)]
struct Head {
    slot: HeadLoc,
    owner: HeadLoc,
    /// Where the head was when its first current pin was taken.
    pinned_at: Option<HeadLoc>,
    pins: u32,
}

#[derive(Default)]
struct Model {
    heads: BTreeMap<u64, Head>,
    /// Small fillers (so compaction has something to slide), by locator.
    fillers: HashSet<HeadLoc>,
    next_id: u64,
    exchanges: u64,
    skipped_pinned: u64,
    owner_moves: u64,
}

fn topology() -> Topology {
    Topology::synthetic(&[1, 1], vec![vec![10, 21], vec![21, 10]], HUGE).unwrap()
}

fn config(rng: &mut Rng) -> ArenaConfig {
    let block = HUGE << rng.below(2);
    let ram_head = block >> (2 + rng.below(2)); // 4 or 8 heads per block
    let split = rng.chance(40);
    ArenaConfig {
        numa: NumaMode::Explicit(0),
        memory_bytes: (2 + rng.below(3)) * block,
        sub_memory_bytes: (2 + rng.below(4)) * block,
        small_memory_bytes: split.then(|| 2 * block),
        small_sub_memory_bytes: 0,
        block_bytes: block,
        ram_head_bytes: ram_head.max(4096),
        small_min_alloc_bytes: 16,
        io_chunk_bytes: 4096,
        stream_bytes: 0,
        perverse: rng.chance(25),
    }
}

/// (block, heat) of some blocks.
type BlockHeats = Vec<(BlockId, u64)>;

struct Harness {
    arena: ShardArena,
    model: Model,
    period: u32,
}

impl Harness {
    fn admit(&mut self) {
        let Ok(slot) = self.arena.try_reserve_fixed() else {
            return;
        };
        let Ok(owner) = self.arena.try_reserve_small(OWNER_BYTES) else {
            self.arena.abort(slot);
            return;
        };
        let id = self.model.next_id;
        self.model.next_id += 1;
        for (i, b) in self.arena.reserved_mut(&slot).iter_mut().enumerate() {
            *b = pattern(id, i);
        }
        self.arena.reserved_mut(&owner)[..8].copy_from_slice(&id.to_le_bytes());
        let (slot, owner) = (self.arena.publish(slot), self.arena.publish(owner));
        self.arena.link_fixed_owner(slot, owner);
        self.model.heads.insert(
            id,
            Head {
                slot,
                owner,
                pinned_at: None,
                pins: 0,
            },
        );
    }

    fn pick(&self, rng: &mut Rng, filter: impl Fn(&Head) -> bool) -> Option<u64> {
        let ids: Vec<u64> = self
            .model
            .heads
            .iter()
            .filter(|(_, h)| filter(h))
            .map(|(id, _)| *id)
            .collect();
        (!ids.is_empty()).then(|| ids[rng.below(ids.len() as u64) as usize])
    }

    fn free(&mut self, id: u64) {
        let head = self.model.heads.remove(&id).unwrap();
        // Pinned: the arena defers the slot's free; the model no longer reads it.
        self.arena.free(head.slot);
        self.arena.free(head.owner);
        for _ in 0..head.pins {
            self.arena.unpin(head.slot);
        }
    }

    fn compact(&mut self) {
        let model = &mut self.model;
        let heads_by_owner: HashMap<HeadLoc, u64> =
            model.heads.iter().map(|(id, h)| (h.owner, *id)).collect();
        let mut moved_owners = Vec::new();
        let mut moved_fillers = Vec::new();
        self.arena.compact_all(&mut |moved: Relocation<'_>| {
            if let Some(id) = heads_by_owner.get(&moved.from) {
                assert_eq!(
                    &moved.payload[..8],
                    &id.to_le_bytes(),
                    "owner record moved whole"
                );
                moved_owners.push((*id, moved.to));
            } else {
                moved_fillers.push((moved.from, moved.to));
            }
        });
        for (id, to) in moved_owners {
            model.heads.get_mut(&id).unwrap().owner = to;
            model.owner_moves += 1;
        }
        for (from, to) in moved_fillers {
            assert!(
                model.fillers.remove(&from),
                "compaction moved an unknown object"
            );
            model.fillers.insert(to);
        }
    }

    fn pass(&mut self, budget: usize, step: usize) {
        // Before: which blocks are completely occupied and unpinned (the only candidates).
        let pinned_blocks: HashSet<BlockId> = self
            .model
            .heads
            .values()
            .filter(|h| h.pins > 0)
            .map(|h| h.slot.block)
            .collect();
        let occupancy = self.occupancy();
        let report = self.arena.promote(self.period, budget);
        assert!(report.exchanged.len() <= budget, "step {step}: over budget");
        let exchanged: HashSet<BlockId> =
            report.exchanged.iter().flat_map(|&(l, f)| [l, f]).collect();
        for &(local, foreign) in &report.exchanged {
            assert_eq!(
                self.arena.fixed_rank(local),
                Some(0),
                "step {step}: {local} not local"
            );
            assert_ne!(
                self.arena.fixed_rank(foreign),
                Some(0),
                "step {step}: {foreign} local"
            );
            for block in [local, foreign] {
                assert_eq!(
                    occupancy.get(&block),
                    Some(&self.arena.arena().plan().config.block_bytes),
                    "step {step}: {block} exchanged while not completely occupied"
                );
                assert!(
                    !pinned_blocks.contains(&block),
                    "step {step}: {block} pinned"
                );
            }
        }
        let per_block =
            (self.arena.arena().plan().config.block_bytes / self.arena.ram_head_bytes()) as usize;
        assert_eq!(report.moves.len(), 2 * per_block * report.exchanged.len());
        let mut by_slot: HashMap<HeadLoc, u64> = self
            .model
            .heads
            .iter()
            .map(|(id, h)| (h.slot, *id))
            .collect();
        let mut updates = Vec::new();
        for m in &report.moves {
            assert!(exchanged.contains(&m.from.block) && exchanged.contains(&m.to.block));
            let id = by_slot
                .remove(&m.from)
                .expect("a move of a head the model holds");
            let head = &self.model.heads[&id];
            assert_eq!(
                head.owner, m.owner,
                "step {step}: the move names the wrong owner"
            );
            assert_eq!(head.pins, 0, "step {step}: a pinned head moved");
            updates.push((id, m.to));
        }
        for (id, to) in updates {
            self.model.heads.get_mut(&id).unwrap().slot = to;
        }
        self.model.exchanges += report.exchanged.len() as u64;
        self.model.skipped_pinned += report.skipped_pinned;
    }

    /// Bytes of live heads per fixed block (the model's view).
    fn occupancy(&self) -> HashMap<BlockId, u64> {
        let mut out = HashMap::new();
        for h in self.model.heads.values() {
            *out.entry(h.slot.block).or_insert(0) += self.arena.ram_head_bytes();
        }
        out
    }

    fn check(&self, step: usize) {
        self.arena.check_invariants();
        for (id, h) in &self.model.heads {
            let bytes = self.arena.bytes(h.slot);
            for (i, b) in bytes.iter().enumerate() {
                assert_eq!(
                    *b,
                    pattern(*id, i),
                    "step {step}: head {id} at {} corrupted",
                    h.slot
                );
            }
            assert_eq!(
                self.arena.fixed_owner(h.slot),
                Some(h.owner),
                "step {step}: head {id}"
            );
            assert_eq!(&self.arena.bytes(h.owner)[..8], &id.to_le_bytes());
            if let Some(at) = h.pinned_at {
                assert_eq!(h.slot, at, "step {step}: pinned head {id} moved");
            }
        }
    }

    /// Heat of every completely occupied block with no pinned head, by locality.
    fn full_block_heats(&self) -> (BlockHeats, BlockHeats) {
        let block_bytes = self.arena.arena().plan().config.block_bytes;
        let mut heat: HashMap<BlockId, u64> = HashMap::new();
        for h in self.model.heads.values() {
            *heat.entry(h.slot.block).or_insert(0) +=
                u64::from(self.arena.heat_of(h.slot, self.period));
        }
        let occupancy = self.occupancy();
        let (mut local, mut foreign) = (Vec::new(), Vec::new());
        for (block, bytes) in occupancy {
            if bytes != block_bytes {
                continue;
            }
            let entry = (block, heat.get(&block).copied().unwrap_or(0));
            if self.arena.fixed_rank(block) == Some(0) {
                local.push(entry);
            } else {
                foreign.push(entry);
            }
        }
        (local, foreign)
    }
}

#[test]
fn promotion_moves_hot_heads_home_and_never_breaks_a_locator() {
    let mut totals = (0u64, 0u64, 0u64);
    for_each_seed("promotion_model", 20, |seed| {
        let mut rng = Rng::new(seed);
        let cfg = config(&mut rng);
        let plan = MemoryPlan::new(&cfg, &topology());
        let arena = Arena::map(plan, &UnlockedMapper, 1).expect("map");
        let mut h = Harness {
            arena: arena.shard(0),
            model: Model::default(),
            period: 1,
        };
        for step in 0..1000 {
            match rng.below(100) {
                0..=24 => h.admit(),
                25..=54 => {
                    // Reads favour a few hot ids (low ids), so some blocks get hot.
                    let hot = rng.chance(70);
                    if let Some(id) = h.pick(&mut rng, |_| true) {
                        let id = if hot {
                            h.model
                                .heads
                                .keys()
                                .copied()
                                .find(|k| k % 7 == id % 3)
                                .unwrap_or(id)
                        } else {
                            id
                        };
                        let slot = h.model.heads[&id].slot;
                        h.arena.touch_fixed(slot, h.period, 100);
                    }
                }
                55..=62 => {
                    if let Some(id) = h.pick(&mut rng, |_| true) {
                        h.free(id);
                    }
                }
                63..=68 => {
                    if let Some(id) = h.pick(&mut rng, |_| true) {
                        let head = h.model.heads.get_mut(&id).unwrap();
                        h.arena.pin(head.slot);
                        head.pins += 1;
                        head.pinned_at.get_or_insert(head.slot);
                    }
                }
                69..=76 => {
                    if let Some(id) = h.pick(&mut rng, |h| h.pins > 0) {
                        let head = h.model.heads.get_mut(&id).unwrap();
                        h.arena.unpin(head.slot);
                        head.pins -= 1;
                        if head.pins == 0 {
                            head.pinned_at = None;
                        }
                    }
                }
                77..=82 => {
                    // Fillers come and go so the records' blocks gather dead space.
                    if rng.chance(50) {
                        if let Ok(r) = h.arena.try_reserve_small(40 + rng.below(200) as u32) {
                            let loc = h.arena.publish(r);
                            h.model.fillers.insert(loc);
                        }
                    } else if let Some(&loc) = h.model.fillers.iter().next() {
                        h.model.fillers.remove(&loc);
                        h.arena.free(loc);
                    }
                }
                83..=85 => h.compact(),
                86..=88 => h.period += 1,
                _ => h.pass(1 + rng.below(3) as usize, step),
            }
            h.check(step);
        }
        // Traffic stops, pins end, passes run until they change nothing.
        let pinned: Vec<u64> = h
            .model
            .heads
            .iter()
            .filter(|(_, x)| x.pins > 0)
            .map(|(id, _)| *id)
            .collect();
        for id in pinned {
            let head = h.model.heads.get_mut(&id).unwrap();
            for _ in 0..head.pins {
                h.arena.unpin(head.slot);
            }
            head.pins = 0;
            head.pinned_at = None;
        }
        for round in 0..64 {
            let before = h.model.exchanges;
            h.pass(4, 10_000 + round);
            h.check(10_000 + round);
            if h.model.exchanges == before {
                break;
            }
        }
        let (local, foreign) = h.full_block_heats();
        for &(f, hot) in &foreign {
            for &(l, cold) in &local {
                assert!(
                    hot <= cold,
                    "foreign {f} (heat {hot}) is still hotter than local {l} (heat {cold})"
                );
            }
        }
        totals.0 += h.model.exchanges;
        totals.1 += h.model.skipped_pinned;
        totals.2 += h.model.owner_moves;
    });
    println!(
        "promotion_model: {} exchanges, {} blocks skipped for pins, {} owner records moved by compaction",
        totals.0, totals.1, totals.2
    );
    if std::env::var_os("HEADROOM_SEED").is_none() {
        assert!(totals.0 > 0, "no run exchanged a block");
        assert!(totals.1 > 0, "no run skipped a pinned block");
        assert!(totals.2 > 0, "no run moved an owner record");
    }
}

#[test]
fn one_fixed_head_region_has_nothing_to_promote() {
    let cfg = ArenaConfig {
        numa: NumaMode::Explicit(0),
        memory_bytes: 4 * HUGE,
        sub_memory_bytes: 0,
        small_memory_bytes: None,
        small_sub_memory_bytes: 0,
        block_bytes: HUGE,
        ram_head_bytes: HUGE / 4,
        small_min_alloc_bytes: 16,
        io_chunk_bytes: 4096,
        stream_bytes: 0,
        perverse: false,
    };
    let arena = Arena::map(MemoryPlan::new(&cfg, &topology()), &UnlockedMapper, 1).unwrap();
    let mut shard = arena.shard(0);
    let mut h = Harness {
        arena: shard,
        model: Model::default(),
        period: 1,
    };
    for _ in 0..8 {
        h.admit();
    }
    let report = h.arena.promote(1, 8);
    assert!(report.exchanged.is_empty() && report.moves.is_empty());
    shard = h.arena;
    assert_eq!(shard.stats().promotion_passes, 0);
}
