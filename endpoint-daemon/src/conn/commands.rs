//! Running what the server sends: each command arrives on a stream of its
//! own (Exec to start it, Attach to pick it up again after a reconnect), and
//! that stream carries the command's approval wait, start, output and exit
//! until the server acknowledges the exit. Apart from the connection's life
//! in [`super`] (hello, heartbeat, reconnection), which only hands it the
//! streams.

use std::sync::Arc;
use std::time::Duration;

use byom_protocol::limits;
use byom_protocol::pb::{self, to_daemon, to_server, ToDaemon, ToServer};
use byom_wire::{read_frame, write_frame};
use tokio::sync::mpsc;

use super::CONNECT_TIMEOUT;
use crate::exec::{Admission, Entry, Runner};

/// How long the daemon waits for the server to acknowledge an exit before
/// keeping the result for the next connection.
const ACK_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a command's start goes unreported: one that ends sooner says
/// when it started in its exit record (a frame, a store write and a wake
/// of its watchers fewer for the many short commands); a longer one shows
/// `running` this much later.
const START_REPORT_DELAY: Duration = Duration::from_millis(20);

pub(super) async fn accept_streams(conn: &quinn::Connection, runner: &Arc<Runner>) -> String {
    loop {
        let runner = runner.clone();
        tokio::select! {
            s = conn.accept_bi() => {
                let (send, recv) = match s {
                    Ok(s) => s,
                    Err(e) => return format!("connection lost: {e}"),
                };
                tokio::spawn(async move {
                    if let Err(e) = handle_stream(send, recv, runner).await {
                        tracing::debug!("command stream ended: {e:#}");
                    }
                });
            }
            s = conn.accept_uni() => {
                let recv = match s {
                    Ok(s) => s,
                    Err(e) => return format!("connection lost: {e}"),
                };
                tokio::spawn(async move {
                    if let Err(e) = feed_stdin(recv, runner).await {
                        tracing::debug!("stdin stream ended: {e:#}");
                    }
                });
            }
        }
    }
}

/// A command's stdin stream (`ExecRequest.stdin_stream`): its header
/// names the command, the rest goes to the process's stdin as the process
/// reads it (a process that does not read holds the stream back, never
/// memory). The stream's end is stdin's end; a reset or a lost connection
/// first cuts it, and the exit record says so. A process that closes its
/// stdin stops the stream.
async fn feed_stdin(mut recv: quinn::RecvStream, runner: Arc<Runner>) -> anyhow::Result<()> {
    use tokio::io::AsyncWriteExt;
    let first: Option<ToDaemon> =
        tokio::time::timeout(CONNECT_TIMEOUT, read_frame(&mut recv)).await??;
    let Some(to_daemon::Msg::Stdin(h)) = first.and_then(|f| f.msg) else {
        let _ = recv.stop(STDIN_REFUSED);
        anyhow::bail!("a unidirectional stream that is not a command's stdin");
    };
    tracing::debug!(cmd = %h.command_id, "stdin stream");
    let Some(entry) = runner.get(&h.command_id) else {
        let _ = recv.stop(STDIN_REFUSED);
        anyhow::bail!(
            "stdin for {}, which this daemon does not hold",
            h.command_id
        );
    };
    let Some(mut stdin) = entry.take_stdin() else {
        let _ = recv.stop(STDIN_REFUSED);
        anyhow::bail!("{} takes no stdin stream (or has one already)", entry.id);
    };
    loop {
        match recv.read_chunk(limits::MAX_OUTPUT_CHUNK_BYTES, true).await {
            Ok(Some(c)) => {
                // Flushed: a terminal's writer buffers, and a keystroke
                // must not wait for the next.
                let wrote = async {
                    stdin.write_all(&c.bytes).await?;
                    stdin.flush().await
                };
                if wrote.await.is_err() {
                    // The process closed its stdin (or ended): it wants
                    // no more, which is not a cut.
                    let _ = recv.stop(STDIN_REFUSED);
                    return Ok(());
                }
            }
            Ok(None) => {
                let _ = stdin.shutdown().await;
                return Ok(());
            }
            Err(e) => {
                entry.mark_stdin_cut();
                anyhow::bail!("{}'s stdin was cut: {e}", entry.id);
            }
        }
    }
}

/// Why the daemon stops reading a stdin stream (QUIC application code).
const STDIN_REFUSED: quinn::VarInt = quinn::VarInt::from_u32(0);

fn error(code: &str, message: impl Into<String>) -> ToServer {
    ToServer {
        msg: Some(to_server::Msg::Error(pb::ErrorReply {
            code: code.into(),
            message: message.into(),
        })),
    }
}

async fn handle_stream(
    mut send: quinn::SendStream,
    mut recv: quinn::RecvStream,
    runner: Arc<Runner>,
) -> anyhow::Result<()> {
    let first: Option<ToDaemon> =
        tokio::time::timeout(CONNECT_TIMEOUT, read_frame(&mut recv)).await??;
    let (entry, offsets) = match first.and_then(|f| f.msg) {
        Some(to_daemon::Msg::Exec(req)) => {
            tracing::info!(cmd = %req.command_id, "exec");
            match runner.admit(req) {
                Admission::Started(e) | Admission::Existing(e) => (e, [0, 0]),
                Admission::AlreadyRan => {
                    write_frame(
                        &mut send,
                        &error(
                            "already_ran",
                            "this daemon process already ran this command",
                        ),
                    )
                    .await?;
                    send.finish()?;
                    return Ok(());
                }
                Admission::Refused(code, msg) => {
                    write_frame(&mut send, &error(code, msg)).await?;
                    send.finish()?;
                    return Ok(());
                }
            }
        }
        Some(to_daemon::Msg::Attach(a)) => match runner.get(&a.command_id) {
            Some(e) => (e, [a.stdout_offset, a.stderr_offset]),
            None => {
                write_frame(
                    &mut send,
                    &error(
                        "unknown_command",
                        "this daemon process does not hold this command",
                    ),
                )
                .await?;
                send.finish()?;
                return Ok(());
            }
        },
        _ => {
            write_frame(&mut send, &error("bad_request", "expected Exec or Attach")).await?;
            send.finish()?;
            return Ok(());
        }
    };
    let r = serve_entry(send, recv, &entry, offsets, &runner).await;
    // The connection went before the command ended: a stdin stream it
    // waits for cannot come on this connection, so its stdin is cut
    // rather than left waiting forever.
    if !entry.is_finished() {
        entry.cut_stdin();
    }
    r
}

