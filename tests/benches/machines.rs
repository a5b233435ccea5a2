//! Many-machines benchmark (run with `cargo bench -p byom-tests --bench machines`).
//!
//! One real `byom server` process; N daemons simulated in this process with
//! the real daemon code (`byom_daemon::pair` and `byom_daemon::conn::run`),
//! each with its own identity, UDP socket and QUIC connection. Measures:
//!  * server memory per idle connection (RSS delta / N);
//!  * commands/s dispatched and completed (`true` on every machine, issued
//!    through the API with bounded concurrency), against a baseline measured
//!    in the same run: the same number of local `true` spawns with the same
//!    concurrency.
//!
//! N = BENCH_MACHINES (default 1000), commands = BENCH_COMMANDS (default 2000).

use std::sync::Arc;
use std::time::{Duration, Instant};

use byom_protocol::pb;
use byom_tests::Server;
use tokio::sync::Semaphore;

fn rss_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

const CONCURRENCY: usize = 64;

fn main() {
    let n = env("BENCH_MACHINES", 1000);
    let m = env("BENCH_COMMANDS", 2000);
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let pid = server.pid().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let creds = byom_api::load_creds(Some(&server.creds()), None).unwrap();
        let client = byom_api::connect(&creds).await.unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
        let rss0 = rss_kib(pid);

        // Pair N machines (real CSR + token redemption each).
        let t = Instant::now();
        let sem = Arc::new(Semaphore::new(32));
        let mut tasks = Vec::new();
        for i in 0..n {
            let mut c = client.clone();
            let sem = sem.clone();
            let d = dir.path().join(format!("m{i}"));
            tasks.push(tokio::spawn(async move {
                let _p = sem.acquire().await.unwrap();
                let tok = c
                    .create_token(pb::CreateTokenRequest::default())
                    .await
                    .unwrap()
                    .into_inner()
                    .secret;
                byom_daemon::pair::pair(
                    &d,
                    byom_daemon::pair::PairOptions {
                        token: tok,
                        name: Some(format!("m{i}")),
                        server: None,
                        key_store: byom_daemon::identity::KeyStoreChoice::File,
                        replace: None,
                    },
                )
                .await
                .unwrap();
                d
            }));
        }
        let mut dirs = Vec::new();
        for t in tasks {
            dirs.push(t.await.unwrap());
        }
        let pair_time = t.elapsed();
        let rss_paired = rss_kib(pid);

        // Connect them all.
        let t = Instant::now();
        let shutdown = tokio_util::sync::CancellationToken::new();
        for d in dirs {
            let s = shutdown.clone();
            tokio::spawn(async move {
                let _ = byom_daemon::conn::run(
                    byom_daemon::conn::RunOptions {
                        config_dir: d,
                        server: None,
                        labels: vec![],
                        upgrade_trial: None,
                    },
                    s,
                )
                .await;
            });
        }
        let mut c = client.clone();
        loop {
            let ms = c
                .list_machines(pb::ListMachinesRequest::default())
                .await
                .unwrap()
                .into_inner()
                .machines;
            let online = ms.iter().filter(|m| m.online).count();
            if online == n {
                break;
            }
            assert!(
                t.elapsed() < Duration::from_secs(300),
                "only {online}/{n} online"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let connect_time = t.elapsed();
        tokio::time::sleep(Duration::from_secs(3)).await;
        let rss1 = rss_kib(pid);

        // Baseline: local spawns with the same concurrency.
        let local = byom_tests::per_second(m, CONCURRENCY, |_| byom_tests::spawn_true()).await;

        // Commands through the API, round-robin over machines.
        let byom = byom_tests::per_second(m, CONCURRENCY, |i| {
            let mut c = client.clone();
            async move {
                byom_tests::api_round_trip(&mut c, &format!("m{}", i % n)).await;
            }
        })
        .await;
        let rss2 = rss_kib(pid);
        shutdown.cancel();

        println!(
            "\nmany machines ({} build, loopback, one process of simulated daemons)",
            if cfg!(debug_assertions) {
                "DEBUG"
            } else {
                "release"
            }
        );
        println!("machines:                         {n}");
        println!(
            "pairing:                          {:.1} s ({:.0} pairings/s)",
            pair_time.as_secs_f64(),
            n as f64 / pair_time.as_secs_f64()
        );
        println!(
            "all online after:                 {:.1} s",
            connect_time.as_secs_f64()
        );
        println!(
            "server RSS idle / paired / connected / after commands: {} / {} / {} / {} MiB",
            rss0 / 1024,
            rss_paired / 1024,
            rss1 / 1024,
            rss2 / 1024
        );
        println!(
            "server memory per idle connection: {:.1} KiB",
            (rss1.saturating_sub(rss_paired)) as f64 / n as f64
        );
        println!("commands (true, concurrency {CONCURRENCY}): {m}");
        println!("  local spawn baseline:           {local:.0} commands/s");
        println!(
            "  through byom (API → QUIC → daemon → store): {byom:.0} commands/s ({:.2}x of local)",
            byom / local
        );
        drop(server);
    });
}
