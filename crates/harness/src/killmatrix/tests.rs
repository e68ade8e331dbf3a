use super::*;

fn cell(implementation: Implementation, backend: Backend, outcome: GateOutcome) -> KillCell {
    KillCell {
        implementation,
        gate: "scenarios",
        backend,
        outcome,
        took_ms: 0.0,
    }
}

#[test]
fn the_summary_counts_the_verdict_rows_the_report_counts() {
    let v = Implementation::Variant(Variant::KeyOnly);
    let k = KillMatrix {
        cells: vec![
            cell(v, Backend::Sqlite, GateOutcome::Killed("x".into())),
            cell(v, Backend::Postgres, GateOutcome::Survived),
            cell(v, Backend::Memory, GateOutcome::NotApplicable("m".into())),
        ],
    };
    assert_eq!(k.rows().len(), 2);
    assert_eq!(
        k.summary(),
        "2 verdicts (implementation × backend) for 1 implementations, from 2 gate runs"
    );
}

fn gate_cell(implementation: Implementation, gate: &'static str, outcome: GateOutcome) -> KillCell {
    KillCell {
        gate,
        ..cell(implementation, Backend::Postgres, outcome)
    }
}

#[test]
fn an_explored_variant_must_be_killed_by_exploration_and_the_first_point_only_informs() {
    let answer = Implementation::Variant(Variant::AnswerInSecondTransaction);
    let redis = Implementation::Variant(Variant::RedisCheckThenLock);
    let killed = || GateOutcome::Killed("x".into());
    let k = KillMatrix {
        cells: vec![
            gate_cell(answer, "explore", killed()),
            gate_cell(answer, "first-point", killed()),
            gate_cell(redis, "explore", killed()),
            gate_cell(redis, "first-point", GateOutcome::Survived),
        ],
    };
    assert!(k.problems().is_empty(), "{:?}", k.problems());
    assert_eq!(k.first_point_missed(), [redis]);
    // Killed by the first point alone: exploration did not find it, and that fails.
    let missed = KillMatrix {
        cells: vec![
            gate_cell(answer, "explore", GateOutcome::Survived),
            gate_cell(answer, "first-point", killed()),
        ],
    };
    assert_eq!(
        missed.problems(),
        ["answer-in-second-transaction survived the explore gate on postgres: exploration did not find it"]
    );
    // A control the first point kills is a broken gate.
    let control = KillMatrix {
        cells: vec![gate_cell(
            Implementation::default(),
            "first-point",
            killed(),
        )],
    };
    assert_eq!(control.verdict(), Verdict::Fail);
}

#[test]
fn the_serve_arguments_select_the_implementation_and_the_redis_variant_gets_its_redis() {
    assert_eq!(
        implementation_args(Implementation::Protocol(
            ticketflow_core::Protocol::OnConflict
        )),
        ["--protocol", "on-conflict"]
    );
    assert_eq!(
        implementation_args(Implementation::Variant(Variant::RedisCheckThenLock)),
        [
            "--variant",
            "redis-check-then-lock",
            "--lease",
            "{redis_url}"
        ]
    );
    assert!(implementations().contains(&Implementation::Variant(Variant::RedisCheckThenLock)));
}

#[test]
fn a_multi_line_reason_is_kept_whole_on_one_line() {
    let reason = "not linearizable:\n  racer a got created T1\n\n  racer b got created T2\n";
    assert_eq!(
        one_line(reason),
        "not linearizable:; racer a got created T1; racer b got created T2"
    );
}

#[test]
fn a_survivor_or_a_killed_control_fails_the_matrix() {
    let v = Implementation::Variant(Variant::KeyOnly);
    let killed = GateOutcome::Killed("x".into());
    let ok = KillMatrix {
        cells: vec![
            cell(
                Implementation::default(),
                Backend::Sqlite,
                GateOutcome::Survived,
            ),
            cell(v, Backend::Sqlite, killed.clone()),
            cell(v, Backend::Postgres, GateOutcome::Pending("down".into())),
        ],
    };
    assert!(ok.problems().is_empty());
    assert_eq!(ok.verdict(), Verdict::Pending);
    assert_eq!(ok.postgres_verdict(), Verdict::Pending);
    let survivor = KillMatrix {
        cells: vec![cell(v, Backend::Sqlite, GateOutcome::Survived)],
    };
    assert_eq!(
        survivor.problems(),
        ["key-only survived every gate on sqlite"]
    );
    assert_eq!(survivor.verdict(), Verdict::Fail);
    let broken_gate = KillMatrix {
        cells: vec![cell(Implementation::default(), Backend::Postgres, killed)],
    };
    assert_eq!(broken_gate.verdict(), Verdict::Fail);
}
