//! Independent groups of racers for the reduced search ([`super::reduce`]): racers none of
//! whose steps, in any run seen, depends on a step of another group.
//!
//! A class of interleavings is an order of a whole run, so the classes of two groups that
//! never touch each other's rows or keys multiply (three clients of one scope racing beside
//! three of another). Explored one group at a time (the others following one order
//! of theirs), the search runs the sum instead: every class of each group, each beside some
//! class of the others. That covers every verdict when each group's steps, answers and
//! effects depend only on its own order, which is what independence means, and when the
//! checks judge each intent on its own or compare sums of counts (a failure of a sum in a
//! combination of classes is a failure with one group's class changed alone).
//!
//! Racers are tied when any step of one was ever seen dependent on any step of the other
//! (in one run, or in two runs: a step one group takes in one of its classes meets a step
//! another takes in one of its own), when they share a session in one wave, and when they
//! send the same intent (scope and key: their checks compare their answers). A tie found
//! after the search began restarts it with the groups merged.

use std::collections::{BTreeSet, HashMap};

use super::footprint::Footprint;
use super::hub::StoreKind;

/// A racer: its conducted wave and index there; the racer of the `k`-th wave of one racer
/// (followed, not scheduled) is `(LONE + k, 0)`.
pub type Node = (usize, usize);

/// The first node number of the waves of one racer.
pub const LONE: usize = 1 << 32;

/// The groups, as a union of racers, with every footprint each racer was seen to take.
#[derive(Debug, Clone, Default)]
pub struct Groups {
    parent: HashMap<Node, Node>,
    seen: HashMap<Node, Vec<Footprint>>,
}

impl Groups {
    /// Groups in which the racers of one wave that send one intent are tied:
    /// `intents[w][r]` is racer `r` of conducted wave `w`'s intent (a wave not listed: none).
    pub fn new(intents: &[Vec<usize>]) -> Self {
        let mut g = Groups::default();
        for (w, wave) in intents.iter().enumerate() {
            for (r, i) in wave.iter().enumerate() {
                g.add((w, r));
                if let Some(first) = wave.iter().position(|x| x == i) {
                    g.union((w, first), (w, r));
                }
            }
        }
        g
    }

    fn add(&mut self, n: Node) {
        self.parent.entry(n).or_insert(n);
    }

    /// The group of `n` (its first racer).
    pub fn root(&self, n: Node) -> Node {
        let mut at = n;
        while let Some(&up) = self.parent.get(&at) {
            if up == at {
                break;
            }
            at = up;
        }
        at
    }

    /// Ties `a` and `b`; whether they were apart.
    fn union(&mut self, a: Node, b: Node) -> bool {
        self.add(a);
        self.add(b);
        let (ra, rb) = (self.root(a), self.root(b));
        if ra == rb {
            return false;
        }
        let (lo, hi) = if ra < rb { (ra, rb) } else { (rb, ra) };
        self.parent.insert(hi, lo);
        true
    }

    /// Takes a run's steps (racer, session, resolved footprint): ties racers of one wave that
    /// share a session, and racers with dependent footprints in this run or any run before.
    /// Returns whether two groups were tied.
    pub fn observe(&mut self, steps: &[(Node, (StoreKind, u64), &Footprint)]) -> bool {
        let mut tied = false;
        for (k, (a, sa, _)) in steps.iter().enumerate() {
            self.add(*a);
            for (b, sb, _) in &steps[..k] {
                if a != b && a.0 == b.0 && a.0 < LONE && sa == sb {
                    tied |= self.union(*a, *b);
                }
            }
        }
        for (a, _, f) in steps {
            if f.is_local() || self.seen.get(a).is_some_and(|v| v.contains(f)) {
                continue;
            }
            let others: Vec<Node> = self
                .seen
                .iter()
                .filter(|(b, fs)| *b != a && fs.iter().any(|g| g.conflicts(f)))
                .map(|(b, _)| *b)
                .collect();
            for b in others {
                tied |= self.union(*a, b);
            }
            self.seen.entry(*a).or_default().push((*f).clone());
        }
        tied
    }

    /// The groups that have two racers or more in one conducted wave (only those have
    /// orders to explore), each named by its first racer, in order.
    pub fn with_races(&self) -> Vec<Node> {
        let mut per: HashMap<(Node, usize), usize> = HashMap::new();
        for &n in self.parent.keys().filter(|n| n.0 < LONE) {
            *per.entry((self.root(n), n.0)).or_default() += 1;
        }
        per.into_iter()
            .filter(|(_, c)| *c > 1)
            .map(|((root, _), _)| root)
            .collect::<BTreeSet<Node>>()
            .into_iter()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interpose::footprint::{footprint, Catalog};

    #[test]
    fn racers_are_tied_by_an_intent_a_session_or_a_dependency_seen_in_any_run() {
        let cat = Catalog::new(&["a_keys".into(), "b_keys".into()], &[]);
        let pg = |t: &str| footprint(StoreKind::Postgres, t, Some(&cat));
        let (wa, wb) = (
            pg("INSERT INTO a_keys VALUES (1)"),
            pg("INSERT INTO b_keys VALUES (1)"),
        );
        let ra = pg("SELECT * FROM a_keys");
        let s = |n: u64| (StoreKind::Postgres, n);
        // Racers 0, 1 send intent 0; 2, 3 intent 1.
        let mut g = Groups::new(&[vec![0, 0, 1, 1]]);
        assert_eq!(g.with_races(), vec![(0, 0), (0, 2)]);
        // One run: each pair touches its own relation.
        let run = [
            ((0, 0), s(1), &wa),
            ((0, 2), s(2), &wb),
            ((0, 1), s(3), &wa),
            ((0, 3), s(4), &wb),
        ];
        assert!(!g.observe(&run));
        assert_eq!(g.with_races().len(), 2);
        // A later run in which racer 3 reads what racer 0 wrote in the first: tied.
        assert!(g.observe(&[((0, 3), s(4), &ra)]));
        assert_eq!(g.with_races(), vec![(0, 0)]);
        // A shared session in one wave ties; across waves it does not.
        let mut g = Groups::new(&[vec![0, 1], vec![0, 1]]);
        assert!(!g.observe(&[((0, 0), s(1), &wa), ((1, 1), s(1), &wb)]));
        assert!(g.observe(&[((0, 0), s(1), &wa), ((0, 1), s(1), &wb)]));
        // A wave of one racer that reads what one group wrote joins it.
        let mut g = Groups::new(&[vec![0, 1]]);
        assert!(!g.observe(&[((0, 0), s(1), &wa), ((0, 1), s(2), &wb)]));
        assert!(g.observe(&[((LONE, 0), s(1), &ra)]));
        assert_eq!(g.root((LONE, 0)), (0, 0));
        assert_eq!(g.root((0, 1)), (0, 1), "the other group stays apart");
    }
}
