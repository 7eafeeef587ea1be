//! The switches memcached sets with `-A`, `-F`, `-X`, `-W` and `-M`, and the crawler's state at
//! start, through the real binary over a socket: a command switched off is refused in
//! memcached 1.6.45's words and changes nothing, one switched on is served.

mod common;

use std::io::Write;
use std::net::TcpStream;
use std::time::Duration;

use common::server::{frame, read_text_reply, set_extras, Client, Server};

const FLUSH: u8 = 0x08;
const FLUSHQ: u8 = 0x18;
const NOOP: u8 = 0x0a;
const STAT: u8 = 0x10;
const SET: u8 = 0x01;
/// Binary statuses memcached gives these refusals.
const STATUS_NOT_FOUND: u16 = 0x0001;
const STATUS_AUTH_ERROR: u16 = 0x0020;
const STATUS_OUT_OF_MEMORY: u16 = 0x0082;

const OUT_OF_MEMORY: &str = "SERVER_ERROR out of memory storing object\r\n";

fn text(server: &Server) -> TcpStream {
    let stream = TcpStream::connect(server.addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    stream
}

/// Sends `request` and reads one reply line.
fn call(stream: &mut TcpStream, request: &str) -> String {
    stream.write_all(request.as_bytes()).unwrap();
    String::from_utf8_lossy(&read_text_reply(stream, b"\r\n", 0)).into_owned()
}

/// `stats settings`, as (name, value) pairs.
fn settings(server: &Server) -> Vec<(String, String)> {
    server.client().stats("settings")
}

fn setting(settings: &[(String, String)], name: &str) -> String {
    settings
        .iter()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("no setting {name}"))
        .1
        .clone()
}

#[test]
fn stats_settings_name_the_switches_as_memcached_does() {
    let server = Server::start(&["--threads", "2"]);
    let s = settings(&server);
    for (name, want) in [
        ("evictions", "on"),
        ("shutdown_command", "no"),
        ("flush_enabled", "yes"),
        ("dump_enabled", "yes"),
        ("watch_enabled", "yes"),
        ("lru_crawler", "yes"),
    ] {
        assert_eq!(setting(&s, name), want, "{name} by default");
    }
    drop(server);
    let server = Server::start(&[
        "--threads",
        "2",
        "--evictions",
        "off",
        "--shutdown-command",
        "on",
        "--flush-all-command",
        "off",
        "--dump-commands",
        "off",
        "--watch-command",
        "off",
        "--lru-crawler",
        "off",
    ]);
    let s = settings(&server);
    for (name, want) in [
        ("evictions", "off"),
        ("shutdown_command", "yes"),
        ("flush_enabled", "no"),
        ("dump_enabled", "no"),
        ("watch_enabled", "no"),
        ("lru_crawler", "no"),
    ] {
        assert_eq!(setting(&s, name), want, "{name} switched");
    }
}

/// Off (the default), `shutdown` in any form is refused before its form is read, silently
/// under `noreply`, and the server goes on.
#[test]
fn shutdown_is_refused_by_default() {
    let server = Server::start(&["--threads", "2"]);
    let mut t = text(&server);
    for line in ["shutdown\r\n", "shutdown graceful\r\n", "shutdown now\r\n"] {
        assert_eq!(
            call(&mut t, line),
            "SERVER_ERROR: shutdown not enabled\r\n",
            "{line:?}"
        );
    }
    assert_eq!(call(&mut t, "shutdown noreply\r\nmn\r\n"), "MN\r\n");
    assert!(call(&mut t, "version\r\n").starts_with("VERSION "));
    let mut server = server;
    assert_eq!(server.wait_exit(Duration::from_millis(300)), None);
}

/// On, `shutdown` closes the connection without a word and stops the server as SIGTERM does,
/// and `shutdown graceful` as SIGUSR1 does: a clean stop, exit status 0. Another mode is
/// refused and the server goes on.
#[test]
fn shutdown_on_stops_the_server() {
    for (line, signal) in [
        ("shutdown\r\n", "SIGTERM"),
        ("shutdown graceful\r\n", "SIGUSR1"),
    ] {
        let mut server = Server::start(&["--threads", "2", "--shutdown-command", "on"]);
        let mut t = text(&server);
        assert_eq!(
            call(&mut t, "shutdown now\r\n"),
            "CLIENT_ERROR invalid shutdown mode\r\n"
        );
        assert_eq!(call(&mut t, "shutdown now noreply\r\nmn\r\n"), "MN\r\n");
        t.write_all(line.as_bytes()).unwrap();
        let mut rest = Vec::new();
        let read = std::io::Read::read_to_end(&mut t, &mut rest);
        assert!(
            read.is_ok() && rest.is_empty(),
            "{line:?}: the connection closes without a reply ({read:?}, {rest:?})"
        );
        let status = server
            .wait_exit(Duration::from_secs(30))
            .unwrap_or_else(|| panic!("{line:?}: still running\n{}", server.log_text()));
        assert_eq!(status.code(), Some(0), "{line:?}\n{}", server.log_text());
        assert!(
            server.logs(&format!("stopping as on {signal}")),
            "{line:?}\n{}",
            server.log_text()
        );
    }
}

