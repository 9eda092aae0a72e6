//! Compiles proto/shoal/v1/*.proto with protox (pure Rust, so a machine
//! with only the Rust toolchain builds shoal: no `protoc` binary needed) and
//! writes the file descriptor set that reflection serves and `shoalctl`
//! exports for grpcurl.
use std::path::PathBuf;

use prost::Message;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files =
        ["proto/shoal/v1/common.proto", "proto/shoal/v1/snapshot.proto", "proto/shoal/v1/shoal.proto", "proto/shoal/v1/shard.proto"];
    for f in &files {
        println!("cargo:rerun-if-changed={f}");
    }
    let fds = protox::compile(files, ["proto"])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out.join("shoal_descriptor.bin"), fds.encode_to_vec())?;
    tonic_prost_build::configure().build_client(true).build_server(true).compile_fds(fds)?;
    Ok(())
}
