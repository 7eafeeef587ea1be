//! What an operator installs beside the binary: `contrib/headroom.service` passes
//! `systemd-analyze verify` (with this build's binary and man page in place of the installed
//! ones), and the man page `headroom-man` writes renders without a warning and documents the
//! flags. The tools come from `scripts/install-deps` (systemd, groff-base, man-db).

use std::path::{Path, PathBuf};
use std::process::Command;

fn tool(name: &str) -> PathBuf {
    let found = ["/usr/bin", "/bin", "/usr/local/bin"]
        .iter()
        .map(|dir| Path::new(dir).join(name))
        .find(|p| p.exists());
    found.unwrap_or_else(|| panic!("{name} is missing: run scripts/install-deps"))
}

/// A fresh directory, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let path =
            std::env::temp_dir().join(format!("headroom-packaging-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        TempDir(path)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A fresh directory with `man1/headroom.1` written by `headroom-man`.
fn man_dir(name: &str) -> TempDir {
    let dir = TempDir::new(name);
    let man1 = dir.path().join("man1");
    std::fs::create_dir(&man1).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_headroom-man"))
        .arg(&man1)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(man1.join("headroom.1").exists());
    dir
}

#[test]
fn the_man_page_renders_without_warnings_and_documents_the_flags() {
    let dir = man_dir("render");
    let page = dir.path().join("man1/headroom.1");
    // -ww: every warning; -z: no output, only the diagnostics.
    let out = Command::new(tool("groff"))
        .args(["-man", "-Tutf8", "-ww", "-z"])
        .arg(&page)
        .env("LC_ALL", "C.UTF-8")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stderr), "", "groff warned");
    let out = Command::new(tool("man"))
        .arg("-l")
        .arg(&page)
        .env("MANPAGER", "cat")
        .env("MANWIDTH", "100")
        .env("LC_ALL", "C.UTF-8")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    for expected in [
        "NAME",
        "SYNOPSIS",
        "--listen",
        "--memory",
        "--data-dir",
        "--metrics-listen",
        "--admin-socket",
        "--log-format",
    ] {
        assert!(
            text.contains(expected),
            "{expected} not in the page:\n{text}"
        );
    }
}

#[test]
fn the_systemd_unit_passes_systemd_analyze_verify() {
    let unit = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/contrib/headroom.service"
    ))
    .unwrap();
    // The unit names the installed binary; verify checks that it exists, so it is pointed at
    // this build's. Everything else is verified as shipped.
    let installed = "ExecStart=/usr/local/bin/headroom ";
    assert!(unit.contains(installed), "the unit's ExecStart moved");
    let unit = unit.replace(
        installed,
        &format!("ExecStart={} ", env!("CARGO_BIN_EXE_headroom")),
    );
    let man = man_dir("unit-man");
    let dir = TempDir::new("unit");
    let path = dir.path().join("headroom.service");
    std::fs::write(&path, unit).unwrap();
    let out = Command::new(tool("systemd-analyze"))
        .arg("verify")
        .arg(&path)
        // Documentation=man:headroom(1) is looked up with man.
        .env("MANPATH", man.path())
        .env("SYSTEMD_LOG_LEVEL", "notice")
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "systemd-analyze verify failed:\n{said}"
    );
    assert!(
        !said.contains("headroom.service"),
        "systemd-analyze verify complained:\n{said}"
    );
}
