//! TLS on the `--listen` port (`--tls-cert`, `--tls-key`, and `--tls-ca` for client
//! certificates), with rustls.
//!
//! A TLS connection's handshake runs on the shard that serves it, within
//! `--tls-handshake-timeout`. The session is then kept in user space: its task decrypts what
//! the client sends and writes the plaintext into one end of a unix socket pair, and encrypts
//! what comes back out of it; the other end is served as any client connection (`serve.rs`),
//! so the three protocols, SASL and large values work unchanged. That costs a copy each way
//! and a socket pair per connection. Kernel TLS (kTLS) would let the connection's own socket
//! carry plaintext after the handshake, and so keep zero-copy sends; the kernels of the
//! machines this was built on offer no `tls` ULP to test it with, so it is not used
//! (`ssl_kernel_tls no`; the start-up line says whether the kernel offers it).
//!
//! SIGHUP reloads the certificate, the key and the CA: new connections get the new ones, and a
//! file that does not load is logged and the pair in use kept.

use std::io::{Read, Write};
use std::os::fd::{FromRawFd, IntoRawFd, OwnedFd};
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime};

use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::net::TcpStream;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig, ServerConnection};

use super::endpoint::{Endpoint, Transport};
use super::shard::ShardCtx;
use crate::config::TlsFiles;

/// TLS for the whole server: the configuration new handshakes use, and its counters.
pub struct Tls {
    pub files: TlsFiles,
    pub handshake_timeout: Duration,
    config: RwLock<Arc<ServerConfig>>,
    /// When the configuration in use was loaded (STAT `time_since_server_cert_refresh`).
    loaded: Mutex<Instant>,
    /// Handshakes that made a session (memcached's `ssl_new_sessions`), and that resumed one.
    pub new_sessions: AtomicU64,
    pub resumed_sessions: AtomicU64,
    /// Handshakes that failed or timed out (memcached's `ssl_handshake_errors`).
    pub handshake_errors: AtomicU64,
    /// Sessions that ended on a TLS error after the handshake (memcached's `ssl_proto_errors`).
    pub proto_errors: AtomicU64,
    /// SIGHUP reloads that kept the old configuration.
    pub reload_errors: AtomicU64,
}

impl Tls {
    /// Loads the configuration at start: a file that does not load, a key that does not match
    /// the certificate, or a certificate outside its validity is refused with one sentence.
    pub fn load(files: TlsFiles, handshake_timeout: Duration) -> Result<Tls, String> {
        let config = build_config(&files)?;
        Ok(Tls {
            files,
            handshake_timeout,
            config: RwLock::new(Arc::new(config)),
            loaded: Mutex::new(Instant::now()),
            new_sessions: AtomicU64::new(0),
            resumed_sessions: AtomicU64::new(0),
            handshake_errors: AtomicU64::new(0),
            proto_errors: AtomicU64::new(0),
            reload_errors: AtomicU64::new(0),
        })
    }

    /// SIGHUP: loads the files again. New handshakes use the new configuration; on an error
    /// the one in use stays and the error is returned (and counted).
    pub fn reload(&self) -> Result<(), String> {
        match build_config(&self.files) {
            Ok(config) => {
                *self.config.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(config);
                *self.loaded.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
                Ok(())
            }
            Err(err) => {
                self.reload_errors.fetch_add(1, Ordering::Relaxed);
                Err(err)
            }
        }
    }

