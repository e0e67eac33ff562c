//! Generates the gRPC code from `proto/` with protox (a Rust protobuf compiler), so no system
//! `protoc` is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = protox::compile(["berth/agent/v1/agent.proto"], ["proto"])?;
    tonic_prost_build::configure().compile_fds(files)?;
    println!("cargo:rerun-if-changed=proto");
    Ok(())
}
