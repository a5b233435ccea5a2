//! The admin gRPC API (an API boundary): tokens, machines, commands. Served
//! over TLS 1.3; only clients with an admin certificate from our CA get past
//! the handshake check in [`serve`].

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use byom_protocol::id::{CommandId, Kind, TokenId};
use byom_protocol::limits;
use byom_protocol::pb::{self, CommandState};
use byom_protocol::token::PairingToken;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::server::TlsStream;
use tonic::{Request, Response, Status};

use crate::gateway;
use crate::pki::{hex, now_ms, sha256, Role};
use crate::server::Shared;
use crate::store::{StoreError, MAX_LIST};

pub mod proto {
    #![allow(clippy::all)]
    include!(concat!(env!("OUT_DIR"), "/byom.admin.v1.rs"));
}
use proto::admin_server::{Admin, AdminServer};

/// TLS handshakes in progress on the API port at once.
const MAX_API_HANDSHAKES: usize = 256;
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Events buffered per WatchCommand stream before the server waits for the
/// client to read.
const WATCH_BUFFER: usize = 64;
/// Longest natural-language policy, and most of them.
const MAX_POLICY_BYTES: usize = 4096;
const MAX_POLICIES: usize = 256;
/// Safety net for watchers in case a notification is missed.
const WATCH_POLL: Duration = Duration::from_secs(1);

/// A TLS connection from an authenticated admin.
pub struct AdminConn {
    tls: TlsStream<TcpStream>,
    admin: String,
}

/// Name from the admin certificate of the caller, in request extensions.
#[derive(Clone, Debug)]
pub struct AdminIdentity(pub String);

impl tonic::transport::server::Connected for AdminConn {
    type ConnectInfo = AdminIdentity;
    fn connect_info(&self) -> AdminIdentity {
        AdminIdentity(self.admin.clone())
    }
}

fn caller<T>(req: &Request<T>) -> String {
    req.extensions()
        .get::<AdminIdentity>()
        .map(|a| format!("admin:{}", a.0))
        .unwrap_or_else(|| "admin".into())
}

impl AsyncRead for AdminConn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.tls).poll_read(cx, buf)
    }
}

impl AsyncWrite for AdminConn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.tls).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.tls).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.tls).poll_shutdown(cx)
    }
}

pub async fn serve(shared: Arc<Shared>, listener: TcpListener, tls: rustls::ServerConfig) {
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<AdminConn, std::io::Error>>(16);
    let limit = Arc::new(tokio::sync::Semaphore::new(MAX_API_HANDSHAKES));
    let accept_shutdown = shared.shutdown.clone();
    tokio::spawn(async move {
        loop {
            let (tcp, remote) = tokio::select! {
                _ = accept_shutdown.cancelled() => return,
                r = listener.accept() => match r {
                    Ok(x) => x,
                    Err(e) => { tracing::warn!("API accept failed: {e}"); tokio::time::sleep(Duration::from_millis(100)).await; continue; }
                },
            };
            let Ok(permit) = limit.clone().try_acquire_owned() else {
                continue;
            };
            let acceptor = acceptor.clone();
            let tx = tx.clone();
            tokio::spawn(async move {
                let _permit = permit;
                let _ = tcp.set_nodelay(true);
                let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await
                {
                    Ok(Ok(t)) => t,
                    Ok(Err(e)) => {
                        tracing::debug!(%remote, "API handshake failed: {e}");
                        return;
                    }
                    Err(_) => return,
                };
                let role = crate::tls::peer_role(tls.get_ref().1.peer_certificates());
                let Some((Role::Admin(admin), _)) = role else {
                    tracing::warn!(%remote, "API client without an admin certificate refused");
                    return;
                };
                let _ = tx.send(Ok(AdminConn { tls, admin })).await;
            });
        }
    });
    let svc = AdminServer::new(Api {
        shared: shared.clone(),
    })
    .max_decoding_message_size(limits::MAX_FRAME_BYTES)
    .max_encoding_message_size(limits::MAX_FRAME_BYTES * 4);
    let incoming = tokio_stream::wrappers::ReceiverStream::new(rx);
    let shutdown = shared.shutdown.clone();
    if let Err(e) = tonic::transport::Server::builder()
        .add_service(svc)
        .serve_with_incoming_shutdown(incoming, async move { shutdown.cancelled().await })
        .await
    {
        tracing::error!("API server failed: {e}");
    }
}

