//! Real peers for the channel tests: a Synapse homeserver started on
//! loopback (SQLite, rate limits raised, registration by shared secret),
//! Slack's own SDK for request signatures, GitHub's example webhooks from
//! npm, and a loopback HTTP server that plays a provider's REST API and
//! records every request so tests can check method, auth and body.
//!
//! `.ci/run` installs the Python packages into `target/ci-venv` and the
//! npm package into `target/ci-npm`; `BYOM_CI_VENV` and
//! `BYOM_OCTOKIT_EXAMPLES` point elsewhere.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// The workspace root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

/// The virtualenv's Python with Synapse and slack_sdk.
pub fn venv_python() -> PathBuf {
    let venv = std::env::var_os("BYOM_CI_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target/ci-venv"));
    let py = venv.join("bin/python");
    assert!(
        py.exists(),
        "{} is missing: run `bash .ci/run` once (it installs Synapse and slack_sdk there) or set BYOM_CI_VENV",
        py.display()
    );
    py
}

/// GitHub's example webhook payloads (`@octokit/webhooks-examples`).
pub fn octokit_examples() -> Value {
    let p = std::env::var_os("BYOM_OCTOKIT_EXAMPLES")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            root().join(
                "target/ci-npm/node_modules/@octokit/webhooks-examples/api.github.com/index.json",
            )
        });
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| {
        panic!(
            "{}: {e}: run `bash .ci/run` once (it installs @octokit/webhooks-examples) or set BYOM_OCTOKIT_EXAMPLES",
            p.display()
        )
    });
    serde_json::from_str(&text).expect("examples are JSON")
}

