//! The text and meta protocols on a connection: each decoded command ([`crate::proto::text`])
//! runs on the spot against its key's partition, through the same [`Store`] calls the binary
//! protocol makes, and only its reply is composed here, as memcached 1.6 writes it. How a found
//! value leaves (copied after its `VALUE`/`VA` line, lent from the arena, or streamed from its
//! segment between that line and its `\r\n`) is [`super::execute`]'s, shared with binary.
//!
//! A GET of many keys locks each key's partition in turn (never two at once), so a multiget
//! is not a snapshot: as in memcached, a write between two of its keys may be seen by one and
//! not the other.

use std::rc::Rc;
use std::sync::atomic::Ordering;

use crate::proto::meta::{self, MetaCode, MetaValues};
use crate::proto::text::{
    self, errors, CrawlClasses, Crawler, TextCommand, TextDecoded, TextStore,
};
use crate::proto::{MaFlags, MdFlags, MgFlags, StoreMode, ARITH_NO_CREATE};
use crate::store::{
    ArithOutcome, DeleteOutcome, Lookup, MetaGet, Store, StoreOutcome, CAS_NEVER_ISSUED,
};

use super::conn::{log_peer_error, After, Conn};
use super::execute::{deliver_large, lend, lends, watched_store, Deferred, WatchedStore};
use super::large::LargeSet;
use super::latency::CommandKind;
use super::replies::OUTPUT_CAP_BYTES;
use super::shard::ShardCtx;
use super::stats::group_pairs;
use super::text_reply::{compare_cas, store_exptime, StoreReply};
use super::unix_now;
use super::watch::{self, Fetched, Watchers};

/// Runs a storage command whose whole value is buffered.
fn run_store(store: &mut Store, cmd: &TextStore, value: &[u8], now: u32) -> StoreOutcome {
    let exptime = store_exptime(cmd.exptime);
    let invalidate = cmd.meta.as_ref().is_some_and(|ms| ms.invalidate);
    if let (true, Some(cas)) = (invalidate, cmd.cas) {
        // `ms ... C<cas> I`: a CAS older than the item's still stores, keeping the item's TTL,
        // and marks it stale so the next reader wins the token to refill it.
        if let Some(old) = store.meta_of(&cmd.key, now) {
            if cas < old.cas && matches!(cmd.mode, StoreMode::Set | StoreMode::Replace) {
                // (An expiry is a Unix time, past the relative range: it is kept as it is.) A
                // recache token already handed out stays handed out.
                let token_sent = store.token_sent(&cmd.key, now);
                let outcome = store.store(
                    StoreMode::Set,
                    &cmd.key,
                    value,
                    cmd.flags,
                    old.expiry,
                    0,
                    now,
                );
                if matches!(outcome, StoreOutcome::Stored { .. }) {
                    store.meta_mark(&cmd.key, now, None, true, token_sent);
                }
                return outcome;
            }
        }
    }
    store.store(
        cmd.mode,
        &cmd.key,
        value,
        cmd.flags,
        exptime,
        compare_cas(cmd),
        now,
    )
}

/// A GET-family hit or miss for one key of a `get`/`gets`/`gat`/`gats`: the `VALUE` line and
/// value, or nothing on a miss; and what was found, for `watch fetchers`.
#[allow(clippy::too_many_arguments)]
fn get_one(
    store: &mut Store,
    owner: usize,
    key: &[u8],
    with_cas: bool,
    touch: Option<u32>,
    now: u32,
    out: &mut Vec<u8>,
    lend_from: Option<usize>,
) -> (Option<Deferred>, Fetched) {
    match store.lookup(key, touch, now, true) {
        Lookup::Miss => (None, Fetched::NotFound),
        Lookup::Small(hit) => {
            let cas = with_cas.then_some(hit.cas);
            let bytes = hit.value.len() as u64;
            let found = Fetched::Found { class: 1, bytes };
            text::value_header(out, key, hit.flags, hit.value.len(), cas);
            if lends(hit.value.len(), lend_from) {
                let (at, len) = (hit.at, hit.value.len());
                return (Some(lend(store, owner, at, len)), found);
            }
            hit.value.append_to(out);
            out.extend_from_slice(b"\r\n");
            (None, found)
        }
        Lookup::Large(hit) => {
            let mut prefix = Vec::with_capacity(48 + key.len());
            let cas = with_cas.then_some(hit.cas);
            let found = Fetched::Found {
                class: 3,
                bytes: hit.value_len,
            };
            text::value_header(&mut prefix, key, hit.flags, hit.value_len as usize, cas);
            let part = deliver_large(store, owner, hit, prefix, b"\r\n", lend_from);
            (Some(part), found)
        }
    }
}

