//! The dependency relation's rules, one test per rule.

use super::*;

fn shop() -> Catalog {
    Catalog::new(
        &[
            "orders".into(),
            "idempotency_keys".into(),
            "outbox".into(),
            "audit".into(),
            "users".into(),
        ],
        &[("outbox".into(), "orders".into())],
    )
}

fn pg(text: &str) -> Footprint {
    footprint(StoreKind::Postgres, text, Some(&shop()))
}

#[test]
fn statements_touch_the_groups_they_name() {
    let read = pg("SELECT response FROM idempotency_keys WHERE key = $1");
    assert_eq!(read.reads, ["idempotency_keys".to_string()].into());
    assert!(read.writes.is_empty() && !read.everything);
    let insert = pg("INSERT INTO orders (item, qty) VALUES ($1, $2) RETURNING id");
    assert!(insert.writes.contains("orders"));
    // outbox is tied to orders by a foreign key: one group.
    assert!(pg("INSERT INTO outbox (payload) VALUES ($1)").conflicts(&insert));
    assert!(!pg("INSERT INTO audit (x) VALUES (1)").conflicts(&insert));
    // Two reads of one table commute; a read and a write do not.
    assert!(!read.conflicts(&pg("SELECT 1 FROM idempotency_keys WHERE key = 'k'")));
    assert!(read.conflicts(&pg(
        "UPDATE idempotency_keys SET response = $1 WHERE key = $2"
    )));
    let locking = pg("SELECT * FROM idempotency_keys WHERE key = $1 FOR UPDATE");
    assert!(locking.conflicts(&read));
}

#[test]
fn what_cannot_be_classified_touches_everything() {
    for text in [
        "SELECT pg_advisory_xact_lock(hashtext($1))",
        "SELECT nextval('orders_id_seq')",
        "SELECT my_fn($1) FROM users",
        "CALL refresh()",
        "DO $$ BEGIN PERFORM 1; END $$",
        "NOTIFY orders",
        "INSERT INTO somewhere_unknown VALUES (1)",
    ] {
        let f = pg(text);
        assert!(f.everything, "{text}: {f:?}");
        assert!(f.conflicts(&pg("SELECT * FROM users")), "{text}");
    }
    // Without a catalog every write touches everything.
    let blind = footprint(StoreKind::Postgres, "INSERT INTO orders VALUES (1)", None);
    assert!(blind.everything);
    let blind_read = footprint(StoreKind::Postgres, "SELECT * FROM orders", None);
    assert!(blind_read.conflicts(&blind));
    assert!(!blind_read.conflicts(&footprint(StoreKind::Postgres, "SELECT 2", None)));
}

#[test]
fn session_local_statements_touch_nothing_and_literals_name_nothing() {
    for text in [
        "SET statement_timeout = 5000",
        "SHOW transaction_isolation",
        "SELECT 1",
        "DISCARD ALL",
    ] {
        assert!(pg(text).is_local(), "{text}");
    }
    // A relation's name inside a literal or a comment is not a relation.
    assert!(pg("SELECT 'orders' -- from orders\n").is_local());
    assert!(pg("SELECT $x$ orders $x$").is_local());
    // A relation the catalog does not know is read as any relation.
    let unknown = pg("SELECT \"Orders\" FROM t");
    assert!(!unknown.is_local());
    assert!(unknown.conflicts(&pg("INSERT INTO t VALUES (1)")));
    assert!(unknown.conflicts(&pg("INSERT INTO orders VALUES (1)")));
    assert!(!unknown.conflicts(&pg("SELECT * FROM orders")));
}

fn step(session: u64, text: &str, status: char) -> StepFootprint {
    StepFootprint {
        session: (StoreKind::Postgres, session),
        footprint: pg(text),
        blocked: false,
        status: Some(status),
    }
}

