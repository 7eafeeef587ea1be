//! Start-up configuration: flags (clap), an optional TOML file (`--config`), and the rules of
//! ADR-0008 checked before any memory is mapped.
//!
//! The command line wins over the file. Every rule has its own [`ConfigError`], whose message
//! is one sentence naming the flag and the rule; the binary exits with status 2 on any of them.

use std::fmt;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::str::FromStr;

use clap::Parser;
use serde::Deserialize;

pub use crate::units::{ByteSize, SizeParseError};

use crate::arena::{ArenaConfig, NumaMode};
use crate::placement::Policy;
use crate::segment::{FileLocality, SegmentSpec};
use crate::topology::{NodeId, Topology};

pub mod memcached;

/// Exit status for every configuration error (as clap uses for usage errors).
pub const CONFIG_ERROR_EXIT: i32 = 2;
/// Most partitions (stores) one server has: their number fits the top 16 bits of a CAS.
pub const PARTITIONS_MAX: usize = 1 << 16;
/// The smallest I/O granule and the alignment every head keeps (device block, ADR-0011).
pub const DEVICE_BLOCK_BYTES: u64 = 4096;
/// io_uring registers buffers of at most 1 GiB; a block must fit one.
pub const MAX_BLOCK_BYTES: u64 = 1 << 30;

pub const DEFAULT_MEMORY: ByteSize = ByteSize(64 << 20);
pub const DEFAULT_RAM_HEAD: ByteSize = ByteSize(256 << 10);
pub const DEFAULT_IO_CHUNK: ByteSize = ByteSize(1 << 20);
/// GET values from this size up leave zero-copy on the ring path (docs/benchmarks.md).
pub const DEFAULT_ZERO_COPY_MIN: ByteSize = ByteSize(128 << 10);
/// The default streaming pool per shard, in chunks (before rounding up to whole blocks).
pub const DEFAULT_IO_POOL_CHUNKS: u64 = 8;
pub const DEFAULT_SMALL_MIN_ALLOC: u64 = 16;
pub const DEFAULT_LISTEN: &str = "127.0.0.1:11211";
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;
/// A stalled large SET holds its segment extents this long at most: a client that is sending
/// brings bytes within milliseconds, and 30 s outlasts a congested link's stalls.
pub const DEFAULT_BODY_TIMEOUT_SECONDS: u64 = 30;
/// `--tls-handshake-timeout`'s default.
pub const DEFAULT_TLS_HANDSHAKE_TIMEOUT_SECONDS: u64 = 10;
/// `--unix-socket-mode`'s default: its owner only, as memcached's `-a`.
pub const DEFAULT_UNIX_SOCKET_MODE: u32 = 0o700;

/// `--tls-session-resumption`'s default: a client that reconnects skips the full handshake.
pub const DEFAULT_TLS_SESSION_RESUMPTION: bool = true;
/// `--tls-write-buffer`'s default. Each part of a reply sealed is a send of its own, and a
/// loopback send of 16 KiB (memcached's `ssl_wbuf_size` default, which its flags keep) costs
/// 1.44x the CPU per GB of 256 KiB GETs this does (docs/benchmarks.md, "TLS").
pub const DEFAULT_TLS_WRITE_BUFFER: ByteSize = ByteSize(256 << 10);
/// `--tls-write-buffer`'s bounds: 1 KiB (memcached's unit) to 16 MiB.
pub const TLS_WRITE_BUFFER_MIN_BYTES: u64 = 1 << 10;
pub const TLS_WRITE_BUFFER_MAX_BYTES: u64 = 16 << 20;

/// The TLS of `--listen`: the files it is configured from and how sessions are kept.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// The server's certificate chain (PEM), leaf first.
    pub cert: PathBuf,
    /// Its private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// The CA (PEM) client certificates are checked against.
    pub ca: Option<PathBuf>,
    /// What an address without a TLS prefix asks of a client's certificate
    /// (`--tls-client-cert`; memcached's `ssl_verify_mode`).
    pub client_certs: ClientCerts,
    /// Refuse TLS 1.2: only TLS 1.3 (memcached's `ssl_min_version=3`).
    pub tls13_only: bool,
    /// A client may resume a session made earlier (memcached's `ssl_session_cache`).
    pub session_resumption: bool,
    /// The most of one reply's plaintext sealed ahead of what the socket has taken
    /// (memcached's `ssl_wbuf_size`): bounds the records a connection holds while a large
    /// value goes out.
    pub write_buffer_bytes: u64,
}

/// Whether a `--listen` address serves TLS, and what it asks of the client's certificate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ListenerTls {
    /// Plain TCP (`plain:`, or any address without `--tls-cert`).
    Off,
    /// TLS, asking for a client certificate as this says.
    On(ClientCerts),
}

/// What a TLS listener asks of a client's certificate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ClientCerts {
    /// None is asked for (`tls:`, no `--tls-ca`, or `--tls-client-cert none`).
    NotAsked,
    /// Asked for and checked against `--tls-ca` when given (`--tls-client-cert optional`).
    Optional,
    /// Required, signed by `--tls-ca` (`mtls:`, or `--tls-ca`).
    Required,
}

/// One `--listen` address and its TLS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ListenAddress {
    pub addr: SocketAddr,
    pub tls: ListenerTls,
}

impl ListenerTls {
    /// As STAT `listen_tls` shows it: `off`, `tls`, `tls_optional_cert` or `mtls`.
    pub fn name(self) -> &'static str {
        match self {
            ListenerTls::Off => "off",
            ListenerTls::On(ClientCerts::NotAsked) => "tls",
            ListenerTls::On(ClientCerts::Optional) => "tls_optional_cert",
            ListenerTls::On(ClientCerts::Required) => "mtls",
        }
    }
}

/// The longest `--idle-timeout` and `--body-timeout` (one day): far longer overflows the
/// timer's clock (an `Instant` plus the timeout), and no link stalls for a day.
pub const TIMEOUT_MAX_SECONDS: u64 = 86_400;
/// Just under the protocol's 4 GiB body limit: large values are streamed, so a high limit
/// costs no buffer memory.
pub const DEFAULT_MAX_ITEM_SIZE: ByteSize = ByteSize(4095 << 20);
/// The data directory when neither `--data-dir` nor `$STATE_DIRECTORY` names one.
pub const DEFAULT_DATA_DIR: &str = "./data";
/// Set by systemd for a unit with `StateDirectory=` (the first path, when there are several):
/// the default data directory under a service manager, so a service never writes to `/data`.
pub const STATE_DIRECTORY_ENV: &str = "STATE_DIRECTORY";
/// The default file segment's size (a sparse file: disk is used as values are written).
pub const DEFAULT_SEGMENT_BYTES: u64 = 1 << 30;
pub use crate::segment::spec::SEGMENT_GRANULE_BYTES;

/// The version with the commit it was built from (`build.rs`): `0.1.0 (commit 1a2b3c4d5e6f)`,
/// `-dirty` when the tree had uncommitted changes, `unknown` when built without git.
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("HEADROOM_COMMIT"),
    ")"
);

/// The default data directory: `$STATE_DIRECTORY` (its first path) when set, else `./data`.
pub fn default_data_dir() -> PathBuf {
    std::env::var_os(STATE_DIRECTORY_ENV)
        .and_then(|dirs| {
            let dirs = dirs.to_string_lossy().into_owned();
            dirs.split(':').find(|d| !d.is_empty()).map(PathBuf::from)
        })
        .unwrap_or_else(|| PathBuf::from(DEFAULT_DATA_DIR))
}

/// `--log-format`: lines of text, or one JSON object per line.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// `--block` default: the platform huge page order (ADR-0008).
pub const fn default_block() -> ByteSize {
    ByteSize(crate::topology::platform_huge_page_bytes())
}

/// `--numa` value: a node number or `auto`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NumaArg {
    Auto,
    Node(NodeId),
}

impl FromStr for NumaArg {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if text.eq_ignore_ascii_case("auto") {
            return Ok(NumaArg::Auto);
        }
        text.parse()
            .map(NumaArg::Node)
            .map_err(|_| format!("'{text}' is neither a NUMA node number nor 'auto'"))
    }
}

impl<'de> Deserialize<'de> for NumaArg {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Node(NodeId),
            Text(String),
        }
        match Raw::deserialize(deserializer)? {
            Raw::Node(node) => Ok(NumaArg::Node(node)),
            Raw::Text(text) => text.parse().map_err(serde::de::Error::custom),
        }
    }
}

const AFTER_HELP: &str = "\
Sizes take binary units: 4G, 256M, 2MiB, 64k, or plain bytes.
Every budget is whole --block units; the command line wins over --config.
Set HEADROOM_TOPOLOGY=FILE to plan against a synthetic NUMA layout (docs/topology.md).
memcached's command line is read too (headroom -m 64 -p 11211 -u memcache ...; headroom -m 64 -h
lists its flags), and Debian's /etc/memcached.conf with --memcached-conf (docs/operations.md).
Exit status: 0 ok, 1 runtime failure, 2 invalid configuration.";

