//! What a run needs before its first request: the target database (or a scratch one) and its
//! setup SQL, the services, the interposers (started here or reached over a running one's
//! control address), the endpoints checked, the server's facts and the barrier's lock.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use super::counts::prepare_counts;
use super::RunOptions;
use crate::barrier::server::ServerLock;
use crate::blackbox::excerpt;
use crate::blackbox::format::{BarrierKind, TargetScenario};
use crate::blackbox::service::{db, target_db, Services, TargetDb, TargetError};
use crate::scenario::capacity::FDS_PER_HTTP_RACER;
use ticketflow_core::store::postgres::{self as pg, IsolationLevel, PgStore};
use ticketflow_core::store::url::redact;

/// What a run needs before its first request: the target database and a session on it, the
/// interposers in front of its stores, the started services, the endpoints, the barrier's lock.
/// Fields drop in order: the monitor, the control connection to a running interposer, the
/// services, the interposers, then the scratch database.
pub(super) struct Prepared {
    pub(super) monitor: Option<postgres::Client>,
    /// The stores of a running `ticketflow interpose` (`[target] interposer`), conducted over
    /// its control connection (closed, and its runs ended, when the last one drops).
    pub(super) remote: Vec<crate::interpose::control::RemoteHub>,
    pub(super) services: Services,
    pub(super) interposers: Vec<crate::interpose::Interposer>,
    pub(super) database: Option<TargetDb>,
    pub(super) endpoints: Vec<(String, String)>,
    pub(super) server_version: Option<String>,
    pub(super) isolation: Option<String>,
    pub(super) server_lock: Option<ServerLock>,
    /// The `redis-pause` barrier's connection.
    pub(super) pause: Option<crate::blackbox::pause::PauseController>,
    /// A direct connection to `redis_url` for the Redis counts.
    pub(super) redis: Option<redis::Connection>,
}

/// Sets a scenario up for one or more runs (an exploration runs many on one set-up).
pub(super) fn prepare(
    scenario: &TargetScenario,
    opts: &RunOptions,
) -> Result<Prepared, TargetError> {
    let t = &scenario.target;
    // Refused before anything is set up: a wave's racers each hold a connection at once.
    let mut per_wave: BTreeMap<u32, usize> = BTreeMap::new();
    for r in &scenario.racers {
        *per_wave.entry(r.wave).or_default() += 1;
    }
    let widest = per_wave.values().copied().max().unwrap_or(0);
    crate::scenario::capacity::check_files(widest, FDS_PER_HTTP_RACER)?;
    let needs_db = scenario.barrier.kind.needs_database()
        || t.counts.iter().any(|q| q.redis.is_none())
        || !t.services.is_empty();
    let database: Option<TargetDb> = if needs_db {
        Some(target_db(
            &scenario.name,
            t.database_url.as_deref(),
            &opts.pg,
        )?)
    } else {
        None
    };
    let mut monitor = match &database {
        Some(d) => Some(
            pg::connect_as(&d.config, pg::SessionRole::Monitor).map_err(|e| {
                TargetError::Unreachable {
                    url: redact(&d.url),
                    reason: e.to_string(),
                }
            })?,
        ),
        None => None,
    };
    prepare_database(scenario, database.as_ref(), monitor.as_mut())?;
    let interposers = start_interposers(scenario, database.as_ref())?;
    let remote = connect_interposer(scenario, database.as_ref(), monitor.as_mut())?;
    let (services, endpoints) = start_endpoints(scenario, opts, database.as_ref(), &interposers)?;
    if let Some(m) = monitor.as_mut() {
        prepare_counts(scenario, m)?;
    }
    let (server_version, isolation) = match monitor.as_mut() {
        Some(m) => {
            let (version, iso) = server_facts(m)?;
            (Some(version), Some(iso))
        }
        None => (None, None),
    };
    let server_lock = server_lock(scenario, database.as_ref(), monitor.as_mut())?;
    let (pause, redis) = prepare_redis(scenario)?;
    Ok(Prepared {
        monitor,
        remote,
        services,
        interposers,
        database,
        endpoints,
        server_version,
        isolation,
        server_lock,
        pause,
        redis,
    })
}

