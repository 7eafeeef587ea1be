//! A seeded soak through the real binary: text and binary clients write, read and delete keys
//! of 10 B to 8 MiB in a store far smaller than what they write, and every GET returns a miss
//! or exactly the last version stored: never an older one, never one after a DELETE or a
//! refused SET, never a torn value. `HEADROOM_SOAK_SECONDS` runs it longer (docs/testing.md).

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::server::{frame, set_extras, Client, Server};
use common::Rng;

const VALUE_MIN_BYTES: u64 = 10;
const VALUE_MAX_BYTES: u64 = 8 << 20;
/// Keys each writer owns: only it writes them, so it knows what each must hold.
const KEYS_PER_WRITER: u64 = 24;
/// The run's length unless `HEADROOM_SOAK_SECONDS` says otherwise.
const CI_SECONDS: u64 = 8;
/// A value at least this long starts with a header naming its key, version and length.
const HEADER_BYTES: usize = 16;

/// The bytes of version `version` of key `key_id`, `len` long: a header (when it fits), then
/// bytes drawn from all three, so a value from another key, version or length, or one torn
/// from two of them, never matches.
fn value_of(key_id: u32, version: u32, len: usize) -> Vec<u8> {
    let mut value = Vec::with_capacity(len);
    if len >= HEADER_BYTES {
        value.extend_from_slice(&key_id.to_le_bytes());
        value.extend_from_slice(&version.to_le_bytes());
        value.extend_from_slice(&(len as u64).to_le_bytes());
    }
    let mut x = (u64::from(key_id) << 32 | u64::from(version)) ^ (len as u64).rotate_left(17);
    x = x.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    while value.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let take = (len - value.len()).min(8);
        value.extend_from_slice(&x.to_le_bytes()[..take]);
    }
    value
}

/// What a value read back says of itself: `Some((key_id, version))` when it is exactly a
/// version of a key as [`value_of`] made it.
fn describe(value: &[u8]) -> Option<(u32, u32)> {
    if value.len() < HEADER_BYTES {
        return None;
    }
    let key_id = u32::from_le_bytes(value[..4].try_into().unwrap());
    let version = u32::from_le_bytes(value[4..8].try_into().unwrap());
    let len = u64::from_le_bytes(value[8..16].try_into().unwrap());
    (len == value.len() as u64 && value_of(key_id, version, value.len()) == value)
        .then_some((key_id, version))
}

/// What a key must hold, by its one writer's account.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expect {
    /// Never stored, deleted, or its last SET was refused: a GET must miss.
    Missing,
    /// This version was stored last: a GET finds it, or misses if it was evicted.
    Version { version: u32, len: usize },
}

#[derive(Clone, Copy, Debug, Default)]
struct Figures {
    ops: u64,
    bytes_written: u64,
    bytes_read: u64,
    hits: u64,
    misses_allowed: u64,
    refusals: u64,
    stale: u64,
    torn: u64,
}

impl Figures {
    fn add(&mut self, other: &Figures) {
        self.ops += other.ops;
        self.bytes_written += other.bytes_written;
        self.bytes_read += other.bytes_read;
        self.hits += other.hits;
        self.misses_allowed += other.misses_allowed;
        self.refusals += other.refusals;
        self.stale += other.stale;
        self.torn += other.torn;
    }
}

/// How a store ended.
enum Stored {
    Yes,
    /// Refused for want of room or as too large: the key must now be missing.
    Refused,
}

/// A client in one protocol.
enum Conn {
    Text(TcpStream, BufReader<TcpStream>),
    Binary(Client),
}

