//! Nothing before authentication can starve the rest. One address
//! (127.0.0.2) holds 2,000 idle TCP-fallback tunnels, 1,000 half-open QUIC
//! handshakes (a captured Initial replayed from 1,000 ports; 1,000 more
//! come from 100 other addresses), 300
//! slow-header webhook connections and 300 idle admin API connections
//! against a server limited to 1,024 open files. Meanwhile, from 127.0.0.1,
//! a real daemon reconnects, `byom exec` runs and a signed webhook is
//! accepted, each within 2 s, and the server's CPU stays low once the
//! attack is idle.
//!
//! Loopback only: Linux routes all of 127.0.0.0/8 to `lo`.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use byom_tests::{byom_headers, webhook_post, Daemon, Server};
use tokio::io::AsyncWriteExt;

const T: Duration = Duration::from_secs(30);
const ATTACKER: &str = "127.0.0.2";
const TUNNELS: usize = 2000;
const HALF_OPEN: usize = 1000;
const SLOW_WEBHOOKS: usize = 300;
const IDLE_API: usize = 300;
/// What "within 2 s" means here.
const GOAL: Duration = Duration::from_secs(2);

fn raise_own_nofile() {
    // The attacker side needs ~3,600 sockets.
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain getrlimit/setrlimit on this process.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
        lim.rlim_cur = lim.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
    }
}

/// Open TCP connections from the attacker's address that send nothing
/// (or `prefix`); returns how many connected.
async fn hold_tcp(to: SocketAddr, n: usize, prefix: &[u8]) -> Vec<tokio::net::TcpStream> {
    let mut held = Vec::with_capacity(n);
    for _ in 0..n {
        let Ok(sock) = tokio::net::TcpSocket::new_v4() else {
            break;
        };
        if sock.bind(format!("{ATTACKER}:0").parse().unwrap()).is_err() {
            break;
        }
        match tokio::time::timeout(Duration::from_millis(500), sock.connect(to)).await {
            Ok(Ok(mut s)) => {
                if !prefix.is_empty() {
                    let _ = s.write_all(prefix).await;
                }
                held.push(s);
            }
            _ => continue,
        }
    }
    held
}

/// A real client's first QUIC Initial packet, captured on a trap socket.
async fn captured_initial(server: &Server) -> Vec<u8> {
    let trap = tokio::net::UdpSocket::bind(format!("{ATTACKER}:0"))
        .await
        .unwrap();
    let trap_addr = trap.local_addr().unwrap();
    let ep = quinn::Endpoint::client(format!("{ATTACKER}:0").parse().unwrap()).unwrap();
    let cfg = byom_daemon::tls::pairing_config(server.ca_pin()).unwrap();
    let connecting = ep
        .connect_with(cfg, trap_addr, byom_protocol::SERVER_NAME)
        .unwrap();
    let mut buf = vec![0u8; 4096];
    let (n, _) = tokio::time::timeout(T, trap.recv_from(&mut buf))
        .await
        .unwrap()
        .unwrap();
    drop(connecting);
    ep.close(0u32.into(), b"");
    buf.truncate(n);
    buf
}

/// CPU seconds the process has used (user + system).
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the parenthesised name; utime and stime are 14th, 15th.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    ticks / hz
}

fn open_files(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_from_one_address_starves_no_one_else() {
    raise_own_nofile();
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_limited(dir.path(), 1024);
    let pid = server.pid().unwrap();
    let mut d = Daemon::new(dir.path(), "lap");
    d.pair(&server.token(&[]), "lap");
    d.start();
    server.wait_online("lap", true, T);
    let key = std::fs::read_to_string(server.data_dir.join("webhook.key")).unwrap();
    let key = key.trim().as_bytes().to_vec();

    // The attack.
    let t0 = Instant::now();
    let tunnels = hold_tcp(server.tcp_addr, TUNNELS, b"").await;
    let api = hold_tcp(server.api_addr, IDLE_API, b"").await;
    let mut slow = hold_tcp(
        server.webhook_addr,
        SLOW_WEBHOOKS,
        b"POST /hooks/ci HTTP/1.1\r\nHost: x\r\n",
    )
    .await;
    let initial = captured_initial(&server).await;
    let mut half_open = Vec::with_capacity(2 * HALF_OPEN);
    for _ in 0..HALF_OPEN {
        let s = std::net::UdpSocket::bind(format!("{ATTACKER}:0")).unwrap();
        let _ = s.send_to(&initial, server.quic_addr);
        half_open.push(s);
    }
    // And as many again from 100 other addresses: past the per-address
    // limit's help, so the server must answer with stateless Retries.
    for i in 0..HALF_OPEN {
        let s = std::net::UdpSocket::bind(format!("127.0.1.{}:0", 1 + i % 100)).unwrap();
        let _ = s.send_to(&initial, server.quic_addr);
        half_open.push(s);
    }
    // Slow headers keep trickling for a while.
    for _ in 0..3 {
        for s in &mut slow {
            let _ = s.write_all(b"X-Slow: 1\r\n").await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    eprintln!(
        "attack: {} tunnels, {} idle API, {} slow webhook connections, {} half-open QUIC, set up in {:?}; server holds {} open files",
        tunnels.len(),
        api.len(),
        slow.len(),
        half_open.len(),
        t0.elapsed(),
        open_files(pid)
    );

    // A restarted daemon reconnects.
    let server = std::sync::Arc::new(server);
    let before = server.machine("lap")["remote_addr"].clone();
    d.kill9();
    let t = Instant::now();
    d.start();
    let s2 = server.clone();
    // Connected again: online from a new address (port).
    tokio::task::spawn_blocking(move || {
        byom_tests::wait_for("the daemon back", T, || {
            let m = s2.machine("lap");
            (m["online"] == true && m["remote_addr"] != before).then_some(())
        })
    })
    .await
    .unwrap();
    let reconnect = t.elapsed();
    // A command runs.
    let t = Instant::now();
    let s2 = server.clone();
    let out =
        tokio::task::spawn_blocking(move || s2.byom(&["exec", "lap", "--", "echo", "through"]))
            .await
            .unwrap();
    let exec = t.elapsed();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "through\n");
    // A signed webhook is accepted.
    let body = r#"{"thread": "flood", "user": "ci", "text": "build passed"}"#;
    let sig = byom_headers(&key, body);
    let addr = server.webhook_addr;
    let t = Instant::now();
    let (status, reply) =
        tokio::task::spawn_blocking(move || webhook_post(addr, "/hooks/ci", Some(&sig), body))
            .await
            .unwrap();
    let hook = t.elapsed();
    assert_eq!(status, 202, "{reply}");

    // The attack goes idle; the server should too.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let c0 = cpu_seconds(pid);
    let w = Instant::now();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let cpu = (cpu_seconds(pid) - c0) / w.elapsed().as_secs_f64();
    eprintln!(
        "during the flood: daemon reconnect {reconnect:?}, exec {exec:?}, signed webhook {hook:?}; idle server CPU {:.1}% of a core; {} open files",
        cpu * 100.0,
        open_files(pid)
    );
    assert!(reconnect < GOAL, "reconnect took {reconnect:?}");
    assert!(exec < GOAL, "exec took {exec:?}");
    assert!(hook < GOAL, "webhook took {hook:?}");
    assert!(
        cpu < 0.15,
        "the server used {:.0}% CPU while the attack idled",
        cpu * 100.0
    );
    drop((tunnels, api, slow, half_open));
}
