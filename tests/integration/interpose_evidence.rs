//! What a failing interposed exploration prints: the Mermaid diagram and the isolation-tester
//! spec of its schedule name each racer's steps in the schedule's order, the spec reads as the
//! isolation tester's grammar and the tester replays it to the failing run's rows,
//! report.json keeps both under its schema, and each step shows
//! what the store answered (a Redis `SET NX` that lost is `nil`, not `+OK`). The checks of
//! order and grammar have their own negative controls.

use ticketflow_harness::blackbox::{TargetOutcome, TargetRun};
use ticketflow_harness::verdict::Verdict;

use crate::interpose::{
    clean_stub_keys, interposed_serve, interposed_serve_text, redis_stub, redis_up, run_interposed,
};

/// A spec read as the isolation tester's grammar reads it (`specparse.y`, `specscanner.l` in
/// PostgreSQL's `src/test/isolation`): top-level `setup` and `teardown` blocks, then sessions
/// (`session NAME`, an optional `setup`, one or more `step NAME { SQL }`, an optional
/// `teardown`), then permutations of step names. `#` starts a comment; a block ends at the
/// first `}`. Returns the sessions with their steps and the permutations.
///
/// `Err` names the first problem: an unknown word, a session without steps, a step name used
/// twice, a permutation naming no step.
type Sessions = Vec<(String, Vec<String>)>;

fn parse_spec(text: &str) -> Result<(Sessions, Vec<Vec<String>>), String> {
    #[derive(Debug, PartialEq)]
    enum Tok {
        Word(String),
        Block,
    }
    let mut toks = Vec::new();
    let b: Vec<char> = text.chars().collect();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == '#' {
            while i < b.len() && b[i] != '\n' {
                i += 1;
            }
        } else if c.is_whitespace() {
            i += 1;
        } else if c == '{' {
            let end = b[i..]
                .iter()
                .position(|&x| x == '}')
                .ok_or("a block without its closing brace")?;
            i += end + 1;
            toks.push(Tok::Block);
        } else if c == '}' {
            return Err("a closing brace outside a block".into());
        } else if c.is_ascii_alphabetic() || c == '_' {
            let start = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == '_') {
                i += 1;
            }
            toks.push(Tok::Word(b[start..i].iter().collect()));
        } else {
            return Err(format!("unexpected character {c:?}"));
        }
    }
    let word = |t: Option<&Tok>| match t {
        Some(Tok::Word(w)) => Some(w.clone()),
        _ => None,
    };
    let mut at = 0;
    let mut sessions: Sessions = Vec::new();
    let mut permutations: Vec<Vec<String>> = Vec::new();
    let mut all_steps: Vec<String> = Vec::new();
    while at < toks.len() {
        match word(toks.get(at)).as_deref() {
            Some("setup" | "teardown") if sessions.is_empty() => {
                if toks.get(at + 1) != Some(&Tok::Block) {
                    return Err("setup or teardown without a block".into());
                }
                at += 2;
            }
            Some("session") => {
                let name = word(toks.get(at + 1)).ok_or("a session without a name")?;
                at += 2;
                if word(toks.get(at)).as_deref() == Some("setup") {
                    at += 2;
                }
                let mut steps = Vec::new();
                while word(toks.get(at)).as_deref() == Some("step") {
                    let step = word(toks.get(at + 1)).ok_or("a step without a name")?;
                    if toks.get(at + 2) != Some(&Tok::Block) {
                        return Err(format!("step {step} without a block"));
                    }
                    if all_steps.contains(&step) {
                        return Err(format!("step name {step} used twice"));
                    }
                    all_steps.push(step.clone());
                    steps.push(step);
                    at += 3;
                }
                if steps.is_empty() {
                    return Err(format!("session {name} has no step"));
                }
                if word(toks.get(at)).as_deref() == Some("teardown") {
                    at += 2;
                }
                sessions.push((name, steps));
            }
            Some("permutation") => {
                at += 1;
                let mut names = Vec::new();
                while let Some(w) = word(toks.get(at)) {
                    if matches!(w.as_str(), "permutation" | "session" | "setup" | "teardown") {
                        break;
                    }
                    if !all_steps.contains(&w) {
                        return Err(format!("permutation names {w}, which is no step"));
                    }
                    names.push(w);
                    at += 1;
                }
                if names.is_empty() {
                    return Err("an empty permutation".into());
                }
                permutations.push(names);
            }
            other => return Err(format!("unexpected {other:?} at token {at}")),
        }
    }
    if sessions.is_empty() {
        return Err("no session".into());
    }
    Ok((sessions, permutations))
}

