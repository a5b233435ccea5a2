//! Data through byom against ssh, in one run, on loopback (run with
//! `cargo build --release -p byom-control-plane -p byom-daemon && cargo
//! bench -p byom-tests --bench transfer`):
//!  1. `byom exec lap cat FILE` against `ssh localhost cat FILE`, both
//!     read to /dev/null: throughput;
//!  2. `byom cp FILE lap:DIR/` against `scp FILE localhost:DIR/`, and the
//!     other way;
//!  3. a 4 KiB file with `byom cp` against `scp`: latency.
//!
//! The pairs run interleaved (A B A B …) and the ratios are taken pair by
//! pair. ssh runs with a control master, as people run it; the ssh side
//! is skipped (said so) if openssh-server is not installed.
//! `BENCH_MIB` sets the big file's size (default 256), `BENCH_N` the
//! rounds (default 5; the small file runs 4x as many).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use byom_tests::{Server, Sshd};

fn timed(cmd: &mut Command) -> Duration {
    let t = Instant::now();
    let out = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{:?}: {}",
        cmd,
        String::from_utf8_lossy(&out.stderr)
    );
    t.elapsed()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

struct Pair {
    name: &'static str,
    a: Vec<Duration>,
    b: Vec<Duration>,
}

impl Pair {
    fn print(&self, bytes: Option<u64>) {
        let secs = |v: &Vec<Duration>| median(v.iter().map(Duration::as_secs_f64).collect());
        let ratios: Vec<f64> = self
            .a
            .iter()
            .zip(&self.b)
            .map(|(a, b)| a.as_secs_f64() / b.as_secs_f64())
            .collect();
        let (lo, hi) = ratios
            .iter()
            .fold((f64::MAX, 0f64), |(l, h), r| (l.min(*r), h.max(*r)));
        let rate = |s: f64| match bytes {
            Some(b) => format!("{:>8.1} MB/s", b as f64 / s / 1e6),
            None => format!("{:>8.2} ms", s * 1000.0),
        };
        if self.b.is_empty() {
            println!(
                "{:<44} {}   (no sshd: not compared)",
                self.name,
                rate(secs(&self.a))
            );
            return;
        }
        println!(
            "{:<44} {}  vs {}   time ratio byom/ssh p50 {:.3} (min {:.3}, max {:.3}, n={})",
            self.name,
            rate(secs(&self.a)),
            rate(secs(&self.b)),
            median(ratios),
            lo,
            hi,
            self.a.len()
        );
    }
}

fn main() {
    let n: usize = std::env::var("BENCH_N")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let mib: u64 = std::env::var("BENCH_MIB")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(256);
    let (dir, server, _d) = Server::with_lap(&[], &[]);
    let ssh_dir = tempfile::tempdir().unwrap();
    let sshd = Sshd::start(ssh_dir.path());
    let big = dir.path().join("big.bin");
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&big).unwrap();
        let mut block = vec![0u8; 1 << 20];
        for _ in 0..mib {
            byom_protocol::random::fill(&mut block);
            f.write_all(&block).unwrap();
        }
    }
    let small = dir.path().join("small.txt");
    std::fs::write(&small, vec![b'x'; 4096]).unwrap();
    let to = dir.path().join("to");
    std::fs::create_dir_all(&to).unwrap();
    let back = dir.path().join("back.bin");
    let bytes = mib << 20;
    let p = |x: &Path| x.display().to_string();

    let byom = |args: &[&str]| {
        let mut c = server.byom_cmd(args);
        c.env_remove("BYOM_LOG");
        c
    };
    let ssh = |cmd: &str| {
        let s = sshd.as_ref()?;
        let mut c = Command::new("ssh");
        c.args(s.ssh_args()).arg(cmd);
        Some(c)
    };
    let scp = |from: &str, to: &str| {
        let s = sshd.as_ref()?;
        let mut c = Command::new("scp");
        c.args(s.scp_args()).arg(from).arg(to);
        Some(c)
    };
    let run = |name: &'static str,
               rounds: usize,
               mut a: Box<dyn FnMut() -> Command + '_>,
               mut b: Box<dyn FnMut() -> Option<Command> + '_>| {
        // One warm-up each.
        timed(&mut a());
        if let Some(mut c) = b() {
            timed(&mut c);
        }
        let mut pair = Pair {
            name,
            a: Vec::new(),
            b: Vec::new(),
        };
        for _ in 0..rounds {
            pair.a.push(timed(&mut a()));
            if let Some(mut c) = b() {
                pair.b.push(timed(&mut c));
            }
        }
        pair
    };

    let cat = run(
        "exec cat (byom exec lap cat F; ssh cat F)",
        n,
        Box::new(|| byom(&["exec", "lap", "cat", &p(&big)])),
        Box::new(|| ssh(&format!("cat {}", p(&big)))),
    );
    let up = run(
        "copy up (byom cp F lap:D/; scp F host:D/)",
        n,
        Box::new(|| byom(&["cp", &p(&big), &format!("lap:{}/", p(&to))])),
        Box::new(|| scp(&p(&big), &format!("127.0.0.1:{}/", p(&to)))),
    );
    let down = run(
        "copy down (byom cp lap:F B; scp host:F B)",
        n,
        Box::new(|| byom(&["cp", &format!("lap:{}", p(&big)), &p(&back)])),
        Box::new(|| scp(&format!("127.0.0.1:{}", p(&big)), &p(&back))),
    );
    let tiny = run(
        "4 KiB file up (byom cp; scp)",
        n * 4,
        Box::new(|| byom(&["cp", &p(&small), &format!("lap:{}/", p(&to))])),
        Box::new(|| scp(&p(&small), &format!("127.0.0.1:{}/", p(&to)))),
    );

    println!(
        "\ndata through byom and ssh (byom and byomd from {}, loopback, {mib} MiB file)",
        byom_tests::bin_dir().display()
    );
    cat.print(Some(bytes));
    up.print(Some(bytes));
    down.print(Some(bytes));
    tiny.print(None);
}
