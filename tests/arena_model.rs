//! Model-based test of one core's arena: random reserve / fill / publish / abort / free /
//! pin / unpin / compact / admit-with-eviction sequences over synthetic multi-node plans.
//! After every step: every locator reads its own bytes, no two live objects overlap, pinned
//! and unpublished objects never move, compaction conserves live bytes, no reservation holds
//! more than its blocks, and objects land in a foreign region only when the local one is full.

mod common;

use std::collections::{BTreeMap, HashMap};

use common::{for_each_seed, Rng};
use headroom::arena::{
    AdmissionHost, AllocError, Arena, ArenaConfig, HeadClass, HeadLoc, MemoryPlan, NumaMode,
    Relocation, Reserved, ShardArena, UnlockedMapper,
};
use headroom::topology::Topology;

/// Small geometry so pressure, compaction and region spill happen within a few hundred steps.
const HUGE: u64 = 64 << 10;

#[derive(Debug)]
struct Object {
    loc: HeadLoc,
    class: HeadClass,
    len: u32,
    salt: u8,
    pins: u32,
    /// Freed by its owner while pinned: waiting for the last unpin.
    freed: bool,
}

fn pattern(id: u64, salt: u8, i: usize) -> u8 {
    (id as usize)
        .wrapping_mul(131)
        .wrapping_add(i.wrapping_mul(7)) as u8
        ^ salt
}

/// The model: what the index would hold, plus reservations in flight.
#[derive(Default)]
struct Model {
    live: BTreeMap<u64, Object>,
    by_loc: HashMap<HeadLoc, u64>,
    reserved: Vec<(u64, Reserved, u32, u8)>,
    next_id: u64,
    rng_state: u64,
    moves: u64,
    evictions: u64,
    foreign_placements: u64,
}

impl Model {
    fn pick_live(&mut self, filter: impl Fn(&Object) -> bool) -> Option<u64> {
        let ids: Vec<u64> = self
            .live
            .iter()
            .filter(|(_, o)| filter(o))
            .map(|(id, _)| *id)
            .collect();
        if ids.is_empty() {
            return None;
        }
        self.rng_state = self
            .rng_state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        Some(ids[(self.rng_state >> 33) as usize % ids.len()])
    }

    fn forget(&mut self, id: u64) {
        let object = self.live.remove(&id).expect("live");
        self.by_loc.remove(&object.loc);
    }
}

impl AdmissionHost for Model {
    fn relocate(&mut self, moved: Relocation<'_>) {
        let id = self
            .by_loc
            .remove(&moved.from)
            .expect("compaction moved an object the index does not hold");
        let object = self.live.get_mut(&id).unwrap();
        assert_eq!(object.pins, 0, "a pinned object moved");
        assert!(!object.freed);
        assert_eq!(moved.payload.len(), object.len as usize);
        for (i, byte) in moved.payload.iter().enumerate() {
            assert_eq!(*byte, pattern(id, object.salt, i), "moved payload differs");
        }
        object.loc = moved.to;
        assert!(
            self.by_loc.insert(moved.to, id).is_none(),
            "moved onto a live object"
        );
        self.moves += 1;
    }

    fn evict_one(&mut self, arena: &mut ShardArena) -> bool {
        let Some(id) = self.pick_live(|o| !o.freed) else {
            return false;
        };
        let object = self.live.get_mut(&id).unwrap();
        arena.free(object.loc);
        self.evictions += 1;
        if object.pins > 0 {
            object.freed = true;
        } else {
            self.forget(id);
        }
        true
    }
}

fn topology(nodes: usize) -> Topology {
    let distances = (0..nodes)
        .map(|i| {
            (0..nodes)
                .map(|j| {
                    if i == j {
                        10
                    } else {
                        20 + 5 * i.abs_diff(j) as u32
                    }
                })
                .collect()
        })
        .collect();
    Topology::synthetic(&vec![1; nodes], distances, HUGE).unwrap()
}

