//! The reduced search: dynamic partial-order reduction with sleep sets over wire steps, and
//! symmetry between interchangeable racers, so that a search that completes has run one
//! schedule of every class of equivalent interleavings.
//!
//! Two interleavings are equivalent (one Mazurkiewicz trace) when one becomes the other by
//! swapping adjacent steps of different racers that are independent under the relation of
//! [`super::footprint`]: such a swap changes nothing any step sees or leaves, so every
//! answer and every count is the same. The search is stateless, as the depth-first search of
//! [`super::explore::Search`] is: each schedule is a fresh run following a prefix of choices.
//!
//! - **Backtracking** (Flanagan and Godefroid, POPL 2005, with the source sets of Abdulla et
//!   al., POPL 2014): after each run, every pair of dependent steps of different racers that
//!   nothing else orders (a *race*) is reversed by scheduling, at the point before the first, a
//!   racer that can start the steps leading to the second without the first, unless one such is
//!   scheduled there already (failing any, every racer that held a step there).
//! - **Sleep sets** (Godefroid, 1996): a racer whose alternative at a point was explored sleeps
//!   in the sibling schedules while the steps released are independent of the step it holds, so
//!   no class is run twice. A run in which every racer holding a step sleeps has nothing new
//!   (it is counted as *redundant*: it still runs to its end, and is judged).
//! - **Symmetry**: racers that send the same request to the same instance (or to instances
//!   started from one command) in one wave are interchangeable. At a point where two of them have released the same statements with the
//!   same answers (none, at first) and hold the same statement, scheduling either one leads to
//!   the same runs with the two names swapped (their own generated values, such as ids, aside),
//!   and the checks judge them alike (the same request, the same expected outcomes), so only
//!   the first is explored: one representative per orbit.
//!
//! - **Side by side**: the search keeps its tree of points, so several runs can be out at
//!   once. A run handed out takes the deepest point with an alternative and starts asleep on
//!   the racers handed out there before (those independent of the one it takes), even while
//!   their runs are out: each such branch is explored in full, now or later, and a branch's
//!   runs depend only on its starting sleep set and on the races they find (which add
//!   alternatives at points on their own paths). The runs are then those of a depth-first
//!   search that took the same alternatives in another order; taken one at a time, they are
//!   exactly depth-first.
//!
//! Soundness rests on what the relation assumes: the racers share state only through the
//! interposed stores (a service that keeps state across requests in its own memory, or in a
//! store not behind the interposer, has dependencies the wire does not show); within that,
//! every step the relation cannot classify is dependent.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use super::explore::{default_order, ChoicePoint, Chooser, HeldStep, Prefix};
use super::footprint::{
    footprint_with, resolve, Catalog, Footprint, Isolation, StepFootprint, TxRole,
};
use super::groups::{Groups, LONE};
use super::hub::StoreKind;

/// A step a run released at a choice point, as the reduction needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Released {
    /// The racer that released it (its index in its wave).
    pub racer: usize,
    /// Its store.
    pub store: StoreKind,
    /// Its session in that store.
    pub session: u64,
    /// The statement or command text.
    pub text: String,
    /// Seen waiting for a lock.
    pub blocked: bool,
    /// PostgreSQL's transaction status after it, when its reply came
    /// ([`super::footprint::tx_status`]).
    pub status: Option<char>,
    /// Its bound parameters.
    pub params: Vec<String>,
    /// The server's answer, in words ([`super::conduct::StepTaken::result`]).
    pub result: String,
}

/// One point of the search tree: the state after the choices that lead to it.
#[derive(Debug, Clone)]
struct Node {
    enabled: Vec<usize>,
    last: Option<usize>,
    held: Vec<HeldStep>,
    /// The held steps' footprints as the chooser resolved them there.
    online: Vec<Online>,
    wave: usize,
    /// The racers to explore here (the ones run, and the ones races added).
    backtrack: BTreeSet<usize>,
    /// The racers handed out here (run, or being run).
    done: BTreeSet<usize>,
    sleep: BTreeSet<usize>,
    /// The node before it and the racer chosen there; `None` at the root.
    parent: Option<(usize, usize)>,
    /// The nodes after it, by the racer chosen here.
    children: HashMap<usize, usize>,
    depth: usize,
}

