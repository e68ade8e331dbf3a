//! The soak's checks, after the traffic and the faults: the database against every answer
//! the clients were given, and the sessions left behind.

use super::*;

pub(super) fn overall(invariants: &[Check]) -> (Verdict, Option<String>) {
    let named = |v: Verdict| -> Vec<&str> {
        invariants
            .iter()
            .filter(|i| i.verdict == v)
            .map(|i| i.name)
            .collect()
    };
    let failed = named(Verdict::Fail);
    if !failed.is_empty() {
        return (
            Verdict::Fail,
            Some(format!("failed: {}", failed.join(", "))),
        );
    }
    let pend = named(Verdict::Pending);
    if !pend.is_empty() {
        let why: Vec<String> = invariants
            .iter()
            .filter(|i| i.verdict == Verdict::Pending)
            .map(|i| format!("{}: {}", i.name, i.detail))
            .collect();
        return (Verdict::Pending, Some(why.join("; ")));
    }
    (Verdict::Pass, None)
}

/// At most three examples, then how many more.
pub(super) fn examples(items: &[String]) -> String {
    let shown: Vec<&str> = items.iter().take(3).map(String::as_str).collect();
    if items.len() > 3 {
        format!("{} (and {} more)", shown.join("; "), items.len() - 3)
    } else {
        shown.join("; ")
    }
}

/// The three SQL checks over the rows: counts per tenant, 201 ids present, one id per key.
pub(super) fn check_database(
    client: &mut postgres::Client,
    tenants: &[String],
    intents: &[Intent],
) -> Vec<Check> {
    match database_checks(client, tenants, intents) {
        Ok(v) => v,
        Err(e) => {
            let why = format!("could not read the rows: {e}");
            INVARIANTS[1..4]
                .iter()
                .map(|name| Check::pending(name, &why))
                .collect()
        }
    }
}

/// The checks of the rows by direct SQL: [`rows_agree_per_tenant`], [`answered_ids_exist`]
/// and [`one_id_per_key`], in [`INVARIANTS`] order.
pub(super) fn database_checks(
    client: &mut postgres::Client,
    tenants: &[String],
    intents: &[Intent],
) -> Result<Vec<Check>, SoakError> {
    Ok(vec![
        rows_agree_per_tenant(client, tenants)?,
        answered_ids_exist(client, tenants, intents)?,
        one_id_per_key(client, tenants, intents)?,
    ])
}

/// Tickets = receipts = `ticket.created` events, per tenant.
fn rows_agree_per_tenant(
    client: &mut postgres::Client,
    tenants: &[String],
) -> Result<Check, SoakError> {
    let count_by_tenant = |client: &mut postgres::Client, sql_text: &str| {
        client
            .query(sql_text, &[&tenants])
            .map_err(sql("count rows per tenant"))
            .map(|rows| {
                rows.iter()
                    .filter_map(|r| {
                        Some((
                            r.try_get::<_, String>(0).ok()?,
                            r.try_get::<_, i64>(1).ok()?,
                        ))
                    })
                    .collect::<HashMap<String, i64>>()
            })
    };
    let tickets = count_by_tenant(
        client,
        "SELECT tenant_id, count(*) FROM tickets WHERE tenant_id = ANY($1) GROUP BY tenant_id",
    )?;
    let receipts = count_by_tenant(
        client,
        "SELECT tenant_id, count(*) FROM idempotency_receipts WHERE tenant_id = ANY($1) \
         GROUP BY tenant_id",
    )?;
    let events = count_by_tenant(
        client,
        "SELECT tenant_id, count(*) FROM outbox_events WHERE tenant_id = ANY($1) \
         AND event_type = 'ticket.created' GROUP BY tenant_id",
    )?;
    let mut unequal = Vec::new();
    let (mut t_all, mut r_all, mut e_all) = (0, 0, 0);
    for t in tenants {
        let (a, b, c) = (
            tickets.get(t).copied().unwrap_or(0),
            receipts.get(t).copied().unwrap_or(0),
            events.get(t).copied().unwrap_or(0),
        );
        t_all += a;
        r_all += b;
        e_all += c;
        if a != b || b != c {
            unequal.push(format!(
                "{t}: {a} tickets, {b} receipts, {c} ticket.created events"
            ));
        }
    }
    Ok(if unequal.is_empty() {
        Check::pass(
            INVARIANTS[1],
            format!(
                "{} tenants: {t_all} tickets = {r_all} receipts = {e_all} ticket.created events",
                tenants.len()
            ),
        )
    } else {
        Check::fail(INVARIANTS[1], examples(&unequal))
    })
}

