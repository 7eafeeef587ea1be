//! Safe to run: start-up failures exit 1 with one sentence before start-up's slow work; one
//! server per address, data directory and segment file; ADMIN only on the admin socket, which
//! mounts only labelled files inside the allowed directories and never writes a foreign file;
//! SASL PLAIN (our client and a real client library), nothing served before it, guessing cut
//! off after three failures; SIGHUP survives and reopens the log, SIGUSR1 stops gracefully with
//! the warm-restart snapshot, a stop signal during start-up is honoured, a start-up that stalls
//! says which shards it is waiting for.

mod common;

use std::time::Duration;

use common::pattern;
use common::server::{frame, fresh_data_dir, run_to_exit, set_extras, Server};
use nix::sys::signal::Signal;

const SASL_LIST_MECHS: u8 = 0x20;
const SASL_AUTH: u8 = 0x21;
const ADMIN: u8 = 0x42;
const STATUS_AUTH_ERROR: u16 = 0x20;
const STATUS_NOT_SUPPORTED: u16 = 0x83;

fn dir_arg(dir: &std::path::Path) -> String {
    dir.display().to_string()
}

/// The address is checked before start-up's slow work: the server exits having mapped nothing
/// and created no segment.
fn failed_before_start_up(stderr: &str, dir: &std::path::Path) {
    assert!(
        !stderr.contains("region mapped"),
        "mapped before binding: {stderr}"
    );
    assert!(
        !dir.join("segment-0").exists(),
        "a segment was created before binding: {stderr}"
    );
}

#[test]
fn a_bind_failure_exits_1_before_start_up_with_one_sentence() {
    // Another program (no SO_REUSEPORT) holds the address. The limit only bounds a hang.
    let holder = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = holder.local_addr().unwrap().to_string();
    let dir = fresh_data_dir();
    let (status, stderr, _) = run_to_exit(
        &["--listen", &addr, "--data-dir", &dir_arg(&dir)],
        Duration::from_secs(60),
    );
    assert_eq!(status, Some(1), "{stderr}");
    let line = stderr.lines().last().unwrap();
    assert!(
        line.starts_with(&format!(
            "headroom: --listen {addr}: the address is already served by "
        )) && line.contains(&format!("pid {}", std::process::id())),
        "{stderr}"
    );
    failed_before_start_up(&stderr, &dir);

    // An address no interface has (TEST-NET-3).
    let (status, stderr, _) = run_to_exit(
        &[
            "--listen",
            "203.0.113.7:11211",
            "--data-dir",
            &dir_arg(&dir),
        ],
        Duration::from_secs(60),
    );
    assert_eq!(status, Some(1), "{stderr}");
    assert!(
        stderr.contains("--listen 203.0.113.7:11211: no interface of this machine has the address"),
        "{stderr}"
    );
    failed_before_start_up(&stderr, &dir);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn one_server_per_address_data_dir_and_segment_file() {
    let first = Server::start(&["--threads", "2"]);
    let addr = first.addr.to_string();
    let pid = format!("pid {}", first.pid());

    // The same address (SO_REUSEPORT would let it in): refused.
    let other_dir = fresh_data_dir();
    let (status, stderr, _) = run_to_exit(
        &["--listen", &addr, "--data-dir", &dir_arg(&other_dir)],
        Duration::from_secs(10),
    );
    assert_eq!(status, Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "--listen {addr}: the address is already served by headroom ({pid})"
        )),
        "{stderr}"
    );
    // Clients still reach one cache only: the first server.
    let mut c = first.client();
    assert_eq!(c.set(b"k", b"v", 0, 0).status, 0);
    for _ in 0..20 {
        assert_eq!(first.client().get(b"k").value, b"v");
    }

    // The same data directory: refused, naming the holder.
    let (status, stderr, _) = run_to_exit(
        &[
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            &dir_arg(&first.data_dir),
        ],
        Duration::from_secs(10),
    );
    assert_eq!(status, Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "--data-dir {}: in use by another Headroom (headroom, {pid})",
            first.data_dir.display()
        )),
        "{stderr}"
    );

    // The same segment file from another data directory: refused, the file untouched.
    let segment = first.data_dir.join("segment-0");
    let before = std::fs::read(&segment).unwrap().len();
    let (status, stderr, _) = run_to_exit(
        &[
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            &dir_arg(&other_dir),
            "--segment",
            &format!("file:{},size=64M", segment.display()),
        ],
        Duration::from_secs(10),
    );
    assert_eq!(status, Some(1), "{stderr}");
    assert!(
        stderr.contains("in use by another process") && stderr.contains(&pid),
        "{stderr}"
    );
    assert_eq!(std::fs::read(&segment).unwrap().len(), before);
    assert_eq!(first.stop().code(), Some(0));
    let _ = std::fs::remove_dir_all(other_dir);
}

