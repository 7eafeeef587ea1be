//! A stock memcached started for a test on a free loopback port (as `nobody` when the test runs
//! as root, since memcached refuses root), killed on drop.
#![allow(dead_code)]

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Memcached {
    child: Child,
    pub addr: SocketAddr,
}

impl Memcached {
    /// Starts `program` with `args` beside the port and address, and waits until it listens.
    pub fn start(program: &Path, args: &[&str]) -> Memcached {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut command = Command::new(program);
        command.args(["-p", &port.to_string(), "-U", "0", "-l", "127.0.0.1"]);
        command.args(args);
        if nix::unistd::geteuid().is_root() {
            command.args(["-u", "nobody"]);
        }
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|err| panic!("start {}: {err}", program.display()));
        let memcached = Memcached {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(memcached.addr).is_err() {
            assert!(Instant::now() < deadline, "memcached did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        memcached
    }
}

impl Drop for Memcached {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// memcached 1.6.45 from the peers directory (`$HEADROOM_PEERS_DIR`, else
/// `~/.cache/headroom-peers`, where `../shared/peers/build` and `scripts/install-deps` put it),
/// if it is there.
pub fn peers_memcached() -> Option<PathBuf> {
    let dir = std::env::var_os("HEADROOM_PEERS_DIR")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache/headroom-peers"))
        })?;
    Some(dir.join("memcached")).filter(|path| path.is_file())
}
