//! The multishot receive (`ring::multishot`) against real sockets and a real ring: every byte a
//! peer sends arrives once and in order, whatever the reader does between reads (reads of any
//! size at any offset, stalls that make arrivals spill and the receive pause, a pause to read
//! the socket directly), the end of the stream reads as 0, and a shard that runs out of
//! provided buffers re-arms without losing a byte. Seeded; the seed is printed.

mod common;

use std::cell::RefCell;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::rc::Rc;
use std::time::Duration;

use common::{for_each_seed, pattern, Rng};
use headroom::buffer_cache::{BufferCache, BufferKind};
use headroom::ring::multishot::{Inbox, SPILL_HIGH_BYTES, SPILL_OVERSHOOT_MAX_BYTES};
use headroom::ring::{FixedBuffers, Ring};

/// The read buffers an idle reader's arrival takes (small, so they fill often).
fn read_buffers() -> Rc<BufferCache> {
    Rc::new(BufferCache::new(BufferKind::Read { bytes: 3000 }, 3000, 4))
}

/// A ring with provided buffers, or `None` (said) where the kernel has none.
fn multishot_ring(connections: usize) -> Option<Rc<Ring>> {
    let buffers = FixedBuffers::cut(&[], 4096).expect("no buffers");
    let ring = match Ring::new(buffers, Vec::new(), connections) {
        Ok(ring) => ring,
        Err(reason) => {
            println!("skipped: no ring here ({reason})");
            return None;
        }
    };
    if let Err(reason) = ring.provide_receive_buffers() {
        println!("skipped: no provided-buffer rings here ({reason})");
        return None;
    }
    // The executor sleeps in the ring unless HEADROOM_TEST_RING_SLEEP=off (scripts/test).
    ring.spawn_driver(std::env::var("HEADROOM_TEST_RING_SLEEP").map_or(true, |v| v != "off"));
    Some(ring)
}

fn on_executor(
    body: impl FnOnce() -> std::pin::Pin<Box<dyn std::future::Future<Output = ()>>> + Send + 'static,
) {
    glommio::LocalExecutorBuilder::default()
        .spawn(body)
        .unwrap()
        .join()
        .unwrap();
}

/// Writes `bytes` to `peer` in seeded pieces with short pauses, then closes it.
fn write_slowly(mut peer: UnixStream, bytes: Vec<u8>, seed: u64) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut rng = Rng::new(seed);
        let mut at = 0;
        while at < bytes.len() {
            let n = (rng.between(1, 40_000) as usize).min(bytes.len() - at);
            peer.write_all(&bytes[at..at + n])
                .expect("the reader keeps its socket");
            at += n;
            if rng.chance(20) {
                std::thread::sleep(Duration::from_micros(rng.below(2_000)));
            }
        }
    })
}

/// Reads `fd`'s multishot receive through `buf` into `got` until the end of the stream.
async fn read_to_end(
    ring: &Rc<Ring>,
    fd: std::os::fd::RawFd,
    inbox: &Rc<Inbox>,
    buf: &mut Vec<u8>,
    got: &mut Vec<u8>,
) {
    loop {
        let n = ring.recv_multishot(fd, inbox, buf, 0).await.unwrap();
        if n == 0 {
            return;
        }
        got.extend_from_slice(&buf[..n]);
    }
}