/// Every id answered with 201 exists in its tenant.
fn answered_ids_exist(
    client: &mut postgres::Client,
    tenants: &[String],
    intents: &[Intent],
) -> Result<Check, SoakError> {
    let mut answered: BTreeMap<usize, HashSet<Uuid>> = BTreeMap::new();
    for i in intents.iter().filter(|i| i.op.is_create()) {
        for a in i.attempts.iter().filter(|a| a.status == Some(201)) {
            if let Some(id) = a.id {
                answered.entry(i.tenant).or_default().insert(id);
            }
        }
    }
    let mut missing = Vec::new();
    let mut total = 0usize;
    for (tenant, ids) in &answered {
        let ids: Vec<Uuid> = ids.iter().copied().collect();
        total += ids.len();
        let found: HashSet<Uuid> = client
            .query(
                "SELECT id FROM tickets WHERE tenant_id = $1 AND id = ANY($2)",
                &[&tenants[*tenant], &ids],
            )
            .map_err(sql("look up answered ids"))?
            .iter()
            .filter_map(|r| r.try_get(0).ok())
            .collect();
        for id in ids.iter().filter(|id| !found.contains(id)) {
            missing.push(format!("{id} (answered 201 to {})", tenants[*tenant]));
        }
    }
    Ok(if missing.is_empty() {
        Check::pass(
            INVARIANTS[2],
            format!("{total} ids answered with 201, every one found in its tenant"),
        )
    } else {
        Check::fail(
            INVARIANTS[2],
            format!(
                "{} of {total} missing: {}",
                missing.len(),
                examples(&missing)
            ),
        )
    })
}

/// One id per key, across every answer and receipt.
fn one_id_per_key(
    client: &mut postgres::Client,
    tenants: &[String],
    intents: &[Intent],
) -> Result<Check, SoakError> {
    let mut per_key: BTreeMap<(usize, &str), (HashSet<Uuid>, usize)> = BTreeMap::new();
    for i in intents.iter().filter(|i| i.op.is_create()) {
        let e = per_key.entry((i.tenant, i.key.as_str())).or_default();
        for a in i.attempts.iter().filter(|a| a.status == Some(201)) {
            if let Some(id) = a.id {
                e.0.insert(id);
            }
        }
        e.1 += usize::from(i.last().is_some_and(|a| a.status == Some(201)));
    }
    let mut stored: HashMap<(usize, String), Vec<Uuid>> = HashMap::new();
    for (t, tenant) in tenants.iter().enumerate() {
        for row in client
            .query(
                "SELECT idempotency_key, ticket_id FROM idempotency_receipts WHERE tenant_id = $1",
                &[tenant],
            )
            .map_err(sql("read receipts"))?
        {
            let (Ok(key), Ok(id)) = (row.try_get::<_, String>(0), row.try_get::<_, Uuid>(1)) else {
                continue;
            };
            stored.entry((t, key)).or_default().push(id);
        }
    }
    let mut split = Vec::new();
    let mut retried = 0usize;
    for ((tenant, key), (ids, acks)) in &per_key {
        let receipts = stored
            .get(&(*tenant, key.to_string()))
            .cloned()
            .unwrap_or_default();
        retried += usize::from(*acks > 1);
        let mut all: HashSet<Uuid> = ids.clone();
        all.extend(receipts.iter().copied());
        let lost = !ids.is_empty() && receipts.is_empty();
        if all.len() > 1 || receipts.len() > 1 || lost {
            split.push(format!(
                "{}/{key}: answered {} id(s), {} receipt(s), {} distinct id(s)",
                tenants[*tenant],
                ids.len(),
                receipts.len(),
                all.len()
            ));
        }
    }
    Ok(if split.is_empty() {
        Check::pass(
            INVARIANTS[3],
            format!(
                "{} keys ({retried} answered 201 more than once): one id each, in the answers and the receipts",
                per_key.len()
            ),
        )
    } else {
        Check::fail(
            INVARIANTS[3],
            format!("{} keys split: {}", split.len(), examples(&split)),
        )
    })
}

pub(super) fn check_conflicts(intents: &[Intent]) -> Check {
    let name = INVARIANTS[4];
    let mut judged = 0usize;
    let mut wrong = Vec::new();
    for i in intents.iter().filter(|i| i.op == Op::Conflict) {
        match i.last().and_then(|a| a.status) {
            Some(409) => judged += 1,
            Some(201) => {
                judged += 1;
                wrong.push(format!("{} with another body: 201", i.key));
            }
            // 500s and unanswered ones are judged by the answers check.
            _ => {}
        }
    }
    if !wrong.is_empty() {
        Check::fail(
            name,
            format!(
                "{} of {judged} conflicts answered 201: {}",
                wrong.len(),
                examples(&wrong)
            ),
        )
    } else if judged == 0 {
        Check::pending(name, "no conflict was answered (run longer)")
    } else {
        Check::pass(name, format!("{judged} conflicts, every one 409"))
    }
}

