//! What the process asks of the operating system for itself.

/// Raises this process's soft `RLIMIT_NOFILE` (open file descriptors) to its hard limit, as
/// most servers do at start-up (POSIX `getrlimit`/`setrlimit`), and returns the soft limit in
/// force afterwards; `None` when it cannot be read. A limit that cannot be raised is left as
/// it is (its value is returned).
pub fn raise_nofile() -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit read and write the struct we pass; no other memory.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return None;
        }
        if limit.rlim_cur < limit.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: limit.rlim_max,
                rlim_max: limit.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                limit = raised;
            }
        }
    }
    Some(limit.rlim_cur)
}
