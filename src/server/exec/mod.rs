//! Running commands against the store: the executor (`execute.rs`: one keyed command against
//! its partition, no protocol), a pass's replies and the partition lock (`replies.rs`), values
//! held in place for a send (`deferred.rs`), and large values streamed between a connection and
//! their segments (`large.rs`). Imports only `shard`.

pub(crate) mod deferred;
pub(crate) mod execute;
pub(crate) mod large;
pub(crate) mod replies;
