//! A PostgreSQL run's recorded timeline as a Mermaid `sequenceDiagram`: the controller takes
//! the barrier lock, each racer's statements block on it, `pg_locks` shows them all waiting,
//! the controller releases, and the racers' inserts, unique violations, rollbacks to the
//! savepoint, replays or conflicts and commits follow in the order they happened.
//!
//! Order comes from each step's start and finish times ([`crate::scenario::timeline`]); no
//! time values are printed, so the diagram changes only when the interleaving does.

use std::collections::BTreeMap;

use super::TicketLabels;
use crate::domain::OutcomeKind;
use crate::scenario::timeline::{ControllerTimes, Step, StoreCall};
use crate::scenario::{Evidence, LockWait, RacerRecord, ScenarioRun};

/// At most this many racers are drawn; the rest are named in a note.
pub const MAX_DRAWN_RACERS: usize = 4;

/// One point on the merged timeline.
enum Event<'a> {
    ControllerLock,
    AllWaiting,
    Release,
    Start(usize, &'a Step),
    End(usize, &'a Step),
}

/// Makes text safe inside a Mermaid message or note (`;` and `#` have meanings there).
fn safe(text: &str) -> String {
    text.replace(';', ",")
        .replace('#', "no. ")
        .replace(['\n', '\r'], " ")
}

/// The statement of a step in a few words, e.g. `SELECT receipt (A, key-1)`.
fn call_label(call: &StoreCall, tickets: &TicketLabels) -> String {
    match call {
        StoreCall::Begin => "BEGIN".into(),
        StoreCall::Savepoint { name } => format!("SAVEPOINT {name}"),
        StoreCall::RollbackToSavepoint { name } => format!("ROLLBACK TO SAVEPOINT {name}"),
        StoreCall::ReleaseSavepoint { name } => format!("RELEASE SAVEPOINT {name}"),
        StoreCall::Commit => "COMMIT".into(),
        StoreCall::Rollback => "ROLLBACK".into(),
        StoreCall::FindReceipt { tenant_id, key } => {
            format!("SELECT receipt ({tenant_id}, {key})")
        }
        StoreCall::InsertTicket { ticket } => {
            format!("INSERT ticket {}", tickets.label(ticket.id))
        }
        StoreCall::InsertOutbox { event } => format!(
            "INSERT outbox {} ({})",
            event.event_type,
            tickets.label(event.aggregate_id)
        ),
        StoreCall::InsertReceipt { receipt } => format!(
            "INSERT receipt ({}, {}) → {}",
            receipt.tenant_id,
            receipt.idempotency_key,
            tickets.label(receipt.ticket_id)
        ),
        StoreCall::InsertReceiptIfAbsent { receipt } => format!(
            "INSERT receipt ({}, {}) → {} ON CONFLICT DO NOTHING",
            receipt.tenant_id,
            receipt.idempotency_key,
            tickets.label(receipt.ticket_id)
        ),
        StoreCall::ClaimAndCreate { receipt, .. } => format!(
            "claim ({}, {}) → {} with ticket and event, ON CONFLICT DO NOTHING",
            receipt.tenant_id,
            receipt.idempotency_key,
            tickets.label(receipt.ticket_id)
        ),
        StoreCall::FindReceiptAndTicket { tenant_id, key } => {
            format!("SELECT receipt and ticket ({tenant_id}, {key})")
        }
        StoreCall::FindTicket { id, .. } => format!("SELECT ticket {}", tickets.label(*id)),
        StoreCall::UpdateTicket { id, .. } => format!("UPDATE ticket {}", tickets.label(*id)),
        StoreCall::Barrier => "wait for the advisory barrier lock".into(),
    }
}

/// What the step returned: `none`, `found`, `unique violation (23505)`, or `ok`.
fn result_label(step: &Step) -> String {
    match step.what.split_once(" -> ") {
        Some((_, r)) => r.to_string(),
        None => "ok".into(),
    }
}

/// The diagram for a PostgreSQL run, or `None` for other runs and runs without racers.
/// Draws at most [`MAX_DRAWN_RACERS`] racers (scenario order); `tickets` names ticket ids.
pub fn sequence_diagram(run: &ScenarioRun, tickets: &TicketLabels) -> Option<String> {
    let Some(Evidence::Postgres {
        lock_statement,
        controller,
        waits,
        ..
    }) = &run.evidence
    else {
        return None;
    };
    if run.racers.is_empty() {
        return None;
    }
    let drawn = &run.racers[..run.racers.len().min(MAX_DRAWN_RACERS)];
    let events = timeline(drawn, controller);

    let mut out = String::from("```mermaid\nsequenceDiagram\n");
    out.push_str("    participant C as controller\n");
    out.push_str("    participant DB as PostgreSQL\n");
    for (i, r) in drawn.iter().enumerate() {
        out.push_str(&format!(
            "    participant R{} as {}\n",
            i + 1,
            safe(&r.name)
        ));
    }
    let mut i = 0;
    while i < events.len() {
        match &events[i].3 {
            Event::ControllerLock => {
                out.push_str(&format!("    C->>DB: BEGIN, {}\n", safe(lock_statement)));
            }
            Event::AllWaiting => out.push_str(&all_waiting_note(waits)),
            Event::Release => out.push_str("    C->>DB: COMMIT (barrier released)\n"),
            Event::Start(r, step) => {
                let next_is_own_end = matches!(
                    events.get(i + 1).map(|e| &e.3),
                    Some(Event::End(r2, s2)) if r2 == r && std::ptr::eq(*s2, *step)
                );
                out.push_str(&request_line(
                    *r,
                    step,
                    next_is_own_end,
                    controller.released_us,
                    tickets,
                ));
                if next_is_own_end {
                    i += 1;
                }
            }
            Event::End(r, step) => {
                let arrow = if step.failed() { "--x" } else { "-->>" };
                out.push_str(&format!(
                    "    DB{arrow}R{}: {}\n",
                    r + 1,
                    safe(&result_label(step))
                ));
            }
        }
        i += 1;
    }
    outcome_notes(&mut out, drawn, tickets);
    if run.racers.len() > drawn.len() {
        out.push_str(&format!(
            "    Note over C,R{}: {} more racers not drawn (all steps in report.json)\n",
            drawn.len(),
            run.racers.len() - drawn.len()
        ));
    }
    out.push_str("```\n");
    Some(out)
}

/// Every event of the `drawn` racers and the controller, in time order: at equal times
/// controller events come first, and a racer's events keep their order (a reply before that
/// racer's next request). Each is `(time, rank, the racer's own order, event)`.
fn timeline<'a>(
    drawn: &'a [RacerRecord],
    controller: &ControllerTimes,
) -> Vec<(u64, u8, usize, Event<'a>)> {
    let mut events: Vec<(u64, u8, usize, Event<'_>)> =
        vec![(controller.locked_us, 0, 0, Event::ControllerLock)];
    if let Some(t) = controller.all_waiting_us {
        events.push((t, 1, 0, Event::AllWaiting));
    }
    events.push((controller.released_us, 1, 1, Event::Release));
    for (i, r) in drawn.iter().enumerate() {
        for (j, step) in r.steps.iter().enumerate() {
            events.push((step.started_us, 2, 2 * j, Event::Start(i, step)));
            events.push((step.finished_us, 2, 2 * j + 1, Event::End(i, step)));
        }
    }
    events.sort_by_key(|(t, rank, own, _)| (*t, *rank, *own));
    events
}

/// The note that every racer was seen waiting, with the lock modes they requested.
fn all_waiting_note(waits: &[LockWait]) -> String {
    let modes: BTreeMap<&str, usize> = waits.iter().fold(BTreeMap::new(), |mut m, w| {
        *m.entry(w.mode.as_str()).or_default() += 1;
        m
    });
    let modes: Vec<String> = modes.iter().map(|(m, n)| format!("{n}× {m}")).collect();
    format!(
        "    Note over C,DB: pg_locks: all {} racers waiting ({}), blocked by the controller\n",
        waits.len(),
        modes.join(", ")
    )
}

/// Racer `r`'s request `step`: with its result on the same arrow when its reply comes next
/// (`with_reply`), else alone, marked when the barrier lock held it (issued before the
/// release at `released_us`, returned after).
fn request_line(
    r: usize,
    step: &Step,
    with_reply: bool,
    released_us: u64,
    tickets: &TicketLabels,
) -> String {
    let label = call_label(&step.call, tickets);
    if with_reply {
        let result = result_label(step);
        let arrow = if step.failed() { "-x" } else { "->>" };
        let suffix = if result == "ok" {
            String::new()
        } else {
            format!(" → {result}")
        };
        format!(
            "    R{}{arrow}DB: {}{}\n",
            r + 1,
            safe(&label),
            safe(&suffix)
        )
    } else {
        // Held by the controller's lock: issued before the release, returned after
        // (pg_locks showed it waiting). Other gaps are just other racers' steps.
        let held = step.started_us < released_us && step.finished_us >= released_us;
        format!(
            "    R{}->>DB: {}{}\n",
            r + 1,
            safe(&label),
            if held {
                " (blocked by the barrier lock)"
            } else {
                ""
            }
        )
    }
}

/// A note over each drawn racer with what it got back.
fn outcome_notes(out: &mut String, drawn: &[RacerRecord], tickets: &TicketLabels) {
    for (i, r) in drawn.iter().enumerate() {
        let text = match &r.result {
            Ok(o) => format!(
                "{} {}{} (HTTP {}, {})",
                o.kind,
                match o.kind {
                    OutcomeKind::Conflict => "",
                    _ => "ticket ",
                },
                o.ticket_id.map(|t| tickets.label(t)).unwrap_or_default(),
                o.http_status,
                o.path_label()
            ),
            Err(e) => format!("error: {e}"),
        };
        out.push_str(&format!("    Note over R{}: {}\n", i + 1, safe(&text)));
    }
}

/// One step of an interposed run ([`crate::interpose::conduct::StepTaken`]) with the racer
/// that took it.
pub(crate) struct ScheduledStep<'a> {
    /// Its place in the run's schedule, from 1, across waves.
    pub number: usize,
    /// Its wave's number.
    pub wave: u32,
    /// Whether the run conducted more than one wave (labels then name the wave).
    pub many_waves: bool,
    /// The racer's letter in its wave's schedule (`A` = the wave's first racer).
    pub letter: char,
    /// The racer's index in the run's racers (scenario order), when known.
    pub racer: Option<usize>,
    /// The racer's name, or `?` when unknown.
    pub name: &'a str,
    /// The step.
    pub step: &'a crate::interpose::conduct::StepTaken,
}

