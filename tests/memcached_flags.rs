//! memcached's command line works unchanged: every flag and `-o` option of 1.6.45 is read into
//! Headroom's settings, noted, or refused with its exit status (the table in
//! docs/operations.md is the same source); Debian's /etc/memcached.conf as shipped, a container
//! line (`-m 1024 -c 4096 -t 2 -v`), `-Z` with the ssl options, `-s`, several `-l`, and `-d`
//! with `-P` all serve through the real binary.

mod common;

use std::ffi::OsString;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use headroom::config::memcached::{self, CommandLine, Meaning, Translation, FLAGS, OPTIONS};
use headroom::config::Cli;

fn read(line: &[&str]) -> Result<CommandLine, memcached::Refusal> {
    let args: Vec<OsString> = std::iter::once("headroom")
        .chain(line.iter().copied())
        .map(OsString::from)
        .collect();
    memcached::read(args)
}

fn translated(line: &[&str]) -> Translation {
    match read(line) {
        Ok(CommandLine::Memcached(t)) => *t,
        Ok(other) => panic!("{line:?}: not read as memcached's: {other:?}"),
        Err(refusal) => panic!("{line:?}: refused: {refusal}"),
    }
}

fn cli(line: &[&str]) -> Cli {
    translated(line).cli
}

fn refused(line: &[&str]) -> (i32, String) {
    match read(line) {
        Err(refusal) => (refusal.exit_status, refusal.message),
        Ok(other) => panic!("{line:?}: not refused: {other:?}"),
    }
}

fn printed(line: &[&str]) -> String {
    match read(line) {
        Ok(CommandLine::Print(text)) => text,
        other => panic!("{line:?}: printed nothing: {other:?}"),
    }
}

fn on(value: &Option<String>) -> &str {
    value.as_deref().unwrap_or("unset")
}