impl Node {
    /// The racer to explore next here, if any: in the backtrack set, not handed out, not
    /// asleep; the first in the default order.
    fn alternative(&self) -> Option<usize> {
        default_order(&self.enabled, self.last)
            .into_iter()
            .find(|r| {
                self.backtrack.contains(r) && !self.done.contains(r) && !self.sleep.contains(r)
            })
    }
}

/// The reduced search over a scenario's schedules.
///
/// The search keeps its tree of points (each run adds the points past its prefix), so that
/// several runs can be out at once (schedules side by side): a run handed out takes the
/// deepest point with an alternative; taken one at a time, that is depth-first order.
#[derive(Debug, Clone)]
pub struct Reduced {
    catalog: Option<Arc<Catalog>>,
    classes: Vec<Vec<usize>>,
    /// The tree's points.
    nodes: Vec<Node>,
    /// The first point of every run, once one was analysed.
    root: Option<usize>,
    /// The run being analysed: its node at each point.
    path: Vec<usize>,
    /// The first run of the search (from the root) is still to be handed out.
    root_pending: bool,
    /// Runs handed out and not yet recorded.
    out: usize,
    /// Bumped each time the search starts over: a run handed out before is recorded for the
    /// groups only.
    generation: u64,
    /// Runs that were not redundant (each completed a class; a class can be run more than
    /// once when the sleep sets, which judge steps before their transaction is over, could not
    /// tell: [`Reduced::classes_run`] counts the distinct ones).
    pub explored: usize,
    /// The classes run: each non-redundant run's order of dependent steps (named by racer and
    /// step number) with each racer's statements.
    seen: HashSet<u64>,
    /// Runs in which every racer holding a step slept: nothing new, judged all the same.
    pub redundant: usize,
    /// Runs whose steps did not line up with their points (a step released outside a point):
    /// every alternative of their new points is explored, as the full search would.
    pub unanalysed: usize,
    /// Points where a replayed prefix's racer held no step (the service branched).
    pub divergences: usize,
    /// The racers' independent groups ([`super::groups`]).
    groups: Groups,
    /// The group whose races are reversed, among [`Groups::with_races`], when there are two
    /// or more; the others follow one order of theirs.
    focus: usize,
    /// The first run since the search (re)started: each group's search starts from it.
    first: Option<Box<FirstRun>>,
    /// Times the search started over because two groups were found tied.
    pub restarts: usize,
}

/// A run kept to start each group's search from.
#[derive(Debug, Clone)]
struct FirstRun {
    points: Vec<ChoicePoint>,
    steps: Vec<Released>,
    waves: Vec<usize>,
    chooser: SleepChooser,
    resolved: Option<Vec<Footprint>>,
}

impl Reduced {
    /// A search from the default schedule. `catalog`: the PostgreSQL database's relations
    /// (`None`: every PostgreSQL write is dependent with every step there). `classes[w][r]`:
    /// racer `r` of wave `w`'s symmetry class (racers of one class are interchangeable; a wave
    /// not listed has none). `intents[w][r]`: its intent (racers of one intent are never
    /// explored apart: [`super::groups`]).
    pub fn new(catalog: Option<Catalog>, classes: Vec<Vec<usize>>, intents: &[Vec<usize>]) -> Self {
        Reduced {
            groups: Groups::new(intents),
            focus: 0,
            first: None,
            restarts: 0,
            catalog: catalog.map(Arc::new),
            classes,
            nodes: Vec::new(),
            root: None,
            path: Vec::new(),
            root_pending: true,
            out: 0,
            generation: 0,
            explored: 0,
            seen: HashSet::new(),
            redundant: 0,
            unanalysed: 0,
            divergences: 0,
        }
    }

    /// The chooser of a next run; `None` when there is none until a run out is recorded (with
    /// none out: the search is complete). Each chooser handed out is to be given back to
    /// [`Reduced::record`] with its run.
    pub fn next_chooser(&mut self) -> Option<SleepChooser> {
        let (prefix, sleep) = if self.root_pending {
            self.root_pending = false;
            (Vec::new(), BTreeSet::new())
        } else {
            self.take_alternative()?
        };
        self.out += 1;
        Some(SleepChooser {
            generation: self.generation,
            prefix: Prefix {
                choices: prefix,
                divergences: 0,
            },
            sleep,
            catalog: self.catalog.clone(),
            blocked_at: None,
            sleeps: Vec::new(),
            online: Vec::new(),
            history: HashMap::new(),
        })
    }

    /// The distinct classes of interleavings the non-redundant runs took.
    pub fn classes_run(&self) -> usize {
        self.seen.len()
    }

