//! A private PostgreSQL cluster for tests and benchmarks: `initdb` in a
//! temp dir, the server on a free loopback port, stopped on drop.
//!
//! It serves TLS with a certificate for `localhost` from a CA of its own
//! ([`PgCluster::ca_file`]); database `tlsonly` refuses plain connections
//! and database `scram` takes only TLS with a SCRAM password (role
//! `scrammer`, password [`SCRAM_PASSWORD`]), so clients' TLS can be
//! tested against a real server.
//!
//! PostgreSQL refuses to run as root, and tests here often do: as root the
//! cluster runs as `nobody`. Its binaries come from `PATH` or Debian's
//! `/usr/lib/postgresql/<version>/bin`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// How long the cluster may take to start.
const START_WITHIN: Duration = Duration::from_secs(60);

/// Role `scrammer`'s password (database `scram`).
pub const SCRAM_PASSWORD: &str = "correct-horse";

/// Who may connect how: plain connections to `tlsonly` and `scram` are
/// refused, `scram` wants a password; the rest is trusted.
const HBA: &str = "\
local all all trust
hostnossl tlsonly all all reject
hostnossl scram all all reject
hostssl scram all all scram-sha-256
host all all 127.0.0.1/32 trust
host all all ::1/128 trust
";

pub struct PgCluster {
    /// Removed on drop when the cluster made it.
    _temp: Option<tempfile::TempDir>,
    dir: PathBuf,
    port: u16,
    fsync: bool,
    /// The postmaster (in a lock: a test may restart it on a shared
    /// cluster).
    server: std::sync::Mutex<Child>,
}

