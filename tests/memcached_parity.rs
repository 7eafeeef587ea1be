//! What clients that follow memcached 1.6.45 rely on, through the real binary: small CAS
//! values, the version they parse, append and prepend of any size, stats that count every
//! item, and the commands and replies 1.6.45 changed since 1.6.18 (each reply here is what
//! 1.6.45 sends, taken from a live 1.6.45 by hand; `docs/protocol.md` lists them).

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::server::Server;

/// Sends `request` followed by `mn` and returns every byte before the `MN` that answers it.
fn call(stream: &mut TcpStream, request: &[u8]) -> Vec<u8> {
    stream.write_all(request).unwrap();
    stream.write_all(b"mn\r\n").unwrap();
    read_until(stream, b"MN\r\n")
}

/// Reads until the bytes end in `end`, within 10 s; returns them without it.
fn read_until(stream: &mut TcpStream, end: &[u8]) -> Vec<u8> {
    let deadline = Instant::now() + Duration::from_secs(10);
    stream
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut got = Vec::new();
    let mut buf = vec![0u8; 1 << 16];
    while !got.ends_with(end) {
        assert!(
            Instant::now() < deadline,
            "no {:?} after {:?}",
            String::from_utf8_lossy(end),
            String::from_utf8_lossy(&got[got.len().saturating_sub(300)..])
        );
        match stream.read(&mut buf) {
            Ok(0) => panic!("closed after {:?}", String::from_utf8_lossy(&got)),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(_) => {}
        }
    }
    got.truncate(got.len() - end.len());
    got
}

fn connect(server: &Server) -> TcpStream {
    let stream = TcpStream::connect(server.addr).unwrap();
    stream.set_nodelay(true).unwrap();
    stream
}

/// The numbers after `c` in `HD c<N>` lines.
fn cas_values(reply: &[u8]) -> Vec<u64> {
    String::from_utf8_lossy(reply)
        .lines()
        .filter_map(|line| line.split(' ').find_map(|w| w.strip_prefix('c')))
        .map(|n| n.parse().unwrap())
        .collect()
}

/// meta-memcache reads CAS tokens into 32 bits: values start near 1, grow by about one per
/// write, and stay unique over every partition.
#[test]
fn cas_values_start_small_and_stay_unique() {
    let server = Server::start(&["--threads", "2", "--partitions", "8"]);
    let mut stream = connect(&server);
    let writes = 4000u64;
    let mut request = Vec::new();
    for i in 0..writes {
        request.extend_from_slice(format!("ms caskey{} 1 c\r\nx\r\n", i % 1000).as_bytes());
    }
    let values = cas_values(&call(&mut stream, &request));
    assert_eq!(values.len() as u64, writes);
    let mut unique = values.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), values.len(), "a CAS value was issued twice");
    let (least, most) = (unique[0], unique[unique.len() - 1]);
    assert!(least <= 8, "the first CAS values are {least} and up");
    // 8 partitions issue every 8th value each; spread writes keep them close together.
    assert!(
        most <= 2 * writes,
        "{writes} writes reached CAS {most}: not about one per write"
    );
    // `gets` shows the same values.
    let reply = call(&mut stream, b"gets caskey7\r\n");
    let text = String::from_utf8(reply).unwrap();
    let cas: u64 = text
        .lines()
        .next()
        .unwrap()
        .rsplit(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(cas <= most && cas < 1 << 32, "{text}");
}

/// Clients read VERSION as memcached's release (the npm `memcached` package takes its last
/// x.y.z): it names 1.6.45, and Headroom's own version has a STAT line of its own.
#[test]
fn version_names_the_memcached_release_spoken() {
    let server = Server::start(&[]);
    let mut stream = connect(&server);
    assert_eq!(call(&mut stream, b"version\r\n"), b"VERSION 1.6.45\r\n");
    let stats = String::from_utf8(call(&mut stream, b"stats\r\n")).unwrap();
    assert!(stats.contains("STAT version 1.6.45\r\n"), "{stats}");
    let own = format!("STAT headroom_version {}\r\n", env!("CARGO_PKG_VERSION"));
    assert!(stats.contains(&own), "{stats}");
}

