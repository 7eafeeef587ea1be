//! Promotion through the real server on this one-node machine: GETs score fixed heads (ADMIN
//! `where` shows the score, the rank and the node `move_pages` reports), the bytes read are
//! counted as local, and a pass has nothing to exchange with a single fixed-head region. The
//! multi-node behaviour is tested in the VM (`tests/numa_vm.rs`).

mod common;

use common::pattern;
use common::server::{Client, Server};

/// An admin command as (status, text): 0 for `OK`, 4 for `ERROR`.
fn admin(server: &Server, command: &str) -> (u16, String) {
    match server.admin(command) {
        Ok(text) => (0, text),
        Err(reason) => (4, reason),
    }
}

fn arena_stat(c: &mut Client, name: &str) -> u64 {
    c.stats("arena")
        .into_iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.parse().unwrap())
        .unwrap_or_else(|| panic!("no {name} in STAT arena"))
}

#[test]
fn reads_score_heads_and_one_node_has_nothing_to_promote() {
    // Shards that poll before sleeping serve the same (and say so in STAT settings).
    // A half-life of an hour: scores halve at period boundaries, and one falling between the
    // five reads below (every 10 s by default) made the score 4 once in CI.
    let server = Server::start(&[
        "--threads",
        "2",
        "--promotion-interval",
        "50",
        "--spin-before-park",
        "30",
        "--promotion-half-life",
        "3600",
    ]);
    let mut c = server.client();
    let settings = c.stats("settings");
    assert!(settings
        .iter()
        .any(|(n, v)| n == "spin_before_park_us" && v == "30"));
    assert!(settings
        .iter()
        .any(|(n, v)| n == "promotion_interval_ms" && v == "50"));
    let value = pattern(3, 256 << 10);
    assert_eq!(c.set(b"hot", &value, 0, 0).status, 0);
    assert_eq!(c.set(b"small", b"tiny", 0, 0).status, 0);
    let (status, before) = admin(&server, "where hot");
    assert_eq!(status, 0, "{before}");
    assert!(before.contains("rank 0 node 0 score 0"), "{before}");
    for _ in 0..5 {
        assert!(c.get(b"hot").value == value);
    }
    let (_, after) = admin(&server, "where hot");
    assert!(after.ends_with("score 5"), "{after}");
    assert!(arena_stat(&mut c, "head_bytes_read_local") >= 5 * (256 << 10));
    assert_eq!(arena_stat(&mut c, "head_bytes_read_foreign"), 0);
    let (status, text) = admin(&server, "promote");
    assert_eq!(status, 0);
    assert_eq!(
        text,
        "promoted: 0 block exchanges, 0 bytes moved, 0 blocks skipped for pins"
    );
    // The periodic pass ran too, and had nothing to do either.
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert_eq!(arena_stat(&mut c, "promotion_exchanges"), 0);
    assert_eq!(
        arena_stat(&mut c, "promotion_passes"),
        0,
        "one region: no pass at all"
    );
    // where explains what it cannot locate.
    let (status, text) = admin(&server, "where small");
    assert_eq!(status, 0x0004);
    assert!(text.contains("packed"), "{text}");
    let (status, text) = admin(&server, "where nothing");
    assert_eq!((status, text.as_str()), (0x0004, "no such key"));
    assert!(c.get(b"hot").value == value);
    assert_eq!(server.stop().code(), Some(0));
}
