//! Garbage over real connections: random, mutated and truncated frame streams on many
//! connections never crash the server or disturb a well-behaved client's data; and a text and
//! meta pipeline gets the same replies, byte for byte, whole or in random splits (1 byte at a
//! time included).

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

/// A text and meta pipeline that ends well framed: valid commands and refused ones (bad numbers,
/// lengths that lie by a few bytes, unknown commands, numbers that do not fit), values of
/// capital letters only, now and then a multiget longer than 2048 bytes; nothing whose answer depends on
/// the clock or closes the connection. Ends with blank lines (to fill a data block a lying
/// length left open) and `mn`.
fn split_pipeline(rng: &mut Rng) -> Vec<u8> {
    const NUMBERS: &[&str] = &[
        "0",
        "1",
        "-1",
        "1000",
        "x",
        "4294967296",
        "4294967298",
        "99999999999",
        "18446744073709551615",
        "-18446744073709551615",
    ];
    // Exptimes without `1`: an item that lives one second is gone or not depending on how
    // long the other server's pieces took, not on how the bytes were split.
    const EXPTIMES: &[&str] = &[
        "0",
        "-1",
        "1000",
        "x",
        "4294967296",
        "99999999999",
        "-18446744073709551615",
    ];
    const MG_FLAGS: &[&str] = &["v", "k", "f", "s", "q", "c", "O12", "N1000", "T1000", "u"];
    const MS_FLAGS: &[&str] = &[
        "q", "k", "c", "F7", "T1000", "T-1", "MA", "MP", "ME", "MR", "I",
    ];
    let key = |rng: &mut Rng| format!("k{}", rng.below(6));
    let value = |rng: &mut Rng, len: u64| -> String {
        // Capitals: a data block read as a command (after a refused line) is never one.
        (0..len)
            .map(|_| (b'A' + rng.below(26) as u8) as char)
            .collect()
    };
    let mut out = String::new();
    for _ in 0..rng.between(1, 30) {
        let k = key(rng);
        match rng.below(14) {
            0..=2 => {
                let command = pick(rng, &["set", "add", "replace", "append", "prepend"]);
                let len = rng.below(40);
                // Sometimes the length lies by a byte or three.
                let sent = match rng.below(10) {
                    0 => len + rng.between(1, 3),
                    1 => len.saturating_sub(rng.between(1, 3)),
                    _ => len,
                };
                let flags = if rng.chance(10) {
                    pick(rng, NUMBERS)
                } else {
                    "5"
                };
                let exptime = if rng.chance(10) {
                    pick(rng, EXPTIMES)
                } else {
                    "0"
                };
                let noreply = if rng.chance(20) { " noreply" } else { "" };
                let v = value(rng, sent);
                out += &format!("{command} {k} {flags} {exptime} {len}{noreply}\r\n{v}\r\n");
            }
            3 => {
                // A length that is refused (the line alone is skipped).
                let len = pick(
                    rng,
                    &[
                        "x",
                        "-1",
                        "4294967298",
                        "99999999999",
                        "18446744073709551615",
                    ],
                );
                out += &format!("set {k} 0 0 {len}\r\n");
            }
            4 => {
                let keys: Vec<String> = (0..rng.between(1, 5)).map(|_| key(rng)).collect();
                let command = pick(rng, &["get", "gets"]);
                out += &format!("{command} {}\r\n", keys.join(" "));
            }
            5 => {
                // A multiget past 2048 bytes, after blank lines that a data block whose
                // length lied short may eat into instead of the `get` (the rest of a long line
                // that is not a multiget would close the connection).
                let keys: Vec<String> = (0..rng.between(300, 900)).map(|_| key(rng)).collect();
                out += &format!("\r\n\r\nget {}\r\n", keys.join(" "));
            }
            6 => {
                let command = pick(rng, &["incr", "decr"]);
                out += &format!("{command} {k} {}\r\n", pick(rng, NUMBERS));
            }
            7 => out += &format!("delete {k}\r\n"),
            8 => out += &format!("touch {k} {}\r\n", pick(rng, &["0", "1000", "4294967296"])),
            9 => {
                let flags: Vec<&str> = (0..rng.below(5)).map(|_| pick(rng, MG_FLAGS)).collect();
                out += &format!("mg {k} {}\r\n", flags.join(" "));
            }
            10 => {
                let len = rng.below(30);
                let flags: Vec<&str> = (0..rng.below(4)).map(|_| pick(rng, MS_FLAGS)).collect();
                let v = value(rng, len);
                out += &format!("ms {k} {len} {}\r\n{v}\r\n", flags.join(" "));
            }
            11 => {
                let flags = pick(rng, &["", "q", "N0 J5", "D3 v", "MD v", "D-1"]);
                out += &format!("ma {k} {flags}\r\n");
            }
            // `C0`, never `C1`: CAS values carry the key's partition, and each server seeds
            // its key hash at random, so whether `C1` matches differs between the two servers.
            12 => out += &format!("md {k} {}\r\n", pick(rng, &["", "q", "k", "C0"])),
            // (No `mn` before the last: the reply is read up to its `MN`.)
            _ => out += pick(rng, &["bogus line\r\n", "\r\n", "verbosity 1\r\n"]),
        }
    }
    out += "\r\n\r\n\r\n\r\nmn\r\n";
    out.into_bytes()
}