/// Every flag and option with a Headroom meaning, by the settings it makes; every noted one
/// by its INFO line; every refused one by its sentence and exit status.
#[test]
fn every_memcached_flag_is_mapped_noted_or_refused() {
    let mut covered: Vec<String> = Vec::new();
    let mut mapped = |name: &str| covered.push(name.to_string());

    // The flags with a Headroom meaning, each checked by what it sets.
    let port = cli(&["-p", "12345"]);
    assert_eq!(port.listen.len(), 1);
    assert!(port.listen[0].ends_with(":12345"), "{:?}", port.listen);
    mapped("-p");
    assert!(cli(&["-U", "0"]).listen[0].ends_with(":11211"));
    assert_eq!(refused(&["-U", "11211"]).0, 64);
    mapped("-U");
    let unix = cli(&["-s", "/tmp/m.sock", "-a", "0770"]);
    assert_eq!(unix.unix_socket, Some(PathBuf::from("/tmp/m.sock")));
    assert_eq!(unix.listen, ["none"]);
    assert_eq!(on(&unix.unix_socket_mode), "0770");
    mapped("-s");
    mapped("-a");
    assert_eq!(on(&cli(&["-A"]).shutdown_command), "on");
    mapped("-A");
    assert_eq!(
        cli(&["-l", "127.0.0.1,::1", "-p", "5"]).listen,
        ["127.0.0.1:5", "[::1]:5"]
    );
    assert_eq!(
        cli(&["-l", "127.0.0.1:7", "-l", "127.0.0.2"]).listen,
        ["127.0.0.1:7", "127.0.0.2:11211"]
    );
    mapped("-l");
    assert!(cli(&["-d"]).daemon);
    mapped("-d");
    assert_eq!(cli(&["-u", "memcache"]).user.as_deref(), Some("memcache"));
    mapped("-u");
    assert_eq!(cli(&["-m", "64"]).memory.unwrap().0, 64 << 20);
    assert_eq!(refused(&["-m", "0"]).0, 64);
    mapped("-m");
    assert_eq!(on(&cli(&["-M"]).evictions), "off");
    mapped("-M");
    assert_eq!(cli(&["-c", "4096"]).max_connections, Some(4096));
    assert_eq!(refused(&["-c", "0"]).0, 1);
    mapped("-c");
    for (line, level) in [
        (&["-p", "1"][..], "info"),
        (&["-v"], "info"),
        (&["-vv"], "debug"),
        (&["-v", "-v", "-v"], "trace"),
    ] {
        assert_eq!(on(&cli(line).log_level), level, "{line:?}");
    }
    mapped("-v");
    assert!(printed(&["-m", "64", "-h"]).contains("-o ext_path"));
    mapped("-h");
    assert!(printed(&["-m", "64", "-i"]).contains("Apache License"));
    mapped("-i");
    assert!(printed(&["-m", "64", "-V"]).starts_with("headroom "));
    mapped("-V");
    assert_eq!(
        cli(&["-P", "/run/m.pid"]).pid_file,
        Some(PathBuf::from("/run/m.pid"))
    );
    mapped("-P");
    assert_eq!(cli(&["-t", "2"]).threads, Some(2));
    assert_eq!(cli(&["-p", "1"]).threads, Some(4), "memcached's default");
    assert_eq!(refused(&["-t", "0"]).0, 1);
    mapped("-t");
    assert!(translated(&["-B", "ascii"])
        .notices
        .iter()
        .any(|n| n.contains("-B ascii")));
    assert!(translated(&["-B", "auto"])
        .notices
        .iter()
        .all(|n| !n.contains("-B")));
    assert_eq!(refused(&["-B", "udp"]).0, 64);
    mapped("-B");
    assert_eq!(cli(&["-I", "2m"]).max_item_size.unwrap().0, 2 << 20);
    assert_eq!(cli(&["-I", "4096"]).max_item_size.unwrap().0, 4096);
    assert_eq!(cli(&["-p", "1"]).max_item_size.unwrap().0, 1 << 20);
    assert_eq!(refused(&["-I", "100"]).0, 64);
    mapped("-I");
    std::env::set_var("MEMCACHED_SASL_PWDB", "/etc/m.pwdb");
    assert_eq!(
        cli(&["-S"]).sasl_password_file,
        Some(PathBuf::from("/etc/m.pwdb"))
    );
    std::env::remove_var("MEMCACHED_SASL_PWDB");
    assert_eq!(
        cli(&["-S", "--sasl-password-file", "/p"]).sasl_password_file,
        Some(PathBuf::from("/p"))
    );
    assert_eq!(refused(&["-S"]).0, 64);
    mapped("-S");
    assert_eq!(on(&cli(&["-F"]).flush_all_command), "off");
    mapped("-F");
    assert_eq!(on(&cli(&["-X"]).dump_commands), "off");
    mapped("-X");
    assert_eq!(on(&cli(&["-W"]).watch_command), "off");
    mapped("-W");
    let restart = translated(&["-e", "/dev/shm/mem"]);
    assert_eq!(on(&restart.cli.warm_restart), "on");
    assert!(restart.notices.iter().any(|n| n.contains("/dev/shm/mem")));
    assert_eq!(on(&cli(&["-p", "1"]).warm_restart), "off");
    mapped("-e");
    let tls = cli(&["-Z", "-o", "ssl_chain_cert=/c.pem,ssl_key=/k.pem"]);
    assert_eq!(tls.tls_cert, Some(PathBuf::from("/c.pem")));
    assert_eq!(tls.tls_key, Some(PathBuf::from("/k.pem")));
    assert_eq!(tls.tls_ca, None);
    assert_eq!(refused(&["-Z"]).0, 64);
    assert_eq!(refused(&["-Z", "-o", "ssl_chain_cert=/c.pem"]).0, 64);
    let plain = translated(&["-o", "ssl_chain_cert=/c.pem,ssl_key=/k.pem"]);
    assert_eq!(plain.cli.tls_cert, None, "no TLS without -Z");
    assert!(plain.notices.iter().any(|n| n.contains("without -Z")));
    mapped("-Z");
    mapped("-o");

    // The -o options with a Headroom meaning.
    let z = ["-Z", "-o", "ssl_chain_cert=/c,ssl_key=/k"];
    let with_tls = |more: &str| cli(&[&z[..], &["-o", more]].concat());
    mapped("ssl_chain_cert");
    mapped("ssl_key");
    assert_eq!(on(&cli(&["-o", "lru_crawler"]).lru_crawler), "on");
    mapped("lru_crawler");
    assert_eq!(on(&cli(&["-o", "no_lru_crawler"]).lru_crawler), "off");
    mapped("no_lru_crawler");
    assert_eq!(cli(&["-o", "idle_timeout=30"]).idle_timeout, Some(30));
    assert_eq!(refused(&["-o", "idle_timeout=x"]).0, 1);
    mapped("idle_timeout");
    let required = with_tls("ssl_ca_cert=/ca,ssl_verify_mode=2");
    assert_eq!(required.tls_ca, Some(PathBuf::from("/ca")));
    assert_eq!(on(&required.tls_client_cert), "required");
    let optional = with_tls("ssl_ca_cert=/ca,ssl_verify_mode=1");
    assert_eq!(on(&optional.tls_client_cert), "optional");
    // Verify mode 0 asks no client of an unprefixed address; the CA checks -l's mtls: ones.
    let unasked = with_tls("ssl_ca_cert=/ca");
    assert_eq!(unasked.tls_ca, Some(PathBuf::from("/ca")));
    assert_eq!(on(&unasked.tls_client_cert), "none");
    assert_eq!(
        refused(&[&z[..], &["-o", "ssl_verify_mode=2"]].concat()).0,
        64
    );
    assert_eq!(refused(&["-o", "ssl_verify_mode=4"]).0, 1);
    mapped("ssl_ca_cert");
    mapped("ssl_verify_mode");
    assert_eq!(
        with_tls("ssl_keyformat=1").tls_cert,
        Some(PathBuf::from("/c"))
    );
    assert_eq!(refused(&["-o", "ssl_keyformat=2"]).0, 64);
    mapped("ssl_keyformat");
    assert_eq!(on(&with_tls("ssl_min_version=3").tls_min_version), "1.3");
    assert_eq!(on(&with_tls("ssl_min_version=2").tls_min_version), "unset");
    mapped("ssl_min_version");
    // memcached keeps no sessions unless asked to, and seals 16 KiB at a time.
    assert_eq!(
        on(&with_tls("ssl_min_version=2").tls_session_resumption),
        "off"
    );
    assert_eq!(
        on(&with_tls("ssl_session_cache").tls_session_resumption),
        "on"
    );
    mapped("ssl_session_cache");
    let wbuf = |cli: Cli| cli.tls_write_buffer.map(|size| size.0);
    assert_eq!(wbuf(with_tls("ssl_min_version=2")), Some(16 << 10));
    assert_eq!(wbuf(with_tls("ssl_wbuf_size=64")), Some(64 << 10));
    assert_eq!(refused(&["-o", "ssl_wbuf_size=x"]).0, 1);
    mapped("ssl_wbuf_size");
    // -l's notls:, btls: and mtls: say each address's TLS.
    let prefixed = cli(&[
        &z[..],
        &["-l", "notls:127.0.0.1:1,btls:127.0.0.1:2,mtls:[::1]:3"],
    ]
    .concat());
    assert_eq!(
        prefixed.listen,
        ["plain:127.0.0.1:1", "tls:127.0.0.1:2", "mtls:[::1]:3"]
    );
    assert_eq!(refused(&["-l", "notls:127.0.0.1"]).0, 1);
    let ext = cli(&["-o", "ext_path=/mnt/flash/file:64G,ext_path=/mnt/b:1t"]);
    let ext: Vec<String> = ext.segments.iter().map(ToString::to_string).collect();
    assert_eq!(ext.len(), 2, "{ext:?}");
    assert!(
        ext[0].contains("/mnt/flash/file") && ext[1].contains("/mnt/b"),
        "{ext:?}"
    );
    assert_eq!(refused(&["-o", "ext_path=/mnt/f"]).0, 1);
    mapped("ext_path");

    // Every other flag and option: its INFO line, or its refusal, straight from the table.
    for flag in FLAGS {
        let name = format!("-{}", flag.short);
        let value = match flag.value {
            memcached::Value::Required => vec![name.clone(), "1".to_string()],
            _ => vec![name.clone()],
        };
        let line: Vec<&str> = value.iter().map(String::as_str).collect();
        match flag.meaning {
            Meaning::Mapped(_) => assert!(covered.contains(&name), "{name} is not checked"),
            Meaning::Noted(note) => {
                let notices = translated(&line).notices;
                assert!(
                    notices
                        .iter()
                        .any(|n| n.contains(&format!("memcached's {name}")) && n.contains(note)),
                    "{name}: {notices:?}"
                );
            }
            Meaning::Refused(sentence, status) => {
                assert_eq!(refused(&line), (status, sentence.to_string()), "{name}");
            }
        }
    }
    for option in OPTIONS {
        let part = format!("{}=1", option.name);
        let line = ["-o", part.as_str()];
        match option.meaning {
            Meaning::Mapped(_) => {
                assert!(
                    covered.contains(&option.name.to_string()),
                    "-o {}",
                    option.name
                )
            }
            Meaning::Noted(note) => {
                let notices = translated(&line).notices;
                assert!(
                    notices
                        .iter()
                        .any(|n| n.contains(&format!("-o {part}")) && n.contains(note)),
                    "-o {}: {notices:?}",
                    option.name
                );
            }
            Meaning::Refused(sentence, status) => {
                assert_eq!(
                    refused(&line),
                    (status, sentence.to_string()),
                    "-o {}",
                    option.name
                );
            }
        }
    }
    // What memcached does not know, it refuses with status 1.
    assert_eq!(refused(&["-m", "64", "-q"]).0, 1);
    assert_eq!(refused(&["-o", "no_such_option"]).0, 1);
    assert_eq!(refused(&["-m", "64", "stray"]).0, 1);
}

