//! The data directory through the real binary: modes are 0700/0600 whatever the umask, links
//! planted in it are never followed, a directory others can write or own is refused, memory and
//! file segments that cannot be are refused without leaving files, and root drops to `--user`.

mod common;

use std::io::Read;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::server::{fresh_data_dir, run_to_exit, Server};
use common::{fresh_temp_path, pattern};

/// Runs `sh -c 'umask 000; exec headroom ARGS'`: the server sees the most permissive umask.
const UMASK_000: &[&str] = &["sh", "-c", "umask 000; exec \"$0\" \"$@\""];

fn mode_of(path: &Path) -> u32 {
    std::fs::symlink_metadata(path)
        .unwrap_or_else(|err| panic!("{}: {err}", path.display()))
        .permissions()
        .mode()
        & 0o7777
}

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Whether a test that needs root may skip (said loudly) when not root.
fn skip_without_root(what: &str) -> bool {
    if is_root() {
        return false;
    }
    assert!(
        std::env::var_os("HEADROOM_REQUIRE_ROOT_TESTS").is_none(),
        "HEADROOM_REQUIRE_ROOT_TESTS is set but this is not root"
    );
    println!("SKIPPED: {what} needs root");
    true
}

/// Runs the binary with exactly `args` (no `--allow-root` added), killed after 30 s: its exit
/// status (None when it had to be killed) and stderr.
fn run_bare(args: &[&str]) -> (Option<i32>, String) {
    run_program(env!("CARGO_BIN_EXE_headroom"), args)
}

/// As [`run_bare`], for `program` (a wrapper such as `setpriv`) with `args`.
fn run_program(program: &str, args: &[&str]) -> (Option<i32>, String) {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status.code();
        }
        if started.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (status, reader.join().unwrap())
}

/// A file outside the data directory that a planted link points at, and its bytes.
fn victim(name: &str) -> (PathBuf, Vec<u8>) {
    let dir = fresh_temp_path("victim");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    let bytes = format!("{name}: not Headroom's to write\n").into_bytes();
    std::fs::write(&path, &bytes).unwrap();
    (path, bytes)
}

/// ADMIN `mount`s a new 4 MiB file segment at `path` as the server's first runtime target and
/// checks the file is `uid`'s.
fn assert_mounts_as(server: &Server, path: &Path, uid: u32) {
    assert_eq!(
        server.admin(&format!("mount file:{},size=4M", path.display())),
        Ok("mounted t1".to_string())
    );
    assert_eq!(std::fs::metadata(path).unwrap().uid(), uid);
}

/// Runs the binary with `args` and checks it stops with exit 1, saying `said`.
fn assert_refused(args: &[&str], said: &str) -> String {
    let (status, stderr, _) = run_to_exit(args, Duration::from_secs(30));
    assert_eq!(status, Some(1), "{stderr}");
    assert!(stderr.contains(said), "{said:?} not in: {stderr}");
    stderr
}

fn assert_untouched(path: &Path, bytes: &[u8]) {
    assert_eq!(
        std::fs::read(path).unwrap(),
        bytes,
        "{} was written through a link",
        path.display()
    );
}

/// Starts a server under `prefix` while another thread watches `data_dir/admin.sock` from
/// before the start until the server listens: the server and the modes the socket was seen with.
fn start_watching_the_admin_socket(
    prefix: &[&str],
    dir: &Path,
    args: &[&str],
) -> (Server, Vec<u32>) {
    let socket = dir.join("admin.sock");
    let watching = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let watcher = {
        let watching = watching.clone();
        std::thread::spawn(move || {
            let mut seen = Vec::new();
            while watching.load(std::sync::atomic::Ordering::Relaxed) {
                if let Ok(meta) = std::fs::symlink_metadata(&socket) {
                    seen.push(meta.permissions().mode() & 0o7777);
                }
            }
            seen
        })
    };
    let server = Server::start_command(prefix, dir, args);
    watching.store(false, std::sync::atomic::Ordering::Relaxed);
    (server, watcher.join().unwrap())
}

