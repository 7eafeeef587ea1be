//! The SETX extension through the real server: preferred and excluded targets, strict node
//! hints with their own status, replicas counted in the reply, and small values staying in RAM.

mod common;

use std::io::Write;

use common::server::{frame, Client, Server};

const SETX: u8 = 0x40;

fn setx_extras(
    replicas: u8,
    node: u16,
    strict: bool,
    preferred: &[u32],
    excluded: &[u32],
) -> Vec<u8> {
    let mut e = 0u32.to_be_bytes().to_vec(); // flags
    e.extend_from_slice(&0u32.to_be_bytes()); // expiry
    e.push(replicas);
    e.extend_from_slice(&node.to_be_bytes());
    e.push(u8::from(strict));
    e.push(preferred.len() as u8);
    e.push(excluded.len() as u8);
    for id in preferred.iter().chain(excluded) {
        e.extend_from_slice(&id.to_be_bytes());
    }
    e
}

fn setx(c: &mut Client, key: &[u8], len: usize, extras: &[u8]) -> common::server::Response {
    let mut head = frame(SETX, extras, key, &[], 0, 9);
    head[8..12].copy_from_slice(&((extras.len() + key.len() + len) as u32).to_be_bytes());
    c.send(&head);
    c.stream.write_all(&vec![7u8; len]).unwrap();
    c.recv().unwrap()
}

fn used(c: &mut Client, target: u32) -> u64 {
    c.stat("segments", &format!("target_{target}_used"))
}

#[test]
fn setx_places_as_asked() {
    let dir = common::fresh_temp_path("setx");
    let file = format!("file:{}/seg,size=256M", dir.display());
    // Target 0: memory on node 0; target 1: a file of unknown locality.
    let server = Server::start(&[
        "--threads",
        "2",
        "--segment",
        "mem:size=16M,numa=0",
        "--segment",
        &file,
    ]);
    let mut c = server.client();
    let mb = 1 << 20;

    // Default hint (the serving node): the memory target on node 0.
    let r = setx(&mut c, b"a", mb, &setx_extras(0, 0xffff, false, &[], &[]));
    assert_eq!((r.status, r.extras.as_slice()), (0, &[1u8][..]));
    assert_eq!((used(&mut c, 0), used(&mut c, 1)), (mb as u64, 0));

    // Preferred target first.
    let r = setx(&mut c, b"b", mb, &setx_extras(0, 0xffff, false, &[1], &[]));
    assert_eq!(r.status, 0);
    assert_eq!(used(&mut c, 1), mb as u64);

    // Excluded never used: node 0's target is excluded, so the unknown-locality file.
    let r = setx(&mut c, b"c", mb, &setx_extras(0, 0, false, &[], &[0]));
    assert_eq!(r.status, 0);
    assert_eq!(used(&mut c, 1), 2 * mb as u64);

    // Strict on node 0 with more than node 0 holds: its own status, and nothing placed.
    let r = setx(&mut c, b"d", 20 * mb, &setx_extras(0, 0, true, &[], &[]));
    assert_eq!(r.status, 0x0084, "{r:?}");
    assert_eq!(c.get(b"d").status, 1);
    // Not strict: falls back to the file.
    let r = setx(&mut c, b"d", 20 * mb, &setx_extras(0, 0, false, &[], &[]));
    assert_eq!(r.status, 0);
    assert_eq!(c.get(b"d").value.len(), 20 * mb);

    // Two replicas on a one-host server: distinct hosts allow one; the reply says so.
    let r = setx(&mut c, b"e", mb, &setx_extras(2, 0xffff, false, &[], &[]));
    assert_eq!((r.status, r.extras.as_slice()), (0, &[1u8][..]));
    assert!(c.stat("placement", "partial") >= 1);

    // A small SETX value stays in RAM: no replicas.
    let r = setx(&mut c, b"small", 100, &setx_extras(1, 0, true, &[], &[]));
    assert_eq!((r.status, r.extras.as_slice()), (0, &[0u8][..]));
    assert_eq!(c.get(b"small").value, vec![7u8; 100]);
    assert!(c.stat("placement", "strict_failures") >= 1);
    drop(server);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_malformed_setx_is_refused_like_any_bad_frame() {
    let server = Server::start(&["--threads", "1"]);
    let mut c = server.client();
    // Extras claim one preferred target but carry none.
    let mut extras = setx_extras(0, 0xffff, false, &[], &[]);
    extras[12] = 1;
    c.send(&frame(SETX, &extras, b"k", b"v", 0, 1));
    let r = c.recv().unwrap();
    assert_eq!(r.status, 0x0004);
    assert!(c.recv().is_none(), "closed after invalid arguments");
}

/// Sends a text `ms` line and a value of `len` bytes; the reply line.
fn ms(stream: &mut std::net::TcpStream, line: &str, len: usize) -> String {
    use std::io::{BufRead, BufReader};
    stream.write_all(format!("{line}\r\n").as_bytes()).unwrap();
    stream.write_all(&vec![7u8; len]).unwrap();
    stream.write_all(b"\r\n").unwrap();
    let mut reply = String::new();
    BufReader::new(stream.try_clone().unwrap())
        .read_line(&mut reply)
        .unwrap();
    reply
}

#[test]
fn ms_placement_flags_place_as_setx_does() {
    let dir = common::fresh_temp_path("ms-hints");
    let file = format!("file:{}/seg,size=256M", dir.display());
    let server = Server::start(&[
        "--threads",
        "2",
        "--segment",
        "mem:size=16M,numa=0",
        "--segment",
        &file,
    ]);
    let mut c = server.client();
    let mut text = std::net::TcpStream::connect(server.addr).unwrap();
    text.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    let mb = 1 << 20;
    // Default: the memory target on the serving node.
    assert_eq!(ms(&mut text, &format!("ms a {mb}"), mb), "HD\r\n");
    assert_eq!((used(&mut c, 0), used(&mut c, 1)), (mb as u64, 0));
    // U: preferred target first.
    assert_eq!(ms(&mut text, &format!("ms b {mb} U1"), mb), "HD\r\n");
    assert_eq!(used(&mut c, 1), mb as u64);
    // X: excluded never used.
    assert_eq!(ms(&mut text, &format!("ms c {mb} G0 X0"), mb), "HD\r\n");
    assert_eq!(used(&mut c, 1), 2 * mb as u64);
    // H: strict on node 0 with more than it holds: refused, nothing stored.
    let reply = ms(&mut text, &format!("ms d {} G0 H", 20 * mb), 20 * mb);
    assert!(
        reply.starts_with("SERVER_ERROR no target on node 0"),
        "{reply}"
    );
    assert_eq!(c.get(b"d").status, 1);
    // Not strict: it falls back to the file; R1 and k/O come back as for any ms.
    assert_eq!(
        ms(&mut text, &format!("ms d {} G0 R1 k O5", 20 * mb), 20 * mb),
        "HD kd O5\r\n"
    );
    assert_eq!(used(&mut c, 1), 22 * mb as u64);
    // A malformed hint is memcached's bad token error, and the connection goes on.
    assert_eq!(
        ms(&mut text, "ms e 1 Ux", 1),
        "CLIENT_ERROR bad token in command line format\r\n"
    );
    assert_eq!(ms(&mut text, "ms e 1", 1), "HD\r\n");
    let _ = std::fs::remove_dir_all(dir);
}
