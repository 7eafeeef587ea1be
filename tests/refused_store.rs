//! A store refused for want of room leaves no stale value behind: every protocol path side by
//! side with stock memcached 1.6.45 (`-M`: it refuses instead of evicting) where it has the
//! same path, the same rule for values above memcached's 1 MiB and for a reader still sending
//! the old value, and a body that never arrives whole leaves the old value in place.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::memcached::{peers_memcached, Memcached};
use common::pattern;
use common::server::{frame, set_extras, Client, Server};

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;

/// A text-protocol connection that reads replies line by line.
struct Text {
    stream: TcpStream,
    reader: BufReader<TcpStream>,
}

impl Text {
    fn connect(addr: SocketAddr) -> Text {
        let stream = TcpStream::connect(addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        stream.set_nodelay(true).unwrap();
        let reader = BufReader::new(stream.try_clone().unwrap());
        Text { stream, reader }
    }

    fn line(&mut self) -> String {
        let mut line = String::new();
        self.reader.read_line(&mut line).unwrap();
        line.trim_end().to_string()
    }

    /// Sends a storage line and its data block; returns the reply line.
    fn store(&mut self, line: &str, value: &[u8]) -> String {
        let mut request = format!("{line}\r\n").into_bytes();
        request.extend_from_slice(value);
        request.extend_from_slice(b"\r\n");
        self.stream.write_all(&request).unwrap();
        self.line()
    }

    /// `gets KEY`: the value and its CAS, or `None` on a miss.
    fn gets(&mut self, key: &str) -> Option<(Vec<u8>, u64)> {
        self.stream
            .write_all(format!("gets {key}\r\n").as_bytes())
            .unwrap();
        let header = self.line();
        if header == "END" {
            return None;
        }
        let words: Vec<&str> = header.split(' ').collect();
        assert_eq!(words[0], "VALUE", "{header}");
        let len: usize = words[3].parse().unwrap();
        let cas = words[4].parse().unwrap();
        let mut value = vec![0u8; len + 2];
        self.reader.read_exact(&mut value).unwrap();
        value.truncate(len);
        assert_eq!(self.line(), "END");
        Some((value, cas))
    }

    fn delete(&mut self, key: &str) {
        self.stream
            .write_all(format!("delete {key}\r\n").as_bytes())
            .unwrap();
        let reply = self.line();
        assert!(reply == "DELETED" || reply == "NOT_FOUND", "{reply}");
    }
}

/// One way of overwriting a key that holds a small value, in one protocol.
#[derive(Clone, Copy, Debug)]
enum Path {
    TextSet,
    TextCas,
    TextAdd,
    TextReplace,
    TextAppend,
    TextPrepend,
    /// `ms` with these flags (`S<len>` is added); `C` is filled with the item's CAS.
    Meta(&'static str),
    BinarySet,
    BinarySetQ,
    BinarySetCas,
    BinaryAdd,
    BinaryReplace,
    BinaryAppend,
    BinaryPrepend,
}

/// What the key holds after the refused store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum After {
    Missing,
    OldValue,
    NewValue,
}

/// Why the store is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Refusal {
    /// No room for the new value: the server is filled with values of `fill_bytes` first.
    Full { fill_bytes: usize },
    /// The new value is over the item size limit.
    TooLarge,
}

impl Path {
    const ALL: [Path; 20] = [
        Path::TextSet,
        Path::TextCas,
        Path::TextAdd,
        Path::TextReplace,
        Path::TextAppend,
        Path::TextPrepend,
        Path::Meta(""),
        Path::Meta("C"),
        Path::Meta("MS"),
        Path::Meta("ME"),
        Path::Meta("MR"),
        Path::Meta("MA"),
        Path::Meta("MP"),
        Path::BinarySet,
        Path::BinarySetQ,
        Path::BinarySetCas,
        Path::BinaryAdd,
        Path::BinaryReplace,
        Path::BinaryAppend,
        Path::BinaryPrepend,
    ];

    /// memcached 1.6.45's rule: a text `set`, an `ms` in any mode, and a binary SET or SETQ
    /// (with a CAS or without) drop the old item when they cannot be stored; the others keep
    /// it. Headroom refuses an ADD of a live key before it seeks room, so that drops nothing.
    fn expected(self, refusal: Refusal) -> After {
        match self {
            Path::TextSet | Path::BinarySet | Path::BinarySetQ | Path::BinarySetCas => {
                After::Missing
            }
            Path::Meta("ME") if refusal != Refusal::TooLarge => After::OldValue,
            Path::Meta(_) => After::Missing,
            _ => After::OldValue,
        }
    }