/// Command-line flags. Every setting is optional here so the file can supply it.
#[derive(Parser, Debug, Default, Clone)]
#[command(name = "headroom", version = VERSION, about = "A thread-per-core io_uring cache server \
    for objects of any size, speaking memcached's text, meta and binary protocols", after_help = AFTER_HELP)]
pub struct Cli {
    /// Read settings from this TOML file (keys are the flag names without `--`).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// Print the memory plan (one line per region) and exit without mapping anything.
    #[arg(long)]
    pub dry_run: bool,

    /// Serving NUMA node: a node number, or `auto` (the node of the NIC that holds --listen,
    /// else node 0). Default: auto.
    #[arg(long, value_name = "NODE|auto", conflicts_with = "no_numa")]
    pub numa: Option<NumaArg>,

    /// Do not bind memory or threads to any NUMA node.
    #[arg(long)]
    pub no_numa: bool,

    /// Fixed-head (and, without --small-memory, small-object) RAM on the serving node
    /// [default: 64M].
    #[arg(long, value_name = "SIZE")]
    pub memory: Option<ByteSize>,

    /// Fixed-head RAM on every other online node; needs an explicit --numa [default: 0].
    #[arg(long, value_name = "SIZE")]
    pub sub_memory: Option<ByteSize>,

    /// Dedicated small-object RAM on the serving node; splits the pools so heads and small
    /// objects never borrow from each other.
    #[arg(long, value_name = "SIZE")]
    pub small_memory: Option<ByteSize>,

    /// Dedicated small-object RAM on every other online node; needs --small-memory and an
    /// explicit --numa [default: 0].
    #[arg(long, value_name = "SIZE")]
    pub small_sub_memory: Option<ByteSize>,

    /// Allocation block: a power-of-two multiple of the huge page size
    /// [default: 2M on x86-64, 32M on aarch64].
    #[arg(long, value_name = "SIZE")]
    pub block: Option<ByteSize>,

    /// RAM head per object: a power of two from 4K up to --block. Smaller objects are packed;
    /// larger ones keep their first ram-head bytes in RAM [default: 256K].
    #[arg(long, value_name = "SIZE")]
    pub ram_head: Option<ByteSize>,

    /// Packing granule of small objects, 8 or 16 bytes [default: 16].
    #[arg(long, value_name = "BYTES")]
    pub small_min_alloc: Option<u64>,

    /// I/O chunk of the streaming pools: a power of two from 4K up to --block [default: 1M].
    #[arg(long, value_name = "SIZE")]
    pub io_chunk: Option<ByteSize>,

    /// Streaming pool per shard (large values move through it in --io-chunk pieces): whole
    /// --block units, at least two chunks; mapped beside the arena on the serving node
    /// [default: 8 chunks, rounded up to whole blocks].
    #[arg(long, value_name = "SIZE")]
    pub io_pool: Option<ByteSize>,

    /// The io_uring data path: `on` registers the arena with a ring per shard (zero-copy head
    /// sends, fixed-buffer segment I/O) and falls back to the plain path, saying why, when the
    /// kernel refuses; `off` forces the plain path [default: on].
    #[arg(long, value_name = "on|off")]
    pub io_ring: Option<String>,

    /// On the ring path, GET values (and large values' heads) held in RAM of at least this
    /// size are sent straight from the arena (SEND_ZC, or SEND from huge pages or where the
    /// kernel copies anyway), pinned until the kernel is done; smaller ones are copied into
    /// the reply (docs/io.md has the measurement behind the default) [default: 128K].
    #[arg(long, value_name = "SIZE")]
    pub zero_copy_min: Option<ByteSize>,

    /// On the ring path, each connection's socket timestamps what it receives, so a request's
    /// latency starts when its bytes reached the kernel, including the wait for a sleeping
    /// shard to wake. `off` receives with plain RECV and starts the clock when the shard takes
    /// the bytes: a little less server CPU per request under a light load, where a shard
    /// wakes for every request (docs/benchmarks.md has the A/B) [default: on].
    #[arg(long, value_name = "on|off")]
    pub receive_timestamps: Option<String>,

    /// On the ring path, each connection's receive is armed once and stays armed (multishot,
    /// into buffers the shard provides): no receive is submitted per request. `off` submits
    /// one receive per read. Kernels before 6.0 get one-shot receives either way
    /// [default: on].
    #[arg(long, value_name = "on|off")]
    pub multishot_receive: Option<String>,

    /// On the ring path, a shard sleeps in its own ring, where most wake-ups come from, and
    /// polls glommio's rings from there: a wake-up is one `io_uring_enter`. `off` sleeps in
    /// glommio's ring, woken through an eventfd the shard's ring signals (more server CPU per
    /// request where a shard sleeps between requests: docs/benchmarks.md has the A/B)
    /// [default: on].
    #[arg(long, value_name = "on|off")]
    pub ring_sleep: Option<String>,

    /// What each shard's thread is pinned to: `core`, its own CPU (the design's thread per
    /// core); `node`, any CPU of the serving node, so the scheduler may run a woken shard on
    /// an idle CPU. `node` is for hosts where the shards share their CPUs with other work,
    /// such as the clients of a benchmark: there a few connections get more throughput at
    /// less CPU per request, and busier loads cost more CPU (docs/benchmarks.md has the A/B)
    /// [default: core].
    #[arg(long, value_name = "core|node")]
    pub pin_shards: Option<String>,

    /// Benchmark only: map the preferred regions on the node farthest from the serving node,
    /// inverting memory locality while threads stay put.
    #[arg(long)]
    pub perverse: bool,

    /// Address to serve on (port 0: any free port, logged); repeatable or comma-separated to
    /// serve on several; `none` serves no TCP (needs --unix-socket, as memcached's `-s`). The
    /// first also picks the node for `--numa auto` [default: 127.0.0.1:11211]. With
    /// --tls-cert every address serves TLS, unless a prefix says otherwise: `plain:ADDR` (no
    /// TLS), `tls:ADDR` (TLS, no client certificate asked for), `mtls:ADDR` (TLS, a
    /// certificate --tls-ca signed required of every client).
    #[arg(long, value_name = "ADDR", value_delimiter = ',')]
    pub listen: Vec<String>,

    /// Serve Prometheus metrics over HTTP on this address: `/metrics` (the Prometheus text
    /// format, or OpenMetrics when the scraper asks for it) and `/health` (200 while serving,
    /// 503 while starting or stopping); port 0 picks a free port, logged. Off without it.
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<String>,

    /// Log filter: error, warn, info, debug, trace, or a tracing directive [default: info].
    #[arg(long, value_name = "LEVEL")]
    pub log_level: Option<String>,

    /// Log line format: `text`, or `json` (one object per line with timestamp, level,
    /// message and the event's fields), to stderr or --log-file alike [default: text].
    #[arg(long, value_name = "text|json")]
    pub log_format: Option<String>,

    /// Serving shards: one per CPU of the serving node (every online CPU with --no-numa);
    /// fewer with this [default: all of them].
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,

    /// Partitions of the key space (each a store behind a short lock; any core serves any
    /// partition) [default: 16 per serving CPU, fewer when the fixed-head or the small-object
    /// reservation holds under 8 blocks each; never more than the scarcer holds blocks].
    #[arg(long, value_name = "N")]
    pub partitions: Option<usize>,

    /// Most client connections open at once; more are closed on accept [default: 1024].
    #[arg(long, value_name = "N")]
    pub max_connections: Option<usize>,

    /// Close a connection that neither sends nor accepts bytes for this many seconds (at most
    /// 86400); 0 never [default: 0].
    #[arg(long, value_name = "SECONDS")]
    pub idle_timeout: Option<u64>,

    /// Drop a large value's SET whose body brings less than 64 KiB (or the rest of the body) in
    /// any window of this many seconds (at most 86400): its segment space goes back and the
    /// connection is closed; 0 never [default: 30].
    #[arg(long, value_name = "SECONDS")]
    pub body_timeout: Option<u64>,

    /// Microseconds a shard keeps polling after it runs out of work before it sleeps: a
    /// message from another shard or a new request then needs no wake-up (costs that much CPU
    /// per idle moment; docs/benchmarks.md) [default: 0].
    #[arg(long, value_name = "MICROS")]
    pub spin_before_park: Option<u64>,

    /// Promotion pass: every this many milliseconds each shard exchanges completely occupied
    /// foreign fixed-head blocks holding hot heads with local ones holding cold heads; 0 never
    /// (docs/arena.md) [default: 1000].
    #[arg(long, value_name = "MS")]
    pub promotion_interval: Option<u64>,

    /// Most block exchanges per shard per promotion pass [default: 4].
    #[arg(long, value_name = "BLOCKS")]
    pub promotion_budget: Option<usize>,

