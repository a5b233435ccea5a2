//! Console benchmark (run with `cargo bench -p byom-tests --bench console`,
//! after `cargo build --release -p byom-control-plane -p byom-daemon`).
//!
//! In one run, on loopback, a real `byom server` (console on a free
//! port) and `byomd`:
//!  1. the store is filled as a busy team's would be: BENCH_TASKS tasks
//!     (default 1,000), each on its own thread with its message, the
//!     Router's decision and a reply, and BENCH_COMMANDS commands
//!     (default 10,000) spread over them; a real task with subagents and
//!     an approval waiting is added through the agents;
//!  2. over one kept-alive HTTPS connection with a session, p50 and p90 of
//!     Needs you, a thread's timeline (the real one and a filled one),
//!     Tasks, a worker's page and the audit's first page, against two
//!     baselines in the same run: `/healthz` (plain HTTP on the admin
//!     port) and the console's style sheet (same connection, no session,
//!     no store);
//!  3. BENCH_CLIENTS live clients (default 100, each its own session and
//!     connection, from a spread of loopback addresses as browsers
//!     would come from different hosts) on one command's output stream:
//!     how many saw every line and the end, and how long after the
//!     command ended they saw it.
//!
//! The bar: both pages ≤ 50 ms at p50.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use byom_protocol::id::{CommandId, ThreadId, TriggerId, WorkerId};
use byom_protocol::pb;
use byom_store::{Op, Space, Store};
use byom_tests::{stderr, wait_for, Server};
use prost::Message;
use serde_json::{json, Value};

const T: Duration = Duration::from_secs(120);
const PARALLEL: &str = "check `echo one`, `echo two` and `echo three` on lap in parallel, then ask me before running `echo cleaned-up`";
const LINES: usize = 20;

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

fn pct(v: &mut [Duration], p: usize) -> f64 {
    v.sort();
    v[(v.len() * p / 100).min(v.len() - 1)].as_secs_f64() * 1000.0
}

/// A TCP connection to `dst` from the loopback address `src`.
fn connect_from(src: Ipv4Addr, dst: SocketAddr) -> TcpStream {
    use std::os::fd::FromRawFd;
    let SocketAddr::V4(dst) = dst else {
        panic!("an IPv4 console address")
    };
    let addr = |ip: Ipv4Addr, port: u16| {
        // SAFETY: sockaddr_in is plain data; all zeros is valid.
        let mut a: libc::sockaddr_in = unsafe { std::mem::zeroed() };
        a.sin_family = libc::AF_INET as libc::sa_family_t;
        a.sin_port = port.to_be();
        a.sin_addr.s_addr = u32::from(ip).to_be();
        a
    };
    let (from, to) = (addr(src, 0), addr(*dst.ip(), dst.port()));
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: a fresh socket, bound and connected with valid addresses,
    // then owned by the TcpStream.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
        let s = TcpStream::from_raw_fd(fd);
        let bound = libc::bind(fd, (&from as *const libc::sockaddr_in).cast(), len);
        assert_eq!(bound, 0, "bind {src}: {}", std::io::Error::last_os_error());
        let c = libc::connect(fd, (&to as *const libc::sockaddr_in).cast(), len);
        assert_eq!(c, 0, "connect: {}", std::io::Error::last_os_error());
        s
    }
}

type Tls = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

struct Console {
    url: String,
    addr: SocketAddr,
    tls: Arc<rustls::ClientConfig>,
}

