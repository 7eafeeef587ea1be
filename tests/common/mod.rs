//! Shared test helpers: a seeded generator that prints its seed; a real server and client.
#![allow(dead_code)]

pub mod certs;
pub mod memcached;
pub mod server;
pub mod stress;

use std::time::{SystemTime, UNIX_EPOCH};

/// The seeded generator the library's benchmarks use (SplitMix64): the same sequence for the
/// same seed on every machine.
#[allow(unused_imports)] // not every test binary draws numbers
pub use headroom::bench::rng::Rng;

/// A path under the system temp directory, `headroom-WHAT-PID-START-N`, that does not exist yet.
/// The name carries the process's start time beside its id, so a directory left behind by an
/// earlier process that had the same id (an earlier run on this machine, another PID namespace
/// sharing `/tmp`, perhaps as another user) is never handed out again; one that exists anyway is
/// skipped. Whatever is made at the path is removed when the test binary exits (a run of the
/// suite left about 250 data directories behind, and `/tmp` had grown to 18 GB), unless
/// `HEADROOM_KEEP_TEST_DIRS` is set.
pub fn fresh_temp_path(what: &str) -> std::path::PathBuf {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    static STARTED_NANOS: std::sync::OnceLock<u128> = std::sync::OnceLock::new();
    let started = STARTED_NANOS.get_or_init(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    });
    loop {
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!(
            "headroom-{what}-{}-{started:x}-{n}",
            std::process::id()
        ));
        if !path.exists() {
            remove_at_exit(&path);
            return path;
        }
    }
}

/// The paths [`fresh_temp_path`] handed out, removed at exit.
static TEMP_PATHS: std::sync::Mutex<Vec<std::path::PathBuf>> = std::sync::Mutex::new(Vec::new());

fn remove_at_exit(path: &std::path::Path) {
    static REGISTERED: std::sync::Once = std::sync::Once::new();
    REGISTERED.call_once(|| {
        extern "C" fn remove_temp_paths() {
            if std::env::var_os("HEADROOM_KEEP_TEST_DIRS").is_some() {
                return;
            }
            let paths = std::mem::take(
                &mut *TEMP_PATHS
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner),
            );
            for path in paths {
                let _ = std::fs::remove_dir_all(&path);
                let _ = std::fs::remove_file(&path);
            }
        }
        // SAFETY: registers a plain function with no captured state; it runs at exit.
        unsafe { libc::atexit(remove_temp_paths) };
    });
    if let Ok(mut paths) = TEMP_PATHS.lock() {
        paths.push(path.to_path_buf());
    }
}

/// `len` bytes of a seeded xorshift stream: large values whose every byte is checkable.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// The seeds a model test runs: `HEADROOM_SEED=N` replays one; otherwise `count` seeds from
/// the clock. Each is printed so a failure can be replayed.
pub fn seeds(test: &str, count: u64) -> Vec<u64> {
    if let Ok(text) = std::env::var("HEADROOM_SEED") {
        let seed = text.parse().expect("HEADROOM_SEED must be a number");
        println!("{test}: replaying seed {seed}");
        return vec![seed];
    }
    let base = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1);
    let seeds: Vec<u64> = (0..count)
        .map(|i| base.wrapping_add(i.wrapping_mul(7919)))
        .collect();
    println!(
        "{test}: seeds {}..(+{count}); replay one with HEADROOM_SEED=<seed>",
        seeds[0]
    );
    seeds
}

/// Runs `body` for every seed, naming the seed in any panic.
pub fn for_each_seed(test: &str, count: u64, mut body: impl FnMut(u64)) {
    for seed in seeds(test, count) {
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(seed)));
        if let Err(panic) = result {
            eprintln!("{test}: FAILED with seed {seed}; replay with HEADROOM_SEED={seed}");
            std::panic::resume_unwind(panic);
        }
    }
}

pub const NR_HUGEPAGES: &str = "/proc/sys/vm/nr_hugepages";

/// The machine's huge page pool resized for a test; the old size comes back on drop, even when
/// the test fails. nr_hugepages is machine-wide: tests that change it run in a binary of
/// their own, or take turns.
pub struct HugePages {
    old: String,
}

