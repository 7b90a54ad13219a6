//! Runs a server under a tiny `sh` supervisor so it can never outlive the test process.
//!
//! Rust never drops statics, and a test binary can be killed outright, so the server's lifetime is
//! tied to a pipe instead: the supervisor's stdin is a pipe whose only write end lives in this
//! process. When we drop the handle, or this process exits in any way (even SIGKILL), the kernel
//! closes that end, the supervisor reads EOF, and it stops the server (TERM, then KILL after 10 s)
//! and optionally removes a folder. The supervisor also exits when the server dies on its own, so
//! [`Supervised::exited`] notices a crash. Spawns processes and reads log files.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};

use crate::Error;

/// `sh -c` script: `$1` = folder to remove afterwards (or `-`), the rest = the server command.
/// The server's stdin is /dev/null; fd 3 keeps our stdin pipe for the watcher subshell.
const SUPERVISOR: &str = r#"
cleanup=$1; shift
exec 3<&0
"$@" </dev/null 3<&- &
pid=$!
trap '' INT HUP
trap 'kill -TERM "$pid" 2>/dev/null' TERM
(
  cat <&3 >/dev/null
  kill -TERM "$pid" 2>/dev/null
  sleep 10
  kill -KILL "$pid" 2>/dev/null
) &
watcher=$!
exec 3<&-
wait "$pid"
status=$?
# A trapped TERM interrupts `wait`; keep waiting until the server is really gone.
while kill -0 "$pid" 2>/dev/null; do
  wait "$pid"
  status=$?
done
kill "$watcher" 2>/dev/null
if [ "$cleanup" != "-" ]; then rm -rf "$cleanup"; fi
exit "$status"
"#;

/// A server process under supervision; dropping it stops the server and waits for that.
#[derive(Debug)]
pub struct Supervised {
    name: &'static str,
    child: Child,
    /// Write end of the supervisor's stdin; closing it stops the server.
    lifeline: Option<ChildStdin>,
    log: PathBuf,
}

impl Supervised {
    /// Starts `program args` with stdout and stderr appended to `log`. When the server stops,
    /// `cleanup` (if any) is removed recursively.
    ///
    /// # Errors
    /// [`Error::Io`] when the log cannot be created, [`Error::Command`] when `sh` cannot start.
    pub fn spawn(
        name: &'static str,
        program: &Path,
        args: &[String],
        log: &Path,
        cleanup: Option<&Path>,
    ) -> Result<Self, Error> {
        let out = File::create(log).map_err(|source| Error::Io {
            action: "create log",
            path: log.to_owned(),
            source,
        })?;
        let err = out.try_clone().map_err(|source| Error::Io {
            action: "duplicate log handle",
            path: log.to_owned(),
            source,
        })?;
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(SUPERVISOR)
            .arg(format!("aliaslb-supervise-{name}"))
            .arg(cleanup.map_or_else(|| "-".into(), |p| p.as_os_str().to_owned()))
            .arg(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| Error::Command {
                command: format!("sh (supervising {})", program.display()),
                detail: e.to_string(),
            })?;
        let lifeline = child.stdin.take();
        Ok(Self {
            name,
            child,
            lifeline,
            log: log.to_owned(),
        })
    }

    /// The log file holding the server's stdout and stderr.
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// `Some(status)` once the server has exited (and its supervisor with it).
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// A start-up error for this server carrying the tail of its log.
    pub fn startup_error(&self, reason: impl Into<String>) -> Error {
        Error::StartUp {
            server: self.name,
            reason: reason.into(),
            log: self.log.clone(),
            tail: tail(&self.log, 40),
        }
    }

    /// Stops the server and waits until it and its supervisor are gone.
    pub fn stop(&mut self) {
        drop(self.lifeline.take());
        let _ = self.child.wait();
    }
}

impl Drop for Supervised {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The last `lines` lines of the file at `path` (at most the last 64 KiB are read).
pub fn tail(path: &Path, lines: usize) -> String {
    const MAX: u64 = 64 * 1024;
    let Ok(mut file) = File::open(path) else {
        return format!("(cannot open {})", path.display());
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = file.seek(SeekFrom::Start(len.saturating_sub(MAX)));
    let mut buf = Vec::new();
    let _ = file.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
