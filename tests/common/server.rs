//! Starting the real `headroom` binary for a test, and a plain binary-protocol client.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A running server, stopped (SIGTERM, then waited for) on drop.
pub struct Server {
    pub addr: SocketAddr,
    pub data_dir: std::path::PathBuf,
    /// `--admin-socket` (every test server opens one, in its data directory).
    pub admin_socket: std::path::PathBuf,
    child: Option<Child>,
    pub log: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Server {
    /// Starts `headroom --listen 127.0.0.1:0 ARGS...` (with its data directory under the
    /// system temp directory) and waits until it listens.
    /// The directory goes when the test binary exits (`fresh_temp_path`).
    pub fn start(args: &[&str]) -> Server {
        Server::start_in(&fresh_data_dir(), args)
    }

    /// Starts a server on an existing data directory (a warm restart reuses one).
    pub fn start_in(data_dir: &std::path::Path, args: &[&str]) -> Server {
        Server::start_command(&[], data_dir, args)
    }

    /// Starts the server under a command prefix (`setpriv ...` to run it as another user).
    /// `HEADROOM_TEST_IO_RING=off` runs every test server on the plain data path;
    /// `HEADROOM_TEST_MULTISHOT=off` runs the ring path with one receive per read, and
    /// `HEADROOM_TEST_RING_SLEEP=off` with shards that sleep in glommio's ring.
    pub fn start_command(prefix: &[&str], data_dir: &std::path::Path, args: &[&str]) -> Server {
        Server::start_binary(env!("CARGO_BIN_EXE_headroom"), prefix, data_dir, args)
    }

    /// As [`Server::start_command`], with another binary (the VM tests run `/test/headroom`).
    pub fn start_binary(
        binary: &str,
        prefix: &[&str],
        data_dir: &std::path::Path,
        args: &[&str],
    ) -> Server {
        let data_dir = data_dir.to_path_buf();
        let mut command = match prefix.split_first() {
            Some((program, rest)) => {
                let mut c = Command::new(program);
                c.args(rest).arg(binary);
                c
            }
            None => Command::new(binary),
        };
        if let Ok(ring) = std::env::var("HEADROOM_TEST_IO_RING") {
            if !args.contains(&"--io-ring") {
                command.args(["--io-ring", &ring]);
            }
        }
        if let Ok(multishot) = std::env::var("HEADROOM_TEST_MULTISHOT") {
            if !args.contains(&"--multishot-receive") {
                command.args(["--multishot-receive", &multishot]);
            }
        }
        if let Ok(sleep) = std::env::var("HEADROOM_TEST_RING_SLEEP") {
            if !args.contains(&"--ring-sleep") {
                command.args(["--ring-sleep", &sleep]);
            }
        }
        // The suite runs as root in CI: every test server stays root unless a test names a user.
        if !args.contains(&"--user") {
            command.arg("--allow-root");
        }
        let admin_socket = data_dir.join("admin.sock");
        if !args.contains(&"--admin-socket") {
            command.arg("--admin-socket").arg(&admin_socket);
        }
        // Any free port, unless the test names one (a server restarted where a proxy expects it).
        if !args.contains(&"--listen") {
            command.args(["--listen", "127.0.0.1:0"]);
        }
        let mut child = command
            .args(["--log-level", "info"])
            .arg("--data-dir")
            .arg(&data_dir)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start headroom");
        let stderr = child.stderr.take().unwrap();
        let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let log_writer = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(at) = line.find("listening on ") {
                    // The first address (`listening on A, B ...` with several).
                    let addr = line[at + 13..]
                        .split_whitespace()
                        .next()
                        .unwrap()
                        .trim_end_matches(',')
                        .to_string();
                    let _ = tx.send(addr);
                }
                log_writer.lock().unwrap().push(line);
            }
        });
        let addr = match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(addr) => match addr.parse() {
                Ok(addr) => addr,
                // Not left running: the panic below drops no `Server` to stop it.
                Err(err) => {
                    let _ = child.kill();
                    panic!("the start-up line names no address ({addr:?}: {err})");
                }
            },
            Err(_) => {
                let _ = child.kill();
                panic!("headroom did not start: {:?}", log.lock().unwrap());
            }
        };
        Server {
            addr,
            data_dir,
            admin_socket,
            child: Some(child),
            log,
        }
    }

    /// Runs one command on the admin socket: `Ok(text)` for `OK text`, `Err(reason)` for
    /// `ERROR reason`.
    pub fn admin(&self, command: &str) -> Result<String, String> {
        admin_command(&self.admin_socket, command)
    }

    pub fn client(&self) -> Client {
        Client::connect(self.addr)
    }

    /// Sends SIGTERM and returns the exit status.
    pub fn stop(mut self) -> std::process::ExitStatus {
        let mut child = self.child.take().unwrap();
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::SIGTERM,
        )
        .unwrap();
        child.wait().unwrap()
    }

    /// Sends SIGTERM and returns the exit status and the whole log (what the stop wrote too).
    #[allow(dead_code)] // not every test binary reads the stop's log
    pub fn stop_logged(mut self) -> (std::process::ExitStatus, String) {
        let mut child = self.child.take().unwrap();
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::SIGTERM,
        )
        .unwrap();
        let status = child.wait().unwrap();
        // The log is read by another thread: wait for the last line the stop writes.
        for _ in 0..100 {
            if self.log_text().contains("stopped") {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        (status, self.log_text())
    }

    /// Sends `signal` and, for a stop signal, returns the exit status.
    pub fn stop_with(mut self, signal: nix::sys::signal::Signal) -> std::process::ExitStatus {
        let mut child = self.child.take().unwrap();
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), signal).unwrap();
        child.wait().unwrap()
    }

    /// Waits up to `limit` for the server to exit by itself (a `shutdown` command): its exit
    /// status, or `None` while it still runs (it is then stopped on drop, as ever).
    #[allow(dead_code)] // not every test binary waits for a server to stop itself
    pub fn wait_exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let started = std::time::Instant::now();
        while started.elapsed() < limit {
            let child = self.child.as_mut().expect("a running server");
            if let Some(status) = child.try_wait().unwrap() {
                self.child = None;
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// Freezes the whole server (SIGSTOP) and returns once every one of its threads is
    /// stopped: `kill` returns before they are, and a shard still running could take a request
    /// sent meanwhile. SIGCONT (`signal`) lets it go.
    #[allow(dead_code)] // not every test binary freezes a server
    pub fn freeze(&self) {
        self.signal(nix::sys::signal::SIGSTOP);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let all_stopped = || {
            std::fs::read_dir(format!("/proc/{}/task", self.pid()))
                .unwrap()
                .all(|task| {
                    let stat = std::fs::read_to_string(task.unwrap().path().join("stat"))
                        .unwrap_or_default();
                    // The state follows the command name's closing parenthesis.
                    stat.rsplit_once(") ")
                        .is_some_and(|(_, rest)| rest.starts_with('T') || rest.starts_with('t'))
                })
        };
        while !all_stopped() {
            assert!(
                std::time::Instant::now() < deadline,
                "the server never stopped"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    /// Sends `signal` and leaves the server running.
    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid() as i32), signal).unwrap();
    }

    /// The metrics endpoint's address (`--metrics-listen`), from the start-up log line
    /// `metrics on http://ADDR/metrics`.
    pub fn metrics_addr(&self) -> SocketAddr {
        assert!(self.logs("metrics on http://"), "{}", self.log_text());
        let log = self.log_text();
        let at = log.find("metrics on http://").unwrap() + "metrics on http://".len();
        let addr = &log[at..];
        addr[..addr.find('/').unwrap()].parse().unwrap()
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    pub fn log_text(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    /// Whether the server logs a line containing `pattern` within five seconds (its log is read
    /// by another thread, so a line just written may not be here yet).
    pub fn logs(&self, pattern: &str) -> bool {
        for _ in 0..100 {
            if self.log_text().contains(pattern) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }
}

/// Runs the `headroom` binary to its end (killed after `limit`): exit status (None when killed),
/// stderr, and how long it ran.
pub fn run_to_exit(args: &[&str], limit: Duration) -> (Option<i32>, String, Duration) {
    let started = std::time::Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_headroom"))
        .args(args)
        .args((!args.contains(&"--user")).then_some("--allow-root"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start headroom");
    let mut stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status.code();
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let elapsed = started.elapsed();
    (status, reader.join().unwrap(), elapsed)
}

/// Sends one line to an admin socket and reads the reply line.
pub fn admin_command(socket: &std::path::Path, command: &str) -> Result<String, String> {
    let mut stream = std::os::unix::net::UnixStream::connect(socket)
        .unwrap_or_else(|err| panic!("admin socket {}: {err}", socket.display()));
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    writeln!(stream, "{command}").unwrap();
    let mut line = String::new();
    BufReader::new(&stream).read_line(&mut line).unwrap();
    let line = line.trim_end();
    if let Some(text) = line.strip_prefix("OK ") {
        Ok(text.to_string())
    } else if let Some(reason) = line.strip_prefix("ERROR ") {
        Err(reason.to_string())
    } else {
        panic!("not an admin reply: {line:?}")
    }
}

/// A data directory no other test, and no earlier run, used.
pub fn fresh_data_dir() -> std::path::PathBuf {
    super::fresh_temp_path("test")
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(child.id() as i32),
                nix::sys::signal::SIGTERM,
            );
            let _ = child.wait();
        }
    }
}

/// One response frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    pub opcode: u8,
    pub status: u16,
    pub opaque: u32,
    pub cas: u64,
    pub extras: Vec<u8>,
    pub key: Vec<u8>,
    pub value: Vec<u8>,
}

impl Response {
    pub fn flags(&self) -> u32 {
        u32::from_be_bytes(self.extras[..4].try_into().unwrap())
    }

    pub fn counter(&self) -> u64 {
        u64::from_be_bytes(self.value[..8].try_into().unwrap())
    }
}

/// Encodes a request frame.
pub fn frame(
    opcode: u8,
    extras: &[u8],
    key: &[u8],
    value: &[u8],
    cas: u64,
    opaque: u32,
) -> Vec<u8> {
    let mut out = Vec::new();
    headroom::proto::write_request(&mut out, opcode, (extras, key, value), opaque, cas);
    out
}

pub fn set_extras(flags: u32, expiry: u32) -> Vec<u8> {
    let mut extras = flags.to_be_bytes().to_vec();
    extras.extend_from_slice(&expiry.to_be_bytes());
    extras
}

pub fn arith_extras(delta: u64, initial: u64, expiry: u32) -> Vec<u8> {
    let mut extras = delta.to_be_bytes().to_vec();
    extras.extend_from_slice(&initial.to_be_bytes());
    extras.extend_from_slice(&expiry.to_be_bytes());
    extras
}

pub struct Client {
    pub stream: TcpStream,
}

impl Client {
    pub fn connect(addr: SocketAddr) -> Client {
        let stream = TcpStream::connect(addr).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        stream.set_nodelay(true).unwrap();
        Client { stream }
    }

    pub fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).unwrap();
    }

    /// Reads one response; `None` when the server closed the connection.
    pub fn recv(&mut self) -> Option<Response> {
        let mut header = [0u8; 24];
        if let Err(err) = self.stream.read_exact(&mut header) {
            assert!(
                matches!(
                    err.kind(),
                    std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::ConnectionReset
                ),
                "read failed: {err}"
            );
            return None;
        }
        assert_eq!(header[0], 0x81, "response magic");
        let key_len = u16::from_be_bytes([header[2], header[3]]) as usize;
        let extras_len = header[4] as usize;
        let body_len = u32::from_be_bytes(header[8..12].try_into().unwrap()) as usize;
        let mut body = vec![0u8; body_len];
        self.stream.read_exact(&mut body).unwrap();
        Some(Response {
            opcode: header[1],
            status: u16::from_be_bytes([header[6], header[7]]),
            opaque: u32::from_be_bytes(header[12..16].try_into().unwrap()),
            cas: u64::from_be_bytes(header[16..24].try_into().unwrap()),
            extras: body[..extras_len].to_vec(),
            key: body[extras_len..extras_len + key_len].to_vec(),
            value: body[extras_len + key_len..].to_vec(),
        })
    }

    pub fn call(&mut self, bytes: &[u8]) -> Response {
        self.send(bytes);
        self.recv().expect("a response")
    }

    /// True when the server closed the connection (EOF or reset) within the read timeout;
    /// false when it sent a byte or stayed silent.
    pub fn closed(&mut self) -> bool {
        let mut byte = [0u8; 1];
        match self.stream.read(&mut byte) {
            Ok(0) => true,
            Ok(_) => false,
            Err(err) => matches!(
                err.kind(),
                std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::ConnectionAborted
            ),
        }
    }

    pub fn set(&mut self, key: &[u8], value: &[u8], flags: u32, expiry: u32) -> Response {
        self.call(&frame(0x01, &set_extras(flags, expiry), key, value, 0, 0))
    }

    /// A SET (or another store opcode) whose value goes out in 1 MiB pieces, as a real client
    /// streams a large one.
    pub fn set_streamed(&mut self, opcode: u8, key: &[u8], value: &[u8], flags: u32) -> Response {
        let mut head = frame(opcode, &set_extras(flags, 0), key, &[], 0, 1);
        let body_len = (8 + key.len() + value.len()) as u32;
        head[8..12].copy_from_slice(&body_len.to_be_bytes());
        self.send(&head);
        for piece in value.chunks(1 << 20) {
            self.stream.write_all(piece).unwrap();
        }
        self.recv().expect("a reply")
    }

    pub fn get(&mut self, key: &[u8]) -> Response {
        self.call(&frame(0x00, &[], key, &[], 0, 0))
    }

    /// STAT with no key: every counter as (name, value).
    /// Bytes in use over every store target (STAT `segments`).
    pub fn segment_used(&mut self) -> u64 {
        self.stats("segments")
            .iter()
            .filter(|(n, _)| n.ends_with("_used"))
            .map(|(_, v)| v.parse::<u64>().unwrap())
            .sum()
    }

    pub fn stats(&mut self, group: &str) -> Vec<(String, String)> {
        self.send(&frame(0x10, &[], group.as_bytes(), &[], 0, 0));
        let mut out = Vec::new();
        loop {
            let r = self.recv().expect("stat reply");
            if r.key.is_empty() {
                return out;
            }
            out.push((
                String::from_utf8(r.key).unwrap(),
                String::from_utf8(r.value).unwrap(),
            ));
        }
    }

    pub fn stat(&mut self, group: &str, name: &str) -> u64 {
        let stats = self.stats(group);
        stats
            .iter()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("no stat {name}"))
            .1
            .parse()
            .unwrap()
    }
}

/// Reads a text-protocol reply from `stream`: until it holds at least `at_least` bytes and
/// ends with `end` (`b"END\r\n"`, `b"MN\r\n"`). The length guard keeps a value that happens to
/// end with the terminator from cutting the read short.
pub fn read_text_reply(stream: &mut TcpStream, end: &[u8], at_least: usize) -> Vec<u8> {
    let mut reply = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    while reply.len() < at_least || !reply.ends_with(end) {
        let n = stream.read(&mut buf).expect("a text reply");
        assert!(
            n > 0,
            "closed mid-reply after {:?}",
            String::from_utf8_lossy(&reply)
        );
        reply.extend_from_slice(&buf[..n]);
    }
    reply
}