/// A `get` of one key: its flags and value, or `None` on a miss.
fn get(stream: &mut TcpStream, key: &str) -> Option<(u32, Vec<u8>)> {
    let reply = call(stream, format!("get {key}\r\n").as_bytes());
    if reply == b"END\r\n" {
        return None;
    }
    let line_end = reply.windows(2).position(|w| w == b"\r\n").unwrap();
    let line = String::from_utf8(reply[..line_end].to_vec()).unwrap();
    let words: Vec<&str> = line.split(' ').collect();
    assert_eq!((words[0], words[1]), ("VALUE", key), "{line}");
    let len: usize = words[3].parse().unwrap();
    let value = reply[line_end + 2..line_end + 2 + len].to_vec();
    assert_eq!(&reply[line_end + 2 + len..], b"\r\nEND\r\n");
    Some((words[2].parse().unwrap(), value))
}

/// A text storage command and its reply.
fn store(stream: &mut TcpStream, command: &str, key: &str, value: &[u8]) -> Vec<u8> {
    let line = format!("{command} {key} 0 0 {}\r\n", value.len());
    call(stream, &[line.as_bytes(), value, b"\r\n"].concat())
}

/// APPEND and PREPEND work up to the item size limit, whatever the sizes and wherever the
/// value lives (RAM, a memory segment, an O_DIRECT file segment), keeping the item's flags;
/// they still refuse a missing key and a sum over the limit.
#[test]
fn append_and_prepend_work_past_the_ram_head() {
    let segment_dir = common::fresh_temp_path("parity-append");
    std::fs::create_dir_all(&segment_dir).unwrap();
    let file_segment = format!("file:{}/seg,size=256M", segment_dir.display());
    for segment in ["mem:size=256M,numa=0", file_segment.as_str()] {
        let server = Server::start(&["--segment", segment, "--max-item-size", "8M"]);
        let mut stream = connect(&server);
        let mut check = |name: &str, first: usize, then: usize, prepend: bool| {
            let key = format!("{name}-{}", if prepend { "pre" } else { "app" });
            let old = common::pattern(first as u64, first);
            let add = common::pattern(then as u64 + 7, then);
            // The item's flags, which an APPEND or PREPEND keeps.
            let set = format!("set {key} 42 0 {first}\r\n");
            let stored = call(&mut stream, &[set.as_bytes(), &old, b"\r\n"].concat());
            assert_eq!(stored, b"STORED\r\n", "{segment}: set {key}");
            let command = if prepend { "prepend" } else { "append" };
            let reply = store(&mut stream, command, &key, &add);
            assert_eq!(
                reply, b"STORED\r\n",
                "{segment}: {command} {then} B onto {first} B"
            );
            let want = if prepend {
                [&add[..], &old[..]].concat()
            } else {
                [&old[..], &add[..]].concat()
            };
            let (flags, value) = get(&mut stream, &key).expect("the item is there");
            assert_eq!(flags, 42, "{segment}: {command} kept the flags");
            assert!(
                value == want,
                "{segment}: {command} {then} B onto {first} B: other bytes"
            );
        };
        for prepend in [false, true] {
            check("edge", 262_140, 5, prepend);
            check("halves", 200_000, 100_000, prepend);
            check("small-onto-large", 300_000, 10, prepend);
            check("large-onto-small", 10, 300_000, prepend);
            check("large-onto-large", 3 << 20, 1 << 20, prepend);
            check("small", 100, 100, prepend);
        }
        // Refused: a missing key, and a sum over --max-item-size (the value stays).
        assert_eq!(
            store(&mut stream, "append", "absent", &[1u8; 300_000]),
            b"NOT_STORED\r\n"
        );
        assert_eq!(get(&mut stream, "absent"), None);
        let big = common::pattern(1, 5 << 20);
        assert_eq!(store(&mut stream, "set", "full", &big), b"STORED\r\n");
        assert_eq!(
            store(&mut stream, "append", "full", &[2u8; 4 << 20]),
            b"NOT_STORED\r\n"
        );
        assert!(get(&mut stream, "full").unwrap().1 == big);
        // `ms` in append mode, with the item's CAS: a stale CAS is refused.
        let reply = String::from_utf8(call(&mut stream, b"mg full c\r\n")).unwrap();
        let cas: u64 = reply
            .trim_end()
            .rsplit('c')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        let ms = |cas: u64| {
            let line = format!("ms full 300000 MA C{cas}\r\n");
            [line.as_bytes(), &[3u8; 300_000], b"\r\n"].concat()
        };
        assert_eq!(call(&mut stream, &ms(cas + 1000)), b"EX\r\n");
        assert_eq!(call(&mut stream, &ms(cas)), b"HD\r\n");
        assert_eq!(
            get(&mut stream, "full").unwrap().1.len(),
            (5 << 20) + 300_000
        );
    }
}