struct Api {
    shared: Arc<Shared>,
}

fn store_err(e: StoreError) -> Status {
    match e {
        StoreError::NotFound(x) => Status::not_found(format!("{x} not found")),
        StoreError::Conflict(x) => Status::already_exists(x),
        StoreError::IllegalTransition { .. } => Status::failed_precondition(e.to_string()),
        other => Status::internal(other.to_string()),
    }
}

fn valid_label(k: &str, v: &str) -> Result<(), Status> {
    let ok = |s: &str| {
        s.len() <= limits::MAX_NAME_LEN
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
    };
    if k.is_empty() || !ok(k) || !ok(v) {
        return Err(Status::invalid_argument(format!(
            "bad label {k}={v}: keys and values use letters, digits, '-', '_', '.', '/' (at most {} characters)",
            limits::MAX_NAME_LEN
        )));
    }
    Ok(())
}

fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}

impl Api {
    fn machine(&self, id_or_name: &str) -> Result<pb::Machine, Status> {
        let m = self
            .shared
            .store
            .resolve_machine(id_or_name)
            .map_err(store_err)?
            .ok_or_else(|| {
                Status::not_found(format!("no machine {id_or_name:?}: see `byom machines ls`"))
            })?;
        Ok(self.decorate(m))
    }

    /// Adds live facts (online, queue sizes) to a stored machine.
    fn decorate(&self, mut m: pb::Machine) -> pb::Machine {
        if let Some(live) = self.shared.live_machine(&m.id) {
            m.online = live.conn.close_reason().is_none();
            m.paused = live.paused.load(std::sync::atomic::Ordering::SeqCst);
            m.running_commands = live.active_count() as u32;
        }
        if let Ok(p) = self.shared.store.pending_commands(&m.id) {
            m.queued_commands = p
                .iter()
                .filter(|c| c.state() == CommandState::Queued)
                .count() as u32;
        }
        m
    }

    /// The least busy online machine with all these labels (running +
    /// queued commands, then name), skipping paused ones.
    fn pick_by_labels(
        &self,
        want: &std::collections::HashMap<String, String>,
    ) -> Result<pb::Machine, Status> {
        let all = self.shared.store.list_machines().map_err(store_err)?;
        let matching: Vec<pb::Machine> = all
            .into_iter()
            .filter(|m| !m.revoked && want.iter().all(|(k, v)| m.labels.get(k) == Some(v)))
            .map(|m| self.decorate(m))
            .collect();
        let selector = {
            let mut v: Vec<String> = want.iter().map(|(k, v)| format!("{k}={v}")).collect();
            v.sort();
            v.join(",")
        };
        let best = matching
            .iter()
            .filter(|m| m.online && !m.paused)
            .min_by_key(|m| (m.running_commands + m.queued_commands, m.name.clone()));
        match best {
            Some(m) => Ok(m.clone()),
            None if matching.is_empty() => Err(Status::not_found(format!(
                "no machine has the labels {selector}: see `byom machines ls`"
            ))),
            None => {
                let names: Vec<String> = matching
                    .iter()
                    .map(|m| {
                        format!(
                            "{} ({})",
                            m.name,
                            if m.paused { "paused" } else { "offline" }
                        )
                    })
                    .collect();
                Err(Status::unavailable(format!(
                    "no online machine has the labels {selector}; matching but unavailable: {}",
                    names.join(", ")
                )))
            }
        }
    }

    fn command(&self, id: &str) -> Result<pb::Command, Status> {
        self.shared
            .store
            .get_command(id)
            .map_err(store_err)?
            .ok_or_else(|| Status::not_found(format!("no command {id}: see `byom commands ls`")))
    }
}

type WatchStream =
    Pin<Box<dyn futures_util::Stream<Item = Result<pb::CommandEvent, Status>> + Send>>;

#[tonic::async_trait]
impl Admin for Api {
    async fn server_info(
        &self,
        _: Request<pb::ServerInfoRequest>,
    ) -> Result<Response<pb::ServerInfoResponse>, Status> {
        Ok(Response::new(pb::ServerInfoResponse {
            version: byom_protocol::VERSION.into(),
            quic_addr: self.shared.quic_addr.to_string(),
            public_addr: self.shared.public_addr.clone(),
            ca_sha256: hex(&self.shared.pki.ca_sha256),
        }))
    }