    /// A fixed head's access score halves every this many seconds [default: 10].
    #[arg(long, value_name = "SECONDS")]
    pub promotion_half_life: Option<u32>,

    /// Largest value accepted; larger ones get "too large". Values above --ram-head are
    /// streamed to segments, never buffered whole [default: 4095M].
    #[arg(long, value_name = "SIZE")]
    pub max_item_size: Option<ByteSize>,

    /// A store target for values larger than --ram-head, repeatable:
    /// `file:PATH,size=64G[,numa=N|auto]` or `mem:size=8G,numa=0[+1...]`
    /// [default: file:DATA_DIR/segment-0,size=1G].
    #[arg(long = "segment", value_name = "SPEC")]
    pub segments: Vec<SegmentSpec>,

    /// Where the default file segment and the warm-restart snapshot live; locked for the life
    /// of the process, so a second server cannot share it. Created mode 0700; it must be the
    /// run user's own with no group or world write bit (refused otherwise), and no file
    /// Headroom names in it is ever opened through a link [default: $STATE_DIRECTORY when set
    /// (systemd's StateDirectory=), else ./data].
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,

    /// A directory where ADMIN `mount` may create or mount file segments at runtime, besides
    /// --data-dir; repeatable. Only files Headroom created (labelled) are mounted there.
    #[arg(long = "mount-dir", value_name = "DIR")]
    pub mount_dirs: Vec<PathBuf>,

    /// Serve ADMIN (mount, unmount, promote, where) on this unix socket, one command per line;
    /// its file permissions decide who may administer. Without it ADMIN is closed; data
    /// connections never get it.
    #[arg(long, value_name = "PATH")]
    pub admin_socket: Option<PathBuf>,

    /// Require SASL PLAIN authentication (binary protocol) against this file of `user:password`
    /// lines; every command but VERSION and SASL before a successful auth is refused.
    #[arg(long, value_name = "FILE")]
    pub sasl_password_file: Option<PathBuf>,

    /// Also serve on this unix domain socket (memcached's `-s`): all three protocols, SASL and
    /// large values as on TCP. The path is taken exclusively (a live server's socket is
    /// refused) and removed on a clean stop.
    #[arg(long, value_name = "PATH")]
    pub unix_socket: Option<PathBuf>,

    /// The unix socket's file mode, in octal (memcached's `-a`) [default: 0700].
    #[arg(long, value_name = "OCTAL")]
    pub unix_socket_mode: Option<String>,

    /// Serve TLS on --listen with this certificate chain (PEM, leaf first); needs --tls-key.
    /// A certificate outside its validity is refused at start. SIGHUP reloads it.
    #[arg(long, value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,

    /// The TLS private key (PEM) of --tls-cert.
    #[arg(long, value_name = "FILE")]
    pub tls_key: Option<PathBuf>,

    /// Require every TLS client to present a certificate this CA (PEM) signed (mutual TLS).
    #[arg(long, value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,

    /// With --tls-ca, what an address without a TLS prefix asks of clients: `required`, a
    /// certificate the CA signed; `optional`, a client may also connect without one
    /// (memcached's `ssl_verify_mode=1`); `none`, no certificate is asked for (only `mtls:`
    /// addresses ask) [default: required].
    #[arg(long, value_name = "required|optional|none")]
    pub tls_client_cert: Option<String>,

    /// The oldest TLS version served: `1.2` or `1.3` (TLS 1.0 and 1.1 are never served)
    /// [default: 1.2].
    #[arg(long, value_name = "1.2|1.3")]
    pub tls_min_version: Option<String>,

    /// Drop a TLS connection whose handshake is not done within this many seconds (1 to
    /// 86400) [default: 10].
    #[arg(long, value_name = "SECONDS")]
    pub tls_handshake_timeout: Option<u64>,

    /// Let a TLS client that reconnects resume its session (an abbreviated handshake, from
    /// a cache of recent sessions in memory) [default: on].
    #[arg(long, value_name = "on|off")]
    pub tls_session_resumption: Option<String>,

    /// The most of one reply a TLS connection seals ahead of what its socket has taken, 1K
    /// to 16M: a large value is sealed and sent a part of this size at a time, so this bounds
    /// the records a slow client holds in memory [default: 256K].
    #[arg(long, value_name = "SIZE")]
    pub tls_write_buffer: Option<ByteSize>,

    /// Append the log to this file instead of stderr; SIGHUP reopens it (for log rotation).
    #[arg(long, value_name = "FILE")]
    pub log_file: Option<PathBuf>,

    /// How the placement master ranks targets within a locality tier: best_fit,
    /// free_ratio_first or random [default: best_fit].
    #[arg(long, value_name = "POLICY")]
    pub placement_policy: Option<String>,

    /// Started as root, drop to this user (a name or a uid) once the ports, the locked memory,
    /// the segments and the data directory are taken, as memcached's `-u`: the data directory
    /// is handed to the user, and every thread serves as it. `--user root` stays root on
    /// purpose. Without root, only the user it already runs as is accepted.
    #[arg(long, value_name = "USER")]
    pub user: Option<String>,

    /// Run as root without --user (refused otherwise, as memcached refuses root without -u).
    /// No effect when not started as root (so scripts may always pass it).
    #[arg(long, overrides_with = "allow_root")]
    pub allow_root: bool,

    /// When no segment has room for a large value: `none` fails it with "out of memory" and
    /// touches nothing else (for data that must not be lost, such as RL rollouts); `lru` evicts
    /// the least recently used large values of the best candidate target until it fits
    /// [default: none].
    #[arg(long, value_name = "POLICY")]
    pub segment_eviction: Option<String>,

    /// Check each large value's CRC32C, computed when it was stored, as a GET streams it out
    /// of its segment; a value that fails is never sent whole: the connection is closed and
    /// the item dropped. `files` checks values read from file segments (which other processes
    /// and disks can change), `on` memory segments too, `off` none (docs/benchmarks.md
    /// measures the cost) [default: files].
    #[arg(long, value_name = "files|on|off")]
    pub verify_reads: Option<String>,

    /// Write the process id to this file once serving (memcached's `-P`); removed on a clean
    /// stop.
    #[arg(long, value_name = "FILE")]
    pub pid_file: Option<PathBuf>,

    /// Run in the background (memcached's `-d`): the command returns once the server serves,
    /// with its start-up's exit status; the server leaves the terminal's session, and its
    /// standard input and output go to /dev/null (the log still goes to stderr without
    /// --log-file). Not for a service manager, which wants it in the foreground.
    #[arg(long)]
    pub daemon: bool,

    /// The text command `shutdown` (and `shutdown graceful`) stops the server as SIGTERM does
    /// (memcached's `-A`); off, it is refused [default: off].
    #[arg(long, value_name = "on|off")]
    pub shutdown_command: Option<String>,

    /// `flush_all` (text, meta and binary) empties the cache; off, it is refused, as
    /// memcached's `-F` does [default: on].
    #[arg(long, value_name = "on|off")]
    pub flush_all_command: Option<String>,

    /// `stats cachedump`, `stats detail dump` and `lru_crawler metadump`/`mgdump` list keys;
    /// off, they are refused, as memcached's `-X` does [default: on].
    #[arg(long, value_name = "on|off")]
    pub dump_commands: Option<String>,

    /// `watch` turns a connection into a log stream; off, it is refused, as memcached's `-W`
    /// does [default: on].
    #[arg(long, value_name = "on|off")]
    pub watch_command: Option<String>,

    /// The LRU crawler (`lru_crawler crawl`, `metadump`, and expired items reclaimed in the
    /// background) starts enabled; `lru_crawler enable|disable` switches it at runtime
    /// [default: on].
    #[arg(long, value_name = "on|off")]
    pub lru_crawler: Option<String>,

    /// When RAM is full, a store evicts the coldest items; `off` refuses the store with
    /// "SERVER_ERROR out of memory storing object" instead (memcached's `-M`) [default: on].
    #[arg(long, value_name = "on|off")]
    pub evictions: Option<String>,

    /// Read the rest of the command line as memcached 1.6.45's flags (`-m 64 -p 11211 ...`),
    /// with Headroom's long flags allowed beside them. A line with memcached's short flags is
    /// read so without it; docs/operations.md, "Coming from memcached", has the table.
    #[arg(long)]
    pub memcached_args: bool,

    /// Read memcached's flags from a file in Debian's /etc/memcached.conf format: one flag a
    /// line, `#` comments, `logfile FILE` for --log-file. Flags on the command line are read
    /// after the file's.
    #[arg(long, value_name = "FILE")]
    pub memcached_conf: Option<PathBuf>,

    /// Set when the line was memcached's (`config::memcached`): --memory is rounded up to
    /// whole blocks and --threads capped at the serving node's CPUs, each with a note, as
    /// memcached takes any `-m` and `-t`.
    #[arg(skip)]
    pub from_memcached: bool,

