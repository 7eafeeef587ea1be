//! Every core's connections hammer one small key set at once (zero-hop serving: any shard runs
//! any key under its partition's lock): SET, GET, DELETE, CAS, INCR and APPEND from eight
//! connections spread over both shards, with values from a few bytes to 200 KiB (those are lent
//! zero-copy, pinned while they are sent), overwrites that leave dead bytes for compaction, keys
//! that expire, and then more data than the arena holds, so eviction runs under the readers.
//! Every GET hit is byte-exact (values describe themselves), each CAS race has exactly one
//! winner, INCR and APPEND lose nothing, and the small requests send no cross-core message.
//! The workload is `tests/common/stress.rs`; the NUMA VM runs it on a two-node plan while
//! promotion exchanges blocks (`tests/numa_vm.rs`).

mod common;

use common::server::{Client, Server};
use common::stress::{check, expire_then_evict, hammer, stat, value, CheckingReaders, Hammer};

#[test]
fn every_core_hammers_one_key_set() {
    let seed = common::seeds("partition_stress", 1)[0];
    // 16 MiB: the contest keys are never evicted while they race; the pressure phase below
    // overflows it.
    let server = Server::start(&[
        "--threads",
        "2",
        "--memory",
        "16M",
        "--promotion-interval",
        "20",
    ]);
    let size = Hammer {
        clients: 8,
        keys: 24,
        ops_per_client: 2500,
        large_value_bytes: 200 << 10,
    };
    hammer(&server, seed, size);
    // About 150 MiB of values into 16 MiB: the CLOCK hands evict.
    expire_then_evict(&server, 1500, 200 << 10);
}

/// Compaction under the same kind of load: overwrites from connections on both shards fill a
/// two-block arena with dead bytes many times over while readers check every hit; the live
/// data is small, so admission compacts and nothing is evicted.
#[test]
fn compaction_under_every_core() {
    let server = Server::start(&["--threads", "2", "--memory", "4M"]);
    let readers = CheckingReaders::start(server.addr, 2, |r, i| format!("c{}", (i * 5 + r) % 50));
    let writers: Vec<_> = (0..4)
        .map(|w| {
            let addr = server.addr;
            std::thread::spawn(move || {
                let mut c = Client::connect(addr);
                for n in 0..2500 {
                    // Every tenth write makes a key that stays: live objects spread through
                    // every block, so dead ones must be compacted away, not whole blocks freed.
                    let k = if n % 10 == 0 {
                        format!("s{w}-{n}")
                    } else {
                        format!("c{}", (n * 7 + w) % 50)
                    };
                    let len = 64 + (n * 131 + w * 17) % 3000;
                    let r = c.set(k.as_bytes(), &value(&k, w, n, len), 0, 0);
                    assert_eq!(r.status, 0, "SET {k}");
                }
            })
        })
        .collect();
    for writer in writers {
        writer.join().expect("a writer failed");
    }
    readers.stop();
    let mut c = server.client();
    assert!(stat(&mut c, "compactions") > 0, "nothing was compacted");
    assert_eq!(stat(&mut c, "evictions"), 0, "small live data was evicted");
    let stable = (0..4).flat_map(|w| (0..2500).step_by(10).map(move |n| format!("s{w}-{n}")));
    for k in (0..50).map(|k| format!("c{k}")).chain(stable) {
        let got = c.get(k.as_bytes());
        assert_eq!(got.status, 0, "{k} lost");
        check(&k, &got.value);
    }
}
