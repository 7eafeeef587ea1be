//! Records the commit the binaries are built from, for `--version`, the start-up log line and
//! the bench results: `HEADROOM_COMMIT` is `git rev-parse --short=12 HEAD`, with `-dirty`
//! when tracked files differ from it, or `unknown` where there is no git (a source tarball).
//! A packager building from a tarball may set `HEADROOM_COMMIT` in the environment instead.

use std::path::Path;
use std::process::Command;

fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=HEADROOM_COMMIT");
    let manifest = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| ".".into());
    let dir = Path::new(&manifest);
    let commit = match std::env::var("HEADROOM_COMMIT") {
        Ok(given) if !given.trim().is_empty() => given.trim().to_string(),
        _ => from_git(dir).unwrap_or_else(|| "unknown".to_string()),
    };
    println!("cargo:rustc-env=HEADROOM_COMMIT={commit}");
}

/// The short commit (and `-dirty`), and rerun triggers on what moves it: HEAD, the branch it
/// names, packed refs and the index (which `git add`, `git commit` and `git status` refresh).
fn from_git(dir: &Path) -> Option<String> {
    let hash = git(dir, &["rev-parse", "--short=12", "HEAD"]).filter(|h| !h.is_empty())?;
    let mut watched = vec!["HEAD".to_string(), "index".into(), "packed-refs".into()];
    if let Some(branch) = git(dir, &["symbolic-ref", "-q", "HEAD"]) {
        watched.push(branch);
    }
    for name in watched {
        if let Some(path) = git(dir, &["rev-parse", "--git-path", &name]) {
            let path = dir.join(path);
            if path.exists() {
                println!("cargo:rerun-if-changed={}", path.display());
            }
        }
    }
    let dirty = git(dir, &["status", "--porcelain", "--untracked-files=no"])
        .is_some_and(|status| !status.is_empty());
    Some(if dirty { format!("{hash}-dirty") } else { hash })
}
