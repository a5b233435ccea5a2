//! When UDP is blocked the daemon falls back to the same protocol tunnelled
//! in TLS over TCP, commands still run, and it moves back to QUIC once UDP
//! works again.

use std::time::Duration;

use byom_tests::proxy::TcpForward;
use byom_tests::{stdout, wait_for, Daemon, Server};

const T: Duration = Duration::from_secs(60);

#[test]
fn udp_blocked_falls_back_to_tcp_and_moves_back() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    // One host:port: UDP through a proxy we can cut, TCP forwarded.
    let (udp, _tcp) = TcpForward::with_udp_proxy(server.quic_addr, server.tcp_addr);
    udp.cut.set(true);

    let mut d = Daemon::new(dir.path(), "daemon");
    d.pair(&server.token(&[]), "lap");
    d.server_override = Some(udp.addr.to_string());
    d.env = vec![("BYOMD_QUIC_PROBE_SECS".into(), "1".into())];
    d.start();
    server.wait_online("lap", true, T);
    assert_eq!(server.machine("lap")["transport"], "tcp");
    let out = server.byom(&[
        "exec",
        "lap",
        "--",
        "sh",
        "-c",
        "echo over tcp; echo err >&2; exit 4",
    ]);
    assert_eq!(out.status.code(), Some(4));
    assert_eq!(stdout(&out), "over tcp\n");
    assert!(stdout(&d.byomd(&["status"])).contains("connected over tcp"));

    // UDP comes back: the daemon moves to QUIC by itself.
    udp.cut.set(false);
    wait_for("back on QUIC", T, || {
        (server.machine("lap")["transport"] == "quic" && server.machine("lap")["online"] == true)
            .then_some(())
    });
    let out = server.byom(&["exec", "lap", "--", "echo", "over quic"]);
    assert_eq!(stdout(&out), "over quic\n");
}

#[test]
fn doctor_checks_everything_and_says_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let mut d = Daemon::new(dir.path(), "daemon");
    d.pair(&server.token(&[]), "lap");
    d.start();
    server.wait_online("lap", true, T);
    let out = d.byomd(&["doctor"]);
    let text = stdout(&out);
    assert!(out.status.success(), "{text}");
    for name in [
        "config",
        "key",
        "certificate",
        "policy",
        "daemon",
        "udp",
        "tcp",
        "clock",
    ] {
        assert!(
            text.lines()
                .any(|l| l.starts_with("ok") && l.contains(name)),
            "{name} missing or failing:\n{text}"
        );
    }
    std::fs::write(d.config_dir.join("policy.toml"), "[oops").unwrap();
    assert!(d.byomd(&["pause"]).status.success());
    let out = d.byomd(&["doctor"]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text.lines()
            .any(|l| l.starts_with("FAIL") && l.contains("policy")),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("FAIL") && l.contains("byomd resume")),
        "{text}"
    );
    d.stop();
    drop(server);
    let text = stdout(&d.byomd(&["doctor"]));
    assert!(
        text.lines()
            .any(|l| l.starts_with("FAIL") && l.contains("udp")),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("FAIL") && l.contains("tcp")),
        "{text}"
    );
}

/// A QUIC endpoint that refuses every handshake, as a middlebox or a
/// proxy that does not speak byom's QUIC would.
fn refuser(rt: &tokio::runtime::Runtime) -> quinn::Endpoint {
    let cert = rcgen::generate_simple_self_signed(vec!["refuser.test".into()]).unwrap();
    let key = rustls::pki_types::PrivatePkcs8KeyDer::from(cert.signing_key.serialize_der());
    let cfg =
        quinn::ServerConfig::with_single_cert(vec![cert.cert.der().clone()], key.into()).unwrap();
    let _guard = rt.enter();
    let ep = quinn::Endpoint::server(cfg, "127.0.0.1:0".parse().unwrap()).unwrap();
    let e2 = ep.clone();
    rt.spawn(async move {
        while let Some(incoming) = e2.accept().await {
            incoming.refuse();
        }
    });
    ep
}

/// Something on the UDP port refuses the QUIC handshake: the daemon takes
/// the TCP fallback on the same port instead of failing over and over.
#[test]
fn a_refused_quic_handshake_falls_back_to_tcp() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let rt = tokio::runtime::Runtime::new().unwrap();
    // The refuser's UDP port, and the same number over TCP forwarded to
    // the server's fallback (ephemeral TCP ports may be taken: try others).
    let (ep, _tcp) = (0..64)
        .find_map(|_| {
            let ep = refuser(&rt);
            let addr = ep.local_addr().unwrap();
            TcpForward::try_start(addr, server.tcp_addr)
                .ok()
                .map(|t| (ep, t))
        })
        .expect("a port free for both UDP and TCP");
    let mut d = Daemon::new(dir.path(), "daemon");
    d.pair(&server.token(&[]), "lap");
    d.server_override = Some(ep.local_addr().unwrap().to_string());
    d.start();
    server.wait_online("lap", true, T);
    assert_eq!(server.machine("lap")["transport"], "tcp");
    let out = server.byom(&["exec", "lap", "--", "echo", "around the refusal"]);
    assert_eq!(stdout(&out), "around the refusal\n");
    assert!(d.log().contains("refused"), "{}", d.log());
}
