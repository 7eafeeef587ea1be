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
