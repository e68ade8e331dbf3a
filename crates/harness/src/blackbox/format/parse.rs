//! Reading a black-box scenario file: TOML into the raw shapes, then each table checked and
//! built into a [`TargetScenario`], every error naming the file and line.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use toml::Spanned;

use super::fields::{Parser, SAMPLE_BASE_URL};
use super::raw::{
    Groups, RawBarrier, RawCounts, RawFault, RawFile, RawKinds, RawRacer, RawSchedule,
};
use super::request::{build_request, SAMPLE_RUN_ID};
use super::{
    secret_env, BarrierKind, BodyTemplate, CountExpectation, Cut, ExploreMode, FaultAt, FaultKind,
    FaultSpec, ScheduleSpec, Target, TargetBarrier, TargetRacer, TargetScenario,
};
use crate::scenario::format::MAX_RACERS;
use crate::scenario::ScenarioError;

impl TargetScenario {
    /// Reads and validates a black-box scenario file, expanding `${ENV}` from the process
    /// environment ([`secret_env`]: every value found is masked in all the tool writes).
    ///
    /// Will return `Err` naming the file and line for unreadable files, TOML errors, unknown
    /// fields, unset environment variables, bad templates, JSON pointers or regexes, a rule
    /// set that classifies nothing as created, and racers or expectations that do not fit.
    pub fn load(path: &Path) -> Result<TargetScenario, ScenarioError> {
        let bytes = std::fs::read(path).map_err(|e| ScenarioError {
            file: path.to_path_buf(),
            line: None,
            message: format!("cannot read scenario: {e}"),
        })?;
        let text = crate::scenario::format::utf8_text(path, bytes)?;
        TargetScenario::parse(path, &text, &secret_env)
    }

    /// Parses scenario text; `env` looks up `${NAME}`.
    ///
    /// Will return `Err` as [`TargetScenario::load`] does.
    pub fn parse(
        path: &Path,
        text: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<TargetScenario, ScenarioError> {
        let p = Parser { path, text, env };
        let raw: RawFile = toml::from_str(text)
            .map_err(|e| p.err(e.span().map(|s| s.start), e.message().to_string()))?;
        if let Some(c) = &raw.check {
            return Err(p.err(
                Some(c.span().start),
                "a [check] table makes this a check file: run it with `ticketflow check FILE`"
                    .into(),
            ));
        }
        p.build(raw)
    }

    /// Parses a check file: a black-box scenario's `[target]` (and `[barrier]`, `[schedule]`)
    /// with a `[check]` table and no racers or expectations, which the histories supply. The
    /// scenario returned has one racer per scope in one wave and `[expect] model = true`: the
    /// set-up every history shares. The `[check]` table is returned as it stands.
    ///
    /// Will return `Err` as [`TargetScenario::load`] does, and for racers, expectations or
    /// faults in the file (a history brings its own).
    pub fn parse_check(
        path: &Path,
        text: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<(TargetScenario, Option<toml::Value>), ScenarioError> {
        let p = Parser { path, text, env };
        let mut raw: RawFile = toml::from_str(text)
            .map_err(|e| p.err(e.span().map(|s| s.start), e.message().to_string()))?;
        if let Some(r) = raw.racers.first() {
            return Err(p.err(
                Some(r.span().start),
                "a check file has no [[racers]]: each history brings its own".into(),
            ));
        }
        if !raw.expect.outcomes.is_empty()
            || !raw.expect.counts.is_empty()
            || raw.expect.model.is_some()
        {
            return Err(p.err(
                None,
                "a check file has no [expect]: the idempotency model is the expectation".into(),
            ));
        }
        if let Some(f) = raw.fault.first() {
            return Err(p.err(
                Some(f.span().start),
                "a check file has no [[fault]] (faults in generated histories are not supported yet)".into(),
            ));
        }
        let check = raw.check.take().map(toml::Spanned::into_inner);
        let scopes: Vec<Option<String>> = match raw.target.get_ref().scopes.as_slice() {
            [] => vec![None],
            s => s.iter().map(|s| Some(s.get_ref().name.clone())).collect(),
        };
        let probe: String = scopes
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let scope = s
                    .as_ref()
                    .map(|s| format!("scope = {}\n", toml::Value::String(s.clone())))
                    .unwrap_or_default();
                format!("[[racers]]\nname = \"probe-{i}\"\nkey = \"k1\"\n{scope}")
            })
            .collect();
        let probed: RawFile = toml::from_str(&format!("{text}\n{probe}\n[expect]\nmodel = true\n"))
            .map_err(|e| p.err(None, e.message().to_string()))?;
        let mut probed = probed;
        probed.check = None;
        Ok((p.build(probed)?, check))
    }
}

