//! The verdict of a black-box run: pure functions over what the clients saw and the counts.
//!
//! What never changes (docs/PROTOCOL.md §9): one intent (scope + key + body) → one business effect and one
//! id for every retry; another body under the key → refused; another scope with the same key →
//! its own result, never another scope's id or stored answer. Checks, in order:
//!
//! - `barrier`: every wave of two or more racers was released by a proven barrier;
//! - `answers`: every racer's final answer is classified (not an error, not still in
//!   progress after the retry phase) unless the racer expects that;
//! - `expected outcomes`: racers with `expect` ended with one of the allowed outcomes;
//! - `one effect per intent`: per (scope, key), exactly one `created` among final answers and
//!   every racer with the creator's body holds its id (replays marked), or one id across all
//!   2xx answers of one body (replays unmarked); other bodies got `conflict`. When a
//!   `[[fault]]` cut struck (after the server, or before a step that follows the commit), the
//!   creator's answer may be the one that was lost: no `created` is then allowed if the
//!   racers hold one id (the counts still count);
//! - `same answer`: replays equal the creator's answer (status, JSON body minus ignored
//!   pointers), when the scenario asks for it; a failure names the pointers that differ;
//! - `scope isolation`: no scope's answer carries an id, or a body, another scope got;
//! - `counts`: the count queries' values, of those that could be read;
//! - `counts read`: every count query could be read (a database or Redis gone mid-run, a
//!   timeout): like a barrier not reached, a count not read proves nothing either way;
//! - `key TTL` (with `[target] lock_ttl_ms`): no key is still answered "in progress" once the
//!   service's own lock TTL (plus [`TTL_MARGIN_MS`]) has passed after its wave;
//! - `after the kill` (with a `kind = "kill"` fault that struck): no key is still answered "in
//!   progress" once the lock TTL (or, without one, [`KILL_GRACE_MS`]) has passed
//!   after the wave in which the service was killed and restarted;
//! - `services up` (with services the runner started): none exited on its own (its status, the
//!   step after which it was seen, the end of its stderr);
//! - `fault` (with `[[fault]]`): every declared cut or kill struck at its step.
//!
//! An errored racer counts against every check that uses it; a check whose every problem is
//! about racers the `answers` check already failed is marked as following from it.
//!
//! The verdict: PASS when every check holds (its evidence line says "effects not counted"
//! when no count query checked the rows, and "Redis effects not counted" when the service
//! uses `redis_url` and no expected count runs in Redis); a barrier that was not reached makes the run
//! PENDING (the race was not run as declared) unless a check that holds whatever the
//! interleaving (scope isolation, one effect per intent, counts, same answer) failed on its
//! own; any other failure is a FAIL whose headline is the most specific failed check. A fault
//! whose step never came counts as the barrier does: nothing was cut, so the run was not run
//! as declared (PENDING) unless a check that holds without it failed.

use std::collections::{BTreeMap, BTreeSet};

use super::format::TargetScenario;
use super::history::binding;
use super::rules::AnswerKind;
use super::summary::group_answers;
use super::{Check, CountSeen, RacerRun, TargetEvidence, TargetRun};
use crate::oracle::json::{differing_pointers, without};
use crate::verdict::Verdict;

/// A problem a check found, and the racers it is about.
struct Problem {
    text: String,
    racers: Vec<String>,
}

fn problem(text: String, racers: &[&str]) -> Problem {
    Problem {
        text,
        racers: racers.iter().map(|s| s.to_string()).collect(),
    }
}

/// Builds a check from its problems; `errored` are the racers the `answers` check failed.
fn make(
    name: &'static str,
    problems: Vec<Problem>,
    ok: String,
    errored: &BTreeSet<String>,
) -> Check {
    let explained = problems
        .iter()
        .all(|p| !p.racers.is_empty() && p.racers.iter().all(|r| errored.contains(r)));
    let texts = problems.into_iter().map(|p| p.text).collect();
    let mut check = Check::of_problems(name, texts, ok);
    if !check.passed() && explained {
        check.follows_from = Some("answers");
    }
    check
}

/// The answer of a racer in a few words: `409 conflict`, `transport error: …`.
fn short(r: &RacerRun) -> String {
    let last = r.last();
    match &last.answer {
        Ok(a) => format!("{} {}", a.status, last.kind),
        Err(_) if last.kind == AnswerKind::Timeout => last
            .note
            .clone()
            .unwrap_or_else(|| "no answer in time".into()),
        Err(e) => format!("error: {e}"),
    }
}