/// `STAT name value` pairs of a stats group.
fn stats(stream: &mut TcpStream, group: &str) -> Vec<(String, u64)> {
    let reply = String::from_utf8(call(stream, format!("stats {group}\r\n").as_bytes())).unwrap();
    reply
        .lines()
        .filter_map(|line| {
            let mut words = line.split(' ');
            let (_, name, value) = (words.next()?, words.next()?, words.next()?);
            Some((name.to_string(), value.parse().ok()?))
        })
        .collect()
}

fn stat(pairs: &[(String, u64)], name: &str) -> u64 {
    pairs
        .iter()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("no STAT {name} in {pairs:?}"))
        .1
}

/// Dashboards and memcached-tool read the per-class figures: they add up to `curr_items`,
/// every class `stats items` shows is a slab class, and `bytes` counts the values in segments.
#[test]
fn stats_classes_and_bytes_count_every_item() {
    let server = Server::start(&["--segment", "mem:size=64M,numa=0", "--threads", "2"]);
    let mut stream = connect(&server);
    let sizes = [10usize, 200, 100_000, 262_144, 500_000, 3 << 20];
    for (i, len) in sizes.iter().enumerate() {
        let value = common::pattern(i as u64, *len);
        assert_eq!(
            store(&mut stream, "set", &format!("k{i}"), &value),
            b"STORED\r\n"
        );
    }
    let general = stats(&mut stream, "");
    let items = stats(&mut stream, "items");
    let slabs = stats(&mut stream, "slabs");
    assert_eq!(stat(&general, "curr_items"), sizes.len() as u64);
    let mut counted = 0;
    for class in 1..=3 {
        let number = items
            .iter()
            .find(|(n, _)| *n == format!("items:{class}:number"))
            .map_or(0, |p| p.1);
        counted += number;
        if number > 0 {
            // memcached-tool `display` lists a class from `stats slabs`.
            assert!(stat(&slabs, &format!("{class}:chunk_size")) > 0);
            assert!(
                stat(&slabs, &format!("{class}:used_chunks")) > 0,
                "class {class}"
            );
        }
    }
    assert_eq!(counted, sizes.len() as u64, "items classes: {items:?}");
    assert_eq!(
        stat(&items, "items:3:number"),
        2,
        "500 KB and 3 MiB are large"
    );
    let values: u64 = sizes.iter().map(|&n| n as u64).sum();
    let bytes = stat(&general, "bytes");
    assert!(bytes >= values, "bytes {bytes} < the values' {values}");
    assert_eq!(
        bytes,
        stat(&general, "ram_bytes") + stat(&general, "large_bytes")
    );
    assert_eq!(stat(&general, "large_bytes"), 500_000 + (3 << 20));
}

