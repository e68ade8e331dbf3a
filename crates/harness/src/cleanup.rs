//! What the process must undo when it is interrupted, and the signal handler that undoes it:
//! one registry for the whole process.
//!
//! Things that outlive a crash unless removed — scratch databases
//! ([`crate::scratch::ScratchDatabase`]), temporary directories
//! ([`crate::scratch::ScratchDir`]) and the services a black-box run starts
//! (the harness's child services) — [`register`] a cleanup while they exist and get a
//! [`Registration`] back; dropping it (or [`Registration::cancel`]) takes the cleanup off the
//! list, because the owner then undoes the thing itself. On SIGINT, SIGTERM or SIGHUP
//! ([`install_signal_handler`]), or a closed output pipe ([`say`]), [`end_as`] runs what is
//! still registered, services first (they use the databases), and exits with 128 + the
//! signal's number (130, 143, 129; 141 for the pipe).
//!
//! What is being created or destroyed right now is not on the list yet, or no longer: a
//! `CREATE DATABASE` still running, a `DROP` the owner has started, a child just spawned.
//! Such work runs inside a [`critical`] section (create, then register; undo, then
//! unregister). The handler first closes the sections (a thread entering one afterwards never
//! returns: the process is about to exit) and waits, bounded by [`CRITICAL_WAIT`], for those
//! in progress to end; only then does it run what is registered. Once it has, a new
//! [`register`] runs its cleanup at once and never returns. So nothing a thread creates while
//! the handler runs outlives the process, and only a SIGKILL can leave something behind.
//!
//! `ticketflow serve` stops differently: once [`graceful_shutdown`] was called, the first
//! signal only notifies the server (it finishes the requests in flight) and a second exits at
//! once.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// How long the interrupt handler waits for the [`critical`] sections in progress (a
/// `CREATE DATABASE`, an owner's `DROP`) to end before it runs the registered cleanups
/// anyway. A section still running after it may leave its database behind.
pub const CRITICAL_WAIT: Duration = Duration::from_secs(30);

/// What a cleanup undoes. On an interrupt cleanups run in this order: every child service,
/// then every scratch database, then every scratch directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// A child process (a service started for a black-box run) to stop.
    ChildService,
    /// A scratch database to drop.
    ScratchDatabase,
    /// A temporary directory (a scratch SQLite file, scripts, logs) to remove.
    ScratchDirectory,
}

/// A cleanup that ran on an interrupt and succeeded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Undone {
    /// What it undid.
    pub kind: Kind,
    /// The name it was registered under (a database name, a pid).
    pub name: String,
}

type Action = Box<dyn FnOnce() -> bool + Send>;

struct Entry {
    id: u64,
    kind: Kind,
    name: String,
    undo: Action,
}

/// The registry's list, and whether it was run for an interrupt (closed).
struct Entries {
    list: Vec<Entry>,
    closed: bool,
}

/// A list of pending cleanups. The process has one ([`register`], [`run_registered`]); tests
/// make their own.
struct Registry {
    cleanups: Mutex<Entries>,
    next_id: AtomicU64,
}

impl Registry {
    const fn new() -> Self {
        Registry {
            cleanups: Mutex::new(Entries {
                list: Vec::new(),
                closed: false,
            }),
            next_id: AtomicU64::new(0),
        }
    }

    fn entries(&self) -> MutexGuard<'_, Entries> {
        self.cleanups.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds `undo` to the list, or, once the list was run for an interrupt
    /// ([`Registry::close_and_run`]), hands it back: nobody would run it otherwise.
    fn try_register(
        &'static self,
        kind: Kind,
        name: String,
        undo: Action,
    ) -> Result<Registration, Action> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut entries = self.entries();
        if entries.closed {
            return Err(undo);
        }
        entries.list.push(Entry {
            id,
            kind,
            name,
            undo,
        });
        Ok(Registration { id, registry: self })
    }

    /// [`Registry::run`], and every later registration is refused.
    fn close_and_run(&self) -> Vec<Undone> {
        self.entries().closed = true;
        self.run()
    }

    fn run(&self) -> Vec<Undone> {
        let mut pending: Vec<Entry> = self.entries().list.drain(..).collect();
        // A stable sort keeps registration order within a kind.
        pending.sort_by_key(|e| e.kind);
        pending
            .into_iter()
            .filter_map(|e| {
                let (kind, name) = (e.kind, e.name);
                (e.undo)().then_some(Undone { kind, name })
            })
            .collect()
    }
}

