//! One QUIC stream per command: the connection's dispatcher takes queued
//! work as slots free up, and each stream sends the ExecRequest (or
//! re-attaches), reports what the daemon says through the commands
//! service, and acknowledges the exit only once it is durable.

use std::sync::Arc;

use byom_protocol::limits;
use byom_protocol::pb::{self, to_daemon, to_server, CommandState, ToDaemon, ToServer};
use byom_wire::{read_frame, write_frame, WireError};
use tokio::sync::mpsc;

use super::Gateway;
use crate::live::LiveMachine;

/// Cancel requests buffered per command stream.
const CANCEL_BUFFER: usize = 4;

#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Mode {
    Exec,
    Attach,
}

/// The connection's dispatcher: sends the commands created straight into
/// its slots, and queued ones whenever the machine is woken (new work, a
/// freed slot while the queue may hold more, resumed), until the
/// connection ends.
pub(super) async fn dispatch_loop(gw: &Gateway, live: &Arc<LiveMachine>) -> String {
    loop {
        if !live.online() {
            return "connection closed".into();
        }
        for c in live.take_handed() {
            spawn_drive(gw, live, c, Mode::Exec, true);
        }
        if live.take_look() {
            for c in gw.commands.dispatch_batch(live).await {
                spawn_drive(gw, live, c, Mode::Exec, true);
            }
        }
        live.woken().await;
    }
}

/// Opens the command's stream in a task of its own. `reserved`: it takes
/// a slot promised to it.
pub(super) fn spawn_drive(
    gw: &Gateway,
    live: &Arc<LiveMachine>,
    cmd: pb::Command,
    mode: Mode,
    reserved: bool,
) {
    let (tx, rx) = mpsc::channel(CANCEL_BUFFER);
    live.track(&cmd.id, tx, reserved);
    let gw = gw.clone();
    let live = live.clone();
    tokio::spawn(async move {
        let id = cmd.id.clone();
        if let Err(e) = drive(&gw, &live, cmd, mode, rx).await {
            tracing::debug!(cmd = %id, "command stream ended: {e}");
        }
        // A slot freed up: the dispatcher looks again.
        live.untrack(&id);
    });
}

/// Runs one command stream to its end: sends Exec (or Attach), records
/// what comes back, acknowledges the exit.
async fn drive(
    gw: &Gateway,
    live: &LiveMachine,
    cmd: pb::Command,
    mode: Mode,
    cancel_rx: mpsc::Receiver<String>,
) -> anyhow::Result<()> {
    let mut keeper = crate::commands::Keeper::new(&gw.store, &cmd.id, gw.commands.output_keep())?;
    let id = cmd.id.clone();
    let r = drive_with(gw, live, cmd, mode, cancel_rx, &mut keeper).await;
    // However the stream ended (a network blip, say), the tail held here
    // was acknowledged to the daemon: it goes to the store now.
    if let Err(e) = gw.commands.write_tail(&id, &mut keeper, true) {
        tracing::warn!(cmd = %id, "cannot store the output's tail: {e}");
    }
    let _ = gw.store.flush_async().await;
    r
}