impl Conn {
    fn connect(addr: SocketAddr, text: bool) -> Conn {
        if !text {
            return Conn::Binary(Client::connect(addr));
        }
        let stream = TcpStream::connect(addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(60)))
            .unwrap();
        stream.set_nodelay(true).unwrap();
        let reader = BufReader::new(stream.try_clone().unwrap());
        Conn::Text(stream, reader)
    }

    fn line(reader: &mut BufReader<TcpStream>) -> String {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        assert!(!line.is_empty(), "the server closed the connection");
        line.trim_end().to_string()
    }

    /// Stores `value` under `key`, by one of the protocol's SET commands (`variant` picks).
    fn store(&mut self, key: &str, value: &[u8], variant: u64) -> Stored {
        match self {
            Conn::Text(stream, reader) => {
                let line = match variant % 2 {
                    0 => format!("set {key} 0 0 {}\r\n", value.len()),
                    _ => format!("ms {key} {}\r\n", value.len()),
                };
                stream.write_all(line.as_bytes()).unwrap();
                stream.write_all(value).unwrap();
                stream.write_all(b"\r\n").unwrap();
                let reply = Self::line(reader);
                match reply.as_str() {
                    "STORED" | "HD" => Stored::Yes,
                    "SERVER_ERROR out of memory storing object"
                    | "SERVER_ERROR object too large for cache" => Stored::Refused,
                    other => panic!("{key}: a store answered {other:?}"),
                }
            }
            Conn::Binary(c) => {
                let quiet = variant % 2 == 1;
                let opcode = if quiet { 0x11 } else { 0x01 };
                c.send(&frame(
                    opcode,
                    &set_extras(0, 0),
                    key.as_bytes(),
                    value,
                    0,
                    1,
                ));
                if quiet {
                    c.send(&frame(0x0a, &[], &[], &[], 0, 2));
                }
                let r = c.recv().expect("a store reply");
                if quiet && r.opaque == 2 {
                    return Stored::Yes;
                }
                let stored = match r.status {
                    0 => Stored::Yes,
                    0x82 | 0x03 => Stored::Refused,
                    other => panic!("{key}: a store answered status {other:#x}"),
                };
                if quiet {
                    assert_eq!(c.recv().expect("the NOOP").opaque, 2);
                }
                stored
            }
        }
    }

    fn get(&mut self, key: &str) -> Option<Vec<u8>> {
        match self {
            Conn::Text(stream, reader) => {
                stream
                    .write_all(format!("get {key}\r\n").as_bytes())
                    .unwrap();
                let header = Self::line(reader);
                if header == "END" {
                    return None;
                }
                let len: usize = header.rsplit(' ').next().unwrap().parse().unwrap();
                let mut value = vec![0u8; len + 2];
                reader.read_exact(&mut value).unwrap();
                value.truncate(len);
                assert_eq!(Self::line(reader), "END");
                Some(value)
            }
            Conn::Binary(c) => {
                let r = c.get(key.as_bytes());
                match r.status {
                    0 => Some(r.value),
                    1 => None,
                    other => panic!("{key}: a GET answered status {other:#x}"),
                }
            }
        }
    }

    fn delete(&mut self, key: &str) {
        match self {
            Conn::Text(stream, reader) => {
                stream
                    .write_all(format!("delete {key}\r\n").as_bytes())
                    .unwrap();
                let reply = Self::line(reader);
                assert!(reply == "DELETED" || reply == "NOT_FOUND", "{reply}");
            }
            Conn::Binary(c) => {
                let r = c.call(&frame(0x04, &[], key.as_bytes(), &[], 0, 0));
                assert!(r.status == 0 || r.status == 1, "delete: {:#x}", r.status);
            }
        }
    }
}

/// One writer: its own keys, in one protocol, until `stop`; every read held to its account.
fn writer(addr: SocketAddr, id: u32, text: bool, seed: u64, stop: &AtomicBool) -> Figures {
    let mut rng = Rng::new(seed ^ u64::from(id).wrapping_mul(0x9E37_79B9));
    let mut conn = Conn::connect(addr, text);
    let mut expect = vec![Expect::Missing; KEYS_PER_WRITER as usize];
    // Every version each key was stored with, to tell an older one from a torn one.
    let mut stored: Vec<Vec<(u32, usize)>> = vec![Vec::new(); KEYS_PER_WRITER as usize];
    let mut versions = vec![0u32; KEYS_PER_WRITER as usize];
    let mut f = Figures::default();
    while !stop.load(Ordering::Relaxed) {
        let slot = rng.below(KEYS_PER_WRITER) as usize;
        let key_id = id * 1000 + slot as u32;
        let key = format!("soak{key_id}");
        let roll = rng.below(100);
        f.ops += 1;
        if roll < 50 {
            versions[slot] += 1;
            let version = versions[slot];
            let len = rng.log_uniform(VALUE_MIN_BYTES, VALUE_MAX_BYTES) as usize;
            let value = value_of(key_id, version, len);
            f.bytes_written += len as u64;
            expect[slot] = match conn.store(&key, &value, rng.next_u64()) {
                Stored::Yes => {
                    stored[slot].push((version, len));
                    Expect::Version { version, len }
                }
                Stored::Refused => {
                    f.refusals += 1;
                    Expect::Missing
                }
            };
        } else if roll < 88 {
            let got = conn.get(&key);
            f.bytes_read += got.as_ref().map_or(0, |v| v.len() as u64);
            let Some(value) = got else {
                if expect[slot] != Expect::Missing {
                    f.misses_allowed += 1;
                }
                continue;
            };
            if let Expect::Version { version, len } = expect[slot] {
                if value.len() == len && value == value_of(key_id, version, len) {
                    f.hits += 1;
                    continue;
                }
            }
            let older = stored[slot]
                .iter()
                .any(|&(v, len)| len == value.len() && value == value_of(key_id, v, len));
            if older {
                f.stale += 1;
            } else {
                f.torn += 1;
            }
            eprintln!(
                "{key}: expected {:?}, got {} bytes that say {:?}: {} (seed {seed})",
                expect[slot],
                value.len(),
                describe(&value),
                if older { "an older version" } else { "torn" }
            );
        } else {
            conn.delete(&key);
            expect[slot] = Expect::Missing;
        }
    }
    f
}

