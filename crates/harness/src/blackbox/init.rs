//! `ticketflow target init`: a commented starter set of black-box scenarios for a service,
//! from its URL(s), database and table. Five files, each one race of the black-box invariant (docs/PROTOCOL.md §9):
//!
//! 1. `1-same-body.toml`: the same body from N clients across the instances: one effect, one id;
//! 2. `2-two-bodies.toml`: two bodies under one key: one wins, the other is refused;
//! 3. `3-two-scopes.toml`: two scopes (tenants, users, API keys) with one key: each its own
//!    result, never the other's;
//! 4. `4-retry-after-answer.toml`: a retry after the first answer came back: a replay;
//! 5. `5-retry-after-rejected.toml`: a retry after a rejected first attempt: the key is not
//!    poisoned, the valid request creates; a rejected request alone under another key
//!    creates nothing.
//!
//! Every `--count` is expected in every file, for every key and scope the file uses: the
//! number of intents that must create under that binding (1 per intent, 0 for a key whose
//! only request is rejected), so a service that answers correctly but writes an extra row
//! fails on its count. A query's bindings decide its entries: with `{scope}` one per scope,
//! with `{key}` one per key, with neither one for the whole run.

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
    /// Header carrying the scope (tenant, user); `None`: scopes through `Authorization`, each
    /// scope's value `${API_SCOPE_X}` (what the service derives from the token).
    pub scope_header: Option<String>,
    /// The control address of a running `ticketflow interpose` (`127.0.0.1:7000`): the files
    /// race through it (interposer barrier, `[target] interposer`). Needs `database_url`.
    pub interposer: Option<String>,
    /// Header carrying the idempotency key.
    pub key_header: String,
    /// Response rule preset.
    pub preset: Preset,
    /// Named count queries (`name`, SQL with `{scope}`/`{key}`/`{run}`), each expected to be 1
    /// per intent.
    pub counts: Vec<(String, String)>,
    /// Clients in the same-body race.
    pub clients: usize,
    /// The service marks its replays (`Idempotent-Replayed: true` or a rule's marker).
    /// `false`: the files set `[target.replay] marked = false` and expect `created` where a
    /// replay comes back (one id per intent is then the check).
    pub replays_marked: bool,
}

/// The name of the check file `target init` writes beside the five scenario files.
pub const CHECK_FILE: &str = "check.toml";

/// One intent of a starter file, as its counts see it: its scope, its logical key, and
/// whether it must create (a key whose only request is rejected must not).
struct Intent {
    scope: &'static str,
    key: &'static str,
    creates: bool,
}

/// Why the starter could not write its files.
#[derive(Debug, thiserror::Error)]
pub enum InitError {
    /// No URL given, or one that is not `http://`.
    #[error("{0}")]
    Usage(String),
    /// A file exists and `--force` was not given.
    #[error("{0} exists (pass {} to overwrite)", ticketflow_core::flags::FORCE)]
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

/// A TOML key: bare when it can be, else quoted.
pub(crate) fn toml_key(k: &str) -> String {
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
        self.barrier_with("exclusive")
    }