/// Judges a finished run.
///
/// A scenario judged by the model (`[expect] model = true`) replaces the per-racer checks
/// (`answers`, `expected outcomes`, `one effect per intent`, `same answer`, `scope isolation`)
/// with `model`, and its `counts` (with `recounts`, the counts read after the settle time and
/// after `settle_after` waves) compare with the model's effects ([`super::history`]).
pub fn judge(
    scenario: &TargetScenario,
    racers: Vec<RacerRun>,
    mut counts: Vec<CountSeen>,
    mut recounts: Vec<super::history::Recount>,
    evidence: TargetEvidence,
) -> TargetRun {
    let mut checks = vec![barrier(&evidence)];
    if scenario.model.is_some() {
        checks.extend(super::history::model_checks(
            scenario,
            &racers,
            &mut counts,
            &mut recounts,
        ));
        let all: Vec<CountSeen> = counts
            .iter()
            .chain(recounts.iter().flat_map(|r| r.counts.iter()))
            .cloned()
            .collect();
        checks.extend(
            counts_check(&all)
                .into_iter()
                .flatten()
                .filter(|c| c.name == "counts read"),
        );
    } else {
        let (answers_check, errored) = answers(scenario, &racers);
        checks.push(answers_check);
        checks.extend(expected_outcomes(scenario, &racers, &errored));
        let lost_ack = lost_acknowledgement(&evidence);
        checks.push(one_effect(scenario, &racers, &errored, lost_ack));
        if scenario.target.replay.same_answer {
            checks.push(same_answer(scenario, &racers, &errored, lost_ack));
        }
        if let Some(c) = scope_isolation(&racers, &errored) {
            checks.push(c);
        }
        checks.extend(counts_check(&counts).into_iter().flatten());
        if counts
            .iter()
            .any(|c| c.counted.as_ref().is_ok_and(|v| *v < c.expected))
        {
            if let Some(c) = checks
                .iter_mut()
                .find(|c| c.name == "counts" && c.verdict == Verdict::Fail)
            {
                c.detail += &late_effect_note(scenario);
            }
        }
    }
    checks.extend(key_ttl(scenario, &evidence));
    checks.extend(after_the_kill(scenario, &racers, &evidence));
    checks.extend(services_up(&evidence));
    checks.extend(fault(scenario, &racers, &evidence));

    let answers = group_answers(scenario, &racers);
    let (verdict, reason, evidence_line) = verdict_of(scenario, &checks, &racers);
    // A request this machine could not send (no free descriptor or local port) leaves the
    // race incomplete: the FAIL it led to judges the machine, not the service.
    let (verdict, reason) = crate::shortage::judged(
        verdict,
        reason,
        racers
            .iter()
            .flat_map(|r| &r.attempts)
            .filter_map(|a| a.answer.as_ref().err().map(String::as_str)),
    );
    TargetRun {
        scenario: scenario.name.clone(),
        file: scenario.file.display().to_string(),
        verdict,
        reason,
        evidence_line,
        checks,
        racers,
        answers,
        counts,
        evidence: Some(evidence),
    }
}

/// The order in which a FAIL's headline picks its check: the most specific finding first.
/// A check that follows from another (its problems are all about errored racers) comes after
/// every check that stands on its own.
const HEADLINE_ORDER: [&str; 12] = [
    "services up",
    "model",
    "after the kill",
    "scope isolation",
    "one effect per intent",
    "counts",
    "key TTL",
    "same answer",
    "expected outcomes",
    "answers",
    "barrier",
    "fault",
];

/// The checks whose failure means the run was not run as declared (no barrier reached, no
/// fault injected): PENDING, unless a check of [`HOLDS_WITHOUT_BARRIER`] failed on its own.
const AS_DECLARED: [&str; 3] = ["barrier", "fault", "counts read"];

/// The checks a FAIL can rest on when the race could not be set up as declared: what the
/// answers and rows show whatever the interleaving was (a duplicate id seen anyway).
const HOLDS_WITHOUT_BARRIER: [&str; 8] = [
    "services up",
    "model",
    "after the kill",
    "scope isolation",
    "one effect per intent",
    "counts",
    "key TTL",
    "same answer",
];

/// The verdict of a judged run, its reason (the headline: the check [`HEADLINE_ORDER`] puts
/// first, or why the run is PENDING) and, for a PASS, its evidence line.
///
/// A barrier that was not reached (fewer requests seen waiting than racers, a request answered
/// before the release, requests that could not be held) means the race was not run as
/// declared: the run is PENDING with the barrier's reason, unless a check that holds without
/// the barrier failed on its own ([`HOLDS_WITHOUT_BARRIER`]), which is a FAIL.
fn verdict_of(
    scenario: &TargetScenario,
    checks: &[Check],
    racers: &[RacerRun],
) -> (Verdict, Option<String>, Option<String>) {
    let rank = |c: &&Check| {
        (
            c.follows_from.is_some(),
            HEADLINE_ORDER
                .iter()
                .position(|n| *n == c.name)
                .unwrap_or(HEADLINE_ORDER.len()),
        )
    };
    let mut failed: Vec<&Check> = checks.iter().filter(|c| !c.passed()).collect();
    failed.sort_by_key(rank);
    let headline = |c: &Check| format!("{}: {}", c.name, c.detail);
    let barrier = checks
        .iter()
        .find(|c| AS_DECLARED.contains(&c.name) && !c.passed());
    match (failed.first(), barrier) {
        (None, _) => (
            Verdict::Pass,
            None,
            Some(evidence_line(scenario, checks, racers)),
        ),
        (Some(_), Some(b)) => {
            let stands = failed
                .iter()
                .find(|c| c.follows_from.is_none() && HOLDS_WITHOUT_BARRIER.contains(&c.name));
            match stands {
                Some(c) => (Verdict::Fail, Some(headline(c)), None),
                None => {
                    let others: Vec<&str> = failed
                        .iter()
                        .filter(|c| c.name != b.name)
                        .map(|c| c.name)
                        .collect();
                    (
                        Verdict::Pending,
                        Some(format!(
                            "the race was not run as declared, nothing proven either way: {}{}",
                            headline(b),
                            if others.is_empty() {
                                String::new()
                            } else {
                                format!(
                                    " (also failed, not judged without it: {})",
                                    others.join(", ")
                                )
                            }
                        )),
                        None,
                    )
                }
            }
        }
        (Some(first), None) => (Verdict::Fail, Some(headline(first)), None),
    }
}

/// How long after the service's stated lock TTL a key may still be answered "in progress"
/// before the `key TTL` check fails, milliseconds: room for the retry's own round trip and a
/// service's expiry sweep.
pub const TTL_MARGIN_MS: u64 = 1000;