    fn current(&self) -> Arc<ServerConfig> {
        Arc::clone(&self.config.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// Seconds since the configuration in use was loaded.
    pub fn seconds_since_load(&self) -> u64 {
        self.loaded
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .elapsed()
            .as_secs()
    }

    /// memcached's `ssl_verify_mode` as its STAT prints it (OpenSSL's flags): 3 (the peer is
    /// verified, and must present a certificate) with `--tls-ca`, else 0.
    pub fn verify_mode(&self) -> u8 {
        if self.files.ca.is_some() {
            3
        } else {
            0
        }
    }
}

/// What this kernel offers for kernel TLS, for the start-up log: the `tls` ULP loaded (which
/// Headroom does not use yet), or not.
pub fn kernel_tls_offered() -> &'static str {
    match std::fs::read_to_string("/proc/sys/net/ipv4/tcp_available_ulp") {
        Ok(ulps) if ulps.split_whitespace().any(|ulp| ulp == "tls") => "offered, not used",
        Ok(_) => "not offered by this kernel",
        Err(_) => "unknown",
    }
}

/// A rustls server configuration from `files`.
fn build_config(files: &TlsFiles) -> Result<ServerConfig, String> {
    let cert_flag = format!("--tls-cert {}", files.cert.display());
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&files.cert)
        .and_then(|certs| certs.collect())
        .map_err(|err| format!("{cert_flag}: {}", pem_error(err)))?;
    let Some(leaf) = chain.first() else {
        return Err(format!("{cert_flag}: holds no PEM certificate"));
    };
    check_validity(leaf).map_err(|why| format!("{cert_flag}: {why}"))?;
    let key = PrivateKeyDer::from_pem_file(&files.key)
        .map_err(|err| format!("--tls-key {}: {}", files.key.display(), pem_error(err)))?;
    // ring, not rustls's default aws-lc-rs (whose build wants cmake): the cipher suites and
    // key exchanges memcached's OpenSSL offers; no post-quantum key exchange, which is what
    // rustls deprecates the ring provider for.
    #[allow(deprecated)]
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|err| format!("TLS: {err}"))?;
    let builder = match &files.ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let ca_flag = format!("--tls-ca {}", ca.display());
            let mut roots = RootCertStore::empty();
            for cert in CertificateDer::pem_file_iter(ca)
                .map_err(|err| format!("{ca_flag}: {}", pem_error(err)))?
            {
                let cert = cert.map_err(|err| format!("{ca_flag}: {}", pem_error(err)))?;
                roots
                    .add(cert)
                    .map_err(|err| format!("{ca_flag}: not a CA certificate: {err}"))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|err| format!("{ca_flag}: {err}"))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    builder.with_single_cert(chain, key).map_err(|err| {
        let why = match err {
            rustls::Error::InconsistentKeys(_) => {
                "the key does not belong to the certificate".to_string()
            }
            other => other.to_string(),
        };
        format!(
            "--tls-cert {} and --tls-key {}: {why}",
            files.cert.display(),
            files.key.display()
        )
    })
}

fn pem_error(err: rustls::pki_types::pem::Error) -> String {
    match err {
        rustls::pki_types::pem::Error::Io(err) => err.to_string(),
        rustls::pki_types::pem::Error::NoItemsFound => "holds no PEM item of that kind".into(),
        other => format!("not readable as PEM: {other:?}"),
    }
}

/// Refuses a certificate that is not valid now: clients would refuse it anyway, and a server
/// that starts with it serves nobody.
fn check_validity(cert: &CertificateDer<'_>) -> Result<(), String> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref())
        .map_err(|err| format!("the certificate cannot be parsed: {err}"))?;
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let validity = parsed.validity();
    if validity.not_after.timestamp() < now {
        return Err(format!(
            "the certificate expired on {}; renew it",
            validity.not_after
        ));
    }
    if validity.not_before.timestamp() > now {
        return Err(format!(
            "the certificate is not valid before {}; check the clock or the certificate",
            validity.not_before
        ));
    }
    Ok(())
}

/// Bytes read from or written to a socket at a time.
const RELAY_CHUNK_BYTES: usize = 64 << 10;