    /// The independent groups of racers explored one at a time (1: not split).
    pub fn groups(&self) -> usize {
        self.groups.with_races().len().max(1)
    }

    /// The group whose races the search reverses: `None` when the racers are not split.
    fn focused(&self) -> Option<super::groups::Node> {
        let groups = self.groups.with_races();
        (groups.len() > 1).then(|| groups[self.focus.min(groups.len() - 1)])
    }

    /// Whether every class was run: nothing left to explore, no run out, and every group's
    /// search done.
    pub fn complete(&self) -> bool {
        !self.has_alternative() && self.out == 0 && self.focus + 1 >= self.groups.with_races().len()
    }

    /// Whether [`Reduced::next_chooser`] would hand out a run now.
    pub fn has_alternative(&self) -> bool {
        self.root_pending || self.nodes.iter().any(|n| n.alternative().is_some())
    }

    /// Takes the deepest point with an alternative (the latest made among equals), marks it
    /// handed out, and returns the prefix that leads to it with the sleep set the run starts
    /// with there: the racers asleep at the point or handed out there before, whose held steps
    /// are independent of the one taken.
    fn take_alternative(&mut self) -> Option<(Vec<usize>, BTreeSet<usize>)> {
        let (id, p) = self
            .nodes
            .iter()
            .enumerate()
            .filter_map(|(id, n)| n.alternative().map(|p| (id, p)))
            .max_by_key(|&(id, _)| (self.nodes[id].depth, id))?;
        let node = &self.nodes[id];
        let of = |r: usize| node.online.iter().find(|o| o.racer == r);
        let child: BTreeSet<usize> = node
            .sleep
            .iter()
            .chain(node.done.iter())
            .copied()
            .filter(|&q| q != p && matches!((of(q), of(p)), (Some(a), Some(b)) if a.independent(b)))
            .collect();
        self.nodes[id].done.insert(p);
        let mut prefix = vec![p];
        let mut at = id;
        while let Some((parent, via)) = self.nodes[at].parent {
            prefix.push(via);
            at = parent;
        }
        prefix.reverse();
        Some((prefix, child))
    }

    /// Starts the search over from the root (a new generation).
    fn start_over(&mut self) {
        self.clear_tree();
        self.generation += 1;
        self.root_pending = true;
    }

    /// Forgets every point.
    fn clear_tree(&mut self) {
        self.nodes.clear();
        self.root = None;
        self.path.clear();
    }

    /// Leaves nothing to explore at `id` and after it: a branch the service no longer takes
    /// (at its first point, the racers holding steps were found to differ).
    fn abandon(&mut self, id: usize) {
        let mut todo = vec![id];
        while let Some(at) = todo.pop() {
            let node = &mut self.nodes[at];
            node.backtrack = node.done.clone();
            todo.extend(node.children.values().copied());
        }
    }

    /// Takes what a run met: its choice points (with the steps each enabled racer held),
    /// the step released at each point (`steps[i]` at `points[i]`), the points per wave, and
    /// the chooser it followed; then finds the next run.
    /// `lone[k]`: the steps of the run's `k`-th wave of one racer (followed, not scheduled),
    /// which tie groups as any step does.
    pub fn record(
        &mut self,
        points: &[ChoicePoint],
        steps: &[Released],
        waves: &[usize],
        chooser: &SleepChooser,
        lone: &[Vec<Released>],
    ) {
        self.out = self.out.saturating_sub(1);
        self.divergences += chooser.prefix.divergences;
        if chooser.blocked_at.is_some() {
            self.redundant += 1;
        } else {
            self.explored += 1;
        }
        // The run's footprints, once: for the groups, and for the races when the run is whole.
        let resolved = (steps.len() == points.len()).then(|| self.resolved(steps));
        let tied = resolved
            .as_deref()
            .is_some_and(|r| self.observe(steps, r, waves, lone));
        if tied && self.first.is_some() {
            // Two groups explored apart depend on each other: start over, together.
            self.restarts += 1;
            self.focus = 0;
            self.first = None;
            self.start_over();
            return;
        }
        // A run handed out before the search started over counts only for what its steps
        // tied (above); the last run out may be one, so the groups still move on below.
        if chooser.generation == self.generation {
            if self.first.is_none() {
                self.first = Some(Box::new(FirstRun {
                    points: points.to_vec(),
                    steps: steps.to_vec(),
                    waves: waves.to_vec(),
                    chooser: chooser.clone(),
                    resolved: resolved.clone(),
                }));
            }
            self.analyse(points, steps, waves, chooser, resolved.as_deref());
        }
        // One group done (nothing left, nothing out): the next one's search starts from the
        // first run.
        while !self.has_alternative()
            && self.out == 0
            && self.focus + 1 < self.groups.with_races().len()
        {
            self.focus += 1;
            self.clear_tree();
            if let Some(f) = self.first.clone() {
                self.analyse(
                    &f.points,
                    &f.steps,
                    &f.waves,
                    &f.chooser,
                    f.resolved.as_deref(),
                );
            }
        }
    }

