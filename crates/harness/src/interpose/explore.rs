//! Schedules: which held racer goes next at each choice point, and the search over them.
//!
//! A run meets a sequence of choice points, each with the racers that hold a step
//! ([`ChoicePoint::enabled`]). A schedule is the sequence of racers chosen, written as letters
//! (`A` for the first racer of the wave, `B` for the second, …) with `/` between waves: its id.
//!
//! - exhaustive: depth-first over every choice (stateless: each prefix is replayed from a fresh
//!   run); at a point the racer that ran last comes first, then the others in order;
//! - bounded: the same search, keeping only schedules with at most *b* preemptions (a switch
//!   away from a racer that could have gone on), after CHESS (Musuvathi and Qadeer, PLDI 2007);
//! - PCT: random racer priorities with *d* − 1 change points per run (Burckhardt et al., ASPLOS
//!   2010): a bug of depth *d* among *n* racers and *k* steps is found by one run with
//!   probability at least 1 / (*n* · *k*^(*d*−1));
//! - replay: a given schedule id, followed where the service lets it.
//!
//! A service that branches (a point whose racers differ from the replayed prefix's) is followed:
//! the prefix's racer is taken when it holds a step, otherwise the default order's first, and
//! the run counts a divergence.

use std::collections::HashMap;

use rand::{Rng as _, SeedableRng as _};
use serde::Serialize;

/// One choice point as a run met it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ChoicePoint {
    /// Racers (indices in the wave, flattened across waves) holding a step, ascending.
    pub enabled: Vec<usize>,
    /// The one released.
    pub chosen: usize,
    /// The racer released at the point before (in the same wave), if any.
    pub last: Option<usize>,
    /// The step each enabled racer held there (the reduced search's sleep sets read them;
    /// not written out: the released steps are).
    #[serde(skip)]
    pub held: Vec<HeldStep>,
}

/// The step a racer held at a choice point.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldStep {
    /// The racer (index in the wave).
    pub racer: usize,
    /// Its store.
    pub store: super::hub::StoreKind,
    /// Its session in that store.
    pub session: u64,
    /// The statement or command text.
    pub text: String,
    /// Its bound parameters ([`super::hub::Step::params`]).
    pub params: Vec<String>,
}

impl ChoicePoint {
    /// Whether choosing `racer` here is a preemption: the last racer could have gone on.
    pub(crate) fn preempts(&self, racer: usize) -> bool {
        self.last
            .is_some_and(|l| l != racer && self.enabled.contains(&l))
    }
}

/// Picks the racer that goes next.
pub trait Chooser {
    /// At choice point number `index` (from 0, across the run), with `enabled` (ascending,
    /// never empty) and the racer released last.
    fn choose(&mut self, index: usize, enabled: &[usize], last: Option<usize>) -> usize;

    /// [`Chooser::choose`], also told the step each enabled racer holds (`held`, one per
    /// enabled racer when the conductor knows it). By default the steps are not read.
    fn choose_held(
        &mut self,
        index: usize,
        enabled: &[usize],
        last: Option<usize>,
        held: &[HeldStep],
    ) -> usize {
        let _ = held;
        self.choose(index, enabled, last)
    }

    /// Whether a wave of one racer is to be followed through the interposer (its steps
    /// released as they come, recorded, with no choice made and no point counted), for a
    /// search that reads every step of a run. By default such a wave is sent as it is.
    fn follows_lone_waves(&self) -> bool {
        false
    }
}

/// The default order at a point: the last racer first when it holds a step, then the others
/// ascending.
pub(crate) fn default_order(enabled: &[usize], last: Option<usize>) -> Vec<usize> {
    let mut v: Vec<usize> = last.filter(|l| enabled.contains(l)).into_iter().collect();
    v.extend(enabled.iter().copied().filter(|&r| Some(r) != last));
    v
}

/// Follows a prefix of choices, then the default order; counts where the prefix's racer held
/// no step.
#[derive(Debug, Clone, Default)]
pub struct Prefix {
    /// The racers to choose, in order.
    pub choices: Vec<usize>,
    /// Points where the prefix's racer held no step.
    pub divergences: usize,
}

