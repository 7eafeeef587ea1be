//! `--daemon` (memcached's `-d`): the process forks; the parent waits until the child serves
//! and exits with the child's start-up status, so a script or a `Type=forking` unit learns
//! whether the start worked. The child leaves the terminal's session, and its standard input
//! and output (and standard error when the log goes to a file) go to /dev/null.
//!
//! memcached's parent exits at once, whatever becomes of the start; its child also changes
//! directory to `/`, which Headroom does not, so relative paths (`./data`) keep meaning what
//! they meant on the command line.

use std::cell::Cell;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};

/// The child's end of the pipe to its waiting parent.
pub struct StartReport {
    pipe: Cell<Option<OwnedFd>>,
}

impl StartReport {
    /// Tells the parent how the start went (0: serving), once; later calls do nothing.
    pub fn started(&self, status: u8) {
        if let Some(pipe) = self.pipe.take() {
            // A parent that is gone (killed) has nobody to tell.
            let _ = File::from(pipe).write_all(&[status]);
        }
    }
}

/// Forks into the background. Returns in the child; the parent exits with the child's start
/// status (1 when the child ends without one). Must run before any other thread starts.
pub fn detach(log_to_file: bool) -> Result<StartReport, String> {
    let threads = std::fs::read_dir("/proc/self/task").map_or(0, |tasks| tasks.count());
    if threads != 1 {
        return Err(format!(
            "cannot fork with {threads} threads running (a bug: it must come first)"
        ));
    }
    let (read_end, write_end) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|err| format!("pipe: {err}"))?;
    // SAFETY: the process has one thread (checked above), so the child's copy of every lock
    // and allocator is consistent; it goes on as the whole program.
    match unsafe { nix::unistd::fork() }.map_err(|err| format!("fork: {err}"))? {
        nix::unistd::ForkResult::Parent { .. } => {
            drop(write_end);
            let mut status = [1u8];
            let status = match File::from(read_end).read(&mut status) {
                Ok(1) => status[0],
                _ => 1,
            };
            std::process::exit(i32::from(status));
        }
        nix::unistd::ForkResult::Child => {
            drop(read_end);
            nix::unistd::setsid().map_err(|err| format!("setsid: {err}"))?;
            let null = File::options()
                .read(true)
                .write(true)
                .open("/dev/null")
                .map_err(|err| format!("/dev/null: {err}"))?;
            let mut streams = vec![libc::STDIN_FILENO, libc::STDOUT_FILENO];
            if log_to_file {
                streams.push(libc::STDERR_FILENO);
            }
            for stream in streams {
                // SAFETY: dup2 onto a standard descriptor this process owns; no Rust object
                // holds those descriptors' files.
                if unsafe { libc::dup2(null.as_raw_fd(), stream) } < 0 {
                    return Err(format!("dup2: {}", std::io::Error::last_os_error()));
                }
            }
            Ok(StartReport {
                pipe: Cell::new(Some(write_end)),
            })
        }
    }
}
