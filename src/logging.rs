//! The log: stderr, or a file (`--log-file`) that SIGHUP reopens, so log rotation can move the
//! old file away without losing lines or restarting the server; lines of text, or one JSON
//! object per line (`--log-format json`: `timestamp`, `level`, `message` and the event's
//! fields at the top level) for a log collector.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// Where log lines go.
#[derive(Clone)]
enum Sink {
    Stderr,
    File {
        path: PathBuf,
        file: Arc<Mutex<File>>,
    },
}

/// A handle on the installed log, for reopening its file.
#[derive(Clone)]
pub struct Log {
    sink: Sink,
}

fn open_append(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    // Its owner only, whatever the umask (a log names keys and admin commands).
    OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
}

/// The log file `init` opened, for [`hand_file_to`].
static OPENED_FILE: std::sync::OnceLock<Arc<Mutex<File>>> = std::sync::OnceLock::new();

/// Hands the open log file to `uid:gid` through its descriptor (never by path, where a name
/// swapped in meanwhile would be chowned instead), so the user the server drops to can reopen
/// it on SIGHUP. Only a regular file with one link is handed over. No file: nothing to do.
pub fn hand_file_to(uid: nix::unistd::Uid, gid: nix::unistd::Gid) -> io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let Some(file) = OPENED_FILE.get() else {
        return Ok(());
    };
    let file = file.lock().unwrap_or_else(|e| e.into_inner());
    let meta = file.metadata()?;
    if !meta.file_type().is_file() || meta.nlink() > 1 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "it is not a regular file with one name ({} links); it is left alone",
                meta.nlink()
            ),
        ));
    }
    nix::unistd::fchown(&*file, Some(uid), Some(gid)).map_err(io::Error::from)
}

/// Installs the process's log: `filter` is a level or tracing directive; lines go to `file`
/// when given (appended), else stderr, in `format`.
pub fn init(filter: &str, file: Option<&Path>, format: LogFormat) -> Result<Log, String> {
    let filter = EnvFilter::try_new(filter)
        .map_err(|err| format!("--log-level {filter}: not a log filter ({err})"))?;
    let sink = match file {
        None => Sink::Stderr,
        Some(path) => {
            let file =
                Arc::new(Mutex::new(open_append(path).map_err(|err| {
                    format!("--log-file {}: {err}", path.display())
                })?));
            let _ = OPENED_FILE.set(Arc::clone(&file));
            Sink::File {
                path: path.to_path_buf(),
                file,
            }
        }
    };
    let ansi = matches!(sink, Sink::Stderr) && std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(sink.clone())
        .with_target(false);
    match format {
        LogFormat::Text => builder.with_ansi(ansi).init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(false)
            .init(),
    }
    Ok(Log { sink })
}

impl Log {
    /// Reopens the log file (after rotation); `Ok(None)` when logging to stderr.
    pub fn reopen(&self) -> io::Result<Option<PathBuf>> {
        match &self.sink {
            Sink::Stderr => Ok(None),
            Sink::File { path, file } => {
                let fresh = open_append(path)?;
                *file.lock().unwrap_or_else(|e| e.into_inner()) = fresh;
                Ok(Some(path.clone()))
            }
        }
    }
}

/// One log line's writer.
pub enum LineWriter {
    Stderr(io::Stderr),
    File(Arc<Mutex<File>>),
}

impl Write for LineWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            LineWriter::Stderr(err) => err.write(buf),
            LineWriter::File(file) => file.lock().unwrap_or_else(|e| e.into_inner()).write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            LineWriter::Stderr(err) => err.flush(),
            LineWriter::File(file) => file.lock().unwrap_or_else(|e| e.into_inner()).flush(),
        }
    }
}

impl<'a> MakeWriter<'a> for Sink {
    type Writer = LineWriter;

    fn make_writer(&'a self) -> LineWriter {
        match self {
            Sink::Stderr => LineWriter::Stderr(io::stderr()),
            Sink::File { file, .. } => LineWriter::File(Arc::clone(file)),
        }
    }
}
