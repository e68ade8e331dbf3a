//! `ticketflow target init`: a commented starter set of black-box scenarios for a service,
//! from its URL(s), database and table. Five files, each one race of the black-box invariant (docs/PROTOCOL.md §9):
//!
//! 1. `1-same-body.toml`: the same body from N clients across the instances: one effect, one id;
//! 2. `2-two-bodies.toml`: two bodies under one key: one wins, the other is refused;
//! 3. `3-two-scopes.toml`: two scopes (tenants, users, API keys) with one key: each its own
//!    result, never the other's;
//! 4. `4-retry-after-answer.toml`: a retry after the first answer came back: a replay;
//! 5. `5-retry-after-rejected.toml`: a retry after a rejected first attempt: the key is not
//!    poisoned, the valid request creates.

use std::path::{Path, PathBuf};

use super::rules::Preset;

/// What the starter needs to know about the service.
#[derive(Debug, Clone)]
pub struct InitOptions {
    /// Base URLs of the running instances (`http://127.0.0.1:8001`).
    pub urls: Vec<String>,
    /// The service's PostgreSQL database, when the barrier or counts use it. Written as given;
    /// pass `${VAR}` to keep it out of the file.
    pub database_url: Option<String>,
    /// The table whose lock holds the requests (the idempotency-key table, or the business
    /// table the create writes). `None`: an HTTP-level barrier (keys in Redis or memory).
    pub table: Option<String>,
    /// Method of the create request.
    pub method: String,
    /// Path of the create request.
    pub path: String,
    /// The JSON body (a template).
    pub body: serde_json::Value,
    /// A JSON body the service rejects (400/422), for the poisoned-key scenario.
    pub invalid_body: serde_json::Value,
    /// Header carrying the scope (tenant, user); `None`: scopes through `Authorization`.
    pub scope_header: Option<String>,
    /// Header carrying the idempotency key.
    pub key_header: String,
    /// Response rule preset.
    pub preset: Preset,
    /// Named count queries (`name`, SQL with `{scope}`/`{key}`/`{run}`), each expected to be 1
    /// per intent.
    pub counts: Vec<(String, String)>,
    /// Clients in the same-body race.
    pub clients: usize,
}