/// Every step of the interposed `run`, in the schedule's order, each with its racer: racer
/// `i` of a wave is the wave's `i`-th racer in scenario order, as the runner lets them go.
pub(crate) fn scheduled_steps(run: &crate::blackbox::TargetRun) -> Vec<ScheduledStep<'_>> {
    let Some(e) = &run.evidence else {
        return Vec::new();
    };
    let conducted: Vec<_> = e.waves.iter().filter(|w| w.schedule.is_some()).collect();
    let many_waves = conducted.len() > 1;
    let mut out = Vec::new();
    for w in conducted {
        let in_wave: Vec<usize> = run
            .racers
            .iter()
            .enumerate()
            .filter(|(_, r)| r.wave == w.wave)
            .map(|(i, _)| i)
            .collect();
        for step in w.schedule.iter().flat_map(|s| s.steps.iter()) {
            let racer = in_wave.get(step.racer).copied();
            out.push(ScheduledStep {
                number: out.len() + 1,
                wave: w.wave,
                many_waves,
                letter: crate::interpose::explore::racer_letter(step.racer),
                racer,
                name: racer.map_or("?", |i| run.racers[i].name.as_str()),
                step,
            });
        }
    }
    out
}

/// Longest statement shown in a diagram's message, in characters.
const DIAGRAM_TEXT: usize = 90;
/// Longest parameter shown in a diagram's message, in characters.
const DIAGRAM_PARAM: usize = 24;