fn assert_only_0600(seen: &[u32]) {
    let mut odd = std::collections::BTreeMap::new();
    for &mode in seen.iter().filter(|&&m| m != 0o600) {
        *odd.entry(format!("{mode:o}")).or_insert(0) += 1;
    }
    assert!(
        odd.is_empty(),
        "the admin socket was seen with other modes (mode: times seen): {odd:?}"
    );
}

#[test]
fn under_umask_000_the_data_dir_is_0700_and_every_file_0600() {
    let dir = fresh_data_dir();
    let args = ["--threads", "2"];
    // The admin socket is watched from before the server starts: it must never be seen with
    // another mode (it used to be bound, then chmod-ed).
    let socket = dir.join("admin.sock");
    let (server, seen) = start_watching_the_admin_socket(UMASK_000, &dir, &args);
    assert_only_0600(&seen);
    assert_eq!(mode_of(&dir), 0o700, "the data directory");
    assert_eq!(mode_of(&dir.join("segment-0")), 0o600, "segment-0");
    assert_eq!(mode_of(&dir.join("headroom.lock")), 0o600, "headroom.lock");
    assert_eq!(mode_of(&socket), 0o600, "the admin socket");
    // A large value on the file segment makes the stop write a snapshot.
    let value = pattern(3, 3 << 20);
    assert_eq!(
        server.client().set_streamed(0x01, b"big", &value, 5).status,
        0
    );
    // A segment file made at runtime, too.
    assert_eq!(
        server.admin(&format!(
            "mount file:{},size=4M",
            dir.join("runtime-0").display()
        )),
        Ok("mounted t1".to_string())
    );
    assert_eq!(mode_of(&dir.join("runtime-0")), 0o600, "runtime-0");
    assert_eq!(server.stop().code(), Some(0));
    let snapshot = dir.join("snapshot");
    assert_eq!(mode_of(&snapshot), 0o700, "the snapshot directory");
    let parts: Vec<PathBuf> = std::fs::read_dir(&snapshot)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert!(!parts.is_empty(), "no snapshot part written");
    for part in &parts {
        assert_eq!(mode_of(part), 0o600, "{}", part.display());
    }
    // And it is read back (through the directory) on the next start.
    let server = Server::start_command(UMASK_000, &dir, &args);
    let got = server.client().get(b"big");
    assert_eq!(got.status, 0);
    assert!(got.value == value, "the restored value differs");
    drop(server);

    // The log file too (made before a refused data directory stops the start-up).
    let log = fresh_temp_path("log");
    let refused_dir = fresh_data_dir();
    std::fs::create_dir_all(&refused_dir).unwrap();
    std::fs::set_permissions(&refused_dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let status = Command::new(UMASK_000[0])
        .args(&UMASK_000[1..])
        .arg(env!("CARGO_BIN_EXE_headroom"))
        .args(["--allow-root", "--listen", "127.0.0.1:0", "--log-file"])
        .arg(&log)
        .arg("--data-dir")
        .arg(&refused_dir)
        .status()
        .unwrap();
    assert_eq!(status.code(), Some(1));
    assert_eq!(mode_of(&log), 0o600, "the log file");
}

/// The admin socket's start-up window, held open: strace delays every mode and owner change,
/// `listen` and the rename by 300 ms each, so a socket bound at its path and given its mode
/// afterwards (the old code) would sit there with the umask's mode long enough to be seen on
/// every run. The socket must only ever be seen with mode 0600.
#[test]
fn the_admin_socket_is_never_seen_with_another_mode_while_start_up_is_held() {
    const HELD: &str = "fchmodat,fchmod,chmod,fchownat,fchown,chown,listen,renameat2";
    let trace = format!("trace={HELD}");
    let inject = format!("inject={HELD}:delay_enter=300000");
    let prefix = [
        "strace",
        "-f",
        "-qq",
        "-o",
        "/dev/null",
        "-e",
        &trace,
        "-e",
        &inject,
    ]
    .into_iter()
    .chain(UMASK_000.iter().copied())
    .collect::<Vec<_>>();
    let dir = fresh_data_dir();
    let (server, seen) = start_watching_the_admin_socket(&prefix, &dir, &["--threads", "1"]);
    // strace leaves its tracee running when it goes: the server is stopped first.
    let children = std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", server.pid()))
        .unwrap_or_default();
    for pid in children.split_whitespace() {
        let pid = nix::unistd::Pid::from_raw(pid.parse().unwrap());
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::SIGTERM);
    }
    drop(server);
    assert!(!seen.is_empty(), "the admin socket was never seen");
    assert_only_0600(&seen);
}

