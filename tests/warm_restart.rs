//! Warm restart: large values on file segments survive a clean shutdown (SIGTERM) and a start
//! on the same `--data-dir`, byte-exact; a crash, a damaged snapshot, a changed segment or
//! damaged data never brings back wrong bytes.

mod common;

use std::os::unix::fs::FileExt;
use std::path::Path;

use common::pattern;
use common::server::{fresh_data_dir, Client, Server};

const ARGS: &[&str] = &["--threads", "2", "--ram-head", "256K"];

/// (key, length, flags): sizes around chunk and alignment edges.
const VALUES: &[(&str, usize, u32)] = &[
    ("a", 300 << 10, 1),
    ("b", (1 << 20) + 1, 2),
    ("c", (5 << 20) + 17, 3),
    ("d", 24 << 20, 4),
];

fn fill(c: &mut Client) {
    for (i, &(key, len, flags)) in VALUES.iter().enumerate() {
        let r = c.set_streamed(0x01, key.as_bytes(), &pattern(i as u64, len), flags);
        assert_eq!(r.status, 0, "SET {key}");
    }
}

fn assert_all_back(c: &mut Client) {
    for (i, &(key, len, flags)) in VALUES.iter().enumerate() {
        let got = c.get(key.as_bytes());
        assert_eq!(
            (got.status, got.value.len()),
            (0, len),
            "{key} after restart"
        );
        assert_eq!(got.flags(), flags);
        assert!(
            got.value == pattern(i as u64, len),
            "{key} came back different"
        );
    }
}

fn snapshot_parts(dir: &Path) -> Vec<std::path::PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir.join("snapshot")) else {
        return Vec::new();
    };
    entries
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "bin"))
        .collect()
}

