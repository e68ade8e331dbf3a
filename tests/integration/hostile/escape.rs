//! Secrets in paths and echoed answers are masked, URLs redacted in refusals, control characters escaped, Markdown from a target rendered as code.