    /// Warm restart: a graceful stop writes the items held in RAM and the large values' index
    /// to the data directory, and the next start restores them. `off` writes and restores
    /// nothing (and removes a snapshot it finds) [default: on].
    #[arg(long, value_name = "on|off")]
    pub warm_restart: Option<String>,
}

/// Which large values a GET checks against their CRC32C as they stream out (`--verify-reads`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VerifyReads {
    /// None.
    Off,
    /// Values read from file segments: a disk, or another process with the file open, can
    /// change their bytes; a memory segment is this process's own memory.
    Files,
    /// Values read from any segment, memory segments too.
    On,
}

impl VerifyReads {
    /// As `--verify-reads` spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            VerifyReads::Off => "off",
            VerifyReads::Files => "files",
            VerifyReads::On => "on",
        }
    }
}

/// The `--config` file: the same settings, spelled as the flags without `--`.
#[derive(Deserialize, Debug, Default, Clone)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct FileConfig {
    pub numa: Option<NumaArg>,
    #[serde(default)]
    pub no_numa: bool,
    pub memory: Option<ByteSize>,
    pub sub_memory: Option<ByteSize>,
    pub small_memory: Option<ByteSize>,
    pub small_sub_memory: Option<ByteSize>,
    pub block: Option<ByteSize>,
    pub ram_head: Option<ByteSize>,
    pub small_min_alloc: Option<u64>,
    pub io_chunk: Option<ByteSize>,
    pub io_pool: Option<ByteSize>,
    pub io_ring: Option<String>,
    pub zero_copy_min: Option<ByteSize>,
    pub receive_timestamps: Option<String>,
    pub multishot_receive: Option<String>,
    pub ring_sleep: Option<String>,
    pub pin_shards: Option<String>,
    #[serde(default)]
    pub perverse: bool,
    pub listen: Option<String>,
    pub metrics_listen: Option<String>,
    pub log_level: Option<String>,
    pub log_format: Option<String>,
    pub threads: Option<usize>,
    pub partitions: Option<usize>,
    pub max_connections: Option<usize>,
    pub idle_timeout: Option<u64>,
    pub body_timeout: Option<u64>,
    pub spin_before_park: Option<u64>,
    pub promotion_interval: Option<u64>,
    pub promotion_budget: Option<usize>,
    pub promotion_half_life: Option<u32>,
    pub max_item_size: Option<ByteSize>,
    #[serde(default, rename = "segment")]
    pub segments: Vec<SegmentSpec>,
    pub data_dir: Option<PathBuf>,
    #[serde(default, rename = "mount-dir")]
    pub mount_dirs: Vec<PathBuf>,
    pub admin_socket: Option<PathBuf>,
    pub sasl_password_file: Option<PathBuf>,
    pub unix_socket: Option<PathBuf>,
    pub unix_socket_mode: Option<String>,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    pub tls_ca: Option<PathBuf>,
    pub tls_handshake_timeout: Option<u64>,
    pub tls_client_cert: Option<String>,
    pub tls_min_version: Option<String>,
    pub tls_session_resumption: Option<String>,
    pub tls_write_buffer: Option<ByteSize>,
    pub log_file: Option<PathBuf>,
    pub placement_policy: Option<String>,
    pub segment_eviction: Option<String>,
    pub user: Option<String>,
    #[serde(default)]
    pub allow_root: bool,
    pub verify_reads: Option<String>,
    pub warm_restart: Option<String>,
    pub pid_file: Option<PathBuf>,
    pub shutdown_command: Option<String>,
    pub flush_all_command: Option<String>,
    pub dump_commands: Option<String>,
    pub watch_command: Option<String>,
    pub lru_crawler: Option<String>,
    pub evictions: Option<String>,
}

impl FileConfig {
    pub fn read(path: &Path) -> Result<FileConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|err| ConfigError::File {
            path: path.to_path_buf(),
            reason: err.to_string(),
        })?;
        toml::from_str(&text).map_err(|err| ConfigError::File {
            path: path.to_path_buf(),
            reason: err.message().to_string(),
        })
    }
}

/// A configuration rule that was broken. Each message is one sentence that names the flag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigError {
    File {
        path: PathBuf,
        reason: String,
    },
    NumaAndNoNuma,
    NumaNodeOffline {
        node: NodeId,
        online: Vec<NodeId>,
    },
    BlockNotPowerOfTwo {
        block: u64,
    },
    BlockNotHugePageMultiple {
        block: u64,
        huge_page: u64,
    },
    BlockTooLarge {
        block: u64,
    },
    RamHeadNotPowerOfTwo {
        ram_head: u64,
    },
    RamHeadTooSmall {
        ram_head: u64,
    },
    RamHeadLargerThanBlock {
        ram_head: u64,
        block: u64,
    },
    SmallMinAlloc {
        value: u64,
    },
    IoChunkNotPowerOfTwo {
        io_chunk: u64,
    },
    IoChunkTooSmall {
        io_chunk: u64,
    },
    IoChunkLargerThanBlock {
        io_chunk: u64,
        block: u64,
    },
    IoPoolNotBlockMultiple {
        io_pool: u64,
        block: u64,
    },
    IoPoolBelowTwoChunks {
        io_pool: u64,
        io_chunk: u64,
    },
    /// `--verify-reads` got something but `files`, `on` or `off`.
    VerifyReads(String),
    /// A switch that takes `on` or `off` got something else.
    OnOff {
        flag: &'static str,
        text: String,
    },
    PromotionHalfLife,
    BudgetBelowBlock {
        flag: &'static str,
        bytes: u64,
        block: u64,
    },
    BudgetNotBlockMultiple {
        flag: &'static str,
        bytes: u64,
        block: u64,
    },
    BudgetNotHugePageMultiple {
        flag: &'static str,
        bytes: u64,
        huge_page: u64,
    },
    TooManyBlocks {
        blocks: u64,
    },
    SubMemoryNeedsExplicitNuma,
    SmallSubMemoryNeedsSmallMemory,
    SmallSubMemoryNeedsExplicitNuma,
    PerverseWithNoNuma,
    PerverseNeedsTwoNodes {
        online: usize,
    },
    Listen {
        text: String,
        reason: String,
    },
    MetricsListen {
        text: String,
        reason: String,
    },
    ThreadsZero,
    ThreadsAboveCpus {
        threads: usize,
        cpus: usize,
    },
    MaxConnectionsZero,
    UnixSocketMode {
        text: String,
    },
    /// A TLS flag without the ones it needs (`--tls-key` without `--tls-cert`, say).
    TlsIncomplete {
        given: &'static str,
        needs: &'static str,
    },
    TimeoutTooLong {
        flag: &'static str,
        seconds: u64,
    },
    MaxItemSize {
        bytes: u64,
    },
    SegmentSize {
        segment: String,
    },
    SegmentNode {
        segment: String,
        node: NodeId,
    },
    PlacementPolicy {
        text: String,
    },
    Partitions {
        count: usize,
    },
    SegmentEviction {
        text: String,
    },
    PinShards {
        text: String,
    },
    LogFormat {
        text: String,
    },
    /// A flag that takes one of a few words got another.
    Choice {
        flag: &'static str,
        text: String,
        choices: &'static str,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use ConfigError::*;
        let b = |bytes: &u64| ByteSize(*bytes);
        match self {
            File { path, reason } => write!(f, "--config {}: {reason}", path.display()),
            NumaAndNoNuma => write!(f, "--numa and --no-numa cannot be used together"),
            NumaNodeOffline { node, online } => {
                write!(f, "--numa {node} is not an online NUMA node (online: {online:?})")
            }
            BlockNotPowerOfTwo { block } => {
                write!(f, "--block {} must be a power of two", b(block))
            }
            BlockNotHugePageMultiple { block, huge_page } => write!(
                f,
                "--block {} must be a power-of-two multiple of the {} huge page size",
                b(block),
                b(huge_page)
            ),
            BlockTooLarge { block } => write!(
                f,
                "--block {} must be at most {} (the largest buffer io_uring registers)",
                b(block),
                b(&MAX_BLOCK_BYTES)
            ),
            RamHeadNotPowerOfTwo { ram_head } => {
                write!(f, "--ram-head {} must be a power of two", b(ram_head))
            }
            RamHeadTooSmall { ram_head } => write!(
                f,
                "--ram-head {} must be at least {} so every fixed head stays O_DIRECT-aligned",
                b(ram_head),
                b(&DEVICE_BLOCK_BYTES)
            ),
            RamHeadLargerThanBlock { ram_head, block } => write!(
                f,
                "--ram-head {} must be no larger than --block {}",
                b(ram_head),
                b(block)
            ),
            SmallMinAlloc { value } => {
                write!(f, "--small-min-alloc {value} must be 8 or 16 (bytes)")
            }
            IoChunkNotPowerOfTwo { io_chunk } => {
                write!(f, "--io-chunk {} must be a power of two", b(io_chunk))
            }
            IoChunkTooSmall { io_chunk } => write!(
                f,
                "--io-chunk {} must be at least {} (the device block)",
                b(io_chunk),
                b(&DEVICE_BLOCK_BYTES)
            ),
            IoChunkLargerThanBlock { io_chunk, block } => write!(
                f,
                "--io-chunk {} must be no larger than --block {}",
                b(io_chunk),
                b(block)
            ),
            IoPoolNotBlockMultiple { io_pool, block } => write!(
                f,
                "--io-pool {} must be a whole multiple of --block {}",
                b(io_pool),
                b(block)
            ),
            IoPoolBelowTwoChunks { io_pool, io_chunk } => write!(
                f,
                "--io-pool {} must hold at least two --io-chunk {} (one filling while one is sent)",
                b(io_pool),
                b(io_chunk)
            ),
            OnOff { flag, text } => write!(f, "{flag} '{text}' must be on or off"),
            VerifyReads(text) => write!(f, "--verify-reads '{text}' must be files, on or off"),
            PromotionHalfLife => write!(f, "--promotion-half-life must be at least 1 second"),
            BudgetBelowBlock { flag, bytes, block } => write!(
                f,
                "{flag} {} must be at least one --block ({})",
                b(bytes),
                b(block)
            ),
            BudgetNotBlockMultiple { flag, bytes, block } => write!(
                f,
                "{flag} {} must be a whole multiple of --block {} (sizes are never rounded)",
                b(bytes),
                b(block)
            ),
            BudgetNotHugePageMultiple { flag, bytes, huge_page } => write!(
                f,
                "{flag} {} must be a whole multiple of the {} huge page size (sizes are never rounded)",
                b(bytes),
                b(huge_page)
            ),
            TooManyBlocks { blocks } => write!(
                f,
                "--memory and the other budgets add up to {} blocks, more than 2^32; use a larger --block",
                if *blocks == u64::MAX { "over 2^64".to_string() } else { blocks.to_string() }
            ),
            SubMemoryNeedsExplicitNuma => write!(
                f,
                "--sub-memory needs an explicit --numa NODE (automatic selection may not commit memory on every node)"
            ),
            SmallSubMemoryNeedsSmallMemory => {
                write!(f, "--small-sub-memory needs --small-memory")
            }
            SmallSubMemoryNeedsExplicitNuma => write!(
                f,
                "--small-sub-memory needs an explicit --numa NODE (automatic selection may not commit memory on every node)"
            ),
            PerverseWithNoNuma => write!(f, "--perverse cannot be used with --no-numa"),
            PerverseNeedsTwoNodes { online } => write!(
                f,
                "--perverse needs at least two online NUMA nodes, and this machine has {online}"
            ),
            Listen { text, reason } => write!(f, "--listen {text}: {reason}"),
            MetricsListen { text, reason } => write!(f, "--metrics-listen {text}: {reason}"),
            ThreadsZero => write!(f, "--threads must be at least 1"),
            ThreadsAboveCpus { threads, cpus } => write!(
                f,
                "--threads {threads} exceeds the {cpus} CPUs of the serving node (one shard per CPU)"
            ),
            MaxConnectionsZero => write!(f, "--max-connections must be at least 1"),
            UnixSocketMode { text } => write!(
                f,
                "--unix-socket-mode {text}: must be an octal file mode from 0 to 0777 (e.g. 0700)"
            ),
            TlsIncomplete { given, needs } => write!(f, "{given} needs {needs}"),
            TimeoutTooLong { flag, seconds } => write!(
                f,
                "{flag} {seconds} must be at most {TIMEOUT_MAX_SECONDS} seconds (one day); 0 \
                 means never"
            ),
            MaxItemSize { bytes } => write!(
                f,
                "--max-item-size {} must be from 1 KiB up to (not including) 4 GiB",
                b(bytes)
            ),
            SegmentSize { segment } => write!(
                f,
                "--segment {segment}: the size must be a nonzero whole multiple of 4 KiB (and, for memory, of 4 KiB per node) of at most 1 EiB"
            ),
            SegmentNode { segment, node } => {
                write!(f, "--segment {segment}: node {node} is not online")
            }
            SegmentEviction { text } => {
                write!(f, "--segment-eviction {text}: must be none or lru")
            }
            PinShards { text } => write!(f, "--pin-shards {text}: must be core or node"),
            PlacementPolicy { text } => write!(
                f,
                "--placement-policy {text}: must be best_fit, free_ratio_first or random"
            ),
            LogFormat { text } => write!(f, "--log-format '{text}' must be text or json"),
            Choice {
                flag,
                text,
                choices,
            } => write!(f, "{flag} '{text}' must be {choices}"),
            Partitions { count } => write!(
                f,
                "--partitions {count} must be from 1 to {}",
                PARTITIONS_MAX
            ),
        }
    }
}

