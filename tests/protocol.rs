//! Byte-level request/response pairs for every command and status, run against the real
//! binary with one shard and with several: the same answers memcached's binary protocol gives.

mod common;

use std::time::Duration;

use common::server::{arith_extras, frame, set_extras, Response, Server};

const GET: u8 = 0x00;
const SET: u8 = 0x01;
const ADD: u8 = 0x02;
const REPLACE: u8 = 0x03;
const DELETE: u8 = 0x04;
const INCR: u8 = 0x05;
const DECR: u8 = 0x06;
const QUIT: u8 = 0x07;
const FLUSH: u8 = 0x08;
const GETQ: u8 = 0x09;
const NOOP: u8 = 0x0a;
const VERSION: u8 = 0x0b;
const GETK: u8 = 0x0c;
const GETKQ: u8 = 0x0d;
const APPEND: u8 = 0x0e;
const PREPEND: u8 = 0x0f;
const STAT: u8 = 0x10;
const SETQ: u8 = 0x11;
const ADDQ: u8 = 0x12;
const DELETEQ: u8 = 0x14;
const INCRQ: u8 = 0x15;
const QUITQ: u8 = 0x17;
const FLUSHQ: u8 = 0x18;
const APPENDQ: u8 = 0x19;
const VERBOSITY: u8 = 0x1b;
const TOUCH: u8 = 0x1c;
const GAT: u8 = 0x1d;
const GATQ: u8 = 0x1e;
const GATK: u8 = 0x23;

const OK: u16 = 0x0000;
const NOT_FOUND: u16 = 0x0001;
const EXISTS: u16 = 0x0002;
const TOO_LARGE: u16 = 0x0003;
const INVALID: u16 = 0x0004;
const NOT_STORED: u16 = 0x0005;
const NON_NUMERIC: u16 = 0x0006;
const UNKNOWN: u16 = 0x0081;

fn expect(r: &Response, opcode: u8, status: u16, opaque: u32) {
    assert_eq!(
        (r.opcode, r.status, r.opaque),
        (opcode, status, opaque),
        "{r:?}"
    );
}

fn error_text(status: u16) -> &'static [u8] {
    match status {
        NOT_FOUND => b"Not found",
        EXISTS => b"Data exists for key.",
        TOO_LARGE => b"Too large.",
        INVALID => b"Invalid arguments",
        NOT_STORED => b"Not stored.",
        NON_NUMERIC => b"Non-numeric server-side value for incr or decr",
        UNKNOWN => b"Unknown command",
        _ => unreachable!(),
    }
}

fn expect_error(r: &Response, opcode: u8, status: u16, opaque: u32) {
    expect(r, opcode, status, opaque);
    assert_eq!(
        (r.extras.as_slice(), r.key.as_slice(), r.value.as_slice()),
        (&[][..], &[][..], error_text(status)),
        "{r:?}"
    );
}

