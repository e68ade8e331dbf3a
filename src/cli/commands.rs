//! One function per subcommand: the parsed arguments become the library's options, the
//! library runs, and the result becomes the summary printed and the exit code. No SQL or
//! protocol logic lives here.

use std::io::Read;
use std::path::Path;
use std::time::Duration;

use super::args::{
    BenchArgs, CleanArgs, CreateArgs, DatabaseArg, GetArgs, InitArgs, InterposeArgs, LeaseArgs,
    PruneArgs, RunArgs, ServeArgs, SoakArgs, UpdateArgs, VerifyArgs, WorkerArgs,
};
use super::print;
use ticketflow::exit::{byte, Exit, EXIT_PENDING};
use ticketflow::verify::{self, BackendChoice};
use ticketflow_core::domain::JsonBodyError;
use ticketflow_core::lease;
use ticketflow_core::store::url::{DatabaseUrl, PgServer, PgUrl, UrlOrigin};
use ticketflow_core::store::Backend;
use ticketflow_core::variants::Implementation;
use ticketflow_core::{
    Error, Fingerprint, Outcome, Protocol, RetryPolicy, TicketPatch, TicketRequest,
};
use ticketflow_harness::cleanup;
use ticketflow_harness::scenario::worker::{self, WorkerConfig};
use ticketflow_serve::{Tokens, TOKENS_ENV};

/// A command that failed: its exit code and the message printed as `ticketflow: MESSAGE`.
pub struct Failure {
    pub code: u8,
    pub message: String,
}

/// The exit code of a command that ran, or why it failed.
pub type CliResult = Result<u8, Failure>;

/// A failure with exit code `code` and `message`.
pub fn failure(code: u8, message: impl std::fmt::Display) -> Failure {
    Failure {
        code,
        message: message.to_string(),
    }
}

/// A usage error (exit 2) with `message`.
pub fn usage(message: impl std::fmt::Display) -> Failure {
    failure(Exit::Usage.byte(), message)
}

/// `ticketflow clean`: sweeps the scratch ledger ([`ticketflow_harness::scratch::ledger::sweep`]) and
/// prints one line per database dropped (or, `--dry-run`, to be dropped) on stdout.
pub fn clean(args: CleanArgs) -> CliResult {
    let pg = pg_url(args.pg_url.as_deref())?;
    let mut admin = ticketflow_core::store::postgres::connect(pg.server.config()).map_err(|e| {
        failure(
            Exit::Fail.byte(),
            format!("PostgreSQL at {}: {e}", pg.server.redacted()),
        )
    })?;
    let verb = if args.dry_run {
        "would drop"
    } else {
        "dropped"
    };
    let sweep = ticketflow_harness::scratch::ledger::sweep(&mut admin, args.dry_run, |orphan| {
        outln!("{verb} {orphan}")
    })
    .map_err(|e| failure(Exit::Fail.byte(), format!("clean: {e}")))?;
    if sweep.busy {
        outln!("another clean is sweeping the ledger; nothing done");
        return Ok(Exit::Pass.byte());
    }
    for (database, why) in &sweep.unjudged {
        outln!("kept {database}: {why}");
    }
    outln!(
        "{} {} scratch database(s); {} of running processes kept; {} stale ledger row(s){}",
        verb,
        sweep.dropped.len(),
        sweep.live,
        sweep.stale_rows,
        if args.dry_run { "" } else { " removed" }
    );
    Ok(Exit::Pass.byte())
}

/// At the start of a run: drops the scratch databases of killed runs in the ledger of the
/// server `pg` and says so on stderr, one line each as it is dropped. Best effort and
/// bounded: a server that does not take the connection within [`SWEEP_CONNECT_WAIT`] is left
/// to the run itself to report; a sweep still dropping after [`SWEEP_WAIT`] more goes on beside
/// the run, and a line says so.
pub(super) fn sweep_orphans(pg: &PgServer) {
    let config = pg.config().clone();
    let (tell, told) = std::sync::mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("ledger-sweep".into())
        .spawn(move || {
            let Ok(mut admin) = ticketflow_core::store::postgres::connect(&config) else {
                return;
            };
            let _ = tell.send(false);
            let result = ticketflow_harness::scratch::ledger::sweep(&mut admin, false, |orphan| {
                errln!("ticketflow: dropped orphaned scratch database {orphan}")
            });
            if let Err(e) = result {
                tracing::warn!(error = %e, "the sweep of the scratch ledger stopped");
            }
            let _ = tell.send(true);
        });
    if spawned.is_err() || told.recv_timeout(SWEEP_CONNECT_WAIT) != Ok(false) {
        return;
    }
    if told.recv_timeout(SWEEP_WAIT).is_err() {
        errln!(
            "ticketflow: still dropping orphaned scratch databases after {} s; the run starts \
             beside it",
            SWEEP_WAIT.as_secs()
        );
    }
}

