use super::*;
use std::collections::{BTreeMap, HashSet};

/// A model: racers with steps (statements on their own session), every step always
/// enabled. Returns every schedule the reduced search ran, with whether it was redundant.
fn reduced_runs(
    racers: &[Vec<&str>],
    catalog: &Catalog,
    classes: Vec<usize>,
) -> Vec<(Vec<usize>, bool)> {
    reduced_runs_of(racers, catalog, classes, &[])
}

/// [`reduced_runs`] with the racers' intents.
fn reduced_runs_of(
    racers: &[Vec<&str>],
    catalog: &Catalog,
    classes: Vec<usize>,
    intents: &[Vec<usize>],
) -> Vec<(Vec<usize>, bool)> {
    reduced_runs_on(racers, catalog, classes, intents, 1)
}

/// [`reduced_runs_of`] with up to `lanes` runs handed out at once, the last handed out
/// recorded first (as lanes side by side may end them).
fn reduced_runs_on(
    racers: &[Vec<&str>],
    catalog: &Catalog,
    classes: Vec<usize>,
    intents: &[Vec<usize>],
    lanes: usize,
) -> Vec<(Vec<usize>, bool)> {
    let mut search = Reduced::new(Some(catalog.clone()), vec![classes], intents);
    let (mut out, mut running) = (Vec::new(), Vec::new());
    loop {
        while running.len() < lanes {
            match search.next_chooser() {
                Some(c) => running.push(c),
                None => break,
            }
        }
        let Some(mut chooser) = running.pop() else {
            break;
        };
        let (points, steps) = model_run(racers, &mut chooser);
        out.push((
            points.iter().map(|p| p.chosen).collect(),
            chooser.redundant(),
        ));
        let n = points.len();
        search.record(&points, &steps, &[n], &chooser, &[]);
    }
    assert!(search.complete());
    out
}

/// One run of the model following `chooser`: its points and the steps released at them.
fn model_run(
    racers: &[Vec<&str>],
    chooser: &mut SleepChooser,
) -> (Vec<ChoicePoint>, Vec<Released>) {
    let mut left: Vec<usize> = vec![0; racers.len()];
    let (mut points, mut steps, mut last) = (Vec::new(), Vec::new(), None);
    while (0..racers.len()).any(|r| left[r] < racers[r].len()) {
        let enabled: Vec<usize> = (0..racers.len())
            .filter(|&r| left[r] < racers[r].len())
            .collect();
        let held: Vec<HeldStep> = enabled
            .iter()
            .map(|&r| HeldStep {
                racer: r,
                store: StoreKind::Postgres,
                session: r as u64,
                text: split(racers[r][left[r]]).0.to_string(),
                params: split(racers[r][left[r]]).1,
            })
            .collect();
        let chosen = chooser.choose_held(points.len(), &enabled, last, &held);
        let (text, params) = split(racers[chosen][left[chosen]]);
        steps.push(Released {
            racer: chosen,
            store: StoreKind::Postgres,
            session: chosen as u64,
            text: text.to_string(),
            blocked: false,
            status: Some(status(&racers[chosen], left[chosen])),
            params,
            result: format!("OK ({})", status(&racers[chosen], left[chosen])),
        });
        points.push(ChoicePoint {
            enabled,
            chosen,
            last,
            held,
        });
        left[chosen] += 1;
        last = Some(chosen);
    }
    (points, steps)
}

/// A model step's text and bound parameters: `TEXT | $1 | $2 …`.
fn split(step: &str) -> (&str, Vec<String>) {
    let mut parts = step.split(" | ");
    let text = parts.next().unwrap_or_default();
    (text, parts.map(str::to_string).collect())
}

/// The transaction status after step `k` of a racer: in a transaction from `BEGIN` to
/// `COMMIT`, idle otherwise.
fn status(steps: &[&str], k: usize) -> char {
    let open = steps[..=k]
        .iter()
        .rev()
        .find(|t| **t == "BEGIN" || **t == "COMMIT")
        .is_some_and(|t| *t == "BEGIN");
    if open {
        'T'
    } else {
        'I'
    }
}