    /// Where Headroom answers otherwise than memcached 1.6.45 on purpose, and why.
    fn known_difference(self, refusal: Refusal) -> Option<&'static str> {
        match (self, refusal) {
            (_, Refusal::TooLarge) => None,
            (Path::TextAdd | Path::BinaryAdd, _) => Some(
                "an ADD of a live key: memcached seeks room first and answers out of memory; \
                 Headroom checks the key first and answers NOT_STORED (EXISTS in binary); both keep the item",
            ),
            (Path::Meta("ME"), _) => Some(
                "`ms ME` of a live key: memcached seeks room first, answers out of memory and \
                 drops the item; Headroom checks the key first, answers NS and keeps it (it was \
                 never to be replaced)",
            ),
            _ => None,
        }
    }

    /// Runs the store of `value` onto `key` (which holds `old`, with CAS `cas`); returns its
    /// reply in short form.
    fn run(self, server: SocketAddr, key: &str, value: &[u8], cas: u64) -> String {
        let len = value.len();
        let text = |line: String| Text::connect(server).store(&line, value);
        let binary = |opcode: u8, extras: &[u8], cas: u64| {
            let mut c = Client::connect(server);
            c.send(&frame(opcode, extras, key.as_bytes(), value, cas, 7));
            // A quiet store answers only a failure: the NOOP after it says when it is done.
            c.send(&frame(0x0a, &[], &[], &[], 0, 8));
            let r = c.recv().expect("a reply");
            if r.opaque == 8 {
                "quiet".to_string()
            } else {
                format!("status {:#x}", r.status)
            }
        };
        match self {
            Path::TextSet => text(format!("set {key} 0 0 {len}")),
            Path::TextCas => text(format!("cas {key} 0 0 {len} {cas}")),
            Path::TextAdd => text(format!("add {key} 0 0 {len}")),
            Path::TextReplace => text(format!("replace {key} 0 0 {len}")),
            Path::TextAppend => text(format!("append {key} 0 0 {len}")),
            Path::TextPrepend => text(format!("prepend {key} 0 0 {len}")),
            Path::Meta(flags) => {
                let flags = flags.replace('C', &format!("C{cas}"));
                text(format!("ms {key} {len} {flags}").trim_end().to_string())
            }
            Path::BinarySet => binary(0x01, &set_extras(0, 0), 0),
            Path::BinarySetQ => binary(0x11, &set_extras(0, 0), 0),
            Path::BinarySetCas => binary(0x01, &set_extras(0, 0), cas),
            Path::BinaryAdd => binary(0x02, &set_extras(0, 0), 0),
            Path::BinaryReplace => binary(0x03, &set_extras(0, 0), 0),
            Path::BinaryAppend => binary(0x0e, &[], 0),
            Path::BinaryPrepend => binary(0x0f, &[], 0),
        }
    }
}

/// Fills the server with `fill_bytes` values under `prefix` until a store is refused; returns
/// the keys stored.
fn fill_until_refused(server: SocketAddr, prefix: &str, fill_bytes: usize) -> Vec<String> {
    let mut t = Text::connect(server);
    let value = pattern(9, fill_bytes);
    let mut keys = Vec::new();
    for i in 0..10_000 {
        let key = format!("{prefix}.fill{i}");
        let reply = t.store(&format!("set {key} 0 0 {fill_bytes}"), &value);
        if reply != "STORED" {
            assert_eq!(reply, "SERVER_ERROR out of memory storing object");
            return keys;
        }
        keys.push(key);
    }
    panic!("10,000 values of {fill_bytes} bytes and no refusal");
}

/// One path on one server: an `old_bytes` value under the key, the server filled until a
/// store is refused (for [`Refusal::Full`]), then the path's store of `new_bytes`. Returns its
/// reply and what the key holds after, and leaves the server as it found it (`settled` waits
/// for that).
fn overwrite_refused(
    server: SocketAddr,
    (path, refusal): (Path, Refusal),
    case: usize,
    (old_bytes, new_bytes): (usize, usize),
    settled: &dyn Fn(),
) -> (String, After) {
    let key = format!("case{case}");
    let old = pattern(case as u64, old_bytes);
    let new = pattern(1000 + case as u64, new_bytes);
    let mut t = Text::connect(server);
    assert_eq!(
        t.store(&format!("set {key} 0 0 {old_bytes}"), &old),
        "STORED"
    );
    let (_, cas) = t.gets(&key).expect("the old value");
    let filled = match refusal {
        Refusal::Full { fill_bytes } => fill_until_refused(server, &key, fill_bytes),
        Refusal::TooLarge => Vec::new(),
    };
    let reply = path.run(server, &key, &new, cas);
    let after = match Text::connect(server).gets(&key) {
        None => After::Missing,
        Some((value, _)) if value == old => After::OldValue,
        Some((value, _)) if value == new => After::NewValue,
        Some((value, _)) => panic!("{path:?}: a value of {} bytes, neither", value.len()),
    };
    for key in filled.iter().chain([&key]) {
        t.delete(key);
    }
    settled();
    (reply, after)
}