#[test]
fn a_write_is_seen_by_reads_when_its_transaction_publishes_it() {
    let steps = vec![
        step(1, "BEGIN ISOLATION LEVEL READ COMMITTED", 'T'),
        step(1, "INSERT INTO idempotency_keys VALUES ($1)", 'T'),
        step(2, "SELECT * FROM idempotency_keys WHERE key = $1", 'I'),
        step(1, "COMMIT", 'I'),
        step(2, "INSERT INTO idempotency_keys VALUES ($1)", 'I'),
        step(3, "SELECT * FROM audit", 'I'),
    ];
    let r = resolve(&steps, Some(Isolation::ReadCommitted));
    // BEGIN touches nothing: PostgreSQL takes the snapshot at the first statement.
    assert!(r[0].is_local());
    // A read under READ COMMITTED neither sees nor waits for a write not yet published...
    assert!(!r[1].conflicts(&r[2]));
    // ...and depends on its publication.
    assert!(r[3].conflicts(&r[2]));
    // Writes of one relation are dependent (a unique index makes the second wait).
    assert!(r[1].conflicts(&r[4]));
    assert!(!r[3].conflicts(&r[5]));
    // Outside a transaction block a write publishes at once.
    assert!(r[4].publishes.contains("idempotency_keys"));
    // A reader under SERIALIZABLE, or at a level not known, depends on every write of
    // what it reads.
    for default in [Some(Isolation::Serializable), None] {
        let s = resolve(&steps, default);
        assert!(s[1].conflicts(&s[2]), "{default:?}");
    }
    // Held, not yet run: an end touches everything, a read may take any snapshot.
    assert!(pg("COMMIT")
        .unresolved()
        .conflicts(&pg("SELECT * FROM audit")));
    assert!(pg("SELECT * FROM audit")
        .unresolved()
        .conflicts(&pg("INSERT INTO orders VALUES (1)").unresolved()));
}

#[test]
fn a_rollback_to_a_savepoint_lets_go_of_its_writes_and_the_commit_publishes_the_rest() {
    let steps = vec![
        step(1, "BEGIN ISOLATION LEVEL READ COMMITTED", 'T'),
        step(1, "INSERT INTO audit VALUES (1)", 'T'),
        step(1, "SAVEPOINT s", 'T'),
        step(1, "INSERT INTO idempotency_keys VALUES ($1)", 'T'),
        step(1, "ROLLBACK TO SAVEPOINT s", 'T'),
        step(1, "COMMIT", 'I'),
        step(2, "SELECT * FROM idempotency_keys", 'I'),
    ];
    let r = resolve(&steps, Some(Isolation::ReadCommitted));
    // The undo lets go of the key's row (a waiting insert goes on): dependent.
    assert_eq!(r[4].publishes, ["idempotency_keys".to_string()].into());
    // The commit publishes what is left, not what was undone.
    assert_eq!(r[5].publishes, ["audit".to_string()].into());
    assert!(!r[5].conflicts(&r[6]));
    assert!(r[4].conflicts(&r[6]));
}

