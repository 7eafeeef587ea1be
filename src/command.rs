//! What a client can ask, whatever protocol it speaks, and what came of it: the codecs
//! (`proto`) parse into these words, every request becomes one [`Command`], the executor and the
//! store act on it and answer with the outcomes below, which each codec writes in its own
//! words; so no protocol reaches the store and the store imports no protocol.

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

/// Relative expiry times above this are absolute Unix times (memcached's rule: 30 days).
pub const RELATIVE_EXPIRY_MAX_SECONDS: u32 = 30 * 24 * 3600;

/// A CAS no item ever has: what a text `cas` with unique 0 compares with (memcached compares
/// a 0 unique and fails, where the store reads a 0 CAS as "no compare").
pub const CAS_NEVER_ISSUED: u64 = u64::MAX;

/// A text protocol exptime as the store takes it. memcached's text protocol lets it be
/// negative ("expired at once"); an absolute time just past the relative range is long gone,
/// so the item is stored (or touched) and never seen again, as memcached does.
pub fn store_exptime(exptime: i32) -> u32 {
    u32::try_from(exptime).unwrap_or(RELATIVE_EXPIRY_MAX_SECONDS + 1)
}

/// What a meta get asks beyond a plain lookup.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MetaGet {
    /// `T`: a new TTL.
    pub touch: Option<u32>,
    /// `N`: create an empty item with this TTL on a miss (and win its token).
    pub vivify: Option<u32>,
    /// `R`: win the token when the item has less than this TTL left.
    pub recache: Option<u32>,
    /// Update recency, fetched bit and last access (no `u`).
    pub bump: bool,
    /// Lease a large value's extents (its value is wanted).
    pub lease: bool,
    /// `E`: the CAS of an item `vivify` creates (0: a new one).
    pub vivify_cas: u64,
    /// `C` with `v`: leave the value out when the item's CAS is this (the reader's copy is
    /// current).
    pub unless_cas: Option<u64>,
}

/// A store's value, as the codec found it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Value<'a> {
    /// Whole, in the connection's buffer.
    Whole(&'a [u8]),
    /// This many bytes follow the request on the connection, too many to buffer: the
    /// connection hands them to the executor as they arrive (`server::exec::large`).
    Streamed(u64),
}

impl Value<'_> {
    pub fn len(&self) -> u64 {
        match self {
            Value::Whole(bytes) => bytes.len() as u64,
            Value::Streamed(len) => *len,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One request, as every protocol asks it: binary, text and meta requests all become one of
/// these, and one executor runs it (`server::exec`: a keyed one against its key's store, the
/// others against the server). Expiries are as the store takes them (relative seconds up to 30 days, else a Unix
/// time; 0 never); a CAS of 0 compares nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command<'a> {
    /// A lookup: the GET family, GAT/TOUCH (`touch`: a new expiry), and with `value: false`
    /// a touch that sends no value.
    Get {
        key: &'a [u8],
        touch: Option<u32>,
        value: bool,
    },
    /// A lookup that also reports and updates the item's meta state (`mg`).
    MetaGet {
        key: &'a [u8],
        options: MetaGet,
    },
    /// The item's state without changing it (`me`).
    Inspect {
        key: &'a [u8],
    },
    /// A store. `invalidate` (`ms I`): a CAS older than the item's still stores, keeping its
    /// expiry, and marks it stale.
    Store {
        mode: StoreMode,
        key: &'a [u8],
        value: Value<'a>,
        flags: u32,
        expiry: u32,
        cas: u64,
        invalidate: bool,
        /// `E`: the CAS the stored item takes (0: a new one).
        explicit_cas: u64,
        /// An APPEND or PREPEND onto a missing item stores it with this expiry (`ms` `N`).
        vivify: Option<u32>,
        /// A store refused for want of room (out of memory, too large, no segment space, a
        /// failed segment write) drops the key's current item, so that no reader is served
        /// the value this store meant to replace: memcached's text `set`, binary SET and
        /// SETQ, and `ms` in any mode (the codec decides, by memcached 1.6.45's rule).
        drop_on_failure: bool,
    },
    /// A store of a value over the size limit: counted and refused, dropping the key's item
    /// when asked (memcached's SET does).
    Refuse {
        key: &'a [u8],
        drop_existing: bool,
    },
    Delete {
        key: &'a [u8],
        cas: u64,
    },
    /// `md`: with `invalidate`, the item is marked stale (given `ttl`) instead of removed;
    /// with `empty` (`x`), its value is emptied and it takes those flags and expiry. A marked
    /// or emptied item takes `new_cas` when not 0 (`E`), else keeps its CAS (`x`).
    MetaDelete {
        key: &'a [u8],
        cas: u64,
        invalidate: bool,
        ttl: Option<u32>,
        empty: Option<(u32, u32)>,
        new_cas: u64,
    },
    /// INCR/DECR. A miss creates the counter at `initial` with expiry `create` unless that is
    /// [`ARITH_NO_CREATE`]; `ttl` sets the expiry after a success (`ma T`); `report` asks for
    /// its expiry after (what `ma` answers).
    Arith {
        incr: bool,
        key: &'a [u8],
        delta: u64,
        initial: u64,
        create: u32,
        cas: u64,
        ttl: Option<u32>,
        report: bool,
        /// `E`: the CAS the counter takes after a success (0: a new one).
        new_cas: u64,
    },
    /// NOOP, meta's `mn`: nothing, answered in its place in the pipeline.
    Noop,
    Version,
    /// VERBOSITY: accepted; the log level is the server's (`--log-level`).
    Verbosity,
    /// FLUSH: every item dies now, or at `delay` seconds from now.
    Flush {
        delay: u32,
    },
    /// STAT: the figures of `group` (empty: the general ones).
    Stats {
        group: &'a [u8],
    },
    /// QUIT: the connection closes once the replies before it are out.
    Quit,
}

impl<'a> Command<'a> {
    /// The key whose partition runs the command; `None` for the commands that name no key
    /// (the executor runs those against the whole server).
    pub fn key(&self) -> Option<&'a [u8]> {
        match *self {
            Command::Get { key, .. }
            | Command::MetaGet { key, .. }
            | Command::Inspect { key }
            | Command::Store { key, .. }
            | Command::Refuse { key, .. }
            | Command::Delete { key, .. }
            | Command::MetaDelete { key, .. }
            | Command::Arith { key, .. } => Some(key),
            Command::Noop
            | Command::Version
            | Command::Verbosity
            | Command::Flush { .. }
            | Command::Stats { .. }
            | Command::Quit => None,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// What running a command did, whatever its protocol: each codec writes these in its words.

/// How a store ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreOutcome {
    /// Stored: the item's CAS and its value's length now (an append's sum).
    Stored {
        cas: u64,
        len: u64,
    },
    /// ADD of a live key, or a CAS mismatch.
    Exists,
    /// REPLACE of a missing key, or CAS of a missing key.
    NotFound,
    /// APPEND/PREPEND of a missing key, or a result over the size limit.
    NotStored,
    TooLarge,
    OutOfMemory,
}

impl StoreOutcome {
    /// Refused for want of room, not by the store's rules: what drops a stale value
    /// (`store::Store::drop_stale`).
    pub fn for_want_of_room(&self) -> bool {
        matches!(self, StoreOutcome::TooLarge | StoreOutcome::OutOfMemory)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeleteOutcome {
    Deleted,
    NotFound,
    Exists,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArithOutcome {
    Value { value: u64, cas: u64 },
    NotFound,
    Exists,
    NonNumeric,
    OutOfMemory,
}
