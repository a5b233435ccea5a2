//! Commands from the API: create (through the commands service, which
//! validates and picks the machine), read, list, cancel, and watch (the
//! stored output from any offset, then live changes, ending with the
//! terminal state).

use std::time::Duration;

use byom_protocol::id::CommandId;
use byom_protocol::limits;
use byom_protocol::pb::{self, CommandState};
use byom_store::MAX_LIST;
use tonic::Status;

use super::{command_err, fingerprint, store_err, Api, Stream};
use crate::commands::{NewCommand, Target};

/// Events buffered per WatchCommand stream before the server waits for the
/// client to read.
const WATCH_BUFFER: usize = 64;
/// Safety net for watchers in case a notification is missed.
const WATCH_POLL: Duration = Duration::from_secs(1);
/// Largest terminal side (rows or columns) a command may ask for.
pub(crate) const MAX_TTY_SIDE: u32 = 4096;
/// Commands listed when the request does not say.
const DEFAULT_LIST: usize = 100;

/// Whether the store may hold output of `c` past `offsets`. A command
/// not started has none (output is stored before the command is marked
/// running, and the change that marks it wakes the watch again); one that
/// exited has none past the byte counts of its daemon's exit record.
fn may_have_output(c: &pb::Command, offsets: [u64; 2]) -> bool {
    match c.state() {
        CommandState::Queued | CommandState::Dispatched => false,
        CommandState::Exited => offsets != [c.stdout_bytes, c.stderr_bytes],
        _ => true,
    }
}

impl Api {
    pub(crate) fn command(&self, id: &str) -> Result<pb::Command, Status> {
        self.store
            .get_command(id)
            .map_err(store_err)?
            .ok_or_else(|| Status::not_found(format!("no command {id}: see `byom commands ls`")))
    }

    pub(super) async fn create_command(
        &self,
        req: pb::CreateCommandRequest,
        by: String,
    ) -> Result<pb::CommandResponse, Status> {
        self.create(req, by, None).await
    }

    /// Creates a command (with the ID `id`, if given). `stdin_stream`:
    /// its stdin follows in an `Exec` call.
    async fn create(
        &self,
        mut req: pb::CreateCommandRequest,
        by: String,
        id: Option<String>,
    ) -> Result<pb::CommandResponse, Status> {
        let stdin_stream = std::mem::take(&mut req.stdin_stream);
        if stdin_stream && id.is_none() {
            return Err(Status::invalid_argument(
                "stdin_stream is for Exec, which streams it; CreateCommand and RunCommand carry stdin in the request",
            ));
        }
        let tty = std::mem::take(&mut req.tty).then_some((req.rows, req.cols));
        if tty.is_some() && !stdin_stream {
            return Err(Status::invalid_argument(
                "a terminal (tty) needs Exec, which carries its keystrokes and resizes",
            ));
        }
        if let Some((rows, cols)) = tty {
            if rows == 0 || cols == 0 || rows > MAX_TTY_SIDE || cols > MAX_TTY_SIDE {
                return Err(Status::invalid_argument(format!(
                    "terminal size {rows}x{cols}: each side 1 to {MAX_TTY_SIDE}"
                )));
            }
        }
        let key = std::mem::take(&mut req.idempotency_key);
        let (env, labels) = (
            std::mem::take(&mut req.env),
            std::mem::take(&mut req.labels),
        );
        let request = fingerprint(&req, &[&env, &labels]);
        let claim = match self.claim("command", &by, &key, &request).await? {
            Ok(p) => p,
            // A retry: the command the first call created.
            Err(r) => {
                return Ok(pb::CommandResponse {
                    command: Some(self.command(&r.object_id)?),
                })
            }
        };
        req.env = env;
        req.labels = labels;
        let target =
            match (req.machine.is_empty(), req.labels.is_empty()) {
                (false, true) => Target::Machine(req.machine),
                (true, false) => Target::Labels(req.labels.into_iter().collect()),
                _ => return Err(Status::invalid_argument(
                    "name a machine or give labels to pick one (byom exec --label k=v), not both",
                )),
            };
        let c = self
            .commands
            .create(
                NewCommand {
                    id,
                    target,
                    argv: req.argv,
                    shell: req.shell,
                    cwd: req.cwd,
                    env: req.env,
                    stdin: req.stdin,
                    stdin_stream,
                    tty,
                    timeout_ms: req.timeout_ms,
                    queue_ttl_ms: req.queue_ttl_ms,
                    requested_by: by,
                    taint: String::new(),
                    approved_by: String::new(),
                },
                Some(&claim),
            )
            .await
            .map_err(command_err)?;
        Ok(pb::CommandResponse { command: Some(c) })
    }

