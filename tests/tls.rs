//! TLS on `--listen` through the real binary, with certificates `openssl` makes here
//! (`common::certs`): pymemcache with a TLS context (0 B to 5 MiB, multi-get, CAS), mutual
//! TLS with the CA's client certificate, without one and with another CA's, SIGHUP reloading
//! the certificate for new connections (and keeping it when the new files are bad), a stalled
//! handshake dropped, a plaintext client refused, an expired or X.509 version 1 certificate
//! refused at start with a sentence (and a version 1 client certificate logged with one),
//! addresses of each TLS prefix side by side, session resumption on and off, a small
//! `--tls-write-buffer`, and the STAT and settings lines.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::certs::Certs;
use common::server::{fresh_data_dir, run_to_exit, Server};

fn path(p: &Path) -> String {
    p.display().to_string()
}

/// tls_app.py's `phase` against `server`, with the client certificate `client` if given.
fn app(phase: &str, server: &Server, certs: &Certs, client: Option<(&Path, &Path)>) -> Command {
    app_at(phase, &server.addr.to_string(), certs, client)
}

/// [`app`] against one of the server's addresses, `addr` (`HOST:PORT`).
fn app_at(phase: &str, addr: &str, certs: &Certs, client: Option<(&Path, &Path)>) -> Command {
    let mut command = Command::new(common::python_with("pymemcache"));
    command
        .arg(common::client_script("tls_app.py"))
        .args([phase, addr, &path(&certs.ca)]);
    if let Some((cert, key)) = client {
        command.args([path(cert), path(key)]);
    }
    command
}

fn tls_server(certs: &Certs, extra: &[&str]) -> Server {
    let (cert, key) = (path(&certs.server_cert), path(&certs.server_key));
    let mut args = vec![
        "--tls-cert",
        &cert,
        "--tls-key",
        &key,
        "--max-item-size",
        "8M",
    ];
    args.extend_from_slice(extra);
    Server::start(&args)
}