/// Runs every path on each server and holds Headroom to the rule and to memcached's answers
/// (`theirs`, when there is a memcached to compare with).
fn every_path(
    refusal: Refusal,
    sizes: (usize, usize),
    headroom: &Server,
    memcached: Option<&Memcached>,
) {
    let mut failures = Vec::new();
    for (case, &path) in Path::ALL.iter().enumerate() {
        let case = case + 100 * matches!(refusal, Refusal::TooLarge) as usize;
        let ours = overwrite_refused(headroom.addr, (path, refusal), case, sizes, &|| {
            segments_empty(headroom)
        });
        let expected = path.expected(refusal);
        if ours.1 != expected {
            failures.push(format!(
                "{path:?}: the key is {:?} after a refused store, not {expected:?} (reply {:?})",
                ours.1, ours.0
            ));
        }
        let Some(memcached) = memcached else {
            println!("{path:?}: {ours:?}");
            continue;
        };
        let theirs = overwrite_refused(memcached.addr, (path, refusal), case, sizes, &|| {});
        println!("{path:?}: memcached {theirs:?}, headroom {ours:?}");
        match path.known_difference(refusal) {
            Some(why) => println!("  differs from memcached on purpose: {why}"),
            None if theirs != ours => {
                failures.push(format!("{path:?}: memcached {theirs:?}, headroom {ours:?}"))
            }
            None => {}
        }
    }
    assert!(failures.is_empty(), "{refusal:?}:\n{}", failures.join("\n"));
}

