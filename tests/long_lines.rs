//! One long text line never stalls a shard: while a 600 KB `get` line arrives unfinished, another
//! client of the same (only) shard is answered, each byte of the line is searched for its end
//! about once and reads grow (STAT `line_scan_bytes`, `line_incomplete_reads`), SASL on or off
//! (before authentication such a line is closed at 2048 bytes, as memcached closes it); a line
//! past the 2 MiB multiget limit is refused and closed, one just under it is served, and the read
//! buffer never grows past what the longest accepted line needs (STAT `read_buffer_max_bytes`).

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::server::{fresh_data_dir, Server};

/// Bytes examined by line-end searches, at most, per byte of the line received (each byte
/// once, plus the few bytes of the short commands around it).
const SCANS_PER_BYTE_MAX: u64 = 2;
/// Bytes a read brings on average, at least, while the long line arrives (the old fixed-step
/// buffer took one byte per read after the first 16 KiB).
const BYTES_PER_READ_MIN: u64 = 1024;
/// A hang fails the test instead of blocking it.
const REPLY_WAIT: Duration = Duration::from_secs(20);
/// `text::MULTIGET_LINE_MAX_BYTES`.
const MULTIGET_LINE_MAX_BYTES: usize = 2 << 20;

/// The line: 60,000 keys, cut at 600,000 bytes, no newline.
fn long_get_line() -> Vec<u8> {
    let keys: Vec<String> = (0..60000).map(|i| format!("kk{i:07}")).collect();
    let mut line = format!("get {}", keys.join(" ")).into_bytes();
    line.truncate(600_000);
    line
}

fn connect(server: &Server) -> TcpStream {
    let stream = TcpStream::connect(server.addr).expect("connect");
    stream.set_read_timeout(Some(REPLY_WAIT)).unwrap();
    stream.set_nodelay(true).unwrap();
    stream
}

/// Sends `request` and reads one line back.
fn ask(stream: &mut TcpStream, request: &[u8]) -> String {
    stream.write_all(request).unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut line = String::new();
    reader.read_line(&mut line).expect("a reply line in time");
    line
}

/// One STAT of the general group, as a number.
fn stat(stream: &mut TcpStream, name: &str) -> u64 {
    stream.write_all(b"stats\r\n").unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut found = None;
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).expect("stats in time");
        let line = line.trim_end();
        if line == "END" {
            return found.unwrap_or_else(|| panic!("no STAT {name}"));
        }
        let mut words = line.split(' ');
        if let (Some("STAT"), Some(n), Some(v)) = (words.next(), words.next(), words.next()) {
            if n == name {
                found = Some(v.parse().unwrap());
            }
        }
    }
}

