//! The snapshot format: versions 1 and 2 as committed in `tests/data/snapshot-v1.bin` and
//! `snapshot-v2.bin` still decode to the same objects (version 1 naming segments by a hash of
//! their path, 2 by their own id), 2 is what this build writes, and damage is refused, never
//! misread.

use headroom::segment::Extent;
use headroom::snapshot::{
    decode, encode, Snapshot, SnapshotError, SnapshotObject, SnapshotTarget, TargetIds,
};

const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/snapshot-v2.bin");
const FIXTURE_V1: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/snapshot-v1.bin");

/// What the fixtures hold: two file targets, three objects (one with two replicas, one with a
/// 250-byte key, one that expires), named as version `ids` names them.
fn fixture_snapshot_with(ids: TargetIds) -> Snapshot {
    Snapshot {
        ids,
        targets: vec![
            SnapshotTarget {
                uuid: 0x1111_2222_3333_4444_5555_6666_7777_8888,
                kind: 1,
                base: 0,
                size: 1 << 30,
                node: Some(0),
                name: "/var/lib/headroom/segment-0".into(),
            },
            SnapshotTarget {
                uuid: 0xAAAA,
                kind: 1,
                base: 0,
                size: 64 << 30,
                node: None,
                name: "/dev/nvme1n1".into(),
            },
        ],
        objects: vec![
            SnapshotObject {
                key: b"video:42".to_vec(),
                flags: 7,
                expiry: 0,
                value_len: (5 << 20) + 17,
                checksum: 0xDEAD_BEEF,
                replicas: vec![
                    (
                        0x1111_2222_3333_4444_5555_6666_7777_8888,
                        Extent {
                            offset: 4096,
                            len: (5 << 20) + 4096,
                        },
                    ),
                    (
                        0xAAAA,
                        Extent {
                            offset: 1 << 30,
                            len: (5 << 20) + 4096,
                        },
                    ),
                ],
            },
            SnapshotObject {
                key: vec![b'k'; 250],
                flags: 0,
                expiry: 0,
                value_len: 300 << 10,
                checksum: 1,
                replicas: vec![(
                    0xAAAA,
                    Extent {
                        offset: 0,
                        len: 300 << 10,
                    },
                )],
            },
            SnapshotObject {
                key: b"expiring".to_vec(),
                flags: u32::MAX,
                expiry: 2_000_000_000,
                value_len: 1 << 20,
                checksum: 0,
                replicas: vec![(
                    0x1111_2222_3333_4444_5555_6666_7777_8888,
                    Extent {
                        offset: 16 << 20,
                        len: 1 << 20,
                    },
                )],
            },
        ],
    }
}

fn fixture_snapshot() -> Snapshot {
    fixture_snapshot_with(TargetIds::SegmentId)
}

#[test]
fn version_2_fixture_still_decodes_and_is_what_this_build_writes() {
    let written = encode(&fixture_snapshot());
    if std::env::var_os("HEADROOM_WRITE_FIXTURE").is_some() {
        std::fs::write(FIXTURE, &written).unwrap();
    }
    let fixture = std::fs::read(FIXTURE).expect("tests/data/snapshot-v2.bin");
    assert_eq!(decode(&fixture), Ok((fixture_snapshot(), 0)));
    assert!(
        written == fixture,
        "version 2 encoding changed: bump VERSION and keep reading v2"
    );
}

/// Version 1, written by builds before segments had ids, reads as naming segments by path.
#[test]
fn version_1_fixture_still_decodes() {
    let fixture = std::fs::read(FIXTURE_V1).expect("tests/data/snapshot-v1.bin");
    let v1 = fixture_snapshot_with(TargetIds::PathHash);
    assert_eq!(decode(&fixture), Ok((v1.clone(), 0)));
    assert!(encode(&v1) == fixture, "version 1 encoding changed");
    assert_eq!(&fixture[8..12], &1u32.to_le_bytes());
}

#[test]
fn damage_is_refused_never_misread() {
    let fixture = std::fs::read(FIXTURE).unwrap();
    assert_eq!(
        decode(b"not a snapshot at all"),
        Err(SnapshotError::NotASnapshot)
    );
    assert_eq!(decode(&[]), Err(SnapshotError::NotASnapshot));
    for cut in 0..fixture.len() {
        assert!(
            decode(&fixture[..cut]).is_err(),
            "truncated at {cut} decoded"
        );
    }
    for at in 0..fixture.len() {
        for bit in [0x01, 0x80] {
            let mut damaged = fixture.clone();
            damaged[at] ^= bit;
            if let Ok((snapshot, _)) = decode(&damaged) {
                panic!("a flip at {at} decoded to {snapshot:?}");
            }
        }
    }
}

#[test]
fn a_newer_version_is_refused_by_name() {
    let mut newer = std::fs::read(FIXTURE).unwrap();
    newer[8..12].copy_from_slice(&3u32.to_le_bytes());
    assert_eq!(decode(&newer), Err(SnapshotError::Version(3)));
}

#[test]
fn an_object_whose_own_checksum_fails_is_skipped_and_counted() {
    let mut bytes = encode(&fixture_snapshot());
    let key_at = bytes.windows(8).position(|w| w == b"video:42").unwrap();
    bytes[key_at] ^= 0x20;
    // Re-seal the trailer, as a writer bug (not disk damage) would.
    let end = bytes.len() - 4;
    let crc = crc32c::crc32c(&bytes[..end]);
    bytes[end..].copy_from_slice(&crc.to_le_bytes());
    let (snapshot, skipped) = decode(&bytes).unwrap();
    assert_eq!(skipped, 1);
    assert_eq!(snapshot.objects, fixture_snapshot().objects[1..].to_vec());
}
