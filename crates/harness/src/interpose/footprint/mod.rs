//! The dependency relation of the reduced search ([`super::reduce`]): what one wire step
//! touches (its *footprint*), and whether two steps of different sessions are dependent, that
//! is, whether running them in the other order can change what either sees or leaves behind.
//!
//! The relation is conservative: whatever it cannot classify is dependent.
//!
//! - PostgreSQL: a statement touches the relations of the service's database it names
//!   (identifiers matched against the catalog, [`Catalog`]), each widened to every relation tied
//!   to it by a foreign key, a trigger's function, a view's definition or a rule (the connected
//!   group, read once per set-up). A `SELECT` (or `WITH`/`VALUES`/`TABLE`) that locks no row,
//!   writes nothing and calls only functions known to be free of shared effects reads them;
//!   anything else that names a relation writes them (row locks included). A statement that
//!   calls any other function (`nextval`, `pg_advisory_xact_lock`, the service's own), writes
//!   no known relation, or is outside these shapes (`CALL`, `DO`, `NOTIFY`, DDL, `EXECUTE`)
//!   touches *everything* in its server. `SET`, `SHOW`, `RESET`, `DISCARD`, `BEGIN`,
//!   `SAVEPOINT` and `RELEASE` touch nothing another session can see (PostgreSQL takes a
//!   transaction's snapshot at its first statement, not at `BEGIN`).
//! - Inserts told apart: plain one-row inserts into relations of [`Catalog::unique_keys`] are
//!   dependent only when a unique key may meet (equal, or not known in either) or a foreign key
//!   of one may reference the other's row ([`Insert::collides`]); a read by a unique key
//!   ([`PointRead`]) sees only inserts of that key.
//! - Writes become visible to others when they are *published*: at `COMMIT`, `ROLLBACK` (or
//!   `ROLLBACK TO`, which also lets go of locks), or at once outside a transaction block. A
//!   plain read under READ COMMITTED or REPEATABLE READ neither sees nor waits for a write not
//!   yet published (MVCC), so it is independent of it and dependent on its publication; under
//!   SERIALIZABLE, or at a level not known, a read is dependent on every write of what it reads.
//!   Under REPEATABLE READ and SERIALIZABLE (and a level not known) a transaction's statements
//!   share one snapshot, so each reads everything the transaction reads.
//! - Redis: a command touches the keys at its key positions (the command table below; a
//!   script's declared keys for `EVAL`, `EVALSHA`, `FCALL`: a script must declare every key it
//!   touches), read or written by the command's kind, a write published at once; connection
//!   commands (`PING`, `SELECT`, `HELLO`, `CLIENT`, …) touch nothing; any other command touches
//!   everything in its server. A `MULTI` … `EXEC` block writes its keys and reads any key
//!   (`WATCH` passes the relay unheld, so what would abort it is not seen).
//! - A step seen waiting for a lock writes what it touches.
//!
//! Two steps are dependent when they are on one session, or on one server and: both write one
//! resource; one publishes a resource the other touches; one reads what the other writes and
//! the reader is not protected by MVCC; or either touches everything there. Steps on different
//! servers (PostgreSQL and Redis) are independent: neither can see the other's effect.
//!
//! Before a step has run (the step a racer holds, for sleep sets) its transaction is not
//! known, so [`Footprint::unresolved`] takes the widest reading: a transaction's end touches
//! everything, a read may take a snapshot of anything, a write may publish at once.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use super::hub::StoreKind;

mod redis;
mod sql;

use redis::redis_footprint;
use sql::{sql_footprint, sql_tokens, SqlToken};

/// A transaction's isolation level as PostgreSQL names it (`READ UNCOMMITTED` behaves as
/// `READ COMMITTED` there).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isolation {
    /// Each statement takes its own snapshot.
    ReadCommitted,
    /// One snapshot for the transaction, from its first statement.
    RepeatableRead,
    /// One snapshot, with serializable-snapshot-isolation's read/write tracking.
    Serializable,
}

impl Isolation {
    fn parse(words: &[&str]) -> Option<Isolation> {
        let at = words.windows(2).position(|w| w == ["isolation", "level"])?;
        match (words.get(at + 2).copied(), words.get(at + 3).copied()) {
            (Some("read"), Some("committed" | "uncommitted")) => Some(Isolation::ReadCommitted),
            (Some("repeatable"), _) => Some(Isolation::RepeatableRead),
            (Some("serializable"), _) => Some(Isolation::Serializable),
            _ => None,
        }
    }
}

/// A step's part in its session's transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxRole {
    /// A statement or command.
    Statement,
    /// `BEGIN`/`START TRANSACTION` (or `SET TRANSACTION`), with the level it names.
    Begin(Option<Isolation>),
    /// `SAVEPOINT`: visible to no one.
    Savepoint,
    /// `RELEASE SAVEPOINT`: visible to no one.
    Release,
    /// Ends the transaction: `COMMIT`, `ROLLBACK`, `ABORT`, `END`, `PREPARE TRANSACTION`.
    End,
    /// Undoes part of it and lets go of the locks taken since a savepoint (`ROLLBACK TO`); the
    /// transaction goes on.
    Undo,
    /// Changes the session's default isolation (`SET SESSION CHARACTERISTICS`,
    /// `default_transaction_isolation`): its later transactions' level is not known.
    SetsDefault,
}