/// Waits until the server has read `bytes` more than `before` (STAT bytes_read, asked on
/// `probe`).
fn wait_read(probe: &mut TcpStream, before: u64, bytes: u64) {
    let deadline = Instant::now() + REPLY_WAIT;
    while stat(probe, "bytes_read") < before + bytes {
        assert!(
            Instant::now() < deadline,
            "the server did not read the line"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Authenticates a text connection (memcached's text authentication: a `set` whose value is
/// `user password`; a server without SASL just stores it).
fn authenticate(stream: &mut TcpStream) {
    assert_eq!(
        ask(stream, b"set auth 0 0 16\r\nalice wonderland\r\n"),
        "STORED\r\n"
    );
}

/// Sends the long line in pieces on a new connection (authenticated first when `authenticate`),
/// and checks that another connection is answered once the server has read it, and that the
/// line cost about one scan per byte in reads of growing size. Returns the holder.
fn hold_a_long_line(server: &Server, authenticated: bool) -> TcpStream {
    let mut probe = connect(server);
    authenticate(&mut probe);
    let scanned_before = stat(&mut probe, "line_scan_bytes");
    let reads_before = stat(&mut probe, "line_incomplete_reads");
    let read_before = stat(&mut probe, "bytes_read");
    let line = long_get_line();
    let mut holder = connect(server);
    if authenticated {
        authenticate(&mut holder);
    }
    let mut sent = 0;
    for piece in line.chunks(8 << 10) {
        // (A server that refuses the line closes while it is sent.)
        if holder.write_all(piece).is_err() {
            break;
        }
        sent += piece.len() as u64;
    }
    if authenticated {
        wait_read(&mut probe, read_before, sent);
    }

    let mut other = connect(server);
    authenticate(&mut other);
    let reply = ask(&mut other, b"version\r\n");
    assert!(reply.starts_with("VERSION "), "{reply:?}");

    let scanned = stat(&mut probe, "line_scan_bytes") - scanned_before;
    let reads = stat(&mut probe, "line_incomplete_reads") - reads_before;
    assert!(
        scanned <= SCANS_PER_BYTE_MAX * sent,
        "{scanned} bytes scanned for a line of {sent}"
    );
    assert!(
        reads <= sent / BYTES_PER_READ_MIN,
        "{reads} reads left the {sent}-byte line unfinished"
    );
    holder
}

/// Whether the server closed `stream` without a byte of reply (a reset counts: the server
/// closed with the client's bytes unread); an error says what came instead, or that it stayed
/// open.
fn closed_silently(stream: &mut TcpStream) -> Result<(), String> {
    let mut reply = Vec::new();
    match stream.read_to_end(&mut reply) {
        Ok(_) if reply.is_empty() => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset && reply.is_empty() => Ok(()),
        Ok(_) => Err(format!("replied {:?}", String::from_utf8_lossy(&reply))),
        Err(e) => Err(format!("{e} after {:?}", String::from_utf8_lossy(&reply))),
    }
}

#[test]
fn a_long_line_held_unfinished_does_not_stall_the_shard() {
    let server = Server::start(&["--threads", "1"]);
    let mut holder = hold_a_long_line(&server, true);
    // 60,000 keys that miss: the multiget is served once its line ends.
    assert_eq!(ask(&mut holder, b"\r\n"), "END\r\n");
}

#[test]
fn a_long_line_before_sasl_authentication_is_refused_at_2048_bytes() {
    let dir = fresh_data_dir();
    std::fs::create_dir_all(&dir).unwrap();
    let passwords = dir.join("passwords");
    std::fs::write(&passwords, "alice:wonderland\n").unwrap();
    let passwords = passwords.display().to_string();
    let server = Server::start_in(
        &dir,
        &["--threads", "1", "--sasl-password-file", &passwords],
    );
    // Unauthenticated: closed without a word once 2048 bytes hold no newline (memcached's
    // text authentication does the same), and nobody else waits.
    let mut holder = hold_a_long_line(&server, false);
    assert_eq!(closed_silently(&mut holder), Ok(()));
    // Authenticated, the same line is held and served.
    let mut holder = hold_a_long_line(&server, true);
    assert_eq!(ask(&mut holder, b"\r\n"), "END\r\n");
}

#[test]
fn a_multiget_line_is_served_up_to_two_mib_and_refused_past_it() {
    let server = Server::start(&["--threads", "1"]);
    let mut probe = connect(&server);
    let scanned_before = stat(&mut probe, "line_scan_bytes");

    // Just under the limit, newline included: served.
    let mut line = b"get".to_vec();
    let mut i = 0;
    while line.len() + 12 < MULTIGET_LINE_MAX_BYTES - 2 {
        line.extend_from_slice(format!(" m{i:09}").as_bytes());
        i += 1;
    }
    line.extend_from_slice(b"\r\n");
    let served = line.len() as u64;
    let mut c = connect(&server);
    // A small value first, pipelined with the line: its block grows the buffer to exactly what
    // it needs (40,024 bytes, kept as under 64 KiB), and doubling from there would pass 2 MiB
    // (to 2.4 MiB) while the line arrives.
    let value = vec![b'v'; 40_000];
    let set = [b"set small 0 0 40000\r\n".as_slice(), &value, b"\r\n"].concat();
    for piece in [set, line].concat().chunks(64 << 10) {
        c.write_all(piece).unwrap();
    }
    let mut reader = BufReader::new(c.try_clone().unwrap());
    let mut replies = String::new();
    for _ in 0..2 {
        reader
            .read_line(&mut replies)
            .expect("a reply line in time");
    }
    assert_eq!(replies, "STORED\r\nEND\r\n");
    assert_eq!(
        ask(&mut c, b"version\r\n").split(' ').next(),
        Some("VERSION")
    );

    // Past it, no newline: memcached's answer to a buffer it cannot grow, then the close.
    let mut refused = connect(&server);
    let long = [b"get ".as_slice(), &vec![b'k'; MULTIGET_LINE_MAX_BYTES]].concat();
    // The server may close before every byte is sent.
    for piece in long.chunks(64 << 10) {
        if refused.write_all(piece).is_err() {
            break;
        }
    }
    let mut reply = Vec::new();
    let _ = refused.read_to_end(&mut reply);
    assert_eq!(
        String::from_utf8_lossy(&reply),
        "SERVER_ERROR out of memory reading request\r\n"
    );

    // No connection's read buffer grew past what the longest accepted line needs.
    let read_buffer_max = stat(&mut probe, "read_buffer_max_bytes");
    assert!(
        read_buffer_max >= served && read_buffer_max <= MULTIGET_LINE_MAX_BYTES as u64 + 1,
        "largest read buffer {read_buffer_max} bytes for a {served}-byte line"
    );

    // A long line that is not a multiget: closed without a word once it passes 2048 bytes, as
    // memcached closes it.
    let mut junk = connect(&server);
    let _ = junk.write_all(&vec![b'x'; 64 << 10]);
    assert_eq!(closed_silently(&mut junk), Ok(()));

    // Every byte was searched about once: the served line, the refused one, the junk's first
    // reads and the short commands.
    let scanned = stat(&mut probe, "line_scan_bytes") - scanned_before;
    let sent = served + long.len() as u64 + (64 << 10);
    assert!(
        scanned <= SCANS_PER_BYTE_MAX * sent,
        "{scanned} bytes scanned for {sent} sent"
    );
}
