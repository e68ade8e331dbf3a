"""The fingerprint must match every golden vector of docs/PROTOCOL.md §2.5 byte for byte.

Run: python test_fingerprint.py [PATH_TO_fingerprints.json]
(default: $TFV_VECTORS, else this repository's tests/data/fingerprints.json).
"""

import json
import os
import sys
import unittest
from pathlib import Path

from fingerprint import canonical_json, fingerprint


def vectors_path() -> Path:
    explicit = os.environ.get("TFV_VECTORS")
    if explicit:
        return Path(explicit)
    here = Path(__file__).resolve().parent
    for parent in [here, *here.parents]:
        candidate = parent / "tests" / "data" / "fingerprints.json"
        if candidate.is_file():
            return candidate
    raise FileNotFoundError("tests/data/fingerprints.json not found; set TFV_VECTORS")


class GoldenVectors(unittest.TestCase):
    def test_every_vector_matches(self):
        vectors = json.loads(vectors_path().read_text(encoding="utf-8"))["vectors"]
        self.assertGreater(len(vectors), 0)
        for i, v in enumerate(vectors):
            with self.subTest(vector=i):
                self.assertEqual(canonical_json(v), v["canonical_json"])
                self.assertEqual(fingerprint(v), v["sha256_hex"])

    def test_field_order_does_not_change_the_fingerprint(self):
        a = {"actor_id": "u1", "title": "t", "body": "b", "priority": "low"}
        b = {"priority": "low", "body": "b", "title": "t", "actor_id": "u1"}
        self.assertEqual(fingerprint(a), fingerprint(b))

    def test_any_field_change_changes_the_fingerprint(self):
        base = {"actor_id": "u1", "title": "t", "body": "b", "priority": "low"}
        for field in base:
            with self.subTest(field=field):
                self.assertNotEqual(fingerprint(base), fingerprint({**base, field: base[field] + "x"}))


if __name__ == "__main__":
    if len(sys.argv) > 1:
        os.environ["TFV_VECTORS"] = sys.argv.pop(1)
    unittest.main(verbosity=1)
