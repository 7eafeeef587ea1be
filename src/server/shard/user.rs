//! Running as root: as memcached does, a server started as root drops to `--user USER` once it
//! holds what needs root (the listening ports, the data directory, the locked arena and huge
//! pages, the command-line segments), and refuses to start as root without it unless told to
//! stay root (`--allow-root`, or `--user root` as memcached's `-u root`).
//!
//! The drop happens before any executor thread starts, so every shard is born with the user's
//! credentials. glibc's `setuid`/`setgid`/`setgroups` also change every thread that already
//! exists (the signal thread): it signals each one to make the same system call, so no thread
//! keeps root. RLIMIT_MEMLOCK is raised to unlimited first (what the systemd unit's
//! `LimitMEMLOCK=infinity` gives): each shard's ring registers the arena after the drop, and a
//! user without CAP_IPC_LOCK is charged for it.

use nix::unistd::{Gid, Uid, User};

/// The user the server runs as once started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunAs {
    pub uid: Uid,
    pub gid: Gid,
}

/// What start-up does about its credentials.
#[derive(Clone, Debug)]
pub enum Privileges {
    /// Runs on as whoever started it.
    Keep,
    /// Started as root: drops to this user before the shards start.
    DropTo(User),
}

impl Privileges {
    /// Who the server runs as once serving.
    pub fn run_as(&self) -> RunAs {
        match self {
            Privileges::Keep => RunAs {
                uid: Uid::effective(),
                gid: Gid::effective(),
            },
            Privileges::DropTo(user) => RunAs {
                uid: user.uid,
                gid: user.gid,
            },
        }
    }
}

/// Decides from `--user` and `--allow-root`, refusing root without either (one sentence).
pub fn plan(user: Option<&str>, allow_root: bool) -> Result<Privileges, String> {
    let me = Uid::effective();
    let Some(name) = user else {
        if me.is_root() && !allow_root {
            return Err("refusing to run as root: give --user USER to drop to once the ports, memory and data directory are taken (e.g. --user headroom), or --allow-root to stay root on purpose".to_string());
        }
        return Ok(Privileges::Keep);
    };
    let found = match name.parse::<u32>() {
        Ok(uid) => User::from_uid(Uid::from_raw(uid)),
        Err(_) => User::from_name(name),
    };
    let user = found
        .map_err(|err| format!("--user {name}: cannot look the user up: {err}"))?
        .ok_or_else(|| format!("--user {name}: no such user"))?;
    if user.uid == me {
        // Already that user (for root, `--user root`: stays root on purpose, as `-u root`).
        return Ok(Privileges::Keep);
    }
    if !me.is_root() {
        return Err(format!(
            "--user {name}: switching to uid {} needs root, and this process runs as uid {me}",
            user.uid
        ));
    }
    Ok(Privileges::DropTo(user))
}

/// Drops root for good: unlimited RLIMIT_MEMLOCK, the log file handed to the user (SIGHUP
/// reopens it as the user), then the user's groups, group and user. It checks that every id is
/// the user's and that root cannot be taken back.
pub fn drop_to(user: &User, log_file: Option<&std::path::Path>) -> Result<(), String> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource, RLIM_INFINITY};
    let fail = |what: &str, err: nix::Error| format!("--user {}: {what}: {err}", user.name);
    if setrlimit(Resource::RLIMIT_MEMLOCK, RLIM_INFINITY, RLIM_INFINITY).is_err() {
        // Without CAP_SYS_RESOURCE (a container) the hard limit stays: take all of it.
        let (_, hard) = getrlimit(Resource::RLIMIT_MEMLOCK)
            .map_err(|err| fail("cannot read the locked-memory limit", err))?;
        setrlimit(Resource::RLIMIT_MEMLOCK, hard, hard)
            .map_err(|err| fail("cannot raise the locked-memory limit", err))?;
        tracing::warn!(
            user = %user.name,
            limit = %crate::units::ByteSize(hard),
            "RLIMIT_MEMLOCK cannot be lifted (no CAP_SYS_RESOURCE): after the switch, a shard ring that must register more than that falls back to the plain path (raise the hard limit, e.g. LimitMEMLOCK=infinity)"
        );
    }
    if let Some(path) = log_file {
        crate::logging::hand_file_to(user.uid, user.gid).map_err(|err| {
            format!(
                "--log-file {}: cannot hand it to --user {}: {err}",
                path.display(),
                user.name
            )
        })?;
    }
    let name = std::ffi::CString::new(user.name.as_bytes())
        .map_err(|_| format!("--user {}: the name holds a NUL byte", user.name))?;
    let groups = nix::unistd::getgrouplist(&name, user.gid)
        .map_err(|err| fail("cannot list its groups", err))?;
    nix::unistd::setgroups(&groups).map_err(|err| fail("setgroups", err))?;
    nix::unistd::setgid(user.gid).map_err(|err| fail("setgid", err))?;
    nix::unistd::setuid(user.uid).map_err(|err| fail("setuid", err))?;
    let uids = nix::unistd::getresuid().map_err(|err| fail("getresuid", err))?;
    let gids = nix::unistd::getresgid().map_err(|err| fail("getresgid", err))?;
    let all_user = [uids.real, uids.effective, uids.saved] == [user.uid; 3]
        && [gids.real, gids.effective, gids.saved] == [user.gid; 3];
    if !all_user || nix::unistd::setuid(Uid::from_raw(0)).is_ok() {
        // Never serve half-dropped.
        return Err(format!(
            "--user {}: the switch did not hold (uids {uids:?}, gids {gids:?})",
            user.name
        ));
    }
    tracing::info!(user = %user.name, uid = %user.uid, gid = %user.gid, groups = groups.len(), "dropped root: running as {}", user.name);
    Ok(())
}
