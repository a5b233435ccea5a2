fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=../protocol/proto/admin.proto");
    println!("cargo:rerun-if-changed=../protocol/proto/byom.proto");
    let fds = protox::compile(["admin.proto"], ["../protocol/proto"])?;
    tonic_prost_build::configure()
        .extern_path(".byom.v1", "::byom_protocol::pb")
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
