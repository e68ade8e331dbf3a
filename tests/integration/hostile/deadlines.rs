//! A silent PostgreSQL, a stalling proxy, a locked barrier table and a count that never returns: each is reported within its bound, naming what was waited for.
