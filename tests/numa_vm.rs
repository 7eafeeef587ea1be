//! Multi-node truth, run inside the QEMU NUMA VM by `scripts/test-numa-vm` (which sets
//! HEADROOM_NUMA_VM=1): regions land on their intended nodes from per-node hugetlb pools and
//! through the fallback, heads are handed out local-first, `--sub-memory` maps on every other
//! node, and `--perverse` maps the preferred region on the farthest node. Outside the VM these
//! tests say so and return; the harness is what CI runs.

use headroom::arena::{Arena, ArenaConfig, Backing, MemoryPlan, NumaMode, ReservationKind};
use headroom::topology::{NodeId, Topology};

const MIB: u64 = 1 << 20;

fn in_vm() -> bool {
    if std::env::var_os("HEADROOM_NUMA_VM").is_some() {
        return true;
    }
    println!("not in the NUMA VM: run scripts/test-numa-vm");
    false
}

fn topology() -> Topology {
    let topo = Topology::from_sysfs("/sys".as_ref()).unwrap();
    assert!(
        topo.online_count() >= 2,
        "the VM must have at least two nodes"
    );
    topo
}

fn huge_free(node: NodeId) -> u64 {
    let path =
        format!("/sys/devices/system/node/node{node}/hugepages/hugepages-2048kB/free_hugepages");
    std::fs::read_to_string(path)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

fn config(numa: NumaMode) -> ArenaConfig {
    ArenaConfig {
        numa,
        memory_bytes: 4 * MIB,
        sub_memory_bytes: 0,
        small_memory_bytes: None,
        small_sub_memory_bytes: 0,
        block_bytes: 2 * MIB,
        ram_head_bytes: 256 << 10,
        small_min_alloc_bytes: 16,
        io_chunk_bytes: MIB,
        stream_bytes: 0,
        perverse: false,
    }
}

/// Every page of every region sits on the region's node; returns (node, backing) per region.
fn placements(arena: &Arena) -> Vec<(NodeId, &'static str)> {
    arena
        .regions()
        .iter()
        .map(|region| {
            let node = region.plan.node.expect("bound region");
            let pages = region.page_nodes().unwrap();
            assert!(
                pages.iter().all(|&n| n == node as i32),
                "region {} wants node {node}, pages on {:?}",
                region.plan.index,
                pages
            );
            (node, region.backing.name())
        })
        .collect()
}

#[test]
fn hugetlb_from_the_nodes_own_pool() {
    if !in_vm() {
        return;
    }
    let topo = topology();
    let node = topo
        .node_ids()
        .into_iter()
        .find(|&n| huge_free(n) >= 2)
        .expect("a node with a hugetlb pool");
    let before = huge_free(node);
    let arena = Arena::map_for_serving(
        MemoryPlan::new(&config(NumaMode::Explicit(node)), &topo),
        &topo,
        1,
    )
    .unwrap();
    assert_eq!(placements(&arena), vec![(node, "hugetlb")]);
    assert_eq!(
        huge_free(node),
        before - 2,
        "the pages came from node {node}'s pool"
    );
    drop(arena);
    assert_eq!(huge_free(node), before, "pages returned on unmap");
}

#[test]
fn fallback_binds_to_a_node_without_pages() {
    if !in_vm() {
        return;
    }
    let topo = topology();
    let node = topo
        .node_ids()
        .into_iter()
        .find(|&n| huge_free(n) == 0)
        .expect("a node without huge pages");
    let arena = Arena::map_for_serving(
        MemoryPlan::new(&config(NumaMode::Explicit(node)), &topo),
        &topo,
        1,
    )
    .unwrap();
    assert_eq!(placements(&arena), vec![(node, "fallback")]);
}

#[test]
fn a_pool_that_cannot_populate_falls_back_and_leaks_nothing() {
    if !in_vm() {
        return;
    }
    // The plan believes the pool is fine (free count unknown), the machine pool has pages, but
    // none on this node: the hugetlb populate fails and the fallback must take over.
    let topo = topology();
    let empty = topo
        .node_ids()
        .into_iter()
        .find(|&n| huge_free(n) == 0)
        .expect("a node without huge pages");
    let total_before: u64 = topo.node_ids().iter().map(|&n| huge_free(n)).sum();
    assert!(
        total_before >= 2,
        "the VM must reserve huge pages somewhere"
    );
    let mut plan = MemoryPlan::new(&config(NumaMode::Explicit(empty)), &topo);
    plan.regions[0].huge_pages_free = None;
    let arena = Arena::map_for_serving(plan, &topo, 1).unwrap();
    match &arena.regions()[0].backing {
        Backing::Fallback { reason } => assert!(reason.contains("populate"), "{reason}"),
        other => panic!("expected the fallback, got {other}"),
    }
    assert_eq!(placements(&arena), vec![(empty, "fallback")]);
    let total_after: u64 = topo.node_ids().iter().map(|&n| huge_free(n)).sum();
    assert_eq!(
        total_after, total_before,
        "the failed hugetlb attempt leaked pages"
    );
}

#[test]
fn sub_memory_maps_every_other_node_and_heads_go_local_first() {
    if !in_vm() {
        return;
    }
    let topo = topology();
    let serving = 0;
    let mut cfg = config(NumaMode::Explicit(serving));
    cfg.sub_memory_bytes = 2 * MIB;
    cfg.small_memory_bytes = Some(2 * MIB);
    cfg.small_sub_memory_bytes = 2 * MIB;
    let arena = Arena::map_for_serving(MemoryPlan::new(&cfg, &topo), &topo, 1).unwrap();
    let placed = placements(&arena);
    let mut expected: Vec<NodeId> = topo.nodes_by_distance(serving);
    expected.extend(topo.nodes_by_distance(serving));
    assert_eq!(placed.iter().map(|p| p.0).collect::<Vec<_>>(), expected);
    // Fill every fixed-head slot: the local region's 16 slots come first, then each foreign
    // region's 8 in distance order, and the bytes really are on those nodes.
    let mut shard = arena.shard(0);
    let slots_per_block = 8;
    let mut nodes_in_order = Vec::new();
    while let Ok(reserved) = shard.try_reserve_fixed() {
        shard.reserved_mut(&reserved).fill(7);
        let loc = shard.publish(reserved);
        let region = &arena.regions()[arena.table().region_of(loc.block)];
        assert_eq!(region.plan.reservation, ReservationKind::Heads);
        nodes_in_order.push(region.plan.node.unwrap());
    }
    let mut want = vec![serving; 2 * slots_per_block];
    for node in topo.nodes_by_distance(serving).into_iter().skip(1) {
        want.extend(std::iter::repeat_n(node, slots_per_block));
    }
    assert_eq!(
        nodes_in_order, want,
        "heads were not handed out local-first"
    );
    // Small objects fill the local small region before the foreign ones.
    let mut small_nodes = Vec::new();
    while let Ok(reserved) = shard.try_reserve_small(60_000) {
        let loc = shard.publish(reserved);
        small_nodes.push(
            arena.regions()[arena.table().region_of(loc.block)]
                .plan
                .node
                .unwrap(),
        );
    }
    let first_foreign = small_nodes
        .iter()
        .position(|&n| n != serving)
        .expect("spilled");
    assert!(
        small_nodes[first_foreign..].iter().all(|&n| n != serving),
        "local after foreign"
    );
}

#[test]
fn perverse_maps_the_preferred_region_on_the_farthest_node() {
    if !in_vm() {
        return;
    }
    let topo = topology();
    let serving = 0;
    let farthest = topo.farthest_from(serving).unwrap();
    let mut cfg = config(NumaMode::Explicit(serving));
    cfg.perverse = true;
    cfg.sub_memory_bytes = 2 * MIB;
    cfg.small_memory_bytes = Some(2 * MIB);
    let arena = Arena::map_for_serving(MemoryPlan::new(&cfg, &topo), &topo, 1).unwrap();
    let heads: Vec<&headroom::arena::Region> = arena
        .regions()
        .iter()
        .filter(|r| r.plan.reservation == ReservationKind::Heads)
        .collect();
    assert_eq!(
        heads[0].plan.node,
        Some(farthest),
        "preferred fixed-head region"
    );
    assert_eq!(heads[0].plan.rank, 0);
    let small: Vec<&headroom::arena::Region> = arena
        .regions()
        .iter()
        .filter(|r| r.plan.reservation == ReservationKind::Small)
        .collect();
    assert_eq!(small[0].plan.node, Some(farthest), "preferred small region");
    placements(&arena);
    // The first head lands in the farthest node's memory: locality is inverted on purpose.
    let mut shard = arena.shard(0);
    let reserved = shard.try_reserve_fixed().unwrap();
    let loc = shard.publish(reserved);
    assert_eq!(
        arena.regions()[arena.table().region_of(loc.block)]
            .plan
            .node,
        Some(farthest)
    );
    println!(
        "perverse: serving node {serving}, preferred region on node {farthest} of {:?}",
        topo.node_ids()
    );
}
