//! Fuzzing the text/meta decoder with seeded streams: generated commands of every kind (valid,
//! malformed, oversized, long lines), mutated, decoded as a connection decodes them. The decoder
//! never panics, never reports consuming more than it was given, always makes progress or asks
//! for more bytes than it has, and the commands a stream decodes to do not depend on how it
//! arrives: whole, byte by byte, split at every point, or in random chunks. The decoder is driven
//! as a connection drives it, resuming the search for a line's end where the last one stopped
//! (`LineScan`, the state the server's connection keeps, moved by `LineScan::consumed` as the
//! connection's `consume` moves it), and that search examines each byte about once however the
//! stream is split.
//! Seeds are printed; replay one with `HEADROOM_SEED=<seed>`.

mod common;

use common::{for_each_seed, Rng};
use headroom::proto::text::{LINE_MAX_BYTES, MULTIGET_LINE_MAX_BYTES};
use headroom::proto::{
    decode_text, decode_text_resuming, LineScan, TextCommand, TextDecoded, KEY_MAX_BYTES,
};

/// Values over this are too large.
const MAX_VALUE: usize = 256;
/// Values over this are streamed.
const STREAM_FROM: usize = 96;

fn key(rng: &mut Rng) -> Vec<u8> {
    const ALPHABET: &[u8] = b"abcxyzKEY019_:-+/=";
    let len = match rng.below(20) {
        0 => 250,
        1 => 251,
        2 => rng.between(1, 40),
        _ => rng.between(1, 6),
    } as usize;
    (0..len)
        .map(|_| match rng.below(40) {
            0 => 0x01,
            1 => b'\t',
            2 => 0xfe,
            _ => *rng.pick(ALPHABET).unwrap(),
        })
        .collect()
}

fn number(rng: &mut Rng) -> Vec<u8> {
    const ODD: &[&str] = &[
        "0",
        "1",
        "-1",
        "-0",
        "+5",
        "x",
        "5x",
        "4294967296",
        "4294967298",
        "18446744073709551615",
        "18446744073709551616",
        "-18446744073709551615",
        "9223372036854775808",
        "2147483646",
        "01",
        "1\t",
    ];
    if rng.chance(25) {
        rng.pick(ODD).unwrap().as_bytes().to_vec()
    } else {
        rng.below(1000).to_string().into_bytes()
    }
}

fn end_of_line(rng: &mut Rng) -> &'static [u8] {
    match rng.below(12) {
        0 => b"\n",
        1 => b"\r\r\n",
        _ => b"\r\n",
    }
}

/// A data block of `len` bytes and its terminator (sometimes the wrong length or terminator).
fn data_block(rng: &mut Rng, len: usize) -> Vec<u8> {
    let actual = match rng.below(12) {
        0 => len + 1,
        1 => len.saturating_sub(1),
        _ => len,
    };
    let mut block: Vec<u8> = (0..actual)
        .map(|_| match rng.below(30) {
            0 => b'\n',
            1 => b'\r',
            _ => b'a' + rng.below(26) as u8,
        })
        .collect();
    block.extend_from_slice(if rng.chance(92) { b"\r\n" } else { b"\n\n" });
    block
}

fn value_len(rng: &mut Rng) -> usize {
    match rng.below(10) {
        0 => rng.between(MAX_VALUE as u64 + 1, 600) as usize,
        1 | 2 => rng.between(STREAM_FROM as u64 + 1, MAX_VALUE as u64) as usize,
        _ => rng.below(20) as usize,
    }
}

const META_FLAGS: &[&str] = &[
    "b",
    "c",
    "f",
    "h",
    "k",
    "l",
    "O1",
    "Oabc",
    "q",
    "s",
    "t",
    "u",
    "v",
    "N30",
    "R10",
    "T-1",
    "T60",
    "C5",
    "F7",
    "I",
    "MS",
    "ME",
    "MA",
    "MP",
    "MR",
    "M+",
    "MD",
    "MZ",
    "Mxx",
    "J5",
    "D3",
    "Dx",
    "E1",
    "S1",
    "x",
    "G0",
    "G*",
    "H",
    "U1,2",
    "X3",
    "R2",
    "P",
    "L",
    "Tx",
    "O0123456789012345678901234567890123",
];

