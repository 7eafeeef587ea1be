//! Running commands against the store: the executor (`execute.rs`: one keyed command against
//! its partition, no protocol), a pass's replies and the partition lock (`replies.rs`), values
//! held in place for a send (`deferred.rs`), and large values streamed between a connection and
//! their segments (`large.rs`); the commands that name no key (`control.rs`), STAT's figures
//! among them (`stats.rs`). Imports only `shard`.

pub(crate) mod control;
pub(crate) mod deferred;
pub(crate) mod execute;
pub(crate) mod large;
pub(crate) mod replies;
pub(crate) mod stats;
