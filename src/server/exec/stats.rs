//! STAT: the general counters memcached clients expect; memcached's groups `settings`,
//! `items`, `slabs`, `sizes`, `conns`, `reset` and `detail on|off|dump`; and Headroom's own
//! `arena`, `io`, `segments` and `placement`. `docs/protocol.md` lists every name.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Instant;

use crate::store::detail::{self, PrefixCounts};
use crate::store::{ItemClass, StoreStats};

use crate::server::shard::counters::ConnCounters;
use crate::server::shard::ctx::{
    ConnRow, MasterSnapshot, ShardCtx, ShardReply, ShardRequest, ShardSnapshot, StatAnswer,
    StatQuery,
};
use crate::server::shard::shared::Shared;
use crate::server::shard::warm_report::Skip;

/// Gathers every shard's snapshot (this one's directly, the others over the mesh).
/// Every partition's figures, each read under its lock.
struct PartitionFigures {
    store: StoreStats,
    arena: Vec<crate::arena::ShardArenaStats>,
}

fn partition_figures(shared: &Shared) -> PartitionFigures {
    let partitions = &shared.partitions;
    let mut figures = PartitionFigures {
        store: StoreStats::default(),
        arena: Vec::with_capacity(partitions.len()),
    };
    for index in 0..partitions.len() {
        let store = partitions.lock(index);
        figures.store.add(&store.stats());
        figures.arena.push(store.arena().stats());
    }
    figures
}

/// Every shard's per-core figures (this one's directly, the others over the mesh).
async fn gather(ctx: &ShardCtx) -> Vec<ShardSnapshot> {
    let mut snapshots = Vec::with_capacity(ctx.shards);
    for shard in 0..ctx.shards {
        if shard == ctx.id {
            snapshots.push(ctx.snapshot());
        } else if let ShardReply::Stats(snapshot) = ctx.call(shard, ShardRequest::Stats).await {
            snapshots.push(*snapshot);
        }
    }
    snapshots
}

/// Answers a [`StatQuery`] on this shard.
pub fn answer(ctx: &ShardCtx, query: StatQuery) -> StatAnswer {
    match query {
        StatQuery::Reset => {
            *ctx.counters.borrow_mut() = ConnCounters::default();
            ctx.latency.reset();
            StatAnswer::Done
        }
        StatQuery::Conns => {
            let started = ctx.shared.started;
            let now = Instant::now();
            let mut rows: Vec<ConnRow> = ctx
                .conns
                .borrow()
                .values()
                .map(|c| ConnRow {
                    fd: c.fd,
                    addr: c.endpoint.conns_addr(),
                    listen_addr: c.endpoint.conns_listen_addr(),
                    state: c.state.get(),
                    idle_seconds: clock_seconds_between(started, c.last_command.get(), now),
                })
                .collect();
            rows.sort_by_key(|r| r.fd);
            StatAnswer::Conns(rows)
        }
    }
}

/// Seconds from `then` to `now` on a clock that ticks once a second from `started`
/// (memcached's `current_time`, which `secs_since_last_cmd` is read on): a command read in the
/// second before this one is 1 second old however little of a second has passed.
fn clock_seconds_between(started: Instant, then: Instant, now: Instant) -> u64 {
    let tick = |at: Instant| at.saturating_duration_since(started).as_secs();
    tick(now).saturating_sub(tick(then))
}

/// Runs `query` on every shard, this one included.
async fn query_all(ctx: &ShardCtx, query: StatQuery) -> Vec<StatAnswer> {
    let mut answers = Vec::with_capacity(ctx.shards);
    for shard in 0..ctx.shards {
        if shard == ctx.id {
            answers.push(answer(ctx, query));
        } else if let ShardReply::StatAnswer(a) =
            ctx.call(shard, ShardRequest::StatQuery(query)).await
        {
            answers.push(a);
        }
    }
    answers
}

fn rusage_seconds() -> (f64, f64) {
    match nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF) {
        Ok(usage) => {
            let secs = |tv: nix::sys::time::TimeVal| tv.tv_sec() as f64 + tv.tv_usec() as f64 / 1e6;
            (secs(usage.user_time()), secs(usage.system_time()))
        }
        Err(_) => (0.0, 0.0),
    }
}