/// Off, `flush_all` is refused in text (in any form, silently under `noreply`) and FLUSH and
/// FLUSHQ in binary ("auth error", as memcached's `-F`), and nothing is flushed.
#[test]
fn flush_all_off_is_refused_and_the_data_stays() {
    let server = Server::start(&["--threads", "2", "--flush-all-command", "off"]);
    let mut c = server.client();
    assert_eq!(c.set(b"kept", b"value", 0, 0).status, 0);
    let mut t = text(&server);
    for line in [
        "flush_all\r\n",
        "flush_all 0\r\n",
        "flush_all 10\r\n",
        "flush_all x\r\n",
    ] {
        assert_eq!(
            call(&mut t, line),
            "CLIENT_ERROR flush_all not allowed\r\n",
            "{line:?}"
        );
    }
    assert_eq!(call(&mut t, "flush_all noreply\r\nmn\r\n"), "MN\r\n");
    let r = c.call(&frame(FLUSH, &[], &[], &[], 0, 7));
    assert_eq!(
        (r.opcode, r.status, r.opaque),
        (FLUSH, STATUS_AUTH_ERROR, 7)
    );
    // FLUSHQ is quiet on success only: its refusal is answered, before the NOOP's.
    let mut quiet = frame(FLUSHQ, &[], &[], &[], 0, 8);
    quiet.extend(frame(NOOP, &[], &[], &[], 0, 9));
    c.send(&quiet);
    let r = c.recv().unwrap();
    assert_eq!(
        (r.opcode, r.status, r.opaque),
        (FLUSHQ, STATUS_AUTH_ERROR, 8)
    );
    assert_eq!(c.recv().unwrap().opcode, NOOP);
    assert_eq!(c.get(b"kept").value, b"value");
    t.write_all(b"get kept\r\n").unwrap();
    assert_eq!(
        read_text_reply(&mut t, b"END\r\n", 0),
        b"VALUE kept 0 5\r\nvalue\r\nEND\r\n"
    );
}

/// Off, the commands that list keys are refused as memcached's `-X` refuses them, whatever
/// their form; the crawler's own refusal comes first when it is off too.
#[test]
fn dump_commands_off_are_refused() {
    let server = Server::start(&["--threads", "2", "--dump-commands", "off"]);
    let mut c = server.client();
    assert_eq!(c.set(b"secret", b"value", 0, 0).status, 0);
    let mut t = text(&server);
    for (line, reply) in [
        (
            "stats cachedump 1 0\r\n",
            "CLIENT_ERROR stats cachedump not allowed\r\n",
        ),
        (
            "stats cachedump\r\n",
            "CLIENT_ERROR stats cachedump not allowed\r\n",
        ),
        (
            "stats detail dump\r\n",
            "CLIENT_ERROR stats detail not allowed\r\n",
        ),
        (
            "stats detail on\r\n",
            "CLIENT_ERROR stats detail not allowed\r\n",
        ),
        (
            "stats detail\r\n",
            "CLIENT_ERROR stats detail not allowed\r\n",
        ),
        (
            "lru_crawler metadump all\r\n",
            "ERROR metadump not allowed\r\n",
        ),
        (
            "lru_crawler mgdump all\r\n",
            "ERROR key dump not allowed\r\n",
        ),
        (
            "lru_crawler metadump x\r\n",
            "ERROR metadump not allowed\r\n",
        ),
    ] {
        assert_eq!(call(&mut t, line), reply, "{line:?}");
    }
    // Binary STAT `detail ...`: memcached's "not found".
    let r = c.call(&frame(STAT, &[], b"detail dump", &[], 0, 3));
    assert_eq!((r.status, r.opaque), (STATUS_NOT_FOUND, 3));
    assert!(c.stat("", "curr_items") >= 1, "other groups still answer");
    assert_eq!(call(&mut t, "lru_crawler disable\r\n"), "OK\r\n");
    assert_eq!(
        call(&mut t, "lru_crawler metadump all\r\n"),
        "CLIENT_ERROR lru crawler disabled\r\n"
    );
}

/// Off, `watch` is refused whatever kinds it names, and the connection is served on.
#[test]
fn watch_off_is_refused() {
    let server = Server::start(&["--threads", "2", "--watch-command", "off"]);
    let mut t = text(&server);
    for line in [
        "watch\r\n",
        "watch fetchers mutations\r\n",
        "watch bogus\r\n",
    ] {
        assert_eq!(
            call(&mut t, line),
            "CLIENT_ERROR watch commands not allowed\r\n",
            "{line:?}"
        );
    }
    assert!(call(&mut t, "version\r\n").starts_with("VERSION "));
}