/// What one step touches in its store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Footprint {
    /// The store the step went to.
    pub store: StoreKind,
    /// Touches every resource of its store (unclassified).
    pub everything: bool,
    /// Resources read: PostgreSQL relation groups, Redis keys; `*` stands for any resource.
    pub reads: BTreeSet<String>,
    /// Reads of rows by a unique key, told apart from inserts of other keys ([`PointRead`]).
    pub point_reads: Vec<PointRead>,
    /// Resources written or locked.
    pub writes: BTreeSet<String>,
    /// Resources whose writes it makes visible to other sessions.
    pub publishes: BTreeSet<String>,
    /// Its reads neither see nor wait for writes not yet published (PostgreSQL MVCC under
    /// READ COMMITTED or REPEATABLE READ).
    pub mvcc: bool,
    /// Its part in its transaction.
    pub role: TxRole,
    /// A plain one-row insert into a relation whose inserts are told apart by their unique
    /// keys ([`Catalog::unique_keys`]): two such inserts are dependent only when they collide
    /// ([`Insert::collides`]).
    pub insert: Option<Insert>,
    /// When every write a publishing step publishes is such an insert: those inserts.
    pub published_inserts: Option<Vec<Insert>>,
}

/// A plain one-row insert, told apart from others by its unique keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Insert {
    /// The relation.
    pub relation: String,
    /// Per unique index of the relation, the values of its columns as sent (`None`: a value
    /// not known, as a column the insert leaves to its default, or `NULL`).
    pub keys: Vec<Option<Vec<String>>>,
    /// The values sent for the columns a foreign key names (either side), by column; a
    /// column missing here is not known.
    pub values: BTreeMap<String, String>,
    /// Its foreign keys: the rows of other relations (or its own) it references.
    pub references: Vec<ForeignKey>,
}

/// A foreign key as the catalog states it (`pg_constraint`, `contype = 'f'`): the child's
/// columns reference the parent's, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForeignKey {
    /// The referencing relation.
    pub child: String,
    /// Its columns, in the key's order.
    pub child_columns: Vec<String>,
    /// The referenced relation.
    pub parent: String,
    /// The referenced columns (a unique key of the parent), in the key's order.
    pub parent_columns: Vec<String>,
}

impl Insert {
    /// Whether two inserts may wait for or fail on each other: one relation and a unique key
    /// that is equal or not known in either; or a foreign key of one to the other's relation
    /// whose referenced row may be the other's row (values equal or not known: the key's
    /// check locks the referenced row, PostgreSQL's `RI_FKey_check`).
    pub fn collides(&self, other: &Insert) -> bool {
        let one_key = self.relation == other.relation
            && self
                .keys
                .iter()
                .zip(&other.keys)
                .any(|(a, b)| a.is_none() || b.is_none() || a == b);
        one_key || self.may_reference(other) || other.may_reference(self)
    }

    /// Whether a foreign key of this insert may reference `parent`'s row: a key to its
    /// relation whose values are not told apart (one column known on both sides and
    /// different tells them apart).
    fn may_reference(&self, parent: &Insert) -> bool {
        self.references
            .iter()
            .filter(|k| k.parent == parent.relation)
            .any(|k| {
                !k.child_columns.iter().zip(&k.parent_columns).any(|(c, p)| {
                    match (self.values.get(c), parent.values.get(p)) {
                        (Some(a), Some(b)) => a != b,
                        _ => false,
                    }
                })
            })
    }
}

/// A column's type as keys compare it: the types whose values have one text per value once
/// put in canonical form here; any other is [`ColumnType::Other`] (its values never known).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColumnType {
    /// `text`, `varchar` under a deterministic collation: compared as sent (a value ending in a
    /// space is not known).
    Text,
    /// `char(n)` (`bpchar`): trailing spaces do not count.
    Char,
    /// `smallint`, `integer`, `bigint`: compared as numbers.
    Int,
    /// `uuid`: any spelling PostgreSQL accepts (case, hyphens, braces).
    Uuid,
    /// Anything else (numeric, timestamps, `citext`, domains, a nondeterministic collation).
    Other,
}

impl ColumnType {
    /// The kind of the type named `name` (`pg_type.typname`, or as a cast writes it).
    pub fn of(name: &str, deterministic: bool) -> ColumnType {
        match name {
            "text" | "varchar" if deterministic => ColumnType::Text,
            "bpchar" | "char" | "character" if deterministic => ColumnType::Char,
            "int2" | "int4" | "int8" | "int" | "integer" | "bigint" | "smallint" => ColumnType::Int,
            "uuid" => ColumnType::Uuid,
            _ => ColumnType::Other,
        }
    }