#[test]
fn a_planted_segment_or_lock_link_is_refused_and_its_target_untouched() {
    for name in ["segment-0", "headroom.lock"] {
        let dir = fresh_data_dir();
        std::fs::create_dir_all(&dir).unwrap();
        let (target, bytes) = victim(name);
        std::os::unix::fs::symlink(&target, dir.join(name)).unwrap();
        let (status, stderr, _) = run_to_exit(
            &[
                "--listen",
                "127.0.0.1:0",
                "--threads",
                "1",
                "--data-dir",
                &dir.display().to_string(),
            ],
            Duration::from_secs(30),
        );
        assert_eq!(status, Some(1), "{name}: {stderr}");
        assert!(
            stderr.contains(&format!("{} is a symbolic link", dir.join(name).display())),
            "{name}: {stderr}"
        );
        assert_eq!(
            stderr.trim().lines().last().unwrap().matches(". ").count(),
            0
        );
        assert_untouched(&target, &bytes);
        assert_eq!(
            std::fs::metadata(&target).unwrap().len(),
            bytes.len() as u64
        );
    }
}

#[test]
fn a_data_dir_that_is_a_link_is_refused() {
    let real = fresh_data_dir();
    std::fs::create_dir_all(&real).unwrap();
    std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o700)).unwrap();
    let link = fresh_temp_path("data-link");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    assert_refused(
        &[
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            &link.display().to_string(),
        ],
        "is not a directory (a symbolic link",
    );
    assert_eq!(
        std::fs::read_dir(&real).unwrap().count(),
        0,
        "nothing made in it"
    );
}