/// Every interleaving of the model's steps.
fn all_runs(racers: &[Vec<&str>]) -> Vec<Vec<usize>> {
    fn go(
        racers: &[Vec<&str>],
        left: &mut Vec<usize>,
        cur: &mut Vec<usize>,
        out: &mut Vec<Vec<usize>>,
    ) {
        if (0..racers.len()).all(|r| left[r] == racers[r].len()) {
            out.push(cur.clone());
            return;
        }
        for r in 0..racers.len() {
            if left[r] < racers[r].len() {
                left[r] += 1;
                cur.push(r);
                go(racers, left, cur, out);
                cur.pop();
                left[r] -= 1;
            }
        }
    }
    let mut out = Vec::new();
    go(
        racers,
        &mut vec![0; racers.len()],
        &mut Vec::new(),
        &mut out,
    );
    out
}

/// A run's class: for each pair of conflicting steps of different racers, which came
/// first (steps named by racer and index), with racers renamed by `rename`.
fn class_of(
    racers: &[Vec<&str>],
    run: &[usize],
    catalog: &Catalog,
    rename: &[usize],
) -> BTreeSet<((usize, usize), (usize, usize))> {
    let mut seen: Vec<(usize, usize)> = Vec::new();
    let mut count: BTreeMap<usize, usize> = BTreeMap::new();
    for &r in run {
        let c = count.entry(r).or_default();
        seen.push((r, *c));
        *c += 1;
    }
    let steps: Vec<StepFootprint> = seen
        .iter()
        .map(|&(r, k)| StepFootprint {
            session: (StoreKind::Postgres, r as u64),
            footprint: footprint_with(
                StoreKind::Postgres,
                split(racers[r][k]).0,
                &split(racers[r][k]).1,
                Some(catalog),
            ),
            blocked: false,
            status: Some(status(&racers[r], k)),
        })
        .collect();
    let f = resolve(&steps, catalog.default_isolation);
    let mut out = BTreeSet::new();
    for j in 0..seen.len() {
        for i in 0..j {
            if seen[i].0 != seen[j].0 && f[i].conflicts(&f[j]) {
                let (a, b) = (seen[i], seen[j]);
                out.insert(((rename[a.0], a.1), (rename[b.0], b.1)));
            }
        }
    }
    out
}

fn catalog() -> Catalog {
    let mut c = Catalog::new(&["keys".into(), "orders".into(), "audit".into()], &[]);
    c.default_isolation = Some(crate::interpose::footprint::Isolation::ReadCommitted);
    c
}

fn request() -> Vec<&'static str> {
    vec![
        "BEGIN",
        "SELECT * FROM keys WHERE k = $1",
        "INSERT INTO keys VALUES ($1)",
        "INSERT INTO orders VALUES ($1)",
        "COMMIT",
    ]
}

/// Models of two and three racers over [`catalog`]'s tables.
fn models() -> Vec<Vec<Vec<&'static str>>> {
    vec![
        vec![request(), request()],
        vec![
            vec![
                "SELECT * FROM keys",
                "INSERT INTO audit VALUES (1)",
                "SELECT 1",
            ],
            vec!["INSERT INTO orders VALUES (1)", "SELECT * FROM audit"],
            vec!["SELECT * FROM orders", "SELECT * FROM keys"],
        ],
        vec![
            vec![
                "INSERT INTO keys VALUES (1)",
                "INSERT INTO orders VALUES (1)",
            ],
            vec![
                "INSERT INTO orders VALUES (2)",
                "INSERT INTO keys VALUES (2)",
            ],
        ],
    ]
}

#[test]
fn the_reduced_search_runs_every_class_once_and_fewer_schedules() {
    let cat = catalog();
    for racers in &models() {
        let ident: Vec<usize> = (0..racers.len()).collect();
        // Distinct classes: no symmetry.
        let runs = reduced_runs(racers, &cat, ident.clone());
        let explored: Vec<&Vec<usize>> = runs.iter().filter(|(_, r)| !r).map(|(s, _)| s).collect();
        let full = all_runs(racers);
        let want: HashSet<_> = full
            .iter()
            .map(|s| class_of(racers, s, &cat, &ident))
            .collect();
        let got: Vec<_> = explored
            .iter()
            .map(|s| class_of(racers, s, &cat, &ident))
            .collect();
        let got_set: HashSet<_> = got.iter().cloned().collect();
        assert_eq!(got_set, want, "{racers:?}: a class was never run");
        assert_eq!(got.len(), got_set.len(), "{racers:?}: a class ran twice");
        assert!(
            runs.len() < full.len(),
            "{racers:?}: {} of {}",
            runs.len(),
            full.len()
        );
    }
}