fn conformance(threads: &str) {
    let server = Server::start(&[
        "--threads",
        threads,
        "--memory",
        "16M",
        "--ram-head",
        "8K",
        "--max-item-size",
        "64K",
    ]);
    let mut c = server.client();

    // NOOP, VERSION, VERBOSITY.
    let r = c.call(&frame(NOOP, &[], &[], &[], 0, 7));
    expect(&r, NOOP, OK, 7);
    assert!(r.value.is_empty() && r.cas == 0);
    let r = c.call(&frame(VERSION, &[], &[], &[], 0, 8));
    expect(&r, VERSION, OK, 8);
    assert!(
        r.value.starts_with(b"1.6."),
        "{:?}",
        String::from_utf8_lossy(&r.value)
    );
    expect(
        &c.call(&frame(VERBOSITY, &1u32.to_be_bytes(), &[], &[], 0, 9)),
        VERBOSITY,
        OK,
        9,
    );

    // SET and the GET family.
    let r = c.call(&frame(
        SET,
        &set_extras(0xdead_beef, 0),
        b"alpha",
        b"one",
        0,
        10,
    ));
    expect(&r, SET, OK, 10);
    assert!(r.cas != 0 && r.value.is_empty());
    let cas = r.cas;
    let r = c.call(&frame(GET, &[], b"alpha", &[], 0, 11));
    expect(&r, GET, OK, 11);
    assert_eq!(
        (r.flags(), r.key.as_slice(), r.value.as_slice(), r.cas),
        (0xdead_beef, &b""[..], &b"one"[..], cas)
    );
    let r = c.call(&frame(GETK, &[], b"alpha", &[], 0, 12));
    assert_eq!(
        (r.key.as_slice(), r.value.as_slice()),
        (&b"alpha"[..], &b"one"[..])
    );
    expect_error(
        &c.call(&frame(GET, &[], b"missing", &[], 0, 13)),
        GET,
        NOT_FOUND,
        13,
    );
    let r = c.call(&frame(GETK, &[], b"missing", &[], 0, 14));
    expect(&r, GETK, NOT_FOUND, 14);
    assert_eq!(
        (r.key.as_slice(), r.value.as_slice()),
        (&b"missing"[..], &b""[..]),
        "GETK miss carries the key, no text"
    );
    // Quiet gets: silent on a miss, answer on a hit.
    c.send(&frame(GETQ, &[], b"missing", &[], 0, 15));
    c.send(&frame(GETKQ, &[], b"alpha", &[], 0, 16));
    c.send(&frame(NOOP, &[], &[], &[], 0, 17));
    let r = c.recv().unwrap();
    expect(&r, GETKQ, OK, 16);
    assert_eq!(r.key, b"alpha");
    expect(&c.recv().unwrap(), NOOP, OK, 17);

    // ADD / REPLACE / CAS.
    expect_error(
        &c.call(&frame(ADD, &set_extras(0, 0), b"alpha", b"x", 0, 20)),
        ADD,
        EXISTS,
        20,
    );
    expect(
        &c.call(&frame(ADD, &set_extras(0, 0), b"beta", b"b", 0, 21)),
        ADD,
        OK,
        21,
    );
    expect_error(
        &c.call(&frame(REPLACE, &set_extras(0, 0), b"gamma", b"g", 0, 22)),
        REPLACE,
        NOT_FOUND,
        22,
    );
    expect(
        &c.call(&frame(REPLACE, &set_extras(0, 0), b"beta", b"B", 0, 23)),
        REPLACE,
        OK,
        23,
    );
    expect_error(
        &c.call(&frame(
            SET,
            &set_extras(0, 0),
            b"alpha",
            b"two",
            cas + 1,
            24,
        )),
        SET,
        EXISTS,
        24,
    );
    let r = c.call(&frame(SET, &set_extras(0, 0), b"alpha", b"two", cas, 25));
    expect(&r, SET, OK, 25);
    assert!(r.cas != cas);
    expect_error(
        &c.call(&frame(SET, &set_extras(0, 0), b"nope", b"x", 99, 26)),
        SET,
        NOT_FOUND,
        26,
    );
    c.send(&frame(ADDQ, &set_extras(0, 0), b"delta", b"d", 0, 27));
    c.send(&frame(ADDQ, &set_extras(0, 0), b"delta", b"d", 0, 28));
    c.send(&frame(NOOP, &[], &[], &[], 0, 29));
    expect_error(&c.recv().unwrap(), ADDQ, EXISTS, 28);
    expect(&c.recv().unwrap(), NOOP, OK, 29);

    // DELETE.
    expect_error(
        &c.call(&frame(DELETE, &[], b"gone", &[], 0, 30)),
        DELETE,
        NOT_FOUND,
        30,
    );
    expect_error(
        &c.call(&frame(DELETE, &[], b"beta", &[], 12345, 31)),
        DELETE,
        EXISTS,
        31,
    );
    expect(
        &c.call(&frame(DELETE, &[], b"beta", &[], 0, 32)),
        DELETE,
        OK,
        32,
    );
    c.send(&frame(DELETEQ, &[], b"delta", &[], 0, 33));
    c.send(&frame(NOOP, &[], &[], &[], 0, 34));
    expect(&c.recv().unwrap(), NOOP, OK, 34);

    // INCR / DECR.
    expect_error(
        &c.call(&frame(
            INCR,
            &arith_extras(1, 0, 0xffff_ffff),
            b"n",
            &[],
            0,
            40,
        )),
        INCR,
        NOT_FOUND,
        40,
    );
    let r = c.call(&frame(INCR, &arith_extras(1, 10, 0), b"n", &[], 0, 41));
    expect(&r, INCR, OK, 41);
    assert_eq!(r.counter(), 10, "created with the initial value");
    assert_eq!(
        c.call(&frame(INCR, &arith_extras(5, 0, 0), b"n", &[], 0, 42))
            .counter(),
        15
    );
    assert_eq!(
        c.call(&frame(DECR, &arith_extras(100, 0, 0), b"n", &[], 0, 43))
            .counter(),
        0,
        "decr stops at 0"
    );
    c.set(b"big", b"18446744073709551615", 0, 0);
    assert_eq!(
        c.call(&frame(INCR, &arith_extras(2, 0, 0), b"big", &[], 0, 44))
            .counter(),
        1,
        "incr wraps"
    );
    // memcached rewrites a counter in place when the number is no longer: padded with spaces
    // to the old length (20 digits here).
    assert_eq!(
        c.get(b"big").value,
        format!("{:<20}", 1).as_bytes(),
        "stored as decimal text, padded in place"
    );
    expect_error(
        &c.call(&frame(INCR, &arith_extras(1, 0, 0), b"alpha", &[], 0, 45)),
        INCR,
        NON_NUMERIC,
        45,
    );
    expect_error(
        &c.call(&frame(INCR, &arith_extras(1, 0, 0), b"big", &[], 777, 46)),
        INCR,
        EXISTS,
        46,
    );
    c.send(&frame(INCRQ, &arith_extras(1, 0, 0), b"big", &[], 0, 47));
    c.send(&frame(NOOP, &[], &[], &[], 0, 48));
    expect(&c.recv().unwrap(), NOOP, OK, 48);
    assert_eq!(c.get(b"big").value, format!("{:<20}", 2).as_bytes());

    // APPEND / PREPEND keep flags.
    expect_error(
        &c.call(&frame(APPEND, &[], b"none", b"x", 0, 50)),
        APPEND,
        NOT_STORED,
        50,
    );
    c.set(b"text", b"mid", 42, 0);
    expect(
        &c.call(&frame(APPEND, &[], b"text", b"-end", 0, 51)),
        APPEND,
        OK,
        51,
    );
    expect(
        &c.call(&frame(PREPEND, &[], b"text", b"start-", 0, 52)),
        PREPEND,
        OK,
        52,
    );
    c.send(&frame(APPENDQ, &[], b"text", b"!", 0, 53));
    let r = c.get(b"text");
    assert_eq!(
        (r.value.as_slice(), r.flags()),
        (&b"start-mid-end!"[..], 42)
    );

    // TOUCH / GAT family.
    let r = c.call(&frame(TOUCH, &100u32.to_be_bytes(), b"text", &[], 0, 60));
    expect(&r, TOUCH, OK, 60);
    assert_eq!(
        (r.flags(), r.value.len()),
        (42, 0),
        "touch returns flags, no value"
    );
    expect_error(
        &c.call(&frame(TOUCH, &100u32.to_be_bytes(), b"none", &[], 0, 61)),
        TOUCH,
        NOT_FOUND,
        61,
    );
    let r = c.call(&frame(GAT, &100u32.to_be_bytes(), b"text", &[], 0, 62));
    assert_eq!((r.status, r.value.as_slice()), (OK, &b"start-mid-end!"[..]));
    let r = c.call(&frame(GATK, &100u32.to_be_bytes(), b"text", &[], 0, 63));
    assert_eq!(
        (r.key.as_slice(), r.value.as_slice()),
        (&b"text"[..], &b"start-mid-end!"[..])
    );
    c.send(&frame(GATQ, &100u32.to_be_bytes(), b"none", &[], 0, 64));
    c.send(&frame(NOOP, &[], &[], &[], 0, 65));
    expect(&c.recv().unwrap(), NOOP, OK, 65);

    // Sizes: a value of exactly ram_head takes a fixed slot; over it, and over the item limit,
    // over the item limit, "too large" (and a failed SET drops the old value).
    let head = vec![7u8; 8192];
    expect(
        &c.call(&frame(SET, &set_extras(1, 0), b"head", &head, 0, 70)),
        SET,
        OK,
        70,
    );
    assert_eq!(c.get(b"head").value, head);
    // One byte over ram_head: the value lives whole in a segment.
    let bigger = vec![1u8; 8193];
    expect(
        &c.call(&frame(SET, &set_extras(1, 0), b"head", &bigger, 0, 71)),
        SET,
        OK,
        71,
    );
    assert_eq!(c.get(b"head").value, bigger);
    // APPEND and PREPEND onto a value in a segment build the sum in a segment, keeping the
    // item's flags; past the item limit they are refused and the value stays.
    expect(
        &c.call(&frame(APPEND, &[], b"head", b"x", 0, 73)),
        APPEND,
        OK,
        73,
    );
    expect(
        &c.call(&frame(PREPEND, &[], b"head", b"<", 0, 74)),
        PREPEND,
        OK,
        74,
    );
    let got = c.get(b"head");
    assert_eq!(got.value, [&b"<"[..], &bigger, b"x"].concat());
    assert_eq!(got.flags(), 1);
    // A RAM value that an APPEND grows past ram_head moves to a segment whole.
    c.set(b"grow", &head, 3, 0);
    expect(
        &c.call(&frame(APPEND, &[], b"grow", &[9u8; 100], 0, 75)),
        APPEND,
        OK,
        75,
    );
    let got = c.get(b"grow");
    assert_eq!(got.value, [&head[..], &[9u8; 100]].concat());
    assert_eq!(got.flags(), 3);
    expect_error(
        &c.call(&frame(APPEND, &[], b"grow", &vec![5u8; 60 * 1024], 0, 76)),
        APPEND,
        NOT_STORED,
        76,
    );
    assert_eq!(c.get(b"grow").value.len(), 8292);
    expect_error(
        &c.call(&frame(APPEND, &[], b"nothere", &vec![5u8; 9000], 0, 77)),
        APPEND,
        NOT_STORED,
        77,
    );
    expect_error(&c.get(b"nothere"), GET, NOT_FOUND, 0);
    c.set(b"keep", b"v", 0, 0);
    c.send(&frame(
        SETQ,
        &set_extras(0, 0),
        b"keep",
        &vec![0u8; 70 * 1024],
        0,
        72,
    ));
    expect_error(&c.recv().unwrap(), SETQ, TOO_LARGE, 72);
    expect_error(&c.get(b"keep"), GET, NOT_FOUND, 0);

    // Keys: 250 bytes fine.
    let key = vec![b'k'; 250];
    expect(
        &c.call(&frame(SET, &set_extras(0, 0), &key, b"v", 0, 80)),
        SET,
        OK,
        80,
    );
    assert_eq!(c.get(&key).value, b"v");

    // STAT.
    let stats = c.stats("");
    let names: Vec<&str> = stats.iter().map(|(n, _)| n.as_str()).collect();
    for name in [
        "pid",
        "uptime",
        "time",
        "version",
        "curr_connections",
        "total_connections",
        "curr_items",
        "total_items",
        "bytes",
        "limit_maxbytes",
        "cmd_get",
        "cmd_set",
        "get_hits",
        "get_misses",
        "evictions",
        "threads",
    ] {
        assert!(names.contains(&name), "STAT lacks {name}");
    }
    assert_eq!(c.stat("", "threads").to_string(), threads);
    assert!(c
        .stats("settings")
        .iter()
        .any(|(n, v)| n == "item_size_max" && v == "65536"));
    assert!(c
        .stats("settings")
        .iter()
        .any(|(n, v)| n == "client_flags_size" && v == "4"));
    assert!(c
        .stats("arena")
        .iter()
        .any(|(n, _)| n == "region_0_backing"));
    expect_error(
        &c.call(&frame(STAT, &[], b"bogus", &[], 0, 90)),
        STAT,
        NOT_FOUND,
        90,
    );

    // FLUSH.
    expect(&c.call(&frame(FLUSH, &[], &[], &[], 0, 91)), FLUSH, OK, 91);
    expect_error(&c.get(b"alpha"), GET, NOT_FOUND, 0);
    c.set(b"alpha", b"x", 0, 0);
    c.send(&frame(FLUSHQ, &[], &[], &[], 0, 92));
    c.send(&frame(NOOP, &[], &[], &[], 0, 93));
    expect(&c.recv().unwrap(), NOOP, OK, 93);
    expect_error(&c.get(b"alpha"), GET, NOT_FOUND, 0);

    // Unknown opcode: answered, connection kept.
    expect_error(
        &c.call(&frame(0x7f, &[], b"", b"abc", 0, 94)),
        0x7f,
        UNKNOWN,
        94,
    );
    expect(&c.call(&frame(NOOP, &[], &[], &[], 0, 95)), NOOP, OK, 95);

    // QUIT answers then closes; QUITQ closes silently.
    expect(&c.call(&frame(QUIT, &[], &[], &[], 0, 96)), QUIT, OK, 96);
    assert!(c.closed());
    let mut q = server.client();
    q.send(&frame(QUITQ, &[], &[], &[], 0, 97));
    assert!(q.recv().is_none());
    assert_eq!(
        server.stop().code(),
        Some(0),
        "SIGTERM stops the server cleanly"
    );
}

