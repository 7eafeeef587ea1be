//! Targeted arena cases the random model reaches rarely: misuse of reservations and pins is
//! refused loudly, compaction respects its gate and local-first order, and two cores sharing
//! one arena never hold the same block.

use std::sync::Arc;

use headroom::arena::{
    AdmissionHost, Arena, ArenaConfig, HeadLoc, MemoryPlan, NumaMode, Relocation, ShardArena,
    UnlockedMapper,
};
use headroom::topology::Topology;

const BLOCK: u64 = 64 << 10;

fn arena(
    nodes: usize,
    memory_blocks: u64,
    sub_blocks: u64,
    ram_head: u64,
    shards: usize,
) -> Arc<Arena> {
    let distances = (0..nodes)
        .map(|i| (0..nodes).map(|j| if i == j { 10 } else { 20 }).collect())
        .collect();
    let topo = Topology::synthetic(&vec![1; nodes], distances, BLOCK).unwrap();
    let config = ArenaConfig {
        numa: NumaMode::Explicit(0),
        memory_bytes: memory_blocks * BLOCK,
        sub_memory_bytes: sub_blocks * BLOCK,
        small_memory_bytes: None,
        small_sub_memory_bytes: 0,
        block_bytes: BLOCK,
        ram_head_bytes: ram_head,
        small_min_alloc_bytes: 16,
        io_chunk_bytes: 4096,
        stream_bytes: 0,
        perverse: false,
    };
    Arena::map(MemoryPlan::new(&config, &topo), &UnlockedMapper, shards).unwrap()
}

/// Records moves and evicts in allocation order from a list it is given.
#[derive(Default)]
struct Host {
    live: Vec<HeadLoc>,
    moves: usize,
    evictions: usize,
    /// Report the block of the next victim as the one being evicted from (as a CLOCK hand does).
    report_evicting_block: bool,
}

impl AdmissionHost for Host {
    fn relocate(&mut self, moved: Relocation<'_>) {
        let at = self
            .live
            .iter()
            .position(|l| *l == moved.from)
            .expect("moved a live object");
        self.live[at] = moved.to;
        self.moves += 1;
    }

    fn evict_one(&mut self, arena: &mut ShardArena) -> bool {
        if self.live.is_empty() {
            return false;
        }
        arena.free(self.live.remove(0));
        self.evictions += 1;
        true
    }

    fn evicting_block(&self) -> Option<headroom::arena::BlockId> {
        self.report_evicting_block
            .then(|| self.live.first().map(|l| l.block))
            .flatten()
    }
}

fn fill_small(shard: &mut ShardArena, host: &mut Host, len: u32) {
    while let Ok(reserved) = shard.try_reserve_small(len) {
        host.live.push(shard.publish(reserved));
    }
}

#[test]
#[should_panic(expected = "is a reservation: abort it")]
fn freeing_an_unpublished_reservation_is_refused() {
    let arena = arena(1, 2, 0, 4096, 1);
    let mut shard = arena.shard(0);
    let reserved = shard.try_reserve_small(10).unwrap();
    shard.free(reserved.loc());
}

#[test]
#[should_panic(expected = "unpublished reservation")]
fn pinning_an_unpublished_reservation_is_refused() {
    let arena = arena(1, 2, 0, 4096, 1);
    let mut shard = arena.shard(0);
    let reserved = shard.try_reserve_fixed().unwrap();
    shard.pin(reserved.loc());
}

#[test]
#[should_panic(expected = "reserved by another ShardArena")]
fn a_reservation_cannot_be_filled_by_another_core() {
    let arena = arena(1, 4, 0, 4096, 2);
    let mut first = arena.shard(0);
    let mut second = arena.shard(1);
    let reserved = first.try_reserve_fixed().unwrap();
    second.reserved_mut(&reserved).fill(1);
}

#[test]
fn a_pinned_head_freed_by_its_owner_lives_until_the_last_unpin() {
    let arena = arena(1, 1, 0, 4096, 1);
    let mut shard = arena.shard(0);
    let reserved = shard.try_reserve_fixed().unwrap();
    shard.reserved_mut(&reserved).fill(9);
    let loc = shard.publish(reserved);
    shard.pin(loc);
    shard.pin(loc);
    shard.free(loc);
    // The slot is not handed out again while readers hold it.
    let mut others = Vec::new();
    while let Ok(r) = shard.try_reserve_fixed() {
        others.push(shard.publish(r));
    }
    assert!(!others.contains(&loc));
    assert!(shard.bytes(loc).iter().all(|&b| b == 9));
    shard.unpin(loc);
    assert!(shard.bytes(loc).iter().all(|&b| b == 9));
    shard.unpin(loc);
    let reserved = shard
        .try_reserve_fixed()
        .expect("the slot came back at the last unpin");
    assert_eq!(reserved.loc(), loc);
    shard.abort(reserved);
    shard.check_invariants();
}

#[test]
fn admission_compacts_instead_of_evicting_when_dead_space_suffices() {
    let arena = arena(1, 1, 0, 4096, 1);
    let mut shard = arena.shard(0);
    let mut host = Host::default();
    fill_small(&mut shard, &mut host, 100);
    let dead: Vec<HeadLoc> = host.live.iter().copied().step_by(2).collect();
    host.live.retain(|l| !dead.contains(l));
    dead.iter().for_each(|l| shard.free(*l));
    assert!(shard.reclaimable_dead_bytes() >= shard.compaction_gate_bytes());
    for _ in 0..100 {
        let reserved = shard.admit_small(100, &mut host).unwrap();
        host.live.push(shard.publish(reserved));
    }
    assert_eq!(host.evictions, 0);
    assert!(host.moves > 0);
    assert_eq!(
        shard.stats().compactions,
        1,
        "one compaction made room for all of them"
    );
    shard.check_invariants();
}

