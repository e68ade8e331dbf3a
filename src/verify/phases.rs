//! The phases of `verify` beside the matrix: the kill matrix, the short soak, the fault
//! cases; the session budget they share and the timer of each phase.

use super::*;
use ticketflow_core::store::url::PgServer;

/// The kill matrix over `scenarios`, its loom gate read from `loom` (loaded from `loom_path`),
/// cells at once within `pool`; with the cells' summed duration.
pub(super) fn run_kill_matrix(
    opts: &VerifyOptions,
    scenarios: &[Scenario],
    pg_unusable: Option<&str>,
    loom_path: &Path,
    loom: &LoomReport,
    pool: Pool,
) -> (KillMatrix, Duration) {
    ticketflow_harness::killmatrix::run_on(
        scenarios,
        &KillOptions {
            pg: opts.pg.clone(),
            pg_unusable: pg_unusable.map(str::to_string),
            cases: KILL_MATRIX_CASES,
            seed: opts.seed,
            loom_report: loom_path.to_path_buf(),
            worker_exe: None,
            lease: opts.lease.clone(),
            interposed: ticketflow_harness::killmatrix::load_interposed(
                &opts
                    .scenarios
                    .join(ticketflow_harness::killmatrix::INTERPOSED_DIR),
            ),
            check_file: ticketflow_harness::killmatrix::load_check_file(&opts.scenarios),
        },
        loom,
        pool,
    )
}

/// How long `verify`'s soak runs.
pub(super) const VERIFY_SOAK: Duration = Duration::from_secs(4);
/// How long `verify`'s soak runs under `--restart-postgres` (the restart needs a longer window).
pub(super) const VERIFY_SOAK_WITH_RESTART: Duration = Duration::from_secs(8);

/// What the soak runs beside (the report names it): the kill matrix and the fault cases, those
/// of them selected; `None` when neither runs, and the soak then runs on its own.
pub(super) fn soak_beside_what(kill_matrix: bool, faults: bool) -> Option<&'static str> {
    match (kill_matrix, faults) {
        (true, true) => Some("the kill matrix and the fault cases"),
        (true, false) => Some("the kill matrix"),
        (false, true) => Some("the fault cases"),
        (false, false) => None,
    }
}

/// `verify`'s short soak: `ticketflow soak` for a few seconds ([`VERIFY_SOAK`]), 4
/// connections, 2 tenants, the default faults, and the PostgreSQL restart under
/// `--restart-postgres` ([`VERIFY_SOAK_WITH_RESTART`]).
pub(super) fn short_soak_options(opts: &VerifyOptions) -> ticketflow_harness::soak::SoakOptions {
    use ticketflow_harness::soak::{FaultKind, SoakOptions};
    let mut s = SoakOptions::new(opts.pg.clone());
    s.connections = 4;
    s.tenants = 2;
    s.seed = opts.seed.unwrap_or(1);
    s.duration = VERIFY_SOAK;
    if opts.restart_postgres {
        s.faults.push(FaultKind::RestartPostgres);
        s.duration = VERIFY_SOAK_WITH_RESTART;
    }
    s
}

/// The soak of `s`, run now; PENDING when PostgreSQL is not selected or unusable.
pub(super) fn run_short_soak(
    s: &ticketflow_harness::soak::SoakOptions,
    wants_pg: bool,
    pg_unusable: Option<&str>,
) -> ticketflow_harness::soak::SoakReport {
    use ticketflow_harness::soak::SoakReport;
    match (wants_pg, pg_unusable) {
        (false, _) => SoakReport::pending(s, "PostgreSQL not selected (--backend)"),
        (true, Some(why)) => SoakReport::pending(s, why),
        (true, None) => ticketflow_harness::soak::run(s),
    }
}

/// The fault and bad-input cases with the savepoint protocol (and the restart, if asked for),
/// then with each other create protocol.
pub(super) fn run_fault_cases(
    opts: &VerifyOptions,
    pg_unusable: Option<&str>,
) -> ticketflow_harness::faults::FaultReport {
    use ticketflow_core::protocol::Protocol;
    let mut faults = ticketflow_harness::faults::run(&opts.pg, pg_unusable, opts.restart_postgres);
    // The other create protocols are controls too: their fault cases must pass.
    for protocol in Protocol::ALL.into_iter().skip(1) {
        faults.absorb(ticketflow_harness::faults::run_protocol(
            protocol,
            &opts.pg,
            pg_unusable,
        ));
    }
    faults
}

