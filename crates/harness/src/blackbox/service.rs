//! What a black-box run sets up around the race: the target database (a scratch database the
//! runner creates and drops, or the one the scenario names) and the services it starts on free
//! loopback ports, waits for, and stops.

use std::io::Read as _;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::client::{self, HttpRequest};
use super::format::ServiceSpec;
use crate::scenario::timeline::ms;
use crate::scratch::ScratchDatabase;
use crate::shortage::Shortage;
use ticketflow_core::store::postgres as pg;
use ticketflow_core::store::url::{parse_postgres, url_with_db, NotAUrl, PgServer};

pub(crate) fn db(what: &'static str) -> impl Fn(ticketflow_core::StoreError) -> TargetError {
    move |source| TargetError::Database { what, source }
}

/// A service the runner started.
#[derive(Debug, Clone, Serialize)]
pub struct ServiceRecord {
    /// Service name.
    pub name: String,
    /// Its base URL.
    pub base_url: String,
    /// OS process id.
    pub os_pid: u32,
    /// Milliseconds from spawn until its ready path answered 2xx.
    pub ready_ms: f64,
    /// The file its standard output goes to, when the run keeps service logs
    /// ([`Services::start`] with a log directory).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stdout_log: Option<String>,
    /// The file its standard error goes to, likewise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stderr_log: Option<String>,
}

/// A runner-started service that exited without being told to (not a kill of the runner's
/// own): what a crash of the service looks like from outside.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ServiceExit {
    /// Service name.
    pub name: String,
    /// Its OS process id.
    pub os_pid: u32,
    /// Its exit status in words (`exit status: 1`, `signal: 6 (SIGABRT)`).
    pub status: String,
    /// The last lines of its standard error (`no stderr` when it wrote none).
    pub stderr_tail: String,
}

impl std::fmt::Display for ServiceExit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "service {} (pid {}) exited with {}; {}",
            self.name, self.os_pid, self.status, self.stderr_tail
        )
    }
}