/// How long a run waits for [`sweep_orphans`]'s connection before it starts anyway.
const SWEEP_CONNECT_WAIT: Duration = Duration::from_secs(2);

/// How long a run waits for [`sweep_orphans`]'s drops, once connected.
const SWEEP_WAIT: Duration = Duration::from_secs(10);

/// A library error as an exit code: invalid input 2, not found 5, anything else 1.
fn error_exit(e: Error) -> Failure {
    let code = match &e {
        Error::Validation(_) | Error::BadUrl(_) | Error::IsolationNotApplicable => {
            Exit::Usage.byte()
        }
        Error::NotFound { .. } => Exit::NotFound.byte(),
        _ => Exit::Fail.byte(),
    };
    failure(code, e)
}

/// The create request, JSON from `file` or stdin.
fn read_request(file: Option<&Path>) -> Result<TicketRequest, Failure> {
    let bytes = match file {
        Some(path) => std::fs::read(path)
            .map_err(|e| usage(format!("cannot read {}: {e}", path.display())))?,
        None => {
            let mut bytes = Vec::new();
            std::io::stdin()
                .read_to_end(&mut bytes)
                .map_err(|e| usage(format!("cannot read stdin: {e}")))?;
            bytes
        }
    };
    let shape = TicketRequest::JSON_SHAPE;
    TicketRequest::from_json(&bytes).map_err(|e| {
        usage(match e {
            JsonBodyError::NotUtf8 { .. } => format!("request is {e}"),
            JsonBodyError::NotObject { kind } => {
                format!("request must be {shape}, not a JSON {kind}")
            }
            JsonBodyError::Syntax(e)
            | JsonBodyError::Shape(e)
            | JsonBodyError::DuplicateMember(e) => format!("request must be {shape}: {e}"),
        })
    })
}

/// The ticket database's default: a SQLite file in the working directory.
const DEFAULT_DATABASE: &str = "ticketflow.db";

/// `DATABASE_URL` as set in the environment (`None` when unset); not UTF-8 is a usage error.
fn database_url_env() -> Result<Option<String>, Failure> {
    match std::env::var("DATABASE_URL") {
        Ok(url) => Ok(Some(url)),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => Err(usage("DATABASE_URL is not valid UTF-8")),
    }
}

/// The ticket database of create, get, update, prune and serve: `--database-url`, else
/// `DATABASE_URL`, else [`DEFAULT_DATABASE`]. A given URL that is not a SQLite file or a
/// PostgreSQL URL that parses is a usage error naming the option or the variable.
pub fn database_url(arg: &DatabaseArg) -> Result<DatabaseUrl, Failure> {
    let (url, origin) = match (&arg.database_url, database_url_env()?) {
        (Some(url), _) => (url.clone(), UrlOrigin::Flag("--database-url")),
        (None, Some(url)) => (url, UrlOrigin::Env("DATABASE_URL")),
        (None, None) => return Ok(DatabaseUrl::Sqlite(DEFAULT_DATABASE.into())),
    };
    ticketflow_core::store::url::check_database(&url, origin).map_err(usage)
}

/// The PostgreSQL server: `--pg-url`, else `DATABASE_URL` when it is a PostgreSQL URL, else
/// the built-in default. A given URL that cannot be parsed is a usage error naming the option
/// or the variable; [`PgUrl::is_explicit`] tells the callers that such a server must answer.
pub(super) fn pg_url(flag: Option<&str>) -> Result<PgUrl, Failure> {
    ticketflow_core::store::url::resolve_pg(flag, "--pg-url", database_url_env()?.as_deref())
        .map_err(usage)
}

/// Says why a `verify` or `scenario run` exits 3 when no `--require-postgres` or
/// `--require-redis` (`asked`) asked for it: the PostgreSQL URL was given, so its server is
/// required.
fn explain_required(code: i32, pg: &PgUrl, asked: bool) {
    if code == EXIT_PENDING && pg.is_explicit() && !asked {
        errln!(
            "ticketflow: exit 3: a run is PENDING and PostgreSQL is required, its URL being \
             given by {} (only the built-in default URL may leave runs PENDING)",
            pg.origin
        );
    }
}

