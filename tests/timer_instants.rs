//! glommio's `TimerActionOnce::do_at` keeps the instant it is given (patch 11 of
//! `third_party/glommio/PATCHES.md`), shown without a loaded machine.
//!
//! Upstream turned the instant into a duration from one clock read and back into an instant
//! from a second read, so a thread that lost its CPU between the two set a deadline later by
//! the time it lost. Here the loss is made on purpose: this test binary defines
//! `clock_gettime` itself (the executable's definition wins over libc's for every caller in
//! the process, `std::time::Instant` included), and while a thread has asked for it, every
//! monotonic reading on that thread moves the process's clock 5 ms ahead first, as if the
//! thread had been preempted for 5 ms just before it.

use std::cell::Cell;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

use glommio::timer::TimerActionOnce;
use glommio::LocalExecutorBuilder;

/// How far every monotonic reading is moved ahead, nanoseconds; only grows.
static MONOTONIC_AHEAD_NS: AtomicI64 = AtomicI64::new(0);
/// What each monotonic reading costs while a thread is "preempted".
const LOST_PER_READING_NS: i64 = 5_000_000;

thread_local! {
    /// Whether this thread's monotonic readings each lose [`LOST_PER_READING_NS`] first.
    static PREEMPTED: Cell<bool> = const { Cell::new(false) };
}

/// The process's `clock_gettime`: the kernel's reading, and for `CLOCK_MONOTONIC` plus how far
/// this test has moved it.
///
/// # Safety
/// As libc's: `reading` points to a `timespec` the caller owns.
#[no_mangle]
pub unsafe extern "C" fn clock_gettime(
    clock: libc::clockid_t,
    reading: *mut libc::timespec,
) -> i32 {
    // SAFETY: the caller's arguments are passed to the system call unchanged, as libc's own
    // `clock_gettime` would pass them.
    let status = unsafe { libc::syscall(libc::SYS_clock_gettime, clock, reading) } as i32;
    if status != 0 || clock != libc::CLOCK_MONOTONIC {
        return status;
    }
    if PREEMPTED.with(Cell::get) {
        MONOTONIC_AHEAD_NS.fetch_add(LOST_PER_READING_NS, Ordering::SeqCst);
    }
    let ahead_ns = MONOTONIC_AHEAD_NS.load(Ordering::SeqCst);
    // SAFETY: the system call has just filled `reading`, which the caller owns.
    let reading = unsafe { &mut *reading };
    let total_ns = reading.tv_nsec + ahead_ns % 1_000_000_000;
    reading.tv_sec += ahead_ns / 1_000_000_000 + total_ns / 1_000_000_000;
    reading.tv_nsec = total_ns % 1_000_000_000;
    0
}

/// The interposed clock is the one `Instant` reads, and it moves only while asked to. (One
/// test in this binary: the clock is the process's, so a second test would move it too.)
fn assert_the_clock_moves_only_while_a_thread_is_preempted() {
    let before = Instant::now();
    PREEMPTED.with(|p| p.set(true));
    let during = Instant::now();
    PREEMPTED.with(|p| p.set(false));
    assert!(
        during - before >= Duration::from_nanos(LOST_PER_READING_NS as u64),
        "the interposed clock_gettime is not the one Instant calls"
    );
    let (a, b) = (Instant::now(), Instant::now());
    assert!(
        b - a < Duration::from_millis(1),
        "the clock kept moving: {:?}",
        b - a
    );
}

/// Action `a` is due 1 ms before action `b`, and `do_at` for `a` is made while the thread
/// loses 5 ms at each clock reading; action `c`, made for later, is rearmed for 0.5 ms before
/// `a` the same way. Each keeps its instant, so they run c, a, b. Upstream's `do_at` and
/// `rearm_at` read the clock twice, and the deadline moved 5 ms or more, behind `b`'s.
#[test]
fn do_at_keeps_its_instant_when_the_thread_loses_time_inside_it() {
    assert_the_clock_moves_only_while_a_thread_is_preempted();
    let order = LocalExecutorBuilder::default()
        .name("timer-instants")
        .spawn(|| async {
            let ran = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
            let base = Instant::now() + Duration::from_millis(200);
            let record = |name: &'static str| {
                let ran = ran.clone();
                async move { ran.borrow_mut().push(name) }
            };
            PREEMPTED.with(|p| p.set(true));
            let a = TimerActionOnce::do_at(base + Duration::from_millis(1), record("a"));
            PREEMPTED.with(|p| p.set(false));
            let b = TimerActionOnce::do_at(base + Duration::from_millis(2), record("b"));
            // Rearmed for an instant before both, while the thread loses time again.
            let c = TimerActionOnce::do_at(base + Duration::from_millis(10), record("c"));
            PREEMPTED.with(|p| p.set(true));
            c.rearm_at(base + Duration::from_micros(500));
            PREEMPTED.with(|p| p.set(false));
            c.join().await;
            a.join().await;
            b.join().await;
            let order = ran.borrow().clone();
            order
        })
        .unwrap()
        .join()
        .unwrap();
    assert_eq!(
        order,
        ["c", "a", "b"],
        "the actions ran out of their instants' order: do_at or rearm_at moved a deadline"
    );
}
