use serde::Deserialize;
use ticketflow_core::{Fingerprint, TicketRequest};

use crate::support::repo_path;

#[derive(Deserialize)]
struct Vectors {
    vectors: Vec<Vector>,
}

#[derive(Deserialize)]
struct Vector {
    actor_id: String,
    title: String,
    body: String,
    priority: String,
    canonical_json: String,
    sha256_hex: String,
}

fn vectors() -> Vec<Vector> {
    let text = std::fs::read_to_string(repo_path("tests/data/fingerprints.json")).unwrap();
    serde_json::from_str::<Vectors>(&text).unwrap().vectors
}

#[test]
fn every_golden_vector_matches() {
    let vectors = vectors();
    assert!(
        vectors.len() >= 30,
        "the golden file has {} cases",
        vectors.len()
    );
    for (i, v) in vectors.iter().enumerate() {
        let fp = Fingerprint::of(&TicketRequest {
            actor_id: v.actor_id.clone(),
            title: v.title.clone(),
            body: v.body.clone(),
            priority: v.priority.clone(),
        });
        assert_eq!(fp.canonical, v.canonical_json, "case {i}: canonical text");
        assert_eq!(fp.hash, v.sha256_hex, "case {i}: hash");
    }
}

#[test]
fn golden_file_is_the_shared_one() {
    // The copy in tests/data must not drift from ../shared/vectors when that is present.
    let shared = repo_path("../shared/vectors/fingerprints.json");
    if let Ok(original) = std::fs::read(&shared) {
        let copy = std::fs::read(repo_path("tests/data/fingerprints.json")).unwrap();
        assert_eq!(
            copy,
            original,
            "tests/data/fingerprints.json differs from {}",
            shared.display()
        );
    }
}

#[test]
fn fingerprint_command_prints_canonical_text_and_hash() {
    let v = &vectors()[0];
    // Keys reordered and pretty-printed: the fingerprint must not change.
    let input = format!(
        "{{\n  \"priority\": {:?},\n  \"title\": {:?},\n  \"body\": {:?},\n  \"actor_id\": {:?}\n}}",
        v.priority, v.title, v.body, v.actor_id
    );
    let out = crate::cli::run_cli(&["fingerprint"], &input);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let json: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(json["canonical"], v.canonical_json.as_str());
    assert_eq!(json["sha256"], v.sha256_hex.as_str());
}