    fn barrier_with(&self, lock: &str) -> String {
        if self.interposer.is_some() {
            return "[barrier]\n\
                 # Each request's own database commands, held at the `ticketflow interpose` your service\n\
                 # connects through ([target] interposer), released one at a time in the order of a schedule.\n\
                 kind = \"interposer\"\n\
                 timeout_ms = 10000\n\n\
                 [schedule]\n\
                 mode = \"auto\"   # exhaustive, or bounded above the limit; docs/INTERPOSER.md\n"
                .to_string();
        }
        match &self.table {
            Some(t) => format!(
                "[barrier]\n\
                 # The runner holds LOCK TABLE {t} in the target database and releases it only when it has\n\
                 # seen one waiting lock request per racer (server-side proof). \"exclusive\" lets reads\n\
                 # through and holds writes; \"access-exclusive\" holds every statement on the table.\n\
                 # Point database_url at a TEST database: creates there wait while the lock is held.\n\
                 kind = \"table-lock\"\n\
                 table = {}\n\
                 lock = {}\n\
                 timeout_ms = 10000\n",
                toml_str(t),
                toml_str(lock)
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
        if let Some(control) = &self.interposer {
            out += &format!(
                "interposer = {}   # the control address `ticketflow interpose` printed; your service uses the database URL it printed\n\
                 # interposer_token_file = \"PATH\"   # the control token file it printed (default: the file TICKETFLOW_INTERPOSE_TOKEN_FILE names)\n",
                toml_str(control)
            );
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
            out += &match &self.scope_header {
                Some(_) => format!(
                    "[[target.scopes]]\nname = {}\nvalue = \"{s}-{{run}}\"   # a fresh scope per run\n",
                    toml_str(s)
                ),
                // The service derives the scope from the token: the file cannot choose it.
                None => format!(
                    "[[target.scopes]]\nname = {}\nvalue = \"${{API_SCOPE_{}}}\"   # the tenant or user your service derives from API_TOKEN_{}: what {{scope}} binds in the counts\n",
                    toml_str(s),
                    s.to_ascii_uppercase(),
                    s.to_ascii_uppercase()
                ),
            };
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
                # Replays the service does not mark (no header, same status as a create): marked = false,\n\
                # then the check is one id across every 2xx answer of one intent, and an expected\n\
                # \"replayed\" is met by a 2xx answer holding that id (`target init --unmarked-replays`).\n\
                [target.replay]\n";
        out += if self.replays_marked {
            "# marked = false\n"
        } else {
            "marked = false\n"
        };
        out += "same_answer = true   # a replay must equal the original answer; false: not compared (a PASS says so)\n\
                # ignore = [\"/request_id\"]   # members that differ on every answer (JSON pointers)\n\n\
                [target.retry]   # in-progress answers are always retried with the same key\n\
                attempts = 10\nbackoff_ms = 25\nstatuses = [503]\n\n";
        if self.counts.is_empty() {
            out += "# NO COUNT: this file cannot see the service's rows, so extra rows behind one returned id\n\
                    # (a second create that answers the first id, work done before a refusal) go unobserved,\n\
                    # and a PASS says \"effects not counted\". Count the effect in your database (each query\n\
                    # returns one integer; {scope}, {key} and {run} are bound as text parameters), then expect it\n\
                    # (or rerun target init with --count NAME=SQL, which writes both):\n\
                    # [target.count]\n\
                    # orders = \"SELECT count(*) FROM orders WHERE idempotency_key = {key}\"\n\
                    # ... and after [expect]:\n\
                    # [[expect.counts]]\n\
                    # key = \"k1\"\n\
                    # orders = 1\n\n";
        } else {
            out += "[target.count]\n";
            for (n, sql) in &self.counts {
                out += &format!("{} = {}\n", toml_key(n), toml_str(sql));
            }
            out.push('\n');
        }
        out
    }

    /// The `[[expect.counts]]` entries of a file whose intents are `intents`: for every count
    /// query, one entry per binding its placeholders ask for (per scope and key, per scope,
    /// per key, or one for the run), each expecting the number of intents under that binding
    /// that must create. Empty without count queries.
    fn counts_expect(&self, intents: &[Intent]) -> String {
        // (scope, key, the queries, the expected value) of each entry.
        type Entry<'a> = (Option<&'a str>, Option<&'a str>, Vec<&'a str>, i64);
        let mut entries: Vec<Entry> = Vec::new();
        for (name, sql) in &self.counts {
            let (by_scope, by_key) = (sql.contains("{scope}"), sql.contains("{key}"));
            let mut bindings: Vec<(Option<&str>, Option<&str>)> = Vec::new();
            for i in intents {
                let b = (by_scope.then_some(i.scope), by_key.then_some(i.key));
                if !bindings.contains(&b) {
                    bindings.push(b);
                }
            }
            for (scope, key) in bindings {
                let n = intents
                    .iter()
                    .filter(|i| {
                        i.creates
                            && scope.map_or(true, |s| s == i.scope)
                            && key.map_or(true, |k| k == i.key)
                    })
                    .count() as i64;
                match entries
                    .iter_mut()
                    .find(|e| e.0 == scope && e.1 == key && e.3 == n)
                {
                    Some(e) => e.2.push(name),
                    None => entries.push((scope, key, vec![name], n)),
                }
            }
        }
        let mut out = String::new();
        for (scope, key, names, n) in entries {
            out += "\n[[expect.counts]]\n";
            if let Some(s) = scope {
                out += &format!("scope = {}\n", toml_str(s));
            }
            if let Some(k) = key {
                out += &format!("key = {}\n", toml_str(k));
            }
            for name in names {
                out += &format!("{} = {n}\n", toml_key(name));
            }
        }
        out
    }

    /// What the files cannot observe, when no count query was given: the warning `init`
    /// prints. `None` with counts.
    pub fn unobserved(&self) -> Option<String> {
        self.counts.is_empty().then(|| {
            "no --count given: the files cannot see the service's rows, so extra rows behind one \
             returned id (a duplicate create answering the first id, an order committed before a \
             refusal) go unobserved, and every PASS says \"effects not counted\"; add \
             --count NAME=SQL (e.g. orders=\"SELECT count(*) FROM orders WHERE idempotency_key = {key}\") \
             or follow the commented example in each file"
                .to_string()
        })
    }

    /// A warning when `database_url` carries a literal password: it is written into every
    /// file as given, where `${TARGET_DATABASE_URL}` would keep it in the environment.
    pub fn literal_password(&self) -> Option<String> {
        let url = self.database_url.as_deref()?;
        let (_, rest) = url.split_once("://")?;
        let authority = &rest[..rest.find(['/', '?']).unwrap_or(rest.len())];
        let (userinfo, _) = authority.rsplit_once('@')?;
        let (_, password) = userinfo.split_once(':')?;
        (!password.is_empty() && !password.contains("${")).then(|| {
            "--target-database-url holds a literal password, written as given into every file: pass              '${TARGET_DATABASE_URL}' (single-quoted, so the shell keeps it) to keep it in the              environment, which the files read at run time"
                .to_string()
        })
    }

    /// The outcomes a same-body racer may end with: a create or a replay (a create only when
    /// replays are unmarked, where a replay is a 2xx with the create's id).
    fn created_or_replayed(&self) -> &'static str {
        if self.replays_marked {
            "[\"created\", \"replayed\"]"
        } else {
            "\"created\""
        }
    }

    /// The other body of the two-bodies race: the base body with the value of its first
    /// string member changed (a realistic edit a service that fingerprints only its known
    /// fields still sees); else its first number changed; else, for a body without either,
    /// one member added.
    fn other_body(&self) -> serde_json::Value {
        use serde_json::Value;
        fn change_first(v: &mut Value, strings: bool) -> bool {
            match v {
                Value::String(s) if strings => {
                    s.push_str(" (other body)");
                    true
                }
                Value::Number(n) if !strings => {
                    *v = match n.as_i64() {
                        Some(i) => Value::from(i.saturating_add(1)),
                        None => Value::from(n.as_f64().unwrap_or(0.0) + 1.0),
                    };
                    true
                }
                Value::Object(o) => o.values_mut().any(|x| change_first(x, strings)),
                Value::Array(a) => a.iter_mut().any(|x| change_first(x, strings)),
                _ => false,
            }
        }
        let mut b = self.body.clone();
        if change_first(&mut b, true) || change_first(&mut b, false) {
            return b;
        }
        match &mut b {
            Value::Object(o) => {
                o.insert("tfv_variant".into(), "other body".into());
            }
            other => *other = serde_json::json!({ "tfv_variant": "other body" }),
        }
        b
    }

    fn scope_line(&self, s: &str) -> String {
        format!("scope = {}\n", toml_str(s))
    }

    /// The five scenario files and the check file ([`CHECK_FILE`]): (file name, contents).
    ///
    /// Will return `Err` when no URL is given or one is not `http://`.
    ///
    /// Long because it writes the five starter files in order, each a template filled from the
    /// same options.
    pub fn render(&self) -> Result<Vec<(String, String)>, InitError> {
        if self.urls.is_empty() {
            return Err(InitError::Usage(format!(
                "give at least one {}",
                ticketflow_core::flags::URL
            )));
        }
        if let Some(u) = self.urls.iter().find(|u| !u.starts_with("http://")) {
            return Err(InitError::Usage(format!(
                "{} {u}: expected http://HOST:PORT (https is not supported)",
                ticketflow_core::flags::URL
            )));
        }
        for (flag, name) in [
            ("--scope-header", self.scope_header.as_deref()),
            ("--key-header", Some(self.key_header.as_str())),
        ] {
            let Some(name) = name else { continue };
            let token = !name.is_empty()
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
            if !token {
                return Err(InitError::Usage(format!(
                    "{flag} {name:?} is not an HTTP header name (RFC 9110 token: letters, digits and !#$%&'*+-.^_`|~)"
                )));
            }
        }
        if self.interposer.is_some() && self.database_url.is_none() {
            return Err(InitError::Usage(
                "--interposer needs --target-database-url: the direct URL of the database your service uses (the counts read it there; the interposer relays to it)".into(),
            ));
        }
        if self.interposer.is_some() && self.table.is_some() {
            return Err(InitError::Usage(
                "give --table (a table-lock barrier) or --interposer (the interposer barrier), not both".into(),
            ));
        }
        if let Some(c) = &self.interposer {
            let loopback = c
                .parse::<std::net::SocketAddr>()
                .is_ok_and(|a| a.ip().is_loopback());
            if !loopback {
                return Err(InitError::Usage(format!(
                    "--interposer {c:?}: expected the loopback IP:PORT `ticketflow interpose` printed as its control address"
                )));
            }
        }
        if self.scope_header.is_none() {
            // Each scope is a credential whose tenant is the same every run.
            if let Some((name, _)) = self.counts.iter().find(|(_, sql)| {
                sql.contains("{scope}") && !sql.contains("{key}") && !sql.contains("{run}")
            }) {
                return Err(InitError::Usage(format!(
                    "count {name:?} binds {{scope}} alone: without --scope-header each scope is a bearer token whose tenant or user (${{API_SCOPE_A}}) is the same every run, so it would count every run's rows; bind {{key}} too (fresh per run), or give --scope-header"
                )));
            }
        }
        let clients = self.clients.max(2);
        let mut files = Vec::new();
        let head = |n, title, inv| self.header(n, title, inv);
        let one = |scope, key| Intent {
            scope,
            key,
            creates: true,
        };
        let either = self.created_or_replayed();
        files.push((
            "1-same-body.toml".to_string(),
            format!(
                "{}name = \"same-body\"\ndescription = \"{clients} clients across the instances send one key and body at once: one created, the rest replayed, one id, one effect.\"\n\n{}\n{}[[racers]]\nname = \"client\"\ncount = {clients}\n{}key = \"k1\"\n\n[expect]\noutcomes = {{ client = {either} }}\n{}",
                head(1, "the same request from many clients", "one intent, one effect, one id for every client."),
                self.barrier(),
                self.target(&["A"]),
                self.scope_line("A"),
                self.counts_expect(&[one("A", "k1")])
            ),
        ));
        // After the race: each body again, one at a time, so whichever body won, one of them
        // is refused and then the original comes again (a refusal must change nothing).
        let after = if self.replays_marked {
            "[\"replayed\", \"conflict\"]"
        } else {
            "[\"created\", \"conflict\"]"
        };
        let other = toml_inline(&self.other_body());
        files.push((
            "2-two-bodies.toml".to_string(),
            format!(
                "{}name = \"two-bodies\"\ndescription = \"Two different bodies under one key at once: one created, the other refused (conflict), never replayed, and only one effect. Then each body again, one at a time, after the answers: the winner's replayed, the other refused, and a refusal changes nothing for the original.\"\n\n{}\n{}[[racers]]\nname = \"body-1\"\nwave = 1\n{}key = \"k1\"\n\n[[racers]]\nname = \"body-2\"\nwave = 1\n{}key = \"k1\"\n# Another request under the same key: the base body with one value changed (replace with a\n# realistic change a client could make; a new member a service ignores would be the same request).\nbody = {other}\n\n[[racers]]\nname = \"body-2-after\"\nwave = 2\n{}key = \"k1\"\nbody = {other}\n\n[[racers]]\nname = \"body-1-after\"\nwave = 3\n{}key = \"k1\"\n\n[[racers]]\nname = \"body-2-again\"\nwave = 4\n{}key = \"k1\"\nbody = {other}\n\n[expect]\noutcomes = {{ body-1 = [\"created\", \"conflict\"], body-2 = [\"created\", \"conflict\"], body-2-after = {after}, body-1-after = {after}, body-2-again = {after} }}\n{}",
                head(2, "two bodies, one key", "another body under a used key is refused, never given the first body's result, does no work, and changes nothing for the original body."),
                self.barrier(),
                self.target(&["A"]),
                self.scope_line("A"),
                self.scope_line("A"),
                self.scope_line("A"),
                self.scope_line("A"),
                self.scope_line("A"),
                // One effect for the key: the refused body must not have written its own.
                self.counts_expect(&[one("A", "k1")])
            ),
        ));
        files.push((
            "3-two-scopes.toml".to_string(),
            format!(
                "{}name = \"two-scopes\"\ndescription = \"Two scopes send the same key and body at once, three requests each: each scope gets its own created resource and replays of it, never the other's id or stored answer. Then each scope again, one at a time, after the answers (an answer cache keyed without the scope shows there).\"\n\n{}\n{}[[racers]]\nname = \"scope-a\"\ncount = 3\nwave = 1\n{}key = \"k1\"\n\n[[racers]]\nname = \"scope-b\"\ncount = 3\nwave = 1\n{}key = \"k1\"\n\n[[racers]]\nname = \"scope-a-after\"\nwave = 2\n{}key = \"k1\"\n\n[[racers]]\nname = \"scope-b-after\"\nwave = 3\n{}key = \"k1\"\n\n[expect]\noutcomes = {{ scope-a = {either}, scope-b = {either}, scope-a-after = {either}, scope-b-after = {either} }}\n{}",
                head(3, "two scopes, one key", "another scope with the same key gets its own result."),
                self.barrier(),
                self.target(&["A", "B"]),
                self.scope_line("A"),
                self.scope_line("B"),
                self.scope_line("A"),
                self.scope_line("B"),
                // One effect per scope: a query with {scope} counts each, one without counts both.
                self.counts_expect(&[one("A", "k1"), one("B", "k1")])
            ),
        ));
        let second = self.urls.get(1).unwrap_or(&self.urls[0]);
        let (retry_outcome, retry_note) = if self.replays_marked {
            ("\"replayed\"", "")
        } else {
            (
                "\"created\"",
                "# Replays unmarked: the retry's answer is a 2xx that must hold the first answer's id.\n",
            )
        };
        files.push((
            "4-retry-after-answer.toml".to_string(),
            format!(
                "{}name = \"retry-after-answer\"\ndescription = \"A client retries after its first answer came back (on another instance): the retry is a replay of the same resource.\"\n\n{}\n{}[[racers]]\nname = \"first\"\nwave = 1\n{}key = \"k1\"\nvia = {}\n\n[[racers]]\nname = \"retry\"\nwave = 2\n{}key = \"k1\"\nvia = {}\n\n[[racers]]\nname = \"retry-reordered\"\nwave = 3\n{}key = \"k1\"\n# The same body with its members in reverse order (raw text; {{{{ and }}}} are literal braces): the\n# same intent to a service that fingerprints canonical JSON, so it must be replayed too.\nraw = {}\n\n{retry_note}[expect]\noutcomes = {{ first = \"created\", retry = {retry_outcome}, retry-reordered = {retry_outcome} }}\n{}",
                head(4, "a retry after the answer", "a retry after the first answer gets the same resource, not a second one."),
                self.barrier(),
                self.target(&["A"]),
                self.scope_line("A"),
                toml_str(&self.urls[0]),
                self.scope_line("A"),
                toml_str(second),
                self.scope_line("A"),
                toml_str(&crate::blackbox::template::raw_text(
                    &self.body,
                    crate::oracle::history::Form::Reordered
                )),
                self.counts_expect(&[one("A", "k1")])
            ),
        ));
        files.push((
            "5-retry-after-rejected.toml".to_string(),
            format!(
                "{}name = \"retry-after-rejected\"\ndescription = \"A first attempt the service rejects (invalid body), then the valid request with the same key: it must create; the key was not poisoned. A rejected request alone under another key creates nothing.\"\n\n{}\n{}[[racers]]\nname = \"invalid\"\nwave = 1\n{}key = \"k1\"\n# A body your service rejects with 400/422 before doing anything. Refused either way: the ietf\n# preset reads a 422 as conflict (the draft's answer to a reused key); the counts see any write.\nbody = {}\nexpect = [\"rejected\", \"conflict\"]\n\n[[racers]]\nname = \"valid\"\nwave = 2\n{}key = \"k1\"\n\n[[racers]]\nname = \"invalid-alone\"\nwave = 3\n{}key = \"k2\"\nbody = {}\nexpect = [\"rejected\", \"conflict\"]\n\n[expect]\noutcomes = {{ valid = \"created\" }}\n{}",
                head(5, "a retry after a rejected attempt", "a rejected request leaves the key unused and writes nothing."),
                self.barrier(),
                self.target(&["A"]),
                self.scope_line("A"),
                toml_inline(&self.invalid_body),
                self.scope_line("A"),
                self.scope_line("A"),
                toml_inline(&self.invalid_body),
                self.counts_expect(&[
                    one("A", "k1"),
                    Intent {
                        scope: "A",
                        key: "k2",
                        creates: false,
                    },
                ])
            ),
        ));
        files.push((CHECK_FILE.to_string(), self.check_file()));
        Ok(files)
    }

    /// The check file: the target of the starter set with two scopes, a barrier that holds
    /// every request touching the table (replays read it too), and a `[check]` table.
    fn check_file(&self) -> String {
        format!(
            "# The check file written by `ticketflow target init`: histories nobody wrote, generated over\n\
             # scopes × keys × bodies (retries, reordered bodies, other bodies, other scopes and keys,\n\
             # invalid then valid, refused then original, concurrent groups, settles), judged against the\n\
             # idempotency model; a failure is shrunk to a minimal history and written as a scenario file.\n\
             # Run: ticketflow check THIS_FILE   (docs/check.md)\n\
             name = \"check\"\ndescription = \"Generated histories judged against the idempotency model.\"\n\n{}\n{}\
             [check]\n\
             histories = 40      # at most this many histories ...\n\
             budget_s = 120      # ... started within this many seconds\n\
             operations = 8      # operations per history\n\
             keys = 3            # keys per scope\n\
             bodies = 3          # body variants: the body above, then one value changed\n\
             settle_ms = 1000    # wait after a history's last answer, then count again\n\
             # seed = 7          # default: a random seed, printed (--seed reproduces a run)\n\
             # A body your service rejects (400/422) before doing anything:\n\
             invalid_body = {}\n",
            self.barrier_with("access-exclusive"),
            self.target(&["A", "B"]),
            toml_inline(&self.invalid_body)
        )
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
    use crate::blackbox::TargetScenario;

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
            interposer: None,
            key_header: "Idempotency-Key".into(),
            preset: Preset::Ietf,
            counts: vec![(
                "orders".into(),
                "SELECT count(*) FROM orders WHERE idempotency_key = {key}".into(),
            )],
            clients: 4,
            replays_marked: true,
        }
    }

