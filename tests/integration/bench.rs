//! `ticketflow bench --quick` produces every row with a ratio (no timing assertions: the
//! figures of a tiny run on a shared machine mean nothing).

use std::process::Command;

use crate::support::pg_url;

#[test]
fn quick_bench_prints_every_row_with_a_ratio() {
    let pg = pg_url();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ticketflow"));
    cmd.args(["bench", "--quick", "--clients", "1,2", "--racers", "2,3"]);
    match &pg {
        Some(url) => cmd.args(["--backend", "both", "--pg-url", url]),
        None => cmd.args(["--backend", "sqlite"]),
    };
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<Vec<String>> = stdout
        .lines()
        .skip(2)
        .map(|l| l.split('|').map(|c| c.trim().to_string()).collect())
        .collect();
    let mut backends = vec!["sqlite"];
    if pg.is_some() {
        backends.push("postgres");
    }
    for backend in backends {
        for protocol in ["savepoint", "on-conflict"] {
            let expected = [
                ("create", "1"),
                ("create", "2"),
                ("replay", "1"),
                ("replay", "2"),
                ("hot-key", "2"),
                ("converge", "2"),
                ("converge", "3"),
            ];
            for (workload, clients) in expected {
                let row = rows
                    .iter()
                    .find(|r| {
                        r.get(1).map(String::as_str) == Some(backend)
                            && r[2] == protocol
                            && r[3] == workload
                            && r[4] == clients
                    })
                    .unwrap_or_else(|| {
                        panic!("no row {backend} {protocol} {workload} {clients}:\n{stdout}")
                    });
                let ratio: f64 = row[7]
                    .trim_matches('*')
                    .parse()
                    .unwrap_or_else(|_| panic!("row without a numeric ratio: {row:?}"));
                assert!(ratio.is_finite() && ratio > 0.0, "{row:?}");
            }
        }
    }
}

/// `bench --lease` adds a table of the contended rows with and without the lease, every row
/// with its ratios, and the lost inserts it counts drop with the lease: on the converge rows
/// every racer but one loses its receipt insert without the lease (summed over the releases
/// of every backend and protocol, some do), and with it the others wait for the receipt.
#[test]
fn lease_rows_exist_with_ratios_and_the_lease_cuts_lost_inserts() {
    let Some(redis) = crate::lease::redis_url() else {
        return;
    };
    let pg = pg_url();
    let json = tempfile::NamedTempFile::new().unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ticketflow"));
    cmd.args([
        "bench",
        "--quick",
        "--workloads",
        "hot-key,converge",
        "--clients",
        "2",
        "--racers",
        "3,4",
        "--converge-reps",
        "5",
        "--lease",
        &redis,
        "--lease-json",
        json.path().to_str().unwrap(),
    ]);
    match &pg {
        Some(url) => cmd.args(["--backend", "both", "--pg-url", url]),
        None => cmd.args(["--backend", "sqlite"]),
    };
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table: Vec<Vec<String>> = stdout
        .lines()
        .filter(|l| l.starts_with("| lease |"))
        .map(|l| l.split('|').map(|c| c.trim().to_string()).collect())
        .collect();
    let rows: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(json.path()).unwrap()).unwrap();
    let mut backends = vec!["sqlite"];
    if pg.is_some() {
        backends.push("postgres");
    }
    let (mut lost_without, mut lost_with) = (0, 0);
    for backend in backends {
        for protocol in ["savepoint", "on-conflict"] {
            for (workload, clients) in [("hot-key", "2"), ("converge", "3"), ("converge", "4")] {
                let printed = table
                    .iter()
                    .find(|r| {
                        r[2] == backend && r[3] == protocol && r[4] == workload && r[5] == clients
                    })
                    .unwrap_or_else(|| {
                        panic!("no lease row {backend} {protocol} {workload} {clients}:\n{stdout}")
                    });
                let speed: f64 = printed[8]
                    .trim_matches('*')
                    .parse()
                    .unwrap_or_else(|_| panic!("row without a numeric speed ratio: {printed:?}"));
                assert!(speed.is_finite() && speed > 0.0, "{printed:?}");
                let row = rows
                    .iter()
                    .find(|r| {
                        r["backend"] == backend
                            && r["protocol"] == protocol
                            && r["workload"] == workload
                            && r["clients"].as_u64().map(|c| c.to_string()).as_deref()
                                == Some(clients)
                    })
                    .unwrap_or_else(|| panic!("{backend} {protocol} {workload} not in the JSON"));
                assert!(
                    row["transactions_ratio"].as_f64().is_some_and(|r| r > 0.0),
                    "{row}"
                );
                for side in ["without", "with"] {
                    assert!(row[side]["transactions"].as_u64().unwrap() > 0, "{row}");
                }
                assert_eq!(row["without"]["lease"]["held"], 0, "{row}");
                assert!(row["with"]["lease"]["held"].as_u64().unwrap() > 0, "{row}");
                assert_eq!(row["with"]["lease"]["no_lease"], 0, "{row}");
                if workload == "converge" {
                    lost_without += row["without"]["lost_inserts"].as_u64().unwrap();
                    lost_with += row["with"]["lost_inserts"].as_u64().unwrap();
                }
            }
        }
    }
    assert!(
        lost_without > 0,
        "no racer ever lost its receipt insert without the lease: the count is broken\n{stdout}"
    );
    assert!(
        lost_with < lost_without,
        "the lease did not cut the lost inserts ({lost_with} with, {lost_without} without)\n{stdout}"
    );
}