/// Streams a command's state and output from `offsets` until the server
/// acknowledges its exit. Output is sent from the in-memory buffer, so a
/// re-attach after a reconnect resumes exactly where the server's store is.
async fn serve_entry(
    mut send: quinn::SendStream,
    mut recv: quinn::RecvStream,
    entry: &Arc<Entry>,
    mut offsets: [u64; 2],
    runner: &Arc<Runner>,
) -> anyhow::Result<()> {
    let (ack_tx, mut ack_rx) = mpsc::channel::<()>(1);
    let reader_entry = entry.clone();
    let reader = tokio::spawn(async move {
        while let Ok(Some(f)) = read_frame::<ToDaemon>(&mut recv).await {
            match f.msg {
                Some(to_daemon::Msg::Cancel(c)) => {
                    tracing::info!(cmd = %reader_entry.id, "cancel: {}", c.reason);
                    reader_entry.cancel(if c.reason.is_empty() {
                        "cancelled"
                    } else {
                        &c.reason
                    });
                }
                Some(to_daemon::Msg::Ack(_)) => {
                    let _ = ack_tx.send(()).await;
                    return;
                }
                Some(to_daemon::Msg::OutputAck(a)) => {
                    reader_entry.ack([a.stdout_offset, a.stderr_offset]);
                }
                Some(to_daemon::Msg::Resize(r)) => reader_entry.resize(r.rows, r.cols),
                _ => {}
            }
        }
    });
    let _abort = AbortOnDrop(reader);
    let mut changed = entry.subscribe();
    let mut sent_started = false;
    let mut sent_approval = false;
    let mut report_start_at: Option<tokio::time::Instant> = None;
    loop {
        // Read exit before output: output is complete once exit is set.
        let exit = entry.exit();
        if !sent_approval && !sent_started {
            if let Some(rule) = entry.awaiting() {
                if entry.started().is_none() {
                    write_frame(
                        &mut send,
                        &ToServer {
                            msg: Some(to_server::Msg::Approval(pb::LocalApproval { rule })),
                        },
                    )
                    .await?;
                }
                sent_approval = true;
            }
        }
        if !sent_started {
            if let Some(s) = entry.started() {
                let output = [pb::OutputStream::Stdout, pb::OutputStream::Stderr]
                    .into_iter()
                    .enumerate()
                    .any(|(i, st)| entry.has_output(st, offsets[i]));
                // A stdin stream opens when the server hears of the start.
                let due = report_start_at.is_some_and(|t| tokio::time::Instant::now() >= t)
                    || entry.wants_stdin();
                if exit.is_some() && !sent_approval {
                    // Said by the exit record.
                    sent_started = true;
                } else if sent_approval || output || due {
                    // After an approval the server must hear it runs
                    // before anything else; output is reported started.
                    write_frame(
                        &mut send,
                        &ToServer {
                            msg: Some(to_server::Msg::Started(s)),
                        },
                    )
                    .await?;
                    sent_started = true;
                } else if report_start_at.is_none() {
                    report_start_at = Some(tokio::time::Instant::now() + START_REPORT_DELAY);
                }
            }
        }
        for (i, stream) in [pb::OutputStream::Stdout, pb::OutputStream::Stderr]
            .into_iter()
            .enumerate()
        {
            loop {
                let (at, data) =
                    entry.output_from(stream, offsets[i], limits::MAX_OUTPUT_CHUNK_BYTES);
                if data.is_empty() {
                    break;
                }
                let len = data.len() as u64;
                offsets[i] = at;
                let out = pb::Output {
                    stream: stream as i32,
                    offset: at,
                    data,
                };
                write_frame(
                    &mut send,
                    &ToServer {
                        msg: Some(to_server::Msg::Output(out)),
                    },
                )
                .await?;
                offsets[i] += len;
            }
        }
        if let Some(exit) = exit {
            write_frame(
                &mut send,
                &ToServer {
                    msg: Some(to_server::Msg::Exit(exit)),
                },
            )
            .await?;
            match tokio::time::timeout(ACK_TIMEOUT, ack_rx.recv()).await {
                Ok(Some(())) => {
                    runner.acknowledge(&entry.id);
                    let _ = send.finish();
                }
                _ => {
                    tracing::debug!(cmd = %entry.id, "no acknowledgement: holding the result for the next connection")
                }
            }
            return Ok(());
        }
        let start_due = report_start_at.filter(|_| !sent_started);
        tokio::select! {
            r = changed.changed() => if r.is_err() { return Ok(()); },
            // The connection went away: the result waits for the next one.
            _ = send.stopped() => return Ok(()),
            _ = tokio::time::sleep_until(start_due.unwrap_or_else(tokio::time::Instant::now)), if start_due.is_some() => {}
        }
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);
impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