    fn with_counts(counts: &[(&str, &str)]) -> InitOptions {
        let mut o = opts(Some("idempotency_keys"));
        o.counts = counts
            .iter()
            .map(|(n, q)| (n.to_string(), q.to_string()))
            .collect();
        o
    }

    /// An expected count: (scope, key, query, value).
    type Seen = (Option<String>, Option<String>, String, i64);

    /// Each file's expected counts.
    fn expected_counts(o: &InitOptions) -> Vec<(String, Vec<Seen>)> {
        o.render()
            .unwrap()
            .into_iter()
            .filter(|(name, _)| name != CHECK_FILE)
            .map(|(name, text)| {
                let s = TargetScenario::parse(Path::new(&name), &text, &|_| None)
                    .unwrap_or_else(|e| panic!("{name}: {e}\n{text}"));
                let mut seen = Vec::new();
                for c in &s.counts {
                    for (q, v) in &c.values {
                        seen.push((c.scope.clone(), c.key.clone(), q.clone(), *v));
                    }
                }
                (name, seen)
            })
            .collect()
    }

    #[test]
    fn every_count_is_expected_in_every_file_per_binding() {
        let o = with_counts(&[
            (
                "by_key",
                "SELECT count(*) FROM orders WHERE idempotency_key = {key}",
            ),
            (
                "by_scope_key",
                "SELECT count(*) FROM orders WHERE owner = {scope} AND idempotency_key = {key}",
            ),
            (
                "by_scope",
                "SELECT count(*) FROM orders WHERE owner = {scope}",
            ),
            (
                "by_run",
                "SELECT count(*) FROM orders WHERE note LIKE '%' || {run}",
            ),
        ]);
        let s = |x: &str| Some(x.to_string());
        for (name, seen) in expected_counts(&o) {
            for q in ["by_key", "by_scope_key", "by_scope", "by_run"] {
                assert!(
                    seen.iter().any(|c| c.2 == q),
                    "{name}: {q} not expected: {seen:?}"
                );
            }
            let has = |scope: Option<String>, key: Option<String>, q: &str, v: i64| {
                assert!(
                    seen.contains(&(scope.clone(), key.clone(), q.to_string(), v)),
                    "{name}: expected {q}[{scope:?}, {key:?}] = {v} in {seen:?}"
                )
            };
            match name.as_str() {
                "3-two-scopes.toml" => {
                    has(None, s("k1"), "by_key", 2);
                    has(s("A"), s("k1"), "by_scope_key", 1);
                    has(s("B"), s("k1"), "by_scope_key", 1);
                    has(s("B"), None, "by_scope", 1);
                    has(None, None, "by_run", 2);
                }
                "5-retry-after-rejected.toml" => {
                    has(None, s("k1"), "by_key", 1);
                    has(None, s("k2"), "by_key", 0);
                    has(s("A"), s("k2"), "by_scope_key", 0);
                    has(s("A"), None, "by_scope", 1);
                    has(None, None, "by_run", 1);
                }
                _ => {
                    has(None, s("k1"), "by_key", 1);
                    has(s("A"), s("k1"), "by_scope_key", 1);
                    has(None, None, "by_run", 1);
                }
            }
        }
    }

