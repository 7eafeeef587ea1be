//! Zero-copy sends from huge pages stall (docs/io.md has the measurement), so a server whose
//! arena sits on hugetlb pages sends its lent heads and pool chunks with plain SEND from the
//! pinned bytes: counted, byte-exact. Its own test binary: it reserves huge pages, which are
//! machine-wide, and no other server of this binary may take them meanwhile.

mod common;

use common::server::Server;
use common::{pattern, HugePages};

#[test]
fn lent_bytes_on_huge_pages_go_out_with_plain_send() {
    let required = std::env::var_os("HEADROOM_REQUIRE_ROOT_TESTS").is_some();
    if !nix::unistd::geteuid().is_root() {
        assert!(!required, "root tests required but not root");
        println!("skipped: reserving huge pages needs root");
        return;
    }
    // 32 MiB of arena and one 2 MiB streaming pool: 17 pages, with room to spare.
    let Some(_pages) = HugePages::add(24) else {
        assert!(!required, "could not reserve huge pages");
        println!("skipped: could not reserve huge pages");
        return;
    };
    let server = Server::start(&[
        "--threads",
        "1",
        "--io-ring",
        "on",
        "--memory",
        "32M",
        "--io-pool",
        "2M",
        "--zero-copy-min",
        "4K",
    ]);
    let mut c = server.client();
    let backings: Vec<String> = c
        .stats("arena")
        .into_iter()
        .filter(|(n, _)| n.ends_with("_backing"))
        .map(|(_, v)| v)
        .collect();
    assert!(backings.iter().all(|b| b == "hugetlb"), "{backings:?}");
    let values: Vec<Vec<u8>> = (0..20).map(|i| pattern(i, 64 << 10)).collect();
    for (i, value) in values.iter().enumerate() {
        assert_eq!(c.set(format!("v{i}").as_bytes(), value, 0, 0).status, 0);
    }
    let big = pattern(99, (3 << 20) + 7);
    assert_eq!(c.set_streamed(0x01, b"big", &big, 0).status, 0);
    for (i, value) in values.iter().enumerate() {
        assert!(c.get(format!("v{i}").as_bytes()).value == *value);
    }
    assert!(c.get(b"big").value == big);
    let io = c.stats("io");
    let stat = |name: &str| -> u64 {
        io.iter()
            .find(|(n, _)| *n == format!("shard0_{name}"))
            .map(|(_, v)| v.parse().unwrap())
            .unwrap_or_else(|| panic!("no {name} in {io:?}"))
    };
    assert!(
        io.iter()
            .any(|(n, v)| n == "shard0_path" && v.starts_with("ring")),
        "{io:?}"
    );
    // 20 values and the large value's head copy, lent from the arena.
    assert_eq!(stat("heads_lent"), 21);
    // Those and the large value's chunks, none of them zero-copy.
    assert!(stat("lent_sends_huge_pages") >= 21, "{io:?}");
    assert_eq!(stat("ops_send_zc"), 0, "{io:?}");
    assert_eq!(stat("op_errors"), 0);
    assert_eq!(server.stop().code(), Some(0));
}