/// Why a black-box run could not be set up (the run is then FAIL or PENDING with this text).
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    /// The scenario PostgreSQL server (for a scratch database) is unreachable.
    #[error("PostgreSQL unreachable at {url}: {reason}")]
    Unreachable {
        /// The URL, password hidden.
        url: String,
        /// The cause.
        reason: String,
    },
    /// A database statement failed.
    #[error("{what}: {source}")]
    Database {
        /// What the runner was doing.
        what: &'static str,
        /// The cause.
        #[source]
        source: ticketflow_core::StoreError,
    },
    /// A service could not be started or did not become ready in time.
    #[error("service {name}: {reason}")]
    Service {
        /// The service's name.
        name: String,
        /// What went wrong, with the end of its stderr when there is one.
        reason: String,
    },
    /// The scenario cannot run against this target as written (a table that does not exist,
    /// an endpoint that refuses connections): nothing was raced.
    #[error("{0}")]
    Setup(String),
    /// More racers in a wave than this process can open connections for; nothing was raced.
    #[error(transparent)]
    Capacity(#[from] crate::scenario::capacity::CapacityError),
    /// The URL given for the scratch database cannot be pointed at another database.
    #[error(transparent)]
    Url(#[from] NotAUrl),
}

impl TargetError {
    /// The shortage of the environment this error shows, if any ([`Shortage`]): the barrier
    /// lock held by a session outside the run (the controller's lock timeout), a service that
    /// could not bind its port (`EADDRINUSE` in its own words), or an error naming a class-53
    /// SQLSTATE or a resource `os error`. Such a run is PENDING, never FAIL.
    pub fn shortage(&self) -> Option<Shortage> {
        match self {
            TargetError::Database { what, source }
                if *what == BARRIER_LOCK
                    && source.kind == ticketflow_core::error::DbErrorKind::Timeout =>
            {
                Some(Shortage::BarrierLock)
            }
            TargetError::Service { reason, .. }
                if reason.contains("EADDRINUSE")
                    || reason
                        .to_ascii_lowercase()
                        .contains("address already in use") =>
            {
                Some(Shortage::Port)
            }
            other => Shortage::in_text(&other.to_string()),
        }
    }
}

/// What the runner was doing when the controller could not take a server-side barrier's lock
/// ([`TargetError::Database`]).
pub(crate) const BARRIER_LOCK: &str = "controller could not take the barrier lock";

/// One started process and what the runner keeps of it.
struct Running {
    child: Child,
    cleanup: crate::cleanup::Registration,
    /// Its standard error, read back for the tail.
    stderr: std::fs::File,
    /// Stopped by the runner ([`Services::kill`], drop): its exit is not a crash.
    stopped: bool,
    /// Its exit was reported once by [`Services::exited`].
    reported: bool,
}

/// Services started for one run; killed (and reaped) when dropped.
#[derive(Default)]
pub struct Services {
    children: Vec<Running>,
    /// What was started, in order.
    pub records: Vec<ServiceRecord>,
    specs: Vec<ServiceSpec>,
    exe: String,
    database_url: String,
    logs: Option<PathBuf>,
}

impl Services {
    /// Starts every service in `specs` (placeholders: `{ticketflow}` = `exe`, `{port}`,
    /// `{database_url}`, in the command and the `env` values) and waits, bounded by each
    /// one's `ready_timeout_ms`, for its ready path to answer 2xx. With `logs`, each start's
    /// standard output and error are kept in that directory (`NAME-N.stdout.log`,
    /// `NAME-N.stderr.log`, created if missing); without, in anonymous temporary files.
    /// Services already started are stopped when this returns `Err`.
    ///
    /// Will return `Err` naming the service when it cannot start, exits, or is not ready in
    /// time (with the end of its stderr), or when the log directory cannot be written.
    pub fn start(
        specs: &[ServiceSpec],
        exe: &str,
        database_url: &str,
        logs: Option<&Path>,
    ) -> Result<Services, TargetError> {
        let mut services = Services {
            specs: specs.to_vec(),
            exe: exe.to_string(),
            database_url: database_url.to_string(),
            logs: logs.map(Path::to_path_buf),
            children: Vec::new(),
            records: Vec::new(),
        };
        for index in 0..specs.len() {
            let (running, record) = services.start_one(index, None)?;
            services.children.push(running);
            services.records.push(record);
        }
        Ok(services)
    }

    fn start_one(
        &self,
        index: usize,
        port: Option<u16>,
    ) -> Result<(Running, ServiceRecord), TargetError> {
        start_service(
            &self.specs[index],
            &self.exe,
            &self.database_url,
            port,
            self.logs.as_deref(),
        )
    }

    /// The index (in start order) of the service whose base URL is `base_url`.
    pub(crate) fn index_of(&self, base_url: &str) -> Option<usize> {
        self.records.iter().position(|r| r.base_url == base_url)
    }

    /// Stops service `index` with `signal` (`SIGSTOP` freezes it where it is: it runs no
    /// code and answers nothing until killed or continued). Returns whether it was sent.
    pub(crate) fn signal(&mut self, index: usize, signal: libc::c_int) -> bool {
        let Some(r) = self.children.get_mut(index) else {
            return false;
        };
        if !matches!(r.child.try_wait(), Ok(None)) {
            return false;
        }
        let Ok(pid) = libc::pid_t::try_from(r.child.id()) else {
            return false;
        };
        // SAFETY: kill takes a pid and a signal number and touches no memory of this process;
        // the pid is a child of this process not yet reaped, so it names no other process.
        unsafe { libc::kill(pid, signal) == 0 }
    }

    /// Kills service `index` (in start order) with SIGKILL, as a crash would, and reaps it;
    /// its port is free afterwards. Returns the killed process's pid, or `None` when the index
    /// is out of range or the service was already killed.
    pub fn kill(&mut self, index: usize) -> Option<u32> {
        let r = self.children.get_mut(index)?;
        let pid = r.child.id();
        if r.child.try_wait().ok().flatten().is_some() {
            return None;
        }
        r.stopped = true;
        let _ = r.child.kill();
        let _ = r.child.wait();
        r.cleanup.cancel();
        Some(pid)
    }

    /// Starts service `index` again with the command, environment and port it had, and waits
    /// for it to be ready as [`Services::start`] does; its record is replaced. The previous
    /// process must be gone ([`Services::kill`]).
    ///
    /// Will return `Err` when the index is out of range, or as [`Services::start`] does.
    pub fn restart(&mut self, index: usize) -> Result<(), TargetError> {
        let port = self
            .records
            .get(index)
            .and_then(|r| r.base_url.rsplit(':').next())
            .and_then(|p| p.parse::<u16>().ok())
            .ok_or_else(|| TargetError::Service {
                name: format!("#{index}"),
                reason: format!("no service {index} to restart"),
            })?;
        let (running, record) = self.start_one(index, Some(port))?;
        self.children[index] = running;
        self.records[index] = record;
        Ok(())
    }

    /// Whether service `index` is running (started and not exited or killed).
    pub(crate) fn is_running(&mut self, index: usize) -> bool {
        self.children
            .get_mut(index)
            .is_some_and(|r| matches!(r.child.try_wait(), Ok(None)))
    }

    /// Starts again every service that is not running (one that exited on its own in an
    /// earlier run of the same set-up), so that each run begins with every service up.
    ///
    /// Will return `Err` as [`Services::restart`] does.
    pub(crate) fn revive(&mut self) -> Result<(), TargetError> {
        for index in 0..self.children.len() {
            if !self.is_running(index) {
                self.restart(index)?;
            }
        }
        Ok(())
    }

    /// The services that exited since the last call without the runner stopping them, each
    /// reported once, with its status and the end of its stderr.
    pub(crate) fn exited(&mut self) -> Vec<ServiceExit> {
        let mut out = Vec::new();
        for (r, record) in self.children.iter_mut().zip(&self.records) {
            if r.stopped || r.reported {
                continue;
            }
            if let Ok(Some(status)) = r.child.try_wait() {
                r.reported = true;
                r.cleanup.cancel();
                out.push(ServiceExit {
                    name: record.name.clone(),
                    os_pid: record.os_pid,
                    status: status_words(status),
                    stderr_tail: tail_of(&mut r.stderr),
                });
            }
        }
        out
    }
}

impl Drop for Services {
    fn drop(&mut self) {
        for r in &mut self.children {
            r.stopped = true;
            let _ = r.child.kill();
            let _ = r.child.wait();
            r.cleanup.cancel();
        }
    }
}

/// An exit status in words, naming the signal that ended the process if one did.
fn status_words(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt as _;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(sig)) => format!("signal {sig}{}", signal_name(sig)),
        (None, None) => status.to_string(),
    }
}

fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGABRT => " (SIGABRT)",
        libc::SIGSEGV => " (SIGSEGV)",
        libc::SIGKILL => " (SIGKILL)",
        libc::SIGTERM => " (SIGTERM)",
        libc::SIGBUS => " (SIGBUS)",
        libc::SIGPIPE => " (SIGPIPE)",
        libc::SIGINT => " (SIGINT)",
        _ => "",
    }
}

/// Sends SIGTERM to a service this process started and has not stopped yet:
/// its interrupt cleanup in the [`crate::cleanup`] registry, which only ever holds pids this
/// process spawned. Returns whether `kill` succeeded.
fn terminate(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: kill takes a pid and a signal number and touches no memory of this process.
    unsafe { libc::kill(pid, libc::SIGTERM) == 0 }
}

/// A free loopback port: bound, read, released. Another process could take it in between;
/// the service then fails to bind and the run FAILs with its stderr, never a false PASS.
fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn substitute(arg: &str, exe: &str, port: u16, database_url: &str) -> String {
    arg.replace("{ticketflow}", exe)
        .replace("{port}", &port.to_string())
        .replace("{database_url}", database_url)
}

/// The last lines of a log, joined: `stderr: a / b / c`, or `no stderr`.
fn tail_of(file: &mut std::fs::File) -> String {
    use std::io::Seek as _;
    const TAIL_BYTES: u64 = 16 * 1024;
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let mut bytes = Vec::new();
    let _ = file.seek(std::io::SeekFrom::Start(len.saturating_sub(TAIL_BYTES)));
    let _ = file.read_to_end(&mut bytes);
    let text = String::from_utf8_lossy(&bytes);
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let tail = lines[lines.len().saturating_sub(5)..].join(" / ");
    if tail.is_empty() {
        "no stderr".into()
    } else {
        format!(
            "stderr: {}",
            crate::contain::terminal(&crate::blackbox::excerpt(&tail, 1200))
        )
    }
}

