//! `ticketflow`: the command line. It parses arguments ([`cli::args`]) and dispatches each
//! subcommand to [`cli::commands`], which calls the library and maps results to documented
//! exit codes; no SQL or protocol logic lives here.
//!
//! Exit codes: 0 success; 1 a FAIL verdict or a database/runtime error; 2 usage error, invalid
//! input, a bad scenario file or a given database URL that cannot be parsed; 3 PENDING under
//! `--require-postgres` or at a given PostgreSQL URL; 4 conflict (HTTP 409);
//! 5 not found (HTTP 404); 128 + the signal's number when ended by a signal (130 Ctrl-C, 143
//! SIGTERM, 129 SIGHUP; 141 when stdout's reader is gone; see [`ticketflow_harness::cleanup`]).

mod cli;

use std::io::Write as _;
use std::process::ExitCode;

use clap::Parser;

use cli::args::{Cli, Command, ScenarioCommand, TargetCommand};
use cli::commands::{self as run_cmd, database_url, CliResult};
use ticketflow_harness::cleanup::{self, Kind};

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(ticketflow::logging::filter(
            std::env::var("TICKETFLOW_LOG").ok().as_deref(),
        ))
        .with_writer(std::io::stderr)
        // Colour codes only on a terminal: a log file or a collector gets plain fields.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    // On Ctrl-C, SIGTERM or SIGHUP (or a closed stdout), stop the services and drop the
    // scratch databases of runs in progress before exiting with 128 + the signal's number.
    // Never `eprintln!` there: it panics on a closed stderr and would end the handler.
    let _ = cleanup::install_signal_handler(|undone| {
        let dropped: Vec<&str> = undone
            .iter()
            .filter(|u| u.kind == Kind::ScratchDatabase)
            .map(|u| u.name.as_str())
            .collect();
        if !dropped.is_empty() {
            let _ = writeln!(
                std::io::stderr(),
                "ticketflow: interrupted; dropped scratch databases {}",
                dropped.join(", ")
            );
        }
    });
    let code = run(Cli::parse()).unwrap_or_else(|f| {
        if !cleanup::interrupted() {
            // A message may quote a target's answer or a scenario's secret.
            eprintln!(
                "ticketflow: {}",
                ticketflow_harness::contain::terminal(&f.message)
            );
        }
        f.code
    });
    // Dropping the scratch databases makes an interrupted run fail and return here; the
    // handler is about to exit with 130, so do not race it with another exit code.
    cleanup::hold_if_interrupted();
    ExitCode::from(code)
}

fn run(cli: Cli) -> CliResult {
    match cli.command {
        Command::Fingerprint => run_cmd::fingerprint(),
        Command::Create(args) => run_cmd::create(&database_url(&args.db)?, args),
        Command::Get(args) => run_cmd::get(&database_url(&args.db)?, args),
        Command::Update(args) => run_cmd::update(&database_url(&args.db)?, args),
        Command::Prune(args) => run_cmd::prune(&database_url(&args.db)?, args),
        Command::Verify(args) => run_cmd::verify(args),
        Command::Serve(args) => run_cmd::serve(&database_url(&args.db)?, args),
        Command::Interpose(args) => run_cmd::interpose(args),
        Command::Bench(args) => run_cmd::bench(args),
        Command::Soak(args) => run_cmd::soak(args),
        Command::Scenario {
            command: ScenarioCommand::Run(args),
        } => run_cmd::scenario_run(args),
        Command::Target {
            command: TargetCommand::Init(args),
        } => run_cmd::target_init(args),
        Command::Check(args) => cli::check::check(args),
        Command::Worker(args) => run_cmd::worker(args),
        Command::Clean(args) => run_cmd::clean(args),
    }
}
