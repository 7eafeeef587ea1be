//! `--segment-eviction`: with `none` a full segment fails a large SET with "out of memory" and
//! touches nothing else; with `lru` the least recently used large values make room.

mod common;

use std::io::Write;

use common::server::{frame, set_extras, Client, Server};

fn set_large(c: &mut Client, key: &[u8], len: usize, byte: u8) -> u16 {
    let mut head = frame(0x01, &set_extras(0, 0), key, &[], 0, 1);
    head[8..12].copy_from_slice(&((8 + key.len() + len) as u32).to_be_bytes());
    c.send(&head);
    c.stream.write_all(&vec![byte; len]).unwrap();
    c.recv().unwrap().status
}

const MB: usize = 1 << 20;

#[test]
fn without_eviction_a_full_segment_refuses_and_keeps_everything() {
    let server = Server::start(&["--threads", "2", "--segment", "mem:size=32M,numa=0"]);
    let mut c = server.client();
    assert_eq!(set_large(&mut c, b"a", 12 * MB, 1), 0);
    assert_eq!(set_large(&mut c, b"b", 12 * MB, 2), 0);
    assert_eq!(set_large(&mut c, b"c", 12 * MB, 3), 0x0082, "out of memory");
    assert_eq!(c.get(b"a").value, vec![1u8; 12 * MB]);
    assert_eq!(c.get(b"b").value, vec![2u8; 12 * MB]);
    assert_eq!(c.get(b"c").status, 1);
    assert_eq!(c.stat("placement", "segment_evictions"), 0);
    // Still usable after the refusal.
    assert_eq!(c.set(b"small", b"ok", 0, 0).status, 0);
}

#[test]
fn with_lru_the_least_recently_used_large_value_makes_room() {
    let server = Server::start(&[
        "--threads",
        "2",
        "--segment",
        "mem:size=32M,numa=0",
        "--segment-eviction",
        "lru",
    ]);
    let mut c = server.client();
    assert_eq!(set_large(&mut c, b"a", 12 * MB, 1), 0);
    assert_eq!(set_large(&mut c, b"b", 12 * MB, 2), 0);
    // Reading `a` makes `b` the least recently used.
    assert_eq!(c.get(b"a").value.len(), 12 * MB);
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert_eq!(set_large(&mut c, b"c", 12 * MB, 3), 0);
    assert_eq!(
        c.get(b"b").status,
        1,
        "the least recently used value was evicted"
    );
    assert_eq!(c.get(b"a").value, vec![1u8; 12 * MB]);
    assert_eq!(c.get(b"c").value, vec![3u8; 12 * MB]);
    assert!(c.stat("placement", "segment_evictions") >= 1);
}
