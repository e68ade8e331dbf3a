//! PostgreSQL statements: the tokens of SQL text, what a statement touches, and the plain
//! one-row inserts told apart by their unique keys.

use std::collections::BTreeSet;

use super::{Catalog, Footprint, ForeignKey, Insert, Isolation, PointRead, StoreKind, TxRole};

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum SqlToken {
    /// An identifier or keyword: unquoted ones lowercased, quoted ones as written.
    Ident(String),
    /// `(`.
    Open,
    /// `)`.
    Close,
    /// `,`.
    Comma,
    /// `$n`: the n-th bound parameter.
    Param(usize),
    /// `::`.
    Cast,
    /// `;`.
    End,
    /// `.` (a qualified name's separator).
    Dot,
    /// `=` standing alone (not part of a longer operator).
    Eq,
    /// Anything else (literals, operators, numbers).
    Other,
}

/// The tokens of SQL text: comments, string literals (standard, `E''`, dollar-quoted) and
/// parameters are skipped as [`SqlToken::Other`].
/// The characters of PostgreSQL operators (the manual's "Lexical Structure", 4.1.3).
const OPERATOR: &str = "+-*/<>=~!@#%^&|`?";

pub(super) fn sql_tokens(text: &str) -> Vec<SqlToken> {
    let b: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c.is_whitespace() {
            i += 1;
        } else if c == '-' && b.get(i + 1) == Some(&'-') {
            while i < b.len() && b[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && b.get(i + 1) == Some(&'*') {
            i += 2;
            while i < b.len() && !(b[i] == '*' && b.get(i + 1) == Some(&'/')) {
                i += 1;
            }
            i += 2;
        } else if c == '\'' {
            i += 1;
            while i < b.len() {
                if b[i] == '\\' && i > 0 {
                    // E'' escapes; in a standard literal a backslash is a character, and
                    // skipping one more only ever ends the literal later (never misses a
                    // relation's name, which is outside literals).
                    i += 2;
                    continue;
                }
                if b[i] == '\'' {
                    if b.get(i + 1) == Some(&'\'') {
                        i += 2;
                        continue;
                    }
                    break;
                }
                i += 1;
            }
            i += 1;
            out.push(SqlToken::Other);
        } else if c == '"' {
            let start = i + 1;
            i += 1;
            let mut name = String::new();
            while i < b.len() {
                if b[i] == '"' {
                    if b.get(i + 1) == Some(&'"') {
                        name.push('"');
                        i += 2;
                        continue;
                    }
                    break;
                }
                name.push(b[i]);
                i += 1;
            }
            let _ = start;
            i += 1;
            out.push(SqlToken::Ident(name));
        } else if c == '$' {
            // $1, or a dollar quote $tag$ … $tag$.
            let mut j = i + 1;
            while j < b.len() && (b[j].is_alphanumeric() || b[j] == '_') {
                j += 1;
            }
            if b.get(j) == Some(&'$') && !b[i + 1..j].iter().all(char::is_ascii_digit)
                || j == i + 1 && b.get(j) == Some(&'$')
            {
                let tag: String = b[i..=j].iter().collect();
                let rest: String = b[j + 1..].iter().collect();
                match rest.find(&tag) {
                    Some(at) => i = j + 1 + rest[..at].chars().count() + tag.chars().count(),
                    None => i = b.len(),
                }
            } else {
                let digits: String = b[i + 1..j].iter().collect();
                i = j;
                if let Ok(n) = digits.parse::<usize>() {
                    out.push(SqlToken::Param(n));
                    continue;
                }
            }
            out.push(SqlToken::Other);
        } else if c.is_alphabetic() || c == '_' {
            let mut name = String::new();
            while i < b.len() && (b[i].is_alphanumeric() || b[i] == '_' || b[i] == '$') {
                name.extend(b[i].to_lowercase());
                i += 1;
            }
            out.push(SqlToken::Ident(name));
        } else if c == '(' {
            out.push(SqlToken::Open);
            i += 1;
        } else if c == ';' {
            out.push(SqlToken::End);
            i += 1;
        } else if c == ')' {
            out.push(SqlToken::Close);
            i += 1;
        } else if c == ':' && b.get(i + 1) == Some(&':') {
            out.push(SqlToken::Cast);
            i += 2;
        } else if c == ',' {
            out.push(SqlToken::Comma);
            i += 1;
        } else if c == '.' && !b.get(i + 1).is_some_and(char::is_ascii_digit) {
            out.push(SqlToken::Dot);
            i += 1;
        } else if OPERATOR.contains(c) {
            // An operator is a run of its characters, ended before a comment starts.
            let start = i;
            while i < b.len()
                && OPERATOR.contains(b[i])
                && !(i > start
                    && matches!((b[i], b.get(i + 1)), ('-', Some('-')) | ('/', Some('*'))))
            {
                i += 1;
            }
            out.push(if i == start + 1 && c == '=' {
                SqlToken::Eq
            } else {
                SqlToken::Other
            });
        } else {
            out.push(SqlToken::Other);
            i += 1;
        }
    }
    out
}

/// Functions (and keywords written before a parenthesis) a statement may call without
/// touching anything another session can see: aggregates, constructors, casts to a type,
/// string, date and JSON functions, session-local settings.
const PURE_CALLS: &[&str] = &[
    "abs",
    "age",
    "all",
    "and",
    "any",
    "array",
    "array_agg",
    "array_length",
    "array_position",
    "array_to_string",
    "as",
    "avg",
    "between",
    "bool_and",
    "bool_or",
    "btrim",
    "cardinality",
    "case",
    "cast",
    "ceil",
    "ceiling",
    "char",
    "char_length",
    "character",
    "character_length",
    "clock_timestamp",
    "coalesce",
    "concat",
    "concat_ws",
    "conflict",
    "count",
    "current_setting",
    "date_part",
    "date_trunc",
    "decimal",
    "decode",
    "digest",
    "distinct",
    "do",
    "else",
    "encode",
    "exists",
    "extract",
    "filter",
    "float",
    "float4",
    "float8",
    "floor",
    "format",
    "from",
    "gen_random_uuid",
    "generate_series",
    "greatest",
    "group",
    "hashtext",
    "hashtextextended",
    "having",
    "in",
    "int",
    "int2",
    "int4",
    "int8",
    "integer",
    "interval",
    "join",
    "json_agg",
    "json_build_array",
    "json_build_object",
    "json_extract_path",
    "json_extract_path_text",
    "json_object_agg",
    "jsonb_agg",
    "jsonb_build_array",
    "jsonb_build_object",
    "jsonb_extract_path",
    "jsonb_extract_path_text",
    "jsonb_object_agg",
    "jsonb_set",
    "jsonb_strip_nulls",
    "jsonb_typeof",
    "lateral",
    "least",
    "left",
    "length",
    "like",
    "lower",
    "lpad",
    "ltrim",
    "make_interval",
    "max",
    "md5",
    "min",
    "mod",
    "not",
    "now",
    "nullif",
    "numeric",
    "octet_length",
    "on",
    "or",
    "over",
    "partition",
    "pg_backend_pid",
    "pg_sleep",
    "position",
    "power",
    "random",
    "regexp_replace",
    "repeat",
    "replace",
    "returning",
    "right",
    "round",
    "row",
    "row_number",
    "row_to_json",
    "rpad",
    "rtrim",
    "select",
    "set",
    "set_config",
    "sha256",
    "smallint",
    "some",
    "split_part",
    "statement_timestamp",
    "string_agg",
    "strpos",
    "substr",
    "substring",
    "sum",
    "then",
    "time",
    "timestamp",
    "timestamptz",
    "to_char",
    "to_date",
    "to_json",
    "to_jsonb",
    "to_number",
    "to_timestamp",
    "transaction_timestamp",
    "trim",
    "trunc",
    "txid_current",
    "unnest",
    "upper",
    "using",
    "uuid",
    "uuid_generate_v4",
    "values",
    "varchar",
    "version",
    "when",
    "where",
    "with",
    "within",
];

pub(super) fn sql_footprint(text: &str, params: &[String], catalog: Option<&Catalog>) -> Footprint {
    let store = StoreKind::Postgres;
    let lower = text.to_lowercase();
    if lower.contains("set_config") && lower.contains("isolation") {
        // A level set by `set_config('transaction_isolation', …)`, named in a string the
        // tokens do not keep: the level is not known from here on, and the step touches
        // everything.
        return Footprint {
            everything: true,
            ..Footprint::role(store, TxRole::SetsDefault)
        };
    }
    let tokens = sql_tokens(text);
    let mut out = Footprint::empty(store);
    // Several statements in one step (a batch of Executes before one Sync, joined with `; `)
    // carry their parameters one after the other: a statement's `$1` is not the list's first,
    // so no statement's values are known.
    let statements = tokens
        .split(|t| *t == SqlToken::End)
        .filter(|s| !s.is_empty())
        .count();
    let params = if statements > 1 { &[][..] } else { params };
    for statement in tokens.split(|t| *t == SqlToken::End) {
        let mut f = statement_footprint(statement, catalog);
        if f.writes.len() == 1 && !f.everything {
            f.insert = catalog.and_then(|c| plain_insert(statement, params, c));
        }
        if f.writes.is_empty() && !f.everything && !f.reads.is_empty() {
            if let Some(r) = catalog.and_then(|c| point_read(statement, params, c)) {
                f.reads.clear();
                f.point_reads.push(r);
            }
        }
        out.absorb(f);
    }
    out
}

/// The insert of `INSERT INTO r (c1, …) VALUES ($i, …)` (values may be cast; `ON CONFLICT`
/// and `RETURNING` may follow) into a relation of [`Catalog::unique_keys`]; `None` for any
/// other statement.
fn plain_insert(tokens: &[SqlToken], params: &[String], catalog: &Catalog) -> Option<Insert> {
    use SqlToken::*;
    let ident = |k: usize, w: &str| matches!(tokens.get(k), Some(Ident(x)) if x == w);
    if !ident(0, "insert") || !ident(1, "into") {
        return None;
    }
    if tokens
        .iter()
        .any(|t| matches!(t, Ident(w) if w == "select" || w == "default"))
    {
        return None;
    }
    let Some(Ident(relation)) = tokens.get(2) else {
        return None;
    };
    let keys = catalog.unique_keys.get(relation)?;
    let mut at = 3;
    if tokens.get(at) != Some(&Open) {
        return None;
    }
    at += 1;
    let mut columns = Vec::new();
    loop {
        match tokens.get(at)? {
            Ident(c) => columns.push(c.clone()),
            Comma => {}
            Close => break,
            _ => return None,
        }
        at += 1;
    }
    at += 1;
    if !ident(at, "values") || tokens.get(at + 1) != Some(&Open) {
        return None;
    }
    at += 2;
    // Each value: a parameter, maybe cast (`$1::uuid`); anything else is not known.
    let mut values: Vec<Vec<&SqlToken>> = vec![Vec::new()];
    let mut depth = 0;
    loop {
        let t = tokens.get(at)?;
        match t {
            Open => depth += 1,
            Close if depth == 0 => break,
            Close => depth -= 1,
            Comma if depth == 0 => {
                values.push(Vec::new());
                at += 1;
                continue;
            }
            _ => {}
        }
        values.last_mut()?.push(t);
        at += 1;
    }
    let values: Vec<Option<(usize, Option<&str>)>> = values
        .iter()
        .map(|v| match v.as_slice() {
            [Param(n)] => Some((*n, None)),
            [Param(n), Cast, Ident(t)] => Some((*n, Some(t.as_str()))),
            _ => None,
        })
        .collect();
    // One row: what follows is `ON CONFLICT …`, `RETURNING …` or nothing.
    if !matches!(tokens.get(at + 1), None | Some(Ident(_))) || values.len() != columns.len() {
        return None;
    }
    let value_of = |column: &str| -> Option<String> {
        let (n, cast) = values[columns.iter().position(|c| c == column)?]?;
        catalog.key_value(relation, column, params.get(n.checked_sub(1)?)?, cast)
    };
    let references: Vec<ForeignKey> = catalog
        .references
        .iter()
        .filter(|k| k.child == *relation)
        .cloned()
        .collect();
    // The columns a foreign key names on either side: the child's values are what it
    // references, the parent's what a child may reference.
    let named: BTreeSet<&String> = catalog
        .references
        .iter()
        .flat_map(|k| {
            let child = (k.child == *relation).then_some(&k.child_columns);
            let parent = (k.parent == *relation).then_some(&k.parent_columns);
            child.into_iter().chain(parent).flatten()
        })
        .collect();
    Some(Insert {
        relation: relation.clone(),
        keys: keys
            .iter()
            .map(|cols| cols.iter().map(|c| value_of(c)).collect())
            .collect(),
        values: named
            .into_iter()
            .filter_map(|c| Some((c.clone(), value_of(c)?)))
            .collect(),
        references,
    })
}

/// The point read of `SELECT … FROM r [[AS] alias] WHERE c1 = $i AND c2 = $j …` (a parameter
/// may be cast; `LIMIT`, `ORDER BY` may follow): one relation of [`Catalog::unique_keys`],
/// no join, subquery or set operation, a conjunction of equalities to parameters covering a
/// unique key whose values are known. `None` for any other statement.
fn point_read(tokens: &[SqlToken], params: &[String], catalog: &Catalog) -> Option<PointRead> {
    use SqlToken::*;
    let word = |t: &SqlToken, w: &str| matches!(t, Ident(x) if x == w);
    if !word(tokens.first()?, "select")
        || tokens.iter().filter(|t| word(t, "select")).count() != 1
        || tokens.iter().any(|t| {
            [
                "join",
                "union",
                "intersect",
                "except",
                "with",
                "for",
                "into",
            ]
            .iter()
            .any(|w| word(t, w))
        })
    {
        return None;
    }
    let from = tokens.iter().position(|t| word(t, "from"))?;
    let Some(Ident(relation)) = tokens.get(from + 1) else {
        return None;
    };
    let keys = catalog.unique_keys.get(relation)?;
    let group = catalog.group_of(relation)?.clone();
    let mut at = from + 2;
    let mut alias = None;
    if tokens.get(at).is_some_and(|t| word(t, "as")) {
        at += 1;
    }
    if let Some(Ident(a)) = tokens.get(at) {
        if a != "where" {
            alias = Some(a.clone());
            at += 1;
        }
    }
    if !tokens.get(at).is_some_and(|t| word(t, "where")) {
        return None;
    }
    at += 1;
    // The equalities, up to the end or a clause that does not filter rows.
    let mut equal: Vec<(String, usize, Option<&str>)> = Vec::new();
    loop {
        let mut column = match tokens.get(at) {
            Some(Ident(c)) => c.clone(),
            _ => return None,
        };
        at += 1;
        if tokens.get(at) == Some(&Dot) {
            if Some(&column) != alias.as_ref() && column != *relation {
                return None;
            }
            let Some(Ident(c)) = tokens.get(at + 1) else {
                return None;
            };
            column = c.clone();
            at += 2;
        }
        let (Some(Eq), Some(Param(n))) = (tokens.get(at), tokens.get(at + 1)) else {
            return None;
        };
        at += 2;
        let mut cast = None;
        if tokens.get(at) == Some(&Cast) {
            let Some(Ident(t)) = tokens.get(at + 1) else {
                return None;
            };
            cast = Some(t.as_str());
            at += 2;
        }
        equal.push((column, *n, cast));
        match tokens.get(at) {
            None => break,
            Some(t) if word(t, "and") => at += 1,
            Some(t) if word(t, "limit") || word(t, "order") => break,
            Some(_) => return None,
        }
    }
    let value_of = |column: &str| -> Option<String> {
        let &(_, n, cast) = equal.iter().find(|(c, _, _)| c == column)?;
        catalog.key_value(relation, column, params.get(n.checked_sub(1)?)?, cast)
    };
    keys.iter().enumerate().find_map(|(index, cols)| {
        let values: Option<Vec<String>> = cols.iter().map(|c| value_of(c)).collect();
        Some(PointRead {
            relation: relation.clone(),
            group: group.clone(),
            index,
            values: values?,
        })
    })
}

fn statement_footprint(tokens: &[SqlToken], catalog: Option<&Catalog>) -> Footprint {
    let store = StoreKind::Postgres;
    let words: Vec<&str> = tokens
        .iter()
        .filter_map(|t| match t {
            SqlToken::Ident(w) => Some(w.as_str()),
            _ => None,
        })
        .collect();
    let Some(&first) = words.first() else {
        return Footprint::empty(store);
    };
    let second = words.get(1).copied().unwrap_or("");
    match first {
        // Two-phase commit names another session's transaction.
        "commit" | "rollback" if second == "prepared" => return Footprint::everything(store),
        "begin" | "start" => {
            return Footprint::role(store, TxRole::Begin(Isolation::parse(&words)))
        }
        "savepoint" => return Footprint::role(store, TxRole::Savepoint),
        "release" => return Footprint::role(store, TxRole::Release),
        "rollback" if words.contains(&"to") => return Footprint::role(store, TxRole::Undo),
        "commit" | "end" | "abort" | "rollback" => return Footprint::role(store, TxRole::End),
        "prepare" if second == "transaction" => return Footprint::role(store, TxRole::End),
        "set" if second == "transaction" && words.get(2) == Some(&"snapshot") => {
            return Footprint::everything(store)
        }
        "set" if second == "transaction" => {
            return Footprint::role(store, TxRole::Begin(Isolation::parse(&words)))
        }
        "set" | "reset"
            if words.contains(&"characteristics")
                || words.contains(&"default_transaction_isolation")
                || words.contains(&"transaction_isolation")
                || words.contains(&"all") =>
        {
            return Footprint::role(store, TxRole::SetsDefault)
        }
        "set" | "show" | "reset" | "discard" | "deallocate" | "prepare" => {
            return Footprint::empty(store)
        }
        "select" | "with" | "values" | "table" | "insert" | "update" | "delete" | "merge"
        | "lock" | "truncate" | "copy" => {}
        _ => return Footprint::everything(store),
    }
    let writes_rows = words.iter().any(|w| {
        matches!(
            *w,
            "insert" | "update" | "delete" | "merge" | "lock" | "truncate" | "copy"
        )
    });
    let locks_rows = words
        .windows(2)
        .any(|w| w[0] == "for" && matches!(w[1], "update" | "share" | "no" | "key"));
    let mut relations: BTreeSet<String> = BTreeSet::new();
    let mut unknown_call = false;
    for (k, t) in tokens.iter().enumerate() {
        let SqlToken::Ident(name) = t else { continue };
        let known = catalog.and_then(|c| c.group_of(name));
        if let Some(g) = known {
            relations.insert(g.clone());
        }
        if catalog.is_some_and(|c| c.wide.contains(name)) {
            return Footprint::everything(store);
        }
        let called = tokens.get(k + 1) == Some(&SqlToken::Open);
        // `schema.function(` and `t.col` come as separate words; a qualified call is caught
        // by its last word.
        if called && known.is_none() && !PURE_CALLS.contains(&name.as_str()) {
            unknown_call = true;
        }
    }
    if unknown_call {
        return Footprint::everything(store);
    }
    let write = writes_rows || locks_rows;
    if catalog.is_none() {
        return if write {
            Footprint::everything(store)
        } else {
            // A plain read: it conflicts with every write (which touches everything).
            Footprint {
                reads: ["*".to_string()].into(),
                ..Footprint::empty(store)
            }
        };
    }
    if relations.is_empty() {
        return if write {
            Footprint::everything(store)
        } else if words
            .iter()
            .any(|w| matches!(*w, "from" | "join" | "table"))
        {
            // It reads a relation the catalog does not know (created after it was read):
            // it conflicts with every unclassified step, among them any write to it.
            Footprint {
                reads: ["*".to_string()].into(),
                ..Footprint::empty(store)
            }
        } else {
            Footprint::empty(store)
        };
    }
    let mut out = Footprint::empty(store);
    if write {
        out.writes = relations;
    } else {
        out.reads = relations;
    }
    out
}