    async fn create_token(
        &self,
        req: Request<pb::CreateTokenRequest>,
    ) -> Result<Response<pb::CreateTokenResponse>, Status> {
        let req = req.into_inner();
        let ttl = if req.ttl_ms == 0 {
            ms(limits::DEFAULT_TOKEN_TTL)
        } else {
            req.ttl_ms
        };
        if ttl > ms(limits::MAX_TOKEN_TTL) {
            return Err(Status::invalid_argument(format!(
                "token TTL too long: at most {}",
                humantime::format_duration(limits::MAX_TOKEN_TTL)
            )));
        }
        if req.labels.len() > limits::MAX_LABELS {
            return Err(Status::invalid_argument(format!(
                "at most {} labels",
                limits::MAX_LABELS
            )));
        }
        for (k, v) in &req.labels {
            valid_label(k, v)?;
        }
        if !req.name.is_empty() && !gateway::valid_name(&req.name) {
            return Err(Status::invalid_argument(
                "bad name: use lower-case letters, digits, '-', '_' or '.'",
            ));
        }
        let replace_machine = if req.replace.is_empty() {
            String::new()
        } else {
            let m = self.machine(&req.replace)?;
            if m.revoked {
                return Err(Status::failed_precondition(format!(
                    "{} is already revoked",
                    m.name
                )));
            }
            m.id
        };
        let now = now_ms();
        let secret =
            PairingToken::generate(self.shared.pki.ca_sha256, self.shared.public_addr.clone());
        let token = pb::Token {
            id: TokenId::new(now).to_string(),
            name: req.name,
            labels: req.labels,
            created_at_ms: now,
            expires_at_ms: now + ttl,
            secret_sha256: hex(&sha256(&secret.secret)),
            replace_machine,
            ..Default::default()
        };
        self.shared.store.create_token(&token).map_err(store_err)?;
        self.shared.store.flush_async().await.map_err(store_err)?;
        let mut shown = token;
        shown.secret_sha256.clear();
        Ok(Response::new(pb::CreateTokenResponse {
            token: Some(shown),
            secret: secret.encode(),
        }))
    }

    async fn list_tokens(
        &self,
        req: Request<pb::ListTokensRequest>,
    ) -> Result<Response<pb::ListTokensResponse>, Status> {
        let all = req.into_inner().include_used;
        let now = now_ms();
        let mut tokens = self.shared.store.list_tokens().map_err(store_err)?;
        tokens.retain(|t| all || (t.used_at_ms == 0 && !t.revoked && t.expires_at_ms > now));
        for t in &mut tokens {
            t.secret_sha256.clear();
        }
        Ok(Response::new(pb::ListTokensResponse { tokens }))
    }

    async fn revoke_token(
        &self,
        req: Request<pb::RevokeTokenRequest>,
    ) -> Result<Response<pb::RevokeTokenResponse>, Status> {
        let id = req.into_inner().id;
        let mut t = self.shared.store.revoke_token(&id).map_err(|e| match e {
            StoreError::NotFound(_) => {
                Status::not_found(format!("no token {id}: see `byom token ls`"))
            }
            e => store_err(e),
        })?;
        self.shared.store.flush_async().await.map_err(store_err)?;
        t.secret_sha256.clear();
        Ok(Response::new(pb::RevokeTokenResponse { token: Some(t) }))
    }

    async fn list_machines(
        &self,
        req: Request<pb::ListMachinesRequest>,
    ) -> Result<Response<pb::ListMachinesResponse>, Status> {
        let all = req.into_inner().include_revoked;
        let machines = self
            .shared
            .store
            .list_machines()
            .map_err(store_err)?
            .into_iter()
            .filter(|m| all || !m.revoked)
            .map(|m| self.decorate(m))
            .collect();
        Ok(Response::new(pb::ListMachinesResponse { machines }))
    }

    async fn get_machine(
        &self,
        req: Request<pb::MachineRef>,
    ) -> Result<Response<pb::MachineResponse>, Status> {
        let m = self.machine(&req.into_inner().machine)?;
        Ok(Response::new(pb::MachineResponse { machine: Some(m) }))
    }

