//! Servers the bench starts: Headroom (this build's binary, or one given) and peers given by a
//! command. A started server listens on a free loopback port, is waited for until it accepts
//! connections, and is stopped (SIGTERM, then SIGKILL) when dropped.

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a server may take to start accepting connections (mapping a large locked arena
/// takes a while).
const START_TIMEOUT: Duration = Duration::from_secs(120);

/// Where a server under test runs.
pub enum Target {
    /// Already running at this address.
    Address(SocketAddr),
    /// Started by the bench.
    Started(Started),
}

impl Target {
    pub fn addr(&self) -> SocketAddr {
        match self {
            Target::Address(a) => *a,
            Target::Started(s) => s.addr,
        }
    }

    /// User + system CPU seconds of the server process, when the bench started it.
    pub fn cpu_seconds(&self) -> Option<f64> {
        match self {
            Target::Address(_) => None,
            Target::Started(s) => process_cpu_seconds(s.child.id()),
        }
    }
}

pub struct Started {
    pub addr: SocketAddr,
    pub command: String,
    child: Child,
    log: Arc<Mutex<Vec<String>>>,
}

impl Started {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The last lines the server wrote to stderr.
    pub fn log_tail(&self, lines: usize) -> Vec<String> {
        let log = self.log.lock().unwrap();
        log[log.len().saturating_sub(lines)..].to_vec()
    }
}

impl Drop for Started {
    fn drop(&mut self) {
        // SAFETY: a signal to our own child, which has not been reaped yet.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A free TCP port on loopback (bound and released: the server binds it right after).
pub fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// The `headroom` binary beside this one (they are built together), else `headroom` on PATH.
pub fn default_headroom() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|me| Some(me.parent()?.join("headroom")))
        .filter(|p| p.exists())
        .unwrap_or_else(|| PathBuf::from("headroom"))
}

/// Starts Headroom with `args` on a free loopback port (`--listen` is added, and
/// `--allow-root` unless `args` name a `--user`: a benchmark started as root stays root).
pub fn start_headroom(binary: &Path, args: &[String]) -> Result<Started, String> {
    let port = free_port().map_err(|e| format!("no free port: {e}"))?;
    let mut full = vec![binary.display().to_string()];
    full.extend(args.iter().cloned());
    if !args
        .iter()
        .any(|a| a == "--user" || a.starts_with("--user="))
    {
        full.push("--allow-root".into());
    }
    full.push("--listen".into());
    full.push(format!("127.0.0.1:{port}"));
    spawn(&full, port)
}

/// Starts a peer from a command line. `{port}` in it is replaced by a free port; a `memcached`
/// command without one gets `-l 127.0.0.1 -p PORT` added (and `-u nobody` when run as root).
pub fn start_command(command: &str) -> Result<Started, String> {
    let port = free_port().map_err(|e| format!("no free port: {e}"))?;
    let mut words: Vec<String> = command.split_whitespace().map(str::to_string).collect();
    if words.is_empty() {
        return Err("an empty server command".into());
    }
    if command.contains("{port}") {
        for w in &mut words {
            *w = w.replace("{port}", &port.to_string());
        }
    } else if Path::new(&words[0])
        .file_name()
        .is_some_and(|n| n == "memcached")
    {
        words.extend([
            "-l".into(),
            "127.0.0.1".into(),
            "-p".into(),
            port.to_string(),
        ]);
        // memcached refuses to run as root without a user to switch to.
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 && !words.iter().any(|w| w == "-u") {
            words.extend(["-u".into(), "nobody".into()]);
        }
    } else {
        return Err(format!(
            "say where '{command}' listens: put {{port}} where its port goes (memcached gets -p added)"
        ));
    }
    spawn(&words, port)
}

fn spawn(words: &[String], port: u16) -> Result<Started, String> {
    let command = words.join(" ");
    let mut child = Command::new(&words[0])
        .args(&words[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start '{command}': {e}"))?;
    let log = Arc::new(Mutex::new(Vec::new()));
    let stderr = child.stderr.take().expect("piped");
    let writer = Arc::clone(&log);
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            writer.lock().unwrap().push(line);
        }
    });
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let started = Instant::now();
    loop {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return Ok(Started {
                addr,
                command,
                child,
                log,
            });
        }
        if let Ok(Some(status)) = child.try_wait() {
            let log = log.lock().unwrap();
            let tail = log[log.len().saturating_sub(5)..].join("\n  ");
            return Err(format!(
                "'{command}' exited with {status} before serving:\n  {tail}"
            ));
        }
        if started.elapsed() > START_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!(
                "'{command}' did not accept connections within {} s",
                START_TIMEOUT.as_secs()
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// User + system CPU seconds of a process (whole process, every thread).
pub fn process_cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat[stat.rfind(')')? + 2..].split(' ').collect();
    // SAFETY: sysconf reads a constant.
    let tick = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Some((fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?) / tick)
}

/// CPUs this machine has online.
pub fn online_cpus() -> Vec<usize> {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap_or_default();
    parse_cpu_list(text.trim()).unwrap_or_else(|_| {
        (0..std::thread::available_parallelism().map_or(1, |n| n.get())).collect()
    })
}

/// `0-3,8,10-11` as a list.
pub fn parse_cpu_list(text: &str) -> Result<Vec<usize>, String> {
    let mut out = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let parse = |s: &str| {
            s.parse::<usize>()
                .map_err(|_| format!("CPU list '{text}': '{s}' is not a CPU number"))
        };
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (parse(a)?, parse(b)?);
                if a > b {
                    return Err(format!("CPU list '{text}': range {part} runs backwards"));
                }
                out.extend(a..=b);
            }
            None => out.push(parse(part)?),
        }
    }
    if out.is_empty() {
        return Err(format!("CPU list '{text}' is empty"));
    }
    Ok(out)
}

/// Pins the calling thread to `cpus`.
pub fn pin_current_thread(cpus: &[usize]) -> Result<(), String> {
    // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET and sched_setaffinity get valid
    // pointers to it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &cpu in cpus {
            libc::CPU_SET(cpu, &mut set);
        }
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(format!(
                "pinning to CPUs {cpus:?}: {}",
                std::io::Error::last_os_error()
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists() {
        assert_eq!(
            parse_cpu_list("0-3,8,10-11"),
            Ok(vec![0, 1, 2, 3, 8, 10, 11])
        );
        assert_eq!(parse_cpu_list("1"), Ok(vec![1]));
        assert!(parse_cpu_list("3-1").is_err());
        assert!(parse_cpu_list("a").is_err());
        assert!(parse_cpu_list("").is_err());
        assert!(!online_cpus().is_empty());
    }

    #[test]
    fn a_peer_command_must_say_its_port() {
        assert!(start_command("sleep 100")
            .err()
            .is_some_and(|e| e.contains("{port}")));
        assert!(start_command("").is_err());
    }
}