#[test]
fn admin_is_refused_on_data_connections_and_served_on_the_socket() {
    let server = Server::start(&["--threads", "2"]);
    let mut c = server.client();
    let r = c.call(&frame(ADMIN, &[], b"promote", &[], 0, 7));
    assert_eq!(r.status, STATUS_NOT_SUPPORTED);
    assert!(
        String::from_utf8_lossy(&r.value).contains("--admin-socket"),
        "{:?}",
        String::from_utf8_lossy(&r.value)
    );
    // The connection goes on.
    assert_eq!(c.set(b"after", b"admin", 0, 0).status, 0);
    assert!(server.admin("promote").unwrap().starts_with("promoted:"));
    // The socket is its owner's only.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&server.admin_socket)
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
}

#[test]
fn runtime_mounts_take_only_our_files_inside_the_allowed_directories() {
    let server = Server::start(&["--threads", "2", "--segment", "mem:size=16M,numa=0"]);
    let inside = server.data_dir.join("foreign");
    let outside_dir = fresh_data_dir();
    std::fs::create_dir_all(&outside_dir).unwrap();
    let outside = outside_dir.join("victim");
    let bytes = pattern(11, 8 << 20);
    std::fs::write(&inside, &bytes).unwrap();
    std::fs::write(&outside, &bytes).unwrap();

    // A file Headroom did not create, inside the data directory: refused.
    let refused = server
        .admin(&format!("mount file:{},size=4M", inside.display()))
        .unwrap_err();
    assert!(
        refused.contains("Headroom did not create this file"),
        "{refused}"
    );
    // Outside every allowed directory: refused.
    let refused = server
        .admin(&format!("mount file:{},size=4M", outside.display()))
        .unwrap_err();
    assert!(
        refused.contains("a runtime mount takes only files inside"),
        "{refused}"
    );
    // A symlink inside pointing outside: refused.
    let link = server.data_dir.join("link");
    std::os::unix::fs::symlink(&outside, &link).unwrap();
    let refused = server
        .admin(&format!("mount file:{},size=4M", link.display()))
        .unwrap_err();
    assert!(refused.contains("symbolic link"), "{refused}");
    // `..` out of the data directory: refused.
    let sneaky = server
        .data_dir
        .join("..")
        .join(outside_dir.file_name().unwrap())
        .join("victim");
    assert!(server
        .admin(&format!("mount file:{},size=4M", sneaky.display()))
        .is_err());
    // A block device, even inside: only from the command line.
    if nix::unistd::geteuid().is_root() {
        let device = server.data_dir.join("blk");
        nix::sys::stat::mknod(
            &device,
            nix::sys::stat::SFlag::S_IFBLK,
            nix::sys::stat::Mode::from_bits_truncate(0o600),
            nix::sys::stat::makedev(7, 0),
        )
        .unwrap();
        let refused = server
            .admin(&format!("mount file:{},size=4M", device.display()))
            .unwrap_err();
        assert!(
            refused.contains("block devices are mounted only from the command line"),
            "{refused}"
        );
    }
    // Nothing was written: byte for byte, and not one byte longer.
    assert!(
        std::fs::read(&inside).unwrap() == bytes,
        "the foreign file changed"
    );
    assert!(
        std::fs::read(&outside).unwrap() == bytes,
        "the outside file changed"
    );

    // A new file inside the data directory is created, labelled, and mounted.
    let fresh = server.data_dir.join("runtime-0");
    assert_eq!(
        server.admin(&format!("mount file:{},size=4M", fresh.display())),
        Ok("mounted t1".to_string())
    );
    assert_eq!(std::fs::metadata(&fresh).unwrap().len(), (4 << 20) + 4096);
    let _ = std::fs::remove_dir_all(outside_dir);
}