#[test]
fn inserts_are_told_apart_by_their_unique_keys() {
    let mut c = shop();
    c.unique_keys
        .insert("orders".into(), vec![vec!["id".into()]]);
    c.unique_keys.insert(
        "idempotency_keys".into(),
        vec![vec!["tenant".into(), "key".into()]],
    );
    let mut c = c.keys_as_text();
    c.column_types
        .insert(("orders".into(), "id".into()), ColumnType::Uuid);
    let ins = |text: &str, params: &[&str]| {
        let params: Vec<String> = params.iter().map(|p| p.to_string()).collect();
        footprint_with(StoreKind::Postgres, text, &params, Some(&c))
    };
    let (u1, u2) = (
        "0f8fad5b-d9cb-469f-a165-70867728950e",
        "7c9e6679-7425-40de-944b-e07fc1f90ae7",
    );
    let order = "INSERT INTO orders (id, item) VALUES ($1::uuid, $2) RETURNING id";
    let a = ins(order, &[u1, "book"]);
    assert!(a.insert.is_some(), "{a:?}");
    // Distinct keys commute; one key, or a key not known, does not.
    assert!(!a.conflicts(&ins(order, &[u2, "book"])));
    assert!(a.conflicts(&ins(order, &[u1, "pen"])));
    assert!(a.conflicts(&ins(order, &["NULL", "pen"])));
    assert!(a.conflicts(&ins("INSERT INTO orders (item) VALUES ($1)", &["pen"])));
    assert!(a.conflicts(&ins(
        "INSERT INTO orders (id, item) VALUES ($1 || 'x', $2)",
        &[u2, "pen"]
    )));
    // One uuid however spelled; a cast to another type, or text that is no uuid, is not
    // known.
    let upper = "{0F8FAD5BD9CB469FA16570867728950E}";
    assert!(a.conflicts(&ins(order, &[upper, "pen"])));
    assert!(a.conflicts(&ins(
        "INSERT INTO orders (id, item) VALUES ($1::text, $2)",
        &[u2, "pen"]
    )));
    assert!(a.conflicts(&ins(order, &["u-2", "pen"])));
    // Relations tied by a foreign key (outbox → orders) stay dependent.
    let outbox = ins("INSERT INTO outbox (id) VALUES ($1)", &["e-1"]);
    assert!(
        outbox.insert.is_none(),
        "outbox has no keys read: {outbox:?}"
    );
    assert!(a.conflicts(&outbox));
    // Other writes of the relation stay dependent.
    assert!(a.conflicts(&ins("UPDATE orders SET item = $1", &["x"])));
    // A commit publishing only inserts conflicts with an insert of the same key only,
    // and with every read of what it inserted.
    let tx = |session: u64, key: &str, p: &[&str], status: char| StepFootprint {
        session: (StoreKind::Postgres, session),
        footprint: ins(key, p),
        blocked: false,
        status: Some(status),
    };
    let keys = "INSERT INTO idempotency_keys (tenant, key) VALUES ($1, $2)";
    let steps = vec![
        tx(1, "BEGIN", &[], 'T'),
        tx(1, keys, &["A", "k1"], 'T'),
        tx(1, "COMMIT", &[], 'I'),
        tx(2, keys, &["A", "k2"], 'I'),
        tx(3, keys, &["A", "k1"], 'I'),
        tx(4, "SELECT * FROM idempotency_keys", &[], 'I'),
    ];
    let r = resolve(&steps, Some(Isolation::ReadCommitted));
    assert!(!r[2].conflicts(&r[3]));
    assert!(r[2].conflicts(&r[4]));
    assert!(r[2].conflicts(&r[5]));
    assert!(!r[1].conflicts(&r[3]) && r[1].conflicts(&r[4]));
    // Two statements in one step are told apart by nothing but their relations.
    let two = ins(&format!("{order}; {order}"), &["u-3", "x"]);
    assert!(two.insert.is_none());
}

/// The shop with keys: orders by `id`, idempotency keys by `(tenant, key)`, and a foreign
/// key from `outbox (tenant, order_id)` to `orders (tenant, id)`.
fn keyed_shop() -> Catalog {
    let mut c = shop();
    c.unique_keys.insert(
        "orders".into(),
        vec![vec!["id".into()], vec!["tenant".into(), "id".into()]],
    );
    c.unique_keys
        .insert("outbox".into(), vec![vec!["id".into()]]);
    c.unique_keys.insert(
        "idempotency_keys".into(),
        vec![vec!["tenant".into(), "key".into()]],
    );
    c.references.push(ForeignKey {
        child: "outbox".into(),
        child_columns: vec!["tenant".into(), "order_id".into()],
        parent: "orders".into(),
        parent_columns: vec!["tenant".into(), "id".into()],
    });
    c.keys_as_text()
}

fn keyed(text: &str, params: &[&str]) -> Footprint {
    let params: Vec<String> = params.iter().map(|p| p.to_string()).collect();
    footprint_with(StoreKind::Postgres, text, &params, Some(&keyed_shop()))
}