impl std::error::Error for ConfigError {}

/// Fully resolved settings, every rule checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub arena: ArenaConfig,
    /// The TCP addresses served and their TLS, in the order given; empty only beside a unix
    /// socket.
    pub listen: Vec<ListenAddress>,
    /// The metrics endpoint's address (`None`: off).
    pub metrics_listen: Option<SocketAddr>,
    /// The CPUs that get a shard each, ascending.
    pub cpus: Vec<usize>,
    /// Partitions of the key space; `None`: chosen from the CPUs and the memory at start.
    pub partitions: Option<usize>,
    pub max_connections: usize,
    /// 0: never.
    pub idle_timeout_seconds: u64,
    /// Seconds a large SET's body may bring no byte before it is dropped; 0: never.
    pub body_timeout_seconds: u64,
    /// Microseconds a shard polls before sleeping; 0: it sleeps at once.
    pub spin_before_park_micros: u64,
    /// Milliseconds between promotion passes; 0: none.
    pub promotion_interval_ms: u64,
    pub promotion_budget_blocks: usize,
    pub promotion_half_life_seconds: u32,
    pub max_item_bytes: u64,
    /// Store targets for large values (never empty: a default file segment otherwise).
    pub segments: Vec<SegmentSpec>,
    /// The data directory: the default segment and the warm-restart snapshot live here.
    pub data_dir: PathBuf,
    /// Where ADMIN may mount files at runtime: the data directory, then every `--mount-dir`.
    pub mount_dirs: Vec<PathBuf>,
    /// The admin endpoint (ADMIN is closed without it).
    pub admin_socket: Option<PathBuf>,
    /// SASL PLAIN credentials, when authentication is required.
    pub sasl_password_file: Option<PathBuf>,
    /// `--unix-socket`, and its file mode.
    pub unix_socket: Option<PathBuf>,
    pub unix_socket_mode: u32,
    /// TLS on `--listen`, when configured.
    pub tls: Option<TlsFiles>,
    pub tls_handshake_timeout_seconds: u64,
    /// The log file (stderr without it).
    pub log_file: Option<PathBuf>,
    pub placement_policy: Policy,
    /// Evict least recently used large values when a segment is full (`--segment-eviction lru`).
    pub segment_eviction_lru: bool,
    /// `--user`: who to drop to when started as root.
    pub user: Option<String>,
    /// `--allow-root`: started as root without `--user`, stay root.
    pub allow_root: bool,
    /// Which large values' CRC32C is checked as they stream out of their segment.
    pub verify_reads: VerifyReads,
    /// `--warm-restart`.
    pub warm_restart: bool,
    /// `--pid-file`.
    pub pid_file: Option<PathBuf>,
    /// `--daemon`.
    pub daemon: bool,
    /// Which commands are served: `shutdown`, `flush_all`, the key dumps, `watch`.
    pub commands: CommandSwitches,
    /// The LRU crawler's state at start.
    pub lru_crawler: bool,
    /// RAM evicts to make room (`--evictions on`), or refuses the store.
    pub evictions: bool,
    /// Each shard's streaming pool.
    pub io_pool_bytes: u64,
    /// Try the io_uring data path (`--io-ring on`).
    pub io_ring: bool,
    /// Smallest GET value sent zero-copy on the ring path.
    pub zero_copy_min_bytes: u64,
    /// Ring path: sockets timestamp what they receive (`--receive-timestamps on`).
    pub receive_timestamps: bool,
    /// Ring path: receives are multishot (`--multishot-receive on`).
    pub multishot_receive: bool,
    /// Ring path: a shard sleeps in its own ring (`--ring-sleep on`).
    pub ring_sleep: bool,
    /// Each shard's thread may run on any CPU of the serving node (`--pin-shards node`), not
    /// only on its own.
    pub pin_shards_to_node: bool,
    pub dry_run: bool,
    pub log_level: String,
    pub log_format: LogFormat,
    /// Why the serving node is what it is (logged at start-up).
    pub numa_reason: String,
    /// What was adjusted from the command line as given (logged at start-up).
    pub notes: Vec<String>,
}

/// Commands an operator can switch off (or, for `shutdown`, on), as memcached's `-A`, `-F`,
/// `-X` and `-W` do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommandSwitches {
    pub shutdown: bool,
    pub flush_all: bool,
    pub dump: bool,
    pub watch: bool,
}