/// `mg`: the item's state and value as the flags ask.
#[allow(clippy::too_many_arguments)]
fn meta_get(
    store: &mut Store,
    owner: usize,
    key: &crate::proto::Key,
    flags: &MgFlags,
    now: u32,
    out: &mut Vec<u8>,
    lend_from: Option<usize>,
    (watchers, fd): (&Watchers, i32),
) -> Option<Deferred> {
    let opts = MetaGet {
        touch: flags.ttl.map(store_exptime),
        vivify: flags.vivify.map(store_exptime),
        recache: flags.recache.map(store_exptime),
        bump: !flags.no_bump,
        lease: flags.value,
    };
    let key_value = Some((&key[..], key.is_binary()));
    let (state, found) = store.meta_get(key, now, &opts);
    // memcached logs every item fetch, `mg` with or without a value.
    let fetched = match &found {
        Lookup::Miss => Fetched::NotFound,
        Lookup::Small(hit) => Fetched::Found {
            class: 1,
            bytes: hit.value.len() as u64,
        },
        Lookup::Large(hit) => Fetched::Found {
            class: 3,
            bytes: hit.value_len,
        },
    };
    watchers.fetched(key, fetched, fd);
    let (flags_value, cas, size) = match &found {
        Lookup::Miss => {
            if !flags.quiet {
                let values = MetaValues {
                    key: key_value,
                    opaque: flags.opaque,
                    ..MetaValues::default()
                };
                meta::meta_line(out, MetaCode::En, &flags.returns, &values);
            }
            return None;
        }
        Lookup::Small(hit) => (hit.flags, hit.cas, hit.value.len()),
        Lookup::Large(hit) => (hit.flags, hit.cas, hit.value_len as usize),
    };
    let values = MetaValues {
        cas: Some(cas),
        flags: Some(flags_value),
        hit: Some(state.fetched),
        key: key_value,
        last_access: Some(u64::from(now.saturating_sub(state.accessed))),
        opaque: flags.opaque,
        size: Some(size),
        ttl: Some(match state.expiry {
            0 => -1,
            at => i64::from(at) - i64::from(now),
        }),
        already_won: state.token_sent,
        stale: state.stale,
        won: state.won,
    };
    let code = if flags.value {
        MetaCode::Va(size)
    } else {
        MetaCode::Hd
    };
    match found {
        Lookup::Small(hit) if flags.value => {
            meta::meta_line(out, code, &flags.returns, &values);
            if lends(hit.value.len(), lend_from) {
                let (at, len) = (hit.at, hit.value.len());
                return Some(lend(store, owner, at, len));
            }
            hit.value.append_to(out);
            out.extend_from_slice(b"\r\n");
            None
        }
        Lookup::Large(hit) if flags.value => {
            let mut prefix = Vec::with_capacity(64);
            meta::meta_line(&mut prefix, code, &flags.returns, &values);
            Some(deliver_large(store, owner, hit, prefix, b"\r\n", lend_from))
        }
        Lookup::Large(hit) => {
            // The lease was not taken (no `v`); nothing to release.
            debug_assert!(hit.lease.is_none());
            meta::meta_line(out, code, &flags.returns, &values);
            None
        }
        _ => {
            meta::meta_line(out, code, &flags.returns, &values);
            None
        }
    }
}

/// `md`.
fn meta_delete(
    store: &mut Store,
    key: &crate::proto::Key,
    flags: &MdFlags,
    now: u32,
    out: &mut Vec<u8>,
) {
    let outcome = store.meta_delete(
        key,
        // `C0` still compares (and fails), as memcached's md does.
        match flags.cas {
            Some(0) => CAS_NEVER_ISSUED,
            cas => cas.unwrap_or(0),
        },
        flags.invalidate,
        flags.ttl.map(store_exptime),
        now,
    );
    let code = match outcome {
        DeleteOutcome::Deleted if flags.quiet => return,
        DeleteOutcome::Deleted => MetaCode::Hd,
        DeleteOutcome::NotFound => MetaCode::Nf,
        DeleteOutcome::Exists => MetaCode::Ex,
    };
    let values = MetaValues {
        key: Some((&key[..], key.is_binary())),
        opaque: flags.opaque,
        ..MetaValues::default()
    };
    meta::meta_line(out, code, &flags.returns, &values);
}

