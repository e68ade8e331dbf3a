//! Child processes that die with this process: every process the tool starts (the services of
//! a black-box run, soak or bench, `ticketflow worker` racers, pgbench, git) is started by
//! [`spawn`] or [`output`].
//!
//! On Linux the child asks the kernel for `SIGKILL` when its parent dies
//! (`prctl(PR_SET_PDEATHSIG, SIGKILL)`, run between `fork` and `exec`), so even a `SIGKILL` of
//! this process, which runs no cleanup, leaves no child behind. Right after the `prctl` the
//! child checks that its parent is still this process (`getppid()`): a parent that died
//! between the `fork` and the `prctl` would otherwise never signal it; the child then exits
//! before `exec`, and the spawn fails.
//!
//! The kernel sends that signal when the *thread* that forked the child exits, not only the
//! process. A child spawned from a short-lived thread (a racer thread, a job thread of
//! `verify`) would be killed when that thread ends, while its owner may still use it. So a
//! child is forked either on the main thread (it lives as long as the process) or on one
//! spawner thread started on first use that never exits.
//!
//! Grandchildren (what a service command such as `sh -c …` starts itself) are not covered:
//! a service command should `exec` its server.
//!
//! On other systems [`spawn`] is a plain `Command::spawn`: the interrupt handler
//! ([`crate::cleanup`]) still stops the children on Ctrl-C or SIGTERM, but a `SIGKILL` may leave
//! them running.

use std::io;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};

/// A command for the spawner thread, and where to send the child back.
type Request = (Command, mpsc::Sender<io::Result<Child>>);

/// Starts `command` as a child that is killed (`SIGKILL`) when this process dies (module
/// docs), from the main thread or the spawner thread.
///
/// Will return `Err` if the program cannot be started (not found, not executable), or, on
/// Linux, if this process died while the child was being set up.
pub fn spawn(mut command: Command) -> io::Result<Child> {
    arm(&mut command);
    if on_main_thread() {
        return command.spawn();
    }
    let (reply, answer) = mpsc::channel();
    spawner()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .send((command, reply))
        .map_err(|_| io::Error::other("the spawner thread is gone"))?;
    answer
        .recv()
        .map_err(|_| io::Error::other("the spawner thread is gone"))?
}

/// Runs `command` to its end as [`spawn`] starts it, and collects its output as
/// [`Command::output`] does: stdin is `/dev/null`, stdout and stderr are captured (whatever
/// the caller set for them).
///
/// Will return `Err` as [`spawn`] does, or if reading its output fails.
pub fn output(mut command: Command) -> io::Result<Output> {
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    spawn(command)?.wait_with_output()
}

/// Whether the calling thread is the process's main thread (its thread id is the process id).
#[cfg(target_os = "linux")]
fn on_main_thread() -> bool {
    // SAFETY: gettid and getpid take no arguments and cannot fail.
    let (tid, pid) = unsafe { (libc::gettid(), libc::getpid()) };
    tid == pid
}

#[cfg(not(target_os = "linux"))]
fn on_main_thread() -> bool {
    true
}

/// The spawner thread's queue, the thread started on first use.
fn spawner() -> &'static Mutex<mpsc::Sender<Request>> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<Request>>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (send, requests) = mpsc::channel::<Request>();
        // The sender lives in a static, so `recv` never fails and the thread never exits:
        // the children it forks keep their parent thread for the life of the process.
        let started = std::thread::Builder::new()
            .name("ticketflow-spawner".into())
            .spawn(move || {
                while let Ok((mut command, reply)) = requests.recv() {
                    let _ = reply.send(command.spawn());
                }
            });
        if let Err(e) = started {
            tracing::warn!(error = %e, "cannot start the spawner thread");
        }
        Mutex::new(send)
    })
}

/// Makes the child of `command` ask for `SIGKILL` when this process dies, and give up if it
/// already has.
#[cfg(target_os = "linux")]
fn arm(command: &mut Command) {
    use std::os::unix::process::CommandExt as _;
    // SAFETY: getpid cannot fail.
    let parent = unsafe { libc::getpid() };
    // SAFETY: the closure runs in the child between fork and exec and calls only prctl and
    // getppid, both async-signal-safe system calls; it allocates nothing.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::getppid() != parent {
                // The parent died before the prctl: nobody would ever signal this child.
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}

#[cfg(not(target_os = "linux"))]
fn arm(_command: &mut Command) {}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn a_child_of_a_short_lived_thread_outlives_that_thread() {
        // A child spawned on a thread that then exits must keep running.
        let child = std::thread::spawn(|| {
            let mut c = Command::new("sleep");
            c.arg("5");
            spawn(c).unwrap()
        })
        .join()
        .unwrap();
        let mut child = child;
        // The thread is gone; were the child bound to it, SIGKILL would arrive at once.
        let deadline = std::time::Instant::now() + std::time::Duration::from_millis(300);
        while std::time::Instant::now() < deadline {
            assert!(
                child.try_wait().unwrap().is_none(),
                "the child died with the thread that asked for it"
            );
            std::thread::yield_now();
        }
        child.kill().unwrap();
        child.wait().unwrap();
    }

    #[test]
    fn output_captures_stdout_and_a_missing_program_is_an_error() {
        let mut c = Command::new("echo");
        c.arg("hi");
        let out = output(c).unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "hi");
        assert!(spawn(Command::new("/nonexistent/ticketflow-no-such-program")).is_err());
    }
}