/// Writes the isolation specs into `out` (`isolation-specs/` beside REPORT.md), one per
/// failing PostgreSQL run.
pub(super) fn export_failing_races(
    runs: &[ScenarioRun],
    out: &mut ticketflow_harness::outputs::OutputDir,
) -> Vec<ExportedSpec> {
    let mut specs = Vec::new();
    for r in runs
        .iter()
        .filter(|r| r.verdict == Verdict::Fail && r.backend == Backend::Postgres)
    {
        // A run that failed before the race has no timeline; it is reported, not exported.
        if let Ok(path) = ticketflow_harness::blackbox::isolation::export(r, out) {
            specs.push(ExportedSpec {
                scenario: r.scenario.clone(),
                setting: r.setting.label(),
                path,
            });
        }
    }
    specs
}

/// The PostgreSQL sessions `verify`'s runs may hold at once: the server's free slots now
/// ([`ticketflow_harness::scenario::capacity::slots`]) less [`ticketflow_harness::jobs::SESSION_MARGIN`]; unbounded
/// ([`ticketflow_harness::jobs::UNBOUNDED_SESSIONS`]) when PostgreSQL is not used or cannot be asked (then
/// every PostgreSQL run is PENDING or fails its own check, as it would alone).
///
/// Never `u64::MAX`: that is what a run that must run alone asks for (a `[lease]` run, the
/// kill matrix's lease gate), and such a run holds the whole budget, which the next one's
/// sessions are added to.
pub(super) fn session_budget(pg: &PgServer, pg_unusable: Option<&str>) -> u64 {
    use ticketflow_harness::jobs::UNBOUNDED_SESSIONS;
    if pg_unusable.is_some() {
        return UNBOUNDED_SESSIONS;
    }
    let slots = ticketflow_core::store::postgres::connect_as(
        pg.config(),
        ticketflow_core::store::postgres::SessionRole::Admin,
    )
    .ok()
    .and_then(|mut admin| ticketflow_harness::scenario::capacity::slots(&mut admin).ok());
    match slots {
        Some(s) => {
            // The probing session itself is closed by now.
            let free = s.max_connections - s.reserved - (s.in_use - 1);
            u64::try_from(free)
                .unwrap_or(0)
                .saturating_sub(ticketflow_harness::jobs::SESSION_MARGIN)
                .clamp(1, UNBOUNDED_SESSIONS)
        }
        None => UNBOUNDED_SESSIONS,
    }
}

/// Times `verify`'s phases ([`Timings`]).
pub(super) struct PhaseTimer {
    pub(super) started: Instant,
    pub(super) timings: Timings,
}

/// When a phase started, and the scratch databases' cost then.
#[derive(Clone, Copy)]
pub(super) struct Mark {
    pub(super) at: Instant,
    pub(super) scratch: ScratchCost,
}

impl PhaseTimer {
    pub(super) fn start(jobs: usize) -> PhaseTimer {
        PhaseTimer {
            started: Instant::now(),
            timings: Timings {
                jobs,
                ..Timings::default()
            },
        }
    }

    pub(super) fn mark(&self) -> Mark {
        Mark {
            at: Instant::now(),
            scratch: scratch_cost(),
        }
    }

    /// Records the phase `phase` begun at `mark` with `items`; `summed` is its items' own
    /// durations added up (`None`: they ran one after another, so the wall time).
    pub(super) fn phase(
        &mut self,
        mark: Mark,
        phase: &'static str,
        items: usize,
        summed: Option<Duration>,
    ) {
        let wall = mark.at.elapsed();
        self.timings.phases.push(PhaseTiming {
            phase,
            items,
            wall_ms: ms(wall),
            summed_ms: ms(summed.unwrap_or(wall)),
            scratch: scratch_cost().since(mark.scratch),
            beside: None,
        });
    }

    /// Records the phase `phase` that ran `took` beside the phases `beside` names: one item,
    /// its own duration as wall and summed, and no scratch cost of its own (theirs includes
    /// it).
    pub(super) fn phase_beside(&mut self, phase: &'static str, took: Duration, beside: &str) {
        self.timings.phases.push(PhaseTiming {
            phase,
            items: 1,
            wall_ms: ms(took),
            summed_ms: ms(took),
            scratch: ScratchCost::default(),
            beside: Some(beside.to_string()),
        });
    }

    pub(super) fn finish(mut self) -> Timings {
        self.timings.wall_ms = ms(self.started.elapsed());
        self.timings
    }
}

/// `d` in milliseconds.
pub(super) fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