/// `ma`: increment or decrement, creating the counter on a miss with `N`.
fn meta_arith(
    store: &mut Store,
    key: &crate::proto::Key,
    flags: &MaFlags,
    now: u32,
    out: &mut Vec<u8>,
) {
    // (store_exptime never gives ARITH_NO_CREATE: an i32 stays below it.)
    let create = flags.vivify.map_or(ARITH_NO_CREATE, store_exptime);
    // memcached's `q` silences the reply to an existing counter only, not to one `N` creates.
    let existed = flags.quiet && flags.vivify.is_some() && store.meta_of(key, now).is_some();
    let outcome = store.arith(
        flags.incr,
        key,
        flags.delta,
        flags.initial,
        create,
        flags.cas.unwrap_or(0),
        now,
    );
    let mut values = MetaValues {
        key: Some((&key[..], key.is_binary())),
        opaque: flags.opaque,
        ..MetaValues::default()
    };
    let (value, cas) = match outcome {
        ArithOutcome::Value { value, cas } => (value, cas),
        ArithOutcome::NotFound => {
            meta::meta_line(out, MetaCode::Nf, &flags.returns, &values);
            return;
        }
        ArithOutcome::Exists => {
            meta::meta_line(out, MetaCode::Ex, &flags.returns, &values);
            return;
        }
        ArithOutcome::NonNumeric => {
            out.extend_from_slice(errors::NON_NUMERIC);
            return;
        }
        ArithOutcome::OutOfMemory => {
            out.extend_from_slice(b"SERVER_ERROR out of memory\r\n");
            return;
        }
    };
    if let Some(ttl) = flags.ttl {
        store.set_ttl(key, store_exptime(ttl), now);
    }
    // memcached's `q` holds back the whole success reply, a `VA` included.
    if flags.quiet && (flags.vivify.is_none() || existed) {
        return;
    }
    let expiry = store.meta_of(key, now).map_or(0, |m| m.expiry);
    values.cas = Some(cas);
    values.ttl = Some(match expiry {
        0 => -1,
        at => i64::from(at) - i64::from(now),
    });
    let mut digits = Vec::with_capacity(20);
    text::counter(&mut digits, value);
    let number = &digits[..digits.len() - 2];
    if flags.value {
        meta::meta_line(out, MetaCode::Va(number.len()), &flags.returns, &values);
        out.extend_from_slice(&digits);
    } else {
        meta::meta_line(out, MetaCode::Hd, &flags.returns, &values);
    }
}

/// `me`: what memcached's debug line shows of an item (`cls` is 0: Headroom has no slab
/// classes; `size` is the value's bytes).
fn meta_debug(store: &mut Store, key: &crate::proto::Key, now: u32, out: &mut Vec<u8>) {
    let opts = MetaGet {
        bump: false,
        ..MetaGet::default()
    };
    let (state, found) = store.meta_get(key, now, &opts);
    let size = match found {
        Lookup::Miss => {
            out.extend_from_slice(meta::EN);
            return;
        }
        Lookup::Small(hit) => hit.value.len() as u64,
        Lookup::Large(hit) => hit.value_len,
    };
    let exp = match state.expiry {
        0 => -1,
        at => i64::from(at) - i64::from(now),
    };
    let cas = store.meta_of(key, now).map_or(0, |m| m.cas);
    meta::meta_debug(
        out,
        key,
        key.is_binary(),
        exp,
        u64::from(now.saturating_sub(state.accessed)),
        cas,
        state.fetched,
        0,
        size,
    );
}