#[test]
fn conformance_one_shard() {
    conformance("1");
}

#[test]
fn conformance_two_shards() {
    conformance("2");
}

#[test]
fn expiry_relative_absolute_and_past() {
    let server = Server::start(&["--threads", "2"]);
    let mut c = server.client();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as u32;
    // Two seconds, not one: a set late in a second and the get just after it may straddle the
    // boundary (expiry is in whole seconds), and a loaded machine makes that likely.
    c.set(b"short", b"v", 0, 2);
    c.set(b"absolute", b"v", 0, now + 2);
    c.set(b"past", b"v", 0, now - 100);
    c.set(b"forever", b"v", 0, 0);
    c.set(b"touched", b"v", 0, 1);
    assert_eq!(c.get(b"short").status, OK);
    assert_eq!(
        c.get(b"past").status,
        NOT_FOUND,
        "an absolute time in the past expires at once"
    );
    c.call(&frame(TOUCH, &100u32.to_be_bytes(), b"touched", &[], 0, 1));
    std::thread::sleep(std::time::Duration::from_millis(3100));
    assert_eq!(c.get(b"short").status, NOT_FOUND);
    assert_eq!(c.get(b"absolute").status, NOT_FOUND);
    assert_eq!(c.get(b"forever").status, OK);
    assert_eq!(c.get(b"touched").status, OK, "touch moved the expiry out");
}