/// What memcached 1.6.45 answers since 1.6.18, byte for byte (each reply taken from a live
/// 1.6.45; tests/text_protocol.rs compares whole sessions with it where it is built).
#[test]
fn replies_that_changed_after_1_6_18() {
    let server = Server::start(&[]);
    let mut c = connect(&server);
    // Compared whole, shown cut to 200 bytes: large values would flood the output.
    let shown = |bytes: &[u8]| String::from_utf8_lossy(&bytes[..bytes.len().min(200)]).into_owned();
    let mut says = |request: &[u8], reply: &[u8]| {
        let got = call(&mut c, request);
        assert!(
            got == reply,
            "{}: got {:?} ({} bytes), want {:?} ({} bytes)",
            shown(request),
            shown(&got),
            got.len(),
            shown(reply),
            reply.len()
        );
    };
    // `E`: the item takes the client's CAS (1.6.27).
    says(b"ms ekey 1 E999\r\nx\r\n", b"HD\r\n");
    says(b"mg ekey c v\r\n", b"VA 1 c999\r\nx\r\n");
    says(b"ms ekey 1 E998 c\r\ny\r\n", b"HD c998\r\n");
    says(b"ma ekn N0 J5 E4321 c v\r\n", b"VA 1 c4321\r\n5\r\n");
    says(b"mg vivk c v N30 E777\r\n", b"VA 0 c777 W\r\n\r\n");
    says(b"md ekey I E555\r\n", b"HD\r\n");
    says(b"mg ekey c\r\n", b"HD c555 X W\r\n");
    // An item `N` creates is answered even with a TTL already past; the next read misses.
    says(b"mg nvk N-99 v\r\n", b"VA 0 W\r\n\r\n");
    says(b"mg nvk v\r\n", b"EN\r\n");
    // An append that misses creates the item with `N` (1.6.20).
    says(b"ms mak 1 MA N30\r\nx\r\n", b"HD\r\n");
    says(b"mg mak v t f\r\n", b"VA 1 t30 f0\r\nx\r\n");
    says(b"ms mak 2 MA N30\r\nyz\r\n", b"HD\r\n");
    says(b"mg mak v\r\n", b"VA 3\r\nxyz\r\n");
    says(b"ms nomak 1 MA\r\nx\r\n", b"NS\r\n");
    // `mg ... v C<cas>`: the value is left out while the reader's CAS is current (1.6.40).
    says(b"ms ck 3 E40\r\nabc\r\n", b"HD\r\n");
    says(b"mg ck v C40\r\n", b"HD\r\n");
    says(b"mg ck v c C40 t\r\n", b"HD c40 t-1\r\n");
    says(b"mg ck v C41 c\r\n", b"VA 3 c40\r\nabc\r\n");
    says(b"mg ck C40 s\r\n", b"HD s3\r\n");
    says(b"mg nock v C40\r\n", b"EN\r\n");
    says(b"mg ck v C40 q\r\n", b"HD\r\n");
    // ... a large value's too: nothing of it is read.
    let large = vec![b'L'; 300_000];
    // A line, then the large value as its data block (and `tail` after it).
    let with_large = |line: &[u8], tail: &[u8]| [line, &large[..], tail].concat();
    says(&with_large(b"ms lck 300000 E41\r\n", b"\r\n"), b"HD\r\n");
    says(b"mg lck c s\r\n", b"HD c41 s300000\r\n");
    says(b"mg lck v C41 s\r\n", b"HD s300000\r\n");
    says(
        b"mg lck v C1\r\nmn\r\n",
        &with_large(b"VA 300000\r\n", b"\r\nMN\r\n"),
    );
    // `ms ... s`: the item's size after the store, or the request's when nothing was stored
    // (1.6.20).
    says(b"ms sz 3 s\r\nabc\r\n", b"HD s3\r\n");
    says(b"ms sz 2 MA s\r\nde\r\n", b"HD s5\r\n");
    says(b"ms sz 2 s q\r\nde\r\n", b"");
    says(b"ms sz2 2 ME s\r\nde\r\n", b"HD s2\r\n");
    says(b"ms sz2 2 ME s\r\nde\r\n", b"NS s2\r\n");
    says(b"ms nosz 2 MR s\r\nde\r\n", b"NS s2\r\n");
    says(b"ms eHl6 1 s k O5 b\r\nx\r\n", b"HD s1 keHl6 b O5\r\n");
    says(
        &with_large(b"ms lsz 300000 s\r\n", b"\r\n"),
        b"HD s300000\r\n",
    );
    says(b"ms lsz 4 MA s\r\ntail\r\n", b"HD s300004\r\n");
    // An append that misses creates the item with `N`, a streamed (large) value too.
    says(
        &with_large(b"ms lviv 300000 MA N30 F3\r\n", b"\r\n"),
        b"HD\r\n",
    );
    says(b"mg lviv s t f\r\n", b"HD s300000 t30 f3\r\n");
    says(
        &with_large(b"ms lviv 300000 MP N30 F3\r\n", b"\r\n"),
        b"HD\r\n",
    );
    says(b"mg lviv s\r\n", b"HD s600000\r\n");
    says(&with_large(b"ms lnoviv 300000 MA\r\n", b"\r\n"), b"NS\r\n");
    // `md ... x` empties the value and keeps the item (1.6.27).
    says(b"ms xk 3 F5 T100\r\nabc\r\n", b"HD\r\n");
    says(b"md xk x\r\n", b"HD\r\n");
    says(b"mg xk v f t\r\n", b"VA 0 f0 t-1\r\n\r\n");
    // A malformed line is CLIENT_ERROR, not ERROR (1.6.40).
    for bare in [
        &b"get\r\n"[..],
        b"gets\r\n",
        b"gat 10\r\n",
        b"ms\r\n",
        b"mg\r\n",
        b"\r\n",
    ] {
        says(bare, b"CLIENT_ERROR bad command line format\r\n");
    }
    // Tokens after delete's key are ignored; `noreply` counts as the last.
    says(
        b"set dk 0 0 1\r\nx\r\ndelete dk 5\r\ndelete dk 5\r\n",
        b"STORED\r\nDELETED\r\nNOT_FOUND\r\n",
    );
    says(b"delete dk 0 noreply\r\n", b"");
    // A length that is no number is refused at once, its block read as commands.
    says(
        b"set big 0 0 99999999999\r\n",
        b"CLIENT_ERROR bad command line format\r\n",
    );
    // Bad flags swallow the block (1.6.45).
    says(
        b"set fk x 0 3\r\nabc\r\n",
        b"CLIENT_ERROR bad command line format\r\n",
    );
    // A NUL is a key byte (1.6.40).
    says(
        b"set a\0b 0 0 1\r\nx\r\nget a\0b\r\nget a\r\n",
        b"STORED\r\nVALUE a\0b 0 1\r\nx\r\nEND\r\nEND\r\n",
    );
    // `shutdown` without -A.
    says(b"shutdown\r\n", b"SERVER_ERROR: shutdown not enabled\r\n");
}

