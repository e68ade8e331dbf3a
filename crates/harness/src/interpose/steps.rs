//! What the conductor knows of one step's text and of the faults aimed at steps: a step's
//! shape (its statement without literals), whether it only reads, whether it starts with a
//! fault's words, and which fault strikes at it ([`StepFault`], [`FaultSeen`]).

use std::time::Duration;

use serde::Serialize;

use super::hub::{Action, CutOutcome, SessionView, StoreKind};

/// Which step of a racer's first attempt a fault strikes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FaultStep {
    /// The n-th step (from 1) of the racer's first attempt, counting only the steps of the
    /// fault's store when it names one.
    Index(usize),
    /// The first step of the racer's first attempt one of whose statements (Redis: commands;
    /// a step of several is split at `; `) starts with these words, case-insensitively and at
    /// a word boundary: `COMMIT` matches `COMMIT` and `commit`, not `BEGIN … READ COMMITTED`.
    Match(String),
    /// The first step of the racer's first attempt of this shape ([`step_shape`]).
    Shape(String),
}

/// A cut at one step of one racer, for [`super::conduct::Conductor::run_with_faults`].
#[derive(Debug, Clone)]
pub struct StepFault {
    /// The racer (index in the wave).
    pub racer: usize,
    /// Which of its steps.
    pub at: FaultStep,
    /// Only this store's steps count (`None`: every interposed store's).
    pub store: Option<StoreKind>,
    /// [`Action::CutBefore`] or [`Action::CutAfter`].
    pub cut: Action,
    /// Whether the service serving the racer is killed at the step ([`super::conduct::Crash`]): frozen, the
    /// step cut, then killed and started again.
    pub kill: bool,
    /// A pause: the step is held at the proxy this long while the other racers go on, then
    /// forwarded (`cut` is then [`Action::Forward`]).
    pub hold: Option<Duration>,
    /// How the evidence names the fault (`cut after r-1's step matching "COMMIT"`).
    pub label: String,
}

/// What became of a [`StepFault`] in one wave.
#[derive(Debug, Clone, Serialize)]
pub struct FaultSeen {
    /// The fault's label.
    pub label: String,
    /// The racer (index in the wave).
    pub racer: usize,
    /// The cut.
    pub cut: Action,
    /// The step cut: its index (from 1) among the racer's counted first-attempt steps;
    /// `None` when the step never came.
    pub step: Option<usize>,
    /// Steps of the racer's first attempt that counted for this fault, up to the cut (all of
    /// them when the step never came).
    pub counted: usize,
    /// The shapes of those counted steps, in order ([`step_shape`]): the sweep's own
    /// bookkeeping, not written out (the wave's steps are).
    #[serde(skip)]
    pub counted_shapes: Vec<String>,
    /// Steps of the racer's first attempt on sessions tied to it by a guess (most often a
    /// connection the service's pool opened in the background): never counted, never cut.
    pub skipped: usize,
    /// The cut step's store.
    pub store: Option<StoreKind>,
    /// Its session.
    pub session: Option<u64>,
    /// Its statement or command.
    pub text: Option<String>,
    /// What the server did with it (`None`: the step never came, or its reply never came
    /// complete).
    pub outcome: Option<CutOutcome>,
    /// For a kill: which service was killed and how it came back, in words (`None`: no kill
    /// was made).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub killed: Option<String>,
    /// The same in words, for the report.
    pub result: String,
}

impl FaultSeen {
    /// What is seen of `fault` before its step comes: nothing struck, nothing cut.
    pub(crate) fn unstruck(fault: &StepFault) -> FaultSeen {
        FaultSeen {
            label: fault.label.clone(),
            racer: fault.racer,
            cut: fault.cut,
            step: None,
            counted: 0,
            counted_shapes: Vec::new(),
            skipped: 0,
            store: None,
            session: None,
            text: None,
            outcome: None,
            killed: None,
            result: "the step never came: nothing was cut".into(),
        }
    }

    /// Whether the fault struck.
    pub fn struck(&self) -> bool {
        self.step.is_some()
    }