/// `stats` and `stats settings` over TLS, read with pymemcache (the tests' binary client
/// speaks plain TCP): a `name value` line each.
fn text_stats(server: &Server, certs: &Certs, client: Option<(&Path, &Path)>) -> String {
    let script = "import ssl,sys\nfrom pymemcache.client.base import Client\n\
                  ctx=ssl.create_default_context(cafile=sys.argv[2])\n\
                  if len(sys.argv)>3: ctx.load_cert_chain(sys.argv[3],sys.argv[4])\n\
                  h,p=sys.argv[1].rsplit(':',1)\n\
                  c=Client((h,int(p)),tls_context=ctx,timeout=10)\n\
                  for group in ('', 'settings'):\n\
                  \x20   args=(group,) if group else ()\n\
                  \x20   for k,v in c.stats(*args).items(): print(k.decode(), v if not isinstance(v, bytes) else v.decode())\n";
    let mut command = Command::new(common::python_with("pymemcache"));
    command.args(["-c", script, &server.addr.to_string(), &path(&certs.ca)]);
    if let Some((cert, key)) = client {
        command.args([path(cert), path(key)]);
    }
    let out = command.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Sends `bytes` on a new TCP connection and reads until the server closes it (10 s at most):
/// what came back, and how long the server took to close.
fn send_and_read_to_end(server: &Server, bytes: &[u8]) -> (Vec<u8>, Duration) {
    let mut stream = TcpStream::connect(server.addr).unwrap();
    stream.write_all(bytes).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let started = Instant::now();
    let mut got = Vec::new();
    let _ = stream.read_to_end(&mut got);
    (got, started.elapsed())
}

fn stat(stats: &str, name: &str) -> String {
    stats
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .unwrap_or_else(|| panic!("no STAT {name} in {stats}"))
        .to_string()
}

#[test]
fn pymemcache_over_tls_stores_and_reads_values_up_to_5_mib() {
    let certs = Certs::make(&fresh_data_dir());
    let server = tls_server(&certs, &["--threads", "2"]);
    common::run_checks(app("app", &server, &certs, None), 10);
    for _ in 0..5 {
        common::run_checks(app("coalesced", &server, &certs, None), 1);
    }
    let stats = text_stats(&server, &certs, None);
    assert!(stat(&stats, "ssl_new_sessions").parse::<u64>().unwrap() >= 2);
    assert_eq!(stat(&stats, "ssl_handshake_errors"), "0");
    assert_eq!(stat(&stats, "ssl_enabled"), "yes");
    assert_eq!(stat(&stats, "ssl_chain_cert"), path(&certs.server_cert));
    assert_eq!(stat(&stats, "ssl_verify_mode"), "0");
    assert_eq!(stat(&stats, "ssl_min_version"), "tlsv1.2");
    assert_eq!(stat(&stats, "ssl_kernel_tls"), "no");
    assert_eq!(stat(&stats, "listen_tls"), "tls");
    assert!(server.logs("TLS on --listen, in user space"));
    // The same over plain socket calls, and on the ring with one-shot receives: the session
    // is a stage of whichever path the connection takes.
    for path_flags in [["--io-ring", "off"], ["--multishot-receive", "off"]] {
        let server = tls_server(&certs, &path_flags);
        common::run_checks(app("app", &server, &certs, None), 10);
    }
}

#[test]
fn mutual_tls_serves_only_clients_the_ca_signed() {
    let certs = Certs::make(&fresh_data_dir());
    let ca = path(&certs.ca);
    let server = tls_server(&certs, &["--tls-ca", &ca]);
    let client = Some((certs.client_cert.as_path(), certs.client_key.as_path()));
    common::run_checks(app("app", &server, &certs, client), 10);
    common::run_checks(app("refused", &server, &certs, None), 1);
    assert_eq!(
        stat(&text_stats(&server, &certs, client), "ssl_verify_mode"),
        "3"
    );
    let rogue = Some((certs.rogue_cert.as_path(), certs.rogue_key.as_path()));
    common::run_checks(app("refused", &server, &certs, rogue), 1);
    // A version 1 client certificate the CA signed: refused, and the log says why in words
    // (a second on, past the log's one line per second per shard).
    std::thread::sleep(Duration::from_millis(1100));
    let v1 = Some((certs.v1_cert.as_path(), certs.server_key.as_path()));
    common::run_checks(app("refused", &server, &certs, v1), 1);
    assert!(
        server.logs("the client's certificate is not X.509 version 3"),
        "{}",
        server.log_text()
    );
    // A plaintext binary client: no binary reply (magic 0x81), at most a TLS alert.
    let (got, _) = send_and_read_to_end(&server, &common::server::frame(0x0b, &[], b"", &[], 0, 0));
    assert!(
        got.first() != Some(&0x81),
        "a plaintext binary client was served: {got:?}"
    );
    assert!(server.logs("TLS handshake failed"));
}

#[test]
fn sighup_reloads_the_certificate_for_new_connections() {
    let certs = Certs::make(&fresh_data_dir());
    let server = tls_server(&certs, &[]);
    let first = certs.server_serial();
    assert_eq!(certs.served_serial(server.addr), first);
    let renewed = certs.renew_server();
    assert_ne!(renewed, first);
    // Until the signal the old certificate is served.
    assert_eq!(certs.served_serial(server.addr), first);
    server.signal(nix::sys::signal::Signal::SIGHUP);
    assert!(server.logs("TLS certificate, key and CA reloaded"));
    assert_eq!(certs.served_serial(server.addr), renewed);
    // A certificate file that does not load: logged, and the pair in use kept.
    std::fs::write(&certs.server_cert, "not a certificate\n").unwrap();
    server.signal(nix::sys::signal::Signal::SIGHUP);
    assert!(server.logs("TLS files not reloaded, the ones in use are kept"));
    assert_eq!(certs.served_serial(server.addr), renewed);
    common::run_checks(app("app", &server, &certs, None), 10);
    // memcached's `refresh_certs` does what SIGHUP does, over the connection.
    let again = certs.renew_server();
    let script = "import ssl,sys\nfrom pymemcache.client.base import Client\n\
                  ctx=ssl.create_default_context(cafile=sys.argv[2])\n\
                  h,p=sys.argv[1].rsplit(':',1)\n\
                  c=Client((h,int(p)),tls_context=ctx,timeout=10)\n\
                  print(c.raw_command(b'refresh_certs', b'\\r\\n'))\n";
    let out = Command::new(common::python_with("pymemcache"))
        .args(["-c", script, &server.addr.to_string(), &path(&certs.ca)])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "b'OK'\n"); // the line, its CRLF taken
    assert_eq!(certs.served_serial(server.addr), again);
    // Without TLS it is memcached's answer.
    let plain = Server::start(&[]);
    let mut c = TcpStream::connect(plain.addr).unwrap();
    c.write_all(b"refresh_certs\r\n").unwrap();
    let mut reply = [0u8; 23];
    c.read_exact(&mut reply).unwrap();
    assert_eq!(&reply, b"Error TLS not enabled\r\n");
}

