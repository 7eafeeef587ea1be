//! memcached 1.6.45's built-in proxy (`memcached-proxy`, its route library `routelib`) in front
//! of three Headroom servers, as `docs/scale-out.md` configures it: keys spread over every
//! backend, pymemcache and meta commands through it byte-exact, a backend stopped (what the
//! proxy answers for its keys meanwhile, the others served) and restarted on its port (served
//! again, nothing wrong in between or after).
//!
//! `scripts/install-deps` builds `memcached-proxy` from `../shared/peers` into
//! `~/.cache/headroom-peers`. Without it (and without the tarball to build it from) the test says
//! so and passes; where the build script is there, a missing proxy fails it.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::server::{fresh_data_dir, Server};

/// The proxy binary, or why there is none.
fn memcached_proxy() -> Result<PathBuf, String> {
    let peers = std::env::var_os("HEADROOM_PEERS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(&std::env::var_os("HOME").unwrap_or_default()).join(".cache/headroom-peers")
        });
    let binary = peers.join("memcached-proxy");
    if binary.is_file() {
        return Ok(binary);
    }
    let build = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/peers/build");
    assert!(
        !build.exists(),
        "{} is missing: run scripts/install-deps (it builds it with {})",
        binary.display(),
        build.display()
    );
    Err(format!(
        "no {} and no {} to build it",
        binary.display(),
        build.display()
    ))
}

/// routelib's configuration: one pool of the backends (keys hashed by the pool, XXH3 and jump
/// hash), every command routed to it; a dead backend retried every 0.25 s instead of every 3 s.
fn routelib_config(backends: &[SocketAddr]) -> String {
    let list: String = backends
        .iter()
        .map(|b| format!("        \"{b}\",\n"))
        .collect();
    format!(
        "settings{{\n    backend_options = {{ retrytimeout = 0.25 }},\n}}\n\
         pools{{\n    main = {{\n        backends = {{\n{list}        }}\n    }}\n}}\n\
         routes{{\n    default = route_direct{{ child = \"main\" }}\n}}\n"
    )
}

/// A running proxy, killed on drop even when the test fails.
struct Proxy {
    child: Child,
    addr: SocketAddr,
}