/// What the general group is made of: every partition's and every shard's figures, summed.
#[derive(Clone, Debug, Default)]
pub(crate) struct GeneralFigures {
    pub uptime_seconds: u64,
    pub version: String,
    pub rusage_user_seconds: f64,
    pub rusage_system_seconds: f64,
    pub max_connections: usize,
    pub curr_connections: usize,
    pub total_connections: u64,
    pub rejected_connections: u64,
    /// What the connections hold, and the buffers kept free for them.
    pub conn_memory: crate::server::shard::ctx::ConnMemory,
    /// Sources whose failure budget is spent now (`auth_gate`).
    pub auth_sources_held: u64,
    /// `watch` connections open now (memcached's `log_watchers`).
    pub log_watchers: usize,
    /// What the server listens on: `--listen`'s address, `tls` (`user` or `off`) and the unix
    /// socket's path (`off` without one).
    pub listen: String,
    /// The warm restart at start: items restored, dropped, and the restore's nanoseconds.
    pub warm_restart: [u64; 4],
    /// Items the warm restart did not restore, by reason (`warm_report::Skip::ALL`'s order).
    pub warm_restart_skipped: [u64; Skip::ALL.len()],
    /// Each `--listen` address's TLS, in `listen`'s order.
    pub listen_tls: String,
    pub listen_unix: String,
    /// TLS's counters, with `--tls-cert`.
    pub tls: Option<TlsFigures>,
    pub store: StoreStats,
    pub conn: ConnCounters,
    pub cache_bytes: u64,
    pub shards: usize,
    pub compactions: u64,
    pub compaction_bytes_moved: u64,
    pub partitions: usize,
    pub lock_acquisitions: u64,
    pub locks_contended: u64,
    /// Sampled hold times: p50, p99 and the longest, in nanoseconds (bucket upper bounds).
    pub lock_hold_ns: [u64; 3],
    pub mesh_placement: u64,
    pub mesh_control: u64,
    pub mesh_connection: u64,
    pub idle_blocks: u64,
}

/// TLS's counters, under memcached's names.
#[derive(Clone, Debug, Default)]
pub(crate) struct TlsFigures {
    /// `None` without session resumption: memcached counts sessions only with its cache.
    pub new_sessions: Option<u64>,
    pub resumed_sessions: u64,
    pub handshake_errors: u64,
    pub proto_errors: u64,
    pub seconds_since_cert_refresh: u64,
}

/// Gathers the general group's figures: the partitions' (each under its lock), `snapshots`
/// (every shard's per-core figures), and the process's. Runs on any thread.
pub(crate) fn general_figures(
    shared: &Shared,
    shards: usize,
    snapshots: &[ShardSnapshot],
) -> GeneralFigures {
    let figures = partition_figures(shared);
    let mut conn = ConnCounters::default();
    let (mut mesh_placement, mut mesh_control, mut idle_blocks) = (0u64, 0u64, 0u64);
    let mut mesh_connection = 0u64;
    let mut conn_memory = crate::server::shard::ctx::ConnMemory::default();
    for s in snapshots {
        conn.add(&s.conn);
        conn_memory.add(&s.conn_memory);
        mesh_placement += s.mesh.placement;
        mesh_control += s.mesh.control;
        mesh_connection += s.mesh.connection;
        idle_blocks += s.idle_blocks;
    }
    let arena = shared.arena.stats(&figures.arena);
    let (acquisitions, contended, holds) = shared.partitions.lock_stats();
    let (user, system) = rusage_seconds();
    let quantile = |q| crate::store::partition::quantile_ns(&holds, q);
    GeneralFigures {
        uptime_seconds: shared.started.elapsed().as_secs(),
        version: shared.version.clone(),
        rusage_user_seconds: user,
        rusage_system_seconds: system,
        max_connections: shared.settings.max_connections,
        curr_connections: shared.curr_connections.load(Ordering::Relaxed),
        total_connections: shared.total_connections.load(Ordering::Relaxed),
        rejected_connections: shared.rejected_connections.load(Ordering::Relaxed),
        conn_memory,
        auth_sources_held: shared
            .auth_gate
            .held_sources(std::time::Instant::now(), 0)
            .1 as u64,
        log_watchers: shared.watchers.count(),
        listen: shared
            .listen_addrs
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(","),
        warm_restart: [
            shared.warm_restart.restored.load(Ordering::Relaxed),
            shared.warm_restart.dropped.load(Ordering::Relaxed),
            shared.warm_restart.restore_ns.load(Ordering::Relaxed),
            shared.warm_restart.evicted.load(Ordering::Relaxed),
        ],
        warm_restart_skipped: Skip::ALL.map(|why| shared.warm_restart.skipped(why)),
        listen_tls: shared
            .settings
            .listen
            .iter()
            .map(|l| l.tls.name())
            .collect::<Vec<_>>()
            .join(","),
        listen_unix: shared
            .settings
            .unix_socket
            .as_ref()
            .map_or("off".to_string(), |p| p.display().to_string()),
        tls: shared.tls.as_ref().map(|tls| TlsFigures {
            new_sessions: tls
                .files
                .session_resumption
                .then(|| tls.new_sessions.load(Ordering::Relaxed)),
            resumed_sessions: tls.resumed_sessions.load(Ordering::Relaxed),
            handshake_errors: tls.handshake_errors.load(Ordering::Relaxed),
            proto_errors: tls.proto_errors.load(Ordering::Relaxed),
            seconds_since_cert_refresh: tls.seconds_since_load(),
        }),
        store: figures.store,
        conn,
        cache_bytes: shared.arena.plan().cache_bytes(),
        shards,
        compactions: arena.totals.compactions,
        compaction_bytes_moved: arena.totals.compaction_bytes_moved,
        partitions: shared.partitions.len(),
        lock_acquisitions: acquisitions,
        locks_contended: contended,
        lock_hold_ns: [quantile(0.5), quantile(0.99), quantile(1.0)],
        mesh_placement,
        mesh_control,
        mesh_connection,
        idle_blocks,
    }
}

