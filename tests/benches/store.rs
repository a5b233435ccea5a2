//! Store benchmark (run with `cargo bench -p byom-tests --bench store`,
//! after `cargo build --release -p byom-control-plane -p byom-daemon`).
//!
//! In one run, on loopback, real `byom server` and `byomd` processes:
//!  1. baseline: spawn `true` locally, one at a time and 64 at once;
//!  2. the API round trip of `true` (create, run, exit stored; one
//!     `RunCommand` call, as `byom exec` makes it) on the embedded store
//!     (sled) and on PostgreSQL (a private cluster with fsync on, as in
//!     production): p50 and overhead over the local spawn; on sled also
//!     one call against two (`CreateCommand`, then `WatchCommand`), in turn;
//!  3. commands/s through one sled server, and through 1, 2 and 3
//!     replicas on PostgreSQL (daemons and API clients spread across them);
//!  4. the agents' takeover time after `kill -9` of the lease holder;
//!  5. what bounds the figures on this machine: the floors of a round trip
//!     (the API's own round trip, a durable write, a QUIC stream's round
//!     trip, capturing a spawn's output) and, during the sled run, the CPU
//!     each command costs the server, the daemons, `true` itself and the
//!     client, which caps commands/s at cores / (their sum); during the
//!     one-replica PostgreSQL run, what each command costs the replica and
//!     the database (its postmaster and backends).
//!
//! Figures only mean something relative to each other in the same run.
//! BENCH_N round trips (default 300), BENCH_COMMANDS commands (default
//! 2000), BENCH_DAEMONS daemons (default 8). BENCH_ONLY=sled stops after
//! the sled figures; BENCH_PAUSE=S prints the sled server's and the first
//! daemon's process IDs and waits S seconds first (to attach a profiler).

use std::sync::Arc;
use std::time::{Duration, Instant};

use byom_tests::{Daemon, Server, SharedStore};

const CONCURRENCY: usize = 64;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

