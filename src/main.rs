//! The `headroom` binary: read the configuration, take the data directory and the listeners,
//! map the arena, serve until SIGINT, SIGTERM or SIGUSR1.
//!
//! Signals are handled by one thread from the first instruction on: a stop signal during
//! start-up ends the process at once (nothing is served yet, and the kernel releases every
//! lock, socket and mapping); once serving, it stops gracefully (in-flight requests finish, the
//! warm-restart snapshot is written); a second stop signal while stopping exits at once.
//! SIGHUP never stops the server: it reopens the log file.

use std::process::ExitCode;
use std::sync::{mpsc, Arc, Mutex};

use clap::Parser;
use nix::sys::signal::{SigSet, Signal};

use headroom::arena::MemoryPlan;
use headroom::config::{self, Cli, CONFIG_ERROR_EXIT};
use headroom::logging::{self, Log};
use headroom::server;
use headroom::topology::Topology;

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

/// Handles signals for the life of the process. A stop signal while serving is passed to the
/// main thread through `stop`; the log (once installed) is what SIGHUP reopens.
fn spawn_signal_thread(
    signals: SigSet,
    phase: Arc<Mutex<Phase>>,
    log: Arc<Mutex<Option<Log>>>,
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
                let log = log.lock().unwrap_or_else(|e| e.into_inner()).clone();
                match log.map(|log| log.reopen()) {
                    Some(Ok(Some(path))) => tracing::info!(
                        path = %path.display(),
                        "SIGHUP: log file reopened (SIGHUP never stops the server; SIGTERM, SIGINT or SIGUSR1 do)"
                    ),
                    Some(Err(err)) => {
                        tracing::error!(%err, "SIGHUP: the log file cannot be reopened; still writing to the old one")
                    }
                    _ => tracing::info!(
                        "SIGHUP: ignored (no --log-file to reopen; SIGTERM, SIGINT or SIGUSR1 stop the server)"
                    ),
                }
                continue;
            }
            let mut phase = phase.lock().unwrap_or_else(|e| e.into_inner());
            match *phase {
                Phase::Starting => {
                    // Nothing is served yet: the kernel releases every lock, socket and mapping.
                    tracing::info!(%signal, "stopping during start-up");
                    eprintln!("headroom: {signal} during start-up: stopped");
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

fn main() -> ExitCode {
    abort_on_panic();
    let signals = match block_signals() {
        Ok(signals) => signals,
        Err(err) => {
            eprintln!("headroom: cannot block signals: {err}");
            return ExitCode::from(1);
        }
    };
    let phase = Arc::new(Mutex::new(Phase::Starting));
    let log_handle = Arc::new(Mutex::new(None));
    let (stop_tx, stop_rx) = mpsc::channel();
    if let Err(err) = spawn_signal_thread(
        signals,
        Arc::clone(&phase),
        Arc::clone(&log_handle),
        stop_tx,
    ) {
        eprintln!("headroom: cannot start the signal thread: {err}");
        return ExitCode::from(1);
    }
    let cli = Cli::parse();
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
    match logging::init(&settings.log_level, settings.log_file.as_deref()) {
        Ok(log) => *log_handle.lock().unwrap_or_else(|e| e.into_inner()) = Some(log),
        Err(err) => {
            eprintln!("headroom: {err}");
            return ExitCode::from(CONFIG_ERROR_EXIT as u8);
        }
    }
    let plan = MemoryPlan::new(&settings.arena, &topology);
    if settings.dry_run {
        print!("{}", plan.render());
        return ExitCode::SUCCESS;
    }
    let log_to_file = settings.log_file.is_some();
    tracing::info!(topology = %topology.source(), "{}", settings.numa_reason);
    let running = match server::start(settings, &topology) {
        Ok(running) => running,
        Err(err) => {
            if log_to_file {
                tracing::error!("{err}");
            }
            eprintln!("headroom: {err}");
            return ExitCode::from(1);
        }
    };
    *phase.lock().unwrap_or_else(|e| e.into_inner()) = Phase::Serving;
    match stop_rx.recv() {
        Ok(signal) => {
            tracing::info!(%signal, "stopping: no new connections, finishing in-flight requests")
        }
        Err(_) => tracing::error!("the signal thread is gone; stopping"),
    }
    running.stop();
    ExitCode::SUCCESS
}
