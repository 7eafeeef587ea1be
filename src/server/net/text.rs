//! The text and meta protocols on a connection: each decoded command ([`crate::proto::text`])
//! runs on the spot. A keyed one becomes its [`Command`] (a `get` one per key) and runs
//! through the executor every protocol uses, answered by a [`TextReply`] as memcached 1.6
//! writes it; the commands that name no key (stats, flush_all, watch, lru_crawler, ...) are
//! served here.
//!
//! A GET of many keys locks each key's partition in turn (never two at once), so a multiget
//! is not a snapshot: as in memcached, a write between two of its keys may be seen by one and
//! not the other.

use std::rc::Rc;
use std::sync::atomic::Ordering;

use crate::command::{Command, StoreMode, Value};
use crate::proto::meta;
use crate::proto::text::{
    self, errors, CrawlClasses, Crawler, Switchable, TextCommand, TextDecoded,
};

use super::conn::{log_peer_error, within_auth_budget, After, Conn};
use super::large_reply::LargeReply;
use super::text_reply::{self, store_exptime, TextReply};
use crate::server::exec::control::{self, ControlOutcome};
use crate::server::exec::large::LargeSet;
use crate::server::exec::large::{self};
use crate::server::exec::replies::OUTPUT_CAP_BYTES;
use crate::server::shard::ctx::ShardCtx;
use crate::server::shard::latency::CommandKind;
use crate::server::shard::shared::unix_now;
use crate::server::shard::watch;

/// Whether the server serves `command` (`--shutdown-command`, `--flush-all-command`,
/// `--dump-commands`, `--watch-command`).
fn serves(ctx: &ShardCtx, command: Switchable) -> bool {
    let switches = &ctx.shared.settings.commands;
    match command {
        Switchable::Shutdown => switches.shutdown,
        Switchable::FlushAll => switches.flush_all,
        Switchable::StatsDetail
        | Switchable::Cachedump
        | Switchable::Metadump
        | Switchable::Mgdump => switches.dump,
        Switchable::Watch => switches.watch,
    }
}

