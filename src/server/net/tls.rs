//! A TLS session on a `--listen` connection: the handshake on the shard that serves it, then
//! the session kept in user space, relayed to a plain connection through a socket pair
//! (`tls_config.rs` holds the certificate, key and CA; the module comment there says why).

use std::io::{Read, Write};
use std::os::fd::{FromRawFd, IntoRawFd, OwnedFd};
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::net::TcpStream;
use rustls::ServerConnection;

use crate::server::shard::ctx::ShardCtx;
use crate::server::shard::endpoint::{Endpoint, Transport};
use crate::server::shard::tls_config::Tls;

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
            if let Some(held_back) = ctx
                .refusal_log
                .allow(crate::server::shard::shared::unix_now())
            {
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
            glommio::timer::sleep(2 * crate::server::shard::shared::STOP_WRITE_GRACE).await;
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
