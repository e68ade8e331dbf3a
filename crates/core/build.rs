//! Sets our own cfg `ticketflow_loom` on every target of this package (ticketflow-core) when the `loom` feature
//! is on (`scripts/loom.sh`). A feature, not `RUSTFLAGS="--cfg ticketflow_loom"`: RUSTFLAGS
//! reach every dependency and so rebuild all of them, while a feature rebuilds only this
//! crate and `loom`'s own few, so the loom lane reuses the dependencies already compiled.
fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    if std::env::var_os("CARGO_FEATURE_LOOM").is_some() {
        println!("cargo::rustc-cfg=ticketflow_loom");
    }
}