async fn drive_with(
    gw: &Gateway,
    live: &LiveMachine,
    cmd: pb::Command,
    mode: Mode,
    mut cancel_rx: mpsc::Receiver<String>,
    keeper: &mut crate::commands::Keeper,
) -> anyhow::Result<()> {
    let (mut send, recv) = live.conn.open_bi().await?;
    let first = match mode {
        Mode::Exec => to_daemon::Msg::Exec(crate::commands::exec_request(&cmd)),
        Mode::Attach => to_daemon::Msg::Attach(pb::AttachRequest {
            command_id: cmd.id.clone(),
            stdout_offset: gw
                .store
                .output_len(&cmd.id, pb::OutputStream::Stdout as i32)?,
            stderr_offset: gw
                .store
                .output_len(&cmd.id, pb::OutputStream::Stderr as i32)?,
        }),
    };
    match write_frame(&mut send, &ToDaemon { msg: Some(first) }).await {
        Ok(()) => {}
        // Never sendable: say so rather than leave it `dispatched`.
        Err(WireError::Frame(e)) => {
            gw.commands
                .refused(&cmd.id, "undeliverable", &e.to_string())
                .await?;
            return Ok(());
        }
        Err(e) => return Err(e.into()),
    }
    if cmd.cancel_requested {
        write_frame(&mut send, &cancel_frame("cancelled".into())).await?;
    }
    let id = cmd.id.clone();
    let commands = &gw.commands;
    let mut running = cmd.state() == CommandState::Running;
    // Output received (and taken) up to here, acknowledged every
    // `OUTPUT_ACK_BYTES` so the daemon's window moves on.
    let mut have = match mode {
        Mode::Exec => [0, 0],
        Mode::Attach => [
            gw.store.output_len(&id, pb::OutputStream::Stdout as i32)?,
            gw.store.output_len(&id, pb::OutputStream::Stderr as i32)?,
        ],
    };
    let mut unacked = 0u64;
    let mut stdin_opened = false;
    // A terminal's resizes, from the stdin stream's call, once it opens.
    let mut resizes: Option<mpsc::Receiver<pb::Resize>> = None;
    let mut tail_timer = tokio::time::interval(crate::commands::streams::TAIL_WRITE);
    tail_timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Frames are read by a task of their own: reading one is not
    // cancel-safe (a cancel or the tail's timer in the middle of one would
    // lose its bytes and the stream's framing with them).
    let mut frames = frame_reader(recv);
    loop {
        let frame = tokio::select! {
            f = frames.recv() => match f {
                Some(f) => f?,
                None => None,
            },
            Some(reason) = cancel_rx.recv() => {
                write_frame(&mut send, &cancel_frame(reason)).await?;
                continue;
            }
            _ = tail_timer.tick() => {
                commands.write_tail(&id, keeper, false)?;
                continue;
            }
            Some(r) = next_resize(&mut resizes) => {
                let frame = ToDaemon { msg: Some(to_daemon::Msg::Resize(r)) };
                write_frame(&mut send, &frame).await?;
                continue;
            }
        };
        let Some(frame) = frame else {
            anyhow::bail!("daemon closed the stream before the exit record");
        };
        match frame.msg {
            Some(to_server::Msg::Started(s)) => {
                commands.started(&id, s.pid, s.started_at_ms)?;
                running = true;
                if cmd.stdin_stream && !stdin_opened && mode == Mode::Exec {
                    stdin_opened = true;
                    resizes = Some(open_stdin(gw, live, &id));
                }
            }
            Some(to_server::Msg::Output(o)) => {
                if o.data.len() > limits::MAX_OUTPUT_CHUNK_BYTES {
                    anyhow::bail!("output chunk over the limit");
                }
                let len = o.data.len() as u64;
                let i = usize::from(o.stream == pb::OutputStream::Stderr as i32);
                // Output only moves forward (a re-attach may skip what the
                // daemon forgot, never go back): so what the store keeps
                // stays bounded whatever a daemon sends.
                let Some(end) = o.offset.checked_add(len) else {
                    anyhow::bail!("output offset out of range");
                };
                if o.offset < have[i] {
                    anyhow::bail!(
                        "output at offset {} after {} was already received",
                        o.offset,
                        have[i]
                    );
                }
                // May wait for the attached client; a cancel meanwhile
                // still goes out.
                let took = commands.output(&id, &o, &mut running, keeper);
                tokio::pin!(took);
                loop {
                    tokio::select! {
                        r = &mut took => { r?; break; }
                        Some(reason) = cancel_rx.recv() => {
                            write_frame(&mut send, &cancel_frame(reason)).await?;
                        }
                    }
                }
                have[i] = end;
                unacked += len;
                if unacked >= limits::OUTPUT_ACK_BYTES {
                    unacked = 0;
                    // What the daemon forgets is durable here first.
                    gw.store.flush_async().await?;
                    let ack = ToDaemon {
                        msg: Some(to_daemon::Msg::OutputAck(pb::OutputAck {
                            stdout_offset: have[0],
                            stderr_offset: have[1],
                        })),
                    };
                    write_frame(&mut send, &ack).await?;
                }
            }
            Some(to_server::Msg::Exit(x)) => {
                commands.write_tail(&id, keeper, true)?;
                // Durable before the daemon may forget the result.
                commands.exited(&id, &x, Some(live)).await?;
                let ack = ToDaemon {
                    msg: Some(to_daemon::Msg::Ack(pb::ResultAck {})),
                };
                write_frame(&mut send, &ack).await?;
                let _ = send.finish();
                return Ok(());
            }
            Some(to_server::Msg::Approval(a)) => commands.awaiting_approval(&id, &a.rule)?,
            Some(to_server::Msg::Error(e)) if e.code == "paused" => {
                live.set_paused(true);
                commands.requeue(&id).await?;
                return Ok(());
            }
            Some(to_server::Msg::Error(e)) => {
                commands.refused(&id, &e.code, &e.message).await?;
                return Ok(());
            }
            _ => anyhow::bail!("unexpected frame on a command stream"),
        }
    }
}