/// The racer letters of a spec's permutation, in order: each step's session is named by its
/// racer's letter (`a_…` for racer A).
fn spec_order(text: &str) -> Result<String, String> {
    let (sessions, permutations) = parse_spec(text)?;
    let [permutation] = permutations.as_slice() else {
        return Err(format!("{} permutations, expected one", permutations.len()));
    };
    permutation
        .iter()
        .map(|step| {
            let (session, _) = sessions
                .iter()
                .find(|(_, steps)| steps.contains(step))
                .ok_or_else(|| format!("{step} is in no session"))?;
            Ok(session.chars().next().unwrap().to_ascii_uppercase())
        })
        .collect()
}

/// The racer letters of a schedule diagram's messages, in order: participants are declared
/// `participant R1 as A: name`; messages are `R1->>PG: 3. …`, numbered 1, 2, … in order.
fn diagram_order(mermaid: &str) -> Result<String, String> {
    let participant = regex::Regex::new(r"^\s*participant (\w+) as (\w):").unwrap();
    let message = regex::Regex::new(r"^\s*(\w+)(?:->>|-x)(?:PG|RD): (\d+)\. ").unwrap();
    let mut letters = std::collections::HashMap::new();
    let mut order = String::new();
    for line in mermaid.lines() {
        if let Some(c) = participant.captures(line) {
            letters.insert(c[1].to_string(), c[2].chars().next().unwrap());
        } else if let Some(c) = message.captures(line) {
            let n: usize = c[2].parse().unwrap();
            if n != order.len() + 1 {
                return Err(format!("message {n} where {} was due", order.len() + 1));
            }
            order.push(
                *letters
                    .get(&c[1])
                    .ok_or_else(|| format!("{} is no participant", &c[1]))?,
            );
        }
    }
    Ok(order)
}

/// Runs `spec` with PostgreSQL's isolation tester in a scratch database migrated as
/// `ticketflow serve` migrates its own; returns the tickets it holds after and the tester's
/// output.
fn replay_spec(spec: &str) -> (i64, String) {
    use std::io::Write as _;
    let db = crate::support::TestDb::postgres("ip_evidence_iso").unwrap();
    let mut child = std::process::Command::new(crate::report::isolationtester())
        .env("PGISOLATIONTIMEOUT", "60")
        .arg(db.url().unwrap())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("isolationtester runs");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(spec.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "isolationtester failed:\n{text}");
    (db.scalar("SELECT count(*) FROM tickets"), text)
}

fn failing(o: &TargetOutcome) -> &TargetRun {
    o.runs
        .iter()
        .find(|r| r.verdict == Verdict::Fail)
        .expect("a failing run")
}