impl Settings {
    /// `--pin-shards` as the operator writes it: `core` or `node`.
    pub fn pin_shards(&self) -> &'static str {
        if self.pin_shards_to_node {
            "node"
        } else {
            "core"
        }
    }
}

/// Merges the file (if any) under the flags and checks every rule against `topology`.
pub fn resolve(cli: &Cli, topology: &Topology) -> Result<Settings, ConfigError> {
    let file = match &cli.config {
        Some(path) => FileConfig::read(path)?,
        None => FileConfig::default(),
    };
    resolve_with_file(cli, &file, topology)
}

fn parse_listen(text: &str) -> Result<SocketAddr, ConfigError> {
    parse_address(text).map_err(|reason| ConfigError::Listen {
        text: text.to_string(),
        reason,
    })
}

/// `--listen`: the command line's addresses, else the file's (comma-separated), else the
/// default; `none` alone serves no TCP, which needs a unix socket. Each address's TLS is its
/// prefix's, else `tls`'s (every address with `--tls-cert`).
fn resolve_listen(
    cli: &Cli,
    file: &FileConfig,
    tls: Option<&TlsFiles>,
) -> Result<Vec<ListenAddress>, ConfigError> {
    let texts: Vec<String> = if !cli.listen.is_empty() {
        cli.listen.clone()
    } else if let Some(text) = &file.listen {
        text.split(',').map(|t| t.trim().to_string()).collect()
    } else {
        vec![DEFAULT_LISTEN.to_string()]
    };
    if texts.iter().any(|t| t == "none") {
        let unix_socket = cli.unix_socket.is_some() || file.unix_socket.is_some();
        if texts.len() > 1 || !unix_socket {
            return Err(ConfigError::Listen {
                text: texts.join(","),
                reason: "`none` (no TCP) stands alone and needs --unix-socket".to_string(),
            });
        }
        return Ok(Vec::new());
    }
    let unprefixed = match tls {
        None => ListenerTls::Off,
        Some(tls) => ListenerTls::On(tls.client_certs),
    };
    let mut listen: Vec<ListenAddress> = Vec::with_capacity(texts.len());
    for text in &texts {
        let (prefix, address) = split_tls_prefix(text);
        let tls_of = match prefix {
            None => unprefixed,
            Some("plain") => ListenerTls::Off,
            Some(prefix) if tls.is_none() => {
                return Err(ConfigError::Listen {
                    text: text.clone(),
                    reason: format!("`{prefix}:` serves TLS, which needs --tls-cert and --tls-key"),
                })
            }
            Some("tls") => ListenerTls::On(ClientCerts::NotAsked),
            Some(_) => ListenerTls::On(ClientCerts::Required),
        };
        let addr = parse_listen(address)?;
        match listen.iter().find(|l| l.addr == addr) {
            Some(same) if same.tls == tls_of => continue,
            Some(same) => {
                return Err(ConfigError::Listen {
                    text: text.clone(),
                    reason: format!(
                        "{addr} is given twice, as {} and as {}; one address has one TLS",
                        same.tls.name(),
                        tls_of.name()
                    ),
                })
            }
            None => listen.push(ListenAddress { addr, tls: tls_of }),
        }
    }
    Ok(listen)
}

/// `--listen`'s TLS prefix (`plain:`, `tls:`, `mtls:`) and the address after it.
fn split_tls_prefix(text: &str) -> (Option<&str>, &str) {
    for prefix in ["plain", "tls", "mtls"] {
        if let Some(address) = text
            .strip_prefix(prefix)
            .and_then(|rest| rest.strip_prefix(':'))
        {
            return (Some(prefix), address);
        }
    }
    (None, text)
}

/// A `HOST:PORT` address, or why it is not one.
fn parse_address(text: &str) -> Result<SocketAddr, String> {
    let mut addrs = text
        .to_socket_addrs()
        .map_err(|err| format!("not a HOST:PORT address ({err})"))?;
    addrs
        .next()
        .ok_or_else(|| "resolves to no address".to_string())
}

/// The node `--numa auto` picks: the NIC holding the listen address, else the lowest online
/// node (node 0 on every ordinary machine).
fn automatic_node(listen: IpAddr, topology: &Topology) -> (NodeId, String) {
    let fallback = topology.node_ids()[0];
    match topology.node_of_listen_addr(listen) {
        Some((nic, node)) => (node, format!("--numa auto: {} holds {listen} and is on node {node}", nic.name)),
        None => (
            fallback,
            format!("--numa auto: no interface with a known NUMA node holds {listen}; using node {fallback}"),
        ),
    }
}

/// A switch's value (command line first, then the file); unset is `on`.
fn on_off(flag: &'static str, value: Option<&String>) -> Result<bool, ConfigError> {
    switch(flag, value, true)
}

/// A switch's value; unset is `default`.
fn switch(flag: &'static str, value: Option<&String>, default: bool) -> Result<bool, ConfigError> {
    match value.map(String::as_str) {
        None => Ok(default),
        Some("on") => Ok(true),
        Some("off") => Ok(false),
        Some(other) => Err(ConfigError::OnOff {
            flag,
            text: other.to_string(),
        }),
    }
}

fn check_budget(flag: &'static str, bytes: u64, block: u64, huge: u64) -> Result<(), ConfigError> {
    if bytes < block {
        return Err(ConfigError::BudgetBelowBlock { flag, bytes, block });
    }
    if bytes % block != 0 {
        return Err(ConfigError::BudgetNotBlockMultiple { flag, bytes, block });
    }
    // Implied by the two rules above and the --block rule; kept as its own check because the
    // bound must never be rounded whatever the other rules become.
    if bytes % huge != 0 {
        return Err(ConfigError::BudgetNotHugePageMultiple {
            flag,
            bytes,
            huge_page: huge,
        });
    }
    Ok(())
}

/// [`resolve`] with the file already read (tests use this directly).
/// `--tls-cert`, `--tls-key` and `--tls-ca`: all or none of cert and key; a CA only with them.
fn resolve_tls(cli: &Cli, file: &FileConfig) -> Result<Option<TlsFiles>, ConfigError> {
    let cert = cli.tls_cert.clone().or_else(|| file.tls_cert.clone());
    let key = cli.tls_key.clone().or_else(|| file.tls_key.clone());
    let ca = cli.tls_ca.clone().or_else(|| file.tls_ca.clone());
    let client_certs = match (
        cli.tls_client_cert
            .as_deref()
            .or(file.tls_client_cert.as_deref()),
        &ca,
    ) {
        (None, None) => ClientCerts::NotAsked,
        (None | Some("required"), Some(_)) => ClientCerts::Required,
        (Some("optional"), Some(_)) => ClientCerts::Optional,
        (Some("none"), Some(_)) => ClientCerts::NotAsked,
        (Some("required" | "optional" | "none"), None) => {
            return Err(ConfigError::TlsIncomplete {
                given: "--tls-client-cert",
                needs: "--tls-ca (the CA a presented client certificate is checked against)",
            })
        }
        (Some(other), _) => {
            return Err(ConfigError::Choice {
                flag: "--tls-client-cert",
                text: other.to_string(),
                choices: "required, optional or none",
            })
        }
    };
    let tls13_only = match cli
        .tls_min_version
        .as_deref()
        .or(file.tls_min_version.as_deref())
    {
        None | Some("1.2") => false,
        Some("1.3") => true,
        Some(other) => {
            return Err(ConfigError::Choice {
                flag: "--tls-min-version",
                text: other.to_string(),
                choices: "1.2 or 1.3 (TLS 1.0 and 1.1 are never served)",
            })
        }
    };
    let session_resumption = switch(
        "--tls-session-resumption",
        cli.tls_session_resumption
            .as_ref()
            .or(file.tls_session_resumption.as_ref()),
        DEFAULT_TLS_SESSION_RESUMPTION,
    )?;
    let write_buffer_bytes = cli
        .tls_write_buffer
        .or(file.tls_write_buffer)
        .unwrap_or(DEFAULT_TLS_WRITE_BUFFER)
        .0;
    if !(TLS_WRITE_BUFFER_MIN_BYTES..=TLS_WRITE_BUFFER_MAX_BYTES).contains(&write_buffer_bytes) {
        return Err(ConfigError::TlsIncomplete {
            given: "--tls-write-buffer",
            needs: "a size from 1K to 16M",
        });
    }
    match (cert, key) {
        (Some(cert), Some(key)) => Ok(Some(TlsFiles {
            cert,
            key,
            ca,
            client_certs,
            tls13_only,
            session_resumption,
            write_buffer_bytes,
        })),
        (Some(_), None) => Err(ConfigError::TlsIncomplete {
            given: "--tls-cert",
            needs: "--tls-key (the certificate's private key)",
        }),
        (None, Some(_)) => Err(ConfigError::TlsIncomplete {
            given: "--tls-key",
            needs: "--tls-cert (the certificate chain it belongs to)",
        }),
        (None, None) if ca.is_some() => Err(ConfigError::TlsIncomplete {
            given: "--tls-ca",
            needs: "--tls-cert and --tls-key (client certificates are asked for over TLS)",
        }),
        (None, None) => Ok(None),
    }
}

