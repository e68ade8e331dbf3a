//! A failing schedule of an interposed black-box run as a Mermaid `sequenceDiagram`: one
//! participant per racer and one per store, each step the racer's statement and the store's
//! answer, in the schedule's order.

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
///
/// Long because it writes one diagram top to bottom (participants, one message per step, notes,
/// the answers), each part from the same steps.
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
            Err(e) => format!("no answer: {}", crate::blackbox::excerpt(e, 60)),
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