pub(super) fn check_gets(intents: &[Intent]) -> Check {
    let name = INVARIANTS[5];
    let (mut own, mut other) = (0usize, 0usize);
    let mut wrong = Vec::new();
    for i in intents.iter().filter(|i| !i.op.is_create()) {
        let Some((id, _)) = i.get else { continue };
        let Some(a) = i.last() else { continue };
        match (i.op, a.status) {
            (Op::Get, Some(200)) if a.id == Some(id) => own += 1,
            (Op::Get, Some(s @ (200 | 404))) => {
                own += 1;
                wrong.push(format!("GET {id} in its tenant: {s}"));
            }
            (Op::GetOtherTenant, Some(404)) => other += 1,
            (Op::GetOtherTenant, Some(s @ 200)) => {
                other += 1;
                wrong.push(format!("GET {id} from another tenant: {s}"));
            }
            _ => {}
        }
    }
    if !wrong.is_empty() {
        Check::fail(
            name,
            format!(
                "{} of {} GETs wrong: {}",
                wrong.len(),
                own + other,
                examples(&wrong)
            ),
        )
    } else if own == 0 {
        Check::pending(name, "no GET was answered (run longer)")
    } else {
        Check::pass(
            name,
            format!("{own} GETs in their tenant answered 200 with the id, {other} from another tenant 404"),
        )
    }
}

pub(super) fn check_answers(intents: &[Intent], faults_end_ms: u64) -> Check {
    let name = INVARIANTS[7];
    let mut five_hundreds = 0usize;
    let mut in_tail = 0usize;
    let mut first_detail: Option<String> = None;
    let mut unexpected: BTreeMap<String, usize> = BTreeMap::new();
    for i in intents {
        for a in &i.attempts {
            let Some(s) = a.status else {
                if let Some(e) = a
                    .error
                    .as_ref()
                    .filter(|e| e.starts_with("not a transport"))
                {
                    *unexpected.entry(e.clone()).or_insert(0) += 1;
                }
                continue;
            };
            let expected = match i.op {
                Op::New | Op::Retry | Op::Contested => s == 201,
                Op::Conflict => s == 409 || s == 201,
                Op::Get | Op::GetOtherTenant => s == 200 || s == 404,
            };
            if s == 500 {
                five_hundreds += 1;
                in_tail += usize::from(a.at_ms >= faults_end_ms);
                if first_detail.is_none() {
                    first_detail = a.detail.clone();
                }
            } else if !(expected || s == 503) {
                *unexpected.entry(format!("{s} to {:?}", i.op)).or_insert(0) += 1;
            }
        }
    }
    let total: usize = intents.iter().map(|i| i.attempts.len()).sum();
    if five_hundreds == 0 && unexpected.is_empty() {
        return Check::pass(
            name,
            format!("{total} answers: no 500, no unexpected status"),
        );
    }
    let mut parts = Vec::new();
    if five_hundreds > 0 {
        parts.push(format!(
            "{five_hundreds} answers 500 ({in_tail} of them in the fault-free tail){}",
            first_detail
                .map(|d| format!(", the first: {d:?}"))
                .unwrap_or_default()
        ));
    }
    for (what, n) in &unexpected {
        parts.push(format!("{n} × {what}"));
    }
    Check::fail(name, parts.join("; "))
}

/// Reads the sessions of database `dbname` (other than this one) that are in a transaction;
/// one seen there on every read over about two seconds is left in a transaction (its negative
/// control plants an aborted session: `tests/integration/soak.rs`).
pub(super) fn check_sessions(client: &mut postgres::Client, dbname: &str) -> Check {
    let name = INVARIANTS[6];
    let read =
        |client: &mut postgres::Client| -> Result<Vec<(i32, String, String)>, postgres::Error> {
            Ok(client
                .query(
                    "SELECT pid, state, left(coalesce(query, ''), 120) FROM pg_stat_activity \
                 WHERE datname = $1 AND pid <> pg_backend_pid() \
                 AND state IN ('idle in transaction', 'idle in transaction (aborted)')",
                    &[&dbname],
                )?
                .iter()
                .filter_map(|r| Some((r.try_get(0).ok()?, r.try_get(1).ok()?, r.try_get(2).ok()?)))
                .collect())
        };
    let mut seen = match read(client) {
        Ok(s) => s,
        Err(e) => return Check::pending(name, format!("could not read pg_stat_activity: {e}")),
    };
    let total = client
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()",
            &[&dbname],
        )
        .and_then(|r| r.try_get::<_, i64>(0))
        .unwrap_or(0);
    // A session only passing through (a request still finishing) leaves within a moment; a
    // stuck one stays. Re-read until none is left or 20 reads (100 ms apart) agree.
    for _ in 0..20 {
        if seen.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
        let now = match read(client) {
            Ok(s) => s,
            Err(e) => return Check::pending(name, format!("could not read pg_stat_activity: {e}")),
        };
        seen.retain(|(pid, _, _)| now.iter().any(|(p, _, _)| p == pid));
    }
    if seen.is_empty() {
        Check::pass(
            name,
            format!("{total} sessions of the scratch database, none in a transaction"),
        )
    } else {
        let list: Vec<String> = seen
            .iter()
            .map(|(pid, state, query)| format!("pid {pid} {state} (last statement: {query:?})"))
            .collect();
        Check::fail(
            name,
            format!(
                "{} of {total} sessions stayed in a transaction for 2 s: {}",
                seen.len(),
                examples(&list)
            ),
        )
    }
}