    /// Ties the groups of the racers whose steps in this run (`resolved`: their footprints)
    /// depend on each other, or on steps seen before; whether two groups were tied.
    fn observe(
        &mut self,
        steps: &[Released],
        resolved: &[Footprint],
        waves: &[usize],
        lone: &[Vec<Released>],
    ) -> bool {
        let wave_of = wave_index(waves, steps.len());
        let mut nodes: Vec<(super::groups::Node, (StoreKind, u64), &Footprint)> = steps
            .iter()
            .zip(resolved)
            .enumerate()
            .map(|(k, (s, f))| ((wave_of[k], s.racer), (s.store, s.session), f))
            .collect();
        let lone_resolved: Vec<Vec<Footprint>> = lone.iter().map(|w| self.resolved(w)).collect();
        for (k, (w, f)) in lone.iter().zip(&lone_resolved).enumerate() {
            for (s, f) in w.iter().zip(f) {
                nodes.push(((LONE + k, 0), (s.store, s.session), f));
            }
        }
        self.groups.observe(&nodes)
    }

    /// The footprints of a run's steps, resolved by their transactions.
    fn resolved(&self, steps: &[Released]) -> Vec<Footprint> {
        resolve(
            &steps
                .iter()
                .map(|s| StepFootprint {
                    session: (s.store, s.session),
                    footprint: footprint_with(s.store, &s.text, &s.params, self.catalog.as_deref()),
                    blocked: s.blocked,
                    status: s.status,
                })
                .collect::<Vec<_>>(),
            self.catalog.as_ref().and_then(|c| c.default_isolation),
        )
    }

    /// The backtracking of [`Reduced::record`] over one run, races of the focused group only,
    /// then the next run. `full`: the footprints of all of `steps`, when they line up with
    /// `points`.
    fn analyse(
        &mut self,
        points: &[ChoicePoint],
        steps: &[Released],
        waves: &[usize],
        chooser: &SleepChooser,
        full: Option<&[Footprint]>,
    ) {
        let n = points.len();
        let prefix_len = chooser.prefix.choices.len();
        let wave_of = wave_index(waves, n);
        let limit = chooser.blocked_at.unwrap_or(n).min(n);
        // The run's path through the tree: the points it shares with earlier runs, then new
        // ones. A point whose racers differ from the tree's (the service branched) starts a
        // new branch there.
        self.path.clear();
        let mut keep = None;
        for (k, p) in points.iter().enumerate().take(limit) {
            let parent = k.checked_sub(1).map(|j| (self.path[j], points[j].chosen));
            let existing = match parent {
                None => self.root,
                Some((at, via)) => self.nodes[at].children.get(&via).copied(),
            };
            let id = match existing {
                Some(id) if self.nodes[id].enabled == p.enabled => id,
                other => {
                    if let Some(old) = other {
                        self.abandon(old);
                    }
                    keep.get_or_insert(k);
                    let id = self.nodes.len();
                    self.nodes.push(Node {
                        enabled: p.enabled.clone(),
                        last: p.last,
                        held: p.held.clone(),
                        online: chooser.online.get(k).cloned().unwrap_or_default(),
                        wave: wave_of[k],
                        backtrack: BTreeSet::new(),
                        done: BTreeSet::new(),
                        sleep: k
                            .checked_sub(prefix_len)
                            .and_then(|i| chooser.sleeps.get(i).cloned())
                            .unwrap_or_default(),
                        parent,
                        children: HashMap::new(),
                        depth: k,
                    });
                    match parent {
                        Some((at, via)) => {
                            self.nodes[at].children.insert(via, id);
                        }
                        None => self.root = Some(id),
                    }
                    id
                }
            };
            self.nodes[id].backtrack.insert(p.chosen);
            self.nodes[id].done.insert(p.chosen);
            self.path.push(id);
        }
        let keep = keep.unwrap_or(self.path.len());
        if steps.len() != n {
            self.unanalysed += 1;
            for k in keep..self.path.len() {
                for q in self.nodes[self.path[k]].enabled.clone() {
                    self.add_backtrack(k, q, None);
                }
            }
        } else {
            let events: Vec<(usize, usize)> =
                (0..limit).map(|k| (wave_of[k], points[k].chosen)).collect();
            // A run cut short (redundant from `limit` on) is resolved up to there only.
            let cut;
            let resolved = match full {
                Some(f) if limit == steps.len() => f,
                _ => {
                    cut = self.resolved(&steps[..limit]);
                    &cut[..]
                }
            };
            let sessions: Vec<(StoreKind, u64)> = steps[..limit]
                .iter()
                .map(|s| (s.store, s.session))
                .collect();
            let before = happens_before(&events, &sessions, resolved);
            let blocked: Vec<bool> = steps[..limit].iter().map(|s| s.blocked).collect();
            // A step that touches everything (a sequence, a function of the service's) may hand
            // each racer a value that decides what it does: marked, it ends symmetry.
            let seen: Vec<Seen> = events
                .iter()
                .zip(&steps[..limit])
                .zip(resolved)
                .map(|((&(w, r), s), f)| {
                    let mark = if f.everything { UNCLASSIFIED } else { "" };
                    (w, r, format!("{mark}{} -> {}", s.text, s.result))
                })
                .collect();
            let focused = self.focused();
            for j in 0..limit {
                for i in 0..j {
                    if focused.is_some_and(|g| self.groups.root(events[i]) != g)
                        || !races(i, j, &events, &sessions, resolved, &before)
                    {
                        continue;
                    }
                    self.reverse(i, j, &events, &blocked, &before, &seen);
                }
            }
            if chooser.blocked_at.is_none() {
                self.seen
                    .insert(class_signature(&events, steps, &sessions, resolved));
            }
        }
    }