/// A reader of every writer's keys: what it finds must be some whole version of that key.
fn reader(addr: SocketAddr, writers: u32, seed: u64, stop: &AtomicBool) -> Figures {
    let mut rng = Rng::new(seed ^ 0x5EED);
    let mut conn = Conn::connect(addr, true);
    let mut f = Figures::default();
    while !stop.load(Ordering::Relaxed) {
        let key_id =
            rng.below(u64::from(writers)) as u32 * 1000 + rng.below(KEYS_PER_WRITER) as u32;
        f.ops += 1;
        if let Some(value) = conn.get(&format!("soak{key_id}")) {
            f.bytes_read += value.len() as u64;
            if value.len() >= HEADER_BYTES {
                match describe(&value) {
                    Some((k, _)) if k == key_id => f.hits += 1,
                    said => {
                        f.torn += 1;
                        eprintln!("soak{key_id}: {} bytes that say {said:?}", value.len());
                    }
                }
            }
        }
    }
    f
}

#[test]
fn every_get_is_a_miss_or_the_last_version_stored() {
    let seconds = std::env::var("HEADROOM_SOAK_SECONDS")
        .map(|s| {
            s.parse()
                .expect("HEADROOM_SOAK_SECONDS is a number of seconds")
        })
        .unwrap_or(CI_SECONDS);
    // 32 MiB of RAM and a 48 MiB segment, against writers that store about 100 times that.
    let server = Server::start(&[
        "--threads",
        "2",
        "--memory",
        "32M",
        "--segment",
        "mem:size=48M,numa=0",
    ]);
    common::for_each_seed("store_soak", 1, |seed| {
        let stop = Arc::new(AtomicBool::new(false));
        let total = Arc::new(Mutex::new(Figures::default()));
        let writers = 4u32;
        let started = Instant::now();
        std::thread::scope(|s| {
            for id in 0..writers {
                let (stop, total) = (Arc::clone(&stop), Arc::clone(&total));
                s.spawn(move || {
                    let f = writer(server.addr, id, id % 2 == 0, seed, &stop);
                    total.lock().unwrap().add(&f);
                });
            }
            let (stop_r, total_r) = (Arc::clone(&stop), Arc::clone(&total));
            s.spawn(move || {
                let f = reader(server.addr, writers, seed, &stop_r);
                total_r.lock().unwrap().add(&f);
            });
            std::thread::sleep(Duration::from_secs(seconds));
            stop.store(true, Ordering::Relaxed);
        });
        let f = *total.lock().unwrap();
        let gib = |b: u64| b as f64 / f64::from(1u32 << 30);
        println!(
            "store_soak: {:.1} s, {} ops, {:.2} GiB written, {:.2} GiB read, {} hits, {} misses \
             after eviction, {} refusals, {} stale, {} torn",
            started.elapsed().as_secs_f64(),
            f.ops,
            gib(f.bytes_written),
            gib(f.bytes_read),
            f.hits,
            f.misses_allowed,
            f.refusals,
            f.stale,
            f.torn
        );
        assert_eq!((f.stale, f.torn), (0, 0), "seed {seed}");
        assert!(
            f.refusals > 0,
            "no store was refused: the store is not small enough"
        );
    });
}
