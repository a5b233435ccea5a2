//! `byom chat`: talk to the agent on a chat thread from the terminal; its
//! replies on that thread appear as they are posted.

use std::io::Write;
use std::time::Duration;

use byom_api::Client;
use byom_protocol::pb;

#[derive(clap::Args, Debug)]
pub struct ChatArgs {
    /// The thread to talk on (the chat's own name for it).
    #[arg(long, default_value = "general")]
    pub thread: String,
    /// Who you are on the channel.
    #[arg(long, env = "USER", default_value = "me")]
    pub user: String,
    #[arg(long, default_value = "chat")]
    pub source: String,
    /// Send these messages instead of reading lines from stdin.
    #[arg(short, long = "message")]
    pub messages: Vec<String>,
    /// Messages to send, as with -m.
    #[arg(value_name = "MESSAGE")]
    pub positional: Vec<String>,
    /// After the last message, wait up to this long for the agent's answer:
    /// it returns as soon as the work the messages started has reported
    /// (or asked a question), or --replies replies were seen.
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
    pub wait: Duration,
    /// Stop once this many replies arrived (0: no limit).
    #[arg(long, default_value_t = 0)]
    pub replies: usize,
}

/// How often `byom chat` looks again at a thread that was answered but
/// whose work has not settled yet.
const SETTLE_POLL: std::time::Duration = std::time::Duration::from_millis(200);

/// Bot lines `byom chat` keeps while it does not yet know its thread's ID.
const CHAT_EARLY_REPLIES: usize = 256;

/// `byom chat`: you type as a user on a thread; the agent's replies on that
/// thread appear as they are posted.
pub async fn run(c: &mut Client, mut a: ChatArgs) -> anyhow::Result<i32> {
    a.messages.append(&mut a.positional);
    let mut tail = c
        .tail_triggers(pb::TailTriggersRequest {})
        .await?
        .into_inner();
    let (thread_tx, mut thread_rx) = tokio::sync::watch::channel(String::new());
    let max = a.replies;
    // Typing at a terminal, replies to later lines must still show: only
    // messages given up front end the wait once answered.
    let until_settled = max == 0 && !a.messages.is_empty();
    let mut probe = c.clone();
    let printer = tokio::spawn(async move {
        let mut seen = 0usize;
        // The thread's ID comes back with the first send, and a fast reply
        // can arrive before it: keep the bot's lines until we know it.
        let mut early: std::collections::VecDeque<pb::Trigger> = Default::default();
        let mut thread = String::new();
        let mut print = |t: &pb::Trigger| {
            println!(
                "byom: {}",
                super::output::safe(&t.text).replace('\n', "\n      ")
            );
            let _ = std::io::stdout().flush();
            seen += 1;
            max != 0 && seen >= max
        };
        // Answered but not settled yet (a worker's last turn can end just
        // after the reply it made): look again until it is.
        let mut answered = false;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(SETTLE_POLL), if answered => {
                    if settled(&mut probe, &thread).await {
                        return;
                    }
                }
                m = tail.message() => {
                    let Ok(Some(t)) = m else { return };
                    // byom's own (no principal): a webhook or an admin
                    // naming a sender "byom" is someone else.
                    if !(t.from_bot && t.user == "byom" && t.principal.is_empty()) {
                        continue;
                    }
                    if thread.is_empty() {
                        if early.len() >= CHAT_EARLY_REPLIES {
                            early.pop_front();
                        }
                        early.push_back(t);
                    } else if t.thread_id == thread {
                        if print(&t) || (until_settled && settled(&mut probe, &thread).await) {
                            return;
                        }
                        answered = until_settled;
                    }
                }
                r = thread_rx.changed(), if thread.is_empty() => {
                    if r.is_err() {
                        // The sender is gone without a thread: nothing to show.
                        return;
                    }
                    thread = thread_rx.borrow_and_update().clone();
                    let mut printed = false;
                    for t in early.drain(..) {
                        if t.thread_id == thread {
                            printed = true;
                            if print(&t) {
                                return;
                            }
                        }
                    }
                    if printed && until_settled {
                        if settled(&mut probe, &thread).await {
                            return;
                        }
                        answered = true;
                    }
                }
            }
        }
    });
    let interactive = a.messages.is_empty();
    if interactive {
        eprintln!(
            "chatting on {}/{} as {} (Ctrl-D to end)",
            a.source, a.thread, a.user
        );
    }
    // Each message once, even when the server restarts while it is sent.
    let send = |text: String| {
        let c = c.clone();
        let req = pb::SendEventRequest {
            source: a.source.clone(),
            thread: a.thread.clone(),
            user: a.user.clone(),
            text,
            mention: true,
            from_bot: false,
            idempotency_key: byom_api::new_key(),
            kind: "chat".into(),
            ..Default::default()
        };
        async move {
            byom_api::until_answered(|| {
                let (mut c, req) = (c.clone(), req.clone());
                async move { c.send_event(req).await }
            })
            .await
            .map(|r| {
                r.into_inner()
                    .trigger
                    .map(|t| t.thread_id)
                    .unwrap_or_default()
            })
        }
    };
    if interactive {
        // Lines from a blocking reader thread; the channel bounds how far it
        // reads ahead.
        let (line_tx, mut lines) = tokio::sync::mpsc::channel::<String>(16);
        std::thread::spawn(move || {
            for line in std::io::stdin().lines() {
                let Ok(l) = line else { return };
                if line_tx.blocking_send(l).is_err() {
                    return;
                }
            }
        });
        while let Some(line) = lines.recv().await {
            if line.trim().is_empty() {
                continue;
            }
            let th = send(line).await?;
            let _ = thread_tx.send(th);
        }
    } else {
        for m in a.messages.clone() {
            println!("{}: {m}", a.user);
            let th = send(m).await?;
            let _ = thread_tx.send(th);
        }
    }
    let _ = tokio::time::timeout(a.wait, printer).await;
    Ok(0)
}

/// The thread's work has answered: no worker on it is still running (each
/// is done, idle, failed, cancelled, or waiting on a person's answer).
async fn settled(c: &mut Client, thread: &str) -> bool {
    let Ok(v) = super::agent::thread(c, thread).await else {
        return false;
    };
    v["workers"].as_array().is_some_and(|ws| {
        ws.iter()
            .all(|w| !matches!(w["status"].as_str(), Some("running")))
    })
}
