//! Garbage over real connections: random, mutated and truncated frame streams on many
//! connections never crash the server or disturb a well-behaved client's data.

mod common;

use std::io::{Read, Write};
use std::time::Duration;

use common::server::{frame, read_text_reply, set_extras, Server};
use common::{for_each_seed, Rng};

fn random_stream(rng: &mut Rng) -> Vec<u8> {
    let mut stream = Vec::new();
    for _ in 0..(1 + rng.below(12)) {
        let opcode = match rng.below(4) {
            0 => rng.below(256) as u8,
            _ => [
                0x00u8, 0x01, 0x02, 0x04, 0x05, 0x0e, 0x10, 0x1c, 0x1d, 0x11, 0x09,
            ][rng.below(11) as usize],
        };
        // FLUSH would (rightly) delete the canary: keep it out of the garbage.
        let opcode = if matches!(opcode, 0x08 | 0x18) {
            0x0a
        } else {
            opcode
        };
        let extras = vec![
            rng.below(256) as u8;
            [0usize, 4, 8, 20, rng.below(40) as usize][rng.below(5) as usize]
        ];
        let key: Vec<u8> = (0..rng.below(300))
            .map(|_| b'a' + rng.below(4) as u8)
            .collect();
        let value: Vec<u8> = (0..rng.below(5000)).map(|_| rng.below(256) as u8).collect();
        stream.extend(frame(
            opcode,
            &extras,
            &key,
            &value,
            rng.below(3),
            rng.below(1000) as u32,
        ));
    }
    for _ in 0..rng.below(5) {
        if !stream.is_empty() {
            let at = rng.below(stream.len() as u64) as usize;
            let byte = rng.below(256) as u8;
            // A mutated opcode byte must not become FLUSH either.
            stream[at] = if matches!(byte, 0x08 | 0x18) {
                0x0a
            } else {
                byte
            };
        }
    }
    let cut = rng.below(stream.len() as u64 + 1) as usize;
    stream.truncate(cut);
    stream
}

const CANARY_VALUE: &[u8] = b"the canary's value";

/// Starts a server holding a canary, sends 150 seeded `garbage` streams on connections of
/// their own, and checks the canary after each; returns the server and the canary's client.
fn garbage_never_hurts_the_canary(
    seeds_name: &str,
    garbage: fn(&mut Rng) -> Vec<u8>,
) -> (Server, common::server::Client) {
    let server = Server::start(&["--threads", "2", "--max-item-size", "4K"]);
    let mut canary = server.client();
    let set = frame(0x01, &set_extras(5, 0), b"canary", CANARY_VALUE, 0, 0);
    assert_eq!(canary.call(&set).status, 0);
    for_each_seed(seeds_name, 150, |seed| {
        let mut rng = Rng::new(seed);
        let mut stream = std::net::TcpStream::connect(server.addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        let _ = stream.write_all(&garbage(&mut rng));
        let mut sink = [0u8; 65536];
        let _ = stream.read(&mut sink);
        drop(stream);
        let r = canary.get(b"canary");
        assert_eq!(
            (r.status, r.value.as_slice()),
            (0, CANARY_VALUE),
            "seed {seed}"
        );
    });
    (server, canary)
}

#[test]
fn garbage_connections_never_hurt_the_server_or_other_clients() {
    let (server, mut canary) = garbage_never_hurts_the_canary("server_fuzz", random_stream);
    let stats = canary.stats("");
    assert!(stats
        .iter()
        .any(|(n, v)| n == "frame_unknown_opcode" && v != "0"));
    assert_eq!(server.stop().code(), Some(0));
}

fn pick(rng: &mut Rng, from: &[&'static str]) -> &'static str {
    from[rng.below(from.len() as u64) as usize]
}

/// A text or meta command stream: real command names with random keys, numbers (negative,
/// huge, malformed), flags and data blocks whose length may lie, then random bytes mutated and
/// the stream cut anywhere. (No `flush_all`: it would rightly delete the canary.)
fn random_text_stream(rng: &mut Rng) -> Vec<u8> {
    const COMMANDS: &[&str] = &[
        "set",
        "add",
        "replace",
        "append",
        "prepend",
        "cas",
        "get",
        "gets",
        "gat",
        "gats",
        "incr",
        "decr",
        "delete",
        "touch",
        "version",
        "verbosity",
        "stats",
        "mg",
        "ms",
        "md",
        "ma",
        "me",
        "mn",
        "bogus",
        "",
    ];
    const NUMBERS: &[&str] = &[
        "0",
        "1",
        "5",
        "-1",
        "100",
        "4096",
        "4097",
        "99999999999999999999",
        "1x",
        "-0",
        "2147483647",
        "18446744073709551615",
        " ",
    ];
    const FLAGS: &[&str] = &[
        "v", "k", "c", "f", "s", "t", "h", "l", "q", "u", "b", "O123", "T10", "T-1", "N30", "R5",
        "C1", "C0", "F7", "I", "MS", "ME", "MA", "MP", "MR", "MX", "D3", "J9", "M-", "E1", "S9",
        "noreply",
    ];
    let mut stream = Vec::new();
    for _ in 0..(1 + rng.below(12)) {
        let command = pick(rng, COMMANDS);
        let key: String = (0..rng.below(260))
            .map(|_| (b'a' + rng.below(4) as u8) as char)
            .collect();
        let mut line = format!("{command} {key}");
        for _ in 0..rng.below(6) {
            line.push(' ');
            line.push_str(if rng.below(2) == 0 {
                pick(rng, NUMBERS)
            } else {
                pick(rng, FLAGS)
            });
        }
        stream.extend_from_slice(line.as_bytes());
        stream.extend_from_slice(if rng.below(8) == 0 { b"\n" } else { b"\r\n" });
        if rng.below(2) == 0 {
            let data: Vec<u8> = (0..rng.below(5000)).map(|_| rng.below(256) as u8).collect();
            stream.extend(data);
            stream.extend_from_slice(b"\r\n");
        }
    }
    for _ in 0..rng.below(5) {
        if !stream.is_empty() {
            let at = rng.below(stream.len() as u64) as usize;
            stream[at] = rng.below(256) as u8;
        }
    }
    // Binary only when the first byte says so: keep these text.
    if stream.first() == Some(&0x80) {
        stream[0] = b'g';
    }
    let cut = rng.below(stream.len() as u64 + 1) as usize;
    stream.truncate(cut);
    stream
}

#[test]
fn text_garbage_never_hurts_the_server_or_other_clients() {
    let (server, mut canary) =
        garbage_never_hurts_the_canary("server_fuzz_text", random_text_stream);
    // The same server still answers text correctly.
    let mut text = std::net::TcpStream::connect(server.addr).unwrap();
    text.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    text.write_all(b"get canary\r\n").unwrap();
    let reply = read_text_reply(&mut text, b"END\r\n", 0);
    assert_eq!(reply, b"VALUE canary 5 18\r\nthe canary's value\r\nEND\r\n");
    let stats = canary.stats("");
    assert!(stats.iter().any(|(n, v)| n == "text_errors" && v != "0"));
    assert_eq!(server.stop().code(), Some(0));
}
