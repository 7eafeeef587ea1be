//! Faults in and around segments, through the real binary: a value changed in its segment behind the server's back is never served whole (connection closed, item dropped, counted), a stalled large SET, or one trickled at under 64 KiB per --body-timeout, gives its segment space back while one sent at a steady pace is stored, and a full disk is answered as such and counted.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};

use common::pattern;
use common::server::{frame, set_extras, Client, Server};

const MIB: usize = 1 << 20;

/// Where `value[at..at + 64]` sits in the file at `path`, when `at` is a multiple of 4 KiB: a
/// value starts at an extent's start, and extents are O_DIRECT-aligned, so only 4 KiB
/// boundaries are tried.
fn find_in_file(path: &Path, value: &[u8], at: usize) -> u64 {
    let file = std::fs::File::open(path).unwrap();
    find_aligned(
        &file,
        0..file.metadata().unwrap().len(),
        &value[at..at + 64],
    )
    .unwrap_or_else(|| panic!("the value's bytes are nowhere in {}", path.display()))
}

/// The first 4 KiB-aligned offset in `range` of `file` where `probe` starts.
fn find_aligned(file: &std::fs::File, range: std::ops::Range<u64>, probe: &[u8]) -> Option<u64> {
    let mut buf = vec![0u8; probe.len()];
    let mut at = range.start.next_multiple_of(4096);
    while at + probe.len() as u64 <= range.end {
        if file.read_exact_at(&mut buf, at).is_ok() && buf == probe {
            return Some(at);
        }
        at += 4096;
    }
    None
}

/// Where `value[at..at + 64]` sits in the memory of process `pid` (a memory segment), when `at`
/// is a multiple of 4 KiB and past the value's RAM head (so the match is the segment's copy).
/// Only anonymous writable mappings of `min_len` bytes up to 4 GiB are searched (an
/// AddressSanitizer server's shadow mappings are terabytes).
fn find_in_memory(pid: u32, value: &[u8], at: usize, min_len: u64) -> u64 {
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    for line in maps.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() != 5 || !fields[1].starts_with("rw") {
            continue;
        }
        let (start, end) = fields[0].split_once('-').unwrap();
        let start = u64::from_str_radix(start, 16).unwrap();
        let end = u64::from_str_radix(end, 16).unwrap();
        if end - start < min_len || end - start > 4 << 30 {
            continue;
        }
        if let Some(found) = find_aligned(&mem, start..end, &value[at..at + 64]) {
            return found;
        }
    }
    panic!("the value's bytes are nowhere in the memory of process {pid}");
}

/// Flips every bit of the byte at `at` of the file at `path` (behind the server's back, as a
/// stray writer or a failing disk would), and makes it durable (a segment file; for
/// `/proc/PID/mem` the write is the change).
fn flip_byte(path: &Path, at: u64) {
    let file = std::fs::OpenOptions::new()
        .write(true)
        .read(true)
        .open(path)
        .unwrap();
    let mut byte = [0u8; 1];
    file.read_exact_at(&mut byte, at).unwrap();
    byte[0] ^= 0xff;
    file.write_all_at(&byte, at).unwrap();
    let _ = file.sync_all();
}

/// Reads from `stream` until the server closes it; the bounded read timeout fails the test on
/// a connection left open. Returns what arrived.
fn read_to_close(stream: &mut TcpStream) -> Vec<u8> {
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut got = Vec::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return got,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(err) if err.kind() == std::io::ErrorKind::ConnectionReset => return got,
            Err(err) => panic!(
                "the connection was not closed ({err}) after {} bytes",
                got.len()
            ),
        }
    }
}

/// A GET that must come back byte-exact.
fn assert_serves(c: &mut Client, key: &[u8], value: &[u8]) {
    let got = c.get(key);
    assert_eq!(got.status, 0, "GET {}", String::from_utf8_lossy(key));
    assert!(
        got.value == value,
        "{} came back different",
        String::from_utf8_lossy(key)
    );
}

/// How the damaged value is asked for.
#[derive(Clone, Copy)]
enum Ask {
    Binary,
    Text,
}

/// Where the damage is done.
#[derive(Clone, Copy)]
enum Segment {
    /// A file segment; `drop_head`: the value's RAM head copy is pushed out first, so all of
    /// it comes from the segment.
    File { drop_head: bool },
    /// A memory segment, changed through `/proc/PID/mem`.
    Memory,
}

