//! Racers as separate OS processes: `ticketflow worker` runs one racer per process, speaking
//! JSON lines, so PostgreSQL evidence can come from separate API-like processes
//! (`api-a` and `api-b`, docs/PROTOCOL.md §1) rather than threads of one process.
//!
//! Protocol (one JSON object per line):
//! 1. the worker connects to the database and writes `{"backend_pid": N}` (a [`Hello`]);
//! 2. the runner writes a [`Job`] `{"tenant", "key", "request": {...}}`;
//! 3. the worker runs the create (waiting at the barrier like any racer) and writes a
//!    [`Reply`] `{"result": {"Ok": {...}} | {"Err": "..."}, "steps": [...]}`;
//! 4. steps 2-3 repeat until the runner closes the worker's stdin; the worker then exits 0.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use serde::{Deserialize, Serialize};

use super::format::LockMode;
use super::racer::{race_postgres, CreateCall};
use super::RacerResult;
use ticketflow_core::domain::TicketRequest;
use ticketflow_core::protocol::RetryPolicy;
use ticketflow_core::store::postgres::{IsolationLevel, PgStore};
use ticketflow_core::store::url::parse_postgres;
use ticketflow_core::variants::Implementation;

/// First line a worker writes.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Hello {
    /// `pg_backend_pid()` of the worker's session.
    pub backend_pid: i32,
}

/// A create request for the worker.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Job {
    /// Tenant id.
    pub tenant: String,
    /// Idempotency key.
    pub key: String,
    /// The request.
    pub request: TicketRequest,
}

/// The worker's answer to a [`Job`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Reply {
    /// The outcome, or the error's text.
    pub result: RacerResult,
    /// The store operations performed, with arguments and times.
    pub steps: Vec<super::timeline::Step>,
}

/// How a worker connects and behaves.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// Server URL.
    pub pg_url: String,
    /// Database on that server (the scenario's scratch database).
    pub dbname: String,
    /// Isolation level.
    pub isolation: IsolationLevel,
    /// The barrier's lock mode (advisory needs a racer-side wait).
    pub lock: LockMode,
    /// The create implementation: a real protocol, or a wrong variant for the kill matrix.
    /// It reaches the worker process as its name, the one `--implementation` flag.
    pub implementation: Implementation,
    /// Exit the process (code 137, no reply) right after this many commits: a client that
    /// dies between transactions. `None` never.
    pub die_after_commits: Option<u32>,
    /// Retry policy.
    pub retry: RetryPolicy,
}

/// Why a worker stopped or could not be driven.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// Connecting or migrating failed.
    #[error(transparent)]
    Store(#[from] ticketflow_core::StoreError),
    /// Reading or writing a line failed.
    #[error("worker i/o: {0}")]
    Io(#[from] std::io::Error),
    /// A line was not the expected JSON.
    #[error("bad worker message {line:?}: {source}")]
    Json {
        /// The line (first 200 characters).
        line: String,
        /// The parse error.
        #[source]
        source: serde_json::Error,
    },
    /// The other side closed the pipe early.
    #[error("worker closed its output before answering")]
    Closed,
}

fn parse<T: for<'de> Deserialize<'de>>(line: &str) -> Result<T, WorkerError> {
    serde_json::from_str(line).map_err(|source| WorkerError::Json {
        line: line.chars().take(200).collect(),
        source,
    })
}

fn write_line(out: &mut impl Write, value: &impl Serialize) -> Result<(), WorkerError> {
    let text = serde_json::to_string(value).expect("worker messages serialize");
    writeln!(out, "{text}")?;
    out.flush()?;
    Ok(())
}

/// Runs the worker side: connect, say hello, answer jobs until `input` ends.
///
/// Will return `Err` if the connection fails, a line is not a [`Job`], or output fails.
pub fn serve(
    config: &WorkerConfig,
    input: impl BufRead,
    mut output: impl Write,
) -> Result<(), WorkerError> {
    let mut pg_config = parse_postgres(&config.pg_url)?;
    pg_config.dbname(&config.dbname);
    let mut store = PgStore::connect(&pg_config, config.isolation)?;
    write_line(
        &mut output,
        &Hello {
            backend_pid: store.backend_pid(),
        },
    )?;
    for line in input.lines() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let job: Job = parse(&line)?;
        let call = CreateCall {
            tenant: &job.tenant,
            key: &job.key,
            request: &job.request,
        };
        let (result, steps) = race_postgres(
            &mut store,
            call,
            config.lock,
            config.implementation,
            &config.retry,
            config.die_after_commits,
        );
        write_line(&mut output, &Reply { result, steps })?;
    }
    Ok(())
}

/// The runner's handle on a worker process.
pub(crate) struct WorkerProcess {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    backend_pid: i32,
}

impl WorkerProcess {
    /// Starts `exe worker …` (default: the running executable) with `config` and waits for
    /// its hello.
    ///
    /// Will return `Err` if the process cannot start or does not say hello.
    pub(crate) fn spawn(exe: Option<&Path>, config: &WorkerConfig) -> Result<Self, WorkerError> {
        let WorkerConfig {
            pg_url,
            dbname,
            isolation,
            lock,
            implementation,
            retry,
            die_after_commits,
        } = config;
        let exe = match exe {
            Some(p) => p.to_path_buf(),
            None => std::env::current_exe()?,
        };
        let args = crate::argv::WorkerArgs {
            pg_url,
            dbname,
            isolation: *isolation,
            lock: lock.name(),
            implementation: *implementation,
            retry,
            die_after_commits: *die_after_commits,
        };
        let mut command = Command::new(exe);
        command
            .args(args.to_vec())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        // Dies with this process, even on SIGKILL (crate::child).
        let mut child = crate::child::spawn(command)?;
        let stdin = child.stdin.take();
        let mut stdout = BufReader::new(child.stdout.take().ok_or(WorkerError::Closed)?);
        let hello: Hello = parse(&read_line(&mut stdout)?)?;
        Ok(WorkerProcess {
            child,
            stdin,
            stdout,
            backend_pid: hello.backend_pid,
        })
    }

    /// The worker's OS process id.
    pub(crate) fn os_pid(&self) -> u32 {
        self.child.id()
    }

    /// The worker's PostgreSQL backend pid.
    pub(crate) fn backend_pid(&self) -> i32 {
        self.backend_pid
    }

    /// Sends one create and waits for the reply.
    pub(crate) fn create(
        &mut self,
        tenant: &str,
        key: &str,
        request: &TicketRequest,
    ) -> Result<Reply, WorkerError> {
        let stdin = self.stdin.as_mut().ok_or(WorkerError::Closed)?;
        write_line(
            stdin,
            &Job {
                tenant: tenant.into(),
                key: key.into(),
                request: request.clone(),
            },
        )?;
        parse(&read_line(&mut self.stdout)?)
    }

    /// Closes the worker's stdin and waits for it to exit.
    pub(crate) fn finish(mut self) {
        drop(self.stdin.take());
        let _ = self.child.wait();
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        if self.stdin.is_some() {
            // Not finished normally: do not leave a stray process behind.
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn read_line(r: &mut impl BufRead) -> Result<String, WorkerError> {
    let mut line = String::new();
    if r.read_line(&mut line)? == 0 {
        return Err(WorkerError::Closed);
    }
    Ok(line)
}
