//! Following a command to its end: its output and state changes, in order,
//! resuming from the offsets already seen when the server restarts under
//! the watch (`WatchCommand` replays the store from any offset). A command
//! can also be created and followed in one call ([`run_command`]).

use std::time::Duration;

use byom_protocol::pb::{self, command_event::Event};

use crate::Client;

/// Pause between reconnect attempts while the server restarts.
const RECONNECT_PAUSE: Duration = Duration::from_millis(500);

/// What the watch saw, as it arrives.
#[derive(Debug, Clone, Copy)]
pub enum Seen<'a> {
    Output(&'a pb::Output),
    /// The command's record changed (the last one is terminal).
    State(&'a pb::Command),
}

#[derive(Debug, Clone, Default)]
pub struct WatchOptions {
    /// Stop when nothing arrives for this long (for a running command's
    /// output so far).
    pub idle: Option<Duration>,
    /// Reconnects allowed while the server is away (0: none).
    pub reconnects: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    #[error(transparent)]
    Status(#[from] tonic::Status),
    #[error("lost the server while waiting for {id}; see `byom commands show {id}`")]
    Lost { id: String },
}

/// Whether a stream error means the server went away (worth a reconnect).
fn server_gone(s: &tonic::Status) -> bool {
    matches!(
        s.code(),
        tonic::Code::Unavailable
            | tonic::Code::Unknown
            | tonic::Code::Internal
            | tonic::Code::Cancelled
    )
}

/// Follows command `id` until it ends, handing every output chunk and
/// state change to `on`. Returns the terminal record, or `None` if the
/// watch went idle first (see [`WatchOptions::idle`]) or the server went
/// away with no reconnects allowed.
pub async fn watch_to_end(
    client: &mut Client,
    id: &str,
    opts: WatchOptions,
    on: impl FnMut(Seen<'_>),
) -> Result<Option<pb::Command>, WatchError> {
    follow(client, id, None, opts, on).await
}

/// A command created by [`run_command`], with its watch under way.
pub struct Run {
    /// The command as created.
    pub command: pb::Command,
    stream: tonic::Streaming<pb::CommandEvent>,
}

/// Creates a command and starts following it, in one call (`RunCommand`):
/// a round trip fewer than `CreateCommand` and then `WatchCommand`. With
/// an idempotency key in `req`, a call the server did not answer is sent
/// again (see [`crate::until_answered`]) and follows the command the first
/// one created; without one it is sent once.
pub async fn run_command(
    client: &Client,
    req: pb::CreateCommandRequest,
) -> Result<Run, tonic::Status> {
    let once = req.idempotency_key.is_empty();
    let call = || {
        let (mut c, req) = (client.clone(), req.clone());
        async move {
            let stream = match c.run_command(req.clone()).await {
                Ok(s) => s.into_inner(),
                // A server from before RunCommand: the same in two calls.
                Err(e) if e.code() == tonic::Code::Unimplemented => {
                    let command = c
                        .create_command(req)
                        .await?
                        .into_inner()
                        .command
                        .ok_or_else(|| tonic::Status::internal("no command created"))?;
                    let stream = c
                        .watch_command(pb::WatchCommandRequest {
                            id: command.id.clone(),
                            stdout_offset: 0,
                            stderr_offset: 0,
                        })
                        .await?
                        .into_inner();
                    return Ok(Run { command, stream });
                }
                Err(e) => return Err(e),
            };
            Run::started(stream).await
        }
    };
    if once {
        call().await
    } else {
        crate::until_answered(call).await
    }
}

/// Creates a command whose stdin, of any length, comes from `stdin` (its
/// end is stdin's end) and starts following it (`Exec`): the command
/// reads at its own pace, and the output comes whole, as fast as the
/// caller reads it. Sent once: a stream cannot be replayed, so a call the
/// server did not answer is an error (with `req`'s idempotency key, a
/// retry by hand finds the command the first call created).
pub async fn exec(
    client: &Client,
    req: pb::CreateCommandRequest,
    stdin: tokio::sync::mpsc::Receiver<Vec<u8>>,
) -> Result<Run, tonic::Status> {
    use tokio_stream::StreamExt;
    let rest = tokio_stream::wrappers::ReceiverStream::new(stdin).map(|b| pb::ExecInput {
        stdin: b,
        ..Default::default()
    });
    exec_stream(client, req, rest).await
}

/// [`exec`] with what follows the creation as `ExecInput`s: stdin, and a
/// terminal's resizes (with `req.tty`).
pub async fn exec_stream(
    client: &Client,
    req: pb::CreateCommandRequest,
    rest: impl tokio_stream::Stream<Item = pb::ExecInput> + Send + 'static,
) -> Result<Run, tonic::Status> {
    use tokio_stream::StreamExt;
    let first = pb::ExecInput {
        create: Some(req),
        ..Default::default()
    };
    let mut c = client.clone();
    let stream = c
        .exec(tokio_stream::once(first).chain(rest))
        .await?
        .into_inner();
    Run::started(stream).await
}

impl Run {
    /// A run whose first event, the created command, is read from
    /// `stream`.
    async fn started(mut stream: tonic::Streaming<pb::CommandEvent>) -> Result<Run, tonic::Status> {
        match stream.message().await? {
            Some(pb::CommandEvent {
                event: Some(Event::State(command)),
            }) => Ok(Run { command, stream }),
            _ => Err(tonic::Status::unavailable(
                "the server ended the run before naming the command",
            )),
        }
    }

    /// Follows the command to its end as [`watch_to_end`] does; `on` sees
    /// the record as created first.
    pub async fn to_end(
        self,
        client: &mut Client,
        opts: WatchOptions,
        mut on: impl FnMut(Seen<'_>),
    ) -> Result<Option<pb::Command>, WatchError> {
        on(Seen::State(&self.command));
        if self.command.state().is_terminal() {
            return Ok(Some(self.command));
        }
        follow(client, &self.command.id, Some(self.stream), opts, on).await
    }
}

/// Follows `id` on `first` (if given), then on watches of its own.
async fn follow(
    client: &mut Client,
    id: &str,
    mut first: Option<tonic::Streaming<pb::CommandEvent>>,
    opts: WatchOptions,
    mut on: impl FnMut(Seen<'_>),
) -> Result<Option<pb::Command>, WatchError> {
    let mut offsets = [0u64, 0u64];
    let mut reconnects = 0u32;
    loop {
        let mut stream = match first.take() {
            Some(s) => s,
            None => {
                let started = client
                    .watch_command(pb::WatchCommandRequest {
                        id: id.to_string(),
                        stdout_offset: offsets[0],
                        stderr_offset: offsets[1],
                    })
                    .await;
                match started {
                    Ok(s) => s.into_inner(),
                    Err(e)
                        if e.code() == tonic::Code::Unavailable && reconnects < opts.reconnects =>
                    {
                        reconnects += 1;
                        tokio::time::sleep(RECONNECT_PAUSE).await;
                        continue;
                    }
                    Err(e) => return Err(e.into()),
                }
            }
        };
        // The server went away mid-stream (an end without a terminal state
        // or a transport error): resume from our offsets.
        loop {
            let next = match opts.idle {
                Some(d) => match tokio::time::timeout(d, stream.message()).await {
                    Ok(m) => m,
                    Err(_) => return Ok(None),
                },
                None => stream.message().await,
            };
            match next {
                Ok(Some(ev)) => match ev.event {
                    Some(Event::Output(o)) => {
                        let i = usize::from(o.stream == pb::OutputStream::Stderr as i32);
                        offsets[i] = o.offset + o.data.len() as u64;
                        on(Seen::Output(&o));
                    }
                    Some(Event::State(c)) => {
                        on(Seen::State(&c));
                        if c.state().is_terminal() {
                            return Ok(Some(c));
                        }
                    }
                    None => {}
                },
                Ok(None) => break,
                Err(e) if server_gone(&e) => break,
                Err(e) => return Err(e.into()),
            }
        }
        if opts.reconnects == 0 {
            return Ok(None);
        }
        reconnects += 1;
        if reconnects > opts.reconnects {
            return Err(WatchError::Lost { id: id.to_string() });
        }
        tokio::time::sleep(RECONNECT_PAUSE).await;
    }
}