#[test]
fn the_order_and_grammar_checks_catch_a_permuted_spec_and_bad_names() {
    let spec =
        "# c\nsession a_r_1\nstep a_r_1_01_begin { BEGIN; }\nstep a_r_1_02_commit { COMMIT; }\n\n\
                session b_r_2\nstep b_r_2_01_begin { BEGIN; }\n\n\
                permutation a_r_1_01_begin b_r_2_01_begin a_r_1_02_commit\n";
    assert_eq!(spec_order(spec).unwrap(), "ABA");
    // Negative controls: another order, a name used twice, a permutation naming no step, a
    // session without steps, a brace inside a block.
    let swapped = spec.replace(
        "permutation a_r_1_01_begin b_r_2_01_begin",
        "permutation b_r_2_01_begin a_r_1_01_begin",
    );
    assert_eq!(spec_order(&swapped).unwrap(), "BAA");
    assert!(parse_spec(&spec.replace("b_r_2_01_begin {", "a_r_1_01_begin {")).is_err());
    assert!(parse_spec(&spec.replace("a_r_1_02_commit\n", "a_r_1_03_commit\n")).is_err());
    assert!(parse_spec("session a\n\npermutation x\n").is_err());
    assert!(parse_spec(&spec.replace("{ BEGIN; }", "{ SELECT '}'; }")).is_err());
    let diagram =
        "sequenceDiagram\n    participant R1 as A: r-1\n    participant R2 as B: r-2\n    \
                   R1->>PG: 1. BEGIN → BEGIN (T)\n    R2-xPG: 2. INSERT → 23505 x (E)\n";
    assert_eq!(diagram_order(diagram).unwrap(), "AB");
    assert!(diagram_order(&diagram.replace("2. INSERT", "3. INSERT")).is_err());
}

