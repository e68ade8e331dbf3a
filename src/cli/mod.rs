//! The binary's own modules, not part of the library: the arguments and the summary lines
//! printed on stdout.

pub mod args;
pub mod check;
pub mod commands;
pub mod print;