/// `--lru-crawler off`: the crawler starts disabled, as memcached's `-o no_lru_crawler`, and
/// `lru_crawler enable` starts it.
#[test]
fn the_crawler_starts_as_configured() {
    let server = Server::start(&["--threads", "2", "--lru-crawler", "off"]);
    let mut t = text(&server);
    assert_eq!(
        call(&mut t, "lru_crawler crawl all\r\n"),
        "CLIENT_ERROR lru crawler disabled\r\n"
    );
    assert_eq!(setting(&settings(&server), "lru_crawler"), "no");
    assert_eq!(call(&mut t, "lru_crawler enable\r\n"), "OK\r\n");
    assert_eq!(setting(&settings(&server), "lru_crawler"), "yes");
    assert_eq!(call(&mut t, "lru_crawler crawl all\r\n"), "OK\r\n");
}

/// A 1,000-byte value for key `i`, telling the keys apart.
fn value(i: usize) -> Vec<u8> {
    (0..1000)
        .map(|at| b'a' + ((i * 7 + at) % 26) as u8)
        .collect()
}

/// Sets `key:i` for `i` in `from..to` in text, pipelined, and returns each one's reply line.
fn set_range(t: &mut TcpStream, from: usize, to: usize) -> Vec<String> {
    let mut request = Vec::new();
    for i in from..to {
        request.extend_from_slice(format!("set key:{i} 0 0 1000\r\n").as_bytes());
        request.extend(value(i));
        request.extend_from_slice(b"\r\n");
    }
    t.write_all(&request).unwrap();
    let mut lines = Vec::new();
    let mut pending = Vec::new();
    while lines.len() < to - from {
        pending.extend(read_text_reply(t, b"\r\n", 0));
        while let Some(end) = pending.windows(2).position(|w| w == b"\r\n") {
            lines.push(String::from_utf8_lossy(&pending[..end + 2]).into_owned());
            pending.drain(..end + 2);
        }
    }
    lines
}

fn get_value(t: &mut TcpStream, i: usize) -> Option<Vec<u8>> {
    t.write_all(format!("get key:{i}\r\n").as_bytes()).unwrap();
    let reply = read_text_reply(t, b"END\r\n", 5);
    if reply == b"END\r\n" {
        return None;
    }
    let header = format!("VALUE key:{i} 0 1000\r\n");
    assert!(reply.starts_with(header.as_bytes()), "get key:{i}");
    Some(reply[header.len()..header.len() + 1000].to_vec())
}

/// The smallest arena (two 2 MiB blocks) holds about 4,000 of these items; this many sets
/// fill it more than twice over.
const SETS: usize = 10_000;
const BATCH: usize = 200;

/// `--evictions off` (memcached's `-M`): once RAM is full a store is refused with memcached's
/// out-of-memory line (binary: its "out of memory" status), and nothing is evicted: every
/// item stored before is still there, byte for byte.
#[test]
fn evictions_off_refuses_stores_when_full_and_evicts_nothing() {
    let server = Server::start(&["--threads", "2", "--memory", "4M", "--evictions", "off"]);
    let mut t = text(&server);
    let mut stored = Vec::new();
    let mut refused = 0;
    for from in (0..SETS).step_by(BATCH) {
        for (i, line) in (from..).zip(set_range(&mut t, from, from + BATCH)) {
            match line.as_str() {
                "STORED\r\n" => stored.push(i),
                OUT_OF_MEMORY => refused += 1,
                other => panic!("set key:{i}: {other:?}"),
            }
        }
    }
    assert!(refused > SETS / 2, "{refused} of {SETS} refused");
    assert!(stored.len() > 1000, "only {} stored", stored.len());
    // (Each partition fills on its own: a later key may still find room in another.)
    for &i in &stored {
        assert_eq!(get_value(&mut t, i), Some(value(i)), "key:{i}");
    }
    let mut c = server.client();
    let r = c.call(&frame(SET, &set_extras(0, 0), b"one-more", &value(0), 0, 5));
    assert_eq!((r.status, r.opaque), (STATUS_OUT_OF_MEMORY, 5));
    assert_eq!(c.stat("", "evictions"), 0);
    assert_eq!(c.stat("", "curr_items"), stored.len() as u64);
}

/// With evictions on (the default) the same sets all succeed: the coldest items make room.
#[test]
fn evictions_on_make_room() {
    let server = Server::start(&["--threads", "2", "--memory", "4M"]);
    let mut t = text(&server);
    for from in (0..SETS).step_by(BATCH) {
        for (i, line) in (from..).zip(set_range(&mut t, from, from + BATCH)) {
            assert_eq!(line, "STORED\r\n", "set key:{i}");
        }
    }
    let mut c: Client = server.client();
    assert!(c.stat("", "evictions") > 0);
    assert_eq!(get_value(&mut t, SETS - 1), Some(value(SETS - 1)));
}
