//! The Redis lease in front of the receipt (docs/PROTOCOL.md §10): it is taken and
//! released with a compare-and-delete, a request that finds it held waits for the receipt and
//! the receipt decides, an old holder never deletes a newer holder's lease (a plain DEL
//! does: the negative control), and Redis down means no lease, never a failure.

use std::process::{Command, Stdio};
use std::time::Duration;

use ticketflow_core::lease::{
    create_with_lease, lease_key, LeaseConfig, LeaseOutcome, Leases, RedisLeases, Release,
};
use ticketflow_core::{create_ticket, CreateOptions};

use crate::support::{b0, TestDb};

/// Where no Redis listens.
const NO_REDIS: &str = "redis://127.0.0.1:1/0";

/// The Redis tests use (`TICKETFLOW_TEST_REDIS`, default db 15 on loopback), or `None` after
/// printing why when it does not answer outside CI. Under `CI` an absent Redis fails.
pub fn redis_url() -> Option<String> {
    let url = std::env::var("TICKETFLOW_TEST_REDIS")
        .unwrap_or_else(|_| "redis://127.0.0.1:6379/15".to_string());
    let config = LeaseConfig::new(&url, Duration::from_secs(1)).unwrap();
    match RedisLeases::connect(&config).and_then(|mut r| r.holder("tfv-probe")) {
        Ok(_) => Some(url),
        Err(e) if std::env::var_os("CI").is_some() => {
            panic!("CI is set and Redis is required: {e}")
        }
        Err(e) => {
            eprintln!("skipping Redis test: {e}");
            None
        }
    }
}

/// A tenant no other test or run uses: lease keys of this test live under it.
fn tenant() -> String {
    format!("tfv-lease-{}", uuid::Uuid::new_v4().simple())
}

