//! The `headroom` binary: read the configuration, take the data directory and the listeners,
//! map the arena, serve until SIGINT, SIGTERM or SIGUSR1.
//!
//! The command line (Headroom's flags, or memcached's: `config::memcached`) is read and
//! checked first, while the process has one thread, so that `--daemon` may fork. From then on
//! signals are handled by one thread: a stop signal during start-up ends the process at once (nothing is served yet, and the kernel releases every
//! lock, socket and mapping); once serving, it stops gracefully (in-flight requests finish, the
//! warm-restart snapshot is written); a second stop signal while stopping exits at once.
//! SIGHUP never stops the server: it reopens the log file.
//!
//! The first log line names the version with its commit and every budget and path in use;
//! `--dry-run` prints the memory plan, the data directory and every segment it would use.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};

use nix::sys::signal::{SigSet, Signal};

use headroom::arena::MemoryPlan;
use headroom::config::{self, Cli, LogFormat, Settings, CONFIG_ERROR_EXIT, VERSION};

mod daemon;
use headroom::logging::{self, Log};
use headroom::segment::SegmentSpec;
use headroom::server;
use headroom::topology::Topology;
use headroom::units::ByteSize;

/// Set once the log writes JSON to stderr: plain sentences there would break its readers, so
/// they are logged instead.
static STDERR_IS_JSON: AtomicBool = AtomicBool::new(false);

/// Says a fatal sentence on stderr, as a log line when stderr carries JSON.
fn say_fatal(text: &str) {
    if STDERR_IS_JSON.load(Ordering::Relaxed) {
        tracing::error!("{text}");
    } else {
        eprintln!("headroom: {text}");
    }
}

/// The signals the signal thread handles.
const HANDLED: [Signal; 4] = [
    Signal::SIGINT,
    Signal::SIGTERM,
    Signal::SIGUSR1,
    Signal::SIGHUP,
];

/// Blocks the handled signals in this thread, and so in every thread it starts: they arrive
/// only where the signal thread waits for them.
fn block_signals() -> Result<SigSet, nix::Error> {
    let mut set = SigSet::empty();
    for signal in HANDLED {
        set.add(signal);
    }
    set.thread_block()?;
    Ok(set)
}

/// A panic is a bug; a shard that died would leave its peers waiting for it forever. Report it
/// and stop the whole process instead of serving half-alive.
fn abort_on_panic() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        report(info);
        eprintln!(
            "headroom: internal error (a bug): aborting rather than serving with a dead shard"
        );
        std::process::abort();
    }));
}

/// Where the process is, as the signal thread sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Starting,
    Serving,
    Stopping,
}

/// What SIGHUP reopens and reloads, once start-up has set them.
#[derive(Default)]
struct Reloadable {
    log: Option<Log>,
    tls: Option<Arc<headroom::server::shard::tls_config::Tls>>,
}

/// Handles signals for the life of the process. A stop signal while serving is passed to the
/// main thread through `stop`; SIGHUP reopens the log file and reloads the TLS files.
fn spawn_signal_thread(
    signals: SigSet,
    phase: Arc<Mutex<Phase>>,
    reloadable: Arc<Mutex<Reloadable>>,
    stop: mpsc::Sender<Signal>,
) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || loop {
            let signal = match signals.wait() {
                Ok(signal) => signal,
                Err(err) => {
                    tracing::error!(%err, "waiting for signals failed; signals are ignored from now on");
                    return;
                }
            };
            if signal == Signal::SIGHUP {
                let (log, tls) = {
                    let r = reloadable.lock().unwrap_or_else(|e| e.into_inner());
                    (r.log.clone(), r.tls.clone())
                };
                match log.map(|log| log.reopen()) {
                    Some(Ok(Some(path))) => tracing::info!(
                        path = %path.display(),
                        "SIGHUP: log file reopened (SIGHUP never stops the server; SIGTERM, SIGINT or SIGUSR1 do)"
                    ),
                    Some(Err(err)) => {
                        tracing::error!(%err, "SIGHUP: the log file cannot be reopened; still writing to the old one")
                    }
                    _ => {}
                }
                match tls.map(|tls| tls.reload()) {
                    Some(Ok(())) => tracing::info!(
                        "SIGHUP: TLS certificate, key and CA reloaded; new connections get them"
                    ),
                    Some(Err(err)) => tracing::error!(
                        "SIGHUP: TLS files not reloaded, the ones in use are kept: {err}"
                    ),
                    None => {}
                }
                continue;
            }
            let mut phase = phase.lock().unwrap_or_else(|e| e.into_inner());
            match *phase {
                Phase::Starting => {
                    // Nothing is served yet: the kernel releases every lock, socket and mapping.
                    tracing::info!(%signal, "stopping during start-up");
                    if !STDERR_IS_JSON.load(Ordering::Relaxed) {
                        eprintln!("headroom: {signal} during start-up: stopped");
                    }
                    std::process::exit(0);
                }
                Phase::Serving => {
                    *phase = Phase::Stopping;
                    let _ = stop.send(signal);
                }
                Phase::Stopping => {
                    tracing::warn!(%signal, "a second stop signal while stopping: exiting now, without waiting for in-flight requests or writing the warm-restart snapshot");
                    std::process::exit(1);
                }
            }
        })
        .map(drop)
}

