//! Test harness for byom's end-to-end tests and benchmarks: starts real
//! `byom server` and `byomd` processes on loopback with real sled stores in
//! temp dirs, drives them through the real CLI, and provides a UDP proxy
//! that can cut the network between a daemon and the server.
//!
//! It knows nothing the tests could not learn from outside: binaries, files
//! they write (`server.json`), and their command lines.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

pub mod channels;
pub mod provider;
pub mod proxy;

/// Directory holding the `byom` and `byomd` binaries: `BYOM_BIN_DIR`, else
/// the cargo target dir this test binary was built into.
pub fn bin_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("BYOM_BIN_DIR") {
        return PathBuf::from(d);
    }
    let exe = std::env::current_exe().expect("current exe");
    // target/<profile>/deps/test-xxxx → target/<profile>
    let mut dir = exe.parent().expect("exe dir").to_path_buf();
    if dir.ends_with("deps") {
        dir.pop();
    }
    dir
}

pub fn bin(name: &str) -> PathBuf {
    let p = bin_dir().join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    assert!(
        p.exists(),
        "{} not built: run `cargo build --workspace` (or cargo test --workspace)",
        p.display()
    );
    p
}

/// Polls `f` every 50 ms until it returns Some or `timeout` passes.
pub fn wait_for<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let t = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            t.elapsed() < timeout,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Held by tests that assert a latency and by tests that flood the two
/// cores (fifty processes at once, crash loops), so a latency test never
/// measures the scheduler instead of byom. Poisoning is ignored: a failed
/// test must not fail the others.
pub fn cpu_heavy() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

fn kill(child: &mut Child, sig: i32) {
    // SAFETY: signalling our own child process.
    unsafe {
        libc::kill(child.id() as libc::pid_t, sig);
    }
}

fn signal(child: &mut Option<Child>, sig: i32) {
    if let Some(c) = child.as_mut() {
        kill(c, sig);
    }
}

/// Writes `<dir>/server/<file>`: a config file for the server that
/// `Server::start(dir)` then starts.
pub fn server_config(dir: &Path, file: &str, text: &str) {
    std::fs::create_dir_all(dir.join("server")).unwrap();
    std::fs::write(dir.join("server").join(file), text).unwrap();
}

/// A running `byom server`.
pub struct Server {
    child: Option<Child>,
    pub data_dir: PathBuf,
    pub quic_addr: SocketAddr,
    pub api_addr: SocketAddr,
    /// The TCP fallback's address.
    pub tcp_addr: SocketAddr,
    pub webhook_addr: SocketAddr,
    pub extra_args: Vec<String>,
    /// The server's open-file limit (soft and hard), if set: a host with
    /// the common 1,024.
    pub nofile: Option<u64>,
    /// Environment for the server process only (never this process's:
    /// tests run in parallel threads).
    pub env: Vec<(String, String)>,
    /// The shared store this server uses, if not the embedded one.
    pub store: Option<SharedStore>,
}

/// A PostgreSQL store for servers: the cluster (running while any server
/// holds it), the database URL and the key file its secrets are sealed
/// with.
#[derive(Clone)]
pub struct SharedStore {
    pub cluster: Arc<byom_store::testing::PgCluster>,
    pub url: String,
    pub key_file: PathBuf,
}

impl SharedStore {
    /// A database of its own for the test in `dir` (the same one each time
    /// it is asked for `dir`: a test restarts servers on their data), on
    /// this test binary's one cluster. Tests that stop or restart the
    /// cluster itself use [`SharedStore::in_dir`].
    pub fn database(dir: &Path) -> SharedStore {
        static DATABASES: Mutex<Vec<(PathBuf, String)>> = Mutex::new(Vec::new());
        let cluster = byom_store::testing::PgCluster::shared();
        let db = {
            let mut known = DATABASES.lock().unwrap_or_else(|p| p.into_inner());
            match known.iter().find(|(d, _)| d == dir) {
                Some((_, db)) => db.clone(),
                None => {
                    let db = cluster.fresh_database();
                    known.push((dir.to_path_buf(), db.clone()));
                    db
                }
            }
        };
        SharedStore::reached(cluster, &db, dir)
    }

    /// How a server reaches database `db` on `cluster`: as production
    /// should, encrypted, its certificate checked against the CA and the
    /// name.
    fn reached(cluster: Arc<byom_store::testing::PgCluster>, db: &str, dir: &Path) -> SharedStore {
        let url = format!(
            "postgres://byom@localhost:{}/{db}?sslmode=verify-full&sslrootcert={}",
            cluster.port(),
            cluster.ca_file().display()
        );
        SharedStore {
            cluster,
            url,
            key_file: dir.join("store.key"),
        }
    }