#[test]
fn below_the_gate_admission_evicts_until_the_gate_opens_then_compacts() {
    let arena = arena(1, 1, 0, 8192, 1);
    let mut shard = arena.shard(0);
    let mut host = Host::default();
    fill_small(&mut shard, &mut host, 100);
    // Free a little, well under one ram_head of dead bytes.
    for _ in 0..10 {
        let loc = host.live.pop().unwrap();
        shard.free(loc);
    }
    let footprint = u64::from(shard.small_footprint(100));
    let gate = shard.compaction_gate_bytes();
    let dead_before = shard.reclaimable_dead_bytes();
    assert!(dead_before < gate);
    let reserved = shard.admit_small(100, &mut host).unwrap();
    host.live.push(shard.publish(reserved));
    let dead_made = dead_before + host.evictions as u64 * footprint;
    assert!(dead_made >= gate, "compacted before the gate opened");
    assert!(
        dead_made < gate + footprint,
        "evicted more than needed to open the gate"
    );
    assert_eq!(shard.stats().compactions, 1);
}

#[test]
fn steady_eviction_empties_blocks_instead_of_compacting_them() {
    // Live data exceeds RAM and the host evicts block by block: compacting the block it is
    // emptying would move bytes for nothing.
    let arena = arena(1, 4, 0, 4096, 1);
    let mut shard = arena.shard(0);
    let mut host = Host {
        report_evicting_block: true,
        ..Host::default()
    };
    fill_small(&mut shard, &mut host, 100);
    let full = host.live.len();
    for _ in 0..(3 * full) {
        let reserved = shard.admit_small(100, &mut host).unwrap();
        host.live.push(shard.publish(reserved));
    }
    assert!(host.evictions >= 2 * full);
    assert_eq!(
        shard.stats().compaction_bytes_moved,
        0,
        "compacted the block under eviction"
    );
    shard.check_invariants();
}

#[test]
fn the_gate_can_open_when_ram_head_equals_the_block() {
    let arena = arena(1, 1, 0, BLOCK, 1);
    let mut shard = arena.shard(0);
    assert_eq!(shard.compaction_gate_bytes(), BLOCK / 2);
    let mut host = Host::default();
    fill_small(&mut shard, &mut host, 1000);
    let dead: Vec<HeadLoc> = host.live.iter().copied().step_by(2).collect();
    host.live.retain(|l| !dead.contains(l));
    dead.iter().for_each(|l| shard.free(*l));
    for _ in 0..10 {
        let reserved = shard.admit_small(1000, &mut host).unwrap();
        host.live.push(shard.publish(reserved));
    }
    assert_eq!(
        host.evictions, 0,
        "half a block of dead space opens the gate"
    );
}

#[test]
fn compaction_makes_room_locally_before_foreign_space_is_used() {
    // One local and one foreign block, both full of small objects; more dead space abroad.
    let arena = arena(2, 1, 1, 4096, 1);
    let mut shard = arena.shard(0);
    let mut host = Host::default();
    fill_small(&mut shard, &mut host, 100);
    let rank_of = |loc: HeadLoc| arena.home_of(loc.block).1;
    let local: Vec<HeadLoc> = host
        .live
        .iter()
        .copied()
        .filter(|l| rank_of(*l) == 0)
        .collect();
    let foreign: Vec<HeadLoc> = host
        .live
        .iter()
        .copied()
        .filter(|l| rank_of(*l) == 1)
        .collect();
    let mut dead: Vec<HeadLoc> = local.iter().copied().step_by(3).collect();
    dead.extend(foreign.iter().copied().step_by(2));
    host.live.retain(|l| !dead.contains(l));
    dead.iter().for_each(|l| shard.free(*l));
    let reserved = shard.admit_small(100, &mut host).unwrap();
    assert_eq!(
        rank_of(reserved.loc()),
        0,
        "compaction should have made room in the local block"
    );
    shard.abort(reserved);
}

#[test]
fn two_cores_never_hold_the_same_block_and_idle_blocks_flow_back_when_scarce() {
    let arena = arena(1, 8, 0, 4096, 2);
    let mut a = arena.shard(0);
    let mut b = arena.shard(1);
    let mut host_a = Host::default();
    fill_small(&mut a, &mut host_a, 1000);
    assert!(
        b.try_reserve_small(1000).is_err(),
        "core a took every block"
    );
    // Core a frees everything: its emptied blocks go back (the pool is empty, so nothing is
    // kept idle), and core b can use them.
    for loc in host_a.live.drain(..) {
        a.free(loc);
    }
    let mut host_b = Host::default();
    fill_small(&mut b, &mut host_b, 1000);
    assert!(
        host_b.live.len() > 100,
        "core b got the blocks core a emptied"
    );
    let held_a = a.blocks_held();
    assert!(b.blocks_held().iter().all(|blk| !held_a.contains(blk)));
    a.check_invariants();
    b.check_invariants();
}