#[test]
fn expired_items_nobody_asks_for_are_swept() {
    let server = Server::start(&["--threads", "2"]);
    let mut c = server.client();
    for i in 0..300 {
        c.set(format!("ephemeral-{i}").as_bytes(), b"v", 0, 1);
    }
    c.set(b"stays", b"v", 0, 0);
    assert_eq!(c.stat("", "curr_items"), 301);
    std::thread::sleep(std::time::Duration::from_millis(3500));
    // No GET touched them: only the background sweep can have reclaimed them.
    assert_eq!(c.stat("", "curr_items"), 1);
    assert!(c.stat("", "reclaimed") >= 300);
}

/// Pipelines of hundreds of mixed quiet and loud commands on keys of every shard come back
/// complete and in request order.
#[test]
fn pipelines_come_back_complete_and_in_order() {
    let server = Server::start(&["--threads", "2"]);
    let mut c = server.client();
    let mut pipeline = Vec::new();
    let mut expected: Vec<(u8, u32, u16, Option<Vec<u8>>)> = Vec::new();
    for i in 0..600u32 {
        let key = format!("key-{}", i % 97).into_bytes();
        let value = format!("value-{i}").into_bytes();
        match i % 6 {
            0 => {
                pipeline.extend(frame(SETQ, &set_extras(i, 0), &key, &value, 0, i));
            }
            1 => {
                pipeline.extend(frame(SET, &set_extras(i, 0), &key, &value, 0, i));
                expected.push((SET, i, OK, None));
            }
            2 => {
                pipeline.extend(frame(GETK, &[], &key, &[], 0, i));
                expected.push((GETK, i, u16::MAX, None)); // hit or miss, checked below by model
            }
            3 => pipeline.extend(frame(
                GETQ,
                &[],
                format!("absent-{i}").as_bytes(),
                &[],
                0,
                i,
            )),
            4 => {
                pipeline.extend(frame(NOOP, &[], &[], &[], 0, i));
                expected.push((NOOP, i, OK, None));
            }
            _ => {
                pipeline.extend(frame(
                    DELETEQ,
                    &[],
                    format!("absent-{i}").as_bytes(),
                    &[],
                    0,
                    i,
                ));
                expected.push((DELETEQ, i, NOT_FOUND, None)); // quiet, but errors still answer
            }
        }
    }
    // Model the GETK answers: the last value set for that key before it, if any.
    let mut last: std::collections::HashMap<Vec<u8>, Vec<u8>> = Default::default();
    let mut model_gets = std::collections::HashMap::new();
    for i in 0..600u32 {
        let key = format!("key-{}", i % 97).into_bytes();
        match i % 6 {
            0 | 1 => {
                last.insert(key, format!("value-{i}").into_bytes());
            }
            2 => {
                model_gets.insert(i, last.get(&key).cloned());
            }
            _ => {}
        }
    }
    c.send(&pipeline);
    for (opcode, opaque, status, _) in expected {
        let r = c.recv().expect("a reply");
        assert_eq!(
            (r.opcode, r.opaque),
            (opcode, opaque),
            "replies out of order"
        );
        if opcode == GETK {
            match &model_gets[&opaque] {
                Some(value) => assert_eq!((r.status, &r.value), (OK, value)),
                None => assert_eq!(r.status, NOT_FOUND),
            }
        } else {
            assert_eq!(r.status, status);
        }
    }
    expect(
        &c.call(&frame(NOOP, &[], &[], &[], 0, 9999)),
        NOOP,
        OK,
        9999,
    );
}

