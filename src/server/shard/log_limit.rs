//! Rate limits for log lines a peer can provoke (failed authentication, refused connections),
//! so a flood cannot fill the disk: at most one line per second per limiter, and the line
//! says how many were held back since the last one.

use std::cell::Cell;

#[derive(Debug, Default)]
pub struct LogLimiter {
    last_second: Cell<u32>,
    suppressed: Cell<u64>,
}

impl LogLimiter {
    /// Whether a line may be logged at `now` (Unix seconds); `Some(held back)` when it may,
    /// with the number of lines suppressed since the last one.
    pub fn allow(&self, now: u32) -> Option<u64> {
        if now != self.last_second.get() {
            self.last_second.set(now);
            Some(self.suppressed.replace(0))
        } else {
            self.suppressed.set(self.suppressed.get() + 1);
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_second_with_the_count_held_back() {
        let limit = LogLimiter::default();
        assert_eq!(limit.allow(100), Some(0));
        assert_eq!(limit.allow(100), None);
        assert_eq!(limit.allow(100), None);
        assert_eq!(limit.allow(101), Some(2));
        assert_eq!(limit.allow(105), Some(0));
    }
}
