//! `ticketflow bench --lease URL`: what the Redis lease (`ticketflow_core::lease`) buys on the
//! contended workloads, measured against the same protocol without it in the same run.
//!
//! For each backend, protocol and contended row (`hot-key` at the largest client count,
//! `converge` at each racer count) both sides run back to back on the same database — the
//! protocol alone (**without**), and the protocol behind [`create_with_lease`] with a Redis
//! connection per client (**with**), the order swapped every other run — and every store
//! call is counted ([`Counted`]):
//!
//! - **lost inserts**: a receipt insert that met the unique violation (`savepoint`) or a claim
//!   that found the key taken (`on-conflict`): an insert the loser wrote for nothing, the
//!   contention the lease is meant to cut;
//! - **transactions**: `BEGIN`s sent (retries included);
//! - **polls**: receipt lookups outside a transaction (a request that found the lease held
//!   looks for the receipt while it waits: work the lease adds);
//! - the lease's own counts ([`LeaseCounts`]: held, waited, no lease, release missed).
//!
//! Ratios are always with / without: speed (throughput, or convergence time without / with,
//! so above 1 means the lease made it faster), and lost inserts and transactions **per
//! operation** (below 1 means the lease saved some). With `runs > 1` every figure is the
//! median over the runs and each ratio the median of the per-run ratios.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use serde::Serialize;
use uuid::Uuid;

use super::{
    bench_request, converge_rounds, median, median_measure, open, require_loopback, scratch_err,
    store_err, tag, throughput, BenchError, BenchOptions, Measure, Workload, TENANT,
};
use crate::scratch::ScratchDb;
use ticketflow_core::domain::{CreateReport, OutboxEvent, Receipt, Ticket, TicketPatch};
use ticketflow_core::lease::{
    create_with_lease, LeaseConfig, LeaseCounts, LeaseStats, Leases, RedisLeases, Release,
};
use ticketflow_core::protocol::{create_ticket, CreateOptions, Protocol};
use ticketflow_core::store::{Backend, Claimed, Store, StoreResult};

/// Counters of the store calls of one side of a row, shared by its clients.
#[derive(Debug, Default)]
pub struct CallCounts {
    transactions: AtomicU64,
    lost_inserts: AtomicU64,
    polls: AtomicU64,
}

impl CallCounts {
    /// `BEGIN`s sent so far.
    pub fn transactions(&self) -> u64 {
        self.transactions.load(Ordering::Relaxed)
    }

    /// Receipt inserts that lost so far (unique violation, or a claim that found the key
    /// taken).
    pub fn lost_inserts(&self) -> u64 {
        self.lost_inserts.load(Ordering::Relaxed)
    }

    /// Receipt lookups outside a transaction so far.
    pub(crate) fn polls(&self) -> u64 {
        self.polls.load(Ordering::Relaxed)
    }
}

/// A [`Store`] that counts what the bench reports ([`CallCounts`]) and otherwise passes every
/// call through unchanged.
pub struct Counted<S> {
    inner: S,
    counts: Arc<CallCounts>,
    in_transaction: bool,
}

impl<S> Counted<S> {
    /// Wraps `inner`, counting into `counts`.
    pub fn new(inner: S, counts: Arc<CallCounts>) -> Self {
        Counted {
            inner,
            counts,
            in_transaction: false,
        }
    }
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

impl<S: Store + ?Sized, B: std::ops::DerefMut<Target = S>> Store for Counted<B> {
    fn backend(&self) -> Backend {
        self.inner.backend()
    }

    fn begin(&mut self) -> StoreResult<()> {
        bump(&self.counts.transactions);
        let result = self.inner.begin();
        self.in_transaction = result.is_ok();
        result
    }

    fn savepoint(&mut self, name: &str) -> StoreResult<()> {
        self.inner.savepoint(name)
    }

    fn rollback_to_savepoint(&mut self, name: &str) -> StoreResult<()> {
        self.inner.rollback_to_savepoint(name)
    }

    fn release_savepoint(&mut self, name: &str) -> StoreResult<()> {
        self.inner.release_savepoint(name)
    }

