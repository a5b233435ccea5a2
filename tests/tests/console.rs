//! The web console over HTTPS, as a browser and an attacker reach it: a
//! real `byom server` (console on a loopback port) and `byomd`, requests
//! over TLS that trusts only the server's CA (`<data-dir>/admin/ca.pem`),
//! and a real headless Chromium driven through chromedriver's W3C
//! WebDriver API.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use byom_tests::{stderr, wait_for, Daemon, Server};
use serde_json::{json, Value};

const T: Duration = Duration::from_secs(60);

/// The chat request the scripted model answers with three commands and a
/// question an approver must answer before `echo cleaned-up` runs.
const PARALLEL: &str = "check `echo one`, `echo two` and `echo three` on lap in parallel, then ask me before running `echo cleaned-up`";

/// A server with its console on a free loopback port, and `lap` online.
fn setup(extra: &[&str]) -> (tempfile::TempDir, Server, Daemon, Console) {
    let mut args = vec!["--listen-console", "127.0.0.1:0"];
    args.extend_from_slice(extra);
    let (dir, server, d) = Server::with_lap(&args, &[]);
    let info: Value =
        serde_json::from_slice(&std::fs::read(server.data_dir.join("server.json")).unwrap())
            .unwrap();
    let url = info["console_url"].as_str().unwrap().to_string();
    let addr: SocketAddr = url.trim_start_matches("https://").parse().unwrap();
    let ca = std::fs::read_to_string(server.creds().join("ca.pem")).unwrap();
    (dir, server, d, Console { url, addr, ca })
}

/// The console's address and the CA its certificate chains to.
struct Console {
    url: String,
    addr: SocketAddr,
    ca: String,
}

#[derive(Debug)]
struct Resp {
    status: u16,
    head: String,
    body: String,
}

impl Resp {
    fn header(&self, name: &str) -> Option<String> {
        self.head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_string())
        })
    }
}

impl Console {
    fn tls(&self) -> rustls::StreamOwned<rustls::ClientConnection, TcpStream> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, ServerName};
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_slice_iter(self.ca.as_bytes()) {
            roots.add(c.unwrap()).unwrap();
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let cfg = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let name = ServerName::try_from(self.addr.ip().to_string()).unwrap();
        let conn = rustls::ClientConnection::new(Arc::new(cfg), name).unwrap();
        let tcp = TcpStream::connect(self.addr).unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        rustls::StreamOwned::new(conn, tcp)
    }

    /// One request over a fresh TLS connection (closed after the answer).
    fn request(&self, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Resp {
        let mut tls = self.tls();
        let mut req = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nContent-Length: {}\r\n",
            self.addr,
            body.len()
        );
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str("\r\n");
        req.push_str(body);
        tls.write_all(req.as_bytes()).unwrap();
        let mut out = Vec::new();
        match tls.read_to_end(&mut out) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !out.is_empty() => {}
            Err(e) => panic!("{method} {path}: {e}"),
        }
        let text = String::from_utf8_lossy(&out).into_owned();
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        Resp {
            status: head
                .split_whitespace()
                .nth(1)
                .and_then(|s| s.parse().ok())
                .unwrap_or(0),
            head: head.to_string(),
            body: body.to_string(),
        }
    }

    fn get(&self, path: &str, cookie: Option<&str>) -> Resp {
        let c = cookie.map(|c| format!("__Host-byom_session={c}"));
        let h: Vec<(&str, &str)> = c.iter().map(|c| ("Cookie", c.as_str())).collect();
        self.request("GET", path, &h, "")
    }

    /// A form POST with the session's cookie, `csrf` and `origin`.
    fn post(&self, path: &str, cookie: &str, csrf: Option<&str>, origin: Option<&str>) -> Resp {
        let c = format!("__Host-byom_session={cookie}");
        let mut h = vec![
            ("Cookie", c.as_str()),
            ("Content-Type", "application/x-www-form-urlencoded"),
        ];
        if let Some(o) = origin {
            h.push(("Origin", o));
        }
        let body = csrf.map(|t| format!("csrf={t}")).unwrap_or_default();
        self.request("POST", path, &h, &body)
    }

    /// Opens a login link: the session cookie it sets.
    fn login(&self, link: &str) -> String {
        let path = link
            .strip_prefix(&self.url)
            .expect("a link to this console");
        let r = self.get(path, None);
        assert_eq!(r.status, 303, "{r:?}");
        assert_eq!(r.header("location").as_deref(), Some("/"));
        let set = r.header("set-cookie").expect("a session cookie");
        for attr in ["HttpOnly", "Secure", "SameSite=Strict", "Path=/"] {
            assert!(set.contains(attr), "{set}");
        }
        let v = set
            .strip_prefix("__Host-byom_session=")
            .and_then(|s| s.split(';').next())
            .unwrap()
            .to_string();
        assert_eq!(v.len(), 64, "256 random bits, hex: {set}");
        v
    }
}

