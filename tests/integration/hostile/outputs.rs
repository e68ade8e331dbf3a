//! Report directories with foreign files and symlinks, and traversal names: the tool removes only what its manifest lists and writes only inside its output directory.