/// Serves one TLS client on `stream`: the handshake, then the session relayed to a plain
/// connection over a socket pair. Returns once both are done.
pub async fn serve(ctx: Rc<ShardCtx>, tls: &Arc<Tls>, mut stream: TcpStream, endpoint: Endpoint) {
    // The served connection's socket is the pair's; the client's is this one. Without it, a
    // reply's last record waits for the client's delayed ACK (Nagle).
    if let Err(err) = stream.set_nodelay(true) {
        tracing::debug!(%err, "TCP_NODELAY refused");
    }
    let Ok(mut session) = ServerConnection::new(tls.current()) else {
        tls.handshake_errors.fetch_add(1, Ordering::Relaxed);
        return;
    };
    let handshake = async {
        glommio::timer::timeout(tls.handshake_timeout, async {
            Ok(handshake(&mut stream, &mut session).await)
        })
        .await
        .unwrap_or_else(|_| Err("no handshake within --tls-handshake-timeout".to_string()))
    };
    let stopped = async {
        ctx.stop.wait().await;
        Err("the server stops".to_string())
    };
    let after_handshake = match futures_lite::future::or(handshake, stopped).await {
        Ok(bytes) => bytes,
        Err(why) => {
            tls.handshake_errors.fetch_add(1, Ordering::Relaxed);
            if let Some(held_back) = ctx.refusal_log.allow(super::unix_now()) {
                tracing::info!(
                    shard = ctx.id,
                    peer = %endpoint.peer,
                    held_back,
                    "TLS handshake failed: {why} (one line per second per shard at most; STAT ssl_handshake_errors counts every one)"
                );
            }
            return;
        }
    };
    // memcached counts sessions made, not resumed ones.
    if session.handshake_kind() != Some(rustls::HandshakeKind::Resumed) {
        tls.new_sessions.fetch_add(1, Ordering::Relaxed);
    } else {
        tls.resumed_sessions.fetch_add(1, Ordering::Relaxed);
    }
    let (outer, inner) = match socket_pair() {
        Ok(pair) => pair,
        Err(err) => {
            tracing::warn!(shard = ctx.id, %err, "TLS: no socket pair for a new session; closing it");
            return;
        }
    };
    let inner_endpoint = Endpoint {
        transport: Transport::TlsRelay,
        ..endpoint
    };
    let served = super::serve::serve(Rc::clone(&ctx), inner, inner_endpoint);
    // At the stop the served connection is cut off after its grace (`shard_main`); the
    // client's socket, which the shard does not know, goes a grace later even if the client
    // never reads what is still being relayed to it.
    let relayed = futures_lite::future::or(
        relay(tls, (stream, after_handshake), outer, session),
        async {
            ctx.stop.wait().await;
            glommio::timer::sleep(2 * super::STOP_WRITE_GRACE).await;
        },
    );
    futures_lite::future::zip(served, relayed).await;
}

/// Runs the handshake on `stream` until it completes, returning the bytes read after it (the
/// client's first records may come in the same read), or fails (Err: why, after the alert
/// rustls has for the client is sent).
async fn handshake(
    stream: &mut TcpStream,
    session: &mut ServerConnection,
) -> Result<Vec<u8>, String> {
    let mut buf = vec![0u8; 16 << 10];
    let mut out = Vec::new();
    let mut after = Vec::new();
    loop {
        while session.wants_write() {
            out.clear();
            session.write_tls(&mut out).map_err(|e| e.to_string())?;
            stream.write_all(&out).await.map_err(|e| e.to_string())?;
        }
        if !session.is_handshaking() {
            return Ok(after);
        }
        let n = stream.read(&mut buf).await.map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("the client closed the connection".into());
        }
        // rustls may take a read in parts; bytes past the handshake are the session's.
        let mut rest = &buf[..n];
        while !rest.is_empty() && session.is_handshaking() {
            session.read_tls(&mut rest).map_err(|e| e.to_string())?;
            if let Err(err) = session.process_new_packets() {
                // The alert that says why (a certificate the CA did not sign, say).
                out.clear();
                if session.write_tls(&mut out).is_ok() && !out.is_empty() {
                    let _ = stream.write_all(&out).await;
                }
                return Err(err.to_string());
            }
        }
        after = rest.to_vec();
    }
}

/// A connected pair of unix stream sockets, as glommio streams: the relay's end and the end
/// the connection is served on.
fn socket_pair() -> std::io::Result<(TcpStream, TcpStream)> {
    use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
    let (a, b) = socketpair(
        AddressFamily::Unix,
        SockType::Stream,
        None,
        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
    )?;
    Ok((into_stream(a), into_stream(b)))
}

fn into_stream(fd: OwnedFd) -> TcpStream {
    // SAFETY: the descriptor is a connected stream socket nothing else owns once `into_raw_fd`
    // gave it up; glommio's stream type does only plain socket calls on it, and closes it.
    unsafe { TcpStream::from_raw_fd(fd.into_raw_fd()) }
}