    /// A cluster in `<dir>/pg` (started again on its data if a test
    /// restarts), with database `byom`.
    pub fn in_dir(dir: &Path) -> SharedStore {
        static RUNNING: Mutex<Vec<(PathBuf, std::sync::Weak<byom_store::testing::PgCluster>)>> =
            Mutex::new(Vec::new());
        let pg = dir.join("pg");
        let mut running = RUNNING.lock().unwrap_or_else(|p| p.into_inner());
        running.retain(|(_, w)| w.strong_count() > 0);
        let cluster = match running
            .iter()
            .find(|(d, _)| *d == pg)
            .and_then(|(_, w)| w.upgrade())
        {
            Some(c) => c,
            None => {
                std::fs::create_dir_all(&pg).unwrap();
                let c = Arc::new(byom_store::testing::PgCluster::start_in(&pg, false));
                running.push((pg, Arc::downgrade(&c)));
                c
            }
        };
        // Creates database `byom`.
        cluster.url("byom");
        SharedStore::reached(cluster, "byom", dir)
    }
}

/// Whether this run's servers use PostgreSQL rather than the embedded
/// store: in test binaries named `*_pg` (the machine, agent and policy
/// suites again, so `cargo test` runs them on both backends), or any with
/// `BYOM_TEST_STORE=postgres`.
pub fn test_store_is_postgres() -> bool {
    let exe = std::env::current_exe().unwrap_or_default();
    let name = exe.file_name().and_then(|n| n.to_str()).unwrap_or("");
    // Cargo names test binaries `<target>-<hash>`.
    let pg_binary = name
        .rsplit_once('-')
        .is_some_and(|(t, _)| t.ends_with("_pg"));
    pg_binary || std::env::var("BYOM_TEST_STORE").is_ok_and(|v| v == "postgres")
}

impl Server {
    pub fn start(dir: &Path) -> Server {
        Self::start_with(dir, &[])
    }

    pub fn start_with(dir: &Path, extra: &[&str]) -> Server {
        Self::start_with_env(dir, extra, &[])
    }

    pub fn start_with_env(dir: &Path, extra: &[&str], env: &[(&str, &str)]) -> Server {
        Self::launched(dir, extra, env, None)
    }

    /// A server that may open at most `nofile` files (soft and hard limit).
    pub fn start_limited(dir: &Path, nofile: u64) -> Server {
        Self::launched(dir, &[], &[], Some(nofile))
    }

    fn launched(dir: &Path, extra: &[&str], env: &[(&str, &str)], nofile: Option<u64>) -> Server {
        let mut s = Server {
            child: None,
            data_dir: dir.join("server"),
            quic_addr: "127.0.0.1:0".parse().unwrap(),
            api_addr: "127.0.0.1:0".parse().unwrap(),
            tcp_addr: "127.0.0.1:0".parse().unwrap(),
            webhook_addr: "127.0.0.1:0".parse().unwrap(),
            extra_args: extra.iter().map(|s| s.to_string()).collect(),
            nofile,
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            store: test_store_is_postgres().then(|| SharedStore::database(dir)),
        };
        s.launch();
        s
    }

    /// A server on `store`, with its own data dir `<dir>/<name>`: one of
    /// several replicas.
    pub fn replica(dir: &Path, name: &str, store: &SharedStore, extra: &[&str]) -> Server {
        let mut s = Self::replica_unstarted(dir, name, Some(store));
        s.extra_args = extra.iter().map(|s| s.to_string()).collect();
        s.launch();
        s
    }

    /// A server in `<dir>/<name>` (on `store`, or the embedded store if
    /// `None`), not started yet: set what the test needs, then `launch`.
    pub fn replica_unstarted(dir: &Path, name: &str, store: Option<&SharedStore>) -> Server {
        Server {
            child: None,
            data_dir: dir.join(name),
            quic_addr: "127.0.0.1:0".parse().unwrap(),
            api_addr: "127.0.0.1:0".parse().unwrap(),
            tcp_addr: "127.0.0.1:0".parse().unwrap(),
            webhook_addr: "127.0.0.1:0".parse().unwrap(),
            extra_args: Vec::new(),
            nofile: None,
            env: Vec::new(),
            store: store.cloned(),
        }
    }