/// How long after a wave with a kill a racer still answered "in progress" keeps retrying when
/// the file declares no `lock_ttl_ms`, milliseconds (the TTL margin comes on top): the requests
/// that were in flight have long finished by then.
pub const KILL_GRACE_MS: u64 = 2000;

/// With `[target] lock_ttl_ms`: every racer still answered "in progress" after its wave was
/// answered otherwise before the TTL plus [`TTL_MARGIN_MS`] passed.
fn key_ttl(scenario: &TargetScenario, evidence: &TargetEvidence) -> Option<Check> {
    let ttl = scenario.target.lock_ttl_ms?;
    let none = BTreeSet::new();
    let problems = evidence
        .ttl_waits
        .iter()
        .filter(|w| !w.answered)
        .map(|w| {
            problem(
                format!(
                    "key left in progress past its TTL: {}'s key {} still answered in progress {} ms after its wave ({} tries; lock_ttl_ms = {ttl} + {TTL_MARGIN_MS} ms margin)",
                    w.racer, w.wire_key, w.waited_ms, w.attempts
                ),
                &[],
            )
        })
        .collect();
    let ok = if evidence.ttl_waits.is_empty() {
        format!("no key was left in progress after its wave (lock_ttl_ms = {ttl})")
    } else {
        evidence
            .ttl_waits
            .iter()
            .map(|w| {
                format!(
                    "{}'s key answered {} {} ms after its wave, within lock_ttl_ms = {ttl} + {TTL_MARGIN_MS} ms",
                    w.racer, w.last, w.waited_ms
                )
            })
            .collect::<Vec<_>>()
            .join("; ")
    };
    Some(make("key TTL", problems, ok, &none))
}

/// What a count below its expected value may mean: an effect written after the counts were
/// read. Counts are read once the last wave ended: with the interposer, `after_answer_ms`
/// after the last answer; otherwise right after it.
fn late_effect_note(scenario: &TargetScenario) -> String {
    match &scenario.schedule {
        Some(s) => format!(
            " (counted once the last wave ended, {} ms after its last answer ([schedule] after_answer_ms): an effect the service writes later, such as an outbox flushed in the background, is not counted; if it is late by design, raise after_answer_ms above that delay)",
            s.after_answer_ms
        ),
        None => " (counted right after the last wave's answers: an effect the service writes later, such as an outbox flushed in the background, is not counted)".into(),
    }
}

/// With services the runner started: none exited on its own during the run (a kill fault's
/// own kill is not an exit). A service that dies when its store connection is cut, or on a
/// request, is a crash the client only sees as a refused connection; this names it, with its
/// exit status, where in the wave it was seen and the end of its stderr.
fn services_up(evidence: &TargetEvidence) -> Option<Check> {
    if evidence.services.is_empty() {
        return None;
    }
    let none = BTreeSet::new();
    let problems = evidence
        .waves
        .iter()
        .flat_map(|w| {
            w.service_exits
                .iter()
                .map(move |e| problem(format!("wave {}: {e}", w.wave), &[]))
        })
        .collect();
    Some(make(
        "services up",
        problems,
        format!(
            "the {} service(s) the runner started stayed up (a kill fault's own kills aside)",
            evidence.services.len()
        ),
        &none,
    ))
}

/// With a `kind = "kill"` fault that struck: no racer's key was left "in progress" by the
/// crash. A key the killed process had claimed must accept a retry at once (the claim died
/// with the process, as a transaction does) or, with `[target] lock_ttl_ms`, within that TTL
/// (the runner retried until it passed, plus [`TTL_MARGIN_MS`]); a racer whose last answer is
/// still "in progress" is a key stuck by the crash.
fn after_the_kill(
    scenario: &TargetScenario,
    racers: &[RacerRun],
    evidence: &TargetEvidence,
) -> Option<Check> {
    let kills: Vec<&str> = evidence
        .waves
        .iter()
        .filter_map(|w| w.schedule.as_ref())
        .flat_map(|s| s.faults.iter())
        .filter(|f| f.struck())
        .filter_map(|f| f.killed.as_deref())
        .collect();
    if kills.is_empty() {
        return None;
    }
    let none = BTreeSet::new();
    let ttl = match scenario.target.lock_ttl_ms {
        Some(ms) => format!("the service's TTL is {ms} ms (lock_ttl_ms)"),
        None => format!(
            "the file declares no lock_ttl_ms, so the key had to accept a retry within {} ms once the wave ended (declare the service's lock TTL if it has one)",
            KILL_GRACE_MS
        ),
    };
    let problems = racers
        .iter()
        .filter(|r| r.kind() == AnswerKind::InProgress)
        .map(|r| {
            let first = r
                .attempts
                .iter()
                .find(|a| a.kind == AnswerKind::InProgress)
                .map_or(0, |a| a.started_us);
            let stuck_ms = r.last().finished_us.saturating_sub(first) / 1000;
            problem(
                format!(
                    "key stuck in progress for {stuck_ms} ms after the kill: {}'s key {} still answered in progress after {} attempt(s); {ttl}",
                    r.name,
                    r.wire_key,
                    r.attempts.len()
                ),
                &[],
            )
        })
        .collect();
    Some(make(
        "after the kill",
        problems,
        format!(
            "no key was left in progress by the kill ({})",
            kills.join("; ")
        ),
        &none,
    ))
}

/// The words the `fault` check adds to a cut the service never saw: its racer's first attempt
/// was answered as if nothing had happened.
pub const ABSORBED: &str = "absorbed below the service";

