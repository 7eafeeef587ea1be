//! Through the real binary, no number wraps: a text or meta token that does not fit its field is
//! refused with memcached 1.6.45's line (a data length, `touch`/`gat`/`flush_all` exptimes,
//! `verbosity`, meta flag numbers) or, where 1.6.45 still truncates (classic flags and exptime),
//! with the line it gives a malformed one; nothing is stored and the connection goes on.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::server::Server;

const BAD_FORMAT: &str = "CLIENT_ERROR bad command line format\r\n";
const INVALID_EXPTIME: &str = "CLIENT_ERROR invalid exptime argument\r\n";
const BAD_TOKEN: &str = "CLIENT_ERROR bad token in command line format\r\n";
/// A reply that does not come in this long fails the test (a hang, not a timing).
const REPLY_WAIT: Duration = Duration::from_secs(10);

/// Sends `request` then `mn`, and returns everything before the `MN` the `mn` brings.
fn exchange(stream: &mut TcpStream, request: &str) -> String {
    stream.write_all(request.as_bytes()).unwrap();
    stream.write_all(b"mn\r\n").unwrap();
    let deadline = Instant::now() + REPLY_WAIT;
    let mut got = Vec::new();
    let mut chunk = [0u8; 4096];
    while !got.ends_with(b"MN\r\n") {
        assert!(
            Instant::now() < deadline,
            "no MN after {request:?}: {got:?}"
        );
        match stream.read(&mut chunk) {
            Ok(0) => panic!("closed after {request:?}"),
            Ok(n) => got.extend_from_slice(&chunk[..n]),
            Err(err) => panic!("{request:?}: {err}"),
        }
    }
    got.truncate(got.len() - 4);
    String::from_utf8(got).unwrap()
}

#[test]
fn numbers_that_do_not_fit_their_field_are_refused() {
    let server = Server::start(&["--threads", "1", "--max-item-size", "1M"]);
    let mut c = TcpStream::connect(server.addr).unwrap();
    c.set_read_timeout(Some(REPLY_WAIT)).unwrap();
    let cases: &[(&str, &str)] = &[
        // The two: 2 bytes stored for 4294967298; a wait for 1.2 GB. The refused
        // line's data block is then read as a command.
        (
            "set k 0 0 4294967298\r\nxy\r\n",
            "CLIENT_ERROR bad command line format\r\nERROR\r\n",
        ),
        ("ms k 99999999999\r\n", BAD_FORMAT),
        ("ms k 99999999999 T0 F1\r\n", BAD_FORMAT),
        // 1.6.45 answers a bad length before it looks for noreply.
        ("set k 0 0 4294967298 noreply\r\n", BAD_FORMAT),
        (
            "set k 0 0 -1 noreply\r\nz\r\n",
            // (A line of under 4 bytes is malformed to 1.6.45.)
            "CLIENT_ERROR bad command line format\r\nCLIENT_ERROR bad command line format\r\n",
        ),
        ("add k 0 0 2147483648\r\n", BAD_FORMAT),
        ("replace k 0 0 -4294967295\r\n", BAD_FORMAT),
        ("append k 0 0 4294967297\r\n", BAD_FORMAT),
        ("prepend k 0 0 18446744073709551617\r\n", BAD_FORMAT),
        ("cas k 0 0 4294967297 1\r\n", BAD_FORMAT),
        ("cas k 0 0 1 -18446744073709551615\r\nx\r\n", BAD_FORMAT),
        ("cas k 0 0 1 18446744073709551616\r\nx\r\n", BAD_FORMAT),
        // Flags and exptime: 1.6.45 truncates these; refused here, the data block swallowed as
        // 1.6.45 swallows it after any refusal once the length is read.
        ("set k 4294967296 0 1\r\nx\r\n", BAD_FORMAT),
        ("set k -18446744073709551615 0 1\r\nx\r\n", BAD_FORMAT),
        ("set k 0 4294967296 1\r\nx\r\n", BAD_FORMAT),
        ("set k 0 2147483648 1\r\nx\r\n", BAD_FORMAT),
        (
            "incr k -18446744073709551615\r\n",
            "CLIENT_ERROR invalid numeric delta argument\r\n",
        ),
        (
            "incr k 18446744073709551616\r\n",
            "CLIENT_ERROR invalid numeric delta argument\r\n",
        ),
        ("touch k 4294967306\r\n", INVALID_EXPTIME),
        ("touch k -2147483649\r\n", INVALID_EXPTIME),
        ("gat 4294967306 k\r\n", INVALID_EXPTIME),
        ("gats 2147483648 k\r\n", INVALID_EXPTIME),
        ("flush_all 4294967296\r\n", INVALID_EXPTIME),
        ("verbosity 4294967296\r\n", BAD_FORMAT),
        ("stats cachedump 4294967297 1\r\n", BAD_FORMAT),
        // Meta flag numbers.
        ("mg k T4294967296 v\r\n", BAD_TOKEN),
        ("mg k N2147483648 v\r\n", BAD_TOKEN),
        ("mg k R-2147483649 v\r\n", BAD_TOKEN),
        ("ms k 1 F4294967296\r\nx\r\n", BAD_FORMAT),
        ("ms k 1 T4294967296\r\nx\r\n", BAD_TOKEN),
        ("ms k 1 C-18446744073709551615\r\nx\r\n", BAD_TOKEN),
        // (1.6.40 and later name md's flag errors.)
        ("md k C-18446744073709551615\r\n", BAD_TOKEN),
        (
            "ma k D-18446744073709551615\r\n",
            "CLIENT_ERROR invalid or duplicate flag\r\n",
        ),
        (
            "ma k N0 J18446744073709551616\r\n",
            "CLIENT_ERROR invalid or duplicate flag\r\n",
        ),
    ];
    for (request, expected) in cases {
        assert_eq!(exchange(&mut c, request), *expected, "{request:?}");
        // Nothing was stored, and the connection still serves.
        assert_eq!(
            exchange(&mut c, "get k\r\n"),
            "END\r\n",
            "after {request:?}"
        );
    }
    // A length that fits but is over --max-item-size is still refused, its data swallowed.
    let too_large = format!("set k 0 0 2000000\r\n{}\r\n", "x".repeat(2_000_000));
    assert_eq!(
        exchange(&mut c, &too_large),
        "SERVER_ERROR object too large for cache\r\n"
    );
    // The largest numbers that fit still work.
    assert_eq!(
        exchange(&mut c, "set k 4294967295 2147483647 1\r\nx\r\nget k\r\n"),
        "STORED\r\nVALUE k 4294967295 1\r\nx\r\nEND\r\n"
    );
    assert_eq!(
        exchange(&mut c, "touch k -2147483648\r\nget k\r\n"),
        "TOUCHED\r\nEND\r\n"
    );
}
