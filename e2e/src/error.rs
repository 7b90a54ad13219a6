//! The harness's error type. No I/O.

use std::fmt;
use std::time::Duration;

/// Why a harness step failed. `Debug` prints the message and its causes, so a test that
/// returns `Result<(), Error>` fails with a readable explanation.
#[derive(thiserror::Error)]
pub enum Error {
    /// A command could not be started.
    #[error("cannot run `{cmd}`")]
    Spawn {
        /// The command line.
        cmd: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A command exited unsuccessfully.
    #[error("`{cmd}` failed ({status}): {stderr}")]
    Command {
        /// The command line.
        cmd: String,
        /// Its exit status.
        status: std::process::ExitStatus,
        /// The end of its standard error.
        stderr: String,
    },
    /// A command printed something that is not what it should have.
    #[error("unexpected output of `{cmd}`: {why}")]
    Output {
        /// The command line.
        cmd: String,
        /// What was wrong.
        why: String,
    },
    /// A condition did not come true in time.
    #[error("timed out after {waited:?} waiting for {what}; last seen: {last}")]
    Timeout {
        /// What was awaited.
        what: String,
        /// How long.
        waited: Duration,
        /// The last observation, to explain the failure.
        last: String,
    },
    /// The environment cannot run the lab.
    #[error("{0}")]
    Environment(String),
    /// A local file or namespace operation failed.
    #[error("{what}")]
    Io {
        /// What was being done.
        what: String,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")?;
        let mut source = std::error::Error::source(self);
        while let Some(s) = source {
            write!(f, ": {s}")?;
            source = s.source();
        }
        Ok(())
    }
}
