"""Request fingerprint of docs/PROTOCOL.md §2: SHA-256 of the canonical JSON of the four intent fields.

Python's own encoder with sorted keys, compact separators and ``ensure_ascii`` already writes
exactly the canonical form (non-ASCII and U+007F as lower-case ``\\uXXXX``, surrogate pairs above
U+FFFF, short escapes for ``\\n \\r \\t \\b \\f``, ``/`` left alone); test_fingerprint.py holds
it to the shared golden vectors so a change of encoder settings cannot slip through.
"""

import hashlib
import json

INTENT_FIELDS = ("actor_id", "body", "priority", "title")


def canonical_json(request: dict) -> str:
    """The canonical text of exactly the intent fields of ``request`` (other keys ignored)."""
    intent = {field: request[field] for field in INTENT_FIELDS}
    return json.dumps(intent, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def fingerprint(request: dict) -> str:
    """Lower-case hex SHA-256 (64 characters) of :func:`canonical_json`."""
    return hashlib.sha256(canonical_json(request).encode("utf-8")).hexdigest()