/// Several runs out at once, ended in another order than handed out (schedules side by
/// side): every class of the full search is still run, and the search completes.
#[test]
fn side_by_side_the_reduced_search_still_runs_every_class() {
    let cat = catalog();
    let mut models = models();
    // Two independent groups (two keys, two racers each).
    models.push(vec![
        vec!["INSERT INTO keys VALUES ($1) | 1", "COMMIT"],
        vec!["INSERT INTO keys VALUES ($1) | 1", "COMMIT"],
        vec!["INSERT INTO keys VALUES ($1) | 2", "COMMIT"],
        vec!["INSERT INTO keys VALUES ($1) | 2", "COMMIT"],
    ]);
    for racers in &models {
        let ident: Vec<usize> = (0..racers.len()).collect();
        let want: HashSet<_> = all_runs(racers)
            .iter()
            .map(|s| class_of(racers, s, &cat, &ident))
            .collect();
        let intents: Vec<usize> = if racers.len() == 4 {
            vec![0, 0, 1, 1]
        } else {
            ident.clone()
        };
        let one = reduced_runs_of(racers, &cat, ident.clone(), std::slice::from_ref(&intents));
        for lanes in [2, 3] {
            let runs = reduced_runs_on(
                racers,
                &cat,
                ident.clone(),
                std::slice::from_ref(&intents),
                lanes,
            );
            let got: HashSet<_> = runs
                .iter()
                .filter(|(_, r)| !r)
                .map(|(s, _)| class_of(racers, s, &cat, &ident))
                .collect();
            if racers.len() == 4 {
                // Explored one group at a time: each group's classes beside one order of the
                // other, as one at a time.
                let alone: HashSet<_> = one
                    .iter()
                    .filter(|(_, r)| !r)
                    .map(|(s, _)| class_of(racers, s, &cat, &ident))
                    .collect();
                assert!(alone.is_subset(&got), "{racers:?} on {lanes} lanes");
            } else {
                assert_eq!(
                    got, want,
                    "{racers:?} on {lanes} lanes: a class was never run"
                );
            }
            assert!(
                runs.len() < all_runs(racers).len(),
                "{racers:?} on {lanes} lanes"
            );
        }
    }
}

#[test]
fn interchangeable_racers_are_explored_once_per_orbit() {
    let cat = catalog();
    let short = vec![
        "SELECT * FROM keys WHERE k = $1",
        "INSERT INTO keys VALUES ($1)",
        "COMMIT",
    ];
    let racers = vec![short.clone(), short.clone(), short];
    let runs = reduced_runs(&racers, &cat, vec![0, 0, 0]);
    let asym = reduced_runs(&racers, &cat, vec![0, 1, 2]);
    assert!(runs.len() < asym.len(), "{} vs {}", runs.len(), asym.len());
    // Every class of the full search, up to renaming the racers, was run.
    let perms = [
        [0, 1, 2],
        [0, 2, 1],
        [1, 0, 2],
        [1, 2, 0],
        [2, 0, 1],
        [2, 1, 0],
    ];
    let orbit = |s: &[usize]| {
        perms
            .iter()
            .map(|p| class_of(&racers, s, &cat, p))
            .min()
            .unwrap()
    };
    let want: HashSet<_> = all_runs(&racers).iter().map(|s| orbit(s)).collect();
    let got: HashSet<_> = runs
        .iter()
        .filter(|(_, r)| !r)
        .map(|(s, _)| orbit(s))
        .collect();
    assert_eq!(got, want);
}

