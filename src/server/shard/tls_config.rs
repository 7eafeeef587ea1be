//! TLS on the `--listen` port (`--tls-cert`, `--tls-key`, and `--tls-ca` for client
//! certificates), with rustls.
//!
//! A TLS connection's handshake runs on the shard that serves it, within
//! `--tls-handshake-timeout`. The session is then kept in user space, a stage of the
//! connection's wire (`tls_stage.rs`): the three protocols, SASL and large values run over it
//! unchanged. Kernel TLS (kTLS) would let the connection's own socket carry plaintext after
//! the handshake, and so keep zero-copy sends; the kernels of the machines this was built on
//! offer no `tls` ULP to test it with, so it is not used (`ssl_kernel_tls no`; the start-up
//! line says whether the kernel offers it).
//!
//! Each `--listen` address asks what its prefix says of a client's certificate (none, optional,
//! required), so there is one rustls configuration for each policy a listener has, each with
//! its own session cache: a session made where no certificate was asked for never resumes
//! where one is required. With `--tls-session-resumption off` no session is kept or resumed.
//!
//! SIGHUP reloads the certificate, the key and the CA: new connections get the new ones, and a
//! file that does not load is logged and the pair in use kept.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime};

use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::UnixTime;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{NoServerSessionStorage, ServerSessionMemoryCache, WebPkiClientVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, RootCertStore, ServerConfig};

use crate::config::{ClientCerts, TlsFiles};

/// Sessions each configuration keeps for resumption, the least recently made dropped first:
/// a few per connection of the default `--max-connections`, a few hundred bytes each.
const SESSION_CACHE_ENTRIES: usize = 4096;