impl HugePages {
    /// Sets the pool to `pages`.
    pub fn set(pages: u64) -> HugePages {
        let old = std::fs::read_to_string(NR_HUGEPAGES)
            .unwrap()
            .trim()
            .to_string();
        std::fs::write(NR_HUGEPAGES, pages.to_string()).unwrap();
        HugePages { old }
    }

    /// Adds `pages` to the pool; `None` when the pool cannot be changed (not root).
    pub fn add(pages: u64) -> Option<HugePages> {
        let old = std::fs::read_to_string(NR_HUGEPAGES)
            .ok()?
            .trim()
            .to_string();
        let now: u64 = old.parse().ok()?;
        std::fs::write(NR_HUGEPAGES, (now + pages).to_string()).ok()?;
        Some(HugePages { old })
    }
}

impl Drop for HugePages {
    fn drop(&mut self) {
        let _ = std::fs::write(NR_HUGEPAGES, &self.old);
    }
}

/// A Python interpreter that imports `module`: `$HEADROOM_PYTHON`, the virtual environment
/// `scripts/install-deps` makes (`~/.cache/headroom-venv`), or `python3`. Panics, naming the
/// fix, when none does.
pub fn python_with(module: &str) -> std::path::PathBuf {
    let home = std::env::var_os("HOME").unwrap_or_default();
    let candidates: Vec<std::path::PathBuf> = std::env::var_os("HEADROOM_PYTHON")
        .map(std::path::PathBuf::from)
        .into_iter()
        .chain([
            std::path::Path::new(&home).join(".cache/headroom-venv/bin/python"),
            std::path::PathBuf::from("python3"),
        ])
        .collect();
    for python in &candidates {
        let imports = std::process::Command::new(python)
            .args(["-c", &format!("import {module}")])
            .output()
            .is_ok_and(|out| out.status.success());
        if imports {
            return python.clone();
        }
    }
    panic!("no Python imports {module} (tried {candidates:?}): run scripts/install-deps");
}

/// Waits `pause` as a peer thread of a wake-up test: short pauses spin (the executor under test
/// may still be awake through them), longer ones sleep (it parks), so both orders of "about to
/// sleep" and "woken" happen.
pub fn spin_or_sleep(pause: std::time::Duration) {
    if pause < std::time::Duration::from_micros(20) {
        let until = std::time::Instant::now() + pause;
        while std::time::Instant::now() < until {
            std::hint::spin_loop();
        }
    } else {
        std::thread::sleep(pause);
    }
}

/// Whether the server closed `stream`: writes `probe`, then reads once within the stream's
/// read timeout. `Some(true)`: closed (a failed write, end of stream or a reset);
/// `Some(false)`: it answered; `None`: neither yet (the read timed out).
pub fn closed_by_server(stream: &mut std::net::TcpStream, probe: &[u8]) -> Option<bool> {
    use std::io::{Read, Write};
    if stream.write_all(probe).is_err() {
        return Some(true);
    }
    let mut byte = [0u8; 1];
    match stream.read(&mut byte) {
        Ok(0) => Some(true),
        Ok(_) => Some(false),
        Err(err)
            if matches!(
                err.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            None
        }
        Err(_) => Some(true),
    }
}

/// A client script of `tests/clients/`.
pub fn client_script(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/clients")
        .join(name)
}

