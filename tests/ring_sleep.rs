//! A shard that sleeps in its own ring (glommio patch 9, `--ring-sleep on`) must still wake for
//! everything that wakes it when it sleeps in glommio's ring, and the other way round. Seeded
//! rounds each wait for one source: a receive on the shard's ring, a glommio timer (glommio's
//! latency ring), an eventfd read through glommio's main ring that another thread completes
//! (the doorbell: how the control plane wakes a shard), or a message on a shared channel from
//! another executor. Each source acts at once (before the wait) or after 1-300 µs (while the
//! executor goes to sleep or sleeps). A lost wake-up hangs a round: a limit far above the
//! run's normal time tells it from a slow run. A third test spins before parking for longer
//! than that limit, so every source must be seen while the executor spins.

mod common;

use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::Rng;
use glommio::channels::shared_channel;
use glommio::LocalExecutorBuilder;
use headroom::ring::{Doorbell, FixedBuffers, Ring};

#[test]
fn a_shard_sleeping_in_its_ring_wakes_for_every_source() {
    common::for_each_seed("ring_sleep", 1, |seed| rounds(seed, true, None, 10_000));
}

#[test]
fn a_shard_sleeping_in_glommios_ring_wakes_for_every_source() {
    common::for_each_seed("ring_sleep_eventfd", 1, |seed| {
        rounds(seed, false, None, 10_000)
    });
}

/// An executor that spins before it parks (`--spin-before-park`) must see its ring's
/// completions while it spins: with a spin far longer than the run's limit, a receive seen
/// only at the park would hang the rounds.
#[test]
fn a_shard_spinning_before_it_sleeps_in_its_ring_sees_every_source() {
    common::for_each_seed("ring_sleep_spin", 1, |seed| {
        rounds(seed, true, Some(Duration::from_secs(600)), 500)
    });
}

#[derive(Clone, Copy, Debug)]
enum Source {
    Receive,
    Timer,
    Doorbell,
    Channel,
}

/// What the helper thread does for a round, after its delay.
enum Act {
    Write(u8, Duration),
    Ring(Duration),
}

fn rounds(seed: u64, sleep_here: bool, spin: Option<Duration>, rounds: usize) {
    let limit = Duration::from_secs(
        std::env::var("RING_SLEEP_LIMIT_S")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(120),
    );
    let mut rng = Rng::new(seed);
    let plan: Vec<(Source, Duration)> = (0..rounds)
        .map(|_| {
            let source = match rng.between(0, 3) {
                0 => Source::Receive,
                1 => Source::Timer,
                2 => Source::Doorbell,
                _ => Source::Channel,
            };
            let delay = if rng.chance(25) {
                Duration::ZERO
            } else {
                Duration::from_micros(rng.between(1, 300))
            };
            (source, delay)
        })
        .collect();

    let (shard_socket, mut peer) = UnixStream::pair().unwrap();
    let doorbell = Arc::new(Doorbell::new().unwrap());
    let (act_tx, act_rx) = mpsc::channel::<Act>();
    let bell = Arc::clone(&doorbell);
    let helper = std::thread::spawn(move || {
        for act in act_rx {
            match act {
                Act::Write(byte, delay) => {
                    common::spin_or_sleep(delay);
                    peer.write_all(&[byte]).unwrap();
                }
                Act::Ring(delay) => {
                    common::spin_or_sleep(delay);
                    bell.ring();
                }
            }
        }
    });

    // Another executor sends on a shared channel when told to (it blocks on the order: it
    // has nothing else to do).
    let (to_shard, from_sender) = shared_channel::new_bounded::<u64>(1);
    let (send_tx, send_rx) = mpsc::channel::<(u64, Duration)>();
    let sender = LocalExecutorBuilder::default()
        .name("ring-sleep-sender")
        .spawn(move || async move {
            let tx = to_shard.connect().await;
            for (i, delay) in send_rx {
                common::spin_or_sleep(delay);
                tx.send(i).await.unwrap();
            }
        })
        .unwrap();

    // The round the shard is in, for the report of a hang.
    let progress = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let at_round = Arc::clone(&progress);
    let plan_seen = plan.clone();
    let started = Instant::now();
    let (done_tx, done_rx) = mpsc::channel::<Result<(), String>>();
    let mut builder = LocalExecutorBuilder::default().name("ring-sleep-shard");
    if let Some(spin) = spin {
        // glommio spins only on an executor bound to a CPU.
        builder = LocalExecutorBuilder::new(glommio::Placement::Fixed(0))
            .name("ring-sleep-shard")
            .spin_before_park(spin);
    }
    let shard = builder
        .spawn(move || async move {
            let buffers = FixedBuffers::cut(&[], 4096).expect("no buffers");
            let ring = match Ring::new(buffers, Vec::new(), 8) {
                Ok(ring) => ring,
                Err(reason) => {
                    println!("skipped: no ring here ({reason})");
                    drop(act_tx);
                    drop(send_tx);
                    let _ = done_tx.send(Ok(()));
                    return;
                }
            };
            ring.spawn_driver(sleep_here);
            let rx = from_sender.connect().await;
            let fd = shard_socket.as_raw_fd();
            for (i, &(source, delay)) in plan.iter().enumerate() {
                at_round.store(i, std::sync::atomic::Ordering::Relaxed);
                match source {
                    Source::Receive => {
                        act_tx.send(Act::Write(i as u8, delay)).unwrap();
                        let (n, buf) = ring.recv(fd, vec![0; 16], 0).await;
                        assert_eq!(n.unwrap(), 1, "round {i}");
                        assert_eq!(buf[0], i as u8, "round {i}");
                    }
                    Source::Timer => {
                        let at = Instant::now();
                        glommio::timer::sleep(delay).await;
                        assert!(at.elapsed() >= delay, "round {i}: the timer fired early");
                    }
                    Source::Doorbell => {
                        act_tx.send(Act::Ring(delay)).unwrap();
                        doorbell.wait().await.unwrap();
                    }
                    Source::Channel => {
                        send_tx.send((i as u64, delay)).unwrap();
                        assert_eq!(rx.recv().await, Some(i as u64), "round {i}");
                    }
                }
            }
            drop(act_tx);
            drop(send_tx);
            ring.drain().await;
            ring.stop();
            let _ = done_tx.send(Ok(()));
        })
        .unwrap();

    // Rounds take microseconds to a third of a millisecond: a lost wake-up shows as this.

    match done_rx.recv_timeout(limit) {
        Ok(result) => result.unwrap(),
        Err(_) => {
            let round = progress.load(std::sync::atomic::Ordering::Relaxed);
            panic!(
                "seed {seed} (sleep_here {sleep_here}): round {round} ({:?}) hung past \
                 {limit:?}: a wake-up was lost",
                plan_seen[round]
            )
        }
    }
    shard.join().unwrap();
    sender.join().unwrap();
    helper.join().unwrap();
    eprintln!(
        "{rounds} rounds (sleep_here {sleep_here}, spin {spin:?}) in {:?}",
        started.elapsed()
    );
}
