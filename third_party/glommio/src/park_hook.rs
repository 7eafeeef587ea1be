// Headroom patch (PATCHES.md, 4): an executor may sleep in the application's own io_uring ring
// instead of its main ring.

//! Lets an application that drives its own io_uring ring on an executor's thread make that
//! ring the place where the executor sleeps.
//!
//! Without it, such an application must wake the executor through an eventfd its ring signals
//! and that the executor's main ring reads: every completion that arrives while the executor
//! sleeps then costs an eventfd write, a completion on the main ring, a task to read it and a
//! read re-armed, on top of the application's own `io_uring_enter` to reap. With a hook the
//! executor calls [`ParkHook::poll`] once per pass and, when it has nothing to run,
//! [`ParkHook::park`] instead of waiting in its main ring; the hook waits in its own ring with
//! a read armed on an eventfd that the executor's rings signal for every completion, so the
//! executor's timers, I/O and remote wake-ups still wake it. (An eventfd, not a poll on the
//! rings' own descriptors: such a poll holds the ring's file, so a ring torn down at exit
//! kept the executor's rings, and the sockets their operations hold, alive a while longer.)

use std::{io, os::unix::io::RawFd, rc::Rc};

/// An application's ring that the executor polls every pass and sleeps in.
pub trait ParkHook {
    /// Takes the application ring's completions without blocking and wakes their tasks.
    /// `submit` says the executor is about to run tasks (not to sleep): entries the
    /// application queued should go to the kernel now. Returns how many tasks it woke.
    fn poll(&self, submit: bool) -> usize;

    /// Sleeps until the application's ring has a completion or `wake_fd` (an eventfd the
    /// executor's rings signal for every completion they post) becomes readable, then takes
    /// the completions as [`ParkHook::poll`] does. Entries still queued are submitted in the
    /// same call. The hook should keep a read of the eventfd armed (reading resets it). It may
    /// return early (a signal); the executor then simply runs another pass.
    fn park(&self, wake_fd: RawFd) -> usize;
}

/// Installs `hook` on the current executor, or removes it with `None`; the executor sleeps in
/// its own main ring again from its next pass. Fails (and installs nothing) when the eventfd
/// cannot be made or registered with the executor's rings.
///
/// # Panics
///
/// Outside an executor.
pub fn set_park_hook(hook: Option<Rc<dyn ParkHook>>) -> io::Result<()> {
    crate::executor().reactor().sys.set_park_hook(hook)
}