/// Sends `pipeline` in chunks (whole when `chunks` gives more than is left) and returns the
/// replies up to the final `MN`, CAS values masked.
fn send_in_chunks(
    addr: std::net::SocketAddr,
    pipeline: &[u8],
    chunks: &mut dyn FnMut() -> usize,
) -> String {
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream.set_nodelay(true).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let reader = {
        let mut stream = stream.try_clone().unwrap();
        std::thread::spawn(move || {
            let mut reply = Vec::new();
            let mut buf = vec![0u8; 64 << 10];
            while !reply.ends_with(b"MN\r\n") {
                match stream.read(&mut buf) {
                    Ok(n) if n > 0 => reply.extend_from_slice(&buf[..n]),
                    end => panic!(
                        "{end:?} before the final MN, after {}",
                        String::from_utf8_lossy(&reply)
                    ),
                }
            }
            reply
        })
    };
    let mut sent = 0;
    let mut writes = 0;
    while sent < pipeline.len() {
        let take = chunks().clamp(1, pipeline.len() - sent);
        stream.write_all(&pipeline[sent..sent + take]).unwrap();
        sent += take;
        writes += 1;
        // Now and then the server surely reads what came so far on its own.
        if writes % 16 == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    let reply = reader
        .join()
        .unwrap_or_else(|_| panic!("no whole reply to {}", String::from_utf8_lossy(pipeline)));
    mask_cas(&String::from_utf8(reply).unwrap())
}

/// Replaces CAS values (a `gets` line's fifth word, a meta line's `c` token) with `CAS`.
fn mask_cas(reply: &str) -> String {
    reply
        .split("\r\n")
        .map(|line| {
            let words: Vec<&str> = line.split(' ').collect();
            if words[0] == "VALUE" && words.len() == 5 {
                return format!("{} CAS", words[..4].join(" "));
            }
            if matches!(words[0], "HD" | "VA" | "EN" | "NF" | "NS" | "EX") {
                let masked: Vec<&str> = words
                    .iter()
                    .map(|w| {
                        let digits = w.strip_prefix('c').unwrap_or("");
                        if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
                            "cCAS"
                        } else {
                            w
                        }
                    })
                    .collect();
                return masked.join(" ");
            }
            line.to_string()
        })
        .collect::<Vec<_>>()
        .join("\r\n")
}

#[test]
fn text_pipelines_answer_the_same_however_they_are_split() {
    // Two servers that see the same commands in the same order, one whole, one in pieces.
    let whole_server = Server::start(&["--threads", "2"]);
    let split_server = Server::start(&["--threads", "2"]);
    for_each_seed("text_pipelines_split", 12, |seed| {
        let mut rng = Rng::new(seed);
        for round in 0..4 {
            let pipeline = split_pipeline(&mut rng);
            let whole = send_in_chunks(whole_server.addr, &pipeline, &mut || usize::MAX);
            let mut chunk_rng = Rng::new(rng.next_u64());
            let byte_by_byte = round == 0;
            let split = send_in_chunks(split_server.addr, &pipeline, &mut || {
                if byte_by_byte || chunk_rng.chance(20) {
                    1
                } else {
                    chunk_rng.between(1, 200) as usize
                }
            });
            assert_eq!(
                whole,
                split,
                "round {round}: the replies differ for {}",
                String::from_utf8_lossy(&pipeline)
            );
        }
    });
}