/// Readers that read in seeded sizes at seeded offsets, stall, and now and then pause the
/// receive to read the socket themselves, see exactly what their peers wrote, then the end.
#[test]
fn every_byte_arrives_once_and_in_order_whatever_the_reader_does() {
    for_each_seed("multishot_model", 4, |seed| {
        on_executor(move || {
            Box::pin(async move {
                let Some(ring) = multishot_ring(64) else {
                    return;
                };
                let mut rng = Rng::new(seed);
                let mut readers = Vec::new();
                let mut writers = Vec::new();
                let cache = read_buffers();
                for c in 0..6u64 {
                    let (mine, peer) = UnixStream::pair().unwrap();
                    let len = rng.below(1_500_000) as usize;
                    let expected = pattern(seed ^ c, len);
                    writers.push(write_slowly(peer, expected.clone(), seed.wrapping_add(c)));
                    let inbox = Rc::new(Inbox::new(c % 2 == 0, Rc::clone(&cache)));
                    let ring = Rc::clone(&ring);
                    let cache = Rc::clone(&cache);
                    let mut rng = Rng::new(seed.wrapping_mul(31).wrapping_add(c));
                    readers.push(glommio::spawn_local(async move {
                        let mut mine = mine;
                        let fd = mine.as_raw_fd();
                        let mut got = Vec::with_capacity(len);
                        loop {
                            if rng.chance(10) {
                                // A reader busy elsewhere: arrivals spill, and pause past the
                                // bound.
                                glommio::timer::sleep(Duration::from_micros(rng.below(3_000)))
                                    .await;
                            }
                            if rng.chance(3) {
                                // Read the socket itself, after what was spilled.
                                ring.pause_receive(&inbox).await;
                                assert!(!inbox.armed());
                                let mut piece = vec![0; rng.between(1, 10_000) as usize];
                                let n = match inbox.take_spilled(&mut piece) {
                                    0 if inbox.ended().is_some() => 0,
                                    0 => mine.read(&mut piece).unwrap(),
                                    n => n,
                                };
                                if n == 0 {
                                    break;
                                }
                                got.extend_from_slice(&piece[..n]);
                                continue;
                            }
                            if rng.chance(3) {
                                // An idle reader: it lends no buffer, and the arrival takes
                                // one of the cache's, given back once read.
                                let mut buf = Vec::new();
                                let n = ring.recv_multishot(fd, &inbox, &mut buf, 0).await.unwrap();
                                if n == 0 {
                                    assert!(buf.is_empty(), "the end takes no buffer");
                                    break;
                                }
                                assert_eq!(buf.len(), 3000, "a buffer of the cache's");
                                got.extend_from_slice(&buf[..n]);
                                cache.give(buf);
                                continue;
                            }
                            let size = rng.between(1, 20_000) as usize;
                            let at = rng.below(64) as usize;
                            let mut buf = vec![0xA5; at + size];
                            let n = ring.recv_multishot(fd, &inbox, &mut buf, at).await.unwrap();
                            assert_eq!(buf.len(), at + size, "the buffer comes back whole");
                            assert!(buf[..at].iter().all(|&b| b == 0xA5), "nothing before `at`");
                            assert!(n <= size);
                            assert!(
                                inbox.spilled_bytes()
                                    <= SPILL_HIGH_BYTES + SPILL_OVERSHOOT_MAX_BYTES,
                                "the spill stays near its bound: {}",
                                inbox.spilled_bytes()
                            );
                            if n == 0 {
                                break;
                            }
                            got.extend_from_slice(&buf[at..at + n]);
                        }
                        assert_eq!(got.len(), len, "connection {c}: every byte, no more");
                        assert!(got == expected, "connection {c}: the bytes in order");
                        // The end stays the end.
                        let mut buf = vec![0; 16];
                        let n = ring.recv_multishot(fd, &inbox, &mut buf, 0).await.unwrap();
                        assert_eq!(n, 0);
                        assert!(!inbox.armed(), "an ended receive is not armed again");
                    }));
                }
                for reader in readers {
                    reader.await;
                }
                for writer in writers {
                    writer.join().unwrap();
                }
                let stats = ring.stats();
                assert_eq!(stats.errors, 0, "{stats:?}");
                assert_eq!(stats.in_flight, 0, "every receive ended: {stats:?}");
                println!(
                    "seed {seed}: {} receives armed, {} paused, {} out of buffers",
                    stats.receives_armed, stats.receives_paused, stats.receives_out_of_buffers
                );
                ring.stop();
                ring.drain().await;
            })
        });
    });
}