    fn commit(&mut self) -> StoreResult<()> {
        self.in_transaction = false;
        self.inner.commit()
    }

    fn rollback(&mut self) -> StoreResult<()> {
        self.in_transaction = false;
        self.inner.rollback()
    }

    fn find_receipt(&mut self, tenant_id: &str, key: &str) -> StoreResult<Option<Receipt>> {
        if !self.in_transaction {
            bump(&self.counts.polls);
        }
        self.inner.find_receipt(tenant_id, key)
    }

    fn insert_ticket(&mut self, ticket: &Ticket) -> StoreResult<()> {
        self.inner.insert_ticket(ticket)
    }

    fn insert_outbox(&mut self, event: &OutboxEvent) -> StoreResult<()> {
        self.inner.insert_outbox(event)
    }

    fn insert_receipt(&mut self, receipt: &Receipt) -> StoreResult<()> {
        let result = self.inner.insert_receipt(receipt);
        if matches!(&result, Err(e) if e.is_unique_violation()) {
            bump(&self.counts.lost_inserts);
        }
        result
    }

    fn insert_receipt_if_absent(&mut self, receipt: &Receipt) -> StoreResult<bool> {
        let result = self.inner.insert_receipt_if_absent(receipt);
        if matches!(result, Ok(false)) {
            bump(&self.counts.lost_inserts);
        }
        result
    }

    fn find_ticket(&mut self, tenant_id: &str, id: Uuid) -> StoreResult<Option<Ticket>> {
        self.inner.find_ticket(tenant_id, id)
    }

    fn update_ticket(
        &mut self,
        tenant_id: &str,
        id: Uuid,
        patch: &TicketPatch,
        now: chrono::DateTime<chrono::Utc>,
    ) -> StoreResult<Option<Ticket>> {
        self.inner.update_ticket(tenant_id, id, patch, now)
    }

    fn claim_and_create(
        &mut self,
        ticket: &Ticket,
        event: &OutboxEvent,
        receipt: &Receipt,
    ) -> StoreResult<Claimed> {
        // The statement is a transaction of its own.
        bump(&self.counts.transactions);
        let result = self.inner.claim_and_create(ticket, event, receipt);
        if matches!(result, Ok(Claimed::TakenUnseen)) {
            bump(&self.counts.lost_inserts);
        }
        result
    }

    fn find_before_claim(
        &mut self,
        tenant_id: &str,
        key: &str,
    ) -> StoreResult<Option<(Receipt, Option<Ticket>)>> {
        self.inner.find_before_claim(tenant_id, key)
    }

    fn find_receipt_and_ticket(
        &mut self,
        tenant_id: &str,
        key: &str,
    ) -> StoreResult<Option<(Receipt, Option<Ticket>)>> {
        self.inner.find_receipt_and_ticket(tenant_id, key)
    }
}

/// One side of a lease row: the timing, and what was counted.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct LeaseSide {
    /// Throughput (hot-key) or convergence time in ms (converge), with p50/p99 as in the
    /// main rows.
    pub measure: Measure,
    /// Receipt inserts that lost (wasted loser inserts).
    pub lost_inserts: u64,
    /// Transactions started.
    pub transactions: u64,
    /// Receipt lookups outside a transaction (waiters polling).
    pub polls: u64,
    /// The lease's counts (all 0 without the lease).
    pub lease: LeaseCounts,
    /// Lost inserts per operation (of one run; the median over runs).
    pub lost_per_op: f64,
    /// Transactions per operation (of one run; the median over runs).
    pub transactions_per_op: f64,
    /// Polls per operation (of one run; the median over runs).
    pub polls_per_op: f64,
}

/// One row of the lease table: a contended workload with and without the lease.
#[derive(Debug, Clone, Serialize)]
pub struct LeaseRow {
    /// The backend measured.
    pub backend: Backend,
    /// The protocol measured.
    pub protocol: Protocol,
    /// `hot-key` or `converge`.
    pub workload: Workload,
    /// Clients (racers for `converge`).
    pub clients: usize,
    /// The protocol alone.
    pub without: LeaseSide,
    /// The protocol behind the lease.
    pub with: LeaseSide,
    /// Speed with / without (module docs); above 1: the lease made it faster.
    pub speed_ratio: f64,
    /// Lost inserts per operation, with / without; below 1: the lease saved some. NaN when
    /// none were lost without it.
    pub lost_ratio: f64,
    /// Transactions per operation, with / without.
    pub transactions_ratio: f64,
}