    /// Reverses the race of steps `i < j` (source sets, Abdulla et al., POPL 2014): the steps
    /// after `i` that do not happen after it, then `j`, can run before step `i`; the racers
    /// that can start that sequence (its *initials*: a racer whose first step there follows
    /// none of the others') are the alternatives at point `i`. One of them is added, unless
    /// one is there already; when none holds a step at `i`, every racer that does is added.
    fn reverse(
        &mut self,
        i: usize,
        j: usize,
        events: &[(usize, usize)],
        blocked: &[bool],
        before: &[Bits],
        seen: &[Seen],
    ) {
        let v: Vec<usize> = (i + 1..j)
            .filter(|&k| !before[k].has(i))
            .chain(std::iter::once(j))
            .collect();
        let mut initials: Vec<usize> = Vec::new();
        let node = &self.nodes[self.path[i]];
        for (x, &k) in v.iter().enumerate() {
            let first = !v[..x].iter().any(|&e| before[k].has(e));
            if first && events[k].0 == node.wave && !initials.contains(&events[k].1) {
                initials.push(events[k].1);
            }
        }
        if initials.iter().any(|q| node.backtrack.contains(q)) {
            return;
        }
        // An initial that holds no step at `i` because its last step before it waits in the
        // server for a lock cannot be scheduled there: its step goes on only once the lock is
        // let go, and that order is the race of its waiting step, reversed at that step.
        let waiting = |q: usize| {
            (0..i)
                .rev()
                .find(|&k| events[k] == (node.wave, q))
                .is_some_and(|k| blocked[k])
        };
        if !initials.is_empty()
            && initials
                .iter()
                .all(|&q| !node.enabled.contains(&q) && waiting(q))
        {
            return;
        }
        let order = default_order(&node.enabled, node.last);
        match order.iter().find(|q| initials.contains(q)) {
            Some(&q) => self.add_backtrack(i, q, Some(seen)),
            None => {
                for q in order {
                    self.add_backtrack(i, q, Some(seen));
                }
            }
        }
    }