    /// `raw` in canonical form; `None` when it is not known.
    fn canonical(self, raw: &str) -> Option<String> {
        match self {
            // `varchar(n)` drops trailing spaces past `n`: such a value is not known.
            ColumnType::Text => (!raw.ends_with(' ')).then(|| raw.to_string()),
            ColumnType::Char => Some(raw.trim_end_matches(' ').to_string()),
            ColumnType::Int => raw.trim().parse::<i128>().ok().map(|i| i.to_string()),
            ColumnType::Uuid => {
                let hex: String = raw
                    .trim()
                    .chars()
                    .filter(|c| !matches!(c, '-' | '{' | '}'))
                    .flat_map(char::to_lowercase)
                    .collect();
                (hex.len() == 32 && hex.chars().all(|c| c.is_ascii_hexdigit())).then_some(hex)
            }
            ColumnType::Other => None,
        }
    }
}

/// A read of the rows of one relation whose unique key equals values sent with the
/// statement (`SELECT … FROM r WHERE a = $1 AND b = $2`, `a, b` a unique key of `r`): it
/// sees only an insert of that key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PointRead {
    /// The relation.
    pub relation: String,
    /// Its group ([`Catalog`]): what a write told apart by nothing else names.
    pub group: String,
    /// The unique index of the relation ([`Catalog::unique_keys`]) the condition covers.
    pub index: usize,
    /// The values of that index's columns, in order.
    pub values: Vec<String>,
}

impl PointRead {
    /// Whether `insert` may insert a row this read sees.
    pub fn sees(&self, insert: &Insert) -> bool {
        insert.relation == self.relation
            && insert
                .keys
                .get(self.index)
                .map_or(true, |k| k.as_ref().map_or(true, |k| *k == self.values))
    }

    /// Whether it may see a write of `f` (its insert, or its relation groups).
    fn meets_writes(&self, f: &Footprint) -> bool {
        match &f.insert {
            Some(i) => self.sees(i),
            None => f.writes.contains(&self.group) || f.writes.contains("*"),
        }
    }

    /// Whether it may see what `p` publishes.
    fn meets_published(&self, p: &Footprint) -> bool {
        match &p.published_inserts {
            Some(list) => list.iter().any(|i| self.sees(i)),
            None => p.publishes.contains(&self.group) || p.publishes.contains("*"),
        }
    }
}

impl Footprint {
    fn empty(store: StoreKind) -> Self {
        Footprint {
            store,
            everything: false,
            reads: BTreeSet::new(),
            point_reads: Vec::new(),
            writes: BTreeSet::new(),
            publishes: BTreeSet::new(),
            mvcc: false,
            role: TxRole::Statement,
            insert: None,
            published_inserts: None,
        }
    }

    fn everything(store: StoreKind) -> Self {
        Footprint {
            everything: true,
            ..Footprint::empty(store)
        }
    }

    fn role(store: StoreKind, role: TxRole) -> Self {
        Footprint {
            role,
            ..Footprint::empty(store)
        }
    }

    /// Whether it touches nothing another session can see.
    pub fn is_local(&self) -> bool {
        !self.everything
            && !matches!(self.role, TxRole::End | TxRole::Undo)
            && self.reads.is_empty()
            && self.point_reads.is_empty()
            && self.writes.is_empty()
            && self.publishes.is_empty()
    }

    fn absorb(&mut self, other: Footprint) {
        // A step of several statements is told apart by nothing but its relations.
        let empty = |f: &Footprint| f.is_local() && f.role == TxRole::Statement;
        self.insert = match (empty(self), empty(&other)) {
            (true, _) => other.insert.clone(),
            (false, true) => self.insert.take(),
            (false, false) => None,
        };
        self.everything |= other.everything;
        if other.role != TxRole::Statement {
            self.role = other.role;
        }
        self.reads.extend(other.reads);
        self.point_reads.extend(other.point_reads);
        self.writes.extend(other.writes);
        self.publishes.extend(other.publishes);
    }

    /// The footprint of a held step, not yet run, whose transaction is not known: an end
    /// touches everything; a PostgreSQL read may take a snapshot of anything (it reads `*`,
    /// without MVCC); a write may publish at once; Redis writes publish.
    pub fn unresolved(mut self) -> Self {
        match (self.store, self.role) {
            (_, TxRole::End | TxRole::Undo | TxRole::SetsDefault) => self.everything = true,
            (StoreKind::Postgres, TxRole::Statement) => {
                if !self.reads.is_empty() || !self.point_reads.is_empty() || !self.writes.is_empty()
                {
                    self.reads.insert("*".into());
                }
                self.publishes = self.writes.clone();
            }
            (StoreKind::Redis, _) => self.publishes = self.writes.clone(),
            _ => {}
        }
        self.mvcc = false;
        self
    }

    /// Whether running `self` and `other` (on different sessions) in the other order can
    /// change what either sees or leaves (the rules of the module's documentation).
    pub fn conflicts(&self, other: &Footprint) -> bool {
        if self.store != other.store || self.is_local() || other.is_local() {
            return false;
        }
        if self.everything || other.everything {
            return true;
        }
        let writes_meet = match (&self.insert, &other.insert) {
            (Some(a), Some(b)) => a.collides(b),
            _ => meets(&self.writes, &other.writes),
        };
        writes_meet
            || publishes_meet(self, other)
            || publishes_meet(other, self)
            || (!self.mvcc && meets(&self.reads, &other.writes))
            || (!other.mvcc && meets(&other.reads, &self.writes))
            || (!self.mvcc && self.point_reads.iter().any(|r| r.meets_writes(other)))
            || (!other.mvcc && other.point_reads.iter().any(|r| r.meets_writes(self)))
    }
}