fn random_config(rng: &mut Rng, nodes: usize) -> ArenaConfig {
    let block = HUGE << rng.below(2);
    // Includes ram_head == block, where the small class reaches almost a whole block.
    let ram_head = block >> rng.below(5);
    let blocks = |rng: &mut Rng, max: u64| (1 + rng.below(max)) * block;
    let split = rng.chance(40);
    let node = rng.below(nodes as u64) as u32;
    ArenaConfig {
        numa: NumaMode::Explicit(node),
        memory_bytes: blocks(rng, 4),
        sub_memory_bytes: if nodes > 1 && rng.chance(80) {
            blocks(rng, 3)
        } else {
            0
        },
        small_memory_bytes: split.then(|| blocks(rng, 3)),
        small_sub_memory_bytes: if split && nodes > 1 && rng.chance(60) {
            blocks(rng, 2)
        } else {
            0
        },
        block_bytes: block,
        ram_head_bytes: ram_head.max(4096),
        small_min_alloc_bytes: if rng.chance(50) { 8 } else { 16 },
        io_chunk_bytes: 4096,
        stream_bytes: 0,
        perverse: nodes > 1 && rng.chance(25),
    }
}

struct Harness {
    arena: ShardArena,
    model: Model,
    ram_head: u32,
}

impl Harness {
    fn fill(&mut self, id: u64, reserved: &Reserved, len: u32, salt: u8) {
        let bytes = self.arena.reserved_mut(reserved);
        assert!(bytes.len() >= len as usize);
        for (i, byte) in bytes.iter_mut().enumerate() {
            *byte = pattern(id, salt, i);
        }
    }

    /// The space an object occupies: [start, end) inside its block.
    fn extent(&self, object: &Object) -> (u32, u32) {
        match object.class {
            HeadClass::Fixed => (object.loc.offset, object.loc.offset + self.ram_head),
            HeadClass::Small => (
                object.loc.offset,
                object.loc.offset + self.arena.small_footprint(object.len),
            ),
        }
    }

    fn check(&self, step: usize) {
        self.arena.check_invariants();
        let mut extents: BTreeMap<(u32, u32), u64> = BTreeMap::new();
        for (id, object) in &self.model.live {
            if !object.freed {
                let bytes = self.arena.bytes(object.loc);
                let expect = if object.class == HeadClass::Fixed {
                    self.ram_head
                } else {
                    object.len
                };
                assert_eq!(
                    bytes.len(),
                    expect as usize,
                    "step {step}: object {id} length"
                );
                for (i, byte) in bytes.iter().enumerate() {
                    assert_eq!(
                        *byte,
                        pattern(*id, object.salt, i),
                        "step {step}: object {id} corrupted at {i}"
                    );
                }
            }
            let (start, end) = self.extent(object);
            assert!(extents.insert((object.loc.block.0, start), *id).is_none());
            let _ = end;
        }
        for (id, reserved, len, _) in &self.model.reserved {
            let start = reserved.loc().offset;
            assert!(
                extents
                    .insert((reserved.loc().block.0, start), *id)
                    .is_none(),
                "step {step}: reservation overlaps"
            );
            let _ = len;
        }
        // Neighbours in each block must not overlap.
        let mut ends: HashMap<u32, u32> = HashMap::new();
        let all: Vec<(u32, u32, u32)> = self
            .model
            .live
            .values()
            .map(|o| (o.loc.block.0, self.extent(o).0, self.extent(o).1))
            .chain(self.model.reserved.iter().map(|(_, r, len, _)| {
                let end = match r.class() {
                    HeadClass::Fixed => r.loc().offset + self.ram_head,
                    HeadClass::Small => r.loc().offset + self.arena.small_footprint(*len),
                };
                (r.loc().block.0, r.loc().offset, end)
            }))
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        for (block, start, end) in all {
            if let Some(prev_end) = ends.get(&block) {
                assert!(
                    *prev_end <= start,
                    "step {step}: objects overlap in block {block}"
                );
            }
            ends.insert(block, end);
        }
    }