/// Waits until no segment extent is in use: deletes hand extents back to the placement master
/// after they answer.
fn segments_empty(server: &Server) {
    let mut c = server.client();
    let deadline = Instant::now() + Duration::from_secs(10);
    while c.segment_used() != 0 {
        assert!(Instant::now() < deadline, "segment space never came back");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn memcached_or_skip() -> Option<Memcached> {
    let Some(program) = peers_memcached() else {
        assert!(
            std::env::var_os("HEADROOM_REQUIRE_ROOT_TESTS").is_none(),
            "memcached 1.6.45 is not built (scripts/install-deps builds it)"
        );
        println!("skipped: memcached 1.6.45 is not built");
        return None;
    };
    Some(Memcached::start(&program, &["-t", "1", "-m", "8", "-M"]))
}

/// Every path side by side with no room: memcached 1.6.45 with 8 MiB and `-M` (its 64 KiB slab
/// class full), Headroom with `--ram-head 4K` and a 4 MiB memory segment (full), so that in
/// both a small value is overwritten by a 64 KiB one that finds no room.
#[test]
fn a_store_refused_for_want_of_room_leaves_what_memcached_leaves() {
    let Some(memcached) = memcached_or_skip() else {
        return;
    };
    let headroom = Server::start(&[
        "--threads",
        "1",
        "--ram-head",
        "4K",
        "--segment",
        "mem:size=4M,numa=0",
    ]);
    let full = Refusal::Full {
        fill_bytes: 64 * KIB,
    };
    every_path(full, (100, 64 * KIB), &headroom, Some(&memcached));
}

/// Every path side by side with a value over the 1 MiB item limit (memcached counts its item
/// header in, so 2,000,000 bytes is over it in both).
#[test]
fn a_store_refused_as_too_large_leaves_what_memcached_leaves() {
    let Some(memcached) = memcached_or_skip() else {
        return;
    };
    let headroom = Server::start(&["--threads", "1", "--max-item-size", "1M"]);
    every_path(
        Refusal::TooLarge,
        (100, 2_000_000),
        &headroom,
        Some(&memcached),
    );
}

/// Above memcached's 1 MiB item limit there is nothing to compare with: the same rule, with a
/// 1 MiB value overwritten by a 3 MiB one in a full 16 MiB file segment (the defaults, so
/// `--segment-eviction none`).
#[test]
fn a_refused_large_store_drops_the_old_value_by_the_same_rule() {
    let segment = common::fresh_temp_path("refused-store-segment");
    let spec = format!("file:{},size=16M", segment.display());
    let headroom = Server::start(&["--threads", "2", "--segment", &spec]);
    let full = Refusal::Full { fill_bytes: MIB };
    every_path(full, (MIB, 3 * MIB), &headroom, None);
}

/// A reader in the middle of the old value keeps getting it whole after a refused SET drops
/// it, and its space comes back only when that reader is done.
#[test]
fn a_dropped_value_is_freed_when_its_last_reader_is_done() {
    let headroom = Server::start(&["--threads", "2", "--segment", "mem:size=32M,numa=0"]);
    let old = pattern(1, 8 * MIB);
    let mut t = Text::connect(headroom.addr);
    assert_eq!(t.store(&format!("set k 0 0 {}", old.len()), &old), "STORED");
    // A reader that asks for the value and reads only its first bytes.
    let mut reader = Text::connect(headroom.addr);
    reader.stream.write_all(b"get k\r\n").unwrap();
    assert_eq!(reader.line(), format!("VALUE k 0 {}", old.len()));
    let mut first = vec![0u8; 1000];
    reader.reader.read_exact(&mut first).unwrap();
    assert_eq!(first, old[..1000]);

    let filled = fill_until_refused(headroom.addr, "filler", 4 * MIB);
    let used_full = headroom.client().segment_used();
    let new = pattern(2, 12 * MIB);
    let reply = t.store(&format!("set k 0 0 {}", new.len()), &new);
    assert_eq!(reply, "SERVER_ERROR out of memory storing object");
    assert_eq!(Text::connect(headroom.addr).gets("k"), None, "stale value");
    // The dropped value's extent is still held for the reader.
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(headroom.client().segment_used(), used_full);

    let mut rest = vec![0u8; old.len() - first.len() + 2];
    reader.reader.read_exact(&mut rest).unwrap();
    assert!(
        rest[..rest.len() - 2] == old[1000..],
        "the reader's value changed"
    );
    assert_eq!(reader.line(), "END");
    let deadline = Instant::now() + Duration::from_secs(10);
    while headroom.client().segment_used() != used_full - old.len() as u64 {
        assert!(
            Instant::now() < deadline,
            "the dropped value's space never came back: {} of {used_full} in use",
            headroom.client().segment_used()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(filled);
}

/// A store whose body never arrives whole replaced nothing, so the old value stays: the client
/// goes away mid-body, the body stops past `--body-timeout`, or (text) the data block does not
/// end in `\r\n`. Small and large values, text and binary.
#[test]
fn a_store_whose_body_never_arrives_whole_keeps_the_old_value() {
    let headroom = Server::start(&[
        "--threads",
        "2",
        "--segment",
        "mem:size=64M,numa=0",
        "--body-timeout",
        "1",
    ]);
    let addr = headroom.addr;
    for (case, new_bytes) in [100, 3 * MIB].into_iter().enumerate() {
        let old = pattern(case as u64, 2 * MIB);
        let key = format!("k{case}");
        let mut t = Text::connect(addr);
        assert_eq!(
            t.store(&format!("set {key} 0 0 {}", old.len()), &old),
            "STORED"
        );
        let new = pattern(100 + case as u64, new_bytes);
        let half = &new[..new_bytes / 2];

        // Text, the client gone mid-body.
        let mut gone = TcpStream::connect(addr).unwrap();
        gone.write_all(format!("set {key} 0 0 {new_bytes}\r\n").as_bytes())
            .unwrap();
        gone.write_all(half).unwrap();
        drop(gone);
        // Binary, the client gone mid-body.
        let mut gone = TcpStream::connect(addr).unwrap();
        let mut head = frame(0x01, &set_extras(0, 0), key.as_bytes(), &[], 0, 1);
        head[8..12].copy_from_slice(&((8 + key.len() + new_bytes) as u32).to_be_bytes());
        gone.write_all(&head).unwrap();
        gone.write_all(half).unwrap();
        drop(gone);
        // Text, a bad data chunk.
        let mut bad = Text::connect(addr);
        let mut request = format!("set {key} 0 0 {new_bytes}\r\n").into_bytes();
        request.extend_from_slice(&new);
        request.extend_from_slice(b"XY");
        bad.stream.write_all(&request).unwrap();
        assert_eq!(bad.line(), "CLIENT_ERROR bad data chunk");
        // Binary, a large value's body stopped: the server closes the connection after the
        // body timeout.
        if new_bytes > MIB {
            let mut stalled = Client::connect(addr);
            stalled.send(&head);
            stalled.send(half);
            assert!(stalled.closed(), "a stalled body was not closed");
        }

        std::thread::sleep(Duration::from_millis(200));
        let (value, _) = Text::connect(addr).gets(&key).expect("the old value");
        assert!(value == old, "{key}: the old value changed");
    }
}