/// Whether what `p` publishes meets what `o` touches: its reads, its writes and what it
/// publishes, inserts told apart by their keys.
fn publishes_meet(p: &Footprint, o: &Footprint) -> bool {
    if p.publishes.is_empty() {
        return false;
    }
    let writes = match (&p.published_inserts, &o.insert) {
        (Some(list), Some(b)) => list.iter().any(|a| a.collides(b)),
        _ => meets(&p.publishes, &o.writes),
    };
    let published = match (&p.published_inserts, &o.published_inserts) {
        (Some(l1), Some(l2)) => l1.iter().any(|a| l2.iter().any(|b| a.collides(b))),
        _ => meets(&p.publishes, &o.publishes),
    };
    meets(&p.publishes, &o.reads)
        || o.point_reads.iter().any(|r| r.meets_published(p))
        || writes
        || published
}

/// Whether two sets of resources share one (`*` shares one with any non-empty set).
fn meets(a: &BTreeSet<String>, b: &BTreeSet<String>) -> bool {
    if a.is_empty() || b.is_empty() {
        return false;
    }
    a.contains("*") || b.contains("*") || a.iter().any(|r| b.contains(r))
}

/// One step of a run as [`resolve`] takes it.
#[derive(Debug, Clone)]
pub struct StepFootprint {
    /// Its store and session.
    pub session: (StoreKind, u64),
    /// What its text touches ([`footprint`]).
    pub footprint: Footprint,
    /// Seen waiting for a lock.
    pub blocked: bool,
    /// PostgreSQL's transaction status after it (`I` idle, `T` in a transaction, `E` failed),
    /// when its reply came.
    pub status: Option<char>,
}

/// The transaction status PostgreSQL reported after a step, from its result text
/// ([`super::conduct::StepTaken::result`]: `INSERT 0 1 (T)`): the last `(I)`, `(T)` or `(E)`.
pub fn tx_status(result: &str) -> Option<char> {
    ['I', 'T', 'E']
        .into_iter()
        .filter_map(|c| result.rfind(&format!("({c})")).map(|at| (at, c)))
        .max()
        .map(|(_, c)| c)
}