/// The runner's own connections to `[target] redis_url`, straight to it (never through the
/// interposer): the `redis-pause` barrier's controller, and one for the Redis counts the
/// scenario expects.
///
/// Will return `Err` ([`TargetError::Setup`]) when Redis does not answer, or the pause barrier
/// refuses the server ([`crate::blackbox::pause::PauseController::connect`]).
pub(super) fn prepare_redis(
    scenario: &TargetScenario,
) -> Result<
    (
        Option<crate::blackbox::pause::PauseController>,
        Option<redis::Connection>,
    ),
    TargetError,
> {
    let Some(url) = scenario.target.redis_url.as_deref() else {
        return Ok((None, None));
    };
    let pause = match scenario.barrier.kind {
        BarrierKind::RedisPause => Some(crate::blackbox::pause::PauseController::connect(url)?),
        _ => None,
    };
    // Every Redis count query the file declares may be read: by `[[expect.counts]]`, or by
    // the model of a model-judged scenario or `check` history, which counts every query.
    let counts_redis = scenario.target.counts.iter().any(|q| q.redis.is_some());
    let redis = if counts_redis {
        Some(crate::blackbox::redis_store::connect(url, "Redis counts")?)
    } else {
        None
    };
    Ok((pause, redis))
}

/// The interposers of an interposed scenario: one in front of the target database, one in
/// front of `redis_url` when given. None for other barriers.
pub(super) fn start_interposers(
    scenario: &TargetScenario,
    database: Option<&TargetDb>,
) -> Result<Vec<crate::interpose::Interposer>, TargetError> {
    use crate::interpose::{upstream_of, Interposer, Limits, StoreKind};
    if scenario.barrier.kind != BarrierKind::Interposer || scenario.target.interposer.is_some() {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    let mut start = |store: StoreKind, url: &str| -> Result<(), TargetError> {
        let upstream = upstream_of(url)
            .map_err(|e| TargetError::Setup(format!("interposer for {}: {e}", redact(url))))?;
        let ip = Interposer::start(store, upstream, Limits::default())
            .map_err(|e| TargetError::Setup(format!("interposer for {}: {e}", redact(url))))?;
        out.push(ip);
        Ok(())
    };
    if let Some(d) = database {
        start(StoreKind::Postgres, &d.url)?;
    }
    if let Some(r) = &scenario.target.redis_url {
        start(StoreKind::Redis, r)?;
    }
    Ok(out)
}

/// The control token of the running `ticketflow interpose` a scenario names, read from
/// `[target] interposer_token_file`, else from the file `TICKETFLOW_INTERPOSE_TOKEN_FILE`
/// names.
///
/// Will return `Err` with the reason when neither names a file, or the file cannot be read or
/// holds no token.
fn control_token(
    scenario: &TargetScenario,
) -> Result<crate::interpose::token::ControlToken, String> {
    use crate::interpose::token::{ControlToken, TOKEN_FILE_ENV};
    let path = match &scenario.target.interposer_token_file {
        Some(p) => p.clone(),
        None => match std::env::var_os(TOKEN_FILE_ENV) {
            Some(p) if !p.is_empty() => PathBuf::from(p),
            _ => {
                return Err(format!(
                    "needs the control token of `ticketflow interpose`: name the control token file it printed in [target] interposer_token_file, or in {TOKEN_FILE_ENV}"
                ))
            }
        },
    };
    ControlToken::read(&path).map_err(|e| e.to_string())
}

/// The stores of the running `ticketflow interpose` a scenario names (`[target] interposer`),
/// after checking that it relays to the server `database_url` names (its upstream address, and
/// the backends of its open sessions in that database) and that the service's sessions go
/// through it. None when the scenario names none.
///
/// Will return [`TargetError::Setup`] when nothing answers at the control address, another
/// client controls it, it relays to another server or database, or no session of the service
/// ever went through it.
pub(super) fn connect_interposer(
    scenario: &TargetScenario,
    database: Option<&TargetDb>,
    monitor: Option<&mut postgres::Client>,
) -> Result<Vec<crate::interpose::control::RemoteHub>, TargetError> {
    use crate::interpose::control::ControlClient;
    use crate::interpose::{upstream_of, StoreKind};
    let Some(addr) = scenario.target.interposer else {
        return Ok(Vec::new());
    };
    let setup = |m: String| TargetError::Setup(format!("[target] interposer {addr}: {m}"));
    let token = control_token(scenario).map_err(setup)?;
    let client = ControlClient::connect(addr, &token, CONTROL_CONNECT_TIMEOUT)
        .map_err(|e| TargetError::Setup(e.to_string()))?;
    let info = client.greeting().clone();
    let (Some(d), Some(m)) = (database, monitor) else {
        return Err(setup(
            "needs database_url (the direct URL of the service's database)".into(),
        ));
    };
    let pg = info.store(StoreKind::Postgres).ok_or_else(|| {
        setup(format!(
            "it stands in front of no PostgreSQL (start it with {})",
            ticketflow_core::flags::POSTGRES
        ))
    })?;
    let named = upstream_of(&d.url).map_err(|e| setup(format!("database_url: {e}")))?;
    // `localhost` may resolve to ::1 here and to 127.0.0.1 there: on loopback the port decides.
    let same = |a: std::net::SocketAddr, b: std::net::SocketAddr| {
        a == b || (a.ip().is_loopback() && b.ip().is_loopback() && a.port() == b.port())
    };
    if !same(pg.upstream, named) {
        return Err(setup(format!(
            "it relays PostgreSQL to {}, but database_url names {named}: the counts and lock waits would be read on another server",
            pg.upstream
        )));
    }
    if let (Some(r), Some(url)) = (info.store(StoreKind::Redis), &scenario.target.redis_url) {
        let named = upstream_of(url).map_err(|e| setup(format!("redis_url: {e}")))?;
        if !same(r.upstream, named) {
            return Err(setup(format!(
                "it relays Redis to {}, but redis_url names {named}",
                r.upstream
            )));
        }
    }
    if info.stores.iter().all(|s| s.opened == 0) {
        return Err(setup(format!(
            "no session of the service is behind the interposer: nothing ever connected to {}; point the service's database URL at it (as `ticketflow interpose` printed) and let it connect once (a request, or its pool opened at start-up)",
            pg.listen
        )));
    }
    let client = std::sync::Arc::new(client);
    let hubs = client.hubs();
    // The sessions open now: their backends must be in the database the counts read.
    let pids: Vec<i32> = hubs
        .iter()
        .filter(|h| h.store() == StoreKind::Postgres)
        .flat_map(|h| crate::interpose::conduct::HubControl::view(h).1)
        .filter_map(|v| v.backend_pid)
        .collect();
    if !pids.is_empty() {
        let rows = m
            .query(
                "SELECT DISTINCT datname::text FROM pg_stat_activity WHERE pid = ANY($1)",
                &[&pids],
            )
            .map_err(|e| pg::classify("read pg_stat_activity", e))
            .map_err(db("check the interposer's sessions"))?;
        let names: Vec<String> = rows
            .iter()
            .filter_map(|r| r.get::<_, Option<String>>(0))
            .collect();
        if names.is_empty() {
            return Err(setup(format!(
                "none of its sessions' backends ({pids:?}) is on the server database_url names: it relays to another PostgreSQL"
            )));
        }
        if let Some(other) = names.iter().find(|n| **n != d.name) {
            return Err(setup(format!(
                "the service's sessions use database {other:?}, but database_url names {:?}: the counts would read another database",
                d.name
            )));
        }
    }
    if let Some(lost) = client.lost() {
        return Err(setup(lost));
    }
    Ok(hubs)
}

/// How long a runner waits for a running interposer's control address to accept.
pub(super) const CONTROL_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Readies the target database: our migrations when the scenario runs our own service, and
/// the scenario's `setup_sql` in a scratch database.
pub(super) fn prepare_database(
    scenario: &TargetScenario,
    database: Option<&TargetDb>,
    monitor: Option<&mut postgres::Client>,
) -> Result<(), TargetError> {
    let t = &scenario.target;
    if let (true, Some(d)) = (t.own_service, database) {
        // Our migrations, as `ticketflow serve` would apply them.
        PgStore::connect(&d.config, IsolationLevel::ReadCommitted)
            .map_err(db("migrate the target database"))?;
    }
    if let (Some(d), Some(m)) = (database, monitor) {
        if d.is_scratch() && !t.setup_sql.is_empty() {
            run_setup_sql(m, &t.setup_sql)?;
        }
    }
    Ok(())
}

/// Runs `setup_sql` on the scratch database's session `m` in one transaction (`BEGIN`, each
/// entry, `COMMIT`), so PostgreSQL itself refuses what acts on the cluster rather than on
/// this database: `CREATE`/`DROP DATABASE`, `ALTER SYSTEM`, `VACUUM`, `CREATE TABLESPACE`,
/// `CREATE INDEX CONCURRENTLY` cannot run inside a transaction block (SQLSTATE 25001). After
/// each entry the transaction must still be open (a `SAVEPOINT` succeeds): an entry that ends
/// it (`COMMIT`, `ROLLBACK`, `END`) is refused before the next one runs. On any refusal the
/// transaction is rolled back.
///
/// What stays possible is what a transaction on this database may do with the URL's role:
/// roles (`CREATE`/`ALTER`/`DROP ROLE`) and `ALTER DATABASE … SET` are cluster-wide and
/// transactional.
///
/// Will return `Err` ([`TargetError::Setup`]) naming the entry (1-based), the server's message
/// and SQLSTATE; ([`TargetError::Database`]) when the session itself fails.
pub(super) fn run_setup_sql(
    m: &mut postgres::Client,
    setup_sql: &[String],
) -> Result<(), TargetError> {
    let fail = |m: &mut postgres::Client, n: usize, sql: &str, e: postgres::Error| {
        let _ = m.batch_execute("ROLLBACK");
        let Some(d) = e.as_db_error() else {
            return TargetError::Database {
                what: "run the scenario's setup_sql",
                source: pg::classify("run setup_sql", e),
            };
        };
        let why = if *d.code() == postgres::error::SqlState::ACTIVE_SQL_TRANSACTION {
            " — setup_sql runs inside one transaction on the scratch database: statements that act on the cluster (CREATE or DROP DATABASE, ALTER SYSTEM, VACUUM, CREATE TABLESPACE) are refused"
        } else {
            ""
        };
        TargetError::Setup(format!(
            "setup_sql entry {n} ({}) refused: {} (SQLSTATE {}){why}; nothing of setup_sql was kept",
            excerpt(sql, 60),
            d.message(),
            d.code().code()
        ))
    };
    m.batch_execute("BEGIN")
        .map_err(|e| pg::classify("run setup_sql", e))
        .map_err(db("run the scenario's setup_sql"))?;
    for (i, sql) in setup_sql.iter().enumerate() {
        let n = i + 1;
        if let Err(e) = m.batch_execute(sql) {
            return Err(fail(m, n, sql, e));
        }
        if let Err(e) = m.batch_execute("SAVEPOINT ticketflow_setup_sql") {
            let _ = m.batch_execute("ROLLBACK");
            return Err(
                if e.code() == Some(&postgres::error::SqlState::NO_ACTIVE_SQL_TRANSACTION) {
                    TargetError::Setup(format!(
                        "setup_sql entry {n} ({}) ended the runner's transaction (COMMIT, ROLLBACK or END): refused before the next entry; setup_sql runs inside one transaction on the scratch database (what ran before it may have been kept there)",
                        excerpt(sql, 60)
                    ))
                } else {
                    fail(m, n, sql, e)
                },
            );
        }
    }
    m.batch_execute("COMMIT")
        .map_err(|e| pg::classify("run setup_sql", e))
        .map_err(db("run the scenario's setup_sql"))
}

/// Starts the scenario's services and checks that every endpoint (theirs, then the listed
/// base URLs) accepts connections. Returns the services (stopped on drop) and the endpoints
/// as `(name, base URL)`.
pub(super) fn start_endpoints(
    scenario: &TargetScenario,
    opts: &RunOptions,
    database: Option<&TargetDb>,
    interposers: &[crate::interpose::Interposer],
) -> Result<(Services, Vec<(String, String)>), TargetError> {
    use crate::interpose::{url_through, StoreKind};
    let t = &scenario.target;
    let exe: PathBuf = match &opts.exe {
        Some(p) => p.clone(),
        None => std::env::current_exe().map_err(|e| TargetError::Service {
            name: "-".into(),
            reason: format!("cannot locate the ticketflow binary: {e}"),
        })?,
    };
    // With interposers the services reach their stores through them.
    let through = |store: StoreKind, url: &str| -> String {
        interposers
            .iter()
            .find(|i| i.store() == store)
            .and_then(|i| url_through(url, i.addr()))
            .unwrap_or_else(|| url.to_string())
    };
    let database_url = database
        .map(|d| through(StoreKind::Postgres, &d.url))
        .unwrap_or_default();
    let redis_url = t
        .redis_url
        .as_deref()
        .map(|u| through(StoreKind::Redis, u))
        .unwrap_or_default();
    let specs: Vec<crate::blackbox::format::ServiceSpec> = t
        .services
        .iter()
        .map(|s| {
            let mut s = s.clone();
            for a in s.command.iter_mut().chain(s.env.values_mut()) {
                *a = a.replace("{redis_url}", &redis_url);
            }
            s
        })
        .collect();
    let logs = opts
        .service_logs
        .as_ref()
        .map(|d| d.join(crate::blackbox::service::safe_file_name(&scenario.name)));
    let services = Services::start(
        &specs,
        &exe.to_string_lossy(),
        &database_url,
        logs.as_deref(),
    )?;
    let endpoints: Vec<(String, String)> = services
        .records
        .iter()
        .map(|s| (s.name.clone(), s.base_url.clone()))
        .chain(t.base_urls.iter().map(|u| (u.clone(), u.clone())))
        .collect();
    for (_, url) in &endpoints {
        check_reachable(url)?;
    }
    Ok((services, endpoints))
}

/// The target's PostgreSQL `server_version` and `default_transaction_isolation`.
pub(super) fn server_facts(m: &mut postgres::Client) -> Result<(String, String), TargetError> {
    let version: String = m
        .query_one("SHOW server_version", &[])
        .map_err(|e| pg::classify("read server version", e))
        .map_err(db("read server version"))?
        .get(0);
    let iso: String = m
        .query_one("SHOW default_transaction_isolation", &[])
        .map_err(|e| pg::classify("read isolation level", e))
        .map_err(db("read isolation level"))?
        .get(0);
    Ok((version, iso))
}

/// The lock a server-side barrier holds (`None` for the HTTP-level barrier). A table lock
/// needs its table to exist in the target database: a setup error otherwise.
pub(super) fn server_lock(
    scenario: &TargetScenario,
    database: Option<&TargetDb>,
    monitor: Option<&mut postgres::Client>,
) -> Result<Option<ServerLock>, TargetError> {
    Ok(match &scenario.barrier.kind {
        BarrierKind::TableLock {
            table,
            access_exclusive,
        } => {
            let m = monitor.expect("a server-side barrier has a database");
            let exists: bool = m
                .query_one("SELECT to_regclass($1) IS NOT NULL", &[table])
                .map_err(|e| pg::classify("find barrier table", e))
                .map_err(db("find barrier table"))?
                .get(0);
            if !exists {
                return Err(TargetError::Setup(format!(
                    "barrier table {table:?} does not exist in database {} (the service creates it on start? run it once first)",
                    database.map(|d| d.name.as_str()).unwrap_or("?")
                )));
            }
            Some(ServerLock::Table {
                table: table.clone(),
                access_exclusive: *access_exclusive,
            })
        }
        BarrierKind::Advisory { key } => Some(ServerLock::Advisory { key: *key }),
        BarrierKind::Http | BarrierKind::Interposer | BarrierKind::RedisPause => None,
    })
}

/// Refuses to race an endpoint that does not accept a TCP connection within 2 s.
pub(super) fn check_reachable(base_url: &str) -> Result<(), TargetError> {
    let authority = base_url
        .strip_prefix("http://")
        .unwrap_or(base_url)
        .split('/')
        .next()
        .unwrap_or("");
    let with_port = if authority
        .rsplit_once(':')
        .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
    {
        authority.to_string()
    } else {
        format!("{authority}:80")
    };
    use std::net::ToSocketAddrs as _;
    let addrs: Vec<_> = with_port
        .to_socket_addrs()
        .map_err(|e| TargetError::Setup(format!("{}: cannot resolve: {e}", redact(base_url))))?
        .collect();
    let mut last = None;
    for a in &addrs {
        match std::net::TcpStream::connect_timeout(a, Duration::from_secs(2)) {
            Ok(_) => return Ok(()),
            Err(e) => last = Some(e),
        }
    }
    Err(TargetError::Setup(format!(
        "{} is unreachable: {}; is the service running?",
        redact(base_url),
        last.map(|e| e.to_string())
            .unwrap_or_else(|| "no address".into())
    )))
}