/// Frames read from a command stream, decoded, in order; the reader
/// stops at the end, at an error (passed on), or when the channel is
/// dropped. Two frames buffered: it reads no further ahead than that.
fn frame_reader(
    mut recv: quinn::RecvStream,
) -> mpsc::Receiver<Result<Option<ToServer>, WireError>> {
    let (tx, rx) = mpsc::channel(2);
    tokio::spawn(async move {
        loop {
            let f = read_frame::<ToServer>(&mut recv).await;
            let last = !matches!(f, Ok(Some(_)));
            if tx.send(f).await.is_err() || last {
                return;
            }
        }
    });
    rx
}

fn cancel_frame(reason: String) -> ToDaemon {
    ToDaemon {
        msg: Some(to_daemon::Msg::Cancel(pb::Cancel { reason })),
    }
}

/// How long opening a stdin stream may wait for the daemon to grant it.
const STDIN_OPEN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Why the server resets a stdin stream: the client's went before its
/// end, or is not here (QUIC application code).
const STDIN_CUT: quinn::VarInt = quinn::VarInt::from_u32(1);

/// Resizes buffered between the `Exec` call and the command's stream.
const RESIZE_BUFFER: usize = 8;

async fn next_resize(r: &mut Option<mpsc::Receiver<pb::Resize>>) -> Option<pb::Resize> {
    match r {
        Some(rx) => match rx.recv().await {
            Some(x) => Some(x),
            None => {
                *r = None;
                std::future::pending().await
            }
        },
        None => std::future::pending().await,
    }
}

/// Opens command `id`'s stdin stream, now that it started, and feeds it
/// from the `Exec` call that streams it in, at the pace the process reads;
/// the call's terminal resizes come out of the receiver returned.
fn open_stdin(gw: &Gateway, live: &LiveMachine, id: &str) -> mpsc::Receiver<pb::Resize> {
    let source = gw.commands.take_stdin(id);
    let conn = live.conn.clone();
    let id = id.to_string();
    let (tx, rx) = mpsc::channel(RESIZE_BUFFER);
    tokio::spawn(async move {
        if let Err(e) = feed_stdin(conn, &id, source, tx).await {
            tracing::debug!(cmd = %id, "stdin stream ended: {e:#}");
        }
    });
    rx
}

async fn feed_stdin(
    conn: quinn::Connection,
    id: &str,
    source: Option<crate::commands::StdinSource>,
    resizes: mpsc::Sender<pb::Resize>,
) -> anyhow::Result<()> {
    // A daemon too old to take stdin streams never grants one.
    let mut send = tokio::time::timeout(STDIN_OPEN_TIMEOUT, conn.open_uni())
        .await
        .map_err(|_| anyhow::anyhow!("the daemon takes no stdin stream (too old?)"))??;
    let header = ToDaemon {
        msg: Some(to_daemon::Msg::Stdin(pb::StdinHeader {
            command_id: id.to_string(),
        })),
    };
    write_frame(&mut send, &header).await?;
    tracing::debug!(cmd = %id, here = source.is_some(), "stdin stream opened");
    // The call streaming it is not here (it went to another replica, or
    // this server restarted since): the command's stdin is cut.
    let Some(mut source) = source else {
        let _ = send.reset(STDIN_CUT);
        return Ok(());
    };
    let mut open = true;
    loop {
        match source.message().await {
            Ok(Some(m)) => {
                if let Some(r) = m.resize {
                    // Only the latest size matters: a full buffer drops one.
                    let _ = resizes.try_send(r);
                }
                if open && !m.stdin.is_empty() && send.write_all(&m.stdin).await.is_err() {
                    // The process wants no more: the rest is read and
                    // dropped, so the client's call ends normally.
                    open = false;
                }
            }
            Ok(None) => {
                if open {
                    send.finish()?;
                }
                return Ok(());
            }
            Err(e) => {
                let _ = send.reset(STDIN_CUT);
                anyhow::bail!("the client's stdin ended early: {e}");
            }
        }
    }
}