/// The command line as Headroom's flags, with the notes of a memcached line; or the exit.
fn read_command_line() -> Result<(Cli, Vec<String>), ExitCode> {
    use config::memcached::{self, CommandLine};
    match memcached::read(std::env::args_os().collect()) {
        Ok(CommandLine::Headroom(cli)) => Ok((*cli, Vec::new())),
        Ok(CommandLine::Memcached(translation)) => Ok((translation.cli, translation.notices)),
        Ok(CommandLine::Print(text)) => {
            print!("{text}");
            Err(ExitCode::SUCCESS)
        }
        Err(refusal) => {
            eprintln!("headroom: {refusal}");
            Err(ExitCode::from(refusal.exit_status as u8))
        }
    }
}

fn main() -> ExitCode {
    abort_on_panic();
    // Read before any thread starts, so that --daemon may fork.
    let (cli, notices) = match read_command_line() {
        Ok(read) => read,
        Err(exit) => return exit,
    };
    let topology = match Topology::load() {
        Ok(topology) => topology,
        Err(err) => {
            eprintln!("headroom: {err}");
            return ExitCode::from(1);
        }
    };
    let settings = match config::resolve(&cli, &topology) {
        Ok(settings) => settings,
        Err(err) => {
            eprintln!("headroom: {err}");
            return ExitCode::from(CONFIG_ERROR_EXIT as u8);
        }
    };
    let started_report = match settings.daemon && !settings.dry_run {
        true => match daemon::detach(settings.log_file.is_some()) {
            Ok(report) => Some(report),
            Err(err) => {
                eprintln!("headroom: --daemon: {err}");
                return ExitCode::from(1);
            }
        },
        false => None,
    };
    let status = serve(settings, &topology, &notices, started_report.as_ref());
    if let Some(report) = started_report {
        // A start that failed says so to the waiting parent (a success said it already).
        report.started(status);
    }
    ExitCode::from(status)
}

/// Starts the server and serves until a stop signal; the exit status.
fn serve(
    settings: Settings,
    topology: &Topology,
    notices: &[String],
    started_report: Option<&daemon::StartReport>,
) -> u8 {
    let signals = match block_signals() {
        Ok(signals) => signals,
        Err(err) => {
            eprintln!("headroom: cannot block signals: {err}");
            return 1;
        }
    };
    let phase = Arc::new(Mutex::new(Phase::Starting));
    let reloadable = Arc::new(Mutex::new(Reloadable::default()));
    let (stop_tx, stop_rx) = mpsc::channel();
    if let Err(err) = spawn_signal_thread(
        signals,
        Arc::clone(&phase),
        Arc::clone(&reloadable),
        stop_tx,
    ) {
        eprintln!("headroom: cannot start the signal thread: {err}");
        return 1;
    }
    match logging::init(
        &settings.log_level,
        settings.log_file.as_deref(),
        settings.log_format,
    ) {
        Ok(log) => reloadable.lock().unwrap_or_else(|e| e.into_inner()).log = Some(log),
        Err(err) => {
            eprintln!("headroom: {err}");
            return CONFIG_ERROR_EXIT as u8;
        }
    }
    STDERR_IS_JSON.store(
        settings.log_format == LogFormat::Json && settings.log_file.is_none(),
        Ordering::Relaxed,
    );
    let plan = MemoryPlan::new(&settings.arena, topology);
    if settings.dry_run {
        print!("{}", plan.render());
        print!("{}", storage_plan(&settings));
        return 0;
    }
    let log_to_file = settings.log_file.is_some();
    log_startup(&settings);
    tracing::info!(topology = %topology.source(), "{}", settings.numa_reason);
    for note in notices.iter().chain(&settings.notes) {
        tracing::info!("{note}");
    }
    let pid_file = settings.pid_file.clone();
    if let Some(path) = &pid_file {
        if let Err(err) = std::fs::write(path, format!("{}\n", std::process::id())) {
            say_fatal(&format!(
                "--pid-file {}: cannot write it: {err}",
                path.display()
            ));
            return 1;
        }
    }
    let remove_pid_file = || {
        if let Some(path) = &pid_file {
            if let Err(err) = std::fs::remove_file(path) {
                tracing::warn!(path = %path.display(), %err, "--pid-file: not removed");
            }
        }
    };
    let running = match server::start(settings, topology) {
        Ok(running) => running,
        Err(err) => {
            if log_to_file {
                tracing::error!("{err}");
            }
            say_fatal(&err.to_string());
            // Who may run it is configuration: restarting cannot fix it.
            let status = match err {
                server::ServerError::User(_) | server::ServerError::Tls(_) => {
                    CONFIG_ERROR_EXIT as u8
                }
                _ => 1,
            };
            remove_pid_file();
            return status;
        }
    };
    reloadable.lock().unwrap_or_else(|e| e.into_inner()).tls = running.tls();
    *phase.lock().unwrap_or_else(|e| e.into_inner()) = Phase::Serving;
    if let Some(report) = started_report {
        report.started(0);
    }
    match stop_rx.recv() {
        Ok(signal) => {
            tracing::info!(%signal, "stopping: no new connections, finishing in-flight requests")
        }
        Err(_) => tracing::error!("the signal thread is gone; stopping"),
    }
    let stopped = running.stop();
    remove_pid_file();
    match stopped {
        Ok(()) => 0,
        // The last line of the stop, so a supervisor and an operator both see it.
        Err(failure) => {
            tracing::error!("{failure}");
            1
        }
    }
}

