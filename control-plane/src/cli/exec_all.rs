//! `byom exec --all --label k=v -- CMD`: the same command on every online
//! machine with those labels at once, each line prefixed with the
//! machine's name, the exit code the worst of theirs (as Teleport's `tsh
//! ssh user@label=value`).

use std::io::Write;

use anyhow::bail;
use byom_api::{Client, Seen, WatchOptions};
use byom_protocol::pb;

use super::exec_notes::{exit_status, warn_before};

/// Most machines one `--all` runs on.
const MAX_FAN_OUT: usize = 256;

/// Writes complete lines with a prefix; keeps a partial line until its end.
struct Prefixed {
    prefix: String,
    partial: [Vec<u8>; 2],
}

impl Prefixed {
    fn push(&mut self, err: bool, data: &[u8]) {
        let buf = &mut self.partial[usize::from(err)];
        buf.extend_from_slice(data);
        while let Some(i) = buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buf.drain(..=i).collect();
            emit(err, &self.prefix, &line);
        }
    }

    fn finish(&mut self) {
        for err in [false, true] {
            let mut rest = std::mem::take(&mut self.partial[usize::from(err)]);
            if !rest.is_empty() {
                rest.push(b'\n');
                emit(err, &self.prefix, &rest);
            }
        }
    }
}

fn emit(err: bool, prefix: &str, line: &[u8]) {
    // One write per line under the lock, so machines' lines never mix.
    let mut out: Box<dyn Write> = if err {
        Box::new(std::io::stderr().lock())
    } else {
        Box::new(std::io::stdout().lock())
    };
    let mut buf = prefix.as_bytes().to_vec();
    buf.extend_from_slice(line);
    let _ = out.write_all(&buf).and_then(|_| out.flush());
}

pub async fn run(
    c: &mut Client,
    labels: &[(String, String)],
    env: &[(String, String)],
    req: pb::CreateCommandRequest,
) -> anyhow::Result<i32> {
    let machines = c
        .list_machines(pb::ListMachinesRequest {
            include_revoked: false,
        })
        .await?
        .into_inner()
        .machines;
    let matching: Vec<pb::Machine> = machines
        .into_iter()
        .filter(|m| m.has_labels(labels.iter().map(|(k, v)| (k, v))))
        .collect();
    let wanted: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    for m in matching.iter().filter(|m| !m.online || m.paused) {
        eprintln!(
            "byom: skipping {} ({})",
            m.name,
            if m.paused {
                "paused by its owner"
            } else {
                "offline"
            }
        );
    }
    let online: Vec<pb::Machine> = matching
        .into_iter()
        .filter(|m| m.online && !m.paused)
        .take(MAX_FAN_OUT)
        .collect();
    if online.is_empty() {
        bail!(
            "no online machine has {}: see `byom machines ls`",
            wanted.join(",")
        );
    }
    let width = online.iter().map(|m| m.name.len()).max().unwrap_or(0);
    let mut tasks = Vec::new();
    for m in online {
        let mut c = c.clone();
        let mut req = req.clone();
        req.machine = m.id.clone();
        req.labels.clear();
        // One key per machine, derived from the invocation's, so a retry
        // of this call creates each machine's command once.
        req.idempotency_key = format!("{}-{}", req.idempotency_key, m.id);
        let env = env.to_vec();
        tasks.push(tokio::spawn(async move {
            let cmd = byom_api::until_answered(|| {
                let (mut c, req) = (c.clone(), req.clone());
                async move { c.create_command(req).await }
            })
            .await
            .map_err(|s| format!("{}: {}", m.name, s.message()))?
            .into_inner()
            .command
            .ok_or_else(|| format!("{}: the server returned no command", m.name))?;
            warn_before(&m, &cmd, &env);
            let mut out = Prefixed {
                prefix: format!("{:<width$} | ", m.name),
                partial: [Vec::new(), Vec::new()],
            };
            let opts = WatchOptions {
                idle: None,
                reconnects: 120,
            };
            let end = byom_api::watch_to_end(&mut c, &cmd.id, opts, |seen| {
                if let Seen::Output(o) = seen {
                    out.push(o.stream == pb::OutputStream::Stderr as i32, &o.data);
                }
            })
            .await
            .map_err(|e| format!("{}: {e}", m.name))?;
            out.finish();
            match end {
                Some(s) => {
                    if s.state() != pb::CommandState::Exited || exit_status(&s) != 0 {
                        eprintln!(
                            "byom: {} on {}: {} (exit {})",
                            s.id,
                            m.name,
                            s.state().name(),
                            exit_status(&s)
                        );
                    }
                    Ok::<i32, String>(exit_status(&s))
                }
                None => Err(format!(
                    "{}: lost the server while waiting for {}",
                    m.name, cmd.id
                )),
            }
        }));
    }
    let mut worst = 0;
    for t in tasks {
        match t.await {
            Ok(Ok(code)) => worst = worst.max(code),
            Ok(Err(e)) => {
                eprintln!("byom: {e}");
                worst = worst.max(255);
            }
            Err(e) => {
                eprintln!("byom: {e}");
                worst = worst.max(255);
            }
        }
    }
    Ok(worst)
}
