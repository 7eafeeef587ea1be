//! Certificates for the TLS tests, made by the `openssl` command in a directory of the test's:
//! a CA, a server certificate it signed (for `localhost` and 127.0.0.1), a client certificate
//! it signed, a client certificate another CA signed, a server certificate that expired, and
//! one of X.509 version 1.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

pub struct Certs {
    pub dir: PathBuf,
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    /// Signed by a CA the server does not know.
    pub rogue_cert: PathBuf,
    pub rogue_key: PathBuf,
    /// Signed by the CA, valid on 1 January 2020 only.
    pub expired_cert: PathBuf,
    /// An X.509 version 1 certificate for the server's key, signed by the CA (OpenSSL takes
    /// it; rustls does not).
    pub v1_cert: PathBuf,
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("openssl (Debian's openssl package)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A P-256 key and a self-signed CA certificate named `name`.
fn make_ca(dir: &Path, name: &str) {
    let (key, cert) = (format!("{name}.key"), format!("{name}.pem"));
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &cert,
            "-days",
            "30",
            "-subj",
            &format!("/CN=Headroom test {name}"),
        ],
    );
}

/// A key and a certificate for `cn` (with `san`), signed by the CA `ca`, valid 30 days; a
/// fresh serial each time, so a reissued certificate differs.
fn make_leaf(dir: &Path, name: &str, cn: &str, san: &str, ca: &str) {
    let (key, csr, cert) = (
        format!("{name}.key"),
        format!("{name}.csr"),
        format!("{name}.pem"),
    );
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &csr,
            "-subj",
            &format!("/CN={cn}"),
        ],
    );
    let ext = format!("{name}.ext");
    std::fs::write(dir.join(&ext), format!("subjectAltName={san}\n")).unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            &format!("{ca}.pem"),
            "-CAkey",
            &format!("{ca}.key"),
            "-set_serial",
            &random_serial(),
            "-out",
            &cert,
            "-days",
            "30",
            "-extfile",
            &ext,
        ],
    );
}

fn random_serial() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("0x{:x}", nanos ^ u128::from(std::process::id()) << 64)
}

impl Certs {
    pub fn make(dir: &Path) -> Certs {
        std::fs::create_dir_all(dir).unwrap();
        make_ca(dir, "ca");
        make_ca(dir, "rogue-ca");
        make_leaf(
            dir,
            "server",
            "localhost",
            "DNS:localhost,IP:127.0.0.1",
            "ca",
        );
        make_leaf(dir, "client", "client", "DNS:client", "ca");
        make_leaf(dir, "rogue", "rogue", "DNS:rogue", "rogue-ca");
        // `openssl x509` cannot date a certificate in the past; `openssl ca` can.
        let db = dir.join("cadb");
        std::fs::create_dir_all(&db).unwrap();
        std::fs::write(db.join("index.txt"), "").unwrap();
        std::fs::write(db.join("serial"), "01\n").unwrap();
        std::fs::write(
            dir.join("ca.cnf"),
            "[ca]\ndefault_ca = test_ca\n[test_ca]\ndir = cadb\ndatabase = cadb/index.txt\n\
             serial = cadb/serial\nnew_certs_dir = cadb\ndefault_md = sha256\n\
             policy = anything\nunique_subject = no\n[anything]\ncommonName = supplied\n",
        )
        .unwrap();
        openssl(
            dir,
            &[
                "ca",
                "-batch",
                "-config",
                "ca.cnf",
                "-cert",
                "ca.pem",
                "-keyfile",
                "ca.key",
                "-in",
                "server.csr",
                "-out",
                "expired.pem",
                "-startdate",
                "20200101000000Z",
                "-enddate",
                "20200102000000Z",
            ],
        );
        // `openssl x509 -req` with no extensions writes version 1.
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                "server.csr",
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-set_serial",
                &random_serial(),
                "-out",
                "v1.pem",
                "-days",
                "30",
            ],
        );
        Certs {
            dir: dir.to_path_buf(),
            ca: dir.join("ca.pem"),
            server_cert: dir.join("server.pem"),
            server_key: dir.join("server.key"),
            client_cert: dir.join("client.pem"),
            client_key: dir.join("client.key"),
            rogue_cert: dir.join("rogue.pem"),
            rogue_key: dir.join("rogue.key"),
            expired_cert: dir.join("expired.pem"),
            v1_cert: dir.join("v1.pem"),
        }
    }

    /// Issues the server a new certificate and key in place (a new serial), as an operator
    /// renewing it would; returns the new serial in hex, as `openssl x509 -serial` prints it.
    pub fn renew_server(&self) -> String {
        make_leaf(
            &self.dir,
            "server",
            "localhost",
            "DNS:localhost,IP:127.0.0.1",
            "ca",
        );
        self.server_serial()
    }

    /// The serial of the server certificate on disk, upper-case hex.
    pub fn server_serial(&self) -> String {
        let out = Command::new("openssl")
            .args(["x509", "-noout", "-serial", "-in"])
            .arg(&self.server_cert)
            .output()
            .unwrap();
        serial_of(&out.stdout)
    }

    /// The serial of the certificate a new TLS connection to `addr` is shown (`openssl
    /// s_client`).
    pub fn served_serial(&self, addr: std::net::SocketAddr) -> String {
        let out = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "openssl s_client -connect {addr} -CAfile {} </dev/null 2>/dev/null | openssl x509 -noout -serial",
                self.ca.display()
            ))
            .output()
            .unwrap();
        serial_of(&out.stdout)
    }
}

/// `serial=HEX` as `openssl x509 -serial` prints it: the hex.
fn serial_of(stdout: &[u8]) -> String {
    String::from_utf8_lossy(stdout)
        .trim()
        .trim_start_matches("serial=")
        .to_string()
}
