//! A one-shot, single-thread event: tasks wait on it; `fire` wakes them all, for good.
//! Used for shutdown, so idle connections stop waiting on their sockets at once.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::future::Future;
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
    waiters: RefCell<HashMap<u64, Waker>>,
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
}

impl Future for Wait {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let inner = &self.event.0;
        if inner.fired.get() {
            return Poll::Ready(());
        }
        inner
            .waiters
            .borrow_mut()
            .insert(self.id, cx.waker().clone());
        Poll::Pending
    }
}

impl Drop for Wait {
    fn drop(&mut self) {
        self.event.0.waiters.borrow_mut().remove(&self.id);
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