/// A reader that stops reading has its receive paused once the spill passes the bound, and
/// the rest waits in the socket: nothing is lost, and memory stays bounded.
#[test]
fn a_reader_that_stops_reading_pauses_its_receive() {
    on_executor(|| {
        Box::pin(async move {
            let Some(ring) = multishot_ring(8) else {
                return;
            };
            let (mut mine, peer) = UnixStream::pair().unwrap();
            let expected = pattern(7, 4 << 20);
            let writer = write_slowly(peer, expected.clone(), 7);
            let inbox = Rc::new(Inbox::new(false, read_buffers()));
            let fd = mine.as_raw_fd();
            let mut got = Vec::new();
            let mut buf = vec![0; 100];
            let n = ring.recv_multishot(fd, &inbox, &mut buf, 0).await.unwrap();
            got.extend_from_slice(&buf[..n]);
            // Not reading: the writer fills the spill, then the socket.
            let mut waited = 0;
            while ring.stats().receives_paused == 0 && waited < 5_000 {
                glommio::timer::sleep(Duration::from_millis(1)).await;
                waited += 1;
            }
            assert_eq!(ring.stats().receives_paused, 1, "{:?}", ring.stats());
            glommio::timer::sleep(Duration::from_millis(50)).await;
            assert!(!inbox.armed(), "paused");
            let spilled = inbox.spilled_bytes();
            assert!(
                (SPILL_HIGH_BYTES..=SPILL_HIGH_BYTES + SPILL_OVERSHOOT_MAX_BYTES)
                    .contains(&spilled),
                "{spilled} bytes spilled"
            );
            read_to_end(&ring, fd, &inbox, &mut buf, &mut got).await;
            writer.join().unwrap();
            assert!(
                got == expected,
                "{} of {} bytes, in order",
                got.len(),
                expected.len()
            );
            assert!(
                ring.stats().receives_armed >= 2,
                "armed again after the pause"
            );
            // Reading the socket directly after the end: nothing.
            assert_eq!(mine.read(&mut buf).unwrap(), 0);
            ring.stop();
            ring.drain().await;
        })
    });
}

/// More arrivals between two reaps than provided buffers: receives end with `ENOBUFS` and are
/// armed again at their next read, and every connection still gets its bytes.
#[test]
fn receives_that_run_out_of_buffers_are_armed_again() {
    on_executor(|| {
        Box::pin(async move {
            let connections = 300;
            let Some(ring) = multishot_ring(connections) else {
                return;
            };
            let per_connection = 32 << 10;
            let done = Rc::new(RefCell::new(0));
            let mut readers = Vec::new();
            for c in 0..connections {
                let (mine, mut peer) = UnixStream::pair().unwrap();
                let expected = pattern(c as u64, per_connection);
                // Already waiting when the receive is armed: each takes four buffers at once.
                peer.write_all(&expected).unwrap();
                drop(peer);
                let (ring, done) = (Rc::clone(&ring), Rc::clone(&done));
                readers.push(glommio::spawn_local(async move {
                    let inbox = Rc::new(Inbox::new(c % 2 == 1, read_buffers()));
                    let mut got = Vec::new();
                    let mut buf = vec![0; 1000];
                    read_to_end(&ring, mine.as_raw_fd(), &inbox, &mut buf, &mut got).await;
                    assert!(got == expected, "connection {c}");
                    *done.borrow_mut() += 1;
                }));
            }
            for reader in readers {
                reader.await;
            }
            assert_eq!(*done.borrow(), connections);
            let stats = ring.stats();
            assert!(stats.receives_out_of_buffers > 0, "{stats:?}");
            assert_eq!(stats.errors, 0, "{stats:?}");
            assert_eq!(stats.in_flight, 0, "{stats:?}");
            ring.stop();
            ring.drain().await;
        })
    });
}