    /// Whether the fault is on the racer named `racer`: its label
    /// ([`crate::blackbox::format::FaultSpec::describe`]) names it as `… {racer}'s step …`.
    pub(crate) fn is_on(&self, racer: &str) -> bool {
        self.label.contains(&format!(" {racer}'s "))
    }
}

/// Whether one of `text`'s statements (split at `; `) starts with the words of `pattern`,
/// case-insensitively, at a word boundary, runs of whitespace counting as one space.
pub fn step_matches(text: &str, pattern: &str) -> bool {
    let words = |s: &str| {
        s.split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
            .to_uppercase()
    };
    let want = words(pattern);
    if want.is_empty() {
        return false;
    }
    text.split("; ").any(|statement| {
        let have = words(statement);
        have.strip_prefix(&want).is_some_and(|rest| {
            rest.chars()
                .next()
                .map_or(true, |c| !(c.is_alphanumeric() || c == '_'))
        })
    })
}

/// A step's shape, to tell whether two runs took the same step at one step number:
/// PostgreSQL, the statement with every quoted literal and every run of digits replaced by
/// `?` and whitespace collapsed (a client that inlines its values, a savepoint numbered per
/// session, still has one shape per statement, as `pg_stat_statements` normalises); Redis,
/// the command names only (keys and values differ from run to run).
pub fn step_shape(store: StoreKind, text: &str) -> String {
    match store {
        StoreKind::Redis => text
            .split("; ")
            .map(|c| c.split_whitespace().next().unwrap_or("").to_uppercase())
            .collect::<Vec<_>>()
            .join("; "),
        StoreKind::Postgres => {
            let mut out = String::with_capacity(text.len());
            let mut chars = text.chars().peekable();
            while let Some(c) = chars.next() {
                match c {
                    '\'' => {
                        // A quoted literal, `''` inside it standing for one quote.
                        while let Some(q) = chars.next() {
                            if q == '\'' {
                                if chars.peek() == Some(&'\'') {
                                    chars.next();
                                } else {
                                    break;
                                }
                            }
                        }
                        out.push('?');
                    }
                    d if d.is_ascii_digit() => {
                        while chars.peek().is_some_and(char::is_ascii_digit) {
                            chars.next();
                        }
                        out.push('?');
                    }
                    w if w.is_whitespace() => {
                        while chars.peek().is_some_and(|x| x.is_whitespace()) {
                            chars.next();
                        }
                        out.push(' ');
                    }
                    other => out.push(other),
                }
            }
            out.trim().to_string()
        }
    }
}

/// What the server did with a cut step, in words.
pub(super) fn cut_result(cut: Action, outcome: Option<&CutOutcome>) -> String {
    match (cut, outcome) {
        (_, Some(CutOutcome::NeverForwarded)) => {
            "cut before forwarding: the connection was closed on both sides, the server never saw the step".into()
        }
        (_, Some(CutOutcome::Completed { tx_status, error })) => format!(
            "cut after the server completed it ({}): the client's connection was closed without the reply",
            match (error, tx_status) {
                (Some(e), _) => e.clone(),
                (None, Some(s)) => format!("transaction status {s}"),
                (None, None) => "ok".into(),
            }
        ),
        (Action::CutAfter, None) => {
            "cut after the server: its reply never came complete (the connection ended first)".into()
        }
        _ => "cut: no outcome recorded".into(),
    }
}

