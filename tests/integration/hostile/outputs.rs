//! Report directories with foreign files and symlinks, and traversal names: the tool removes only what its manifest lists and writes only inside its output directory.

use std::path::{Path, PathBuf};

use crate::cli::{run_cli_in, Output};
use crate::support::repo_path;

/// A work directory with `scenarios/` holding the shipped scenario a (and b when `two`).
fn workdir(two: bool) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let scen = dir.path().join("scenarios");
    std::fs::create_dir(&scen).unwrap();
    std::fs::copy(
        repo_path("scenarios/a-same-key-same-body.toml"),
        scen.join("a.toml"),
    )
    .unwrap();
    if two {
        std::fs::copy(
            repo_path("scenarios/b-committed-receipt-different-body.toml"),
            scen.join("b.toml"),
        )
        .unwrap();
    }
    dir
}

/// `verify` over the SQLite runs of scenarios a and b only (no PostgreSQL, no self-checks:
/// a fraction of a second), writing its report to `report`, plus `extra` arguments.
fn verify(dir: &Path, report: &str, extra: &[&str]) -> Output {
    let args = [
        "verify",
        "--backend",
        "sqlite",
        "--sqlite-journal",
        "wal",
        "--sqlite-tx",
        "lazy",
        "--filter",
        "a-same",
        "--filter",
        "b-committed",
        "--report",
        report,
    ];
    run_cli_in(dir, &[&args[..], extra].concat(), b"")
}

fn read(path: impl AsRef<Path>) -> String {
    std::fs::read_to_string(path.as_ref())
        .unwrap_or_else(|e| panic!("{}: {e}", path.as_ref().display()))
}

/// Every file under `dir`, recursively (symlinks not followed), relative to it.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let t = e.file_type().unwrap();
            if t.is_dir() {
                todo.push(e.path());
            } else {
                out.push(e.path().strip_prefix(dir).unwrap().to_path_buf());
            }
        }
    }
    out.sort();
    out
}

/// Foreign `*.md` in reports/details and `*.spec` in isolation-specs survive a run; a detail
/// page the previous run wrote for a scenario that is gone is removed (it is in the manifest).
#[test]
fn foreign_details_and_specs_are_kept_and_only_our_stale_pages_removed() {
    let dir = workdir(true);
    let out = dir.path().join("out");
    let details = out.join("reports/details");
    let specs = out.join("isolation-specs");
    std::fs::create_dir_all(&details).unwrap();
    std::fs::create_dir_all(&specs).unwrap();
    std::fs::write(details.join("notes.md"), "mine\n").unwrap();
    std::fs::write(specs.join("hand-written.spec"), "mine\n").unwrap();

    let first = verify(dir.path(), "out/X.md", &[]);
    assert_eq!(first.code, 0, "{}{}", first.stdout, first.stderr);
    assert_eq!(read(details.join("notes.md")), "mine\n");
    assert_eq!(read(specs.join("hand-written.spec")), "mine\n");
    let b_page = details.join("scenario-b-committed-receipt-different-body.md");
    assert!(b_page.exists(), "{:?}", files_under(&out));
    let manifest: serde_json::Value =
        serde_json::from_str(&read(details.join(".ticketflow-manifest.json"))).unwrap();
    assert_eq!(manifest["version"], 1);
    assert!(manifest["tool"].as_str().is_some_and(|v| !v.is_empty()));
    let listed = manifest["files"].as_array().unwrap();
    assert!(listed.contains(&"scenario-b-committed-receipt-different-body.md".into()));
    assert!(!listed.contains(&"notes.md".into()), "{listed:?}");

    // Scenario b is gone: its page (ours, listed) goes, the foreign files stay.
    std::fs::remove_file(dir.path().join("scenarios/b.toml")).unwrap();
    let second = verify(dir.path(), "out/X.md", &[]);
    assert_eq!(second.code, 0, "{}{}", second.stdout, second.stderr);
    assert!(!b_page.exists(), "a stale page of ours is removed");
    assert!(details.join("scenario-a-same-key-same-body.md").exists());
    assert_eq!(read(details.join("notes.md")), "mine\n");
    assert_eq!(read(specs.join("hand-written.spec")), "mine\n");
}

/// A details folder (or isolation-specs folder, or report file) that is a symlink to
/// somewhere else is refused before anything runs (exit 2, naming it); nothing there is
/// removed or written.
#[test]
fn symlinked_output_folders_and_files_are_refused_and_left_alone() {
    let dir = workdir(false);
    let elsewhere = dir.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    std::fs::write(elsewhere.join("precious.md"), "keep\n").unwrap();
    std::fs::write(elsewhere.join("precious.spec"), "keep\n").unwrap();
    let before = files_under(&elsewhere);

    for (link, what) in [
        ("out1/reports/details", "reports/details"),
        ("out2/isolation-specs", "isolation-specs"),
        ("out3/reports", "reports"),
    ] {
        let link = dir.path().join(link);
        std::fs::create_dir_all(link.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &link).unwrap();
        let report = format!("{}/X.md", link.parent().unwrap().display());
        let report = report.replace("/reports/X.md", "/X.md");
        let ran = verify(dir.path(), &report, &[]);
        assert_eq!(ran.code, 2, "{what}: {}{}", ran.stdout, ran.stderr);
        assert!(ran.stderr.contains("symlink"), "{what}: {}", ran.stderr);
        assert!(ran.stderr.contains(what), "{what}: {}", ran.stderr);
        assert!(ran.stdout.is_empty(), "nothing ran: {}", ran.stdout);
        // --force does not write through a symlink either.
        let forced = verify(dir.path(), &report, &["--force"]);
        assert_eq!(forced.code, 2, "{what}: {}{}", forced.stdout, forced.stderr);
        assert_eq!(files_under(&elsewhere), before, "{what}");
        assert_eq!(read(elsewhere.join("precious.md")), "keep\n");
    }

    // The report file itself a symlink to a file elsewhere: refused, the file unchanged.
    std::fs::create_dir(dir.path().join("out4")).unwrap();
    std::os::unix::fs::symlink(elsewhere.join("precious.md"), dir.path().join("out4/X.md"))
        .unwrap();
    for extra in [&[][..], &["--force"][..]] {
        let ran = verify(dir.path(), "out4/X.md", extra);
        assert_eq!(ran.code, 2, "{extra:?}: {}{}", ran.stdout, ran.stderr);
        assert!(ran.stderr.contains("symlink"), "{}", ran.stderr);
        assert_eq!(read(elsewhere.join("precious.md")), "keep\n");
    }
}

