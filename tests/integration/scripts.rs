//! The set-up scripts on a fresh machine, run against fake programs in a
//! temporary directory (PATH holds only them and a few coreutils; `/etc/postgresql` is
//! replaced by `TICKETFLOW_PG_ETC`), so the shared PostgreSQL and Redis are never touched:
//! `scripts/pg-up` reloads the cluster after adding its trust lines and then checks the login,
//! failing loudly with what to do; `scripts/tools-up` finds and installs what CI and the tests
//! call.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::repo_path;

/// A temporary PATH directory: `bin/` with symlinks to real programs and fake ones, and
/// `state/` where the fakes keep what happened.
struct Sandbox {
    dir: tempfile::TempDir,
}

impl Sandbox {
    /// `bin/` with bash and the coreutils the scripts use, nothing else.
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("bin")).unwrap();
        std::fs::create_dir(dir.path().join("state")).unwrap();
        let sandbox = Sandbox { dir };
        for tool in [
            "bash", "sh", "sed", "ls", "sort", "tail", "seq", "sleep", "grep", "cat", "mkdir",
            "cp", "touch", "id",
        ] {
            let real = ["/usr/bin", "/bin"]
                .iter()
                .map(|d| Path::new(d).join(tool))
                .find(|p| p.exists())
                .unwrap_or_else(|| panic!("{tool} not found in /usr/bin or /bin"));
            std::os::unix::fs::symlink(real, sandbox.bin().join(tool)).unwrap();
        }
        sandbox
    }

    fn bin(&self) -> PathBuf {
        self.dir.path().join("bin")
    }

    fn state(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    fn etc(&self) -> PathBuf {
        self.dir.path().join("etc")
    }

    /// A fake program: `body` is sh, with `$STATE`, `$ETC` and `$BIN` set.
    fn fake(&self, name: &str, body: &str) {
        use std::os::unix::fs::PermissionsExt as _;
        let path = self.bin().join(name);
        let text = format!(
            "#!/bin/sh\nSTATE='{}'\nETC='{}'\nBIN='{}'\n{body}\n",
            self.state().display(),
            self.etc().display(),
            self.bin().display()
        );
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    /// A file under `state/`, empty when absent.
    fn read(&self, name: &str) -> String {
        std::fs::read_to_string(self.state().join(name)).unwrap_or_default()
    }

    /// Runs `script` (with `args`) with PATH = `bin/` only: (exit code, stderr).
    fn run(&self, script: &str, args: &[&str]) -> (i32, String) {
        // A script that would edit the real /etc/postgresql is never run from here.
        let text = std::fs::read_to_string(repo_path(script)).unwrap();
        assert!(
            !text.contains("/etc/postgresql") || text.contains("TICKETFLOW_PG_ETC"),
            "{script} does not take TICKETFLOW_PG_ETC: not run, it would touch the real cluster"
        );
        let out = Command::new(self.bin().join("bash"))
            .arg(repo_path(script))
            .args(args)
            .env_clear()
            .env("PATH", self.bin())
            .env("TICKETFLOW_PG_ETC", self.etc())
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// A PostgreSQL 15 cluster as the fakes see it: `pg_hba.conf` (as on disk), whether it
    /// runs, and the hba it loaded; `pg_isready` answers when it runs, `psql` logs in when the
    /// loaded hba trusts loopback, `pg_ctlcluster` starts and reloads it (each call logged in
    /// `state/calls`).
    fn postgres(&self, hba: Option<&str>, running: bool, loaded: &str) {
        if let Some(hba) = hba {
            std::fs::create_dir_all(self.etc().join("15/main")).unwrap();
            std::fs::write(self.etc().join("15/main/pg_hba.conf"), hba).unwrap();
        }
        if running {
            std::fs::write(self.state().join("running"), "").unwrap();
        }
        std::fs::write(self.state().join("loaded_hba"), loaded).unwrap();
        self.fake("pg_isready", r#"[ -e "$STATE/running" ]"#);
        self.fake(
            "psql",
            r#"grep -q '127.0.0.1/32 trust' "$STATE/loaded_hba" && exit 0
echo 'psql: error: FATAL:  password authentication failed for user "postgres"' >&2
exit 2"#,
        );
    }

    /// The fake `pg_ctlcluster`.
    fn pg_ctlcluster(&self) {
        self.fake(
            "pg_ctlcluster",
            r#"echo "$*" >> "$STATE/calls"
case "$*" in
  *" reload") [ -e "$STATE/running" ] || exit 1; cp "$ETC/15/main/pg_hba.conf" "$STATE/loaded_hba" ;;
  *" start") [ -e "$STATE/running" ] && exit 2; touch "$STATE/running"; cp "$ETC/15/main/pg_hba.conf" "$STATE/loaded_hba" ;;
esac"#,
        );
    }
}

const SCRAM_HBA: &str = "local all postgres peer\nhost all all 127.0.0.1/32 scram-sha-256\n";
const MARKED_HBA: &str = "# ticketflow: trust loopback\nhost all all 127.0.0.1/32 trust\nhost all all ::1/128 trust\nlocal all postgres peer\nhost all all 127.0.0.1/32 scram-sha-256\n";

/// A fresh machine: apt-get installs PostgreSQL, whose package starts the cluster with its own
/// pg_hba.conf; pg-up adds the trust lines, reloads, and the login works. (It once edited the
/// file without a reload: the running server kept refusing the tests' login.)
#[test]
fn pg_up_on_a_fresh_machine_installs_adds_trust_reloads_and_logs_in() {
    let sandbox = Sandbox::new();
    if !is_root() {
        eprintln!("skipping: pg-up installs only as root");
        return;
    }
    sandbox.postgres(None, false, SCRAM_HBA);
    let fake_pg_ctlcluster = sandbox.bin().join("pg_ctlcluster.installed");
    // apt-get "installs" pg_ctlcluster and the cluster's files, and starts it (as Debian's
    // package does where it can).
    sandbox.pg_ctlcluster();
    std::fs::rename(sandbox.bin().join("pg_ctlcluster"), &fake_pg_ctlcluster).unwrap();
    sandbox.fake(
        "apt-get",
        &format!(
            r#"echo "apt-get $*" >> "$STATE/calls"
case "$*" in *install*postgresql*)
  mkdir -p "$ETC/15/main"; printf '{}' > "$ETC/15/main/pg_hba.conf"
  cp "$ETC/15/main/pg_hba.conf" "$STATE/loaded_hba"; touch "$STATE/running"
  cp '{}' "$BIN/pg_ctlcluster" ;;
esac"#,
            SCRAM_HBA.replace('\n', "\\n"),
            fake_pg_ctlcluster.display()
        ),
    );
    let (code, stderr) = sandbox.run("scripts/pg-up", &[]);
    assert_eq!(code, 0, "{stderr}\ncalls:\n{}", sandbox.read("calls"));
    let hba = std::fs::read_to_string(sandbox.etc().join("15/main/pg_hba.conf")).unwrap();
    assert!(hba.starts_with(MARKED_HBA.lines().next().unwrap()), "{hba}");
    assert!(hba.contains("host all all 127.0.0.1/32 trust"), "{hba}");
    assert!(
        sandbox.read("calls").contains("15 main reload"),
        "no reload after editing pg_hba.conf: {}",
        sandbox.read("calls")
    );
    assert!(sandbox.read("loaded_hba").contains("127.0.0.1/32 trust"));
    // Run again: nothing to do, no second edit.
    let (code, stderr) = sandbox.run("scripts/pg-up", &[]);
    assert_eq!(code, 0, "{stderr}");
    let again = std::fs::read_to_string(sandbox.etc().join("15/main/pg_hba.conf")).unwrap();
    assert_eq!(again, hba);
}