fn meta_flags(rng: &mut Rng) -> Vec<u8> {
    let count = if rng.chance(5) { 20 } else { rng.below(6) };
    let mut out = Vec::new();
    for _ in 0..count {
        out.push(b' ');
        out.extend_from_slice(rng.pick(META_FLAGS).unwrap().as_bytes());
    }
    out
}

/// One command (with its data block for storage commands), mostly well formed.
fn command(rng: &mut Rng) -> Vec<u8> {
    let mut line: Vec<u8> = Vec::new();
    let mut block = None;
    match rng.below(22) {
        0..=2 => {
            let name = *rng.pick(&["get", "gets", "gat", "gats", "bget"]).unwrap();
            line.extend_from_slice(name.as_bytes());
            if name.starts_with("gat") {
                line.push(b' ');
                line.extend(number(rng));
            }
            let keys = if rng.chance(3) { 40 } else { rng.below(5) };
            for _ in 0..keys {
                line.push(b' ');
                line.extend(key(rng));
            }
        }
        3..=6 => {
            let name = *rng
                .pick(&["set", "add", "replace", "append", "prepend", "cas"])
                .unwrap();
            let len = value_len(rng);
            line.extend_from_slice(name.as_bytes());
            line.push(b' ');
            line.extend(key(rng));
            line.push(b' ');
            line.extend(number(rng));
            line.push(b' ');
            line.extend(number(rng));
            line.push(b' ');
            line.extend(if rng.chance(90) {
                len.to_string().into_bytes()
            } else {
                number(rng)
            });
            if name == "cas" || rng.chance(5) {
                line.push(b' ');
                line.extend(number(rng));
            }
            if rng.chance(20) {
                line.extend_from_slice(b" noreply");
            }
            block = Some(data_block(rng, len));
        }
        7 => {
            line.extend_from_slice(if rng.chance(50) { b"incr " } else { b"decr " });
            line.extend(key(rng));
            line.push(b' ');
            line.extend(number(rng));
            if rng.chance(30) {
                line.extend_from_slice(b" noreply");
            }
        }
        8 => {
            line.extend_from_slice(b"delete ");
            line.extend(key(rng));
            let tail = *rng
                .pick(&[
                    "",
                    " 0",
                    " noreply",
                    " 0 noreply",
                    " 1",
                    " x y",
                    " 1 noreply",
                ])
                .unwrap();
            line.extend_from_slice(tail.as_bytes());
        }
        9 => {
            line.extend_from_slice(b"touch ");
            line.extend(key(rng));
            line.push(b' ');
            line.extend(number(rng));
        }
        10 => {
            let simple = [
                "flush_all",
                "flush_all 10",
                "flush_all noreply",
                "flush_all x",
                "verbosity 1",
                "verbosity",
                "version",
                "quit",
                "stats",
                "stats items",
                "stats detail",
                "stats detail dump",
                "shutdown",
                "watch",
                "mn",
                "me k",
                "me YQ== b",
                "xyz",
                "",
                "GET / HTTP/1.1",
            ];
            line.extend_from_slice(rng.pick(&simple).unwrap().as_bytes());
        }
        11..=13 => {
            line.extend_from_slice(rng.pick(&[&b"mg "[..], b"md ", b"ma "]).unwrap());
            line.extend(if rng.chance(10) {
                b"YWJj".to_vec()
            } else {
                key(rng)
            });
            line.extend(meta_flags(rng));
        }
        14..=16 => {
            let len = value_len(rng);
            line.extend_from_slice(b"ms ");
            line.extend(key(rng));
            line.push(b' ');
            line.extend(if rng.chance(90) {
                len.to_string().into_bytes()
            } else {
                number(rng)
            });
            line.extend(meta_flags(rng));
            block = Some(data_block(rng, len));
        }
        17 => {
            // A long line, a long multiget, or a line with no end yet.
            let len = rng.between(LINE_MAX_BYTES as u64 - 4, LINE_MAX_BYTES as u64 + 40) as usize;
            let head: &[u8] = rng
                .pick(&[&b"get "[..], b"gets ", b"set ", b" get ", b""])
                .unwrap();
            line.extend_from_slice(head);
            while line.len() < len {
                line.extend_from_slice(b"k ");
            }
        }
        _ => {
            let len = rng.below(12) as usize;
            line.extend((0..len).map(|_| *rng.pick(b"ab \r\0\x7f\x80gms").unwrap()));
        }
    }
    line.extend_from_slice(end_of_line(rng));
    if let Some(block) = block {
        line.extend(block);
    }
    line
}