/// Two racers of 8 steps (12,870 interleavings), each creating under one key with the
/// `savepoint` protocol's statements on `serve`'s tables (a ticket and an event of its
/// own, the receipt of the shared key): the reduced search runs every class of the full
/// search once, and there are few of them.
#[test]
fn two_creates_of_eight_steps_complete_in_few_classes() {
    use crate::interpose::footprint::ForeignKey;
    let mut cat = Catalog::new(
        &[
            "tickets".into(),
            "outbox_events".into(),
            "idempotency_receipts".into(),
        ],
        &[
            ("outbox_events".into(), "tickets".into()),
            ("idempotency_receipts".into(), "tickets".into()),
        ],
    );
    cat.default_isolation = Some(crate::interpose::footprint::Isolation::ReadCommitted);
    cat.unique_keys.insert(
        "tickets".into(),
        vec![vec!["id".into()], vec!["tenant_id".into(), "id".into()]],
    );
    cat.unique_keys
        .insert("outbox_events".into(), vec![vec!["id".into()]]);
    cat.unique_keys.insert(
        "idempotency_receipts".into(),
        vec![vec!["tenant_id".into(), "idempotency_key".into()]],
    );
    for (child, columns) in [
        ("outbox_events", ["tenant_id", "aggregate_id"]),
        ("idempotency_receipts", ["tenant_id", "ticket_id"]),
    ] {
        cat.references.push(ForeignKey {
            child: child.into(),
            child_columns: columns.iter().map(|c| c.to_string()).collect(),
            parent: "tickets".into(),
            parent_columns: vec!["tenant_id".into(), "id".into()],
        });
    }
    let cat = cat.keys_as_text();
    let create = |n: &str| -> Vec<String> {
        vec![
            "BEGIN".into(),
            "SELECT tenant_id, idempotency_key, payload_hash, ticket_id, created_at \
             FROM idempotency_receipts WHERE tenant_id = $1 AND idempotency_key = $2 | A | k1"
                .into(),
            "SAVEPOINT ticketflow_create".into(),
            format!("INSERT INTO tickets (id, tenant_id, title) VALUES ($1, $2, $3) | t-{n} | A | x"),
            format!(
                "INSERT INTO outbox_events (id, aggregate_id, tenant_id, event_type) \
                 VALUES ($1, $2, $3, $4) | e-{n} | t-{n} | A | ticket.created"
            ),
            format!(
                "INSERT INTO idempotency_receipts (tenant_id, idempotency_key, payload_hash, ticket_id) \
                 VALUES ($1, $2, $3, $4) | A | k1 | h | t-{n}"
            ),
            "RELEASE SAVEPOINT ticketflow_create".into(),
            "COMMIT".into(),
        ]
    };
    let (a, b) = (create("1"), create("2"));
    let racers: Vec<Vec<&str>> = vec![
        a.iter().map(String::as_str).collect(),
        b.iter().map(String::as_str).collect(),
    ];
    let ident = vec![0, 1];
    let runs = reduced_runs(&racers, &cat, ident.clone());
    let full = all_runs(&racers);
    assert_eq!(full.len(), 12_870);
    let want: HashSet<_> = full
        .iter()
        .map(|s| class_of(&racers, s, &cat, &ident))
        .collect();
    let got: Vec<_> = runs
        .iter()
        .filter(|(_, r)| !r)
        .map(|(s, _)| class_of(&racers, s, &cat, &ident))
        .collect();
    assert_eq!(got.iter().cloned().collect::<HashSet<_>>(), want);
    assert!(want.len() <= 145, "{} classes", want.len());
    assert!(runs.len() <= 2 * want.len(), "{} runs", runs.len());
}

/// Two groups of two racers that never touch each other's relation: each group's classes
/// are all run, beside one order of the other group, in fewer runs than their product.
#[test]
fn independent_groups_are_explored_one_at_a_time() {
    let cat = catalog();
    let on = |r: &'static str| -> Vec<&'static str> {
        match r {
            "keys" => vec![
                "BEGIN",
                "SELECT * FROM keys",
                "INSERT INTO keys VALUES ($1)",
                "COMMIT",
            ],
            _ => vec![
                "BEGIN",
                "SELECT * FROM orders",
                "INSERT INTO orders VALUES ($1)",
                "COMMIT",
            ],
        }
    };
    let racers = vec![on("keys"), on("keys"), on("orders"), on("orders")];
    let runs = reduced_runs_of(&racers, &cat, vec![0, 1, 2, 3], &[vec![0, 0, 1, 1]]);
    let explored: Vec<&Vec<usize>> = runs.iter().filter(|(_, r)| !r).map(|(s, _)| s).collect();
    let mut product = 1;
    for group in [[0, 1], [2, 3]] {
        let alone = vec![racers[group[0]].clone(), racers[group[1]].clone()];
        let ident = vec![0, 1];
        let want: HashSet<_> = all_runs(&alone)
            .iter()
            .map(|s| class_of(&alone, s, &cat, &ident))
            .collect();
        let got: HashSet<_> = explored
            .iter()
            .map(|s| {
                let projected: Vec<usize> = s
                    .iter()
                    .filter_map(|r| group.iter().position(|g| g == r))
                    .collect();
                class_of(&alone, &projected, &cat, &ident)
            })
            .collect();
        assert_eq!(got, want, "group {group:?}");
        product *= want.len();
    }
    assert!(
        runs.len() < product,
        "{} runs, {product} in the product",
        runs.len()
    );
    // Tied by one step seen dependent: the product again.
    let mut tied = racers.clone();
    tied[3] = vec![
        "BEGIN",
        "SELECT * FROM keys",
        "INSERT INTO orders VALUES ($1)",
        "COMMIT",
    ];
    let runs = reduced_runs_of(&tied, &cat, vec![0, 1, 2, 3], &[vec![0, 0, 1, 1]]);
    assert!(runs.len() >= product, "{} runs", runs.len());
}