    /// A server (with `extra` arguments and `env`) and one daemon paired
    /// as `lap` (its config dir named `lap` too), online.
    pub fn with_lap(extra: &[&str], env: &[(&str, &str)]) -> (tempfile::TempDir, Server, Daemon) {
        let dir = tempfile::tempdir().unwrap();
        let server = Server::start_with_env(dir.path(), extra, env);
        let tok = server.token(&["--name", "lap"]);
        let mut d = Daemon::new(dir.path(), "lap");
        d.pair(&tok, "lap");
        d.start();
        server.wait_online("lap", true, Duration::from_secs(60));
        (dir, server, d)
    }

    /// The SHA-256 of the server's CA certificate, as daemons pin it.
    pub fn ca_pin(&self) -> [u8; 32] {
        let v: Value =
            serde_json::from_slice(&std::fs::read(self.data_dir.join("server.json")).unwrap())
                .unwrap();
        let hex = v["ca_sha256"].as_str().unwrap();
        let mut pin = [0u8; 32];
        for (i, b) in pin.iter_mut().enumerate() {
            *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap();
        }
        pin
    }

    pub fn launch(&mut self) {
        let _ = std::fs::remove_file(self.data_dir.join("server.json"));
        std::fs::create_dir_all(&self.data_dir).unwrap();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .unwrap();
        let mut cmd = Command::new(bin("byom"));
        if let Some(n) = self.nofile {
            use std::os::unix::process::CommandExt;
            // SAFETY: setrlimit only, between fork and exec.
            unsafe {
                cmd.pre_exec(move || {
                    let lim = libc::rlimit {
                        rlim_cur: n,
                        rlim_max: n,
                    };
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let child = cmd
            .arg("server")
            .arg("--data-dir")
            .arg(&self.data_dir)
            .arg("--listen-quic")
            .arg(self.quic_addr.to_string())
            .arg("--listen-api")
            .arg(self.api_addr.to_string())
            .arg("--listen-webhook")
            .arg(self.webhook_addr.to_string())
            .args(&self.extra_args)
            .args(self.store.iter().flat_map(|st| {
                [
                    "--store".into(),
                    st.url.clone().into(),
                    "--store-key-file".into(),
                    st.key_file.clone().into_os_string(),
                ]
            }))
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .env("BYOM_LOG", "info,byom_server=debug,byom_agent=debug")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start byom server");
        self.child = Some(child);
        let json = self.data_dir.join("server.json");
        let info: Value = wait_for("server.json", Duration::from_secs(30), || {
            let v: Value = serde_json::from_slice(&std::fs::read(&json).ok()?).ok()?;
            Some(v)
        });
        if self.store.is_some() {
            // The run is on PostgreSQL as asked, not quietly on sled.
            assert!(
                self.log().contains("shared store"),
                "the server did not open the shared store"
            );
        }
        self.quic_addr = info["quic_addr"].as_str().unwrap().parse().unwrap();
        self.api_addr = info["api_addr"].as_str().unwrap().parse().unwrap();
        self.tcp_addr = info["tcp_addr"].as_str().unwrap().parse().unwrap();
        self.webhook_addr = info["webhook_addr"].as_str().unwrap().parse().unwrap();
    }

    /// `kill -9`: no chance to flush or say goodbye.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts again on the same ports and data dir.
    pub fn restart(&mut self) {
        self.kill9();
        let t = Instant::now();
        loop {
            // The old process's ports can take a moment to be released.
            let udp = std::net::UdpSocket::bind(self.quic_addr).is_ok();
            let tcp = std::net::TcpListener::bind(self.api_addr).is_ok();
            if (udp && tcp) || t.elapsed() > Duration::from_secs(10) {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.launch();
    }

    /// Freezes the server process (SIGSTOP), as a long GC pause or a
    /// suspended VM would.
    pub fn sigstop(&mut self) {
        signal(&mut self.child, libc::SIGSTOP);
    }

    pub fn sigcont(&mut self) {
        signal(&mut self.child, libc::SIGCONT);
    }

    /// Says `text` on chat thread `thread` as ada, addressed to the agent;
    /// what `byom events send` answered.
    pub fn say(&self, thread: &str, text: &str) -> Value {
        self.json(&[
            "events",
            "send",
            "--source",
            "chat",
            "--thread",
            thread,
            "--user",
            "ada",
            "--mention",
            text,
        ])
    }

    /// The agent's replies on a chat thread, oldest first.
    pub fn replies(&self, thread: &str) -> Vec<String> {
        let out = self.byom(&["threads", "show", thread, "--json"]);
        if !out.status.success() {
            // Shown, so a wait that times out says why it saw nothing.
            eprintln!("byom threads show {thread}: {}", stderr(&out));
            return Vec::new();
        }
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        v["messages"]
            .as_array()
            .map(|m| {
                m.iter()
                    .filter(|m| m["from_bot"] == true && m["user"] == "byom")
                    .map(|m| m["text"].as_str().unwrap_or("").to_string())
                    .collect()
            })
            .unwrap_or_default()
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// What the server has logged so far (all its runs in this test).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// `<dir>/server.log` for the one server of a test; replicas log to
    /// `<dir>/<name>.log`.
    fn log_path(&self) -> PathBuf {
        let name = self
            .data_dir
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("server");
        self.data_dir.with_file_name(format!("{name}.log"))
    }

    pub fn creds(&self) -> PathBuf {
        self.data_dir.join("admin")
    }

    /// Runs the `byom` CLI against this server.
    pub fn byom(&self, args: &[&str]) -> Output {
        self.byom_cmd(args).output().expect("run byom")
    }

    pub fn byom_cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(bin("byom"));
        c.args(args)
            .env("BYOM_CREDS", self.creds())
            .env_remove("BYOM_API")
            .stdin(Stdio::null());
        c
    }

    /// `byom trust ARGS`, panicking on failure: tests whose channels'
    /// people should be trusted say so, as an admin would.
    pub fn trust(&self, args: &[&str]) {
        let mut a = vec!["trust"];
        a.extend_from_slice(args);
        let out = self.byom(&a);
        assert!(
            out.status.success(),
            "byom {a:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Runs `byom … --json` and parses the output, panicking on failure.
    pub fn json(&self, args: &[&str]) -> Value {
        let mut a = args.to_vec();
        a.push("--json");
        let out = self.byom(&a);
        assert!(
            out.status.success(),
            "byom {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "byom {args:?}: bad JSON ({e}): {}",
                String::from_utf8_lossy(&out.stdout)
            )
        })
    }

    pub fn token(&self, extra: &[&str]) -> String {
        let mut a = vec!["token", "create"];
        a.extend_from_slice(extra);
        let v = self.json(&a);
        v["token"].as_str().expect("token string").to_string()
    }

    pub fn machine(&self, m: &str) -> Value {
        self.json(&["machines", "show", m])
    }

    pub fn command(&self, id: &str) -> Value {
        self.json(&["commands", "show", id])
    }

    pub fn wait_online(&self, m: &str, online: bool, timeout: Duration) {
        wait_for(&format!("{m} online={online}"), timeout, || {
            (self.machine(m)["online"].as_bool() == Some(online)).then_some(())
        });
    }

    /// Waits for a command to reach a terminal state and returns it.
    pub fn wait_done(&self, id: &str, timeout: Duration) -> Value {
        wait_for(&format!("{id} to finish"), timeout, || {
            let c = self.command(id);
            let st = c["state"].as_str().unwrap_or("");
            matches!(
                st,
                "exited" | "failed" | "cancelled" | "timed_out" | "lost" | "denied"
            )
            .then_some(c)
        })
    }

    /// Queues a command with --detach and returns its ID.
    pub fn detach(&self, machine: &str, extra: &[&str], argv: &[&str]) -> String {
        let mut a = vec!["exec", machine, "--detach"];
        a.extend_from_slice(extra);
        a.push("--");
        a.extend_from_slice(argv);
        let out = self.byom(&a);
        assert!(
            out.status.success(),
            "exec failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // A failing test shows what the server was doing: CI keeps no temp dirs.
        if std::thread::panicking() {
            print_tail(&self.log_path(), &self.log(), 200);
            // And what the agents hold, if the server still answers.
            if self.child.is_some() {
                for q in [
                    &["router", "--json"][..],
                    &["workers", "ls", "--json"],
                    &["approvals", "ls", "--all", "--json"],
                    &["commands", "ls", "--json"],
                ] {
                    let text = output_within(self.byom_cmd(q), Duration::from_secs(10));
                    eprintln!("--- byom {} ---\n{text}", q.join(" "));
                }
            }
        }
        if let Some(c) = self.child.as_mut() {
            kill(c, libc::SIGTERM);
            let t = Instant::now();
            while t.elapsed() < Duration::from_secs(3) {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The last `n` lines of a log, for a failing test's output (CI keeps no
/// temp dirs).
fn print_tail(path: &Path, log: &str, n: usize) {
    let lines: Vec<&str> = log.lines().collect();
    let from = lines.len().saturating_sub(n);
    eprintln!(
        "--- last {} lines of {} ---\n{}",
        lines.len() - from,
        path.display(),
        lines[from..].join("\n")
    );
}

/// A command's stdout and stderr, or why there are none; never panics and
/// never waits past `limit` (it runs while a test is already failing).
fn output_within(mut cmd: Command, limit: Duration) -> String {
    let dir = match tempfile::tempdir() {
        Ok(d) => d,
        Err(e) => return format!("(no temp dir: {e})"),
    };
    let path = dir.path().join("out");
    let Ok(file) = std::fs::File::create(&path) else {
        return "(cannot create the output file)".into();
    };
    let Ok(err) = file.try_clone() else {
        return "(cannot clone the output file)".into();
    };
    let mut child = match cmd.stdout(file).stderr(err).spawn() {
        Ok(c) => c,
        Err(e) => return format!("(cannot start: {e})"),
    };
    let t = Instant::now();
    while t.elapsed() < limit {
        if let Ok(Some(_)) = child.try_wait() {
            return std::fs::read_to_string(&path).unwrap_or_default();
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    format!("(no answer within {limit:?})")
}

/// A `byomd` with its own config dir.
pub struct Daemon {
    child: Option<Child>,
    /// The byomd it runs (a copy, for tests that upgrade it in place).
    pub exe: PathBuf,
    pub config_dir: PathBuf,
    log: PathBuf,
    pub server_override: Option<String>,
    pub run_args: Vec<String>,
    pub env: Vec<(String, String)>,
    /// Run byomd (and `byomd …` calls) as this uid and gid, not ours.
    pub user: Option<(u32, u32)>,
}

impl Daemon {
    pub fn new(dir: &Path, name: &str) -> Daemon {
        Daemon {
            child: None,
            exe: bin("byomd"),
            config_dir: dir.join(name),
            log: dir.join(format!("{name}.log")),
            server_override: None,
            run_args: Vec::new(),
            env: Vec::new(),
            user: None,
        }
    }

    /// A daemon that runs as `nobody`: its config dir and `home` (its
    /// HOME) are made and handed to that user, and `dir` opened to it.
    pub fn unprivileged(dir: &Path, name: &str, home: &Path) -> Daemon {
        use std::os::unix::fs::PermissionsExt;
        let (uid, gid) = (65534, 65534);
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut d = Daemon::new(dir, name);
        for p in [&d.config_dir, &home.to_path_buf()] {
            std::fs::create_dir_all(p).unwrap();
            std::os::unix::fs::chown(p, Some(uid), Some(gid)).unwrap();
        }
        d.user = Some((uid, gid));
        d.env.push(("HOME".into(), home.display().to_string()));
        d
    }

    fn as_user(&self, c: &mut Command) {
        use std::os::unix::process::CommandExt;
        if let Some((uid, gid)) = self.user {
            c.uid(uid).gid(gid);
        }
    }

    pub fn byomd(&self, args: &[&str]) -> Output {
        self.byomd_with_input(args, None)
    }

    /// `byomd ARGS` with `input` on its stdin.
    pub fn byomd_with_input(&self, args: &[&str], input: Option<&[u8]>) -> Output {
        use std::io::Write;
        let mut c = Command::new(&self.exe);
        self.as_user(&mut c);
        let mut child = c
            .envs(self.env.iter().cloned())
            .arg("--config-dir")
            .arg(&self.config_dir)
            .args(args)
            .env("BYOMD_KEY_STORE", "file")
            .env("BYOMD_LOG", "warn")
            .stdin(if input.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run byomd");
        if let (Some(data), Some(mut stdin)) = (input, child.stdin.take()) {
            stdin.write_all(data).expect("byomd's stdin");
        }
        child.wait_with_output().expect("run byomd")
    }

    /// Pairs with `token`; panics with byomd's message on failure.
    pub fn pair(&self, token: &str, name: &str) {
        let out = self.byomd(&["pair", token, "--name", name, "--key-store", "file"]);
        assert!(
            out.status.success(),
            "pair failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    pub fn start(&mut self) {
        assert!(self.child.is_none(), "daemon already running");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let mut c = Command::new(&self.exe);
        self.as_user(&mut c);
        c.arg("--config-dir").arg(&self.config_dir).arg("run");
        if let Some(s) = &self.server_override {
            c.arg("--server").arg(s);
        }
        c.args(&self.run_args);
        c.envs(self.env.iter().cloned());
        let child = c
            .env("BYOMD_LOG", "info,byom_daemon=debug")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start byomd");
        self.child = Some(child);
    }

    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            kill(&mut c, libc::SIGTERM);
            let t = Instant::now();
            while t.elapsed() < Duration::from_secs(5) {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Freezes the daemon process, as a laptop's sleep does (SIGSTOP).
    pub fn sigstop(&mut self) {
        signal(&mut self.child, libc::SIGSTOP);
    }

    /// Wakes it again (SIGCONT).
    pub fn sigcont(&mut self) {
        signal(&mut self.child, libc::SIGCONT);
    }

    /// Exit status if the daemon process ended.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.as_mut()?.try_wait().ok()?
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn identity(&self) -> Value {
        serde_json::from_slice(&std::fs::read(self.config_dir.join("identity.json")).unwrap())
            .unwrap()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if std::thread::panicking() {
            print_tail(&self.log, &self.log(), 60);
        }
        self.stop();
    }
}

/// A flag that a background thread watches.
#[derive(Clone, Default)]
pub struct Flag(Arc<AtomicBool>);
impl Flag {
    pub fn set(&self, v: bool) {
        self.0.store(v, Ordering::SeqCst)
    }
    pub fn get(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Runs `true` on `machine` through the admin API (CreateCommand, then
/// WatchCommand until the stored exit) and returns the round-trip time.
/// Panics unless it exited successfully: benchmarks must not time failures.
/// Runs `job(i)` for `i` in `0..n`, at most `concurrency` at once, and
/// returns how many per second: the benchmarks' throughput figure, for
/// byom and for the local baseline alike.
pub async fn per_second<F, Fut>(n: usize, concurrency: usize, job: F) -> f64
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let sem = Arc::new(tokio::sync::Semaphore::new(concurrency));
    let t = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..n {
        let sem = sem.clone();
        let fut = job(i);
        tasks.push(tokio::spawn(async move {
            let _p = sem.acquire().await.expect("semaphore open");
            fut.await;
        }));
    }
    for t in tasks {
        t.await.expect("job");
    }
    n as f64 / t.elapsed().as_secs_f64()
}

/// CPU time (user and system) a process has used so far, and that of
/// its children it has reaped, from `/proc/PID/stat`; zero where that
/// cannot be read. CPU per unit of work is a steadier figure than wall
/// time on a shared, noisy machine.
pub fn cpu_time(pid: u32) -> (Duration, Duration) {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return (Duration::ZERO, Duration::ZERO);
    };
    // Fields after the command name, which may itself hold spaces.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let sum = |fields: [usize; 2]| {
        let ticks: u64 = fields
            .iter()
            .filter_map(|&i| f.get(i).and_then(|v| v.parse::<u64>().ok()))
            .sum();
        Duration::from_secs_f64(ticks as f64 / hz)
    };
    // utime, stime; cutime, cstime.
    (sum([11, 12]), sum([13, 14]))
}

/// CPU used by a process and its living children (a server's workers,
/// such as PostgreSQL's backends), each with what it reaped.
pub fn tree_cpu_time(pid: u32) -> Duration {
    let (own, reaped) = cpu_time(pid);
    let mut sum = own + reaped;
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return sum;
    };
    for e in entries.flatten() {
        let Some(child) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let stat = std::fs::read_to_string(format!("/proc/{child}/stat")).unwrap_or_default();
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, r)| r.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if ppid == Some(pid) {
            let (own, reaped) = cpu_time(child);
            sum += own + reaped;
        }
    }
    sum
}

/// Spawns `true` locally and waits for it: the baseline job.
pub async fn spawn_true() {
    let s = tokio::process::Command::new("true").status().await;
    assert!(s.is_ok_and(|s| s.success()), "true failed");
}

/// One command, `true` on `machine`, through the API as `byom exec` runs
/// it (created and followed in one `RunCommand` call), to its stored exit.
pub async fn api_round_trip(c: &mut byom_api::Client, machine: &str) -> Duration {
    use byom_protocol::pb;
    let t = Instant::now();
    let run = byom_api::run_command(
        c,
        pb::CreateCommandRequest {
            machine: machine.into(),
            argv: vec!["true".into()],
            ..Default::default()
        },
    )
    .await
    .expect("run command");
    let end = run
        .to_end(c, Default::default(), |_| {})
        .await
        .expect("watch command")
        .expect("a terminal state");
    assert_eq!(end.state(), pb::CommandState::Exited, "{end:?}");
    t.elapsed()
}

/// POSTs `body` to the webhook at `addr` with optional signature headers
/// (see [`byom_headers`]); returns (status, response body).
pub fn webhook_post(
    addr: SocketAddr,
    path: &str,
    headers: Option<&str>,
    body: &str,
) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let headers = headers.unwrap_or_default();
    let req = format!("POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
    // A server may answer (and close) before it reads the whole request,
    // as the webhook port does for plain HTTP from afar: what it answered
    // is the result, so a failed write is not.
    let _ = s.write_all(req.as_bytes());
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let status = out
        .split_whitespace()
        .nth(1)
        .and_then(|x| x.parse().ok())
        .unwrap_or(0);
    let body = out.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    (status, body)
}

/// The generic webhook's signature headers for `body` under `key`, signed
/// at unix time `ts` (`X-Byom-Timestamp`, and `X-Byom-Signature` over
/// `TS.BODY`), each line ending in CRLF.
pub fn byom_headers_at(key: &[u8], ts: u64, body: &str) -> String {
    let sig = webhook_sign(key, &format!("{ts}.{body}"));
    format!("X-Byom-Timestamp: {ts}\r\nX-Byom-Signature: {sig}\r\n")
}

/// [`byom_headers_at`] now.
pub fn byom_headers(key: &[u8], body: &str) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    byom_headers_at(key, now, body)
}

/// `sha256=HEX`, the HMAC-SHA256 of `body` under `key` (GitHub's
/// signature, and byom's over `TS.BODY`).
pub fn webhook_sign(key: &[u8], body: &str) -> String {
    use ring::hmac;
    let tag = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, key), body.as_bytes());
    format!("sha256={}", byom_protocol::hex(tag.as_ref()))
}

/// A copy of the built byomd whose version stamp says `version`: a "newer
/// build" for the upgrade tests, made the way a packager stamps one.
pub fn stamped_byomd(version: &str) -> Vec<u8> {
    let mut bytes = std::fs::read(bin("byomd")).expect("read byomd");
    let prefix = b"byom-version-stamp:";
    let at = bytes
        .windows(prefix.len())
        .position(|w| w == prefix)
        .expect("byomd has a version stamp")
        + prefix.len();
    let field = &mut bytes[at..at + 64 - prefix.len()];
    field.fill(0);
    field[..version.len()].copy_from_slice(version.as_bytes());
    bytes
}

/// Writes a release directory as installers/release.sh lays it out:
/// each `(file, program, kind, bytes)` for this machine's platform, and the
/// manifest listing them with their SHA-256.
pub fn write_dist(dir: &Path, version: &str, files: &[(&str, &str, &str, &[u8])]) {
    use std::fmt::Write as _;
    std::fs::create_dir_all(dir).unwrap();
    let (os, arch) = byom_protocol::manifest::this_platform();
    let mut m = format!("byom-manifest 1\nversion {version}\n");
    for (file, program, kind, bytes) in files {
        let path = dir.join(file);
        std::fs::write(&path, bytes).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        let sha = ring::digest::digest(&ring::digest::SHA256, bytes);
        let _ = writeln!(
            m,
            "artifact {file} {program} {os} {arch} {kind} {} {}",
            bytes.len(),
            byom_protocol::manifest::hex(sha.as_ref())
        );
    }
    std::fs::write(dir.join("manifest"), m).unwrap();
}

/// `byom server` on `data_dir` with free loopback ports, not started: for
/// tests that expect it to refuse (a bad config, a busy data dir).
pub fn server_cmd(data_dir: &Path) -> Command {
    let mut c = Command::new(bin("byom"));
    c.arg("server")
        .arg("--data-dir")
        .arg(data_dir)
        .args(["--listen-quic", "127.0.0.1:0"])
        .args(["--listen-api", "127.0.0.1:0"])
        .args(["--listen-webhook", "127.0.0.1:0"]);
    c
}

/// POSTs `body` over HTTPS to `addr` (as `server_name`), trusting only
/// `roots_pem`; (status, response body), or the TLS error.
pub fn https_post(
    addr: SocketAddr,
    server_name: &str,
    roots_pem: &str,
    path: &str,
    headers: &str,
    body: &str,
) -> Result<(u16, String), String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, ServerName};
    use std::io::{Read, Write};
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(roots_pem.as_bytes()) {
        roots
            .add(c.map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let name = ServerName::try_from(server_name.to_string()).map_err(|e| e.to_string())?;
    let conn = rustls::ClientConnection::new(Arc::new(cfg), name).map_err(|e| e.to_string())?;
    let tcp = std::net::TcpStream::connect(addr).map_err(|e| e.to_string())?;
    tcp.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    write!(tls, "POST {path} HTTP/1.1\r\nHost: {server_name}\r\nContent-Type: application/json\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len())
        .map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    match tls.read_to_end(&mut out) {
        Ok(_) => {}
        // Peers that close without close_notify still sent their answer.
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !out.is_empty() => {}
        Err(e) => return Err(e.to_string()),
    }
    let out = String::from_utf8_lossy(&out).into_owned();
    let status = out
        .split_whitespace()
        .nth(1)
        .and_then(|x| x.parse().ok())
        .unwrap_or(0);
    Ok((
        status,
        out.split("\r\n\r\n").nth(1).unwrap_or("").to_string(),
    ))
}

/// A local sshd on loopback for benchmarks to compare against (with a key
/// of its own and a control master, as people run ssh); `None` when
/// openssh-server is not installed or does not start.
pub struct Sshd {
    child: std::process::Child,
    dir: PathBuf,
    port: u16,
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Sshd {
    pub fn start(dir: &Path) -> Option<Sshd> {
        let sshd = ["/usr/sbin/sshd", "/usr/bin/sshd"]
            .into_iter()
            .find(|p| Path::new(p).exists())?;
        let key = dir.join("id");
        let hostkey = dir.join("hostkey");
        for k in [&key, &hostkey] {
            Command::new("ssh-keygen")
                .args(["-q", "-t", "ed25519", "-N", "", "-f"])
                .arg(k)
                .status()
                .ok()?;
        }
        std::fs::copy(dir.join("id.pub"), dir.join("authorized_keys")).ok()?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .ok()?
            .local_addr()
            .ok()?
            .port();
        let cfg = dir.join("sshd_config");
        std::fs::write(
            &cfg,
            format!(
                "Port {port}\nListenAddress 127.0.0.1\nHostKey {}\nAuthorizedKeysFile {}\nPasswordAuthentication no\nStrictModes no\nPidFile {}\nUsePAM no\n{}",
                hostkey.display(),
                dir.join("authorized_keys").display(),
                dir.join("sshd.pid").display(),
                // scp speaks SFTP these days.
                ["/usr/lib/openssh/sftp-server", "/usr/libexec/sftp-server", "/usr/lib/ssh/sftp-server"]
                    .into_iter()
                    .find(|p| Path::new(p).exists())
                    .map(|p| format!("Subsystem sftp {p}\n"))
                    .unwrap_or_default()
            ),
        )
        .ok()?;
        let _ = std::fs::create_dir_all("/run/sshd");
        let child = Command::new(sshd)
            .arg("-D")
            .arg("-f")
            .arg(&cfg)
            .arg("-e")
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        let s = Sshd {
            child,
            dir: dir.to_path_buf(),
            port,
        };
        std::thread::sleep(Duration::from_millis(500));
        // Warm the control master.
        let mut args = s.ssh_args();
        args.push("true".into());
        let ok = Command::new("ssh")
            .args(&args)
            .stdin(Stdio::null())
            .status()
            .ok()?
            .success();
        ok.then_some(s)
    }

    /// `-o` options both ssh and scp take.
    fn options(&self) -> Vec<String> {
        let mut v = vec!["-i".to_string(), self.dir.join("id").display().to_string()];
        for o in [
            "StrictHostKeyChecking=no".to_string(),
            format!(
                "UserKnownHostsFile={}",
                self.dir.join("known_hosts").display()
            ),
            "ControlMaster=auto".into(),
            format!("ControlPath={}", self.dir.join("cm-%r@%h:%p").display()),
            "ControlPersist=60".into(),
            "BatchMode=yes".into(),
        ] {
            v.push("-o".into());
            v.push(o);
        }
        v
    }

    /// ssh's arguments up to the host (add the command).
    pub fn ssh_args(&self) -> Vec<String> {
        let mut v = vec!["-p".to_string(), self.port.to_string()];
        v.extend(self.options());
        v.push("127.0.0.1".into());
        v
    }

    /// scp's options (then the paths; the host is 127.0.0.1).
    pub fn scp_args(&self) -> Vec<String> {
        let mut v = vec!["-q".to_string(), "-P".into(), self.port.to_string()];
        v.extend(self.options());
        v
    }
}