#[test]
fn a_pipeline_whose_replies_exceed_the_output_cap_comes_back_whole() {
    // 200 GETs of a 20 KB value: 4 MB of replies, four times the per-write cap.
    let server = Server::start(&["--threads", "2"]);
    let mut c = server.client();
    let value = vec![b'v'; 20_000];
    c.set(b"twenty-k", &value, 0, 0);
    let pipeline: Vec<u8> = (0..200u32)
        .flat_map(|i| frame(GET, &[], b"twenty-k", &[], 0, i))
        .collect();
    c.send(&pipeline);
    for i in 0..200u32 {
        let r = c.recv().expect("every reply arrives");
        assert_eq!((r.opaque, r.status, r.value.len()), (i, OK, value.len()));
    }
}

#[test]
fn cas_race_between_two_connections_has_one_winner() {
    let server = Server::start(&["--threads", "2"]);
    let mut a = server.client();
    let mut b = server.client();
    for round in 0..50u32 {
        let key = format!("race-{round}").into_bytes();
        let cas = a.set(&key, b"0", 0, 0).cas;
        // Both read the same CAS and try to swap.
        a.send(&frame(SET, &set_extras(0, 0), &key, b"a", cas, 1));
        b.send(&frame(SET, &set_extras(0, 0), &key, b"b", cas, 2));
        let ra = a.recv().unwrap();
        let rb = b.recv().unwrap();
        let wins = [ra.status, rb.status].iter().filter(|s| **s == OK).count();
        let losses = [ra.status, rb.status]
            .iter()
            .filter(|s| **s == EXISTS)
            .count();
        assert_eq!((wins, losses), (1, 1), "round {round}: {ra:?} {rb:?}");
        let winner: &[u8] = if ra.status == OK { b"a" } else { b"b" };
        assert_eq!(a.get(&key).value, winner);
    }
}