impl Console {
    fn new(server: &Server) -> Console {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::CertificateDer;
        let info: Value =
            serde_json::from_slice(&std::fs::read(server.data_dir.join("server.json")).unwrap())
                .unwrap();
        let url = info["console_url"].as_str().unwrap().to_string();
        let addr = url.trim_start_matches("https://").parse().unwrap();
        let ca = std::fs::read(server.creds().join("ca.pem")).unwrap();
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_slice_iter(&ca) {
            roots.add(c.unwrap()).unwrap();
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let cfg = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        Console {
            url,
            addr,
            tls: Arc::new(cfg),
        }
    }

    fn connect(&self, from: Ipv4Addr) -> Tls {
        use rustls::pki_types::ServerName;
        let name = ServerName::try_from(self.addr.ip().to_string()).unwrap();
        let conn = rustls::ClientConnection::new(self.tls.clone(), name).unwrap();
        let tcp = connect_from(from, self.addr);
        tcp.set_read_timeout(Some(T)).unwrap();
        tcp.set_nodelay(true).unwrap();
        rustls::StreamOwned::new(conn, tcp)
    }

    /// A session: `byom console`'s link, opened.
    fn session(&self, server: &Server) -> String {
        let o = server.byom(&["console"]);
        assert!(o.status.success(), "{}", stderr(&o));
        let link = String::from_utf8_lossy(&o.stdout).trim().to_string();
        let path = link.strip_prefix(&self.url).unwrap().to_string();
        let mut t = self.connect(Ipv4Addr::LOCALHOST);
        let (status, head, _) = get(&mut t, &self.addr, &path, None);
        assert_eq!(status, 303, "{head}");
        let set = head
            .lines()
            .find_map(|l| l.strip_prefix("set-cookie: __host-byom_session="))
            .expect("a cookie");
        set.split(';').next().unwrap().to_string()
    }
}

/// One GET on a kept-alive connection: status, head, body (by
/// Content-Length).
fn get(
    t: &mut impl ReadWrite,
    host: &SocketAddr,
    path: &str,
    cookie: Option<&str>,
) -> (u16, String, String) {
    let c = cookie
        .map(|c| format!("Cookie: __Host-byom_session={c}\r\n"))
        .unwrap_or_default();
    write!(t, "GET {path} HTTP/1.1\r\nHost: {host}\r\n{c}\r\n").unwrap();
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        t.read_exact(&mut byte).unwrap();
        buf.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&buf).to_ascii_lowercase();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    t.read_exact(&mut body).unwrap();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, head, String::from_utf8_lossy(&body).into_owned())
}

trait ReadWrite: Read + Write {}
impl<T: Read + Write> ReadWrite for T {}

/// Times `n` GETs of `path` (after a warm-up): p50, p90 in ms.
fn time(
    t: &mut impl ReadWrite,
    host: &SocketAddr,
    path: &str,
    cookie: Option<&str>,
    n: usize,
) -> (f64, f64) {
    let mut v = Vec::with_capacity(n);
    for i in 0..n + 10 {
        let start = Instant::now();
        let (status, head, body) = get(t, host, path, cookie);
        assert_eq!(status, 200, "{path}: {head}{body}");
        if i >= 10 {
            v.push(start.elapsed());
        }
    }
    (pct(&mut v, 50), pct(&mut v, 90))
}

/// Fills the stopped server's store: `tasks` threads, each with a
/// message, its fate, a reply and a task like `template` (a real
/// worker's record), and `commands` commands spread over the tasks.
fn fill(store: &Store, template: &Value, machine: &str, tasks: usize, commands: usize) -> String {
    let now = now_ms();
    let per = commands / tasks;
    let cmd_tpl = template["commands"]
        .as_object()
        .and_then(|m| m.values().next().cloned())
        .expect("the template task ran a command");
    let mut last_thread = String::new();
    for i in 0..tasks {
        let at = now - ((tasks - i) as u64) * 60_000;
        let thr = ThreadId::new(at).to_string();
        let wrk = WorkerId::new(at + 10).to_string();
        store
            .create_thread(&pb::Thread {
                id: thr.clone(),
                source: "chat".into(),
                external: format!("bench-{i}"),
                kind: "chat".into(),
                created_at_ms: at,
                last_trigger_ms: at + 500,
            })
            .unwrap();
        let mut ops = Vec::new();
        for (k, (user, text, bot)) in [
            (
                "ada",
                format!("please run the checks for build {i} on lap"),
                false,
            ),
            (
                "byom",
                format!("Done: build {i} passed all {per} checks."),
                true,
            ),
        ]
        .into_iter()
        .enumerate()
        {
            let mut t = pb::Trigger {
                id: TriggerId::new(at + 500 * k as u64).to_string(),
                thread_id: thr.clone(),
                source: "chat".into(),
                user: user.into(),
                text,
                from_bot: bot,
                mention: !bot,
                created_at_ms: at + 500 * k as u64,
                kind: "chat".into(),
                trusted: true,
                ..Default::default()
            };
            t.set_decision(pb::TriggerDecision::Candidate);
            if !bot {
                ops.push(Op::put(
                    Space::Agents,
                    byom_agent::storage::keys::fate(&t.id),
                    format!("given to a new worker, {wrk}").into_bytes(),
                ));
            }
            ops.push(Op::trigger(&t));
        }
        let mut cmds = serde_json::Map::new();
        for k in 0..per {
            let c_at = at + 20 + k as u64;
            let id = CommandId::new(c_at).to_string();
            let mut c = pb::Command {
                id: id.clone(),
                machine_id: machine.into(),
                shell: format!("make check-{k} BUILD={i}"),
                created_at_ms: c_at,
                dispatched_at_ms: c_at,
                started_at_ms: c_at,
                finished_at_ms: c_at + 300,
                exit_code: Some(0),
                requested_by: wrk.clone(),
                stdout_bytes: 120,
                ..Default::default()
            };
            c.set_state(pb::CommandState::Exited);
            ops.push(Op::put(Space::Commands, id.as_bytes(), c.encode_to_vec()));
            let mut r = cmd_tpl.clone();
            r["command"] = json!(c.shell);
            r["done"] = json!(true);
            cmds.insert(id, r);
        }
        let mut w = template.clone();
        w["id"] = json!(wrk);
        w["task"] = json!(format!("run the checks for build {i}"));
        w["threads"] = json!([thr]);
        w["own_threads"] = json!([thr]);
        w["commands"] = Value::Object(cmds);
        w["conversation"] = json!({"seqs": [], "next": 0});
        w["created_ms"] = json!(at + 10);
        w["updated_ms"] = json!(at + 400);
        ops.push(Op::put(
            Space::Agents,
            byom_agent::storage::keys::record(&wrk),
            serde_json::to_vec(&w).unwrap(),
        ));
        store.batch(&ops).unwrap();
        last_thread = thr;
    }
    store.flush().unwrap();
    last_thread
}