    #[test]
    fn the_other_body_changes_a_value_and_adds_no_member() {
        let o = opts(None);
        let other = o.other_body();
        let (base, other) = (o.body.as_object().unwrap(), other.as_object().unwrap());
        assert_eq!(
            base.keys().collect::<Vec<_>>(),
            other.keys().collect::<Vec<_>>()
        );
        assert_ne!(base["item"], other["item"]);
        assert_eq!(base["quantity"], other["quantity"]);
        let mut numbers = opts(None);
        numbers.body = serde_json::json!({"amount": 100});
        assert_eq!(numbers.other_body(), serde_json::json!({"amount": 101}));
    }

    #[test]
    fn unmarked_replays_expect_no_replayed_outcome() {
        let mut o = opts(Some("idempotency_keys"));
        o.replays_marked = false;
        for (name, text) in o.render().unwrap() {
            let s = match name.as_str() {
                CHECK_FILE => {
                    TargetScenario::parse_check(Path::new(&name), &text, &|_| None)
                        .unwrap()
                        .0
                }
                _ => TargetScenario::parse(Path::new(&name), &text, &|_| None).unwrap(),
            };
            assert!(!s.target.replay.marked, "{name}");
            assert!(
                s.racers
                    .iter()
                    .all(|r| !r.expect.contains(&crate::blackbox::AnswerKind::Replayed)),
                "{name}"
            );
        }
        assert!(opts(None).render().unwrap()[3]
            .1
            .contains("retry = \"replayed\""));
    }