#[test]
fn planted_snapshot_links_are_never_followed() {
    let dir = fresh_data_dir();
    let args = ["--threads", "2"];
    let value = pattern(8, 3 << 20);
    let (target, bytes) = victim("snapshot-victim");

    // 1. `snapshot` itself a link to a directory elsewhere: nothing is written there.
    let elsewhere = fresh_temp_path("snapshot-elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    let server = Server::start_in(&dir, &args);
    assert_eq!(
        server.client().set_streamed(0x01, b"big", &value, 1).status,
        0
    );
    std::os::unix::fs::symlink(&elsewhere, dir.join("snapshot")).unwrap();
    // The snapshot cannot be written, and the stop says so in its exit status and last line.
    let (status, log) = server.stop_logged();
    assert_eq!(status.code(), Some(1), "{log}");
    let last = log.lines().last().unwrap_or_default();
    assert!(
        last.contains("ERROR") && last.contains("the warm-restart snapshot was not written"),
        "{last}"
    );
    assert_eq!(
        std::fs::read_dir(&elsewhere).unwrap().count(),
        0,
        "the snapshot went through the link"
    );
    std::fs::remove_file(dir.join("snapshot")).unwrap();

    // 2. The temporary parts are links to a file: removed and made anew, never written through.
    let server = Server::start_in(&dir, &args);
    assert_eq!(
        server.client().set_streamed(0x01, b"big", &value, 1).status,
        0
    );
    std::fs::create_dir(dir.join("snapshot")).unwrap();
    std::fs::set_permissions(dir.join("snapshot"), std::fs::Permissions::from_mode(0o700)).unwrap();
    for shard in 0..2 {
        std::os::unix::fs::symlink(&target, dir.join(format!("snapshot/.part-{shard}.tmp")))
            .unwrap();
    }
    assert_eq!(server.stop().code(), Some(0));
    assert_untouched(&target, &bytes);
    // The shard that held the value wrote a real part (one with nothing to write left its
    // planted link alone: restore reads only `part-*.bin`).
    let parts: Vec<PathBuf> = std::fs::read_dir(dir.join("snapshot"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "bin"))
        .collect();
    assert_eq!(parts.len(), 1, "{parts:?}");
    assert!(std::fs::symlink_metadata(&parts[0])
        .unwrap()
        .file_type()
        .is_file());

    // 3. A part that is a link, even one the manifest lists, is refused at restore and
    // removed (the link, not its target); the real parts are restored.
    std::os::unix::fs::symlink(&target, dir.join("snapshot/part-9.bin")).unwrap();
    let manifest = dir.join("snapshot/manifest");
    let text = std::fs::read_to_string(&manifest).unwrap();
    let (body, _) = text.trim_end().rsplit_once('\n').unwrap();
    let body = format!("{body}\npart-9.bin\n");
    let crc = crc32c::crc32c(body.as_bytes());
    std::fs::write(&manifest, format!("{body}crc32c {crc:08x}\n")).unwrap();
    let server = Server::start_in(&dir, &args);
    assert!(
        server.logs("snapshot part unusable"),
        "{}",
        server.log_text()
    );
    let got = server.client().get(b"big");
    assert_eq!(got.status, 0);
    assert!(got.value == value, "the restored value differs");
    assert!(!dir.join("snapshot").exists(), "the parts were not removed");
    assert_untouched(&target, &bytes);
}

#[test]
fn a_data_dir_others_can_write_or_own_is_refused_with_exit_1() {
    for mode in [0o777, 0o770, 0o1777] {
        let dir = fresh_data_dir();
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode)).unwrap();
        let shown = dir.display().to_string();
        let (status, stderr, _) = run_to_exit(
            &["--listen", "127.0.0.1:0", "--data-dir", &shown],
            Duration::from_secs(30),
        );
        assert_eq!(status, Some(1), "{mode:o}: {stderr}");
        assert!(
            stderr.contains(&format!(
                "--data-dir {shown} is mode {mode:04o} (group- or world-writable)"
            )) && stderr.contains(&format!("chmod 700 {shown}")),
            "{mode:o}: {stderr}"
        );
        assert_eq!(
            std::fs::read_dir(&dir).unwrap().count(),
            0,
            "nothing made in it"
        );
    }
    // Owned by another user: as root, a directory given to nobody; otherwise root's own `/`.
    let (dir, owner) = if is_root() {
        let dir = fresh_data_dir();
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        nix::unistd::chown(&dir, Some(nix::unistd::Uid::from_raw(65534)), None).unwrap();
        (dir, 65534)
    } else {
        (PathBuf::from("/"), 0)
    };
    let shown = dir.display().to_string();
    assert_refused(
        &["--listen", "127.0.0.1:0", "--data-dir", &shown],
        &format!("--data-dir {shown} is owned by uid {owner}"),
    );
    assert!(!dir.join("headroom.lock").exists());
}

/// The machine's MemTotal in bytes.
fn mem_total_bytes() -> u64 {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap();
    let line = text.lines().find(|l| l.starts_with("MemTotal:")).unwrap();
    line.split_whitespace()
        .nth(1)
        .unwrap()
        .parse::<u64>()
        .unwrap()
        * 1024
}

#[test]
fn memory_segments_that_cannot_be_backed_are_refused() {
    // Twice the machine's memory, in whole GiB.
    let too_much = format!("mem:size={}G,numa=0", (mem_total_bytes() >> 30) * 2 + 2);
    let dir = fresh_data_dir();
    let stderr = assert_refused(
        &[
            "--listen",
            "127.0.0.1:0",
            "--threads",
            "1",
            "--segment",
            &too_much,
            "--data-dir",
            &dir.display().to_string(),
        ],
        "node 0 cannot back",
    );
    assert!(stderr.contains("outside its huge page pool"), "{stderr}");
    // At runtime too, and the server goes on.
    let server = Server::start(&["--threads", "1"]);
    let refused = server.admin(&format!("mount {too_much}")).unwrap_err();
    assert!(refused.contains("node 0 cannot back"), "{refused}");
    assert_eq!(
        server.admin("mount mem:size=8M,numa=0"),
        Ok("mounted t1".to_string())
    );
}