/// Moves the session's bytes both ways until the served connection closes its end: the
/// client's records decrypted into `outer`, and what comes out of `outer` encrypted to the
/// client. The client closing (or a TLS error) shuts `outer` for writing, so the connection
/// sees the end of its input; the connection closing ends the session with a close_notify.
async fn relay(
    tls: &Tls,
    (tcp, after_handshake): (TcpStream, Vec<u8>),
    outer: TcpStream,
    session: ServerConnection,
) {
    use std::cell::RefCell;
    let session = RefCell::new(session);
    let (mut tcp_in, mut tcp_out) = futures_lite::io::split(tcp);
    let (mut outer_in, mut outer_out) = futures_lite::io::split(outer);
    // Whether the client direction produced TLS records (a reply to a key update) that the
    // other direction has not sent yet.
    let (wake_tx, wake_rx) = glommio::channels::local_channel::new_bounded::<()>(1);

    let client_to_server = async {
        let mut buf = vec![0u8; RELAY_CHUNK_BYTES];
        let mut plain = vec![0u8; RELAY_CHUNK_BYTES];
        // What came with the handshake's last read goes first: plaintext rustls decrypted
        // already, then the bytes it did not take.
        let mut first = Some(after_handshake);
        let mut open = pass_plaintext(&session, &mut plain, &mut outer_out).await;
        while open {
            let n = match first.take() {
                Some(bytes) => {
                    buf[..bytes.len()].copy_from_slice(&bytes);
                    bytes.len()
                }
                None => match tcp_in.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                },
            };
            // rustls takes records only while its plaintext buffer has room: what it left is
            // offered again once the plaintext is passed on.
            let mut rest = &buf[..n];
            while open && !rest.is_empty() {
                {
                    let mut s = session.borrow_mut();
                    let failed = match s.read_tls(&mut rest) {
                        Err(err) => Some(err.to_string()),
                        Ok(_) => s.process_new_packets().err().map(|err| err.to_string()),
                    };
                    if let Some(why) = failed {
                        tracing::debug!(%why, "TLS session ended by an error");
                        tls.proto_errors.fetch_add(1, Ordering::Relaxed);
                        open = false;
                        break;
                    }
                    if s.wants_write() {
                        let _ = wake_tx.try_send(());
                    }
                }
                open = pass_plaintext(&session, &mut plain, &mut outer_out).await;
            }
        }
        // The connection reads to the end of its input, then finishes.
        let _ = outer_out.close().await;
        futures_lite::future::pending::<()>().await;
    };

    let server_to_client = async {
        let mut plain = vec![0u8; RELAY_CHUNK_BYTES];
        let mut records = Vec::with_capacity(RELAY_CHUNK_BYTES + 1024);
        loop {
            let read =
                futures_lite::future::or(async { Some(outer_in.read(&mut plain).await) }, async {
                    wake_rx.recv().await;
                    None
                })
                .await;
            if let Some(read) = read {
                let n = match read {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                // rustls takes plaintext while its buffer of records has room (64 KiB):
                // records go out to make more.
                let mut rest = &plain[..n];
                while !rest.is_empty() {
                    let taken = session.borrow_mut().writer().write(rest);
                    match taken {
                        Ok(0) => {
                            if flush(&session, &mut records, &mut tcp_out).await.is_err() {
                                return;
                            }
                        }
                        Ok(taken) => rest = &rest[taken..],
                        Err(_) => return,
                    }
                }
            }
            if flush(&session, &mut records, &mut tcp_out).await.is_err() {
                return;
            }
        }
        session.borrow_mut().send_close_notify();
        let _ = flush(&session, &mut records, &mut tcp_out).await;
        let _ = tcp_out.close().await;
    };
    futures_lite::future::or(server_to_client, client_to_server).await;
}

/// Writes the plaintext the session holds to the served connection; false once the client
/// sent close_notify or the connection's end is gone.
async fn pass_plaintext(
    session: &std::cell::RefCell<ServerConnection>,
    plain: &mut [u8],
    outer: &mut futures_lite::io::WriteHalf<TcpStream>,
) -> bool {
    loop {
        let read = session.borrow_mut().reader().read(plain);
        match read {
            Ok(0) => return false,
            Ok(n) => {
                if outer.write_all(&plain[..n]).await.is_err() {
                    return false;
                }
            }
            Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => return true,
            Err(_) => return false,
        }
    }
}

/// Writes every record the session has ready to `tcp`.
async fn flush(
    session: &std::cell::RefCell<ServerConnection>,
    records: &mut Vec<u8>,
    tcp: &mut futures_lite::io::WriteHalf<TcpStream>,
) -> std::io::Result<()> {
    loop {
        records.clear();
        {
            let mut s = session.borrow_mut();
            while s.wants_write() && records.len() < RELAY_CHUNK_BYTES {
                s.write_tls(records)?;
            }
        }
        if records.is_empty() {
            return Ok(());
        }
        tcp.write_all(records).await?;
    }
}
