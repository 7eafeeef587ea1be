//! `watch`: memcached's live log of fetches and stores, streamed to an operator's connection.
//!
//! Any shard serves any key, so one watcher's lines come from every shard. Each watcher owns a
//! bounded buffer behind a short lock; serving code formats a line and appends it there (when
//! no watcher wants that kind of line, the whole cost is one atomic load). The watcher's own
//! connection drains its buffer every [`DRAIN_INTERVAL`] and writes it out. A full buffer drops
//! lines and counts them, and the count goes out as `skipped=N`, as memcached's logger does.
//! Lines are memcached's (`ts=... gid=... type=item_get key=... status=... clsid=... cfd=...
//! size=...`), keys URI-encoded.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::endpoint::{Endpoint, Transport};
use crate::proto::StoreMode;
use crate::store::{Evicted, StoreOutcome};

/// `watch fetchers`: every key a GET-family command looks up.
pub const FETCHERS: u8 = 1;
/// `watch mutations`: every store (set, add, replace, append, prepend, cas).
pub const MUTATIONS: u8 = 2;
/// `watch connevents`: every client connection opened and closed.
pub const CONNEVENTS: u8 = 4;
/// `watch deletions`: every item a `delete` or `md` removed.
pub const DELETIONS: u8 = 8;
/// `watch evictions`: every item evicted to make room for a store.
pub const EVICTIONS: u8 = 16;

/// Why a connection closed, as memcached's `conn_close` line says it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CloseReason {
    /// The client left or asked (QUIT).
    Normal,
    /// A protocol error closed it.
    Error,
    /// The server stopped.
    Shutdown,
}
/// Lines a watcher holds before it drops (and counts) new ones.
const BUFFER_CAP_BYTES: usize = 1 << 20;
/// How often a watching connection writes out what gathered (memcached's logger thread polls
/// every 1 to 50 ms).
pub const DRAIN_INTERVAL: Duration = Duration::from_millis(10);
/// Most watchers at once (memcached's `WATCHER_LIMIT`).
const WATCHERS_MAX: usize = 20;

#[derive(Default)]
pub struct Watchers {
    /// The union of every watcher's kinds: the serving path's only cost when it is 0.
    kinds: AtomicU8,
    list: Mutex<Vec<Arc<Watcher>>>,
    /// memcached's `gid`: one number per line, across all watchers.
    next_gid: AtomicU64,
}

pub struct Watcher {
    kinds: u8,
    lines: Mutex<Lines>,
}

#[derive(Default)]
struct Lines {
    bytes: Vec<u8>,
    skipped: u64,
}

/// What a lookup found, as memcached's `item_get` line says it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fetched {
    NotFound,
    /// Found, in this item class (1 small, 2 fixed head, 3 large), with this many value bytes.
    Found {
        class: u8,
        bytes: u64,
    },
}

impl Watchers {
    /// Whether any watcher wants lines of `kind`.
    pub fn wants(&self, kind: u8) -> bool {
        self.kinds.load(Ordering::Relaxed) & kind != 0
    }

    /// A new watcher of `kinds`, or `None` at the limit.
    pub fn add(&self, kinds: u8) -> Option<Arc<Watcher>> {
        let mut list = self.list.lock().expect("watchers lock");
        if list.len() >= WATCHERS_MAX {
            return None;
        }
        let watcher = Arc::new(Watcher {
            kinds,
            lines: Mutex::new(Lines::default()),
        });
        list.push(Arc::clone(&watcher));
        self.kinds.fetch_or(kinds, Ordering::Relaxed);
        Some(watcher)
    }

    /// Watchers open now.
    pub fn count(&self) -> usize {
        self.list.lock().expect("watchers lock").len()
    }

    pub fn remove(&self, watcher: &Arc<Watcher>) {
        let mut list = self.list.lock().expect("watchers lock");
        list.retain(|w| !Arc::ptr_eq(w, watcher));
        let kinds = list.iter().fold(0, |kinds, w| kinds | w.kinds);
        self.kinds.store(kinds, Ordering::Relaxed);
    }

    /// An `item_get` line: a lookup of `key` by the connection on socket `fd`.
    pub fn fetched(&self, key: &[u8], fetched: Fetched, fd: i32) {
        if !self.wants(FETCHERS) {
            return;
        }
        let (status, class, bytes) = match fetched {
            Fetched::NotFound => ("not_found", 0, 0),
            Fetched::Found { class, bytes } => ("found", class, bytes),
        };
        let mut line = self.line_start("item_get", key);
        line.push_str(&format!(
            " status={status} clsid={class} cfd={fd} size={bytes}\n"
        ));
        self.publish(FETCHERS, line.as_bytes());
    }