/// Whether a step of this shape ([`step_shape`]) only reads: a PostgreSQL `SELECT` that locks
/// no row (no `FOR UPDATE`/`FOR SHARE`) and calls no sequence or advisory-lock function, or a
/// Redis read command. A poll is such a step repeated.
pub fn read_only(store: StoreKind, shape: &str) -> bool {
    match store {
        StoreKind::Postgres => {
            let s = shape.trim_start().to_ascii_uppercase();
            s.starts_with("SELECT")
                && ![
                    "FOR UPDATE",
                    "FOR SHARE",
                    "FOR NO KEY UPDATE",
                    "FOR KEY SHARE",
                ]
                .iter()
                .any(|w| s.contains(w))
                && !["NEXTVAL", "SETVAL", "PG_ADVISORY", "PG_TRY_ADVISORY"]
                    .iter()
                    .any(|w| s.contains(w))
        }
        StoreKind::Redis => shape.split("; ").all(|c| {
            matches!(
                c,
                "GET"
                    | "MGET"
                    | "EXISTS"
                    | "HGET"
                    | "HMGET"
                    | "HGETALL"
                    | "HEXISTS"
                    | "TTL"
                    | "PTTL"
                    | "STRLEN"
                    | "TYPE"
                    | "SMEMBERS"
                    | "SISMEMBER"
                    | "SCARD"
                    | "LRANGE"
                    | "LLEN"
                    | "ZRANGE"
                    | "ZSCORE"
                    | "ZCARD"
            )
        }),
    }
}