/// Why the starter could not write its files.
#[derive(Debug, thiserror::Error)]
pub enum InitError {
    /// No URL given, or one that is not `http://`.
    #[error("{0}")]
    Usage(String),
    /// A file exists and `--force` was not given.
    #[error("{0} exists (pass --force to overwrite)")]
    Exists(PathBuf),
    /// Writing failed.
    #[error("cannot write {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

fn toml_str(s: &str) -> String {
    toml::Value::String(s.to_string()).to_string()
}

/// A JSON value as an inline TOML value.
fn toml_inline(v: &serde_json::Value) -> String {
    use serde_json::Value;
    match v {
        Value::Null => "\"\"".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => toml_str(s),
        Value::Array(a) => format!(
            "[{}]",
            a.iter().map(toml_inline).collect::<Vec<_>>().join(", ")
        ),
        Value::Object(o) => format!(
            "{{ {} }}",
            o.iter()
                .map(|(k, v)| format!("{} = {}", toml_key(k), toml_inline(v)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

fn toml_key(k: &str) -> String {
    if !k.is_empty()
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        k.to_string()
    } else {
        toml_str(k)
    }
}

impl InitOptions {
    fn header(&self, n: usize, title: &str, invariant: &str) -> String {
        format!(
            "# Scenario {n} of the starter set written by `ticketflow target init` — {title}.\n\
             # Invariant: {invariant}\n\
             # Run: ticketflow scenario run THIS_FILE   (PASS / FAIL / PENDING with the reason)\n"
        )
    }

    fn barrier(&self) -> String {
        match &self.table {
            Some(t) => format!(
                "[barrier]\n\
                 # The runner holds LOCK TABLE {t} in the target database and releases it only when it has\n\
                 # seen one waiting lock request per racer (server-side proof). \"exclusive\" lets reads\n\
                 # through and holds writes; \"access-exclusive\" holds every statement on the table.\n\
                 # Point database_url at a TEST database: creates there wait while the lock is held.\n\
                 kind = \"table-lock\"\n\
                 table = {}\n\
                 lock = \"exclusive\"\n\
                 timeout_ms = 10000\n",
                toml_str(t)
            ),
            None => "[barrier]\n\
                 # Keys the database cannot see (Redis, memory): every connection is opened and every request\n\
                 # written but its last byte, then released together. No server-side proof: a PASS needs\n\
                 # --repeat 3 or more (ticketflow scenario run FILE --repeat 10).\n\
                 kind = \"http\"\n\
                 timeout_ms = 10000\n"
                .to_string(),
        }
    }

    fn target(&self, scopes: &[&str]) -> String {
        let mut out = String::from("[target]\n");
        out += &format!(
            "base_urls = [{}]   # running already; racers are spread over them in turn\n",
            self.urls
                .iter()
                .map(|u| toml_str(u))
                .collect::<Vec<_>>()
                .join(", ")
        );
        match &self.database_url {
            Some(d) => out += &format!("database_url = {}\n", toml_str(d)),
            None => out += "# database_url = \"${TARGET_DATABASE_URL}\"   # needed for a table-lock barrier and [target.count]\n",
        }
        out += &format!(
            "# Answer classification: your [[target.rules]] first, then the preset's.\n\
             # ietf: 2xx created, 2xx + Idempotent-Replayed: true replayed, 409 in-progress, 422 conflict,\n\
             # other 4xx rejected; stripe: 409 in-progress, 400 idempotency_error conflict; ticketflow: 409 conflict.\n\
             preset = {}\n\n",
            toml_str(self.preset.name())
        );
        out += &format!(
            "[target.request]\nmethod = {}\npath = {}\nkey_header = {}\n\
             key = \"tfv-{{run}}-{{key}}\"   # fresh per run: a rerun never meets an old key\n\
             headers = {{ Accept = \"application/json\" }}   # add e.g. Authorization = \"Bearer ${{API_TOKEN}}\"\n\
             body = {}\n\n",
            toml_str(&self.method),
            toml_str(&self.path),
            toml_str(&self.key_header),
            toml_inline(&self.body)
        );
        for s in scopes {
            out += &format!(
                "[[target.scopes]]\nname = {}\nvalue = \"{s}-{{run}}\"   # a fresh scope per run\n",
                toml_str(s)
            );
            out += &match &self.scope_header {
                Some(h) => format!("headers = {{ {} = \"{{scope}}\" }}\n\n", toml_key(h)),
                None => format!(
                    "headers = {{ Authorization = \"Bearer ${{API_TOKEN_{}}}\" }}   # one credential per scope\n\n",
                    s.to_ascii_uppercase()
                ),
            };
        }
        out += "# The id of a created resource: a JSON pointer into the body, or the Location header.\n\
                [target.id]\npointer = \"/id\"\n# header = \"Location\"\n\n\
                # Replays the service does not mark (no header, same status as a create): set marked = false,\n\
                # then the check is one id across every 2xx answer of one intent.\n\
                [target.replay]\n# marked = false\nsame_answer = false   # true: a replay must equal the original answer\n\
                # ignore = [\"/created_at\"]\n\n\
                [target.retry]   # in-progress answers are always retried with the same key\n\
                attempts = 10\nbackoff_ms = 25\nstatuses = [503]\n\n";
        if self.counts.is_empty() {
            out += "# Count the effect in your database (each query returns one integer; {scope}, {key} and\n\
                    # {run} are bound as parameters), then expect it under [[expect.counts]]:\n\
                    # [target.count]\n\
                    # orders = \"SELECT count(*) FROM orders WHERE idempotency_key = {key}\"\n\n";
        } else {
            out += "[target.count]\n";
            for (n, sql) in &self.counts {
                out += &format!("{} = {}\n", toml_key(n), toml_str(sql));
            }
            out.push('\n');
        }
        out
    }

    fn counts_expect(&self, scope: Option<&str>, key: &str) -> String {
        self.counts_expect_n(scope, key, 1)
    }

    fn counts_expect_n(&self, scope: Option<&str>, key: &str, n: i64) -> String {
        if self.counts.is_empty() {
            return String::new();
        }
        let mut out = String::from("\n[[expect.counts]]\n");
        if let Some(s) = scope {
            out += &format!("scope = {}\n", toml_str(s));
        }
        out += &format!("key = {}\n", toml_str(key));
        for (name, _) in &self.counts {
            out += &format!("{} = {n}\n", toml_key(name));
        }
        out
    }

    fn scope_line(&self, s: &str) -> String {
        format!("scope = {}\n", toml_str(s))
    }

    /// The five files: (file name, contents).
    ///
    /// Will return `Err` when no URL is given or one is not `http://`.
    pub fn render(&self) -> Result<Vec<(String, String)>, InitError> {
        if self.urls.is_empty() {
            return Err(InitError::Usage("give at least one --url".into()));
        }
        if let Some(u) = self.urls.iter().find(|u| !u.starts_with("http://")) {
            return Err(InitError::Usage(format!(
                "--url {u}: expected http://HOST:PORT (https is not supported)"
            )));
        }
        let clients = self.clients.max(2);
        let mut files = Vec::new();
        let head = |n, title, inv| self.header(n, title, inv);
        files.push((
            "1-same-body.toml".to_string(),
            format!(
                "{}name = \"same-body\"\ndescription = \"{clients} clients across the instances send one key and body at once: one created, the rest replayed, one id, one effect.\"\n\n{}\n{}[[racers]]\nname = \"client\"\ncount = {clients}\n{}key = \"k1\"\n\n[expect]\noutcomes = {{ client = [\"created\", \"replayed\"] }}\n{}",
                head(1, "the same request from many clients", "one intent, one effect, one id for every client."),
                self.barrier(),
                self.target(&["A"]),
                self.scope_line("A"),
                self.counts_expect(Some("A"), "k1")
            ),
        ));
        let other_body = {
            let mut b = self.body.clone();
            match &mut b {
                serde_json::Value::Object(o) => {
                    o.insert("tfv_variant".into(), "other body".into());
                }
                other => *other = serde_json::json!({ "tfv_variant": "other body" }),
            }
            b
        };
        files.push((
            "2-two-bodies.toml".to_string(),
            format!(
                "{}name = \"two-bodies\"\ndescription = \"Two different bodies under one key at once: one created, the other refused (conflict), never replayed.\"\n\n{}\n{}[[racers]]\nname = \"body-1\"\n{}key = \"k1\"\n\n[[racers]]\nname = \"body-2\"\n{}key = \"k1\"\n# Another request under the same key: replace with a realistic change of your body.\nbody = {}\n\n[expect]\noutcomes = {{ body-1 = [\"created\", \"conflict\"], body-2 = [\"created\", \"conflict\"] }}\n",
                head(2, "two bodies, one key", "another body under a used key is refused, never given the first body's result."),
                self.barrier(),
                self.target(&["A"]),
                self.scope_line("A"),
                self.scope_line("A"),
                toml_inline(&other_body)
            ),
        ));
        files.push((
            "3-two-scopes.toml".to_string(),
            format!(
                "{}name = \"two-scopes\"\ndescription = \"Two scopes send the same key and body at once: each gets its own created resource, never the other's id or stored answer.\"\n\n{}\n{}[[racers]]\nname = \"scope-a\"\n{}key = \"k1\"\n\n[[racers]]\nname = \"scope-b\"\n{}key = \"k1\"\n\n[expect]\noutcomes = {{ scope-a = \"created\", scope-b = \"created\" }}\n{}{}",
                head(3, "two scopes, one key", "another scope with the same key gets its own result."),
                self.barrier(),
                self.target(&["A", "B"]),
                self.scope_line("A"),
                self.scope_line("B"),
                "\n# One effect per scope: two in all for the key (a query using {scope} can count each).",
                self.counts_expect_n(None, "k1", 2)
            ),
        ));
        let second = self.urls.get(1).unwrap_or(&self.urls[0]);
        files.push((
            "4-retry-after-answer.toml".to_string(),
            format!(
                "{}name = \"retry-after-answer\"\ndescription = \"A client retries after its first answer came back (on another instance): the retry is a replay of the same resource.\"\n\n{}\n{}[[racers]]\nname = \"first\"\nwave = 1\n{}key = \"k1\"\nvia = {}\n\n[[racers]]\nname = \"retry\"\nwave = 2\n{}key = \"k1\"\nvia = {}\n\n[expect]\noutcomes = {{ first = \"created\", retry = \"replayed\" }}\n{}",
                head(4, "a retry after the answer", "a retry after the first answer gets the same resource, not a second one."),
                self.barrier(),
                self.target(&["A"]),
                self.scope_line("A"),
                toml_str(&self.urls[0]),
                self.scope_line("A"),
                toml_str(second),
                self.counts_expect(Some("A"), "k1")
            ),
        ));
        files.push((
            "5-retry-after-rejected.toml".to_string(),
            format!(
                "{}name = \"retry-after-rejected\"\ndescription = \"A first attempt the service rejects (invalid body), then the valid request with the same key: it must create; the key was not poisoned.\"\n\n{}\n{}[[racers]]\nname = \"invalid\"\nwave = 1\n{}key = \"k1\"\n# A body your service rejects with 400/422 before doing anything.\nbody = {}\nexpect = \"rejected\"\n\n[[racers]]\nname = \"valid\"\nwave = 2\n{}key = \"k1\"\n\n[expect]\noutcomes = {{ valid = \"created\" }}\n{}",
                head(5, "a retry after a rejected attempt", "a rejected request leaves the key unused."),
                self.barrier(),
                self.target(&["A"]),
                self.scope_line("A"),
                toml_inline(&self.invalid_body),
                self.scope_line("A"),
                self.counts_expect(Some("A"), "k1")
            ),
        ));
        Ok(files)
    }

    /// Writes the five files into `dir` (created if missing).
    ///
    /// Will return `Err` for bad options, a file that exists without `force`, or a write error;
    /// nothing is written unless every file can be.
    pub fn write(&self, dir: &Path, force: bool) -> Result<Vec<PathBuf>, InitError> {
        let files = self.render()?;
        let paths: Vec<PathBuf> = files.iter().map(|(n, _)| dir.join(n)).collect();
        if !force {
            if let Some(p) = paths.iter().find(|p| p.exists()) {
                return Err(InitError::Exists(p.clone()));
            }
        }
        std::fs::create_dir_all(dir).map_err(|source| InitError::Write {
            path: dir.to_path_buf(),
            source,
        })?;
        for ((_, text), path) in files.iter().zip(&paths) {
            std::fs::write(path, text).map_err(|source| InitError::Write {
                path: path.clone(),
                source,
            })?;
        }
        Ok(paths)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::target::TargetScenario;

    fn opts(table: Option<&str>) -> InitOptions {
        InitOptions {
            urls: vec![
                "http://127.0.0.1:8001".into(),
                "http://127.0.0.1:8002".into(),
            ],
            database_url: Some("postgres://postgres@127.0.0.1:5432/shop_test".into()),
            table: table.map(str::to_string),
            method: "POST".into(),
            path: "/orders".into(),
            body: serde_json::json!({"item": "book", "quantity": 1}),
            invalid_body: serde_json::json!({"item": "", "quantity": -1}),
            scope_header: Some("X-User-Id".into()),
            key_header: "Idempotency-Key".into(),
            preset: Preset::Ietf,
            counts: vec![(
                "orders".into(),
                "SELECT count(*) FROM orders WHERE idempotency_key = {key}".into(),
            )],
            clients: 4,
        }
    }

    #[test]
    fn every_starter_file_loads_with_both_barrier_kinds() {
        for table in [Some("idempotency_keys"), None] {
            let files = opts(table).render().unwrap();
            assert_eq!(files.len(), 5);
            for (name, text) in files {
                let s = TargetScenario::parse(Path::new(&name), &text, &|_| None)
                    .unwrap_or_else(|e| panic!("{name}: {e}\n{text}"));
                assert_eq!(s.barrier.kind.server_side(), table.is_some(), "{name}");
                assert!(!s.racers.is_empty());
            }
        }
    }

    #[test]
    fn authorization_scopes_name_environment_variables() {
        let mut o = opts(None);
        o.scope_header = None;
        let files = o.render().unwrap();
        let scopes = &files[2].1;
        assert!(scopes.contains("${API_TOKEN_A}"), "{scopes}");
        // Unset variables are a load error naming the line, not an empty header.
        let e = TargetScenario::parse(Path::new("3.toml"), scopes, &|_| None).unwrap_err();
        assert!(e.message.contains("API_TOKEN_A") && e.line.is_some(), "{e}");
        let ok = TargetScenario::parse(Path::new("3.toml"), scopes, &|_| Some("t".into()));
        assert!(ok.is_ok());
    }

    #[test]
    fn bad_urls_and_existing_files_are_refused() {
        let mut o = opts(None);
        o.urls = vec!["https://x".into()];
        assert!(matches!(o.render(), Err(InitError::Usage(_))));
        let dir = tempfile::tempdir().unwrap();
        opts(None).write(dir.path(), false).unwrap();
        assert!(matches!(
            opts(None).write(dir.path(), false),
            Err(InitError::Exists(_))
        ));
        assert_eq!(opts(None).write(dir.path(), true).unwrap().len(), 5);
    }
}
