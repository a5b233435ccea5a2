//! Command creation against a long queue (run with `cargo bench -p
//! byom-tests --bench queue`).
//!
//! One real `byom server`; one paired machine that stays offline, so every
//! command waits in its queue. Measures commands created per second
//! through the API (sequential calls, each acknowledged after its flush)
//! with an empty queue, then again with BENCH_QUEUED (default 9,500)
//! already waiting, near the 10,000 limit. Creating a command used to scan
//! the whole queue (about 180/s empty, 56/s near the limit); with the count
//! kept, the ratio should stay near 1.

use std::time::{Duration, Instant};

use byom_protocol::pb;
use byom_tests::Server;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

async fn create(c: &mut byom_api::Client, n: usize) -> Duration {
    let t = Instant::now();
    for _ in 0..n {
        c.create_command(pb::CreateCommandRequest {
            machine: "lap".into(),
            argv: vec!["true".into()],
            idempotency_key: byom_api::new_key(),
            ..Default::default()
        })
        .await
        .unwrap();
    }
    t.elapsed()
}

fn main() {
    let sample = env("BENCH_SAMPLE", 300);
    let queued = env("BENCH_QUEUED", 9500);
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let creds = byom_api::load_creds(Some(&server.creds()), None).unwrap();
        let mut c = byom_api::connect(&creds).await.unwrap();
        let tok = c
            .create_token(pb::CreateTokenRequest::default())
            .await
            .unwrap()
            .into_inner()
            .secret;
        byom_daemon::pair::pair(
            &dir.path().join("lap"),
            byom_daemon::pair::PairOptions {
                token: tok,
                name: Some("lap".into()),
                server: None,
                key_store: byom_daemon::identity::KeyStoreChoice::File,
                replace: None,
            },
        )
        .await
        .unwrap();

        let empty = create(&mut c, sample).await;
        let fill = queued.saturating_sub(2 * sample);
        let t = Instant::now();
        create(&mut c, fill).await;
        eprintln!("filled the queue with {fill} more in {:?}", t.elapsed());
        let full = create(&mut c, sample).await;
        let rate = |d: Duration| sample as f64 / d.as_secs_f64();
        println!(
            "creates/s with an empty queue: {:.0}; with {} queued: {:.0}; ratio {:.2}",
            rate(empty),
            queued - sample,
            rate(full),
            rate(full) / rate(empty)
        );
    });
}
