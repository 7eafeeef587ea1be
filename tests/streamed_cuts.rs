//! A streamed value cut at every stage, in each protocol: a large SET (binary, text `set`, meta
//! `ms`) whose client goes away in its command, right after it, inside the value, before its
//! `\r\n` and inside it, and a large GET (binary, text, meta `mg v`) whose client goes away
//! inside the reply's header, its head from RAM or the rest from the segment. Seeded cut points
//! (the seed printed); after every cut the key holds its old value whole, and at the end no
//! segment space, lease or pool chunk is left held.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::server::{frame, set_extras, Client, Server};
use common::{pattern, Rng};

const MIB: usize = 1 << 20;
/// Large enough to stream (over the 256 KiB `--ram-head`) in several 1 MiB chunks.
const VALUE_BYTES: usize = 3 * MIB + 4321;

#[derive(Clone, Copy, Debug)]
enum Protocol {
    Binary,
    Text,
    Meta,
}

const PROTOCOLS: [Protocol; 3] = [Protocol::Binary, Protocol::Text, Protocol::Meta];

/// A store of `value` under `key`: (the bytes before the value, the bytes after it).
fn store_request(protocol: Protocol, key: &str, value_len: usize) -> (Vec<u8>, Vec<u8>) {
    match protocol {
        Protocol::Binary => {
            let mut head = frame(0x01, &set_extras(0, 0), key.as_bytes(), &[], 0, 1);
            head[8..12].copy_from_slice(&((8 + key.len() + value_len) as u32).to_be_bytes());
            (head, Vec::new())
        }
        Protocol::Text => (
            format!("set {key} 0 0 {value_len}\r\n").into_bytes(),
            b"\r\n".to_vec(),
        ),
        Protocol::Meta => (
            format!("ms {key} {value_len}\r\n").into_bytes(),
            b"\r\n".to_vec(),
        ),
    }
}

fn get_request(protocol: Protocol, key: &str) -> Vec<u8> {
    match protocol {
        Protocol::Binary => frame(0x00, &[], key.as_bytes(), &[], 0, 0),
        Protocol::Text => format!("get {key}\r\n").into_bytes(),
        Protocol::Meta => format!("mg {key} v\r\n").into_bytes(),
    }
}

/// Sends `bytes` and goes away.
fn send_and_leave(server: &Server, bytes: &[u8]) {
    let mut stream = TcpStream::connect(server.addr).unwrap();
    // A large write may meet a server already gone from it: what matters is the server after.
    let _ = stream.write_all(bytes);
    drop(stream);
}

/// The key's value over a fresh binary connection.
fn value_of(server: &Server, key: &str) -> Option<Vec<u8>> {
    let r = server.client().get(key.as_bytes());
    (r.status == 0).then_some(r.value)
}

/// Waits until `check` holds, for up to 10 s (a cut connection's clean-up runs on the server's
/// own time).
fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !check() {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn cuts(seed: u64) {
    let server = Server::start(&["--threads", "2", "--segment", "mem:size=64M,numa=0"]);
    let mut rng = Rng::new(seed);
    let old = pattern(seed, VALUE_BYTES);
    let new = pattern(seed + 1, VALUE_BYTES);
    let mut c = server.client();
    for protocol in PROTOCOLS {
        let key = format!("cut-{protocol:?}");
        assert_eq!(c.set_streamed(0x01, key.as_bytes(), &old, 0).status, 0);
        let (head, tail) = store_request(protocol, &key, new.len());
        let mut whole = head.clone();
        whole.extend_from_slice(&new);
        whole.extend_from_slice(&tail);
        // Where the client goes away: inside the command, right after it, inside the value
        // (in its first chunk and further on), at its end, and inside its `\r\n`.
        let mut stages = vec![
            ("command", rng.between(1, head.len() as u64 - 1) as usize),
            ("after the command", head.len()),
            (
                "first chunk",
                head.len() + rng.between(1, MIB as u64) as usize,
            ),
            (
                "value",
                head.len() + rng.between(MIB as u64, new.len() as u64 - 1) as usize,
            ),
            ("before its last byte", head.len() + new.len() - 1),
        ];
        // Text and meta: the value whole, its `\\r\\n` not, or half of it.
        if !tail.is_empty() {
            stages.push(("before the \\r\\n", head.len() + new.len()));
            stages.push(("inside the \\r\\n", head.len() + new.len() + 1));
        }
        for (stage, cut) in stages {
            send_and_leave(&server, &whole[..cut]);
            // The server takes the cut in its own time: its verdict is the key, read after.
            std::thread::sleep(Duration::from_millis(30));
            let got = value_of(&server, &key);
            assert!(
                got.as_deref() == Some(&old[..]),
                "{protocol:?} SET cut {stage} (at byte {cut}, seed {seed}): the key holds {:?} bytes, not the old value",
                got.map(|v| v.len())
            );
        }
        // GETs cut inside the header, the head from RAM, and the rest from the segment.
        let request = get_request(protocol, &key);
        for (stage, keep) in [
            ("header", rng.between(1, 8) as usize),
            ("head", rng.between(64, 256 << 10) as usize),
            ("segment", rng.between(1 << 20, old.len() as u64) as usize),
        ] {
            let mut stream = TcpStream::connect(server.addr).unwrap();
            stream.write_all(&request).unwrap();
            let mut got = vec![0u8; keep];
            stream.read_exact(&mut got).unwrap();
            drop(stream);
            assert!(
                value_of(&server, &key).as_deref() == Some(&old[..]),
                "{protocol:?} GET cut in its {stage} (seed {seed}) changed the value"
            );
        }
        // And whole, through the same paths, once more.
        let mut stream = TcpStream::connect(server.addr).unwrap();
        stream.write_all(&whole).unwrap();
        let mut reply = [0u8; 4];
        stream.read_exact(&mut reply[..2]).unwrap();
        drop(stream);
        eventually(&format!("{protocol:?}: the whole SET never landed"), || {
            value_of(&server, &key).as_deref() == Some(&new[..])
        });
    }
    // Nothing is left held: the three values' space only, every pool chunk home.
    let per_value = (VALUE_BYTES as u64).next_multiple_of(4096);
    eventually("segment space left held by cut streams", || {
        c.segment_used() == 3 * per_value
    });
    let on_ring = std::env::var("HEADROOM_TEST_IO_RING").map_or(true, |v| v != "off");
    if on_ring {
        eventually("pool chunks left out by cut streams", || {
            (0..2).all(|shard| {
                c.stat("io", &format!("shard{shard}_pool_chunks_free"))
                    == c.stat("io", &format!("shard{shard}_pool_chunks"))
            })
        });
    }
    let mut served = Client::connect(server.addr);
    assert_eq!(served.set(b"after", b"all", 0, 0).status, 0);
}

#[test]
fn a_streamed_value_cut_at_every_stage_leaves_the_old_value_and_nothing_held() {
    common::for_each_seed("streamed_cuts", 3, cuts);
}