/// Runs a command that names one key against its partition (held by the caller) and appends
/// its reply; a value sent in place comes back as a [`Deferred`].
#[allow(clippy::too_many_arguments)]
fn execute_keyed(
    store: &mut Store,
    owner: usize,
    command: &TextCommand,
    now: u32,
    out: &mut Vec<u8>,
    lend_from: Option<usize>,
    watchers: &Watchers,
    fd: i32,
) -> Option<Deferred> {
    match command {
        TextCommand::Store { store: cmd, value } => {
            let what = WatchedStore {
                key: cmd.key.as_bytes(),
                mode: cmd.mode,
                with_cas: cmd.cas.is_some(),
                exptime: store_exptime(cmd.exptime),
                bytes: value.len() as u64,
                now,
            };
            let outcome = watched_store(store, (watchers, fd), what, |s| {
                run_store(s, cmd, value, now)
            });
            StoreReply::of(cmd).write(out, Some(outcome));
        }
        TextCommand::Arith {
            incr,
            key,
            delta,
            noreply,
        } => {
            let reply = store.arith(*incr, key, *delta, 0, ARITH_NO_CREATE, 0, now);
            if !noreply {
                match reply {
                    ArithOutcome::Value { value, .. } => text::counter(out, value),
                    ArithOutcome::NotFound => out.extend_from_slice(text::NOT_FOUND),
                    ArithOutcome::NonNumeric => out.extend_from_slice(errors::NON_NUMERIC),
                    ArithOutcome::Exists => out.extend_from_slice(text::EXISTS),
                    ArithOutcome::OutOfMemory => {
                        out.extend_from_slice(b"SERVER_ERROR out of memory\r\n")
                    }
                }
            }
        }
        TextCommand::Delete { key, noreply } => {
            let outcome = store.delete(key, 0, now);
            if !noreply {
                out.extend_from_slice(match outcome {
                    DeleteOutcome::Deleted => text::DELETED,
                    DeleteOutcome::NotFound | DeleteOutcome::Exists => text::NOT_FOUND,
                });
            }
        }
        TextCommand::Touch {
            key,
            exptime,
            noreply,
        } => {
            let found = !matches!(
                store.lookup(key, Some(store_exptime(*exptime)), now, false),
                Lookup::Miss
            );
            if !noreply {
                out.extend_from_slice(if found {
                    text::TOUCHED
                } else {
                    text::NOT_FOUND
                });
            }
        }
        TextCommand::MetaGet { key, flags } => {
            return meta_get(
                store,
                owner,
                key,
                flags,
                now,
                out,
                lend_from,
                (watchers, fd),
            );
        }
        TextCommand::MetaDelete { key, flags } => meta_delete(store, key, flags, now, out),
        TextCommand::MetaArith { key, flags } => meta_arith(store, key, flags, now, out),
        TextCommand::MetaDebug { key } => meta_debug(store, key, now, out),
        _ => unreachable!("only keyed text commands run against a store"),
    }
    None
}

/// The key a keyed command runs under.
fn key_of<'c>(command: &'c TextCommand) -> Option<&'c [u8]> {
    Some(match command {
        TextCommand::Store { store, .. } => &store.key,
        TextCommand::Arith { key, .. }
        | TextCommand::Delete { key, .. }
        | TextCommand::Touch { key, .. } => key,
        TextCommand::MetaGet { key, .. }
        | TextCommand::MetaDelete { key, .. }
        | TextCommand::MetaArith { key, .. }
        | TextCommand::MetaDebug { key } => key,
        _ => return None,
    })
}

/// memcached's `stats` in text: `STAT name value` lines and `END`; `reset` answers `RESET`,
/// `detail on|off` `OK`, `detail dump` the dump itself; an unknown group `ERROR`.
async fn write_stats(ctx: &ShardCtx, args: &text::Words<'_>, out: &mut Vec<u8>) {
    let mut group = Vec::with_capacity(args.as_bytes().len());
    for (i, word) in args.iter().enumerate() {
        if i > 0 {
            group.push(b' ');
        }
        group.extend_from_slice(word);
    }
    if let Some((class, limit)) = text::cachedump_args(args) {
        write_cachedump(ctx, class, limit, out);
        return;
    }
    let Some(pairs) = group_pairs(ctx, &group).await else {
        out.extend_from_slice(errors::ERROR);
        return;
    };
    match &group[..] {
        b"reset" => out.extend_from_slice(text::RESET),
        b"detail on" | b"detail off" => out.extend_from_slice(text::OK),
        // The dump ends in its own `END`.
        b"detail dump" => {
            for (_, dump) in pairs {
                out.extend_from_slice(dump.as_bytes());
            }
        }
        _ => {
            for (name, value) in pairs {
                text::stat(out, name.as_bytes(), value.as_bytes());
            }
            out.extend_from_slice(text::END);
        }
    }
}

/// The most bytes a `stats cachedump` reply holds, `END` included (memcached's cap).
const CACHEDUMP_MAX_BYTES: usize = 2 << 20;