#[test]
fn a_stalled_handshake_is_dropped_and_plaintext_gets_no_reply() {
    let certs = Certs::make(&fresh_data_dir());
    let server = tls_server(&certs, &["--tls-handshake-timeout", "1"]);
    // Half a ClientHello, then nothing.
    let (_, waited) = send_and_read_to_end(&server, &[0x16, 0x03, 0x01, 0x02, 0x00, 0x01]);
    assert!(
        waited >= Duration::from_millis(900) && waited < Duration::from_secs(8),
        "dropped after {waited:?}"
    );
    // A plaintext client gets no cache reply: at most a TLS alert record, then the close.
    let (got, _) = send_and_read_to_end(&server, b"version\r\nget k\r\n");
    assert!(
        got.is_empty() || got[0] == 0x15,
        "a plaintext client got {got:?}"
    );
    assert!(!String::from_utf8_lossy(&got).contains("VERSION"));
    let stats = text_stats(&server, &certs, None);
    assert!(stat(&stats, "ssl_handshake_errors").parse::<u64>().unwrap() >= 2);
}

#[test]
fn bad_tls_files_are_refused_at_start_with_one_sentence() {
    let certs = Certs::make(&fresh_data_dir());
    let dir = fresh_data_dir();
    let data_dir = path(&dir);
    let (cert, key, expired, v1) = (
        path(&certs.server_cert),
        path(&certs.server_key),
        path(&certs.expired_cert),
        path(&certs.v1_cert),
    );
    let ca_key = certs.dir.join("ca.key").display().to_string();
    let cases: [(&[&str], &str); 9] = [
        (
            &["--tls-cert", &expired, "--tls-key", &key],
            "the certificate expired on",
        ),
        (
            &["--tls-cert", &v1, "--tls-key", &key],
            "the certificate is X.509 version 1, and Headroom's TLS (rustls) takes version 3 only",
        ),
        (
            &["--tls-cert", &cert, "--tls-key", &ca_key],
            "the key does not belong to the certificate",
        ),
        (&["--tls-cert", &cert], "--tls-cert needs --tls-key"),
        (
            &["--tls-ca", &cert],
            "--tls-ca needs --tls-cert and --tls-key",
        ),
        (
            &["--listen", "tls:127.0.0.1:0"],
            "--listen tls:127.0.0.1:0: `tls:` serves TLS, which needs --tls-cert and --tls-key",
        ),
        (
            &[
                "--tls-cert",
                &cert,
                "--tls-key",
                &key,
                "--tls-client-cert",
                "none",
            ],
            "--tls-client-cert needs --tls-ca",
        ),
        (
            &[
                "--tls-cert",
                &cert,
                "--tls-key",
                &key,
                "--tls-write-buffer",
                "512",
            ],
            "--tls-write-buffer needs a size from 1K to 16M",
        ),
        (
            &[
                "--tls-cert",
                &cert,
                "--tls-key",
                &key,
                "--listen",
                "127.0.0.1:11299,plain:127.0.0.1:11299",
            ],
            "127.0.0.1:11299 is given twice, as tls and as off; one address has one TLS",
        ),
    ];
    for (flags, said) in cases {
        let mut args = vec!["--listen", "127.0.0.1:0", "--data-dir", &data_dir];
        args.extend_from_slice(flags);
        let (status, stderr, _) = run_to_exit(&args, Duration::from_secs(30));
        assert_eq!(status, Some(2), "{flags:?}: {stderr}");
        assert!(stderr.contains(said), "{flags:?}: {stderr}");
    }
}

/// Large replies leave straight from the session's records while the socket takes them, and
/// through a send buffer when it is full, sealed `--tls-write-buffer` at a time: a reader that
/// takes them slowly still gets every byte, in order, on every path and with the smallest
/// write buffer.
#[test]
fn a_slow_tls_reader_gets_every_byte_of_large_values() {
    let certs = Certs::make(&fresh_data_dir());
    let paths: [&[&str]; 4] = [
        &[],
        &["--io-ring", "off"],
        &["--tls-write-buffer", "1K"],
        &["--tls-write-buffer", "1K", "--io-ring", "off"],
    ];
    for path_flags in paths {
        let server = tls_server(&certs, path_flags);
        common::run_checks(app("slow", &server, &certs, None), 2);
    }
}

