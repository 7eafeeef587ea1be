//! The multi-core stress workload (issue 12): every connection hammers one small key set with
//! SET, GET, DELETE, CAS, INCR and APPEND, then expiry and eviction run under readers. The
//! host runs it in `tests/partition_stress.rs`; the NUMA VM runs it on a two-node plan while
//! promotion exchanges blocks (`tests/numa_vm.rs`). Values describe themselves, so every hit
//! is checked byte for byte without knowing who wrote last.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::server::{arith_extras, frame, set_extras, Client, Server};
use super::Rng;

const GET: u8 = 0x00;
const SET: u8 = 0x01;
const DELETE: u8 = 0x04;
const INCREMENT: u8 = 0x05;
const APPEND: u8 = 0x0e;

/// The size of one hammer run.
#[derive(Clone, Copy, Debug)]
pub struct Hammer {
    /// Client threads, one connection each (spread over the shards by the listener).
    pub clients: usize,
    /// The contested keys `k0..`.
    pub keys: u64,
    pub ops_per_client: usize,
    /// The size of the large values (one SET in twenty): 200 KiB are lent zero-copy and
    /// pinned while sent; exactly `--ram-head` makes fixed heads, which promotion moves.
    pub large_value_bytes: usize,
}

/// A value that says what it is: `key|writer|n|len|` then a fill every byte of which follows
/// from that header. `len` is at least 64 (the header fits).
pub fn value(key: &str, writer: usize, n: usize, len: usize) -> Vec<u8> {
    assert!(len >= 64);
    let mut v = format!("{key}|{writer}|{n}|{len}|").into_bytes();
    let seed = (writer * 1_000_003 + n) as u64;
    let fill = super::pattern(seed, len.saturating_sub(v.len()));
    v.extend_from_slice(&fill);
    v
}

/// Panics unless `bytes` is exactly a value [`value`] made for `key`.
pub fn check(key: &str, bytes: &[u8]) {
    let text = String::from_utf8_lossy(&bytes[..bytes.len().min(64)]).into_owned();
    let mut fields = text.splitn(5, '|');
    let (k, writer, n, len) = (
        fields.next().unwrap_or(""),
        fields.next().and_then(|f| f.parse::<usize>().ok()),
        fields.next().and_then(|f| f.parse::<usize>().ok()),
        fields.next().and_then(|f| f.parse::<usize>().ok()),
    );
    assert_eq!(
        k, key,
        "a GET of {key} returned another key's bytes: {text:?}"
    );
    let (Some(writer), Some(n), Some(len)) = (writer, n, len) else {
        panic!("{key}: a value without its header: {text:?}");
    };
    assert_eq!(
        bytes.len(),
        len,
        "{key}: torn value (writer {writer}, #{n})"
    );
    assert!(
        bytes == value(key, writer, n, len),
        "{key}: wrong bytes (writer {writer}, #{n}, {len} bytes)"
    );
}

/// Reader threads that GET keys in a loop until stopped, checking every hit byte for byte.
pub struct CheckingReaders {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<u64>>,
}

impl CheckingReaders {
    /// `count` readers, one connection each; reader `r`'s `i`-th GET asks for `key(r, i)`.
    pub fn start(
        addr: std::net::SocketAddr,
        count: u64,
        key: impl Fn(u64, u64) -> String + Send + Sync + 'static,
    ) -> CheckingReaders {
        let stop = Arc::new(AtomicBool::new(false));
        let key = Arc::new(key);
        let threads = (0..count)
            .map(|r| {
                let (stop, key) = (Arc::clone(&stop), Arc::clone(&key));
                std::thread::spawn(move || {
                    let mut c = Client::connect(addr);
                    let (mut i, mut hits) = (0, 0);
                    while !stop.load(Ordering::Relaxed) {
                        let k = key(r, i);
                        let got = c.get(k.as_bytes());
                        if got.status == 0 {
                            check(&k, &got.value);
                            hits += 1;
                        }
                        i += 1;
                    }
                    hits
                })
            })
            .collect();
        CheckingReaders { stop, threads }
    }

    /// Stops the readers and returns their hits; panics if one saw wrong bytes.
    pub fn stop(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.threads
            .into_iter()
            .map(|t| t.join().expect("a reader saw wrong bytes"))
            .sum()
    }
}

pub fn stat(c: &mut Client, name: &str) -> u64 {
    c.stat("", name)
}

