//! Running one keyed request against its partition's store (held by the caller) and composing
//! its reply, exactly as memcached's binary protocol answers. How a found value leaves (copied
//! into the reply, lent from the arena, or streamed from its segment) is shared by every wire
//! protocol: [`lends`], [`lend`] and [`deliver_large`].

use crate::arena::{SendPin, SlotBytes};
use crate::proto::{Request, ResponseWriter, Status};
use crate::store::{ArithOutcome, DeleteOutcome, LargeHit, Lookup, Store, StoreOutcome};

use super::watch::{self, Fetched, Watchers};

/// A GET-family hit on a large item: its reply is streamed by the connection (head from RAM,
/// the rest from the segment), in its place among the other replies.
#[derive(Debug)]
pub struct LargeGet {
    /// The reply's bytes before the value (the protocol's header for it), and after it.
    pub prefix: Vec<u8>,
    pub suffix: &'static [u8],
    pub hit: LargeHit,
    /// The head copy pinned for a zero-copy send (then `hit.head` is empty).
    pub head_pin: Option<SendPin>,
    /// The partition holding the lease (and the pin).
    pub owner: usize,
}

impl LargeGet {
    /// Bytes of the value sent from RAM before the segment is read.
    pub fn head_len(&self) -> usize {
        self.hit.head.len() + self.head_pin.as_ref().map_or(0, SendPin::len)
    }
}

/// A GET hit whose value bytes leave zero-copy, straight from the arena, after the reply's
/// header (already in the output): pinned in partition `owner` until the kernel is done with
/// them.
#[derive(Debug)]
pub struct LentGet {
    pub pin: SendPin,
    pub owner: usize,
}

/// A reply part the connection sends itself, in its place among the other replies.
#[derive(Debug)]
pub enum Deferred {
    /// A large value: header, head and the rest streamed from its segment.
    Large(LargeGet),
    /// A value sent zero-copy from the arena.
    Lent(LentGet),
}

/// Whether a found value in RAM of `len` bytes is lent from the arena (at least `lend_from`)
/// rather than copied into the reply after its header.
pub fn lends(len: usize, lend_from: Option<usize>) -> bool {
    lend_from.is_some_and(|min| len > 0 && len >= min.max(1))
}

/// Pins a found value's `len` bytes at `at` for the connection to send in its place.
pub fn lend(
    store: &mut Store,
    owner: usize,
    at: (crate::arena::HeadLoc, usize),
    len: usize,
) -> Deferred {
    let pin = store.pin_for_send(at, len);
    Deferred::Lent(LentGet { pin, owner })
}

/// A found large value: its head copy pinned (at least `lend_from` long) or copied, the rest
/// streamed from its segment by the connection between `prefix` (the protocol's header for the
/// value) and `suffix`.
pub fn deliver_large(
    store: &mut Store,
    owner: usize,
    mut hit: LargeHit,
    prefix: Vec<u8>,
    suffix: &'static [u8],
    lend_from: Option<usize>,
) -> Deferred {
    let mut head_pin = None;
    if let Some((slot, len)) = hit.head_at {
        if lend_from.is_some_and(|min| len >= min.max(1)) {
            head_pin = Some(store.pin_for_send((slot, 0), len));
        } else {
            hit.head = store.fixed_bytes(slot, len).to_vec();
        }
    }
    Deferred::Large(LargeGet {
        prefix,
        suffix,
        hit,
        head_pin,
        owner,
    })
}

/// A store as `watch` logs it.
pub struct WatchedStore<'k> {
    pub key: &'k [u8],
    pub mode: crate::proto::StoreMode,
    pub with_cas: bool,
    /// memcached's exptime (relative seconds, or a Unix time past 30 days; 0 never).
    pub exptime: u32,
    pub bytes: u64,
    pub now: u32,
}

/// Runs `run` (a store) and logs it to `watch`ers as memcached does: first the lookup of the
/// item it replaces (an `item_get` line), then the outcome (`item_store`). With no watcher this
/// is two atomic loads.
pub fn watched_store(
    store: &mut Store,
    (watchers, fd): (&Watchers, i32),
    what: WatchedStore<'_>,
    run: impl FnOnce(&mut Store) -> StoreOutcome,
) -> StoreOutcome {
    if watchers.wants(watch::FETCHERS) {
        let fetched = match store.meta_of(what.key, what.now) {
            Some(_) => Fetched::Found { class: 1, bytes: 0 },
            None => Fetched::NotFound,
        };
        watchers.fetched(what.key, fetched, fd);
    }
    let outcome = run(store);
    if watchers.wants(watch::MUTATIONS) {
        let ttl = match crate::store::absolute_expiry(what.exptime, what.now) {
            0 => 0,
            at => at.saturating_sub(what.now),
        };
        let (key, mode) = (what.key, what.mode);
        watchers.stored(key, mode, what.with_cas, outcome, ttl, what.bytes, fd);
    }
    outcome
}