/// The directory holding `initdb` and `postgres`, if PostgreSQL is here.
pub fn pg_bin_dir() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("PATH") {
        for d in std::env::split_paths(&path) {
            if d.join("initdb").is_file() && d.join("postgres").is_file() {
                return Some(d);
            }
        }
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .flatten()
        .filter_map(|e| {
            let v = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").is_file().then_some((v, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, b)| b)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// `nobody`'s uid and gid when we are root (PostgreSQL refuses root).
fn run_as() -> Option<(u32, u32)> {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    root.then_some((65534, 65534))
}

fn command(bin: &Path, name: &str, as_user: Option<(u32, u32)>) -> Command {
    use std::os::unix::process::CommandExt;
    let mut c = Command::new(bin.join(name));
    if let Some((uid, gid)) = as_user {
        // As root, std also drops the supplementary groups.
        c.uid(uid).gid(gid);
    }
    c
}

/// This process's cluster, shared by its tests: each takes databases of
/// its own ([`PgCluster::fresh_url`]), so a test binary pays for one
/// `initdb` and one start, not one per test.
static SHARED: OnceLock<Arc<PgCluster>> = OnceLock::new();

/// How many databases [`PgCluster::fresh_url`] has made in this process.
static FRESH: AtomicU64 = AtomicU64::new(0);

impl PgCluster {
    /// The cluster of this test process, started on first use and stopped
    /// (its directory removed) when the process exits. Tests that stop,
    /// restart or reconfigure a cluster start one of their own instead.
    pub fn shared() -> Arc<PgCluster> {
        SHARED
            .get_or_init(|| {
                // The postmaster gets a signal when the thread that started
                // it ends (its parent-death signal), so it is started on a
                // thread that lives as long as the process.
                let (tx, rx) = std::sync::mpsc::channel();
                std::thread::Builder::new()
                    .name("test-cluster".into())
                    .spawn(move || {
                        let started = std::panic::catch_unwind(PgCluster::start);
                        let failed = started.is_err();
                        let _ = tx.send(started.map_err(|p| {
                            p.downcast_ref::<String>()
                                .cloned()
                                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                                .unwrap_or_default()
                        }));
                        if failed {
                            return;
                        }
                        loop {
                            std::thread::park();
                        }
                    })
                    .expect("a thread for the test cluster");
                let cluster = match rx.recv() {
                    Ok(Ok(c)) => Arc::new(c),
                    Ok(Err(why)) => panic!("the shared test cluster did not start: {why}"),
                    Err(_) => panic!("the shared test cluster did not start"),
                };
                // SAFETY: registers a plain function; it runs at exit, when
                // the tests are over.
                unsafe { libc::atexit(stop_shared) };
                cluster
            })
            .clone()
    }

    /// The name of a database nobody else in this process uses, created now.
    pub fn fresh_database(&self) -> String {
        let n = FRESH.fetch_add(1, Ordering::Relaxed);
        let db = format!("t{n}");
        self.url(&db);
        db
    }

    /// The URL of a database nobody else in this process uses, created now.
    pub fn fresh_url(&self) -> String {
        let db = self.fresh_database();
        self.url(&db)
    }

    /// A cluster without fsync: for tests, where a crash of the machine is
    /// not what is being tested.
    pub fn start() -> PgCluster {
        Self::start_temp(false)
    }

    /// A cluster that fsyncs as a production one does: for benchmarks.
    pub fn start_durable() -> PgCluster {
        Self::start_temp(true)
    }

    /// A cluster in a temp dir of its own, removed on drop.
    fn start_temp(fsync: bool) -> PgCluster {
        let temp = tempfile::Builder::new()
            .prefix("byom-pg")
            .tempdir()
            .expect("temp dir");
        let mut c = Self::start_in(temp.path(), fsync);
        c._temp = Some(temp);
        c
    }

    /// A cluster in `dir`: made there the first time, started again on
    /// what is there after that (a test's server restarted on its data).
    pub fn start_in(dir: &Path, fsync: bool) -> PgCluster {
        let bin = pg_bin_dir().expect(
            "PostgreSQL is not installed (initdb not on PATH nor in /usr/lib/postgresql/*/bin): \
             apt-get install postgresql",
        );
        let data = dir.join("data");
        let user = run_as();
        if !data.join("PG_VERSION").exists() {
            Self::init(&bin, dir, &data, user);
        }
        let port = free_port();
        let server = Self::postgres(&bin, dir, port, fsync, user);
        PgCluster {
            _temp: None,
            dir: dir.to_path_buf(),
            port,
            fsync,
            server: std::sync::Mutex::new(server),
        }
    }

    /// Starts the postmaster on the cluster in `dir` and waits until it
    /// takes connections.
    fn postgres(bin: &Path, dir: &Path, port: u16, fsync: bool, user: Option<(u32, u32)>) -> Child {
        let data = dir.join("data");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("log"))
            .expect("log file");
        if let Some((uid, gid)) = user {
            std::os::unix::fs::chown(dir.join("log"), Some(uid), Some(gid)).expect("chown");
        }
        let mut cmd = command(bin, "postgres", user);
        cmd.arg("-D")
            .arg(&data)
            .args(["-p", &port.to_string(), "-k"])
            .arg(dir)
            .args(["-c", "listen_addresses=127.0.0.1"])
            .args(["-c", &format!("fsync={}", if fsync { "on" } else { "off" })])
            .args(["-c", "max_connections=400"])
            .args(["-c", "ssl=on", "-c", "ssl_cert_file=server.crt"])
            .args(["-c", "ssl_key_file=server.key"]);
        // More settings for a look inside, e.g. `log_statement=all`.
        for setting in std::env::var("BYOM_TEST_PG_SETTINGS")
            .unwrap_or_default()
            .split_whitespace()
        {
            cmd.args(["-c", setting]);
        }
        cmd.current_dir(dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log);
        {
            use std::os::unix::process::CommandExt;
            // SAFETY: prctl is async-signal-safe; a test process that dies
            // (a panic with abort, kill -9) takes its cluster with it.
            unsafe {
                cmd.pre_exec(|| {
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGQUIT);
                    Ok(())
                });
            }
        }
        let ready_before = std::fs::read_to_string(dir.join("log"))
            .unwrap_or_default()
            .matches("ready to accept connections")
            .count();
        let mut server = cmd.spawn().expect("start postgres");
        let t = Instant::now();
        loop {
            let log = std::fs::read_to_string(dir.join("log")).unwrap_or_default();
            if log.matches("ready to accept connections").count() > ready_before {
                break;
            }
            if let Ok(Some(status)) = server.try_wait() {
                panic!("postgres exited ({status}) at start: {log}");
            }
            assert!(t.elapsed() < START_WITHIN, "postgres did not start: {log}");
            std::thread::sleep(Duration::from_millis(20));
        }
        server
    }

    fn init(bin: &Path, dir: &Path, data: &Path, user: Option<(u32, u32)>) {
        std::fs::create_dir_all(data).expect("data dir");
        if let Some((uid, gid)) = user {
            for d in [dir, data] {
                std::os::unix::fs::chown(d, Some(uid), Some(gid)).expect("chown the cluster dir");
            }
        }
        let out = command(bin, "initdb", user)
            .args(["-D"])
            .arg(data)
            .args([
                "-U",
                "byom",
                "--auth=trust",
                "-N",
                "-E",
                "UTF8",
                "--locale=C",
            ])
            .current_dir(dir)
            .output()
            .expect("run initdb");
        assert!(
            out.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // Relative paths in the settings are the data directory's.
        let (ca, cert, key) = server_certificate();
        std::fs::write(dir.join("ca.pem"), ca).expect("write ca.pem");
        for (name, body) in [
            ("server.crt", cert.as_str()),
            ("server.key", &key),
            ("pg_hba.conf", HBA),
        ] {
            let p = data.join(name);
            std::fs::write(&p, body).expect("write the cluster's TLS files");
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).expect("chmod");
            if let Some((uid, gid)) = user {
                std::os::unix::fs::chown(&p, Some(uid), Some(gid)).expect("chown");
            }
        }
    }

    /// The PEM file of the CA that signed the cluster's certificate.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// Runs `sql` as the cluster's superuser, in database `postgres`.
    pub fn admin(&self, sql: &str) {
        let sql = sql.to_string();
        self.as_superuser(|client| async move {
            client.batch_execute(&sql).await.expect("admin statement");
        });
    }

    /// Runs `f` with a superuser's client of database `postgres`, on a
    /// thread of its own (the caller may be inside a runtime).
    fn as_superuser<T, F, Fut>(&self, f: F) -> T
    where
        T: Send,
        F: FnOnce(tokio_postgres::Client) -> Fut + Send,
        Fut: std::future::Future<Output = T>,
    {
        let admin = format!(
            "postgres://byom@127.0.0.1:{}/postgres?sslmode=disable",
            self.port
        );
        std::thread::scope(|s| {
            s.spawn(|| {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("runtime");
                rt.block_on(async {
                    let (client, conn) = tokio_postgres::connect(&admin, tokio_postgres::NoTls)
                        .await
                        .expect("connect to the test cluster");
                    tokio::spawn(conn);
                    f(client).await
                })
            })
            .join()
            .expect("a superuser's statement")
        })
    }

    /// What PostgreSQL logged, for a failing test's message.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("log")).unwrap_or_default()
    }

    /// The directory of the cluster's local socket.
    pub fn socket_dir(&self) -> &Path {
        &self.dir
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The postmaster's process ID (its backends are its children).
    pub fn pid(&self) -> u32 {
        self.server.lock().unwrap_or_else(|p| p.into_inner()).id()
    }

    /// The URL of database `db`, created if it does not exist.
    pub fn url(&self, db: &str) -> String {
        let url = format!("postgres://byom@127.0.0.1:{}/{db}", self.port);
        let db = db.to_string();
        self.as_superuser(|client| async move {
            let exists = client
                .query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&db])
                .await
                .expect("query");
            if exists.is_none() {
                client
                    .batch_execute(&format!("CREATE DATABASE \"{db}\""))
                    .await
                    .expect("create database");
            }
        });
        url
    }

    /// Stops the cluster now (as a crash would: immediate shutdown).
    pub fn kill(&self) {
        let mut server = self.server.lock().unwrap_or_else(|p| p.into_inner());
        // SAFETY: a plain signal to our own child.
        unsafe {
            libc::kill(server.id() as i32, libc::SIGQUIT);
        }
        let _ = server.wait();
    }

    /// Starts the cluster again after [`kill`](Self::kill), on the same
    /// port and data, as a database back from a crash or a failover.
    /// The postmaster dies with the thread that calls this (its parent
    /// death signal), so call it from the test's own thread.
    pub fn restart(&self) {
        let mut server = self.server.lock().unwrap_or_else(|p| p.into_inner());
        let bin = pg_bin_dir().expect("PostgreSQL is installed");
        *server = Self::postgres(&bin, &self.dir, self.port, self.fsync, run_as());
    }
}

