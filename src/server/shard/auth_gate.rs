//! The budget of failed authentications each source gets, over all its connections and
//! shards: a token bucket per source address (an IPv4 address, an IPv6 /64, the unix socket as
//! one source) of [`AUTH_SOURCE_FAILURE_BURST`] failures, refilled at
//! [`AUTH_SOURCE_FAILURES_PER_SECOND`]. Every attempt, right password or wrong, first takes a
//! token, waiting for one when the source has none left (the attempt is held, and nothing is
//! said meanwhile: a client that gives up learns nothing), and gives it back when it
//! succeeded: so only failures spend the budget, and no answer and no close comes sooner for a
//! wrong password than for a right one. Another source's attempts never wait on this one's.
//! The table is bounded ([`AUTH_SOURCES_MAX`]): the source seen longest ago goes first.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Failed authentications a source may make at once before the rate applies (a few clients
/// with a stale password behind one address, each retrying its 3 times, stay within it).
pub const AUTH_SOURCE_FAILURE_BURST: u32 = 30;
/// Failed authentications a source may make per second once its burst is spent.
pub const AUTH_SOURCE_FAILURES_PER_SECOND: u32 = 10;
/// Sources the table holds at most (about 48 bytes each): past it, the source seen longest ago
/// is forgotten (and starts again with a full burst if it comes back).
pub const AUTH_SOURCES_MAX: usize = 16_384;
/// Where attempts come from, as the budget counts them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Source {
    V4(u32),
    /// The /64 prefix: one host of IPv6 holds a whole /64.
    V6(u64),
    /// Every client of `--unix-socket`.
    Unix,
}

impl Source {
    /// The source of a client at `peer` (`ip:port`; anything that does not parse is a unix
    /// socket's client).
    pub fn of_peer(peer: &str) -> Source {
        match peer.parse::<SocketAddr>().map(|a| a.ip()) {
            Ok(IpAddr::V4(ip)) => Source::V4(u32::from(ip)),
            Ok(IpAddr::V6(ip)) => match ip.to_ipv4_mapped() {
                Some(v4) => Source::V4(u32::from(v4)),
                None => Source::V6((u128::from(ip) >> 64) as u64),
            },
            Err(_) => Source::Unix,
        }
    }
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::V4(ip) => write!(f, "{}", std::net::Ipv4Addr::from(*ip)),
            Source::V6(prefix) => {
                write!(
                    f,
                    "{}/64",
                    std::net::Ipv6Addr::from(u128::from(*prefix) << 64)
                )
            }
            Source::Unix => f.write_str("the unix socket"),
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Bucket {
    tokens: f64,
    refilled_at: Instant,
    seen_at: Instant,
    /// Attempts held now, waiting for a token.
    held: u32,
}

impl Bucket {
    fn new(now: Instant) -> Bucket {
        Bucket {
            tokens: f64::from(AUTH_SOURCE_FAILURE_BURST),
            refilled_at: now,
            seen_at: now,
            held: 0,
        }
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now
            .saturating_duration_since(self.refilled_at)
            .as_secs_f64();
        self.refilled_at = self.refilled_at.max(now);
        self.tokens = (self.tokens + elapsed * f64::from(AUTH_SOURCE_FAILURES_PER_SECOND))
            .min(f64::from(AUTH_SOURCE_FAILURE_BURST));
    }

    /// How long until a whole token is there.
    fn wait(&self) -> Duration {
        let missing = (1.0 - self.tokens).max(0.0);
        Duration::from_secs_f64(missing / f64::from(AUTH_SOURCE_FAILURES_PER_SECOND))
    }
}

/// Every source's budget, shared by every shard.
#[derive(Debug, Default)]
pub struct AuthGate {
    buckets: Mutex<HashMap<Source, Bucket>>,
}

/// A token an attempt holds: spent by a failure, given back by [`AuthGate::succeeded`].
#[derive(Debug)]
#[must_use = "a token is given back on success, or spent"]
pub struct Token {
    source: Source,
}

impl AuthGate {
    /// Takes a token of `source`'s at `now`: `Ok` with it, or `Err` with how long until one
    /// is there (the attempt is then held, and asks again).
    pub fn try_take(&self, source: Source, now: Instant) -> Result<Token, Duration> {
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        if !buckets.contains_key(&source) && buckets.len() >= AUTH_SOURCES_MAX {
            // The source seen longest ago, among those with nothing held (a held attempt's
            // source stays, or its count would be lost).
            let oldest = buckets
                .iter()
                .min_by_key(|(_, b)| (b.held > 0, b.seen_at))
                .map(|(s, _)| *s)
                .expect("a full table has an oldest source");
            buckets.remove(&oldest);
        }
        let bucket = buckets.entry(source).or_insert_with(|| Bucket::new(now));
        bucket.refill(now);
        bucket.seen_at = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            Ok(Token { source })
        } else {
            Err(bucket.wait().max(Duration::from_millis(1)))
        }
    }

    /// Counts one more attempt of `source`'s held, waiting for a token (a source with
    /// attempts held is never the one the full table forgets, or its spent budget would be
    /// forgotten with it). Every call is matched by one [`AuthGate::released`]. How many a
    /// source may have held is bounded by the connections it may open, as an idle connection
    /// is: a held attempt costs no more.
    pub fn hold(&self, source: Source, now: Instant) {
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        buckets
            .entry(source)
            .or_insert_with(|| Bucket::new(now))
            .held += 1;
    }