impl Proxy {
    fn start(binary: &Path, config: &Path) -> Proxy {
        let port = common::free_port();
        let mut command = Command::new(binary);
        command.args([
            "-l",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-U",
            "0",
            "-t",
            "2",
        ]);
        if nix::unistd::geteuid().is_root() {
            command.args(["-u", "nobody"]);
        }
        let mut child = command
            .arg("-o")
            .arg(format!(
                "proxy_config=routelib,proxy_arg={}",
                config.display()
            ))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start memcached-proxy");
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let started = Instant::now();
        while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
            if let Some(status) = child.try_wait().unwrap() {
                let mut said = String::new();
                let _ = child.stderr.take().unwrap().read_to_string(&mut said);
                panic!("memcached-proxy exited ({status}): {said}");
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "memcached-proxy never listened on {addr}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Proxy { child, addr }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One text request, and its reply read until it ends with `end` (or 10 s pass).
fn call(addr: SocketAddr, request: &[u8], end: &[u8]) -> Vec<u8> {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream.write_all(request).unwrap();
    let mut reply = Vec::new();
    let mut buf = [0u8; 65536];
    while !reply.ends_with(end) {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => reply.extend_from_slice(&buf[..n]),
        }
    }
    reply
}

/// `c<digits>` tokens in meta replies replaced by `c#`: CAS values differ between servers.
fn mask_cas(reply: &[u8]) -> String {
    let text = String::from_utf8_lossy(reply);
    let mut out = String::with_capacity(text.len());
    for (i, line) in text.split("\r\n").enumerate() {
        if i > 0 {
            out.push_str("\r\n");
        }
        let masked: Vec<String> = line
            .split(' ')
            .map(|token| match token.strip_prefix('c') {
                Some(digits)
                    if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) =>
                {
                    "c#".to_string()
                }
                _ => token.to_string(),
            })
            .collect();
        out.push_str(&masked.join(" "));
    }
    out
}

/// A meta pipeline for one key, ended by `mn`: sets, reads with every return flag, counters,
/// quiet misses, an invalidation, a delete.
fn meta_session(key: &str) -> Vec<u8> {
    format!(
        "ms {key} 5 T0 F7\r\nhello\r\n\
         mg {key} v f t s k O42\r\n\
         mg {key} c q\r\n\
         ms {key} 3 MA\r\nabc\r\n\
         mg {key} v s\r\n\
         mg {key}-missing v q\r\n\
         ma {key}-n N0 J10 D5 v\r\n\
         ma {key}-n MD D20 v\r\n\
         md {key} I T30\r\n\
         mg {key} v c\r\n\
         md {key} q\r\n\
         mg {key} v\r\n\
         mn\r\n"
    )
    .into_bytes()
}

#[test]
fn memcached_proxy_spreads_keys_over_three_servers_and_survives_a_restart() {
    let binary = match memcached_proxy() {
        Ok(binary) => binary,
        Err(why) => {
            println!("skipped: {why}");
            return;
        }
    };
    let args = ["--threads", "1", "--memory", "64M", "--max-item-size", "8M"];
    let mut backends: Vec<Server> = (0..3).map(|_| Server::start(&args)).collect();
    let addrs: Vec<SocketAddr> = backends.iter().map(|b| b.addr).collect();
    let dir = fresh_data_dir();
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("proxy.lua");
    std::fs::write(&config, routelib_config(&addrs)).unwrap();
    let proxy = Proxy::start(&binary, &config);
    let proxy_arg = proxy.addr.to_string();
    let python = common::python_with("pymemcache");
    let app = |phase: &str| {
        let mut command = Command::new(&python);
        command
            .arg(common::client_script("proxy_app.py"))
            .args([phase, &proxy_arg]);
        command
    };

    // pymemcache through the proxy; every backend holds a share of the keys.
    common::run_checks(app("fill"), 17);
    let items: Vec<u64> = backends
        .iter()
        .map(|b| b.client().stat("", "curr_items"))
        .collect();
    assert_eq!(items.iter().sum::<u64>(), 503, "per backend: {items:?}");
    assert!(items.iter().all(|&n| n > 100), "per backend: {items:?}");

    // Meta commands through the proxy answer as a server answers them directly.
    let reference = Server::start(&args);
    for key in ["meta-a", "meta-b", "meta-c", "meta-d"] {
        let session = meta_session(key);
        let through = call(proxy.addr, &session, b"MN\r\n");
        let direct = call(reference.addr, &session, b"MN\r\n");
        assert_eq!(mask_cas(&through), mask_cas(&direct), "{key}");
        let want_start = format!("HD\r\nVA 5 f7 t-1 s5 k{key} O42\r\nhello\r\n");
        assert!(
            through.starts_with(want_start.as_bytes()) && through.ends_with(b"EN\r\nMN\r\n"),
            "{key}: {}",
            String::from_utf8_lossy(&through)
        );
    }
    drop(reference);

    // Which backend holds which key, asked of each directly.
    let holder = |key: &str| -> Option<usize> {
        let request = format!("mg {key} k\r\n");
        backends
            .iter()
            .position(|b| call(b.addr, request.as_bytes(), b"\r\n").starts_with(b"HD"))
    };
    let keys: Vec<String> = (0..500).map(|i| format!("key-{i}")).collect();
    let held: Vec<usize> = keys.iter().map(|k| holder(k).expect(k)).collect();

    // Stop backend 1: its keys answer an error through the proxy, never a value; the other
    // backends' keys are still served.
    let stopped = 1;
    let stopped_addr = backends[stopped].addr;
    let data_dir = backends[stopped].data_dir.clone();
    let backend = backends.remove(stopped);
    assert_eq!(backend.stop().code(), Some(0));
    for (key, &at) in keys.iter().zip(&held).take(60) {
        let reply = call(proxy.addr, format!("mg {key} v\r\n").as_bytes(), b"\r\n");
        if at == stopped {
            // memcached-proxy 1.6.45 says `SERVER_ERROR backend failure`.
            assert!(
                reply.starts_with(b"SERVER_ERROR"),
                "{key} on the stopped backend: {:?}",
                String::from_utf8_lossy(&reply)
            );
        } else {
            assert!(reply.starts_with(b"VA "), "{key}: {reply:?}");
        }
    }

    // Restart it on its port and data directory: the proxy serves it again within its retry
    // time, and every value read through the proxy is the one stored or a miss.
    let listen = stopped_addr.to_string();
    let mut restart_args = args.to_vec();
    restart_args.extend(["--listen", &listen]);
    let restarted = Server::start_in(&data_dir, &restart_args);
    let key_there = keys[held.iter().position(|&at| at == stopped).unwrap()].clone();
    let started = Instant::now();
    loop {
        let reply = call(
            proxy.addr,
            format!("mg {key_there} v\r\n").as_bytes(),
            b"\r\n",
        );
        if !reply.starts_with(b"SERVER_ERROR") {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the proxy never served the restarted backend"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    println!(
        "the proxy served the restarted backend after {:?}",
        started.elapsed()
    );
    common::run_checks(app("after"), 5);
    drop(proxy);
    drop(restarted);
}
