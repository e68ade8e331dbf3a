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
