//! What every shard (and the placement master) shares: the settings, the arena, the key space
//! in its partitions, and the atomics touched on accept, close, stop and STAT.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::arena::Arena;
use crate::config::Settings;
use crate::segment::MountedTarget;
use crate::topology::Topology;

/// How long a connection may go on writing its replies after the stop (its receive ended at
/// once) before its socket is shut down both ways.
pub(crate) const STOP_WRITE_GRACE: Duration = Duration::from_secs(1);
/// Seconds since the Unix epoch, as the protocol's expiry times count them.
pub fn unix_now() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as u32)
}

/// State every shard sees: configuration, the partitions (each behind its own lock), and
/// atomics touched on accept, close and STAT.
pub struct Shared {
    pub settings: Settings,
    pub arena: Arc<Arena>,
    /// The key space: every store, each behind its lock.
    pub partitions: crate::store::partition::Partitions,
    pub version: String,
    pub started: Instant,
    /// Every shard serves (set once start-up is done; `/health` answers 200 from then on).
    pub(crate) serving: AtomicBool,
    pub stop: AtomicBool,
    /// One per shard, then the master's: rung to stop, and for the master when a shard finished.
    pub(crate) doorbells: Vec<crate::ring::Doorbell>,
    /// SASL PLAIN credentials (authentication is required when present).
    pub(crate) credentials: Option<super::auth::Credentials>,
    /// Each source's budget of failed authentications, over every shard.
    pub(crate) auth_gate: super::auth_gate::AuthGate,
    /// TLS on `--listen` (`--tls-cert`).
    pub(crate) tls: Option<Arc<super::tls_config::Tls>>,
    /// The address `--listen` bound (its port chosen when it asked for port 0).
    pub listen_addrs: Vec<SocketAddr>,
    pub curr_connections: AtomicUsize,
    /// Connections that asked to `watch` fetches and stores.
    pub watchers: super::watch::Watchers,
    /// Connections each shard serves (a hand-off counts on the shard it goes to): the accept
    /// loops even out what the kernel's SO_REUSEPORT hash spreads unevenly.
    pub connections_by_shard: Box<[AtomicUsize]>,
    pub total_connections: AtomicU64,
    pub rejected_connections: AtomicU64,
    /// Shards whose own connections have all finished (shutdown barrier).
    pub(crate) drained: AtomicUsize,
    /// Shards that are completely done (the placement master waits for them all).
    pub(crate) finished: AtomicUsize,
    /// Shards that have read the warm-restart snapshot (the last one deletes it).
    pub(crate) restored: AtomicUsize,
    /// Shards that have written their warm-restart parts (the last one writes the manifest).
    pub(crate) snapshot_written: AtomicUsize,
    /// Why parts of the warm-restart snapshot were not written (then there is no manifest,
    /// and the stop exits non-zero): one sentence each.
    pub(crate) snapshot_failures: std::sync::Mutex<Vec<String>>,
    /// What the warm restart brought back (STAT `warm_restart_*`).
    pub(crate) warm_restart: super::warm_report::WarmRestartFigures,
    /// Every shard waits here after its restore: none serves before all partitions are back.
    pub(crate) restore_done: std::sync::Barrier,
    /// Whether a refused io_uring ring has been logged (it is said once).
    pub(crate) io_fallback_said: std::sync::atomic::AtomicBool,
    /// Whether a shard has said why its receives are not multishot (said once).
    pub(crate) multishot_fallback_said: std::sync::atomic::AtomicBool,
    /// The background expiry sweep runs (text `lru_crawler enable|disable`, memcached's name
    /// for its crawler; `crawl` and `metadump` need it on, as memcached's do).
    pub crawler_enabled: AtomicBool,
    /// Store targets mounted at start, by placement target id.
    pub targets: Vec<MountedTarget>,
    /// The machine, for mounts at runtime.
    pub topology: Topology,
    /// Mesh peer ids, filled as executors join, and the barrier every executor passes once
    /// all are known.
    pub(crate) peers: Mutex<(Vec<Option<usize>>, Option<usize>)>,
    pub(crate) joined: std::sync::Barrier,
    /// The data directory, opened once and locked for the life of the process.
    pub data_dir: Arc<super::data_dir::DataDir>,
}

impl Shared {
    pub(crate) fn register_shard(&self, index: usize, peer: usize) -> Peers {
        self.peers.lock().unwrap_or_else(|e| e.into_inner()).0[index] = Some(peer);
        self.joined.wait();
        self.peer_map()
    }

    pub(crate) fn register_master(&self, peer: usize) {
        self.peers.lock().unwrap_or_else(|e| e.into_inner()).1 = Some(peer);
        self.joined.wait();
    }

    pub(crate) fn peer_map(&self) -> Peers {
        let peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        Peers {
            shards: peers
                .0
                .iter()
                .map(|p| p.expect("every shard joined"))
                .collect(),
            master: peers.1.expect("the master joined"),
        }
    }
}

/// Mesh peer ids: each shard's (by index) and the placement master's.
#[derive(Clone, Debug)]
pub struct Peers {
    pub shards: Vec<usize>,
    pub master: usize,
}

/// FLUSH: every partition drops its items now, or marks them to die at `now + delay`.
pub(crate) fn flush_all(shared: &Shared, delay: u32, now: u32) {
    for index in 0..shared.partitions.len() {
        shared.partitions.lock(index).flush(delay, now);
    }
}

/// A seed for a hasher or the placement policy's random choices.
pub(crate) fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(Instant::now().elapsed().as_nanos());
    h.finish()
}
