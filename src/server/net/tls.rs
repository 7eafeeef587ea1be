//! A TLS session on a `--listen` connection: the handshake on the shard that serves it, then
//! the connection served as any other, its session a stage of its wire (`tls_stage.rs`:
//! records opened as they are read and sealed as replies are written, on the client's own
//! socket). `tls_config.rs` holds the certificate, key and CA.

use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::net::TcpStream;
use rustls::ServerConnection;

use crate::config::ClientCerts;
use crate::server::shard::ctx::ShardCtx;
use crate::server::shard::endpoint::{Endpoint, Transport};
use crate::server::shard::tls_config::Tls;
use crate::server::shard::tls_stage::TlsStage;

/// Serves one TLS client on `stream`: the handshake, then the connection through its session.
/// `admitted` counts the connection until this ends.
pub(crate) async fn serve(
    ctx: Rc<ShardCtx>,
    tls: Arc<Tls>,
    policy: ClientCerts,
    mut stream: TcpStream,
    endpoint: Endpoint,
    admitted: super::conn::Admitted,
) {
    let tls = &tls;
    let Ok(mut session) = ServerConnection::new(tls.current(policy)) else {
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
    let endpoint = Endpoint {
        transport: Transport::Tls,
        ..endpoint
    };
    let stage = TlsStage::new(Arc::clone(tls), session, after_handshake);
    // Boxed: the handshake's state above is not kept for the connection's life.
    Box::pin(super::serve::serve(
        ctx,
        stream,
        endpoint,
        Some(Box::new(stage)),
        admitted,
    ))
    .await;
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
                return Err(handshake_error(&err));
            }
        }
        after = rest.to_vec();
    }
}

/// Why a handshake failed, as a sentence: rustls's own words, but for what it names only by a
/// webpki code.
fn handshake_error(err: &rustls::Error) -> String {
    let said = err.to_string();
    if said.contains("UnsupportedCertVersion") {
        return "the client's certificate is not X.509 version 3, the only version Headroom's \
                TLS (rustls) takes (OpenSSL-based servers such as memcached take version 1 \
                too); the client needs a version 3 certificate"
            .to_string();
    }
    said
}