    #[test]
    fn without_counts_init_warns_and_each_file_says_so() {
        let mut o = opts(None);
        o.counts.clear();
        assert!(o.unobserved().unwrap().contains("effects not counted"));
        for (name, text) in o.render().unwrap() {
            assert!(text.contains("NO COUNT"), "{name}");
        }
        assert!(with_counts(&[("n", "SELECT 1")]).unobserved().is_none());
    }

    #[test]
    fn the_two_scopes_race_sends_three_requests_per_scope_then_one_after_the_answers() {
        let files = opts(None).render().unwrap();
        let s = TargetScenario::parse(Path::new("3.toml"), &files[2].1, &|_| None).unwrap();
        for scope in ["A", "B"] {
            let waves: Vec<u32> = s
                .racers
                .iter()
                .filter(|r| r.scope.as_deref() == Some(scope))
                .map(|r| r.wave)
                .collect();
            assert_eq!(waves.iter().filter(|w| **w == 1).count(), 3, "{scope}");
            assert_eq!(waves.len(), 4, "{scope}");
        }
        assert_eq!(s.waves().len(), 3);
    }

    #[test]
    fn the_two_bodies_file_sends_each_body_again_after_the_race_and_the_retry_file_a_reordered_body(
    ) {
        let files = opts(Some("idempotency_keys")).render().unwrap();
        let s = TargetScenario::parse(Path::new("2.toml"), &files[1].1, &|_| None).unwrap();
        let bodies: Vec<(u32, bool)> = s
            .racers
            .iter()
            .map(|r| (r.wave, r.body.is_some()))
            .collect();
        // Body 2 refused or created in the race, then alone: body 2, body 1, body 2.
        assert_eq!(
            bodies,
            [(1, false), (1, true), (2, true), (3, false), (4, true)]
        );
        let s = TargetScenario::parse(Path::new("4.toml"), &files[3].1, &|_| None).unwrap();
        let reordered = s.racers.last().expect("three racers");
        let sent = crate::blackbox::format::request::build_request(&s, reordered, "http://x", "r1");
        let plain =
            crate::blackbox::format::request::build_request(&s, &s.racers[0], "http://x", "r1");
        assert_ne!(sent.body, plain.body, "the members are in another order");
        let parse = |b: &[u8]| serde_json::from_slice::<serde_json::Value>(b).unwrap();
        assert_eq!(parse(&sent.body), parse(&plain.body));
    }