/// A start's stdout and stderr files, and their paths when they are kept.
type LogFiles = (std::fs::File, std::fs::File, Option<(String, String)>);

/// `name` as a file name: ASCII letters, digits, `-` and `_` kept, anything else `_`.
pub(crate) fn safe_file_name(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Where a start's stdout and stderr go: two new files in `dir` (`NAME-N.stdout.log` and
/// `.stderr.log`, N the first free number), or two anonymous temporary files.
fn log_files(dir: Option<&Path>, name: &str) -> std::io::Result<LogFiles> {
    let Some(dir) = dir else {
        return Ok((tempfile::tempfile()?, tempfile::tempfile()?, None));
    };
    std::fs::create_dir_all(dir)?;
    let safe = safe_file_name(name);
    for n in 1..10_000 {
        let out = dir.join(format!("{safe}-{n}.stdout.log"));
        let err = dir.join(format!("{safe}-{n}.stderr.log"));
        let open = |p: &Path| {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .open(p)
        };
        match open(&out) {
            Ok(o) => {
                let e = open(&err)?;
                return Ok((
                    o,
                    e,
                    Some((out.display().to_string(), err.display().to_string())),
                ));
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    Err(std::io::Error::other(format!(
        "{}: no free log file name for {name}",
        dir.display()
    )))
}

fn start_service(
    spec: &ServiceSpec,
    exe: &str,
    database_url: &str,
    port: Option<u16>,
    logs: Option<&Path>,
) -> Result<(Running, ServiceRecord), TargetError> {
    let fail = |reason: String| TargetError::Service {
        name: spec.name.clone(),
        reason,
    };
    let port = match port {
        Some(p) => p,
        None => free_port().map_err(|e| fail(format!("no free port: {e}")))?,
    };
    let args: Vec<String> = spec
        .command
        .iter()
        .map(|a| substitute(a, exe, port, database_url))
        .collect();
    let (stdout, mut stderr, paths) = log_files(logs, &spec.name).map_err(|e| {
        fail(format!(
            "no log file{}: {e}",
            logs.map(|d| format!(" in {}", d.display()))
                .unwrap_or_default()
        ))
    })?;
    let started = Instant::now();
    // An interrupt waits until the child is spawned and its cleanup registered.
    let section = crate::cleanup::critical();
    let mut command = Command::new(&args[0]);
    command
        .args(&args[1..])
        .envs(
            spec.env
                .iter()
                .map(|(k, v)| (k, substitute(v, exe, port, database_url))),
        )
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(
            stderr
                .try_clone()
                .map_err(|e| fail(format!("no temp file: {e}")))?,
        );
    // Dies with this process, even on SIGKILL (crate::child).
    let mut child = crate::child::spawn(command)
        .map_err(|e| fail(format!("cannot start {:?}: {e}", args[0])))?;
    let pid = child.id();
    let cleanup = crate::cleanup::register(
        crate::cleanup::Kind::ChildService,
        pid.to_string(),
        move || terminate(pid),
    );
    drop(section);
    let base_url = format!("http://127.0.0.1:{port}");
    let ready_url = format!("{base_url}{}", spec.ready_path);
    let deadline = started + Duration::from_millis(spec.ready_timeout_ms);
    let probe = HttpRequest {
        method: "GET".into(),
        url: ready_url.clone(),
        headers: Vec::new(),
        body: Vec::new(),
    };
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            cleanup.cancel();
            return Err(fail(format!(
                "exited with {} before it was ready; {}",
                status_words(status),
                tail_of(&mut stderr)
            )));
        }
        if matches!(client::send(&probe, Duration::from_millis(500)), Ok(a) if (200..300).contains(&a.status))
        {
            break;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            cleanup.cancel();
            return Err(fail(format!(
                "{ready_url} did not answer 2xx within {} ms; {}",
                spec.ready_timeout_ms,
                tail_of(&mut stderr)
            )));
        }
        // Readiness is observed (the ready path answers); this only paces the probes.
        std::thread::sleep(Duration::from_millis(20));
    }
    let (stdout_log, stderr_log) = paths.unzip();
    let record = ServiceRecord {
        name: spec.name.clone(),
        base_url,
        os_pid: child.id(),
        ready_ms: ms(started.elapsed()),
        stdout_log,
        stderr_log,
    };
    Ok((
        Running {
            child,
            cleanup,
            stderr,
            stopped: false,
            reported: false,
        },
        record,
    ))
}

/// The target database: a scratch one (dropped with this value) or the one the scenario names.
pub(crate) struct TargetDb {
    scratch: Option<ScratchDatabase>,
    /// Connection settings.
    pub config: postgres::Config,
    /// Its URL (what `{database_url}` expands to).
    pub url: String,
    /// Its name.
    pub name: String,
}

impl TargetDb {
    /// Whether the runner created it (and drops it with this value).
    pub(crate) fn is_scratch(&self) -> bool {
        self.scratch.is_some()
    }
}

/// The database named by `database_url`, or a new scratch database (label in its name) on the
/// server `server`.
///
/// Will return `Err` for a URL that does not parse, an unreachable server
/// ([`TargetError::Unreachable`]) or a failed `CREATE DATABASE`.
pub(crate) fn target_db(
    label: &str,
    database_url: Option<&str>,
    server: &PgServer,
) -> Result<TargetDb, TargetError> {
    if let Some(url) = database_url {
        let config = parse_postgres(url).map_err(db("parse database_url"))?;
        return Ok(TargetDb {
            name: config.get_dbname().unwrap_or("").to_string(),
            scratch: None,
            config,
            url: url.to_string(),
        });
    }
    let admin = pg::connect_as(server.config(), pg::SessionRole::Admin).map_err(|e| {
        TargetError::Unreachable {
            url: server.redacted(),
            reason: e.to_string(),
        }
    })?;
    let scratch =
        crate::scratch::ScratchDatabase::migrated(admin, server.config(), &format!("http_{label}"))
            .map_err(db("create scratch database"))?;
    Ok(TargetDb {
        url: url_with_db(server.url(), scratch.name())?,
        config: scratch.config().clone(),
        name: scratch.name().to_string(),
        scratch: Some(scratch),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ticketflow_core::error::DbErrorKind;

    fn store_error(kind: DbErrorKind, code: &str) -> ticketflow_core::StoreError {
        ticketflow_core::StoreError {
            kind,
            backend: ticketflow_core::store::Backend::Postgres,
            operation: "take the barrier lock",
            code: Some(code.into()),
            message: "canceling statement due to lock timeout".into(),
        }
    }

    #[test]
    fn a_barrier_lock_held_outside_a_busy_port_and_class_53_are_shortages_other_errors_are_not() {
        let held = TargetError::Database {
            what: BARRIER_LOCK,
            source: store_error(DbErrorKind::Timeout, "55P03"),
        };
        assert_eq!(held.shortage(), Some(Shortage::BarrierLock));
        let elsewhere = TargetError::Database {
            what: "count rows",
            source: store_error(DbErrorKind::Timeout, "55P03"),
        };
        assert_eq!(
            elsewhere.shortage(),
            None,
            "a lock timeout elsewhere is the service's"
        );
        let full = TargetError::Database {
            what: "count rows",
            source: store_error(DbErrorKind::Unavailable, "53300"),
        };
        assert_eq!(full.shortage(), Some(Shortage::Connections));
        for stderr in [
            "Error: listen EADDRINUSE: address already in use 127.0.0.1:8080",
            "OSError: [Errno 98] Address already in use",
        ] {
            let service = TargetError::Service {
                name: "api".into(),
                reason: format!("exited with status 1; stderr: {stderr}"),
            };
            assert_eq!(service.shortage(), Some(Shortage::Port), "{stderr}");
        }
        let crashed = TargetError::Service {
            name: "api".into(),
            reason: "exited with status 1; stderr: TypeError".into(),
        };
        assert_eq!(crashed.shortage(), None);
    }
}