/// A step of [`keyed_shop`]'s database on `session`, leaving `status`.
fn keyed_step(session: u64, text: &str, p: &[&str], status: char) -> StepFootprint {
    StepFootprint {
        session: (StoreKind::Postgres, session),
        footprint: keyed(text, p),
        blocked: false,
        status: Some(status),
    }
}

#[test]
fn a_child_row_is_told_apart_from_a_parent_row_it_does_not_reference() {
    let order = "INSERT INTO orders (id, tenant, item) VALUES ($1, $2, $3)";
    let event = "INSERT INTO outbox (id, tenant, order_id) VALUES ($1, $2, $3::text)";
    let o1 = keyed(order, &["o-1", "A", "book"]);
    // Its own order: the key's check locks that row.
    assert!(o1.conflicts(&keyed(event, &["e-1", "A", "o-1"])));
    // Another order, another tenant: apart.
    assert!(!o1.conflicts(&keyed(event, &["e-2", "A", "o-2"])));
    assert!(!o1.conflicts(&keyed(event, &["e-3", "B", "o-1"])));
    // A reference not known (NULL, an expression) is not told apart.
    assert!(o1.conflicts(&keyed(event, &["e-4", "A", "NULL"])));
    assert!(o1.conflicts(&keyed(
        "INSERT INTO outbox (id, tenant, order_id) VALUES ($1, $2, $3 || '')",
        &["e-5", "A", "o-2"]
    )));
    // Keys typed uuid compare as uuids: one order spelled two ways is one order.
    let mut uuids = keyed_shop();
    for (r, c) in [("orders", "id"), ("outbox", "order_id")] {
        uuids
            .column_types
            .insert((r.into(), c.into()), ColumnType::Uuid);
    }
    let typed = |text: &str, p: &[&str]| {
        let p: Vec<String> = p.iter().map(|x| x.to_string()).collect();
        footprint_with(StoreKind::Postgres, text, &p, Some(&uuids))
    };
    let hyphens = "0f8fad5b-d9cb-469f-a165-70867728950e";
    let (hex, other) = (
        "0F8FAD5BD9CB469FA16570867728950E",
        "7c9e6679742540de944be07fc1f90ae7",
    );
    let uuid_event = "INSERT INTO outbox (id, tenant, order_id) VALUES ($1, $2, $3)";
    let o = typed(order, &[hyphens, "A", "book"]);
    assert!(o.conflicts(&typed(uuid_event, &["e-1", "A", hex])));
    assert!(!o.conflicts(&typed(uuid_event, &["e-2", "A", other])));
    // Children of one parent do not wait for each other.
    assert!(!keyed(event, &["e-1", "A", "o-1"]).conflicts(&keyed(event, &["e-2", "A", "o-1"])));
    // A commit publishing an order meets a child that references it, and only that one.
    let tx = keyed_step;
    let steps = vec![
        tx(1, "BEGIN", &[], 'T'),
        tx(1, order, &["o-1", "A", "book"], 'T'),
        tx(1, "COMMIT", &[], 'I'),
        tx(2, event, &["e-1", "A", "o-1"], 'I'),
        tx(3, event, &["e-2", "A", "o-9"], 'I'),
    ];
    let r = resolve(&steps, Some(Isolation::ReadCommitted));
    assert!(r[2].conflicts(&r[3]));
    assert!(!r[2].conflicts(&r[4]));
}