fn stream(rng: &mut Rng) -> Vec<u8> {
    let commands = rng.between(1, 25);
    let mut stream: Vec<u8> = (0..commands).flat_map(|_| command(rng)).collect();
    for _ in 0..rng.below(4) {
        if stream.is_empty() {
            break;
        }
        let at = rng.below(stream.len() as u64) as usize;
        match rng.below(4) {
            0 => stream[at] = *rng.pick(b" \r\n\0xk0").unwrap(),
            1 => stream.insert(at, *rng.pick(b" \r\n\0").unwrap()),
            2 => {
                stream.remove(at);
            }
            _ => stream.truncate(at),
        }
    }
    stream
}

/// What a connection does with a stream arriving in `chunks`: decode (resuming the line-end
/// search across reads), skip, stream large values, stop at a close. Returns what it decoded, as
/// text, checking the decoder's promises on the way.
fn drive(stream: &[u8], chunks: &mut dyn FnMut() -> usize) -> Vec<String> {
    let mut buffered: Vec<u8> = Vec::new();
    let mut scan = LineScan::default();
    let mut decodes: u64 = 0;
    let mut fed = 0;
    let mut skip: u64 = 0;
    // A large value being streamed: bytes still to take (value and its two-byte end), and those
    // taken.
    let mut streaming: Option<(usize, Vec<u8>)> = None;
    let mut events = Vec::new();
    loop {
        if skip > 0 {
            let drop = (skip as usize).min(buffered.len());
            buffered.drain(..drop);
            scan.consumed(drop);
            skip -= drop as u64;
        }
        if let Some((left, taken)) = &mut streaming {
            let take = (*left).min(buffered.len());
            taken.extend(buffered.drain(..take));
            scan.consumed(take);
            *left -= take;
            if *left == 0 {
                let ok = taken.ends_with(b"\r\n");
                events.push(format!(
                    "large value {} end ok {ok}",
                    taken[..taken.len() - 2].escape_ascii()
                ));
                streaming = None;
            }
        }
        let ready = skip == 0 && streaming.is_none();
        let mut more = !ready;
        if ready {
            let have = buffered.len();
            decodes += 1;
            // Each byte fed is searched once; a found line's `\n` once more per decode.
            let decoded = decode_text_resuming(&buffered, &mut scan, MAX_VALUE, STREAM_FROM);
            assert!(
                scan.bytes_examined <= fed as u64 + decodes,
                "{} bytes examined for {fed} fed in {decodes} decodes",
                scan.bytes_examined
            );
            match decoded {
                TextDecoded::Incomplete { needed } => {
                    assert!(needed > have, "incomplete asks for {needed} with {have}");
                    assert!(
                        needed <= MULTIGET_LINE_MAX_BYTES + MAX_VALUE + 2,
                        "asks for {needed}"
                    );
                    more = true;
                }
                TextDecoded::Command { command, consumed } => {
                    assert!(
                        consumed > 0 && consumed <= have,
                        "consumed {consumed} of {have}"
                    );
                    check(&command);
                    events.push(format!("{command:?} ({consumed})"));
                    buffered.drain(..consumed);
                    scan.consumed(consumed);
                }
                TextDecoded::LargeStore { store, consumed } => {
                    assert!(
                        consumed > 0 && consumed <= have,
                        "consumed {consumed} of {have}"
                    );
                    assert!(store.value_len > STREAM_FROM && store.value_len <= MAX_VALUE);
                    assert!(store.key.len() <= KEY_MAX_BYTES);
                    events.push(format!("{store:?} ({consumed})"));
                    streaming = Some((store.value_len + 2, Vec::new()));
                    buffered.drain(..consumed);
                    scan.consumed(consumed);
                }
                TextDecoded::TooLarge {
                    key,
                    drop_existing,
                    reply,
                    skip: s,
                } => {
                    assert!(s as usize > MAX_VALUE, "too large skips its value");
                    assert!(key.len() <= KEY_MAX_BYTES);
                    events.push(format!(
                        "too large {key:?} {drop_existing} {} {s}",
                        reply.escape_ascii()
                    ));
                    skip = s;
                }
                TextDecoded::Error {
                    reply,
                    skip: s,
                    close,
                } => {
                    events.push(format!("error {} {s} {close}", reply.escape_ascii()));
                    if close {
                        return events;
                    }
                    assert!(s > 0, "a kept connection moves past the command");
                    skip = s;
                }
            }
        }
        if more {
            if fed == stream.len() {
                return events;
            }
            let take = chunks().clamp(1, stream.len() - fed);
            buffered.extend_from_slice(&stream[fed..fed + take]);
            fed += take;
        }
    }
}

