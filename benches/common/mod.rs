//! What the benchmarks share: the arena they measure on, their command line, the median, and
//! (`gets`) pipelined GETs run as a connection runs them.
//! (`mod common;` in each bench; not a bench target itself.)

#![allow(dead_code)] // each bench uses its own share of these

use std::sync::Arc;

pub mod gets;

use headroom::arena::{Arena, ArenaConfig, MemoryPlan, NumaMode, UnlockedMapper};
use headroom::topology::Topology;

pub fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(|a, b| a.partial_cmp(b).unwrap());
    values[values.len() / 2]
}

/// The value after `--name` on the command line, parsed.
pub fn arg<T: std::str::FromStr>(args: &[String], name: &str) -> Option<T> {
    let at = args.iter().position(|a| a == name)?;
    args.get(at + 1)?.parse().ok()
}

/// Whether `cargo test --benches` is only compiling and listing (figures come from
/// `cargo bench`).
pub fn listing_only(args: &[String]) -> bool {
    args.iter().any(|a| a == "--test" || a == "--list")
}

/// An arena of `memory` bytes on the first node (2 MiB blocks, 256 KiB heads, `granule`-byte
/// small allocations): locked and bound memory when the process may lock it, plain memory
/// otherwise (said on stderr).
pub fn arena(memory: u64, granule: u64) -> Arc<Arena> {
    let topology = Topology::load().expect("topology");
    let config = ArenaConfig {
        numa: NumaMode::Explicit(topology.node_ids()[0]),
        memory_bytes: memory,
        sub_memory_bytes: 0,
        small_memory_bytes: None,
        small_sub_memory_bytes: 0,
        block_bytes: 2 << 20,
        ram_head_bytes: 256 << 10,
        small_min_alloc_bytes: granule,
        io_chunk_bytes: 1 << 20,
        stream_bytes: 0,
        perverse: false,
    };
    let plan = MemoryPlan::new(&config, &topology);
    match Arena::map_for_serving(plan.clone(), &topology, 1) {
        Ok(arena) => arena,
        Err(err) => {
            eprintln!("note: {err}; measuring on unlocked memory instead");
            Arena::map(plan, &UnlockedMapper, 1).expect("map")
        }
    }
}