    /// Adds racer `q` to the alternatives at point `k`, or the first racer interchangeable
    /// with it there: one of its class that, like `q`, released nothing before `k` in the wave
    /// and holds the same statement.
    fn add_backtrack(&mut self, k: usize, q: usize, seen: Option<&[Seen]>) {
        let id = self.path[k];
        let node = &self.nodes[id];
        let class = |r: usize| self.classes.get(node.wave).and_then(|c| c.get(r)).copied();
        // What a racer released before `k` in the wave: each statement with its answer.
        let history = |r: usize| -> Option<Vec<&str>> {
            let seen = seen?;
            Some(
                seen[..k.min(seen.len())]
                    .iter()
                    .filter(|x| (x.0, x.1) == (node.wave, r))
                    .map(|x| x.2.as_str())
                    .collect(),
            )
        };
        let text = |r: usize| node.held.iter().find(|h| h.racer == r).map(|h| &h.text);
        // Inside a transaction block the racer holds a snapshot and locks of its own: only
        // under READ COMMITTED (a snapshot per statement) are two such racers with the same
        // history alike; outside a block they hold nothing.
        let default = self.catalog.as_ref().and_then(|c| c.default_isolation);
        let settled = |h: &[&str]| -> bool {
            if h.iter().any(|x| x.starts_with(UNCLASSIFIED)) {
                return false;
            }
            let Some(last) = h.last() else { return true };
            if super::footprint::tx_status(last) != Some('T') {
                return super::footprint::tx_status(last) == Some('I');
            }
            let level = h.iter().rev().find_map(|x| {
                let text = x.split(" -> ").next().unwrap_or("");
                match footprint_with(StoreKind::Postgres, text, &[], None).role {
                    TxRole::Begin(level) => Some(level),
                    _ => None,
                }
            });
            level.flatten().or(default) == Some(Isolation::ReadCommitted)
        };
        let mut pick = q;
        if let (Some(_), Some(mine)) = (class(q), history(q).filter(|h| settled(h))) {
            if let Some(&r) = node.enabled.iter().find(|&&r| {
                r < q
                    && class(r) == class(q)
                    && text(r).is_some()
                    && text(r) == text(q)
                    && history(r).as_ref() == Some(&mine)
            }) {
                pick = r;
            }
        }
        self.nodes[id].backtrack.insert(pick);
    }
}

/// The transaction status a step is taken to leave before its reply comes: idle after an
/// end, in a transaction after a `BEGIN` or inside one.
fn guessed_status(role: TxRole, in_block: bool) -> char {
    match role {
        TxRole::End => 'I',
        TxRole::Begin(_) => 'T',
        _ if in_block => 'T',
        _ => 'I',
    }
}

/// A released step as symmetry compares racers: its wave, racer, and statement with answer.
type Seen = (usize, usize, String);

/// The mark of a released step the relation could not classify, in [`Seen`].
const UNCLASSIFIED: &str = "* ";

/// A held step's footprint, resolved by what its session released before it.
#[derive(Debug, Clone)]
struct Online {
    racer: usize,
    session: (StoreKind, u64),
    footprint: Footprint,
}

impl Online {
    /// Whether two held steps of different racers are independent: different sessions, and
    /// footprints that do not conflict.
    fn independent(&self, other: &Online) -> bool {
        self.session != other.session && !self.footprint.conflicts(&other.footprint)
    }
}

/// The wave of each of `n` points, from the points per wave.
fn wave_index(waves: &[usize], n: usize) -> Vec<usize> {
    let mut out: Vec<usize> = waves
        .iter()
        .enumerate()
        .flat_map(|(w, &k)| std::iter::repeat(w).take(k))
        .collect();
    let last = waves.len().saturating_sub(1);
    out.resize(n, last);
    out
}

/// A run's class as a hash: for each pair of dependent steps of different racers, which came
/// first (each step named by its wave, racer and number among the racer's steps), and each
/// racer's statements in order. Two runs of one class have the same signature.
fn class_signature(
    events: &[(usize, usize)],
    steps: &[Released],
    sessions: &[(StoreKind, u64)],
    f: &[Footprint],
) -> u64 {
    use std::hash::{Hash, Hasher};
    /// A step named by its wave, racer and number among the racer's steps.
    type Named = (usize, usize, usize);
    let mut nth: HashMap<(usize, usize), usize> = HashMap::new();
    let named: Vec<Named> = events
        .iter()
        .map(|&(w, r)| {
            let k = nth.entry((w, r)).or_default();
            *k += 1;
            (w, r, *k)
        })
        .collect();
    let mut pairs: Vec<(Named, Named)> = Vec::new();
    for j in 0..events.len() {
        for i in 0..j {
            if events[i] != events[j]
                && events[i].0 == events[j].0
                && sessions[i] != sessions[j]
                && f[i].conflicts(&f[j])
            {
                pairs.push((named[i], named[j]));
            }
        }
    }
    pairs.sort_unstable();
    let mut texts: Vec<(Named, &str)> = named
        .iter()
        .zip(steps)
        .map(|(n, s)| (*n, s.text.as_str()))
        .collect();
    texts.sort_unstable();
    let mut h = std::collections::hash_map::DefaultHasher::new();
    pairs.hash(&mut h);
    texts.hash(&mut h);
    h.finish()
}