fn general(ctx: &ShardCtx, snapshots: &[ShardSnapshot]) -> Vec<(String, String)> {
    general_pairs(&general_figures(&ctx.shared, ctx.shards, snapshots))
}

/// The general group's pairs, in memcached's order and then Headroom's.
pub(crate) fn general_pairs(f: &GeneralFigures) -> Vec<(String, String)> {
    let store = &f.store;
    let conn = &f.conn;
    let mut pairs: Vec<(&str, String)> = vec![
        ("pid", std::process::id().to_string()),
        ("uptime", f.uptime_seconds.to_string()),
        ("time", crate::server::shard::shared::unix_now().to_string()),
        ("version", f.version.clone()),
        (
            "pointer_size",
            (8 * std::mem::size_of::<usize>()).to_string(),
        ),
        ("rusage_user", format!("{:.6}", f.rusage_user_seconds)),
        ("rusage_system", format!("{:.6}", f.rusage_system_seconds)),
        ("max_connections", f.max_connections.to_string()),
        ("curr_connections", f.curr_connections.to_string()),
        ("total_connections", f.total_connections.to_string()),
        ("rejected_connections", f.rejected_connections.to_string()),
        // What connections hold: each one's task and state, and the buffers lent to it now
        // (an idle connection holds none). memcached's read buffer figures count the buffers
        // held and the ones kept free for the next connection.
        ("conn_bytes", f.conn_memory.conn_bytes().to_string()),
        (
            "read_buf_count",
            (f.conn_memory.read_buffers_held + f.conn_memory.read_buffers_free).to_string(),
        ),
        (
            "read_buf_bytes",
            (f.conn_memory.read_buffer_bytes_held + f.conn_memory.read_buffer_bytes_free)
                .to_string(),
        ),
        (
            "read_buf_bytes_free",
            f.conn_memory.read_buffer_bytes_free.to_string(),
        ),
        ("cmd_get", (store.get_hits + store.get_misses).to_string()),
        ("cmd_set", store.cmd_set.to_string()),
        ("cmd_flush", conn.cmd_flush.to_string()),
        (
            "cmd_touch",
            (store.touch_hits + store.touch_misses).to_string(),
        ),
        ("get_hits", store.get_hits.to_string()),
        ("get_misses", store.get_misses.to_string()),
        ("get_expired", store.get_expired.to_string()),
        // memcached finds flushed items lazily and counts the lookups that do; a FLUSH here
        // frees every item it covers when it takes effect, so no lookup ever finds one.
        ("get_flushed", "0".to_string()),
        ("delete_misses", store.delete_misses.to_string()),
        ("delete_hits", store.delete_hits.to_string()),
        ("incr_misses", store.incr_misses.to_string()),
        ("incr_hits", store.incr_hits.to_string()),
        ("decr_misses", store.decr_misses.to_string()),
        ("decr_hits", store.decr_hits.to_string()),
        ("cas_misses", store.cas_misses.to_string()),
        ("cas_hits", store.cas_hits.to_string()),
        ("cas_badval", store.cas_badval.to_string()),
        ("touch_hits", store.touch_hits.to_string()),
        ("touch_misses", store.touch_misses.to_string()),
        ("bytes_read", conn.bytes_read.to_string()),
        ("bytes_written", conn.bytes_written.to_string()),
        ("limit_maxbytes", f.cache_bytes.to_string()),
        // memcached stops listening at its connection limit (and counts it); Headroom never
        // does: connections beyond --max-connections are closed on accept
        // (rejected_connections).
        ("accepting_conns", "1".to_string()),
        ("listen_disabled_num", "0".to_string()),
        ("time_in_listen_disabled_us", "0".to_string()),
        ("threads", f.shards.to_string()),
        // Every stored byte, as dashboards read memcached's: RAM and segments (split below,
        // ram_bytes and large_bytes).
        ("bytes", (store.bytes + store.large_bytes).to_string()),
        ("curr_items", store.curr_items.to_string()),
        ("total_items", store.total_items.to_string()),
        ("evictions", store.evictions.to_string()),
        ("reclaimed", store.expired_reclaimed.to_string()),
        ("expired_reclaimed", store.expired_reclaimed.to_string()),
        ("lrutail_reflocked", store.lrutail_reflocked.to_string()),
        ("index_bytes", store.index_bytes.to_string()),
        ("ram_bytes", store.bytes.to_string()),
        ("large_items", store.large_items.to_string()),
        ("large_bytes", store.large_bytes.to_string()),
        ("large_heads_dropped", store.large_heads_dropped.to_string()),
        ("too_large", store.too_large.to_string()),
        // memcached's names for the same two counts.
        ("store_too_large", store.too_large.to_string()),
        ("store_no_memory", store.out_of_memory.to_string()),
        ("large_values_refused", store.large_refusals.to_string()),
        ("out_of_memory", store.out_of_memory.to_string()),
        ("compactions", f.compactions.to_string()),
        (
            "compaction_bytes_moved",
            f.compaction_bytes_moved.to_string(),
        ),
        ("commands", conn.commands.to_string()),
        ("frame_bad_magic", conn.bad_magic.to_string()),
        ("frame_body_too_short", conn.body_too_short.to_string()),
        ("frame_key_too_long", conn.key_too_long.to_string()),
        ("frame_invalid", conn.invalid_frames.to_string()),
        ("frame_unknown_opcode", conn.unknown_opcodes.to_string()),
        ("frame_too_large", conn.too_large_frames.to_string()),
        ("text_errors", conn.text_errors.to_string()),
        ("line_scan_bytes", conn.line_scan_bytes.to_string()),
        (
            "line_incomplete_reads",
            conn.line_incomplete_reads.to_string(),
        ),
        (
            "read_buffer_max_bytes",
            conn.read_buffer_max_bytes.to_string(),
        ),
        ("idle_closed", conn.idle_closed.to_string()),
        ("body_timeouts", conn.body_timeouts.to_string()),
        (
            "segment_read_crc_errors",
            conn.segment_read_crc_errors.to_string(),
        ),
        // memcached's name for the same count (a value from its disk tier failing its CRC).
        (
            "badcrc_from_extstore",
            conn.segment_read_crc_errors.to_string(),
        ),
        (
            "segment_write_errors",
            conn.segment_write_errors.to_string(),
        ),
        (
            "segment_write_no_space",
            conn.segment_write_no_space.to_string(),
        ),
        ("auth_cmds", conn.auth_cmds.to_string()),
        ("auth_errors", conn.auth_errors.to_string()),
        ("auth_closed", conn.auth_closed.to_string()),
        ("auth_held", conn.auth_held.to_string()),
        ("auth_sources_held", f.auth_sources_held.to_string()),
        ("log_watchers", f.log_watchers.to_string()),
        ("large_evictions", store.large_evictions.to_string()),
        ("headroom_version", env!("CARGO_PKG_VERSION").to_string()),
        ("partitions", f.partitions.to_string()),
        ("partition_locks", f.lock_acquisitions.to_string()),
        ("partition_locks_contended", f.locks_contended.to_string()),
        ("partition_lock_hold_p50_ns", f.lock_hold_ns[0].to_string()),
        ("partition_lock_hold_p99_ns", f.lock_hold_ns[1].to_string()),
        ("partition_lock_hold_max_ns", f.lock_hold_ns[2].to_string()),
        ("mesh_messages_placement", f.mesh_placement.to_string()),
        ("mesh_messages_control", f.mesh_control.to_string()),
        ("mesh_messages_connection", f.mesh_connection.to_string()),
        ("core_batch_idle_blocks", f.idle_blocks.to_string()),
        ("warm_restart_restored", f.warm_restart[0].to_string()),
        ("warm_restart_dropped", f.warm_restart[1].to_string()),
        ("warm_restart_ns", f.warm_restart[2].to_string()),
        ("warm_restart_evicted", f.warm_restart[3].to_string()),
        ("listen", f.listen.clone()),
        ("listen_tls", f.listen_tls.clone()),
        ("listen_unix", f.listen_unix.clone()),
    ];
    let at = pairs
        .iter()
        .position(|(name, _)| *name == "warm_restart_evicted")
        .map_or(pairs.len(), |i| i + 1);
    let skipped = Skip::ALL
        .iter()
        .zip(f.warm_restart_skipped)
        .map(|(why, count)| (why.stat_name(), count.to_string()));
    pairs.splice(at..at, skipped);
    // memcached shows these with TLS on only.
    if let Some(tls) = &f.tls {
        let at = pairs
            .iter()
            .position(|(name, _)| *name == "rejected_connections")
            .map_or(pairs.len(), |i| i + 1);
        let new_sessions = tls
            .new_sessions
            .map(|n| ("ssl_new_sessions", n.to_string()));
        let tls_pairs = new_sessions.into_iter().chain([
            ("tls_resumed_sessions", tls.resumed_sessions.to_string()),
            ("ssl_handshake_errors", tls.handshake_errors.to_string()),
            ("ssl_proto_errors", tls.proto_errors.to_string()),
            (
                "time_since_server_cert_refresh",
                tls.seconds_since_cert_refresh.to_string(),
            ),
        ]);
        pairs.splice(at..at, tls_pairs);
    }
    pairs.into_iter().map(|(n, v)| (n.to_string(), v)).collect()
}

