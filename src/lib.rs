//! Headroom: a thread-per-core io_uring cache server for objects of any size.
//!
//! Modules, lowest first: [`topology`] (the machine), [`config`] (flags and rules),
//! [`arena`] (the RAM arena of ADR-0008). Each depends only on those before it.

pub mod arena;
pub mod config;
pub mod placement;
pub mod proto;
pub mod segment;
pub mod server;
pub mod store;
pub mod topology;