#[test]
fn a_failed_mount_leaves_no_file_behind() {
    let server = Server::start(&["--threads", "1"]);
    let before: Vec<_> = std::fs::read_dir(&server.data_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    // Refused before anything is made: no size, and one past the 1 EiB limit (whose label
    // offset would wrap).
    let mut sizes = vec!["0", "18446744073709547520"];
    // Refused after the file was made, where the filesystem cannot hold 1 EiB (ext4, overlay):
    // the file goes again.
    let probe = fresh_temp_path("probe");
    let fits = std::fs::File::create(&probe)
        .unwrap()
        .set_len((1 << 60) + 4096)
        .is_ok();
    let _ = std::fs::remove_file(&probe);
    if !fits {
        sizes.push("1E");
    }
    for size in sizes {
        let path = server.data_dir.join(format!("bad-{size}"));
        let refused = server
            .admin(&format!("mount file:{},size={size}", path.display()))
            .unwrap_err();
        assert!(
            !path.exists(),
            "size={size} left {}: {refused}",
            path.display()
        );
    }
    let after: Vec<_> = std::fs::read_dir(&server.data_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(before.len(), after.len(), "{before:?} -> {after:?}");
    // Still serving.
    assert_eq!(server.client().set(b"k", b"v", 0, 0).status, 0);
}

/// Every thread's real, effective, saved and filesystem ids of process `pid`.
fn thread_ids(pid: u32) -> Vec<(String, String, String)> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .map(|task| {
            let path = task.unwrap().path();
            let status = std::fs::read_to_string(path.join("status")).unwrap();
            let field = |name: &str| {
                status
                    .lines()
                    .find(|l| l.starts_with(name))
                    .unwrap()
                    .split_whitespace()
                    .skip(1)
                    .collect::<Vec<_>>()
                    .join(" ")
            };
            (
                field("Name:"),
                field("Uid:"),
                format!("{} caps {}", field("Gid:"), field("CapEff:")),
            )
        })
        .collect()
}

#[test]
fn root_is_refused_without_user_or_allow_root() {
    if skip_without_root("refusing root") {
        return;
    }
    let dir = fresh_data_dir();
    let shown = dir.display().to_string();
    let (status, stderr) = run_bare(&["--listen", "127.0.0.1:0", "--data-dir", &shown]);
    assert_eq!(status, Some(2), "{stderr}");
    assert!(
        stderr.contains("refusing to run as root: give --user USER")
            && stderr.contains("--allow-root"),
        "{stderr}"
    );
    assert!(
        !dir.exists(),
        "the data directory was made before the refusal"
    );
    let (status, stderr) = run_bare(&[
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        &shown,
        "--user",
        "no-such-user-headroom",
    ]);
    assert_eq!(status, Some(2), "{stderr}");
    assert!(
        stderr.contains("--user no-such-user-headroom: no such user"),
        "{stderr}"
    );
    // `--user root` stays root on purpose, as memcached's `-u root`.
    let server = Server::start_in(&dir, &["--threads", "1", "--user", "root"]);
    assert_eq!(server.client().set(b"k", b"v", 0, 0).status, 0);
    let ids = thread_ids(server.pid());
    assert!(ids.iter().all(|(_, uid, _)| uid == "0 0 0 0"), "{ids:?}");
}

#[test]
fn user_drops_every_thread_to_that_user_and_it_serves() {
    if skip_without_root("--user") {
        return;
    }
    let nobody = nix::unistd::User::from_name("nobody").unwrap().unwrap();
    let (uid, gid) = (nobody.uid.as_raw(), nobody.gid.as_raw());
    let dir = fresh_data_dir();
    let value = pattern(21, 3 << 20);
    // A first run as root leaves a root-owned data directory with a snapshot and a runtime
    // segment in it.
    let server = Server::start_in(&dir, &["--threads", "2"]);
    assert_eq!(
        server.client().set_streamed(0x01, b"big", &value, 4).status,
        0
    );
    let earlier = dir.join("runtime-root");
    assert_eq!(
        server.admin(&format!("mount file:{},size=4M", earlier.display())),
        Ok("mounted t1".to_string())
    );
    assert_eq!(server.stop().code(), Some(0));
    assert_eq!(std::fs::metadata(&dir).unwrap().uid(), 0);

    // Started as root with --user nobody: it takes the port, memory and directory, then drops.
    let args = ["--threads", "2", "--user", "nobody"];
    let server = Server::start_in(&dir, &args);
    let ids = thread_ids(server.pid());
    let want_uid = format!("{uid} {uid} {uid} {uid}");
    // No capability left either: root cannot be taken back.
    let want_gid = format!("{gid} {gid} {gid} {gid} caps 0000000000000000");
    assert!(ids.len() >= 4, "{ids:?}");
    for (name, uids, gids) in &ids {
        assert_eq!((uids, gids), (&want_uid, &want_gid), "thread {name}");
    }
    // It serves, restored the root run's snapshot as nobody, and removed it.
    let mut c = server.client();
    let got = c.get(b"big");
    assert_eq!(got.status, 0);
    assert!(got.value == value, "the restored value differs");
    assert_eq!(c.set(b"k", b"v", 0, 0).status, 0);
    assert_eq!(c.get(b"k").value, b"v");
    assert!(!dir.join("snapshot").exists());
    // The data directory and what Headroom keeps there are nobody's now.
    for path in [
        dir.clone(),
        dir.join("headroom.lock"),
        dir.join("segment-0"),
        earlier.clone(),
    ] {
        assert_eq!(
            std::fs::metadata(&path).unwrap().uid(),
            uid,
            "{}",
            path.display()
        );
    }
    assert_eq!(mode_of(&dir), 0o700);
    // ADMIN after the drop: a file made at runtime is nobody's.
    assert_mounts_as(&server, &dir.join("runtime-0"), uid);
    // And the root run's segment file, handed over, mounts again.
    assert_eq!(
        server.admin(&format!("mount file:{},size=4M", earlier.display())),
        Ok("mounted t2".to_string())
    );
    assert_eq!(server.stop().code(), Some(0));
    // The snapshot the dropped server wrote is its own.
    assert_eq!(std::fs::metadata(dir.join("snapshot")).unwrap().uid(), uid);
}

#[test]
fn runtime_mounts_refuse_what_another_user_could_have_put_there() {
    let shared = fresh_temp_path("mount-shared");
    std::fs::create_dir_all(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let server = Server::start(&[
        "--threads",
        "1",
        "--mount-dir",
        &shared.display().to_string(),
    ]);
    // A world-writable --mount-dir: anyone could have left a labelled file there.
    let refused = server
        .admin(&format!(
            "mount file:{},size=4M",
            shared.join("seg").display()
        ))
        .unwrap_err();
    assert!(
        refused.contains("is mode 1777 (group- or world-writable)"),
        "{refused}"
    );
    assert!(!shared.join("seg").exists());
    // A file another user owns, even in the data directory (root can place one there).
    if is_root() {
        let theirs = server.data_dir.join("theirs");
        std::fs::write(&theirs, b"theirs").unwrap();
        nix::unistd::chown(&theirs, Some(nix::unistd::Uid::from_raw(65534)), None).unwrap();
        let refused = server
            .admin(&format!("mount file:{},size=4M", theirs.display()))
            .unwrap_err();
        assert!(refused.contains("owned by uid 65534"), "{refused}");
        assert_eq!(std::fs::read(&theirs).unwrap(), b"theirs");
    }
}

#[test]
fn user_reopens_its_log_file_on_sighup() {
    if skip_without_root("--user") {
        return;
    }
    let dir = fresh_data_dir();
    let logs = fresh_temp_path("user-log");
    std::fs::create_dir_all(&logs).unwrap();
    let log = logs.join("headroom.log");
    let read = || std::fs::read_to_string(&log).unwrap_or_default();
    let wait_for = |text: &str| {
        for _ in 0..500 {
            if read().contains(text) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("the log never said {text:?}: {}", read());
    };
    let mut child = Command::new(env!("CARGO_BIN_EXE_headroom"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--threads",
            "1",
            "--user",
            "nobody",
        ])
        .arg("--data-dir")
        .arg(&dir)
        .arg("--log-file")
        .arg(&log)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    wait_for("listening on ");
    // Made by root before the drop, handed to nobody: the dropped server can open it again.
    assert_eq!(std::fs::metadata(&log).unwrap().uid(), 65534);
    nix::sys::signal::kill(pid, nix::sys::signal::SIGHUP).unwrap();
    wait_for("SIGHUP: log file reopened");
    nix::sys::signal::kill(pid, nix::sys::signal::SIGTERM).unwrap();
    assert_eq!(child.wait().unwrap().code(), Some(0));
}

#[test]
fn a_planted_hard_link_or_fifo_segment_is_refused_and_its_target_untouched() {
    // A hard link: root may make one to any file, whatever fs.protected_hardlinks says (a
    // user may too where it is 0). The server must not label or resize its target.
    let dir = fresh_data_dir();
    std::fs::create_dir_all(&dir).unwrap();
    let (target, bytes) = victim("hard-linked");
    std::fs::hard_link(&target, dir.join("segment-0")).unwrap();
    let shown = dir.display().to_string();
    let args = [
        "--listen",
        "127.0.0.1:0",
        "--threads",
        "1",
        "--data-dir",
        &shown,
    ];
    let said = format!("{} has 2 hard links", dir.join("segment-0").display());
    assert_refused(&args, &said);
    assert_untouched(&target, &bytes);
    assert_eq!(
        std::fs::metadata(&target).unwrap().len(),
        bytes.len() as u64
    );
    // A FIFO named segment-0: refused at once, the start-up never waits on it.
    std::fs::remove_file(dir.join("segment-0")).unwrap();
    nix::unistd::mkfifo(
        &dir.join("segment-0"),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    let (status, stderr, _) = run_to_exit(&args, Duration::from_secs(30));
    assert_eq!(
        status,
        Some(1),
        "the FIFO hung the start-up or was taken: {stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "{} is not a regular file or a block device",
            dir.join("segment-0").display()
        )),
        "{stderr}"
    );
}

#[test]
fn user_never_hands_over_a_hard_linked_file_in_the_data_dir() {
    if skip_without_root("--user") {
        return;
    }
    let dir = fresh_data_dir();
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let (target, bytes) = victim("handed");
    std::fs::hard_link(&target, dir.join("planted")).unwrap();
    let shown = dir.display().to_string();
    let said = format!("{} has 2 hard links", dir.join("planted").display());
    let args = [
        "--listen",
        "127.0.0.1:0",
        "--user",
        "nobody",
        "--data-dir",
        &shown,
    ];
    assert_refused(&args, &said);
    assert_untouched(&target, &bytes);
    assert_eq!(std::fs::metadata(&target).unwrap().uid(), 0, "chowned");
}

#[test]
fn user_binds_the_admin_socket_before_the_drop_in_a_root_owned_dir() {
    if skip_without_root("--user") {
        return;
    }
    // A root-owned 0755 directory, as /run is: the user the server drops to cannot write it.
    let run = fresh_temp_path("admin-run");
    std::fs::create_dir_all(&run).unwrap();
    std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o755)).unwrap();
    let socket = run.join("headroom.sock");
    let shown = socket.display().to_string();
    let dir = fresh_data_dir();
    let args = [
        "--threads",
        "1",
        "--user",
        "nobody",
        "--admin-socket",
        &shown,
    ];
    let mut server = Server::start_in(&dir, &args);
    server.admin_socket = socket.clone();
    let meta = std::fs::symlink_metadata(&socket).unwrap();
    assert_eq!(meta.permissions().mode() & 0o7777, 0o600);
    // The user's own (it may connect too); root connects whatever the mode.
    assert_eq!((meta.uid(), meta.gid()), (65534, nobody_gid()));
    assert!(server.admin("promote").unwrap().starts_with("promoted"));
    // Nothing but the socket is left in its directory (the private one is gone).
    let names: Vec<_> = std::fs::read_dir(&run)
        .unwrap()
        .map(|entry| entry.unwrap().file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("headroom.sock")]);
    assert_eq!(server.stop().code(), Some(0));

    // A directory others may write without the sticky bit: refused before anything is mapped.
    let open = fresh_temp_path("admin-open");
    std::fs::create_dir_all(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let socket = open.join("headroom.sock").display().to_string();
    let data = fresh_data_dir().display().to_string();
    let said = format!(
        "its directory {} is mode 0777 (group- or world-writable)",
        open.display()
    );
    let args = [
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        &data,
        "--admin-socket",
        &socket,
    ];
    assert_refused(&args, &said);
    assert_eq!(std::fs::read_dir(&open).unwrap().count(), 0);
}