/// Whether a step's result is the server refusing it: a PostgreSQL error (`SQLSTATE …`,
/// [`crate::interpose::hub::SessionView::result_text`]) or a Redis error line (`-ERR …`).
pub(crate) fn refused(store: crate::interpose::StoreKind, result: &str) -> bool {
    match store {
        crate::interpose::StoreKind::Redis => result.starts_with('-'),
        crate::interpose::StoreKind::Postgres => {
            let code: Vec<char> = result.chars().take(6).collect();
            code.len() == 6
                && code[5] == ' '
                && code[..5]
                    .iter()
                    .all(|c| c.is_ascii_digit() || c.is_ascii_uppercase())
                && code[..5].iter().any(char::is_ascii_digit)
        }
    }
}

/// A failing interposed run's steps as the store saw them, as a Mermaid `sequenceDiagram`
/// (without the Markdown fence): a participant per racer's client (`A: name`) and per
/// interposed store; one message per step, numbered in the schedule's order, with its
/// statement (clipped to 90 characters), its parameters (each clipped to 24) and its result
/// (a cross arrow when the server refused it); a note where a step waited for a lock and
/// where a step was taken without quiescence; a note with each racer's final answer.
/// `None` when `run` has no conducted steps.
pub fn schedule_diagram(run: &crate::blackbox::TargetRun) -> Option<String> {
    use crate::interpose::StoreKind;
    use std::fmt::Write as _;
    let steps = scheduled_steps(run);
    if steps.is_empty() {
        return None;
    }
    let id = run.evidence.as_ref().and_then(|e| e.schedule_id.clone());
    let label = |s: &ScheduledStep<'_>| {
        if s.many_waves {
            format!("wave {} {}: {}", s.wave, s.letter, s.name)
        } else {
            format!("{}: {}", s.letter, s.name)
        }
    };
    // A participant per racer that took a step, in scenario order; then the stores.
    let mut racers: Vec<(usize, String, String)> = Vec::new();
    for s in &steps {
        let alias = participant(s);
        if !racers.iter().any(|(_, a, _)| *a == alias) {
            racers.push((s.racer.unwrap_or(usize::MAX), alias, label(s)));
        }
    }
    racers.sort_by_key(|(i, a, _)| (*i, a.clone()));
    let stores: Vec<StoreKind> = [StoreKind::Postgres, StoreKind::Redis]
        .into_iter()
        .filter(|k| steps.iter().any(|s| s.step.store == *k))
        .collect();
    let store_alias = |k: StoreKind| match k {
        StoreKind::Postgres => "PG",
        StoreKind::Redis => "RD",
    };
    let mut out = String::from("sequenceDiagram\n");
    for (_, alias, name) in &racers {
        let _ = writeln!(out, "    participant {alias} as {}", escaped(name));
    }
    for k in &stores {
        let _ = writeln!(
            out,
            "    participant {} as {} (through the interposer)",
            store_alias(*k),
            match k {
                StoreKind::Postgres => "PostgreSQL",
                StoreKind::Redis => "Redis",
            }
        );
    }
    let first = racers
        .first()
        .map_or("PG", |(_, a, _)| a.as_str())
        .to_string();
    let last = store_alias(*stores.last().unwrap_or(&StoreKind::Postgres));
    let _ = writeln!(
        out,
        "    Note over {first},{last}: schedule {} ({}), steps as the store saw them",
        escaped(id.as_deref().unwrap_or("?")),
        run.verdict
    );
    let mut wave = None;
    for s in &steps {
        if s.many_waves && wave != Some(s.wave) {
            let _ = writeln!(out, "    Note over {first},{last}: wave {}", s.wave);
        }
        wave = Some(s.wave);
        let who = participant(s);
        let to = store_alias(s.step.store);
        if !s.step.quiescent {
            let _ = writeln!(
                out,
                "    Note over {who}: step {} taken without quiescence (a racer was busy outside the store)",
                s.number
            );
        }
        let params = if s.step.params.is_empty() {
            String::new()
        } else {
            format!(
                " [{}]",
                s.step
                    .params
                    .iter()
                    .map(|p| crate::interpose::hub::clip_to(p, DIAGRAM_PARAM))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        let arrow = if refused(s.step.store, &s.step.result) {
            "-x"
        } else {
            "->>"
        };
        let _ = writeln!(
            out,
            "    {who}{arrow}{to}: {}. {}{} → {}",
            s.number,
            escaped(&crate::interpose::hub::clip_to(&s.step.text, DIAGRAM_TEXT)),
            escaped(&params),
            escaped(&s.step.result)
        );
        if s.step.blocked {
            let _ = writeln!(
                out,
                "    Note over {who},{to}: step {} waited for a lock (seen in pg_blocking_pids); its reply came after the steps below it",
                s.number
            );
        }
    }
    for (i, r) in run.racers.iter().enumerate() {
        let alias = format!("R{}", i + 1);
        if !racers.iter().any(|(_, a, _)| *a == alias) {
            continue;
        }
        let last = r.last();
        let answer = match &last.answer {
            Ok(a) => format!("HTTP {} {}", a.status, last.kind),
            Err(e) => format!("no answer: {}", crate::blackbox::run::excerpt(e, 60)),
        };
        let _ = writeln!(
            out,
            "    Note over {alias}: final answer {answer}{}",
            if r.attempts.len() > 1 {
                format!(" after {} attempts", r.attempts.len())
            } else {
                String::new()
            }
        );
    }
    Some(out)
}

/// A racer's participant alias: `R` and its place in the run's racers (from 1), or the wave
/// and letter when it is unknown.
fn participant(s: &ScheduledStep<'_>) -> String {
    match s.racer {
        Some(i) => format!("R{}", i + 1),
        None => format!("W{}{}", s.wave, s.letter),
    }
}

/// Text made safe inside a Mermaid message or note without changing it: `#`, `;`, `<` and `>`
/// as Mermaid's entity codes (`#35;`, `#59;`, `#lt;`, `#gt;`), line breaks as spaces.
fn escaped(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '#' => out.push_str("#35;"),
            ';' => out.push_str("#59;"),
            '<' => out.push_str("#lt;"),
            '>' => out.push_str("#gt;"),
            '\n' | '\r' => out.push(' '),
            c => out.push(c),
        }
    }
    out
}