/// The footprints of a run's steps, in order, resolved by their transactions: a step's
/// transaction is its session's steps from one idle status to the next. `default`: the
/// server's default isolation when known (a transaction that names none runs at it).
pub fn resolve(steps: &[StepFootprint], default: Option<Isolation>) -> Vec<Footprint> {
    // Per step, its transaction number; per transaction, what it touched and its level.
    struct Tx {
        reads: BTreeSet<String>,
        point_reads: Vec<PointRead>,
        writes: BTreeSet<String>,
        everything: bool,
        level: Option<Isolation>,
        statements: usize,
        /// The writes still in effect, by savepoint: a `ROLLBACK TO` undoes the last part.
        live: Vec<Part>,
    }
    /// What a step publishes: resources, and the inserts when they are all it publishes.
    type Shown = (BTreeSet<String>, Option<Vec<Insert>>);
    /// Writes of one part of a transaction: their resources, the inserts told apart by key,
    /// and whether any other write was made.
    #[derive(Default, Clone)]
    struct Part {
        writes: BTreeSet<String>,
        inserts: Vec<Insert>,
        other: bool,
    }
    impl Part {
        fn extend(&mut self, p: Part) {
            self.writes.extend(p.writes);
            self.inserts.extend(p.inserts);
            self.other |= p.other;
        }
        fn shown(&self) -> Shown {
            (
                self.writes.clone(),
                (!self.other).then(|| self.inserts.clone()),
            )
        }
    }
    let mut txs: Vec<Tx> = Vec::new();
    let mut open: HashMap<(StoreKind, u64), usize> = HashMap::new();
    let mut default_known: HashMap<(StoreKind, u64), bool> = HashMap::new();
    let mut tx_of: Vec<usize> = Vec::with_capacity(steps.len());
    // What each step that ends (or partly undoes) its transaction makes visible.
    let mut published: Vec<Option<Shown>> = Vec::with_capacity(steps.len());
    for s in steps {
        let known = *default_known.entry(s.session).or_insert(true);
        let t = *open.entry(s.session).or_insert_with(|| {
            txs.push(Tx {
                reads: BTreeSet::new(),
                point_reads: Vec::new(),
                writes: BTreeSet::new(),
                everything: false,
                level: if known { default } else { None },
                statements: 0,
                live: vec![Part::default()],
            });
            txs.len() - 1
        });
        let tx = &mut txs[t];
        let f = &s.footprint;
        let mut writes = f.writes.clone();
        if s.blocked {
            writes.extend(f.reads.iter().cloned());
            writes.extend(f.point_reads.iter().map(|r| r.group.clone()));
        }
        tx.reads.extend(f.reads.iter().cloned());
        tx.point_reads.extend(f.point_reads.iter().cloned());
        tx.writes.extend(writes.iter().cloned());
        // A statement that failed (its transaction failed with it) changed nothing: a unique
        // violation's row was never visible, and its locks are not what its undo lets go.
        let failed = s.session.0 == StoreKind::Postgres
            && f.role == TxRole::Statement
            && s.status == Some('E');
        // A plain insert that waited stays told apart by its keys: what can hold a lock it
        // waits for is an insert of its key, or a write its relation's group meets.
        let plain = !s.blocked || (f.reads.is_empty() && f.point_reads.is_empty());
        if let Some(part) = tx.live.last_mut().filter(|_| !failed) {
            if !writes.is_empty() {
                match f.insert.as_ref().filter(|_| plain) {
                    Some(i) => part.inserts.push(i.clone()),
                    None => part.other = true,
                }
            }
            part.writes.extend(writes);
        }
        tx.everything |= f.everything;
        let all_live = |tx: &Tx| {
            let mut all = Part::default();
            for p in &tx.live {
                all.extend(p.clone());
            }
            all.shown()
        };
        let mut shown = None;
        match f.role {
            TxRole::Begin(level) => tx.level = level.or(tx.level),
            TxRole::Statement => tx.statements += 1,
            TxRole::SetsDefault => {
                // It may set the level of the transaction it is in, too.
                default_known.insert(s.session, false);
                tx.level = None;
            }
            TxRole::Savepoint => tx.live.push(Part::default()),
            TxRole::Release if tx.live.len() > 1 => {
                let part = tx.live.pop().unwrap_or_default();
                tx.live.last_mut().expect("one part at least").extend(part);
            }
            // The writes since the savepoint are undone and their locks let go (a `ROLLBACK
            // TO` an earlier savepoint undoes more: those are still counted live, which only
            // makes the commit publish more).
            TxRole::Undo => shown = tx.live.last_mut().map(|p| std::mem::take(p).shown()),
            TxRole::End => shown = Some(all_live(tx)),
            _ => {}
        }
        // Outside a block, or with no reply: what is live may be visible from now on.
        if shown.is_none() && s.status != Some('T') && s.status != Some('E') {
            shown = Some(all_live(tx));
        }
        published.push(shown);
        tx_of.push(t);
        // Redis has no transaction spanning steps; PostgreSQL's ends at an idle status.
        if s.session.0 == StoreKind::Redis || s.status == Some('I') {
            open.remove(&s.session);
        }
    }
    steps
        .iter()
        .zip(&tx_of)
        .enumerate()
        .map(|(k, (s, &t))| {
            let tx = &txs[t];
            let mut out = s.footprint.clone();
            if s.blocked {
                let reads = std::mem::take(&mut out.reads);
                out.writes.extend(reads);
                let points = std::mem::take(&mut out.point_reads);
                out.writes.extend(points.into_iter().map(|r| r.group));
            }
            if s.session.0 == StoreKind::Redis {
                out.publishes = out.writes.clone();
                return out;
            }
            let single = tx.statements <= 1;
            out.mvcc = matches!(
                tx.level,
                Some(Isolation::ReadCommitted | Isolation::RepeatableRead)
            );
            // One snapshot for the transaction: each statement reads what any of it reads.
            if out.role == TxRole::Statement
                && !single
                && tx.level != Some(Isolation::ReadCommitted)
            {
                out.reads.extend(tx.reads.iter().cloned());
                out.point_reads.extend(tx.point_reads.iter().cloned());
            }
            // Published: at the end of the transaction, at once outside one, or (the reply
            // never came, the status is not known) possibly.
            if s.blocked && !(s.footprint.reads.is_empty() && s.footprint.point_reads.is_empty()) {
                out.insert = None;
            }
            if let Some((shown, inserts)) = &published[k] {
                out.publishes.extend(shown.iter().cloned());
                out.published_inserts = inserts.clone();
                out.everything |= tx.everything && matches!(out.role, TxRole::End | TxRole::Undo);
            }
            out
        })
        .collect()
}

/// The relations of a PostgreSQL database and what ties them: each name (lowercase, unquoted
/// as written in the catalog) maps to its group, the relations connected to it by foreign
/// keys, triggers, views and rules.
#[derive(Debug, Clone, Default)]
pub struct Catalog {
    group: HashMap<String, String>,
    /// Relations whose plain inserts can be told apart by their unique keys (no trigger, rule,
    /// exclusion constraint or sequence default; every unique index on plain columns, no
    /// predicate): each unique index's columns, in order.
    pub unique_keys: HashMap<String, Vec<Vec<String>>>,
    /// Every foreign key with its columns: what tells an insert of a child row from an insert
    /// of a parent row it does not reference.
    pub references: Vec<ForeignKey>,
    /// The type of each column of the ordinary and partitioned tables, by (relation, column):
    /// what says when two values sent for a key are the same key ([`Catalog::key_value`]).
    pub column_types: HashMap<(String, String), ColumnType>,
    /// Relations a statement cannot name without touching anything on the server: a trigger,
    /// view or rule of theirs calls a function in a language other than SQL and PL/pgSQL, or
    /// one that runs SQL built at run time.
    pub wide: HashSet<String>,
    /// The isolation level of a transaction that names none: the server's
    /// `default_transaction_isolation`, `None` when a role or database overrides it
    /// (`ALTER ROLE … SET`), since the service's role may be another than ours.
    pub default_isolation: Option<Isolation>,
}

