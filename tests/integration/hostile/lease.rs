//! A stuck lease with a huge TTL: requests on its key wait without a database session; fresh keys still get 201; out-of-range Redis db and TTL refused at start.

use std::time::{Duration, Instant};

use crate::serve::{call, serve, Reply, B0};
use crate::support::{counts, redis_up_at, repo_path, TestDb, UNREACHABLE_PG};

/// The Redis database these tests plant leases in (no other test uses db 10).
const REDIS: &str = "redis://127.0.0.1:6379/10";

/// A tenant no other test or run uses: this module's lease keys live under it.
fn tenant() -> String {
    format!("tfv-hostile-lease-{}", uuid::Uuid::new_v4().simple())
}

fn redis() -> redis::Connection {
    redis::Client::open(REDIS)
        .unwrap()
        .get_connection_with_timeout(Duration::from_secs(2))
        .unwrap()
}

fn post(base: &str, tenant: &str, key: &str) -> Reply {
    call(
        "POST",
        &format!("{base}/v1/tickets"),
        &[("X-Tenant-Id", tenant), ("Idempotency-Key", key)],
        Some(B0),
    )
}

/// Polls, up to 10 s, until some client of db 10 last ran a `GET` (a request of `serve`
/// looking at the planted lease): the requests on the stuck key are waiting.
fn wait_for_lease_pollers(admin: &mut redis::Connection) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        let list: String = redis::cmd("CLIENT").arg("LIST").query(admin).unwrap();
        if list
            .lines()
            .any(|l| l.contains(" db=10 ") && l.contains(" cmd=get "))
        {
            return;
        }
        std::thread::yield_now();
    }
    panic!("no request of serve ever looked at the planted lease");
}

/// A lease left by a crashed holder, with a TTL of an hour: the requests on its key wait
/// without a database session and end with 503 `lease-held` (nothing written) before their
/// request timeout, while more of them than the pool has sessions are waiting; fresh keys
/// still get 201 meanwhile.
#[test]
fn a_stuck_lease_holds_no_session_and_fresh_keys_still_get_201() {
    if !redis_up_at(REDIS) {
        return;
    }
    let Some(db) = TestDb::postgres("hostile_lease") else {
        return;
    };
    let s = serve(
        &db.url().unwrap(),
        &[
            "--lease",
            REDIS,
            "--lease-ttl-ms",
            "3600000",
            "--pool-size",
            "2",
            "--min-idle",
            "2",
            "--pool-timeout-ms",
            "1000",
            "--request-timeout-ms",
            "4000",
        ],
    );
    let t = tenant();
    let stuck = ticketflow_core::lease::lease_key(&t, "K");
    let mut admin = redis();
    let planted: Option<String> = redis::cmd("SET")
        .arg(&stuck)
        .arg("token-of-a-crashed-holder")
        .arg("NX")
        .arg("PX")
        .arg(3_600_000u64)
        .query(&mut admin)
        .unwrap();
    assert!(planted.is_some());
    let started = Instant::now();
    let waiting: Vec<_> = (0..4)
        .map(|_| {
            let (base, t) = (s.base.clone(), t.clone());
            std::thread::spawn(move || (post(&base, &t, "K"), Instant::now()))
        })
        .collect();
    wait_for_lease_pollers(&mut admin);
    for n in 0..3 {
        let r = post(&s.base, &t, &format!("fresh-{n}"));
        assert_eq!(r.status, 201, "fresh key {n} while K is stuck: {}", r.json);
    }
    for w in waiting {
        let (r, at) = w.join().unwrap();
        assert_eq!(r.status, 503, "{}", r.json);
        assert_eq!(r.json["cause"], "lease-held", "{}", r.json);
        assert_eq!(r.json["written"], "nothing", "{}", r.json);
        assert_eq!(r.retry_after.as_deref(), Some("1"));
        assert!(
            at - started < Duration::from_millis(4000),
            "answered after {:?}, past the request timeout",
            at - started
        );
    }
    assert_eq!(db.counts(&t), counts(3, 3, 3));
    // The lease gone (expired, or removed by an operator), the key serves again.
    let _: i64 = redis::cmd("DEL").arg(&stuck).query(&mut admin).unwrap();
    let r = post(&s.base, &t, "K");
    assert_eq!(r.status, 201, "{}", r.json);
    assert_eq!(db.counts(&t), counts(4, 4, 4));
}

/// Runs the binary with `args`: exit code and stderr; killed (and reported as -1) after 20 s,
/// so an option that is wrongly accepted ends the test instead of running a whole command.
fn run(args: &[&str]) -> (i32, String) {
    // In a directory of its own: a wrongly accepted `verify` writes its report there.
    let dir = tempfile::tempdir().unwrap();
    super::run_bounded(dir.path(), args, &[], Duration::from_secs(20))
}

/// A TTL of 0, above the documented bound (an hour), of 2^64-1 ms or past u64, and a Redis
/// database out of the server's range are refused at start with exit 2, by every command that
/// takes a lease, before any database is touched; a refused URL never shows its password.
#[test]
fn lease_ttls_out_of_bounds_and_a_redis_db_out_of_range_are_refused_at_start() {
    let scenario = repo_path("scenarios/n-lease-expiry.toml");
    let scenario = scenario.to_str().unwrap();
    let commands: [&[&str]; 5] = [
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--database-url",
            UNREACHABLE_PG,
        ],
        &[
            "create",
            "--database-url",
            UNREACHABLE_PG,
            "--tenant",
            "A",
            "--key",
            "k",
        ],
        &["scenario", "run", scenario, "--pg-url", UNREACHABLE_PG],
        &["bench", "--pg-url", UNREACHABLE_PG, "--quick"],
        &["verify", "--pg-url", UNREACHABLE_PG, "--no-kill-matrix"],
    ];
    let bad_ttls = [
        ("0", "above 0"),
        ("3600001", "at most"),
        ("18446744073709551615", "at most"),
        ("18446744073709551616", "lease-ttl-ms"),
    ];
    for command in commands {
        for (ttl, says) in bad_ttls {
            let mut args = command.to_vec();
            args.extend([
                "--lease",
                "redis://127.0.0.1:6379/10",
                "--lease-ttl-ms",
                ttl,
            ]);
            let (code, stderr) = run(&args);
            assert_eq!(code, 2, "{args:?}: {stderr}");
            assert!(stderr.contains(says), "{args:?}: {stderr}");
        }
        let mut args = command.to_vec();
        args.extend(["--lease", "redis://:s3kr1t@127.0.0.1:6379/10"]);
        let (code, stderr) = run(&args);
        assert_eq!(code, 2, "{args:?}: {stderr}");
        assert!(!stderr.contains("s3kr1t"), "{args:?}: {stderr}");
        if redis_up_at(REDIS) {
            let mut args = command.to_vec();
            args.extend(["--lease", "redis://127.0.0.1:6379/4096"]);
            let (code, stderr) = run(&args);
            assert_eq!(code, 2, "{args:?}: {stderr}");
            assert!(
                stderr.contains("database 4096") && stderr.contains("range"),
                "{args:?}: {stderr}"
            );
        }
    }
}
