//! Operating the server: the metrics endpoint (`metrics.rs`), the warm
//! restart (`warm.rs`, its part files `part_file.rs`), the placement master (`master.rs`) and
//! the admin socket (`admin.rs`). Imports `exec` and `shard`, never `net`.

pub(crate) mod admin;
pub(crate) mod master;
pub mod metric_table;
pub mod metrics;
pub(crate) mod part_file;
pub(crate) mod warm;