impl Catalog {
    /// A catalog of `relations` with `ties` (pairs of relation names that one step may touch
    /// together): groups are the connected parts of that graph.
    pub fn new(relations: &[String], ties: &[(String, String)]) -> Self {
        let mut parent: HashMap<String, String> =
            relations.iter().map(|r| (r.clone(), r.clone())).collect();
        fn root(parent: &mut HashMap<String, String>, x: &str) -> String {
            let mut at = x.to_string();
            loop {
                let up = parent.get(&at).cloned().unwrap_or_else(|| at.clone());
                if up == at {
                    return at;
                }
                at = up;
            }
        }
        for (a, b) in ties {
            if !parent.contains_key(a) || !parent.contains_key(b) {
                continue;
            }
            let (ra, rb) = (root(&mut parent, a), root(&mut parent, b));
            if ra != rb {
                let (lo, hi) = if ra < rb { (ra, rb) } else { (rb, ra) };
                parent.insert(hi, lo);
            }
        }
        let names: Vec<String> = parent.keys().cloned().collect();
        let group = names
            .into_iter()
            .map(|n| {
                let g = root(&mut parent, &n);
                (n, g)
            })
            .collect();
        Catalog {
            group,
            default_isolation: None,
            unique_keys: HashMap::new(),
            references: Vec::new(),
            wide: HashSet::new(),
            column_types: HashMap::new(),
        }
    }