/// TLS for the whole server: the configurations new handshakes use, and their counters.
pub struct Tls {
    pub files: TlsFiles,
    pub handshake_timeout: Duration,
    /// One configuration for each client-certificate policy a listener has.
    configs: RwLock<Vec<(ClientCerts, Arc<ServerConfig>)>>,
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
    /// Loads the configurations of the `policies` the listeners have at start: a file that
    /// does not load, a key that does not match the certificate, or a certificate outside its
    /// validity is refused with one sentence.
    pub fn load(
        files: TlsFiles,
        policies: &[ClientCerts],
        handshake_timeout: Duration,
    ) -> Result<Tls, String> {
        let mut policies = policies.to_vec();
        policies.sort();
        policies.dedup();
        let configs = build_configs(&files, &policies)?;
        Ok(Tls {
            files,
            handshake_timeout,
            configs: RwLock::new(configs),
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
        let policies: Vec<ClientCerts> = self
            .configs
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(policy, _)| *policy)
            .collect();
        match build_configs(&self.files, &policies) {
            Ok(configs) => {
                *self.configs.write().unwrap_or_else(|e| e.into_inner()) = configs;
                *self.loaded.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
                Ok(())
            }
            Err(err) => {
                self.reload_errors.fetch_add(1, Ordering::Relaxed);
                Err(err)
            }
        }
    }

    /// The configuration for a listener with this client-certificate policy (one was loaded
    /// for every listener's at start).
    pub(crate) fn current(&self, policy: ClientCerts) -> Arc<ServerConfig> {
        let configs = self.configs.read().unwrap_or_else(|e| e.into_inner());
        let (_, config) = configs
            .iter()
            .find(|(loaded, _)| *loaded == policy)
            .expect("a configuration is loaded for every listener's policy");
        Arc::clone(config)
    }

    /// Seconds since the configuration in use was loaded.
    pub fn seconds_since_load(&self) -> u64 {
        self.loaded
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .elapsed()
            .as_secs()
    }

    /// memcached's `ssl_verify_mode` as its STAT prints it (OpenSSL's flags), for an address
    /// without a prefix.
    pub fn verify_mode(&self) -> u8 {
        match self.files.client_certs {
            ClientCerts::NotAsked => 0,
            // OpenSSL's SSL_VERIFY_PEER: asked for, checked when given.
            ClientCerts::Optional => 1,
            // SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT.
            ClientCerts::Required => 3,
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

/// A rustls configuration for each of `policies`, from `files`.
fn build_configs(
    files: &TlsFiles,
    policies: &[ClientCerts],
) -> Result<Vec<(ClientCerts, Arc<ServerConfig>)>, String> {
    policies
        .iter()
        .map(|&policy| Ok((policy, Arc::new(build_config(files, policy)?))))
        .collect()
}

/// A rustls server configuration from `files`, asking clients for certificates as `policy`
/// says.
fn build_config(files: &TlsFiles, policy: ClientCerts) -> Result<ServerConfig, String> {
    let cert_flag = format!("--tls-cert {}", files.cert.display());
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&files.cert)
        .and_then(|certs| certs.collect())
        .map_err(|err| format!("{cert_flag}: {}", pem_error(err)))?;
    let Some(leaf) = chain.first() else {
        return Err(format!("{cert_flag}: holds no PEM certificate"));
    };
    check_certificate(leaf).map_err(|why| format!("{cert_flag}: {why}"))?;
    let key = PrivateKeyDer::from_pem_file(&files.key)
        .map_err(|err| format!("--tls-key {}: {}", files.key.display(), pem_error(err)))?;
    // ring, not rustls's default aws-lc-rs (whose build wants cmake): the cipher suites and
    // key exchanges memcached's OpenSSL offers; no post-quantum key exchange, which is what
    // rustls deprecates the ring provider for.
    #[allow(deprecated)]
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let versions: &[&rustls::SupportedProtocolVersion] = match files.tls13_only {
        true => &[&rustls::version::TLS13],
        false => rustls::DEFAULT_VERSIONS,
    };
    let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_protocol_versions(versions)
        .map_err(|err| format!("TLS: {err}"))?;
    let builder = match (policy, &files.ca) {
        (ClientCerts::NotAsked, _) => builder.with_no_client_auth(),
        // An `mtls:` address with no CA to check against: as memcached's OpenSSL with no CA
        // file, a certificate is required and none is trusted (the start-up log says so).
        (_, None) => builder.with_client_cert_verifier(Arc::new(NoTrustedIssuer(provider))),
        (_, Some(ca)) => {
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
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
            let verifier = match policy {
                ClientCerts::Optional => verifier.allow_unauthenticated(),
                _ => verifier,
            };
            let verifier = verifier
                .build()
                .map_err(|err| format!("{ca_flag}: {err}"))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_single_cert(chain, key).map_err(|err| {
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
    })?;
    // Sessions are kept in memory and resumed by their ID (TLS 1.2) or a ticket naming them
    // (TLS 1.3), as memcached's `ssl_session_cache` keeps them; none without resumption.
    config.session_storage = match files.session_resumption {
        true => ServerSessionMemoryCache::new(SESSION_CACHE_ENTRIES),
        false => Arc::new(NoServerSessionStorage {}),
    };
    if !files.session_resumption {
        config.send_tls13_tickets = 0;
    }
    Ok(config)
}

fn pem_error(err: rustls::pki_types::pem::Error) -> String {
    match err {
        rustls::pki_types::pem::Error::Io(err) => err.to_string(),
        rustls::pki_types::pem::Error::NoItemsFound => "holds no PEM item of that kind".into(),
        other => format!("not readable as PEM: {other:?}"),
    }
}

/// Refuses a certificate that is not valid now (clients would refuse it anyway, and a server
/// that starts with it serves nobody), or that rustls does not take.
fn check_certificate(cert: &CertificateDer<'_>) -> Result<(), String> {
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
    // rustls (its webpki) takes only X.509 version 3 end-entity certificates; OpenSSL, and so
    // memcached, takes version 1 too. Said here, not as webpki's `UnsupportedCertVersion`.
    if parsed.version() != x509_parser::x509::X509Version::V3 {
        return Err(format!(
            "the certificate is X.509 version {}, and Headroom's TLS (rustls) takes version 3 \
             only (OpenSSL-based servers such as memcached take both); make a version 3 \
             certificate from the same key, for example with `openssl x509 -req` and an \
             `-extfile` giving `subjectAltName=DNS:your.host`",
            parsed.version().0 + 1
        ));
    }
    Ok(())
}

/// The client-certificate check of an `mtls:` address without `--tls-ca`: a certificate is
/// required, and none verifies, since no CA is trusted. rustls checks the certificate before
/// its signature, so the signature checks only ever refuse as well.
#[derive(Debug)]
struct NoTrustedIssuer(Arc<rustls::crypto::CryptoProvider>);

/// Every check of [`NoTrustedIssuer`]: the issuer is unknown.
fn untrusted<T>() -> Result<T, rustls::Error> {
    Err(rustls::Error::InvalidCertificate(
        rustls::CertificateError::UnknownIssuer,
    ))
}

impl ClientCertVerifier for NoTrustedIssuer {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        untrusted()
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        untrusted()
    }

    fn verify_tls13_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        untrusted()
    }

    /// The schemes the certificate request offers: the provider's, as for a verifier with a CA.
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
