//! The executor of keyed commands: runs a [`Command`] against its partition's store (held by
//! the caller) and hands each outcome to the protocol's [`Reply`], which writes the bytes (the
//! commands that name no key run in `control.rs`). It
//! knows no protocol. How a found value leaves (copied into the reply, lent from the arena, or
//! streamed from its segment) is decided here for every protocol: [`lends`], [`lend`] and
//! [`deliver_large`].

use crate::arena::SendPin;
use crate::command::{Command, MetaGet, StoreMode, Value};
use crate::store::{
    ArithOutcome, DeleteOutcome, LargeHit, Lookup, MetaState, Store, StoreOutcome, CAS_NEVER_ISSUED,
};

use crate::server::shard::watch::{self, Fetched, Watchers};

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
    pub mode: StoreMode,
    pub with_cas: bool,
    /// memcached's exptime (relative seconds, or a Unix time past 30 days; 0 never).
    pub exptime: u32,
    pub bytes: u64,
    pub now: u32,
}

/// Runs `run` (a store) and logs it to `watch`ers as memcached does: first the lookup of the
/// item it replaces (an `item_get` line), what it evicted to make room (`eviction`), then the
/// outcome (`item_store`). With no watcher this is three atomic loads.
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
    let log_evictions = watchers.wants(watch::EVICTIONS);
    if log_evictions {
        store.log_evictions(true);
    }
    let outcome = run(store);
    if log_evictions {
        for evicted in store.take_evicted() {
            watchers.evicted(&evicted, what.now);
        }
        store.log_evictions(false);
    }
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

/// Runs `run` (a delete named `cmd`) and logs what it removed to `watch deletions` as
/// memcached does; a miss is not logged. With no watcher this is one atomic load.
fn watched_delete(
    store: &mut Store,
    watchers: &Watchers,
    (key, cmd, now): (&[u8], &str, u32),
    run: impl FnOnce(&mut Store) -> DeleteOutcome,
) -> DeleteOutcome {
    let removed = watchers
        .wants(watch::DELETIONS)
        .then(|| store.value_size(key, now))
        .flatten();
    let outcome = run(store);
    if let (DeleteOutcome::Deleted, Some((class, bytes))) = (outcome, removed) {
        watchers.deleted(key, cmd, class, bytes);
    }
    outcome
}

/// What a lookup found, for a reply's header (or whole reply, when no value follows).
#[derive(Clone, Copy, Debug)]
pub struct Found {
    pub flags: u32,
    pub cas: u64,
    /// The value's bytes.
    pub len: usize,
    /// Whether the value follows the header.
    pub value: bool,
    /// The item's meta state (`mg`, `me`).
    pub state: Option<MetaState>,
    /// When it was found (Unix seconds), for the TTL and last access a reply shows.
    pub now: u32,
}

/// What an INCR/DECR reports beyond its outcome, when the command asked (`report`).
#[derive(Clone, Copy, Debug, Default)]
pub struct Counted {
    /// Its expiry after the command (0: never).
    pub expiry: u32,
    pub now: u32,
}

/// How one protocol answers one command: the executor hands it each outcome and the protocol
/// writes the bytes. A found value's bytes are the executor's to place (copied, lent, or
/// streamed), between the header [`Reply::found`] writes and [`Reply::VALUE_END`].
pub trait Reply {
    /// The bytes after a value (the text protocols' `\r\n`).
    const VALUE_END: &'static [u8];
    fn found(&mut self, out: &mut Vec<u8>, found: &Found);
    fn missed(&mut self, out: &mut Vec<u8>);
    fn stored(&mut self, out: &mut Vec<u8>, outcome: StoreOutcome);
    fn deleted(&mut self, out: &mut Vec<u8>, outcome: DeleteOutcome);
    fn counted(&mut self, out: &mut Vec<u8>, outcome: ArithOutcome, counted: Counted);
    /// A store refused as too large ([`Command::Refuse`]).
    fn refused(&mut self, out: &mut Vec<u8>);
}

/// How a command runs beyond the command itself: the partition holding `store`, the time,
/// the size from which a found value is lent rather than copied, and the `watch`ers to log to
/// as the connection on socket `fd`.
#[derive(Clone, Copy)]
pub struct Run<'w> {
    pub owner: usize,
    pub now: u32,
    pub lend_from: Option<usize>,
    pub watchers: &'w Watchers,
    pub fd: i32,
}