/// A switch in the words memcached's `stats settings` gives most of them.
fn yes_no(on: bool) -> &'static str {
    if on {
        "yes"
    } else {
        "no"
    }
}

/// A switch as memcached gives `evictions`.
fn on_off(on: bool) -> &'static str {
    if on {
        "on"
    } else {
        "off"
    }
}

/// memcached's verbosity for a log filter: 0 below info, 1 info, 2 debug, 3 trace.
fn verbosity(log_level: &str) -> u8 {
    let level = log_level.to_ascii_lowercase();
    if level.contains("trace") {
        3
    } else if level.contains("debug") {
        2
    } else if level.contains("info") {
        1
    } else {
        0
    }
}

fn settings(ctx: &ShardCtx) -> Vec<(String, String)> {
    let s = &ctx.shared.settings;
    let a = &s.arena;
    let pairs = [
        (
            "maxbytes",
            ctx.shared.arena.plan().cache_bytes().to_string(),
        ),
        ("maxconns", s.max_connections.to_string()),
        // memcached's names: the first address's port (0: no TCP), and every interface.
        (
            "tcpport",
            ctx.shared
                .listen_addrs
                .first()
                .map_or(0, |a| a.port())
                .to_string(),
        ),
        (
            "inter",
            match s.listen.is_empty() {
                true => "NULL".to_string(),
                false => s
                    .listen
                    .iter()
                    .map(|a| a.addr.ip().to_string())
                    .collect::<Vec<_>>()
                    .join(","),
            },
        ),
        // memcached's -v count, from the log level: -v is info, -vv debug, -vvv trace.
        ("verbosity", verbosity(&s.log_level).to_string()),
        ("num_threads", ctx.shards.to_string()),
        ("item_size_max", s.max_item_bytes.to_string()),
        (
            "tcp_backlog",
            crate::server::shard::listen::LISTEN_BACKLOG.to_string(),
        ),
        // A connection over maxconns is told and closed at once.
        ("maxconns_fast", "yes".to_string()),
        // memcached 1.6.40's width of client flags in bytes: 32-bit flags.
        ("client_flags_size", std::mem::size_of::<u32>().to_string()),
        ("idle_timeout", s.idle_timeout_seconds.to_string()),
        ("body_timeout", s.body_timeout_seconds.to_string()),
        ("verify_reads", s.verify_reads.as_str().to_string()),
        ("spin_before_park_us", s.spin_before_park_micros.to_string()),
        (
            "receive_timestamps",
            if s.receive_timestamps { "on" } else { "off" }.to_string(),
        ),
        (
            "multishot_receive",
            if s.multishot_receive { "on" } else { "off" }.to_string(),
        ),
        (
            "ring_sleep",
            if s.ring_sleep { "on" } else { "off" }.to_string(),
        ),
        ("pin_shards", s.pin_shards().to_string()),
        ("promotion_interval_ms", s.promotion_interval_ms.to_string()),
        ("promotion_budget", s.promotion_budget_blocks.to_string()),
        (
            "promotion_half_life",
            s.promotion_half_life_seconds.to_string(),
        ),
        // memcached's names and words for -M, -A, -X (and -F below).
        ("evictions", on_off(s.evictions).to_string()),
        ("shutdown_command", yes_no(s.commands.shutdown).to_string()),
        ("dump_enabled", yes_no(s.commands.dump).to_string()),
        // Headroom's: memcached 1.6.45 does not report -W.
        ("watch_enabled", yes_no(s.commands.watch).to_string()),
        (
            "lru_crawler",
            if ctx.shared.crawler_enabled.load(Ordering::Relaxed) {
                "yes"
            } else {
                "no"
            }
            .to_string(),
        ),
        // No UDP listener.
        ("udpport", "0".to_string()),
        ("cas_enabled", "yes".to_string()),
        ("flush_enabled", yes_no(s.commands.flush_all).to_string()),
        (
            "domain_socket",
            s.unix_socket
                .as_ref()
                .map_or("NULL".to_string(), |p| p.display().to_string()),
        ),
        // memcached's `-a`, which it prints as octal digits without the leading 0.
        ("umask", format!("{:o}", s.unix_socket_mode)),
        (
            "auth_enabled_sasl",
            if ctx.shared.credentials.is_some() {
                "yes"
            } else {
                "no"
            }
            .to_string(),
        ),
        (
            "admin_socket",
            s.admin_socket
                .as_ref()
                .map_or("NULL".to_string(), |p| p.display().to_string()),
        ),
        ("data_dir", s.data_dir.display().to_string()),
        // One port serves all three protocols, decided by each connection's first byte.
        ("binding_protocol", "auto-negotiate".to_string()),
        ("numa", format!("{:?}", a.numa)),
        (
            "cpus",
            s.cpus
                .iter()
                .map(|c| c.to_string())
                .collect::<Vec<_>>()
                .join(","),
        ),
        ("memory", a.memory_bytes.to_string()),
        ("sub_memory", a.sub_memory_bytes.to_string()),
        (
            "small_memory",
            a.small_memory_bytes
                .map_or("none".to_string(), |b| b.to_string()),
        ),
        ("small_sub_memory", a.small_sub_memory_bytes.to_string()),
        ("block", a.block_bytes.to_string()),
        ("ram_head", a.ram_head_bytes.to_string()),
        ("small_min_alloc", a.small_min_alloc_bytes.to_string()),
        ("io_chunk", a.io_chunk_bytes.to_string()),
        (
            "perverse",
            if a.perverse { "yes" } else { "no" }.to_string(),
        ),
    ];
    let mut pairs: Vec<(String, String)> =
        pairs.into_iter().map(|(n, v)| (n.to_string(), v)).collect();
    pairs.extend(tls_settings(ctx));
    pairs
}

