//! Connections: the accept loops and the shard's tasks (`tasks.rs`), a connection served from
//! its socket (`serve.rs`) through its shell (`conn.rs`: the read buffer, the pass's replies,
//! what it does next) to the codec its first byte chose (`binary.rs`, `text.rs` with
//! `text_reply.rs`), the look ahead over a pipelined batch (`lookahead.rs`) and the TLS
//! handshake (`tls.rs`). The top layer of `server` below its `mod.rs`.

pub(crate) mod binary;
pub(crate) mod conn;
pub(crate) mod large_reply;
pub mod lookahead;
pub(crate) mod serve;
pub(crate) mod stream;
pub(crate) mod tasks;
pub(crate) mod text;
pub(crate) mod text_reply;
pub(crate) mod tls;
