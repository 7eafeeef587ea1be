//! Headroom: a thread-per-core io_uring cache server for objects of any size, speaking
//! memcached's text, meta and binary protocols on one port.
//!
//! The crate is built in layers. The code of each module in this table imports only modules
//! listed before it; tests are the one exception (`ring`'s unit tests borrow the seeded
//! generator of [`bench`](mod@bench)), and `tests/layering.rs` checks the rule against this
//! list.
//! `docs/architecture.md` says what each module owns and imports.
//!
//! | module | what it owns |
//! | --- | --- |
//! | [`units`] | byte sizes as operators write them |
//! | [`topology`] | NUMA nodes, CPUs, distances, huge page pools, NIC and block-device nodes |
//! | [`lockfile`] | exclusive `flock`s on files for the life of the process |
//! | [`dir`] | the data directory, its files reached without following links |
//! | [`lent`] | memory lent to an I/O operation until the last user is done |
//! | [`buffer_cache`] | a shard's connection buffers, lent while a connection has bytes |
//! | [`command`] | what a client can ask of a store, whatever its protocol |
//! | [`numbers`] | numbers as memcached's `safe_strto*` read them |
//! | `sys` | the memory system calls (mmap, mbind, madvise, mlock, move_pages, statx) |
//! | [`arena`] | the RAM arena: block pools, buddy slots, bump arena, compaction, promotion |
//! | [`segment`] | targets for large values: memory or O_DIRECT files, extent allocators |
//! | [`placement`] | pure placement decisions over targets: tiers, policies, indexes |
//! | [`config`] | flags, the `--config` file, every rule, `Settings` |
//! | [`logging`] | the log, reopened on SIGHUP |
//! | [`ring`] | one shard's io_uring ring: fixed buffers, streaming pool, sends and file I/O |
//! | [`proto`] | the binary, text and meta protocols: bytes into requests, replies out |
//! | [`store`] | the key space in partitions: index, records, admission, eviction, expiry |
//! | [`snapshot`] | the warm-restart snapshot of the large values in file segments |
//! | [`ram_snapshot`] | the file format of the RAM items a graceful stop writes |
//! | [`server`] | shards, listeners, connections, the placement master, the data path, STAT |
//!
//! Beside them, [`bench`](mod@bench) is the library of the `headroom-bench` tool: it imports
//! `config`, `placement`, `proto`, `segment`, `sys` and `units`, and nothing imports it.

pub mod arena;
pub mod bench;
pub mod buffer_cache;
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