impl Parser<'_> {
    pub(super) fn build(&self, raw: RawFile) -> Result<TargetScenario, ScenarioError> {
        let target_at = raw.target.span().start;
        let target = self.target(raw.target.into_inner(), target_at)?;
        let barrier = self.barrier(raw.barrier, &target)?;
        let schedule = self.schedule(raw.schedule, &barrier, &target)?;
        let (racers, groups) = self.racers(&raw.racers, &target)?;
        if racers.is_empty() {
            return Err(self.err(None, "scenario has no racers ([[racers]])".into()));
        }
        for (name, kinds) in &raw.expect.outcomes {
            let members = groups.get(name).ok_or_else(|| {
                self.err(
                    Some(kinds.span().start),
                    format!("expectation names unknown racer {name:?}"),
                )
            })?;
            if kinds.get_ref().set().is_empty() || members.is_empty() {
                return Err(self.err(
                    Some(kinds.span().start),
                    format!("no allowed outcome for {name:?}"),
                ));
            }
        }
        let mut racers = racers;
        for r in &mut racers {
            let by_name = raw.expect.outcomes.get(&r.name);
            let by_group = raw.expect.outcomes.get(&r.group);
            if let Some(k) = by_name.or(by_group) {
                r.expect.extend(k.get_ref().set());
            }
        }
        crate::scenario::format::check_scenario_name(&raw.name)
            .map_err(|m| self.err(None, m.to_string()))?;
        let counts = self.count_expectations(&raw.expect.counts, &target, &racers)?;
        let model = self.model(&raw.expect, &racers, &counts)?;
        let faults = self.faults(&raw.fault, &barrier, schedule.as_ref(), &target, &racers)?;
        let scenario = TargetScenario {
            file: self.path.to_path_buf(),
            name: raw.name,
            description: raw.description,
            barrier,
            target,
            racers,
            counts,
            schedule,
            faults,
            model,
        };
        // Every racer's request with its own key, scope and name filled in, as the run builds
        // it: a value that makes it unsendable is a load error at the racer's line.
        for r in &scenario.racers {
            let at = raw
                .racers
                .iter()
                .find(|x| x.get_ref().name == r.group)
                .map_or(target_at, |x| x.span().start);
            let built = build_request(&scenario, r, SAMPLE_BASE_URL, SAMPLE_RUN_ID);
            self.sendable(at, &format!("racer {:?}'s request", r.name), &built)?;
        }
        Ok(scenario)
    }

    /// `[[fault]]`: with the interposer barrier and a mode that releases steps one at a time;
    /// one per racer; the racer by name (a group of one) or letter; exactly one of `step`
    /// (from 1), `match` (words) and `each`, and `each` only in a lone fault; `store` one the
    /// run interposes; `cut` given.
    pub(super) fn faults(
        &self,
        raw: &[Spanned<RawFault>],
        barrier: &TargetBarrier,
        schedule: Option<&ScheduleSpec>,
        target: &Target,
        racers: &[TargetRacer],
    ) -> Result<Vec<FaultSpec>, ScenarioError> {
        use crate::interpose::StoreKind;
        let mut out: Vec<FaultSpec> = Vec::new();
        for f in raw {
            let at = f.span().start;
            let f = f.get_ref();
            let e = |m: String| self.err(Some(at), m);
            if barrier.kind != BarrierKind::Interposer {
                return Err(e(
                    "[[fault]] goes with [barrier] kind = \"interposer\": the cut is made at the interposer".into(),
                ));
            }
            if schedule.is_some_and(|s| s.mode == ExploreMode::FirstPoint) {
                return Err(e(
                    "[[fault]] needs the steps released one at a time: [schedule] mode first-point runs them free".into(),
                ));
            }
            let racer = racer_index(racers, &f.racer).map_err(|m| e(m.to_string()))?;
            if out.iter().any(|o| o.racer == racer) {
                return Err(e(format!(
                    "racer {:?} has a [[fault]] already: one per racer",
                    racers[racer].name
                )));
            }
            let fault_at = match (f.step, &f.words, f.each) {
                (Some(0), None, false) => {
                    return Err(e("fault step counts from 1".into()));
                }
                (Some(k), None, false) => FaultAt::Step(k),
                (None, Some(w), false) if !w.trim().is_empty() => FaultAt::Match(w.clone()),
                (None, Some(_), false) => return Err(e("fault match is empty".into())),
                (None, None, true) => FaultAt::Each,
                _ => return Err(e(
                    "a [[fault]] needs exactly one of step = N, match = \"WORDS\" or each = true"
                        .into(),
                )),
            };
            let store = match f.store.as_deref() {
                None => None,
                Some("postgres") => Some(StoreKind::Postgres),
                Some("redis") if target.redis_url.is_some() => Some(StoreKind::Redis),
                Some("redis") => {
                    return Err(e(
                        "fault store = \"redis\" needs [target] redis_url (the Redis the interposer stands in front of)".into(),
                    ))
                }
                Some(other) => {
                    return Err(e(format!(
                        "fault store {other:?}: expected postgres or redis"
                    )))
                }
            };
            if f.hold_ms.is_some() && f.kind.as_deref() != Some("pause") {
                return Err(e("hold_ms goes with kind = \"pause\"".into()));
            }
            let (kind, cut) = match (f.kind.as_deref(), f.cut, f.when) {
                (Some("pause"), None, None) => match f.hold_ms {
                    Some(ms) if ms > 0 && ms < target.request_timeout_ms => {
                        (FaultKind::Pause { hold_ms: ms }, Cut::Before)
                    }
                    Some(ms) if ms > 0 => {
                        return Err(e(format!(
                            "hold_ms = {ms} is not below [target] request_timeout_ms = {}: the held request would time out at the client first",
                            target.request_timeout_ms
                        )))
                    }
                    _ => {
                        return Err(e(
                            "a kind = \"pause\" [[fault]] needs hold_ms = N (milliseconds above 0 the step is held at the proxy) and neither cut nor when".into(),
                        ))
                    }
                },
                (Some("pause"), _, _) => {
                    return Err(e(
                        "a kind = \"pause\" [[fault]] needs hold_ms = N (milliseconds above 0 the step is held at the proxy) and neither cut nor when".into(),
                    ))
                }
                (None | Some("cut"), Some(cut), None) => (FaultKind::Cut, cut),
                (None | Some("cut"), _, _) => {
                    return Err(e(
                        "a [[fault]] needs cut = \"before\" (never forwarded) or \"after\" (done, the reply withheld)".into(),
                    ))
                }
                (Some("kill"), None, Some(when)) if !target.services.is_empty() => {
                    (FaultKind::Kill, when)
                }
                (Some("kill"), None, Some(_)) => {
                    return Err(e(
                        "kind = \"kill\" kills and restarts a service the runner started: this target's service was started by hand (base_urls), so the runner cannot start it again; declare it as [[target.service]] (command, ready_path) so the runner starts it behind its interposer, or stop it yourself at that point".into(),
                    ))
                }
                (Some("kill"), _, _) => {
                    return Err(e(
                        "a kind = \"kill\" [[fault]] needs when = \"before\" (killed before the step is forwarded) or \"after\" (killed once the server completed it, its reply never delivered), and no cut".into(),
                    ))
                }
                (Some(other), _, _) => {
                    return Err(e(format!(
                        "fault kind {other:?}: expected cut, kill or pause"
                    )))
                }
            };
            out.push(FaultSpec {
                racer,
                at: fault_at,
                store,
                kind,
                cut,
                origin: format!(
                    "{}:{}",
                    self.path.display(),
                    self.text[..at.min(self.text.len())].matches('\n').count() + 1
                ),
            });
        }
        if out.len() > 1 && out.iter().any(|f| f.at == FaultAt::Each) {
            return Err(self.err(
                raw.first().map(|f| f.span().start),
                "each = true sweeps one fault's steps: give it as the only [[fault]]".into(),
            ));
        }
        Ok(out)
    }

    /// `[schedule]`: only with the interposer barrier, which needs services the runner starts
    /// (their URLs are the interposer's); an exploring mode needs count queries that bind
    /// `{key}` or `{run}` (the schedules share one database).
    pub(super) fn schedule(
        &self,
        raw: Option<Spanned<RawSchedule>>,
        barrier: &TargetBarrier,
        target: &Target,
    ) -> Result<Option<ScheduleSpec>, ScenarioError> {
        let interposed = barrier.kind == BarrierKind::Interposer;
        let at = raw.as_ref().map(|r| r.span().start);
        if !interposed && target.interposer.is_some() {
            return Err(self.err(
                at,
                "[target] interposer goes with [barrier] kind = \"interposer\"".into(),
            ));
        }
        if !interposed {
            if raw.is_some() {
                return Err(self.err(
                    at,
                    "[schedule] goes with [barrier] kind = \"interposer\"".into(),
                ));
            }
            return Ok(None);
        }
        if target.services.is_empty() && target.interposer.is_none() {
            return Err(self.err(
                at,
                "barrier kind interposer needs [[target.service]] (the runner starts the services with {database_url} and {redis_url} pointing at its interposer) or [target] interposer (the control address of a running `ticketflow interpose` your service reaches its stores through)".into(),
            ));
        }
        let d = ScheduleSpec::default();
        let spec = match raw {
            None => d,
            Some(r) => {
                let r = r.into_inner();
                ScheduleSpec {
                    mode: r.mode.unwrap_or(d.mode),
                    preemptions: r.preemptions.unwrap_or(d.preemptions),
                    limit: r.limit.unwrap_or(d.limit),
                    runs: r.runs.unwrap_or(d.runs),
                    depth: r.depth.unwrap_or(d.depth),
                    seed: r.seed.unwrap_or(d.seed),
                    step_timeout_ms: r.step_timeout_ms.unwrap_or(d.step_timeout_ms),
                    poll_repeats: r.poll_repeats.unwrap_or(d.poll_repeats),
                    after_answer_ms: r.after_answer_ms.unwrap_or(d.after_answer_ms),
                }
            }
        };
        if spec.limit == 0 || spec.runs == 0 || spec.depth == 0 || spec.step_timeout_ms == 0 {
            return Err(self.err(
                at,
                "[schedule] limit, runs, depth and step_timeout_ms must be at least 1".into(),
            ));
        }
        // A scope counts as fresh per run when every scope's value uses {run}.
        let fresh_scopes =
            !target.scopes.is_empty() && target.scopes.iter().all(|sc| sc.value.contains("{run}"));
        if let Some(q) = target.counts.iter().find(|q| {
            !q.params
                .iter()
                .any(|p| *p == "key" || *p == "run" || (*p == "scope" && fresh_scopes))
        }) {
            return Err(self.err(
                at,
                format!(
                    "count {:?} binds neither {{key}}, {{run}} nor a {{scope}} whose value uses {{run}}: the schedules of an interposed scenario share one database, so it would count earlier schedules' rows",
                    q.name
                ),
            ));
        }
        Ok(Some(spec))
    }

    /// Long because it validates the `[barrier]` table field by field against the target (each
    /// barrier kind needs its own fields), each refused with its own message.
    pub(super) fn barrier(
        &self,
        b: Option<Spanned<RawBarrier>>,
        target: &Target,
    ) -> Result<TargetBarrier, ScenarioError> {
        let Some(b) = b else {
            return Err(self.err(
                None,
                "[barrier] is missing: kind = \"table-lock\" (with table), \"advisory\" (with advisory_key) or \"http\"".into(),
            ));
        };
        let at = b.span().start;
        let b = b.into_inner();
        let kind = match b.kind.as_deref() {
            Some("table-lock") | None => {
                let Some(table) = b.table else {
                    return Err(self.err(Some(at), "barrier kind table-lock needs table".into()));
                };
                let valid = !table.is_empty()
                    && table
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.');
                if !valid {
                    return Err(self.err(
                        Some(at),
                        format!("barrier table {table:?} must be a plain (optionally schema-qualified) name"),
                    ));
                }
                let access_exclusive = match b.lock.as_deref() {
                    None | Some("access-exclusive") => true,
                    Some("exclusive") => false,
                    Some(other) => {
                        return Err(self.err(
                            Some(at),
                            format!(
                                "barrier lock {other:?}: expected access-exclusive or exclusive"
                            ),
                        ))
                    }
                };
                if b.advisory_key.is_some() {
                    return Err(self.err(
                        Some(at),
                        "advisory_key goes with kind = \"advisory\"".into(),
                    ));
                }
                BarrierKind::TableLock {
                    table,
                    access_exclusive,
                }
            }
            Some("advisory") => {
                let Some(key) = b.advisory_key else {
                    return Err(
                        self.err(Some(at), "barrier kind advisory needs advisory_key".into())
                    );
                };
                if b.table.is_some() || b.lock.is_some() {
                    return Err(self.err(
                        Some(at),
                        "table and lock go with kind = \"table-lock\"".into(),
                    ));
                }
                BarrierKind::Advisory { key }
            }
            Some("http") => {
                if b.table.is_some() || b.lock.is_some() || b.advisory_key.is_some() {
                    return Err(self.err(
                        Some(at),
                        "kind = \"http\" takes no table, lock or advisory_key".into(),
                    ));
                }
                BarrierKind::Http
            }
            Some("interposer") => {
                if b.table.is_some() || b.lock.is_some() || b.advisory_key.is_some() {
                    return Err(self.err(
                        Some(at),
                        "kind = \"interposer\" takes no table, lock or advisory_key".into(),
                    ));
                }
                BarrierKind::Interposer
            }
            Some("redis-pause") => {
                if b.table.is_some() || b.lock.is_some() || b.advisory_key.is_some() {
                    return Err(self.err(
                        Some(at),
                        "kind = \"redis-pause\" takes no table, lock or advisory_key".into(),
                    ));
                }
                if target.redis_url.is_none() {
                    return Err(self.err(
                        Some(at),
                        "barrier kind redis-pause needs [target] redis_url (the Redis whose writes it pauses)".into(),
                    ));
                }
                BarrierKind::RedisPause
            }
            Some(other) => {
                return Err(self.err(
                    Some(at),
                    format!(
                        "barrier kind {other:?}: expected table-lock, advisory, http, interposer or redis-pause"
                    ),
                ))
            }
        };
        if kind.needs_database() && target.database_url.is_none() && target.services.is_empty() {
            return Err(self.err(
                Some(at),
                format!("barrier kind {} needs [target] database_url", kind.name()),
            ));
        }
        let timeout_ms = b.timeout_ms.unwrap_or(10_000);
        if timeout_ms == 0 {
            return Err(self.err(Some(at), "barrier timeout_ms must be at least 1".into()));
        }
        Ok(TargetBarrier { kind, timeout_ms })
    }

    /// Long because it validates every `[[racers]]` entry's fields one after another, each
    /// refused with its own message at the entry's line, and expands `count`.
    pub(super) fn racers(
        &self,
        raw: &[Spanned<RawRacer>],
        target: &Target,
    ) -> Result<(Vec<TargetRacer>, Groups), ScenarioError> {
        let endpoints = target.endpoints();
        let mut racers: Vec<TargetRacer> = Vec::new();
        let mut seen: BTreeSet<String> = BTreeSet::new();
        let mut groups: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for r in raw {
            let at = r.span().start;
            let r = r.get_ref();
            if r.name.is_empty() || groups.contains_key(&r.name) {
                return Err(self.err(
                    Some(at),
                    format!("racer name {:?} is empty or given twice", r.name),
                ));
            }
            let scope = match (&r.scope, target.scopes.is_empty()) {
                (Some(s), false) if target.scopes.iter().any(|x| &x.name == s) => Some(s.clone()),
                (Some(s), false) => {
                    return Err(self.err(
                        Some(at),
                        format!("racer {:?}: no scope {s:?} in [[target.scopes]]", r.name),
                    ))
                }
                (Some(_), true) => {
                    return Err(self.err(
                        Some(at),
                        format!(
                            "racer {:?} names a scope but the target has no [[target.scopes]]",
                            r.name
                        ),
                    ))
                }
                (None, false) => {
                    return Err(self.err(
                        Some(at),
                        format!(
                            "racer {:?} needs a scope (the target has [[target.scopes]])",
                            r.name
                        ),
                    ))
                }
                (None, true) => None,
            };
            let via = r
                .via
                .as_deref()
                .map(|v| {
                    self.env(at, "via", v)
                        .map(|v| v.trim_end_matches('/').to_string())
                })
                .transpose()?;
            if let Some(v) = &via {
                if !endpoints.contains(v) {
                    return Err(self.err(Some(at), format!("racer {:?} goes via {v:?}, which is not a service or base URL of the target", r.name)));
                }
            }
            let key = r.key.clone().unwrap_or_else(|| "k1".into());
            if key.contains(['{', '}']) {
                return Err(self.err(Some(at), format!("racer {:?}: key is a logical name; placeholders belong in [target.request] key", r.name)));
            }
            let body = self.body(at, "racer body", r.body.as_ref(), r.raw.as_ref(), None)?;
            // A racer's raw text keeps the request's content type; with a JSON request body,
            // raw text that is JSON (another spelling of a body: members reordered or
            // re-spaced) is sent as application/json, and other text as text/plain.
            let body = match (body, &target.request.body) {
                (Some(BodyTemplate::Raw { text, .. }), BodyTemplate::Raw { content_type, .. }) => {
                    Some(BodyTemplate::Raw {
                        text,
                        content_type: content_type.clone(),
                    })
                }
                (Some(BodyTemplate::Raw { text, content_type }), BodyTemplate::Json(_)) => {
                    let sample: crate::blackbox::template::Vars =
                        crate::blackbox::template::PLACEHOLDERS
                            .iter()
                            .map(|p| (*p, "x".to_string()))
                            .collect();
                    let is_json = serde_json::from_str::<serde_json::Value>(
                        &crate::blackbox::template::expand(&text, &sample),
                    )
                    .is_ok();
                    Some(BodyTemplate::Raw {
                        text,
                        content_type: if is_json {
                            "application/json".into()
                        } else {
                            content_type
                        },
                    })
                }
                (b, _) => b,
            };
            let wave = r.wave.unwrap_or(1);
            if wave == 0 {
                return Err(self.err(Some(at), "wave must be at least 1".into()));
            }
            let n = match r.count {
                Some(0) => return Err(self.err(Some(at), "count must be at least 1".into())),
                Some(n) if n > MAX_RACERS.saturating_sub(racers.len()) => {
                    return Err(self.err(
                        Some(at),
                        format!(
                            "more than {MAX_RACERS} racers (count, over all [[racers]]); a run \
                             is also refused when this process cannot open a connection each"
                        ),
                    ))
                }
                Some(n) => n,
                None => 1,
            };
            let names: Vec<String> = if r.count.is_none() {
                vec![r.name.clone()]
            } else {
                (1..=n).map(|i| format!("{}-{i}", r.name)).collect()
            };
            for name in &names {
                if !seen.insert(name.clone()) {
                    return Err(self.err(Some(at), format!("duplicate racer name {name:?}")));
                }
                racers.push(TargetRacer {
                    name: name.clone(),
                    group: r.name.clone(),
                    n: racers.len() + 1,
                    scope: scope.clone(),
                    key: key.clone(),
                    body: body.clone(),
                    via: via.clone(),
                    wave,
                    expect: r.expect.as_ref().map(RawKinds::set).unwrap_or_default(),
                });
            }
            groups.insert(r.name.clone(), names.clone());
            for name in names {
                groups.entry(name.clone()).or_insert_with(|| vec![name]);
            }
        }
        Ok((racers, groups))
    }

    /// `[expect] model`, `settle_ms` and `settle_after`: the model's settings, refused when
    /// mixed with hand-written counts or given without `model = true`.
    pub(super) fn model(
        &self,
        raw: &super::raw::RawExpect,
        racers: &[TargetRacer],
        counts: &[CountExpectation],
    ) -> Result<Option<super::ModelExpect>, ScenarioError> {
        let on = raw.model.as_ref().is_some_and(|m| *m.get_ref());
        if !on {
            if let Some(s) = &raw.settle_ms {
                return Err(self.err(
                    Some(s.span().start),
                    "expect.settle_ms needs expect.model = true".into(),
                ));
            }
            if !raw.settle_after.is_empty() {
                return Err(self.err(None, "expect.settle_after needs expect.model = true".into()));
            }
            return Ok(None);
        }
        let at = raw.model.as_ref().map(|m| m.span().start);
        if !counts.is_empty() {
            return Err(self.err(
                at,
                "expect.model = true counts every [target.count] query itself; drop [[expect.counts]]"
                    .into(),
            ));
        }
        let settle_ms = raw
            .settle_ms
            .as_ref()
            .map_or(super::DEFAULT_SETTLE_MS, |s| *s.get_ref());
        if settle_ms > super::MAX_SETTLE_MS {
            return Err(self.err(
                raw.settle_ms.as_ref().map(|s| s.span().start),
                format!(
                    "expect.settle_ms = {settle_ms} is over the largest, {}",
                    super::MAX_SETTLE_MS
                ),
            ));
        }
        for w in &raw.settle_after {
            if !racers.iter().any(|r| r.wave == *w) {
                return Err(self.err(at, format!("expect.settle_after: no racer is in wave {w}")));
            }
        }
        Ok(Some(super::ModelExpect {
            settle_ms,
            settle_after: raw.settle_after.clone(),
        }))
    }

    pub(super) fn count_expectations(
        &self,
        raw: &[Spanned<RawCounts>],
        target: &Target,
        racers: &[TargetRacer],
    ) -> Result<Vec<CountExpectation>, ScenarioError> {
        let mut out = Vec::new();
        for c in raw {
            let at = c.span().start;
            let c = c.get_ref();
            if let Some(s) = &c.scope {
                if !target.scopes.iter().any(|x| &x.name == s) {
                    return Err(self.err(Some(at), format!("expect.counts: no scope {s:?}")));
                }
            }
            if let Some(k) = &c.key {
                if !racers.iter().any(|r| &r.key == k) {
                    return Err(
                        self.err(Some(at), format!("expect.counts: no racer uses key {k:?}"))
                    );
                }
            }
            let mut values = BTreeMap::new();
            for (name, v) in &c.values {
                let Some(q) = target.counts.iter().find(|q| &q.name == name) else {
                    return Err(self.err(
                        Some(at),
                        format!("expect.counts: {name:?} is not a query of [target.count]"),
                    ));
                };
                let toml::Value::Integer(v) = v else {
                    return Err(self.err(
                        Some(at),
                        format!("expect.counts: {name} must be an integer"),
                    ));
                };
                for (p, given) in [("scope", c.scope.is_some()), ("key", c.key.is_some())] {
                    if q.params.contains(&p) && !given {
                        return Err(self.err(
                            Some(at),
                            format!("expect.counts: query {name:?} uses {{{p}}}; give {p} = …"),
                        ));
                    }
                }
                values.insert(name.clone(), *v);
            }
            if values.is_empty() {
                return Err(self.err(Some(at), "expect.counts entry names no query".into()));
            }
            out.push(CountExpectation {
                scope: c.scope.clone(),
                key: c.key.clone(),
                values,
            });
        }
        Ok(out)
    }
}

