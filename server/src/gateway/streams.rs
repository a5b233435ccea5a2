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
    mut cancel_rx: mpsc::Receiver<String>,
) -> anyhow::Result<()> {
    let (mut send, mut recv) = live.conn.open_bi().await?;
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
        let cancel = ToDaemon {
            msg: Some(to_daemon::Msg::Cancel(pb::Cancel {
                reason: "cancelled".into(),
            })),
        };
        write_frame(&mut send, &cancel).await?;
    }
    let id = cmd.id.clone();
    let commands = &gw.commands;
    let mut stored_bytes = cmd.stdout_bytes + cmd.stderr_bytes;
    let mut running = cmd.state() == CommandState::Running;
    loop {
        let frame = tokio::select! {
            f = read_frame::<ToServer>(&mut recv) => f?,
            Some(reason) = cancel_rx.recv() => {
                let cancel = ToDaemon { msg: Some(to_daemon::Msg::Cancel(pb::Cancel { reason })) };
                write_frame(&mut send, &cancel).await?;
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
            }
            Some(to_server::Msg::Output(o)) => {
                if o.data.len() > limits::MAX_OUTPUT_CHUNK_BYTES {
                    anyhow::bail!("output chunk over the limit");
                }
                stored_bytes += o.data.len() as u64;
                if stored_bytes
                    > limits::MAX_COMMAND_OUTPUT_BYTES + limits::MAX_OUTPUT_CHUNK_BYTES as u64
                {
                    anyhow::bail!("daemon sent more output than the per-command limit");
                }
                commands.output(&id, &o, &mut running)?;
            }
            Some(to_server::Msg::Exit(x)) => {
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
