//! The protobuf code is generated once and committed
//! (`protocol/src/gen`, `api/src/gen`), so building byom needs no protobuf
//! compiler and none of its crates. This test generates it again from the
//! `.proto` files and fails when the committed code differs;
//! `BYOM_REGENERATE=1 cargo test -p byom-tests --test protos` rewrites it.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace")
        .to_path_buf()
}

/// Compares `generated` (in a temp dir) with the committed `file`, or
/// rewrites `file` when asked to.
fn check(generated: &Path, file: &Path) {
    let want = std::fs::read_to_string(generated).expect("generated code");
    if std::env::var_os("BYOM_REGENERATE").is_some() {
        std::fs::write(file, &want).expect("rewrite the committed code");
        return;
    }
    let have = std::fs::read_to_string(file).unwrap_or_default();
    assert!(
        have == want,
        "{} is not what its .proto gives: run BYOM_REGENERATE=1 cargo test -p byom-tests --test protos and commit it",
        file.display()
    );
}

#[test]
fn the_committed_protocol_messages_are_what_byom_proto_gives() {
    let out = tempfile::tempdir().unwrap();
    let protos = root().join("protocol/proto");
    let fds = protox::compile(["byom.proto"], [&protos]).unwrap();
    prost_build::Config::new()
        .out_dir(out.path())
        .compile_fds(fds)
        .unwrap();
    check(
        &out.path().join("byom.v1.rs"),
        &root().join("protocol/src/gen/byom.v1.rs"),
    );
}

#[test]
fn the_committed_admin_api_is_what_admin_proto_gives() {
    let out = tempfile::tempdir().unwrap();
    let protos = root().join("protocol/proto");
    let fds = protox::compile(["admin.proto"], [&protos]).unwrap();
    tonic_prost_build::configure()
        .extern_path(".byom.v1", "::byom_protocol::pb")
        .build_client(true)
        .build_server(true)
        .out_dir(out.path())
        .compile_fds(fds)
        .unwrap();
    check(
        &out.path().join("byom.admin.v1.rs"),
        &root().join("api/src/gen/byom.admin.v1.rs"),
    );
}