#[test]
fn large_values_survive_a_clean_restart_byte_exact() {
    let dir = fresh_data_dir();
    let server = Server::start_in(&dir, ARGS);
    let mut c = server.client();
    fill(&mut c);
    assert_eq!(c.set(b"small", b"lives in RAM only", 0, 0).status, 0);
    assert_eq!(
        c.set_streamed(0x01, b"gone", &pattern(99, 2 << 20), 0)
            .status,
        0
    );
    assert_eq!(
        c.call(&common::server::frame(0x04, &[], b"gone", &[], 0, 0))
            .status,
        0
    );
    std::thread::sleep(std::time::Duration::from_millis(100));
    let used_before = c.segment_used();
    assert_eq!(server.stop().code(), Some(0));
    assert!(!snapshot_parts(&dir).is_empty(), "no snapshot written");

    let server = Server::start_in(&dir, ARGS);
    assert!(
        server.logs("warm restart from the snapshot"),
        "{}",
        server.log_text()
    );
    let mut c = server.client();
    assert_all_back(&mut c);
    assert_eq!(
        c.get(b"small").status,
        1,
        "RAM-only values are not snapshotted"
    );
    assert_eq!(c.get(b"gone").status, 1, "a deleted value came back");
    assert_eq!(
        c.segment_used(),
        used_before,
        "restored extents are claimed, no more, no less"
    );
    assert!(
        snapshot_parts(&dir).is_empty(),
        "the snapshot is consumed at start"
    );

    // New values go around the restored ones, which stay intact.
    assert_eq!(
        c.set_streamed(0x01, b"new", &pattern(7, 8 << 20), 0).status,
        0
    );
    assert_all_back(&mut c);
    assert!(c.get(b"new").value == pattern(7, 8 << 20));
    assert_eq!(server.stop().code(), Some(0));

    // And the second shutdown snapshots both again.
    let server = Server::start_in(&dir, ARGS);
    let mut c = server.client();
    assert_all_back(&mut c);
    assert!(c.get(b"new").value == pattern(7, 8 << 20));
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_crash_restarts_empty() {
    let dir = fresh_data_dir();
    let server = Server::start_in(&dir, ARGS);
    fill(&mut server.client());
    assert_eq!(server.stop().code(), Some(0));
    // Restored once, then killed: the consumed snapshot must not bring back what a later
    // (unsnapshotted) write could have overwritten.
    let server = Server::start_in(&dir, ARGS);
    assert_all_back(&mut server.client());
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(server.pid() as i32),
        nix::sys::signal::SIGKILL,
    )
    .unwrap();
    drop(server);
    let server = Server::start_in(&dir, ARGS);
    let mut c = server.client();
    for &(key, _, _) in VALUES {
        assert_eq!(
            c.get(key.as_bytes()).status,
            1,
            "{key} came back after a crash"
        );
    }
    assert_eq!(c.segment_used(), 0);
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_damaged_snapshot_starts_empty_with_a_warning() {
    let dir = fresh_data_dir();
    let server = Server::start_in(&dir, ARGS);
    fill(&mut server.client());
    assert_eq!(server.stop().code(), Some(0));
    for part in snapshot_parts(&dir) {
        let mut bytes = std::fs::read(&part).unwrap();
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0x10;
        std::fs::write(&part, bytes).unwrap();
    }
    let server = Server::start_in(&dir, ARGS);
    assert!(
        server.logs("snapshot part unusable"),
        "{}",
        server.log_text()
    );
    let mut c = server.client();
    for &(key, _, _) in VALUES {
        assert_eq!(c.get(key.as_bytes()).status, 1);
    }
    assert_eq!(c.segment_used(), 0);
    assert_eq!(c.set(b"still", b"works", 0, 0).status, 0);
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn damaged_data_skips_only_that_object() {
    let dir = fresh_data_dir();
    let server = Server::start_in(&dir, ARGS);
    fill(&mut server.client());
    assert_eq!(server.stop().code(), Some(0));
    // Find where "c" lives and flip one of its bytes in the segment file.
    let mut extent = None;
    for part in snapshot_parts(&dir) {
        let (snapshot, _) = headroom::snapshot::decode(&std::fs::read(part).unwrap()).unwrap();
        for object in snapshot.objects {
            if object.key == b"c" {
                extent = Some(object.replicas[0].1);
            }
        }
    }
    let extent = extent.expect("c is in the snapshot");
    let segment = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(dir.join("segment-0"))
        .unwrap();
    let at = extent.offset + 3 * (1 << 20) + 5;
    let mut byte = [0u8];
    segment.read_exact_at(&mut byte, at).unwrap();
    byte[0] ^= 0xFF;
    segment.write_all_at(&byte, at).unwrap();
    segment.sync_all().unwrap();
    drop(segment);

    let server = Server::start_in(&dir, ARGS);
    assert!(
        server.logs("no longer matches its checksum"),
        "{}",
        server.log_text()
    );
    let mut c = server.client();
    assert_eq!(c.get(b"c").status, 1, "damaged data was served");
    for (i, &(key, len, _)) in VALUES.iter().enumerate().filter(|(_, v)| v.0 != "c") {
        assert!(
            c.get(key.as_bytes()).value == pattern(i as u64, len),
            "{key}"
        );
    }
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_segment_mounted_with_another_size_is_not_trusted() {
    let dir = fresh_data_dir();
    let server = Server::start_in(&dir, ARGS);
    fill(&mut server.client());
    assert_eq!(server.stop().code(), Some(0));
    let segment = format!("file:{},size=512M", dir.join("segment-0").display());
    let mut args = ARGS.to_vec();
    args.extend(["--segment", &segment]);
    let server = Server::start_in(&dir, &args);
    let mut c = server.client();
    for &(key, _, _) in VALUES {
        assert_eq!(
            c.get(key.as_bytes()).status,
            1,
            "{key} trusted on a resized segment"
        );
    }
    assert_eq!(c.segment_used(), 0);
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn restored_values_can_be_evicted_like_any_other() {
    let dir = fresh_data_dir();
    let segment = format!("file:{},size=32M", dir.join("segment-0").display());
    let args = [ARGS, &["--segment", &segment, "--segment-eviction", "lru"]].concat();
    let server = Server::start_in(&dir, &args);
    let mut c = server.client();
    for key in ["a", "b"] {
        assert_eq!(
            c.set_streamed(0x01, key.as_bytes(), &pattern(1, 12 << 20), 0)
                .status,
            0
        );
    }
    assert_eq!(server.stop().code(), Some(0));
    let server = Server::start_in(&dir, &args);
    let mut c = server.client();
    assert_eq!(
        c.set_streamed(0x01, b"c", &pattern(2, 12 << 20), 0).status,
        0,
        "no room made"
    );
    let gone = ["a", "b"]
        .iter()
        .filter(|k| c.get(k.as_bytes()).status == 1)
        .count();
    assert_eq!(gone, 1, "one restored value made room");
    assert!(c.get(b"c").value == pattern(2, 12 << 20));
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}