#[test]
fn a_read_by_a_unique_key_sees_inserts_of_that_key_only() {
    let lookup = "SELECT k.response FROM idempotency_keys AS k WHERE k.tenant = $1 AND key = $2::text LIMIT 1";
    let read = keyed(lookup, &["A", "k1"]);
    assert_eq!(read.point_reads.len(), 1, "{read:?}");
    assert!(read.reads.is_empty());
    let insert = "INSERT INTO idempotency_keys (tenant, key) VALUES ($1, $2)";
    let tx = keyed_step;
    let steps = vec![
        tx(1, insert, &["A", "k1"], 'I'),
        tx(2, insert, &["A", "k2"], 'I'),
        tx(3, lookup, &["A", "k1"], 'I'),
        tx(4, "UPDATE idempotency_keys SET response = $1", &["x"], 'I'),
    ];
    let r = resolve(&steps, Some(Isolation::ReadCommitted));
    assert!(r[0].conflicts(&r[2]), "the same key");
    assert!(!r[1].conflicts(&r[2]), "another key");
    assert!(r[3].conflicts(&r[2]), "any other write of the relation");
    // Not a read by a unique key: relation-wide, as before.
    for (text, params) in [
        ("SELECT * FROM idempotency_keys WHERE tenant = $1", &["A"][..]),
        ("SELECT * FROM idempotency_keys WHERE tenant = $1 OR key = $2", &["A", "k1"]),
        ("SELECT * FROM idempotency_keys WHERE tenant = $1 AND key >= $2", &["A", "k1"]),
        ("SELECT * FROM idempotency_keys WHERE tenant = $1 AND key = $2", &["A", "NULL"]),
        (
            "SELECT * FROM idempotency_keys k JOIN orders o ON o.id = k.key WHERE k.tenant = $1 AND k.key = $2",
            &["A", "k1"],
        ),
        (
            "SELECT (SELECT count(*) FROM orders) FROM idempotency_keys WHERE tenant = $1 AND key = $2",
            &["A", "k1"],
        ),
    ] {
        let f = keyed(text, params);
        assert!(f.point_reads.is_empty(), "{text}: {f:?}");
        assert!(!f.reads.is_empty(), "{text}: {f:?}");
        assert!(f.conflicts(&keyed(insert, &["B", "k9"]).unresolved()), "{text}");
    }
    // Under REPEATABLE READ the transaction's snapshot reads what any of it reads.
    let steps = vec![
        tx(1, "BEGIN ISOLATION LEVEL REPEATABLE READ", &[], 'T'),
        tx(1, lookup, &["A", "k1"], 'T'),
        tx(1, "SELECT 1", &[], 'T'),
        tx(2, insert, &["A", "k1"], 'I'),
    ];
    let r = resolve(&steps, None);
    assert!(r[2].conflicts(&r[3]));
}

#[test]
fn a_failed_statement_leaves_nothing_for_its_undo_or_commit_to_publish() {
    let insert = "INSERT INTO idempotency_keys (tenant, key) VALUES ($1, $2)";
    let lookup = "SELECT * FROM idempotency_keys WHERE tenant = $1 AND key = $2";
    let tx = |session: u64, text: &str, p: &[&str], status: char, blocked: bool| StepFootprint {
        blocked,
        ..keyed_step(session, text, p, status)
    };
    let order = "INSERT INTO orders (id, tenant, item) VALUES ($1, $2, $3)";
    let steps = vec![
        tx(1, "BEGIN", &[], 'T', false),
        tx(1, "SAVEPOINT s", &[], 'T', false),
        tx(1, order, &["o-1", "A", "book"], 'T', false),
        // Waited for another session's insert of the key, then failed (23505).
        tx(1, insert, &["A", "k1"], 'E', true),
        tx(1, "ROLLBACK TO SAVEPOINT s", &[], 'T', false),
        tx(2, lookup, &["A", "k1"], 'I', false),
        tx(3, insert, &["A", "k1"], 'I', false),
        tx(
            4,
            "SELECT * FROM orders WHERE id = $1",
            &["o-2"],
            'I',
            false,
        ),
        tx(
            4,
            "SELECT * FROM orders WHERE id = $1",
            &["o-1"],
            'I',
            false,
        ),
    ];
    let r = resolve(&steps, Some(Isolation::ReadCommitted));
    // The waiting insert stays told apart by its key; the undo frees the order only.
    assert!(r[3].conflicts(&r[6]));
    assert!(!r[4].conflicts(&r[5]), "{:?}", r[4]);
    assert!(!r[4].conflicts(&r[7]));
    assert!(r[4].conflicts(&r[8]));
}