impl LeaseRow {
    fn new(
        backend: Backend,
        protocol: Protocol,
        workload: Workload,
        clients: usize,
        without: LeaseSide,
        with: LeaseSide,
    ) -> Self {
        let speed_ratio = match workload {
            Workload::Converge => without.measure.value / with.measure.value,
            _ => with.measure.value / without.measure.value,
        };
        let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { f64::NAN };
        LeaseRow {
            backend,
            protocol,
            workload,
            clients,
            speed_ratio,
            lost_ratio: ratio(with.lost_per_op, without.lost_per_op),
            transactions_ratio: ratio(with.transactions_per_op, without.transactions_per_op),
            without,
            with,
        }
    }

    fn same_cell(&self, other: &LeaseRow) -> bool {
        self.backend == other.backend
            && self.protocol == other.protocol
            && self.workload == other.workload
            && self.clients == other.clients
    }
}

/// Checks that Redis answers at `config.url`, before anything is measured.
///
/// Will return `Err` ([`BenchError::LeaseUnreachable`]) when it does not.
pub fn probe(config: &LeaseConfig) -> Result<(), BenchError> {
    RedisLeases::connect(config)
        .and_then(|mut r| r.holder("lease:ticketflow-bench-probe").map(drop))
        .map_err(|source| BenchError::LeaseUnreachable {
            url: config.url.clone(),
            source,
        })
}

/// Runs the lease rows (module docs) for every selected backend and protocol, `runs` times,
/// and returns one row per cell with medians. Only `hot-key` and `converge` (if selected) have
/// lease rows. `progress` sees each row of each run.
///
/// Will return `Err` when Redis does not answer at the start, a database cannot be created
/// or opened, or a convergence row does not converge.
pub fn run(
    opts: &BenchOptions,
    config: &LeaseConfig,
    mut progress: impl FnMut(usize, &LeaseRow),
) -> Result<Vec<LeaseRow>, BenchError> {
    probe(config)?;
    if let Some(pg) = &opts.pg {
        require_loopback(pg)?;
    }
    let mut all: Vec<Vec<LeaseRow>> = Vec::new();
    for run_no in 0..opts.runs.max(1) {
        let mut rows = Vec::new();
        let mut targets = Vec::new();
        if opts.sqlite {
            targets.push(ScratchDb::sqlite().map_err(scratch_err("create the SQLite database"))?);
        }
        if let Some(pg) = &opts.pg {
            targets.push(
                ScratchDb::postgres(pg, "benchlease")
                    .map_err(scratch_err("create the scratch database"))?,
            );
        }
        for target in &targets {
            for &protocol in &opts.protocols {
                let cell = Cell {
                    target,
                    opts,
                    config,
                    protocol,
                    with_first: run_no % 2 == 1,
                };
                for row in cell.rows()? {
                    progress(run_no, &row);
                    rows.push(row);
                }
            }
        }
        all.push(rows);
    }
    Ok(medians(&all))
}

fn median_side(sides: &[LeaseSide]) -> LeaseSide {
    let m = |f: &dyn Fn(&LeaseSide) -> u64| -> u64 {
        median(sides.iter().map(|s| f(s) as f64).collect()).round() as u64
    };
    LeaseSide {
        measure: median_measure(&sides.iter().map(|s| s.measure).collect::<Vec<_>>()),
        lost_inserts: m(&|s| s.lost_inserts),
        transactions: m(&|s| s.transactions),
        polls: m(&|s| s.polls),
        lease: LeaseCounts {
            held: m(&|s| s.lease.held),
            waited: m(&|s| s.lease.waited),
            no_lease: m(&|s| s.lease.no_lease),
            release_missed: m(&|s| s.lease.release_missed),
        },
        lost_per_op: median(sides.iter().map(|s| s.lost_per_op).collect()),
        transactions_per_op: median(sides.iter().map(|s| s.transactions_per_op).collect()),
        polls_per_op: median(sides.iter().map(|s| s.polls_per_op).collect()),
    }
}

