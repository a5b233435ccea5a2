//! The local side of a remote terminal (`byom exec -t`, `byom shell`):
//! this terminal in raw mode (every key, Ctrl-C and Ctrl-Z included, goes
//! to the machine, whose terminal turns them into signals), its size at
//! the start and at every change, restored when done.

use byom_protocol::pb;

/// Size when stdin is not a terminal (as ssh -t assumes).
const DEFAULT_SIZE: (u32, u32) = (24, 80);

/// This terminal's size (rows, cols), if stdin is one.
pub fn size() -> Option<(u32, u32)> {
    #[cfg(unix)]
    {
        // SAFETY: TIOCGWINSZ fills a winsize.
        let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
        let r = unsafe { libc::ioctl(0, libc::TIOCGWINSZ, &mut ws) };
        if r == 0 && ws.ws_row > 0 && ws.ws_col > 0 {
            return Some((ws.ws_row as u32, ws.ws_col as u32));
        }
    }
    None
}

pub fn size_or_default() -> (u32, u32) {
    size().unwrap_or(DEFAULT_SIZE)
}

/// This terminal in raw mode until dropped.
pub struct Raw {
    #[cfg(unix)]
    saved: Option<libc::termios>,
}

impl Raw {
    /// Raw mode on stdin, if it is a terminal (else nothing to do).
    pub fn enter() -> Raw {
        #[cfg(unix)]
        {
            // SAFETY: tcgetattr/tcsetattr on fd 0 with termios we own.
            let mut t: libc::termios = unsafe { std::mem::zeroed() };
            if unsafe { libc::tcgetattr(0, &mut t) } != 0 {
                return Raw { saved: None };
            }
            let saved = t;
            unsafe {
                libc::cfmakeraw(&mut t);
                libc::tcsetattr(0, libc::TCSANOW, &t);
            }
            Raw { saved: Some(saved) }
        }
        #[cfg(not(unix))]
        Raw {}
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        #[cfg(unix)]
        if let Some(t) = &self.saved {
            // SAFETY: restores what tcgetattr gave.
            unsafe {
                libc::tcsetattr(0, libc::TCSANOW, t);
            }
        }
    }
}

/// What the terminal sends the machine: keys as they are typed, and its
/// new size whenever it changes (SIGWINCH).
pub fn input() -> tokio::sync::mpsc::Receiver<pb::ExecInput> {
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    let keys = tx.clone();
    std::thread::spawn(move || {
        use std::io::Read;
        let mut stdin = std::io::stdin().lock();
        let mut buf = [0u8; 4096];
        loop {
            match stdin.read(&mut buf) {
                Ok(0) => return,
                Ok(n) => {
                    let m = pb::ExecInput {
                        stdin: buf[..n].to_vec(),
                        ..Default::default()
                    };
                    if keys.blocking_send(m).is_err() {
                        return;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return,
            }
        }
    });
    #[cfg(unix)]
    tokio::spawn(async move {
        use tokio::signal::unix::{signal, SignalKind};
        let Ok(mut winch) = signal(SignalKind::window_change()) else {
            return;
        };
        while winch.recv().await.is_some() {
            let Some((rows, cols)) = size() else { continue };
            let m = pb::ExecInput {
                resize: Some(pb::Resize { rows, cols }),
                ..Default::default()
            };
            if tx.send(m).await.is_err() {
                return;
            }
        }
    });
    rx
}