#[test]
fn a_level_set_where_the_text_does_not_name_it_is_not_known() {
    let steps = |set: &str| {
        vec![
            step(1, "BEGIN", 'T'),
            step(1, set, 'T'),
            step(1, "SELECT * FROM orders", 'T'),
            step(2, "INSERT INTO orders VALUES (1)", 'T'),
        ]
    };
    let plain = resolve(
        &steps("SET search_path = public"),
        Some(Isolation::ReadCommitted),
    );
    assert!(plain[2].mvcc, "{:?}", plain[2]);
    for set in [
        "SET transaction_isolation = 'serializable'",
        "SELECT set_config('transaction_isolation', 'serializable', true)",
    ] {
        let r = resolve(&steps(set), Some(Isolation::ReadCommitted));
        assert!(!r[2].mvcc, "{set}: {:?}", r[2]);
    }
    assert!(
        pg("SELECT set_config('default_transaction_isolation', 'serializable', false)").everything
    );
    assert!(!pg("SELECT set_config('app.tenant', $1, true)").everything);
}

#[test]
fn key_values_are_known_by_their_columns_type() {
    let t = ColumnType::of;
    assert_eq!(t("varchar", true).canonical("k1"), Some("k1".into()));
    assert_eq!(
        t("varchar", true).canonical("k1 "),
        None,
        "padding may be cut"
    );
    assert_eq!(
        t("text", false),
        ColumnType::Other,
        "a nondeterministic collation"
    );
    assert_eq!(t("bpchar", true).canonical("ab  "), Some("ab".into()));
    assert_eq!(t("int8", true).canonical(" 007"), Some("7".into()));
    assert_eq!(t("int4", true).canonical("7.0"), None);
    assert_eq!(
        t("uuid", true).canonical("{0F8FAD5B-D9CB-469F-A165-70867728950E}"),
        t("uuid", true).canonical("0f8fad5bd9cb469fa16570867728950e")
    );
    assert_eq!(t("numeric", true).canonical("1"), None);
    assert_eq!(t("citext", true).canonical("a"), None);
}

#[test]
fn a_batch_of_statements_knows_no_statements_values() {
    // Each statement's `$1` is its own first parameter, not the batch's.
    let lookup = "SELECT * FROM idempotency_keys WHERE tenant = $1 AND key = $2";
    let batch = keyed(&format!("{lookup}; {lookup}"), &["A", "k1", "A", "k2"]);
    assert!(batch.point_reads.is_empty(), "{batch:?}");
    let insert = "INSERT INTO idempotency_keys (tenant, key) VALUES ($1, $2)";
    assert!(batch.conflicts(&keyed(insert, &["A", "k9"]).unresolved()));
}

#[test]
fn what_a_text_reaches_follows_the_functions_it_calls() {
    let names = [
        "receipts".to_string(),
        "orders".to_string(),
        "audit".to_string(),
    ];
    let known: BTreeSet<&String> = names.iter().collect();
    let f = |lang: &str, src: &str| (lang.to_string(), src.to_string());
    let functions: HashMap<String, (String, String)> = [
        (
            "record_receipt".to_string(),
            f("sql", "INSERT INTO receipts VALUES (k)"),
        ),
        (
            "deeper".to_string(),
            f("plpgsql", "BEGIN PERFORM record_receipt(1); END"),
        ),
        (
            "dynamic".to_string(),
            f("plpgsql", "BEGIN EXECUTE 'INSERT INTO ' || t; END"),
        ),
        ("native".to_string(), f("c", "native_fn")),
        ("again".to_string(), f("sql", "SELECT again(1)")),
    ]
    .into();
    let r = |text: &str| reached(text, &known, &functions);
    assert_eq!(
        r("BEGIN PERFORM deeper(NEW.k); INSERT INTO audit VALUES (1); END"),
        (["audit".to_string(), "receipts".to_string()].into(), false)
    );
    assert!(r("BEGIN PERFORM dynamic(); END").1, "SQL built at run time");
    assert!(r("SELECT native(1)").1, "another language");
    assert_eq!(
        r("SELECT again(1)"),
        (BTreeSet::new(), false),
        "a cycle ends"
    );
    assert!(!r("CREATE TRIGGER t AFTER INSERT ON orders EXECUTE FUNCTION again()").1);
}