/// A machine an older pg-up set up: the trust lines are in pg_hba.conf, the server never
/// re-read it. pg-up reloads (its own lines) and the login works.
#[test]
fn pg_up_reloads_a_cluster_that_never_read_its_trust_lines() {
    let sandbox = Sandbox::new();
    sandbox.postgres(Some(MARKED_HBA), true, SCRAM_HBA);
    sandbox.pg_ctlcluster();
    let (code, stderr) = sandbox.run("scripts/pg-up", &[]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        sandbox.read("calls"),
        "--skip-systemctl-redirect 15 main reload\n"
    );
}

/// A server that refuses the login, with a pg_hba.conf that is not ours: pg-up changes
/// nothing, exits 1 and says what to do. With the login working it says nothing.
#[test]
fn pg_up_fails_loudly_when_the_login_is_refused_and_is_silent_when_it_works() {
    let sandbox = Sandbox::new();
    sandbox.postgres(Some(SCRAM_HBA), true, SCRAM_HBA);
    sandbox.pg_ctlcluster();
    let (code, stderr) = sandbox.run("scripts/pg-up", &[]);
    assert_eq!(code, 1, "{stderr}");
    for what in [
        "the login as postgres://postgres@127.0.0.1:5432/postgres fails",
        "password authentication failed",
        "host all all 127.0.0.1/32 trust",
        "pg_hba.conf",
        "reload",
        "DATABASE_URL=",
    ] {
        assert!(stderr.contains(what), "{what}: {stderr}");
    }
    assert_eq!(sandbox.read("calls"), "", "nothing touched");
    let hba = std::fs::read_to_string(sandbox.etc().join("15/main/pg_hba.conf")).unwrap();
    assert_eq!(hba, SCRAM_HBA);

    std::fs::write(sandbox.state().join("loaded_hba"), MARKED_HBA).unwrap();
    let (code, stderr) = sandbox.run("scripts/pg-up", &[]);
    assert_eq!((code, stderr.as_str()), (0, ""));
}

