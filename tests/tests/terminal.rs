//! `byom exec -t` / `byom shell` with a real pseudo-terminal on both
//! sides: the CLI runs on one this test opens, the command on one the
//! daemon opens. The window's size reaches the command and follows a
//! resize, Ctrl-C interrupts the remote job (not byom), and the exit
//! status comes back.

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::Stdio;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use byom_tests::Server;

const T: Duration = Duration::from_secs(30);

fn winsize(rows: u16, cols: u16) -> libc::winsize {
    libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    }
}

/// What the terminal shows, read on a thread of its own.
struct Screen {
    rx: mpsc::Receiver<Vec<u8>>,
    seen: String,
}

impl Screen {
    /// Waits (bounded) until `text` appears after what was consumed;
    /// returns everything up to and including it.
    fn until(&mut self, text: &str) -> String {
        let deadline = Instant::now() + T;
        loop {
            if let Some(i) = self.seen.find(text) {
                let upto: String = self.seen.drain(..i + text.len()).collect();
                return upto;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "{text:?} never appeared; the screen:\n{}",
                self.seen
            );
            if let Ok(b) = self.rx.recv_timeout(left.min(Duration::from_millis(200))) {
                self.seen.push_str(&String::from_utf8_lossy(&b));
            }
        }
    }
}

#[test]
fn a_terminal_follows_the_window_passes_ctrl_c_and_returns_the_status() {
    let (_dir, server, _d) = Server::with_lap(&[], &[]);
    let (mut m, mut s) = (-1, -1);
    let ws = winsize(30, 100);
    // SAFETY: openpty writes two descriptors we then own.
    assert_eq!(
        unsafe { libc::openpty(&mut m, &mut s, std::ptr::null_mut(), std::ptr::null(), &ws) },
        0
    );
    let (master, slave) = unsafe { (OwnedFd::from_raw_fd(m), OwnedFd::from_raw_fd(s)) };
    let mut cmd = server.byom_cmd(&["shell", "lap"]);
    cmd.env("SHELL", "/bin/sh")
        .stdin(Stdio::from(slave.try_clone().unwrap()))
        .stdout(Stdio::from(slave.try_clone().unwrap()))
        .stderr(Stdio::from(slave.try_clone().unwrap()));
    // SAFETY: async-signal-safe calls only, between fork and exec: byom
    // gets the terminal as its controlling one, as in a real shell.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY as _, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().unwrap();
    drop(slave);
    let mut reader = std::fs::File::from(master.try_clone().unwrap());
    let mut writer = std::fs::File::from(master.try_clone().unwrap());
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        // Ends at EIO once byom is gone.
        while let Ok(n) = reader.read(&mut buf) {
            if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                return;
            }
        }
    });
    let mut screen = Screen {
        rx,
        seen: String::new(),
    };
    // Arithmetic the shell does: the typed line (echoed) never shows the
    // answer, only the command's output does.
    writer.write_all(b"stty size; echo $((40+2))A\r").unwrap();
    let out = screen.until("42A");
    assert!(out.contains("30 100"), "the size did not arrive: {out}");

    // A resize of this window reaches the remote terminal.
    // SAFETY: TIOCSWINSZ reads a winsize.
    let ws = winsize(40, 120);
    assert_eq!(
        unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSWINSZ, &ws) },
        0
    );
    let mut resized = false;
    for i in 0..20 {
        std::thread::sleep(Duration::from_millis(200));
        writer
            .write_all(format!("stty size; echo $((100+{i}))R\r").as_bytes())
            .unwrap();
        if screen.until(&format!("{}R", 100 + i)).contains("40 120") {
            resized = true;
            break;
        }
    }
    assert!(resized, "the resize never reached the command");

    // Ctrl-C interrupts the remote job, not byom.
    writer.write_all(b"sleep 30; echo $((40+4))C\r").unwrap();
    std::thread::sleep(Duration::from_millis(800));
    let t = Instant::now();
    writer.write_all(b"\x03").unwrap();
    writer.write_all(b"echo $((40+5))D\r").unwrap();
    let out = screen.until("45D");
    assert!(
        t.elapsed() < Duration::from_secs(20),
        "Ctrl-C did not stop the sleep"
    );
    assert!(!out.contains("44C"), "the interrupted list went on: {out}");
    assert!(
        child.try_wait().unwrap().is_none(),
        "Ctrl-C ended byom itself"
    );

    // The shell's status is byom's.
    writer.write_all(b"exit 7\r").unwrap();
    let deadline = Instant::now() + T;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "byom did not end with the shell");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status.code(), Some(7));
    let c = server.json(&["commands", "ls"]);
    assert_eq!(c[0]["tty"], true, "{c}");
}
