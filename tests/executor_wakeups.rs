//! The sleep/wake protocol between glommio executors, as Headroom's vendored glommio has it
//! (`third_party/glommio/PATCHES.md`, 1: a `SeqCst` fence on each side of the sleep flag
//! instead of a membarrier before sleeping). A lost wake-up would leave a message unreceived
//! by a sleeping executor: here two executors ping-pong over shared channels with seeded
//! pauses of 0 to 200 µs on each side, so the receiver is caught at every point between
//! deciding to sleep and sleeping, and the whole exchange must finish well inside its limit.

mod common;

use std::time::{Duration, Instant};

use common::Rng;
use glommio::channels::shared_channel;
use glommio::LocalExecutorBuilder;

/// The pauses one side takes, reproducible from the seed.
fn pauses(seed: u64, n: usize) -> Vec<Duration> {
    let mut rng = Rng::new(seed);
    (0..n)
        .map(|_| {
            // One exchange in four without a pause (back to back), the others 1-200 µs.
            if rng.chance(25) {
                Duration::ZERO
            } else {
                Duration::from_micros(rng.between(1, 200))
            }
        })
        .collect()
}

fn spin_or_sleep(pause: Duration) {
    // Short pauses spin (the peer stays awake through them), longer ones sleep (the peer
    // parks): both orders of "flag set" and "message pushed" happen.
    if pause < Duration::from_micros(20) {
        let until = Instant::now() + pause;
        while Instant::now() < until {
            std::hint::spin_loop();
        }
    } else {
        std::thread::sleep(pause);
    }
}

#[test]
fn no_wakeup_is_lost_between_sleeping_executors() {
    common::for_each_seed("executor_wakeups", 1, exchange);
}

fn exchange(seed: u64) {
    const ROUNDS: usize = 20_000;
    let (to_b, from_a) = shared_channel::new_bounded::<u64>(1);
    let (to_a, from_b) = shared_channel::new_bounded::<u64>(1);
    let (pauses_a, pauses_b) = (pauses(seed, ROUNDS), pauses(seed ^ 0x9e37_79b9, ROUNDS));
    let started = Instant::now();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let done_b = done_tx.clone();
    let a = LocalExecutorBuilder::default()
        .name("wake-a")
        .spawn(move || async move {
            let (tx, rx) = (to_b.connect().await, from_b.connect().await);
            for (i, pause) in pauses_a.into_iter().enumerate() {
                spin_or_sleep(pause);
                tx.send(i as u64).await.unwrap();
                assert_eq!(rx.recv().await, Some(i as u64));
            }
            done_tx.send(()).unwrap();
        })
        .unwrap();
    let b = LocalExecutorBuilder::default()
        .name("wake-b")
        .spawn(move || async move {
            let (rx, tx) = (from_a.connect().await, to_a.connect().await);
            for (i, pause) in pauses_b.into_iter().enumerate() {
                assert_eq!(rx.recv().await, Some(i as u64));
                spin_or_sleep(pause);
                tx.send(i as u64).await.unwrap();
            }
            done_b.send(()).unwrap();
        })
        .unwrap();
    // A lost wake-up hangs the exchange (nothing else would wake the sleeper): a limit far
    // above its normal time (seconds) tells the two apart.
    let limit = Duration::from_secs(120);
    for _ in 0..2 {
        let left = limit.saturating_sub(started.elapsed());
        if done_rx.recv_timeout(left).is_err() {
            panic!("seed {seed}: the exchange hung past {limit:?}: a wake-up was lost");
        }
    }
    a.join().unwrap();
    b.join().unwrap();
    let took = started.elapsed();
    eprintln!("{ROUNDS} exchanges in {took:?}");
}
