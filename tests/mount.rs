//! Mount, unmount and remount at runtime through the admin socket: a mounted segment takes
//! placements; unmount is two-phase (prepare: no new placements, reads go on; commit: its
//! objects leave the index); a remount must keep its identity; overlaps and duplicates are
//! refused.

mod common;

use std::io::Write;

use common::server::{frame, Client, Server};

const SETX: u8 = 0x40;

/// A large SET aimed at one target (SETX with it preferred).
fn set_on(c: &mut Client, key: &[u8], len: usize, target: u32) -> u16 {
    let mut e = 0u32.to_be_bytes().to_vec();
    e.extend_from_slice(&0u32.to_be_bytes());
    e.extend_from_slice(&[1, 0xff, 0xff, 0, 1, 0]);
    e.extend_from_slice(&target.to_be_bytes());
    let mut head = frame(SETX, &e, key, &[], 0, 1);
    head[8..12].copy_from_slice(&((e.len() + key.len() + len) as u32).to_be_bytes());
    c.send(&head);
    c.stream.write_all(&vec![9u8; len]).unwrap();
    c.recv().unwrap().status
}

#[test]
fn mount_unmount_and_remount_at_runtime() {
    let server = Server::start(&["--threads", "2", "--segment", "mem:size=64M,numa=0"]);
    let dir = server.data_dir.clone();
    let admin = |command: &str| server.admin(command);
    let mut c = server.client();
    let spec = format!("file:{}/extra,size=64M", dir.display());

    assert_eq!(
        admin(&format!("mount {spec}")),
        Ok("mounted t1".to_string())
    );
    assert_eq!(
        c.stats("segments")
            .iter()
            .find(|(n, _)| n == "target_1_kind")
            .unwrap()
            .1,
        "file"
    );
    assert_eq!(set_on(&mut c, b"on-t1", 2 << 20, 1), 0);
    assert_eq!(c.stat("segments", "target_1_used"), 2 << 20);
    // Mounting it again while mounted: a duplicate.
    assert!(admin(&format!("mount {spec}")).is_err());

    // Commit before prepare is refused.
    let refused = admin("unmount commit 1").unwrap_err();
    assert!(refused.contains("prepare"), "{refused}");
    // Prepare: no new placements there, reads go on.
    assert!(admin("unmount prepare 1").is_ok());
    assert_eq!(c.get(b"on-t1").value.len(), 2 << 20);
    assert_eq!(set_on(&mut c, b"elsewhere", 2 << 20, 1), 0);
    assert_eq!(
        c.stat("segments", "target_1_used"),
        2 << 20,
        "a draining target took a placement"
    );
    // Commit: its objects leave the index.
    assert_eq!(
        admin("unmount commit 1"),
        Ok("unmounted t1, 1 objects dropped".to_string())
    );
    assert_eq!(c.get(b"on-t1").status, 1);
    assert_eq!(c.get(b"elsewhere").value.len(), 2 << 20);
    assert!(!c
        .stats("segments")
        .iter()
        .any(|(n, _)| n.starts_with("target_1_")));

    // Remount: the same file, the same identity, a new id.
    assert_eq!(
        admin(&format!("mount {spec}")),
        Ok("mounted t2".to_string())
    );
    assert!(admin("unmount prepare 2").is_ok());
    assert!(admin("unmount commit 2").is_ok());
    // A remount that changes the size is refused (the file's label says its size).
    let refused = admin(&format!("mount file:{}/extra,size=32M", dir.display())).unwrap_err();
    assert!(
        refused.contains("as a segment of 67108864 bytes, not 33554432"),
        "{refused}"
    );
    let r = admin(&format!("mount {spec},numa=0"));
    assert!(r.is_ok(), "an unknown node may be filled in: {r:?}");
    assert!(admin("unmount prepare 3").is_ok());
    assert!(admin("unmount commit 3").is_ok());
    let r = admin(&format!("mount {spec}"));
    assert!(
        r.is_ok(),
        "a known node stays when the remount does not say: {r:?}"
    );
    assert_eq!(
        c.stats("segments")
            .iter()
            .find(|(n, _)| n == "target_4_node")
            .unwrap()
            .1,
        "0"
    );

    // Bad commands get a clear refusal.
    for bad in [
        "mount",
        "mount disk:/x,size=1G",
        "unmount prepare 99",
        "unmount commit x",
        "format c:",
    ] {
        let refused = admin(bad).unwrap_err();
        assert!(!refused.is_empty(), "{bad}");
    }
    assert_eq!(c.set(b"still", b"serving", 0, 0).status, 0);
    drop(server);
    let _ = std::fs::remove_dir_all(dir);
}