/// Runs one keyed command against its partition's store (held by the caller): the one
/// executor every protocol's requests go through. Its reply goes to `out` through `reply`; a
/// value sent in place (lent from the arena or streamed from a segment) comes back as a
/// [`Deferred`]. GETs and stores are logged to `watch`ers as memcached logs them.
pub fn run<R: Reply>(
    store: &mut Store,
    command: &Command<'_>,
    how: Run<'_>,
    out: &mut Vec<u8>,
    reply: &mut R,
) -> Option<Deferred> {
    let now = how.now;
    match *command {
        Command::Get { key, touch, value } => {
            return deliver(store, key, Fetch::Plain { touch, value }, how, out, reply);
        }
        Command::MetaGet { key, options } => {
            return deliver(store, key, Fetch::Meta(options), how, out, reply);
        }
        Command::Inspect { key } => {
            let options = MetaGet {
                bump: false,
                ..MetaGet::default()
            };
            let (state, found) = store.meta_get(key, now, &options);
            let (flags, len) = match found {
                Lookup::Miss => {
                    reply.missed(out);
                    return None;
                }
                Lookup::Small(hit) => (hit.flags, hit.value.len()),
                Lookup::Large(hit) => (hit.flags, hit.value_len as usize),
            };
            let cas = store.meta_of(key, now).map_or(0, |m| m.cas);
            let found = Found {
                flags,
                cas,
                len,
                value: false,
                state: Some(state),
                now,
            };
            reply.found(out, &found);
        }
        Command::Store {
            mode,
            key,
            value,
            flags,
            expiry,
            cas,
            invalidate,
            explicit_cas,
            vivify,
            drop_on_failure,
        } => {
            let Value::Whole(value) = value else {
                unreachable!("a streamed store runs in exec::large as its value arrives")
            };
            let what = WatchedStore {
                key,
                mode,
                with_cas: cas != 0,
                exptime: expiry,
                bytes: value.len() as u64,
                now,
            };
            let outcome = watched_store(store, (how.watchers, how.fd), what, |store| {
                // `ms ... MA N<ttl>`: an append onto a missing item stores it.
                let (mode, expiry) = match vivify {
                    Some(ttl) if store.meta_of(key, now).is_none() => (StoreMode::Set, ttl),
                    _ => (mode, expiry),
                };
                let outcome = match invalidate.then(|| store_stale(store, command, now)) {
                    Some(Some(outcome)) => outcome,
                    _ => store.store(mode, key, value, flags, expiry, cas, now),
                };
                if drop_on_failure && outcome.for_want_of_room() {
                    store.drop_stale(key);
                }
                store.with_client_cas(key, now, outcome, explicit_cas)
            });
            reply.stored(out, outcome);
        }
        Command::Refuse { key, drop_existing } => {
            store.refuse_too_large(key, drop_existing);
            reply.refused(out);
        }
        Command::Delete { key, cas } => {
            let what = (key, "delete", now);
            let outcome = watched_delete(store, how.watchers, what, |s| s.delete(key, cas, now));
            reply.deleted(out, outcome)
        }
        Command::MetaDelete {
            key,
            cas,
            invalidate,
            ttl: _,
            empty: Some(line),
            new_cas,
        } => {
            // `md ... x` empties the value, and memcached logs it as a deletion unless `I`
            // keeps it (stale) instead.
            let outcome = match invalidate {
                true => empty_value(store, key, cas, invalidate, line, new_cas, now),
                false => watched_delete(store, how.watchers, (key, "md", now), |s| {
                    empty_value(s, key, cas, invalidate, line, new_cas, now)
                }),
            };
            reply.deleted(out, outcome)
        }
        Command::MetaDelete {
            key,
            cas,
            invalidate,
            ttl,
            empty: None,
            new_cas,
        } => {
            let outcome = match invalidate {
                true => store.meta_delete(key, cas, invalidate, ttl, now),
                false => watched_delete(store, how.watchers, (key, "md", now), |s| {
                    s.meta_delete(key, cas, invalidate, ttl, now)
                }),
            };
            if invalidate && new_cas != 0 && outcome == DeleteOutcome::Deleted {
                store.meta_mark(key, now, Some(new_cas), false, false);
            }
            reply.deleted(out, outcome)
        }
        Command::Arith {
            incr,
            key,
            delta,
            initial,
            create,
            cas,
            ttl,
            report,
            new_cas,
        } => {
            let mut outcome = store.arith(incr, key, delta, initial, create, cas, now);
            if let (ArithOutcome::Value { value, .. }, true) = (outcome, new_cas != 0) {
                store.meta_mark(key, now, Some(new_cas), false, false);
                outcome = ArithOutcome::Value {
                    value,
                    cas: new_cas,
                };
            }
            let mut counted = Counted { expiry: 0, now };
            if let ArithOutcome::Value { .. } = outcome {
                if let Some(ttl) = ttl {
                    store.set_ttl(key, ttl, now);
                }
                if report {
                    counted.expiry = store.meta_of(key, now).map_or(0, |m| m.expiry);
                }
            }
            reply.counted(out, outcome, counted);
        }
        Command::Noop
        | Command::Version
        | Command::Verbosity
        | Command::Flush { .. }
        | Command::Stats { .. }
        | Command::Quit => unreachable!("commands that name no key run in exec::control"),
    }
    None
}

/// What a lookup found, as `watch fetchers` logs it.
fn fetched(found: &Lookup<'_>) -> Fetched {
    match found {
        Lookup::Miss => Fetched::NotFound,
        Lookup::Small(hit) => Fetched::Found {
            class: 1,
            bytes: hit.value.len() as u64,
        },
        Lookup::Large(hit) => Fetched::Found {
            class: 3,
            bytes: hit.value_len,
        },
    }
}

