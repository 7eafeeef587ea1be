//! Large values (over `--ram-head`) through TCP: stored whole in segments (file and memory),
//! byte-exact back, head first; overwrite, delete and expiry free their extents; an aborted
//! SET leaves nothing behind.

mod common;

use std::io::{Read, Write};

use common::pattern;
use common::server::{frame, set_extras, Server};

fn round_trips(args: &[&str]) {
    let server = Server::start(args);
    let mut c = server.client();
    for (i, len) in [300 << 10, 1 << 20, (5 << 20) + 17, 64 << 20]
        .into_iter()
        .enumerate()
    {
        let key = format!("large-{i}");
        let value = pattern(i as u64, len);
        let r = c.set_streamed(0x01, key.as_bytes(), &value, 7);
        assert_eq!(r.status, 0, "SET {len}: {r:?}");
        let got = c.get(key.as_bytes());
        assert_eq!((got.status, got.flags(), got.cas), (0, 7, r.cas));
        assert_eq!(got.value.len(), len);
        assert!(got.value == value, "{len}-byte value came back different");
    }
    let before = c.segment_used();
    assert!(before >= 70 << 20);
    // Overwrite with a small value and delete: the extents go back to the master.
    assert_eq!(c.set(b"large-3", b"small now", 0, 0).status, 0);
    assert_eq!(c.get(b"large-3").value, b"small now");
    assert_eq!(c.call(&frame(0x04, &[], b"large-2", &[], 0, 0)).status, 0);
    assert_eq!(c.get(b"large-2").status, 1);
    std::thread::sleep(std::time::Duration::from_millis(200));
    let after = c.segment_used();
    assert!(
        after <= before - (69 << 20),
        "extents not freed: {before} -> {after}"
    );
    assert_eq!(c.stat("", "curr_items"), 3);
    assert_eq!(server.stop().code(), Some(0));
}

#[test]
fn large_values_round_trip_through_a_file_segment() {
    round_trips(&["--threads", "2", "--ram-head", "256K"]);
}

#[test]
fn large_values_round_trip_through_a_memory_segment() {
    round_trips(&["--threads", "2", "--segment", "mem:size=256M,numa=0"]);
}

#[test]
fn an_aborted_set_leaves_nothing_behind() {
    let server = Server::start(&["--threads", "1"]);
    let mut c = server.client();
    let before = c.segment_used();
    {
        let mut d = server.client();
        let mut head = frame(0x01, &set_extras(0, 0), b"half", &[], 0, 1);
        head[8..12].copy_from_slice(&((8 + 4 + (8 << 20)) as u32).to_be_bytes());
        d.send(&head);
        d.stream.write_all(&vec![1u8; 3 << 20]).unwrap();
    }
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(
        c.get(b"half").status,
        1,
        "a half-written value must never be visible"
    );
    assert_eq!(
        c.segment_used(),
        before,
        "the aborted SET's extent was not freed"
    );
}

#[test]
fn the_head_arrives_before_the_tail_is_read() {
    // The first bytes of a large GET reply come from RAM: read the header and head while
    // the rest is still streaming.
    let server = Server::start(&["--threads", "1", "--ram-head", "256K"]);
    let mut c = server.client();
    let value = pattern(9, 32 << 20);
    assert_eq!(c.set_streamed(0x01, b"big", &value, 7).status, 0);
    c.send(&frame(0x00, &[], b"big", &[], 0, 5));
    let mut head = vec![0u8; 24 + 4 + (256 << 10)];
    c.stream.read_exact(&mut head).unwrap();
    assert_eq!(&head[28..], &value[..256 << 10]);
    let mut rest = vec![0u8; value.len() - (256 << 10)];
    c.stream.read_exact(&mut rest).unwrap();
    assert!(rest == value[256 << 10..]);
}

#[test]
fn a_one_and_a_half_gib_value_round_trips_byte_exact() {
    // Streamed both ways and checked by a running hash, never held whole by the test.
    const LEN: u64 = 3 << 29; // 1.5 GiB
    let segment_dir = common::fresh_temp_path("big");
    let server = Server::start(&[
        "--threads",
        "2",
        "--segment",
        &format!("file:{}/big,size=2G", segment_dir.display()),
    ]);
    let mut c = server.client();
    let key = b"one-and-a-half";
    let mut head = frame(0x01, &set_extras(3, 0), key, &[], 0, 1);
    head[8..12].copy_from_slice(&((8 + key.len() as u64 + LEN) as u32).to_be_bytes());
    c.send(&head);
    let chunk = pattern(5, 1 << 20);
    let mut sent_hash = 0u64;
    for i in 0..(LEN >> 20) {
        let mut piece = chunk.clone();
        piece[..8].copy_from_slice(&i.to_le_bytes());
        sent_hash = piece.iter().fold(sent_hash, |h, b| {
            h.wrapping_mul(31).wrapping_add(u64::from(*b))
        });
        c.stream.write_all(&piece).unwrap();
    }
    let r = c.recv().unwrap();
    assert_eq!(r.status, 0, "{r:?}");
    c.send(&frame(0x00, &[], key, &[], 0, 2));
    let mut header = [0u8; 24 + 4];
    c.stream.read_exact(&mut header).unwrap();
    assert_eq!(
        u32::from_be_bytes(header[8..12].try_into().unwrap()) as u64,
        4 + LEN
    );
    let mut got_hash = 0u64;
    let mut buf = vec![0u8; 1 << 20];
    for _ in 0..(LEN >> 20) {
        c.stream.read_exact(&mut buf).unwrap();
        got_hash = buf.iter().fold(got_hash, |h, b| {
            h.wrapping_mul(31).wrapping_add(u64::from(*b))
        });
    }
    assert_eq!(got_hash, sent_hash, "1.5 GiB came back different");
    let _ = std::fs::remove_dir_all(segment_dir);
}