/// Whether a struck cut of `racer` never reached what the client sees: the racer's first
/// attempt was answered created or replayed (no error, no 5xx, no "in progress"), as if
/// nothing had happened. A store client that resends a command whose reply was lost on a new
/// connection (ioredis, redis-rb), or a service that retries it itself, hides the fault from
/// the request; the run then says nothing about how the service handles it.
fn absorbed(racer: Option<&RacerRun>) -> Option<String> {
    let first = racer?.attempts.first()?;
    matches!(first.kind, AnswerKind::Created | AnswerKind::Replayed).then(|| {
        format!(
            "; {ABSORBED}: {}'s first attempt was answered {} as if nothing had happened (its store client resent the command on a new connection, or the service retried it itself): not counted as fault coverage",
            racer.map_or("?", |r| r.name.as_str()),
            first.kind
        )
    })
}

/// With `[[fault]]`: every declared cut struck (what the server did with the step), or the
/// step never came (the service took another path: nothing was cut). A cut the request never
/// felt is stated as [`ABSORBED`].
fn fault(
    scenario: &TargetScenario,
    racers: &[RacerRun],
    evidence: &TargetEvidence,
) -> Option<Check> {
    if scenario.faults.is_empty() {
        return None;
    }
    let none = BTreeSet::new();
    let seen: Vec<&crate::interpose::steps::FaultSeen> = evidence
        .waves
        .iter()
        .filter_map(|w| w.schedule.as_ref())
        .flat_map(|s| s.faults.iter())
        .collect();
    let mut problems = Vec::new();
    let mut struck = Vec::new();
    for f in &scenario.faults {
        let racer = &scenario.racers[f.racer].name;
        // The conductor's label starts with the fault's own words; a sweep's names its step.
        let mine = seen.iter().find(|s| s.is_on(racer));
        match mine {
            Some(s) if s.struck() => struck.push(format!(
                "{}: step {} ({}) {}{}{}{}",
                s.label,
                s.step.unwrap_or_default(),
                s.text.as_deref().unwrap_or(""),
                s.result,
                s.killed
                    .as_ref()
                    .map(|k| format!("; {k}"))
                    .unwrap_or_default(),
                // A pause delays the request and a kill answers nothing: only a cut can be
                // hidden from the client by a resend.
                if f.kind == crate::blackbox::format::FaultKind::Cut {
                    absorbed(racers.iter().find(|r| r.name == *racer)).unwrap_or_default()
                } else {
                    String::new()
                },
                skipped_note(s.skipped)
            )),
            Some(s) => problems.push(problem(
                format!(
                    "{}: the step never came ({racer}'s first attempt had {} counted step(s){}): the service took another path, nothing was cut{}",
                    s.label,
                    s.counted,
                    skipped_note(s.skipped),
                    unowned_note(evidence)
                ),
                &[],
            )),
            None => problems.push(problem(
                format!(
                    "{} ({}): its wave was not conducted, nothing was cut",
                    f.describe(scenario, &f.at),
                    f.origin
                ),
                &[],
            )),
        }
    }
    Some(make("fault", problems, struck.join("; "), &none))
}

/// When steps no racer could own were released unscheduled in the run: one of them may have
/// been the fault's step (a write sent after the answer while another racer was in flight, or
/// later than `after_answer_ms`).
fn unowned_note(evidence: &TargetEvidence) -> String {
    let unowned: usize = evidence
        .waves
        .iter()
        .filter_map(|w| w.schedule.as_ref())
        .map(|s| s.unowned)
        .sum();
    if unowned == 0 {
        String::new()
    } else {
        format!(
            " (or it came on a session no racer could own: {unowned} such step(s) were released unscheduled, e.g. a write sent after the answer while another racer was in flight, or later than [schedule] after_answer_ms)"
        )
    }
}

/// `; N step(s) on sessions tied by a guess not counted` when `skipped` is above 0.
fn skipped_note(skipped: usize) -> String {
    if skipped == 0 {
        String::new()
    } else {
        format!("; {skipped} step(s) on sessions tied to the racer by a guess not counted")
    }
}

/// The barrier of every wave of two or more racers: its problem, else what was seen.
fn barrier(evidence: &TargetEvidence) -> Check {
    let none = BTreeSet::new();
    let barriered: Vec<_> = evidence
        .waves
        .iter()
        .filter(|w| w.barrier != "none")
        .collect();
    let problems: Vec<Problem> = barriered
        .iter()
        .filter_map(|w| {
            w.problem
                .as_ref()
                .map(|p| problem(format!("wave {}: {p}", w.wave), &[]))
        })
        .collect();
    let seen: Vec<String> = barriered
        .iter()
        .map(|w| match (&w.held, w.lock_statement.is_some()) {
            _ if w.blocked_writers.is_some() => format!(
                "wave {}: {} requests seen blocked on a write in Redis ({}) under {}, then released by CLIENT UNPAUSE: {}",
                w.wave,
                w.blocked_writers.as_ref().map_or(0, Vec::len),
                super::pause::commands(w.blocked_writers.as_deref().unwrap_or_default()),
                w.lock_statement.as_deref().unwrap_or("CLIENT PAUSE … WRITE"),
                super::format::PROVES
            ),
            (Some(h), _) => format!(
                "wave {}: {h} requests held open (all but their last byte written), then released together; no server-side proof",
                w.wave
            ),
            (None, true) => format!(
                "wave {}: {} requests seen waiting ({}) blocked by the controller",
                w.wave,
                w.waits.len(),
                w.waits
                    .first()
                    .map(|x| format!("{}, {}", x.wait_event, x.mode))
                    .unwrap_or_default()
            ),
            (None, false) => match &w.schedule {
                Some(sc) if sc.points.is_empty() => format!(
                    "wave {}: {} requests each held at the interposer at its first store command, then released together and run free",
                    w.wave, w.racers
                ),
                Some(sc) => format!(
                    "wave {}: {} requests each held at the interposer at its first store command, then {} steps released one at a time ({} not quiescent{}{})",
                    w.wave,
                    w.racers,
                    sc.steps.len(),
                    sc.nonquiescent,
                    if sc.guessed > 0 {
                        format!("; {} session(s) tied to a racer by a guess", sc.guessed)
                    } else {
                        String::new()
                    },
                    if sc.unowned > 0 {
                        format!("; {} step(s) no racer could own, released unscheduled", sc.unowned)
                    } else {
                        String::new()
                    }
                ),
                None => format!("wave {}: sent as is", w.wave),
            },
        })
        .collect();
    make(
        "barrier",
        problems,
        if seen.is_empty() {
            "no wave of two or more racers".into()
        } else {
            seen.join("; ")
        },
        &none,
    )
}