/// A set of step indices.
#[derive(Debug, Clone)]
struct Bits(Vec<u64>);

impl Bits {
    fn new(n: usize) -> Self {
        Bits(vec![0; n.div_ceil(64).max(1)])
    }
    fn set(&mut self, i: usize) {
        self.0[i / 64] |= 1 << (i % 64);
    }
    fn has(&self, i: usize) -> bool {
        self.0[i / 64] & (1 << (i % 64)) != 0
    }
    fn union(&mut self, other: &Bits) {
        for (a, b) in self.0.iter_mut().zip(&other.0) {
            *a |= b;
        }
    }
    fn meets(&self, other: &Bits) -> bool {
        self.0.iter().zip(&other.0).any(|(a, b)| a & b != 0)
    }
}

/// Whether step `a` is ordered before step `b` (`a < b`) by itself: one racer (program
/// order), different waves (a wave starts after the last ends), one session, or footprints
/// that conflict.
fn ordered(
    a: usize,
    b: usize,
    events: &[(usize, usize)],
    sessions: &[(StoreKind, u64)],
    f: &[Footprint],
) -> bool {
    events[a] == events[b]
        || events[a].0 != events[b].0
        || sessions[a] == sessions[b]
        || f[a].conflicts(&f[b])
}

/// For each step, the steps that happen before it: the transitive closure of [`ordered`].
fn happens_before(
    events: &[(usize, usize)],
    sessions: &[(StoreKind, u64)],
    f: &[Footprint],
) -> Vec<Bits> {
    let n = events.len();
    let mut before: Vec<Bits> = Vec::with_capacity(n);
    for b in 0..n {
        let mut set = Bits::new(n);
        for (a, earlier) in before.iter().enumerate() {
            if ordered(a, b, events, sessions, f) {
                set.set(a);
                set.union(earlier);
            }
        }
        before.push(set);
    }
    before
}

/// Whether steps `i < j` race: different racers of one wave on different sessions, dependent,
/// and not ordered through a step between them.
fn races(
    i: usize,
    j: usize,
    events: &[(usize, usize)],
    sessions: &[(StoreKind, u64)],
    f: &[Footprint],
    before: &[Bits],
) -> bool {
    if events[i].0 != events[j].0
        || events[i].1 == events[j].1
        || sessions[i] == sessions[j]
        || !f[i].conflicts(&f[j])
    {
        return false;
    }
    // A step k between them with i before k and k before j orders them already.
    let mut after_i = Bits::new(events.len());
    for (k, b) in before.iter().enumerate().take(j).skip(i + 1) {
        if b.has(i) {
            after_i.set(k);
        }
    }
    !after_i.meets(&before[j])
}

/// Follows a prefix of choices, then the default order among the racers awake: a racer in
/// the sleep set is not chosen while the steps released are independent of the step it holds.
#[derive(Debug, Clone)]
pub struct SleepChooser {
    /// The search's generation it was handed out in ([`Reduced::record`]).
    generation: u64,
    /// The choices it replays, and where the service branched from them.
    prefix: Prefix,
    sleep: BTreeSet<usize>,
    catalog: Option<Arc<Catalog>>,
    /// The first point at which every enabled racer slept (the run is redundant from there).
    blocked_at: Option<usize>,
    /// The sleep set at each point past the prefix.
    sleeps: Vec<BTreeSet<usize>>,
    /// The held steps' footprints at each point.
    online: Vec<Vec<Online>>,
    /// Per session, the steps released so far, with the transaction status each is taken
    /// to leave (from its text: the status itself comes with the reply, after the choice).
    history: HashMap<(StoreKind, u64), Vec<StepFootprint>>,
}

impl SleepChooser {
    /// The choices it replays.
    pub fn prefix(&self) -> &[usize] {
        &self.prefix.choices
    }

    /// Whether the run had nothing new: at some point every racer holding a step slept.
    pub fn redundant(&self) -> bool {
        self.blocked_at.is_some()
    }