/// `stats cachedump <class> <limit>`: up to `limit` (0: no limit) items of the item class
/// (`stats items` numbers them: 1 small, 2 fixed, 3 large; any other class holds none), one
/// `ITEM <key> [<value bytes> b; <expiry> s]` line each (the expiry a Unix time, 0 never), then
/// `END`, within memcached's 2 MiB. Partitions are walked one at a time under their locks.
fn write_cachedump(ctx: &ShardCtx, class: u32, limit: u32, out: &mut Vec<u8>) {
    let start = out.len();
    let class = class
        .checked_sub(1)
        .and_then(|i| crate::store::ItemClass::ALL.get(i as usize).copied());
    if let Some(class) = class {
        let now = unix_now();
        let partitions = &ctx.shared.partitions;
        let mut shown = 0u32;
        let mut full = false;
        for index in 0..partitions.len() {
            if full || (limit != 0 && shown >= limit) {
                break;
            }
            partitions
                .lock(index)
                .dump_class(class, now, |key, len, expiry| {
                    let mut line = Vec::with_capacity(key.len() + 40);
                    line.extend_from_slice(b"ITEM ");
                    line.extend_from_slice(key);
                    line.extend_from_slice(format!(" [{len} b; {expiry} s]\r\n").as_bytes());
                    if out.len() - start + line.len() + text::END.len() > CACHEDUMP_MAX_BYTES {
                        full = true;
                        return false;
                    }
                    out.extend_from_slice(&line);
                    shown += 1;
                    limit == 0 || shown < limit
                });
        }
    }
    out.extend_from_slice(text::END);
}

/// `lru_crawler`. `enable`/`disable` switch the background expiry sweep (memcached's crawler
/// thread); `crawl` and `metadump` need it on, as memcached's do. `crawl` reclaims the expired
/// items of the classes named in every partition before it answers `OK` (memcached answers
/// first and crawls after). `metadump` is refused behind replies not yet sent, as memcached
/// refuses it; otherwise it returns the dump to run.
async fn lru_crawler(
    ctx: &Rc<ShardCtx>,
    crawler: Crawler,
    pipelined: bool,
    out: &mut Vec<u8>,
) -> Option<Metadump> {
    let enabled = &ctx.shared.crawler_enabled;
    match crawler {
        // memcached refuses to start a crawler that runs, and stops one that does not.
        Crawler::Enable => {
            match enabled.compare_exchange(false, true, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => out.extend_from_slice(text::OK),
                Err(_) => out.extend_from_slice(errors::CRAWLER_RUNNING),
            }
        }
        Crawler::Disable => {
            enabled.store(false, Ordering::Relaxed);
            out.extend_from_slice(text::OK);
        }
        Crawler::Crawl(_) | Crawler::Metadump(_) if !enabled.load(Ordering::Relaxed) => {
            out.extend_from_slice(errors::CRAWLER_DISABLED);
        }
        Crawler::Crawl(CrawlClasses::Invalid) => out.extend_from_slice(errors::BADCLASS),
        Crawler::Crawl(classes) => {
            crawl(ctx, classes).await;
            out.extend_from_slice(text::OK);
        }
        Crawler::Metadump(_) if pipelined => {
            out.extend_from_slice(errors::METADUMP_AFTER_PIPELINE);
        }
        Crawler::Metadump(CrawlClasses::Invalid) => out.extend_from_slice(errors::BADCLASS),
        Crawler::Metadump(classes) => {
            return Some(Metadump {
                classes,
                partition: 0,
                bucket: 0,
            });
        }
    }
    None
}

/// Index buckets a crawl or a metadump visits per partition lock hold: the hold stays short
/// whatever the partition holds.
const CRAWL_BUCKETS_PER_HOLD: usize = 1024;

/// How long a crawl or a metadump runs before it lets the other connections of its shard have
/// the core: glommio preempts a task only after its 100 ms preempt period, far longer than a
/// GET should wait.
const CRAWL_RUN_MAX: std::time::Duration = std::time::Duration::from_millis(1);

/// Pauses a long walk once it has run [`CRAWL_RUN_MAX`]. Yielding the task (or its queue)
/// would not do: glommio runs a runnable queue again before it polls for I/O, so the other
/// connections' requests would not even be read. A timer a microsecond away takes the walk
/// off the run queue until the executor's next I/O poll, after every task that poll wakes.
struct Pacer(std::time::Instant);

impl Pacer {
    fn new() -> Pacer {
        Pacer(std::time::Instant::now())
    }

    async fn between_slices(&mut self) {
        if self.0.elapsed() >= CRAWL_RUN_MAX {
            glommio::timer::sleep(std::time::Duration::from_micros(1)).await;
            self.0 = std::time::Instant::now();
        }
    }
}