    /// An `item_store` line: a store of `key` with its outcome. `ttl` is seconds left (0:
    /// none), `bytes` the value's length.
    #[allow(clippy::too_many_arguments)]
    pub fn stored(
        &self,
        key: &[u8],
        mode: StoreMode,
        with_cas: bool,
        outcome: StoreOutcome,
        ttl: u32,
        bytes: u64,
        fd: i32,
    ) {
        if !self.wants(MUTATIONS) {
            return;
        }
        let status = match outcome {
            StoreOutcome::Stored { .. } => "stored",
            // The store layer answers an ADD of a live key as binary does (exists); memcached
            // logs it, in every protocol, as not stored.
            StoreOutcome::Exists if mode == StoreMode::Add => "not_stored",
            StoreOutcome::Exists => "exists",
            StoreOutcome::NotFound => "not_found",
            StoreOutcome::NotStored => "not_stored",
            StoreOutcome::TooLarge => "too_large",
            StoreOutcome::OutOfMemory => "no_memory",
        };
        let cmd = match mode {
            _ if with_cas => "cas",
            StoreMode::Set => "set",
            StoreMode::Add => "add",
            StoreMode::Replace => "replace",
            StoreMode::Append => "append",
            StoreMode::Prepend => "prepend",
        };
        let class = if bytes == 0 { 0 } else { 1 };
        let mut line = self.line_start("item_store", key);
        line.push_str(&format!(
            " status={status} cmd={cmd} ttl={ttl} clsid={class} cfd={fd} size={bytes}\n"
        ));
        self.publish(MUTATIONS, line.as_bytes());
    }

    /// A `deleted` line: `cmd` (`delete`, `md`) removed `key`, an item of `class` with `bytes`
    /// value bytes.
    pub fn deleted(&self, key: &[u8], cmd: &str, class: u8, bytes: u64) {
        if !self.wants(DELETIONS) {
            return;
        }
        let mut line = self.line_start("deleted", key);
        line.push_str(&format!(" cmd={cmd} clsid={class} size={bytes}\n"));
        self.publish(DELETIONS, line.as_bytes());
    }

    /// An `eviction` line, as memcached writes it: whether the item was read since stored,
    /// its seconds to live (-1: no expiry) and since its last access, its class and size, as
    /// of `now` (Unix seconds).
    pub fn evicted(&self, evicted: &Evicted, now: u32) {
        if !self.wants(EVICTIONS) {
            return;
        }
        let fetch = if evicted.fetched { "yes" } else { "no" };
        let ttl = match evicted.expiry {
            0 => -1,
            at => i64::from(at) - i64::from(now),
        };
        let since_access = now.saturating_sub(evicted.accessed);
        let mut line = self.line_start("eviction", &evicted.key);
        line.push_str(&format!(
            " fetch={fetch} ttl={ttl} la={since_access} clsid={} size={}\n",
            evicted.class as u8, evicted.value_bytes
        ));
        self.publish(EVICTIONS, line.as_bytes());
    }

    /// A `conn_new` line: a client connected over `endpoint`, on socket `fd`.
    pub fn conn_new(&self, endpoint: &Endpoint, fd: i32) {
        if !self.wants(CONNEVENTS) {
            return;
        }
        let line = format!(
            "{} {} transport={} cfd={fd}\n",
            self.stamp("conn_new"),
            remote(endpoint),
            endpoint.watch_transport()
        );
        self.publish(CONNEVENTS, line.as_bytes());
    }

    /// A `conn_close` line: the connection over `endpoint` on socket `fd` closed, for `reason`.
    pub fn conn_close(&self, endpoint: &Endpoint, fd: i32, reason: CloseReason) {
        if !self.wants(CONNEVENTS) {
            return;
        }
        let reason = match reason {
            CloseReason::Normal => "normal",
            CloseReason::Error => "error",
            CloseReason::Shutdown => "shutdown",
        };
        let line = format!(
            "{} {} transport={} reason={reason} cfd={fd}\n",
            self.stamp("conn_close"),
            remote(endpoint),
            endpoint.watch_transport()
        );
        self.publish(CONNEVENTS, line.as_bytes());
    }

    /// `ts=... gid=... type=<kind>`.
    fn stamp(&self, kind: &str) -> String {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let gid = self.next_gid.fetch_add(1, Ordering::Relaxed) + 1;
        format!(
            "ts={}.{:06} gid={gid} type={kind}",
            now.as_secs(),
            now.subsec_micros()
        )
    }