    /// Reads the catalog of the database `client` is connected to: ordinary, partitioned and
    /// foreign tables, views and materialized views outside the system schemas; ties from
    /// foreign keys, non-internal triggers (the relations named in the trigger function's
    /// source), views' definitions and rules; and the default isolation level.
    ///
    /// Will return `Err` with the server's error when a catalog query fails.
    pub fn read(client: &mut postgres::Client) -> Result<Catalog, postgres::Error> {
        let relations: Vec<String> = client
            .query(
                "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
                 WHERE c.relkind IN ('r', 'p', 'v', 'm', 'f') \
                 AND n.nspname NOT IN ('pg_catalog', 'information_schema') \
                 AND n.nspname NOT LIKE 'pg_toast%'",
                &[],
            )?
            .iter()
            .map(|r| r.get::<_, String>(0))
            .collect();
        let references: Vec<ForeignKey> = client
            .query(
                "SELECT a.relname, b.relname, \
                 ARRAY(SELECT x.attname::text FROM unnest(k.conkey) WITH ORDINALITY u(n, o) \
                     JOIN pg_attribute x ON x.attrelid = k.conrelid AND x.attnum = u.n ORDER BY u.o), \
                 ARRAY(SELECT x.attname::text FROM unnest(k.confkey) WITH ORDINALITY u(n, o) \
                     JOIN pg_attribute x ON x.attrelid = k.confrelid AND x.attnum = u.n ORDER BY u.o) \
                 FROM pg_constraint k \
                 JOIN pg_class a ON a.oid = k.conrelid JOIN pg_class b ON b.oid = k.confrelid \
                 WHERE k.contype = 'f'",
                &[],
            )?
            .iter()
            .map(|r| ForeignKey {
                child: r.get(0),
                parent: r.get(1),
                child_columns: r.get(2),
                parent_columns: r.get(3),
            })
            .collect();
        let mut ties: Vec<(String, String)> = references
            .iter()
            .map(|k| (k.child.clone(), k.parent.clone()))
            .collect();
        // Texts whose relations are tied to a relation: trigger functions, views, rules, column
        // defaults, checks (the table's, and its columns' domains'), row-level security
        // policies.
        let texts: Vec<(String, String)> = client
            .query(
                "SELECT c.relname, p.prosrc FROM pg_trigger t \
                 JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_proc p ON p.oid = t.tgfoid \
                 WHERE NOT t.tgisinternal \
                 UNION ALL SELECT c.relname, pg_get_viewdef(c.oid) FROM pg_class c \
                 JOIN pg_namespace n ON n.oid = c.relnamespace \
                 WHERE c.relkind IN ('v', 'm') \
                 AND n.nspname NOT IN ('pg_catalog', 'information_schema') \
                 UNION ALL SELECT tablename::text, definition FROM pg_rules \
                 WHERE schemaname NOT IN ('pg_catalog', 'information_schema') \
                 UNION ALL SELECT c.relname, pg_get_expr(d.adbin, d.adrelid) FROM pg_attrdef d \
                 JOIN pg_class c ON c.oid = d.adrelid \
                 UNION ALL SELECT c.relname, pg_get_constraintdef(k.oid) FROM pg_constraint k \
                 JOIN pg_class c ON c.oid = k.conrelid WHERE k.contype = 'c' \
                 UNION ALL SELECT c.relname, pg_get_constraintdef(k.oid) FROM pg_attribute a \
                 JOIN pg_class c ON c.oid = a.attrelid \
                 JOIN pg_constraint k ON k.contypid = a.atttypid AND k.contype = 'c' \
                 WHERE a.attnum > 0 AND NOT a.attisdropped \
                 UNION ALL SELECT c.relname, concat_ws(' ', pg_get_expr(p.polqual, p.polrelid), \
                 pg_get_expr(p.polwithcheck, p.polrelid)) FROM pg_policy p \
                 JOIN pg_class c ON c.oid = p.polrelid",
                &[],
            )?
            .iter()
            .map(|r| (r.get(0), r.get::<_, Option<String>>(1).unwrap_or_default()))
            .collect();
        // The service's own functions: what a trigger, view or rule calls reaches what their
        // source names, and so on down; a function in another language, or one that runs SQL
        // built at run time (`EXECUTE`), may reach anything.
        let functions: HashMap<String, (String, String)> = client
            .query(
                "SELECT p.proname, l.lanname, coalesce(p.prosrc, '') FROM pg_proc p \
                 JOIN pg_namespace n ON n.oid = p.pronamespace \
                 JOIN pg_language l ON l.oid = p.prolang \
                 WHERE n.nspname NOT IN ('pg_catalog', 'information_schema')",
                &[],
            )?
            .iter()
            .map(|r| (r.get::<_, String>(0).to_lowercase(), (r.get(1), r.get(2))))
            .collect();
        let known: BTreeSet<&String> = relations.iter().collect();
        let mut wide: HashSet<String> = HashSet::new();
        // Relations whose writes reach another relation through such a text: their inserts are
        // not told apart by key.
        let mut reaching: HashSet<String> = HashSet::new();
        for (rel, text) in &texts {
            let (names, anything) = reached(text, &known, &functions);
            if anything {
                wide.insert(rel.clone());
            }
            if anything || names.iter().any(|n| n != rel) {
                reaching.insert(rel.clone());
            }
            ties.extend(names.into_iter().map(|n| (rel.clone(), n)));
        }
        // A partition or an inheriting table and its parent: a read of the parent reads it.
        let inherits: Vec<(String, String)> = client
            .query(
                "SELECT c.relname, p.relname FROM pg_inherits i \
                 JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_class p ON p.oid = i.inhparent",
                &[],
            )?
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        ties.extend(inherits.iter().cloned());
        let overridden: i64 = client
            .query_one(
                "SELECT count(*) FROM pg_db_role_setting s, unnest(s.setconfig) c \
                 WHERE c LIKE 'default_transaction_isolation=%'",
                &[],
            )?
            .get(0);
        let level: String = client
            .query_one(
                "SELECT current_setting('default_transaction_isolation')",
                &[],
            )?
            .get(0);
        let words: Vec<&str> = ["isolation", "level"]
            .into_iter()
            .chain(level.split_whitespace())
            .collect();
        // Inserts told apart by their keys: ordinary tables whose unique indexes are on plain
        // columns without a predicate, with no user trigger, rule, exclusion constraint, or
        // column filled by a sequence (an insert's order would then show in its values).
        let mut unique_keys: HashMap<String, Vec<Vec<String>>> = client
            .query(
                "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
                 WHERE c.relkind = 'r' AND NOT c.relrowsecurity \
                 AND n.nspname NOT IN ('pg_catalog', 'information_schema') \
                 AND n.nspname NOT LIKE 'pg_toast%' \
                 AND NOT EXISTS (SELECT 1 FROM pg_trigger t WHERE t.tgrelid = c.oid AND NOT t.tgisinternal) \
                 AND NOT EXISTS (SELECT 1 FROM pg_rewrite r WHERE r.ev_class = c.oid) \
                 AND NOT EXISTS (SELECT 1 FROM pg_inherits h WHERE h.inhrelid = c.oid OR h.inhparent = c.oid) \
                 AND NOT EXISTS (SELECT 1 FROM pg_index x JOIN pg_collation k \
                     ON k.oid = ANY (x.indcollation::oid[]) \
                     WHERE x.indrelid = c.oid AND x.indisunique AND NOT k.collisdeterministic) \
                 AND NOT EXISTS (SELECT 1 FROM pg_constraint k WHERE k.conrelid = c.oid AND k.contype = 'x') \
                 AND NOT EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisunique \
                     AND (i.indexprs IS NOT NULL OR i.indpred IS NOT NULL)) \
                 AND NOT EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attnum > 0 \
                     AND NOT a.attisdropped AND (a.attidentity <> '' OR EXISTS (SELECT 1 FROM pg_attrdef d \
                     WHERE d.adrelid = a.attrelid AND d.adnum = a.attnum \
                     AND pg_get_expr(d.adbin, d.adrelid) ILIKE '%nextval%')))",
                &[],
            )?
            .iter()
            .map(|r| (r.get::<_, String>(0), Vec::new()))
            .collect();
        for row in client.query(
            "SELECT c.relname, ARRAY(SELECT a.attname::text FROM unnest(i.indkey::int2[]) \
             WITH ORDINALITY k(n, o) JOIN pg_attribute a ON a.attrelid = i.indrelid \
             AND a.attnum = k.n ORDER BY k.o) FROM pg_index i \
             JOIN pg_class c ON c.oid = i.indrelid WHERE i.indisunique",
            &[],
        )? {
            let (rel, columns): (String, Vec<String>) = (row.get(0), row.get(1));
            if let Some(keys) = unique_keys.get_mut(&rel) {
                keys.push(columns);
            }
        }
        let mut catalog = Catalog::new(&relations, &ties);
        // A name in two schemas: the catalog cannot tell which a statement means.
        let mut seen_names: BTreeSet<&String> = BTreeSet::new();
        let twice: BTreeSet<&String> = relations.iter().filter(|r| !seen_names.insert(r)).collect();
        unique_keys.retain(|rel, _| !reaching.contains(rel) && !twice.contains(rel));
        catalog.column_types = client
            .query(
                "SELECT c.relname, a.attname::text, t.typname::text, \
                 coalesce(k.collisdeterministic, true) FROM pg_attribute a \
                 JOIN pg_class c ON c.oid = a.attrelid JOIN pg_type t ON t.oid = a.atttypid \
                 JOIN pg_namespace n ON n.oid = c.relnamespace \
                 LEFT JOIN pg_collation k ON k.oid = a.attcollation \
                 WHERE a.attnum > 0 AND NOT a.attisdropped AND c.relkind IN ('r', 'p') \
                 AND n.nspname NOT IN ('pg_catalog', 'information_schema')",
                &[],
            )?
            .iter()
            .map(|r| {
                let kind = ColumnType::of(r.get::<_, &str>(2), r.get(3));
                ((r.get(0), r.get(1)), kind)
            })
            .collect();
        catalog.unique_keys = unique_keys;
        catalog.references = references;
        catalog.wide = wide;
        catalog.default_isolation = (overridden == 0)
            .then(|| Isolation::parse(&words))
            .flatten();
        Ok(catalog)
    }

    /// Every column its unique keys and foreign keys name typed as text: a hand-made catalog
    /// for tests.
    #[cfg(test)]
    pub(crate) fn keys_as_text(mut self) -> Self {
        let mut columns: Vec<(String, String)> = self
            .unique_keys
            .iter()
            .flat_map(|(r, keys)| keys.iter().flatten().map(move |c| (r.clone(), c.clone())))
            .collect();
        for k in &self.references {
            columns.extend(k.child_columns.iter().map(|c| (k.child.clone(), c.clone())));
            columns.extend(
                k.parent_columns
                    .iter()
                    .map(|c| (k.parent.clone(), c.clone())),
            );
        }
        for c in columns {
            self.column_types.insert(c, ColumnType::Text);
        }
        self
    }

    /// The value `raw` (a parameter as sent, in text) stored in `relation.column` as a key
    /// compares, `cast`: the type the statement casts the parameter to. `None` when it is not
    /// known: `NULL`, binary, a column whose type has no one spelling per value here, a cast to
    /// another type, or text that does not parse as the type.
    pub fn key_value(
        &self,
        relation: &str,
        column: &str,
        raw: &str,
        cast: Option<&str>,
    ) -> Option<String> {
        if raw == "NULL" || raw.starts_with("\\x") {
            return None;
        }
        let kind = *self
            .column_types
            .get(&(relation.to_string(), column.to_string()))?;
        if let Some(cast) = cast {
            if ColumnType::of(cast, true) != kind {
                return None;
            }
        }
        kind.canonical(raw)
    }

    /// The group of the relation `name`, if the catalog knows it.
    fn group_of(&self, name: &str) -> Option<&String> {
        self.group.get(name)
    }
}

