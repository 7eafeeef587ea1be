//! Headroom: a thread-per-core io_uring cache server for objects of any size.
//!
//! Modules, lowest first: `units`, `topology`, `lockfile`, `dir`, `lent`, `command`, `numbers`,
//! `sys`, `arena`, `segment`, `placement`, `config`, `logging`, `ring`, `proto`, `store`,
//! `snapshot`, `server`; each depends only on those before it, and `bench` (the benchmark
//! tool's library) stands apart. `docs/architecture.md` has what each owns and imports.

pub mod arena;
pub mod bench;
pub mod command;
pub mod config;
pub mod dir;
pub mod lent;
pub mod lockfile;
pub mod logging;
pub mod numbers;
pub mod placement;
pub mod proto;
pub mod ram_snapshot;
pub mod ring;
pub mod segment;
pub mod server;
pub mod snapshot;
pub mod store;
mod sys;
pub mod topology;
pub mod units;
