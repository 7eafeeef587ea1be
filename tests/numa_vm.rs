//! Multi-node truth, run inside the QEMU NUMA VM by `scripts/test-numa-vm` (which sets
//! HEADROOM_NUMA_VM=1): regions land on their intended nodes from per-node hugetlb pools and
//! through the fallback, heads are handed out local-first, `--sub-memory` maps on every other
//! node, and `--perverse` maps the preferred region on the farthest node. Outside the VM these
//! tests say so and return; the harness is what CI runs.

mod common;

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

/// Starts the server binary `scripts/test-numa-vm` passes in (`/test/headroom`) with its data
/// directory in `/tmp/NAME`.
fn vm_server(name: &str, args: &[&str]) -> common::server::Server {
    let binary = "/test/headroom";
    assert!(
        std::path::Path::new(binary).exists(),
        "{binary} is missing: scripts/test-numa-vm passes it with NUMA_VM_FILES"
    );
    let dir = std::path::PathBuf::from("/tmp").join(name);
    std::fs::create_dir_all(&dir).unwrap();
    common::server::Server::start_binary(binary, &[], &dir, args)
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

/// Score-based promotion on a real server: heads fill the local fixed-head blocks first and
/// spill into node 1; reads make some foreign heads hot; a pass exchanges their blocks with
/// local ones, and the kernel (`move_pages`, asked by the server for `ADMIN where`) then puts
/// every hot head on node 0. Every GET is byte-exact before, during and after.
#[test]
fn promotion_brings_hot_heads_home() {
    if !in_vm() {
        return;
    }
    let _ = topology();
    // Fixed heads: 2 blocks on node 0, 4 on node 1 (8 heads of 256 KiB each); records apart.
    let server = vm_server(
        "promotion",
        &[
            "--numa",
            "0",
            "--memory",
            "4M",
            "--sub-memory",
            "8M",
            "--small-memory",
            "2M",
            "--threads",
            "1",
            "--io-pool",
            "2M",
            "--segment",
            "mem:size=16M,numa=0",
            "--promotion-interval",
            "0",
        ],
    );
    let mut c = server.client();
    // Exactly --ram-head: a fixed head (a smaller value may be packed with its record).
    let value = |i: usize| common::pattern(i as u64, 256 << 10);
    let keys: Vec<String> = (0..48).map(|i| format!("head{i:02}")).collect();
    for (i, key) in keys.iter().enumerate() {
        assert_eq!(c.set(key.as_bytes(), &value(i), 0, 0).status, 0, "{key}");
    }
    let general = c.stats("");
    let evictions: Vec<_> = general
        .iter()
        .filter(|(n, _)| n == "evictions" || n == "curr_items")
        .collect();
    assert!(
        general.iter().any(|(n, v)| n == "evictions" && v == "0"),
        "filling evicted: {evictions:?} {:?}",
        c.stats("arena")
            .iter()
            .filter(|(n, _)| n.starts_with("region"))
            .collect::<Vec<_>>()
    );
    let check_all = |c: &mut common::server::Client| {
        for (i, key) in keys.iter().enumerate() {
            assert!(c.get(key.as_bytes()).value == value(i), "{key} changed");
        }
    };
    let locate = |_: &mut common::server::Client, key: &str| -> (String, u32, i32) {
        let text = server
            .admin(&format!("where {key}"))
            .unwrap_or_else(|err| panic!("where {key}: {err}"));
        let field = |name: &str| -> String {
            let words: Vec<&str> = text.split_whitespace().collect();
            let at = words.iter().position(|w| *w == name).unwrap();
            words[at + 1].to_string()
        };
        let block = field("slot").split('+').next().unwrap().to_string();
        (
            block,
            field("rank").parse().unwrap(),
            field("node").parse().unwrap(),
        )
    };
    check_all(&mut c);
    let places: Vec<(String, u32, i32)> = keys.iter().map(|k| locate(&mut c, k)).collect();
    assert_eq!(
        places.iter().filter(|p| p.1 == 0).count(),
        16,
        "local blocks fill first"
    );
    assert!(
        places.iter().all(|p| (p.1 == 0) == (p.2 == 0)),
        "rank 0 is node 0: {places:?}"
    );
    // The hot set: the heads of two foreign blocks.
    let mut foreign_blocks: Vec<String> = places
        .iter()
        .filter(|p| p.1 != 0)
        .map(|p| p.0.clone())
        .collect();
    foreign_blocks.sort();
    foreign_blocks.dedup();
    let hot_blocks = &foreign_blocks[..2];
    let hot: Vec<usize> = (0..keys.len())
        .filter(|&i| hot_blocks.contains(&places[i].0))
        .collect();
    assert_eq!(hot.len(), 16);
    for _ in 0..6 {
        for &i in &hot {
            assert!(c.get(keys[i].as_bytes()).value == value(i));
        }
    }
    let text = server.admin("promote").unwrap();
    assert!(text.starts_with("promoted: 2 block exchanges"), "{text}");
    check_all(&mut c);
    for &i in &hot {
        let (_, rank, node) = locate(&mut c, &keys[i]);
        assert_eq!((rank, node), (0, 0), "hot {} is not home", keys[i]);
    }
    // A second pass finds nothing more to do: the local blocks hold the hottest heads.
    assert!(server
        .admin("promote")
        .unwrap()
        .starts_with("promoted: 0 block exchanges"));
    let stats = c.stats("arena");
    let stat = |name: &str| -> u64 {
        stats
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.parse().unwrap())
            .unwrap()
    };
    assert_eq!(stat("promotion_exchanges"), 2);
    assert_eq!(stat("promotion_bytes_moved"), 4 * 2 * MIB);
    assert!(stat("head_bytes_read_foreign") >= 16 * 6 * (256 << 10));
    check_all(&mut c);
    assert_eq!(server.stop().code(), Some(0));
}

