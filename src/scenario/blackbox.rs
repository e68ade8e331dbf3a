//! The black-box runner: racers send HTTP requests to a service (ours, started by the runner,
//! or yours, already running) instead of calling the library, and the barrier still runs on
//! the service's PostgreSQL.
//!
//! One run: create a scratch database (unless the scenario names the target's own
//! `database_url`), apply our migrations when `own_service = true`, start the declared
//! services on free loopback ports and wait (bounded) for each one's ready path, take the
//! controller lock on the scenario's `receipts_table`, send every racer's request on its own
//! thread, poll `pg_locks` until exactly as many lock requests on that table as there are
//! racers wait behind the controller (from sessions other than the controller's and the
//! monitor's), release, collect the responses, count rows with the scenario's SQL, stop the
//! services, drop the scratch database.
//!
//! The runner cannot tell which server session serves which racer; it proves the barrier by
//! count: N racers, N waiting lock requests on the receipts table, each blocked by the
//! controller, none from the harness's own sessions. Fewer (a request still queued in the
//! service, or one that finished without touching the table) or more (something else waits
//! on the table) is a FAIL with the reason, never a PASS.
//!
//! Verdicts come from what a client sees — status (201 created, 201 with the replay header
//! replayed, 409 conflict, anything else an error), the ticket id in the body — plus the rows
//! counted in the target database (`[target.count]`). Running a command per request is not
//! implemented.

use std::collections::BTreeSet;
use std::io::Read as _;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use uuid::Uuid;

use super::check::{barrier_check, GroundTruth};
use super::format::{LockMode, Racer, Scenario, ServiceSpec, TargetSpec};
use super::runner::{finish, redact, PgOptions, POLL_INTERVAL};
use super::timeline::{now_us, Step, StoreCall};
use super::{
    Evidence, RacerOutcome, RacerRecord, RunSetting, ScenarioRun, ServiceRecord, TargetWait,
    Verdict,
};
use crate::domain::{DecisionPath, OutcomeKind};
use crate::fingerprint::Fingerprint;
use crate::store::postgres::{self as pg, IsolationLevel, PgStore, ScratchDatabase};
use crate::store::RowCounts;

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
        source: crate::StoreError,
    },
    /// A service could not be started or did not become ready in time.
    #[error("service {name}: {reason}")]
    Service {
        /// The service's name.
        name: String,
        /// What went wrong, with the end of its stderr when there is one.
        reason: String,
    },
    /// The URL given for the scratch database cannot be pointed at another database.
    #[error("cannot derive a database URL from {0:?}: expected postgres://…")]
    Url(String),
}

fn db(what: &'static str) -> impl Fn(crate::StoreError) -> TargetError {
    move |source| TargetError::Database { what, source }
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1000.0 * 100.0).round() / 100.0
}

/// The run's setting cell: one per black-box scenario.
pub fn setting(target: &TargetSpec) -> RunSetting {
    RunSetting::Http {
        endpoints: target.endpoints().len(),
    }
}

/// `base` (a `postgres://` URL) pointed at database `dbname`, keeping user, host and query.
///
/// Will return `Err` when `base` is not a URL (a key=value string).
pub fn url_with_db(base: &str, dbname: &str) -> Result<String, TargetError> {
    let Some(scheme_end) = base.find("://") else {
        return Err(TargetError::Url(redact(base)));
    };
    let authority_start = scheme_end + 3;
    let path_start = base[authority_start..]
        .find(['/', '?'])
        .map(|i| authority_start + i)
        .unwrap_or(base.len());
    let query = base[path_start..]
        .find('?')
        .map(|q| &base[path_start + q..])
        .unwrap_or("");
    Ok(format!("{}/{dbname}{query}", &base[..path_start]))
}

/// Services started for one run; killed (and reaped) when dropped.
struct Services {
    children: Vec<(String, Child)>,
    records: Vec<ServiceRecord>,
}

impl Drop for Services {
    fn drop(&mut self) {
        for (_, child) in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
            active_services().retain(|p| *p != child.id());
        }
    }
}

/// OS pids of services started and not yet stopped, so an interrupt handler can stop them
/// ([`stop_active_services`]).
static ACTIVE_SERVICES: std::sync::Mutex<Vec<u32>> = std::sync::Mutex::new(Vec::new());

fn active_services() -> std::sync::MutexGuard<'static, Vec<u32>> {
    ACTIVE_SERVICES.lock().unwrap_or_else(|p| p.into_inner())
}