/// Stores a large value in a segment, changes one byte of it there, `damage_at` bytes into
/// the value, and GETs it: the reply stops short of the whole value and the connection is
/// closed; the item is gone, counted once, and other keys still serve.
fn damaged_value_is_never_served(ask: Ask, segment: Segment, damage_at: usize) {
    let dir = common::server::fresh_data_dir();
    let file = dir.join("segment-test");
    let spec = match segment {
        Segment::File { .. } => format!("file:{},size=96M", file.display()),
        Segment::Memory => "mem:size=96M,numa=0".to_string(),
    };
    // A memory segment's values are checked only when asked (`files` is the default).
    let verify = match segment {
        Segment::File { .. } => "files",
        Segment::Memory => "on",
    };
    let args = [
        "--threads",
        "1",
        "--segment",
        &spec,
        "--verify-reads",
        verify,
    ];
    let server = Server::start_in(&dir, &args);
    let mut c = server.client();
    let value = pattern(36, (5 * MIB) + 123);
    let other = pattern(37, 3 * MIB);
    assert_eq!(c.set_streamed(0x01, b"damaged", &value, 0).status, 0);
    assert_eq!(c.set_streamed(0x01, b"other", &other, 0).status, 0);
    if let Segment::File { drop_head: true } = segment {
        // Values of exactly --ram-head take the fixed-head slots until the large values'
        // head copies are given up for them.
        let filler = vec![7u8; 256 << 10];
        let mut n = 0;
        while c.stat("", "large_heads_dropped") < 2 {
            assert!(n < 4096, "no head copy was dropped after {n} fillers");
            assert_eq!(
                c.set(format!("fill-{n}").as_bytes(), &filler, 0, 0).status,
                0
            );
            n += 1;
        }
    }
    // (After the fillers, which would push it out.)
    assert_eq!(c.set(b"small", b"still here", 0, 0).status, 0);
    assert_serves(&mut c, b"damaged", &value);
    match segment {
        Segment::File { .. } => {
            let start = find_in_file(&file, &value, 0);
            flip_byte(&file, start + damage_at as u64);
        }
        Segment::Memory => {
            let probe_at = 2 * MIB;
            let start = find_in_memory(server.pid(), &value, probe_at, 96 << 20) - probe_at as u64;
            flip_byte(
                Path::new(&format!("/proc/{}/mem", server.pid())),
                start + damage_at as u64,
            );
        }
    }

    let mut d = server.client();
    let whole = match ask {
        Ask::Binary => {
            d.send(&frame(0x00, &[], b"damaged", &[], 0, 0));
            24 + 4 + value.len()
        }
        Ask::Text => {
            d.send(b"get damaged\r\n");
            format!("VALUE damaged 0 {}\r\n", value.len()).len() + value.len() + 7
        }
    };
    let got = read_to_close(&mut d.stream);
    assert!(
        got.len() < whole - 7,
        "{} of the {whole}-byte reply arrived: the damaged value went out whole",
        got.len()
    );
    if let Ask::Text = ask {
        assert!(got.starts_with(b"VALUE damaged 0 "), "{:?}", &got[..32]);
    }

    assert_eq!(
        c.get(b"damaged").status,
        1,
        "the damaged item was not dropped"
    );
    assert_eq!(c.stat("", "segment_read_crc_errors"), 1);
    assert_eq!(c.stat("", "badcrc_from_extstore"), 1);
    assert_serves(&mut c, b"other", &other);
    assert_serves(&mut c, b"small", b"still here");
    assert!(
        server.logs("failed its CRC32C"),
        "the damage was not logged: {:?}",
        server.log.lock().unwrap()
    );
    // The key takes a new value.
    assert_eq!(c.set_streamed(0x01, b"damaged", &value, 0).status, 0);
    assert_serves(&mut c, b"damaged", &value);
}

#[test]
fn a_byte_changed_past_the_ram_head_is_never_served() {
    damaged_value_is_never_served(Ask::Binary, Segment::File { drop_head: false }, 3 * MIB + 5);
}

#[test]
fn a_byte_changed_in_the_last_piece_is_never_served_as_text() {
    damaged_value_is_never_served(Ask::Text, Segment::File { drop_head: false }, 5 * MIB + 100);
}

#[test]
fn a_byte_changed_in_a_value_without_a_ram_head_is_never_served() {
    // In the value's first 256 KiB: with a head copy these bytes would come from RAM.
    damaged_value_is_never_served(Ask::Text, Segment::File { drop_head: true }, 1000);
}

