//! The soak's faults: the schedule, each kind's injection on the scratch database or a
//! service, and what a requested fault that could not be injected means for the verdict.

use super::*;

pub(super) enum FaultFailure {
    /// The fault cannot be injected here (PENDING).
    CannotInject(String),
    /// Injecting it broke something it should not have (FAIL).
    Broke(String),
}

/// The faults check: FAIL when injecting one broke something, PENDING when a requested kind
/// was never injected (it cannot be here, or the window was too short), else PASS.
pub(super) fn judge_faults(kinds: &[FaultKind], faults: &[FaultRecord]) -> Check {
    let name = INVARIANTS[0];
    if kinds.is_empty() {
        return Check::pass(name, "none requested (a fault-free soak)");
    }
    let broke: Vec<String> = faults
        .iter()
        .filter(|f| f.verdict == Verdict::Fail)
        .map(|f| format!("{}: {}", f.kind, f.detail))
        .collect();
    if !broke.is_empty() {
        return Check::fail(name, broke.join("; "));
    }
    let counts: Vec<String> = kinds
        .iter()
        .map(|k| {
            let n = faults
                .iter()
                .filter(|f| f.kind == *k && f.verdict == Verdict::Pass)
                .count();
            format!("{k} ×{n}")
        })
        .collect();
    let missing: Vec<String> = kinds
        .iter()
        .filter(|k| {
            !faults
                .iter()
                .any(|f| f.kind == **k && f.verdict == Verdict::Pass)
        })
        .map(|k| {
            match faults
                .iter()
                .find(|f| f.kind == *k && f.verdict == Verdict::Pending)
            {
                Some(f) => format!("{k}: {}", f.detail),
                None => format!("{k}: no time left in the fault window (run longer)"),
            }
        })
        .collect();
    if missing.is_empty() {
        Check::pass(name, counts.join(", "))
    } else {
        Check::pending(name, format!("not injected: {}", missing.join("; ")))
    }
}

pub(super) fn sleep_until(t: Instant) {
    let now = Instant::now();
    if t > now {
        std::thread::sleep(t - now);
    }
}

impl Soak {
    pub(super) fn run_fault_schedule(&mut self, started: Instant, faults_end: Instant) {
        if self.kinds.is_empty() {
            return;
        }
        let first = started + (self.opts.duration / 10).min(Duration::from_millis(500));
        sleep_until(first);
        let mut n = 0usize;
        let mut gave_up: HashSet<FaultKind> = HashSet::new();
        while Instant::now() < faults_end && gave_up.len() < self.kinds.len() {
            let kind = self.kinds[n % self.kinds.len()];
            n += 1;
            if gave_up.contains(&kind) {
                continue;
            }
            let at_ms = started.elapsed().as_millis() as u64;
            let (verdict, detail) = match self.inject(kind, n) {
                Ok(detail) => (Verdict::Pass, detail),
                Err(FaultFailure::CannotInject(why)) => {
                    gave_up.insert(kind);
                    (Verdict::Pending, why)
                }
                Err(FaultFailure::Broke(why)) => (Verdict::Fail, why),
            };
            self.faults.push(FaultRecord {
                kind,
                at_ms,
                took_ms: (started.elapsed().as_millis() as u64).saturating_sub(at_ms),
                verdict,
                detail,
            });
            let next = Instant::now() + FAULT_GAP;
            if next >= faults_end {
                break;
            }
            sleep_until(next);
        }
    }

    pub(super) fn admin(&self) -> Result<postgres::Client, AdminError> {
        Ok(pg::connect_as(
            self.opts.pg.config(),
            pg::SessionRole::Admin,
        )?)
    }

    pub(super) fn db_name(&self) -> String {
        self.db
            .pg()
            .map(|d| d.name().to_string())
            .unwrap_or_default()
    }

    pub(super) fn inject(&mut self, kind: FaultKind, n: usize) -> Result<String, FaultFailure> {
        match kind {
            FaultKind::KillService => {
                let index = n % 2;
                let name = self.specs[index].name.clone();
                let Some(pid) = self.services.kill(index) else {
                    return Err(FaultFailure::Broke(format!("{name} was not running")));
                };
                std::thread::sleep(KILL_DOWN);
                let back = Instant::now();
                self.services
                    .restart(index)
                    .map_err(|e| FaultFailure::Broke(format!("killed {name}; {e}")))?;
                Ok(format!(
                    "SIGKILL to {name} (pid {pid}); down {} ms, ready again {} ms after its start",
                    KILL_DOWN.as_millis(),
                    back.elapsed().as_millis()
                ))
            }
            FaultKind::TerminateBackends => {
                let n = self
                    .terminate_all()
                    .map_err(|e| FaultFailure::CannotInject(e.to_string()))?;
                Ok(format!(
                    "pg_terminate_backend of {n} sessions of the scratch database"
                ))
            }
            FaultKind::StatementTimeout => self.statement_timeout(),
            FaultKind::RestartPostgres => {
                let began = Instant::now();
                crate::faults::restart_local_cluster(&self.opts.pg)
                    .map_err(|e| FaultFailure::CannotInject(e.to_string()))?;
                let back = self.wait_for_postgres();
                Ok(format!(
                    "pg_ctlcluster restart took {} ms; {back}",
                    began.elapsed().as_millis()
                ))
            }
        }
    }