/// memcached's TLS settings (`ssl_enabled`, its files, `ssl_verify_mode`, `ssl_kernel_tls`).
fn tls_settings(ctx: &ShardCtx) -> Vec<(String, String)> {
    let path =
        |p: Option<&std::path::PathBuf>| p.map_or("NULL".into(), |p| p.display().to_string());
    let tls = ctx.shared.tls.as_deref();
    let files = tls.map(|tls| &tls.files);
    [
        (
            "ssl_enabled",
            if tls.is_some() { "yes" } else { "no" }.into(),
        ),
        ("ssl_chain_cert", path(files.map(|f| &f.cert))),
        ("ssl_key", path(files.map(|f| &f.key))),
        ("ssl_ca_cert", path(files.and_then(|f| f.ca.as_ref()))),
        (
            "ssl_verify_mode",
            tls.map_or(0, |t| t.verify_mode()).to_string(),
        ),
        // Sessions stay in user space (tls.rs).
        ("ssl_kernel_tls", "no".into()),
        // --tls-session-resumption: rustls's in-memory session cache.
        (
            "ssl_session_cache",
            yes_no(files.is_some_and(|f| f.session_resumption)).into(),
        ),
        // --tls-write-buffer, in bytes as memcached prints it.
        (
            "ssl_wbuf_size",
            files
                .map_or(crate::config::DEFAULT_TLS_WRITE_BUFFER.0, |f| {
                    f.write_buffer_bytes
                })
                .to_string(),
        ),
        // PEM only (OpenSSL's SSL_FILETYPE_PEM), rustls's suites, TLS 1.2 and 1.3.
        ("ssl_keyformat", "1".into()),
        ("ssl_ciphers", "NULL".into()),
        (
            "ssl_min_version",
            match files.is_some_and(|f| f.tls13_only) {
                true => "tlsv1.3",
                false => "tlsv1.2",
            }
            .into(),
        ),
        (
            "tls_handshake_timeout",
            ctx.shared
                .settings
                .tls_handshake_timeout_seconds
                .to_string(),
        ),
    ]
    .into_iter()
    .map(|(n, v)| (n.to_string(), v))
    .collect()
}