/// The critical sections in progress, and whether new ones are refused (an interrupt).
struct Sections {
    busy: usize,
    closed: bool,
}

/// Counts the [`critical`] sections in progress; once closed, refuses new ones and lets the
/// closer wait for the others to end. The process has one; tests make their own.
struct Gate {
    sections: Mutex<Sections>,
    idle: Condvar,
}

impl Gate {
    const fn new() -> Self {
        Gate {
            sections: Mutex::new(Sections {
                busy: 0,
                closed: false,
            }),
            idle: Condvar::new(),
        }
    }

    fn sections(&self) -> MutexGuard<'_, Sections> {
        self.sections.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Enters a section, or `None` once the gate is closed.
    fn enter(&'static self) -> Option<Critical> {
        let mut sections = self.sections();
        if sections.closed {
            return None;
        }
        sections.busy += 1;
        Some(Critical { gate: self })
    }

    fn leave(&self) {
        let mut sections = self.sections();
        sections.busy -= 1;
        if sections.busy == 0 {
            self.idle.notify_all();
        }
    }

    /// Refuses new sections and waits until those in progress have ended, at most `limit`.
    /// Returns whether they all ended.
    fn close(&self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        let mut sections = self.sections();
        sections.closed = true;
        while sections.busy > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            sections = self
                .idle
                .wait_timeout(sections, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        true
    }
}

/// A [`critical`] section in progress; it ends when this value is dropped.
#[must_use = "the section ends when this value is dropped"]
pub struct Critical {
    gate: &'static Gate,
}

impl std::fmt::Debug for Critical {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Critical").finish_non_exhaustive()
    }
}

impl Drop for Critical {
    fn drop(&mut self) {
        self.gate.leave();
    }
}

/// The process's one registry: the pending cleanups, the critical sections, the interrupt
/// state and serve's hook.
struct State {
    registry: Registry,
    gate: Gate,
    interrupted: AtomicBool,
    signalled: AtomicBool,
    shutdown: OnceLock<Arc<tokio::sync::Notify>>,
}

static STATE: State = State {
    registry: Registry::new(),
    gate: Gate::new(),
    interrupted: AtomicBool::new(false),
    signalled: AtomicBool::new(false),
    shutdown: OnceLock::new(),
};

/// A registered cleanup; dropping it (or [`Registration::cancel`]) unregisters it without
/// running it.
#[must_use = "dropping the registration unregisters the cleanup at once"]
pub struct Registration {
    id: u64,
    registry: &'static Registry,
}

impl std::fmt::Debug for Registration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registration")
            .field("id", &self.id)
            .finish()
    }
}

impl Registration {
    /// Takes the cleanup off the list now (the owner is undoing the thing itself). Calling it
    /// again, or dropping afterwards, does nothing.
    pub fn cancel(&self) {
        self.registry.entries().list.retain(|e| e.id != self.id);
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.cancel();
    }
}

/// Registers `undo` to run if the process is interrupted before the returned
/// [`Registration`] is dropped. `undo` returns whether it succeeded; `name` says what it undoes
/// in [`Undone`] (a database name, a pid). Call it inside the [`critical`] section that
/// creates the thing.
///
/// Once the interrupt handler has run the registered cleanups, this runs `undo` at once and
/// never returns (the handler is exiting the process).
pub fn register(
    kind: Kind,
    name: impl Into<String>,
    undo: impl FnOnce() -> bool + Send + 'static,
) -> Registration {
    match STATE
        .registry
        .try_register(kind, name.into(), Box::new(undo))
    {
        Ok(registration) => registration,
        Err(undo) => {
            undo();
            park_forever()
        }
    }
}

/// Enters a critical section: creating something and registering its cleanup, or undoing it
/// and unregistering. The interrupt handler waits for the sections in progress (at most
/// [`CRITICAL_WAIT`]) before it runs the registered cleanups, so a thing is never half-made
/// or half-undone behind its back. The section ends when the value is dropped.
///
/// Once the process was interrupted this never returns: the handler is exiting the process,
/// and whatever the caller was about to create must not be created.
pub fn critical() -> Critical {
    STATE.gate.enter().unwrap_or_else(|| park_forever())
}