/// One row per cell: median sides, median of the per-run ratios.
fn medians(runs: &[Vec<LeaseRow>]) -> Vec<LeaseRow> {
    let Some(first) = runs.first() else {
        return Vec::new();
    };
    first
        .iter()
        .map(|cell| {
            let same: Vec<&LeaseRow> = runs
                .iter()
                .flat_map(|r| r.iter().filter(|x| x.same_cell(cell)))
                .collect();
            let ratio = |f: &dyn Fn(&LeaseRow) -> f64| {
                median(same.iter().map(|r| f(r)).filter(|v| !v.is_nan()).collect())
            };
            let mut without = median_side(&same.iter().map(|r| r.without).collect::<Vec<_>>());
            let mut with = median_side(&same.iter().map(|r| r.with).collect::<Vec<_>>());
            // `median_measure` sums operations over the runs; show the median run's.
            let ops = |f: &dyn Fn(&LeaseRow) -> u64| {
                median(same.iter().map(|r| f(r) as f64).collect()).round() as u64
            };
            without.measure.ops = ops(&|r| r.without.measure.ops);
            with.measure.ops = ops(&|r| r.with.measure.ops);
            LeaseRow {
                without,
                with,
                speed_ratio: ratio(&|r| r.speed_ratio),
                lost_ratio: ratio(&|r| r.lost_ratio),
                transactions_ratio: ratio(&|r| r.transactions_ratio),
                ..cell.clone()
            }
        })
        .collect()
}

/// One backend and protocol of one run.
struct Cell<'a> {
    target: &'a ScratchDb,
    opts: &'a BenchOptions,
    config: &'a LeaseConfig,
    protocol: Protocol,
    with_first: bool,
}

impl Cell<'_> {
    fn rows(&self) -> Result<Vec<LeaseRow>, BenchError> {
        let wants = |w: Workload| self.opts.workloads.contains(&w);
        let backend = self.target.backend();
        let mut rows = Vec::new();
        if wants(Workload::HotKey) {
            let clients = self.opts.clients.iter().copied().max().unwrap_or(1);
            let (without, with) = self.pair(|lease| self.hot_key(clients, lease))?;
            rows.push(LeaseRow::new(
                backend,
                self.protocol,
                Workload::HotKey,
                clients,
                without,
                with,
            ));
        }
        for &racers in self
            .opts
            .racers
            .iter()
            .filter(|_| wants(Workload::Converge))
        {
            let (without, with) = self.pair(|lease| self.converge(racers, lease))?;
            rows.push(LeaseRow::new(
                backend,
                self.protocol,
                Workload::Converge,
                racers,
                without,
                with,
            ));
        }
        Ok(rows)
    }

    /// Both sides back to back, the lease side first when `with_first`.
    fn pair(
        &self,
        side: impl Fn(Option<&LeaseConfig>) -> Result<LeaseSide, BenchError>,
    ) -> Result<(LeaseSide, LeaseSide), BenchError> {
        if self.with_first {
            let with = side(Some(self.config))?;
            Ok((side(None)?, with))
        } else {
            let without = side(None)?;
            Ok((without, side(Some(self.config))?))
        }
    }

    /// `clients` clients on [`super::HOT_KEYS`] fresh keys for the row's duration.
    fn hot_key(
        &self,
        clients: usize,
        lease: Option<&LeaseConfig>,
    ) -> Result<LeaseSide, BenchError> {
        let counts = Arc::new(CallCounts::default());
        let stats = LeaseStats::default();
        let keys = tag(if lease.is_some() { "hl" } else { "hn" });
        let (request, protocol, stats_ref) = (bench_request(), self.protocol, &stats);
        let measure = throughput(
            clients,
            self.opts.duration,
            || -> Result<Client, BenchError> {
                let store = Counted::new(open(self.target)?, counts.clone());
                Ok((store, lease.map(ticketflow_core::lease::connect_or_none)))
            },
            |(store, redis), random, _| {
                let key = format!("{keys}{}", random % super::HOT_KEYS as u64);
                leased_create(protocol, store, redis, lease, stats_ref, &key, &request).map(drop)
            },
        )?;
        Ok(side(measure, &counts, &stats))
    }

    /// `reps` barrier releases of `racers` sessions creating one fresh key; the median time
    /// from release to the last answer, checked to be one ticket id.
    fn converge(
        &self,
        racers: usize,
        lease: Option<&LeaseConfig>,
    ) -> Result<LeaseSide, BenchError> {
        let counts = Arc::new(CallCounts::default());
        let stats = LeaseStats::default();
        let mut sessions = (0..racers)
            .map(|_| {
                let store = Counted::new(open(self.target)?, counts.clone());
                Ok((store, lease.map(ticketflow_core::lease::connect_or_none)))
            })
            .collect::<Result<Vec<Client>, BenchError>>()?;
        let (request, protocol, stats_ref) = (bench_request(), self.protocol, &stats);
        let measure = converge_rounds(
            &mut sessions,
            self.opts.converge_reps,
            if lease.is_some() { "cl" } else { "cn" },
            |(store, redis), key| {
                leased_create(protocol, store, redis, lease, stats_ref, key, &request)
                    .map(|r| r.outcome.ticket().map(|t| t.id))
            },
            || {
                format!(
                    "{racers} racers on {} ({}, lease: {})",
                    self.target.backend(),
                    self.protocol,
                    lease.is_some()
                )
            },
        )?;
        Ok(side(measure, &counts, &stats))
    }
}

