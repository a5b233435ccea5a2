//! Data of any size through `byom exec`: stdout and stdin flow end to
//! end with flow control, memory stays bounded on the server and the
//! daemon, a slow reader slows the command instead of losing bytes, and
//! the store keeps the head and the tail of long output and says so.

use std::io::{Read, Write};
use std::process::Stdio;
use std::time::{Duration, Instant};

use byom_tests::{stderr, wait_for, Server};

const T: Duration = Duration::from_secs(60);

/// Bytes moved by the big tests: 1 GiB (BYOM_STREAM_MIB sets fewer MiB
/// for a quick run by hand).
fn total() -> u64 {
    std::env::var("BYOM_STREAM_MIB")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(1024)
        << 20
}

/// `byom ARGS` with stdin, stdout and stderr piped to this test.
fn piped(server: &Server, args: &[&str]) -> std::process::Child {
    server
        .byom_cmd(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The first command the server lists as running, once there is one.
fn the_running_command(server: &Server) -> serde_json::Value {
    wait_for("the command running", T, || {
        let v = server.json(&["commands", "ls", "--state", "running"]);
        v.as_array().and_then(|a| a.first().cloned())
    })
}

fn rss_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Samples the peak RSS of some processes while `f` runs.
fn peak_rss<R>(pids: &[u32], f: impl FnOnce() -> R) -> (R, Vec<u64>) {
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (s, p) = (stop.clone(), pids.to_vec());
    let sampler = std::thread::spawn(move || {
        let mut peak = vec![0u64; p.len()];
        // Bounded: at most an hour of 50 ms samples.
        for _ in 0..72_000 {
            for (i, pid) in p.iter().enumerate() {
                peak[i] = peak[i].max(rss_kib(*pid));
            }
            if s.load(std::sync::atomic::Ordering::Relaxed) {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        peak
    });
    let r = f();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    (r, sampler.join().unwrap())
}

#[test]
fn a_gibibyte_each_way_through_exec() {
    let (dir, server, d) = Server::with_lap(&[], &[]);
    let pids = [server.pid().unwrap(), d.pid().unwrap()];
    // Warm: the first command's allocations are not the stream's.
    assert!(server.byom(&["exec", "lap", "true"]).status.success());
    let idle: Vec<u64> = pids.iter().map(|p| rss_kib(*p)).collect();
    // A block of random bytes, repeated: the remote side makes the same
    // stream from the same file.
    let mut block = vec![0u8; 16 << 20];
    byom_protocol::random::fill(&mut block);
    let file = dir.path().join("block");
    std::fs::write(&file, &block).unwrap();
    let n = total() / block.len() as u64;
    let want = {
        let mut h = ring::digest::Context::new(&ring::digest::SHA256);
        for _ in 0..n {
            h.update(&block);
        }
        byom_protocol::hex(h.finish().as_ref())
    };

    // stdout: the machine sends it, we hash it.
    let t = Instant::now();
    let (got, peak) = peak_rss(&pids, || {
        let mut child = server
            .byom_cmd(&[
                "exec",
                "lap",
                "--sh",
                &format!("for i in $(seq {n}); do cat {}; done", file.display()),
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = child.stdout.take().unwrap();
        let mut h = ring::digest::Context::new(&ring::digest::SHA256);
        let mut buf = vec![0u8; 1 << 20];
        let mut len = 0u64;
        loop {
            let k = out.read(&mut buf).unwrap();
            if k == 0 {
                break;
            }
            len += k as u64;
            h.update(&buf[..k]);
        }
        let status = child.wait().unwrap();
        let mut err = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        assert!(status.success(), "{status:?} {err}");
        (len, byom_protocol::hex(h.finish().as_ref()))
    });
    eprintln!(
        "stdout: {} MiB in {:?}; peak RSS server {} KiB, daemon {} KiB (idle {idle:?})",
        total() >> 20,
        t.elapsed(),
        peak[0],
        peak[1]
    );
    assert_eq!(got, (total(), want.clone()), "stdout arrived changed");
    for (p, i) in peak.iter().zip(&idle) {
        assert!(
            p.saturating_sub(*i) < 64 << 10,
            "RSS grew {p} KiB from {i} KiB"
        );
    }

    // stdin: we send it, the machine hashes it.
    let t = Instant::now();
    let (out, peak) = peak_rss(&pids, || {
        let mut child = server
            .byom_cmd(&["exec", "lap", "sha256sum"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut input = child.stdin.take().unwrap();
        let feeder = std::thread::spawn(move || {
            for _ in 0..n {
                input.write_all(&block).unwrap();
            }
        });
        let out = child.wait_with_output().unwrap();
        feeder.join().unwrap();
        out
    });
    eprintln!(
        "stdin: {} MiB in {:?}; peak RSS server {} KiB, daemon {} KiB",
        total() >> 20,
        t.elapsed(),
        peak[0],
        peak[1]
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .next(),
        Some(want.as_str()),
        "stdin arrived changed"
    );
    for (p, i) in peak.iter().zip(&idle) {
        assert!(
            p.saturating_sub(*i) < 64 << 10,
            "RSS grew {p} KiB from {i} KiB"
        );
    }
}

/// A client that does not read holds the command back (its output waits
/// on the machine, within the window) instead of losing bytes; the store
/// keeps the head and the tail, and says how much it did not keep.
#[test]
fn a_slow_reader_slows_the_command_and_the_store_keeps_head_and_tail() {
    let (_dir, server, _d) =
        Server::with_lap(&["--output-head", "1MiB", "--output-tail", "1MiB"], &[]);
    let total: u64 = 64 << 20;
    let mut child = server
        .byom_cmd(&[
            "exec",
            "lap",
            "--sh",
            &format!("head -c {total} /dev/zero; echo finished >&2"),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Nobody reads: the command cannot finish.
    let running = the_running_command(&server);
    std::thread::sleep(Duration::from_secs(3));
    let id = running["id"].as_str().unwrap().to_string();
    assert_eq!(
        server.command(&id)["state"],
        "running",
        "the command ran on while its client read nothing"
    );
    // Now read it all: every byte, in order.
    let mut out = child.stdout.take().unwrap();
    let mut buf = vec![0u8; 1 << 20];
    let mut len = 0u64;
    loop {
        let k = out.read(&mut buf).unwrap();
        if k == 0 {
            break;
        }
        assert!(buf[..k].iter().all(|b| *b == 0));
        len += k as u64;
    }
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}");
    assert_eq!(len, total);
    let c = server.wait_done(&id, T);
    assert_eq!(c["stdout_bytes"], total);
    let elided = c["stdout_elided"].as_u64().unwrap();
    // At least the head and the tail are kept (exactly 2 MiB when the
    // chunks fall on the boundaries), less than a chunk more of each.
    assert!(
        elided > total - (3 << 20) && elided <= total - (2 << 20),
        "the store kept {} of {total} bytes, not its 1 MiB head and 1 MiB tail",
        total - elided
    );
    assert_eq!(c["truncated"], false);
    // `show` says so, and marks where bytes are missing.
    let shown = server.byom(&["commands", "show", &id]);
    let text = String::from_utf8_lossy(&shown.stdout);
    assert!(
        text.contains("kept (the store keeps the head and the tail"),
        "{text:.2000}"
    );
    assert!(text.contains(&format!("[byom: {elided} bytes not kept here]")));
}

/// A client that goes while sending stdin cuts it: the command sees its
/// stdin end, and its record says it was cut.
#[test]
fn a_client_gone_mid_stdin_cuts_it_and_the_record_says_so() {
    let (_dir, server, _d) = Server::with_lap(&[], &[]);
    let mut child = piped(
        &server,
        &["exec", "lap", "--sh", "wc -c; echo stdin ended >&2"],
    );
    let mut input = child.stdin.take().unwrap();
    // More than a request carries: it streams.
    input.write_all(&vec![b'x'; 2 << 20]).unwrap();
    let running = the_running_command(&server);
    let id = running["id"].as_str().unwrap().to_string();
    std::thread::sleep(Duration::from_millis(500));
    child.kill().unwrap();
    let _ = child.wait();
    drop(input);
    let c = server.wait_done(&id, T);
    assert_eq!(c["state"], "exited", "{c}");
    assert_eq!(c["stdin_cut"], true, "{c}");
    let shown = server.byom(&["commands", "show", &id]);
    assert!(
        String::from_utf8_lossy(&shown.stdout).contains("stdin:    cut"),
        "{}",
        stderr(&shown)
    );
}

/// Small stdin still goes in the request, and a pipe that stays open
/// (a producer slower than a request) streams.
#[test]
fn stdin_from_a_slow_producer_streams_to_its_end() {
    let (_dir, server, _d) = Server::with_lap(&[], &[]);
    let mut child = piped(&server, &["exec", "lap", "wc", "-c"]);
    let mut input = child.stdin.take().unwrap();
    for _ in 0..5 {
        input.write_all(b"tick\n").unwrap();
        input.flush().unwrap();
        std::thread::sleep(Duration::from_millis(150));
    }
    drop(input);
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "25");
}

fn sha256_of(path: &std::path::Path) -> String {
    let mut f = std::fs::File::open(path).unwrap();
    let mut h = ring::digest::Context::new(&ring::digest::SHA256);
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let k = f.read(&mut buf).unwrap();
        if k == 0 {
            break;
        }
        h.update(&buf[..k]);
    }
    byom_protocol::hex(h.finish().as_ref())
}

#[cfg(unix)]
fn mode_of(path: &std::path::Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

/// `byom cp` both ways: a gibibyte file up and down intact, its mode
/// kept, memory bounded; a directory tree up and down with `-r`; the
/// machine's policy decides (a denied copy writes nothing).
#[test]
fn cp_moves_files_and_trees_both_ways_intact() {
    let (dir, server, d) = Server::with_lap(&[], &[]);
    let pids = [server.pid().unwrap(), d.pid().unwrap()];
    assert!(server.byom(&["exec", "lap", "true"]).status.success());
    let idle: Vec<u64> = pids.iter().map(|p| rss_kib(*p)).collect();
    let src = dir.path().join("src");
    std::fs::create_dir_all(src.join("sub")).unwrap();
    let big = src.join("big.bin");
    {
        let mut f = std::fs::File::create(&big).unwrap();
        let mut block = vec![0u8; 16 << 20];
        byom_protocol::random::fill(&mut block);
        for _ in 0..total() / block.len() as u64 {
            f.write_all(&block).unwrap();
        }
    }
    std::fs::write(src.join("sub/small.txt"), b"small\n").unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&big, std::fs::Permissions::from_mode(0o750)).unwrap();
    }
    let want = sha256_of(&big);
    let there = dir.path().join("there");
    std::fs::create_dir_all(&there).unwrap();

    let t = Instant::now();
    let (out, peak) = peak_rss(&pids, || {
        server.byom(&[
            "cp",
            big.to_str().unwrap(),
            &format!("lap:{}/", there.display()),
        ])
    });
    assert!(out.status.success(), "{}", stderr(&out));
    eprintln!(
        "cp up: {} MiB in {:?}; peak RSS {peak:?} (idle {idle:?})",
        total() >> 20,
        t.elapsed()
    );
    let up = there.join("big.bin");
    assert_eq!(sha256_of(&up), want, "cp up changed the bytes");
    #[cfg(unix)]
    assert_eq!(mode_of(&up), 0o750);
    for (p, i) in peak.iter().zip(&idle) {
        assert!(
            p.saturating_sub(*i) < 64 << 10,
            "RSS grew {p} KiB from {i} KiB"
        );
    }
    // Nothing left beside it: the temporary name was renamed.
    let names: Vec<_> = std::fs::read_dir(&there)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, vec!["big.bin".to_string()]);

    let back = dir.path().join("back.bin");
    let t = Instant::now();
    let (out, peak) = peak_rss(&pids, || {
        server.byom(&[
            "cp",
            &format!("lap:{}", up.display()),
            back.to_str().unwrap(),
        ])
    });
    assert!(out.status.success(), "{}", stderr(&out));
    eprintln!(
        "cp down: {} MiB in {:?}; peak RSS {peak:?}",
        total() >> 20,
        t.elapsed()
    );
    assert_eq!(sha256_of(&back), want, "cp down changed the bytes");
    #[cfg(unix)]
    assert_eq!(mode_of(&back), 0o750);
    for (p, i) in peak.iter().zip(&idle) {
        assert!(
            p.saturating_sub(*i) < 64 << 10,
            "RSS grew {p} KiB from {i} KiB"
        );
    }
    std::fs::remove_file(&up).unwrap();
    std::fs::remove_file(&back).unwrap();
    std::fs::remove_file(&big).unwrap();

    // Trees, with -r (and without it, a clear refusal).
    let out = server.byom(&[
        "cp",
        src.to_str().unwrap(),
        &format!("lap:{}/tree", there.display()),
    ]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("use -r"), "{}", stderr(&out));
    let out = server.byom(&[
        "cp",
        "-r",
        src.to_str().unwrap(),
        &format!("lap:{}/tree", there.display()),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        std::fs::read(there.join("tree/sub/small.txt")).unwrap(),
        b"small\n"
    );
    let down = dir.path().join("tree-back");
    let out = server.byom(&[
        "cp",
        "-r",
        &format!("lap:{}/tree", there.display()),
        down.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        std::fs::read(down.join("sub/small.txt")).unwrap(),
        b"small\n"
    );

    // A copy is a command: both sides keep it.
    let v = server.json(&["commands", "ls"]);
    let copies = v
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["argv"].to_string().contains("byom-cp"))
        .count();
    assert!(copies >= 4, "{v}");
    let audit = std::fs::read_to_string(dir.path().join("lap/audit.log")).unwrap_or_default();
    assert!(
        audit.contains("byom-cp"),
        "the machine's audit log does not show the copies"
    );

    // The machine says a file's mode: setuid and setgid bits it asks for
    // are not made here (a machine must not plant a setuid file on the
    // admin's side), and this side's umask applies.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let suid = there.join("suid-tool");
        std::fs::write(&suid, b"#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&suid, std::fs::Permissions::from_mode(0o6777)).unwrap();
        let got = dir.path().join("suid-here");
        let out = server.byom(&[
            "cp",
            &format!("lap:{}", suid.display()),
            got.to_str().unwrap(),
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
        let mode = mode_of(&got);
        assert_eq!(mode & 0o7000, 0, "a special bit came across: {mode:o}");
    }

    // A missing file is a clear error and writes nothing here.
    let nowhere = dir.path().join("nowhere");
    let out = server.byom(&["cp", "lap:/nonexistent/file", nowhere.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("no file /nonexistent/file"),
        "{}",
        stderr(&out)
    );
    assert!(!nowhere.exists());
}