    pub(crate) fn list_commands(
        &self,
        req: pb::ListCommandsRequest,
    ) -> Result<pb::ListCommandsResponse, Status> {
        let machine = if req.machine.is_empty() {
            None
        } else {
            Some(self.machine(&req.machine)?.id)
        };
        let state = match req.state() {
            CommandState::Unspecified => None,
            s => Some(s),
        };
        let limit = if req.limit == 0 {
            DEFAULT_LIST
        } else {
            (req.limit as usize).min(MAX_LIST)
        };
        let mut commands = self
            .store
            .list_commands(machine.as_deref(), state, req.since_ms, limit)
            .map_err(store_err)?;
        for c in &mut commands {
            c.stdin.clear();
        }
        Ok(pb::ListCommandsResponse { commands })
    }

    pub(super) async fn cancel_command(
        &self,
        req: pb::CancelCommandRequest,
    ) -> Result<pb::CommandResponse, Status> {
        let reason = if req.reason.is_empty() {
            "cancelled by admin".to_string()
        } else {
            req.reason
        };
        let c = self
            .commands
            .cancel(&req.id, &reason)
            .await
            .map_err(command_err)?;
        Ok(pb::CommandResponse { command: Some(c) })
    }

    pub(crate) fn watch_command(
        &self,
        req: pb::WatchCommandRequest,
    ) -> Result<Stream<pb::CommandEvent>, Status> {
        // Subscribed before the read, so no change after it is missed.
        let wake = self.commands.subscribe(&req.id);
        match self.command(&req.id) {
            Ok(c) => Ok(self.watch_from(c, wake, [req.stdout_offset, req.stderr_offset], None)),
            Err(e) => {
                drop(wake);
                self.commands.unsubscribed(&req.id);
                Err(e)
            }
        }
    }

    /// Creates a command and watches it (`RunCommand`). The ID is chosen
    /// here so the watch is subscribed before the command exists: it then
    /// starts from the created record without reading it back. The caller
    /// is the command's attached client: it gets every output byte (not
    /// only what the store keeps), at the pace it reads.
    pub(super) async fn run_command(
        &self,
        req: pb::CreateCommandRequest,
        by: String,
    ) -> Result<Stream<pb::CommandEvent>, Status> {
        if req.stdin_stream {
            return Err(Status::invalid_argument(
                "stdin_stream is for Exec, which streams it; RunCommand carries stdin in the request",
            ));
        }
        self.run(req, by, None).await
    }

    /// `Exec`: as `RunCommand`, with stdin of any length streamed in
    /// after the first message (which creates the command).
    pub(super) async fn exec(
        &self,
        mut input: crate::commands::StdinSource,
        by: String,
    ) -> Result<Stream<pb::CommandEvent>, Status> {
        let first = input.message().await?.ok_or_else(|| {
            Status::invalid_argument("Exec needs a first message that creates the command")
        })?;
        let Some(mut req) = first.create else {
            return Err(Status::invalid_argument(
                "Exec's first message creates the command (ExecInput.create); stdin follows in later ones",
            ));
        };
        if !first.stdin.is_empty() {
            return Err(Status::invalid_argument(
                "Exec's first message creates the command; stdin follows in later ones",
            ));
        }
        req.stdin_stream = true;
        self.run(req, by, Some(input)).await
    }

    async fn run(
        &self,
        req: pb::CreateCommandRequest,
        by: String,
        stdin: Option<crate::commands::StdinSource>,
    ) -> Result<Stream<pb::CommandEvent>, Status> {
        let id = CommandId::new(byom_wire::now_ms()).to_string();
        let wake = self.commands.subscribe(&id);
        let feed = self.commands.attach_output(&id);
        if let Some(s) = stdin {
            self.commands.put_stdin(&id, s);
        }
        let created = self.create(req, by, Some(id.clone())).await;
        let c = match created {
            Ok(r) => r
                .command
                .ok_or_else(|| Status::internal("no command created")),
            Err(e) => Err(e),
        };
        match c {
            Ok(c) if c.id == id => Ok(self.watch_from(c, wake, [0, 0], Some(feed))),
            // A retry: the command the first call created.
            Ok(c) => {
                self.forget(&id, wake);
                self.watch_command(pb::WatchCommandRequest {
                    id: c.id,
                    stdout_offset: 0,
                    stderr_offset: 0,
                })
            }
            Err(e) => {
                self.forget(&id, wake);
                Err(e)
            }
        }
    }

    /// Drops what was set up for a command not created after all.
    fn forget(&self, id: &str, wake: tokio::sync::watch::Receiver<crate::commands::Wake>) {
        drop(wake);
        self.commands.unsubscribed(id);
        self.commands.detach_output(id);
        drop(self.commands.take_stdin(id));
    }