    async fn rename_machine(
        &self,
        req: Request<pb::RenameMachineRequest>,
    ) -> Result<Response<pb::MachineResponse>, Status> {
        let req = req.into_inner();
        let m = self.machine(&req.machine)?;
        if !gateway::valid_name(&req.name) {
            return Err(Status::invalid_argument(
                "bad name: use lower-case letters, digits, '-', '_' or '.' (and not an ID)",
            ));
        }
        let m = self
            .shared
            .store
            .rename_machine(&m.id, &req.name)
            .map_err(store_err)?;
        self.shared.store.flush_async().await.map_err(store_err)?;
        Ok(Response::new(pb::MachineResponse {
            machine: Some(self.decorate(m)),
        }))
    }

    async fn label_machine(
        &self,
        req: Request<pb::LabelMachineRequest>,
    ) -> Result<Response<pb::MachineResponse>, Status> {
        let req = req.into_inner();
        let m = self.machine(&req.machine)?;
        for (k, v) in &req.set {
            valid_label(k, v)?;
        }
        let m = self
            .shared
            .store
            .update_machine(&m.id, |m| {
                for k in &req.remove {
                    m.labels.remove(k);
                }
                for (k, v) in &req.set {
                    m.labels.insert(k.clone(), v.clone());
                }
                if m.labels.len() > limits::MAX_LABELS {
                    return Err(StoreError::Conflict(format!(
                        "at most {} labels",
                        limits::MAX_LABELS
                    )));
                }
                Ok(())
            })
            .map_err(store_err)?;
        self.shared.store.flush_async().await.map_err(store_err)?;
        Ok(Response::new(pb::MachineResponse {
            machine: Some(self.decorate(m)),
        }))
    }

    async fn revoke_machine(
        &self,
        req: Request<pb::MachineRef>,
    ) -> Result<Response<pb::MachineResponse>, Status> {
        let admin = caller(&req);
        let m = self.machine(&req.into_inner().machine)?;
        let m = gateway::revoke_machine(&self.shared, &m.id, &format!("revoked by {admin}"))
            .await
            .map_err(store_err)?;
        Ok(Response::new(pb::MachineResponse {
            machine: Some(self.decorate(m)),
        }))
    }

    async fn create_command(
        &self,
        req: Request<pb::CreateCommandRequest>,
    ) -> Result<Response<pb::CommandResponse>, Status> {
        let admin = caller(&req);
        let req = req.into_inner();
        let m =
            match (req.machine.is_empty(), req.labels.is_empty()) {
                (false, true) => self.machine(&req.machine)?,
                (true, false) => self.pick_by_labels(&req.labels)?,
                _ => return Err(Status::invalid_argument(
                    "name a machine or give labels to pick one (byom exec --label k=v), not both",
                )),
            };
        if m.revoked {
            return Err(Status::failed_precondition(format!(
                "machine {} was revoked; pair it again with a new token",
                m.name
            )));
        }
        if req.argv.is_empty() == req.shell.is_empty() {
            return Err(Status::invalid_argument(
                "give either argv or a shell command line",
            ));
        }
        let line: usize = req.argv.iter().map(|a| a.len() + 1).sum::<usize>() + req.shell.len();
        if line > limits::MAX_COMMAND_LINE_BYTES {
            return Err(Status::invalid_argument(format!(
                "command line too long: {line} bytes, limit {}",
                limits::MAX_COMMAND_LINE_BYTES
            )));
        }
        if req.stdin.len() > limits::MAX_STDIN_BYTES {
            return Err(Status::invalid_argument(format!(
                "stdin too large: {} bytes, limit {}",
                req.stdin.len(),
                limits::MAX_STDIN_BYTES
            )));
        }
        if req.env.len() > limits::MAX_ENV_VARS {
            return Err(Status::invalid_argument(format!(
                "at most {} environment variables",
                limits::MAX_ENV_VARS
            )));
        }
        if req
            .env
            .keys()
            .any(|k| k.is_empty() || k.contains('=') || k.contains('\0'))
        {
            return Err(Status::invalid_argument("bad environment variable name"));
        }
        if req.timeout_ms > ms(limits::MAX_COMMAND_TIMEOUT) {
            return Err(Status::invalid_argument("timeout too long: at most 7 days"));
        }
        let ttl = if req.queue_ttl_ms == 0 {
            ms(limits::DEFAULT_QUEUE_TTL)
        } else {
            req.queue_ttl_ms.min(ms(limits::MAX_QUEUE_TTL))
        };
        let pending = self
            .shared
            .store
            .pending_commands(&m.id)
            .map_err(store_err)?;
        if pending.len() >= limits::MAX_QUEUED_PER_MACHINE {
            return Err(Status::resource_exhausted(format!(
                "machine {} already has {} commands waiting; cancel some or wait",
                m.name,
                pending.len()
            )));
        }
        let now = now_ms();
        let c = pb::Command {
            id: CommandId::new(now).to_string(),
            machine_id: m.id.clone(),
            argv: req.argv,
            shell: req.shell,
            cwd: req.cwd,
            env: req.env,
            stdin: req.stdin,
            timeout_ms: req.timeout_ms,
            state: CommandState::Queued as i32,
            created_at_ms: now,
            queue_deadline_ms: now + ttl,
            requested_by: admin,
            ..Default::default()
        };
        self.shared.store.create_command(&c).map_err(store_err)?;
        // Acknowledged only once durable.
        self.shared.store.flush_async().await.map_err(store_err)?;
        if let Some(live) = self.shared.live_machine(&m.id) {
            let shared = self.shared.clone();
            tokio::spawn(async move { gateway::dispatch_queued(&shared, &live).await });
        }
        Ok(Response::new(pb::CommandResponse { command: Some(c) }))
    }