#[test]
fn a_failing_exploration_is_drawn_and_exported_in_the_schedule_order() {
    let Some(url) = crate::support::pg_url() else {
        return;
    };
    let mut o = run_interposed(
        &interposed_serve(Some("split-transactions"), "bounded", 60),
        &url,
        None,
    );
    assert_eq!(o.verdict, Verdict::Fail, "{:?}", o.coverage);
    let run = failing(&o).clone();
    let id = run.evidence.as_ref().unwrap().schedule_id.clone().unwrap();
    let f = o.failing_schedule.clone().expect("a failing schedule");
    assert_eq!(f.schedule_id, id);
    assert!(
        f.replay.ends_with(&format!("--schedule {id}")),
        "{}",
        f.replay
    );
    // The schedule's letters, in order (one wave here).
    let letters: String = id.chars().filter(|c| *c != '/').collect();
    assert_eq!(diagram_order(&f.mermaid).unwrap(), letters, "{}", f.mermaid);
    let spec = f
        .isolation_spec
        .clone()
        .unwrap_or_else(|| panic!("{:?}", f.isolation_spec_missing));
    assert_eq!(spec_order(&spec).unwrap(), letters, "{spec}");
    assert!(spec.contains("# setup {"), "setup is a comment: {spec}");
    assert!(
        spec.contains("BEGIN"),
        "transaction control is kept: {spec}"
    );

    // The isolation tester replays the spec on a copy of the service's schema (our
    // migrations, no rows) to the failing run's rows: its steps in the schedule's order, the
    // lock wait where the run waited.
    let replay = replay_spec(&spec);
    let tickets = run
        .counts
        .iter()
        .find(|c| c.name == "tickets")
        .and_then(|c| c.counted.clone().ok())
        .unwrap();
    assert_eq!(tickets, 2, "the failing run made two tickets");
    assert_eq!(replay.0, tickets, "{}", replay.1);
    let blocked = run
        .evidence
        .iter()
        .flat_map(|e| e.waves.iter())
        .flat_map(|w| w.schedule.iter().flat_map(|s| s.steps.iter()))
        .any(|s| s.blocked);
    assert_eq!(replay.1.contains("<waiting ...>"), blocked, "{}", replay.1);

    // Each PostgreSQL step shows its CommandComplete tag and the transaction status, or its
    // error; an INSERT shows how many rows.
    let steps: Vec<_> = run
        .evidence
        .as_ref()
        .unwrap()
        .waves
        .iter()
        .flat_map(|w| w.schedule.iter().flat_map(|s| s.steps.clone()))
        .collect();
    let tagged = regex::Regex::new(r"^.+ \([ITE]\)( \(answered after the next point\))?$").unwrap();
    for s in &steps {
        assert!(
            tagged.is_match(&s.result) || s.result == "waiting for a lock",
            "{} → {}",
            s.text,
            s.result
        );
    }
    assert!(
        steps.iter().any(|s| s.result.starts_with("INSERT 0 1 (")),
        "{steps:?}"
    );
    assert!(steps.iter().any(|s| s.result == "BEGIN (T)"), "{steps:?}");

    // The text output holds the diagram and says the spec was not written yet.
    let text = ticketflow_harness::blackbox::summary::summary_text(&o);
    assert!(
        text.contains(&format!("schedule {id} as a Mermaid sequence diagram:")),
        "{text}"
    );
    assert!(text.contains("           sequenceDiagram"), "{text}");
    assert!(
        text.contains("isolation-tester spec of its PostgreSQL steps: not written"),
        "{text}"
    );
    // Exported as scenario run does: the file holds the spec and the text names it.
    let dir = tempfile::tempdir().unwrap();
    let mut out =
        ticketflow_harness::outputs::OutputDir::open(dir.path(), "", false, false).unwrap();
    let written = ticketflow::verify::export_schedules(std::slice::from_mut(&mut o), &mut out);
    assert_eq!(written.len(), 1);
    assert_eq!(std::fs::read_to_string(&written[0]).unwrap(), spec);
    assert_eq!(
        written[0].file_name().unwrap().to_string_lossy(),
        format!("interposed-serve.schedule-{id}.spec")
    );
    let text = ticketflow_harness::blackbox::summary::summary_text(&o);
    assert!(
        text.contains(&format!(
            "spec of its PostgreSQL steps: written to {}",
            written[0].display()
        )),
        "{text}"
    );

    // report.json keeps both under its schema; black-box.md draws the diagram.
    let loom = ticketflow_harness::killmatrix::LoomReport::default();
    let ctx = crate::report::test_ctx("ticketflow scenario run");
    let descriptions = [(o.scenario.clone(), "interposed".to_string())];
    let input = ticketflow_report::ReportInput {
        scenarios: &[],
        runs: &[],
        targets: std::slice::from_ref(&o),
        target_descriptions: &descriptions,
        suites: &[],
        kill: None,
        loom: &loom,
        faults: None,
        soak: None,
        ctx: &ctx,
        specs: &[],
        not_selected: &[],
    };
    let doc: serde_json::Value =
        serde_json::from_str(&ticketflow_report::json::render(&input, 1)).unwrap();
    let v = crate::report::schema_validator();
    assert_eq!(crate::report::schema_errors(&v, &doc), Vec::<String>::new());
    let t = &doc["targets"][0];
    assert_eq!(t["barrier"], "interposer");
    assert_eq!(t["failing_schedule"]["schedule_id"], id.as_str());
    assert_eq!(t["failing_schedule"]["isolation_spec"], spec.as_str());
    // Negative controls: the schema refuses a diagram that is not one, an empty result.
    let mut bad = doc.clone();
    bad["targets"][0]["failing_schedule"]["mermaid"] = "graph TD".into();
    assert!(!crate::report::schema_errors(&v, &bad).is_empty());
    let mut bad = doc.clone();
    let waves = bad["targets"][0]["runs"][0]["evidence"]["waves"]
        .as_array_mut()
        .unwrap();
    waves[0]["schedule"]["steps"][0]["result"] = "".into();
    assert!(!crate::report::schema_errors(&v, &bad).is_empty());
    let details = ticketflow_report::markdown::render_details(&input);
    let (_, black_box) = details
        .iter()
        .find(|(name, _)| name == ticketflow_report::markdown::BLACK_BOX_FILE)
        .unwrap();
    assert!(
        black_box.contains(&format!("Failing schedule `{id}`")),
        "{black_box}"
    );
    assert!(
        black_box.contains("```mermaid\nsequenceDiagram\n"),
        "{black_box}"
    );
    // REPORT.md of given files names the schedules, the failing one first, not every run.
    let md = ticketflow_report::markdown::render_scoped(
        &input,
        &ticketflow_report::Scope::Files(vec!["interposed.toml".into()]),
    );
    assert!(
        md.contains(&format!("| schedule `{id}` | **FAIL** |")),
        "{md}"
    );
    assert!(
        !md.contains("flake rate"),
        "schedules are not repeats: {md}"
    );
}