#[test]
fn a_byte_changed_in_a_memory_segment_is_never_served() {
    damaged_value_is_never_served(Ask::Binary, Segment::Memory, 4 * MIB + 1);
}

#[test]
fn with_verify_reads_off_a_changed_byte_goes_out() {
    let dir = common::server::fresh_data_dir();
    let segment = dir.join("segment-test");
    let spec = format!("file:{},size=64M", segment.display());
    let server = Server::start_in(
        &dir,
        &[
            "--threads",
            "1",
            "--segment",
            &spec,
            "--verify-reads",
            "off",
        ],
    );
    let mut c = server.client();
    let mut value = pattern(38, 2 * MIB);
    assert_eq!(c.set_streamed(0x01, b"k", &value, 0).status, 0);
    let start = find_in_file(&segment, &value, 0);
    flip_byte(&segment, start + MIB as u64);
    value[MIB] ^= 0xff;
    assert_serves(&mut c, b"k", &value);
    assert_eq!(c.stat("", "segment_read_crc_errors"), 0);
}

/// By default (`--verify-reads files`) a value read from a memory segment is not summed: the
/// segment is the server's own memory. A byte changed there behind its back (through
/// `/proc/PID/mem`) goes out, and nothing is counted.
#[test]
fn by_default_a_memory_segment_is_not_checked() {
    let dir = common::server::fresh_data_dir();
    let server = Server::start_in(
        &dir,
        &["--threads", "1", "--segment", "mem:size=64M,numa=0"],
    );
    let mut c = server.client();
    let settings = c.stats("settings");
    let verify = settings.iter().find(|(name, _)| name == "verify_reads");
    assert_eq!(verify.map(|(_, v)| v.as_str()), Some("files"));
    let mut value = pattern(39, 3 * MIB);
    assert_eq!(c.set_streamed(0x01, b"k", &value, 0).status, 0);
    let probe_at = 2 * MIB;
    let start = find_in_memory(server.pid(), &value, probe_at, 64 << 20) - probe_at as u64;
    flip_byte(
        Path::new(&format!("/proc/{}/mem", server.pid())),
        start + (MIB + 1) as u64,
    );
    value[MIB + 1] ^= 0xff;
    assert_serves(&mut c, b"k", &value);
    assert_eq!(c.stat("", "segment_read_crc_errors"), 0);
}