fn assert_other_clients_unaffected(server: &Server) {
    let mut other = server.client();
    other.set(b"canary", b"alive", 0, 0);
    assert_eq!(other.get(b"canary").value, b"alive");
}

#[test]
fn bad_input_gets_memcached_treatment_and_hurts_nobody_else() {
    let server = Server::start(&["--threads", "2", "--max-item-size", "4K"]);
    // Wrong magic on a binary connection (its first byte was 0x80): closed without a reply.
    // (A connection whose first byte is not 0x80 speaks text, as memcached decides.)
    let mut c = server.client();
    let mut bytes = frame(NOOP, &[], &[], &[], 0, 4);
    bytes.extend_from_slice(&[0x81; 24]);
    c.send(&bytes);
    expect(&c.recv().unwrap(), NOOP, OK, 4);
    assert!(c.recv().is_none());
    // Key + extras longer than the body: "unknown command", then closed.
    let mut c = server.client();
    let mut bytes = frame(GET, &[], b"key", &[], 0, 5);
    bytes[8..12].copy_from_slice(&1u32.to_be_bytes());
    c.send(&bytes);
    expect_error(&c.recv().unwrap(), GET, UNKNOWN, 5);
    assert!(c.recv().is_none());
    // A key over 250 bytes: "invalid arguments", then closed.
    let mut c = server.client();
    c.send(&frame(GET, &[], &[b'k'; 251], &[], 0, 6));
    expect_error(&c.recv().unwrap(), GET, INVALID, 6);
    assert!(c.recv().is_none());
    // Wrong extras for the opcode: "invalid arguments", then closed.
    let mut c = server.client();
    c.send(&frame(SET, &[0; 4], b"k", b"v", 0, 7));
    expect_error(&c.recv().unwrap(), SET, INVALID, 7);
    assert!(c.recv().is_none());
    // A body beyond --max-item-size: "too large", the value skipped, the connection kept.
    let mut c = server.client();
    let mut big = frame(SET, &set_extras(0, 0), b"k", &vec![b'x'; 100_000], 0, 8);
    big.extend(frame(NOOP, &[], &[], &[], 0, 9));
    c.send(&big);
    expect_error(&c.recv().unwrap(), SET, TOO_LARGE, 8);
    expect(&c.recv().unwrap(), NOOP, OK, 9);
    // Half a frame, then the client leaves.
    let mut c = server.client();
    c.send(&frame(SET, &set_extras(0, 0), b"half", b"0123456789", 0, 10)[..30]);
    drop(c);
    // A client that never reads its replies only stalls itself.
    let mut stuck = server.client();
    stuck.set(b"bulk", &vec![b'b'; 4000], 0, 0);
    let gets: Vec<u8> = (0..20_000)
        .flat_map(|i| frame(GET, &[], b"bulk", &[], 0, i))
        .collect();
    stuck.stream.set_nonblocking(true).unwrap();
    let _ = std::io::Write::write(&mut stuck.stream, &gets);
    assert_other_clients_unaffected(&server);
    drop(stuck);
    assert_other_clients_unaffected(&server);
    let mut c = server.client();
    let stats = c.stats("");
    let get = |name: &str| {
        stats
            .iter()
            .find(|(n, _)| n == name)
            .unwrap()
            .1
            .parse::<u64>()
            .unwrap()
    };
    assert_eq!(get("frame_bad_magic"), 1);
    assert_eq!(get("frame_body_too_short"), 1);
    assert_eq!(get("frame_key_too_long"), 1);
    assert_eq!(get("frame_invalid"), 1);
    assert!(get("too_large") >= 1);
    assert_eq!(server.stop().code(), Some(0));
}