#[test]
fn a_redis_set_nx_that_lost_shows_nil_and_one_that_won_shows_ok() {
    let Some(url) = crate::support::pg_url() else {
        return;
    };
    if !redis_up() {
        return;
    }
    let o = run_interposed(&redis_stub("exhaustive"), &url, None);
    clean_stub_keys();
    assert_eq!(
        o.verdict,
        Verdict::Fail,
        "{}",
        ticketflow_harness::blackbox::summary::summary_text(&o)
    );
    let set_nx: Vec<String> = o
        .runs
        .iter()
        .flat_map(|r| r.evidence.iter().flat_map(|e| e.waves.iter()))
        .flat_map(|w| w.schedule.iter().flat_map(|s| s.steps.iter()))
        .filter(|s| s.text.starts_with("SET ") && s.text.contains(" NX"))
        .map(|s| s.result.clone())
        .collect();
    assert!(set_nx.iter().any(|r| r == "nil"), "{set_nx:?}");
    assert!(set_nx.iter().any(|r| r == "+OK"), "{set_nx:?}");
    assert!(
        set_nx.iter().all(|r| r == "nil" || r == "+OK"),
        "{set_nx:?}"
    );
    // The failing schedule is drawn in its order; it has no PostgreSQL step to export.
    let f = o.failing_schedule.clone().unwrap();
    let letters: String = f.schedule_id.chars().filter(|c| *c != '/').collect();
    assert_eq!(diagram_order(&f.mermaid).unwrap(), letters, "{}", f.mermaid);
    assert!(
        f.mermaid.contains("participant RD as Redis"),
        "{}",
        f.mermaid
    );
    assert!(f.isolation_spec.is_none());
    assert!(
        f.isolation_spec_missing
            .as_deref()
            .is_some_and(|m| m.contains("no PostgreSQL step")),
        "{:?}",
        f.isolation_spec_missing
    );
    // A GET that found nothing reads nil too; one that found the record shows its value.
    let gets: Vec<&str> = failing(&o)
        .evidence
        .iter()
        .flat_map(|e| e.waves.iter())
        .flat_map(|w| w.schedule.iter().flat_map(|s| s.steps.iter()))
        .filter(|s| s.text.starts_with("GET "))
        .map(|s| s.result.as_str())
        .collect();
    assert!(gets.contains(&"nil"), "{gets:?}");
}

#[test]
fn scenario_run_names_the_schedules_and_writes_the_spec_beside_its_report() {
    let Some(url) = crate::support::pg_url() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("interposed.toml");
    std::fs::write(
        &file,
        interposed_serve_text(Some("split-transactions"), "bounded", 60, 2),
    )
    .unwrap();
    let report = dir.path().join("out/REPORT.md");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ticketflow"))
        .args(["scenario", "run", "--pg-url", &url, "--report"])
        .arg(&report)
        .arg(&file)
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    // Beside the spec: the folder's manifest of what the tool wrote.
    let specs: Vec<_> = std::fs::read_dir(dir.path().join("out/isolation-specs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "spec"))
        .collect();
    assert_eq!(specs.len(), 1, "{specs:?}");
    let spec = &specs[0];
    assert!(
        stdout.contains(&format!(
            "isolation-tester spec of its PostgreSQL steps: written to {}",
            spec.display()
        )),
        "{stdout}"
    );
    assert!(
        stderr.contains(&format!("isolation spec written to {}", spec.display())),
        "{stderr}"
    );
    assert!(spec_order(&std::fs::read_to_string(spec).unwrap()).is_ok());
    // Schedules, not repeats: counted, the failing one named first.
    assert!(stdout.contains(" explored runs: "), "{stdout}");
    assert!(!stdout.contains("by repeat"), "{stdout}");
    let line = stdout
        .lines()
        .find(|l| l.trim_start().starts_with("{run} by schedule ("))
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(line.contains(" failing): "), "{line}");
    let first = line
        .split("): ")
        .nth(1)
        .unwrap()
        .split(", ")
        .next()
        .unwrap();
    assert!(first.ends_with("(FAIL)"), "{line}");
    assert!(line.matches(" = ").count() <= 5, "{line}");
}