    /// Streams `c`'s output from `offsets` and its changes until it ends;
    /// `c` was read (or written) after `wake` was subscribed. `feed`: the
    /// attached client's every chunk (else what the store keeps).
    fn watch_from(
        &self,
        c: pb::Command,
        wake: tokio::sync::watch::Receiver<crate::commands::Wake>,
        offsets: [u64; 2],
        feed: Option<Feed>,
    ) -> Stream<pb::CommandEvent> {
        let (tx, rx) = tokio::sync::mpsc::channel(WATCH_BUFFER);
        let api = self.clone();
        tokio::spawn(async move {
            let id = c.id.clone();
            let attached = feed.is_some();
            api.follow(c, wake, offsets, feed, tx).await;
            // The subscription went with `follow`: forget it unless
            // someone else still watches.
            api.commands.unsubscribed(&id);
            if attached {
                api.commands.detach_output(&id);
                // A command that ended before it started (expired in the
                // queue, cancelled) never took its stdin stream.
                drop(api.commands.take_stdin(&id));
            }
        });
        Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))
    }

    /// The body of [`Api::watch_from`]: sends `c`'s events to `tx` until
    /// it ends, the client goes or the server stops.
    async fn follow(
        &self,
        c: pb::Command,
        mut wake: tokio::sync::watch::Receiver<crate::commands::Wake>,
        mut offsets: [u64; 2],
        mut feed: Option<Feed>,
        tx: tokio::sync::mpsc::Sender<Result<pb::CommandEvent, Status>>,
    ) {
        let mut last_state = None;
        let id = c.id.clone();
        let mut known = Some(c);
        loop {
            let cmd = match known.take() {
                Some(c) => c,
                None => match self.store.get_command(&id) {
                    Ok(Some(c)) => c,
                    _ => return,
                },
            };
            // The attached client's chunks first: everything published
            // before this read of the command is in the feed, and the
            // store (read next) keeps only some of it.
            if let Some(f) = feed.as_mut() {
                while let Ok(o) = f.try_recv() {
                    if !forward(&tx, &mut offsets, o).await {
                        return;
                    }
                }
            }
            // Output first, so a terminal state is the last event.
            let look = may_have_output(&cmd, offsets);
            for (i, stream) in [pb::OutputStream::Stdout, pb::OutputStream::Stderr]
                .into_iter()
                .enumerate()
                .filter(|_| look)
            {
                loop {
                    let chunks = match self.store.read_output(
                        &id,
                        stream as i32,
                        offsets[i],
                        limits::MAX_OUTPUT_CHUNK_BYTES * 4,
                    ) {
                        Ok(ch) => ch,
                        Err(e) => {
                            let _ = tx.send(Err(store_err(e))).await;
                            return;
                        }
                    };
                    if chunks.is_empty() {
                        break;
                    }
                    for (off, data) in chunks {
                        let mut at = off;
                        for piece in data.chunks(limits::MAX_OUTPUT_CHUNK_BYTES) {
                            let o = pb::Output {
                                stream: stream as i32,
                                offset: at,
                                data: piece.to_vec(),
                            };
                            at += piece.len() as u64;
                            if !forward(&tx, &mut offsets, o).await {
                                return;
                            }
                        }
                    }
                }
            }
            if last_state != Some((cmd.state, cmd.cancel_requested)) {
                last_state = Some((cmd.state, cmd.cancel_requested));
                let mut shown = cmd.clone();
                shown.stdin.clear();
                let ev = pb::CommandEvent {
                    event: Some(pb::command_event::Event::State(shown)),
                };
                if tx.send(Ok(ev)).await.is_err() {
                    return;
                }
            }
            if cmd.state().is_terminal() {
                return;
            }
            // Chunks from the feed go straight on; a change of the
            // command (or the store) reads it again.
            loop {
                tokio::select! {
                    o = next_chunk(&mut feed) => match o {
                        Some(o) => {
                            if !forward(&tx, &mut offsets, o).await {
                                return;
                            }
                        }
                        None => feed = None,
                    },
                    _ = wake.changed() => {
                        known = wake.borrow_and_update().ended.as_deref().cloned();
                        break;
                    }
                    _ = tokio::time::sleep(WATCH_POLL) => break,
                    _ = tx.closed() => return,
                    _ = self.shutdown.cancelled() => return,
                }
            }
        }
    }
}

/// An attached client's output feed (see [`crate::commands::streams`]).
type Feed = tokio::sync::mpsc::Receiver<pb::Output>;

async fn next_chunk(feed: &mut Option<Feed>) -> Option<pb::Output> {
    match feed {
        Some(f) => f.recv().await,
        None => std::future::pending().await,
    }
}

/// Sends the part of `o` past what the client has (feed and store may
/// both carry a chunk); false: the client is gone.
async fn forward(
    tx: &tokio::sync::mpsc::Sender<Result<pb::CommandEvent, Status>>,
    offsets: &mut [u64; 2],
    mut o: pb::Output,
) -> bool {
    let i = usize::from(o.stream == pb::OutputStream::Stderr as i32);
    let end = o.offset + o.data.len() as u64;
    if end <= offsets[i] {
        return true;
    }
    if o.offset < offsets[i] {
        o.data.drain(..(offsets[i] - o.offset) as usize);
        o.offset = offsets[i];
    }
    offsets[i] = end;
    let ev = pb::CommandEvent {
        event: Some(pb::command_event::Event::Output(o)),
    };
    tx.send(Ok(ev)).await.is_ok()
}
