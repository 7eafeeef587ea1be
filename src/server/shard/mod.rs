//! What every task of a shard shares, and the leaf services it holds: the server's shared
//! state (`shared.rs`), a shard's context (`ctx.rs`: its ring, pools, counters, the mesh), the
//! ring's socket I/O with its time limits, the listeners and sockets bound at start, SASL
//! credentials, the TLS certificate, `watch` streams, latency histograms, the data directory,
//! the open-files limit.
//! The bottom layer of `server`: it imports nothing from `exec`, `ops` or `net`.

pub(crate) mod auth;
pub(crate) mod auth_gate;
pub(crate) mod counters;
pub(crate) mod ctx;
pub mod data_dir;
pub(crate) mod endpoint;
pub(crate) mod event;
pub mod latency;
pub(crate) mod limits;
pub mod listen;
pub(crate) mod log_limit;
pub(crate) mod open_files;
pub(crate) mod shared;
pub mod tls_config;
pub mod tls_stage;
pub(crate) mod unix_socket;
pub mod user;
pub(crate) mod warm_report;
pub(crate) mod watch;
pub(crate) mod wire;