    async fn get_command(
        &self,
        req: Request<pb::CommandRef>,
    ) -> Result<Response<pb::CommandResponse>, Status> {
        let c = self.command(&req.into_inner().id)?;
        Ok(Response::new(pb::CommandResponse { command: Some(c) }))
    }

    async fn list_commands(
        &self,
        req: Request<pb::ListCommandsRequest>,
    ) -> Result<Response<pb::ListCommandsResponse>, Status> {
        let req = req.into_inner();
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
            100
        } else {
            (req.limit as usize).min(MAX_LIST)
        };
        let mut commands = self
            .shared
            .store
            .list_commands(machine.as_deref(), state, req.since_ms, limit)
            .map_err(store_err)?;
        for c in &mut commands {
            c.stdin.clear();
        }
        Ok(Response::new(pb::ListCommandsResponse { commands }))
    }

    async fn cancel_command(
        &self,
        req: Request<pb::CancelCommandRequest>,
    ) -> Result<Response<pb::CommandResponse>, Status> {
        let req = req.into_inner();
        let reason = if req.reason.is_empty() {
            "cancelled by admin".to_string()
        } else {
            req.reason
        };
        let c = self.command(&req.id)?;
        if c.state().is_terminal() {
            return Err(Status::failed_precondition(format!(
                "{} already finished ({})",
                c.id,
                c.state().name()
            )));
        }
        let store = &self.shared.store;
        let now = now_ms();
        let c = match store
            .transition(
                &c.id,
                &[CommandState::Queued],
                CommandState::Cancelled,
                |c| {
                    c.reason = reason.clone();
                    c.finished_at_ms = now;
                },
            )
            .map_err(store_err)?
        {
            Some(c) => c,
            None => {
                let c = store
                    .update_command(&c.id, |c| {
                        if !c.state().is_terminal() {
                            c.cancel_requested = true;
                        }
                        Ok(())
                    })
                    .map_err(store_err)?;
                if let Some(live) = self.shared.live_machine(&c.machine_id) {
                    live.cancel(&c.id, &reason);
                }
                c
            }
        };
        store.flush_async().await.map_err(store_err)?;
        self.shared.notify(&c.id);
        Ok(Response::new(pb::CommandResponse { command: Some(c) }))
    }

    async fn send_event(
        &self,
        req: Request<pb::SendEventRequest>,
    ) -> Result<Response<pb::SendEventResponse>, Status> {
        let ev = req.into_inner();
        if ev.source.trim().is_empty() || ev.thread.trim().is_empty() || ev.user.trim().is_empty() {
            return Err(Status::invalid_argument(
                "an event needs a source, a thread and a user",
            ));
        }
        let t = crate::triggers::ingest(&self.shared.store, &self.shared.rules, ev)
            .await
            .map_err(store_err)?;
        let _ = self.shared.triggers_tx.send(t.clone());
        self.shared.agents.wake.notify_one();
        Ok(Response::new(pb::SendEventResponse { trigger: Some(t) }))
    }

    async fn list_triggers(
        &self,
        req: Request<pb::ListTriggersRequest>,
    ) -> Result<Response<pb::ListTriggersResponse>, Status> {
        let req = req.into_inner();
        let limit = if req.limit == 0 {
            50
        } else {
            (req.limit as usize).min(MAX_LIST)
        };
        let thread = (!req.thread.is_empty()).then_some(req.thread.as_str());
        let triggers = self
            .shared
            .store
            .list_triggers(thread, limit)
            .map_err(store_err)?;
        Ok(Response::new(pb::ListTriggersResponse { triggers }))
    }

    type TailTriggersStream =
        Pin<Box<dyn futures_util::Stream<Item = Result<pb::Trigger, Status>> + Send>>;

    async fn tail_triggers(
        &self,
        _: Request<pb::TailTriggersRequest>,
    ) -> Result<Response<Self::TailTriggersStream>, Status> {
        let mut rx = self.shared.triggers_tx.subscribe();
        let (tx, out) = tokio::sync::mpsc::channel(WATCH_BUFFER);
        let shutdown = self.shared.shutdown.clone();
        tokio::spawn(async move {
            loop {
                let t = tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tx.closed() => return,
                    r = rx.recv() => r,
                };
                match t {
                    Ok(t) => {
                        if tx.send(Ok(t)).await.is_err() {
                            return;
                        }
                    }
                    // A slow reader skips ahead rather than holding memory.
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(_) => return,
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(out),
        )))
    }

    async fn add_policy(
        &self,
        req: Request<pb::AddPolicyRequest>,
    ) -> Result<Response<pb::PolicyResponse>, Status> {
        let who = caller(&req);
        let text = req.into_inner().text.trim().to_string();
        if text.is_empty() || text.len() > MAX_POLICY_BYTES {
            return Err(Status::invalid_argument(format!(
                "a policy is 1 to {MAX_POLICY_BYTES} bytes of text"
            )));
        }
        if self.shared.store.list_policies().map_err(store_err)?.len() >= MAX_POLICIES {
            return Err(Status::resource_exhausted(format!(
                "at most {MAX_POLICIES} policies: remove one first"
            )));
        }
        let now = now_ms();
        let p = pb::RouterPolicy {
            id: byom_protocol::id::PolicyId::new(now).to_string(),
            text,
            created_at_ms: now,
            created_by: who,
        };
        self.shared.store.put_policy(&p).map_err(store_err)?;
        self.shared.store.flush_async().await.map_err(store_err)?;
        Ok(Response::new(pb::PolicyResponse { policy: Some(p) }))
    }

    async fn list_policies(
        &self,
        _: Request<pb::ListPoliciesRequest>,
    ) -> Result<Response<pb::ListPoliciesResponse>, Status> {
        let policies = self.shared.store.list_policies().map_err(store_err)?;
        Ok(Response::new(pb::ListPoliciesResponse { policies }))
    }

    async fn remove_policy(
        &self,
        req: Request<pb::RemovePolicyRequest>,
    ) -> Result<Response<pb::PolicyResponse>, Status> {
        let id = req.into_inner().id;
        let p = self
            .shared
            .store
            .remove_policy(&id)
            .map_err(store_err)?
            .ok_or_else(|| Status::not_found(format!("no policy {id}: see `byom policy ls`")))?;
        self.shared.store.flush_async().await.map_err(store_err)?;
        Ok(Response::new(pb::PolicyResponse { policy: Some(p) }))
    }

    async fn agent(
        &self,
        req: Request<pb::AgentRequest>,
    ) -> Result<Response<pb::AgentResponse>, Status> {
        use crate::agent::query::{handle, QueryError};
        let by = caller(&req);
        let r = req.into_inner();
        let v = handle(&self.shared, &r.op, &r.id, &r.json, &by)
            .await
            .map_err(|e| match e {
                QueryError::NotFound(m) => Status::not_found(m),
                QueryError::Invalid(m) => Status::invalid_argument(m),
                QueryError::Conflict(m) => Status::failed_precondition(m),
                QueryError::Store(e) => store_err(e),
            })?;
        Ok(Response::new(pb::AgentResponse {
            json: v.to_string(),
        }))
    }

    type WatchCommandStream = WatchStream;

    async fn watch_command(
        &self,
        req: Request<pb::WatchCommandRequest>,
    ) -> Result<Response<WatchStream>, Status> {
        let req = req.into_inner();
        let c = self.command(&req.id)?;
        let (tx, rx) = tokio::sync::mpsc::channel(WATCH_BUFFER);
        let shared = self.shared.clone();
        tokio::spawn(async move {
            let mut offsets = [req.stdout_offset, req.stderr_offset];
            let mut last_state = None;
            let mut wake = shared.subscribe(&c.id);
            loop {
                let cmd = match shared.store.get_command(&c.id) {
                    Ok(Some(c)) => c,
                    _ => return,
                };
                // Output first, so a terminal state is the last event.
                for (i, stream) in [pb::OutputStream::Stdout, pb::OutputStream::Stderr]
                    .into_iter()
                    .enumerate()
                {
                    loop {
                        let chunks = match shared.store.read_output(
                            &c.id,
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
                            offsets[i] = off + data.len() as u64;
                            let mut at = off;
                            for piece in data.chunks(limits::MAX_OUTPUT_CHUNK_BYTES) {
                                let ev = pb::CommandEvent {
                                    event: Some(pb::command_event::Event::Output(pb::Output {
                                        stream: stream as i32,
                                        offset: at,
                                        data: piece.to_vec(),
                                    })),
                                };
                                at += piece.len() as u64;
                                if tx.send(Ok(ev)).await.is_err() {
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
                    if tx
                        .send(Ok(pb::CommandEvent {
                            event: Some(pb::command_event::Event::State(shown)),
                        }))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
                if cmd.state().is_terminal() {
                    return;
                }
                tokio::select! {
                    _ = wake.changed() => {}
                    _ = tokio::time::sleep(WATCH_POLL) => {}
                    _ = tx.closed() => return,
                    _ = shared.shutdown.cancelled() => return,
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    async fn show(
        &self,
        req: Request<pb::ShowRequest>,
    ) -> Result<Response<pb::ShowResponse>, Status> {
        use pb::show_response::Object;
        let id = req.into_inner().id;
        let object = match Kind::of(&id) {
            Some(Kind::Machine) => Object::Machine(self.machine(&id)?),
            Some(Kind::Command) => Object::Command(self.command(&id)?),
            Some(Kind::Token) => {
                let mut t = self
                    .shared
                    .store
                    .get_token(&id)
                    .map_err(store_err)?
                    .ok_or_else(|| Status::not_found(format!("no token {id}")))?;
                t.secret_sha256.clear();
                Object::Token(t)
            }
            Some(Kind::Trigger) => Object::Trigger(
                self.shared
                    .store
                    .get_trigger(&id)
                    .map_err(store_err)?
                    .ok_or_else(|| Status::not_found(format!("no trigger {id}")))?,
            ),
            Some(Kind::Thread) => Object::Thread(
                self.shared
                    .store
                    .get_thread(&id)
                    .map_err(store_err)?
                    .ok_or_else(|| Status::not_found(format!("no thread {id}")))?,
            ),
            Some(Kind::Worker | Kind::Approval | Kind::Snapshot) => {
                let text = crate::agent::driver::lookup(&self.shared.store, &id)
                    .ok_or_else(|| Status::not_found(format!("no {id}")))?;
                Object::AgentJson(text)
            }
            Some(_) => {
                return Err(Status::unimplemented(format!(
                    "{id}: this kind of object cannot be shown"
                )))
            }
            None => match self.shared.store.resolve_machine(&id).map_err(store_err)? {
                Some(m) => Object::Machine(self.decorate(m)),
                None => {
                    return Err(Status::invalid_argument(format!(
                        "{id:?} is not an ID (mch_…, cmd_…, tok_…) or a machine name"
                    )))
                }
            },
        };
        Ok(Response::new(pb::ShowResponse {
            object: Some(object),
        }))
    }
}