/// `watch connevents`, as memcached's t/watcher.t reads it: a line when a client connects and
/// one when it closes, `reason=normal` after QUIT, `reason=error` after a protocol error.
#[test]
fn watch_connevents_logs_connections_opened_and_closed() {
    let server = Server::start(&[]);
    let mut watcher = connect(&server);
    watcher.write_all(b"watch connevents\r\n").unwrap();
    assert_eq!(read_until(&mut watcher, b"\r\n"), b"OK");
    // One line at a time: a read may bring several.
    let line = |watcher: &mut TcpStream| {
        watcher
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut bytes = Vec::new();
        let mut byte = [0u8; 1];
        while bytes.last() != Some(&b'\n') {
            watcher.read_exact(&mut byte).expect("a watch line");
            bytes.push(byte[0]);
        }
        String::from_utf8(bytes).unwrap()
    };
    let mut client = connect(&server);
    assert_eq!(call(&mut client, b"version\r\n"), b"VERSION 1.6.45\r\n");
    client.write_all(b"quit\r\n").unwrap();
    let opened = line(&mut watcher);
    let port = client.local_addr().unwrap().port();
    assert!(
        opened.contains(" type=conn_new rip=127.0.0.1 ")
            && opened.contains(&format!(" rport={port} transport=tcp cfd=")),
        "{opened}"
    );
    let closed = line(&mut watcher);
    assert!(
        closed.contains(" type=conn_close ")
            && closed.contains(" transport=tcp reason=normal cfd="),
        "{closed}"
    );
    let mut bad = connect(&server);
    bad.write_all(b"GET / HTTP/1.1\r\n").unwrap();
    assert!(line(&mut watcher).contains(" type=conn_new "));
    let closed = line(&mut watcher);
    assert!(closed.contains(" reason=error "), "{closed}");
    for text in [&opened, &closed] {
        assert!(text.starts_with("ts="), "{text}");
        assert!(
            text.split(' ')
                .nth(1)
                .is_some_and(|gid| gid.starts_with("gid=")),
            "{text}"
        );
    }
}