/// An existing report file the tool did not write (REPORT.md or report.json) is refused
/// without --force (exit 2, naming the file, before anything runs) and replaced with it;
/// after that it is ours and a plain run rewrites it.
#[test]
fn a_foreign_report_file_is_refused_without_force() {
    let dir = workdir(false);
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    std::fs::write(out.join("X.md"), "my notes\n").unwrap();

    let refused = verify(dir.path(), "out/X.md", &[]);
    assert_eq!(refused.code, 2, "{}{}", refused.stdout, refused.stderr);
    assert!(refused.stderr.contains("out/X.md"), "{}", refused.stderr);
    assert!(refused.stderr.contains("--force"), "{}", refused.stderr);
    assert!(refused.stdout.is_empty(), "nothing ran: {}", refused.stdout);
    assert_eq!(read(out.join("X.md")), "my notes\n");
    assert!(!out.join("report.json").exists());

    let forced = verify(dir.path(), "out/X.md", &["--force"]);
    assert_eq!(forced.code, 0, "{}{}", forced.stdout, forced.stderr);
    assert!(read(out.join("X.md")).starts_with("# TicketFlow Verify report"));
    let again = verify(dir.path(), "out/X.md", &[]);
    assert_eq!(again.code, 0, "ours now: {}{}", again.stdout, again.stderr);

    // A report.json beside a new REPORT.md that the tool did not write.
    let other = dir.path().join("other");
    std::fs::create_dir(&other).unwrap();
    std::fs::write(other.join("report.json"), "{\"mine\": true}\n").unwrap();
    let refused = verify(dir.path(), "other/REPORT.md", &[]);
    assert_eq!(refused.code, 2, "{}{}", refused.stdout, refused.stderr);
    assert!(
        refused.stderr.contains("other/report.json"),
        "{}",
        refused.stderr
    );
    assert_eq!(read(other.join("report.json")), "{\"mine\": true}\n");
    assert!(!other.join("REPORT.md").exists());

    // scenario run --report: the same rule.
    std::fs::write(out.join("Y.md"), "mine too\n").unwrap();
    let run = [
        "scenario",
        "run",
        "scenarios/a.toml",
        "--backend",
        "sqlite",
        "--sqlite-journal",
        "wal",
        "--sqlite-tx",
        "lazy",
        "--report",
        "out/Y.md",
    ];
    let refused = run_cli_in(dir.path(), &run, b"");
    assert_eq!(refused.code, 2, "{}{}", refused.stdout, refused.stderr);
    assert!(refused.stderr.contains("out/Y.md"), "{}", refused.stderr);
    assert_eq!(read(out.join("Y.md")), "mine too\n");
    let forced = run_cli_in(dir.path(), &[&run[..], &["--force"]].concat(), b"");
    assert_eq!(forced.code, 0, "{}{}", forced.stdout, forced.stderr);
    assert!(read(out.join("Y.md")).starts_with("# TicketFlow Verify report"));
}

/// A scenario named `../../x` (or an empty or blank name) is a load error (exit 2, naming the
/// file) and nothing is written anywhere: not above the report folder, not in it.
#[test]
fn traversal_and_blank_names_are_load_errors_and_nothing_is_written() {
    let a = std::fs::read_to_string(repo_path("scenarios/a-same-key-same-body.toml")).unwrap();
    for bad in ["../../x", "../../../../x", "", "   ", "a/b", "."] {
        let dir = tempfile::tempdir().unwrap();
        let deep = dir.path().join("one/two");
        std::fs::create_dir_all(deep.join("scenarios")).unwrap();
        let text = a.replace(
            "name = \"a-same-key-same-body\"",
            &format!("name = {bad:?}"),
        );
        assert_ne!(text, a);
        std::fs::write(deep.join("scenarios/a.toml"), text).unwrap();
        let before = files_under(dir.path());
        for args in [
            &["verify", "--backend", "sqlite", "--report", "out/X.md"][..],
            &[
                "scenario",
                "run",
                "scenarios/a.toml",
                "--report",
                "out/X.md",
            ][..],
        ] {
            let ran = run_cli_in(&deep, args, b"");
            assert_eq!(
                ran.code, 2,
                "{bad:?} {args:?}: {}{}",
                ran.stdout, ran.stderr
            );
            assert!(
                ran.stderr.contains("a.toml") && ran.stderr.contains("scenario name"),
                "{bad:?}: {}",
                ran.stderr
            );
            assert_eq!(files_under(dir.path()), before, "{bad:?} {args:?}");
        }
    }
}