fn ticketflow(args: &[&str]) -> (i32, serde_json::Value, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ticketflow"))
        .args(args)
        .env_remove("DATABASE_URL")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let json = serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
    (
        out.status.code().unwrap_or(-1),
        json,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `ticketflow create` of B0 for (tenant, key) on the SQLite file `path`, behind the lease at
/// `url`: exit code, JSON output, stderr.
fn create_behind_lease(
    path: &str,
    tenant: &str,
    key: &str,
    url: &str,
) -> (i32, serde_json::Value, String) {
    let body = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(body.path(), crate::serve::B0).unwrap();
    let file = body.path().to_str().unwrap();
    ticketflow(&[
        "create",
        "--database-url",
        path,
        "--tenant",
        tenant,
        "--key",
        key,
        "--file",
        file,
        "--lease",
        url,
    ])
}

/// POSTs B0 for (tenant, key) to the service at `base`.
fn post_b0(base: &str, tenant: &str, key: &str) -> Result<ureq::Response, Box<ureq::Error>> {
    ureq::post(&format!("{base}/v1/tickets"))
        .set("X-Tenant-Id", tenant)
        .set("Idempotency-Key", key)
        .set("Content-Type", "application/json")
        .send_string(crate::serve::B0)
        .map_err(Box::new)
}

#[test]
fn a_malformed_lease_url_or_a_zero_ttl_is_a_usage_error() {
    let db = TestDb::sqlite();
    let path = db.sqlite_path().unwrap().display().to_string();
    let body = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(body.path(), crate::serve::B0).unwrap();
    let file = body.path().to_str().unwrap();
    for (url, ttl) in [
        ("http://127.0.0.1:6379/0", "100"),
        ("redis://127.0.0.1:6379", "100"),
        ("redis://127.0.0.1:6379/0", "0"),
    ] {
        let args = [
            "create",
            "--database-url",
            &path,
            "--tenant",
            "A",
            "--key",
            "k",
            "--file",
            file,
            "--lease",
            url,
            "--lease-ttl-ms",
            ttl,
        ];
        let (code, _, stderr) = ticketflow(&args);
        assert_eq!(code, 2, "{url} {ttl}: {stderr}");
        let serve = [
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--database-url",
            &path,
            "--lease",
            url,
            "--lease-ttl-ms",
            ttl,
        ];
        let (code, _, stderr) = ticketflow(&serve);
        assert_eq!(code, 2, "serve {url} {ttl}: {stderr}");
    }
    assert_eq!(db.counts("A").tickets, 0);
}

#[test]
fn a_create_takes_its_lease_and_releases_it_with_its_own_token() {
    let Some(url) = redis_url() else { return };
    let db = TestDb::sqlite();
    let path = db.sqlite_path().unwrap().display().to_string();
    let t = tenant();
    let (code, first, stderr) = create_behind_lease(&path, &t, "k1", &url);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(first["outcome"], "created", "{first}");
    assert_eq!(
        first["lease"],
        serde_json::json!({"lease": "held", "released": true})
    );
    let mut r =
        RedisLeases::connect(&LeaseConfig::new(&url, Duration::from_secs(1)).unwrap()).unwrap();
    assert_eq!(
        r.holder(&lease_key(&t, "k1")).unwrap(),
        None,
        "the lease outlived its create"
    );
    let (code, again, _) = create_behind_lease(&path, &t, "k1", &url);
    assert_eq!(code, 0);
    assert_eq!(again["outcome"], "replayed", "{again}");
    assert_eq!(db.counts(&t).tickets, 1);
}

#[test]
fn a_request_that_finds_the_lease_held_waits_and_the_receipt_decides() {
    let Some(url) = redis_url() else { return };
    for db in TestDb::all("lease_wait") {
        let t = tenant();
        let mut config = LeaseConfig::new(&url, Duration::from_secs(5)).unwrap();
        config.wait = Duration::from_millis(100);
        let mut other = RedisLeases::connect(&config).unwrap();
        let mut leases = RedisLeases::connect(&config).unwrap();
        let mut store = db.open();
        let options = CreateOptions::default();
        // A receipt already committed while someone holds the lease: the waiter sees it
        // and the protocol replays without inserting.
        create_ticket(store.as_mut(), &t, "k1", &b0(), &options).unwrap();
        assert!(other
            .acquire(&lease_key(&t, "k1"), "someone-else", Duration::from_secs(5))
            .unwrap());
        let (report, outcome) = create_with_lease(
            Some(&mut leases),
            &config,
            Release::CompareAndDelete,
            store.as_mut(),
            &t,
            "k1",
            |s| create_ticket(s, &t, "k1", &b0(), &options),
        );
        assert!(
            matches!(
                outcome,
                LeaseOutcome::Waited {
                    receipt_seen: true,
                    ..
                }
            ),
            "{outcome:?}"
        );
        assert_eq!(report.unwrap().outcome.kind().to_string(), "replayed");
        // A holder that never commits: the wait is bounded, then the receipt decides (no
        // receipt: this request creates). The lease is a hint, never the arbiter.
        assert!(other
            .acquire(&lease_key(&t, "k2"), "stalled", Duration::from_secs(5))
            .unwrap());
        let (report, outcome) = create_with_lease(
            Some(&mut leases),
            &config,
            Release::CompareAndDelete,
            store.as_mut(),
            &t,
            "k2",
            |s| create_ticket(s, &t, "k2", &b0(), &options),
        );
        match outcome {
            LeaseOutcome::Waited {
                waited_ms,
                receipt_seen: false,
            } => assert!(waited_ms >= 100),
            other => panic!("{other:?}"),
        }
        assert_eq!(report.unwrap().outcome.kind().to_string(), "created");
        assert_eq!(db.counts(&t).tickets, 2, "{}", db.name());
        for k in ["k1", "k2"] {
            other.delete(&lease_key(&t, k)).unwrap();
        }
    }
}

#[test]
fn an_old_holder_never_deletes_a_newer_holders_lease_but_a_plain_del_does() {
    let Some(url) = redis_url() else { return };
    let config = LeaseConfig::new(&url, Duration::from_secs(5)).unwrap();
    let mut r = RedisLeases::connect(&config).unwrap();
    let key = lease_key(&tenant(), "k");
    let ttl = Duration::from_secs(5);
    assert!(r.acquire(&key, "old", ttl).unwrap());
    assert!(
        !r.acquire(&key, "new", ttl).unwrap(),
        "NX: one holder at a time"
    );
    // The old holder's lease is gone (as after its TTL, or a flush); a newer holder takes it.
    assert!(r.delete(&key).unwrap());
    assert!(r.acquire(&key, "new", ttl).unwrap());
    assert!(
        !r.release(&key, "old").unwrap(),
        "the old token released the new lease"
    );
    assert_eq!(r.holder(&key).unwrap().as_deref(), Some("new"));
    // Negative control: the unsafe release (a plain DEL) removes the newer holder's lease.
    assert!(r.delete(&key).unwrap());
    assert_eq!(r.holder(&key).unwrap(), None);
}

#[test]
fn with_redis_down_a_create_goes_on_without_the_lease_never_failing() {
    let db = TestDb::sqlite();
    let path = db.sqlite_path().unwrap().display().to_string();
    let (code, out, stderr) = create_behind_lease(&path, "A", "k1", NO_REDIS);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(out["outcome"], "created");
    assert_eq!(out["lease"]["lease"], "no-lease", "{out}");
    assert!(
        !stderr.contains("Printer") && !stderr.contains(crate::serve::B0),
        "{stderr}"
    );
    let s = crate::serve::serve(&path, &["--lease", NO_REDIS]);
    let r = post_b0(&s.base, "A", "k2").unwrap();
    assert_eq!(r.status(), 201);
    assert_eq!(r.header("ticketflow-lease"), Some("no-lease"));
}

#[test]
fn racers_through_serve_with_the_lease_get_one_ticket_and_the_holder_is_marked() {
    let Some(url) = redis_url() else { return };
    let Some(db) = TestDb::postgres("lease_serve") else {
        return;
    };
    let s = crate::serve::serve(&db.url().unwrap(), &["--lease", &url]);
    let t = tenant();
    let answers: Vec<_> = (0..6)
        .map(|_| {
            let (base, t) = (s.base.clone(), t.clone());
            std::thread::spawn(move || {
                let r = post_b0(&base, &t, "k").unwrap();
                let lease = r.header("ticketflow-lease").unwrap().to_string();
                let json: serde_json::Value =
                    serde_json::from_str(&r.into_string().unwrap()).unwrap();
                (lease, json["id"].as_str().unwrap().to_string())
            })
        })
        .map(|h| h.join().unwrap())
        .collect();
    let ids: std::collections::BTreeSet<_> = answers.iter().map(|(_, id)| id).collect();
    assert_eq!(ids.len(), 1, "{answers:?}");
    assert!(
        answers.iter().all(|(l, _)| l == "held" || l == "waited"),
        "{answers:?}"
    );
    assert_eq!(db.counts(&t), crate::support::counts(1, 1, 1));
}

/// Through `serve`: a holder whose lease was replaced while it was inside its transaction
/// (held there by a table lock) must not delete the newer token on release; the served
/// `lease-unsafe-release` variant does (plain DEL): the negative control.
#[test]
fn a_served_holder_never_deletes_a_newer_lease_but_the_unsafe_variant_does() {
    let Some(url) = redis_url() else { return };
    let Some(db) = TestDb::postgres("lease_serve_release") else {
        return;
    };
    let config = LeaseConfig::new(&url, Duration::from_secs(5)).unwrap();
    let mut redis = RedisLeases::connect(&config).unwrap();
    for (extra, newer_survives) in [
        (&[][..], true),
        (&["--variant", "lease-unsafe-release"][..], false),
    ] {
        let mut args = vec![
            "--lease",
            url.as_str(),
            "--pool-size",
            "1",
            "--min-idle",
            "1",
        ];
        args.extend_from_slice(extra);
        let s = crate::serve::serve(&db.url().unwrap(), &args);
        let t = tenant();
        let key = lease_key(&t, "k");
        let mut holder = db.pg_config().unwrap().connect(postgres::NoTls).unwrap();
        holder
            .batch_execute("BEGIN; LOCK TABLE idempotency_receipts IN ACCESS EXCLUSIVE MODE")
            .unwrap();
        let request = {
            let (base, t) = (s.base.clone(), t.clone());
            std::thread::spawn(move || {
                post_b0(&base, &t, "k")
                    .map(|r| r.status())
                    .map_err(|e| e.to_string())
            })
        };
        // The request took its lease and waits on the lock inside its transaction.
        let mut taken = false;
        for _ in 0..500 {
            if redis.holder(&key).unwrap().is_some() {
                taken = true;
                break;
            }
            std::thread::park_timeout(Duration::from_millis(10));
        }
        assert!(taken, "the request never took its lease");
        // Its lease expires (as after a pause past the TTL) and a newer holder takes it.
        assert!(redis.delete(&key).unwrap());
        assert!(redis
            .acquire(&key, "newer", Duration::from_secs(5))
            .unwrap());
        holder.batch_execute("COMMIT").unwrap();
        assert_eq!(request.join().unwrap(), Ok(201));
        let left = redis.holder(&key).unwrap();
        assert_eq!(
            left.as_deref() == Some("newer"),
            newer_survives,
            "{extra:?}: {left:?}"
        );
        redis.delete(&key).unwrap();
    }
}

/// A Redis that accepts connections but never answers (hung, overloaded): after the timeout
/// the create goes on without the lease.
#[test]
fn a_silent_redis_means_no_lease_after_the_timeout_never_a_failure() {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("redis://{}/1", silent.local_addr().unwrap());
    let db = TestDb::sqlite();
    let path = db.sqlite_path().unwrap().display().to_string();
    let (code, out, stderr) = create_behind_lease(&path, "A", "k1", &url);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(out["outcome"], "created", "{out}");
    assert_eq!(out["lease"]["lease"], "no-lease", "{out}");
    drop(silent);
}
