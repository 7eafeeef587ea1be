//! Headroom: a thread-per-core io_uring cache server for objects of any size.
//!
//! Modules, lowest first: [`units`] (byte sizes), [`topology`] (the machine), `sys` (memory system calls), [`config`]
//! (flags and rules), [`arena`] (the RAM arena of ADR-0008), [`segment`] (store targets and
//! their extents, no keys), [`placement`] (pure placement decisions), [`proto`] (the wire
//! format, no store), [`store`] (one shard's keys and items), [`server`] (shards, connections,
//! the mesh), and apart from them [`bench`] (the benchmark tool's library: it uses `placement`
//! and `units`, and nothing depends on it). Each depends only on those before it; `docs/architecture.md` has the table.

pub mod arena;
pub mod bench;
pub mod config;
pub mod dir;
pub mod lockfile;
pub mod logging;
pub mod placement;
pub mod proto;
pub mod ring;
pub mod segment;
pub mod server;
pub mod snapshot;
pub mod store;
mod sys;
pub mod topology;
pub mod units;