/// A client of a lease row: its counted session and, on the lease side, its Redis connection
/// (`Some(None)`: it could not connect, so its creates count as no lease).
type Client = (Counted<Box<dyn Store + Send>>, Option<Option<RedisLeases>>);

/// One create: the protocol alone, or behind the lease.
fn leased_create(
    protocol: Protocol,
    store: &mut Counted<Box<dyn Store + Send>>,
    redis: &mut Option<Option<RedisLeases>>,
    lease: Option<&LeaseConfig>,
    stats: &LeaseStats,
    key: &str,
    request: &ticketflow_core::domain::TicketRequest,
) -> Result<CreateReport, BenchError> {
    let options = CreateOptions::new(protocol);
    let result = match (lease, redis) {
        (Some(config), Some(conn)) => {
            let (result, outcome) = create_with_lease(
                conn.as_mut().map(|c| c as &mut dyn Leases),
                config,
                Release::CompareAndDelete,
                store,
                TENANT,
                key,
                |s| create_ticket(s, TENANT, key, request, &options),
            );
            stats.record(&outcome);
            result
        }
        _ => create_ticket(store, TENANT, key, request, &options),
    };
    result.map_err(store_err("create"))
}

fn side(measure: Measure, counts: &CallCounts, stats: &LeaseStats) -> LeaseSide {
    let per_op = |n: u64| n as f64 / measure.ops.max(1) as f64;
    LeaseSide {
        measure,
        lost_inserts: counts.lost_inserts(),
        transactions: counts.transactions(),
        polls: counts.polls(),
        lease: stats.counts(),
        lost_per_op: per_op(counts.lost_inserts()),
        transactions_per_op: per_op(counts.transactions()),
        polls_per_op: per_op(counts.polls()),
    }
}