#[test]
fn operators_and_qualified_names_are_tokens_of_their_own() {
    use SqlToken::*;
    let t = sql_tokens("a.b = $1 AND c >= 2 AND d=-1 AND e.1");
    assert_eq!(
        &t[..5],
        &[Ident("a".into()), Dot, Ident("b".into()), Eq, Param(1)]
    );
    assert!(!t[5..].contains(&Eq), "{t:?}");
}

#[test]
fn repeatable_read_statements_share_one_snapshot_and_a_blocked_step_writes() {
    let steps = vec![
        step(1, "BEGIN ISOLATION LEVEL REPEATABLE READ", 'T'),
        step(1, "SELECT 1", 'T'),
        step(2, "INSERT INTO orders VALUES (1)", 'I'),
        step(1, "SELECT * FROM orders", 'T'),
        step(1, "COMMIT", 'I'),
    ];
    let r = resolve(&steps, None);
    // The first statement took the snapshot later reads of orders use.
    assert!(r[1].conflicts(&r[2]));
    let mut blocked = steps.clone();
    blocked[3].blocked = true;
    assert!(resolve(&blocked, None)[3].writes.contains("orders"));
    assert_eq!(
        tx_status("INSERT 0 1 (T) (answered after the next point)"),
        Some('T')
    );
    assert_eq!(tx_status("waiting for a lock"), None);
}

#[test]
fn redis_commands_touch_their_keys() {
    let r = |t: &str| footprint(StoreKind::Redis, t, None);
    assert!(r("GET a").conflicts(&r("SET a 1 NX PX 30000")));
    assert!(!r("GET a").conflicts(&r("GET a")));
    assert!(!r("SET a 1").conflicts(&r("SET b 1")));
    assert!(r("MSET a 1 b 2").conflicts(&r("GET b")));
    assert!(!r("MSET a 1 b 2").conflicts(&r("GET 1")));
    assert!(r("EVAL \"return 1\" 1 lock:k tok").conflicts(&r("GET lock:k")));
    assert!(!r("EVAL \"return 1\" 1 lock:k tok").conflicts(&r("GET other")));
    assert!(r("KEYS *").everything);
    assert!(r("EVAL \"return 1\" x").everything);
    assert!(r("PING").is_local() && r("SELECT 3").is_local());
    let block = r("MULTI; SET a 1; INCR n; EXEC");
    assert!(block.conflicts(&r("GET n")) && !block.conflicts(&r("GET z")));
    // A quoted value holding `; ` is one word, not the end of a command.
    let mset = r("MSET note:k \"jammed; get a technician\" rec:k v");
    assert!(mset.conflicts(&r("GET rec:k")), "{mset:?}");
    assert!(!mset.everything);
    // An EXEC may depend on keys WATCHed unheld: any write meets it.
    assert!(block.conflicts(&r("SET audit:k 1")));
    assert!(!block.conflicts(&r("GET z")));
    // A quoted key with a space is one key.
    assert!(r("SET \"a b\" 1").conflicts(&r("GET \"a b\"")));
    assert!(!r("SET \"a b\" 1").conflicts(&r("GET a")));
    // Different servers never conflict.
    assert!(!r("SET orders 1").conflicts(&pg("SELECT pg_advisory_lock(1)")));
}