/// Sends SIGTERM (through `kill`) to every service this process started for a black-box run
/// and has not stopped yet; for an interrupt handler, before the process exits. Returns their
/// pids. Only pids this process spawned are ever signalled.
pub fn stop_active_services() -> Vec<u32> {
    let pids: Vec<u32> = active_services().drain(..).collect();
    for pid in &pids {
        let _ = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
    pids
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
) -> Result<(Child, ServiceRecord), TargetError> {
    let fail = |reason: String| TargetError::Service {
        name: spec.name.clone(),
        reason,
    };
    let port = free_port().map_err(|e| fail(format!("no free port: {e}")))?;
    let args: Vec<String> = spec
        .command
        .iter()
        .map(|a| substitute(a, exe, port, database_url))
        .collect();
    let mut stderr = tempfile::tempfile().map_err(|e| fail(format!("no temp file: {e}")))?;
    let started = Instant::now();
    let mut child = Command::new(&args[0])
        .args(&args[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(
            stderr
                .try_clone()
                .map_err(|e| fail(format!("no temp file: {e}")))?,
        )
        .spawn()
        .map_err(|e| fail(format!("cannot start {:?}: {e}", args[0])))?;
    active_services().push(child.id());
    let base_url = format!("http://127.0.0.1:{port}");
    let ready_url = format!("{base_url}{}", spec.ready_path);
    let deadline = started + Duration::from_millis(spec.ready_timeout_ms);
    let agent = ureq::AgentBuilder::new()
        .timeout(Duration::from_millis(500))
        .build();
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            active_services().retain(|p| *p != child.id());
            return Err(fail(format!(
                "exited with {status} before it was ready; {}",
                tail_of(&mut stderr)
            )));
        }
        if matches!(agent.get(&ready_url).call(), Ok(r) if (200..300).contains(&r.status())) {
            break;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            active_services().retain(|p| *p != child.id());
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
    Ok((child, record))
}

/// One racer's request and what came back.
struct HttpRun {
    result: Result<RacerOutcome, String>,
    step: Step,
    done_at: Instant,
}

fn send(agent: &ureq::Agent, target: &TargetSpec, base_url: &str, racer: &Racer) -> HttpRun {
    let url = format!("{}{}", base_url.trim_end_matches('/'), target.create_path);
    let body = serde_json::to_string(&racer.request).expect("requests serialize");
    let started_us = now_us();
    let step = |what: String| Step {
        what,
        call: StoreCall::Http {
            method: "POST".into(),
            url: url.clone(),
        },
        started_us,
        finished_us: now_us(),
    };
    let response = agent
        .post(&url)
        .set(&target.key_header, &racer.key)
        .set(&target.tenant_header, &racer.tenant)
        .set("Content-Type", "application/json")
        .send_string(&body);
    let done_at = Instant::now();
    let (status, response) = match response {
        Ok(r) => (r.status(), r),
        Err(ureq::Error::Status(code, r)) => (code, r),
        Err(ureq::Error::Transport(t)) => {
            return HttpRun {
                result: Err(format!("POST {url}: {t}")),
                step: step(format!("POST {url} -> transport error")),
                done_at,
            }
        }
    };
    let replayed = response
        .header(&target.replay_header)
        .is_some_and(|v| v.eq_ignore_ascii_case("true"));
    let path = response
        .header(crate::serve::PATH_HEADER)
        .and_then(|p| match p {
            "created" => Some(DecisionPath::Created),
            "from-lookup" => Some(DecisionPath::FromLookup),
            "after-unique-violation" => Some(DecisionPath::AfterUniqueViolation),
            "after-insert-conflict" => Some(DecisionPath::AfterInsertConflict),
            _ => None,
        });
    let mut text = String::new();
    let _ = response
        .into_reader()
        .take(1 << 20)
        .read_to_string(&mut text);
    let step = step(format!(
        "POST {url} -> {status}{}",
        if replayed { " (replayed)" } else { "" }
    ));
    let outcome = |kind, ticket_id| RacerOutcome {
        kind,
        ticket_id,
        path,
        http_status: status,
        // A black-box target does not say how many transactions it ran.
        attempts: 0,
        retried: Vec::new(),
    };
    let result = match status {
        200 | 201 => {
            let id = serde_json::from_str::<serde_json::Value>(&text)
                .ok()
                .and_then(|v| {
                    v.get(&target.id_field)
                        .and_then(|i| i.as_str())
                        .map(str::to_string)
                })
                .and_then(|i| Uuid::parse_str(&i).ok());
            match id {
                Some(id) if replayed => Ok(outcome(OutcomeKind::Replayed, Some(id))),
                Some(id) => Ok(outcome(OutcomeKind::Created, Some(id))),
                None => Err(format!(
                    "HTTP {status} without a ticket id in member {:?}",
                    target.id_field
                )),
            }
        }
        409 => Ok(outcome(OutcomeKind::Conflict, None)),
        other => Err(format!(
            "HTTP {other}: {}",
            text.chars().take(300).collect::<String>()
        )),
    };
    HttpRun {
        result,
        step,
        done_at,
    }
}

/// The target database: a scratch one (dropped with this value) or the one the scenario names.
struct TargetDb {
    _scratch: Option<ScratchDatabase>,
    config: postgres::Config,
    url: String,
    name: String,
}

fn target_db(
    scenario: &Scenario,
    target: &TargetSpec,
    opts: &PgOptions,
) -> Result<TargetDb, TargetError> {
    if let Some(url) = &target.database_url {
        let config = pg::parse_url(url).map_err(db("parse database_url"))?;
        return Ok(TargetDb {
            name: config.get_dbname().unwrap_or("").to_string(),
            _scratch: None,
            config,
            url: url.clone(),
        });
    }
    let server = pg::parse_url(&opts.url).map_err(db("parse PostgreSQL url"))?;
    let admin = pg::connect(&server).map_err(|e| TargetError::Unreachable {
        url: redact(&opts.url),
        reason: e.to_string(),
    })?;
    let scratch = ScratchDatabase::create(admin, &server, &format!("http_{}", scenario.name))
        .map_err(db("create scratch database"))?;
    Ok(TargetDb {
        url: url_with_db(&opts.url, scratch.name())?,
        config: scratch.config().clone(),
        name: scratch.name().to_string(),
        _scratch: Some(scratch),
    })
}

/// Runs a black-box scenario (one with `[target]`). `opts.url` is the server for the scratch
/// database; `opts.worker_exe` is what `{ticketflow}` names (default: the running binary).
/// Never PASS without the barrier proven; PENDING when the scratch server is unreachable.
pub fn run_http(scenario: &Scenario, opts: &PgOptions) -> ScenarioRun {
    let target = scenario
        .target
        .as_ref()
        .expect("run_http needs a scenario with [target]");
    let setting = setting(target);
    match run_inner(scenario, target, opts, setting) {
        Ok(run) => run,
        Err(e @ TargetError::Unreachable { .. }) => {
            ScenarioRun::pending(scenario, setting, e.to_string())
        }
        Err(e) => {
            let mut run = ScenarioRun::pending(scenario, setting, e.to_string());
            run.verdict = Verdict::Fail;
            run
        }
    }
}

const WAITERS_SQL: &str = "SELECT a.pid, coalesce(a.application_name, ''), \
            coalesce(a.wait_event_type, '-') || '/' || coalesce(a.wait_event, '-'), \
            l.mode, pg_blocking_pids(a.pid), a.wait_event_type = 'Lock' \
     FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
     WHERE NOT l.granted AND l.locktype = 'relation' AND l.relation = to_regclass($1) \
       AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
       AND l.pid <> $2 AND l.pid <> pg_backend_pid()";

fn run_inner(
    scenario: &Scenario,
    target: &TargetSpec,
    opts: &PgOptions,
    setting: RunSetting,
) -> Result<ScenarioRun, TargetError> {
    let database = target_db(scenario, target, opts)?;
    let mut monitor =
        pg::connect(&database.config).map_err(db("connect to the target database"))?;
    if target.own_service {
        // Our migrations, as `ticketflow serve` would apply them.
        PgStore::connect(&database.config, IsolationLevel::ReadCommitted)
            .map_err(db("migrate the target database"))?;
    }
    let exe: PathBuf = match &opts.worker_exe {
        Some(p) => p.clone(),
        None => std::env::current_exe().map_err(|e| TargetError::Service {
            name: "-".into(),
            reason: format!("cannot locate the ticketflow binary: {e}"),
        })?,
    };
    let mut services = Services {
        children: Vec::new(),
        records: Vec::new(),
    };
    for spec in &target.service {
        let (child, record) = start_service(spec, &exe.to_string_lossy(), &database.url)?;
        services.children.push((spec.name.clone(), child));
        services.records.push(record);
    }
    // Endpoint name → base URL: service names, then base URLs as written.
    let endpoints: Vec<(String, String)> = services
        .records
        .iter()
        .map(|s| (s.name.clone(), s.base_url.clone()))
        .chain(target.base_urls.iter().map(|u| (u.clone(), u.clone())))
        .collect();
    let base_for = |i: usize, racer: &Racer| -> String {
        match &racer.via {
            Some(v) => endpoints
                .iter()
                .find(|(n, _)| n == v)
                .map(|(_, u)| u.clone())
                .expect("validated at load"),
            None => endpoints[i % endpoints.len()].1.clone(),
        }
    };

    let server_version: String = monitor
        .query_one("SHOW server_version", &[])
        .map_err(|e| pg::classify("read server version", e))
        .map_err(db("read server version"))?
        .get(0);
    let exists: bool = monitor
        .query_one(
            "SELECT to_regclass($1) IS NOT NULL",
            &[&target.receipts_table],
        )
        .map_err(|e| pg::classify("find receipts table", e))
        .map_err(db("find receipts table"))?
        .get(0);
    if !exists {
        return Err(TargetError::Database {
            what: "find receipts table",
            source: crate::StoreError {
                kind: crate::DbErrorKind::Other,
                backend: "postgres",
                operation: "find receipts table",
                code: None,
                message: format!(
                    "no table {:?} in database {} (own_service = false and the service did not create it?)",
                    target.receipts_table, database.name
                ),
            },
        });
    }
    let mut controller = pg::connect(&database.config).map_err(db("controller connect"))?;
    let controller_pid: i32 = controller
        .query_one("SELECT pg_backend_pid()", &[])
        .map_err(|e| pg::classify("controller pid", e))
        .map_err(db("controller pid"))?
        .get(0);
    let mode = match scenario.barrier.lock {
        LockMode::Exclusive => "EXCLUSIVE",
        // Advisory is refused at load time for a target.
        LockMode::AccessExclusive | LockMode::Advisory => "ACCESS EXCLUSIVE",
    };
    let lock_statement = format!("LOCK TABLE {} IN {mode} MODE", target.receipts_table);
    controller
        .batch_execute(&format!("BEGIN; {lock_statement}"))
        .map_err(|e| pg::classify("take the barrier lock", e))
        .map_err(db("controller could not take the barrier lock"))?;

    let agent = ureq::AgentBuilder::new()
        .timeout(Duration::from_millis(target.request_timeout_ms))
        .build();
    let timeout = opts
        .barrier_timeout
        .unwrap_or(Duration::from_millis(scenario.barrier.timeout_ms));
    let n = scenario.racers.len();
    let started = Instant::now();
    let mut polls = 0u32;
    let mut waits: Vec<TargetWait> = Vec::new();
    let mut problem: Option<String> = None;
    let mut reached_at: Option<Instant> = None;
    let mut release: Option<Instant> = None;
    let bases: Vec<String> = scenario
        .racers
        .iter()
        .enumerate()
        .map(|(i, r)| base_for(i, r))
        .collect();

    let runs: Vec<HttpRun> = std::thread::scope(|sc| {
        let handles: Vec<_> = scenario
            .racers
            .iter()
            .zip(&bases)
            .map(|(racer, base)| {
                let agent = &agent;
                sc.spawn(move || send(agent, target, base, racer))
            })
            .collect();
        let deadline = started + timeout;
        loop {
            polls += 1;
            match monitor.query(WAITERS_SQL, &[&target.receipts_table, &controller_pid]) {
                Ok(rows) => {
                    waits = rows
                        .iter()
                        .filter(|r| {
                            r.get::<_, Option<bool>>(5) == Some(true)
                                && r.get::<_, Vec<i32>>(4).contains(&controller_pid)
                        })
                        .map(|r| TargetWait {
                            pid: r.get(0),
                            application_name: r.get(1),
                            wait_event: r.get(2),
                            mode: r.get(3),
                            blocked_by: r.get(4),
                        })
                        .collect();
                    if waits.len() > n {
                        problem = Some(format!(
                            "{} lock requests wait on {} for {n} racers: cannot attribute them to the racers",
                            waits.len(),
                            target.receipts_table
                        ));
                        break;
                    }
                    if waits.len() == n {
                        reached_at = Some(Instant::now());
                        break;
                    }
                }
                Err(e) => {
                    problem = Some(format!("cannot read pg_locks: {e}"));
                    break;
                }
            }
            if let Some(i) = handles.iter().position(|h| h.is_finished()) {
                problem = Some(format!(
                    "racers never reached the barrier: {}'s request finished before {n} waits on {} were seen",
                    scenario.racers[i].name, target.receipts_table
                ));
                break;
            }
            if Instant::now() >= deadline {
                problem = Some(format!(
                    "racers never reached the barrier: {} of {n} requests seen waiting on {} within {} ms",
                    waits.len(),
                    target.receipts_table,
                    timeout.as_millis()
                ));
                break;
            }
            // The condition is observed on the server; this only paces the queries.
            std::thread::sleep(POLL_INTERVAL);
        }
        if let Err(e) = controller.batch_execute("COMMIT") {
            problem.get_or_insert(format!("controller could not release the lock: {e}"));
        }
        release = Some(Instant::now());
        handles
            .into_iter()
            .map(|h| h.join().expect("racer thread panicked"))
            .collect()
    });
    drop(controller);
    let release_at = release.expect("set before the racers are joined");

    let barrier = barrier_check(problem.as_deref(), || {
        format!(
            "{} requests seen waiting on {} ({}) in the target database, blocked by the controller, for {n} racers",
            waits.len(),
            target.receipts_table,
            waits.first().map(|w| w.mode.as_str()).unwrap_or("")
        )
    });
    let records: Vec<RacerRecord> = scenario
        .racers
        .iter()
        .zip(&runs)
        .zip(&bases)
        .map(|((racer, run), _base)| RacerRecord {
            name: racer.name.clone(),
            tenant: racer.tenant.clone(),
            key: racer.key.clone(),
            fingerprint: Fingerprint::of(&racer.request).hash,
            backend_pid: None,
            os_pid: None,
            result: run.result.clone(),
            steps: vec![run.step.clone()],
            done_after_release_ms: Some(ms(run.done_at.saturating_duration_since(release_at))),
        })
        .collect();

    let mut truth = GroundTruth {
        black_box: true,
        ..GroundTruth::default()
    };
    let mut tenants: BTreeSet<String> = scenario.racers.iter().map(|r| r.tenant.clone()).collect();
    tenants.extend(scenario.expect.rows.keys().cloned());
    for tenant in tenants {
        let mut n = [0i64; 3];
        for (slot, sql) in n.iter_mut().zip([
            &target.count.tickets,
            &target.count.receipts,
            &target.count.created_events,
        ]) {
            *slot = monitor
                .query_one(&format!("SELECT (({sql}))::bigint"), &[&tenant])
                .map_err(|e| pg::classify("count rows", e))
                .map_err(db("count rows with the scenario's [target.count] SQL"))?
                .get::<_, Option<i64>>(0)
                .unwrap_or(0);
        }
        truth.rows.insert(
            tenant,
            RowCounts {
                tickets: n[0],
                receipts: n[1],
                created_events: n[2],
            },
        );
    }
    let evidence = Evidence::Http {
        server_version,
        database: database.name.clone(),
        scratch: database._scratch.is_some(),
        own_service: target.own_service,
        lock_mode: scenario.barrier.lock,
        controller_pid,
        lock_statement,
        services: services.records.clone(),
        base_urls: endpoints.iter().map(|(_, u)| u.clone()).collect(),
        waits,
        barrier_reached_ms: reached_at.map(|r| ms(r - started)),
        polls,
    };
    let done = runs
        .iter()
        .map(|r| r.done_at)
        .max()
        .map(|d| ms(d.saturating_duration_since(release_at)));
    drop(monitor);
    // Stop the services before the scratch database is dropped.
    drop(services);
    let run = finish(scenario, setting, barrier, records, truth, evidence, done);
    drop(database);
    Ok(run)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_with_db_keeps_user_host_and_query() {
        assert_eq!(
            url_with_db(
                "postgres://u@127.0.0.1:5432/postgres?sslmode=disable",
                "tf_x"
            )
            .unwrap(),
            "postgres://u@127.0.0.1:5432/tf_x?sslmode=disable"
        );
        assert_eq!(
            url_with_db("postgres://u@h", "d").unwrap(),
            "postgres://u@h/d"
        );
        assert!(url_with_db("host=h user=u", "d").is_err());
    }

    #[test]
    fn placeholders_are_substituted() {
        assert_eq!(
            substitute(
                "{ticketflow}:{port}:{database_url}",
                "/bin/tf",
                8080,
                "postgres://x/y"
            ),
            "/bin/tf:8080:postgres://x/y"
        );
    }
}