/// `ticketflow fingerprint`: the canonical text and hash of the request on stdin.
pub fn fingerprint() -> CliResult {
    let fp = Fingerprint::of(&read_request(None)?);
    print::json(&serde_json::json!({"canonical": fp.canonical, "sha256": fp.hash}));
    Ok(Exit::Pass.byte())
}

/// `ticketflow create`: one idempotent create on `db` (behind the lease when given); exit 4 on a
/// conflict.
pub fn create(db: &DatabaseUrl, args: CreateArgs) -> CliResult {
    // The lease options are checked before the request is read or the database opened.
    let lease = lease_config(&args.lease)?;
    let request = read_request(args.file.as_deref())?;
    let mut store =
        ticketflow_core::store::open_with(db, args.isolation.isolation).map_err(error_exit)?;
    let implementation = args.variant.map_or(
        Implementation::Protocol(args.protocol),
        Implementation::Variant,
    );
    let retry = RetryPolicy::default();
    let (tenant, key) = (args.tenant.as_str(), args.key.as_str());
    let (result, lease_outcome) = match &lease {
        None => (
            implementation.create(store.as_mut(), tenant, key, &request, &retry),
            None,
        ),
        Some(config) => {
            let mut conn = lease::connect_or_none(config);
            let (result, outcome) = lease::create_with_lease(
                conn.as_mut().map(|c| c as &mut dyn lease::Leases),
                config,
                implementation.release(),
                store.as_mut(),
                tenant,
                key,
                |s| implementation.create(s, tenant, key, &request, &retry),
            );
            (result, Some(outcome))
        }
    };
    let report = result.map_err(error_exit)?;
    match lease_outcome {
        None => print::json(&report),
        Some(outcome) => {
            let mut value = serde_json::to_value(&report).expect("reports serialize");
            value["lease"] = serde_json::to_value(&outcome).expect("lease outcomes serialize");
            print::json(&value);
        }
    }
    Ok(match report.outcome {
        Outcome::Conflict { .. } => Exit::Conflict.byte(),
        _ => Exit::Pass.byte(),
    })
}

/// `ticketflow get`: one ticket of a tenant; exit 5 when there is none.
pub fn get(db: &DatabaseUrl, args: GetArgs) -> CliResult {
    let mut store = ticketflow_core::store::open(db).map_err(error_exit)?;
    let ticket =
        ticketflow_core::get_ticket(store.as_mut(), &args.tenant, args.id).map_err(error_exit)?;
    print::json(&ticket);
    Ok(Exit::Pass.byte())
}

/// `ticketflow update`: changes a ticket and writes its `ticket.updated` event; exit 5 when
/// there is none.
pub fn update(db: &DatabaseUrl, args: UpdateArgs) -> CliResult {
    let patch = TicketPatch {
        title: args.title,
        body: args.body,
        priority: args.priority,
    };
    let mut store = ticketflow_core::store::open(db).map_err(error_exit)?;
    let ticket = ticketflow_core::update_ticket(store.as_mut(), &args.tenant, args.id, &patch)
        .map_err(error_exit)?;
    print::json(&ticket);
    Ok(Exit::Pass.byte())
}

/// `ticketflow prune`: deletes receipts older than the given age; prints how many.
pub fn prune(db: &DatabaseUrl, args: PruneArgs) -> CliResult {
    let pruned = ticketflow_core::store::prune_receipts(db, args.older_than).map_err(error_exit)?;
    print::json(&serde_json::json!({
        "pruned_receipts": pruned,
        "older_than": humantime::format_duration(args.older_than).to_string(),
    }));
    Ok(Exit::Pass.byte())
}

