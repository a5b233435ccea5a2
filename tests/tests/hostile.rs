//! Hostile input at the gateway: malformed, oversized and out-of-place
//! frames close the offending stream or connection with an error, and the
//! server keeps serving everyone else.

use std::time::Duration;

use byom_protocol::pb::{to_daemon, ToDaemon};
use byom_tests::{Daemon, Server};

const T: Duration = Duration::from_secs(30);

async fn raw_stream(server: &Server, bytes: &[u8]) -> Result<Vec<u8>, String> {
    let ep = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    let cfg = byom_daemon::tls::pairing_config(server.ca_pin()).unwrap();
    let conn = ep
        .connect_with(cfg, server.quic_addr, byom_protocol::SERVER_NAME)
        .unwrap()
        .await
        .map_err(|e| e.to_string())?;
    let (mut send, mut recv) = conn.open_bi().await.map_err(|e| e.to_string())?;
    send.write_all(bytes).await.map_err(|e| e.to_string())?;
    let _ = send.finish();
    let r = tokio::time::timeout(Duration::from_secs(15), recv.read_to_end(1 << 20))
        .await
        .map_err(|_| "timeout".to_string())?;
    conn.close(0u32.into(), b"");
    r.map_err(|e| e.to_string())
}

fn decode(bytes: &[u8]) -> Option<ToDaemon> {
    let mut d = byom_protocol::frame::FrameDecoder::new();
    d.push(bytes);
    d.next_frame().ok().flatten()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_and_oversized_frames_do_not_hurt_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());

    // Oversized length prefix: refused before any allocation.
    let r = raw_stream(&server, &u32::MAX.to_be_bytes()).await;
    assert!(r.map(|b| b.is_empty()).unwrap_or(true));

    // A length that fits but garbage inside.
    let mut garbage = 16u32.to_be_bytes().to_vec();
    garbage.extend_from_slice(&[0xff; 16]);
    let r = raw_stream(&server, &garbage).await;
    assert!(r.map(|b| b.is_empty()).unwrap_or(true));

    // A well-formed frame that is not a pairing request: a clear error.
    let hello = byom_protocol::pb::ToServer {
        msg: Some(byom_protocol::pb::to_server::Msg::Ping(
            byom_protocol::pb::Ping { seq: 1 },
        )),
    };
    let r = raw_stream(&server, &byom_protocol::frame::encode(&hello).unwrap())
        .await
        .unwrap();
    match decode(&r).and_then(|f| f.msg) {
        Some(to_daemon::Msg::Error(e)) => assert_eq!(e.code, "unauthenticated"),
        other => panic!("expected an error frame, got {other:?}"),
    }

    // A pairing request with a bogus token and CSR.
    let pair = byom_protocol::pb::ToServer {
        msg: Some(byom_protocol::pb::to_server::Msg::Pair(
            byom_protocol::pb::PairRequest {
                token: "byom1-AAAA".into(),
                csr_pem: "nope".into(),
                ..Default::default()
            },
        )),
    };
    let r = raw_stream(&server, &byom_protocol::frame::encode(&pair).unwrap())
        .await
        .unwrap();
    assert!(matches!(
        decode(&r).and_then(|f| f.msg),
        Some(to_daemon::Msg::Error(_))
    ));

    // Truncated frame: the stream ends mid-frame.
    let mut trunc = byom_protocol::frame::encode(&pair).unwrap();
    trunc.truncate(trunc.len() / 2);
    let _ = raw_stream(&server, &trunc).await;

    // The server still pairs and runs commands.
    let mut d = Daemon::new(dir.path(), "daemon");
    d.pair(&server.token(&[]), "lap");
    d.start();
    server.wait_online("lap", true, T);
    let out = server.byom(&["exec", "lap", "--", "echo", "still fine"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "still fine\n");
}

/// Garbage where the first frame belongs closes the connection with the
/// protocol-error code and a reason, not a silent normal close.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_first_frames_close_with_the_protocol_error_code() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let ep = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    let cfg = byom_daemon::tls::pairing_config(server.ca_pin()).unwrap();
    let conn = ep
        .connect_with(cfg, server.quic_addr, byom_protocol::SERVER_NAME)
        .unwrap()
        .await
        .unwrap();
    let (mut send, _recv) = conn.open_bi().await.unwrap();
    let mut garbage = 16u32.to_be_bytes().to_vec();
    garbage.extend_from_slice(&[0xff; 16]);
    send.write_all(&garbage).await.unwrap();
    let _ = send.finish();
    let why = tokio::time::timeout(T, conn.closed()).await.unwrap();
    match why {
        quinn::ConnectionError::ApplicationClosed(c) => {
            assert_eq!(c.error_code, byom_protocol::close::PROTOCOL.into(), "{c:?}");
            assert!(!c.reason.is_empty(), "a reason is given");
        }
        other => panic!("expected an application close, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_refuses_clients_without_an_admin_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    // A machine certificate from the same CA is not an admin certificate.
    let d = Daemon::new(dir.path(), "daemon");
    d.pair(&server.token(&[]), "lap");
    let creds = dir.path().join("fake-admin");
    std::fs::create_dir_all(&creds).unwrap();
    let id = d.identity();
    std::fs::write(creds.join("ca.pem"), id["ca_pem"].as_str().unwrap()).unwrap();
    std::fs::write(creds.join("admin.pem"), id["cert_pem"].as_str().unwrap()).unwrap();
    std::fs::copy(d.config_dir.join("key.pem"), creds.join("admin.key")).unwrap();
    std::fs::copy(server.creds().join("api.json"), creds.join("api.json")).unwrap();
    let out = std::process::Command::new(byom_tests::bin("byom"))
        .args(["machines", "ls"])
        .env("BYOM_CREDS", &creds)
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "a machine certificate reached the admin API"
    );
}