#[test]
fn long_forms_clusters_and_headroom_flags_read_together() {
    let line = cli(&[
        "--memory-limit=128",
        "--port",
        "7",
        "-vvl127.0.0.1",
        "--data-dir",
        "/srv/h",
        "--ram-head=64K",
    ]);
    assert_eq!(line.memory.unwrap().0, 128 << 20);
    assert_eq!(line.listen, ["127.0.0.1:7"]);
    assert_eq!(on(&line.log_level), "debug");
    assert_eq!(line.data_dir, Some(PathBuf::from("/srv/h")));
    assert_eq!(line.ram_head.unwrap().0, 64 << 10);
    // As root with no data directory named, a service's place for it.
    let unnamed = cli(&["-m", "64"]).data_dir;
    if nix::unistd::geteuid().is_root() && std::env::var_os("STATE_DIRECTORY").is_none() {
        assert_eq!(unnamed, Some(PathBuf::from(memcached::ROOT_DATA_DIR)));
    } else {
        assert_eq!(unnamed, None);
    }
    let forced = cli(&["--memcached-args", "--conn-limit=9"]);
    assert_eq!(forced.max_connections, Some(9));
    // Headroom's own line is not memcached's.
    match read(&["--memory", "64M"]) {
        Ok(CommandLine::Headroom(cli)) => assert_eq!(cli.memory.unwrap().0, 64 << 20),
        other => panic!("{other:?}"),
    }
    // The same setting twice: the later wins, as in memcached.
    assert_eq!(
        cli(&["-m", "64", "--memory", "128M"]).memory.unwrap().0,
        128 << 20
    );
    assert_eq!(cli(&["-m", "64", "-m", "32"]).memory.unwrap().0, 32 << 20);
    // A Headroom flag that is not one: one sentence, Headroom's status.
    let (status, message) = refused(&["-m", "64", "--no-such-flag"]);
    assert_eq!(status, 2, "{message}");
    assert!(message.contains("--no-such-flag"), "{message}");
    // memcached's long forms win where the names are the same (`--listen` is `-l`).
    assert_eq!(
        cli(&["-l", "127.0.0.1", "--listen", "127.0.0.2:5"]).listen,
        ["127.0.0.1:11211", "127.0.0.2:5"]
    );
}