impl Chooser for Prefix {
    fn choose(&mut self, index: usize, enabled: &[usize], last: Option<usize>) -> usize {
        match self.choices.get(index) {
            Some(r) if enabled.contains(r) => *r,
            Some(_) => {
                self.divergences += 1;
                default_order(enabled, last)[0]
            }
            None => default_order(enabled, last)[0],
        }
    }
}

/// The depth-first search over schedules, with an optional preemption bound.
///
/// Stateless: each prefix is run from a fresh start, and the run's points past its prefix
/// give the prefixes of its children (every alternative there, within the bound). The
/// prefixes not yet run are kept on a stack, the deepest point's first alternative on top, so
/// that taken one at a time they come in depth-first order; taken several at once (schedules
/// side by side) the same set is run, each prefix once, whatever order the runs end in.
#[derive(Debug, Clone)]
pub struct Search {
    bound: Option<u32>,
    pending: Vec<Vec<usize>>,
}

impl Search {
    /// A search from the default schedule; `bound`: at most that many preemptions.
    pub fn new(bound: Option<u32>) -> Self {
        Search {
            bound,
            pending: vec![Vec::new()],
        }
    }

    /// The prefix a next run follows; `None` when every prefix handed out so far has been,
    /// or is being, run (with none out, the search is complete).
    pub fn next_prefix(&mut self) -> Option<Vec<usize>> {
        self.pending.pop()
    }

    /// Whether no prefix is waiting to be run.
    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// Takes the points a run met following a prefix of `prefix_len` choices, and keeps its
    /// children: at each point from `prefix_len` on (before it, the runs that made the prefix
    /// branched), every alternative after the one chosen in the default order whose
    /// preemptions along the run stay within the bound.
    pub fn record(&mut self, prefix_len: usize, points: &[ChoicePoint]) {
        let mut preemptions = Vec::with_capacity(points.len());
        let mut so_far = 0u32;
        for p in points {
            preemptions.push(so_far);
            so_far += u32::from(p.preempts(p.chosen));
        }
        for (j, p) in points.iter().enumerate().skip(prefix_len) {
            let order = default_order(&p.enabled, p.last);
            let at = order.iter().position(|&r| r == p.chosen).unwrap_or(0);
            // Pushed last first, so the first alternative is taken first.
            for &alt in order[at + 1..].iter().rev() {
                let cost = preemptions[j] + u32::from(p.preempts(alt));
                if self.bound.map_or(true, |b| cost <= b) {
                    let mut prefix: Vec<usize> = points[..j].iter().map(|q| q.chosen).collect();
                    prefix.push(alt);
                    self.pending.push(prefix);
                }
            }
        }
    }
}

/// Probabilistic concurrency testing: one run's racer priorities and change points.
#[derive(Debug, Clone)]
pub(crate) struct Pct {
    priority: Vec<i64>,
    change_at: Vec<usize>,
    taken: usize,
}