    fn line_start(&self, kind: &str, key: &[u8]) -> String {
        format!(
            "{} key={}",
            self.stamp(kind),
            crate::proto::text::uri_encoded(key)
        )
    }

    fn publish(&self, kind: u8, line: &[u8]) {
        let list = self.list.lock().expect("watchers lock");
        for watcher in list.iter().filter(|w| w.kinds & kind != 0) {
            let mut lines = watcher.lines.lock().expect("watcher lock");
            if lines.bytes.len() + line.len() > BUFFER_CAP_BYTES {
                lines.skipped += 1;
            } else {
                lines.bytes.extend_from_slice(line);
            }
        }
    }
}

impl Watcher {
    /// Everything gathered since the last call, after a `skipped=N` line when lines were
    /// dropped.
    pub fn take(&self) -> Vec<u8> {
        let mut lines = self.lines.lock().expect("watcher lock");
        let mut out = Vec::new();
        if lines.skipped > 0 {
            out.extend_from_slice(format!("skipped={}\n", lines.skipped).as_bytes());
            lines.skipped = 0;
        }
        out.append(&mut lines.bytes);
        out
    }
}

/// memcached's `rip=... rport=...` for a TCP client (`ip:port`, `[v6]:port`); a unix socket's
/// client has no address, and memcached writes `rip=unix rport=0`.
fn remote(endpoint: &Endpoint) -> String {
    if endpoint.transport == Transport::Unix {
        return "rip=unix rport=0".to_string();
    }
    let peer = endpoint.peer.as_str();
    let (ip, port) = match peer.rsplit_once(':') {
        Some((ip, port)) => (ip.trim_start_matches('[').trim_end_matches(']'), port),
        None => (peer, "0"),
    };
    format!("rip={ip} rport={port}")
}

/// The kinds `watch` names (`watch` alone: fetchers), or `None` for a word Headroom does not
/// log (memcached answers ERROR for an unknown one; Headroom also for the kinds it has no
/// lines of: sysevents, rawcmds, proxy*).
pub fn kinds_of<'a>(words: impl Iterator<Item = &'a [u8]>) -> Option<u8> {
    let mut kinds = 0;
    for word in words {
        kinds |= match word {
            b"fetchers" => FETCHERS,
            b"mutations" => MUTATIONS,
            b"connevents" => CONNEVENTS,
            b"deletions" => DELETIONS,
            b"evictions" => EVICTIONS,
            _ => return None,
        };
    }
    Some(if kinds == 0 { FETCHERS } else { kinds })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_reach_only_watchers_of_their_kind_and_overflow_is_counted() {
        let watchers = Watchers::default();
        assert!(!watchers.wants(FETCHERS));
        let fetch = watchers.add(FETCHERS).unwrap();
        let store = watchers.add(MUTATIONS).unwrap();
        watchers.fetched(b"a b", Fetched::NotFound, 7);
        let line = String::from_utf8(fetch.take()).unwrap();
        assert!(
            line.contains("type=item_get key=a%20b status=not_found clsid=0 cfd=7 size=0\n"),
            "{line}"
        );
        assert!(store.take().is_empty());
        for _ in 0..BUFFER_CAP_BYTES / 32 {
            watchers.fetched(b"k", Fetched::Found { class: 1, bytes: 3 }, 7);
        }
        let all = fetch.take();
        assert!(
            all.starts_with(b"skipped="),
            "a full buffer counts what it drops"
        );
        assert!(all.len() <= BUFFER_CAP_BYTES + 64);
        watchers.fetched(b"k", Fetched::NotFound, 7);
        assert!(!fetch.take().starts_with(b"skipped="));
        watchers.remove(&fetch);
        assert!(!watchers.wants(FETCHERS));
        assert!(watchers.wants(MUTATIONS));
    }

    #[test]
    fn watch_words_parse_as_memcached_names_them() {
        let words = |s: &'static str| s.split(' ').filter(|w| !w.is_empty()).map(str::as_bytes);
        assert_eq!(kinds_of(words("")), Some(FETCHERS));
        assert_eq!(
            kinds_of(words("fetchers mutations")),
            Some(FETCHERS | MUTATIONS)
        );
        assert_eq!(
            kinds_of(words("mutations evictions")),
            Some(MUTATIONS | EVICTIONS)
        );
        assert_eq!(kinds_of(words("bogus")), None);
    }
}