fn node_text(node: Option<u32>) -> String {
    node.map_or("unknown".to_string(), |n| n.to_string())
}

/// One row per target: `target_N_<field> value`.
pub(crate) fn segments(master: &MasterSnapshot) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for row in &master.targets {
        let p = format!("target_{}", row.id.0);
        let kind = match row.spec.kind {
            crate::segment::TargetKind::Mem => "mem",
            crate::segment::TargetKind::File => "file",
        };
        for (name, value) in [
            ("name", row.spec.name.clone()),
            ("uuid", format!("{:032x}", row.spec.uuid)),
            ("kind", kind.to_string()),
            ("host", row.spec.host.to_string()),
            ("node", node_text(row.spec.locality)),
            ("capacity", row.capacity.to_string()),
            ("used", row.used.to_string()),
            ("largest_free", row.largest_free.to_string()),
            ("objects", row.objects.to_string()),
            (
                "status",
                if row.draining { "draining" } else { "active" }.to_string(),
            ),
        ] {
            out.push((format!("{p}_{name}"), value));
        }
    }
    out
}

/// The RFC's placement metrics.
pub(crate) fn placement(master: &MasterSnapshot) -> Vec<(String, String)> {
    let s = &master.stats;
    let mut out: Vec<(String, String)> = [
        ("policy", master.policy.to_string()),
        ("segment_evictions", master.segment_evictions.to_string()),
        ("requests", s.requests.to_string()),
        (
            "requests_without_locality",
            s.requests_without_locality.to_string(),
        ),
        ("exact_node", s.exact_node.to_string()),
        ("exact_node_bytes", s.exact_node_bytes.to_string()),
        (
            "unknown_locality_placements",
            s.unknown_locality.to_string(),
        ),
        ("cross_node_fallbacks", s.cross_node_fallbacks.to_string()),
        ("other_host_fallbacks", s.other_host_fallbacks.to_string()),
        ("preferred_placements", s.preferred.to_string()),
        ("partial", s.partial.to_string()),
        ("strict_failures", s.strict_failures.to_string()),
        ("failures", s.failures.to_string()),
        ("last_failure_free", s.last_failure_free.to_string()),
        (
            "last_failure_largest_hole",
            s.last_failure_largest_hole.to_string(),
        ),
        (
            "targets_unknown_locality",
            s.targets_unknown_locality.to_string(),
        ),
    ]
    .into_iter()
    .map(|(n, v)| (n.to_string(), v))
    .collect();
    for ((local, node), capacity) in &s.by_node {
        let p = format!(
            "{}_node_{}",
            if *local { "local" } else { "remote" },
            node_text(*node)
        );
        out.push((format!("{p}_capacity"), capacity.capacity_bytes.to_string()));
        out.push((
            format!("{p}_allocated"),
            capacity.allocated_bytes.to_string(),
        ));
    }
    out
}