    /// Objects may land in a region of rank r > 0 only if lower ranks had neither free
    /// blocks in the pool nor idle blocks in this core's batch before the call.
    fn lower_ranks_had_blocks(&self, class: HeadClass) -> Vec<bool> {
        let arena = self.arena.arena();
        let config = &arena.plan().config;
        let kind = if class == HeadClass::Fixed {
            config.head_reservation()
        } else {
            config.small_reservation()
        };
        let stats = self.arena.stats();
        arena
            .plan()
            .reservation_regions(kind)
            .map(|region| {
                arena.pool().with(|p| p.free_in(kind, region.rank)) > 0
                    || stats.per_region[region.index].blocks_idle > 0
            })
            .collect()
    }

    fn assert_local_first(&mut self, loc: HeadLoc, had_blocks: &[bool], step: usize) {
        let (_, rank) = self.arena.arena().home_of(loc.block);
        if rank > 0 {
            self.model.foreign_placements += 1;
        }
        assert!(
            had_blocks[..rank].iter().all(|had| !had),
            "step {step}: object placed in rank {rank} while a lower rank had free blocks"
        );
    }
}

/// What one run exercised, so the test can insist the interesting paths were taken.
#[derive(Default, Debug)]
struct Coverage {
    moves: u64,
    evictions: u64,
    foreign_placements: u64,
    deferred_frees: u64,
}