/// The multi-core stress workload (`tests/common/stress.rs`, which `tests/partition_stress.rs`
/// runs on the host) on a two-node plan, with promotion exchanging blocks under it. Fixed
/// heads fill node 0's head blocks and spill onto node 1; readers make one block's heads hot
/// after another (a new block every second, scores halving every second), so promotion keeps
/// finding foreign blocks hotter than local ones while connections on both shards hammer the
/// contested keys. Every GET is byte-exact: a head that moved while it was pinned for a send
/// would come out torn. Needs two CPUs on node 0: `scripts/test-numa-vm` runs it in a VM of
/// its own.
#[test]
fn every_core_hammers_one_key_set_while_promotion_runs() {
    use common::stress::{check, expire_then_evict, hammer, value, CheckingReaders, Hammer};
    use std::sync::Arc;

    if !in_vm() {
        return;
    }
    let topo = topology();
    let node0_cpus = topo.node(0).map_or(0, |n| n.cpus.len());
    assert!(
        node0_cpus >= 2,
        "node 0 has {node0_cpus} CPU(s); the stress needs a shard on each of two (NUMA_VM_CPUS_PER_NODE=2)"
    );
    let seed = common::seeds("numa_vm stress", 1)[0];
    // Fixed heads: 4 blocks on node 0 and 8 on node 1, shared by two shards.
    let server = vm_server(
        "stress",
        &[
            "--numa",
            "0",
            "--threads",
            "2",
            "--memory",
            "8M",
            "--sub-memory",
            "16M",
            "--small-memory",
            "4M",
            "--io-pool",
            "2M",
            "--segment",
            "mem:size=32M,numa=0",
            "--promotion-interval",
            "20",
            "--promotion-half-life",
            "1",
        ],
    );
    const HEAD: usize = 256 << 10;
    let mut c = server.client();
    let heads: Vec<String> = (0..48).map(|i| format!("h{i:02}")).collect();
    for (i, key) in heads.iter().enumerate() {
        let r = c.set(key.as_bytes(), &value(key, 0, i, HEAD), 0, 0);
        assert_eq!(r.status, 0, "SET {key}");
    }
    // Group the heads by the block they landed in, foreign blocks first.
    let mut blocks: Vec<(bool, String, Vec<String>)> = Vec::new();
    for key in &heads {
        let text = server.admin(&format!("where {key}")).unwrap();
        let words: Vec<&str> = text.split_whitespace().collect();
        let field = |name: &str| words[words.iter().position(|w| *w == name).unwrap() + 1];
        let block = field("slot").split('+').next().unwrap().to_string();
        let local = field("rank") == "0";
        match blocks.iter_mut().find(|b| b.1 == block) {
            Some(b) => b.2.push(key.clone()),
            None => blocks.push((local, block, vec![key.clone()])),
        }
    }
    blocks.sort_by_key(|b| b.0);
    let foreign = blocks.iter().filter(|b| !b.0).count();
    assert!(
        foreign >= 2 && foreign < blocks.len(),
        "the heads should fill local blocks and spill: {blocks:?}"
    );
    let groups: Arc<Vec<Vec<String>>> = Arc::new(blocks.into_iter().map(|b| b.2).collect());

    let started = std::time::Instant::now();
    let hot = Arc::clone(&groups);
    let readers = CheckingReaders::start(server.addr, 2, move |r, i| {
        let group = &hot[started.elapsed().as_secs() as usize % hot.len()];
        group[(r + i) as usize % group.len()].clone()
    });
    let arena_stat = |c: &mut common::server::Client, name: &str| c.stat("arena", name);
    let exchanges_before = arena_stat(&mut c, "promotion_exchanges");
    let size = Hammer {
        clients: 4,
        keys: 24,
        ops_per_client: 300,
        large_value_bytes: HEAD,
    };
    // Churn: one more connection overwrites 50 packed keys (16-48 KiB) while the hammer runs, so
    // the small-object arena fills with dead bytes and admission compacts under the hammer.
    let hammering = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let churn = {
        let (addr, hammering) = (server.addr, Arc::clone(&hammering));
        std::thread::spawn(move || {
            let mut c = common::server::Client::connect(addr);
            let mut n = 0;
            while hammering.load(std::sync::atomic::Ordering::Relaxed) {
                let k = format!("c{}", n % 50);
                let r = c.set(
                    k.as_bytes(),
                    &value(&k, 7, n, 16384 + n * 4099 % 32768),
                    0,
                    0,
                );
                assert_eq!(r.status, 0, "SET {k}");
                n += 1;
            }
            n
        })
    };
    let compactions_before = c.stat("", "compactions");
    hammer(&server, seed, size);
    hammering.store(false, std::sync::atomic::Ordering::Relaxed);
    let churned = churn.join().expect("the churn writer failed");
    let compactions = c.stat("", "compactions") - compactions_before;
    let exchanges = arena_stat(&mut c, "promotion_exchanges") - exchanges_before;
    let hits = readers.stop();
    let skipped = arena_stat(&mut c, "promotion_skipped_pinned");
    println!(
        "stress on two nodes: {} s, {exchanges} block exchanges during the hammer, \
         {skipped} blocks skipped for pins, {} hot-head hits",
        started.elapsed().as_secs(),
        hits
    );
    assert!(
        exchanges > 0,
        "promotion exchanged no block under the hammer"
    );
    // Every head is still exact, wherever it went.
    for key in groups.iter().flatten() {
        let got = c.get(key.as_bytes());
        assert_eq!(got.status, 0, "{key} lost");
        check(key, &got.value);
    }
    // 60 heads and 60 small values on top of the 48 heads: more than the 24 MiB of head blocks.
    println!(
        "stress on two nodes: {churned} churn SETs, {compactions} compactions during the hammer"
    );
    assert!(compactions > 0, "nothing was compacted under the hammer");
    for k in (0..50).map(|k| format!("c{k}")) {
        let got = c.get(k.as_bytes());
        assert_eq!(got.status, 0, "{k} lost");
        check(&k, &got.value);
    }
    expire_then_evict(&server, 120, HEAD);
    assert_eq!(server.stop().code(), Some(0));
}