/// `items`: per item class (1 small, 2 fixed, 3 large), as memcached's `items:N:...`.
fn items(store: &StoreStats) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for class in ItemClass::ALL {
        let c = store.class(class);
        if c.number == 0 && c.evicted == 0 && c.reclaimed == 0 {
            continue;
        }
        let n = class as u8;
        for (name, value) in [
            ("number", c.number),
            ("mem_requested", c.requested_bytes),
            ("evicted", c.evicted),
            ("reclaimed", c.reclaimed),
        ] {
            out.push((format!("items:{n}:{name}"), value.to_string()));
        }
    }
    out
}

/// `slabs`: the item classes of `stats items` as memcached's slab classes. Class 1 is the
/// byte-granular small-object arena (a chunk is one `--small-min-alloc` granule; a page one
/// block); class 2 the fixed head slots (a chunk is one `--ram-head` slot); class 3 the
/// large values, whole in segments (STAT `segments`): a chunk is one value of up to
/// `--max-item-size`, so tools that list classes (memcached-tool `display`) show every item.
fn slabs(
    ctx: &ShardCtx,
    arena: &crate::arena::ArenaStats,
    store: &StoreStats,
) -> Vec<(String, String)> {
    let a = &ctx.shared.settings.arena;
    let mut usage = crate::arena::ShardRegionStats::default();
    for region in &arena.regions {
        usage.blocks_small += region.usage.blocks_small;
        usage.blocks_fixed += region.usage.blocks_fixed;
        usage.fixed_heads_live += region.usage.fixed_heads_live;
        usage.small_objects_live += region.usage.small_objects_live;
        usage.small_live_bytes += region.usage.small_live_bytes;
        usage.small_dead_bytes += region.usage.small_dead_bytes;
    }
    let small_chunks_per_page = a.block_bytes / a.small_min_alloc_bytes;
    let small_total = usage.blocks_small * small_chunks_per_page;
    let small_used = usage.small_live_bytes.div_ceil(a.small_min_alloc_bytes);
    let small_dead = usage.small_dead_bytes.div_ceil(a.small_min_alloc_bytes);
    let fixed_chunks_per_page = a.block_bytes / a.ram_head_bytes;
    let fixed_total = usage.blocks_fixed * fixed_chunks_per_page;
    let large = store.class(ItemClass::Large);
    let rows: [(u8, &str, u64); 21] = [
        (1, "chunk_size", a.small_min_alloc_bytes),
        (1, "chunks_per_page", small_chunks_per_page),
        (1, "total_pages", usage.blocks_small),
        (1, "total_chunks", small_total),
        (1, "used_chunks", small_used),
        (
            1,
            "free_chunks",
            small_total.saturating_sub(small_used + small_dead),
        ),
        (1, "dead_chunks", small_dead),
        (1, "mem_requested", usage.small_live_bytes),
        (2, "chunk_size", a.ram_head_bytes),
        (2, "chunks_per_page", fixed_chunks_per_page),
        (2, "total_pages", usage.blocks_fixed),
        (2, "total_chunks", fixed_total),
        (2, "used_chunks", usage.fixed_heads_live),
        (
            2,
            "free_chunks",
            fixed_total.saturating_sub(usage.fixed_heads_live),
        ),
        (3, "chunk_size", ctx.shared.settings.max_item_bytes),
        (3, "chunks_per_page", 1),
        (3, "total_pages", large.number),
        (3, "total_chunks", large.number),
        (3, "used_chunks", large.number),
        (3, "free_chunks", 0),
        (3, "mem_requested", store.large_bytes),
    ];
    let mut out: Vec<(String, String)> = rows
        .iter()
        .map(|(class, name, value)| (format!("{class}:{name}"), value.to_string()))
        .collect();
    let active = u64::from(usage.blocks_small > 0)
        + u64::from(usage.blocks_fixed > 0)
        + u64::from(large.number > 0);
    out.push(("active_slabs".into(), active.to_string()));
    out.push((
        "total_malloced".into(),
        ((usage.blocks_small + usage.blocks_fixed) * a.block_bytes).to_string(),
    ));
    out
}