/// One live client: reads the command's events until the end state;
/// (all lines seen, when the end arrived).
fn follow(con: &Console, from: Ipv4Addr, cookie: &str, cmd: &str) -> (bool, Instant) {
    use base64::Engine;
    let mut t = con.connect(from);
    write!(
        t,
        "GET /commands/{cmd}/events HTTP/1.1\r\nHost: {}\r\nCookie: __Host-byom_session={cookie}\r\n\r\n",
        con.addr
    )
    .unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    let end = loop {
        let n = t.read(&mut buf).unwrap_or(0);
        if n == 0 {
            break Instant::now();
        }
        seen.extend_from_slice(&buf[..n]);
        if seen.windows(15).any(|w| w == b"\"terminal\":true") {
            break Instant::now();
        }
    };
    let text = String::from_utf8_lossy(&seen);
    let mut out = Vec::new();
    for l in text.lines() {
        if let Some(d) = l.strip_prefix("data: ") {
            let v: Value = serde_json::from_str(d).unwrap_or_default();
            if let Some(b) = v["b64"].as_str() {
                out.extend(
                    base64::engine::general_purpose::STANDARD
                        .decode(b)
                        .unwrap_or_default(),
                );
            }
        }
    }
    let out = String::from_utf8_lossy(&out);
    let all = (1..=LINES).all(|i| out.contains(&format!("line-{i}\n")));
    (all, end)
}

