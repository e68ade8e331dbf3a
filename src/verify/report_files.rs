//! Where `verify` writes: the report's location and its sibling files, the output folders
//! claimed before anything runs, and the report's context (commit, options).

use super::*;

/// Where an ordinary `verify` writes its report (gitignored in this repository): a run's
/// outputs never touch the tracked evidence unless `--update-report` asks for it.
pub const OUTPUT_DIR: &str = "ticketflow-report";

/// Where REPORT.md goes, from `--report` (`explicit`), `--update-report` and the options that
/// narrowed the run (`narrowed_by`, from [`narrowed_by`]):
/// - `--update-report`: the tracked `REPORT.md` in the working directory (with its details
///   under `reports/details/`), only from a full run without `--report`;
/// - `--report PATH`: there;
/// - otherwise [`OUTPUT_DIR`]`/REPORT.md`, or [`OUTPUT_DIR`]`/partial/REPORT.md` for a narrowed
///   run, so a partial report never replaces a full one.
///
/// The folder is created when missing (but for `--update-report`'s, the working directory).
///
/// Will return `Err` ([`VerifyError::UpdateReport`], [`VerifyError::UpdateReportNarrowed`]) for
/// `--update-report` with `--report` or a narrowing option, or [`VerifyError::ReportPath`]
/// when the folder cannot be created.
pub fn report_location(
    explicit: Option<&Path>,
    update_report: bool,
    narrowed_by: &[String],
) -> Result<PathBuf, VerifyError> {
    let path = report_path(explicit, update_report, narrowed_by)?;
    let dir = path.parent().unwrap_or(Path::new(""));
    if !update_report && !dir.as_os_str().is_empty() {
        std::fs::create_dir_all(dir).map_err(|e| VerifyError::ReportPath {
            path: dir.to_path_buf(),
            why: format!("cannot create the output folder: {e}"),
        })?;
    }
    Ok(path)
}

/// Whether `dir` is the shipped `scenarios/` of the working directory (the same directory,
/// however written): the only one `--update-report` takes.
pub fn is_shipped_scenarios(dir: &Path) -> bool {
    match (
        std::fs::canonicalize(dir),
        std::fs::canonicalize(DEFAULT_SCENARIOS),
    ) {
        (Ok(given), Ok(shipped)) => given == shipped,
        _ => dir == Path::new(DEFAULT_SCENARIOS),
    }
}

/// The scenario directory `verify` and `scenario run` read by default (`--scenarios`).
pub const DEFAULT_SCENARIOS: &str = "scenarios";

/// [`report_location`]'s choice of path, without creating any folder.
///
/// Will return `Err` as [`report_location`] does for `--update-report`.
pub fn report_path(
    explicit: Option<&Path>,
    update_report: bool,
    narrowed_by: &[String],
) -> Result<PathBuf, VerifyError> {
    match (explicit, update_report) {
        (Some(_), true) => Err(VerifyError::UpdateReport(
            "it always writes REPORT.md in the working directory; drop --report",
        )),
        (None, true) if !narrowed_by.is_empty() => {
            Err(VerifyError::UpdateReportNarrowed(narrowed_by.to_vec()))
        }
        (None, true) => Ok(PathBuf::from("REPORT.md")),
        (Some(path), false) => Ok(path.to_path_buf()),
        (None, false) if narrowed_by.is_empty() => Ok(Path::new(OUTPUT_DIR).join("REPORT.md")),
        (None, false) => Ok(Path::new(OUTPUT_DIR).join("partial").join("REPORT.md")),
    }
}

/// The loom report `verify` reads: `ticketflow-report/loom.json` (what `scripts/loom.sh`
/// writes on an ordinary run) when it is usable (fresh for the sources), else the tracked
/// `reports/loom.json` (written by `scripts/loom.sh --update-report`), both beside the
/// scenario directory's parent. Returns the path chosen and the loaded report.
pub fn load_loom(scenarios: &Path) -> (PathBuf, LoomReport) {
    let root = scenarios.join("..");
    let own = root.join(OUTPUT_DIR).join("loom.json");
    if own.exists() {
        let loaded = LoomReport::load(&own);
        if loaded.unusable.is_none() {
            return (own, loaded);
        }
    }
    let tracked = root.join("reports/loom.json");
    let loaded = LoomReport::load(&tracked);
    (tracked, loaded)
}