/// `conns`: every client connection, as memcached's `N:addr`, `N:listen_addr`, `N:state`,
/// `N:secs_since_last_cmd` (N is the socket).
fn conns(answers: Vec<StatAnswer>) -> Vec<(String, String)> {
    let mut rows: Vec<ConnRow> = answers
        .into_iter()
        .flat_map(|a| match a {
            StatAnswer::Conns(rows) => rows,
            _ => Vec::new(),
        })
        .collect();
    rows.sort_by_key(|r| r.fd);
    let mut out = Vec::new();
    for r in rows {
        out.push((format!("{}:addr", r.fd), r.addr));
        out.push((format!("{}:listen_addr", r.fd), r.listen_addr));
        out.push((format!("{}:state", r.fd), r.state.to_string()));
        out.push((
            format!("{}:secs_since_last_cmd", r.fd),
            r.idle_seconds.to_string(),
        ));
    }
    out
}

/// The pairs answering `group`, or `None` for a group that does not exist ("not found").
pub async fn group_pairs(ctx: &ShardCtx, group: &[u8]) -> Option<Vec<(String, String)>> {
    Some(match group {
        b"" => general(ctx, &gather(ctx).await),
        b"items" => items(&partition_figures(&ctx.shared).store),
        b"slabs" => {
            let figures = partition_figures(&ctx.shared);
            slabs(ctx, &ctx.shared.arena.stats(&figures.arena), &figures.store)
        }
        b"sizes" => {
            let partitions = &ctx.shared.partitions;
            let mut sizes = BTreeMap::new();
            for index in 0..partitions.len() {
                let part = partitions.lock(index).sizes();
                for (bucket, count) in part {
                    *sizes.entry(bucket).or_insert(0u64) += count;
                }
            }
            sizes
                .into_iter()
                .map(|(bucket, count)| (bucket.to_string(), count.to_string()))
                .collect()
        }
        b"conns" => conns(query_all(ctx, StatQuery::Conns).await),
        b"reset" => {
            let partitions = &ctx.shared.partitions;
            for index in 0..partitions.len() {
                partitions.lock(index).reset_stats();
            }
            query_all(ctx, StatQuery::Reset).await;
            ctx.shared.total_connections.store(0, Ordering::Relaxed);
            ctx.shared.rejected_connections.store(0, Ordering::Relaxed);
            tracing::info!("STAT reset: counters back to zero");
            Vec::new()
        }
        // memcached's `-X` refuses every `detail` group (binary: "not found").
        b"detail on" | b"detail off" | b"detail dump" if !ctx.shared.settings.commands.dump => {
            return None
        }
        b"detail on" | b"detail off" => {
            let partitions = &ctx.shared.partitions;
            for index in 0..partitions.len() {
                partitions.lock(index).detail.enabled = group == b"detail on";
            }
            Vec::new()
        }
        b"detail dump" => {
            let partitions = &ctx.shared.partitions;
            let mut merged: BTreeMap<Vec<u8>, PrefixCounts> = BTreeMap::new();
            for index in 0..partitions.len() {
                for (prefix, counts) in partitions.lock(index).detail.snapshot() {
                    merged.entry(prefix).or_default().add(&counts);
                }
            }
            let merged: Vec<_> = merged.into_iter().collect();
            vec![("detailed".to_string(), detail::dump(&merged))]
        }
        b"settings" => settings(ctx),
        b"segments" | b"placement" => {
            let ShardReply::PlacementStats(master) =
                ctx.call_master(ShardRequest::PlacementStats).await
            else {
                unreachable!("the master answers stats with stats")
            };
            if group == b"segments" {
                segments(&master)
            } else {
                placement(&master)
            }
        }
        b"io" => gather(ctx)
            .await
            .iter()
            .enumerate()
            .flat_map(|(shard, s)| s.io.pairs(shard))
            .collect(),
        b"arena" => ctx
            .shared
            .arena
            .stats(&partition_figures(&ctx.shared).arena)
            .pairs(),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn connection_idle_seconds_tick_with_the_clock() {
        let started = Instant::now();
        let at = |ms| started + Duration::from_millis(ms);
        // Across a tick: 1 second old after 200 ms, as memcached's clock has it.
        assert_eq!(clock_seconds_between(started, at(900), at(1_100)), 1);
        // Within a second: 0, however long.
        assert_eq!(clock_seconds_between(started, at(1_000), at(1_999)), 0);
        assert_eq!(clock_seconds_between(started, at(500), at(3_499)), 3);
        // A command read after `now` was taken (another shard's connection).
        assert_eq!(clock_seconds_between(started, at(2_000), at(1_000)), 0);
    }
}
