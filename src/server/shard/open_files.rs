//! The open-files limit a server needs for `--max-connections`: raised at start as far as the
//! hard limit allows (as memcached raises it for `-c`), and said in the log when that is not
//! far enough.

use nix::sys::resource::{getrlimit, setrlimit, Resource};

/// Descriptors the server holds besides its client connections: listeners and rings per
/// shard, eventfds, segment files, the data directory, the log, with room to spare.
pub const OTHER_FILES: u64 = 256;

/// Raises the soft `RLIMIT_NOFILE` to `max_connections` plus [`OTHER_FILES`], up to the hard
/// limit, and says what it did. Past a hard limit that is too low, the kernel refuses the
/// accepts beyond it (the accept loop says so, once a second per shard at most).
pub fn raise_for(max_connections: usize) {
    let need = max_connections as u64 + OTHER_FILES;
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return;
    };
    if soft >= need {
        return;
    }
    let target = need.min(hard);
    if target > soft {
        if let Err(err) = setrlimit(Resource::RLIMIT_NOFILE, target, hard) {
            tracing::warn!(%err, soft, hard, "could not raise the open-files limit");
            return;
        }
    }
    if target < need {
        tracing::warn!(
            max_connections,
            open_files_limit = target,
            connections_possible = target.saturating_sub(OTHER_FILES),
            "the open-files limit is below what --max-connections needs: connections past about \
             {} are refused by the kernel at accept; raise the hard limit (LimitNOFILE= in the \
             systemd unit, `ulimit -Hn` as root) or lower --max-connections",
            target.saturating_sub(OTHER_FILES)
        );
    } else {
        tracing::info!(
            from = soft,
            to = target,
            max_connections,
            "raised the open-files limit for --max-connections"
        );
    }
}