/// Every racer got a classified final answer (an error or "in progress" only where the
/// racer expects it). Returns the check and the racers it failed.
fn answers(scenario: &TargetScenario, racers: &[RacerRun]) -> (Check, BTreeSet<String>) {
    let none = BTreeSet::new();
    let mut errored = BTreeSet::new();
    let mut problems = Vec::new();
    for r in racers {
        let k = r.kind();
        let bad = matches!(
            k,
            AnswerKind::Error | AnswerKind::InProgress | AnswerKind::Timeout
        ) && !r.expect_allows(scenario, k);
        if bad {
            errored.insert(r.name.clone());
            let why = match (k, r.attempts.len()) {
                (AnswerKind::InProgress, n) => format!(
                    "{}: still in progress after {n} attempt(s) (the retry phase gave up)",
                    r.name
                ),
                (AnswerKind::Timeout, _) => format!("{}: {}", r.name, short(r)),
                _ => format!(
                    "{}: {}{}",
                    r.name,
                    short(r),
                    r.last()
                        .note
                        .as_ref()
                        .map(|n| format!(" ({n})"))
                        .unwrap_or_default()
                ),
            };
            problems.push(problem(why, &[]));
        }
    }
    let retried = racers.iter().filter(|r| r.attempts.len() > 1).count();
    let check = make(
        "answers",
        problems,
        format!(
            "all {} racers got a classified final answer{}",
            racers.len(),
            if retried > 0 {
                format!(" ({retried} after retries)")
            } else {
                String::new()
            }
        ),
        &none,
    );
    (check, errored)
}

/// The racers with expected outcomes got one of them, when any racer has expectations.
fn expected_outcomes(
    scenario: &TargetScenario,
    racers: &[RacerRun],
    errored: &BTreeSet<String>,
) -> Option<Check> {
    let expecting: Vec<&RacerRun> = racers
        .iter()
        .filter(|r| !racer_of(scenario, r).expect.is_empty())
        .collect();
    if expecting.is_empty() {
        return None;
    }
    // Unmarked replays cannot be told from creates: "created" and "replayed" are one outcome
    // there, and `one effect per intent` holds them to one id.
    let unmarked = !scenario.target.replay.marked;
    let allowed = |r: &RacerRun| {
        let expect = &racer_of(scenario, r).expect;
        let k = r.kind();
        expect.contains(&k)
            || (unmarked
                && k.has_resource()
                && (expect.contains(&AnswerKind::Created)
                    || expect.contains(&AnswerKind::Replayed)))
    };
    let problems = expecting
        .iter()
        .filter(|r| !allowed(r))
        .map(|r| {
            problem(
                format!(
                    "{}: expected {}, got {}",
                    r.name,
                    racer_of(scenario, r)
                        .expect
                        .iter()
                        .map(|k| k.name())
                        .collect::<Vec<_>>()
                        .join(" or "),
                    short(r)
                ),
                &[&r.name],
            )
        })
        .collect();
    Some(make(
        "expected outcomes",
        problems,
        format!("{} racers as expected", expecting.len()),
        errored,
    ))
}

/// The scenario's count queries against what they expect, when it has any.
fn counts_check(counts: &[CountSeen]) -> Option<Vec<Check>> {
    let none = BTreeSet::new();
    if counts.is_empty() {
        return None;
    }
    // A count that could not be read (the database or Redis gone, a statement timeout) proves
    // nothing either way: it is its own check, `counts read`, which makes the run PENDING
    // unless a check that holds without it fails. `counts` judges the counts that were read.
    let unread: Vec<Problem> = counts
        .iter()
        .filter_map(|c| match &c.counted {
            Err(e) => Some(problem(format!("{}{}: {e}", c.name, binding(c)), &[])),
            Ok(_) => None,
        })
        .collect();
    let problems = counts
        .iter()
        .filter(|c| c.counted.as_ref().is_ok_and(|v| *v != c.expected))
        .map(|c| {
            problem(
                format!(
                    "{}{}: expected {}, {}",
                    c.name,
                    binding(c),
                    c.expected,
                    match &c.counted {
                        Ok(v) => format!("counted {v}"),
                        Err(e) => e.clone(),
                    }
                ),
                &[],
            )
        })
        .collect();
    let seen: Vec<String> = counts
        .iter()
        .map(|c| {
            format!(
                "{}{} = {}",
                c.name,
                binding(c),
                c.counted
                    .as_ref()
                    .map(|v| v.to_string())
                    .unwrap_or_else(|e| e.clone())
            )
        })
        .collect();
    let mut checks = vec![make("counts", problems, seen.join(", "), &none)];
    if !unread.is_empty() {
        checks.push(make("counts read", unread, String::new(), &none));
    }
    Some(checks)
}

fn racer_of<'s>(scenario: &'s TargetScenario, r: &RacerRun) -> &'s super::format::TargetRacer {
    scenario
        .racers
        .iter()
        .find(|x| x.name == r.name)
        .expect("records come from the scenario's racers")
}

