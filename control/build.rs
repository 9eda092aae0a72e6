//! Generates nothing. Depending on `protoc-bin-vendored` here makes cargo
//! download a `protoc` before any build script runs; etcd-client's build
//! script then finds it through `ops/protoc` (`PROTOC` in
//! `.cargo/config.toml`), so a machine with only the Rust toolchain builds
//! the coordinator. See docs/architecture.md, "Building without protoc".

fn main() {
    // A platform the package has no binary for still builds when a protoc
    // is on PATH or in PROTOC: say so, but do not fail here.
    if let Err(e) = protoc_bin_vendored::protoc_bin_path() {
        println!("cargo::warning={e}; etcd-client's build needs a protoc on PATH or in PROTOC");
    }
    println!("cargo::rerun-if-changed=build.rs");
}