fn nobody_gid() -> u32 {
    nix::unistd::User::from_name("nobody")
        .unwrap()
        .unwrap()
        .gid
        .as_raw()
}

#[test]
fn under_umask_077_user_reaches_a_data_dir_whose_parents_it_made() {
    if skip_without_root("--user") {
        return;
    }
    // Two missing levels above the data directory, made by root under root's usual umask:
    // they must be 0755 whatever the umask, or nobody cannot reach its own directory.
    let top = fresh_temp_path("parents-077");
    let dir = top.join("var").join("data");
    let args = ["--threads", "1", "--user", "nobody"];
    let umask_077: &[&str] = &["sh", "-c", "umask 077; exec \"$0\" \"$@\""];
    let server = Server::start_command(umask_077, &dir, &args);
    assert_eq!(mode_of(&top), 0o755, "{}", top.display());
    assert_eq!(mode_of(&top.join("var")), 0o755);
    assert_eq!(mode_of(&dir), 0o700);
    // After the drop, a runtime mount reaches the data directory by its path.
    assert_mounts_as(&server, &dir.join("runtime-0"), 65534);
    assert_eq!(server.stop().code(), Some(0));
}

#[test]
fn a_drop_that_the_kernel_refuses_exits_1() {
    if skip_without_root("--user") {
        return;
    }
    // Root without CAP_SETGID (a confined container): setgroups fails with EPERM. That is
    // the machine's doing, not the configuration's: exit 1, not 2.
    let dir = fresh_data_dir().display().to_string();
    let (status, stderr) = run_program(
        "setpriv",
        &[
            "--bounding-set=-setgid",
            env!("CARGO_BIN_EXE_headroom"),
            "--listen",
            "127.0.0.1:0",
            "--threads",
            "1",
            "--user",
            "nobody",
            "--data-dir",
            &dir,
        ],
    );
    assert_eq!(status, Some(1), "{stderr}");
    assert!(
        stderr.contains("--user nobody: setgroups: EPERM"),
        "{stderr}"
    );
}

#[test]
fn a_segment_in_the_data_dir_spelt_another_way_is_never_reached_through_a_link() {
    // `DATA/sub/../segment-0` is in the data directory: it is recognised by its inode, so the
    // link planted there is refused, not followed as a path the operator named elsewhere.
    let dir = fresh_data_dir();
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    let (target, bytes) = victim("spelt");
    std::os::unix::fs::symlink(&target, dir.join("segment-0")).unwrap();
    let spelt = dir.join("sub").join("..").join("segment-0");
    let segment = format!("file:{},size=4M", spelt.display());
    let shown = dir.display().to_string();
    let said = format!("{} is a symbolic link", dir.join("segment-0").display());
    let args = [
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        &shown,
        "--segment",
        &segment,
    ];
    assert_refused(&args, &said);
    assert_untouched(&target, &bytes);
}