#[test]
fn sasl_plain_guards_every_command() {
    let dir = fresh_data_dir();
    std::fs::create_dir_all(&dir).unwrap();
    let passwords = dir.join("passwords");
    std::fs::write(&passwords, "# user:password\nalice:wonderland\n").unwrap();
    let server = Server::start_in(
        &dir,
        &[
            "--threads",
            "2",
            "--sasl-password-file",
            &dir_arg(&passwords),
        ],
    );
    // Before authentication nothing but VERSION and SASL is served: anything else, a frame
    // the decoder refuses included, is answered 0x20 `Auth failure.` and the connection
    // closed, as memcached 1.6.45 does (proto_bin.c, `authenticated()`).
    let refused = [
        ("GET", frame(0x00, &[], b"k", &[], 0, 0)),
        ("SET", frame(0x01, &set_extras(0, 0), b"k", b"v", 0, 0)),
        ("STAT", frame(0x10, &[], b"", &[], 0, 0)),
        ("FLUSH", frame(0x08, &[], b"", &[], 0, 0)),
        ("NOOP", frame(0x0a, &[], b"", &[], 0, 0)),
        ("QUIT", frame(0x07, &[], b"", &[], 0, 0)),
        ("VERBOSITY", frame(0x1b, &[0, 0, 0, 1], b"", &[], 0, 0)),
        ("ADMIN", frame(ADMIN, &[], b"promote", &[], 0, 0)),
        ("an unknown opcode", frame(0x5f, &[], b"", &[], 0, 0)),
    ];
    for (name, request) in refused {
        let mut c = server.client();
        let r = c.call(&request);
        assert_eq!(
            (r.status, r.value.as_slice()),
            (STATUS_AUTH_ERROR, &b"Auth failure."[..]),
            "{name} before authentication"
        );
        assert!(c.closed(), "{name}: the connection stayed open");
    }
    let mut c = server.client();
    let r = c.call(&frame(0x0b, &[], b"", &[], 0, 0));
    assert_eq!(r.status, 0, "VERSION is allowed");
    let r = c.call(&frame(SASL_LIST_MECHS, &[], b"", &[], 0, 0));
    assert_eq!((r.status, r.value.as_slice()), (0, &b"PLAIN"[..]));
    // A wrong password: refused and counted; the connection may try again.
    let r = c.call(&frame(SASL_AUTH, &[], b"PLAIN", b"\0alice\0rabbit", 0, 0));
    assert_eq!(
        (r.status, r.value.as_slice()),
        (STATUS_AUTH_ERROR, &b"Auth failure."[..])
    );
    // The right one: every command works.
    let r = c.call(&alice_login());
    assert_eq!((r.status, r.value.as_slice()), (0, &b"Authenticated"[..]));
    assert_eq!(c.set(b"k", b"v", 0, 0).status, 0);
    assert_eq!(c.get(b"k").value, b"v");
    assert_eq!(c.stat("", "auth_cmds"), 2);
    assert_eq!(c.stat("", "auth_errors"), 1);
    assert!(c
        .stats("settings")
        .contains(&("auth_enabled_sasl".into(), "yes".into())));

    // A real client library that speaks SASL (python-binary-memcached).
    let python = common::python_with("bmemcached");
    let script = r#"
import sys, bmemcached
addr, user, password = sys.argv[1], sys.argv[2], sys.argv[3]
c = bmemcached.Client([addr], user, password)
c.set("lib-key", "from python")
print(c.get("lib-key"))
"#;
    let run = |password: &str| {
        std::process::Command::new(&python)
            .args(["-c", script, &server.addr.to_string(), "alice", password])
            .output()
            .unwrap()
    };
    let ok = run("wonderland");
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&ok.stdout).trim(), "from python");
    let wrong = run("rabbit");
    assert!(
        !wrong.status.success() || String::from_utf8_lossy(&wrong.stdout).trim() != "from python",
        "a wrong password must not read: {}",
        String::from_utf8_lossy(&wrong.stdout)
    );
    assert_eq!(c.stat("", "auth_errors"), 2);
    assert_eq!(c.get(b"lib-key").value, b"from python");
}