impl Pct {
    /// Run number `run` of a PCT search with `seed`: `racers` racers, about `steps` steps in
    /// all, bug depth `depth` (at least 1: `depth − 1` change points).
    pub(crate) fn new(seed: u64, run: u64, racers: usize, steps: usize, depth: u32) -> Self {
        let mut rng =
            rand::rngs::StdRng::seed_from_u64(seed ^ run.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let d = i64::from(depth.max(1));
        let mut priority: Vec<i64> = (0..racers).map(|i| d + i as i64).collect();
        for i in (1..priority.len()).rev() {
            let j = rng.gen_range(0..=i);
            priority.swap(i, j);
        }
        let change_at = (1..depth.max(1))
            .map(|_| rng.gen_range(0..steps.max(1)))
            .collect();
        Pct {
            priority,
            change_at,
            taken: 0,
        }
    }
}

impl Chooser for Pct {
    fn choose(&mut self, _index: usize, enabled: &[usize], _last: Option<usize>) -> usize {
        let best = *enabled
            .iter()
            .max_by_key(|&&r| self.priority.get(r).copied().unwrap_or(0))
            .expect("a choice point has a racer");
        for (i, &at) in self.change_at.iter().enumerate() {
            if at == self.taken {
                if let Some(p) = self.priority.get_mut(best) {
                    // The i-th change point drops the running racer below every other.
                    *p = -(i as i64) - 1;
                }
            }
        }
        self.taken += 1;
        best
    }
}

/// PCT's lower bound on one run finding a bug of depth `depth` with `racers` racers and
/// `steps` steps: 1 / (n · k^(d−1)).
pub(crate) fn pct_bound(racers: usize, steps: usize, depth: u32) -> f64 {
    let k = steps.max(1) as f64;
    1.0 / (racers.max(1) as f64 * k.powi(depth.max(1) as i32 - 1))
}

/// The probability that `runs` independent runs each finding a bug with probability at least
/// `p` all miss it: at most (1 − p)^R.
pub(crate) fn miss_probability(p: f64, runs: usize) -> f64 {
    (1.0 - p).powi(i32::try_from(runs).unwrap_or(i32::MAX))
}

/// How many ways racers with `steps[i]` steps each interleave when every step is always
/// enabled: the multinomial (Σ k)! / Π k!; `None` past `u128`.
pub fn interleavings(steps: &[u64]) -> Option<u128> {
    let mut total: u128 = 1;
    let mut n: u128 = 0;
    for &k in steps {
        for i in 1..=u128::from(k) {
            n += 1;
            total = total.checked_mul(n)? / i;
        }
    }
    Some(total)
}

/// How many of those interleavings have at most `bound` preemptions (a switch away from a
/// racer with steps left); `None` when the count would take too long to work out.
pub(crate) fn bounded_interleavings(steps: &[u64], bound: u32) -> Option<u128> {
    let states: u128 = steps.iter().map(|&k| u128::from(k) + 1).product::<u128>()
        * (steps.len() as u128 + 1)
        * (u128::from(bound) + 1);
    if states > 2_000_000 {
        return None;
    }
    fn count(
        rem: &mut Vec<u64>,
        cur: Option<usize>,
        used: u32,
        bound: u32,
        memo: &mut HashMap<(Vec<u64>, Option<usize>, u32), u128>,
    ) -> u128 {
        if rem.iter().all(|&k| k == 0) {
            return 1;
        }
        let key = (rem.clone(), cur, used);
        if let Some(&v) = memo.get(&key) {
            return v;
        }
        let mut total: u128 = 0;
        for r in 0..rem.len() {
            if rem[r] == 0 {
                continue;
            }
            let cost = u32::from(cur.is_some_and(|c| c != r && rem[c] > 0));
            if used + cost > bound {
                continue;
            }
            rem[r] -= 1;
            total = total.saturating_add(count(rem, Some(r), used + cost, bound, memo));
            rem[r] += 1;
        }
        memo.insert(key, total);
        total
    }
    let mut rem = steps.to_vec();
    Some(count(&mut rem, None, 0, bound, &mut HashMap::new()))
}

/// A schedule's id: the chosen racers as letters, `/` between waves (`waves[i]`: the number
/// of points of wave i).
pub fn schedule_id(points: &[ChoicePoint], waves: &[usize]) -> String {
    let mut out = String::new();
    let mut at = 0;
    for (w, &n) in waves.iter().enumerate() {
        if w > 0 {
            out.push('/');
        }
        for p in points.iter().skip(at).take(n) {
            out.push(racer_letter(p.chosen));
        }
        at += n;
    }
    out
}

/// `A` for racer 0, … `Z` for 25, then `a` … `z`; `?` beyond.
pub(crate) fn racer_letter(i: usize) -> char {
    match i {
        0..=25 => (b'A' + i as u8) as char,
        26..=51 => (b'a' + (i - 26) as u8) as char,
        _ => '?',
    }
}

/// Parses a schedule id into its flattened choices.
///
/// Will return `Err` naming the first character that is not a racer letter or `/`.
pub fn parse_schedule_id(id: &str) -> Result<Vec<usize>, ScheduleIdError> {
    id.chars()
        .filter(|&c| c != '/')
        .map(|c| match c {
            'A'..='Z' => Ok(c as usize - 'A' as usize),
            'a'..='z' => Ok(c as usize - 'a' as usize + 26),
            _ => Err(ScheduleIdError::NotALetter {
                id: id.to_string(),
                found: c,
            }),
        })
        .collect()
}

/// Parses a schedule id for a scenario whose widest wave has `racers` racers: every letter
/// must name one of them (`A` the first).
///
/// Will return `Err` naming the first character that is not a racer letter or `/`, or the
/// first letter past the last racer, with the racers' letters.
pub fn parse_schedule_id_for(id: &str, racers: usize) -> Result<Vec<usize>, ScheduleIdError> {
    let choices = parse_schedule_id(id)?;
    let letters = id.chars().filter(|&c| c != '/');
    match choices.iter().zip(letters).find(|(&r, _)| r >= racers) {
        Some((_, found)) => Err(ScheduleIdError::NoSuchRacer {
            id: id.to_string(),
            found,
            racers,
            letters: (0..racers)
                .map(racer_letter)
                .map(String::from)
                .collect::<Vec<_>>()
                .join(", "),
        }),
        None => Ok(choices),
    }
}

/// A schedule id that does not name a schedule.
#[derive(Debug, thiserror::Error)]
pub enum ScheduleIdError {
    /// A character that is neither a racer letter nor `/`.
    #[error("schedule id {id:?}: {found:?} is not a racer letter (A–Z, a–z) or '/'")]
    NotALetter {
        /// The id as given.
        id: String,
        /// The first character that is not a racer letter or `/`.
        found: char,
    },
    /// A letter past the scenario's last racer.
    #[error("schedule id {id:?}: {found:?} names no racer: the scenario races {racers} racers ({letters})")]
    NoSuchRacer {
        /// The id as given.
        id: String,
        /// The first letter that names no racer.
        found: char,
        /// Racers in the scenario's widest wave.
        racers: usize,
        /// Their letters, comma-separated.
        letters: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One run of a model of `steps[i]` steps per racer, every step always enabled, following
    /// `prefix`: its points.
    fn model_run(steps: &[usize], prefix: Vec<usize>) -> Vec<ChoicePoint> {
        let mut chooser = Prefix {
            choices: prefix,
            divergences: 0,
        };
        let mut left = steps.to_vec();
        let (mut points, mut last) = (Vec::new(), None);
        while left.iter().any(|&k| k > 0) {
            let enabled: Vec<usize> = (0..left.len()).filter(|&r| left[r] > 0).collect();
            let chosen = chooser.choose(points.len(), &enabled, last);
            points.push(ChoicePoint {
                enabled,
                chosen,
                last,
                held: Vec::new(),
            });
            left[chosen] -= 1;
            last = Some(chosen);
        }
        assert_eq!(chooser.divergences, 0);
        points
    }

    /// Runs a search over the model of [`model_run`] one run at a time; returns every
    /// schedule it ran.
    fn explore(steps: &[usize], bound: Option<u32>) -> Vec<Vec<usize>> {
        let mut search = Search::new(bound);
        let mut seen = Vec::new();
        while let Some(prefix) = search.next_prefix() {
            let n = prefix.len();
            let points = model_run(steps, prefix);
            seen.push(points.iter().map(|p| p.chosen).collect());
            search.record(n, &points);
        }
        seen
    }

    #[test]
    fn taken_several_at_once_and_ended_in_any_order_the_search_runs_the_same_schedules() {
        for (steps, bound) in [
            (vec![3, 3], None),
            (vec![2, 2, 1], None),
            (vec![4, 3], Some(2)),
        ] {
            let mut one_at_a_time = explore(&steps, bound);
            // Three lanes: three prefixes out at once, the last handed out ending first.
            let mut search = Search::new(bound);
            let (mut out, mut seen): (Vec<Vec<usize>>, Vec<Vec<usize>>) = (Vec::new(), Vec::new());
            loop {
                while out.len() < 3 {
                    match search.next_prefix() {
                        Some(p) => out.push(p),
                        None => break,
                    }
                }
                let Some(prefix) = out.pop() else { break };
                let n = prefix.len();
                let points = model_run(&steps, prefix);
                seen.push(points.iter().map(|p| p.chosen).collect());
                search.record(n, &points);
            }
            one_at_a_time.sort();
            seen.sort();
            assert_eq!(seen, one_at_a_time, "{steps:?} bound {bound:?}");
        }
    }

    #[test]
    fn the_exhaustive_search_runs_every_interleaving_once() {
        for steps in [vec![2, 2], vec![3, 2], vec![2, 2, 1], vec![4, 4]] {
            let all = explore(&steps, None);
            let mut unique = all.clone();
            unique.sort();
            unique.dedup();
            assert_eq!(unique.len(), all.len(), "{steps:?}: a schedule ran twice");
            let k: Vec<u64> = steps.iter().map(|&s| s as u64).collect();
            assert_eq!(all.len() as u128, interleavings(&k).unwrap(), "{steps:?}");
        }
        assert_eq!(interleavings(&[8, 8]), Some(12_870));
    }

    #[test]
    fn the_bounded_search_keeps_within_its_preemptions_and_matches_the_count() {
        for bound in 0..3 {
            let all = explore(&[3, 3], Some(bound));
            let k = bounded_interleavings(&[3, 3], bound).unwrap();
            assert_eq!(all.len() as u128, k, "bound {bound}");
            for s in &all {
                // A preemption: a switch away from a racer that still has steps after it.
                let pre = (1..s.len())
                    .filter(|&i| s[i] != s[i - 1] && s[i..].contains(&s[i - 1]))
                    .count();
                assert!(pre as u32 <= bound, "{s:?} has {pre} preemptions");
            }
        }
        // Bound 0: only the two serial orders.
        assert_eq!(
            explore(&[3, 3], Some(0)),
            [vec![0, 0, 0, 1, 1, 1], vec![1, 1, 1, 0, 0, 0]]
        );
        assert!(bounded_interleavings(&[3, 3], 2).unwrap() < interleavings(&[3, 3]).unwrap());
    }

    #[test]
    fn a_prefix_that_names_a_racer_without_a_step_diverges_and_is_counted() {
        let mut p = Prefix {
            choices: vec![1, 1],
            divergences: 0,
        };
        assert_eq!(p.choose(0, &[0, 1], None), 1);
        assert_eq!(p.choose(1, &[0], Some(1)), 0);
        assert_eq!(p.divergences, 1);
        assert_eq!(
            p.choose(2, &[0, 1], Some(0)),
            0,
            "past the prefix: the last goes on"
        );
    }

    #[test]
    fn schedule_ids_round_trip_with_wave_separators() {
        let pts: Vec<ChoicePoint> = [0, 1, 1, 0, 2]
            .iter()
            .map(|&c| ChoicePoint {
                enabled: vec![0, 1, 2],
                chosen: c,
                last: None,
                held: Vec::new(),
            })
            .collect();
        let id = schedule_id(&pts, &[3, 2]);
        assert_eq!(id, "ABB/AC");
        assert_eq!(parse_schedule_id(&id).unwrap(), [0, 1, 1, 0, 2]);
        assert!(parse_schedule_id("AB1").is_err());
    }

    #[test]
    fn pct_is_seeded_and_its_bound_shrinks_with_depth() {
        let run = |seed| {
            let mut p = Pct::new(seed, 3, 2, 6, 2);
            (0..6)
                .map(|i| p.choose(i, &[0, 1], None))
                .collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        assert!(pct_bound(2, 10, 2) < pct_bound(2, 10, 1));
        assert!((pct_bound(2, 10, 2) - 0.05).abs() < 1e-12);
        assert!(miss_probability(0.05, 100) < 0.01);
    }
}