    /// Terminates every session of the scratch database; returns how many.
    pub(super) fn terminate_all(&self) -> Result<i64, AdminError> {
        let mut admin = self.admin()?;
        Ok(admin
            .query_one(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                 WHERE datname = $1 AND pid <> pg_backend_pid()",
                &[&self.db_name()],
            )
            .and_then(|r| r.try_get::<_, i64>(0))?)
    }

    pub(super) fn statement_timeout(&mut self) -> Result<String, FaultFailure> {
        let name = self.db_name();
        let ms = self.opts.statement_timeout.as_millis().max(1);
        let mut admin = self
            .admin()
            .map_err(|e| FaultFailure::CannotInject(e.to_string()))?;
        // The name is ours (`tf_soak_…`, lowercase letters, digits and `_`): quoted as is.
        admin
            .batch_execute(&format!(
                "ALTER DATABASE \"{name}\" SET statement_timeout = '{ms}ms'"
            ))
            .map_err(|e| FaultFailure::CannotInject(e.to_string()))?;
        let cut_at_start = self.terminate_all().unwrap_or(0);
        std::thread::sleep(self.opts.hold());
        let reset = admin
            .batch_execute(&format!(
                "ALTER DATABASE \"{name}\" RESET statement_timeout"
            ))
            .and_then(|()| admin.query_one("SELECT clock_timestamp()", &[]))
            .and_then(|r| r.try_get::<_, chrono::DateTime<chrono::Utc>>(0));
        let reset_at = match reset {
            Ok(t) => t,
            Err(e) => {
                return Err(FaultFailure::Broke(format!(
                    "could not reset statement_timeout on {name}: {e}"
                )))
            }
        };
        // Sessions opened under the timeout keep it: terminate them (the pools reconnect
        // without it), but leave one that stays in an aborted transaction alone, so the
        // checks see whether the service ever recovers it. A session only passing through
        // that state is caught on a later round.
        let mut cut_at_reset = 0i64;
        let mut left: Vec<(i32, String)> = Vec::new();
        for round in 0..20 {
            if round > 0 {
                std::thread::sleep(Duration::from_millis(50));
            }
            let cut = admin
                .query(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                     WHERE datname = $1 AND pid <> pg_backend_pid() AND backend_start < $2 \
                     AND state IS DISTINCT FROM 'idle in transaction' \
                     AND state IS DISTINCT FROM 'idle in transaction (aborted)'",
                    &[&name, &reset_at],
                )
                .map_err(|e| FaultFailure::Broke(format!("terminate after the reset: {e}")))?;
            cut_at_reset += cut.len() as i64;
            let remaining = admin
                .query(
                    "SELECT pid, coalesce(state, '') FROM pg_stat_activity WHERE datname = $1 \
                     AND pid <> pg_backend_pid() AND backend_start < $2",
                    &[&name, &reset_at],
                )
                .map_err(|e| FaultFailure::Broke(format!("read sessions after the reset: {e}")))?;
            left = remaining
                .iter()
                .filter_map(|r| Some((r.try_get(0).ok()?, r.try_get(1).ok()?)))
                .collect();
            if left.is_empty() {
                break;
            }
        }
        let left_text = if left.is_empty() {
            String::new()
        } else {
            format!(
                "; {} session(s) still in a transaction after 1 s, left alone on purpose: {left:?}",
                left.len()
            )
        };
        Ok(format!(
            "statement_timeout = {ms} ms on the scratch database for {} ms; {cut_at_start} sessions terminated to pick it up, {cut_at_reset} after the reset{left_text}",
            self.opts.hold().as_millis()
        ))
    }

    /// Waits (bounded by [`SETTLE_TIMEOUT`]) until the server accepts a connection again.
    pub(super) fn wait_for_postgres(&self) -> String {
        let began = Instant::now();
        while began.elapsed() < SETTLE_TIMEOUT {
            if self.admin().is_ok() {
                return format!("accepting again after {} ms", began.elapsed().as_millis());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        format!(
            "still not accepting connections after {} s",
            SETTLE_TIMEOUT.as_secs()
        )
    }
}

/// Why the soak's admin session could not connect, or its query failed; the message is the
/// cause's own.
#[derive(Debug, thiserror::Error)]
pub(super) enum AdminError {
    /// The admin session could not connect.
    #[error(transparent)]
    Connect(#[from] ticketflow_core::StoreError),
    /// A query of the admin session failed.
    #[error(transparent)]
    Query(#[from] postgres::Error),
}