/// The lease rows as a Markdown table (module docs for the columns); speed ratios under 0.9
/// and lost-insert or transaction ratios over 1 are bold.
pub fn markdown(rows: &[LeaseRow]) -> String {
    let mut out = String::from(
        "| lease | backend | protocol | workload | clients | without | with lease | speed ratio | lost inserts without / with (ops) | lost/op ratio | tx/op without / with | tx ratio | polls/op with | p99 without / with (µs) | lease held / waited / no lease |\n\
         |---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n",
    );
    let ratio = |v: f64, bad: bool| {
        if v.is_nan() {
            "–".to_string()
        } else if bad {
            format!("**{v:.2}**")
        } else {
            format!("{v:.2}")
        }
    };
    for r in rows {
        let fmt = |m: &Measure| match r.workload {
            Workload::Converge => format!("{:.2} ms", m.value),
            _ => format!("{:.0} /s", m.value),
        };
        out.push_str(&format!(
            "| lease | {} | {} | {} | {} | {} | {} | {} | {} / {} ({} / {}) | {} | {:.2} / {:.2} | {} | {:.2} | {:.0} / {:.0} | {} / {} / {} |\n",
            r.backend,
            r.protocol,
            r.workload.name(),
            r.clients,
            fmt(&r.without.measure),
            fmt(&r.with.measure),
            ratio(r.speed_ratio, r.speed_ratio < 0.9),
            r.without.lost_inserts,
            r.with.lost_inserts,
            r.without.measure.ops,
            r.with.measure.ops,
            ratio(r.lost_ratio, r.lost_ratio > 1.0),
            r.without.transactions_per_op,
            r.with.transactions_per_op,
            ratio(r.transactions_ratio, r.transactions_ratio > 1.0),
            r.with.polls_per_op,
            r.without.measure.p99_us,
            r.with.measure.p99_us,
            r.with.lease.held,
            r.with.lease.waited,
            r.with.lease.no_lease,
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use ticketflow_core::store::memory::MemoryDb;

    fn counted(db: &MemoryDb, name: &str, counts: &Arc<CallCounts>) -> Client {
        let session: Box<dyn Store + Send> = Box::new(db.session(name));
        (Counted::new(session, counts.clone()), None)
    }

    /// The counts can fail: a receipt insert that meets the committed key (23505) and a claim
    /// that finds it taken are lost inserts, a won insert is not; `BEGIN`s are transactions;
    /// a lookup outside a transaction is a poll, one inside is not.
    #[test]
    fn lost_inserts_transactions_and_polls_are_counted() {
        let db = MemoryDb::new();
        let counts = Arc::new(CallCounts::default());
        let (mut a, _) = counted(&db, "a", &counts);
        let (mut b, _) = counted(&db, "b", &counts);
        let options = CreateOptions::new(Protocol::Savepoint);
        create_ticket(&mut a, TENANT, "k", &bench_request(), &options).unwrap();
        assert_eq!(
            (counts.transactions(), counts.lost_inserts(), counts.polls()),
            (1, 0, 0),
            "a create that won: one transaction, nothing lost, no poll"
        );
        let receipt = a.find_receipt(TENANT, "k").unwrap().expect("committed");
        assert_eq!(counts.polls(), 1);
        b.begin().unwrap();
        let met = b.insert_receipt(&receipt).unwrap_err();
        assert!(met.is_unique_violation(), "{met}");
        b.rollback().unwrap();
        assert_eq!(counts.lost_inserts(), 1);
        assert!(!b.insert_receipt_if_absent(&receipt).unwrap());
        assert_eq!(
            (counts.transactions(), counts.lost_inserts(), counts.polls()),
            (2, 2, 1)
        );
    }

    #[test]
    fn ratios_are_with_over_without_and_missing_without_losses_are_no_ratio() {
        let side = |value: f64, lost: u64, transactions: u64| LeaseSide {
            measure: Measure {
                value,
                ops: 10,
                ..Measure::default()
            },
            lost_inserts: lost,
            transactions,
            lost_per_op: lost as f64 / 10.0,
            transactions_per_op: transactions as f64 / 10.0,
            ..LeaseSide::default()
        };
        let row = |w, without, with| {
            LeaseRow::new(Backend::Sqlite, Protocol::Savepoint, w, 2, without, with)
        };
        let converge = row(Workload::Converge, side(2.0, 5, 10), side(4.0, 0, 10));
        assert!((converge.speed_ratio - 0.5).abs() < 1e-9, "twice as slow");
        assert_eq!(converge.lost_ratio, 0.0);
        assert_eq!(converge.transactions_ratio, 1.0);
        let hot = row(Workload::HotKey, side(100.0, 0, 10), side(50.0, 0, 10));
        assert!((hot.speed_ratio - 0.5).abs() < 1e-9);
        assert!(hot.lost_ratio.is_nan());
        assert!(markdown(&[hot]).contains("| – |"));
    }
}