/// Slack's signature for `body` at `ts`, made by Slack's own SDK.
pub fn slack_signature(secret: &str, ts: u64, body: &str) -> String {
    let mut child = Command::new(venv_python())
        .args([
            "-c",
            "import sys; from slack_sdk.signature import SignatureVerifier as V; \
             print(V(sys.argv[1]).generate_signature(timestamp=sys.argv[2], body=sys.stdin.read()))",
            secret,
            &ts.to_string(),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("run python");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(body.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "slack_sdk failed");
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// A free loopback TCP port (released before use; good enough on
/// loopback in tests).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One HTTP/1.1 request with a JSON body; (status, JSON or Null). Reads
/// chunked and sized bodies.
pub fn http(method: &str, url: &str, headers: &[(&str, &str)], body: Option<&str>) -> (u16, Value) {
    let (status, _, text) = http_raw(method, url, headers, body);
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// [`http`] returning the response headers and raw body too.
pub fn http_raw(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> (u16, Vec<(String, String)>, String) {
    let rest = url.strip_prefix("http://").expect("http:// URL");
    let (host, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let path = if path.is_empty() { "/" } else { path };
    let mut s = TcpStream::connect(host).unwrap_or_else(|e| panic!("connect {host}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let body = body.unwrap_or("");
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    if !body.is_empty() {
        req.push_str("Content-Type: application/json\r\n");
    }
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes()).unwrap();
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, rest) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|x| x.parse().ok())
        .unwrap_or(0);
    let hdrs: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_lowercase(), v.trim().to_string()))
        .collect();
    let chunked = hdrs
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"));
    let body = if chunked {
        let mut out = String::new();
        let mut r = rest;
        while let Some((size, after)) = r.split_once("\r\n") {
            let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
            if n == 0 || after.len() < n {
                break;
            }
            out.push_str(&after[..n]);
            r = after[n..].strip_prefix("\r\n").unwrap_or(&after[n..]);
        }
        out
    } else {
        rest.to_string()
    };
    (status, hdrs, body)
}

/// A Synapse homeserver on loopback, killed on drop.
pub struct Synapse {
    child: Option<Child>,
    dir: PathBuf,
    pub port: u16,
    pub url: String,
}

const SHARED_SECRET: &str = "byom-test-registration-secret";

impl Synapse {
    pub fn start(dir: &Path) -> Synapse {
        let dir = dir.join("synapse");
        std::fs::create_dir_all(&dir).unwrap();
        let port = free_port();
        let d = dir.display();
        let limit = "{per_second: 10000, burst_count: 10000}";
        let cfg = format!(
            r#"server_name: "localhost"
pid_file: {d}/hs.pid
listeners:
  - port: {port}
    bind_addresses: ['127.0.0.1']
    type: http
    tls: false
    x_forwarded: false
    resources:
      - names: [client]
        compress: false
database:
  name: sqlite3
  args:
    database: {d}/hs.db
media_store_path: {d}/media
registration_shared_secret: "{SHARED_SECRET}"
report_stats: false
macaroon_secret_key: "byom-test-macaroon"
form_secret: "byom-test-form"
signing_key_path: "{d}/hs.signing.key"
trusted_key_servers: []
suppress_key_server_warning: true
enable_metrics: false
presence:
  enabled: false
url_preview_enabled: false
rc_message: {limit}
rc_registration: {limit}
rc_login:
  address: {limit}
  account: {limit}
  failed_attempts: {limit}
rc_joins:
  local: {limit}
  remote: {limit}
rc_invites:
  per_room: {limit}
  per_user: {limit}
"#
        );
        std::fs::write(dir.join("hs.yaml"), cfg).unwrap();
        let st = Command::new(venv_python())
            .args(["-m", "synapse.app.homeserver", "--config-path"])
            .arg(dir.join("hs.yaml"))
            .arg("--generate-keys")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("run synapse");
        assert!(st.success(), "synapse --generate-keys failed");
        let mut s = Synapse {
            child: None,
            dir,
            port,
            url: format!("http://127.0.0.1:{port}"),
        };
        s.launch();
        s
    }

    fn launch(&mut self) {
        let log = std::fs::File::create(self.dir.join("hs.out")).unwrap();
        let child = Command::new(venv_python())
            .args(["-m", "synapse.app.homeserver", "--config-path"])
            .arg(self.dir.join("hs.yaml"))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start synapse");
        self.child = Some(child);
        let t = Instant::now();
        loop {
            if TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                let (st, _) = http(
                    "GET",
                    &format!("{}/_matrix/client/versions", self.url),
                    &[],
                    None,
                );
                if st == 200 {
                    return;
                }
            }
            assert!(
                t.elapsed() < Duration::from_secs(90),
                "synapse did not start: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    pub fn log(&self) -> String {
        let t = std::fs::read_to_string(self.dir.join("hs.out")).unwrap_or_default();
        t.lines()
            .rev()
            .take(40)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Stops it (the database stays).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn restart(&mut self) {
        self.stop();
        self.launch();
    }

    /// Freezes (SIGSTOP) or thaws (SIGCONT) the homeserver.
    pub fn freeze(&self, on: bool) {
        if let Some(c) = &self.child {
            // SAFETY: signalling our own child process.
            unsafe {
                libc::kill(
                    c.id() as i32,
                    if on { libc::SIGSTOP } else { libc::SIGCONT },
                );
            }
        }
    }

    /// Registers `user` with the shared-secret admin API; (user ID, token).
    pub fn register(&self, user: &str) -> (String, String) {
        use ring::hmac;
        let (_, n) = http(
            "GET",
            &format!("{}/_synapse/admin/v1/register", self.url),
            &[],
            None,
        );
        let nonce = n["nonce"].as_str().expect("nonce").to_string();
        let password = format!("pw-{user}-0123456789");
        let msg = format!("{nonce}\0{user}\0{password}\0notadmin");
        let key = hmac::Key::new(
            hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY,
            SHARED_SECRET.as_bytes(),
        );
        let mac = byom_protocol::hex(hmac::sign(&key, msg.as_bytes()).as_ref());
        let body = json!({"nonce": nonce, "username": user, "password": password,
                          "admin": false, "mac": mac})
        .to_string();
        let (st, v) = http(
            "POST",
            &format!("{}/_synapse/admin/v1/register", self.url),
            &[],
            Some(&body),
        );
        assert_eq!(st, 200, "register {user}: {v}");
        (
            v["user_id"].as_str().unwrap().to_string(),
            v["access_token"].as_str().unwrap().to_string(),
        )
    }

    /// A client-server API call as the user with `token`.
    pub fn api(&self, method: &str, path: &str, token: &str, body: Option<Value>) -> (u16, Value) {
        let auth = format!("Bearer {token}");
        let body = body.map(|b| b.to_string());
        http(
            method,
            &format!("{}/_matrix/client/v3{path}", self.url),
            &[("Authorization", &auth)],
            body.as_deref(),
        )
    }

    /// Messages of `room` (newest first), as `token` sees them.
    pub fn messages(&self, room: &str, token: &str) -> Vec<Value> {
        let (st, v) = self.api(
            "GET",
            &format!("/rooms/{}/messages?dir=b&limit=100", enc(room)),
            token,
            None,
        );
        assert_eq!(st, 200, "{v}");
        v["chunk"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|e| e["type"] == "m.room.message")
            .collect()
    }

    /// Posts `content` in `room` as `token`'s user; the event ID.
    pub fn send(&self, room: &str, token: &str, content: Value) -> String {
        let txn = format!("t{:016x}", rand_u64());
        let (st, v) = self.api(
            "PUT",
            &format!("/rooms/{}/send/m.room.message/{txn}", enc(room)),
            token,
            Some(content),
        );
        assert_eq!(st, 200, "{v}");
        v["event_id"].as_str().unwrap().to_string()
    }
}

impl Drop for Synapse {
    fn drop(&mut self) {
        self.freeze(false);
        self.stop();
    }
}

fn rand_u64() -> u64 {
    let mut b = [0u8; 8];
    let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut b);
    u64::from_le_bytes(b)
}

/// Percent-encodes a path segment.
pub fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// A request the fake provider received.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: String,
    /// When it arrived.
    pub at: Instant,
}

impl Seen {
    pub fn header(&self, k: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(h, _)| h.eq_ignore_ascii_case(k))
            .map(|(_, v)| v.as_str())
    }
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or(Value::Null)
    }
}

/// The fake's answer: status, extra headers, JSON body.
pub type Answer = (u16, Vec<(String, String)>, String);
type Handler = dyn Fn(&Seen) -> Answer + Send + Sync;

/// A provider's REST API on loopback: every request is recorded, answered
/// by the test's handler.
pub struct FakeApi {
    pub addr: SocketAddr,
    pub seen: Arc<Mutex<Vec<Seen>>>,
}

impl FakeApi {
    pub fn start(handler: impl Fn(&Seen) -> Answer + Send + Sync + 'static) -> FakeApi {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let handler: Arc<Handler> = Arc::new(handler);
        let s2 = seen.clone();
        std::thread::spawn(move || {
            for conn in l.incoming().flatten() {
                let (seen, handler) = (s2.clone(), handler.clone());
                std::thread::spawn(move || serve_one(conn, &seen, handler.as_ref()));
            }
        });
        FakeApi { addr, seen }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn requests(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

fn serve_one(conn: TcpStream, seen: &Mutex<Vec<Seen>>, handler: &Handler) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
    let mut r = BufReader::new(conn.try_clone().unwrap());
    let mut line = String::new();
    if r.read_line(&mut line).unwrap_or(0) == 0 {
        return;
    }
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or("").to_string();
    let path = parts.next().unwrap_or("").to_string();
    let mut headers = Vec::new();
    let mut len = 0usize;
    loop {
        let mut h = String::new();
        if r.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            let (k, v) = (k.trim().to_string(), v.trim().to_string());
            if k.eq_ignore_ascii_case("content-length") {
                len = v.parse().unwrap_or(0);
            }
            headers.push((k, v));
        }
    }
    let mut body = vec![0u8; len];
    let _ = r.read_exact(&mut body);
    let req = Seen {
        method,
        path,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
        at: Instant::now(),
    };
    let (status, extra, text) = handler(&req);
    seen.lock().unwrap().push(req);
    let mut out = format!(
        "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n",
        text.len()
    );
    for (k, v) in extra {
        out.push_str(&format!("{k}: {v}\r\n"));
    }
    out.push_str("\r\n");
    out.push_str(&text);
    let mut conn = conn;
    let _ = conn.write_all(out.as_bytes());
}

/// POSTs `body` to the server's webhook port at `path` with `headers`.
pub fn post_hook(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, Value) {
    http("POST", &format!("http://{addr}{path}"), headers, Some(body))
}

/// A room on a Synapse where `ada` invited the bot, the bot connected to
/// a byom server as the Matrix connector `team` and joined.
pub struct MatrixRoom {
    pub bot: String,
    pub bot_token: String,
    pub ada_id: String,
    /// ada's access token.
    pub ada: String,
    pub room: String,
}

/// Registers the bot and ada on `syn`, makes ada's room with the bot
/// invited, adds the connector to `server` (the token from a file in
/// `dir`) and waits until the bot has joined.
pub fn matrix_room(server: &crate::Server, syn: &Synapse, dir: &Path) -> MatrixRoom {
    let (bot, bot_token) = syn.register("byom");
    let (ada_id, ada) = syn.register("ada");
    let (st, v) = syn.api(
        "POST",
        "/createRoom",
        &ada,
        Some(json!({"name": "ops", "invite": [bot]})),
    );
    assert_eq!(st, 200, "{v}");
    let room = v["room_id"].as_str().unwrap().to_string();
    let token_file = dir.join("matrix.token");
    std::fs::write(&token_file, format!("{bot_token}\n")).unwrap();
    let out = server.byom(&[
        "connectors",
        "add",
        "matrix",
        "team",
        "--homeserver",
        &syn.url,
        "--user-id",
        &bot,
        "--access-token-file",
        token_file.to_str().unwrap(),
        "--invite-from",
        &ada_id,
    ]);
    assert!(out.status.success(), "{}", crate::stderr(&out));
    assert!(
        !crate::stdout(&out).contains(&bot_token),
        "the token is never printed"
    );
    crate::wait_for("the bot to join", Duration::from_secs(90), || {
        let (_, v) = syn.api(
            "GET",
            &format!("/rooms/{}/joined_members", enc(&room)),
            &ada,
            None,
        );
        v["joined"].get(&bot).map(|_| ())
    });
    MatrixRoom {
        bot,
        bot_token,
        ada_id,
        ada,
        room,
    }
}

/// Adds the GitHub connector `name` to `server` with webhook secret
/// `secret` (written to a file in `dir`), the API at `api`, the bot's
/// login, and `auth` (`--token-file F` or `--app-id N --private-key-file F`).
pub fn connect_github(
    server: &crate::Server,
    dir: &Path,
    name: &str,
    secret: &str,
    api: &str,
    bot_login: &str,
    auth: &[&str],
) {
    let f = dir.join(format!("{name}.secret"));
    std::fs::write(&f, secret).unwrap();
    let mut args = vec![
        "connectors",
        "add",
        "github",
        name,
        "--webhook-secret-file",
        f.to_str().unwrap(),
        "--api-url",
        api,
        "--bot-login",
        bot_login,
    ];
    args.extend_from_slice(auth);
    let out = server.byom(&args);
    assert!(out.status.success(), "{}", crate::stderr(&out));
}