/// Reclaims every expired item of `classes` in every partition now, a slice of the index per
/// lock hold.
async fn crawl(ctx: &Rc<ShardCtx>, classes: CrawlClasses) {
    let partitions = &ctx.shared.partitions;
    let now = unix_now();
    let mut pacer = Pacer::new();
    for index in 0..partitions.len() {
        let mut from = Some(0);
        while let Some(bucket) = from {
            let mut store = partitions.lock(index);
            from = store.reclaim_expired_in(bucket, CRAWL_BUCKETS_PER_HOLD, now, |class| {
                classes.contains(class as u8)
            });
            let frees = store.take_pending_frees();
            drop(store);
            ctx.free_extents(frees);
            pacer.between_slices().await;
        }
    }
}

/// Where an `lru_crawler metadump` is: the partition and index bucket it goes on from, and
/// the classes it lists.
struct Metadump {
    classes: CrawlClasses,
    partition: usize,
    bucket: usize,
}

/// Appends `dump`'s next lines to `out` until `out` passes the output cap (then returns the
/// dump to go on with) or every partition is walked (then appends `END`). One line per live
/// item, as memcached's crawler writes it: `key=<URI-encoded key> exp=<Unix time, -1 never>
/// la=<Unix time of the last store or fetch> cas=<CAS> fetch=<yes|no> cls=<item class>
/// size=<key plus value bytes>`.
async fn continue_metadump(
    ctx: &ShardCtx,
    mut dump: Metadump,
    out: &mut Vec<u8>,
) -> Option<Metadump> {
    use std::io::Write;
    let partitions = &ctx.shared.partitions;
    let now = unix_now();
    let mut pacer = Pacer::new();
    while dump.partition < partitions.len() {
        if out.len() > OUTPUT_CAP_BYTES {
            return Some(dump);
        }
        let store = partitions.lock(dump.partition);
        let next = store.dump_meta(dump.bucket, CRAWL_BUCKETS_PER_HOLD, now, |key, item| {
            if !dump.classes.contains(item.class as u8) {
                return;
            }
            let exp = match item.expiry {
                0 => -1,
                at => i64::from(at),
            };
            let _ = writeln!(
                out,
                "key={} exp={exp} la={} cas={} fetch={} cls={} size={}",
                text::uri_encoded(key),
                item.accessed,
                item.cas,
                if item.fetched { "yes" } else { "no" },
                item.class as u8,
                item.bytes,
            );
        });
        drop(store);
        match next {
            Some(bucket) => dump.bucket = bucket,
            None => {
                dump.partition += 1;
                dump.bucket = 0;
            }
        }
        pacer.between_slices().await;
    }
    out.extend_from_slice(text::END);
    None
}

/// memcached's answer to anything but its text authentication before it.
const UNAUTHENTICATED: &[u8] = b"CLIENT_ERROR unauthenticated\r\n";
/// The longest `user password` value a text authentication may carry, as memcached's
/// `MAX_AUTH_REQ_LEN`, and its answer to a longer one.
const AUTH_TOKEN_MAX_BYTES: usize = 16 << 10;
const AUTH_TOKEN_TOO_LONG: &[u8] = b"CLIENT_ERROR auth token too long\r\n";

