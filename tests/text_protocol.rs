//! The text and meta protocols through the real binary, byte for byte against a real memcached:
//! 1.6.45 when it is built (the peers directory), else Debian's 1.6.18, which the output names.
//! A table of request scripts runs on both servers (each case in keys of its own) and the
//! replies must match after normalising what legitimately differs (CAS numbers, the version
//! string, `me` output, TTL and last-access seconds off by one); the cases Headroom answers
//! otherwise on purpose, or that changed after 1.6.18, are listed with the reason. Then what memcached cannot be
//! compared on: Headroom's STAT groups over text, and values beyond `--ram-head` (streamed to
//! segments) in and out over `set`/`get` and `ms`/`mg`.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

use common::pattern;
use common::server::Server;

/// memcached's default item limit (`-I 1m`); Headroom gets the same for the comparison.
const ITEM_MAX: &str = "1M";
/// A reply is over when this passes with no new byte (unless the sentinel's `MN` came first or
/// the connection closed).
const QUIET: Duration = Duration::from_millis(150);
/// Sent after each step so a complete reply is recognised without waiting out [`QUIET`].
const SENTINEL: &[u8] = b"mn\r\n";
/// Stands for the case's key prefix in a script, so cases never share a key.
const PREFIX_MARK: u8 = b'@';
/// A 1 MiB item limit refuses this and takes the next (memcached counts its item header in).
const TOO_LARGE: usize = 2_000_000;
const FITS: usize = 1_000_000;

/// The memcached the replies are compared with: 1.6.45 from the peers directory when it is
/// there (`common::memcached::peers_memcached`), else Debian's (1.6.18) from PATH.
fn reference_memcached() -> std::path::PathBuf {
    common::memcached::peers_memcached().unwrap_or_else(|| "memcached".into())
}

/// Cases where Headroom answers otherwise than memcached 1.6.45, on purpose, and why
/// (`docs/protocol.md` lists them).
const KNOWN_DIFFERENCES_1_6_45: &[(&str, &str)] = &[
    (
        "keys of 251 bytes",
        "1.6.45 follows the error for a get of a too-long key with a second CRLF (its \
         process_get_command_err copies a line that already ends in one); Headroom sends one line",
    ),
    (
        "incr grows and decr pads the value",
        "1.6.45 pads a shorter counter with spaces only when no other request holds the item \
         (here a pipelined get still held it, so it wrote the number alone); Headroom always pads, \
         as 1.6.18 did: the same number either way",
    ),
    (
        "me",
        "`me KEY b` with a key that is not base64: 1.6.45 looks up the key as written, Headroom \
         answers EN (the key cannot be decoded)",
    ),
];

/// With Debian's memcached 1.6.18 as the reference (no 1.6.45 built), the cases whose answers
/// 1.6.40's new parser and later releases changed, which Headroom follows.
const CHANGED_SINCE_1_6_18: &[(&str, &str)] = &[
    ("gat bad forms", "1.6.40: a malformed line (too few tokens, under 4 bytes) is CLIENT_ERROR bad command line format, not ERROR"),
    ("incr on a missing key and bad forms", "1.6.40: a malformed line (too few tokens, under 4 bytes) is CLIENT_ERROR bad command line format, not ERROR"),
    ("touch", "1.6.40: a malformed line (too few tokens, under 4 bytes) is CLIENT_ERROR bad command line format, not ERROR"),
    ("verbosity", "1.6.40: a malformed line (too few tokens, under 4 bytes) is CLIENT_ERROR bad command line format, not ERROR"),
    ("unknown commands", "1.6.40: a malformed line (too few tokens, under 4 bytes) is CLIENT_ERROR bad command line format, not ERROR"),
    ("empty lines", "1.6.40: a malformed line (too few tokens, under 4 bytes) is CLIENT_ERROR bad command line format, not ERROR"),
    ("data block longer than declared", "1.6.40: a malformed line (too few tokens, under 4 bytes) is CLIENT_ERROR bad command line format, not ERROR"),
    ("data block missing its CR LF", "1.6.40: a malformed line (too few tokens, under 4 bytes) is CLIENT_ERROR bad command line format, not ERROR"),
    ("mg bad forms", "1.6.40: a malformed line (too few tokens, under 4 bytes) is CLIENT_ERROR bad command line format, not ERROR"),
    ("ms bad forms", "1.6.40: a malformed line (too few tokens, under 4 bytes) is CLIENT_ERROR bad command line format, not ERROR"),
    ("pipeline with errors in between", "1.6.40: a malformed line (too few tokens, under 4 bytes) is CLIENT_ERROR bad command line format, not ERROR"),
    ("set flags extremes", "1.6.45: a storage line refused after its length swallows the data block"),
    ("cas bad forms", "1.6.45: a storage line refused after its length swallows the data block"),
    ("keys of 251 bytes", "1.6.45: a storage line refused after its length swallows the data block"),
    ("bad numbers", "1.6.45: a storage line refused after its length swallows the data block"),
    ("bad numbers noreply", "1.6.45: a storage line refused after its length swallows the data block"),
    ("delete bad forms", "1.6.40: tokens after the key are ignored (delete's hold time, flush_all's and the others' extras)"),
    ("flush_all", "1.6.40: tokens after the key are ignored (delete's hold time, flush_all's and the others' extras)"),
    ("shutdown", "1.6.40: the shutdown refusal is SERVER_ERROR"),
    ("NUL ends the line", "1.6.40: a NUL is a key byte, no longer the line's end"),
    ("md", "1.6.40: md names its flag errors; M reads one byte; a flag must be a letter or digit"),
    ("ms invalid mode", "1.6.40: md names its flag errors; M reads one byte; a flag must be a letter or digit"),
    ("ma bad forms", "1.6.40: md names its flag errors; M reads one byte; a flag must be a letter or digit"),
    ("me", "1.6.45: `me KEY b` takes the key as written"),
    ("ma misses and autovivify", "1.6.45: ma's q silences the reply to a counter N created too"),
];

/// A memcached child, killed on drop.
struct Memcached(common::memcached::Memcached);

impl Memcached {
    /// `None` (after saying so) when memcached is not installed and the root tests are not
    /// required.
    fn start() -> Option<Memcached> {
        let program = reference_memcached();
        if Command::new(&program).arg("-h").output().is_err() {
            assert!(
                std::env::var_os("HEADROOM_REQUIRE_ROOT_TESTS").is_none(),
                "memcached is missing (scripts/install-deps installs it)"
            );
            println!("skipped: memcached is not installed");
            return None;
        }
        let started = common::memcached::Memcached::start(&program, &["-t", "1", "-m", "64"]);
        Some(Memcached(started))
    }

    fn addr(&self) -> SocketAddr {
        self.0.addr
    }
}

impl Memcached {
    /// The release `memcached -V` names (`1.6.45`).
    fn version(&self) -> String {
        let out = Command::new(reference_memcached())
            .arg("-V")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        text.split_whitespace()
            .nth(1)
            .unwrap_or("unknown")
            .to_string()
    }
}

// ---------------------------------------------------------------------------------------------
// The raw-TCP client
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Debug, PartialEq, Eq)]
struct Reply {
    bytes: Vec<u8>,
    closed: bool,
}

fn connect(addr: SocketAddr) -> TcpStream {
    let stream = TcpStream::connect(addr).expect("connect");
    stream.set_nodelay(true).unwrap();
    stream
}

/// `MN\r\n` lines in a reply.
fn mn_lines(bytes: &[u8]) -> usize {
    (0..bytes.len())
        .filter(|&i| bytes[i..].starts_with(b"MN\r\n") && (i == 0 || bytes[i - 1] == b'\n'))
        .count()
}

/// Reads until `mn_wanted` `MN` lines came (0: never enough), the connection closed, or
/// [`QUIET`] passed with no new byte.
fn read_reply(stream: &mut TcpStream, mn_wanted: usize) -> Reply {
    stream.set_read_timeout(Some(QUIET)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut bytes = Vec::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        if mn_wanted > 0 && mn_lines(&bytes) >= mn_wanted {
            return Reply {
                bytes,
                closed: false,
            };
        }
        match stream.read(&mut buf) {
            Ok(0) => {
                return Reply {
                    bytes,
                    closed: true,
                }
            }
            Ok(n) => bytes.extend_from_slice(&buf[..n]),
            Err(err) if matches!(err.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return Reply {
                    bytes,
                    closed: false,
                }
            }
            Err(err)
                if matches!(
                    err.kind(),
                    ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted
                ) =>
            {
                return Reply {
                    bytes,
                    closed: true,
                }
            }
            Err(err) => panic!("read failed: {err}"),
        }
        assert!(Instant::now() < deadline, "a reply that never ends");
    }
}

/// Reads exactly `len` bytes (large values, where a pause could pass for the end).
fn read_exact_len(stream: &mut TcpStream, len: usize) -> Vec<u8> {
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut bytes = vec![0u8; len];
    stream.read_exact(&mut bytes).expect("the whole reply");
    bytes
}

