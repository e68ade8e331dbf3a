//! A kill fault's two halves outside the conductor: [`ServiceCrash`] freezes, kills and
//! restarts the runner-started service that serves a racer, and [`Restarts`] holds the
//! racers' retries while one is down, so that a retry meets the restarted service, not a
//! closed port.

use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::blackbox::service::Services;

/// How many services are down for a restart; racers wait for none before a retry.
#[derive(Default)]
pub(super) struct Restarts {
    down: Mutex<usize>,
    back: Condvar,
}

impl Restarts {
    fn begin(&self) {
        *self.down.lock().unwrap_or_else(|p| p.into_inner()) += 1;
    }

    fn end(&self) {
        let mut d = self.down.lock().unwrap_or_else(|p| p.into_inner());
        *d = d.saturating_sub(1);
        self.back.notify_all();
    }

    /// Waits until no service is down, or `bound` passes (a restart is bounded by its
    /// service's `ready_timeout_ms`; the bound only keeps a racer from waiting for ever).
    pub(super) fn wait(&self, bound: Duration) {
        let until = Instant::now() + bound;
        let mut d = self.down.lock().unwrap_or_else(|p| p.into_inner());
        while *d > 0 {
            let now = Instant::now();
            if now >= until {
                return;
            }
            d = self
                .back
                .wait_timeout(d, until - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

/// The services of a run as a conductor's [`crate::interpose::conduct::Crash`]: racer `i`
/// of the wave is served by the service at `bases[i]`.
pub(super) struct ServiceCrash<'a> {
    pub(super) services: &'a mut Services,
    pub(super) bases: Vec<String>,
    pub(super) restarts: &'a Restarts,
    /// The service frozen by the last [`ServiceCrash::freeze`], by index.
    frozen: Option<usize>,
}

impl<'a> ServiceCrash<'a> {
    pub(super) fn new(
        services: &'a mut Services,
        bases: Vec<String>,
        restarts: &'a Restarts,
    ) -> Self {
        ServiceCrash {
            services,
            bases,
            restarts,
            frozen: None,
        }
    }
}

impl crate::interpose::conduct::Crash for ServiceCrash<'_> {
    fn freeze(&mut self, racer: usize) -> Result<(), String> {
        let base = self
            .bases
            .get(racer)
            .ok_or_else(|| format!("no racer {racer} in this wave"))?;
        let index = self
            .services
            .index_of(base)
            .ok_or_else(|| format!("{base} is not a service the runner started"))?;
        self.restarts.begin();
        if !self.services.signal(index, libc::SIGSTOP) {
            self.restarts.end();
            return Err(format!(
                "service {} is not running, so it cannot be killed",
                self.services.records[index].name
            ));
        }
        self.frozen = Some(index);
        Ok(())
    }

    fn kill_and_restart(&mut self, _racer: usize) -> Result<String, String> {
        let Some(index) = self.frozen.take() else {
            return Err("no service was frozen".into());
        };
        let name = self.services.records[index].name.clone();
        let began = Instant::now();
        let said = match self.services.kill(index) {
            None => Err(format!("service {name} was gone before the kill")),
            Some(old) => match self.services.restart(index) {
                Ok(()) => {
                    let r = &self.services.records[index];
                    Ok(format!(
                        "SIGKILL to service {name} (pid {old}); started again as pid {}, ready {} ms after the kill",
                        r.os_pid,
                        began.elapsed().as_millis()
                    ))
                }
                Err(e) => Err(format!(
                    "SIGKILL to service {name} (pid {old}); it did not start again: {e}"
                )),
            },
        };
        self.restarts.end();
        said
    }

    fn exited(&mut self) -> Vec<String> {
        self.services
            .exited()
            .into_iter()
            .map(|e| e.to_string())
            .collect()
    }
}