/// memcached's `stats` in text: `STAT name value` lines and `END`; `reset` answers `RESET`,
/// `detail on|off` `OK`, `detail dump` the dump itself; an unknown group `ERROR`. `detail` and
/// `cachedump` are refused with the key dumps off.
async fn write_stats(ctx: &ShardCtx, args: &text::Words<'_>, now: u32, out: &mut Vec<u8>) {
    if let Some(dump) = text::stats_switchable(args).filter(|&dump| !serves(ctx, dump)) {
        out.extend_from_slice(dump.refusal());
        return;
    }
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
    let command = Command::Stats { group: &group };
    let Some(ControlOutcome::Stats(Some(pairs))) = control::run(ctx, &command, now).await else {
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

/// Writes what a command that names no key did, as memcached's text and meta protocols answer
/// it: `OK` (FLUSH, VERBOSITY; nothing under `noreply`), `MN`, `VERSION ...`. Returns whether
/// the connection closes (`quit`).
fn write_control(
    out: &mut Vec<u8>,
    command: &TextCommand,
    outcome: Option<ControlOutcome>,
) -> bool {
    let (noop, noreply) = match command {
        TextCommand::Run { command, noreply } => (matches!(command, Command::Noop), *noreply),
        _ => (false, false),
    };
    match outcome {
        Some(ControlOutcome::Quit) => return true,
        Some(ControlOutcome::Version(version)) => text::version(out, version),
        Some(ControlOutcome::Done) if noop => out.extend_from_slice(meta::MN),
        Some(ControlOutcome::Done) if !noreply => out.extend_from_slice(text::OK),
        Some(ControlOutcome::FlushRefused) if !noreply => {
            out.extend_from_slice(Switchable::FlushAll.refusal())
        }
        Some(ControlOutcome::Done | ControlOutcome::FlushRefused) => {}
        outcome => unreachable!("{outcome:?}: only FLUSH, VERSION, VERBOSITY, mn and quit"),
    }
    false
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
        Crawler::Crawl(_) | Crawler::Metadump(_) | Crawler::Mgdump(_)
            if !enabled.load(Ordering::Relaxed) =>
        {
            out.extend_from_slice(errors::CRAWLER_DISABLED);
        }
        // memcached checks the crawler first, then the key dumps' switch, then the pipeline.
        Crawler::Metadump(_) if !serves(ctx, Switchable::Metadump) => {
            out.extend_from_slice(Switchable::Metadump.refusal())
        }
        Crawler::Mgdump(_) if !serves(ctx, Switchable::Mgdump) => {
            out.extend_from_slice(Switchable::Mgdump.refusal())
        }
        Crawler::Crawl(CrawlClasses::Invalid) => out.extend_from_slice(errors::BADCLASS),
        Crawler::Crawl(classes) => {
            crawl(ctx, classes).await;
            out.extend_from_slice(text::OK);
        }
        Crawler::Metadump(_) if pipelined => {
            out.extend_from_slice(errors::METADUMP_AFTER_PIPELINE);
        }
        Crawler::Mgdump(_) if pipelined => out.extend_from_slice(errors::MGDUMP_AFTER_PIPELINE),
        Crawler::Metadump(CrawlClasses::Invalid) | Crawler::Mgdump(CrawlClasses::Invalid) => {
            out.extend_from_slice(errors::BADCLASS)
        }
        Crawler::Metadump(classes) | Crawler::Mgdump(classes) => {
            out.extend_from_slice(text::OK);
            return Some(Metadump {
                classes,
                mg_lines: matches!(crawler, Crawler::Mgdump(_)),
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

/// Where an `lru_crawler metadump` (or `mgdump`) is: the partition and index bucket it goes on
/// from, and the classes it lists.
struct Metadump {
    classes: CrawlClasses,
    /// `mgdump`: `mg <key>` lines.
    mg_lines: bool,
    partition: usize,
    bucket: usize,
}

/// Appends `dump`'s next lines to `out` until `out` passes the output cap (then returns the
/// dump to go on with) or every partition is walked (then appends `END`, `EN` for mgdump).
/// One line per live item, as memcached 1.6.45's crawler writes it: `key=<URI-encoded key>
/// exp=<Unix time, -1 never> la=<Unix time of the last store or fetch> cas=<CAS>
/// fetch=<yes|no> cls=<item class> size=<key plus value bytes> flags=<client flags> `, or for
/// mgdump `mg <key>` (a key that is not printable ASCII in base64, followed by ` b`).
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
            if dump.mg_lines {
                out.extend_from_slice(b"mg ");
                if key.iter().all(u8::is_ascii_graphic) {
                    out.extend_from_slice(key);
                } else {
                    crate::proto::meta::base64_encode(out, key);
                    out.extend_from_slice(b" b");
                }
                out.extend_from_slice(b"\r\n");
                return;
            }
            let _ = writeln!(
                out,
                "key={} exp={exp} la={} cas={} fetch={} cls={} size={} flags={} ",
                text::uri_encoded(key),
                item.accessed,
                item.cas,
                if item.fetched { "yes" } else { "no" },
                item.class as u8,
                item.bytes,
                item.flags,
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
    out.extend_from_slice(if dump.mg_lines { b"EN\r\n" } else { text::END });
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

/// Whether `command` is an authentication attempt (a classic `set` with credentials on).
fn is_authentication(ctx: &ShardCtx, command: &TextCommand) -> bool {
    ctx.shared.credentials.is_some()
        && matches!(command, TextCommand::Store { store, .. } if store.meta.is_none())
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
    match credentials.authenticate(crate::server::shard::auth::MECHANISMS.as_bytes(), &plain) {
        crate::server::shard::auth::AuthOutcome::Authenticated { user } => {
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
pub(crate) struct TextSession {
    /// An `lru_crawler metadump` under way: it goes out a buffer at a time, before the
    /// commands after it.
    metadump: Option<Metadump>,
}

impl TextSession {
    /// Runs every whole text or meta command buffered on `conn`, up to the output cap, and
    /// says what the connection does next. `now`: the time the commands run at, in Unix
    /// seconds.
    pub(crate) async fn process(&mut self, conn: &mut Conn, ctx: &Rc<ShardCtx>, now: u32) -> After {
        let max_item = ctx.shared.settings.max_item_bytes as usize;
        // Values above ram_head live in segments: they are streamed, never buffered whole.
        let stream_from = ctx.shared.settings.arena.ram_head_bytes as usize;
        let lend_from = ctx.io.lend_from();
        loop {
            if let Some(dump) = self.metadump.take() {
                self.metadump = Box::pin(continue_metadump(ctx, dump, &mut conn.replies.out)).await;
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
                        log_peer_error(ctx, conn.peer(), what, true);
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
                    log_peer_error(ctx, conn.peer(), &what, close);
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
                    if conn.authenticated {
                        let command = Command::Refuse {
                            key: &key,
                            drop_existing,
                        };
                        let mut reply = TextReply::Refused(reply);
                        conn.replies
                            .run(ctx, &command, (now, conn.fd), None, &mut reply);
                    } else if buffered.starts_with(b"set ") {
                        conn.replies.out.extend_from_slice(AUTH_TOKEN_TOO_LONG);
                    } else {
                        conn.replies.out.extend_from_slice(UNAUTHENTICATED);
                    }
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
                    let (set, reply) =
                        large_set_of(&store, Value::Streamed(store.value_len as u64));
                    return After::LargeSet(set, reply);
                }
                TextDecoded::Command { command, consumed } => (command, consumed),
            };
            ctx.counters.borrow_mut().commands += 1;
            conn.batch.add(CommandKind::of_text(&command));
            if !conn.authenticated {
                // `Conn::consume`, field by field: the command still borrows the buffer.
                conn.consumed += consumed;
                conn.line_scan.consumed(consumed);
                let outcome = if is_authentication(ctx, &command) {
                    let attempt = || authenticate(ctx, &command);
                    let accepted = |done: &Auth| matches!(done, Auth::Accepted);
                    let answer = within_auth_budget(ctx, (conn.peer(), conn.fd), attempt, accepted);
                    match answer.await {
                        Some(outcome) => outcome,
                        None => return After::Close,
                    }
                } else {
                    authenticate(ctx, &command)
                };
                match outcome {
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
            if let Some(named) = command.command().filter(|c| c.key().is_none()) {
                // Boxed, as the other rare waits here: a connection's task is as big as its
                // biggest wait.
                let outcome = Box::pin(control::run(ctx, &named, now)).await;
                let quit = write_control(&mut conn.replies.out, &command, outcome);
                conn.consume(consumed);
                if quit {
                    return After::Quit;
                }
                continue;
            }
            match &command {
                TextCommand::Get { cas, touch, keys } => {
                    let touch = touch.map(store_exptime);
                    for key in keys.iter() {
                        let command = Command::Get {
                            key,
                            touch,
                            value: true,
                        };
                        let with_cas = *cas;
                        let mut reply = TextReply::Value { key, with_cas };
                        let how = (now, conn.fd);
                        conn.replies.run(ctx, &command, how, lend_from, &mut reply);
                    }
                    conn.replies.out.extend_from_slice(text::END);
                }
                // memcached's answers, word for word.
                TextCommand::RefreshCerts => match ctx.shared.tls.as_deref().map(|t| t.reload()) {
                    None => conn
                        .replies
                        .out
                        .extend_from_slice(b"Error TLS not enabled\r\n"),
                    Some(Ok(())) => conn.replies.out.extend_from_slice(text::OK),
                    Some(Err(why)) => {
                        tracing::error!("refresh_certs: TLS files not reloaded, the ones in use are kept: {why}");
                        let line = format!("Error reloading the certificates: {why}\r\n");
                        conn.replies.out.extend_from_slice(line.as_bytes());
                    }
                },
                TextCommand::Stats { args } => {
                    let args = *args;
                    let mut out = std::mem::take(&mut conn.replies.out);
                    Box::pin(write_stats(ctx, &args, now, &mut out)).await;
                    conn.replies.out = out;
                }
                TextCommand::Watch { kinds } => {
                    // Checked in memcached's order: the switch, replies waiting, the kinds.
                    if !serves(ctx, Switchable::Watch) {
                        conn.replies.out.extend_from_slice(errors::WATCH_DISABLED);
                        conn.consume(consumed);
                        continue;
                    }
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
                TextCommand::Shutdown { graceful } if serves(ctx, Switchable::Shutdown) => {
                    let graceful = *graceful;
                    conn.consume(consumed);
                    // As memcached: no reply, the connection closes (after the replies before
                    // it here), the server stops.
                    match control::shutdown(conn.peer(), graceful) {
                        Ok(()) => return After::Quit,
                        Err(line) => conn.replies.out.extend_from_slice(line.as_bytes()),
                    }
                    continue;
                }
                TextCommand::Shutdown { .. } => conn
                    .replies
                    .out
                    .extend_from_slice(errors::SHUTDOWN_DISABLED),
                TextCommand::Malformed {
                    command,
                    reply,
                    noreply,
                } => {
                    let served = serves(ctx, *command);
                    let mut counters = ctx.counters.borrow_mut();
                    // memcached counts a flush_all before it reads it, refused or not.
                    if *command == Switchable::FlushAll {
                        counters.cmd_flush += 1;
                    }
                    if served {
                        counters.text_errors += 1;
                    }
                    drop(counters);
                    if !noreply {
                        let line = if served { reply } else { command.refusal() };
                        conn.replies.out.extend_from_slice(line);
                    }
                }
                TextCommand::LruCrawler(crawler) => {
                    let pipelined = !conn.replies.is_empty();
                    let crawler = *crawler;
                    let mut out = std::mem::take(&mut conn.replies.out);
                    self.metadump = Box::pin(lru_crawler(ctx, crawler, pipelined, &mut out)).await;
                    conn.replies.out = out;
                }
                TextCommand::Store { store, value }
                    if matches!(store.mode, StoreMode::Append | StoreMode::Prepend)
                        && large::concat_needs_segment(ctx, &store.key, value.len(), now) =>
                {
                    // The sum outgrows RAM (or the value is in a segment already): the new
                    // value is built in a segment, the data block read from the buffer.
                    // (`Conn::consume` of the line alone, field by field.)
                    let line_len = consumed - value.len() - 2;
                    conn.consumed += line_len;
                    conn.line_scan.consumed(line_len);
                    let (set, reply) = large_set_of(store, Value::Whole(value));
                    return After::LargeSet(set, reply);
                }
                keyed => {
                    let command = keyed.command().expect("keyed text commands are commands");
                    let mut reply = TextReply::of(keyed).expect("keyed text commands reply");
                    let how = (now, conn.fd);
                    conn.replies.run(ctx, &command, how, lend_from, &mut reply);
                }
            }
            conn.consume(consumed);
        }
    }
}

/// A text or `ms` storage command whose value goes to a segment (`value`: streamed, or a
/// whole APPEND or PREPEND whose sum outgrows RAM), and how it is answered.
pub(crate) fn large_set_of(
    store: &crate::proto::TextStore,
    value: Value<'_>,
) -> (LargeSet, LargeReply) {
    let hints = store.meta.as_ref().and_then(|ms| ms.hints.clone());
    let set = LargeSet::of(&store.command(value), hints).expect("a store");
    (
        set,
        LargeReply::Text(Box::new(text_reply::OwnedStoreReply::of(store))),
    )
}
