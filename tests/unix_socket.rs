//! `--unix-socket` through the real binary: pymemcache (text) and the binary protocol with
//! SASL over it, values in RAM and in segments; memccapable through it (over a socat relay:
//! memccapable speaks TCP only); the socket's mode; a second server refused the path; the path
//! removed on a clean stop; STAT `conns`, `settings` and `watch connevents` naming it.

mod common;

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::server::{frame, fresh_data_dir, run_to_exit, set_extras, Server};

fn socket_in(dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    dir.join("hr.sock")
}

/// One text request over `stream`, its reply read until it ends with `end`.
fn call(stream: &mut UnixStream, request: &[u8], end: &[u8]) -> Vec<u8> {
    stream.write_all(request).unwrap();
    let mut reply = Vec::new();
    let mut buf = [0u8; 65536];
    while !reply.ends_with(end) {
        let n = stream.read(&mut buf).expect("a reply");
        assert!(n > 0, "closed after {:?}", String::from_utf8_lossy(&reply));
        reply.extend_from_slice(&buf[..n]);
    }
    reply
}

const PYMEMCACHE_SCRIPT: &str = r#"
import os, random, sys
from pymemcache.client.base import Client
c = Client(sys.argv[1], connect_timeout=5, timeout=10, default_noreply=False)
def check(name, got, want):
    print(f"ok {name}" if got == want else f"FAIL {name}: got {got!r:.200} want {want!r:.200}", flush=True)
rng = random.Random(31)
values = {f"size-{n}": rng.randbytes(n) for n in [0, 1, 1000, 262144, 262145, 3 << 20]}
check("set every size", [k for k, v in values.items() if not c.set(k, v)], [])
check("get every size", [k for k, v in values.items() if c.get(k) != v], [])
check("get_many", c.get_many(list(values) + ["never-set"]) == values, True)
value, token = c.gets("size-1")
check("cas stale", c.cas("size-1", b"x", int(token) + 1), False)
check("cas current", c.cas("size-1", b"y", token), True)
check("append past 256 KiB", c.append("size-262144", b"tail"), True)
check("appended", c.get("size-262144") == values["size-262144"] + b"tail", True)
check("meta", c.raw_command(b"ms meta 2 T0\r\nhi\r\nmg meta v\r\nmn", b"MN\r\n"), b"HD\r\nVA 2\r\nhi\r\n")
print("done")
"#;

#[test]
fn every_protocol_is_served_over_the_unix_socket() {
    let dir = fresh_data_dir();
    let sock = socket_in(&dir.join("run"));
    let sock_arg = sock.display().to_string();
    let passwords = dir.join("passwords");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(&passwords, "alice:wonderland\n").unwrap();
    let server = Server::start_in(
        &dir,
        &[
            "--unix-socket",
            &sock_arg,
            "--threads",
            "2",
            "--max-item-size",
            "8M",
        ],
    );
    // Its owner only, as memcached's -a default.
    let mode = std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700);

    let mut python = Command::new(common::python_with("pymemcache"));
    python.args(["-c", PYMEMCACHE_SCRIPT, &sock_arg]);
    common::run_checks(python, 8);

    // The binary protocol: a SET and a GET on the same socket.
    let mut binary = UnixStream::connect(&sock).unwrap();
    binary
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let value = common::pattern(5, 300_000);
    binary
        .write_all(&frame(0x01, &set_extras(7, 0), b"bin", &value, 0, 0))
        .unwrap();
    binary
        .write_all(&frame(0x00, &[], b"bin", &[], 0, 0))
        .unwrap();
    let mut header = [0u8; 24];
    binary.read_exact(&mut header).unwrap();
    assert_eq!((header[0], header[7]), (0x81, 0), "SET status");
    binary.read_exact(&mut header).unwrap();
    assert_eq!((header[0], header[7]), (0x81, 0), "GET status");
    let body = u32::from_be_bytes(header[8..12].try_into().unwrap()) as usize;
    let mut got = vec![0u8; body];
    binary.read_exact(&mut got).unwrap();
    assert_eq!(&got[4..], &value[..], "the value over the binary protocol");

    // Text sees the same store, and STAT names the socket.
    let mut text = UnixStream::connect(&sock).unwrap();
    let settings = call(&mut text, b"stats settings\r\n", b"END\r\n");
    let settings = String::from_utf8_lossy(&settings);
    assert!(
        settings.contains(&format!("STAT domain_socket {sock_arg}\r\n")),
        "{settings}"
    );
    assert!(settings.contains("STAT umask 700\r\n"), "{settings}");
    let conns =
        String::from_utf8_lossy(&call(&mut text, b"stats conns\r\n", b"END\r\n")).into_owned();
    assert!(
        conns.contains(&format!(":listen_addr unix:{sock_arg}\r\n")),
        "{conns}"
    );
    let general = String::from_utf8_lossy(&call(&mut text, b"stats\r\n", b"END\r\n")).into_owned();
    assert!(
        general.contains(&format!("STAT listen_unix {sock_arg}\r\n")),
        "{general}"
    );
    // A second server cannot take the path.
    let other = fresh_data_dir();
    let (status, stderr, _) = run_to_exit(
        &[
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            &other.display().to_string(),
            "--unix-socket",
            &sock_arg,
        ],
        Duration::from_secs(30),
    );
    assert_eq!(status, Some(1), "{stderr}");
    assert!(stderr.contains("another server is serving it"), "{stderr}");
    // `watch connevents` says `transport=local` for its clients.
    let mut watcher = UnixStream::connect(&sock).unwrap();
    assert_eq!(
        call(&mut watcher, b"watch connevents\r\n", b"\r\n"),
        b"OK\r\n"
    );
    let mut client = UnixStream::connect(&sock).unwrap();
    assert_eq!(
        call(&mut client, b"version\r\n", b"\r\n"),
        b"VERSION 1.6.45\r\n"
    );
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    watcher
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    while line.last() != Some(&b'\n') {
        watcher.read_exact(&mut byte).unwrap();
        line.push(byte[0]);
    }
    let line = String::from_utf8(line).unwrap();
    assert!(
        line.contains("type=conn_new rip=unix rport=0 transport=local cfd="),
        "{line}"
    );
    drop((text, binary, watcher, client));
    // A clean stop removes the path.
    assert_eq!(server.stop().code(), Some(0));
    assert!(!sock.exists(), "the socket outlived a clean stop");
}