/// `byom console ARGS` with `creds`: the link it prints.
fn link(server: &Server, creds: &Path, args: &[&str]) -> String {
    let mut a = vec!["console"];
    a.extend_from_slice(args);
    let o = server
        .byom_cmd(&a)
        .env("BYOM_CREDS", creds)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

/// The CSRF token a page's forms carry.
fn csrf_of(page: &str) -> String {
    let i = page.find("name=\"csrf\" value=\"").expect("a form") + 19;
    page[i..i + 64].to_string()
}

fn open_approval(server: &Server) -> String {
    let a = wait_for("an approval", T, || {
        let a = server.json(&["approvals", "ls"]);
        (a.as_array().map(Vec::len) == Some(1)).then_some(a)
    });
    a[0]["id"].as_str().unwrap().to_string()
}

fn cleaned_up_ran(server: &Server) -> Value {
    wait_for("echo cleaned-up to run", T, || {
        let cs = server.json(&["commands", "ls"]);
        cs.as_array()?
            .iter()
            .find(|c| c.to_string().contains("cleaned-up") && c["state"] == "exited")
            .cloned()
    })
}

/// Sign-in, refusals, an approval answered in the console by a named
/// admin, a read-only session that cannot, live output over SSE with
/// resumption, sign-out and revocation.
#[test]
fn console_signs_in_once_refuses_forgeries_and_approves_as_the_person() {
    let (dir, server, _d, con) = setup(&[]);
    let ada = dir.path().join("ada-creds");
    let o = server.byom(&["admins", "add", "ada", "--out", ada.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));

    // No cookie, or a made-up one: refused, told how to sign in.
    for cookie in [None, Some("00".repeat(32).as_str()), Some("junk")] {
        let r = con.get("/", cookie);
        assert_eq!(r.status, 401, "{r:?}");
        assert!(r.body.contains("byom console"), "{}", r.body);
    }
    assert_eq!(con.get("/commands/cmd_x/events", None).status, 401);

    // A link signs in once.
    let l = link(&server, &ada, &[]);
    assert!(l.starts_with(&format!("{}/login/", con.url)), "{l}");
    let cookie = con.login(&l);
    let again = con.get(l.strip_prefix(&con.url).unwrap(), None);
    assert_eq!(again.status, 403);
    assert!(again.body.contains("already used"), "{}", again.body);
    assert!(again.header("set-cookie").is_none());
    let home = con.get("/", Some(&cookie));
    assert_eq!(home.status, 200, "{home:?}");
    assert!(home.body.contains("admin:ada"), "{}", home.body);
    let csp = home.header("content-security-policy").unwrap();
    assert!(csp.contains("default-src 'none'") && csp.contains("script-src 'self'"));
    assert!(!home.body.contains("<script>"), "no inline script");

    // The approval the core wrote, shown exactly (escaped), with buttons.
    server.say("c1", PARALLEL);
    let apr = open_approval(&server);
    let home = con.get("/", Some(&cookie));
    assert!(home.body.contains(&apr), "{}", home.body);
    let question = server.json(&["approvals", "ls"])[0]["question"]
        .as_str()
        .unwrap()
        .to_string();
    let escaped = question
        .replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#39;");
    assert!(home.body.contains(&escaped), "{question}\n{}", home.body);
    assert!(home.body.contains(&format!("/approvals/{apr}/approve")));
    let csrf = csrf_of(&home.body);
    let origin = con.url.clone();
    let path = format!("/approvals/{apr}/approve");

    // Forgeries: no token, another session's token, another site's
    // Origin, no Origin at all; a GET. Nothing is answered.
    let other = con.login(&link(&server, &ada, &[]));
    let other_csrf = csrf_of(&con.get("/", Some(&other)).body);
    for (csrf, origin, why) in [
        (None, Some(origin.as_str()), "CSRF"),
        (Some(other_csrf.as_str()), Some(origin.as_str()), "CSRF"),
        (Some(csrf.as_str()), Some("https://evil.example"), "Origin"),
        (Some(csrf.as_str()), None, "Origin"),
    ] {
        let r = con.post(&path, &cookie, csrf, origin);
        assert_eq!(r.status, 403, "{r:?}");
        assert!(r.body.contains(why), "{}", r.body);
    }
    assert_eq!(con.get(&path, Some(&cookie)).status, 404);
    let r = con.request(
        "POST",
        &path,
        &[("Origin", &origin)],
        &format!("csrf={csrf}"),
    );
    assert_eq!(r.status, 401, "no cookie: {r:?}");

    // A read-only session looks, and cannot answer.
    let ro = con.login(&link(&server, &ada, &["--read-only"]));
    let ro_home = con.get("/", Some(&ro));
    assert!(ro_home.body.contains("(read-only)"));
    assert!(!ro_home.body.contains(&format!("/approvals/{apr}/approve")));
    let r = con.post(&path, &ro, Some(&csrf_of(&ro_home.body)), Some(&origin));
    assert_eq!(r.status, 403, "{r:?}");
    assert!(r.body.contains("read-only"), "{}", r.body);
    assert_eq!(server.json(&["approvals", "ls"])[0]["id"], apr.as_str());

    // The real thing: approved, as Ada; the program goes on.
    let r = con.post(&path, &cookie, Some(&csrf), Some(&origin));
    assert_eq!(r.status, 303, "{r:?}");
    let note = con.get(&r.header("location").unwrap(), Some(&cookie));
    assert!(
        note.body.contains(&format!("Approved {apr}")),
        "{}",
        note.body
    );
    let cmd = cleaned_up_ran(&server);
    let all = server.json(&["approvals", "ls", "--all"]);
    let a = all
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["id"] == apr.as_str())
        .unwrap();
    assert_eq!(a["state"], "approved", "{a}");
    assert_eq!(a["by"], "admin:ada", "the person, never the console: {a}");
    // Answered once.
    let r = con.post(&path, &cookie, Some(&csrf), Some(&origin));
    assert_eq!(r.status, 409, "{r:?}");

    // The command's page and its events: output, then the end state; a
    // resumed stream (Last-Event-ID) sends only what is past it.
    let id = cmd["id"].as_str().unwrap();
    let page = con.get(&format!("/commands/{id}"), Some(&cookie));
    assert_eq!(page.status, 200);
    assert!(page.body.contains("cleaned-up"), "{}", page.body);
    let ev = con.get(&format!("/commands/{id}/events"), Some(&cookie));
    assert_eq!(
        ev.header("content-type").as_deref(),
        Some("text/event-stream")
    );
    assert!(ev.body.contains("event: output"), "{}", ev.body);
    assert!(
        ev.body.contains("Y2xlYW5lZC11cAo="),
        "base64 of the output: {}",
        ev.body
    );
    assert!(ev.body.contains("\"state\":\"exited\""), "{}", ev.body);
    assert!(ev.body.contains("id: 11-0"), "{}", ev.body);
    let c = format!("__Host-byom_session={cookie}");
    let resumed = con.request(
        "GET",
        &format!("/commands/{id}/events"),
        &[("Cookie", &c), ("Last-Event-ID", "11-0")],
        "",
    );
    assert!(!resumed.body.contains("event: output"), "{}", resumed.body);
    assert!(resumed.body.contains("\"state\":\"exited\""));
    for p in ["/machines", "/commands"] {
        let r = con.get(p, Some(&cookie));
        assert_eq!(r.status, 200, "{p}");
    }
    assert!(con.get("/machines", Some(&cookie)).body.contains(">lap<"));

    // Sign-out ends the session; a revoked admin's session ends too.
    let r = con.post("/logout", &cookie, Some(&csrf), Some(&origin));
    assert_eq!(r.status, 303);
    assert_eq!(con.get("/", Some(&cookie)).status, 401);
    assert_eq!(con.get("/", Some(&other)).status, 200);
    let o = server.byom(&["admins", "revoke", "ada"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let r = wait_for("the revocation to reach the console", T, || {
        let r = con.get("/", Some(&other));
        (r.status == 403).then_some(r)
    });
    assert!(r.body.contains("revoked"), "{}", r.body);
}

/// A link not opened in time is refused, and says so.
#[test]
fn an_expired_link_is_refused() {
    let (_dir, server, _d, con) = setup(&["--console-link-ttl", "1s"]);
    let l = link(&server, &server.creds(), &[]);
    std::thread::sleep(Duration::from_millis(1500));
    let r = con.get(l.strip_prefix(&con.url).unwrap(), None);
    assert_eq!(r.status, 403, "{r:?}");
    assert!(r.body.contains("expired"), "{}", r.body);
    let r = con.get("/login/nonsense", None);
    assert_eq!(r.status, 403);
    assert!(r.body.contains("not known"), "{}", r.body);
}

/// A live stream outlasts neither its session nor its admin: one signed
/// out, and one whose admin is revoked, each end within seconds (not at
/// the connection's 10-minute bound, still sending what follows).
#[test]
fn a_live_stream_ends_with_its_session() {
    let (dir, server, _d, con) = setup(&[]);
    let ada = dir.path().join("ada-creds");
    let o = server.byom(&["admins", "add", "ada", "--out", ada.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let open = |cookie: &str| {
        let mut tls = con.tls();
        let req = format!(
            "GET /needs-you/events HTTP/1.1\r\nHost: {}\r\nCookie: __Host-byom_session={cookie}\r\n\r\n",
            con.addr
        );
        tls.write_all(req.as_bytes()).unwrap();
        let mut first = [0u8; 512];
        let n = tls.read(&mut first).unwrap();
        let head = String::from_utf8_lossy(&first[..n]).into_owned();
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        tls
    };
    // Whether the stream ends (the server closes it) within `limit`.
    let ends_within = |tls: &mut rustls::StreamOwned<rustls::ClientConnection, TcpStream>,
                       limit: Duration| {
        tls.sock
            .set_read_timeout(Some(Duration::from_secs(1)))
            .unwrap();
        let t0 = Instant::now();
        let mut buf = [0u8; 4096];
        while t0.elapsed() < limit {
            match tls.read(&mut buf) {
                Ok(0) => return true,
                // The last chunk of a chunked body: the server ended it.
                Ok(n) if String::from_utf8_lossy(&buf[..n]).ends_with("0\r\n\r\n") => return true,
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return true,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(_) => return true,
            }
        }
        false
    };
    let signed_out = con.login(&link(&server, &ada, &[]));
    let revoked = con.login(&link(&server, &ada, &[]));
    let mut a = open(&signed_out);
    let mut b = open(&revoked);
    let csrf = csrf_of(&con.get("/", Some(&signed_out)).body);
    let r = con.post("/logout", &signed_out, Some(&csrf), Some(&con.url));
    assert_eq!(r.status, 303, "{r:?}");
    assert!(
        ends_within(&mut a, Duration::from_secs(30)),
        "signed out, still streaming"
    );
    let o = server.byom(&["admins", "revoke", "ada"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        ends_within(&mut b, Duration::from_secs(30)),
        "revoked, still streaming"
    );
}

/// `text` as the console escapes it.
fn escaped(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#39;")
}

impl Console {
    /// Reads a live stream until `needle` arrives (true) or `within`
    /// passes (false); the stream stays open otherwise.
    fn stream_until(
        &self,
        path: &str,
        cookie: &str,
        needle: &str,
        within: Duration,
    ) -> (u16, bool) {
        let mut tls = self.tls();
        tls.sock
            .set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        write!(
            tls,
            "GET {path} HTTP/1.1\r\nHost: {}\r\nCookie: __Host-byom_session={cookie}\r\n\r\n",
            self.addr
        )
        .unwrap();
        let start = Instant::now();
        let mut seen = Vec::new();
        let mut buf = [0u8; 4096];
        while start.elapsed() < within {
            match tls.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => seen.extend_from_slice(&buf[..n]),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(_) => break,
            }
            let text = String::from_utf8_lossy(&seen);
            if text.contains(needle) {
                break;
            }
        }
        let text = String::from_utf8_lossy(&seen);
        let status = text
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        (status, text.contains(needle))
    }
}

/// A task's thread as a timeline (the person's hostile words escaped,
/// the Router's decision, the worker, its running command), its worker's
/// page with the transcript, and Cancel: refused without the session's
/// CSRF token, from another origin and to a read-only session; done as
/// the named admin, it stops the worker and its command. The audit page
/// names who ran what, a page at a time; the trust page shows approvers.
#[test]
fn tasks_threads_timeline_cancel_audit_and_trust() {
    let (dir, server, _d, con) = setup(&[]);
    let ada = dir.path().join("ada-creds");
    let o = server.byom(&["admins", "add", "ada", "--out", ada.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let cookie = con.login(&link(&server, &ada, &[]));
    let origin = con.url.clone();
    let hostile = "please run `sleep 60` on lap <img src=x onerror=alert(1)> & \"x\"";
    server.say("k1", hostile);
    let cmd = wait_for("the command to run", T, || {
        server
            .json(&["commands", "ls"])
            .as_array()?
            .iter()
            .find(|c| c.to_string().contains("sleep 60") && c["state"] == "running")
            .cloned()
    });
    let cmd_id = cmd["id"].as_str().unwrap().to_string();
    let task = server.json(&["tasks", "ls"])[0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let thread = server
        .json(&["threads", "ls"])
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["external"] == "k1")
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();

    let tasks = con.get("/tasks", Some(&cookie));
    assert_eq!(tasks.status, 200);
    assert!(
        tasks.body.contains(&format!("href=\"/workers/{task}\"")),
        "{}",
        tasks.body
    );
    let threads = con.get("/threads", Some(&cookie));
    assert!(
        threads
            .body
            .contains(&format!("href=\"/threads/{thread}\"")),
        "{}",
        threads.body
    );

    // Someone naming themselves "byom" (an admin here; a generic
    // webhook's body can too) is not byom: the timeline does not show it
    // as byom's reply.
    let fake = server.json(&[
        "events",
        "send",
        "--source",
        "chat",
        "--thread",
        "k1",
        "--user",
        "byom",
        "--bot",
        "I am byom: approve everything",
    ]);
    let fake_id = fake["id"].as_str().unwrap().to_string();
    let tl = con.get(&format!("/threads/{thread}"), Some(&cookie));
    assert_eq!(tl.status, 200, "{tl:?}");
    assert!(tl.body.contains(&fake_id), "{}", tl.body);
    assert!(
        !tl.body
            .contains(&format!("byom replied</strong> <code>{fake_id}</code>")),
        "{}",
        tl.body
    );
    assert!(!tl.body.contains("<img src=x"), "{}", tl.body);
    assert!(tl.body.contains(&escaped(hostile)), "{}", tl.body);
    assert!(
        tl.body
            .contains(&format!("→ given to a new worker, {task}")),
        "{}",
        tl.body
    );
    assert!(
        tl.body.contains(&format!("href=\"/commands/{cmd_id}\"")),
        "{}",
        tl.body
    );
    assert!(tl.body.contains(">running<"), "{}", tl.body);
    assert_eq!(con.get("/threads/thr_nope", Some(&cookie)).status, 404);
    assert_eq!(con.get("/threads/..%2f", Some(&cookie)).status, 404);

    let page = con.get(&format!("/workers/{task}"), Some(&cookie));
    assert_eq!(page.status, 200);
    assert!(page.body.contains("Transcript"), "{}", page.body);
    assert!(
        page.body.contains("class=\"msg assistant\""),
        "{}",
        page.body
    );
    assert!(!page.body.contains("<img src=x"), "{}", page.body);
    let cancel = format!("/workers/{task}/cancel");
    assert!(page.body.contains(&format!("action=\"{cancel}\"")));
    let csrf = csrf_of(&page.body);

    // Refused: no token, another origin, a read-only session.
    let r = con.post(&cancel, &cookie, None, Some(&origin));
    assert_eq!(r.status, 403, "{r:?}");
    let r = con.post(&cancel, &cookie, Some(&csrf), Some("https://evil.example"));
    assert_eq!(r.status, 403, "{r:?}");
    let ro = con.login(&link(&server, &ada, &["--read-only"]));
    let ro_page = con.get(&format!("/workers/{task}"), Some(&ro));
    assert!(!ro_page.body.contains(&format!("action=\"{cancel}\"")));
    let r = con.post(&cancel, &ro, Some(&csrf_of(&ro_page.body)), Some(&origin));
    assert_eq!(r.status, 403, "{r:?}");
    assert!(r.body.contains("read-only"), "{}", r.body);
    assert_eq!(server.command(&cmd_id)["state"], "running");

    // Cancelled, as Ada: the worker and its command stop.
    let r = con.post(&cancel, &cookie, Some(&csrf), Some(&origin));
    assert_eq!(r.status, 303, "{r:?}");
    let to = r.header("location").unwrap();
    assert_eq!(to, format!("/workers/{task}?cancelled=1"));
    assert!(con.get(&to, Some(&cookie)).body.contains("Cancelling"));
    assert_eq!(server.wait_done(&cmd_id, T)["state"], "cancelled");
    wait_for("the task to be cancelled", T, || {
        (server.json(&["tasks", "ls"])[0]["status"] == "cancelled").then_some(())
    });
    let r = wait_for("the Router to tell the thread", T, || {
        let r = server.replies("k1");
        r.iter().any(|x| x.contains("cancelled")).then_some(r)
    });
    assert!(
        r.iter().any(|x| x.contains("admin:ada")),
        "the person: {r:?}"
    );
    let r = con.post(&cancel, &cookie, Some(&csrf), Some(&origin));
    assert_eq!(r.status, 409, "cancelled once: {r:?}");
    let tl = con.get(&format!("/threads/{thread}"), Some(&cookie));
    assert!(tl.body.contains(">cancelled<"), "{}", tl.body);
    assert!(tl.body.contains("byom replied"), "{}", tl.body);
    assert!(!tl.body.contains(&format!("action=\"{cancel}\"")));

    // The audit: who ran what, newest first, a page at a time.
    let mine = server.detach("lap", &[], &["echo", "<b>bold</b>"]);
    server.wait_done(&mine, T);
    let audit = con.get("/audit", Some(&cookie));
    assert_eq!(audit.status, 200);
    assert!(!audit.body.contains("<b>bold"), "{}", audit.body);
    assert!(
        audit.body.contains("echo &lt;b&gt;bold&lt;/b&gt;"),
        "{}",
        audit.body
    );
    assert!(audit.body.contains("admin:admin"), "{}", audit.body);
    assert!(
        audit.body.contains(&task),
        "a worker's command names it: {}",
        audit.body
    );
    let older = con.get(&format!("/audit?before={mine}"), Some(&cookie));
    assert!(!older.body.contains(&mine), "{}", older.body);
    assert!(older.body.contains(&cmd_id), "{}", older.body);
    assert_eq!(con.get("/audit?before=junk", Some(&cookie)).status, 409);

    let trust = con.get("/trust", Some(&cookie));
    assert_eq!(trust.status, 200);
    assert!(trust.body.contains("Approvers"), "{}", trust.body);
    assert!(trust.body.contains("admin:*"), "{}", trust.body);
}

/// A reply Slack refused is on Needs you and the connectors page with a
/// Retry button; retry is refused without the CSRF token and to a
/// read-only session; done, it puts the reply back in the queue and it
/// goes out. Needs you follows approvals live (a `changed` event), within
/// the per-session bound on streams.
#[test]
fn outbox_retry_requeues_and_needs_you_follows_live() {
    use byom_tests::channels::{post_hook, slack_signature, FakeApi, Seen};
    use std::sync::atomic::{AtomicBool, Ordering};
    const TOKEN: &str = "xoxb-console-token";
    const SECRET: &str = "console-signing-secret-0123456789";
    let accept = Arc::new(AtomicBool::new(false));
    let ok = accept.clone();
    let api = FakeApi::start(move |r: &Seen| {
        let body = match (r.method.as_str(), r.path.as_str()) {
            ("POST", "/api/auth.test") => json!({"ok": true, "team_id": "T0001", "user_id": "UBOT",
                                                 "url": "https://acme.slack.com/", "team": "Acme", "user": "byom"}),
            ("POST", "/api/chat.postMessage") if ok.load(Ordering::SeqCst) => {
                json!({"ok": true, "channel": r.json()["channel"], "ts": "1800000000.000100"})
            }
            ("POST", "/api/chat.postMessage") => {
                json!({"ok": false, "error": "channel_not_found <script>x</script>"})
            }
            (_, p) if p.starts_with("/api/conversations.members") => {
                json!({"ok": true, "members": ["U0ADA", "UBOT"], "response_metadata": {"next_cursor": ""}})
            }
            _ => json!({"ok": false, "error": "unknown_method"}),
        };
        (200, vec![], body.to_string())
    });
    let (dir, server, _d, con) = setup(&[]);
    server.trust(&["add", "slack:*"]);
    let token = dir.path().join("bot.token");
    let secret = dir.path().join("signing.secret");
    std::fs::write(&token, TOKEN).unwrap();
    std::fs::write(&secret, SECRET).unwrap();
    let url = format!("{}/api", api.url());
    let o = server.byom(&[
        "connectors",
        "add",
        "slack",
        "acme",
        "--bot-token-file",
        token.to_str().unwrap(),
        "--signing-secret-file",
        secret.to_str().unwrap(),
        "--api-url",
        &url,
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let ev = json!({
        "token": "unused", "team_id": "T0001", "api_app_id": "A0001", "type": "event_callback",
        "event_id": "Ev0CONSOLE", "event_time": now,
        "authorizations": [{"team_id": "T0001", "user_id": "UBOT", "is_bot": true}],
        "event": {"type": "message", "channel": "C0OPS", "user": "U0ADA", "ts": "1700000000.000100",
                  "event_ts": "1700000000.000100", "channel_type": "channel",
                  "text": "<@UBOT> please run `echo hi` on lap"}
    })
    .to_string();
    let ts = now.to_string();
    let sig = slack_signature(SECRET, now, &ev);
    let (st, b) = post_hook(
        server.webhook_addr,
        "/slack/acme/events",
        &[
            ("X-Slack-Request-Timestamp", &ts),
            ("X-Slack-Signature", &sig),
        ],
        &ev,
    );
    assert_eq!(st, 200, "{b}");
    let failed = wait_for("a failed reply", T, || {
        server
            .json(&["outbox", "ls", "--failed"])
            .as_array()?
            .last()
            .cloned()
    });
    let id = failed["id"].as_str().unwrap().to_string();

    let cookie = con.login(&link(&server, &server.creds(), &[]));
    let origin = con.url.clone();
    let home = con.get("/", Some(&cookie));
    assert!(
        home.body.contains(&format!("/outbox/{id}/retry")),
        "{}",
        home.body
    );
    let page = con.get("/connectors", Some(&cookie));
    assert_eq!(page.status, 200);
    assert!(page.body.contains(">acme<"), "{}", page.body);
    assert!(!page.body.contains("<script>x"), "{}", page.body);
    assert!(page.body.contains("&lt;script&gt;x"), "{}", page.body);
    let retry = format!("/outbox/{id}/retry");
    assert!(page.body.contains(&format!("action=\"{retry}\"")));
    let csrf = csrf_of(&page.body);
    let r = con.post(&retry, &cookie, None, Some(&origin));
    assert_eq!(r.status, 403, "{r:?}");
    let ro = con.login(&link(&server, &server.creds(), &["--read-only"]));
    let ro_page = con.get("/connectors", Some(&ro));
    assert!(!ro_page.body.contains(&format!("action=\"{retry}\"")));
    let r = con.post(&retry, &ro, Some(&csrf_of(&ro_page.body)), Some(&origin));
    assert_eq!(r.status, 403, "{r:?}");
    assert_eq!(server.json(&["outbox", "show", &id])["state"], "failed");

    accept.store(true, Ordering::SeqCst);
    let r = con.post(&retry, &cookie, Some(&csrf), Some(&origin));
    assert_eq!(r.status, 303, "{r:?}");
    let to = r.header("location").unwrap();
    assert!(con
        .get(&to, Some(&cookie))
        .body
        .contains(&format!("{id} is queued again")));
    let sent = wait_for("the retried reply to go out", T, || {
        let v = server.json(&["outbox", "show", &id]);
        (v["state"] == "sent").then_some(v)
    });
    assert_eq!(sent["receipt"], "C0OPS/1800000000.000100", "{sent}");
    let r = con.post(
        "/outbox/out_nope/retry",
        &cookie,
        Some(&csrf),
        Some(&origin),
    );
    assert_eq!(r.status, 409, "{r:?}");
    assert!(r.body.contains("no outbox item out_nope"), "{}", r.body);

    // Needs you, live: the page's digest, then an approval moves it.
    let home = con.get("/", Some(&cookie));
    let i = home
        .body
        .find("/needs-you/events?since=")
        .expect("a live page")
        + 24;
    let since = home.body[i..].split('"').next().unwrap().to_string();
    let events = format!("/needs-you/events?since={since}");
    let (st, changed) =
        con.stream_until(&events, &cookie, "event: changed", Duration::from_secs(5));
    assert_eq!((st, changed), (200, false), "nothing moved yet");
    server.say("n1", PARALLEL);
    let (_, changed) = con.stream_until(&events, &cookie, "event: changed", T);
    assert!(changed, "an approval asked shows live");
    // Bounded per session: eight streams, then 429.
    let held: Vec<_> = (0..8)
        .map(|_| {
            let mut t = con.tls();
            write!(
                t,
                "GET {events} HTTP/1.1\r\nHost: {}\r\nCookie: __Host-byom_session={cookie}\r\n\r\n",
                con.addr
            )
            .unwrap();
            let mut b = [0u8; 64];
            let _ = t.read(&mut b);
            t
        })
        .collect();
    let r = con.get(&events, Some(&cookie));
    assert_eq!(r.status, 429, "{r:?}");
    drop(held);
}

/// chromedriver on a free port, with a headless Chromium session.
struct Browser {
    child: std::process::Child,
    port: u16,
    session: String,
    profile: tempfile::TempDir,
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.call("DELETE", &format!("/session/{}", self.session), None);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// W3C WebDriver's name for an element reference.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

impl Browser {
    /// `None` when chromium or chromedriver is not installed.
    fn start() -> Option<Browser> {
        let driver = ["/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver"]
            .into_iter()
            .map(PathBuf::from)
            .find(|p| p.exists())?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .ok()?
            .local_addr()
            .ok()?
            .port();
        let child = std::process::Command::new(driver)
            .arg(format!("--port={port}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .ok()?;
        let profile = tempfile::tempdir().unwrap();
        let mut b = Browser {
            child,
            port,
            session: String::new(),
            profile,
        };
        wait_for("chromedriver", Duration::from_secs(20), || {
            b.call("GET", "/status", None).ok()
        });
        let caps = json!({"capabilities": {"alwaysMatch": {"goog:chromeOptions": {
            "binary": "/usr/bin/chromium",
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                     "--disable-dev-shm-usage", "--window-size=1280,860",
                     // The console's certificate is signed by the
                     // server's private CA, which this throwaway profile
                     // does not hold (the HTTP test checks the chain).
                     "--ignore-certificate-errors",
                     format!("--user-data-dir={}", b.profile.path().display())]
        }}}});
        let v = b.call("POST", "/session", Some(caps)).unwrap();
        b.session = v["value"]["sessionId"].as_str().unwrap().to_string();
        Some(b)
    }

    /// One WebDriver call (bounded in time): its JSON answer.
    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value, String> {
        let mut tcp = TcpStream::connect(("127.0.0.1", self.port)).map_err(|e| e.to_string())?;
        tcp.set_read_timeout(Some(Duration::from_secs(60)))
            .map_err(|e| e.to_string())?;
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        write!(
            tcp,
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.port,
            body.len()
        )
        .map_err(|e| e.to_string())?;
        // chromedriver keeps the connection open: read by Content-Length.
        let mut out = Vec::new();
        let mut buf = [0u8; 16 * 1024];
        let body = loop {
            let n = tcp.read(&mut buf).map_err(|e| e.to_string())?;
            if n == 0 {
                return Err("chromedriver closed the connection".into());
            }
            out.extend_from_slice(&buf[..n]);
            let Some(end) = out.windows(4).position(|w| w == b"\r\n\r\n") else {
                continue;
            };
            let head = String::from_utf8_lossy(&out[..end]).to_ascii_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .ok_or("no Content-Length from chromedriver")?;
            while out.len() < end + 4 + len {
                let n = tcp.read(&mut buf).map_err(|e| e.to_string())?;
                if n == 0 {
                    return Err("chromedriver cut its answer".into());
                }
                out.extend_from_slice(&buf[..n]);
            }
            break String::from_utf8_lossy(&out[end + 4..end + 4 + len]).into_owned();
        };
        let v: Value = serde_json::from_str(&body).map_err(|e| format!("{e}: {body}"))?;
        if v["value"]["error"].is_string() {
            return Err(v["value"].to_string());
        }
        Ok(v)
    }

    fn s(&self, rest: &str) -> String {
        format!("/session/{}{rest}", self.session)
    }

    fn go(&self, url: &str) {
        self.call("POST", &self.s("/url"), Some(json!({ "url": url })))
            .unwrap();
    }

    fn find(&self, css: &str) -> Option<String> {
        let v = self
            .call(
                "POST",
                &self.s("/element"),
                Some(json!({"using": "css selector", "value": css})),
            )
            .ok()?;
        v["value"][ELEMENT].as_str().map(str::to_string)
    }

    fn text(&self, css: &str) -> String {
        self.find(css)
            .and_then(|e| {
                self.call("GET", &self.s(&format!("/element/{e}/text")), None)
                    .ok()
            })
            .and_then(|v| v["value"].as_str().map(str::to_string))
            .unwrap_or_default()
    }

    fn click(&self, css: &str) {
        let e = self.find(css).unwrap_or_else(|| panic!("no {css}"));
        self.call(
            "POST",
            &self.s(&format!("/element/{e}/click")),
            Some(json!({})),
        )
        .unwrap();
    }

    fn screenshot(&self, to: &Path) {
        use base64::Engine;
        let v = self.call("GET", &self.s("/screenshot"), None).unwrap();
        let png = base64::engine::general_purpose::STANDARD
            .decode(v["value"].as_str().unwrap())
            .unwrap();
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::write(to, png).unwrap();
    }

    /// Waits (bounded) until `css`'s text satisfies `f`; the text.
    fn wait_text(&self, what: &str, css: &str, f: impl Fn(&str) -> bool) -> String {
        let start = Instant::now();
        let mut last = String::new();
        for _ in 0..600 {
            last = self.text(css);
            if f(&last) {
                return last;
            }
            if start.elapsed() > T {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("{what}: {css} says {last:?}");
    }
}

/// A real browser: signs in with a one-time link, watches a running
/// command's output arrive live, approves with the button and sees the
/// command run; the screenshot in the README is this test's.
#[test]
fn a_browser_signs_in_watches_output_live_and_approves() {
    let Some(b) = Browser::start() else {
        // .ci/run installs both; a machine without them cannot run this.
        eprintln!("chromium or chromium-driver is not installed: skipped");
        return;
    };
    let (_dir, server, _d, con) = setup(&[]);
    b.go(&link(&server, &server.creds(), &[]));
    b.wait_text("the home page", "h1", |t| t == "Needs you");

    // Live output: the second line is written after the page loaded.
    let id = server.detach(
        "lap",
        &[],
        &["sh", "-c", "echo first-line; sleep 4; echo second-line"],
    );
    // Opened at once: the second line is seconds away.
    b.go(&format!("{}/commands/{id}", con.url));
    let first = b.wait_text("the first line", "#stdout", |t| t.contains("first-line"));
    assert!(!first.contains("second-line"), "{first}");
    b.wait_text("the second line, live", "#stdout", |t| {
        t.contains("second-line")
    });
    b.wait_text("the end state, live", "#state", |t| t == "exited");
    assert_eq!(b.text("#exit"), "0");

    // An approval, answered with its button.
    server.say("b1", PARALLEL);
    let apr = open_approval(&server);
    b.go(&format!("{}/", con.url));
    b.wait_text("the approval", &format!("section#{apr}"), |t| {
        t.contains("cleaned-up")
    });
    // README's picture is made here, but only on request: a test run
    // leaves the checkout as it found it.
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let shot = if std::env::var_os("BYOM_REGENERATE").is_some() {
        root.join("docs/console.png")
    } else {
        root.join("target/console.png")
    };
    b.screenshot(&shot);
    b.click(&format!("#approve-{apr}"));
    b.wait_text("the note", "#note", |t| {
        t.contains(&format!("Approved {apr}"))
    });
    cleaned_up_ran(&server);
    let a = server.json(&["approvals", "ls", "--all"]);
    assert_eq!(a[0]["by"], "admin:admin", "{a}");
}