    /// The footprint of held step `h`, resolved by its session's released steps: within a
    /// transaction block a write is not yet published and a read under READ COMMITTED or
    /// REPEATABLE READ is protected by MVCC; a statement of a block at another level (or one
    /// not known) may take the snapshot later reads use, so it reads anything (`*`).
    fn online(&self, h: &HeldStep) -> Online {
        let catalog = self.catalog.as_deref();
        let session = (h.store, h.session);
        let mut steps = self.history.get(&session).cloned().unwrap_or_default();
        let in_block = steps.last().is_some_and(|s| s.status == Some('T'));
        let next = self.guessed(h, in_block);
        let role = next.footprint.role;
        steps.push(next);
        let default = catalog.and_then(|c| c.default_isolation);
        let mut footprint = resolve(&steps, default).pop().expect("one step at least");
        if h.store == StoreKind::Postgres && in_block && role == TxRole::Statement {
            // The block's level: its BEGIN's, else the default.
            let level = steps
                .iter()
                .rev()
                .skip(1)
                .take_while(|s| s.status == Some('T'))
                .find_map(|s| match s.footprint.role {
                    TxRole::Begin(level) => level,
                    _ => None,
                })
                .or(default);
            if level != Some(Isolation::ReadCommitted) {
                footprint.reads.insert("*".into());
            }
        }
        Online {
            racer: h.racer,
            session,
            footprint,
        }
    }

    /// Records the step `h` released, with the status it is taken to leave.
    fn released(&mut self, h: &HeldStep) {
        let session = (h.store, h.session);
        let in_block = self
            .history
            .get(&session)
            .and_then(|steps| steps.last())
            .is_some_and(|s| s.status == Some('T'));
        let next = self.guessed(h, in_block);
        self.history.entry(session).or_default().push(next);
    }

    /// Held step `h` as its session's next step, with the status it is taken to leave
    /// (`in_block`: the session's last step left it inside a transaction block).
    fn guessed(&self, h: &HeldStep, in_block: bool) -> StepFootprint {
        let footprint = footprint_with(h.store, &h.text, &h.params, self.catalog.as_deref());
        StepFootprint {
            session: (h.store, h.session),
            status: Some(guessed_status(footprint.role, in_block)),
            footprint,
            blocked: false,
        }
    }
}

impl Chooser for SleepChooser {
    fn choose(&mut self, index: usize, enabled: &[usize], last: Option<usize>) -> usize {
        self.choose_held(index, enabled, last, &[])
    }

    fn follows_lone_waves(&self) -> bool {
        true
    }

    fn choose_held(
        &mut self,
        index: usize,
        enabled: &[usize],
        last: Option<usize>,
        held: &[HeldStep],
    ) -> usize {
        let online: Vec<Online> = held.iter().map(|h| self.online(h)).collect();
        let chosen = self.pick(index, enabled, last, &online);
        if let Some(h) = held.iter().find(|h| h.racer == chosen) {
            self.released(h);
        }
        if self.online.len() == index {
            self.online.push(online);
        }
        chosen
    }
}

impl SleepChooser {
    fn pick(
        &mut self,
        index: usize,
        enabled: &[usize],
        last: Option<usize>,
        online: &[Online],
    ) -> usize {
        let replayed = self.prefix.choices.len();
        if index < replayed {
            return self.prefix.choose(index, enabled, last);
        }
        if index != replayed + self.sleeps.len() || self.blocked_at.is_some() {
            // Past a point where the run stopped being new: any order will do.
            return default_order(enabled, last)[0];
        }
        // A sleeper that holds no step any more (let go on a deadline, deferred) wakes.
        self.sleep
            .retain(|q| enabled.contains(q) && online.iter().any(|o| o.racer == *q));
        self.sleeps.push(self.sleep.clone());
        let awake: Vec<usize> = enabled
            .iter()
            .copied()
            .filter(|r| !self.sleep.contains(r))
            .collect();
        if awake.is_empty() {
            self.blocked_at = Some(index);
            return default_order(enabled, last)[0];
        }
        let chosen = default_order(&awake, last)[0];
        match online.iter().find(|o| o.racer == chosen) {
            Some(p) => self.sleep.retain(|&q| {
                online
                    .iter()
                    .find(|o| o.racer == q)
                    .is_some_and(|o| o.independent(p))
            }),
            None => self.sleep.clear(),
        }
        chosen
    }
}

#[cfg(test)]
mod tests;