fn main() {
    let tasks = env("BENCH_TASKS", 1000);
    let commands = env("BENCH_COMMANDS", 10_000);
    let clients = env("BENCH_CLIENTS", 100);
    let (_dir, mut server, _lap) = Server::with_lap(&["--listen-console", "127.0.0.1:0"], &[]);
    let machine = server.machine("lap")["id"].as_str().unwrap().to_string();

    // A real task, whose record the filled ones copy.
    server.say("template", "please run `true` on lap");
    let tpl = wait_for("the template task", T, || {
        let t = server.json(&["tasks", "ls"]);
        let t = t.as_array()?.first()?.clone();
        (t["status"] == "idle" || t["status"] == "done").then_some(t)
    });
    let tpl_id = tpl["id"].as_str().unwrap().to_string();
    server.kill9();
    let started = Instant::now();
    let last_thread = {
        let store = Store::open_sled(&server.data_dir.join("store")).unwrap();
        let raw = store
            .get_raw(Space::Agents, &byom_agent::storage::keys::record(&tpl_id))
            .unwrap()
            .expect("the template's record");
        let template: Value = serde_json::from_slice(&raw).unwrap();
        fill(&store, &template, &machine, tasks, commands)
    };
    println!(
        "filled the store: {tasks} tasks on {tasks} threads ({} triggers), {commands} commands, in {:.1} s",
        2 * tasks,
        started.elapsed().as_secs_f64()
    );
    // The old process's ports can take a moment to be released.
    wait_for("the API port to be free", T, || {
        std::net::TcpListener::bind(server.api_addr).ok().map(drop)
    });
    server.launch();
    server.wait_online("lap", true, T);

    // A real thread: subagents, commands, an approval waiting.
    server.say("bench", PARALLEL);
    wait_for("an approval", T, || {
        let a = server.json(&["approvals", "ls"]);
        (a.as_array().map(Vec::len) == Some(1)).then_some(())
    });
    let threads = server.json(&["threads", "ls"]);
    let real = threads
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["external"] == "bench")
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let real_task = server
        .json(&["tasks", "ls"])
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["threads"].to_string().contains(&real))
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();

    // 2. Pages.
    let con = Console::new(&server);
    let cookie = con.session(&server);
    let rounds = env("BENCH_N", 200);
    let mut plain = TcpStream::connect(server.api_addr).unwrap();
    plain.set_nodelay(true).unwrap();
    let healthz = time(&mut plain, &server.api_addr, "/healthz", None, rounds);
    let mut t = con.connect(Ipv4Addr::LOCALHOST);
    let css = time(&mut t, &con.addr, "/console.css", None, rounds);
    println!(
        "baseline /healthz (plain HTTP, admin port): p50 {:.2} ms, p90 {:.2} ms",
        healthz.0, healthz.1
    );
    println!(
        "baseline /console.css (HTTPS, kept alive): p50 {:.2} ms, p90 {:.2} ms",
        css.0, css.1
    );
    let home = con.get_page(&mut t, "/", &cookie);
    assert!(home.contains("cleaned-up"), "the approval is on Needs you");
    let tl = con.get_page(&mut t, &format!("/threads/{real}"), &cookie);
    assert!(tl.contains("asked approval"), "the real timeline");
    let mut bar = Vec::new();
    for (name, path, checked) in [
        ("Needs you", "/".to_string(), true),
        (
            "timeline of the real thread",
            format!("/threads/{real}"),
            true,
        ),
        (
            "timeline of a filled thread",
            format!("/threads/{last_thread}"),
            true,
        ),
        ("Tasks (1,000 rows at most)", "/tasks".to_string(), false),
        ("a worker's page", format!("/workers/{real_task}"), false),
        ("Audit, first page", "/audit".to_string(), false),
    ] {
        let (p50, p90) = time(&mut t, &con.addr, &path, Some(&cookie), rounds);
        println!(
            "{name}: p50 {p50:.2} ms ({:.2} over the style sheet), p90 {p90:.2} ms{}",
            p50 - css.0,
            if checked {
                if p50 <= 50.0 {
                    " — within 50 ms"
                } else {
                    " — OVER 50 ms"
                }
            } else {
                ""
            }
        );
        if checked {
            bar.push(p50 <= 50.0);
        }
    }

    // 3. Live clients on one command's output.
    let started = Instant::now();
    let cookies: Vec<String> = (0..clients).map(|_| con.session(&server)).collect();
    println!(
        "{clients} sessions signed in in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let script = format!("sleep 3; for i in $(seq 1 {LINES}); do echo line-$i; sleep 0.05; done");
    let cmd = server.detach("lap", &[], &["sh", "-c", &script]);
    let con = Arc::new(con);
    let handles: Vec<_> = cookies
        .into_iter()
        .enumerate()
        .map(|(i, cookie)| {
            let con = con.clone();
            let cmd = cmd.clone();
            // 32 clients per loopback address (the console admits 64).
            let from = Ipv4Addr::new(127, 0, 1, 1 + (i / 32) as u8);
            std::thread::spawn(move || follow(&con, from, &cookie, &cmd))
        })
        .collect();
    let results: Vec<(bool, Instant)> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let c = server.wait_done(&cmd, T);
    let finished_ms = c["finished_at"]
        .as_str()
        .and_then(byom_protocol::time::parse_rfc3339)
        .unwrap();
    let now_ms = now_ms();
    let now = Instant::now();
    let mut after: Vec<Duration> = results
        .iter()
        .map(|(_, at)| {
            let at_ms = now_ms - now.duration_since(*at).as_millis() as u64;
            Duration::from_millis(at_ms.saturating_sub(finished_ms))
        })
        .collect();
    let complete = results.iter().filter(|(all, _)| *all).count();
    println!(
        "{clients} live clients on one command's stream: {complete} saw all {LINES} lines and the end; the end reached them {:.0} ms (p50), {:.0} ms (max) after the command ended",
        pct(&mut after, 50),
        pct(&mut after, 100)
    );
    println!(
        "bar (Needs you and a thread's timeline ≤ 50 ms p50): {}",
        if bar.iter().all(|b| *b) && complete == clients {
            "met"
        } else {
            "NOT met"
        }
    );
}

impl Console {
    fn get_page(&self, t: &mut Tls, path: &str, cookie: &str) -> String {
        let (status, head, body) = get(t, &self.addr, path, Some(cookie));
        assert_eq!(status, 200, "{path}: {head}");
        body
    }
}