#[test]
fn a_conf_file_reads_as_debian_s_wrapper_reads_it() {
    let dir = common::fresh_temp_path("memcached-conf");
    std::fs::create_dir_all(&dir).unwrap();
    let conf = dir.join("memcached.conf");
    std::fs::write(
        &conf,
        "# a comment\n-d\n\nlogfile /var/log/m.log\n  -m 96   # trailing\n-l 127.0.0.1\n\
         -P /run/a\\#b.pid\n-o \"idle_timeout=5\"\nstrange directive\n",
    )
    .unwrap();
    let conf_arg = conf.display().to_string();
    let t = translated(&["--memcached-conf", &conf_arg, "-c", "77"]);
    assert!(!t.cli.daemon, "-d in a conf file is skipped");
    assert!(t
        .notices
        .iter()
        .any(|n| n.contains("line 2") && n.contains("-d")));
    assert!(t
        .notices
        .iter()
        .any(|n| n.contains("line 9") && n.contains("ignored")));
    assert_eq!(t.cli.log_file, Some(PathBuf::from("/var/log/m.log")));
    assert_eq!(t.cli.memory.unwrap().0, 96 << 20);
    assert_eq!(t.cli.listen, ["127.0.0.1:11211"]);
    assert_eq!(t.cli.pid_file, Some(PathBuf::from("/run/a#b.pid")));
    assert_eq!(t.cli.idle_timeout, Some(5));
    assert_eq!(t.cli.max_connections, Some(77));
    let (status, message) = refused(&["--memcached-conf", "/nonexistent/memcached.conf"]);
    assert_eq!(status, 2);
    assert!(message.starts_with("--memcached-conf /nonexistent/memcached.conf:"));
}

#[test]
fn the_docs_table_is_the_flag_table() {
    let docs = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/operations.md"))
        .unwrap();
    let table = memcached::markdown_table();
    assert!(
        docs.contains(&table),
        "docs/operations.md's \"Coming from memcached\" table is not the flag table; it should be:\n{table}"
    );
}

/// A server started from a memcached line (`-p 0`: free ports, read from its log), stopped
/// (SIGTERM) on drop.
struct Started {
    child: Child,
    log: PathBuf,
    addrs: Vec<SocketAddr>,
}