#[test]
fn idle_connections_are_closed_after_the_timeout() {
    let server = Server::start(&["--idle-timeout", "1"]);
    let mut c = server.client();
    assert_eq!(c.set(b"k", b"v", 0, 0).status, OK);
    std::thread::sleep(std::time::Duration::from_millis(2500));
    assert!(c.closed(), "idle connection still open");
    let mut d = server.client();
    assert!(d.stat("", "idle_closed") >= 1);
}

/// A connection over `--max-connections` is told so, as memcached 1.6.45 tells it (the exact
/// line, to binary and text clients alike: it is sent before the client's first byte), and
/// closed.
#[test]
fn connections_beyond_the_limit_are_told_and_closed() {
    use std::io::Read;
    let server = Server::start(&["--max-connections", "2"]);
    let mut a = server.client();
    let mut b = server.client();
    // Make sure both are accepted before the third arrives (shards accept independently).
    assert_eq!(a.call(&frame(NOOP, &[], &[], &[], 0, 1)).status, OK);
    assert_eq!(b.call(&frame(NOOP, &[], &[], &[], 0, 1)).status, OK);
    // One that sends nothing, and a binary client whose request is already on its way.
    let mut silent = server.client();
    let mut binary = server.client();
    binary.send(&frame(NOOP, &[], &[], &[], 0, 1));
    for (name, c) in [("silent", &mut silent), ("binary", &mut binary)] {
        let mut got = Vec::new();
        let read = c.stream.read_to_end(&mut got);
        assert_eq!(
            String::from_utf8_lossy(&got),
            "ERROR Too many open connections\r\n",
            "{name}: {read:?}"
        );
        assert!(read.is_ok(), "{name}: closed with a reset: {read:?}");
    }
    assert_eq!(a.set(b"k", b"v", 0, 0).status, OK);
    drop(b);
    std::thread::sleep(std::time::Duration::from_millis(200));
    let mut d = server.client();
    assert_eq!(d.stat("", "rejected_connections"), 2);
    assert_eq!(a.get(b"k").value, b"v");
}