fn p50(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// `daemons` byomd processes, machine `m{i}` each, dialling the replicas
/// in turn (a different first one each).
fn daemons(dir: &std::path::Path, servers: &[&Server], n: usize) -> Vec<Daemon> {
    (0..n)
        .map(|i| {
            let s = servers[i % servers.len()];
            let mut d = Daemon::new(dir, &format!("m{i}"));
            d.pair(&s.token(&[]), &format!("m{i}"));
            let order: Vec<String> = (0..servers.len())
                .map(|k| servers[(i + k) % servers.len()].quic_addr.to_string())
                .collect();
            d.server_override = Some(order.join(","));
            d.start();
            d
        })
        .collect()
}

async fn client(s: &Server) -> byom_api::Client {
    let creds = byom_api::load_creds(Some(&s.creds()), Some(&s.api_addr.to_string())).unwrap();
    byom_api::connect(&creds).await.unwrap()
}

/// Round trips of `true` on machine m0 through `s`, after a warm-up.
async fn round_trips(s: &Server, n: usize) -> Vec<Duration> {
    let mut c = client(s).await;
    let mut v = Vec::with_capacity(n);
    for i in 0..n + 20 {
        let d = byom_tests::api_round_trip(&mut c, "m0").await;
        if i >= 20 {
            v.push(d);
        }
    }
    v
}

/// Round trips as one call (`RunCommand`, as [`round_trips`]) and as two
/// (`CreateCommand`, then `WatchCommand`), taken in turn so both see the
/// same machine: (one call, two calls).
async fn one_call_and_two(s: &Server, n: usize) -> (Vec<Duration>, Vec<Duration>) {
    use byom_protocol::pb;
    let mut c = client(s).await;
    let (mut one, mut two) = (Vec::new(), Vec::new());
    for _ in 0..n {
        one.push(byom_tests::api_round_trip(&mut c, "m0").await);
        let t = Instant::now();
        let cmd = c
            .create_command(pb::CreateCommandRequest {
                machine: "m0".into(),
                argv: vec!["true".into()],
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .command
            .unwrap();
        byom_api::watch_to_end(&mut c, &cmd.id, Default::default(), |_| {})
            .await
            .unwrap()
            .unwrap();
        two.push(t.elapsed());
    }
    (one, two)
}

/// `m` commands through the replicas `servers` (round-robin), 64 at once,
/// over `machines` machines: commands/s.
async fn throughput(servers: &[&Server], machines: usize, m: usize) -> f64 {
    let mut clients = Vec::new();
    for s in servers {
        clients.push(client(s).await);
    }
    byom_tests::per_second(m, CONCURRENCY, |i| {
        let mut c = clients[i % clients.len()].clone();
        async move {
            byom_tests::api_round_trip(&mut c, &format!("m{}", i % machines)).await;
        }
    })
    .await
}

fn main() {
    let n = env("BENCH_N", 300);
    let m = env("BENCH_COMMANDS", 2000);
    let k = env("BENCH_DAEMONS", 8);
    let rt = tokio::runtime::Runtime::new().unwrap();

    // Baselines.
    let local: Vec<Duration> = (0..n)
        .map(|_| {
            let t = Instant::now();
            assert!(std::process::Command::new("true")
                .status()
                .unwrap()
                .success());
            t.elapsed()
        })
        .collect();
    let local = p50(local);
    let local_rate = rt.block_on(byom_tests::per_second(m, CONCURRENCY, |_| {
        byom_tests::spawn_true()
    }));

    // sled.
    let sled_dir = tempfile::tempdir().unwrap();
    let sled = Server::replica_unstarted(sled_dir.path(), "server", None);
    let mut sled = sled;
    sled.launch();
    let sled_daemons = daemons(sled_dir.path(), &[&sled], k);
    for i in 0..k {
        sled.wait_online(&format!("m{i}"), true, Duration::from_secs(60));
    }
    if let Ok(secs) = std::env::var("BENCH_PAUSE") {
        // Time to attach a tracer to the server and the first daemon.
        eprintln!(
            "server pid {:?}, daemon m0 pid {:?}",
            sled.pid(),
            sled_daemons[0].pid()
        );
        std::thread::sleep(Duration::from_secs(secs.parse().unwrap_or(10)));
    }
    let sled_rt = p50(rt.block_on(round_trips(&sled, n)));
    let floors = rt.block_on(floors(&sled, n));
    // CPU used by processes (own, their reaped children's).
    let cpu = |pids: &[Option<u32>]| -> (Duration, Duration) {
        pids.iter()
            .flatten()
            .map(|&p| byom_tests::cpu_time(p))
            .fold((Duration::ZERO, Duration::ZERO), |a, b| {
                (a.0 + b.0, a.1 + b.1)
            })
    };
    let me = Some(std::process::id());
    let daemon_pids: Vec<Option<u32>> = sled_daemons.iter().map(Daemon::pid).collect();
    let before = [cpu(&[sled.pid()]), cpu(&daemon_pids), cpu(&[me])];
    let sled_rate = rt.block_on(throughput(&[&sled], k, m));
    let after = [cpu(&[sled.pid()]), cpu(&daemon_pids), cpu(&[me])];
    // CPU per command, in µs: the server; the daemons; the commands
    // themselves (the daemons' children); this client.
    let per_cmd = |a: Duration, b: Duration| a.saturating_sub(b).as_secs_f64() * 1e6 / m as f64;
    let server_cpu = per_cmd(after[0].0, before[0].0);
    let daemons_cpu = per_cmd(after[1].0, before[1].0);
    let commands_cpu = per_cmd(after[1].1, before[1].1);
    let client_cpu = per_cmd(after[2].0, before[2].0);
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    // The most commands/s these processes could carry with every core busy.
    let ceiling = cores as f64 * 1e6 / (server_cpu + daemons_cpu + commands_cpu + client_cpu);
    let (one, two) = rt.block_on(one_call_and_two(&sled, n));
    let (one, two) = (p50(one), p50(two));
    drop(sled_daemons);
    drop(sled);
    if std::env::var("BENCH_ONLY").as_deref() == Ok("sled") {
        println!(
            "spawn `true` locally, p50: {:.3} ms; sled round trip p50 {:.3} ms (overhead {:.3} ms); local {local_rate:.0}/s; sled {sled_rate:.0}/s ({:.2}x; CPU per command: server {server_cpu:.0} µs, daemons {daemons_cpu:.0} µs, `true` {commands_cpu:.0} µs, client {client_cpu:.0} µs; ceiling on {cores} cores {ceiling:.0}/s); floors: API {:.3} ms, flush {:.3} ms, QUIC {:.3} ms, capturing output {:.3} ms, sum {:.3} ms; round trip in turn: one call {:.3} ms, two calls {:.3} ms",
            ms(local),
            ms(sled_rt),
            ms(sled_rt.saturating_sub(local)),
            sled_rate / local_rate,
            ms(floors.api),
            ms(floors.flush),
            ms(floors.quic),
            ms(floors.capture),
            ms(floors.sum()),
            ms(one),
            ms(two)
        );
        return;
    }

    // PostgreSQL, 1 to 3 replicas, one cluster per size (a fresh database).
    let mut pg_rt = Duration::ZERO;
    let mut pg_rates = Vec::new();
    // CPU per command of one replica and of PostgreSQL, in µs.
    let mut pg_cpu = (0.0, 0.0);
    for replicas in 1..=3 {
        let dir = tempfile::tempdir().unwrap();
        let cluster = Arc::new(byom_store::testing::PgCluster::start_durable());
        let store = SharedStore {
            url: cluster.url("byom"),
            cluster,
            key_file: dir.path().join("store.key"),
        };
        let servers: Vec<Server> = (0..replicas)
            .map(|i| Server::replica(dir.path(), &format!("r{i}"), &store, &[]))
            .collect();
        let refs: Vec<&Server> = servers.iter().collect();
        let ds = daemons(dir.path(), &refs, k);
        for i in 0..k {
            refs[0].wait_online(&format!("m{i}"), true, Duration::from_secs(60));
        }
        if replicas == 1 {
            pg_rt = p50(rt.block_on(round_trips(refs[0], n)));
        }
        let pg_pid = store.cluster.pid();
        let before = (cpu(&[refs[0].pid()]), byom_tests::tree_cpu_time(pg_pid));
        pg_rates.push(rt.block_on(throughput(&refs, k, m)));
        if replicas == 1 {
            let after = (cpu(&[refs[0].pid()]), byom_tests::tree_cpu_time(pg_pid));
            pg_cpu = (per_cmd(after.0 .0, before.0 .0), per_cmd(after.1, before.1));
        }
        drop(ds);
    }

    // Takeover: two replicas, kill -9 the one running the agents.
    let dir = tempfile::tempdir().unwrap();
    let store = SharedStore::in_dir(dir.path());
    let mut servers: Vec<Server> = (0..2)
        .map(|i| Server::replica(dir.path(), &format!("t{i}"), &store, &[]))
        .collect();
    let holder = byom_tests::wait_for("a lease holder", Duration::from_secs(30), || {
        servers
            .iter()
            .position(|s| s.log().contains("took the agents' lease"))
    });
    let other = 1 - holder;
    servers[holder].kill9();
    let t = Instant::now();
    byom_tests::wait_for("the takeover", Duration::from_secs(30), || {
        servers[other]
            .log()
            .contains("took the agents' lease")
            .then_some(())
    });
    let takeover = t.elapsed();

    println!(
        "\nstore ({} build, loopback, {k} daemons, {m} commands {CONCURRENCY} at once)",
        if cfg!(debug_assertions) {
            "DEBUG"
        } else {
            "release"
        }
    );
    println!(
        "spawn `true` locally, p50:              {:.3} ms",
        ms(local)
    );
    println!(
        "API round trip p50, sled:               {:.3} ms (overhead {:.3} ms over local)",
        ms(sled_rt),
        ms(sled_rt.saturating_sub(local))
    );
    println!(
        "  floors: API {:.3} ms, durable write {:.3} ms (a command needs 2), QUIC stream {:.3} ms, capturing the output {:.3} ms: {:.3} ms in all",
        ms(floors.api),
        ms(floors.flush),
        ms(floors.quic),
        ms(floors.capture),
        ms(floors.sum())
    );
    println!(
        "API round trip p50, PostgreSQL:         {:.3} ms (overhead {:.3} ms; {:.2}x sled)",
        ms(pg_rt),
        ms(pg_rt.saturating_sub(local)),
        pg_rt.as_secs_f64() / sled_rt.as_secs_f64()
    );
    println!(
        "round trips in turn, sled: one call (RunCommand) {:.3} ms, two calls (Create, Watch) {:.3} ms",
        ms(one),
        ms(two)
    );
    println!("local spawns, {CONCURRENCY} at once:            {local_rate:.0}/s");
    println!(
        "commands/s, one sled server:            {sled_rate:.0} ({:.2}x local)",
        sled_rate / local_rate
    );
    println!(
        "CPU per command at that rate:           server {server_cpu:.0} µs, daemons {daemons_cpu:.0} µs, `true` itself {commands_cpu:.0} µs, client {client_cpu:.0} µs"
    );
    println!("  so at most {ceiling:.0} commands/s with all {cores} cores busy");
    println!(
        "CPU per command, PostgreSQL, 1 replica:  server {:.0} µs, PostgreSQL {:.0} µs",
        pg_cpu.0, pg_cpu.1
    );
    for (i, r) in pg_rates.iter().enumerate() {
        println!(
            "commands/s, PostgreSQL, {} replica(s):   {r:.0} ({:.2}x sled)",
            i + 1,
            r / sled_rate
        );
    }
    println!(
        "agents' takeover after kill -9 of the lease holder: {:.2} s (lease {} s)",
        takeover.as_secs_f64(),
        4
    );
}

/// What no command round trip on this machine can beat, measured here:
/// the API's own round trip (`ServerInfo`, no store), a durable store
/// write (one small put and its flush: a command pays two, for its
/// creation and its exit), a QUIC stream's round trip between two
/// endpoints in this process (the dispatch and the exit record), and
/// the extra time of spawning `true` with its output captured, as the
/// daemon must. Their sum is the least overhead a command can have here.
struct Floors {
    api: Duration,
    flush: Duration,
    quic: Duration,
    capture: Duration,
}

impl Floors {
    fn sum(&self) -> Duration {
        self.api + 2 * self.flush + self.quic + self.capture
    }
}

async fn floors(s: &Server, n: usize) -> Floors {
    let mut c = client(s).await;
    let mut api = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        c.server_info(byom_protocol::pb::ServerInfoRequest::default())
            .await
            .unwrap();
        api.push(t.elapsed());
    }

    let dir = tempfile::tempdir().unwrap();
    let store = byom_store::Store::open_sled(dir.path()).unwrap();
    let flush = (0..n)
        .map(|i| {
            let t = Instant::now();
            store
                .put_raw(byom_store::Space::Commands, &format!("k{i}"), &[7; 200])
                .unwrap();
            store.flush().unwrap();
            t.elapsed()
        })
        .collect();

    // Spawning `true` as the baseline does, and with its output captured
    // by the runtime (as the daemon does) and from a thread of its own
    // (std polls both pipes, then waits: no runtime wake-ups), in turn so
    // the three see the same machine. The floor is the cheaper capture's
    // extra time over the plain spawn.
    let (mut plain, mut tokio_io, mut std_io) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..n {
        let t = Instant::now();
        assert!(std::process::Command::new("true")
            .status()
            .unwrap()
            .success());
        plain.push(t.elapsed());
        let t = Instant::now();
        let out = tokio::process::Command::new("true")
            .stdin(std::process::Stdio::null())
            .output()
            .await
            .unwrap();
        assert!(out.status.success());
        tokio_io.push(t.elapsed());
        let t = Instant::now();
        let out = std::process::Command::new("true")
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        assert!(out.status.success());
        std_io.push(t.elapsed());
    }
    let capture = p50(tokio_io).min(p50(std_io)).saturating_sub(p50(plain));

    Floors {
        api: p50(api),
        flush: p50(flush),
        quic: p50(quic_round_trips(n).await),
        capture,
    }
}

/// A small request and its answer on a fresh stream of one QUIC
/// connection (TLS 1.3, as the gateway), both endpoints in this process.
async fn quic_round_trips(n: usize) -> Vec<Duration> {
    use rustls::pki_types::{CertificateDer, PrivatePkcs8KeyDer};
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let der = CertificateDer::from(cert.cert.der().to_vec());
    let key = PrivatePkcs8KeyDer::from(cert.signing_key.serialize_der());
    let provider = byom_daemon::tls::provider();
    let server_tls = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![der.clone()], key.into())
        .unwrap();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(der).unwrap();
    let client_tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let server_cfg = quinn::ServerConfig::with_crypto(Arc::new(
        quinn::crypto::rustls::QuicServerConfig::try_from(server_tls).unwrap(),
    ));
    let client_cfg = quinn::ClientConfig::new(Arc::new(
        quinn::crypto::rustls::QuicClientConfig::try_from(client_tls).unwrap(),
    ));
    let server = quinn::Endpoint::server(server_cfg, "127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = server.local_addr().unwrap();
    let echo = tokio::spawn(async move {
        let conn = server.accept().await.unwrap().await.unwrap();
        while let Ok((mut send, mut recv)) = conn.accept_bi().await {
            let req = recv.read_to_end(1 << 16).await.unwrap();
            send.write_all(&req).await.unwrap();
            let _ = send.finish();
        }
    });
    let client = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    let conn = client
        .connect_with(client_cfg, addr, "localhost")
        .unwrap()
        .await
        .unwrap();
    let mut v = Vec::with_capacity(n);
    for i in 0..n + 20 {
        let t = Instant::now();
        let (mut send, mut recv) = conn.open_bi().await.unwrap();
        send.write_all(&[1; 120]).await.unwrap();
        send.finish().unwrap();
        let back = recv.read_to_end(1 << 16).await.unwrap();
        assert_eq!(back.len(), 120);
        if i >= 20 {
            v.push(t.elapsed());
        }
    }
    conn.close(0u32.into(), b"");
    echo.abort();
    v
}