fn run(seed: u64, steps: usize, coverage: &mut Coverage) {
    let mut rng = Rng::new(seed);
    let nodes = 1 + rng.below(3) as usize;
    let topo = topology(nodes);
    let config = random_config(&mut rng, nodes);
    let plan = MemoryPlan::new(&config, &topo);
    let arena = Arena::map(plan, &UnlockedMapper, 1).expect("map");
    let mut h = Harness {
        ram_head: config.ram_head_bytes as u32,
        arena: arena.shard(0),
        model: Model {
            rng_state: seed,
            ..Model::default()
        },
    };
    let max_small = h.arena.small_max_payload();
    for step in 0..steps {
        let live_bytes_before: u64 = h
            .model
            .live
            .values()
            .filter(|o| o.class == HeadClass::Small)
            .map(|o| u64::from(h.arena.small_footprint(o.len)))
            .sum();
        match rng.below(100) {
            // Reserve a small object, fill it, publish it (or leave it unpublished a while).
            0..=29 => {
                let len = if rng.chance(80) {
                    rng.below(200) as u32
                } else {
                    rng.below(u64::from(max_small) + 1) as u32
                };
                let had = h.lower_ranks_had_blocks(HeadClass::Small);
                let id = h.model.next_id;
                h.model.next_id += 1;
                let salt = rng.below(256) as u8;
                let result = if rng.chance(50) {
                    h.arena.try_reserve_small(len)
                } else {
                    let Harness { arena, model, .. } = &mut h;
                    arena.admit_small(len, model)
                };
                match result {
                    Ok(reserved) => {
                        assert_eq!(reserved.class(), HeadClass::Small);
                        h.assert_local_first(reserved.loc(), &had, step);
                        h.fill(id, &reserved, len, salt);
                        if rng.chance(85) {
                            let loc = h.arena.publish(reserved);
                            h.model.by_loc.insert(loc, id);
                            h.model.live.insert(
                                id,
                                Object {
                                    loc,
                                    class: HeadClass::Small,
                                    len,
                                    salt,
                                    pins: 0,
                                    freed: false,
                                },
                            );
                        } else {
                            h.model.reserved.push((id, reserved, len, salt));
                        }
                    }
                    Err(AllocError::OutOfMemory { .. }) => {}
                    Err(other) => panic!("step {step}: unexpected {other}"),
                }
            }
            // Reserve a fixed head.
            30..=44 => {
                let had = h.lower_ranks_had_blocks(HeadClass::Fixed);
                let id = h.model.next_id;
                h.model.next_id += 1;
                let salt = rng.below(256) as u8;
                let result = if rng.chance(50) {
                    h.arena.try_reserve_fixed()
                } else {
                    let Harness { arena, model, .. } = &mut h;
                    arena.admit_fixed(model)
                };
                if let Ok(reserved) = result {
                    h.assert_local_first(reserved.loc(), &had, step);
                    let len = h.ram_head;
                    h.fill(id, &reserved, len, salt);
                    let loc = h.arena.publish(reserved);
                    h.model.by_loc.insert(loc, id);
                    h.model.live.insert(
                        id,
                        Object {
                            loc,
                            class: HeadClass::Fixed,
                            len,
                            salt,
                            pins: 0,
                            freed: false,
                        },
                    );
                }
            }
            // Publish or abort a pending reservation.
            45..=52 => {
                if !h.model.reserved.is_empty() {
                    let at = rng.below(h.model.reserved.len() as u64) as usize;
                    let (id, reserved, len, salt) = h.model.reserved.swap_remove(at);
                    if rng.chance(50) {
                        let loc = h.arena.publish(reserved);
                        h.model.by_loc.insert(loc, id);
                        h.model.live.insert(
                            id,
                            Object {
                                loc,
                                class: HeadClass::Small,
                                len,
                                salt,
                                pins: 0,
                                freed: false,
                            },
                        );
                    } else {
                        h.arena.abort(reserved);
                    }
                }
            }
            // Free.
            53..=72 => {
                if let Some(id) = h.model.pick_live(|o| !o.freed) {
                    let object = h.model.live.get_mut(&id).unwrap();
                    h.arena.free(object.loc);
                    if object.pins > 0 {
                        object.freed = true;
                    } else {
                        h.model.forget(id);
                    }
                }
            }
            // Pin.
            73..=80 => {
                if let Some(id) = h.model.pick_live(|o| !o.freed) {
                    let object = h.model.live.get_mut(&id).unwrap();
                    h.arena.pin(object.loc);
                    object.pins += 1;
                }
            }
            // Unpin.
            81..=89 => {
                if let Some(id) = h.model.pick_live(|o| o.pins > 0) {
                    let object = h.model.live.get_mut(&id).unwrap();
                    h.arena.unpin(object.loc);
                    object.pins -= 1;
                    if object.pins == 0 && object.freed {
                        h.model.forget(id);
                    }
                }
            }
            // Compact everything movable.
            _ => {
                let Harness { arena, model, .. } = &mut h;
                let report = arena.compact_all(&mut |moved| model.relocate(moved));
                let live_after: u64 = h
                    .model
                    .live
                    .values()
                    .filter(|o| o.class == HeadClass::Small)
                    .map(|o| u64::from(h.arena.small_footprint(o.len)))
                    .sum();
                assert_eq!(
                    live_bytes_before, live_after,
                    "step {step}: compaction changed live bytes"
                );
                let _ = report;
            }
        }
        h.check(step);
    }
    coverage.moves += h.model.moves;
    coverage.evictions += h.model.evictions;
    coverage.foreign_placements += h.model.foreign_placements;
    coverage.deferred_frees += h.model.live.values().filter(|o| o.freed).count() as u64;
    // Drain: pins released, reservations aborted, everything freed: every block goes home.
    for (_, reserved, _, _) in std::mem::take(&mut h.model.reserved) {
        h.arena.abort(reserved);
    }
    let ids: Vec<u64> = h.model.live.keys().copied().collect();
    for id in ids {
        let object = h.model.live.remove(&id).unwrap();
        if !object.freed {
            h.arena.free(object.loc);
        }
        for _ in 0..object.pins {
            h.arena.unpin(object.loc);
        }
    }
    h.arena.check_invariants();
    h.arena.return_idle_blocks();
    assert!(
        h.arena.blocks_held().is_empty(),
        "blocks still held after everything was freed"
    );
    let free: u64 = h.arena.arena().pool().with(|p| {
        p.region_counts()
            .iter()
            .map(|c| u64::from(c.blocks_free))
            .sum()
    });
    assert_eq!(free, u64::from(h.arena.arena().plan().total_blocks()));
}

