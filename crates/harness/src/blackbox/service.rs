//! What a black-box run sets up around the race: the target database (a scratch database the
//! runner creates and drops, or the one the scenario names) and the services it starts on free
//! loopback ports, waits for, and stops.

use std::io::Read as _;
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::client::{self, HttpRequest};
use super::format::ServiceSpec;
use crate::scenario::timeline::ms;
use crate::scratch::ScratchDatabase;
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

/// Services started for one run; killed (and reaped) when dropped.
#[derive(Default)]
pub struct Services {
    children: Vec<(String, Child, crate::cleanup::Registration)>,
    /// What was started, in order.
    pub records: Vec<ServiceRecord>,
}

impl Services {
    /// Starts every service in `specs` (placeholders: `{ticketflow}` = `exe`, `{port}`,
    /// `{database_url}`) and waits, bounded by each one's `ready_timeout_ms`, for its ready
    /// path to answer 2xx. Services already started are stopped when this returns `Err`.
    ///
    /// Will return `Err` naming the service when it cannot start, exits, or is not ready in
    /// time (with the end of its stderr).
    pub fn start(
        specs: &[ServiceSpec],
        exe: &str,
        database_url: &str,
    ) -> Result<Services, TargetError> {
        let mut services = Services::default();
        for spec in specs {
            let (child, cleanup, record) = start_service(spec, exe, database_url, None)?;
            services.children.push((spec.name.clone(), child, cleanup));
            services.records.push(record);
        }
        Ok(services)
    }

    /// Kills service `index` (in start order) with SIGKILL, as a crash would, and reaps it;
    /// its port is free afterwards. Returns the killed process's pid, or `None` when the index
    /// is out of range or the service was already killed.
    pub fn kill(&mut self, index: usize) -> Option<u32> {
        let (_, child, cleanup) = self.children.get_mut(index)?;
        let pid = child.id();
        if child.try_wait().ok().flatten().is_some() {
            return None;
        }
        let _ = child.kill();
        let _ = child.wait();
        cleanup.cancel();
        Some(pid)
    }

    /// Starts service `index` again from `spec` on the port it had, and waits for it to be
    /// ready as [`Services::start`] does; its record is replaced. The previous process must be
    /// gone ([`Services::kill`]).
    ///
    /// Will return `Err` when the index is out of range, or as [`Services::start`] does.
    pub fn restart(
        &mut self,
        index: usize,
        spec: &ServiceSpec,
        exe: &str,
        database_url: &str,
    ) -> Result<(), TargetError> {
        let port = self
            .records
            .get(index)
            .and_then(|r| r.base_url.rsplit(':').next())
            .and_then(|p| p.parse::<u16>().ok())
            .ok_or_else(|| TargetError::Service {
                name: spec.name.clone(),
                reason: format!("no service {index} to restart"),
            })?;
        let (child, cleanup, record) = start_service(spec, exe, database_url, Some(port))?;
        self.children[index] = (spec.name.clone(), child, cleanup);
        self.records[index] = record;
        Ok(())
    }

    /// Whether service `index` is running (started and not exited or killed).
    pub(crate) fn is_running(&mut self, index: usize) -> bool {
        self.children
            .get_mut(index)
            .is_some_and(|(_, child, _)| matches!(child.try_wait(), Ok(None)))
    }
}

impl Drop for Services {
    fn drop(&mut self) {
        for (_, child, cleanup) in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
            cleanup.cancel();
        }
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

fn tail_of(file: &mut std::fs::File) -> String {
    use std::io::Seek as _;
    let mut text = String::new();
    let _ = file.seek(std::io::SeekFrom::Start(0));
    let _ = file.read_to_string(&mut text);
    let lines: Vec<&str> = text.lines().collect();
    let tail = lines[lines.len().saturating_sub(5)..].join(" / ");
    if tail.is_empty() {
        "no stderr".into()
    } else {
        format!("stderr: {tail}")
    }
}

fn start_service(
    spec: &ServiceSpec,
    exe: &str,
    database_url: &str,
    port: Option<u16>,
) -> Result<(Child, crate::cleanup::Registration, ServiceRecord), TargetError> {
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
    let mut stderr = tempfile::tempfile().map_err(|e| fail(format!("no temp file: {e}")))?;
    let started = Instant::now();
    // An interrupt waits until the child is spawned and its cleanup registered.
    let section = crate::cleanup::critical();
    let mut command = Command::new(&args[0]);
    command
        .args(&args[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
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
                "exited with {status} before it was ready; {}",
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
    let record = ServiceRecord {
        name: spec.name.clone(),
        base_url,
        os_pid: child.id(),
        ready_ms: ms(started.elapsed()),
    };
    Ok((child, cleanup, record))
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