#[test]
fn sasl_guards_the_unix_socket_and_its_mode_is_configurable() {
    let dir = fresh_data_dir();
    let sock = socket_in(&dir.join("run"));
    let sock_arg = sock.display().to_string();
    std::fs::create_dir_all(&dir).unwrap();
    let passwords = dir.join("passwords");
    std::fs::write(&passwords, "alice:wonderland\n").unwrap();
    let passwords = passwords.display().to_string();
    let server = Server::start_in(
        &dir,
        &[
            "--unix-socket",
            &sock_arg,
            "--unix-socket-mode",
            "0770",
            "--sasl-password-file",
            &passwords,
        ],
    );
    let mode = std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o770);
    // Text before authentication: refused, as on TCP; then authenticated by a `set`.
    let mut text = UnixStream::connect(&sock).unwrap();
    assert_eq!(
        call(&mut text, b"get k\r\n", b"\r\n"),
        b"CLIENT_ERROR unauthenticated\r\n"
    );
    assert_eq!(
        call(&mut text, b"set u 0 0 16\r\nalice wonderland\r\n", b"\r\n"),
        b"STORED\r\n"
    );
    assert_eq!(call(&mut text, b"get k\r\n", b"\r\n"), b"END\r\n");
    drop(server);
}

/// memccapable speaks TCP only: socat relays a local port onto the unix socket.
#[test]
fn memccapable_passes_over_the_unix_socket() {
    let Some(socat) = ["socat", "/usr/bin/socat"]
        .iter()
        .find(|s| Command::new(s).arg("-V").output().is_ok())
    else {
        panic!("socat is missing: run scripts/install-deps");
    };
    let memccapable = "memccapable"; // Debian's libmemcached-tools
    let dir = fresh_data_dir();
    let sock = socket_in(&dir.join("run"));
    let sock_arg = sock.display().to_string();
    let _server = Server::start_in(&dir, &["--unix-socket", &sock_arg]);
    let port = common::free_port();
    let mut relay = Command::new(socat)
        .arg(format!("TCP-LISTEN:{port},bind=127.0.0.1,reuseaddr,fork"))
        .arg(format!("UNIX-CONNECT:{sock_arg}"))
        .spawn()
        .unwrap();
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    for _ in 0..200 {
        if std::net::TcpStream::connect(addr).is_ok() {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = Command::new(memccapable)
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-b", "-t", "10"])
        .output()
        .expect("memccapable (libmemcached-tools): run scripts/install-deps");
    let _ = relay.kill();
    let _ = relay.wait();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "memccapable -b: {said}");
    assert!(said.contains("All tests passed"), "{said}");
}