/// `bench --lease` with no Redis there says so and measures nothing; a malformed lease URL
/// is a usage error.
#[test]
fn bench_with_an_unreachable_lease_says_so_and_measures_nothing() {
    let out = Command::new(env!("CARGO_BIN_EXE_ticketflow"))
        .args([
            "bench",
            "--quick",
            "--backend",
            "sqlite",
            "--lease",
            "redis://127.0.0.1:1/0",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("Redis unreachable") && stderr.contains("redis://127.0.0.1:1/0"),
        "{stderr}"
    );
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let out = Command::new(env!("CARGO_BIN_EXE_ticketflow"))
        .args(["bench", "--quick", "--lease", "http://127.0.0.1:6379/0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

/// The Redis pass-through rows of `bench --interposer`: both shapes measured direct, through a
/// plain relay and through the interposer, every reply checked; a Redis that does not answer
/// is an error, not a row.
#[test]
fn the_redis_pass_through_rows_measure_both_shapes_and_refuse_a_silent_redis() {
    use ticketflow_harness::bench::interpose::{redis_pass_through, PIPELINE};
    if !crate::support::redis_up_at("redis://127.0.0.1:6379") {
        return;
    }
    let redis: std::net::SocketAddr = "127.0.0.1:6379".parse().unwrap();
    let mut lines = Vec::new();
    let rows = redis_pass_through(redis, std::time::Duration::from_millis(50), 2, &mut |l| {
        lines.push(l.to_string())
    })
    .unwrap();
    let shapes: Vec<&str> = rows.iter().map(|r| r.shape.as_str()).collect();
    assert_eq!(
        shapes,
        [
            "GET, one at a time".to_string(),
            format!("GET, pipelined {PIPELINE} at a time")
        ]
    );
    for r in &rows {
        assert!(
            r.direct_cps > 0.0 && r.plain_cps > 0.0 && r.through_cps > 0.0,
            "{r:?}"
        );
        assert!(r.ratio.is_finite() && r.ratio > 0.0, "{r:?}");
        assert!(
            r.ratio_to_plain.is_finite() && r.ratio_to_plain > 0.0,
            "{r:?}"
        );
    }
    assert_eq!(
        lines.len(),
        2 * 2 * 3,
        "two shapes, two runs, three sides (direct, plain relay, through): {lines:?}"
    );
    // A port nobody listens on (a listener bound, then closed).
    let silent = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let e = redis_pass_through(silent, std::time::Duration::ZERO, 1, &mut |_| {}).unwrap_err();
    assert!(e.to_string().contains(&silent.to_string()), "{e}");
}