/// Two racers whose steps include one the relation cannot classify (a sequence's next
/// value may decide what each does): with racer 0 first (the one choice symmetry makes
/// before anything ran), every class of the full search is run, names not swapped.
#[test]
fn a_step_not_classified_ends_symmetry() {
    let cat = catalog();
    let numbered = vec![
        "SELECT nextval('tickets')",
        "INSERT INTO keys VALUES ($1)",
        "COMMIT",
    ];
    let racers = vec![numbered.clone(), numbered];
    let ident = vec![0, 1];
    let runs = reduced_runs(&racers, &cat, vec![0, 0]);
    let got: HashSet<_> = runs
        .iter()
        .filter(|(_, r)| !r)
        .map(|(s, _)| class_of(&racers, s, &cat, &ident))
        .collect();
    for s in all_runs(&racers).iter().filter(|s| s[0] == 0) {
        let class = class_of(&racers, s, &cat, &ident);
        assert!(got.contains(&class), "{s:?} not run");
    }
}

#[test]
fn independent_racers_need_one_schedule() {
    let cat = catalog();
    let racers = vec![
        vec!["INSERT INTO keys VALUES (1)", "SELECT 1"],
        vec!["INSERT INTO audit VALUES (1)", "SET x = 1"],
    ];
    let runs = reduced_runs(&racers, &cat, vec![0, 1]);
    assert_eq!(runs.len(), 1, "{runs:?}");
}

/// Three independent groups; two runs out at once; one of them finds groups 0 and 1 tied
/// (the service took another path), so the search starts over with the other run still out.
/// When that stale run comes back last, the search still moves on to the group left apart,
/// and says complete only once every group's search is done.
#[test]
fn a_run_from_before_a_restart_coming_back_last_still_moves_the_groups_on() {
    let cat = catalog();
    // Each statement its own transaction: a read, an insert, a read.
    let on = |table: &'static str, v: &'static str| -> Vec<&'static str> {
        let insert: &'static str =
            Box::leak(format!("INSERT INTO {table} VALUES ($1) | {v}").into_boxed_str());
        let select: &'static str = Box::leak(format!("SELECT * FROM {table}").into_boxed_str());
        vec![select, insert, select]
    };
    let racers = vec![
        on("keys", "1"),
        on("keys", "1"),
        on("orders", "2"),
        on("orders", "2"),
        on("audit", "3"),
        on("audit", "3"),
    ];
    // Racer 2 reads the keys table in this path: groups 0 and 1 tied.
    let mut tied = racers.clone();
    tied[2] = vec![
        "SELECT * FROM keys",
        "INSERT INTO orders VALUES ($1) | 2",
        "SELECT * FROM orders",
    ];
    let intents = [vec![0, 0, 1, 1, 2, 2]];
    let mut search = Reduced::new(Some(cat.clone()), vec![(0..6).collect()], &intents);
    let record = |search: &mut Reduced, model: &[Vec<&str>], mut c: SleepChooser| {
        let (points, steps) = model_run(model, &mut c);
        let n = points.len();
        search.record(&points, &steps, &[n], &c, &[]);
    };
    let root = search.next_chooser().unwrap();
    record(&mut search, &racers, root);
    assert_eq!(search.groups(), 3);
    // Runs one at a time until two can be out at once.
    let (first, second) = loop {
        let a = search
            .next_chooser()
            .expect("the first group has classes to run");
        match search.next_chooser() {
            Some(b) => break (a, b),
            None => record(&mut search, &racers, a),
        }
    };
    record(&mut search, &tied, first);
    assert_eq!(search.restarts, 1);
    // The new search runs to its end while the stale run is out.
    while let Some(c) = search.next_chooser() {
        record(&mut search, &tied, c);
    }
    assert!(!search.complete(), "a run is still out");
    record(&mut search, &tied, second);
    // The group left apart (racers 4 and 5) has races of its own: its search runs now.
    let mut after = 0;
    while let Some(c) = search.next_chooser() {
        record(&mut search, &tied, c);
        after += 1;
    }
    assert!(after > 0, "the group left apart was never explored");
    assert!(search.complete());
    assert_eq!(search.groups(), 2);
}
