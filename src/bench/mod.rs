//! `headroom-bench`: the load generator, the `--perverse` A/B, the side-by-side peer run, the
//! offline placement replay and the live RL pattern (`docs/benchmarks.md`). Every figure it
//! prints comes from a run it made.
//!
//! Pure parts first (seeded generators, statistics, the trace format, the SVG), then what
//! touches the network and processes (`client`, `process`, `load`, `rl`), then the
//! comparisons built on them (`compare`) and the offline `replay` over the placement master's
//! own code. Nothing in the server depends on this module.

pub mod client;
pub mod compare;
pub mod load;
pub mod meta;
pub mod process;
pub mod replay;
pub mod report;
pub mod rl;
pub mod rng;
pub mod server_latency;
pub mod stats;
pub mod svg;
pub mod trace;
pub mod workload;
