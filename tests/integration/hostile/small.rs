//! The small ones: read-only database is 503 with nothing written, body timeout writes nothing, serve binds before migrating, one exit code for a URL without a host, template errors are load errors.