/// Runs every registered cleanup once, child services first, then scratch databases (each
/// kind in registration order), and empties the list for good: a later [`register`] runs its
/// cleanup at once and never returns. Returns those that succeeded. For an interrupt, after
/// the [`critical`] sections have ended: the owners' own cleanup will find nothing left to do.
pub fn run_registered() -> Vec<Undone> {
    STATE.registry.close_and_run()
}

/// Parks the calling thread for good: the process is being interrupted and will exit.
fn park_forever() -> ! {
    loop {
        std::thread::park();
    }
}

/// Whether the process was interrupted (the handler is cleaning up and will exit).
pub fn interrupted() -> bool {
    STATE.interrupted.load(Ordering::SeqCst)
}

/// Blocks forever when the process was interrupted: the handler is about to exit with
/// its interrupt code, and the main thread must not race it with another exit code. Returns
/// at once otherwise.
pub fn hold_if_interrupted() {
    while interrupted() {
        std::thread::park();
    }
}

/// Makes the next Ctrl-C or SIGTERM a graceful shutdown: the handler notifies the returned
/// value instead of exiting, and a second signal exits at once. For `serve`; call it once.
pub fn graceful_shutdown() -> Arc<tokio::sync::Notify> {
    STATE
        .shutdown
        .get_or_init(|| Arc::new(tokio::sync::Notify::new()))
        .clone()
}

/// The signals that end the process the way Ctrl-C does: SIGINT, SIGTERM and SIGHUP. The
/// exit status is 128 + the signal's number, as shells report it (130, 143, 129).
pub const ENDING_SIGNALS: [i32; 3] = [
    signal_hook::consts::SIGINT,
    signal_hook::consts::SIGTERM,
    signal_hook::consts::SIGHUP,
];

/// SIGPIPE's number: a closed output pipe ends the process as this signal would (exit 141),
/// cleaning up first ([`end_as`]); Rust ignores the signal itself, so a write meets `EPIPE`.
pub const SIGPIPE: i32 = signal_hook::consts::SIGPIPE;

/// What the process says on its way out of an interrupt (set by [`install_signal_handler`]).
type Report = Box<dyn Fn(&[Undone]) + Send + Sync>;
static REPORT: OnceLock<Report> = OnceLock::new();

/// Installs the process's handler of [`ENDING_SIGNALS`], a thread of its own: on a signal it
/// ends the process with [`end_as`] (cleanups run, `report` told what they undid, exit
/// 128 + the signal's number); after [`graceful_shutdown`], see there. `report` must not
/// block on a closed or full pipe (write with `let _ = writeln!(…)`, never `eprintln!`,
/// which panics on a closed stderr and would end the handler's thread).
///
/// Will return `Err` if the OS refuses the handler or its thread cannot start.
pub fn install_signal_handler(
    report: impl Fn(&[Undone]) + Send + Sync + 'static,
) -> std::io::Result<()> {
    let _ = REPORT.set(Box::new(report));
    let mut signals = signal_hook::iterator::Signals::new(ENDING_SIGNALS)?;
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            for signal in signals.forever() {
                end_as(signal);
            }
        })?;
    Ok(())
}

/// Ends the process as `signal` would, from any thread: marks it [`interrupted`], closes the
/// [`critical`] sections and waits for those in progress (at most [`CRITICAL_WAIT`]), runs the
/// registered cleanups ([`run_registered`]), tells the installed report what they undid and
/// exits with 128 + `signal`. A second caller while the first is cleaning up parks for good
/// (the first exits the process). After [`graceful_shutdown`] the first call only notifies
/// the server and returns; a second exits at once.
pub fn end_as(signal: i32) {
    let code = 128 + signal;
    if let Some(shutdown) = STATE.shutdown.get() {
        if STATE.signalled.swap(true, Ordering::SeqCst) {
            std::process::exit(code);
        }
        shutdown.notify_one();
        return;
    }
    if STATE.interrupted.swap(true, Ordering::SeqCst) {
        park_forever();
    }
    if !STATE.gate.close(CRITICAL_WAIT) {
        tracing::warn!(
            "a scratch database or service was still being created or removed after {:?}",
            CRITICAL_WAIT
        );
    }
    let undone = run_registered();
    if let Some(report) = REPORT.get() {
        report(&undone);
    }
    std::process::exit(code);
}