#[test]
fn arena_model_holds_every_invariant() {
    let seeds = std::env::var("HEADROOM_MODEL_SEEDS").map_or(60, |s| s.parse().expect("a number"));
    let mut coverage = Coverage::default();
    for_each_seed("arena_model", seeds, |seed| run(seed, 600, &mut coverage));
    println!("arena_model coverage: {coverage:?}");
    if seeds >= 20 {
        assert!(
            coverage.moves > 0,
            "no run compacted anything: {coverage:?}"
        );
        assert!(coverage.evictions > 0, "no run evicted: {coverage:?}");
        assert!(
            coverage.foreign_placements > 0,
            "no run spilled to a foreign region: {coverage:?}"
        );
        assert!(
            coverage.deferred_frees > 0,
            "no run freed a pinned object: {coverage:?}"
        );
    }
}

#[test]
fn compaction_runs_at_full_arena_and_keeps_every_locator() {
    // One region, shared mode, filled to the brim with small objects; then free every other
    // one and admit more: compaction must make room in place, without a spare block.
    let topo = topology(1);
    let config = ArenaConfig {
        numa: NumaMode::Explicit(0),
        memory_bytes: 2 * HUGE,
        sub_memory_bytes: 0,
        small_memory_bytes: None,
        small_sub_memory_bytes: 0,
        block_bytes: HUGE,
        ram_head_bytes: 4096,
        small_min_alloc_bytes: 16,
        io_chunk_bytes: 4096,
        stream_bytes: 0,
        perverse: false,
    };
    let arena = Arena::map(MemoryPlan::new(&config, &topo), &UnlockedMapper, 1).unwrap();
    let mut h = Harness {
        ram_head: 4096,
        arena: arena.shard(0),
        model: Model::default(),
    };
    let len = 100;
    loop {
        let id = h.model.next_id;
        let Ok(reserved) = h.arena.try_reserve_small(len) else {
            break;
        };
        h.model.next_id += 1;
        h.fill(id, &reserved, len, 9);
        let loc = h.arena.publish(reserved);
        h.model.by_loc.insert(loc, id);
        h.model.live.insert(
            id,
            Object {
                loc,
                class: HeadClass::Small,
                len,
                salt: 9,
                pins: 0,
                freed: false,
            },
        );
    }
    let full = h.model.live.len();
    assert!(full > 1000, "filled {full}");
    let ids: Vec<u64> = h
        .model
        .live
        .keys()
        .copied()
        .filter(|id| id % 2 == 0)
        .collect();
    for id in ids {
        h.arena.free(h.model.live[&id].loc);
        h.model.forget(id);
    }
    assert!(
        h.arena.try_reserve_small(len).is_err(),
        "no tail room before compaction"
    );
    // Admission compacts (dead space is well over one ram_head) instead of evicting.
    let mut admitted = 0;
    for _ in 0..(full / 2) {
        let id = h.model.next_id;
        h.model.next_id += 1;
        let Harness { arena, model, .. } = &mut h;
        let reserved = arena
            .admit_small(len, model)
            .expect("compaction makes room");
        h.fill(id, &reserved, len, 9);
        let loc = h.arena.publish(reserved);
        h.model.by_loc.insert(loc, id);
        h.model.live.insert(
            id,
            Object {
                loc,
                class: HeadClass::Small,
                len,
                salt: 9,
                pins: 0,
                freed: false,
            },
        );
        admitted += 1;
    }
    assert_eq!(admitted, full / 2);
    assert_eq!(h.model.evictions, 0, "compaction should have sufficed");
    assert!(h.model.moves > 0);
    h.check(0);
    let stats = h.arena.stats();
    assert!(stats.compactions >= 1 && stats.compaction_bytes_moved > 0);
}