/// A batch of requests the server has read when the stop comes is answered whole before the
/// connection closes: the stop ends reading, not writing. A pipeline of 1,000 GETs of a 64 KiB
/// value is sent and the first bytes of the replies are read, so the server has read a batch;
/// then the client stops reading, so the server's writes back up (the replies need many passes
/// against the 1 MiB output cap and the socket's buffers), and SIGTERM lands while they go out.
/// Requests never read are dropped with the connection. (The test froze the server while the
/// pipeline and the signal arrived until a CI run showed the stop could win the race against
/// the first read: no batch read, no reply, a correct stop and a failed test.)
#[test]
fn a_batch_read_before_the_stop_is_answered_whole() {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    use std::io::Read;
    const GETS: u32 = 1000;
    let value: Vec<u8> = (0..64 << 10).map(|i| (i % 251) as u8).collect();
    for threads in ["1", "2"] {
        let server = Server::start(&["--threads", threads]);
        let mut c = server.client();
        assert_eq!(c.set(b"kept", &value, 0, 0).status, 0);
        let idle = server.client();
        let pid = Pid::from_raw(server.pid() as i32);
        let mut pipeline = Vec::new();
        for opaque in 0..GETS {
            pipeline.extend(frame(0x00, &[], b"kept", &[], 0, opaque));
        }
        c.send(&pipeline);
        // The first reply bytes: the server has read a batch and is answering it.
        let mut received = Vec::new();
        let mut chunk = vec![0u8; 1 << 20];
        let n = c.stream.read(&mut chunk).expect("the first replies");
        assert!(n > 0, "{threads} shard(s): closed before any reply");
        received.extend_from_slice(&chunk[..n]);
        // Not reading for a while backs the server's writes up; the stop lands among them.
        std::thread::sleep(Duration::from_millis(100));
        kill(pid, Signal::SIGTERM).unwrap();
        // Everything until the server closes (a reset, for the requests it never read).
        loop {
            match c.stream.read(&mut chunk) {
                Ok(0) => break,
                Ok(n) => received.extend_from_slice(&chunk[..n]),
                Err(err) if err.kind() == std::io::ErrorKind::ConnectionReset => break,
                Err(err) => panic!("{threads} shard(s): reading the replies failed: {err}"),
            }
        }
        let reply_bytes = 24 + 4 + value.len();
        let replies = received.len() / reply_bytes;
        assert_eq!(
            received.len() % reply_bytes,
            0,
            "{threads} shard(s): a reply was cut off after {replies} whole ones"
        );
        assert!(
            replies >= 1,
            "{threads} shard(s): no reply before the close"
        );
        for (opaque, reply) in received.chunks(reply_bytes).enumerate() {
            assert_eq!(reply[0], 0x81, "reply {opaque}: magic");
            assert_eq!(&reply[6..8], &[0, 0], "reply {opaque}: status");
            assert_eq!(
                reply[12..16],
                (opaque as u32).to_be_bytes(),
                "reply {opaque}: order"
            );
            assert!(reply[28..] == value[..], "reply {opaque}: wrong value");
        }
        eprintln!("{threads} shard(s): {replies} of {GETS} GETs answered whole before the close");
        drop(idle);
        // Waits for the exit the SIGTERM above began (a second one would cut it short).
        let status = server.stop_with(Signal::SIGCONT);
        assert_eq!(status.code(), Some(0), "the server exits cleanly");
    }
}
