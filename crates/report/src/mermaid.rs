//! A PostgreSQL run's recorded timeline as a Mermaid `sequenceDiagram`: the controller takes
//! the barrier lock, each racer's statements block on it, `pg_locks` shows them all waiting,
//! the controller releases, and the racers' inserts, unique violations, rollbacks to the
//! savepoint, replays or conflicts and commits follow in the order they happened.
//!
//! Order comes from each step's start and finish times ([`ticketflow_harness::scenario::timeline`]); no
//! time values are printed, so the diagram changes only when the interleaving does.

use std::collections::BTreeMap;

use super::TicketLabels;
use ticketflow_core::domain::OutcomeKind;
use ticketflow_core::store::call::StoreCall;
use ticketflow_harness::scenario::timeline::{ControllerTimes, Step};
use ticketflow_harness::scenario::{Evidence, LockWait, RacerRecord, ScenarioRun};

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
