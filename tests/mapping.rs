//! Real mappings on this machine: the hugetlb path (pages reserved through
//! /proc/sys/vm/nr_hugepages when root, the old value restored) and the fallback path (no
//! pages), both verified by reading back where every page sits.

mod common;

use std::sync::Mutex;

use common::{HugePages, NR_HUGEPAGES};

use headroom::arena::{Arena, ArenaConfig, Backing, MemoryPlan, NumaMode};
use headroom::topology::Topology;

/// nr_hugepages is machine-wide: tests that change it take turns.
static HUGEPAGES: Mutex<()> = Mutex::new(());

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Whether this run must exercise the root-only paths (CI runs as root and sets it).
fn root_required() -> bool {
    std::env::var_os("HEADROOM_REQUIRE_ROOT_TESTS").is_some()
}

fn config(node: u32, memory: u64) -> ArenaConfig {
    ArenaConfig {
        numa: NumaMode::Explicit(node),
        memory_bytes: memory,
        sub_memory_bytes: 0,
        small_memory_bytes: None,
        small_sub_memory_bytes: 0,
        block_bytes: 2 << 20,
        ram_head_bytes: 256 << 10,
        small_min_alloc_bytes: 16,
        io_chunk_bytes: 1 << 20,
        stream_bytes: 0,
        perverse: false,
    }
}

/// Maps, checks every page is on `node`, writes and reads back through the arena.
fn map_and_verify(topology: &Topology, node: u32, memory: u64) -> Backing {
    let plan = MemoryPlan::new(&config(node, memory), topology);
    let arena = Arena::map_for_serving(plan, topology, 1).expect("map");
    let region = &arena.regions()[0];
    let nodes = region.page_nodes().unwrap();
    assert_eq!(nodes.len() as u64, memory / region.page_bytes() as u64);
    assert!(
        nodes.iter().all(|&n| n == node as i32),
        "pages off node {node}: {nodes:?}"
    );
    let mut shard = arena.shard(0);
    let reserved = shard.try_reserve_fixed().unwrap();
    shard.reserved_mut(&reserved).fill(0x5a);
    let loc = shard.publish(reserved);
    assert!(shard.bytes(loc).iter().all(|&b| b == 0x5a));
    shard.free(loc);
    region.backing.clone()
}

fn vm_locked_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmLck:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn fallback_path_binds_locks_and_places_every_page() {
    let _turn = HUGEPAGES.lock().unwrap_or_else(|e| e.into_inner());
    let _pages = is_root().then(|| HugePages::set(0));
    let topology = Topology::from_sysfs("/sys".as_ref()).unwrap();
    let node = topology.node_ids()[0];
    let locked_before = vm_locked_kib();
    let plan = MemoryPlan::new(&config(node, 8 << 20), &topology);
    let arena = Arena::map_for_serving(plan, &topology, 1).expect("map");
    let region = &arena.regions()[0];
    match &region.backing {
        Backing::Fallback { reason } => assert!(reason.contains("pool"), "{reason}"),
        other => panic!("expected the fallback with no huge pages reserved, got {other}"),
    }
    assert_eq!(region.page_bytes(), 4096);
    let nodes = region.page_nodes().unwrap();
    assert_eq!(nodes.len(), 2048);
    assert!(nodes.iter().all(|&n| n == node as i32));
    assert!(
        vm_locked_kib() >= locked_before + 8 * 1024,
        "region is not locked"
    );
    drop(arena);
    let _ = map_and_verify(&topology, node, 4 << 20);
}

#[test]
fn hugetlb_path_takes_pages_from_the_nodes_pool() {
    if !is_root() {
        assert!(
            !root_required(),
            "HEADROOM_REQUIRE_ROOT_TESTS is set but this is not root"
        );
        println!("skipped: reserving huge pages needs root");
        return;
    }
    let _turn = HUGEPAGES.lock().unwrap_or_else(|e| e.into_inner());
    let _pages = HugePages::set(8);
    let reserved: u64 = std::fs::read_to_string(NR_HUGEPAGES)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        reserved >= 4,
        "the kernel reserved only {reserved} huge pages"
    );
    let topology = Topology::from_sysfs("/sys".as_ref()).unwrap();
    let node = topology.node_ids()[0];
    // Pages a process of an earlier test still holds (a server exiting, on a machine that had
    // a pool reserved) leave this pool short until it is gone: wait for them, up to a bound.
    let free_path =
        format!("/sys/devices/system/node/node{node}/hugepages/hugepages-2048kB/free_hugepages");
    let free = || -> u64 {
        std::fs::read_to_string(&free_path)
            .ok()
            .and_then(|text| text.trim().parse().ok())
            .unwrap_or(0)
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while free() < 4 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    // The plan takes the pool's free pages from the topology: read it again.
    let topology = Topology::from_sysfs("/sys".as_ref()).unwrap();
    match map_and_verify(&topology, node, 8 << 20) {
        Backing::HugeTlb { page_bytes } => assert_eq!(page_bytes, 2 << 20),
        other => panic!("expected hugetlb with 8 pages reserved, got {other}"),
    }
}

#[test]
fn a_short_pool_falls_back_with_the_same_geometry() {
    if !is_root() {
        assert!(
            !root_required(),
            "HEADROOM_REQUIRE_ROOT_TESTS is set but this is not root"
        );
        println!("skipped: reserving huge pages needs root");
        return;
    }
    let _turn = HUGEPAGES.lock().unwrap_or_else(|e| e.into_inner());
    let _pages = HugePages::set(2);
    let topology = Topology::from_sysfs("/sys".as_ref()).unwrap();
    let node = topology.node_ids()[0];
    let plan = MemoryPlan::new(&config(node, 8 << 20), &topology);
    let blocks = plan.total_blocks();
    let arena = Arena::map_for_serving(plan, &topology, 1).expect("map");
    assert_eq!(arena.regions()[0].backing.name(), "fallback");
    assert_eq!(
        arena.table().len() as u32,
        blocks,
        "geometry changed on fallback"
    );
    assert_eq!(arena.regions()[0].mapping().len(), 8 << 20);
}

#[test]
fn memlock_limit_is_checked_before_mapping() {
    // An unprivileged user (no CAP_IPC_LOCK) with a 1 MiB RLIMIT_MEMLOCK: start-up must fail
    // at once, saying how much is needed and how to grant it, without mapping anything.
    if !is_root() {
        assert!(
            !root_required(),
            "HEADROOM_REQUIRE_ROOT_TESTS is set but this is not root"
        );
        println!("skipped: switching to an unprivileged user needs root");
        return;
    }
    let data_dir = common::fresh_temp_path("memlock");
    let out = std::process::Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "prlimit",
            "--memlock=1048576",
        ])
        .arg(env!("CARGO_BIN_EXE_headroom"))
        .args(["--memory", "64M", "--threads", "1", "--io-pool", "2M"])
        .args(["--log-level", "warn", "--listen", "127.0.0.1:0"])
        // A data directory the unprivileged user may create (the lock is taken before mapping).
        .arg("--data-dir")
        .arg(&data_dir)
        .output()
        .expect("setpriv and prlimit (util-linux) run");
    let _ = std::fs::remove_dir_all(&data_dir);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("locks 66 MiB")
            && stderr.contains("allows 1 MiB")
            && stderr.contains("CAP_IPC_LOCK"),
        "{stderr}"
    );
}
