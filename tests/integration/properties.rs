//! The property suites pass on both real protocols on every backend, and catch the wrong
//! implementations 1 and 2 of docs/PROTOCOL.md §8 with a shrunk counterexample.

use ticketflow_core::variants::Implementation;
use ticketflow_core::variants::Variant;
use ticketflow_harness::props::{self, SuiteBackend, SuiteConfig, SuiteResult};
use ticketflow_harness::verdict::Verdict;

use crate::support::pg_url;

fn backends() -> Vec<SuiteBackend> {
    let mut v = vec![SuiteBackend::Sqlite];
    v.extend(pg_url().map(|url| SuiteBackend::Postgres {
        server: crate::support::server(&url),
    }));
    v
}

fn config(suite: &str, cases: u32) -> SuiteConfig {
    // No persistence from tests: a regression file is for failures of real runs.
    SuiteConfig::new(suite, cases, None, false)
}

fn assert_pass(r: &SuiteResult) {
    assert_eq!(
        r.verdict,
        Verdict::Pass,
        "{} on {} with {} (seed {}): {:?}\n{}",
        r.suite,
        r.backend_name(),
        r.implementation.name(),
        r.seed,
        r.reason,
        r.counterexample.as_deref().unwrap_or("")
    );
}

#[test]
fn fingerprint_properties_hold() {
    assert_pass(&props::fingerprint::run(&config("fingerprint", 256)));
}

#[test]
fn sequential_histories_match_the_model_on_every_backend() {
    for b in backends() {
        for implementation in Implementation::PROTOCOLS {
            let c = config("sequential", props::sequential::DEFAULT_CASES);
            assert_pass(&props::sequential::run(&b, implementation, &c));
        }
    }
}

#[test]
fn concurrent_histories_are_linearizable_on_every_backend() {
    for b in backends() {
        for implementation in Implementation::PROTOCOLS {
            let c = config("concurrent", props::concurrent::DEFAULT_CASES);
            assert_pass(&props::concurrent::run(&b, implementation, &c));
        }
    }
}

/// The suite must FAIL on `variant`, with a shrunk counterexample, on every backend.
fn assert_caught(
    suite: &str,
    variant: Variant,
    run: impl Fn(&SuiteBackend, &SuiteConfig) -> SuiteResult,
) {
    for b in backends() {
        let r = run(&b, &config(suite, 64));
        assert_eq!(
            r.verdict,
            Verdict::Fail,
            "{suite} did not catch {variant} on {}",
            b.backend()
        );
        let example = r.counterexample.expect("a shrunk counterexample");
        println!(
            "{suite} caught {variant} on {} (seed {}):\n{}\n{example}",
            b.backend(),
            r.seed,
            r.reason.unwrap_or_default()
        );
    }
}

#[test]
fn sequential_suite_catches_key_only_comparison() {
    let v = Variant::KeyOnly;
    assert_caught("sequential", v, |b, c| {
        props::sequential::run(b, Implementation::Variant(v), c)
    });
}

#[test]
fn sequential_suite_catches_a_noncanonical_fingerprint() {
    let v = Variant::NoncanonicalFingerprint;
    assert_caught("sequential", v, |b, c| {
        props::sequential::run(b, Implementation::Variant(v), c)
    });
}

#[test]
fn concurrent_suite_catches_split_transactions() {
    let v = Variant::SplitTransactions;
    assert_caught("concurrent", v, |b, c| {
        props::concurrent::run(b, Implementation::Variant(v), c)
    });
}

#[test]
fn shrinking_reaches_a_small_counterexample_for_key_only() {
    let r = props::sequential::run(
        &SuiteBackend::Sqlite,
        Implementation::Variant(Variant::KeyOnly),
        &config("sequential", 64),
    );
    // The minimal failure is two creates on one key with different requests.
    let example = r.counterexample.unwrap();
    assert_eq!(
        example.matches("Create").count() + example.matches("Retry").count(),
        2,
        "{example}"
    );
}