/// Runs a request that has a key (GET family, stores, DELETE, INCR/DECR, too-large stores)
/// and appends its reply, if any, to `out`. Quiet requests reply only on errors (and GETQ
/// family only on hits), as memcached does. A hit on a large value returns its [`LargeGet`]
/// instead of a reply; with `lend_from`, a hit on a value of at least that many bytes appends
/// only its header and returns the value pinned ([`LentGet`]). `owner` is this store's
/// partition. GETs and stores are logged to `watch`ers as the connection on socket `fd`.
#[allow(clippy::too_many_arguments)]
pub fn execute_keyed(
    store: &mut Store,
    owner: usize,
    request: &Request<'_>,
    opcode: u8,
    opaque: u32,
    now: u32,
    out: &mut Vec<u8>,
    lend_from: Option<usize>,
    watchers: &Watchers,
    fd: i32,
) -> Option<Deferred> {
    // (TOUCH, a GET-family request without a value, is not a fetch in memcached's log.)
    let log_fetch = |fetched: Fetched| {
        if let Request::Get {
            key, value: true, ..
        } = *request
        {
            watchers.fetched(key, fetched, fd);
        }
    };
    let mut w = ResponseWriter::new(out);
    match *request {
        Request::Get {
            key,
            quiet,
            with_key,
            touch,
            value,
        } => match store.lookup(key, touch, now, value) {
            Lookup::Large(hit) if value => {
                log_fetch(Fetched::Found {
                    class: 3,
                    bytes: hit.value_len,
                });
                let key: &[u8] = if with_key { key } else { &[] };
                let mut prefix = Vec::with_capacity(32 + key.len());
                let mut header = ResponseWriter::new(&mut prefix);
                header.header(
                    opcode,
                    opaque,
                    Status::Ok,
                    hit.cas,
                    4,
                    key.len() as u16,
                    hit.value_len as u32,
                );
                header.body(&hit.flags.to_be_bytes());
                header.body(key);
                return Some(deliver_large(store, owner, hit, prefix, b"", lend_from));
            }
            Lookup::Large(hit) => {
                // TOUCH: flags and CAS, no value.
                w.header(opcode, opaque, Status::Ok, hit.cas, 4, 0, 0);
                w.body(&hit.flags.to_be_bytes());
            }
            Lookup::Small(hit) => {
                log_fetch(Fetched::Found {
                    class: 1,
                    bytes: hit.value.len() as u64,
                });
                let key_part: &[u8] = if with_key { key } else { &[] };
                let value_part = if value {
                    hit.value
                } else {
                    SlotBytes::default()
                };
                w.header(
                    opcode,
                    opaque,
                    Status::Ok,
                    hit.cas,
                    4,
                    key_part.len() as u16,
                    value_part.len() as u32,
                );
                w.body(&hit.flags.to_be_bytes());
                w.body(key_part);
                if !lends(value_part.len(), lend_from) {
                    for run in value_part.parts() {
                        w.body(run);
                    }
                    return None;
                }
                let (at, len) = (hit.at, value_part.len());
                return Some(lend(store, owner, at, len));
            }
            Lookup::Miss => {
                log_fetch(Fetched::NotFound);
                // GETK/GATK misses carry the key and no message; the others memcached's text.
                if quiet {
                } else if with_key {
                    w.reply(opcode, opaque, Status::NotFound, 0, &[], key, &[]);
                } else {
                    w.error(opcode, opaque, Status::NotFound);
                }
            }
        },
        Request::Store {
            mode,
            key,
            value,
            flags,
            expiry,
            cas,
            quiet,
        } => match watched_store(
            store,
            (watchers, fd),
            WatchedStore {
                key,
                mode,
                with_cas: cas != 0,
                exptime: expiry,
                bytes: value.len() as u64,
                now,
            },
            |store| store.store(mode, key, value, flags, expiry, cas, now),
        ) {
            StoreOutcome::Stored { cas } => {
                if !quiet {
                    // A SETX reply counts the replicas placed: none, for a value kept in RAM.
                    let extras: &[u8] = if opcode == crate::proto::opcode::SETX {
                        &[0]
                    } else {
                        &[]
                    };
                    w.reply(opcode, opaque, Status::Ok, cas, extras, &[], &[]);
                }
            }
            StoreOutcome::Exists => w.error(opcode, opaque, Status::Exists),
            StoreOutcome::NotFound => w.error(opcode, opaque, Status::NotFound),
            StoreOutcome::NotStored => w.error(opcode, opaque, Status::NotStored),
            StoreOutcome::TooLarge => w.error(opcode, opaque, Status::TooLarge),
            StoreOutcome::OutOfMemory => w.error(opcode, opaque, Status::OutOfMemory),
        },
        Request::TooLarge { key, drop_existing } => {
            store.refuse_too_large(key, drop_existing);
            w.error(opcode, opaque, Status::TooLarge);
        }
        Request::Delete { key, cas, quiet } => match store.delete(key, cas, now) {
            DeleteOutcome::Deleted => {
                if !quiet {
                    w.reply(opcode, opaque, Status::Ok, 0, &[], &[], &[]);
                }
            }
            DeleteOutcome::NotFound => w.error(opcode, opaque, Status::NotFound),
            DeleteOutcome::Exists => w.error(opcode, opaque, Status::Exists),
        },
        Request::Arith {
            incr,
            key,
            delta,
            initial,
            expiry,
            cas,
            quiet,
        } => match store.arith(incr, key, delta, initial, expiry, cas, now) {
            ArithOutcome::Value { value, cas } => {
                if !quiet {
                    w.reply(
                        opcode,
                        opaque,
                        Status::Ok,
                        cas,
                        &[],
                        &[],
                        &value.to_be_bytes(),
                    );
                }
            }
            ArithOutcome::NotFound => w.error(opcode, opaque, Status::NotFound),
            ArithOutcome::Exists => w.error(opcode, opaque, Status::Exists),
            ArithOutcome::NonNumeric => w.error(opcode, opaque, Status::NonNumeric),
            ArithOutcome::OutOfMemory => w.error(opcode, opaque, Status::OutOfMemory),
        },
        _ => unreachable!("only keyed requests are executed by a store"),
    }
    None
}