impl RacerRun {
    fn expect_allows(&self, scenario: &TargetScenario, k: AnswerKind) -> bool {
        racer_of(scenario, self).expect.contains(&k)
    }
}

/// The words a PASS carries when replays were not compared with the first answer
/// (`same_answer = false`): a replay re-rendered with a field changed passes unseen.
pub const ANSWERS_NOT_COMPARED: &str =
    "answers not compared (same_answer = false: a replay that differs from the first answer is unobserved)";

/// The words a PASS carries when no count query checked the rows: extra rows behind one
/// returned id would not have been seen.
pub(crate) const EFFECTS_NOT_COUNTED: &str =
    "effects not counted (no [[expect.counts]]: extra rows behind one returned id are unobserved)";

/// The words a PASS carries when the service uses Redis (`[target] redis_url`) and no
/// expected count runs there: effects kept in Redis (a second order behind one id) would not
/// have been seen.
pub const REDIS_EFFECTS_NOT_COUNTED: &str = "Redis effects not counted (redis_url is set and no [[expect.counts]] names a Redis count: a second effect kept in Redis behind one returned id is unobserved)";

/// Whether an expected count runs in Redis.
fn counts_in_redis(scenario: &TargetScenario) -> bool {
    if scenario.model.is_some() {
        return scenario.target.counts.iter().any(|q| q.redis.is_some());
    }
    scenario.counts.iter().any(|e| {
        e.values.keys().any(|name| {
            scenario
                .target
                .counts
                .iter()
                .any(|q| &q.name == name && q.redis.is_some())
        })
    })
}

/// PASS in one line: the barrier, then the final outcomes, then what the counts saw (or that
/// nothing counted the effects, in PostgreSQL or in Redis).
fn evidence_line(scenario: &TargetScenario, checks: &[Check], racers: &[RacerRun]) -> String {
    let mut by_kind: BTreeMap<AnswerKind, usize> = BTreeMap::new();
    for r in racers {
        *by_kind.entry(r.kind()).or_default() += 1;
    }
    let outcomes: Vec<String> = by_kind.iter().map(|(k, n)| format!("{n} {k}")).collect();
    let retried = racers.iter().filter(|r| r.attempts.len() > 1).count();
    let mut counted = match checks.iter().find(|c| c.name == "counts") {
        Some(c) if !scenario.counts.is_empty() || scenario.model.is_some() => {
            format!("counts: {}", c.detail)
        }
        _ => EFFECTS_NOT_COUNTED.to_string(),
    };
    if !scenario.target.replay.same_answer {
        counted.push_str("; ");
        counted.push_str(ANSWERS_NOT_COMPARED);
    }
    if scenario.target.redis_url.is_some() && !counts_in_redis(scenario) {
        counted.push_str("; ");
        counted.push_str(REDIS_EFFECTS_NOT_COUNTED);
    }
    format!(
        "{}; final answers: {}{}; {counted}",
        checks[0].detail,
        outcomes.join(", "),
        if retried > 0 {
            format!(" ({retried} after retries)")
        } else {
            String::new()
        }
    )
}

/// Per (scope, key): one effect, one id for the winning body, conflicts for the others.
fn one_effect(
    scenario: &TargetScenario,
    racers: &[RacerRun],
    errored: &BTreeSet<String>,
    lost_ack: bool,
) -> Check {
    let marked = scenario.target.replay.marked;
    let mut by_key: BTreeMap<(Option<String>, String), Vec<&RacerRun>> = BTreeMap::new();
    for r in racers {
        // A racer that expects only a refusal (rejected, or a 422 a preset reads as conflict)
        // sends a request that never was an intent; the counts see whether it wrote anything.
        let expect = &racer_of(scenario, r).expect;
        if !expect.is_empty()
            && expect
                .iter()
                .all(|k| matches!(k, AnswerKind::Rejected | AnswerKind::Conflict))
        {
            continue;
        }
        by_key
            .entry((r.scope.clone(), r.wire_key.clone()))
            .or_default()
            .push(r);
    }
    let mut problems = Vec::new();
    for ((scope, _), group) in &by_key {
        let label = format!(
            "{}key {}",
            scope
                .as_ref()
                .map(|s| format!("scope {s}, "))
                .unwrap_or_default(),
            group[0].key
        );
        no_answer_or_rejected(&label, group, errored, &mut problems);
        let marks = Marks { marked, lost_ack };
        let Some(winner_body) = winner_body(&label, group, marks, errored, &mut problems) else {
            continue;
        };
        against_winner(&label, group, &winner_body, errored, &mut problems);
    }
    make(
        "one effect per intent",
        problems,
        format!(
            "{} key(s): {}; other bodies conflict",
            by_key.len(),
            if marked {
                "one created each, same-body racers hold its id"
            } else {
                "replays unmarked: one id across each key's same-body 2xx answers"
            }
        ),
        errored,
    )
}

/// A racer of one key's `group` with no final answer, or rejected, is a problem.
fn no_answer_or_rejected(
    label: &str,
    group: &[&RacerRun],
    errored: &BTreeSet<String>,
    problems: &mut Vec<Problem>,
) {
    for r in group.iter().filter(|r| errored.contains(&r.name)) {
        problems.push(problem(
            format!("{label}: {} has no final answer ({})", r.name, short(r)),
            &[&r.name],
        ));
    }
    for r in group.iter().filter(|r| r.kind() == AnswerKind::Rejected) {
        problems.push(problem(
            format!("{label}: {} was rejected ({})", r.name, short(r)),
            &[&r.name],
        ));
    }
}