/// A lookup, plain or meta.
#[derive(Clone, Copy)]
enum Fetch {
    /// `touch`: a new expiry; `value`: the value is wanted.
    Plain {
        touch: Option<u32>,
        value: bool,
    },
    Meta(MetaGet),
}

/// Looks `key` up and answers: the reply's header, then (when the value is wanted) the value
/// copied after it, lent from the arena, or streamed from its segment.
fn deliver<R: Reply>(
    store: &mut Store,
    key: &[u8],
    fetch: Fetch,
    how: Run<'_>,
    out: &mut Vec<u8>,
    reply: &mut R,
) -> Option<Deferred> {
    let (state, found, value) = match fetch {
        Fetch::Plain { touch, value } => (None, store.lookup(key, touch, how.now, value), value),
        Fetch::Meta(options) => {
            let (state, found) = store.meta_get(key, how.now, &options);
            (Some(state), found, options.lease && !state.value_withheld)
        }
    };
    // memcached logs every fetch of an item: every `mg`, and a GET but not a touch.
    if value || state.is_some() {
        how.watchers.fetched(key, fetched(&found), how.fd);
    }
    match found {
        Lookup::Miss => {
            reply.missed(out);
            None
        }
        Lookup::Small(hit) => {
            let len = hit.value.len();
            let (flags, cas) = (hit.flags, hit.cas);
            reply.found(
                out,
                &Found {
                    flags,
                    cas,
                    len,
                    value,
                    state,
                    now: how.now,
                },
            );
            if !value {
                return None;
            }
            if lends(len, how.lend_from) {
                let at = hit.at;
                return Some(lend(store, how.owner, at, len));
            }
            hit.value.append_to(out);
            out.extend_from_slice(R::VALUE_END);
            None
        }
        Lookup::Large(hit) => {
            let found = Found {
                flags: hit.flags,
                cas: hit.cas,
                len: hit.value_len as usize,
                value,
                state,
                now: how.now,
            };
            if !value {
                // The lease was not taken (no value asked): nothing to release.
                debug_assert!(hit.lease.is_none());
                reply.found(out, &found);
                return None;
            }
            let mut prefix = Vec::with_capacity(64);
            reply.found(&mut prefix, &found);
            let suffix = R::VALUE_END;
            let owner = how.owner;
            Some(deliver_large(
                store,
                owner,
                hit,
                prefix,
                suffix,
                how.lend_from,
            ))
        }
    }
}

/// `md ... x`: the item stays, its value emptied, with the line's flags and expiry; it keeps
/// its CAS (or takes `new_cas`, `E`), and is marked stale with `invalidate`.
fn empty_value(
    store: &mut Store,
    key: &[u8],
    cas: u64,
    invalidate: bool,
    (flags, expiry): (u32, u32),
    new_cas: u64,
    now: u32,
) -> DeleteOutcome {
    let Some(old) = store.meta_of(key, now) else {
        return DeleteOutcome::NotFound;
    };
    if cas != 0 && old.cas != cas {
        return DeleteOutcome::Exists;
    }
    match store.store(StoreMode::Set, key, b"", flags, expiry, 0, now) {
        StoreOutcome::Stored { .. } => {
            let keep = if new_cas != 0 { new_cas } else { old.cas };
            store.meta_mark(key, now, Some(keep), invalidate, false);
            DeleteOutcome::Deleted
        }
        // (Out of memory for an empty record: the item is gone, as a delete would leave it.)
        _ => DeleteOutcome::Deleted,
    }
}

/// `ms ... C<cas> I`: a CAS older than the item's still stores a SET or REPLACE, keeping the
/// item's expiry, and marks it stale so the next reader wins the token to refill it. `None`:
/// the store runs as any other.
fn store_stale(store: &mut Store, command: &Command<'_>, now: u32) -> Option<StoreOutcome> {
    let Command::Store {
        mode,
        key,
        value: Value::Whole(value),
        flags,
        cas,
        ..
    } = *command
    else {
        return None;
    };
    // (A `C0` compares as CAS_NEVER_ISSUED; here it is the oldest CAS there is.)
    let given = match cas {
        0 => return None,
        CAS_NEVER_ISSUED => 0,
        cas => cas,
    };
    let old = store.meta_of(key, now)?;
    if given >= old.cas || !matches!(mode, StoreMode::Set | StoreMode::Replace) {
        return None;
    }
    // (An expiry is a Unix time, past the relative range: it is kept as it is.) A recache
    // token already handed out stays handed out.
    let token_sent = store.token_sent(key, now);
    let outcome = store.store(StoreMode::Set, key, value, flags, old.expiry, 0, now);
    if matches!(outcome, StoreOutcome::Stored { .. }) {
        store.meta_mark(key, now, None, true, token_sent);
    }
    Some(outcome)
}