/// Writes `line` and a newline to stdout. When the reader is gone (`EPIPE`: `| head`, a closed
/// pipe) the process ends as SIGPIPE would, cleaning up first ([`end_as`]): nobody reads what
/// the run would say. Other write errors are ignored.
pub fn say(line: &str) {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    let wrote = writeln!(out, "{line}").and_then(|()| out.flush());
    drop(out);
    if let Err(e) = wrote {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            end_as(SIGPIPE);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    fn registry() -> &'static Registry {
        Box::leak(Box::new(Registry::new()))
    }

    impl Registry {
        fn register(&'static self, kind: Kind, name: String, undo: Action) -> Registration {
            self.try_register(kind, name, undo)
                .unwrap_or_else(|_| panic!("the registry is closed"))
        }
    }

    #[test]
    fn registered_cleanups_run_services_first_and_dropped_ones_never() {
        let registry = registry();
        let order = Arc::new(Mutex::new(Vec::new()));
        let push = |what: &'static str, ok: bool| -> Action {
            let order = Arc::clone(&order);
            Box::new(move || {
                order.lock().unwrap().push(what);
                ok
            })
        };
        let db = registry.register(Kind::ScratchDatabase, "tf_a".into(), push("db", true));
        let service = registry.register(Kind::ChildService, "42".into(), push("service", true));
        let failing =
            registry.register(Kind::ScratchDatabase, "tf_b".into(), push("failing", false));
        let gone = registry.register(Kind::ScratchDatabase, "tf_c".into(), push("gone", true));
        drop(gone);
        let undone = registry.run();
        assert_eq!(*order.lock().unwrap(), ["service", "db", "failing"]);
        let undone: Vec<(Kind, &str)> = undone.iter().map(|u| (u.kind, u.name.as_str())).collect();
        assert_eq!(
            undone,
            [(Kind::ChildService, "42"), (Kind::ScratchDatabase, "tf_a")]
        );
        assert!(registry.run().is_empty(), "each cleanup runs once");
        drop((db, service, failing));
    }

    #[test]
    fn a_cancelled_cleanup_does_not_run() {
        let registry = registry();
        let runs = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&runs);
        let r = registry.register(
            Kind::ChildService,
            "1".into(),
            Box::new(move || {
                counter.fetch_add(1, Ordering::SeqCst);
                true
            }),
        );
        r.cancel();
        r.cancel();
        assert!(registry.run().is_empty());
        assert_eq!(runs.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn a_closed_registry_hands_a_new_cleanup_back_instead_of_losing_it() {
        let registry = registry();
        let kept = registry.register(Kind::ScratchDatabase, "tf_a".into(), Box::new(|| true));
        assert_eq!(registry.close_and_run().len(), 1);
        let late = registry.try_register(Kind::ScratchDatabase, "tf_b".into(), Box::new(|| true));
        let undo = late.expect_err("a closed registry takes no new cleanup");
        assert!(undo(), "the caller gets the cleanup back to run");
        drop(kept);
    }

    #[test]
    fn closing_the_gate_waits_for_the_sections_in_progress_and_refuses_new_ones() {
        let gate: &'static Gate = Box::leak(Box::new(Gate::new()));
        let section = gate.enter().expect("an open gate lets a section in");
        let section_ended = AtomicBool::new(false);
        std::thread::scope(|s| {
            let closer = s.spawn(|| {
                let all_ended = gate.close(Duration::from_secs(60));
                (all_ended, section_ended.load(Ordering::SeqCst))
            });
            // The closer has closed the gate (and waits) before the section ends.
            while !gate.sections().closed {
                std::thread::yield_now();
            }
            assert!(gate.enter().is_none(), "a closed gate lets no section in");
            section_ended.store(true, Ordering::SeqCst);
            drop(section);
            let (all_ended, saw_the_end) = closer.join().unwrap();
            assert!(
                all_ended && saw_the_end,
                "close returned before the section ended"
            );
        });
    }

    #[test]
    fn closing_the_gate_gives_up_on_a_section_that_never_ends() {
        let gate: &'static Gate = Box::leak(Box::new(Gate::new()));
        let stuck = gate.enter().unwrap();
        assert!(!gate.close(Duration::from_millis(1)));
        drop(stuck);
        assert!(gate.close(Duration::ZERO), "no section left");
    }
}