/// How replays are told apart in one run: marked ([`super::format::ReplaySpec::marked`]), and
/// whether a cut after the server struck ([`lost_acknowledgement`]).
#[derive(Debug, Clone, Copy)]
struct Marks {
    marked: bool,
    lost_ack: bool,
}

/// Whether a `[[fault]]` cut struck in this run: a request's answer may have been lost after
/// its effect was committed, so its creator's "created" was never seen. A cut after the server
/// loses it at the cut step itself (a `COMMIT`); a cut before a step the service sends after
/// its commit (a bookkeeping `UPDATE`, a cache write) loses it just the same, so either kind
/// counts.
fn lost_acknowledgement(evidence: &TargetEvidence) -> bool {
    evidence
        .waves
        .iter()
        .filter_map(|w| w.schedule.as_ref())
        .flat_map(|s| s.faults.iter())
        .any(|f| f.struck())
}

/// The body that won one key: the creator's when replays are marked (exactly one creator
/// expected), else the body of the 2xx answers (exactly one expected). `None` when none won.
fn winner_body(
    label: &str,
    group: &[&RacerRun],
    marks: Marks,
    errored: &BTreeSet<String>,
    problems: &mut Vec<Problem>,
) -> Option<String> {
    let Marks { marked, lost_ack } = marks;
    // The winning body: the creator's (marked), or the body of the 2xx answers.
    let resource: Vec<&&RacerRun> = group.iter().filter(|r| r.kind().has_resource()).collect();
    let creators: Vec<&&RacerRun> = group
        .iter()
        .filter(|r| r.kind() == AnswerKind::Created)
        .collect();
    if marked {
        // A cut after the server may have taken the creator's answer: then no racer saw
        // "created", and the replays alone show the one effect (one id, the counts).
        if creators.is_empty() && lost_ack && !resource.is_empty() {
            return resource.first().map(|r| r.intent_sha256.clone());
        }
        if creators.len() != 1 {
            let names: Vec<&str> = creators.iter().map(|r| r.name.as_str()).collect();
            let errs = errored_in(group, errored);
            problems.push(problem(
                format!(
                    "{label}: {} racers got created{}, expected exactly 1{}",
                    creators.len(),
                    if names.is_empty() {
                        String::new()
                    } else {
                        format!(" ({})", names.join(", "))
                    },
                    unmarked_hint(&creators)
                ),
                // Zero creators is explained by errors only if some racer errored.
                if creators.is_empty() && !errs.is_empty() {
                    &errs
                } else {
                    &[]
                },
            ));
        }
        creators.first().map(|c| c.intent_sha256.clone())
    } else {
        let bodies: BTreeSet<&str> = resource.iter().map(|r| r.intent_sha256.as_str()).collect();
        if bodies.len() > 1 {
            problems.push(problem(
                format!(
                    "{label}: {} different bodies got a 2xx answer under one key",
                    bodies.len()
                ),
                &[],
            ));
        }
        if resource.is_empty() {
            let errs = errored_in(group, errored);
            problems.push(problem(
                format!("{label}: no racer got a 2xx answer with an id"),
                &errs,
            ));
        }
        resource.first().map(|r| r.intent_sha256.clone())
    }
}

/// When two or more `created` answers of one intent all hold one id, the service most likely
/// replays without marking the replay (no header, the create's status): says so and names
/// the setting that judges such replays by their id. Empty otherwise.
fn unmarked_hint(creators: &[&&RacerRun]) -> String {
    let ids: BTreeSet<Option<&str>> = creators.iter().map(|r| r.id()).collect();
    match (creators.len(), ids.iter().next()) {
        (2.., Some(Some(id))) if ids.len() == 1 => format!(
            "; every one of them holds id {id}: if the service does not mark its replays (no \
             header, the create's status), set marked = false under [target.replay] and the check \
             becomes one id per intent"
        ),
        _ => String::new(),
    }
}

/// Against the winning body of one key: one id for it, its senders hold a resource, other
/// bodies conflict.
fn against_winner(
    label: &str,
    group: &[&RacerRun],
    winner_body: &str,
    errored: &BTreeSet<String>,
    problems: &mut Vec<Problem>,
) {
    let winner_ids: BTreeSet<&str> = group
        .iter()
        .filter(|r| r.intent_sha256 == winner_body && r.kind().has_resource())
        .filter_map(|r| r.id())
        .collect();
    if winner_ids.len() > 1 {
        problems.push(problem(
            format!(
                "{label}: the same request got {} different ids ({}): more than one effect",
                winner_ids.len(),
                winner_ids.iter().copied().collect::<Vec<_>>().join(", ")
            ),
            &[],
        ));
    }
    for r in group.iter().filter(|r| !errored.contains(&r.name)) {
        let same_body = r.intent_sha256 == winner_body;
        match (same_body, r.kind()) {
            (true, k) if k.has_resource() => {}
            (true, AnswerKind::Rejected) => {}
            (true, _) => problems.push(problem(
                format!(
                    "{label}: {} sent the winning body but got {}",
                    r.name,
                    short(r)
                ),
                &[&r.name],
            )),
            (false, AnswerKind::Conflict) => {}
            (false, AnswerKind::Rejected) => {}
            (false, _) => problems.push(problem(
                format!(
                    "{label}: {} sent another body but got {}{}",
                    r.name,
                    short(r),
                    r.id().map(|i| format!(" with id {i}")).unwrap_or_default()
                ),
                &[&r.name],
            )),
        }
    }
}

/// The names of `group`'s racers that the `answers` check failed.
fn errored_in<'a>(group: &[&'a RacerRun], errored: &BTreeSet<String>) -> Vec<&'a str> {
    group
        .iter()
        .filter(|r| errored.contains(&r.name))
        .map(|r| r.name.as_str())
        .collect()
}

