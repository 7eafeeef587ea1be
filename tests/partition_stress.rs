//! Every core's connections hammer one small key set at once (zero-hop serving: any shard runs
//! any key under its partition's lock): SET, GET, DELETE, CAS, INCR and APPEND from eight
//! connections spread over both shards, with values from a few bytes to 200 KiB (those are lent
//! zero-copy, pinned while they are sent), overwrites that leave dead bytes for compaction, keys
//! that expire, and then more data than the arena holds, so eviction runs under the readers.
//! Every GET hit is byte-exact (values describe themselves), each CAS race has exactly one
//! winner, INCR and APPEND lose nothing, and the small requests send no cross-core message.
//! (Promotion across nodes runs under the same kind of load in the VM: `tests/numa_vm.rs`.)

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use common::server::{arith_extras, frame, set_extras, Client, Server};
use common::{seeds, Rng};

const CLIENTS: usize = 8;
const KEYS: u64 = 24;
const OPS_PER_CLIENT: usize = 2500;
const GET: u8 = 0x00;
const SET: u8 = 0x01;
const DELETE: u8 = 0x04;
const INCREMENT: u8 = 0x05;
const APPEND: u8 = 0x0e;

/// A value that says what it is: `key|writer|n|len|` then a fill every byte of which follows
/// from that header, so any hit can be checked byte for byte without knowing who wrote last.
/// `len` is at least 64 (the header fits).
fn value(key: &str, writer: usize, n: usize, len: usize) -> Vec<u8> {
    assert!(len >= 64);
    let mut v = format!("{key}|{writer}|{n}|{len}|").into_bytes();
    let seed = (writer * 1_000_003 + n) as u64;
    let fill = common::pattern(seed, len.saturating_sub(v.len()));
    v.extend_from_slice(&fill);
    v
}

fn check(key: &str, bytes: &[u8]) {
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

fn stat(c: &mut Client, name: &str) -> u64 {
    c.stat("", name)
}

#[test]
fn every_core_hammers_one_key_set() {
    let seed = seeds("partition_stress", 1)[0];
    // 16 MiB: the contest keys are never evicted while they race; the pressure phase below
    // overflows it.
    let server = Server::start(&[
        "--threads",
        "2",
        "--memory",
        "16M",
        "--promotion-interval",
        "20",
    ]);
    let mut admin = server.client();
    let control_before = stat(&mut admin, "mesh_messages_control");
    let cas_wins = Arc::new(AtomicU64::new(0));
    let incrs = Arc::new(std::sync::Mutex::new(Vec::new()));
    assert_eq!(admin.set(b"cas", b"0", 0, 0).status, 0);
    assert_eq!(admin.set(b"log", b"", 0, 0).status, 0);
    let clients: Vec<_> = (0..CLIENTS)
        .map(|writer| {
            let addr = server.addr;
            let (cas_wins, incrs) = (Arc::clone(&cas_wins), Arc::clone(&incrs));
            std::thread::spawn(move || {
                let mut rng = Rng::new(seed ^ (writer as u64 + 1).wrapping_mul(0x9E37_79B9));
                let mut c = Client::connect(addr);
                let mut mine = Vec::new();
                for n in 0..OPS_PER_CLIENT {
                    let k = format!("k{}", rng.below(KEYS));
                    match rng.below(100) {
                        0..=29 => {
                            let len = match rng.below(20) {
                                0 => 200 << 10,
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
    assert!(stat(&mut admin, "partition_locks") > (CLIENTS * OPS_PER_CLIENT) as u64);

    // Expiry: the sweep (or a lookup) reclaims what expired. The hammer's keys may all have
    // ended on values that never expire (24 keys, a 1 s TTL on one SET in ten), so one more
    // item that expires is certain to be there; the sweep runs every second on each shard.
    assert_eq!(admin.set(b"expires", b"soon", 0, 1).status, 0);
    std::thread::sleep(std::time::Duration::from_millis(2200));

    // Pressure: more than the arena holds, while readers check every hit.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let readers: Vec<_> = (0..2)
        .map(|r| {
            let (addr, stop) = (server.addr, Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut c = Client::connect(addr);
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let k = format!("p{}", (i * 7 + r) % 1500);
                    let got = c.get(k.as_bytes());
                    if got.status == 0 {
                        check(&k, &got.value);
                    }
                    i += 1;
                }
            })
        })
        .collect();
    let mut writer = server.client();
    // About 150 MiB of heads into 16 MiB: the CLOCK hands evict.
    for n in 0..1500 {
        let k = format!("p{n}");
        let len = if n % 2 == 0 {
            200 << 10
        } else {
            300 + n % 3000
        };
        let r = writer.set(k.as_bytes(), &value(&k, 99, n, len), 0, 0);
        assert!(r.status == 0 || r.status == 0x82, "SET {k}: {}", r.status);
    }
    stop.store(true, Ordering::Relaxed);
    for reader in readers {
        reader.join().expect("a reader saw wrong bytes");
    }
    assert!(
        stat(&mut admin, "evictions") > 0,
        "the pressure phase evicted nothing"
    );
    assert!(
        stat(&mut admin, "expired_reclaimed") > 0,
        "no expired item was reclaimed"
    );
}

/// Compaction under the same kind of load: overwrites from connections on both shards fill a
/// two-block arena with dead bytes many times over while readers check every hit; the live
/// data is small, so admission compacts and nothing is evicted.
#[test]
fn compaction_under_every_core() {
    let server = Server::start(&["--threads", "2", "--memory", "4M"]);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let readers: Vec<_> = (0..2)
        .map(|r| {
            let (addr, stop) = (server.addr, Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut c = Client::connect(addr);
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let k = format!("c{}", (i * 5 + r) % 50);
                    let got = c.get(k.as_bytes());
                    if got.status == 0 {
                        check(&k, &got.value);
                    }
                    i += 1;
                }
            })
        })
        .collect();
    let writers: Vec<_> = (0..4)
        .map(|w| {
            let addr = server.addr;
            std::thread::spawn(move || {
                let mut c = Client::connect(addr);
                for n in 0..2500 {
                    // Every tenth write makes a key that stays: live objects spread through
                    // every block, so dead ones must be compacted away, not whole blocks freed.
                    let k = if n % 10 == 0 {
                        format!("s{w}-{n}")
                    } else {
                        format!("c{}", (n * 7 + w) % 50)
                    };
                    let len = 64 + (n * 131 + w * 17) % 3000;
                    let r = c.set(k.as_bytes(), &value(&k, w, n, len), 0, 0);
                    assert_eq!(r.status, 0, "SET {k}");
                }
            })
        })
        .collect();
    for writer in writers {
        writer.join().expect("a writer failed");
    }
    stop.store(true, Ordering::Relaxed);
    for reader in readers {
        reader.join().expect("a reader saw wrong bytes");
    }
    let mut c = server.client();
    assert!(stat(&mut c, "compactions") > 0, "nothing was compacted");
    assert_eq!(stat(&mut c, "evictions"), 0, "small live data was evicted");
    let stable = (0..4).flat_map(|w| (0..2500).step_by(10).map(move |n| format!("s{w}-{n}")));
    for k in (0..50).map(|k| format!("c{k}")).chain(stable) {
        let got = c.get(k.as_bytes());
        assert_eq!(got.status, 0, "{k} lost");
        check(&k, &got.value);
    }
}