/// Each `--listen` address serves the TLS its prefix says, beside the others: an unprefixed
/// one what `--tls-ca` says (a certificate required), `plain:` none, `tls:` TLS without a
/// client certificate, `mtls:` TLS with one; all serve the same items. A session made where
/// no certificate was asked for does not let a client past `mtls:`.
#[test]
fn each_listen_address_serves_the_tls_its_prefix_says() {
    let certs = Certs::make(&fresh_data_dir());
    let ca = path(&certs.ca);
    let [plain, tls, mtls] = [(); 3].map(|()| format!("127.0.0.1:{}", common::free_port()));
    let listen = format!("127.0.0.1:0,plain:{plain},tls:{tls},mtls:{mtls}");
    let server = tls_server(&certs, &["--tls-ca", &ca, "--listen", &listen]);
    let client = Some((certs.client_cert.as_path(), certs.client_key.as_path()));
    // The unprefixed address wants a certificate, as --tls-ca says.
    common::run_checks(app("refused", &server, &certs, None), 1);
    common::run_checks(app("coalesced", &server, &certs, client), 1);
    // tls: asks for none; mtls: requires one.
    common::run_checks(app_at("coalesced", &tls, &certs, None), 1);
    common::run_checks(app_at("refused", &mtls, &certs, None), 1);
    common::run_checks(app_at("coalesced", &mtls, &certs, client), 1);
    let mut elsewhere = app_at("resume-elsewhere", &tls, &certs, None);
    elsewhere.env("TLS_ELSEWHERE", &mtls);
    common::run_checks(elsewhere, 2);
    // plain: speaks plain TCP, to the same items, and no TLS.
    let mut plain_client = common::server::Client::connect(plain.parse().unwrap());
    let got = plain_client.get(b"coalesced");
    assert_eq!(
        got.value, b"hello",
        "the item a TLS client stored, read over plain:"
    );
    common::run_checks(app_at("refused", &plain, &certs, None), 1);
    let stats = text_stats(&server, &certs, client);
    assert_eq!(stat(&stats, "listen_tls"), "mtls,off,tls,mtls");
    assert_eq!(stat(&stats, "ssl_verify_mode"), "3");
}

/// An `mtls:` address without `--tls-ca` has no CA to trust, as memcached's OpenSSL without
/// `ssl_ca_cert`: every client of it is refused, one with a certificate too, and the start-up
/// log says so; the unprefixed address beside it serves TLS as usual.
#[test]
fn mtls_without_a_ca_refuses_every_client_and_says_so() {
    let certs = Certs::make(&fresh_data_dir());
    let mtls = format!("127.0.0.1:{}", common::free_port());
    let listen = format!("127.0.0.1:0,mtls:{mtls}");
    let server = tls_server(&certs, &["--listen", &listen]);
    assert!(server.logs("there is no --tls-ca to verify one against"));
    let client = Some((certs.client_cert.as_path(), certs.client_key.as_path()));
    common::run_checks(app_at("refused", &mtls, &certs, client), 1);
    common::run_checks(app_at("refused", &mtls, &certs, None), 1);
    common::run_checks(app("coalesced", &server, &certs, None), 1);
}

/// A client that reconnects resumes its session with `--tls-session-resumption on` (the
/// default) on TLS 1.2 and 1.3, and never with it off, where, as memcached without
/// `ssl_session_cache`, STAT `ssl_new_sessions` is not shown; `stats settings` says which,
/// and the write buffer.
#[test]
fn sessions_resume_only_with_session_resumption_on() {
    let certs = Certs::make(&fresh_data_dir());
    let server = tls_server(&certs, &["--tls-write-buffer", "64K"]);
    common::run_checks(app("resumed", &server, &certs, None), 2);
    let stats = text_stats(&server, &certs, None);
    assert_eq!(stat(&stats, "ssl_session_cache"), "yes");
    assert_eq!(stat(&stats, "ssl_wbuf_size"), "65536");
    assert!(stat(&stats, "tls_resumed_sessions").parse::<u64>().unwrap() >= 2);
    assert!(stat(&stats, "ssl_new_sessions").parse::<u64>().unwrap() >= 2);

    let server = tls_server(&certs, &["--tls-session-resumption", "off"]);
    common::run_checks(app("not-resumed", &server, &certs, None), 2);
    let stats = text_stats(&server, &certs, None);
    assert_eq!(stat(&stats, "ssl_session_cache"), "no");
    assert_eq!(stat(&stats, "ssl_wbuf_size"), "262144");
    assert_eq!(stat(&stats, "tls_resumed_sessions"), "0");
    assert!(!stats.contains("ssl_new_sessions"), "{stats}");
}

/// A TLS client that asked for far more than the sockets hold and never reads does not hold
/// the stop up: its connection is cut off after the grace, as a plain one is.
#[test]
fn a_tls_reader_that_never_reads_does_not_hold_up_the_stop() {
    use std::io::BufRead;
    let certs = Certs::make(&fresh_data_dir());
    let server = tls_server(&certs, &[]);
    let mut stalled = app("stall", &server, &certs, None)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(stalled.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    if line != "# sent\n" {
        let mut said = String::new();
        let _ = stalled
            .stderr
            .take()
            .map(|mut e| e.read_to_string(&mut said));
        panic!("the stalling client did not get to send: {line:?} {said}");
    }
    std::thread::sleep(Duration::from_millis(500));
    let started = Instant::now();
    assert_eq!(server.stop().code(), Some(0));
    let took = started.elapsed();
    let _ = stalled.kill();
    let _ = stalled.wait();
    assert!(took < Duration::from_secs(8), "the stop took {took:?}");
}
