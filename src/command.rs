//! What a client can ask of a store, whatever protocol it speaks: the codecs (`proto`) parse
//! into these words and the store (`store`) acts on them, so neither imports the other.

/// How a store command decides whether to store: SET always, ADD only a missing key, REPLACE
/// only an existing one, APPEND and PREPEND onto an existing value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreMode {
    Set,
    Add,
    Replace,
    Append,
    Prepend,
}

/// INCR/DECR with this expiry fail on a missing key instead of creating it.
pub const ARITH_NO_CREATE: u32 = 0xffff_ffff;