/// A server with `alice:wonderland` in its password file.
fn sasl_server() -> (Server, std::path::PathBuf) {
    let dir = fresh_data_dir();
    std::fs::create_dir_all(&dir).unwrap();
    let passwords = dir.join("passwords");
    std::fs::write(&passwords, "alice:wonderland\n").unwrap();
    let args = [
        "--threads",
        "2",
        "--sasl-password-file",
        &dir_arg(&passwords),
    ];
    (Server::start_in(&dir, &args), dir)
}

/// Sends one text line (and data block) and reads its one-line reply.
/// The SASL PLAIN request with the right password of `sasl_server`'s one user.
fn alice_login() -> Vec<u8> {
    frame(SASL_AUTH, &[], b"PLAIN", b"\0alice\0wonderland", 0, 0)
}

fn text_call(stream: &mut std::net::TcpStream, request: &[u8]) -> String {
    use std::io::Write;
    stream.write_all(request).unwrap();
    String::from_utf8_lossy(&common::server::read_text_reply(stream, b"\r\n", 0)).into_owned()
}

/// Guessing passwords on one connection ends at the third failure: its reply goes out and
/// the connection closes, in both protocols, however many guesses were pipelined behind it
/// (20,000 wrong passwords on one connection were once answered in 0.41 s). Every failure is
/// counted (`auth_errors`), and so is the close (`auth_closed`).
#[test]
fn sasl_guessing_ends_with_a_close_after_three_failures() {
    use std::io::{Read, Write};
    let (server, _dir) = sasl_server();
    // Binary: 50 wrong passwords in one write.
    let mut c = server.client();
    let wrong = frame(SASL_AUTH, &[], b"PLAIN", b"\0alice\0rabbit", 0, 0);
    c.send(&wrong.repeat(50));
    for attempt in 1..=3 {
        let r = c
            .recv()
            .unwrap_or_else(|| panic!("no reply to attempt {attempt}"));
        assert_eq!(
            (r.status, r.value.as_slice()),
            (STATUS_AUTH_ERROR, &b"Auth failure."[..]),
            "attempt {attempt}"
        );
    }
    assert!(c.recv().is_none(), "a fourth guess was answered");

    // Text (memcached's `set` form): the same, one guess at a time.
    let mut t = std::net::TcpStream::connect(server.addr).unwrap();
    t.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    for attempt in 1..=3 {
        assert_eq!(
            text_call(&mut t, b"set a 0 0 12\r\nalice rabbit\r\n"),
            "CLIENT_ERROR authentication failure\r\n",
            "attempt {attempt}"
        );
    }
    let _ = t.write_all(b"set a 0 0 12\r\nalice rabbit\r\n");
    let mut rest = Vec::new();
    let _ = t.read_to_end(&mut rest);
    assert!(rest.is_empty(), "after the third failure: {rest:?}");

    // The right password still works on a new connection; every failure was counted.
    let mut ok = server.client();
    let r = ok.call(&alice_login());
    assert_eq!(r.status, 0);
    assert_eq!(ok.stat("", "auth_errors"), 6);
    assert_eq!(ok.stat("", "auth_closed"), 2);
}