fn show(bytes: &[u8]) -> String {
    const MAX: usize = 700;
    let text = bytes.escape_ascii().to_string();
    if text.len() > MAX {
        format!("{}... ({} bytes)", &text[..MAX], bytes.len())
    } else {
        text
    }
}

fn replace_all(haystack: &[u8], needle: &[u8], with: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(haystack.len());
    let mut at = 0;
    while at < haystack.len() {
        if haystack[at..].starts_with(needle) {
            out.extend_from_slice(with);
            at += needle.len();
        } else {
            out.push(haystack[at]);
            at += 1;
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Cases
// ---------------------------------------------------------------------------------------------

struct Step {
    bytes: Vec<u8>,
    /// Follow with `mn` (off where an extra line would change the answer: the long-line close).
    sentinel: bool,
}

/// Steps run in order on one connection. `@` is the case's key prefix; `{cas}` and `{cas+1}`
/// are the last CAS value this server returned on the connection (and one more), so each server
/// is driven with its own uniques.
struct Case {
    name: String,
    steps: Vec<Step>,
}

fn case(name: &str, steps: &[&str]) -> Case {
    Case {
        name: name.to_string(),
        steps: steps
            .iter()
            .map(|s| Step {
                bytes: s.as_bytes().to_vec(),
                sentinel: true,
            })
            .collect(),
    }
}

fn case_bytes(name: &str, steps: Vec<Vec<u8>>) -> Case {
    Case {
        name: name.to_string(),
        steps: steps
            .into_iter()
            .map(|bytes| Step {
                bytes,
                sentinel: true,
            })
            .collect(),
    }
}

fn raw_case(name: &str, bytes: Vec<u8>) -> Case {
    Case {
        name: name.to_string(),
        steps: vec![Step {
            bytes,
            sentinel: false,
        }],
    }
}

/// The prefix is four bytes (`NNN.`), so `@` plus `len - 4` bytes is a key of `len` bytes.
fn key_of_len(len: usize) -> String {
    format!("@{}", "k".repeat(len - 4))
}

fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

fn cases() -> Vec<Case> {
    let k250 = key_of_len(250);
    let k251 = key_of_len(251);
    let fits = vec![b'f'; FITS];
    let too_large = vec![b't'; TOO_LARGE];
    let many_keys: String = (0..120).map(|i| format!(" @multiget-key-{i:03}")).collect();
    vec![
        // --- storage commands ---
        case("set", &["set @a 5 0 3\r\nabc\r\nget @a\r\n"]),
        case("set noreply", &["set @a 5 0 3 noreply\r\nabc\r\nget @a\r\n"]),
        case("set empty value", &["set @a 0 0 0\r\n\r\nget @a\r\n"]),
        case(
            "set overwrites value and flags",
            &["set @a 1 0 1\r\nx\r\nset @a 7 0 2\r\nyz\r\nget @a\r\n"],
        ),
        case(
            "set data with CR LF inside",
            &["set @a 0 0 6\r\na\r\nb\r\n\r\nget @a\r\n"],
        ),
        case(
            "set flags extremes",
            // (Flags past 32 bits are refused, where memcached 1.6.18 truncates them: see
            // tests/number_limits.rs.)
            &["set @a 4294967295 0 1\r\nx\r\nget @a\r\n\
               set @c -1 0 1\r\nx\r\nget @c\r\nset @d -0 0 1\r\nx\r\nget @d\r\n"],
        ),
        case(
            "set negative exptime expires at once",
            &["set @a 0 -1 1\r\nx\r\nget @a\r\nset @b 0 100 1\r\nx\r\nmg @b t v\r\n"],
        ),
        case(
            "add",
            &["add @a 0 0 1\r\nx\r\nadd @a 0 0 1\r\ny\r\nget @a\r\n\
               add @b 0 0 1 noreply\r\nz\r\nadd @b 0 0 1 noreply\r\nw\r\nget @b\r\n"],
        ),
        case(
            "replace",
            &["replace @a 0 0 1\r\nx\r\nget @a\r\nset @a 0 0 1\r\nx\r\nreplace @a 3 0 2\r\nyy\r\n\
               get @a\r\nreplace @m 0 0 1 noreply\r\nq\r\nget @m\r\n"],
        ),
        case(
            "append and prepend",
            &["append @a 0 0 1\r\nx\r\nprepend @a 0 0 1\r\nx\r\nset @a 9 0 3\r\nmid\r\n\
               append @a 1 0 4\r\n_end\r\nprepend @a 2 0 6\r\nstart_\r\nget @a\r\n\
               append @a 0 0 1 noreply\r\n!\r\nprepend @a 0 0 1 noreply\r\n^\r\ngets @a\r\n\
               append @m 0 0 1 noreply\r\n!\r\nget @m\r\n"],
        ),
        case(
            "cas with the right unique",
            &[
                "set @a 0 0 1\r\nx\r\ngets @a\r\n",
                "cas @a 3 0 2 {cas}\r\nyy\r\ngets @a\r\n",
                "cas @a 0 0 1 {cas}\r\nz\r\ncas @a 0 0 1 {cas}\r\nw\r\nget @a\r\n",
            ],
        ),
        case(
            "cas with a wrong unique",
            &[
                "set @a 0 0 1\r\nx\r\ngets @a\r\n",
                "cas @a 0 0 1 {cas+1}\r\ny\r\nget @a\r\ncas @a 0 0 1 0\r\ny\r\nget @a\r\n",
            ],
        ),
        case(
            "cas on a missing key",
            &["cas @none 0 0 1 1\r\nx\r\ncas @none 0 0 1 1 noreply\r\nx\r\nget @none\r\n"],
        ),
        case(
            "cas noreply",
            &[
                "set @a 0 0 1\r\nx\r\ngets @a\r\n",
                "cas @a 0 0 1 {cas+1} noreply\r\ny\r\ncas @a 0 0 1 {cas} noreply\r\nz\r\nget @a\r\n",
            ],
        ),
        case(
            "cas bad forms",
            &["cas @a 0 0 1 abc\r\nx\r\ncas @a 0 0 1\r\nx\r\ncas @a 0 0 1 -1\r\nx\r\n\
               cas @a 0 0 1 18446744073709551616\r\nx\r\n"],
        ),
        case(
            "cas after an append changed the unique",
            &[
                "set @a 0 0 1\r\nx\r\ngets @a\r\n",
                "append @a 0 0 1\r\ny\r\ncas @a 0 0 1 {cas}\r\nz\r\nget @a\r\n",
            ],
        ),
        // --- retrieval ---
        case(
            "get and gets with hits and misses mixed",
            &["set @a 1 0 1\r\nA\r\nset @c 3 0 3\r\nCCC\r\nget @a @b @c @d @a\r\n\
               gets @a @b @c\r\nget @none\r\ngets @none @none2\r\n"],
        ),
        case(
            "get with extra spaces",
            &["set @a 0 0 1\r\nx\r\nget  @a   @a \r\nget @a\n"],
        ),
        case(
            "gat and gats",
            &["set @a 1 0 1\r\nA\r\nset @c 0 0 2\r\nCC\r\ngat 100 @a @b @c\r\n\
               gats 200 @c @a @x\r\nmg @a t\r\nmg @c t\r\ngat 0 @a\r\nmg @a t\r\n\
               gat -1 @c\r\nget @c\r\n"],
        ),
        case(
            "gat bad forms",
            &["gat abc @a\r\ngat\r\ngat 10\r\ngats\r\nget\r\ngets\r\ngats 10\r\n"],
        ),
        case(
            "keys of 250 bytes",
            &[&format!(
                "set {k250} 0 0 1\r\nx\r\nget {k250}\r\ngets @a {k250} @b\r\nmg {k250} v k\r\n\
                 touch {k250} 10\r\nincr {k250} 1\r\ndelete {k250}\r\nget {k250}\r\n"
            )],
        ),
        // One command a step: memcached 1.6.18 drops the error lines still queued from the same
        // read when a get's key is over 250 bytes (an accident of its reply batching).
        case_bytes(
            "keys of 251 bytes",
            [
                "set {k} 0 0 1\r\nx\r\n",
                "get {k}\r\n",
                "get @a {k}\r\n",
                "gets {k}\r\n",
                "gat 10 {k}\r\n",
                "delete {k}\r\n",
                "incr {k} 1\r\n",
                "touch {k} 1\r\n",
                "set {k} 0 0 1 noreply\r\nx\r\n",
                "mg {k} v\r\n",
                "ms {k} 1\r\nx\r\n",
                "md {k}\r\n",
                "ma {k}\r\n",
                "me {k}\r\n",
            ]
            .iter()
            .map(|step| step.replace("{k}", &k251).into_bytes())
            .collect(),
        ),
        case("multiget line over 2048 bytes", &[&format!(
            "set @multiget-key-007 0 0 2\r\nhi\r\nset @multiget-key-113 0 0 2\r\nho\r\nget{many_keys}\r\n"
        )]),
        // --- incr / decr ---
        case(
            "incr and decr",
            &["set @n 0 0 2\r\n10\r\nincr @n 5\r\ndecr @n 3\r\nincr @n 1 noreply\r\n\
               decr @n 1 noreply\r\nget @n\r\nincr @n 0\r\n"],
        ),
        case(
            "decr below zero stops at zero",
            &["set @n 0 0 1\r\n5\r\ndecr @n 10\r\nget @n\r\ndecr @n 1\r\n"],
        ),
        case(
            "incr wraps at 64 bits",
            &["set @n 0 0 20\r\n18446744073709551615\r\nincr @n 1\r\nget @n\r\n\
               set @m 0 0 20\r\n18446744073709551610\r\nincr @m 10\r\nget @m\r\n"],
        ),
        case(
            "incr grows and decr pads the value",
            &["set @n 3 0 2\r\n99\r\nincr @n 1\r\nget @n\r\ndecr @n 1\r\nget @n\r\n\
               incr @n 1\r\nget @n\r\ndecr @n 95\r\ngets @n\r\n"],
        ),
        case(
            "incr on a non-numeric value",
            &["set @a 0 0 3\r\nabc\r\nincr @a 1\r\nset @b 0 0 3\r\n12a\r\ndecr @b 1\r\n\
               set @c 0 0 20\r\n18446744073709551616\r\nincr @c 1\r\nset @d 0 0 0\r\n\r\nincr @d 1\r\n\
               set @e 0 0 2\r\n-1\r\nincr @e 1\r\nincr @a 1 noreply\r\n"],
        ),
        case(
            "incr with a huge or bad delta",
            &["set @n 0 0 1\r\n1\r\nincr @n 18446744073709551616\r\nincr @n abc\r\nincr @n -1\r\n\
               decr @n 1x\r\nincr @n 18446744073709551615\r\ndecr @n 18446744073709551615\r\n\
               incr @n x noreply\r\nget @n\r\n"],
        ),
        case(
            "incr on a missing key and bad forms",
            &["incr @none 1\r\ndecr @none 1\r\nincr @none 1 noreply\r\nincr @n\r\nincr\r\n\
               incr @n 1 2 3\r\ndecr @n 1 2\r\n"],
        ),
        // --- delete ---
        case(
            "delete",
            &["set @a 0 0 1\r\nx\r\ndelete @a\r\ndelete @a\r\nset @a 0 0 1\r\nx\r\ndelete @a 0\r\n\
               get @a\r\nset @a 0 0 1\r\nx\r\ndelete @a noreply\r\nget @a\r\nset @a 0 0 1\r\nx\r\n\
               delete @a 0 noreply\r\nget @a\r\ndelete @a noreply\r\n"],
        ),
        case(
            "delete bad forms",
            &["set @a 0 0 1\r\nx\r\ndelete @a 1\r\ndelete @a 0 0\r\ndelete @a x noreply\r\n\
               delete @a 1 noreply\r\ndelete\r\ndelete @a 0 noreply extra\r\nget @a\r\n"],
        ),
        // --- touch ---
        case(
            "touch",
            &["set @a 0 0 1\r\nx\r\ntouch @a 100\r\nmg @a t\r\ntouch @none 10\r\ntouch @a abc\r\n\
               touch @a 10 noreply\r\nmg @a t\r\ntouch @a\r\ntouch @a 0\r\nmg @a t\r\n\
               touch @a -1\r\nget @a\r\ntouch @a 1 2 3\r\n"],
        ),
        // --- flush_all, verbosity, version, quit ---
        case(
            "flush_all",
            &["set @a 0 0 1\r\nx\r\nflush_all\r\nget @a\r\nset @b 0 0 1\r\nx\r\nget @b\r\n\
               flush_all 0\r\nget @b\r\nset @c 0 0 1\r\nx\r\nflush_all noreply\r\nget @c\r\n\
               set @d 0 0 1\r\nx\r\nflush_all 0 noreply\r\nget @d\r\nflush_all abc\r\n\
               flush_all abc noreply\r\nflush_all 0 0 0\r\nset @e 0 0 1\r\nx\r\nget @e\r\n\
               flush_all -1\r\nget @e\r\n"],
        ),
        // Malformed `slabs` commands (a well-formed one differs: Headroom has no slab classes).
        case(
            "slabs errors",
            &["slabs automove invalid\r\nslabs automove 3\r\nslabs automove\r\nslabs\r\n\
               slabs bogus 1\r\nslabs automove ratio\r\nslabs automove ratio x\r\n\
               slabs automove x noreply\r\nslabs reassign 1\r\n"],
        ),
        case("watch errors", &["watch bogus\r\nwatch fetchers bogus\r\n"]),
        case(
            "verbosity",
            &["verbosity 1\r\nverbosity 0\r\nverbosity\r\nverbosity x\r\nverbosity 1 noreply\r\n\
               verbosity 0 noreply\r\nverbosity 1 2 3\r\nverbosity x noreply\r\n"],
        ),
        case("version", &["version\r\nversion extra\r\n"]),
        case("quit", &["set @a 0 0 1\r\nx\r\nget @a\r\nquit\r\nget @a\r\n"]),
        case("quit with an argument", &["quit now\r\n"]),
        // --- bad input ---
        case(
            "unknown commands",
            &["bogus\r\nfoo bar baz\r\nGET @a\r\nSET @a 0 0 1\r\nsets @a\r\nx\r\nmz @a\r\n"],
        ),
        // Malformed `lru_crawler` commands and a metadump behind a reply (a well-formed crawl
        // or dump differs: the items and their figures are not memcached's; memcached's
        // crawler thread stops some time after `disable` answers, so what follows it races).
        case(
            "lru_crawler errors",
            &["lru_crawler enable\r\nlru_crawler crawl 0\r\nlru_crawler crawl 64\r\n\
               lru_crawler crawl x\r\nlru_crawler metadump 1,x\r\nlru_crawler tocrawl x\r\n\
               lru_crawler sleep -\r\nlru_crawler\r\nlru_crawler bogus\r\n\
               lru_crawler crawl\r\nlru_crawler crawl 1 2\r\n",
              "mg @a v\r\nlru_crawler metadump all\r\n"],
        ),
        // Headroom does not serve some of memcached's administrative commands (`lru`,
        // `extstore`, ...: ERROR by design), but `shutdown` answers as memcached's without -A.
        case("shutdown", &["shutdown\r\nshutdown graceful\r\n"]),
        case("empty lines", &["\r\n", "\n", " \r\n", "\r\r\n"]),
        case("NUL ends the line", &["set @a 0 0 1\r\nx\r\nget @a\0junk\r\n"]),
        case("tab belongs to the key", &["set @a\tb 0 0 1\r\nx\r\nget @a\tb\r\nget @a\r\n"]),
        raw_case("line over 2048 bytes closes", vec![b'x'; 3000]),
        raw_case(
            "set line over 2048 bytes closes",
            cat(&[b"set @a 0 0 1 ", &[b'9'; 3000]]),
        ),
        case("HTTP request closes", &["GET / HTTP/1.1\r\n"]),
        case(
            "bad numbers",
            &["set @a x 0 1\r\nz\r\nset @a 0 x 1\r\nz\r\nset @a 0 0 x\r\nz\r\nset @a 0 0 1x\r\nz\r\n\
               set @a 0 0 -1\r\nz\r\nset @a 0 0\r\nz\r\nset @a 0 0 1 2 3\r\nz\r\nget @a\r\n"],
        ),
        // A bad length under noreply is answered since 1.6.45 (its parser reads the length
        // before noreply), not by 1.6.18: tests/number_limits.rs holds that case.
        case(
            "bad numbers noreply",
            &["set @a x 0 1 noreply\r\nz\r\nget @a\r\n"],
        ),
        case(
            "data block longer than declared",
            &["set @a 0 0 3\r\nold\r\nset @a 0 0 3\r\nabcXY\r\nget @a\r\n\
               set @b 0 0 1 noreply\r\nxyz\r\nget @b\r\nappend @a 0 0 1\r\nxx\r\nget @a\r\n"],
        ),
        case("data block missing its CR LF", &["set @a 0 0 3\r\nabc", "get @a\r\n"]),
        case("data block ending in LF only", &["set @a 0 0 3\r\nabc\nget @a\r\n"]),
        case("line ending in LF only", &["set @a 0 0 1\nx\r\nget @a\n"]),
        case_bytes(
            "value that fits the item limit",
            vec![cat(&[
                b"set @a 0 0 1000000\r\n",
                &fits,
                b"\r\nget @a\r\nms @b 1000000 T0\r\n",
                &fits,
                b"\r\nmg @b s v\r\n",
            ])],
        ),
        case_bytes(
            "value over the item limit",
            vec![cat(&[
                b"set @a 0 0 1\r\nx\r\nset @a 0 0 2000000\r\n",
                &too_large,
                b"\r\nget @a\r\nset @b 0 0 1\r\nx\r\nadd @b 0 0 2000000\r\n",
                &too_large,
                b"\r\nget @b\r\nset @c 0 0 2000000 noreply\r\n",
                &too_large,
                b"\r\nset @d 0 0 1\r\nx\r\nms @d 2000000 MR\r\n",
                &too_large,
                b"\r\nmg @d v\r\nms @e 2000000 q\r\n",
                &too_large,
                b"\r\nappend @b 0 0 2000000\r\n",
                &too_large,
                b"\r\nget @b\r\n",
            ])],
        ),
        // --- meta ---
        case("mn", &["mn\r\nmn\r\n"]),
        case(
            "mg flags",
            &["set @a 7 0 3\r\nabc\r\nmg @a h\r\nmg @a h\r\nmg @a v\r\nmg @a k v f s\r\nmg @a c\r\n\
               mg @a t\r\nmg @a O123 k\r\nmg @a\r\nmg @a q\r\nmg @a q v\r\nmg @a l\r\n\
               mg @a s t f O9 k v c\r\nmg @a vfoo\r\nmg @a u v\r\n"],
        ),
        case(
            "mg misses",
            &["mg @none\r\nmg @none v k O9\r\nmg @none q\r\nmg @none q v k\r\nmg @none s t f c\r\n\
               mg @none v\r\n"],
        ),
        case(
            "mg bad forms",
            &["mg\r\nmg @a Z\r\nmg @a v v\r\nmg @a Tx\r\nmg @a Nx\r\n\
               mg @a O123456789012345678901234567890123\r\n\
               mg @a 1 2 3 4 5 6 7 8 9 a b c d e f g h i\r\n"],
        ),
        case(
            "mg T N R",
            &["set @a 0 0 1\r\nx\r\nmg @a T30\r\nmg @a t\r\nmg @new N30 v t\r\nmg @new v t\r\n\
               mg @new q N30\r\nset @r 0 10 1\r\nx\r\nmg @r R30 v\r\nmg @r R30 v\r\n"],
        ),
        case(
            "mg base64 key",
            &["ms bWdiNjQtMQ== 3 b\r\nabc\r\nmg bWdiNjQtMQ== b k v\r\nget mgb64-1\r\n\
               mg bWdiNjQtMg== b k v\r\nmg !!!! b v\r\n"],
        ),
        case(
            "ms modes",
            &["ms @a 1 ME\r\nx\r\nms @a 1 ME\r\ny\r\nmg @a v\r\n\
               ms @b 1 MR\r\nx\r\nms @b 1\r\ny\r\nms @b 1 MR\r\nz\r\nmg @b v\r\n\
               ms @c 1 MA\r\nx\r\nms @c 1 MS\r\nm\r\nms @c 1 MA\r\na\r\nms @c 1 MP\r\np\r\nmg @c v\r\n\
               ms @d 1 MP\r\nx\r\nms @e 1 Ms\r\nx\r\nms @e 1 Ma\r\ny\r\nmg @e v\r\n"],
        ),
        case(
            "ms invalid mode",
            &["ms @a 2 MX\r\nxx\r\nmg @a v\r\nms @a 2 MEE\r\nxx\r\nmg @a v\r\n"],
        ),
        case(
            "ms flags",
            &["ms @a 3 F5 T100 k O77 c\r\nabc\r\nmg @a f t v\r\nms @b 3 q\r\nabc\r\n\
               ms @nob 1 q MR\r\nx\r\nmg @b v\r\nms @c 2 F4294967295 T0\r\nhi\r\nmg @c f t v\r\n\
               ms @d 2 T-1\r\nhi\r\nmg @d v\r\nms @e 2 I\r\nhi\r\nmg @e v\r\nms @g 0\r\n\r\nmg @g v s\r\n"],
        ),
        case(
            "ms with CAS",
            &[
                "ms @a 1 c\r\nx\r\n",
                "ms @a 1 C{cas+1}\r\ny\r\nmg @a v\r\nms @a 1 C{cas} c\r\nz\r\nmg @a v\r\n\
                 ms @none 1 C123\r\nx\r\nms @none 1 C123 ME\r\nx\r\n",
            ],
        ),
        case(
            "ms modes with CAS",
            &[
                "ms @a 1 c\r\nx\r\n",
                "ms @a 1 MA C{cas+1}\r\ny\r\nmg @a v\r\nms @a 1 MA C{cas}\r\nz\r\nmg @a v c\r\n",
                "ms @a 1 MP C{cas}\r\np\r\nms @a 1 ME C{cas}\r\ne\r\nms @a 1 MR C{cas}\r\nr\r\n\
                 mg @a v\r\nms @b 1 MA C1\r\nx\r\nms @c 1 ME C1\r\nx\r\nmg @c v\r\n",
            ],
        ),
        case(
            "ms invalidate with an older CAS",
            &[
                "ms @a 1 c\r\nx\r\n",
                "ms @a 1 C1 I\r\ny\r\nmg @a v c\r\n",
                // The stale item's own CAS (a client reads it; CAS values are unique, not
                // consecutive per key).
                "mg @a v\r\nms @a 1 C{cas} I\r\nz\r\nmg @a v\r\n",
            ],
        ),
        case(
            "ms bad forms",
            &["ms @a 2 Z\r\nxx\r\nmg @a v\r\nms @a 2 k k\r\nxx\r\nms @a\r\nms @a abc\r\nxx\r\n\
               ms @a -1\r\nxx\r\nms @a 2 Fx\r\nxx\r\nms @a 2 Tx\r\nxx\r\nms @a 2 Cx\r\nxx\r\n\
               ms @a 2\r\nxxyy\r\nms @a 2 O123456789012345678901234567890123\r\nxx\r\nmg @a v\r\n"],
        ),
        case(
            "ms base64 key",
            &["ms bXNiNjQtMQ== 2 b k\r\nhi\r\nmg bXNiNjQtMQ== b v k\r\nget msb64-1\r\n\
               ms !!!! 2 b\r\nhi\r\nms bXNiNjQtMg== 2 b q k O1\r\nho\r\nmn\r\nget msb64-2\r\n"],
        ),
        case(
            "md",
            &["set @a 0 0 1\r\nx\r\nmd @a\r\nmd @a\r\nmd @a q\r\nset @a 0 0 1\r\nx\r\nmd @a q\r\n\
               mg @a\r\nset @b 0 0 1\r\nx\r\nmd @b k O5\r\nmd @b k O5\r\nmd @a Z\r\nmd @a q q\r\n\
               md\r\n"],
        ),
        case(
            "md with CAS",
            &[
                "ms @a 1 c\r\nx\r\n",
                "md @a C{cas+1}\r\nmg @a v\r\nmd @a C{cas}\r\nmg @a\r\nmd @none C1\r\n",
            ],
        ),
        case(
            "md invalidate with a TTL",
            &["set @a 0 0 1\r\nx\r\nmd @a I T30\r\nmg @a v t\r\nmg @a v\r\nmd @a I\r\nmg @a v\r\n\
               ms @a 1\r\ny\r\nmg @a v\r\n"],
        ),
        case(
            "ma",
            &["set @n 0 0 2\r\n10\r\nma @n\r\nma @n v\r\nma @n MD v\r\nma @n M- D5 v\r\n\
               ma @n M+ D100 v\r\nma @n MI v\r\nma @n Md v\r\nma @n Mi v\r\nget @n\r\nma @n q\r\n\
               ma @n k O3\r\nmg @n v\r\n"],
        ),
        case(
            "ma misses and autovivify",
            &["ma @x\r\nma @x q\r\nma @x v\r\nma @x N0 J13 v\r\nma @x N0 J13 v\r\n\
               ma @y N100 J5 t v\r\nma @z q N0 J1\r\nmg @z v\r\nma @w N0 v\r\nma @u MD N0 J3 v\r\n"],
        ),
        case(
            "ma below zero and wrapping",
            &["set @n 0 0 1\r\n3\r\nma @n MD D10 v\r\nset @m 0 0 20\r\n18446744073709551615\r\n\
               ma @m v\r\nma @m D18446744073709551615 v\r\n"],
        ),
        case(
            "ma t and c",
            &["set @n 0 0 1\r\n5\r\nma @n t c v\r\nset @o 0 100 1\r\n5\r\nma @o t v\r\n\
               ma @o T50 t\r\nmg @o t\r\n"],
        ),
        case(
            "ma with CAS",
            &[
                "set @n 0 0 1\r\n5\r\nmg @n c\r\n",
                "ma @n C{cas+1} v\r\nma @n C{cas} v\r\nma @n C{cas} v\r\n",
            ],
        ),
        case(
            "ma bad forms",
            &["set @n 0 0 1\r\n1\r\nma @n D18446744073709551616\r\nma @n Dabc\r\nma @n MX\r\n\
               ma @n Jx N0\r\nma @n Z\r\nset @s 0 0 1\r\nx\r\nma @s\r\nma\r\nma @n v v\r\n"],
        ),
        case(
            "me",
            &["set @a 0 0 1\r\nx\r\nme @a\r\nme @none\r\nme\r\nme @a b\r\n"],
        ),
        // --- pipelines ---
        case(
            "pipeline of text and meta commands",
            &["set @a 0 0 1\r\nx\r\nmg @a v\r\nget @a @b\r\nms @b 2 T0\r\nyy\r\nmn\r\ngets @b\r\n\
               incr @c 1\r\nma @c N0 J7 v\r\ndelete @a\r\nmd @b q\r\nmg @a\r\nmn\r\nversion\r\n\
               touch @c 100\r\nmg @c t v\r\nadd @c 0 0 1\r\nz\r\nmd @c\r\nmn\r\n"],
        ),
        case(
            "pipeline with errors in between",
            &["set @a 0 0 1\r\nx\r\nbogus\r\nget @a\r\nset @a 0 0 1\r\nxyz\r\nmg @a v\r\n\
               incr @a x\r\nms @a 1 Z\r\ny\r\nmg @a v\r\n"],
        ),
        // --- stats that must equal memcached's ---
        case("stats reset", &["stats reset\r\n"]),
        case("stats of an unknown group", &["stats bogus\r\nstats bogus extra\r\n"]),
        // Only this case's keys hold the prefix delimiter `:`, so the dump has one prefix.
        case(
            "stats detail dump",
            &["stats detail dump\r\nstats detail on\r\nset @pfx:a 0 0 1\r\nx\r\nget @pfx:a\r\n\
               get @pfx:b\r\ndelete @pfx:a\r\nstats detail dump\r\nstats detail off\r\n"],
        ),
        case(
            "stats detail",
            &["stats detail\r\nstats detail bogus\r\nstats detail on\r\nstats detail off\r\n"],
        ),
        // Malformed cachedumps, and a class that holds nothing (memcached has no class 63 at
        // its default growth factor; Headroom's are 1 to 3).
        case(
            "stats cachedump refusals and an empty class",
            &["stats cachedump\r\nstats cachedump 1\r\nstats cachedump x 1\r\n\
               stats cachedump 1 -1\r\nstats cachedump 64 1\r\n\
               stats cachedump 63 1\r\nstats cachedump 63 0 extra\r\n"],
        ),
    ]
}

// ---------------------------------------------------------------------------------------------
// Running and normalising
// ---------------------------------------------------------------------------------------------

fn number(bytes: &[u8]) -> Option<u64> {
    std::str::from_utf8(bytes).ok()?.parse().ok()
}

/// A meta reply line's status code.
fn is_meta_code(word: &[u8]) -> bool {
    matches!(word, b"VA" | b"HD" | b"EN" | b"NF" | b"NS" | b"EX")
}

/// A reply with what legitimately differs replaced (CAS numbers in `VALUE` lines and meta `c`
/// tokens, the version string, `me`'s fields after `exp=`), and the last CAS value seen.
/// Data blocks are copied untouched.
fn normalise(reply: &[u8]) -> (Vec<u8>, Option<u64>) {
    let mut out = Vec::with_capacity(reply.len());
    let mut cas = None;
    let mut at = 0;
    while at < reply.len() {
        let Some(end) = reply[at..].windows(2).position(|w| w == b"\r\n") else {
            out.extend_from_slice(&reply[at..]);
            break;
        };
        let line = &reply[at..at + end];
        at += end + 2;
        let mut words: Vec<Vec<u8>> = line.split(|&b| b == b' ').map(<[u8]>::to_vec).collect();
        let mut data = None;
        match words[0].as_slice() {
            b"VALUE" if words.len() >= 4 => {
                data = number(&words[3]);
                if words.len() == 5 {
                    cas = number(&words[4]).or(cas);
                    words[4] = b"<cas>".to_vec();
                }
            }
            b"VERSION" if words.len() > 1 && !words[1].is_empty() => {
                words = vec![b"VERSION".to_vec(), b"<version>".to_vec()];
            }
            b"ME" if words.len() > 2 && words[2].starts_with(b"exp=") => {
                words.truncate(2);
                words.push(b"exp=<...>".to_vec());
            }
            code if is_meta_code(code) => {
                let flags_from = if code == b"VA" {
                    data = words.get(1).and_then(|w| number(w));
                    2
                } else {
                    1
                };
                for word in words.iter_mut().skip(flags_from) {
                    if word.len() > 1 && word[0] == b'c' {
                        if let Some(n) = number(&word[1..]) {
                            cas = Some(n);
                            *word = b"c<cas>".to_vec();
                        }
                    }
                }
            }
            _ => {}
        }
        out.extend_from_slice(&words.join(&b' '));
        out.extend_from_slice(b"\r\n");
        if let Some(len) = data {
            let end = (at + len as usize + 2).min(reply.len());
            out.extend_from_slice(&reply[at..end]);
            at = end;
        }
    }
    (out, cas)
}

/// Equal, or equal but for meta `t`/`l` seconds that differ by one (the servers' clocks tick
/// apart).
fn same_but_seconds(a: &[u8], b: &[u8]) -> bool {
    if a == b {
        return true;
    }
    let lines =
        |r: &[u8]| -> Vec<Vec<u8>> { r.split(|&x| x == b'\n').map(<[u8]>::to_vec).collect() };
    let (la, lb) = (lines(a), lines(b));
    la.len() == lb.len()
        && la.iter().zip(&lb).all(|(x, y)| {
            if x == y {
                return true;
            }
            let wx: Vec<&[u8]> = x.split(|&c| c == b' ').collect();
            let wy: Vec<&[u8]> = y.split(|&c| c == b' ').collect();
            is_meta_code(wx[0])
                && wx.len() == wy.len()
                && wx.iter().zip(&wy).all(|(p, q)| {
                    let seconds = |w: &[u8]| -> Option<i64> {
                        let w = w.strip_suffix(b"\r").unwrap_or(w);
                        if w.len() > 1 && matches!(w[0], b't' | b'l') {
                            std::str::from_utf8(&w[1..]).ok()?.parse().ok()
                        } else {
                            None
                        }
                    };
                    p == q
                        || (p.first() == q.first()
                            && matches!((seconds(p), seconds(q)), (Some(s), Some(t)) if (s - t).abs() <= 1 && s >= 0 && t >= 0))
                })
        })
}

/// One case on one server: each step's reply (until the connection closed).
fn run_case(addr: SocketAddr, prefix: &str, case: &Case) -> Vec<Reply> {
    let mut stream = connect(addr);
    let mut cas: Option<u64> = None;
    let mut replies = Vec::new();
    for step in &case.steps {
        let mut bytes = replace_all(&step.bytes, &[PREFIX_MARK], prefix.as_bytes());
        if let Some(cas) = cas {
            bytes = replace_all(&bytes, b"{cas}", cas.to_string().as_bytes());
            bytes = replace_all(&bytes, b"{cas+1}", (cas + 1).to_string().as_bytes());
        }
        let mut wanted = 0;
        if step.sentinel {
            bytes.extend_from_slice(SENTINEL);
            wanted = mn_lines(&replace_all(&bytes, b"mn\r\n", b"MN\r\n"));
        }
        // A server that closed mid-write is seen by the read.
        let _ = stream.write_all(&bytes);
        let reply = read_reply(&mut stream, wanted);
        if let (_, Some(seen)) = normalise(&reply.bytes) {
            cas = Some(seen);
        }
        let closed = reply.closed;
        replies.push(reply);
        if closed {
            break;
        }
    }
    replies
}

fn run_all(addr: SocketAddr, cases: &[Case]) -> Vec<Vec<Reply>> {
    cases
        .iter()
        .enumerate()
        .map(|(i, case)| run_case(addr, &format!("{i:03}."), case))
        .collect()
}

#[test]
fn text_and_meta_replies_equal_memcached() {
    let Some(memcached) = Memcached::start() else {
        return;
    };
    let headroom = Server::start(&["--threads", "2", "--max-item-size", ITEM_MAX]);
    let cases = cases();
    let started = Instant::now();
    // Both servers run the whole table at once, each on its own thread.
    let (expected, got) = std::thread::scope(|s| {
        let theirs = s.spawn(|| run_all(memcached.addr(), &cases));
        let ours = s.spawn(|| run_all(headroom.addr, &cases));
        (theirs.join().unwrap(), ours.join().unwrap())
    });
    let version = memcached.version();
    let known = match version.as_str() {
        "1.6.45" => KNOWN_DIFFERENCES_1_6_45,
        _ => CHANGED_SINCE_1_6_18,
    };
    println!("compared with memcached {version}");
    let mut failures = Vec::new();
    let mut skipped = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        if let Some((_, why)) = known.iter().find(|(name, _)| *name == case.name) {
            skipped.push(format!("  `{}`: {why}", case.name));
            continue;
        }
        let (theirs, ours) = (&expected[i], &got[i]);
        for step in 0..theirs.len().max(ours.len()) {
            let (t, o) = (theirs.get(step), ours.get(step));
            let matches = match (t, o) {
                (Some(t), Some(o)) => {
                    t.closed == o.closed
                        && same_but_seconds(&normalise(&t.bytes).0, &normalise(&o.bytes).0)
                }
                _ => false,
            };
            if !matches {
                let prefix = format!("{i:03}.");
                let request = replace_all(
                    &case
                        .steps
                        .get(step)
                        .map(|s| s.bytes.clone())
                        .unwrap_or_default(),
                    &[PREFIX_MARK],
                    prefix.as_bytes(),
                );
                let describe = |r: Option<&Reply>| match r {
                    Some(r) => format!(
                        "{}{}",
                        show(&r.bytes),
                        if r.closed { " <closed>" } else { "" }
                    ),
                    None => "<no step: the connection closed before>".to_string(),
                };
                failures.push(format!(
                    "case {i} `{}` step {step}\n  request:   {}\n  memcached: {}\n  headroom:  {}",
                    case.name,
                    show(&request),
                    describe(t),
                    describe(o)
                ));
                break;
            }
        }
    }
    println!(
        "{} of {} cases equal memcached {version}'s replies ({:.1} s); {} not compared:\n{}",
        cases.len() - failures.len() - skipped.len(),
        cases.len(),
        started.elapsed().as_secs_f64(),
        skipped.len(),
        skipped.join("\n")
    );
    assert!(
        failures.is_empty(),
        "{} cases differ from memcached:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

// ---------------------------------------------------------------------------------------------
// Headroom alone: STAT groups over text, large values
// ---------------------------------------------------------------------------------------------

/// Sends `request` and the sentinel; the reply without the sentinel's `MN`.
fn call(stream: &mut TcpStream, request: &[u8]) -> Vec<u8> {
    stream.write_all(&cat(&[request, SENTINEL])).unwrap();
    let wanted = mn_lines(&replace_all(request, b"mn\r\n", b"MN\r\n")) + 1;
    let reply = read_reply(stream, wanted);
    assert!(!reply.closed, "{} closed the connection", show(request));
    let body = reply
        .bytes
        .strip_suffix(b"MN\r\n")
        .unwrap_or_else(|| panic!("{}: no MN after {}", show(request), show(&reply.bytes)));
    body.to_vec()
}

#[test]
fn stats_groups_answer_over_text() {
    let server = Server::start(&["--threads", "2"]);
    let mut stream = connect(server.addr);
    assert_eq!(
        call(&mut stream, b"set statkey 0 0 1\r\nx\r\nget statkey\r\n"),
        b"STORED\r\nVALUE statkey 0 1\r\nx\r\nEND\r\n"
    );
    for (group, at_least) in [
        ("", 1),
        (" settings", 1),
        (" items", 0),
        (" slabs", 0),
        (" sizes", 0),
        (" conns", 1),
        (" detail dump", 0),
    ] {
        let request = format!("stats{group}\r\n");
        let reply = call(&mut stream, request.as_bytes());
        let text = String::from_utf8(reply.clone())
            .unwrap_or_else(|_| panic!("stats{group}: not text: {}", show(&reply)));
        let body = text
            .strip_suffix("END\r\n")
            .unwrap_or_else(|| panic!("stats{group}: no END: {}", show(&reply)));
        let lines: Vec<&str> = body.split_terminator("\r\n").collect();
        assert!(
            lines.len() >= at_least,
            "stats{group}: {} lines: {text:?}",
            lines.len()
        );
        for line in &lines {
            let words: Vec<&str> = line.split(' ').collect();
            // memcached's `stats detail dump` lines are `PREFIX ...`; every other group's are
            // `STAT <name> <value>`.
            let ok = if group == " detail dump" {
                words[0] == "STAT" || words[0] == "PREFIX"
            } else {
                words[0] == "STAT" && words.len() >= 3 && !words[1].is_empty()
            };
            assert!(ok, "stats{group}: bad line {line:?} in {text:?}");
        }
    }
    assert_eq!(call(&mut stream, b"stats reset\r\n"), b"RESET\r\n");
    // Still serving.
    assert_eq!(
        call(&mut stream, b"get statkey\r\n"),
        b"VALUE statkey 0 1\r\nx\r\nEND\r\n"
    );
}

/// `stats cachedump <class> <limit>` lists the items of one of `stats items`' classes (memcached
/// walks only its cold LRU, so the listing itself cannot be compared).
#[test]
fn cachedump_lists_the_items_of_a_class() {
    let server = Server::start(&["--threads", "2"]);
    let mut stream = connect(server.addr);
    assert_eq!(
        call(
            &mut stream,
            b"set dump-a 0 0 3\r\nabc\r\nset dump-b 0 2000000000 1\r\nx\r\n\
              set dump-gone 0 -1 1\r\nx\r\n"
        ),
        b"STORED\r\nSTORED\r\nSTORED\r\n"
    );
    let reply = call(&mut stream, b"stats cachedump 1 0\r\n");
    let text = String::from_utf8(reply).unwrap();
    let mut lines: Vec<&str> = text.split_terminator("\r\n").collect();
    assert_eq!(lines.pop(), Some("END"), "{text:?}");
    lines.sort_unstable();
    // Value bytes and the expiry as a Unix time (0: never); the expired item is left out.
    assert_eq!(
        lines,
        ["ITEM dump-a [3 b; 0 s]", "ITEM dump-b [1 b; 2000000000 s]"]
    );
    // A limit; another class; a class Headroom does not have.
    let one = call(&mut stream, b"stats cachedump 1 1\r\n");
    assert!(one.starts_with(b"ITEM dump-") && one.ends_with(b"]\r\nEND\r\n"));
    assert_eq!(
        one.iter().filter(|&&b| b == b'\n').count(),
        2,
        "{}",
        show(&one)
    );
    assert_eq!(call(&mut stream, b"stats cachedump 2 0\r\n"), b"END\r\n");
    assert_eq!(call(&mut stream, b"stats cachedump 9 0\r\n"), b"END\r\n");
}

/// A `stats` figure over text.
fn text_stat(stream: &mut TcpStream, group: &str, name: &str) -> Option<u64> {
    let reply = call(stream, format!("stats {group}\r\n").as_bytes());
    let text = String::from_utf8(reply).unwrap();
    text.lines()
        .find_map(|line| line.strip_prefix(&format!("STAT {name} ")))
        .map(|value| value.trim().parse().unwrap())
}

/// `lru_crawler metadump` lists every live item once, in memcached's line format, a buffer at
/// a time before the commands after it; `crawl` reclaims expired items before it answers;
/// `disable` stops the background expiry sweep and refuses both.
#[test]
fn lru_crawler_dumps_every_item_and_crawls_expired_ones() {
    let server = Server::start(&["--threads", "2"]);
    let mut s = connect(server.addr);
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let fixed = pattern(2, 256 << 10);
    let large = pattern(3, 1 << 20);
    let stores = cat(&[
        b"set md-a 0 0 3\r\nabc\r\nset md%\xc3\xa9 7 2000000000 1\r\nx\r\n",
        b"set md-gone 0 -1 1\r\nx\r\n",
        format!("set md-fixed 0 0 {}\r\n", fixed.len()).as_bytes(),
        &fixed,
        format!("\r\nset md-large 0 0 {}\r\n", large.len()).as_bytes(),
        &large,
        b"\r\n",
    ]);
    let writer = send_in_background(&s, cat(&[&stores, SENTINEL]));
    let reply = read_reply(&mut s, 1);
    writer.join().unwrap();
    assert_eq!(
        reply.bytes,
        b"STORED\r\n"
            .repeat(5)
            .into_iter()
            .chain(*b"MN\r\n")
            .collect::<Vec<u8>>()
    );
    let gets = call(&mut s, b"gets md-a\r\n");
    let cas: u64 = String::from_utf8(gets)
        .unwrap()
        .lines()
        .next()
        .unwrap()
        .rsplit(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();

    let dump = |s: &mut TcpStream, classes: &str| -> Vec<String> {
        let reply = call(s, format!("lru_crawler metadump {classes}\r\n").as_bytes());
        let text = String::from_utf8(reply).unwrap();
        let body = text
            .strip_prefix("OK\r\n")
            .and_then(|text| text.strip_suffix("END\r\n"))
            .unwrap_or_else(|| panic!("no OK or END: {text:?}"));
        let mut lines: Vec<String> = body.lines().map(str::to_string).collect();
        lines.sort_unstable();
        lines
    };
    let all = dump(&mut s, "all");
    let now = started + 60;
    let keys: Vec<&str> = all.iter().map(|l| l.split(' ').next().unwrap()).collect();
    assert_eq!(
        keys,
        [
            "key=md%25%C3%A9",
            "key=md-a",
            "key=md-fixed",
            "key=md-large"
        ],
        "{all:#?}"
    );
    let field = |line: &str, name: &str| -> String {
        line.split(' ')
            .find_map(|w| w.strip_prefix(&format!("{name}=")))
            .unwrap_or_else(|| panic!("no {name} in {line:?}"))
            .to_string()
    };
    let a = &all[1];
    assert_eq!(field(a, "exp"), "-1");
    assert_eq!(field(a, "cas"), cas.to_string());
    assert_eq!(field(a, "fetch"), "yes");
    assert_eq!(field(a, "cls"), "1");
    assert_eq!(field(a, "size"), "7");
    assert_eq!(field(a, "flags"), "0");
    assert!(
        a.ends_with(' '),
        "1.6.45 ends each line with a blank: {a:?}"
    );
    let la: u64 = field(a, "la").parse().unwrap();
    assert!((started..now).contains(&la), "{a}");
    assert_eq!(field(&all[0], "exp"), "2000000000");
    assert_eq!(field(&all[0], "flags"), "7");
    assert_eq!(field(&all[0], "fetch"), "no");
    assert_eq!(field(&all[2], "cls"), "2");
    assert_eq!(field(&all[2], "size"), (8 + (256 << 10)).to_string());
    assert_eq!(field(&all[3], "cls"), "3");
    assert_eq!(field(&all[3], "size"), (8 + (1 << 20)).to_string());
    // One class, two, and a class that holds nothing; `hash` is `all`.
    assert_eq!(dump(&mut s, "2"), [all[2].clone()]);
    assert_eq!(dump(&mut s, "1,3").len(), 3);
    assert!(dump(&mut s, "9").is_empty());
    assert_eq!(dump(&mut s, "hash"), all);
    // `mgdump` (1.6.19): an `mg` line per key, ready to be sent back with flags added; a key
    // that is not printable ASCII in base64 with `b`.
    let reply = String::from_utf8(call(&mut s, b"lru_crawler mgdump all\r\n")).unwrap();
    let body = reply
        .strip_prefix("OK\r\n")
        .and_then(|r| r.strip_suffix("EN\r\n"))
        .unwrap_or_else(|| panic!("no OK or EN: {reply:?}"));
    let mut mg: Vec<&str> = body.lines().collect();
    mg.sort_unstable();
    assert_eq!(
        mg,
        ["mg bWQlw6k= b", "mg md-a", "mg md-fixed", "mg md-large"]
    );
    assert_eq!(
        call(&mut s, b"lru_crawler mgdump 2\r\n"),
        b"OK\r\nmg md-fixed\r\nEN\r\n"
    );
    assert_eq!(
        call(&mut s, b"lru_crawler mgdump 99\r\n"),
        b"BADCLASS invalid class id\r\n"
    );
    assert_eq!(
        call(&mut s, b"mg nothing v\r\nlru_crawler mgdump all\r\n"),
        b"EN\r\nERROR cannot pipeline other commands before mgdump\r\n"
    );

    // Far more than one output buffer: every key once, and the command after it answered
    // after its END.
    const BULK: usize = 30_000;
    let mut bulk = Vec::new();
    for i in 0..BULK {
        bulk.extend_from_slice(format!("set bulk-{i} 0 0 1 noreply\r\nz\r\n").as_bytes());
    }
    let writer = send_in_background(&s, cat(&[&bulk, SENTINEL]));
    assert_eq!(read_reply(&mut s, 1).bytes, b"MN\r\n");
    writer.join().unwrap();
    let reply = call(&mut s, b"lru_crawler metadump all\r\nversion\r\n");
    let text = String::from_utf8(reply).unwrap();
    let (dumped, after) = text.split_once("END\r\n").unwrap();
    let dumped = dumped.strip_prefix("OK\r\n").unwrap();
    assert!(after.starts_with("VERSION "), "{after:?}");
    let mut seen = std::collections::HashSet::new();
    for line in dumped.lines() {
        assert!(
            seen.insert(line.split(' ').next().unwrap().to_string()),
            "twice: {line}"
        );
    }
    assert_eq!(seen.len(), BULK + 4);
    assert!(dumped.len() > 1 << 20, "{} bytes: one buffer", dumped.len());

    // Behind a reply not yet sent, memcached's refusal.
    assert_eq!(
        call(&mut s, b"mg nothing v\r\nlru_crawler metadump all\r\n"),
        b"EN\r\nERROR cannot pipeline other commands before metadump\r\n"
    );

    // With the sweep off, expired items stay until something reclaims them.
    assert_eq!(call(&mut s, b"lru_crawler disable\r\n"), b"OK\r\n");
    let mut short = Vec::new();
    for i in 0..100 {
        short.extend_from_slice(format!("set short-{i} 0 1 1 noreply\r\nz\r\n").as_bytes());
    }
    call(&mut s, &short);
    let reclaimed = text_stat(&mut s, "", "reclaimed").unwrap();
    std::thread::sleep(Duration::from_millis(3_200));
    assert_eq!(
        text_stat(&mut s, "", "reclaimed"),
        Some(reclaimed),
        "sweep ran while off"
    );
    assert_eq!(
        call(&mut s, b"lru_crawler crawl all\r\n"),
        b"CLIENT_ERROR lru crawler disabled\r\n"
    );
    assert_eq!(
        call(&mut s, b"lru_crawler metadump all\r\n"),
        b"CLIENT_ERROR lru crawler disabled\r\n"
    );
    let settings = call(&mut s, b"stats settings\r\n");
    assert!(settings
        .windows(21)
        .any(|w| w == b"STAT lru_crawler no\r\n"));
    // A crawl of another class leaves them; a crawl of theirs has reclaimed them all by its OK.
    assert_eq!(
        call(&mut s, b"lru_crawler enable\r\nlru_crawler crawl 2,3\r\n"),
        b"OK\r\nOK\r\n"
    );
    assert_eq!(call(&mut s, b"lru_crawler crawl 1\r\n"), b"OK\r\n");
    assert!(text_stat(&mut s, "", "reclaimed").unwrap() >= reclaimed + 100);
    assert_eq!(
        text_stat(&mut s, "items", "items:1:number"),
        Some(BULK as u64 + 2)
    );
    assert_eq!(
        call(&mut s, b"lru_crawler enable\r\n"),
        b"ERROR failed to start lru crawler thread\r\n"
    );
}

/// Writes `bytes` on another thread (a large request must not wait for its reader).
fn send_in_background(stream: &TcpStream, bytes: Vec<u8>) -> std::thread::JoinHandle<()> {
    let mut writer = stream.try_clone().unwrap();
    std::thread::spawn(move || writer.write_all(&bytes).unwrap())
}

/// Sends `request` and expects exactly `expected` back, then nothing more before an `MN`.
fn expect_exact(stream: &mut TcpStream, what: &str, request: Vec<u8>, expected: &[u8]) {
    let writer = send_in_background(stream, cat(&[&request, SENTINEL]));
    let got = read_exact_len(stream, expected.len());
    writer.join().unwrap();
    if got != expected {
        let at = got
            .iter()
            .zip(expected)
            .position(|(a, b)| a != b)
            .unwrap_or(0);
        let from = at.saturating_sub(40);
        panic!(
            "{what}: reply differs at byte {at} of {}\n  expected: {}\n  got:      {}",
            expected.len(),
            show(&expected[from..(at + 80).min(expected.len())]),
            show(&got[from..(at + 80).min(got.len())]),
        );
    }
    let rest = read_reply(stream, 1);
    assert_eq!(
        rest.bytes,
        b"MN\r\n",
        "{what}: after the reply: {}",
        show(&rest.bytes)
    );
}

fn text_value(key: &str, flags: u32, value: &[u8]) -> Vec<u8> {
    cat(&[
        format!("VALUE {key} {flags} {}\r\n", value.len()).as_bytes(),
        value,
        b"\r\n",
    ])
}

#[test]
fn large_values_over_text_and_meta() {
    const MAX: usize = 8 << 20;
    let server = Server::start(&["--threads", "2", "--max-item-size", "8M"]);
    let mut s = connect(server.addr);
    expect_exact(
        &mut s,
        "small",
        b"set small 0 0 5\r\nsmall\r\n".to_vec(),
        b"STORED\r\n",
    );
    let small_reply = text_value("small", 0, b"small");
    for (i, size) in [0, 1, 100 << 10, 300 << 10, 3 << 20]
        .into_iter()
        .enumerate()
    {
        let value = pattern(i as u64 + 1, size);
        let key = format!("text-{size}");
        let set = cat(&[
            format!("set {key} {i} 0 {size}\r\n").as_bytes(),
            &value,
            b"\r\n",
        ]);
        expect_exact(&mut s, &format!("set {size}"), set, b"STORED\r\n");
        let get = format!("get {key}\r\n").into_bytes();
        let hit = cat(&[&text_value(&key, i as u32, &value), b"END\r\n"]);
        expect_exact(&mut s, &format!("get {size}"), get, &hit);
        let mg = format!("mg {key} s f v\r\n").into_bytes();
        let va = cat(&[
            format!("VA {size} s{size} f{i}\r\n").as_bytes(),
            &value,
            b"\r\n",
        ]);
        expect_exact(&mut s, &format!("mg of text-set {size}"), mg, &va);

        let value = pattern(i as u64 + 100, size);
        let key = format!("meta-{size}");
        let ms = cat(&[
            format!("ms {key} {size} F{i} T0\r\n").as_bytes(),
            &value,
            b"\r\n",
        ]);
        expect_exact(&mut s, &format!("ms {size}"), ms, b"HD\r\n");
        let mg = format!("mg {key} v\r\n").into_bytes();
        let va = cat(&[format!("VA {size}\r\n").as_bytes(), &value, b"\r\n"]);
        expect_exact(&mut s, &format!("mg v {size}"), mg, &va);
        let gets_both = format!("get {key} small\r\n").into_bytes();
        let both = cat(&[
            &text_value(&key, i as u32, &value),
            &small_reply,
            b"END\r\n",
        ]);
        expect_exact(&mut s, &format!("get of ms-set {size}"), gets_both, &both);
    }

    // Too large: refused with the data swallowed, the old value of a `set` dropped, the
    // connection still usable.
    let huge = pattern(7, MAX + 1);
    let old = pattern(8, 300 << 10);
    let set_old = cat(&[b"set big 0 0 307200\r\n", &old, b"\r\n"]);
    expect_exact(&mut s, "set old big", set_old.clone(), b"STORED\r\n");
    let too_large = cat(&[
        format!("set big 0 0 {}\r\n", huge.len()).as_bytes(),
        &huge,
        b"\r\nget small\r\nget big\r\n",
    ]);
    let refused = cat(&[
        b"SERVER_ERROR object too large for cache\r\n",
        &small_reply[..],
        b"END\r\nEND\r\n",
    ]);
    expect_exact(&mut s, "set too large", too_large, &refused);
    let ms_too_large = cat(&[
        format!("ms big {} T0\r\n", huge.len()).as_bytes(),
        &huge,
        b"\r\nset big 0 0 1 noreply\r\nx\r\n",
        format!("set big 0 0 {} noreply\r\n", huge.len()).as_bytes(),
        &huge,
        b"\r\nget small\r\n",
    ]);
    let refused = cat(&[
        b"SERVER_ERROR object too large for cache\r\n",
        &small_reply[..],
        b"END\r\n",
    ]);
    expect_exact(
        &mut s,
        "ms too large, set too large noreply",
        ms_too_large,
        &refused,
    );

    // A bad data chunk after a large value: memcached answers it, keeps the old value and
    // reads on right after the two bad bytes.
    expect_exact(&mut s, "set old big again", set_old, b"STORED\r\n");
    for (what, line) in [
        ("set", "set big 0 0 3145728\r\n"),
        ("ms", "ms big 3145728\r\n"),
        ("set 300K", "set big 0 0 307200\r\n"),
    ] {
        let len: usize = line
            .split(' ')
            .nth(if what == "ms" { 2 } else { 4 })
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let bad = cat(&[
            line.as_bytes(),
            &pattern(9, len),
            b"XYget small\r\nget big\r\n",
        ]);
        let expected = cat(&[
            b"CLIENT_ERROR bad data chunk\r\n",
            &small_reply[..],
            b"END\r\n",
            &text_value("big", 0, &old),
            b"END\r\n",
        ]);
        expect_exact(
            &mut s,
            &format!("bad data chunk after a large {what}"),
            bad,
            &expected,
        );
    }

    // A pipeline around a large set comes back in order.
    let big = pattern(10, 3 << 20);
    let pipeline = cat(&[
        b"set big 0 0 3145728\r\n",
        &big,
        b"\r\nget small\r\nget big\r\nmn\r\nmg big s v\r\n",
    ]);
    let expected = cat(&[
        b"STORED\r\n",
        &small_reply[..],
        b"END\r\n",
        &text_value("big", 0, &big),
        b"END\r\nMN\r\n",
        b"VA 3145728 s3145728\r\n",
        &big,
        b"\r\n",
    ]);
    expect_exact(&mut s, "pipeline around a large set", pipeline, &expected);
}

/// Reads from `stream` until `done` holds for what arrived, or panics after 10 s.
fn read_until(stream: &mut TcpStream, what: &str, done: impl Fn(&str) -> bool) -> String {
    stream
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&got).into_owned();
        if done(&text) {
            return text;
        }
        assert!(Instant::now() < deadline, "{what}: only {text:?}");
        match stream.read(&mut buf) {
            Ok(0) => panic!("{what}: closed after {text:?}"),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) => panic!("{what}: {e}"),
        }
    }
}

#[test]
fn watch_streams_fetches_and_stores_of_every_shard() {
    let server = Server::start(&["--threads", "2"]);
    let mut refused = connect(server.addr);
    // Replies already waiting in the pipeline stop it, as in memcached; an unknown kind is an
    // error, and neither ends the connection.
    refused.write_all(b"watch sysevents\r\n").unwrap();
    read_until(&mut refused, "watch sysevents", |t| t == "ERROR\r\n");
    refused.write_all(b"get nothing\r\nwatch\r\n").unwrap();
    let expected = "END\r\nERROR cannot pipeline other commands before watch\r\n";
    let got = read_until(&mut refused, "refused watch", |t| t.len() >= expected.len());
    assert_eq!(got, expected);

    let mut watcher = connect(server.addr);
    watcher.write_all(b"watch fetchers mutations\r\n").unwrap();
    read_until(&mut watcher, "watch", |t| t == "OK\r\n");
    // Clients on both shards (connections alternate between them), keys that need encoding.
    let mut clients: Vec<TcpStream> = (0..4).map(|_| connect(server.addr)).collect();
    for (i, client) in clients.iter_mut().enumerate() {
        let request = format!("set w%{i} 0 0 1\r\nx\r\nget w%{i} absent{i}\r\n");
        client.write_all(request.as_bytes()).unwrap();
        let reply = format!("STORED\r\nVALUE w%{i} 0 1\r\nx\r\nEND\r\n");
        read_until(client, "client", |t| t == reply);
    }
    // A binary client's SET and GET are logged too.
    let frame = |opcode: u8, extras: &[u8], key: &[u8], value: &[u8]| {
        let mut f = Vec::new();
        headroom::proto::write_request(&mut f, opcode, (extras, key, value), 0, 0);
        f
    };
    let mut binary = connect(server.addr);
    binary
        .write_all(&cat(&[
            &frame(0x01, &[0; 8], b"bin", b"yz"),
            &frame(0x00, &[], b"bin", b""),
        ]))
        .unwrap();
    // A TTL is logged as seconds left.
    clients[0]
        .write_all(b"set ttlkey 0 100 1\r\nx\r\n")
        .unwrap();
    read_until(&mut clients[0], "set ttlkey", |t| t == "STORED\r\n");
    let mut replies = vec![0u8; 24 + 24 + 4 + 2];
    binary.read_exact(&mut replies).unwrap();
    assert_eq!(&replies[replies.len() - 2..], b"yz");
    // Values streamed to a segment (above --ram-head), stored and refused, and `mg` fetches.
    let big = vec![b'b'; 300_000];
    let stores = cat(&[
        b"set wbig 0 0 300000\r\n",
        &big,
        b"\r\nadd wbig 0 0 300000\r\n",
        &big,
        b"\r\nmg wbig s\r\nmg mgabsent v\r\n",
    ]);
    let writer = send_in_background(&clients[1], stores);
    read_until(&mut clients[1], "large stores and mg", |t| {
        t == "STORED\r\nNOT_STORED\r\nHD s300000\r\nEN\r\n"
    });
    writer.join().unwrap();
    let log = read_until(&mut watcher, "watch lines", |t| {
        (0..4).all(|i| t.contains(&format!("key=absent{i} status=not_found")))
            && t.contains("type=item_get key=bin status=found clsid=1")
            && t.contains("type=item_get key=mgabsent status=not_found")
    });
    for line in [
        "type=item_store key=wbig status=stored cmd=set ttl=0 ",
        "type=item_store key=wbig status=not_stored cmd=add ttl=0 ",
        "type=item_get key=wbig status=found clsid=3 ",
    ] {
        assert!(log.contains(line), "no `{line}` in:\n{log}");
    }
    assert!(
        log.contains("type=item_store key=bin status=stored cmd=set ttl=0 clsid=1"),
        "{log}"
    );
    assert!(
        log.contains("key=ttlkey status=stored cmd=set ttl=100 ")
            || log.contains("key=ttlkey status=stored cmd=set ttl=99 "),
        "{log}"
    );
    for i in 0..4 {
        for line in [
            format!("type=item_get key=w%25{i} status=not_found clsid=0"),
            format!("type=item_store key=w%25{i} status=stored cmd=set ttl=0 clsid=1"),
            format!("type=item_get key=w%25{i} status=found clsid=1"),
        ] {
            assert!(log.contains(&line), "no `{line}` in:\n{log}");
        }
    }
    for line in log.lines() {
        assert!(line.starts_with("ts="), "{line}");
        assert!(line.contains(" gid=") && line.contains(" cfd="), "{line}");
    }
    // Gone watchers cost nothing more: the server goes on serving.
    drop(watcher);
    let mut client = connect(server.addr);
    client.write_all(b"get w%0\r\n").unwrap();
    read_until(&mut client, "after the watcher left", |t| {
        t.ends_with("END\r\n")
    });
}