/// Promises about decoded commands.
fn check(command: &TextCommand) {
    match command {
        TextCommand::Get { keys, .. } => {
            assert!(keys
                .iter()
                .all(|k| !k.is_empty() && k.len() <= KEY_MAX_BYTES));
        }
        TextCommand::Store { store, value } => {
            assert_eq!(value.len(), store.value_len);
            assert!(value.len() <= STREAM_FROM);
            assert!(store.key.len() <= KEY_MAX_BYTES);
        }
        TextCommand::Run { command, .. } => {
            assert!(command.key().is_none_or(|key| key.len() <= KEY_MAX_BYTES))
        }
        TextCommand::MetaGet { key, .. }
        | TextCommand::MetaDelete { key, .. }
        | TextCommand::MetaArith { key, .. }
        | TextCommand::MetaDebug { key } => assert!(key.len() <= KEY_MAX_BYTES),
        _ => {}
    }
}

#[test]
fn streams_decode_the_same_however_they_are_split() {
    for_each_seed(
        "streams_decode_the_same_however_they_are_split",
        24,
        |seed| {
            let mut rng = Rng::new(seed);
            for _ in 0..4 {
                let stream = stream(&mut rng);
                let whole = drive(&stream, &mut || usize::MAX);
                let bytewise = drive(&stream, &mut || 1);
                assert_eq!(whole, bytewise, "byte by byte");
                for cut in 0..=stream.len() {
                    let mut first = true;
                    let split = drive(&stream, &mut || {
                        if std::mem::take(&mut first) {
                            cut.max(1)
                        } else {
                            usize::MAX
                        }
                    });
                    assert_eq!(whole, split, "split at {cut}");
                }
                let mut chunk_rng = Rng::new(rng.next_u64());
                let chunked = drive(&stream, &mut || chunk_rng.between(1, 64) as usize);
                assert_eq!(whole, chunked, "random chunks");
            }
        },
    );
}

#[test]
fn arbitrary_bytes_never_panic() {
    for_each_seed("arbitrary_bytes_never_panic", 64, |seed| {
        let mut rng = Rng::new(seed);
        for _ in 0..200 {
            let len = rng.below(3000) as usize;
            let bytes: Vec<u8> = (0..len)
                .map(|_| match rng.below(4) {
                    0 => rng.next_u64() as u8,
                    _ => *rng.pick(b"gesmtadcv 0123456789\r\nkOqbNTFCMJD-+").unwrap(),
                })
                .collect();
            let mut chunks = Rng::new(rng.next_u64());
            drive(&bytes, &mut || chunks.between(1, 300) as usize);
        }
    });
}

#[test]
fn valid_commands_decode_whole() {
    // Every generated storage command with a clean value decodes to that value.
    for_each_seed("valid_commands_decode_whole", 32, |seed| {
        let mut rng = Rng::new(seed);
        for _ in 0..500 {
            let len = rng.below(STREAM_FROM as u64 + 1) as usize;
            let value: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
            let k: Vec<u8> = (0..rng.between(1, 250))
                .map(|_| b'!' + rng.below(90) as u8)
                .collect();
            let flags = rng.next_u64() as u32;
            let mut bytes =
                format!("set {} {flags} 0 {len}\r\n", String::from_utf8_lossy(&k)).into_bytes();
            bytes.extend_from_slice(&value);
            bytes.extend_from_slice(b"\r\n");
            match decode_text(&bytes, MAX_VALUE, STREAM_FROM) {
                TextDecoded::Command {
                    command: TextCommand::Store { store, value: v },
                    consumed,
                } => {
                    assert_eq!(
                        (&store.key[..], store.flags, v),
                        (&k[..], flags, &value[..])
                    );
                    assert_eq!(consumed, bytes.len());
                }
                other => panic!("{other:?}"),
            }
        }
    });
}