/// The racer a `[[fault]]` names: an expanded racer's name, a group of one, or a letter (`A`
/// = the scenario's first racer, in file order).
///
/// Will return `Err` with the message for a name that is no racer, a group of several, or a
/// letter past the last racer.
pub(super) fn racer_index(racers: &[TargetRacer], name: &str) -> Result<usize, RacerError> {
    if let Some(i) = racers.iter().position(|r| r.name == name) {
        return Ok(i);
    }
    let group: Vec<&str> = racers
        .iter()
        .filter(|r| r.group == name)
        .map(|r| r.name.as_str())
        .collect();
    if group.len() > 1 {
        return Err(RacerError::Group {
            name: name.to_string(),
            members: group.iter().map(|m| m.to_string()).collect(),
        });
    }
    let mut chars = name.chars();
    if let (Some(c @ 'A'..='Z'), None) = (chars.next(), chars.next()) {
        let i = (c as u8 - b'A') as usize;
        if i < racers.len() {
            return Ok(i);
        }
    }
    Err(RacerError::Unknown {
        name: name.to_string(),
        last: (b'A' + u8::try_from(racers.len().clamp(1, 26) - 1).unwrap_or(25)) as char,
    })
}

/// Why a `[[fault]]`'s racer names no one racer ([`racer_index`]).
#[derive(Debug, thiserror::Error)]
pub(super) enum RacerError {
    /// The name is a group of several racers.
    #[error(
        "fault racer {name:?} is a group of {} racers: name one of them ({})",
        members.len(),
        members.join(", ")
    )]
    Group {
        /// The name as written.
        name: String,
        /// The racers of the group.
        members: Vec<String>,
    },
    /// The name is no racer, no group and no letter of a racer.
    #[error("fault racer {name:?} is neither a racer's name nor a letter of one (A to {last})")]
    Unknown {
        /// The name as written.
        name: String,
        /// The letter of the last racer (`Z` at most).
        last: char,
    },
}