/// Runs a client script of `tests/clients/` to its end and checks what it printed: an
/// `ok NAME` line per check, no `FAIL` line, at least `checks_min` checks (a script cut short
/// fails), and `done` last. Lines starting `# ` are notes, printed and not judged. Returns what
/// the script printed.
pub fn run_checks(mut command: std::process::Command, checks_min: usize) -> String {
    let what = format!("{command:?}");
    let out = command
        .output()
        .unwrap_or_else(|err| panic!("{what}: {err}: run scripts/install-deps"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    stdout
        .lines()
        .filter(|l| l.starts_with("# "))
        .for_each(|l| println!("{l}"));
    let judged = || stdout.lines().filter(|l| !l.starts_with("# "));
    let failed: Vec<&str> = judged().filter(|l| !l.starts_with("ok ")).collect();
    let passed = judged().filter(|l| l.starts_with("ok ")).count();
    assert!(
        out.status.success() && failed == ["done"] && passed >= checks_min,
        "{what}: exit {}, {passed} checks passed (at least {checks_min} expected), \
         these lines are not `ok`: {failed:#?}\nstderr: {stderr}",
        out.status
    );
    stdout.into_owned()
}

/// A local port nothing listens on right now (a proxy or relay binds it a moment later).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// An ext4 filesystem of `size_mib` MiB in an image file, loop-mounted for the test and
/// unmounted on drop.
pub struct TinyFs {
    image: std::path::PathBuf,
    pub mount: std::path::PathBuf,
}

impl TinyFs {
    /// The mounted filesystem, or `None` after saying why the test is skipped (not root, or
    /// no loop device): a failure instead under `HEADROOM_REQUIRE_ROOT_TESTS`.
    pub fn or_skip(size_mib: u64) -> Option<TinyFs> {
        let required = std::env::var_os("HEADROOM_REQUIRE_ROOT_TESTS").is_some();
        if !nix::unistd::geteuid().is_root() {
            assert!(
                !required,
                "HEADROOM_REQUIRE_ROOT_TESTS is set but this is not root"
            );
            println!("skipped: loop-mounting a small filesystem needs root");
            return None;
        }
        match TinyFs::new(size_mib) {
            Ok(fs) => Some(fs),
            Err(why) => {
                assert!(
                    !required,
                    "HEADROOM_REQUIRE_ROOT_TESTS is set but no small filesystem could be mounted: {why}"
                );
                println!("skipped: no small filesystem could be mounted: {why}");
                None
            }
        }
    }

    /// The mounted filesystem, or why it could not be made (no `mkfs.ext4`, no loop device).
    pub fn new(size_mib: u64) -> Result<TinyFs, String> {
        let image = fresh_temp_path("tinyfs-image");
        let mount = fresh_temp_path("tinyfs");
        std::fs::File::create(&image)
            .and_then(|f| f.set_len(size_mib << 20))
            .map_err(|err| format!("{}: {err}", image.display()))?;
        let run = |program: &str, args: &[&std::ffi::OsStr]| {
            let out = std::process::Command::new(program)
                .args(args)
                .output()
                .map_err(|err| format!("{program}: {err}"))?;
            if out.status.success() {
                Ok(())
            } else {
                Err(format!(
                    "{program} {args:?}: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                ))
            }
        };
        run(
            "mkfs.ext4",
            &["-q".as_ref(), "-F".as_ref(), image.as_os_str()],
        )?;
        std::fs::create_dir(&mount).map_err(|err| format!("{}: {err}", mount.display()))?;
        let fs = TinyFs { image, mount };
        run(
            "mount",
            &[
                "-o".as_ref(),
                "loop".as_ref(),
                fs.image.as_os_str(),
                fs.mount.as_os_str(),
            ],
        )?;
        Ok(fs)
    }
}

impl Drop for TinyFs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg(&self.mount)
            .status();
        let _ = std::fs::remove_dir(&self.mount);
        let _ = std::fs::remove_file(&self.image);
    }
}

/// An exclusive `flock` on a file, held until dropped: for a test that needs a fixed path that
/// another test process could be using at the same time.
pub struct PathLock(#[allow(dead_code)] nix::fcntl::Flock<std::fs::File>);

impl PathLock {
    pub fn take(path: &std::path::Path) -> PathLock {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .unwrap_or_else(|err| panic!("{}: {err}", path.display()));
        match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive) {
            Ok(lock) => PathLock(lock),
            Err((_, err)) => panic!("flock {}: {err}", path.display()),
        }
    }
}

/// The body of `GET path` over HTTP/1.1 on a fresh connection (the metrics endpoint).
pub fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(20)))
        .unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\n\r\n");
    stream.write_all(request.as_bytes()).unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).unwrap();
    let (_, body) = reply.split_once("\r\n\r\n").expect("a whole response");
    body.to_string()
}
