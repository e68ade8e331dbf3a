//! The one integration-test binary. PostgreSQL tests use `DATABASE_URL` (when it is a
//! postgres:// URL) or the loopback default, each in a scratch database of its own; with no
//! server they skip with a printed reason locally and fail when `CI` is set.

mod cli;
mod fingerprint; // golden vectors and the `fingerprint` command
mod negative_controls; // every scenario check can FAIL on the fault it is for
mod protocol; // create / get / update behaviour, run on every backend
mod scenarios; // the shipped scenario files PASS on both backends
mod support; // backends, scratch databases, request helpers // the binary: exit codes, JSON output, bad input