/// The paths of the three outputs for a REPORT.md path: `(REPORT.md, report.json,
/// report.junit.xml)`, the last two in the same directory.
pub fn output_paths(report: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let dir = report.parent().unwrap_or(Path::new(""));
    (
        report.to_path_buf(),
        dir.join("report.json"),
        dir.join("report.junit.xml"),
    )
}

/// Where isolation-tester specs of failing PostgreSQL runs go: `isolation-specs/` beside
/// REPORT.md.
pub fn spec_dir(report: &Path) -> PathBuf {
    report.parent().unwrap_or(Path::new("")).join(SPEC_DIR)
}

/// The folder, relative to REPORT.md's, of the isolation specs ([`spec_dir`]).
pub const SPEC_DIR: &str = "isolation-specs";

/// The output folders of a report at `report` (REPORT.md's path): its own folder (REPORT.md,
/// `report.json`, `report.steps.json`, `report.junit.xml`; files of an earlier report under
/// another name stay), [`ticketflow_report::markdown::DETAILS_DIR`] and `isolation-specs/` (both
/// swept: a file the previous run listed and this one does not write is removed). Each keeps a
/// manifest ([`ticketflow_harness::outputs`]).
#[derive(Debug)]
pub struct ReportOutputs {
    /// REPORT.md's folder.
    pub root: ticketflow_harness::outputs::OutputDir,
    /// The detail pages' folder.
    pub details: ticketflow_harness::outputs::OutputDir,
    /// The isolation specs' folder ([`spec_dir`]).
    pub specs: ticketflow_harness::outputs::OutputDir,
    /// REPORT.md's file name.
    md_name: String,
}

impl ReportOutputs {
    /// Opens the output folders of a report at `report` and checks, before anything runs,
    /// that REPORT.md, `report.json`, `report.steps.json` and `report.junit.xml` can be
    /// written: none is a symlink or a foreign file (unless `force`), and neither
    /// `reports/`, `reports/details/` nor `isolation-specs/` is a symlink.
    ///
    /// Will return `Err` ([`VerifyError::Refused`]) for the first that cannot, or
    /// ([`VerifyError::ReportPath`]) for a path without a file name.
    pub fn open(report: &Path, force: bool) -> Result<Self, VerifyError> {
        use ticketflow_harness::outputs::OutputDir;
        let base = report.parent().unwrap_or(Path::new(""));
        let md_name = report
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| VerifyError::ReportPath {
                path: report.to_path_buf(),
                why: "it has no file name (UTF-8) to write REPORT.md as".into(),
            })?
            .to_string();
        let outputs = ReportOutputs {
            root: OutputDir::open(base, "", force, false)?,
            details: OutputDir::open(base, ticketflow_report::markdown::DETAILS_DIR, force, true)?,
            specs: OutputDir::open(base, SPEC_DIR, force, true)?,
            md_name,
        };
        for name in outputs.root_names() {
            outputs.root.check(&name)?;
        }
        Ok(outputs)
    }

    /// The file names written into REPORT.md's folder.
    fn root_names(&self) -> [String; 4] {
        [
            self.md_name.clone(),
            "report.json".into(),
            "report.steps.json".into(),
            "report.junit.xml".into(),
        ]
    }
}