    /// A held attempt of `source`'s stops waiting (it got its token, or the server stops).
    pub fn released(&self, source: Source) {
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(bucket) = buckets.get_mut(&source) {
            bucket.held = bucket.held.saturating_sub(1);
        }
    }

    /// An attempt that succeeded gives its token back: only failures spend the budget.
    pub fn succeeded(&self, token: Token) {
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(bucket) = buckets.get_mut(&token.source) {
            bucket.tokens = (bucket.tokens + 1.0).min(f64::from(AUTH_SOURCE_FAILURE_BURST));
        }
    }

    /// An attempt that failed spends its token.
    pub fn failed(&self, token: Token) {
        let _ = token;
    }

    /// The sources out of tokens at `now` (their next attempt is held), at most `limit` of
    /// them, and how many there are in all.
    pub fn held_sources(&self, now: Instant, limit: usize) -> (Vec<Source>, usize) {
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        let mut held = Vec::new();
        let mut count = 0;
        for (source, bucket) in buckets.iter_mut() {
            bucket.refill(now);
            if bucket.tokens < 1.0 {
                count += 1;
                if held.len() < limit {
                    held.push(*source);
                }
            }
        }
        (held, count)
    }

    /// Sources the table holds now.
    #[cfg(test)]
    fn sources(&self) -> usize {
        self.buckets.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_gets_a_burst_then_a_rate_and_successes_cost_nothing() {
        let gate = AuthGate::default();
        let (a, b) = (Source::V4(1), Source::V4(2));
        let start = Instant::now();
        let mut taken = Vec::new();
        while let Ok(token) = gate.try_take(a, start) {
            taken.push(token);
        }
        assert_eq!(taken.len(), AUTH_SOURCE_FAILURE_BURST as usize);
        // Another source is not held by this one.
        let other = gate.try_take(b, start).expect("another source's token");
        gate.succeeded(other);
        // A held attempt is told how long until a token: 1 / rate.
        let wait = gate.try_take(a, start).unwrap_err();
        assert!(wait <= Duration::from_millis(101) && wait >= Duration::from_millis(99));
        // One second later, one second's worth.
        let later = start + Duration::from_secs(1);
        let more = (0..100)
            .filter_map(|_| gate.try_take(a, later).ok())
            .count();
        assert_eq!(more, AUTH_SOURCE_FAILURES_PER_SECOND as usize);
        // A success gives its token back.
        let much_later = later + Duration::from_secs(10);
        let token = gate.try_take(a, much_later).unwrap();
        gate.succeeded(token);
        let burst = (0..100)
            .filter_map(|_| gate.try_take(a, much_later).ok())
            .count();
        assert_eq!(burst, AUTH_SOURCE_FAILURE_BURST as usize);
        for token in taken {
            gate.failed(token);
        }
    }

    #[test]
    fn sources_are_addresses_v6_prefixes_and_the_unix_socket() {
        assert_eq!(Source::of_peer("127.0.0.1:5000"), Source::V4(0x7f00_0001));
        assert_eq!(
            Source::of_peer("127.0.0.1:5000"),
            Source::of_peer("127.0.0.1:6000")
        );
        assert_eq!(
            Source::of_peer("[::ffff:127.0.0.1]:1"),
            Source::V4(0x7f00_0001)
        );
        assert_eq!(
            Source::of_peer("[2001:db8::1]:1"),
            Source::of_peer("[2001:db8::ffff:2]:2"),
            "one /64"
        );
        assert_ne!(
            Source::of_peer("[2001:db8::1]:1"),
            Source::of_peer("[2001:db8:0:1::1]:1")
        );
        assert_eq!(Source::of_peer("<AF 1>"), Source::Unix);
        assert_eq!(
            Source::V6(0x2001_0db8_0000_0000).to_string(),
            "2001:db8::/64"
        );
    }

    #[test]
    fn the_table_forgets_the_source_seen_longest_ago() {
        let gate = AuthGate::default();
        let start = Instant::now();
        for i in 0..AUTH_SOURCES_MAX as u32 {
            let at = start + Duration::from_micros(u64::from(i));
            gate.failed(gate.try_take(Source::V4(i), at).unwrap());
        }
        assert_eq!(gate.sources(), AUTH_SOURCES_MAX);
        let late = start + Duration::from_secs(1);
        gate.failed(gate.try_take(Source::V4(u32::MAX), late).unwrap());
        assert_eq!(gate.sources(), AUTH_SOURCES_MAX, "bounded");
        drop(gate.buckets.lock().unwrap());
        let held = gate.buckets.lock().unwrap();
        assert!(!held.contains_key(&Source::V4(0)), "the oldest went");
        assert!(held.contains_key(&Source::V4(1)));
    }

    #[test]
    fn a_source_with_attempts_held_is_not_forgotten() {
        let gate = AuthGate::default();
        let start = Instant::now();
        let first = Source::V4(0);
        gate.failed(gate.try_take(first, start).unwrap());
        gate.hold(first, start);
        for i in 1..=AUTH_SOURCES_MAX as u32 {
            let at = start + Duration::from_micros(u64::from(i));
            gate.failed(gate.try_take(Source::V4(i), at).unwrap());
        }
        let held = gate.buckets.lock().unwrap();
        assert_eq!(held.len(), AUTH_SOURCES_MAX, "bounded");
        assert!(held.contains_key(&first), "the held source stayed");
        assert!(
            !held.contains_key(&Source::V4(1)),
            "the oldest not held went"
        );
        drop(held);
        gate.released(first);
        assert_eq!(gate.buckets.lock().unwrap()[&first].held, 0);
    }
}