/// `path` made absolute against the working directory (not resolved: a symlink stays one).
fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

/// A segment as given, its file path made absolute.
fn absolute_segment(segment: &SegmentSpec) -> SegmentSpec {
    match segment {
        SegmentSpec::File {
            path,
            size,
            locality,
        } => SegmentSpec::File {
            path: absolute(path),
            size: *size,
            locality: locality.clone(),
        },
        other => other.clone(),
    }
}

fn optional_path(path: &Option<PathBuf>, absent: &str) -> String {
    path.as_deref()
        .map_or(absent.to_string(), |p| absolute(p).display().to_string())
}

/// The start-up line: the version with its commit, every budget and every path in use.
fn log_startup(settings: &Settings) {
    let arena = &settings.arena;
    let segments: Vec<String> = settings
        .segments
        .iter()
        .map(|s| absolute_segment(s).to_string())
        .collect();
    let mount_dirs: Vec<String> = settings
        .mount_dirs
        .iter()
        .map(|d| absolute(d).display().to_string())
        .collect();
    tracing::info!(
        version = VERSION,
        listen = %settings
            .listen
            .iter()
            .map(|l| format!("{} ({})", l.addr, l.tls.name()))
            .collect::<Vec<_>>()
            .join(", "),
        metrics_listen = %settings
            .metrics_listen
            .map_or("none (off)".to_string(), |addr| addr.to_string()),
        shards = settings.cpus.len(),
        memory = %ByteSize(arena.memory_bytes),
        sub_memory = %ByteSize(arena.sub_memory_bytes),
        small_memory = %arena
            .small_memory_bytes
            .map_or("none (shares --memory)".to_string(), |b| ByteSize(b).to_string()),
        small_sub_memory = %ByteSize(arena.small_sub_memory_bytes),
        io_pool_per_shard = %ByteSize(settings.io_pool_bytes),
        block = %ByteSize(arena.block_bytes),
        ram_head = %ByteSize(arena.ram_head_bytes),
        max_item_size = %ByteSize(settings.max_item_bytes),
        partitions = %settings
            .partitions
            .map_or("auto".to_string(), |n| n.to_string()),
        data_dir = %absolute(&settings.data_dir).display(),
        segments = %segments.join("; "),
        mount_dirs = %mount_dirs.join("; "),
        admin_socket = %optional_path(&settings.admin_socket, "none (ADMIN closed)"),
        sasl_password_file = %optional_path(&settings.sasl_password_file, "none (no authentication)"),
        log_file = %optional_path(&settings.log_file, "stderr"),
        user = %settings.user.as_deref().unwrap_or("none (runs as the user that started it)"),
        "starting headroom"
    );
}

/// What `--dry-run` adds after the memory plan: the data directory and every segment, each
/// saying whether it exists or would be created.
fn storage_plan(settings: &Settings) -> String {
    let state = |path: &Path| match std::fs::metadata(path) {
        Ok(meta) if meta.is_dir() => "exists".to_string(),
        Ok(meta) if meta.file_type().is_file() => {
            format!("exists, {} allocated", ByteSize(meta_allocated(&meta)))
        }
        Ok(_) => "exists (not a regular file: a device)".to_string(),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            "would be created at start".to_string()
        }
        Err(err) => format!("cannot be read now: {err}"),
    };
    let data_dir = absolute(&settings.data_dir);
    let mut out = format!(
        "data dir: {} ({}; locked while serving; holds the warm-restart snapshot {})\n",
        data_dir.display(),
        state(&data_dir),
        data_dir.join("snapshot").display()
    );
    for (i, segment) in settings.segments.iter().enumerate() {
        let segment = absolute_segment(segment);
        let line = match &segment {
            SegmentSpec::File { path, .. } => format!(
                "segment {i}: {segment} (a sparse file: disk is used as values are written; {})",
                state(path)
            ),
            SegmentSpec::Mem { .. } => format!("segment {i}: {segment} (memory, no file)"),
        };
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// Bytes a file occupies on disk (a sparse segment uses less than its size).
fn meta_allocated(meta: &std::fs::Metadata) -> u64 {
    use std::os::unix::fs::MetadataExt;
    meta.blocks() * 512
}