/// `watch evictions`, as memcached's t/watcher.t asks for it (`watch mutations evictions`): a
/// store into a full cache logs what it evicted (`type=eviction key=... fetch=yes|no ttl=...
/// la=... clsid=... size=...`, before its `item_store` line), one line per item the STAT
/// `evictions` counts; `log_watchers` counts the watching connections.
#[test]
fn watch_evictions_logs_each_item_evicted() {
    let server = Server::start(&["--memory", "16M", "--threads", "1"]);
    let mut client = connect(&server);
    let mut watcher = connect(&server);
    watcher.write_all(b"watch mutations evictions\r\n").unwrap();
    assert_eq!(read_until(&mut watcher, b"\r\n"), b"OK");
    assert_eq!(stat(&stats(&mut client, ""), "log_watchers"), 1);
    let before = stat(&stats(&mut client, ""), "evictions");
    // 3,000 values of 11,000 bytes into 16 MiB: evictions, some of them items read once.
    let value = vec![b'B'; 11_000];
    for i in 0..3_000 {
        let key = format!("n,foo{i}");
        assert_eq!(store(&mut client, "set", &key, &value), b"STORED\r\n");
        if i == 0 {
            assert!(get(&mut client, &key).is_some());
        }
    }
    let evicted = stat(&stats(&mut client, ""), "evictions") - before;
    assert!(evicted > 0, "nothing was evicted");
    // Every eviction has its line, and the stores theirs.
    let mut lines = String::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    watcher
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    while lines.matches(" type=eviction ").count() < evicted as usize
        || lines.matches(" type=item_store ").count() < 3_000
    {
        assert!(
            Instant::now() < deadline,
            "{} eviction lines of {evicted}",
            lines.matches(" type=eviction ").count()
        );
        let mut chunk = [0u8; 65536];
        if let Ok(n) = watcher.read(&mut chunk) {
            lines.push_str(std::str::from_utf8(&chunk[..n]).unwrap());
        }
    }
    assert_eq!(lines.matches(" type=eviction ").count(), evicted as usize);
    let first = lines
        .lines()
        .find(|l| l.contains(" type=eviction key=n%2Cfoo0 "))
        .expect("the first key evicted, and logged");
    assert!(
        first.contains(" fetch=yes ttl=-1 la=") && first.ends_with(" size=11000"),
        "{first}"
    );
    let unread = lines
        .lines()
        .find(|l| l.contains(" type=eviction key=n%2Cfoo1 "))
        .expect("the second key evicted, and logged");
    assert!(unread.contains(" fetch=no "), "{unread}");
    drop(watcher);
    let deadline = Instant::now() + Duration::from_secs(10);
    while stat(&stats(&mut client, ""), "log_watchers") != 0 {
        assert!(
            Instant::now() < deadline,
            "the watcher was never counted gone"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `watch deletions` (1.6.20): a line per item a `delete` or `md` removed, as 1.6.45 writes it
/// (`type=deleted key=<URI-encoded> cmd=delete|md clsid=<class> size=<value bytes>`); misses
/// and `md ... I` (which keeps the item, stale) are not logged.
#[test]
fn watch_deletions_logs_each_item_removed() {
    let server = Server::start(&[]);
    let mut watcher = connect(&server);
    watcher.write_all(b"watch deletions\r\n").unwrap();
    assert_eq!(read_until(&mut watcher, b"\r\n"), b"OK");
    let mut client = connect(&server);
    let large = vec![b'L'; 300_000];
    let mut set_large = b"set big 0 0 300000\r\n".to_vec();
    set_large.extend_from_slice(&large);
    set_large.extend_from_slice(b"\r\n");
    assert_eq!(call(&mut client, &set_large), b"STORED\r\n");
    assert_eq!(
        call(
            &mut client,
            b"set a 0 0 1\r\nx\r\nset b%20c 0 0 2\r\nyz\r\nset st 0 0 1\r\ns\r\n\
              delete a\r\ndelete nope\r\nmd b%20c q\r\nmd st I\r\nmd big\r\nmn\r\n"
        ),
        b"STORED\r\nSTORED\r\nSTORED\r\nDELETED\r\nNOT_FOUND\r\nHD\r\nHD\r\nMN\r\n"
    );
    let mut lines = String::new();
    watcher
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut buf = [0u8; 4096];
    while lines.matches('\n').count() < 3 {
        let n = watcher.read(&mut buf).expect("watch lines");
        assert!(n > 0, "the watcher closed: {lines}");
        lines.push_str(std::str::from_utf8(&buf[..n]).unwrap());
    }
    let got: Vec<&str> = lines
        .lines()
        .map(|line| line.split_once(" type=").expect(line).1)
        .collect();
    assert_eq!(
        got,
        [
            "deleted key=a cmd=delete clsid=1 size=1",
            "deleted key=b%2520c cmd=md clsid=1 size=2",
            "deleted key=big cmd=md clsid=3 size=300000",
        ]
    );
}