/// `ticketflow verify`: the main job; exit 0 PASS, 1 FAIL, 3 PENDING where required.
pub fn verify(args: VerifyArgs) -> CliResult {
    use std::io::IsTerminal as _;
    let started = std::time::Instant::now();
    let pg = pg_url(args.pg_url.as_deref())?;
    sweep_orphans(&pg.server);
    let mut opts = verify::VerifyOptions {
        repeat: args.repeat as usize,
        jobs: args
            .jobs
            .map_or_else(ticketflow_harness::jobs::default_jobs, |n| n as usize),
        filters: args.filter,
        progress: std::io::stderr().is_terminal() && std::env::var_os("CI").is_none(),
        restart_postgres: args.restart_postgres,
        seed: args.seed,
        kill_matrix: !args.no_kill_matrix,
        retry: args.retry.policy(),
        scenarios: args.scenarios,
        pg: pg.server.clone(),
        selection: args.matrix.selection(),
        // Chosen below, once the options that narrow the run are known.
        report: std::path::PathBuf::new(),
        // A given URL must answer: explicit means required.
        require_postgres: args.require_postgres || pg.is_explicit(),
        protocol: args.protocol,
        lease: lease_scenarios(&args.lease)?,
        require_redis: args.lease.require_redis,
        // The tracked evidence is the tool's own, committed: --update-report replaces it.
        force: args.force || args.update_report,
    };
    // The tracked evidence is made from the shipped scenarios/ (a run over another directory
    // is full for its own report, not for this repository's).
    if args.update_report && !verify::is_shipped_scenarios(&opts.scenarios) {
        return Err(usage(verify::VerifyError::UpdateReport(
            "the tracked evidence is made from the shipped scenarios/; drop --scenarios",
        )));
    }
    opts.report = verify::report_location(
        args.report.as_deref(),
        args.update_report,
        &verify::narrowed_by(&opts),
    )
    .map_err(usage)?;
    let outcome = verify::verify_reporting(&opts, &print::finished).map_err(|e| match e {
        // The runs happened; only the report could not be written.
        verify::VerifyError::WriteRefused(_) => failure(Exit::Fail.byte(), e),
        other => usage(other),
    })?;
    print::verify_tail(&outcome, args.no_kill_matrix);
    let (md, json, junit) = verify::output_paths(&opts.report);
    let dir = md.parent().unwrap_or(Path::new(""));
    outln!(
        "report written to {}, {}, {}, {}, {}",
        md.display(),
        dir.join(ticketflow_report::markdown::DETAILS_DIR).display(),
        json.display(),
        json.with_file_name("report.steps.json").display(),
        junit.display()
    );
    explain_required(
        outcome.exit_code,
        &pg,
        args.require_postgres || args.lease.require_redis,
    );
    print::verify_totals(&outcome, &md, started.elapsed());
    Ok(byte(outcome.exit_code))
}