/// Counts racer `chosen`'s step `view` for the faults on it (only steps of its first attempt
/// count: those before its retry starts, what its service sends after the answer included) and returns the fault that strikes at it, if any, recording
/// the strike in `seen`.
///
/// A step on a session tied to the racer by a guess (`guessed`) is not counted: it is
/// recorded as skipped, so that a connection the service opened in the background (a pool
/// refilling itself) never shifts the step numbers of the racer's own commands.
pub(super) fn strike(
    faults: &[StepFault],
    seen: &mut [FaultSeen],
    chosen: usize,
    retrying: bool,
    guessed: bool,
    view: &SessionView,
) -> Option<usize> {
    if retrying {
        return None;
    }
    let mut hit = None;
    for (j, f) in faults.iter().enumerate() {
        if f.racer != chosen || seen[j].struck() || f.store.is_some_and(|s| s != view.store) {
            continue;
        }
        if guessed {
            seen[j].skipped += 1;
            continue;
        }
        seen[j].counted += 1;
        let shape = step_shape(view.store, &view.step.text);
        let here = match &f.at {
            FaultStep::Index(k) => seen[j].counted == *k,
            FaultStep::Match(words) => step_matches(&view.step.text, words),
            FaultStep::Shape(wanted) => shape == *wanted,
        };
        seen[j].counted_shapes.push(shape);
        if here && hit.is_none() {
            hit = Some(j);
            let s = &mut seen[j];
            s.step = Some(s.counted);
            s.store = Some(view.store);
            s.session = Some(view.id);
            s.text = Some(view.step.text.clone());
            s.result = "cut: released, its outcome not yet seen".into();
        }
    }
    hit
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interpose::hub::Phase;

    #[test]
    fn a_step_shape_drops_literals_and_redis_arguments() {
        let pg = StoreKind::Postgres;
        assert_eq!(
            step_shape(pg, "INSERT INTO t VALUES ('a''b', 42,\n  'x')"),
            step_shape(pg, "INSERT INTO t VALUES ('zz', 7, 'y')")
        );
        assert_eq!(
            step_shape(pg, "SAVEPOINT sa_savepoint_1"),
            step_shape(pg, "SAVEPOINT sa_savepoint_12")
        );
        assert_ne!(
            step_shape(pg, "RELEASE SAVEPOINT s"),
            step_shape(pg, "COMMIT")
        );
        let redis = StoreKind::Redis;
        assert_eq!(
            step_shape(redis, "MULTI; SET tfv:a 1; EXEC"),
            step_shape(redis, "multi; set tfv:b 2; exec")
        );
        assert_ne!(step_shape(redis, "GET k"), step_shape(redis, "SET k v NX"));
    }

    #[test]
    fn a_step_matches_the_words_its_statement_starts_with() {
        assert!(step_matches("COMMIT", "commit"));
        assert!(step_matches("commit  and chain", "COMMIT AND CHAIN"));
        assert!(!step_matches(
            "BEGIN ISOLATION LEVEL READ COMMITTED",
            "COMMIT"
        ));
        assert!(!step_matches("COMMITTED", "COMMIT"), "a word boundary");
        assert!(step_matches("MULTI; SET k v; EXEC", "EXEC"));
        assert!(step_matches("SET tfv:rec:k1 {}", "SET tfv:rec"));
        assert!(!step_matches("SETNX k v", "SET"));
        assert!(!step_matches("COMMIT", "  "));
    }

    fn view(text: &str, store: StoreKind) -> SessionView {
        SessionView {
            id: 7,
            store,
            backend_pid: None,
            tx_status: None,
            phase: Phase::Held,
            step: super::super::hub::Step {
                text: text.into(),
                params: Vec::new(),
            },
            phase_us: 0,
            completed: 0,
            last_error: None,
            last_result: None,
            queued: 0,
        }
    }

    // Long because it plays three short sequences of steps through `strike` (a fault by index,
    // by words, and beside a session tied by a guess), each expectation beside its step; the
    // formatter spreads each call over several lines.
    #[test]
    fn a_fault_strikes_once_at_its_racers_first_attempt_step() {
        let fault = |at: FaultStep, store: Option<StoreKind>| StepFault {
            racer: 1,
            at,
            store,
            cut: Action::CutAfter,
            kill: false,
            hold: None,
            label: "f".into(),
        };
        let fresh = |faults: &[StepFault]| -> Vec<FaultSeen> {
            faults.iter().map(FaultSeen::unstruck).collect()
        };
        let pg = StoreKind::Postgres;
        // By index, counting only its racer's first-attempt steps of its store.
        let faults = [fault(FaultStep::Index(2), Some(pg))];
        let mut seen = fresh(&faults);
        assert_eq!(
            strike(&faults, &mut seen, 0, false, false, &view("BEGIN", pg)),
            None
        );
        assert_eq!(
            strike(
                &faults,
                &mut seen,
                1,
                false,
                false,
                &view("GET k", StoreKind::Redis)
            ),
            None
        );
        assert_eq!(
            strike(&faults, &mut seen, 1, false, false, &view("BEGIN", pg)),
            None
        );
        assert_eq!(
            strike(&faults, &mut seen, 1, false, false, &view("SELECT 1", pg)),
            Some(0)
        );
        assert_eq!(
            (seen[0].step, seen[0].text.as_deref()),
            (Some(2), Some("SELECT 1"))
        );
        assert_eq!(
            strike(&faults, &mut seen, 1, false, false, &view("COMMIT", pg)),
            None,
            "once"
        );
        // By words; a retry's steps (after the first answer) never count.
        let faults = [fault(FaultStep::Match("COMMIT".into()), None)];
        let mut seen = fresh(&faults);
        assert_eq!(
            strike(&faults, &mut seen, 1, true, false, &view("COMMIT", pg)),
            None
        );
        assert_eq!(
            strike(
                &faults,
                &mut seen,
                1,
                false,
                false,
                &view("BEGIN ISOLATION LEVEL READ COMMITTED", pg)
            ),
            None
        );
        assert_eq!(
            strike(&faults, &mut seen, 1, false, false, &view("COMMIT", pg)),
            Some(0)
        );
        assert_eq!(seen[0].counted, 2);
        // A step on a session tied by a guess is skipped, not counted: the racer's own
        // steps keep their numbers.
        let faults = [fault(FaultStep::Index(2), None)];
        let mut seen = fresh(&faults);
        assert_eq!(
            strike(&faults, &mut seen, 1, false, false, &view("BEGIN", pg)),
            None
        );
        assert_eq!(
            strike(
                &faults,
                &mut seen,
                1,
                false,
                true,
                &view("SELECT pg_backend_pid()", pg)
            ),
            None
        );
        assert_eq!(
            strike(&faults, &mut seen, 1, false, false, &view("COMMIT", pg)),
            Some(0)
        );
        assert_eq!((seen[0].counted, seen[0].skipped), (2, 1));
        assert_eq!(seen[0].counted_shapes, ["BEGIN", "COMMIT"]);
    }
}
