//! The one integration-test binary. PostgreSQL tests use `DATABASE_URL` (when it is a
//! postgres:// URL) or the loopback default, each in a scratch database of its own; with no
//! server they skip with a printed reason locally and fail when `CI` is set.

/// `verify` with PostgreSQL and Redis each up or down: a verdict, the report and the TOTAL
/// line with the documented exit code every time; a missing report folder is created.
mod availability;
/// `ticketflow bench --quick`: every row with a ratio.
mod bench;
/// Black-box scenarios: HTTP racers against two `ticketflow serve` processes PASS, against a
/// served wrong implementation FAIL; an unprovable barrier is never PASS.
mod blackbox;
/// Racer counts the backend cannot hold (file descriptors, connection slots) are refused
/// before anything is created.
mod capacity;
/// `ticketflow check` against `serve`: the protocol passes, a sequence-only variant fails and
/// shrinks to a file that replays the FAIL; model-judged scenario files.
mod check;
/// The binary: exit codes, JSON output, bad input, logs, interrupts.
mod cli;
/// The documentation's relative links and anchors resolve; README.md stays short.
mod docs;
/// Faults in and around the transaction: pauses, crashes, terminated backends, timeouts.
mod faults;
/// Golden vectors and the `fingerprint` command.
mod fingerprint;
/// Hostile servers, targets, inputs and kills: every wait has a deadline, every file written
/// stays the tool's, the target's database is only read, no secret or control byte escapes,
/// nothing outlives a kill.
mod hostile;
/// The interposer: PostgreSQL and Redis traffic through it untouched outside a run; a
/// conducted race explored exhaustively finds check-then-insert every time and replays it by id;
/// a pipelining client is stepped one command at a time.
mod interpose;
/// The interposer's bounds answered as the servers answer them: the startup deadline, invalid
/// startup packets, the connection cap's refusal, the message bound's error; Redis pub/sub and
/// `QUIT` relayed as the server sends them.
mod interpose_bounds;
/// A failing interposed exploration's Mermaid diagram and isolation-tester spec follow the
/// schedule's order and the tester's grammar; step results show the store's answer (`nil`).
mod interpose_evidence;
/// Fair to polling: a duplicate that polls the store gets no false FAIL in 20 invocations;
/// without the poll rule it does.
mod interpose_fairness;
/// Faults at a step through the interposer: cut before and after the server converge on
/// `serve`, the lost-ack variant fails only with the cut, keys left in progress, faults that
/// never strike; a service whose driver cancels a lost session (pgx-style) passes a cut after
/// COMMIT.
mod interpose_faults;
/// Kills at a step: serve killed after each step converges, claim-never-expires is left in
/// progress, a Redis lock without expiry is stuck, a service that exits on a cut is named
/// with its status and stderr, `env` and `${NAME}` in service commands.
mod interpose_kill;
/// Schedules side by side (`--parallel`): the same schedules as one at a time, a wrong
/// implementation still FAILs with a schedule that replays, and a scenario whose lanes would
/// share state runs one at a time and says why.
mod interpose_lanes;
/// Pass-through keeps pipelining: Redis commands, PostgreSQL Queries and Parse/Bind/Execute/Sync
/// groups written at once reach the server at once, without waiting for each reply; a run
/// that begins behind a pipeline holds the next command once the pipeline's replies are in.
mod interpose_passthrough;
/// `ticketflow interpose` as a process in front of a service the test starts: a scenario naming
/// its control address PASSes the real serve and FAILs split-transactions; pass-through, one
/// controller at a time, SIGTERM, and setup errors for a wrong or absent interposer.
mod interpose_standalone;
/// Served wrong implementations only exploration finds: exploration FAILs each and replays its
/// schedule; the real protocols PASS the same files; the first point's result is recorded.
mod interpose_variants;
/// SIGINT in each phase of `verify` and in `bench`: no scratch database left, printed lines
/// kept.
mod interrupts;
/// Layers: store/, serve and the core never import the harness; ARCHITECTURE.md's code map
/// names every source file.
mod layers;
/// The Redis lease in front of the receipt: taken and released by token, waits for the
/// receipt, never deletes another holder's lease, never fails a create when Redis is down.
mod lease;
/// Scenarios with Redis in the loop: expiry, two tokens, flush, a simulated restart and Redis
/// down PASS with both protocols; the lease variants FAIL the check each is for; negative
/// controls for the runner's own checks; PENDING (exit 3 only under --require-redis).
mod lease_scenarios;
/// Logs never contain a body, with a negative control.
mod logs;
/// The in-memory store: protocol behaviour, lock waits, savepoints, 25P02 (std only; under
/// `--features loom` its types are loom's and work only inside a model).
#[cfg(not(feature = "loom"))]
mod memory;
/// Every scenario check can FAIL on the fault it is for.
mod negative_controls;
/// Property suites: fingerprint, sequential model, concurrent linearizability.
mod properties;
/// create / get / update behaviour, run on every store × every real protocol.
mod protocol;
/// Targets whose effects live in Redis: a Redis count catches an effect applied twice behind
/// one id, retries cannot starve a held racer, and the CLIENT PAUSE barrier holds every racer's
/// first write (or is PENDING).
mod redis_targets;
/// report.json schema, JUnit shape, exit codes, --filter, diff-friendly tables, isolation specs.
mod report;
/// The shipped scenario files PASS over the whole matrix; forced paths; retries.
mod scenarios;
/// Scratch databases: migrated template copies, recycling that never shares rows, parallel
/// runs each at their own barrier.
mod scratch;
/// The set-up scripts against fake programs: pg-up reloads after adding its trust lines and
/// checks the login; tools-up finds and installs what CI and the tests call.
mod scripts;
/// `ticketflow serve`: 201 / replay header / 409 problem+json / 400 / 422, GET and PATCH
/// scoped by tenant, SQLite, SIGTERM.
mod serve;
/// Sessions never stay poisoned: a failed BEGIN ends the transaction it met; the pool's
/// check refuses a session inside a transaction.
mod sessions;
/// A server short of sessions makes runs PENDING (never FAIL, never "killed") in `scenario
/// run`, `verify` and the kill matrix, and they PASS again when the sessions are freed.
mod shortage;
/// `ticketflow soak`: fault-free PASS, served wrong implementations and planted faults FAIL
/// the invariant they break, an unreachable server is PENDING.
mod soak;
/// `target init`'s starter set against shop services with one known bug each.
mod starter;
/// Backends, scratch databases, request helpers.
mod support;
/// Tenant isolation: every statement on tenant rows filters by tenant.
mod tenancy;
/// Each wrong implementation (docs/PROTOCOL.md §8) shows its symptom; the gates catch the wrong
/// `on-conflict` variant.
mod variants;
