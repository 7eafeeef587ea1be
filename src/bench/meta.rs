//! What a result file says about where it came from, so it stands on its own: the tool's
//! version (with its commit) and arguments, the host, its kernel, CPUs and the date, and every
//! server measured: how it was started (or where it was found), its `--version` when the bench
//! started a Headroom, and what it says of itself in STAT (`version`, and the `settings` group).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;

use super::client::Conn;
use super::process::{online_cpus, Target};

/// The machine and the tool, at the start of a run.
#[derive(Clone, Debug, Serialize)]
pub struct Meta {
    pub tool: String,
    /// `0.1.0 (commit 1a2b3c4d5e6f)`.
    pub tool_version: String,
    /// The tool's command line as run.
    pub tool_arguments: Vec<String>,
    pub host: String,
    /// `uname -r`.
    pub kernel: String,
    /// Online CPUs.
    pub cpus: usize,
    /// `model name` of /proc/cpuinfo, when it says.
    pub cpu_model: Option<String>,
    /// When the run started, UTC, RFC 3339.
    pub date: String,
    /// Every server the run measured (none for the offline placement replay).
    pub servers: Vec<ServerInfo>,
}

/// One server a run measured.
#[derive(Clone, Debug, Serialize)]
pub struct ServerInfo {
    /// Its part in the run: `server`, or `A` / `B` of a comparison.
    pub role: String,
    /// What the run calls it (`headroom`, the peer's command, ...).
    pub name: String,
    pub address: String,
    /// The command line the bench started it with; `None` for a server given by address.
    pub command: Option<String>,
    /// `BINARY --version` of a Headroom the bench started (names its commit).
    pub binary_version: Option<String>,
    /// STAT `version` as the server answered it.
    pub stat_version: Option<String>,
    /// The STAT `settings` group (memcached and Headroom both answer it): the arguments in
    /// effect, for a server given only by address too.
    pub stat_settings: BTreeMap<String, String>,
}

impl Meta {
    /// The tool and this machine, now; no servers yet.
    pub fn now() -> Meta {
        Meta {
            tool: "headroom-bench".into(),
            tool_version: crate::config::VERSION.into(),
            tool_arguments: std::env::args().collect(),
            host: hostname(),
            kernel: kernel_release(),
            cpus: online_cpus().len(),
            cpu_model: cpu_model(),
            date: rfc3339_utc(SystemTime::now()),
            servers: Vec::new(),
        }
    }

    pub fn with_servers(mut self, servers: Vec<ServerInfo>) -> Meta {
        self.servers = servers;
        self
    }
}

/// A result with its [`Meta`] first, the result's own fields beside it at the top level.
#[derive(Serialize)]
pub struct WithMeta<'a, T: Serialize> {
    pub meta: &'a Meta,
    #[serde(flatten)]
    pub result: &'a T,
}

/// What `target` says of itself, asked now. `binary` is the Headroom binary when the bench
/// started one from it.
pub fn describe(role: &str, name: &str, target: &Target, binary: Option<&Path>) -> ServerInfo {
    let command = match target {
        Target::Address(_) => None,
        Target::Started(started) => Some(started.command.clone()),
    };
    let (stat_version, stat_settings) = stat_of(target.addr());
    let name = if name.is_empty() {
        guess_name(stat_version.as_deref(), command.as_deref())
    } else {
        name.to_string()
    };
    ServerInfo {
        role: role.into(),
        name,
        address: target.addr().to_string(),
        binary_version: match (binary, target) {
            (Some(binary), Target::Started(_)) => binary_version(binary),
            _ => None,
        },
        command,
        stat_version,
        stat_settings,
    }
}

/// A name for a server from what it says: `headroom` when its version says so, else the
/// program of its command, else `server`.
fn guess_name(version: Option<&str>, command: Option<&str>) -> String {
    if version.is_some_and(|v| v.contains("headroom")) {
        return "headroom".into();
    }
    command
        .and_then(|c| c.split_whitespace().next())
        .and_then(|program| Path::new(program).file_name())
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_else(|| "server".into())
}

fn stat_of(addr: SocketAddr) -> (Option<String>, BTreeMap<String, String>) {
    let Ok(mut conn) = Conn::connect(addr, Duration::from_secs(5)) else {
        return (None, BTreeMap::new());
    };
    let version = conn.stats("").ok().and_then(|general| {
        general
            .into_iter()
            .find(|(name, _)| name == "version")
            .map(|(_, v)| v)
    });
    let settings = conn
        .stats("settings")
        .map(|pairs| pairs.into_iter().collect())
        .unwrap_or_default();
    (version, settings)
}

/// `BINARY --version`, without the program name (`0.1.0 (commit ...)`).
pub fn binary_version(binary: &Path) -> Option<String> {
    let out = Command::new(binary).arg("--version").output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (out.status.success() && !text.is_empty()).then(|| {
        text.split_once(' ')
            .map_or(text.clone(), |(_, rest)| rest.to_string())
    })
}

fn first_line(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty())
}

/// This machine's host name.
pub fn hostname() -> String {
    first_line("/proc/sys/kernel/hostname").unwrap_or_else(|| {
        let mut buf = [0u8; 256];
        // SAFETY: gethostname writes at most buf.len() bytes into buf.
        let ok = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } == 0;
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        if ok && end > 0 {
            String::from_utf8_lossy(&buf[..end]).into_owned()
        } else {
            "unknown".into()
        }
    })
}

/// The running kernel's release (`uname -r`).
pub fn kernel_release() -> String {
    crate::sys::kernel_release().unwrap_or_else(|| "unknown".into())
}

fn cpu_model() -> Option<String> {
    let text = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    text.lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
}

/// `time` as RFC 3339 in UTC to the second: `2025-03-01T12:34:56Z`.
pub fn rfc3339_utc(time: SystemTime) -> String {
    let seconds = time
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let (days, rest) = (seconds.div_euclid(86_400), seconds.rem_euclid(86_400));
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

/// Days since 1970-01-01 as a proleptic Gregorian (year, month, day) (H. Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_are_rfc3339_utc() {
        let at = |s: u64| rfc3339_utc(UNIX_EPOCH + Duration::from_secs(s));
        assert_eq!(at(0), "1970-01-01T00:00:00Z");
        assert_eq!(at(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(at(1_709_164_799), "2024-02-28T23:59:59Z");
        assert_eq!(at(1_709_251_200), "2024-03-01T00:00:00Z");
        assert_eq!(at(4_102_444_800), "2100-01-01T00:00:00Z");
    }

    #[test]
    fn a_name_comes_from_what_the_server_says() {
        assert_eq!(guess_name(Some("1.6.0-headroom-0.1.0"), None), "headroom");
        assert_eq!(
            guess_name(Some("1.6.21"), Some("/usr/bin/memcached -t 2")),
            "memcached"
        );
        assert_eq!(guess_name(None, None), "server");
        assert!(!hostname().is_empty() && !kernel_release().is_empty());
        let meta = Meta::now();
        assert!(meta.tool_version.contains("(commit "));
        assert!(meta.cpus >= 1);
    }
}
