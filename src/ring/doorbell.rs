//! A doorbell: another thread rings it, a glommio task on the owning executor wakes. It lets
//! the control plane (the signal thread, shards finishing) wake a sleeping executor without
//! any timer polling a flag, so an idle server costs nothing.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// An eventfd that rings one executor. `ring` may be called from any thread; `wait` only on the
/// executor that waits.
#[derive(Debug)]
pub struct Doorbell {
    eventfd: OwnedFd,
}

impl Doorbell {
    pub fn new() -> io::Result<Doorbell> {
        // SAFETY: a plain eventfd syscall; the descriptor is owned right away.
        let raw = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a fresh descriptor nothing else owns.
        Ok(Doorbell {
            eventfd: unsafe { OwnedFd::from_raw_fd(raw) },
        })
    }

    /// Wakes the waiter (a ring before the wait is not lost: the count stays until read).
    pub fn ring(&self) {
        let one = 1u64;
        // SAFETY: writes 8 bytes from a live u64 to our own eventfd.
        unsafe {
            libc::write(
                self.eventfd.as_raw_fd(),
                (&one as *const u64).cast(),
                std::mem::size_of::<u64>(),
            )
        };
    }

    /// Resolves at the next ring (or at once if it rang since the last wait), reading through
    /// the current glommio executor's own ring.
    pub async fn wait(&self) -> io::Result<()> {
        // SAFETY: dup of our own eventfd; the duplicate is owned by the glommio file.
        let dup = unsafe { libc::dup(self.eventfd.as_raw_fd()) };
        if dup < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `dup` is a fresh descriptor handed to the file, which closes it.
        let file = unsafe { glommio::io::BufferedFile::from_raw_fd(dup) };
        let read = file.read_at(0, 8).await.map(drop).map_err(io::Error::from);
        let _ = file.close().await;
        read
    }
}
