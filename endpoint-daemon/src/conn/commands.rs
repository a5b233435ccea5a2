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
        let (send, recv) = match conn.accept_bi().await {
            Ok(s) => s,
            Err(e) => return format!("connection lost: {e}"),
        };
        let runner = runner.clone();
        tokio::spawn(async move {
            if let Err(e) = handle_stream(send, recv, runner).await {
                tracing::debug!("command stream ended: {e:#}");
            }
        });
    }
}

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
    serve_entry(send, recv, &entry, offsets, &runner).await
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
                    .any(|(i, st)| !entry.output_from(st, offsets[i], 1).is_empty());
                let due = report_start_at.is_some_and(|t| tokio::time::Instant::now() >= t);
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
                let data = entry.output_from(stream, offsets[i], limits::MAX_OUTPUT_CHUNK_BYTES);
                if data.is_empty() {
                    break;
                }
                let len = data.len() as u64;
                let out = pb::Output {
                    stream: stream as i32,
                    offset: offsets[i],
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