/// What a text connection may do before it authenticates (with `--sasl-password-file`),
/// as memcached's text authentication has it: a `set` whose value is `user password`.
enum Auth {
    /// Authenticated now: answer `STORED`.
    Accepted,
    /// Not an authentication: answered, not counted.
    Refused(&'static [u8]),
    /// A wrong user or password: answered after `auth::after_failure`.
    Failed,
}

fn authenticate(ctx: &ShardCtx, command: &TextCommand) -> Auth {
    let (TextCommand::Store { store, value }, Some(credentials)) =
        (command, &ctx.shared.credentials)
    else {
        return Auth::Refused(UNAUTHENTICATED);
    };
    if store.meta.is_some() {
        return Auth::Refused(UNAUTHENTICATED);
    }
    ctx.counters.borrow_mut().auth_cmds += 1;
    let mut plain = vec![0u8];
    let mut parts = value.splitn(2, |&b| b == b' ');
    plain.extend_from_slice(parts.next().unwrap_or_default());
    plain.push(0);
    plain.extend_from_slice(parts.next().unwrap_or_default());
    match credentials.authenticate(super::auth::MECHANISMS.as_bytes(), &plain) {
        super::auth::AuthOutcome::Authenticated { user } => {
            tracing::debug!(shard = ctx.id, %user, "text authentication: authenticated");
            Auth::Accepted
        }
        _ => {
            ctx.counters.borrow_mut().auth_errors += 1;
            Auth::Failed
        }
    }
}

/// A text connection's state between passes.
#[derive(Default)]
pub(super) struct TextSession {
    /// An `lru_crawler metadump` under way: it goes out a buffer at a time, before the
    /// commands after it.
    metadump: Option<Metadump>,
}

impl TextSession {
    /// Runs every whole text or meta command buffered on `conn`, up to the output cap, and
    /// says what the connection does next. `now`: the time the commands run at, in Unix
    /// seconds.
    pub(super) async fn process(&mut self, conn: &mut Conn, ctx: &Rc<ShardCtx>, now: u32) -> After {
        let max_item = ctx.shared.settings.max_item_bytes as usize;
        // Values above ram_head live in segments: they are streamed, never buffered whole.
        let stream_from = ctx.shared.settings.arena.ram_head_bytes as usize;
        let lend_from = ctx.io.lend_from();
        loop {
            if let Some(dump) = self.metadump.take() {
                self.metadump = continue_metadump(ctx, dump, &mut conn.replies.out).await;
                if self.metadump.is_some() {
                    return After::Process;
                }
            }
            if let Some(after) = conn.before_next(&ctx.shared.partitions) {
                return after;
            }
            let buffered = &conn.buf[conn.consumed..conn.filled];
            // The search for the line's end resumes where the last pass's stopped.
            // Before authentication only a token up to AUTH_TOKEN_MAX_BYTES is buffered; a
            // longer value is refused and skipped, never held (memcached's MAX_AUTH_REQ_LEN).
            let (max_item, stream_from) = if conn.authenticated {
                (max_item, stream_from)
            } else {
                (AUTH_TOKEN_MAX_BYTES, AUTH_TOKEN_MAX_BYTES)
            };
            let decoded =
                text::decode_text_resuming(buffered, &mut conn.line_scan, max_item, stream_from);
            let (command, consumed) = match decoded {
                TextDecoded::Incomplete { needed } => {
                    let no_line = conn.line_scan.newline_free == buffered.len();
                    if no_line && !conn.authenticated && buffered.len() > text::LINE_MAX_BYTES {
                        // As memcached's text authentication: before it, a line without a
                        // newline in 2048 bytes closes the connection (no multiget exception).
                        ctx.counters.borrow_mut().text_errors += 1;
                        let what = "a line over 2048 bytes before authentication";
                        log_peer_error(ctx, &conn.peer, what, true);
                        return After::Close;
                    }
                    if no_line {
                        conn.line_incomplete_reads += 1;
                    }
                    conn.make_room(needed);
                    return After::Read;
                }
                TextDecoded::Error { reply, skip, close } => {
                    ctx.counters.borrow_mut().text_errors += 1;
                    let what = match reply.trim_ascii_end() {
                        b"" if close => "a line over 2048 bytes".to_string(),
                        b"" => "an error silenced by noreply".to_string(),
                        line => String::from_utf8_lossy(line).into_owned(),
                    };
                    log_peer_error(ctx, &conn.peer, &what, close);
                    // Before authentication no command is answered but with memcached's
                    // refusal (`shutdown`, `slabs automove`, ... included); a close is silent.
                    let reply = match (conn.authenticated, close) {
                        (true, _) => &reply[..],
                        (false, true) => b"",
                        (false, false) => UNAUTHENTICATED,
                    };
                    conn.replies.out.extend_from_slice(reply);
                    conn.skip_stream(skip);
                    if close {
                        return After::Close;
                    }
                    continue;
                }
                TextDecoded::TooLarge {
                    key,
                    drop_existing,
                    reply,
                    skip,
                } => {
                    ctx.counters.borrow_mut().commands += 1;
                    conn.batch.add(CommandKind::Set);
                    let reply = if conn.authenticated {
                        conn.replies
                            .run_keyed(ctx, &key, None, b"", |store, _, _, _| {
                                store.refuse_too_large(&key, drop_existing);
                                None
                            });
                        reply
                    } else if buffered.starts_with(b"set ") {
                        AUTH_TOKEN_TOO_LONG
                    } else {
                        UNAUTHENTICATED
                    };
                    conn.replies.out.extend_from_slice(reply);
                    conn.skip_stream(skip);
                    continue;
                }
                TextDecoded::LargeStore { store, consumed } => {
                    ctx.counters.borrow_mut().commands += 1;
                    conn.batch.add(CommandKind::of_text_store(&store));
                    // `Conn::consume`, field by field: the command still borrows the buffer.
                    conn.consumed += consumed;
                    conn.line_scan.consumed(consumed);
                    if !conn.authenticated {
                        // Refused without running; the value and its `\r\n` are skipped.
                        conn.replies.out.extend_from_slice(UNAUTHENTICATED);
                        conn.skip += store.value_len as u64 + 2;
                        continue;
                    }
                    return After::LargeSet(LargeSet::from_text(&store));
                }
                TextDecoded::Command { command, consumed } => (command, consumed),
            };
            ctx.counters.borrow_mut().commands += 1;
            conn.batch.add(CommandKind::of_text(&command));
            if !conn.authenticated {
                // `Conn::consume`, field by field: the command still borrows the buffer.
                conn.consumed += consumed;
                conn.line_scan.consumed(consumed);
                match authenticate(ctx, &command) {
                    Auth::Accepted => {
                        conn.authenticated = true;
                        conn.replies.out.extend_from_slice(text::STORED);
                    }
                    Auth::Refused(reply) => conn.replies.out.extend_from_slice(reply),
                    Auth::Failed => {
                        conn.replies
                            .out
                            .extend_from_slice(b"CLIENT_ERROR authentication failure\r\n");
                        if conn.authentication_failed(ctx).await {
                            return After::Close;
                        }
                    }
                }
                continue;
            }
            match &command {
                TextCommand::Get { cas, touch, keys } => {
                    let touch = touch.map(store_exptime);
                    let (watchers, fd) = (&ctx.shared.watchers, conn.fd);
                    for key in keys.iter() {
                        conn.replies.run_keyed(
                            ctx,
                            key,
                            lend_from,
                            b"\r\n",
                            |store, partition, out, lend| {
                                let (part, fetched) =
                                    get_one(store, partition, key, *cas, touch, now, out, lend);
                                watchers.fetched(key, fetched, fd);
                                part
                            },
                        );
                    }
                    conn.replies.out.extend_from_slice(text::END);
                }
                TextCommand::FlushAll { delay, noreply } => {
                    ctx.counters.borrow_mut().cmd_flush += 1;
                    super::flush_all(&ctx.shared, (*delay).max(0) as u32, now);
                    if !noreply {
                        conn.replies.out.extend_from_slice(text::OK);
                    }
                }
                TextCommand::Version => text::version(&mut conn.replies.out, &ctx.shared.version),
                TextCommand::Verbosity { noreply, .. } => {
                    if !noreply {
                        conn.replies.out.extend_from_slice(text::OK);
                    }
                }
                TextCommand::Stats { args } => {
                    let args = *args;
                    let mut out = std::mem::take(&mut conn.replies.out);
                    write_stats(ctx, &args, &mut out).await;
                    conn.replies.out = out;
                }
                TextCommand::Quit => {
                    conn.consume(consumed);
                    return After::Close;
                }
                TextCommand::Watch { kinds } => {
                    // Checked in memcached's order: replies waiting first, then the kinds.
                    if !conn.replies.is_empty() {
                        conn.replies
                            .out
                            .extend_from_slice(errors::WATCH_AFTER_PIPELINE);
                        conn.consume(consumed);
                        continue;
                    }
                    let Some(kinds) = watch::kinds_of(kinds.iter()) else {
                        conn.replies.out.extend_from_slice(errors::ERROR);
                        conn.consume(consumed);
                        continue;
                    };
                    conn.consume(consumed);
                    match ctx.shared.watchers.add(kinds) {
                        Some(watcher) => {
                            conn.replies.out.extend_from_slice(text::OK);
                            return After::Watch(watcher);
                        }
                        None => conn.replies.out.extend_from_slice(errors::WATCHER_TOO_MANY),
                    }
                    continue;
                }
                TextCommand::MetaNoop => conn.replies.out.extend_from_slice(meta::MN),
                TextCommand::LruCrawler(crawler) => {
                    let pipelined = !conn.replies.is_empty();
                    let crawler = *crawler;
                    let mut out = std::mem::take(&mut conn.replies.out);
                    self.metadump = lru_crawler(ctx, crawler, pipelined, &mut out).await;
                    conn.replies.out = out;
                }
                keyed => {
                    let key = key_of(keyed).expect("keyed text commands have keys");
                    let (watchers, fd) = (&ctx.shared.watchers, conn.fd);
                    conn.replies.run_keyed(
                        ctx,
                        key,
                        lend_from,
                        b"\r\n",
                        |store, partition, out, lend| {
                            execute_keyed(store, partition, keyed, now, out, lend, watchers, fd)
                        },
                    );
                }
            }
            conn.consume(consumed);
        }
    }
}