/// Stops the shared cluster and removes its directory: statics are never
/// dropped, so without this every test binary would leave one behind.
extern "C" fn stop_shared() {
    if let Some(c) = SHARED.get() {
        c.kill();
        let _ = std::fs::remove_dir_all(&c.dir);
    }
}

/// A CA, and a certificate for `localhost` it signed with its key: (CA
/// PEM, certificate PEM, key PEM).
fn server_certificate() -> (String, String, String) {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
    let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "byom test PostgreSQL CA");
    let ca_key = KeyPair::generate().expect("CA key");
    let ca_cert = ca.self_signed(&ca_key).expect("CA certificate");
    let issuer = Issuer::new(ca, ca_key);
    let params = CertificateParams::new(vec!["localhost".to_string()]).expect("params");
    let key = KeyPair::generate().expect("key");
    let cert = params.signed_by(&key, &issuer).expect("certificate");
    (ca_cert.pem(), cert.pem(), key.serialize_pem())
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        let server = self.server.get_mut().unwrap_or_else(|p| p.into_inner());
        // Fast shutdown: abort sessions, stop cleanly.
        // SAFETY: a plain signal to our own child.
        unsafe {
            libc::kill(server.id() as i32, libc::SIGINT);
        }
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(10) {
            if let Ok(Some(_)) = server.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = server.kill();
        let _ = server.wait();
    }
}