/// Writes REPORT.md, its detail files under `reports/details/`, `report.json`,
/// `report.steps.json` and `report.junit.xml` into `outputs` ([`output_paths`]), each
/// rendered for `scope`; `report.json`'s `exit_code` is `exit_code`. Every file is checked
/// before the first is written; then the stale files of the previous run are removed
/// ([`ticketflow_harness::outputs::OutputDir::finish`]) and the manifests written. Returns the paths
/// written: REPORT.md, the details folder, report.json, report.steps.json, report.junit.xml.
///
/// Will return `Err` ([`VerifyError::WriteRefused`]) when one of them cannot be written.
pub(super) fn write_outputs(
    mut outputs: ReportOutputs,
    input: &ReportInput<'_>,
    exit_code: i32,
    scope: &ticketflow_report::Scope,
) -> Result<Vec<PathBuf>, VerifyError> {
    let refused = VerifyError::WriteRefused;
    let details = ticketflow_report::markdown::render_details(input);
    let [md, json, steps, junit] = outputs.root_names();
    let root_files = [
        (md, ticketflow_report::markdown::render_scoped(input, scope)),
        (
            json,
            ticketflow_report::json::render_scoped(input, exit_code, scope),
        ),
        (steps, ticketflow_report::json::render_steps(input)),
        (junit, ticketflow_report::junit::render_scoped(input, scope)),
    ];
    for (name, _) in &details {
        outputs.details.check(name).map_err(refused)?;
    }
    for (name, _) in &root_files {
        outputs.root.check(name).map_err(refused)?;
    }
    for (name, text) in &details {
        outputs
            .details
            .write(name, text.as_bytes())
            .map_err(refused)?;
    }
    let mut written = Vec::new();
    for (name, text) in &root_files {
        written.push(outputs.root.write(name, text.as_bytes()).map_err(refused)?);
    }
    let details_dir = outputs.details.path().to_path_buf();
    outputs.details.finish().map_err(refused)?;
    outputs.specs.finish().map_err(refused)?;
    outputs.root.finish().map_err(refused)?;
    written.insert(1, details_dir);
    Ok(written)
}

/// Fails before anything runs when the outputs cannot be written: `report` is a directory,
/// or its directory does not exist or takes no new file.
pub(super) fn check_report_path(report: &Path) -> Result<(), VerifyError> {
    let bad = |why: String| VerifyError::ReportPath {
        path: report.to_path_buf(),
        why,
    };
    if report.is_dir() {
        return Err(bad("it is a directory".into()));
    }
    let dir = match report.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if !dir.is_dir() {
        return Err(bad(format!("{} is not a directory", dir.display())));
    }
    tempfile::NamedTempFile::new_in(dir)
        .map(drop)
        .map_err(|e| bad(format!("cannot create a file in {}: {e}", dir.display())))
}

/// The report's context of a `verify` run with `opts`: the command line and PostgreSQL URL
/// with any password hidden, the version, the git commit of the working directory (when it is
/// a checkout), the time, the filters, seed and protocol.
pub(super) fn report_context(opts: &VerifyOptions) -> Context {
    use ticketflow_core::store::url::redact;
    Context {
        // Any argument that carries a URL is shown with its password hidden.
        command: std::env::args()
            .enumerate()
            .map(|(i, a)| {
                if i == 0 {
                    "ticketflow".to_string()
                } else {
                    redact(&a)
                }
            })
            .collect::<Vec<_>>()
            .join(" "),
        pg_url: opts.pg.redacted(),
        custom_pg_url: !opts.pg.is_default(),
        version: env!("CARGO_PKG_VERSION").to_string(),
        git_commit: git_commit(),
        generated_at: ticketflow_core::domain::iso8601(ticketflow_core::domain::now_utc()),
        filters: opts.filters.clone(),
        narrowed_by: narrowed_by(opts),
        seed: opts.seed,
        protocol: opts.protocol,
        timings: Timings::default(),
    }
}

/// `git rev-parse HEAD` of the working directory, when it is a git checkout.
pub(super) fn git_commit() -> Option<String> {
    let mut git = std::process::Command::new("git");
    git.args(["rev-parse", "HEAD"]);
    let out = ticketflow_harness::child::output(git).ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    (out.status.success() && !text.trim().is_empty()).then(|| text.trim().to_string())
}