/// Waits (boundedly) until the segments hold `want` bytes: freed extents reach the placement
/// master by message.
fn wait_for_segment_used(c: &mut Client, want: u64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let used = c.segment_used();
        if used == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the segments hold {used} bytes, not {want}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Starts a binary SET of `len` bytes and sends only `sent` of them.
fn stalled_set(server: &Server, key: &[u8], len: usize, sent: usize) -> Client {
    let mut c = server.client();
    let mut head = frame(0x01, &set_extras(0, 0), key, &[], 0, 1);
    head[8..12].copy_from_slice(&((8 + key.len() + len) as u32).to_be_bytes());
    c.send(&head);
    c.stream.write_all(&pattern(1, sent)).unwrap();
    c
}

#[test]
fn stalled_large_sets_give_their_space_back_after_the_body_timeout() {
    let server = Server::start(&["--threads", "1", "--body-timeout", "1"]);
    let mut c = server.client();
    let before = c.segment_used();
    // Five 200 MiB SETs that stop after 1 MiB hold 1000 MiB of the 1 GiB default segment.
    let mut stallers: Vec<Client> = (0..5)
        .map(|i| stalled_set(&server, format!("stalled-{i}").as_bytes(), 200 * MIB, MIB))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(20);
    while c.segment_used() < before + 1000 * MIB as u64 {
        assert!(
            Instant::now() < deadline,
            "the stalled SETs were never placed"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Each staller's connection is closed (the bounded read fails the test otherwise).
    for staller in &mut stallers {
        read_to_close(&mut staller.stream);
    }
    let value = pattern(2, 200 * MIB);
    let r = c.set_streamed(0x01, b"after", &value, 0);
    assert_eq!(
        r.status, 0,
        "a large SET failed after the stallers' timeout: {r:?}"
    );
    assert_eq!(c.get(b"after").value.len(), value.len());
    assert_eq!(c.stat("", "body_timeouts"), 5);
    wait_for_segment_used(&mut c, before + 200 * MIB as u64);
    for i in 0..5 {
        assert_eq!(c.get(format!("stalled-{i}").as_bytes()).status, 1);
    }
    assert!(server.logs("--body-timeout"), "the timeout was not logged");
}

#[test]
fn a_trickled_large_set_is_dropped_and_a_steady_one_is_not() {
    // Each --body-timeout window must bring 64 KiB (headroom's BODY_PROGRESS_MIN_BYTES).
    let server = Server::start(&["--threads", "1", "--body-timeout", "2"]);
    let mut c = server.client();
    let before = c.segment_used();

    // A few bytes every half window: each read brings something, but never the minimum.
    let mut trickler = stalled_set(&server, b"trickled", 8 * MIB, 1024);
    wait_for_segment_used(&mut c, before + 8 * MIB as u64);
    trickler
        .stream
        .set_read_timeout(Some(Duration::from_secs(1)))
        .unwrap();
    let give_up = Instant::now() + Duration::from_secs(60);
    let dropped = loop {
        assert!(
            Instant::now() < give_up,
            "a body trickled a few bytes a second was never dropped"
        );
        if let Some(closed) = common::closed_by_server(&mut trickler.stream, &[b'x'; 16]) {
            break closed;
        }
    };
    assert!(dropped, "the trickled SET was answered");
    assert_eq!(c.stat("", "body_timeouts"), 1);
    wait_for_segment_used(&mut c, before);
    assert_eq!(c.get(b"trickled").status, 1);
    assert!(server.logs("--body-timeout"), "the timeout was not logged");

    // A body sent at a steady pace for three windows (256 KiB every half second) is stored.
    let value = pattern(3, 3 * MIB);
    let key = b"steady";
    let mut steady = server.client();
    let mut head = frame(0x01, &set_extras(0, 0), key, &[], 0, 1);
    head[8..12].copy_from_slice(&((8 + key.len() + value.len()) as u32).to_be_bytes());
    steady.send(&head);
    for piece in value.chunks(256 << 10) {
        steady.stream.write_all(piece).unwrap();
        std::thread::sleep(Duration::from_millis(500));
    }
    let reply = steady.recv().expect("a reply to the steady SET");
    assert_eq!(reply.status, 0, "the steady SET failed: {reply:?}");
    assert_eq!(c.get(key).value, value);
    assert_eq!(c.stat("", "body_timeouts"), 1);
}

#[test]
fn a_full_disk_is_answered_as_such_and_counted() {
    // A 256 MiB sparse segment file on a 32 MiB filesystem: it mounts, and fills up.
    let Some(fs) = common::TinyFs::or_skip(32) else {
        return;
    };
    let segment = fs.mount.join("segment");
    let spec = format!("file:{},size=256M", segment.display());
    {
        let server = Server::start(&["--threads", "1", "--segment", &spec]);
        let mut c = server.client();
        // Old values under both keys: a SET that fails its segment write must drop them.
        assert_eq!(c.set(b"too-big-for-the-disk", b"old", 0, 0).status, 0);
        assert_eq!(c.set(b"text-too-big", b"old", 0, 0).status, 0);
        let before = c.segment_used();

        let r = c.set_streamed(0x01, b"too-big-for-the-disk", &pattern(3, 64 * MIB), 0);
        assert_eq!(
            (r.status, r.value.as_slice()),
            (0x82, &b"Out of disk space"[..]),
            "binary SET on a full disk"
        );

        let mut t = server.client();
        let value = pattern(4, 64 * MIB);
        t.send(format!("set text-too-big 0 0 {}\r\n", value.len()).as_bytes());
        t.stream.write_all(&value).unwrap();
        t.send(b"\r\n");
        let reply = common::server::read_text_reply(&mut t.stream, b"\r\n", 0);
        assert_eq!(
            String::from_utf8_lossy(&reply),
            "SERVER_ERROR out of disk space storing object\r\n"
        );

        assert_eq!(c.stat("", "segment_write_errors"), 2);
        assert_eq!(c.stat("", "segment_write_no_space"), 2);
        // Nothing is left half-stored, no old value is left to be served stale, and both
        // connections still serve.
        assert_eq!(c.get(b"too-big-for-the-disk").status, 1);
        assert_eq!(c.get(b"text-too-big").status, 1);
        wait_for_segment_used(&mut c, before);
        assert_eq!(c.set(b"small", b"fine", 0, 0).status, 0);
        t.send(b"get small\r\n");
        let reply = common::server::read_text_reply(&mut t.stream, b"END\r\n", 0);
        assert_eq!(reply, b"VALUE small 0 4\r\nfine\r\nEND\r\n");
        assert!(server.logs("No space left on device"), "not logged");
    }
}