impl Started {
    /// Runs `headroom ARGS` with stderr to a file, and waits until its log (`log`, else
    /// stderr) says where it listens.
    fn start(args: &[&str], log: Option<&std::path::Path>) -> Started {
        let stderr = common::fresh_temp_path("memcached-flags-stderr");
        let child = Command::new(env!("CARGO_BIN_EXE_headroom"))
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .unwrap();
        let mut started = Started {
            child,
            log: log.map_or(stderr, std::path::Path::to_path_buf),
            addrs: Vec::new(),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(addrs) = listening(&started.log()) {
                started.addrs = addrs;
                return started;
            }
            if let Ok(Some(status)) = started.child.try_wait() {
                panic!("headroom exited ({status}): {}", started.log());
            }
            assert!(Instant::now() < deadline, "not serving: {}", started.log());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn stop(mut self) -> std::process::ExitStatus {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        self.child.wait().unwrap()
    }
}

impl Drop for Started {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The addresses of the log's `listening on A, B addr=...` line, once it is there.
fn listening(log: &str) -> Option<Vec<SocketAddr>> {
    let line = log.lines().find(|l| l.contains("INFO listening on "))?;
    let after = &line[line.find("listening on ")? + 13..];
    let list = &after[..after.find(" addr=")?];
    Some(list.split(", ").map(|a| a.parse().unwrap()).collect())
}

/// Sends `command` and reads up to `END\r\n` (or the reply line of a storage command).
fn text(addr: SocketAddr, command: &str) -> String {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream.write_all(command.as_bytes()).unwrap();
    let mut got = Vec::new();
    let mut chunk = [0u8; 4096];
    while !(got.ends_with(b"END\r\n") || got.ends_with(b"STORED\r\n")) {
        let n = stream.read(&mut chunk).unwrap();
        assert!(n > 0, "closed after {:?}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&chunk[..n]);
    }
    String::from_utf8(got).unwrap()
}

fn stat(stats: &str, name: &str) -> String {
    stats
        .lines()
        .find_map(|l| l.strip_prefix(&format!("STAT {name} ")))
        .unwrap_or_else(|| panic!("no STAT {name} in {stats}"))
        .to_string()
}

/// The user the servers run as: memcached's `-u` is needed as root, as memcached needs it.
fn user_args() -> Vec<&'static str> {
    match nix::unistd::geteuid().is_root() {
        true => vec!["-u", "root"],
        false => vec![],
    }
}

#[test]
fn debian_s_default_conf_serves_with_its_settings() {
    let shipped = include_str!("data/debian-memcached.conf");
    let dir = common::fresh_temp_path("debian-conf");
    std::fs::create_dir_all(&dir).unwrap();
    let pid_file = dir.join("memcached.pid");
    let log_file = dir.join("memcached.log");
    let user = if nix::unistd::geteuid().is_root() {
        "root"
    } else {
        ""
    };
    // The lines as shipped, with the port, the pid file, the log file and the user adapted.
    let adapted: String = shipped
        .lines()
        .map(|line| match line {
            "-p 11211" => "-p 0".to_string(),
            "-u memcache" if user.is_empty() => "# -u memcache".to_string(),
            "-u memcache" => format!("-u {user}"),
            "-P /var/run/memcached/memcached.pid" => format!("-P {}", pid_file.display()),
            "logfile /var/log/memcached.log" => format!("logfile {}", log_file.display()),
            other => other.to_string(),
        })
        .map(|line| line + "\n")
        .collect();
    assert_ne!(adapted, shipped, "the shipped lines were found and adapted");
    let conf = dir.join("memcached.conf");
    std::fs::write(&conf, adapted).unwrap();
    let data_dir = dir.join("data");
    let server = Started::start(
        &[
            "--memcached-conf",
            conf.to_str().unwrap(),
            "--data-dir",
            data_dir.to_str().unwrap(),
        ],
        Some(&log_file),
    );
    let addr = server.addrs[0];
    // -d is skipped: the process started is the server.
    let written = std::fs::read_to_string(&pid_file).unwrap();
    assert_eq!(written.trim(), server.child.id().to_string());
    assert_eq!(text(addr, "set debian 0 0 2\r\nhi\r\n"), "STORED\r\n");
    assert_eq!(
        text(addr, "get debian\r\n"),
        "VALUE debian 0 2\r\nhi\r\nEND\r\n"
    );
    let settings = text(addr, "stats settings\r\n");
    assert_eq!(stat(&settings, "maxbytes"), (64u64 << 20).to_string());
    assert_eq!(stat(&settings, "tcpport"), addr.port().to_string());
    assert_eq!(stat(&settings, "inter"), "127.0.0.1");
    assert_eq!(stat(&settings, "maxconns"), "1024");
    assert_eq!(stat(&settings, "item_size_max"), (1u64 << 20).to_string());
    let log = std::fs::read_to_string(&log_file).unwrap();
    assert!(log.contains("starting headroom"), "{log}");
    assert!(
        log.contains("skipped, as Debian's systemd wrapper"),
        "{log}"
    );
    assert!(server.stop().success());
    assert!(
        !pid_file.exists(),
        "the pid file is removed on a clean stop"
    );
}

#[test]
fn a_container_line_serves_with_its_settings() {
    let data_dir = common::server::fresh_data_dir();
    let mut args = vec!["-m", "1024", "-c", "4096", "-t", "2", "-v"];
    args.extend(["-p", "0", "-l", "127.0.0.1"]);
    args.extend(user_args());
    args.extend(["--data-dir", data_dir.to_str().unwrap()]);
    let server = Started::start(&args, None);
    let addr = server.addrs[0];
    let settings = text(addr, "stats settings\r\n");
    assert_eq!(stat(&settings, "maxbytes"), (1u64 << 30).to_string());
    assert_eq!(stat(&settings, "maxconns"), "4096");
    let cpus = std::thread::available_parallelism().unwrap().get();
    assert_eq!(stat(&settings, "num_threads"), cpus.min(2).to_string());
    assert_eq!(stat(&settings, "tcpport"), addr.port().to_string());
    assert_eq!(stat(&settings, "evictions"), "on");
    assert_eq!(stat(&settings, "verbosity"), "1");
    assert_eq!(text(addr, "set c 0 0 1\r\nx\r\n"), "STORED\r\n");
    assert!(server.stop().success());
}

/// A `-Z` server with fresh test certificates and the ssl options `more` makes of them after
/// the chain and key: the server, its certificates, and its address.
fn tls_line(
    more: impl Fn(&common::certs::Certs) -> String,
) -> (Started, common::certs::Certs, String) {
    let dir = common::server::fresh_data_dir();
    let certs = common::certs::Certs::make(&dir.join("certs"));
    let ssl = format!(
        "ssl_chain_cert={},ssl_key={}{}",
        certs.server_cert.display(),
        certs.server_key.display(),
        more(&certs)
    );
    let mut args = vec!["-Z", "-o", &ssl, "-p", "0", "-l", "127.0.0.1", "-I", "8m"];
    args.extend(user_args());
    let data_dir = dir.join("data");
    args.extend(["--data-dir", data_dir.to_str().unwrap()]);
    let server = Started::start(&args, None);
    let addr = server.addrs[0].to_string();
    (server, certs, addr)
}

/// tls_app.py's `phase` against `addr`, trusting the test CA, with a client certificate if given.
fn tls_app(
    phase: &str,
    addr: &str,
    certs: &common::certs::Certs,
    client: Option<(&PathBuf, &PathBuf)>,
) -> Command {
    let mut command = Command::new(common::python_with("pymemcache"));
    command.arg(common::client_script("tls_app.py")).args([
        phase,
        addr,
        certs.ca.to_str().unwrap(),
    ]);
    if let Some((cert, key)) = client {
        command.args([cert, key]);
    }
    command
}

#[test]
fn tls_from_z_and_the_ssl_options_serves() {
    let (server, certs, addr) = tls_line(|_| String::new());
    let app = tls_app("app", &addr, &certs, None);
    common::run_checks(app, 10);
    // A plaintext client is not served.
    let mut plain = TcpStream::connect(&addr).unwrap();
    plain
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    plain.write_all(b"version\r\n").unwrap();
    let mut got = Vec::new();
    let _ = plain.read_to_end(&mut got);
    assert!(!got.starts_with(b"VERSION"), "plaintext was served");
    assert!(server.stop().success());
}

#[test]
fn ssl_verify_mode_1_and_ssl_min_version_3_serve_as_memcached_would() {
    let (server, certs, addr) = tls_line(|certs| {
        format!(
            ",ssl_ca_cert={},ssl_verify_mode=1,ssl_min_version=3",
            certs.ca.display()
        )
    });
    let ca = certs.ca.to_str().unwrap();
    let app = |phase, client| tls_app(phase, &addr, &certs, client);
    // Verify mode 1: served without a client certificate and with the CA's; another CA's
    // certificate, presented, is still checked and refused.
    common::run_checks(app("app", None), 10);
    common::run_checks(
        app("app", Some((&certs.client_cert, &certs.client_key))),
        10,
    );
    common::run_checks(
        app("refused", Some((&certs.rogue_cert, &certs.rogue_key))),
        1,
    );
    // Minimum version 3: a client that stops at TLS 1.2 gets no session.
    let tls12 = "import ssl,socket,sys\n\
                 ctx=ssl.create_default_context(cafile=sys.argv[2])\n\
                 ctx.maximum_version=ssl.TLSVersion.TLSv1_2\n\
                 h,p=sys.argv[1].rsplit(':',1)\n\
                 try:\n\
                 \x20   s=ctx.wrap_socket(socket.create_connection((h,int(p)),timeout=10),server_hostname=h)\n\
                 \x20   s.sendall(b'version\\r\\n'); print('served', s.recv(100))\n\
                 except (ssl.SSLError, OSError) as err:\n\
                 \x20   print('refused', err)\n";
    let out = Command::new(common::python_with("pymemcache"))
        .args(["-c", tls12, &addr, ca])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.starts_with("refused"),
        "{said} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let settings = {
        let script = "import ssl,sys\nfrom pymemcache.client.base import Client\n\
                      ctx=ssl.create_default_context(cafile=sys.argv[2])\n\
                      h,p=sys.argv[1].rsplit(':',1)\n\
                      c=Client((h,int(p)),tls_context=ctx,timeout=10)\n\
                      for k,v in c.stats('settings').items(): print(k.decode(), v if not isinstance(v, bytes) else v.decode())\n";
        let out = Command::new(common::python_with("pymemcache"))
            .args(["-c", script, &addr, ca])
            .output()
            .unwrap();
        String::from_utf8(out.stdout).unwrap()
    };
    assert!(
        settings.lines().any(|l| l == "ssl_verify_mode 1"),
        "{settings}"
    );
    assert!(
        settings.lines().any(|l| l == "ssl_min_version tlsv1.3"),
        "{settings}"
    );
    assert!(server.stop().success());
}

#[test]
fn s_serves_the_unix_socket_only_and_several_l_serve_each_address() {
    let dir = common::server::fresh_data_dir();
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("m.sock");
    let mut args = vec!["-s", socket.to_str().unwrap(), "-a", "0700"];
    args.extend(user_args());
    let data_dir = dir.join("data");
    args.extend(["--data-dir", data_dir.to_str().unwrap()]);
    let stderr = dir.join("stderr");
    let mut child = Command::new(env!("CARGO_BIN_EXE_headroom"))
        .args(&args)
        .stderr(std::fs::File::create(&stderr).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut stream = loop {
        if let Ok(stream) = std::os::unix::net::UnixStream::connect(&socket) {
            break stream;
        }
        assert!(
            Instant::now() < deadline,
            "{}",
            std::fs::read_to_string(&stderr).unwrap()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    stream.write_all(b"stats settings\r\n").unwrap();
    let mut got = Vec::new();
    let mut chunk = [0u8; 4096];
    while !got.ends_with(b"END\r\n") {
        let n = stream.read(&mut chunk).unwrap();
        assert!(n > 0);
        got.extend_from_slice(&chunk[..n]);
    }
    let settings = String::from_utf8(got).unwrap();
    assert_eq!(stat(&settings, "tcpport"), "0");
    assert_eq!(stat(&settings, "inter"), "NULL");
    // The unix socket is bound before the shards start: the start-up line may come later.
    let deadline = Instant::now() + Duration::from_secs(30);
    let log = loop {
        let log = std::fs::read_to_string(&stderr).unwrap();
        if log.contains("INFO listening on ") || Instant::now() > deadline {
            break log;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(log.contains("TCP is off"), "{log}");
    assert!(
        log.contains("listening on no TCP address"),
        "no TCP listener is bound: {log}"
    );
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    assert!(child.wait().unwrap().success());

    // Two loopback addresses, one port.
    let mut args = vec!["-l", "127.0.0.1,127.0.0.2", "-p", "0"];
    args.extend(user_args());
    let data_dir = common::server::fresh_data_dir();
    args.extend(["--data-dir", data_dir.to_str().unwrap()]);
    let server = Started::start(&args, None);
    let (first, second) = (server.addrs[0], server.addrs[1]);
    assert_eq!(first.ip().to_string(), "127.0.0.1");
    assert_eq!(second.ip().to_string(), "127.0.0.2");
    assert_eq!(text(second, "set two 0 0 1\r\n2\r\n"), "STORED\r\n");
    assert_eq!(text(first, "get two\r\n"), "VALUE two 0 1\r\n2\r\nEND\r\n");
    assert_eq!(
        stat(&text(second, "stats settings\r\n"), "inter"),
        "127.0.0.1,127.0.0.2"
    );
    assert!(server.stop().success());
}

#[test]
fn d_returns_once_serving_and_p_names_the_daemon() {
    let dir = common::server::fresh_data_dir();
    std::fs::create_dir_all(&dir).unwrap();
    let pid_file = dir.join("headroom.pid");
    let log_file = dir.join("log");
    let data_dir = dir.join("data");
    let mut args = vec!["-d", "-P", pid_file.to_str().unwrap(), "-p", "0"];
    args.extend(["-l", "127.0.0.1", "--log-file", log_file.to_str().unwrap()]);
    args.extend(user_args());
    args.extend(["--data-dir", data_dir.to_str().unwrap()]);
    let status = Command::new(env!("CARGO_BIN_EXE_headroom"))
        .args(&args)
        .status()
        .unwrap();
    assert!(
        status.success(),
        "{}",
        std::fs::read_to_string(&log_file).unwrap_or_default()
    );
    // Serving already when the command returned.
    let log = std::fs::read_to_string(&log_file).unwrap();
    let addr = listening(&log).expect("the log says where it listens")[0];
    assert_eq!(text(addr, "set d 0 0 1\r\nd\r\n"), "STORED\r\n");
    let pid: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let pid = nix::unistd::Pid::from_raw(pid);
    assert_eq!(
        nix::unistd::getsid(Some(pid)).unwrap(),
        pid,
        "its own session"
    );
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    // Gone, or a zombie its new parent has not reaped yet.
    let running = |pid: nix::unistd::Pid| {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
            stat.rsplit(')')
                .next()
                .is_some_and(|s| !s.starts_with(" Z"))
        })
    };
    while running(pid) {
        assert!(Instant::now() < deadline, "the daemon did not stop");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!pid_file.exists());

    // A start that fails: the command says so with the server's status.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken_port = taken.local_addr().unwrap().port().to_string();
    let mut args = vec!["-d", "-p", &taken_port, "-l", "127.0.0.1"];
    args.extend(user_args());
    let data_dir = common::server::fresh_data_dir();
    args.extend(["--data-dir", data_dir.to_str().unwrap()]);
    let out = Command::new(env!("CARGO_BIN_EXE_headroom"))
        .args(&args)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("already served"));
}

#[test]
fn refusals_exit_with_memcached_s_status_and_one_sentence() {
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_headroom"))
            .args(args)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        )
    };
    let (status, said) = run(&["-m", "64", "-U", "11211"]);
    assert_eq!(status, Some(64));
    assert_eq!(
        said,
        "headroom: -U 11211: Headroom has no UDP; leave -U out or give -U 0 (memcached's default: off)"
    );
    let (status, said) = run(&["-m", "64", "-j"]);
    assert_eq!(status, Some(1));
    assert!(
        said.starts_with("headroom: illegal argument '-j'"),
        "{said}"
    );
    let (status, said) = run(&["-m", "64", "-o", "proxy_config=/etc/p.lua"]);
    assert_eq!(status, Some(64));
    assert!(said.contains("memcached-proxy"), "{said}");
}

/// Every flag and `-o` option memcached 1.6.45's own `-h` lists is in the table (when the
/// peers' memcached is built: `../shared/peers/build`, `scripts/install-deps`).
#[test]
fn the_table_holds_everything_memcached_h_lists() {
    let Some(program) = common::memcached::peers_memcached() else {
        eprintln!("skipped: no memcached 1.6.45 in the peers directory to ask for -h");
        return;
    };
    let out = Command::new(&program).arg("-h").output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.starts_with("memcached 1.6.45"), "{help}");
    let mut flags = 0;
    let mut options = 0;
    for line in help.lines() {
        let trimmed = line.trim_start();
        if let Some(rest) = line.strip_prefix('-') {
            let letter = rest.chars().next().unwrap();
            assert!(
                FLAGS.iter().any(|f| f.short == letter),
                "-{letter} is not in the table: {line}"
            );
            if let Some(long) = rest.split("--").nth(1) {
                let long: String = long
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
                    .collect();
                // memcached's -h spells -N's long form with an underscore; its getopt table,
                // which the reader follows, with a dash.
                let long = long.replace('_', "-");
                assert!(
                    FLAGS.iter().any(|f| f.long == Some(long.as_str())),
                    "--{long} is not in the table: {line}"
                );
            }
            flags += 1;
        } else if let Some(rest) = trimmed.strip_prefix("- ") {
            let name = rest.split(':').next().unwrap().trim();
            if name.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
                assert!(
                    OPTIONS.iter().any(|o| o.name == name),
                    "-o {name} is not in the table: {line}"
                );
                options += 1;
            }
        }
    }
    assert!(
        flags >= 30 && options >= 30,
        "{flags} flags, {options} options read"
    );
}
