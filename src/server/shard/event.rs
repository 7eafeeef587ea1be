//! A one-shot, single-thread event: tasks wait on it; `fire` wakes them all, for good.
//! Used for shutdown, so idle connections stop waiting on their sockets at once.

use std::cell::{Cell, RefCell};
use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::future::Future;
use std::hash::{BuildHasherDefault, Hasher};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

#[derive(Clone, Default)]
pub struct LocalEvent(Rc<Inner>);

#[derive(Default)]
struct Inner {
    fired: Cell<bool>,
    next_id: Cell<u64>,
    /// Registered waiters; a waiter removes itself when dropped, so nothing accumulates.
    waiters: RefCell<HashMap<u64, Waker, BuildHasherDefault<IdHasher>>>,
}

/// Hashes a waiter's id (unique, sequential) with one multiplication: every socket operation
/// of a connection waits on the stop event, so SipHash was a visible cost per request.
#[derive(Default)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, _: &[u8]) {
        unreachable!("waiter ids hash as u64");
    }

    fn write_u64(&mut self, id: u64) {
        // Fibonacci hashing: spreads sequential ids over the high bits hashbrown probes with.
        self.0 = id.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

impl LocalEvent {
    pub fn new() -> LocalEvent {
        LocalEvent::default()
    }

    pub fn fire(&self) {
        self.0.fired.set(true);
        let waiters: Vec<Waker> = self
            .0
            .waiters
            .borrow_mut()
            .drain()
            .map(|(_, w)| w)
            .collect();
        for waker in waiters {
            waker.wake();
        }
    }

    pub fn fired(&self) -> bool {
        self.0.fired.get()
    }

    /// Resolves once the event has fired.
    pub fn wait(&self) -> Wait {
        let id = self.0.next_id.get();
        self.0.next_id.set(id + 1);
        Wait {
            event: self.clone(),
            id,
            registered: false,
        }
    }

    #[cfg(test)]
    fn waiting(&self) -> usize {
        self.0.waiters.borrow().len()
    }
}

pub struct Wait {
    event: LocalEvent,
    id: u64,
    /// Whether a waker is registered (only then does dropping touch the map).
    registered: bool,
}

impl Future for Wait {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        let inner = &this.event.0;
        if inner.fired.get() {
            return Poll::Ready(());
        }
        match inner.waiters.borrow_mut().entry(this.id) {
            Entry::Occupied(known) if known.get().will_wake(cx.waker()) => {}
            Entry::Occupied(mut known) => {
                known.insert(cx.waker().clone());
            }
            Entry::Vacant(new) => {
                new.insert(cx.waker().clone());
            }
        }
        this.registered = true;
        Poll::Pending
    }
}

impl Drop for Wait {
    fn drop(&mut self) {
        if self.registered {
            self.event.0.waiters.borrow_mut().remove(&self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waiters_leave_no_trace_and_fire_wakes_all() {
        let event = LocalEvent::new();
        let waker = Waker::noop();
        let mut cx = Context::from_waker(waker);
        {
            let mut wait = Box::pin(event.wait());
            assert!(wait.as_mut().poll(&mut cx).is_pending());
            assert_eq!(event.waiting(), 1);
        }
        assert_eq!(event.waiting(), 0, "a dropped waiter must deregister");
        let mut wait = Box::pin(event.wait());
        assert!(wait.as_mut().poll(&mut cx).is_pending());
        event.fire();
        assert!(wait.as_mut().poll(&mut cx).is_ready());
        assert!(event.fired());
    }
}