/// tools-up --check names each missing program with the package that provides it and the
/// commands that would install them, and installs nothing; on this machine (set up by
/// scripts/test) nothing is missing.
#[test]
fn tools_up_check_names_what_is_missing_and_how_to_install_it() {
    let sandbox = Sandbox::new();
    // cargo without rustfmt (rustup's proxy answers, the component is missing), with clippy.
    sandbox.fake(
        "cargo",
        r#"echo "cargo $*" >> "$STATE/calls"; [ "$1" = clippy ]"#,
    );
    sandbox.fake("rustup", r#"echo "rustup $*" >> "$STATE/calls""#);
    sandbox.fake("apt-get", r#"echo "apt-get $*" >> "$STATE/calls""#);
    let (code, stderr) = sandbox.run("scripts/tools-up", &["--check"]);
    assert_eq!(code, 1, "{stderr}");
    for what in [
        "kill (procps)",
        "psql (postgresql-client)",
        "pg_config (postgresql-client)",
        "pgbench (postgresql)",
        "pg_ctlcluster (postgresql-common)",
        "redis-cli (redis-tools)",
        "cargo fmt (rustfmt)",
        "would run: rustup component add rustfmt\n",
        "apt-get install -y -qq procps postgresql-client postgresql postgresql-common redis-tools",
    ] {
        assert!(stderr.contains(what), "{what}: {stderr}");
    }
    assert!(!stderr.contains("clippy"), "{stderr}");
    assert!(
        !sandbox.read("calls").contains("rustup") && !sandbox.read("calls").contains("apt-get"),
        "--check installs nothing: {}",
        sandbox.read("calls")
    );

    let here = Command::new(repo_path("scripts/tools-up"))
        .arg("--check")
        .output()
        .unwrap();
    assert!(
        here.status.success(),
        "run scripts/tools-up: {}",
        String::from_utf8_lossy(&here.stderr)
    );
}

/// tools-up without --check installs: the rustup components, then the Debian packages as
/// root (else it says what to install and exits 1).
#[test]
fn tools_up_installs_components_and_packages() {
    let sandbox = Sandbox::new();
    sandbox.fake(
        "cargo",
        r#"[ "$1" = fmt ] && [ ! -e "$STATE/rustfmt" ] && exit 1; exit 0"#,
    );
    sandbox.fake(
        "rustup",
        r#"echo "rustup $*" >> "$STATE/calls"; touch "$STATE/rustfmt""#,
    );
    sandbox.fake("apt-get", r#"echo "apt-get $*" >> "$STATE/calls""#);
    sandbox.fake("kill", "exit 0");
    sandbox.fake("psql", "exit 0");
    sandbox.fake("pg_isready", "exit 0");
    sandbox.fake("pg_ctlcluster", "exit 0");
    sandbox.fake("redis-cli", "exit 0");
    let lib = sandbox.dir.path().join("lib");
    std::fs::create_dir_all(lib.join("pgxs/src/test/isolation")).unwrap();
    std::fs::copy(
        sandbox.bin().join("psql"),
        lib.join("pgxs/src/test/isolation/isolationtester"),
    )
    .unwrap();
    sandbox.fake("pg_config", &format!("echo '{}'", lib.display()));
    // Only pgbench and rustfmt are missing.
    let (code, stderr) = sandbox.run("scripts/tools-up", &[]);
    let calls = sandbox.read("calls");
    assert!(
        calls.starts_with("rustup component add rustfmt\n"),
        "{calls}"
    );
    if is_root() {
        assert_eq!(code, 0, "{stderr}");
        assert!(
            calls.contains("apt-get update -qq\napt-get install -y -qq postgresql\n"),
            "{calls}"
        );
    } else {
        assert_eq!(code, 1, "{stderr}");
        assert!(
            stderr.contains("install the packages postgresql"),
            "{stderr}"
        );
    }
    assert!(
        stderr.contains("missing: pgbench (postgresql), cargo fmt (rustfmt)"),
        "{stderr}"
    );
}

/// Whether the tests run as root (the scripts install only then).
fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}