    #[test]
    fn every_starter_file_loads_with_both_barrier_kinds() {
        for table in [Some("idempotency_keys"), None] {
            let files = opts(table).render().unwrap();
            assert_eq!(files.len(), 6);
            for (name, text) in files {
                let s = match name.as_str() {
                    CHECK_FILE => TargetScenario::parse_check(Path::new(&name), &text, &|_| None)
                        .map(|(s, check)| {
                            assert!(check.is_some(), "{name} has a [check] table");
                            s
                        }),
                    _ => TargetScenario::parse(Path::new(&name), &text, &|_| None),
                }
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
        assert!(
            (e.message.contains("API_SCOPE_A") || e.message.contains("API_TOKEN_A"))
                && e.line.is_some(),
            "{e}"
        );
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
        assert_eq!(opts(None).write(dir.path(), true).unwrap().len(), 6);
    }

    #[test]
    fn bearer_scopes_bind_the_scope_the_service_derives_and_refuse_a_count_on_it_alone() {
        let mut o = opts(Some("idempotency_keys"));
        o.scope_header = None;
        let env = |name: &str| match name {
            "API_TOKEN_A" | "API_TOKEN_B" => Some(format!("token-{name}")),
            "API_SCOPE_A" => Some("tenant-17".to_string()),
            "API_SCOPE_B" => Some("tenant-42".to_string()),
            _ => None,
        };
        for (name, text) in o
            .render()
            .unwrap()
            .into_iter()
            .filter(|(n, _)| n != CHECK_FILE)
        {
            let s = TargetScenario::parse(Path::new(&name), &text, &env)
                .unwrap_or_else(|e| panic!("{name}: {e}\n{text}"));
            for scope in &s.target.scopes {
                // What {scope} binds is what the service sees, never a value of the file's own.
                let want = if scope.name == "A" {
                    "tenant-17"
                } else {
                    "tenant-42"
                };
                assert_eq!(scope.value, want, "{name}");
            }
        }
        // A scope variable left unset is a load error naming it, not a silent zero count.
        let (name, text) = o.render().unwrap().remove(2);
        let e = TargetScenario::parse(Path::new(&name), &text, &|n: &str| {
            n.starts_with("API_TOKEN").then(|| "t".to_string())
        })
        .unwrap_err();
        assert!(e.to_string().contains("API_SCOPE_A"), "{e}");
        o.counts = vec![(
            "orders".into(),
            "SELECT count(*) FROM orders WHERE user_id = {scope}".into(),
        )];
        let e = o.render().unwrap_err().to_string();
        assert!(e.contains("binds {scope} alone"), "{e}");
    }

    #[test]
    fn a_literal_database_password_is_warned_about_and_a_variable_is_not() {
        let mut o = opts(None);
        o.database_url = Some("postgres://app:s3cret@127.0.0.1:5432/shop".into());
        assert!(o.literal_password().is_some());
        for quiet in [
            "postgres://app@127.0.0.1:5432/shop",
            "${TARGET_DATABASE_URL}",
            "postgres://app:${PGPASSWORD}@127.0.0.1/shop",
        ] {
            o.database_url = Some(quiet.into());
            assert_eq!(o.literal_password(), None, "{quiet}");
        }
    }

    #[test]
    fn a_header_name_that_is_not_a_token_is_refused() {
        for bad in ["X-User\nId", "", "X User", "X:Y"] {
            let mut o = opts(None);
            o.scope_header = Some(bad.into());
            let e = o.render().unwrap_err().to_string();
            assert!(e.contains("not an HTTP header name"), "{bad:?}: {e}");
            let mut o = opts(None);
            o.key_header = bad.into();
            assert!(o.render().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn interposer_files_race_through_the_running_interposer() {
        let mut o = opts(None);
        o.interposer = Some("127.0.0.1:7000".into());
        for (name, text) in o
            .render()
            .unwrap()
            .into_iter()
            .filter(|(n, _)| n != CHECK_FILE)
        {
            let s = TargetScenario::parse(Path::new(&name), &text, &|_| None)
                .unwrap_or_else(|e| panic!("{name}: {e}\n{text}"));
            assert_eq!(
                s.barrier.kind,
                crate::blackbox::format::BarrierKind::Interposer,
                "{name}"
            );
            assert_eq!(
                s.target.interposer,
                Some("127.0.0.1:7000".parse().unwrap()),
                "{name}"
            );
        }
        o.database_url = None;
        assert!(o
            .render()
            .unwrap_err()
            .to_string()
            .contains("--target-database-url"));
        let mut o = opts(Some("idempotency_keys"));
        o.interposer = Some("127.0.0.1:7000".into());
        assert!(o.render().unwrap_err().to_string().contains("not both"));
        o.table = None;
        o.interposer = Some("10.0.0.1:7000".into());
        assert!(o.render().unwrap_err().to_string().contains("loopback"));
    }
}