/// `ticketflow scenario run`: the given scenario files, without verify's suites.
pub fn scenario_run(args: RunArgs) -> CliResult {
    let pg = pg_url(args.pg_url.as_deref())?;
    // A report that could never be written, or would replace a file that is not ours or
    // write through a symlink, is refused before anything runs.
    let mut outputs = match &args.report {
        Some(report) => {
            verify::check_files_report_path(report).map_err(usage)?;
            Some(verify::ReportOutputs::open(report, args.force).map_err(usage)?)
        }
        None => None,
    };
    sweep_orphans(&pg.server);
    let opts = verify::RunFilesOptions {
        files: args.files,
        pg: pg.server.clone(),
        // A given URL must answer: explicit means required.
        require_postgres: args.require_postgres || pg.is_explicit(),
        selection: args.matrix.selection(),
        retry: args.retry.policy(),
        implementation: args.implementation,
        export_isolation_spec: args.export_isolation_spec,
        repeat: args.repeat as usize,
        barrier_timeout: args.barrier_timeout_ms.map(Duration::from_millis),
        lease: lease_scenarios(&args.lease)?,
        require_redis: args.lease.require_redis,
        on_wait: Some(|line| errln!("… {}", ticketflow_harness::contain::terminal(line))),
        explore: args.explore,
        schedule: args.schedule,
        keep_going: args.keep_going,
        parallel: args.parallel.map_or_else(
            || std::thread::available_parallelism().map_or(1, |n| n.get()),
            |n| n as usize,
        ),
        force: args.force,
        service_logs: args.report.as_deref().map(super::service_logs_beside),
    };
    let spec_written = |p: &Path| errln!("isolation spec written to {}", p.display());
    let mut outcome = verify::run_files(&opts).map_err(|e| match e {
        verify::RunFilesError::Export { ref written, .. } => {
            written.iter().for_each(|p| spec_written(p));
            failure(Exit::Fail.byte(), e)
        }
        other => usage(other),
    })?;
    outcome.specs.iter().for_each(|p| spec_written(p));
    // Failing schedules' specs go beside the report when no export directory was given.
    if let (None, Some(outputs)) = (&opts.export_isolation_spec, outputs.as_mut()) {
        verify::export_schedules(&mut outcome.targets, &mut outputs.specs)
            .iter()
            .for_each(|p| spec_written(p));
    }
    print::run_files(&outcome.runs, &outcome.targets, args.json);
    if let (Some(report), Some(outputs)) = (&args.report, outputs) {
        // Written whatever the verdict; only a failure to write changes the exit code.
        let written = verify::write_files_report(report, outputs, &opts, &outcome)
            .map_err(|e| failure(Exit::Fail.byte(), e))?;
        errln!(
            "report written to {}",
            written
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    explain_required(
        outcome.exit_code,
        &pg,
        args.require_postgres || args.lease.require_redis,
    );
    Ok(byte(outcome.exit_code))
}

/// `ticketflow target init`: writes the starter set of black-box scenarios.
pub fn target_init(args: InitArgs) -> CliResult {
    use ticketflow_harness::blackbox::init::{InitError, InitOptions};
    // Read as every request body is: a member named twice is refused, not "the last wins".
    let json = |what: &str, text: &str| {
        ticketflow_core::domain::json_value(text.as_bytes()).map_err(|e| match e {
            JsonBodyError::DuplicateMember(e) => usage(format!("{what}: {e}")),
            e => usage(format!("{what} is not JSON: {e}")),
        })
    };
    let counts = args
        .counts
        .iter()
        .map(|c| {
            c.split_once('=')
                .map(|(n, q)| (n.trim().to_string(), q.trim().to_string()))
                .ok_or_else(|| usage(format!("--count {c:?}: expected NAME=SQL")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    if args.target_database_url.is_none() && !counts.is_empty() {
        return Err(usage(
            "--count needs --target-database-url (the queries run there)",
        ));
    }
    let opts = InitOptions {
        urls: args.urls,
        database_url: args.target_database_url,
        table: args.table,
        method: args.method,
        path: args.path,
        body: json("--body", &args.body)?,
        invalid_body: json("--invalid-body", &args.invalid_body)?,
        scope_header: args.scope_header,
        interposer: args.interposer,
        key_header: args.key_header,
        preset: args.preset,
        counts,
        clients: args.clients,
        replays_marked: !args.unmarked_replays,
    };
    let written = opts.write(&args.out, args.force).map_err(|e| match e {
        InitError::Write { .. } => failure(Exit::Fail.byte(), e),
        other => usage(other),
    })?;
    for p in &written {
        outln!("wrote {}", p.display());
    }
    for warning in [opts.unobserved(), opts.literal_password()]
        .into_iter()
        .flatten()
    {
        errln!("ticketflow: warning: {warning}");
    }
    if let (Some(control), Some(db)) = (&opts.interposer, &opts.database_url) {
        outln!(
            "first: ticketflow interpose --postgres {} --control {control}   (then restart your service on the database URL it prints, so its commands pass the interposer, and export TICKETFLOW_INTERPOSE_TOKEN_FILE as the control token file it prints)",
            ticketflow_core::store::url::redact(db)
        );
    }
    outln!(
        "next: ticketflow scenario run {}/[1-5]-*.toml   (adapt the bodies, rules and counts first; every file says how)",
        args.out.display()
    );
    outln!(
        "then: ticketflow check {}   (generated histories judged against the idempotency model; docs/check.md)",
        args.out.join(ticketflow_harness::blackbox::init::CHECK_FILE).display()
    );
    Ok(Exit::Pass.byte())
}

/// `ticketflow serve`: the protocol over HTTP on `db` until Ctrl-C or SIGTERM.
pub fn serve(db: &DatabaseUrl, args: ServeArgs) -> CliResult {
    let config = ticketflow_serve::ServeConfig {
        listen: args.listen,
        database_url: db.clone(),
        implementation: args.variant.map_or(
            Implementation::Protocol(args.protocol),
            Implementation::Variant,
        ),
        pool_size: args.pool_size,
        min_idle: args.min_idle,
        pool_timeout: Duration::from_millis(args.pool_timeout_ms),
        shutdown_grace: Duration::from_millis(args.shutdown_grace_ms),
        limits: ticketflow_serve::Limits {
            max_connections: args.max_connections.unwrap_or_else(|| {
                ticketflow_serve::Limits::default_max_connections(args.pool_size)
            }),
            header_read_timeout: Duration::from_millis(args.header_read_timeout_ms),
            idle_timeout: Duration::from_millis(args.idle_timeout_ms),
            request_timeout: Duration::from_millis(args.request_timeout_ms),
        },
        auth: serve_tokens(args.auth_tokens.as_deref())?,
        isolation: args.isolation.isolation,
        lease: lease_config(&args.lease)?,
    };
    let shutdown = cleanup::graceful_shutdown();
    let listening = |addr| {
        use std::io::Write as _;
        let mut out = std::io::stdout();
        let _ = writeln!(out, "listening on http://{addr}");
        let _ = out.flush();
    };
    ticketflow_serve::serve_blocking(&config, listening, async move { shutdown.notified().await })
        .map_err(|e| {
            let code = match &e {
                ticketflow_serve::ServeError::Database { source, .. }
                    if matches!(**source, Error::BadUrl(_) | Error::IsolationNotApplicable) =>
                {
                    Exit::Usage.byte()
                }
                ticketflow_serve::ServeError::Limits(_)
                | ticketflow_serve::ServeError::Usage(_) => Exit::Usage.byte(),
                _ => Exit::Fail.byte(),
            };
            failure(code, e)
        })?;
    Ok(Exit::Pass.byte())
}

/// `ticketflow interpose`: prints the service's URLs and the control address, serves until the
/// first Ctrl-C or SIGTERM (a second exits at once). Exit 2 for a non-loopback address or a
/// bad URL, 1 when an address cannot be bound.
pub fn interpose(args: InterposeArgs) -> CliResult {
    use ticketflow_harness::interpose::standalone::{serve_blocking, StandaloneConfig};
    // Before the URL parser, which knows no verify-ca: the reason is the relay, not the URL.
    if let Some(reason) = ticketflow_harness::interpose::standalone::wants_tls(&args.postgres) {
        return Err(usage(format!(
            "--postgres {}: {reason}",
            ticketflow_core::store::url::redact(&args.postgres)
        )));
    }
    let server =
        ticketflow_core::store::url::check_postgres(&args.postgres, UrlOrigin::Flag("--postgres"))
            .map_err(usage)?;
    if server.config().get_password().is_some()
        && std::env::var_os("TICKETFLOW_INTERPOSE_POSTGRES").is_none()
    {
        errln!(
            "ticketflow: warning: --postgres carries a password, readable by other local users on the command line; the interposer does not need it (give the URL without it, or in TICKETFLOW_INTERPOSE_POSTGRES)"
        );
    }
    let config = StandaloneConfig {
        redis: args.redis,
        listen_postgres: args.listen_postgres,
        listen_redis: args.listen_redis,
        control: args.control,
        token_file: Some(
            args.control_token_file
                .unwrap_or_else(ticketflow_harness::interpose::token::default_token_path),
        ),
        allow_remote_upstream: args.allow_remote_upstream,
        limits: ticketflow_harness::interpose::Limits {
            busy_poll: std::time::Duration::from_micros(args.busy_poll_us),
            ..Default::default()
        },
        ..StandaloneConfig::new(args.postgres)
    };
    if config.allow_remote_upstream {
        errln!(
            "ticketflow: warning: --allow-remote-upstream: the relay to the upstream is plain text (statements, parameters and the password exchange cross the network unencrypted)"
        );
    }
    let shutdown = cleanup::graceful_shutdown();
    let ready = |s: &ticketflow_harness::interpose::standalone::Standalone| {
        use std::io::Write as _;
        let mut out = std::io::stdout();
        for line in s.lines() {
            let _ = writeln!(out, "{line}");
        }
        let _ = out.flush();
    };
    serve_blocking(&config, ready, async move { shutdown.notified().await }).map_err(|e| {
        failure(
            if e.is_usage() {
                Exit::Usage.byte()
            } else {
                Exit::Fail.byte()
            },
            e,
        )
    })?;
    Ok(Exit::Pass.byte())
}

/// `--lease URL --lease-ttl-ms MS` checked ([`lease::LeaseConfig::validate`]): a malformed
/// URL, a TTL of 0 or above an hour, or a database out of the server's range is a usage error.
fn lease_config(args: &LeaseArgs) -> Result<Option<lease::LeaseConfig>, Failure> {
    lease_url_ttl(args.lease.as_deref(), args.lease_ttl_ms)
}

/// A lease URL and TTL checked as [`lease_config`] does, for commands whose `--lease` reads
/// differently (`bench`).
/// The Redis `bench --interposer` measures its Redis rows against without `--lease`.
const DEFAULT_BENCH_REDIS: &str = "redis://127.0.0.1:6379";

fn lease_url_ttl(url: Option<&str>, ttl_ms: u64) -> Result<Option<lease::LeaseConfig>, Failure> {
    url.map(|u| lease::LeaseConfig::validate(u, ttl_ms))
        .transpose()
        .map_err(usage)
}

/// The lease scenarios' Redis: `--lease` or the default URL, with `--lease-ttl-ms`
/// ([`ticketflow_harness::scenario::lease::LeaseRunOptions::with_lease`]); a bad one is a usage error.
fn lease_scenarios(
    args: &super::args::LeaseScenarioArgs,
) -> Result<ticketflow_harness::scenario::lease::LeaseRunOptions, Failure> {
    ticketflow_harness::scenario::lease::LeaseRunOptions::with_lease(
        args.lease.as_deref(),
        args.lease_ttl_ms,
    )
    .map_err(usage)
}

/// The token table of `serve --auth-tokens FILE` or `TICKETFLOW_AUTH_TOKENS`; both at once,
/// or a bad table, is a usage error.
fn serve_tokens(file: Option<&Path>) -> Result<Option<Tokens>, Failure> {
    // Set but empty is an error ("no tokens"), never the open mode: a secret that came
    // through empty must not leave the service unauthenticated.
    let env = std::env::var(TOKENS_ENV).ok();
    let usage = |e: String| failure(Exit::Usage.byte(), e);
    match (file, env) {
        (Some(_), Some(_)) => Err(usage(format!(
            "give the tokens in --auth-tokens or in {TOKENS_ENV}, not both"
        ))),
        (Some(path), None) => Tokens::from_file(path)
            .map(Some)
            .map_err(|e| usage(e.to_string())),
        (None, Some(text)) => Tokens::parse(&text, TOKENS_ENV)
            .map(Some)
            .map_err(|e| usage(e.to_string())),
        (None, None) => Ok(None),
    }
}

/// `ticketflow bench`: the protocols' cost against bare SQL, as Markdown tables.
// Long on purpose: it only copies the flags into the bench's options and prints the three
// tables (protocols, interposer, lease) in order, each with its optional JSON file.
pub fn bench(args: BenchArgs) -> CliResult {
    let lease = lease_url_ttl(args.lease.as_deref(), args.lease_ttl_ms)?;
    if let Some(config) = &lease {
        // Before anything is measured: a run that cannot have its lease rows says so now.
        ticketflow_harness::bench::lease::probe(config)
            .map_err(|e| failure(Exit::Fail.byte(), e))?;
    }
    let backends = args.backend.backends();
    let pg = pg_url(args.pg_url.as_deref())?;
    let server = ticketflow_harness::bench::postgres_for(
        &pg,
        backends.contains(&Backend::Postgres),
        args.backend == BackendChoice::Postgres,
        |why| errln!("bench: PostgreSQL skipped: {why}"),
    )
    .map_err(|why| failure(Exit::Fail.byte(), why))?;
    let mut opts = ticketflow_harness::bench::BenchOptions::standard(server);
    opts.sqlite = backends.contains(&Backend::Sqlite);
    opts.protocols = args.protocol.map_or(Protocol::ALL.to_vec(), |p| vec![p]);
    if !args.workloads.is_empty() {
        opts.workloads = args.workloads;
    }
    opts.clients = args.clients;
    opts.racers = args.racers;
    opts.duration = args.duration;
    opts.converge_reps = args.converge_reps;
    opts.runs = args.runs;
    opts.pgbench = args.pgbench;
    if args.quick {
        opts = opts.quick();
    }
    let rows = ticketflow_harness::bench::run(&opts, |run, r| {
        errln!(
            "bench: run {} {} {} {} x{}: ours {:.1}, baseline {:.1}, ratio {:.2}",
            run + 1,
            r.backend,
            r.protocol,
            r.workload.name(),
            r.clients,
            r.ours.value,
            r.baseline.value,
            r.ratio
        )
    })
    .map_err(|e| failure(Exit::Fail.byte(), e))?;
    print!("{}", ticketflow_harness::bench::markdown(&rows));
    if let Some(path) = args.json {
        write_json(&path, &rows)?;
    }
    if args.interposer {
        let Some(pg) = &opts.pg else {
            return Err(failure(
                Exit::Fail.byte(),
                "--interposer: the interposer rows need PostgreSQL, and it was skipped",
            ));
        };
        let exe = std::env::current_exe()
            .map_err(|e| failure(Exit::Fail.byte(), format!("cannot find this program: {e}")))?;
        // The Redis rows measure the Redis `--lease` names, else the loopback default.
        let redis_url = args.lease.as_deref().unwrap_or(DEFAULT_BENCH_REDIS);
        let redis = ticketflow_harness::interpose::upstream_of(redis_url)
            .map_err(|e| failure(Exit::Usage.byte(), format!("{redis_url}: {e}")))?;
        let rows = ticketflow_harness::bench::interpose::run(
            pg,
            redis,
            &exe,
            &opts.clients,
            opts.duration,
            opts.runs,
            |line| errln!("bench: {line}"),
        )
        .map_err(|e| failure(Exit::Fail.byte(), e))?;
        outln!();
        print!("{}", ticketflow_harness::bench::interpose::markdown(&rows));
        if let Some(path) = &args.interposer_json {
            write_json(path, &rows)?;
        }
    }
    let Some(config) = lease else {
        return Ok(Exit::Pass.byte());
    };
    let lease_rows = ticketflow_harness::bench::lease::run(&opts, &config, |run, r| {
        errln!(
            "bench: run {} lease {} {} {} x{}: without {:.1}, with {:.1}, speed ratio {:.2}, \
             lost inserts {} / {}",
            run + 1,
            r.backend,
            r.protocol,
            r.workload.name(),
            r.clients,
            r.without.measure.value,
            r.with.measure.value,
            r.speed_ratio,
            r.without.lost_inserts,
            r.with.lost_inserts
        )
    })
    .map_err(|e| failure(Exit::Fail.byte(), e))?;
    outln!();
    print!(
        "{}",
        ticketflow_harness::bench::lease::markdown(&lease_rows)
    );
    if let Some(path) = args.lease_json {
        write_json(&path, &lease_rows)?;
    }
    Ok(Exit::Pass.byte())
}

/// `value` as pretty JSON in the file `path` (a `bench --json` file).
fn write_json(path: &Path, value: &impl serde::Serialize) -> Result<(), Failure> {
    let text = serde_json::to_string_pretty(value).expect("bench rows serialize");
    std::fs::write(path, text).map_err(|e| {
        failure(
            Exit::Fail.byte(),
            format!("cannot write {}: {e}", path.display()),
        )
    })
}

/// `ticketflow soak`: two services under mixed traffic and faults; exit 0 PASS, 1 FAIL,
/// 3 PENDING.
pub fn soak(args: SoakArgs) -> CliResult {
    use ticketflow_harness::verdict::Verdict;
    let mut opts =
        ticketflow_harness::soak::SoakOptions::new(pg_url(args.pg_url.as_deref())?.server);
    opts.duration = args.duration;
    opts.connections = args.connections;
    opts.tenants = args.tenants;
    opts.seed = args.seed;
    if args.faults.len() > 1 && args.faults.contains(&None) {
        return Err(usage(
            "--faults: `none` stands alone; drop it or the fault kinds listed with it",
        ));
    }
    opts.faults = args.faults.into_iter().flatten().collect();
    opts.statement_timeout = Duration::from_millis(args.statement_timeout_ms);
    opts.statement_timeout_hold = args.statement_timeout_hold_ms.map(Duration::from_millis);
    opts.implementation = args.variant.map_or(
        Implementation::Protocol(args.protocol),
        Implementation::Variant,
    );
    opts.validate().map_err(usage)?;
    sweep_orphans(&opts.pg);
    let report = ticketflow_harness::soak::run(&opts);
    if args.json {
        print::json(&report);
    } else {
        print::text(&report.text());
    }
    Ok(match report.verdict {
        Verdict::Pass => Exit::Pass.byte(),
        Verdict::Fail => Exit::Fail.byte(),
        Verdict::Pending => Exit::Pending.byte(),
    })
}

/// `ticketflow worker`: one racer per process, JSON lines on stdin and stdout.
pub fn worker(args: WorkerArgs) -> CliResult {
    ticketflow_core::store::url::check_postgres(&args.pg_url, UrlOrigin::Flag("--pg-url"))
        .map_err(usage)?;
    let config = WorkerConfig {
        implementation: args.implementation,
        die_after_commits: args.die_after_commits,
        pg_url: args.pg_url,
        dbname: args.dbname,
        isolation: args.isolation,
        lock: args.lock,
        retry: RetryPolicy {
            max_attempts: args.max_attempts.max(1),
            base_backoff: Duration::from_micros(args.base_backoff_us),
            max_backoff: Duration::from_micros(args.max_backoff_us),
        },
    };
    let stdin = std::io::stdin();
    worker::serve(&config, stdin.lock(), std::io::stdout().lock())
        .map_err(|e| failure(Exit::Fail.byte(), e))?;
    Ok(Exit::Pass.byte())
}