/// Runs the hammer and checks what it must leave: every GET hit byte-exact, each CAS race
/// with exactly one winner, every INCR and APPEND counted once, and no message between cores
/// for any of the requests.
pub fn hammer(server: &Server, seed: u64, size: Hammer) {
    let mut admin = server.client();
    let control_before = stat(&mut admin, "mesh_messages_control");
    let cas_wins = Arc::new(AtomicU64::new(0));
    let incrs = Arc::new(Mutex::new(Vec::new()));
    assert_eq!(admin.set(b"cas", b"0", 0, 0).status, 0);
    assert_eq!(admin.set(b"log", b"", 0, 0).status, 0);
    let clients: Vec<_> = (0..size.clients)
        .map(|writer| {
            let addr = server.addr;
            let (cas_wins, incrs) = (Arc::clone(&cas_wins), Arc::clone(&incrs));
            std::thread::spawn(move || {
                let mut rng = Rng::new(seed ^ (writer as u64 + 1).wrapping_mul(0x9E37_79B9));
                let mut c = Client::connect(addr);
                let mut mine = Vec::new();
                for n in 0..size.ops_per_client {
                    let k = format!("k{}", rng.below(size.keys));
                    match rng.below(100) {
                        0..=29 => {
                            let len = match rng.below(20) {
                                0 => size.large_value_bytes,
                                1..=4 => 64 + rng.below(4000) as usize,
                                _ => 64 + rng.below(200) as usize,
                            };
                            // Some values expire within the run.
                            let ttl = if rng.chance(10) { 1 } else { 0 };
                            let r = c.call(&frame(
                                SET,
                                &set_extras(0, ttl),
                                k.as_bytes(),
                                &value(&k, writer, n, len),
                                0,
                                0,
                            ));
                            assert!(r.status == 0 || r.status == 0x82, "SET {k}: {}", r.status);
                        }
                        30..=59 => {
                            let r = c.call(&frame(GET, &[], k.as_bytes(), &[], 0, 0));
                            match r.status {
                                0 => check(&k, &r.value),
                                1 => {}
                                other => panic!("GET {k}: status {other}"),
                            }
                        }
                        60..=64 => {
                            let r = c.call(&frame(DELETE, &[], k.as_bytes(), &[], 0, 0));
                            assert!(r.status == 0 || r.status == 1, "DELETE {k}: {}", r.status);
                        }
                        65..=79 => {
                            // CAS race: read the counter and its token, write +1 with it.
                            let got = c.call(&frame(GET, &[], b"cas", &[], 0, 0));
                            assert_eq!(got.status, 0, "the CAS counter is always there");
                            let now: u64 = String::from_utf8(got.value).unwrap().parse().unwrap();
                            let r = c.call(&frame(
                                SET,
                                &set_extras(0, 0),
                                b"cas",
                                (now + 1).to_string().as_bytes(),
                                got.cas,
                                0,
                            ));
                            match r.status {
                                0 => {
                                    cas_wins.fetch_add(1, Ordering::Relaxed);
                                }
                                2 => {} // lost the race: someone else's CAS won
                                other => panic!("CAS: status {other}"),
                            }
                        }
                        80..=91 => {
                            let r = c.call(&frame(
                                INCREMENT,
                                &arith_extras(1, 1, 0),
                                b"ctr",
                                &[],
                                0,
                                0,
                            ));
                            assert_eq!(r.status, 0, "INCR");
                            mine.push(r.counter());
                        }
                        _ => {
                            let token = format!("<{writer}.{n}>");
                            let r = c.call(&frame(APPEND, &[], b"log", token.as_bytes(), 0, 0));
                            assert_eq!(r.status, 0, "APPEND");
                        }
                    }
                }
                incrs.lock().unwrap().extend(mine);
            })
        })
        .collect();
    for client in clients {
        client.join().expect("a client failed");
    }
    // INCR: every increment returned a distinct value, and the last is the count.
    let mut values = incrs.lock().unwrap().clone();
    values.sort_unstable();
    let count = values.len() as u64;
    assert!(count > 0);
    assert_eq!(
        values,
        (1..=count).collect::<Vec<_>>(),
        "INCR lost or repeated an increment"
    );
    let ctr = admin.get(b"ctr");
    assert_eq!(String::from_utf8(ctr.value).unwrap(), count.to_string());
    // CAS: every win moved the counter by one, and nothing else did.
    let cas = admin.get(b"cas");
    assert_eq!(
        String::from_utf8(cas.value).unwrap(),
        cas_wins.load(Ordering::Relaxed).to_string(),
        "a CAS race had two winners (or a win was lost)"
    );
    // APPEND: every token once.
    let log = String::from_utf8(admin.get(b"log").value).unwrap();
    let tokens: Vec<&str> = log.split_inclusive('>').collect();
    let unique: std::collections::HashSet<&str> = tokens.iter().copied().collect();
    assert_eq!(tokens.len(), unique.len(), "an APPEND landed twice");
    // Small requests crossed no core: the only control messages are this STAT's own gather.
    let control_after = stat(&mut admin, "mesh_messages_control");
    assert_eq!(
        control_after - control_before,
        1,
        "requests sent messages to another core"
    );
    assert_eq!(stat(&mut admin, "mesh_messages_placement"), 0);
    assert!(stat(&mut admin, "partition_locks") > (size.clients * size.ops_per_client) as u64);
}

/// Expiry, then eviction: one item certain to expire is reclaimed by the sweep (the hammer's
/// keys may all have ended on values that never expire), then `items` SETs, every other one
/// `large_value_bytes`, overflow the arena while two readers check every hit.
pub fn expire_then_evict(server: &Server, items: usize, large_value_bytes: usize) {
    let mut admin = server.client();
    assert_eq!(admin.set(b"expires", b"soon", 0, 1).status, 0);
    // The sweep runs every second on each shard.
    std::thread::sleep(std::time::Duration::from_millis(2200));

    let readers = CheckingReaders::start(server.addr, 2, move |r, i| {
        format!("p{}", (i * 7 + r) % items as u64)
    });
    let mut writer = server.client();
    for n in 0..items {
        let k = format!("p{n}");
        let len = if n % 2 == 0 {
            large_value_bytes
        } else {
            300 + n % 3000
        };
        let r = writer.set(k.as_bytes(), &value(&k, 99, n, len), 0, 0);
        assert!(r.status == 0 || r.status == 0x82, "SET {k}: {}", r.status);
    }
    readers.stop();
    assert!(
        stat(&mut admin, "evictions") > 0,
        "the pressure phase evicted nothing"
    );
    assert!(
        stat(&mut admin, "expired_reclaimed") > 0,
        "no expired item was reclaimed"
    );
}
