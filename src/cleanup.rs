//! What the process must undo when it is interrupted, and the Ctrl-C / SIGTERM handler that
//! undoes it: one registry for the whole process.
//!
//! Things that outlive a crash unless removed — scratch databases
//! ([`crate::store::postgres::ScratchDatabase`]) and the services a black-box run starts
//! ([`crate::target::service::Services`]) — [`register`] a cleanup while they exist and get a
//! [`Registration`] back; dropping it (or [`Registration::cancel`]) takes the cleanup off the
//! list, because the owner then undoes the thing itself. On a signal,
//! [`install_signal_handler`]'s handler runs what is still registered, services first (they
//! use the databases), and exits with [`EXIT_INTERRUPTED`].
//!
//! `ticketflow serve` stops differently: once [`graceful_shutdown`] was called, the first
//! signal only notifies the server (it finishes the requests in flight) and a second exits at
//! once.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

/// Exit code of a process ended by Ctrl-C or SIGTERM (128 + SIGINT's number, as shells do).
pub const EXIT_INTERRUPTED: i32 = 130;

/// What a cleanup undoes. On an interrupt cleanups run in this order: every child service,
/// then every scratch database.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// A child process (a service started for a black-box run) to stop.
    ChildService,
    /// A scratch database to drop.
    ScratchDatabase,
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

/// A list of pending cleanups. The process has one ([`register`], [`run_registered`]); tests
/// make their own.
struct Registry {
    cleanups: Mutex<Vec<Entry>>,
    next_id: AtomicU64,
}

impl Registry {
    const fn new() -> Self {
        Registry {
            cleanups: Mutex::new(Vec::new()),
            next_id: AtomicU64::new(0),
        }
    }

    fn entries(&self) -> MutexGuard<'_, Vec<Entry>> {
        self.cleanups.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn register(&'static self, kind: Kind, name: String, undo: Action) -> Registration {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.entries().push(Entry {
            id,
            kind,
            name,
            undo,
        });
        Registration { id, registry: self }
    }

    fn run(&self) -> Vec<Undone> {
        let mut pending: Vec<Entry> = self.entries().drain(..).collect();
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

/// The process's one registry: the pending cleanups, the interrupt state and serve's hook.
struct State {
    registry: Registry,
    interrupted: AtomicBool,
    signalled: AtomicBool,
    shutdown: OnceLock<Arc<tokio::sync::Notify>>,
}

static STATE: State = State {
    registry: Registry::new(),
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
        self.registry.entries().retain(|e| e.id != self.id);
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.cancel();
    }
}

/// Registers `undo` to run if the process is interrupted before the returned
/// [`Registration`] is dropped. `undo` returns whether it succeeded; `name` says what it undoes
/// in [`Undone`] (a database name, a pid).
pub fn register(
    kind: Kind,
    name: impl Into<String>,
    undo: impl FnOnce() -> bool + Send + 'static,
) -> Registration {
    STATE.registry.register(kind, name.into(), Box::new(undo))
}

/// Runs every registered cleanup once, child services first, then scratch databases (each
/// kind in registration order), and empties the list. Returns those that succeeded. For an
/// interrupt: the owners' own cleanup will find nothing left to do.
pub fn run_registered() -> Vec<Undone> {
    STATE.registry.run()
}

/// Whether the process was interrupted (the handler is cleaning up and will exit).
pub fn interrupted() -> bool {
    STATE.interrupted.load(Ordering::SeqCst)
}

/// Blocks forever when the process was interrupted: the handler is about to exit with
/// [`EXIT_INTERRUPTED`], and the main thread must not race it with another exit code. Returns
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

/// Installs the process's Ctrl-C / SIGTERM handler. On a signal it marks the process
/// [`interrupted`], runs the registered cleanups ([`run_registered`]), hands what it undid
/// to `report` and exits with [`EXIT_INTERRUPTED`]; after [`graceful_shutdown`], see there.
///
/// Will return `Err` if a handler is already installed or the OS refuses one.
pub fn install_signal_handler(
    report: impl Fn(&[Undone]) + Send + 'static,
) -> Result<(), ctrlc::Error> {
    ctrlc::set_handler(move || {
        if let Some(shutdown) = STATE.shutdown.get() {
            if STATE.signalled.swap(true, Ordering::SeqCst) {
                std::process::exit(EXIT_INTERRUPTED);
            }
            shutdown.notify_one();
            return;
        }
        STATE.interrupted.store(true, Ordering::SeqCst);
        report(&run_registered());
        std::process::exit(EXIT_INTERRUPTED);
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    fn registry() -> &'static Registry {
        Box::leak(Box::new(Registry::new()))
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
}