/// The relations among `known` that `text` (a function's source, a view's definition, a
/// rule's) names, directly or through the user functions it calls (`functions`: name →
/// (language, source)), and whether it may reach anything else: a call of a function in
/// another language, or SQL run by `EXECUTE`.
fn reached(
    text: &str,
    known: &BTreeSet<&String>,
    functions: &HashMap<String, (String, String)>,
) -> (BTreeSet<String>, bool) {
    let mut names = BTreeSet::new();
    let mut anything = false;
    let mut visited: BTreeSet<String> = BTreeSet::new();
    let mut todo: Vec<String> = vec![text.to_string()];
    while let Some(source) = todo.pop() {
        let tokens = sql_tokens(&source);
        for (k, token) in tokens.iter().enumerate() {
            let SqlToken::Ident(name) = token else {
                continue;
            };
            if known.contains(name) {
                names.insert(name.clone());
            }
            if name == "execute"
                && !matches!(tokens.get(k + 1), Some(SqlToken::Ident(w)) if w == "function" || w == "procedure")
            {
                anything = true;
            }
            if tokens.get(k + 1) != Some(&SqlToken::Open) {
                continue;
            }
            if let Some((language, body)) = functions.get(name) {
                if !matches!(language.as_str(), "sql" | "plpgsql") {
                    anything = true;
                } else if visited.insert(name.clone()) {
                    todo.push(body.clone());
                }
            }
        }
    }
    (names, anything)
}

/// The footprint of one step's text in `store`; `catalog`: the PostgreSQL database's
/// relations (`None`: unknown, so every PostgreSQL write touches everything).
pub fn footprint(store: StoreKind, text: &str, catalog: Option<&Catalog>) -> Footprint {
    footprint_with(store, text, &[], catalog)
}

/// [`footprint`], with the step's bound parameters (`$1` is `params[0]`), which tell one
/// insert's unique keys from another's.
pub fn footprint_with(
    store: StoreKind,
    text: &str,
    params: &[String],
    catalog: Option<&Catalog>,
) -> Footprint {
    match store {
        StoreKind::Postgres => sql_footprint(text, params, catalog),
        StoreKind::Redis => redis_footprint(text),
    }
}

#[cfg(test)]
mod tests;