/// A client of `server` whose connection comes from `source` (a loopback address of its own:
/// another source as the failure budget counts them).
fn client_from(server: &Server, source: [u8; 4]) -> common::server::Client {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    let from = std::net::SocketAddr::from((source, 0));
    socket.bind(&from.into()).expect("bind a loopback source");
    socket.connect(&server.addr.into()).unwrap();
    let stream: std::net::TcpStream = socket.into();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    stream.set_nodelay(true).unwrap();
    common::server::Client { stream }
}

/// Many connections from one source guessing for several seconds share that source's
/// budget (`auth_gate`: 30 failures at once, then 10 a second): the guesses answered stay
/// within it however many connections there are, a connection whose attempt is held gets
/// nothing (no answer, no close) until it gives up, and the right password from another
/// source (127.0.0.2) is answered within 50 ms throughout.
#[test]
fn sasl_guessing_over_many_connections_stays_within_the_source_budget() {
    const GUESSERS: usize = 60;
    const SECONDS: f64 = 4.0;
    const BURST: u64 = 30;
    const PER_SECOND: f64 = 10.0;
    let (server, _dir) = sasl_server();
    let wrong = frame(SASL_AUTH, &[], b"PLAIN", b"\0alice\0rabbit", 0, 0);
    let stop = std::sync::atomic::AtomicBool::new(false);
    let started = std::time::Instant::now();
    let (answered, gave_up, slowest_right, sources_held) = std::thread::scope(|scope| {
        let guessers: Vec<_> = (0..GUESSERS)
            .map(|_| {
                let (server, wrong, stop) = (&server, &wrong, &stop);
                scope.spawn(move || {
                    let (mut answered, mut gave_up) = (0u64, 0u64);
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        // One guess a connection: answered, or given up after 300 ms.
                        let mut c = server.client();
                        c.stream
                            .set_read_timeout(Some(Duration::from_millis(300)))
                            .unwrap();
                        c.send(wrong);
                        let mut header = [0u8; 24];
                        match std::io::Read::read_exact(&mut c.stream, &mut header) {
                            Ok(()) => {
                                let status = u16::from_be_bytes([header[6], header[7]]);
                                assert_eq!(status, STATUS_AUTH_ERROR);
                                answered += 1;
                            }
                            Err(err) => {
                                assert!(
                                    matches!(
                                        err.kind(),
                                        std::io::ErrorKind::WouldBlock
                                            | std::io::ErrorKind::TimedOut
                                    ),
                                    "a held attempt was closed, not held: {err}"
                                );
                                gave_up += 1;
                            }
                        }
                    }
                    (answered, gave_up)
                })
            })
            .collect();
        // Meanwhile the right password from another source, every 50 ms.
        let (mut slowest, mut sources_held) = (Duration::ZERO, 0);
        while started.elapsed().as_secs_f64() < SECONDS {
            let mut c = client_from(&server, [127, 0, 0, 2]);
            let asked = std::time::Instant::now();
            assert_eq!(
                c.call(&alice_login()).status,
                0,
                "the right password refused"
            );
            slowest = slowest.max(asked.elapsed());
            // The guessing source is out of tokens while its attempts are held.
            sources_held = sources_held.max(c.stat("", "auth_sources_held"));
            std::thread::sleep(Duration::from_millis(50));
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let (answered, gave_up) = guessers
            .into_iter()
            .map(|g| g.join().unwrap())
            .fold((0, 0), |(a, g), (a2, g2)| (a + a2, g + g2));
        (answered, gave_up, slowest, sources_held)
    });
    let seconds = started.elapsed().as_secs_f64();
    let budget = BURST + (PER_SECOND * seconds).ceil() as u64;
    println!(
        "{GUESSERS} connections guessing for {seconds:.1} s: {answered} guesses answered \
         (budget {budget}), {gave_up} given up while held; the right password from 127.0.0.2 \
         answered in {slowest_right:?} at the slowest"
    );
    assert!(
        answered <= budget,
        "{answered} guesses answered, over the {budget} budget"
    );
    assert!(answered >= BURST, "the burst was not answered: {answered}");
    assert!(gave_up > 0, "no attempt was ever held");
    // Held attempts from 127.0.0.1 queue for seconds; another source's never wait on them.
    assert!(
        slowest_right < Duration::from_millis(50),
        "the right password from another source took {slowest_right:?}"
    );
    let mut ok = client_from(&server, [127, 0, 0, 3]);
    assert_eq!(ok.call(&alice_login()).status, 0);
    assert!(ok.stat("", "auth_held") >= gave_up);
    assert!(ok.stat("", "auth_errors") >= answered);
    assert_eq!(
        sources_held, 1,
        "STAT auth_sources_held: only 127.0.0.1 guessed"
    );
    assert!(
        server.logs("then 10 a second): 127.0.0.1 (one line per second"),
        "the log names the held source: {}",
        server.log_text()
    );
    // A held attempt whose client gave up does not keep its connection until a token comes
    // (or the guessers would fill --max-connections for every source): once they are gone,
    // only this one is left, soon.
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    loop {
        let open = ok.stat("", "curr_connections");
        if open <= 2 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{open} connections still open 2 s after every guesser gave up"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Past its budget, a source's right password waits its turn as a wrong one does: neither
/// is answered (nor closed) before a token comes, so the timing says nothing.
#[test]
fn past_the_budget_a_right_password_waits_as_a_wrong_one_does() {
    let (server, _dir) = sasl_server();
    let wrong = frame(SASL_AUTH, &[], b"PLAIN", b"\0alice\0rabbit", 0, 0);
    // Spend the burst and then some at once: 40 guesses on 40 connections; the last 10 are
    // held, and by the time they are answered the budget is spent.
    let mut guessers: Vec<_> = (0..40).map(|_| server.client()).collect();
    for c in &mut guessers {
        c.send(&wrong);
    }
    for c in &mut guessers {
        assert_eq!(c.recv().expect("an answer").status, STATUS_AUTH_ERROR);
    }
    // STAT from another source, logged in.
    let mut probe = client_from(&server, [127, 0, 0, 3]);
    assert_eq!(probe.call(&alice_login()).status, 0);
    let held_before = probe.stat("", "auth_held");
    // The budget is spent but for what refilled meanwhile: five more guesses take it, and the
    // right password comes after them.
    let mut more: Vec<_> = (0..5).map(|_| server.client()).collect();
    for c in &mut more {
        c.send(&wrong);
    }
    std::thread::sleep(Duration::from_millis(20));
    let mut right = server.client();
    let asked = std::time::Instant::now();
    assert_eq!(
        right.call(&alice_login()).status,
        0,
        "the right password refused"
    );
    let right_took = asked.elapsed();
    for c in &mut more {
        assert_eq!(c.recv().expect("an answer").status, STATUS_AUTH_ERROR);
    }
    let held = probe.stat("", "auth_held") - held_before;
    // At least four guesses and the right password waited for tokens, which come every
    // 100 ms once the budget is spent: the right one was not answered at once.
    assert!(
        held >= 5,
        "{held} attempts held, not the right one among them"
    );
    assert!(
        right_took >= Duration::from_millis(30),
        "the right password was answered in {right_took:?} past the budget"
    );
}

/// Over text, nothing is served before authentication but memcached's `set user password`:
/// every other command, `shutdown` and `slabs automove` (once answered before authentication)
/// and lines the decoder refuses included, gets memcached's `CLIENT_ERROR unauthenticated`,
/// and the connection may go on to authenticate; after it the same lines get their usual
/// answers.
#[test]
fn nothing_but_authentication_is_served_before_it_over_text() {
    let (server, _dir) = sasl_server();
    let mut t = std::net::TcpStream::connect(server.addr).unwrap();
    t.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let lines: [&[u8]; 14] = [
        b"shutdown\r\n",
        b"slabs automove 1\r\n",
        b"slabs reassign 1 2\r\n",
        b"stats\r\n",
        b"version\r\n",
        b"get k\r\n",
        b"mn\r\n",
        b"lru_crawler metadump all\r\n",
        b"watch\r\n",
        b"flush_all\r\n",
        b"verbosity 1\r\n",
        b"delete k noreply\r\n",
        b"bogus\r\n",
        b"ms k 2 T0\r\nhi\r\n",
    ];
    for line in lines {
        assert_eq!(
            text_call(&mut t, line),
            "CLIENT_ERROR unauthenticated\r\n",
            "{:?} before authentication",
            String::from_utf8_lossy(line)
        );
    }
    // A token over memcached's 16 KiB is refused and its value skipped, never buffered; a
    // store that is not `set` is not an authentication at all.
    // `command a 0 0 len`, its data block `len` bytes of `x`.
    let store = |command: &str, len: usize| {
        let mut request = format!("{command} a 0 0 {len}\r\n").into_bytes();
        request.extend(std::iter::repeat_n(b'x', len));
        request.extend_from_slice(b"\r\n");
        request
    };
    assert_eq!(
        text_call(&mut t, &store("set", 16385)),
        "CLIENT_ERROR auth token too long\r\n"
    );
    assert_eq!(
        text_call(&mut t, &store("add", 20000)),
        "CLIENT_ERROR unauthenticated\r\n"
    );
    assert_eq!(
        text_call(&mut t, b"set a 0 0 16\r\nalice wonderland\r\n"),
        "STORED\r\n"
    );
    assert_eq!(
        text_call(&mut t, b"shutdown\r\n"),
        "SERVER_ERROR: shutdown not enabled\r\n"
    );
    assert!(text_call(&mut t, b"slabs automove 1\r\n").starts_with("SERVER_ERROR not supported"));
    assert!(text_call(&mut t, b"version\r\n").starts_with("VERSION "));
    let mut c = server.client();
    let r = c.call(&alice_login());
    assert_eq!(r.status, 0);
    assert_eq!(
        c.stat("", "auth_errors"),
        0,
        "refusals are not failed logins"
    );
}

#[test]
fn sighup_survives_and_reopens_the_log_file() {
    let dir = fresh_data_dir();
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("headroom.log");
    let read_log = |path: &std::path::Path| std::fs::read_to_string(path).unwrap_or_default();
    let wait_for = |path: &std::path::Path, text: &str| {
        for _ in 0..500 {
            if read_log(path).contains(text) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("{} never said {text:?}: {}", path.display(), read_log(path));
    };
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_headroom"))
        .args([
            "--allow-root",
            "--listen",
            "127.0.0.1:0",
            "--threads",
            "2",
            "--data-dir",
            &dir_arg(&dir),
        ])
        .args(["--log-file", &dir_arg(&log)])
        .spawn()
        .unwrap();
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    wait_for(&log, "listening on ");
    let text = read_log(&log);
    let addr: std::net::SocketAddr = text[text.find("listening on ").unwrap() + 13..]
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let mut c = common::server::Client::connect(addr);
    assert_eq!(c.set(b"k", b"v", 0, 0).status, 0);
    // Rotation: the file is moved away, SIGHUP makes a new one.
    let rotated = dir.join("headroom.log.1");
    std::fs::rename(&log, &rotated).unwrap();
    nix::sys::signal::kill(pid, Signal::SIGHUP).unwrap();
    wait_for(&log, "SIGHUP: log file reopened");
    assert!(read_log(&rotated).contains("listening on"));
    // Still serving, same data.
    assert_eq!(c.get(b"k").value, b"v");
    nix::sys::signal::kill(pid, Signal::SIGTERM).unwrap();
    assert_eq!(child.wait().unwrap().code(), Some(0));
    assert!(read_log(&log).contains("stopped"));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn sigusr1_stops_gracefully_with_the_snapshot() {
    let dir = fresh_data_dir();
    let args = ["--threads", "2"];
    let server = Server::start_in(&dir, &args);
    let mut c = server.client();
    let value = pattern(5, 3 << 20);
    assert_eq!(c.set_streamed(0x01, b"big", &value, 9).status, 0);
    assert_eq!(server.stop_with(Signal::SIGUSR1).code(), Some(0));
    let server = Server::start_in(&dir, &args);
    let got = server.client().get(b"big");
    assert_eq!((got.status, got.flags()), (0, 9));
    assert!(got.value == value, "restored value differs");
}

#[test]
fn a_stop_signal_during_start_up_is_honoured() {
    // Mapping and locking the arena takes a while; SIGTERM arrives meanwhile. (Not too large:
    // the kernel's teardown of a big locked mapping, under a loaded test run, is slow.)
    for delay_ms in [0u64, 30, 120] {
        let dir = fresh_data_dir();
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("headroom.log");
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_headroom"))
            .args([
                "--allow-root",
                "--listen",
                "127.0.0.1:0",
                "--memory",
                "256M",
                "--data-dir",
                &dir_arg(&dir),
            ])
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(delay_ms));
        let sent = std::time::Instant::now();
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            Signal::SIGTERM,
        )
        .unwrap();
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if sent.elapsed() > Duration::from_secs(30) {
                let _ = child.kill();
                panic!(
                    "SIGTERM {delay_ms} ms into start-up was not honoured: {}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        // Before the signal thread exists (the first microseconds) the default action ends it.
        use std::os::unix::process::ExitStatusExt;
        assert!(
            status.code() == Some(0) || status.signal() == Some(Signal::SIGTERM as i32),
            "{delay_ms} ms: {status:?}"
        );
        let _ = std::fs::remove_dir_all(dir);
        let _ = std::fs::remove_file(log);
    }
}

#[test]
fn a_stalled_start_up_names_the_shards_it_waits_for() {
    // strace holds each thread's first io_uring_register (the setup of a ring) for 12 s, longer
    // than start-up waits for its shards before it says which are not ready (10 s).
    let dir = fresh_data_dir();
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("headroom.log");
    let mut strace = std::process::Command::new("strace")
        .args([
            "-f",
            "-qq",
            "-o",
            "/dev/null",
            "-e",
            "trace=io_uring_register",
        ])
        .args(["-e", "inject=io_uring_register:delay_exit=12000000:when=1"])
        .arg(env!("CARGO_BIN_EXE_headroom"))
        .args([
            "--allow-root",
            "--listen",
            "127.0.0.1:0",
            "--threads",
            "2",
            "--memory",
            "64M",
        ])
        .args(["--data-dir", &dir_arg(&dir)])
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("strace runs (scripts/install-deps installs it)");
    let started = std::time::Instant::now();
    let text = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.contains("start-up is slow") || started.elapsed() > Duration::from_secs(60) {
            break text;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    // The server is strace's child; a tracer that goes leaves its tracee running, so the
    // server is killed first.
    let children = std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", strace.id()))
        .unwrap_or_default();
    for pid in children.split_whitespace() {
        let pid = nix::unistd::Pid::from_raw(pid.parse().unwrap());
        let _ = nix::sys::signal::kill(pid, Signal::SIGKILL);
    }
    let _ = strace.kill();
    let _ = strace.wait();
    let warning = text
        .lines()
        .find(|line| line.contains("start-up is slow"))
        .unwrap_or_else(|| panic!("no warning about the stalled start-up in 60 s:\n{text}"));
    assert!(warning.contains("WARN"), "{warning}");
    assert!(warning.contains("waiting=["), "names no shards: {warning}");
    assert!(
        !text.contains("listening on"),
        "the start-up was not held up: {text}"
    );
}