/// Replays equal the creator's answer (status and body, ignored pointers aside).
fn same_answer(
    scenario: &TargetScenario,
    racers: &[RacerRun],
    errored: &BTreeSet<String>,
    lost_ack: bool,
) -> Check {
    let ignore = &scenario.target.replay.ignore;
    let marked = scenario.target.replay.marked;
    let mut by_key: BTreeMap<(Option<String>, String), Vec<&RacerRun>> = BTreeMap::new();
    for r in racers.iter().filter(|r| r.kind().has_resource()) {
        by_key
            .entry((r.scope.clone(), r.wire_key.clone()))
            .or_default()
            .push(r);
    }
    let mut problems = Vec::new();
    let mut compared = 0;
    for group in by_key.values() {
        // The original: the creator (marked), or the earliest answer (unmarked, or when a cut
        // after the server took the creator's answer).
        let creator = group.iter().find(|r| r.kind() == AnswerKind::Created);
        let original = if marked && (creator.is_some() || !lost_ack) {
            creator
        } else {
            group.iter().min_by_key(|r| r.last().finished_us)
        };
        let Some(original) = original else { continue };
        let norm = |r: &RacerRun| -> Option<(u16, Result<serde_json::Value, Vec<u8>>)> {
            let a = r.last().answer.as_ref().ok()?;
            let body = serde_json::from_slice::<serde_json::Value>(&a.body)
                .map(|v| without(&v, ignore))
                .map_err(|_| a.body.clone());
            Some((a.status, body))
        };
        let want = norm(original);
        for r in group.iter().filter(|r| r.name != original.name) {
            if r.intent_sha256 != original.intent_sha256 {
                continue;
            }
            compared += 1;
            let got = norm(r);
            if got != want {
                let a = r.last().answer.as_ref().ok();
                // Where both bodies are JSON, name the members that differ: a timestamp or a
                // request id belongs in `ignore`; anything else is a replay that is not the
                // original answer.
                let members = match (&got, &want) {
                    (Some((_, Ok(x))), Some((_, Ok(y)))) => {
                        let at = differing_pointers(y, x, 8);
                        if at.is_empty() {
                            String::new()
                        } else {
                            format!(
                                "; the bodies differ at {} (volatile members belong in `ignore`)",
                                at.join(", ")
                            )
                        }
                    }
                    _ => String::new(),
                };
                problems.push(problem(
                    format!(
                        "{} got {} {} but the original answer to {} was {} {}{members}",
                        r.name,
                        a.map(|a| a.status).unwrap_or(0),
                        a.map(|a| a.body_excerpt.clone()).unwrap_or_default(),
                        original.name,
                        original
                            .last()
                            .answer
                            .as_ref()
                            .map(|a| a.status)
                            .unwrap_or(0),
                        original
                            .last()
                            .answer
                            .as_ref()
                            .map(|a| a.body_excerpt.clone())
                            .unwrap_or_default()
                    ),
                    &[&r.name],
                ));
            }
        }
    }
    make(
        "same answer",
        problems,
        format!(
            "{compared} replay(s) equal the original answer{}",
            if ignore.is_empty() {
                String::new()
            } else {
                format!(" (ignoring {})", ignore.join(", "))
            }
        ),
        errored,
    )
}

/// No scope's answer carries an id or a body that another scope got.
fn scope_isolation(racers: &[RacerRun], errored: &BTreeSet<String>) -> Option<Check> {
    let scopes: BTreeSet<&str> = racers.iter().filter_map(|r| r.scope.as_deref()).collect();
    if scopes.len() < 2 {
        return None;
    }
    let mut ids: BTreeMap<&str, BTreeMap<&str, Vec<&str>>> = BTreeMap::new();
    let mut bodies: BTreeMap<&[u8], BTreeSet<&str>> = BTreeMap::new();
    for r in racers.iter().filter(|r| r.kind().has_resource()) {
        let scope = r.scope.as_deref().unwrap_or("");
        if let Some(id) = r.id() {
            ids.entry(id)
                .or_default()
                .entry(scope)
                .or_default()
                .push(&r.name);
        }
        if let Ok(a) = &r.last().answer {
            if !a.body.is_empty() {
                bodies.entry(&a.body).or_default().insert(scope);
            }
        }
    }
    let mut problems = Vec::new();
    for (id, by_scope) in &ids {
        if by_scope.len() > 1 {
            let who: Vec<String> = by_scope
                .iter()
                .map(|(s, names)| format!("scope {s} ({})", names.join(", ")))
                .collect();
            let names: Vec<&str> = by_scope.values().flatten().copied().collect();
            problems.push(problem(
                format!(
                    "id {id} was answered to {}: one scope got another's resource",
                    who.join(" and ")
                ),
                &names,
            ));
        }
    }
    for (body, in_scopes) in &bodies {
        if in_scopes.len() > 1 {
            problems.push(problem(
                format!(
                    "scopes {} got the identical body {}",
                    in_scopes.iter().copied().collect::<Vec<_>>().join(", "),
                    super::excerpt(&String::from_utf8_lossy(body), 120)
                ),
                &[],
            ));
        }
    }
    // An id seen in two scopes and the identical body are one finding; say it once.
    if problems.len() > 1 && problems.iter().any(|p| p.text.starts_with("id ")) {
        problems.retain(|p| p.text.starts_with("id "));
    }
    Some(make(
        "scope isolation",
        problems,
        format!(
            "{} scopes: no id or body answered to more than one scope",
            scopes.len()
        ),
        errored,
    ))
}