pub fn resolve_with_file(
    cli: &Cli,
    file: &FileConfig,
    topology: &Topology,
) -> Result<Settings, ConfigError> {
    let no_numa = cli.no_numa || (file.no_numa && cli.numa.is_none());
    let numa = cli.numa.or(if cli.no_numa { None } else { file.numa });
    if no_numa && numa.is_some() {
        return Err(ConfigError::NumaAndNoNuma);
    }
    let tls = resolve_tls(cli, file)?;
    let listen = resolve_listen(cli, file, tls.as_ref())?;
    let metrics_listen = match cli
        .metrics_listen
        .clone()
        .or_else(|| file.metrics_listen.clone())
    {
        None => None,
        Some(text) => Some(
            parse_address(&text).map_err(|reason| ConfigError::MetricsListen { text, reason })?,
        ),
    };
    let huge = topology.huge_page_bytes();

    let block = cli.block.or(file.block).unwrap_or(default_block()).0;
    if !block.is_power_of_two() {
        return Err(ConfigError::BlockNotPowerOfTwo { block });
    }
    if block < huge {
        return Err(ConfigError::BlockNotHugePageMultiple {
            block,
            huge_page: huge,
        });
    }
    if block > MAX_BLOCK_BYTES {
        return Err(ConfigError::BlockTooLarge { block });
    }
    let ram_head = cli.ram_head.or(file.ram_head).unwrap_or(DEFAULT_RAM_HEAD).0;
    if !ram_head.is_power_of_two() {
        return Err(ConfigError::RamHeadNotPowerOfTwo { ram_head });
    }
    if ram_head < DEVICE_BLOCK_BYTES {
        return Err(ConfigError::RamHeadTooSmall { ram_head });
    }
    if ram_head > block {
        return Err(ConfigError::RamHeadLargerThanBlock { ram_head, block });
    }
    let small_min_alloc = cli
        .small_min_alloc
        .or(file.small_min_alloc)
        .unwrap_or(DEFAULT_SMALL_MIN_ALLOC);
    if small_min_alloc != 8 && small_min_alloc != 16 {
        return Err(ConfigError::SmallMinAlloc {
            value: small_min_alloc,
        });
    }
    let io_chunk = cli.io_chunk.or(file.io_chunk).unwrap_or(DEFAULT_IO_CHUNK).0;
    if !io_chunk.is_power_of_two() {
        return Err(ConfigError::IoChunkNotPowerOfTwo { io_chunk });
    }
    if io_chunk < DEVICE_BLOCK_BYTES {
        return Err(ConfigError::IoChunkTooSmall { io_chunk });
    }
    if io_chunk > block {
        return Err(ConfigError::IoChunkLargerThanBlock { io_chunk, block });
    }
    let promotion_half_life = cli
        .promotion_half_life
        .or(file.promotion_half_life)
        .unwrap_or(10);
    if promotion_half_life == 0 {
        return Err(ConfigError::PromotionHalfLife);
    }
    let io_pool = match cli.io_pool.or(file.io_pool) {
        Some(ByteSize(io_pool)) => io_pool,
        None => (DEFAULT_IO_POOL_CHUNKS * io_chunk).next_multiple_of(block),
    };
    if io_pool % block != 0 {
        return Err(ConfigError::IoPoolNotBlockMultiple { io_pool, block });
    }
    if io_pool < 2 * io_chunk {
        return Err(ConfigError::IoPoolBelowTwoChunks { io_pool, io_chunk });
    }
    let io_ring = on_off("--io-ring", cli.io_ring.as_ref().or(file.io_ring.as_ref()))?;
    let warm_restart = on_off(
        "--warm-restart",
        cli.warm_restart.as_ref().or(file.warm_restart.as_ref()),
    )?;
    let verify_reads = match cli
        .verify_reads
        .as_ref()
        .or(file.verify_reads.as_ref())
        .map(String::as_str)
    {
        None | Some("files") => VerifyReads::Files,
        Some("on") => VerifyReads::On,
        Some("off") => VerifyReads::Off,
        Some(other) => return Err(ConfigError::VerifyReads(other.to_string())),
    };
    let receive_timestamps = on_off(
        "--receive-timestamps",
        cli.receive_timestamps
            .as_ref()
            .or(file.receive_timestamps.as_ref()),
    )?;
    let multishot_receive = on_off(
        "--multishot-receive",
        cli.multishot_receive
            .as_ref()
            .or(file.multishot_receive.as_ref()),
    )?;
    let ring_sleep = on_off(
        "--ring-sleep",
        cli.ring_sleep.as_ref().or(file.ring_sleep.as_ref()),
    )?;
    let pin_shards_to_node = match cli.pin_shards.as_ref().or(file.pin_shards.as_ref()) {
        None => false,
        Some(text) if text == "core" => false,
        Some(text) if text == "node" => true,
        Some(text) => return Err(ConfigError::PinShards { text: text.clone() }),
    };

    let mut notes = Vec::new();
    let mut memory = cli.memory.or(file.memory).unwrap_or(DEFAULT_MEMORY).0;
    if cli.from_memcached && memory % block != 0 {
        let rounded = memory.next_multiple_of(block);
        notes.push(format!(
            "memcached's -m: {} rounded up to {} (whole --block units of {})",
            ByteSize(memory),
            ByteSize(rounded),
            ByteSize(block)
        ));
        memory = rounded;
    }
    check_budget("--memory", memory, block, huge)?;
    let sub_memory = cli.sub_memory.or(file.sub_memory).map_or(0, |s| s.0);
    if sub_memory > 0 {
        check_budget("--sub-memory", sub_memory, block, huge)?;
    }
    let small_memory = cli.small_memory.or(file.small_memory).map(|s| s.0);
    if let Some(bytes) = small_memory {
        check_budget("--small-memory", bytes, block, huge)?;
    }
    let small_sub_memory = cli
        .small_sub_memory
        .or(file.small_sub_memory)
        .map_or(0, |s| s.0);
    if small_sub_memory > 0 {
        check_budget("--small-sub-memory", small_sub_memory, block, huge)?;
    }

    let explicit = matches!(numa, Some(NumaArg::Node(_)));
    if sub_memory > 0 && !explicit {
        return Err(ConfigError::SubMemoryNeedsExplicitNuma);
    }
    if small_sub_memory > 0 && small_memory.is_none() {
        return Err(ConfigError::SmallSubMemoryNeedsSmallMemory);
    }
    if small_sub_memory > 0 && !explicit {
        return Err(ConfigError::SmallSubMemoryNeedsExplicitNuma);
    }
    let perverse = cli.perverse || file.perverse;
    if perverse && no_numa {
        return Err(ConfigError::PerverseWithNoNuma);
    }
    if perverse && topology.online_count() < 2 {
        return Err(ConfigError::PerverseNeedsTwoNodes {
            online: topology.online_count(),
        });
    }

    let (mode, numa_reason) = if no_numa {
        (
            NumaMode::Unbound,
            "--no-numa: memory and threads are not bound".to_string(),
        )
    } else {
        match numa {
            Some(NumaArg::Node(node)) => {
                if !topology.is_online(node) {
                    return Err(ConfigError::NumaNodeOffline {
                        node,
                        online: topology.node_ids(),
                    });
                }
                (NumaMode::Explicit(node), format!("--numa {node}"))
            }
            Some(NumaArg::Auto) | None => {
                let ip = listen
                    .first()
                    .map_or(IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), |l| l.addr.ip());
                let (node, reason) = automatic_node(ip, topology);
                (NumaMode::Automatic(node), reason)
            }
        }
    };
    let node_cpus = match mode.serving_node() {
        Some(node) => topology
            .node(node)
            .map(|n| n.cpus.clone())
            .unwrap_or_default(),
        None => topology.all_cpus(),
    };
    let mut threads = cli.threads.or(file.threads).unwrap_or(node_cpus.len());
    if cli.from_memcached && threads > node_cpus.len() {
        notes.push(format!(
            "memcached's -t {threads}: {} shards, one per CPU of the serving node (a shard is pinned to its CPU; more would share them)",
            node_cpus.len()
        ));
        threads = node_cpus.len();
    }
    if threads == 0 {
        return Err(ConfigError::ThreadsZero);
    }
    if threads > node_cpus.len() {
        return Err(ConfigError::ThreadsAboveCpus {
            threads,
            cpus: node_cpus.len(),
        });
    }
    let partitions = cli.partitions.or(file.partitions);
    if let Some(count) = partitions {
        if !(1..=PARTITIONS_MAX).contains(&count) {
            return Err(ConfigError::Partitions { count });
        }
    }
    let max_connections = cli
        .max_connections
        .or(file.max_connections)
        .unwrap_or(DEFAULT_MAX_CONNECTIONS);
    if max_connections == 0 {
        return Err(ConfigError::MaxConnectionsZero);
    }
    let idle_timeout_seconds = cli.idle_timeout.or(file.idle_timeout).unwrap_or(0);
    let body_timeout_seconds = cli
        .body_timeout
        .or(file.body_timeout)
        .unwrap_or(DEFAULT_BODY_TIMEOUT_SECONDS);
    let tls_handshake_timeout_seconds = cli
        .tls_handshake_timeout
        .or(file.tls_handshake_timeout)
        .unwrap_or(DEFAULT_TLS_HANDSHAKE_TIMEOUT_SECONDS);
    if tls_handshake_timeout_seconds == 0 {
        return Err(ConfigError::TlsIncomplete {
            given: "--tls-handshake-timeout 0",
            needs: "a timeout of at least 1 second (a handshake is never waited for forever)",
        });
    }
    for (flag, seconds) in [
        ("--idle-timeout", idle_timeout_seconds),
        ("--body-timeout", body_timeout_seconds),
        ("--tls-handshake-timeout", tls_handshake_timeout_seconds),
    ] {
        if seconds > TIMEOUT_MAX_SECONDS {
            return Err(ConfigError::TimeoutTooLong { flag, seconds });
        }
    }
    let max_item_bytes = cli
        .max_item_size
        .or(file.max_item_size)
        .unwrap_or(DEFAULT_MAX_ITEM_SIZE)
        .0;
    if !(1024..1 << 32).contains(&max_item_bytes) {
        return Err(ConfigError::MaxItemSize {
            bytes: max_item_bytes,
        });
    }
    let data_dir = cli
        .data_dir
        .clone()
        .or_else(|| file.data_dir.clone())
        .unwrap_or_else(default_data_dir);
    let mut segments = if cli.segments.is_empty() {
        file.segments.clone()
    } else {
        cli.segments.clone()
    };
    if segments.is_empty() {
        segments.push(SegmentSpec::File {
            path: data_dir.join("segment-0"),
            size: DEFAULT_SEGMENT_BYTES,
            locality: FileLocality::Unknown,
        });
    }
    for segment in &segments {
        let nodes: Vec<NodeId> = match segment {
            SegmentSpec::Mem { nodes, .. } => nodes.clone(),
            SegmentSpec::File {
                locality: FileLocality::Node(n),
                ..
            } => vec![*n],
            SegmentSpec::File { .. } => Vec::new(),
        };
        if segment.check_size().is_err() {
            return Err(ConfigError::SegmentSize {
                segment: segment.to_string(),
            });
        }
        if let Some(&node) = nodes.iter().find(|n| !topology.is_online(**n)) {
            return Err(ConfigError::SegmentNode {
                segment: segment.to_string(),
                node,
            });
        }
    }
    let policy_text = cli
        .placement_policy
        .clone()
        .or_else(|| file.placement_policy.clone())
        .unwrap_or_else(|| "best_fit".to_string());
    let placement_policy = match Policy::parse(&policy_text) {
        Some(Policy::LargestHoleFirst) | None => {
            return Err(ConfigError::PlacementPolicy { text: policy_text })
        }
        Some(policy) => policy,
    };
    let eviction_text = cli
        .segment_eviction
        .clone()
        .or_else(|| file.segment_eviction.clone())
        .unwrap_or_else(|| "none".to_string());
    let segment_eviction_lru = match eviction_text.as_str() {
        "none" => false,
        "lru" => true,
        _ => {
            return Err(ConfigError::SegmentEviction {
                text: eviction_text,
            })
        }
    };
    let log_format = match cli
        .log_format
        .clone()
        .or_else(|| file.log_format.clone())
        .as_deref()
    {
        None | Some("text") => LogFormat::Text,
        Some("json") => LogFormat::Json,
        Some(other) => {
            return Err(ConfigError::LogFormat {
                text: other.to_string(),
            })
        }
    };
    // Every budget is whole blocks (checked above), so count blocks; overflow is just "too many".
    let others = topology.online_count().saturating_sub(1) as u64;
    let blocks = [
        Some(memory / block),
        (sub_memory / block).checked_mul(others),
        Some(small_memory.unwrap_or(0) / block),
        (small_sub_memory / block).checked_mul(others),
    ]
    .into_iter()
    .try_fold(0u64, |sum, part| part.and_then(|p| sum.checked_add(p)));
    match blocks {
        Some(blocks) if blocks <= u64::from(u32::MAX) => {}
        _ => {
            return Err(ConfigError::TooManyBlocks {
                blocks: blocks.unwrap_or(u64::MAX),
            })
        }
    }
    let unix_socket = cli.unix_socket.clone().or_else(|| file.unix_socket.clone());
    let unix_socket_mode = match cli
        .unix_socket_mode
        .as_ref()
        .or(file.unix_socket_mode.as_ref())
    {
        None => DEFAULT_UNIX_SOCKET_MODE,
        Some(text) => u32::from_str_radix(text.trim_start_matches("0o"), 8)
            .ok()
            .filter(|&mode| mode <= 0o777)
            .ok_or_else(|| ConfigError::UnixSocketMode { text: text.clone() })?,
    };
    let commands = CommandSwitches {
        shutdown: switch(
            "--shutdown-command",
            cli.shutdown_command
                .as_ref()
                .or(file.shutdown_command.as_ref()),
            false,
        )?,
        flush_all: on_off(
            "--flush-all-command",
            cli.flush_all_command
                .as_ref()
                .or(file.flush_all_command.as_ref()),
        )?,
        dump: on_off(
            "--dump-commands",
            cli.dump_commands.as_ref().or(file.dump_commands.as_ref()),
        )?,
        watch: on_off(
            "--watch-command",
            cli.watch_command.as_ref().or(file.watch_command.as_ref()),
        )?,
    };
    let lru_crawler = on_off(
        "--lru-crawler",
        cli.lru_crawler.as_ref().or(file.lru_crawler.as_ref()),
    )?;
    let evictions = on_off(
        "--evictions",
        cli.evictions.as_ref().or(file.evictions.as_ref()),
    )?;
    Ok(Settings {
        arena: ArenaConfig {
            numa: mode,
            memory_bytes: memory,
            sub_memory_bytes: sub_memory,
            small_memory_bytes: small_memory,
            small_sub_memory_bytes: small_sub_memory,
            block_bytes: block,
            ram_head_bytes: ram_head,
            small_min_alloc_bytes: small_min_alloc,
            io_chunk_bytes: io_chunk,
            stream_bytes: io_pool * threads as u64,
            perverse,
        },
        io_pool_bytes: io_pool,
        io_ring,
        zero_copy_min_bytes: cli
            .zero_copy_min
            .or(file.zero_copy_min)
            .unwrap_or(DEFAULT_ZERO_COPY_MIN)
            .0,
        receive_timestamps,
        multishot_receive,
        ring_sleep,
        pin_shards_to_node,
        listen,
        metrics_listen,
        cpus: node_cpus[..threads].to_vec(),
        partitions,
        max_connections,
        idle_timeout_seconds,
        body_timeout_seconds,
        spin_before_park_micros: cli.spin_before_park.or(file.spin_before_park).unwrap_or(0),
        promotion_interval_ms: cli
            .promotion_interval
            .or(file.promotion_interval)
            .unwrap_or(1000),
        promotion_budget_blocks: cli.promotion_budget.or(file.promotion_budget).unwrap_or(4),
        promotion_half_life_seconds: promotion_half_life,
        max_item_bytes,
        segments,
        mount_dirs: std::iter::once(data_dir.clone())
            .chain(if cli.mount_dirs.is_empty() {
                file.mount_dirs.clone()
            } else {
                cli.mount_dirs.clone()
            })
            .collect(),
        admin_socket: cli
            .admin_socket
            .clone()
            .or_else(|| file.admin_socket.clone()),
        sasl_password_file: cli
            .sasl_password_file
            .clone()
            .or_else(|| file.sasl_password_file.clone()),
        unix_socket,
        unix_socket_mode,
        tls,
        tls_handshake_timeout_seconds,
        log_file: cli.log_file.clone().or_else(|| file.log_file.clone()),
        data_dir,
        placement_policy,
        segment_eviction_lru,
        user: cli.user.clone().or_else(|| file.user.clone()),
        allow_root: cli.allow_root || file.allow_root,
        verify_reads,
        warm_restart,
        pid_file: cli.pid_file.clone().or_else(|| file.pid_file.clone()),
        daemon: cli.daemon,
        commands,
        lru_crawler,
        evictions,
        dry_run: cli.dry_run,
        log_level: cli
            .log_level
            .clone()
            .or_else(|| file.log_level.clone())
            .unwrap_or_else(|| "info".to_string()),
        log_format,
        numa_reason,
        notes,
    })
}
