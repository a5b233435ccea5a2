//! The admin gRPC service (the API boundary is `byom-api`): served over TLS
//! 1.3 to clients with an admin certificate from our CA only ([`serve`]),
//! one module per resource: [`machines`] (tokens and machines),
//! [`commands`], [`events`] (triggers and policies), [`agents`],
//! [`people`] and [`show`]; records become messages in [`views`]. The
//! generated `Admin` trait is implemented here by delegation, the
//! services by area in [`services`].

mod agents;
mod commands;
mod events;
mod machines;
mod people;
mod services;
mod show;
mod views;

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use byom_api::proto::admin_server::{Admin, AdminServer};
use byom_protocol::{limits, pb};
use byom_store::{Store, StoreError};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use crate::agents::AgentInbox;
use crate::commands::{CommandError, Commands};
use crate::idempotency::{Claim, IdemError, Idempotency, Pending};
use crate::identity::ServerIdentity;
use crate::live::LiveMachines;
use crate::pki::Role;
use crate::triggers::Triggers;

/// Longest a client may take to finish its TLS handshake (the CLI takes
/// milliseconds); then its place may go to someone else.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// The first byte of a TLS connection (a handshake record); anything else
/// is plain HTTP for the monitor.
const TLS_HANDSHAKE: u8 = 0x16;
/// Authenticated connections waiting to be served.
const ACCEPT_QUEUE: usize = 16;

/// What the API works with.
#[derive(Clone)]
pub struct Api {
    pub store: Store,
    pub identity: Arc<ServerIdentity>,
    pub live: Arc<LiveMachines>,
    pub commands: Commands,
    pub triggers: Triggers,
    pub agents: AgentInbox,
    pub idem: Idempotency,
    pub shutdown: CancellationToken,
    pub channels: Arc<crate::channels::Channels>,
    /// The web console's base URL (`https://HOST:PORT`), for login links;
    /// `None` when it is off.
    pub console_url: Option<String>,
    /// How long a console login link lives (at most
    /// [`crate::console::sessions::LINK_TTL`]).
    pub console_link_ttl: Duration,
}

/// A TLS connection from an authenticated admin.
pub struct AdminConn {
    tls: TlsStream<TcpStream>,
    admin: String,
    /// SHA-256 of the certificate's public key, checked against the admin
    /// list on every call.
    spki: String,
    /// Its place in the gate, held while the connection lives.
    _ticket: crate::gate::Ticket,
}

/// Name and key from the admin certificate of the caller, in request
/// extensions.
#[derive(Clone, Debug)]
pub struct AdminIdentity {
    pub name: String,
    pub spki: String,
}

impl tonic::transport::server::Connected for AdminConn {
    type ConnectInfo = AdminIdentity;
    fn connect_info(&self) -> AdminIdentity {
        AdminIdentity {
            name: self.admin.clone(),
            spki: self.spki.clone(),
        }
    }
}

/// Every call is checked against the admin list as it is now (another
/// replica's change: once its note arrives, within
/// [`crate::admins::SHARED_FRESH`] at worst), so a revoke takes effect on
/// connections already open too.
fn admitted(
    store: &Store,
    checker: &crate::admins::Checker,
    req: Request<()>,
) -> Result<Request<()>, Status> {
    let Some(who) = req.extensions().get::<AdminIdentity>() else {
        return Err(Status::unauthenticated("no admin certificate"));
    };
    let admins = checker.admins(store).map_err(store_err)?;
    crate::admins::check(&admins, &who.name, &who.spki).map_err(Status::permission_denied)?;
    Ok(req)
}

/// [`admitted`] as every service's interceptor.
#[derive(Clone)]
struct Gatekeeper {
    store: Store,
    checker: Arc<crate::admins::Checker>,
}

impl tonic::service::Interceptor for Gatekeeper {
    fn call(&mut self, req: Request<()>) -> Result<Request<()>, Status> {
        admitted(&self.store, &self.checker, req)
    }
}

/// Who is calling: `admin:NAME`, from the certificate.
fn caller<T>(req: &Request<T>) -> String {
    req.extensions()
        .get::<AdminIdentity>()
        .map(|a| format!("admin:{}", a.name))
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

/// Serves the API on `listener` until shutdown. Connections are admitted
/// through `gate` (per address, and the oldest unfinished handshake makes
/// room for a new one), so idle strangers cannot lock the CLI out.
///
/// With `monitor`, a connection that does not open with a TLS handshake
/// is plain HTTP for `/metrics` and the health checks (see
/// [`crate::monitor`]); it never reaches the API.
pub async fn serve(
    api: Api,
    listener: TcpListener,
    tls: rustls::ServerConfig,
    gate: Arc<crate::gate::Gate>,
    monitor: Option<crate::monitor::Monitor>,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<AdminConn, std::io::Error>>(ACCEPT_QUEUE);
    let accept_shutdown = api.shutdown.clone();
    tokio::spawn(async move {
        while let Some((tcp, remote, ticket)) =
            crate::gate::accept(&listener, &gate, &accept_shutdown).await
        {
            let acceptor = acceptor.clone();
            let tx = tx.clone();
            let monitor = monitor.clone();
            tokio::spawn(async move {
                // One deadline for the first byte and the handshake.
                let deadline = tokio::time::Instant::now() + HANDSHAKE_TIMEOUT;
                if let Some(m) = monitor {
                    let mut first = [0u8; 1];
                    let Some(Ok(1)) = ticket.within(HANDSHAKE_TIMEOUT, tcp.peek(&mut first)).await
                    else {
                        return;
                    };
                    if first[0] != TLS_HANDSHAKE {
                        m.serve_conn(tcp, ticket).await;
                        return;
                    }
                }
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                let tls = match ticket.within(left, acceptor.accept(tcp)).await {
                    Some(Ok(t)) => t,
                    Some(Err(e)) => {
                        tracing::debug!(%remote, "API handshake failed: {e}");
                        return;
                    }
                    None => return,
                };
                let role = crate::tls::peer_role(tls.get_ref().1.peer_certificates());
                let Some((Role::Admin(admin), info)) = role else {
                    tracing::warn!(%remote, "API client without an admin certificate refused");
                    return;
                };
                ticket.established();
                let _ = tx
                    .send(Ok(AdminConn {
                        tls,
                        admin,
                        spki: info.spki_sha256,
                        _ticket: ticket,
                    }))
                    .await;
            });
        }
    });
    let shutdown = api.shutdown.clone();
    let gate = Gatekeeper {
        store: api.store.clone(),
        checker: Arc::new(crate::admins::Checker::default()),
    };
    // Every service behind the same check; messages as large as the
    // protocol allows (a worker's transcript, a command's output).
    macro_rules! service {
        ($server:ty) => {
            InterceptedService::new(
                <$server>::new(api.clone())
                    .max_decoding_message_size(limits::MAX_FRAME_BYTES)
                    .max_encoding_message_size(limits::MAX_FRAME_BYTES * 4),
                gate.clone(),
            )
        };
    }
    use byom_api::proto::{
        admins_server::AdminsServer, approvals_server::ApprovalsServer,
        connectors_server::ConnectorsServer, outbox_server::OutboxServer,
        sources_server::SourcesServer, tasks_server::TasksServer, trust_server::TrustServer,
    };
    use tonic::service::interceptor::InterceptedService;
    let incoming = tokio_stream::wrappers::ReceiverStream::new(rx);
    if let Err(e) = tonic::transport::Server::builder()
        .add_service(service!(AdminServer<Api>))
        .add_service(service!(TasksServer<Api>))
        .add_service(service!(ApprovalsServer<Api>))
        .add_service(service!(TrustServer<Api>))
        .add_service(service!(AdminsServer<Api>))
        .add_service(service!(ConnectorsServer<Api>))
        .add_service(service!(OutboxServer<Api>))
        .add_service(service!(SourcesServer<Api>))
        .serve_with_incoming_shutdown(incoming, async move { shutdown.cancelled().await })
        .await
    {
        tracing::error!("API server failed: {e}");
    }
}

/// How a Router policy is enforced: by code when it needs no judgement.
fn enforcement(text: &str) -> String {
    byom_agent::fastpath::CodeRule::compile(text)
        .map(|r| r.describe())
        .unwrap_or_default()
}

fn store_err(e: StoreError) -> Status {
    match e {
        StoreError::NotFound(x) => Status::not_found(format!("{x} not found")),
        StoreError::Conflict(x) => Status::already_exists(x),
        StoreError::IllegalTransition { .. } => Status::failed_precondition(e.to_string()),
        // Clients send the call again (with its idempotency key) until
        // the database is back.
        StoreError::Unreachable(_) => Status::unavailable(e.to_string()),
        other => Status::internal(other.to_string()),
    }
}

fn command_err(e: CommandError) -> Status {
    match e {
        CommandError::NotFound(m) => Status::not_found(m),
        CommandError::Invalid(m) => Status::invalid_argument(m),
        CommandError::Refused(m) => Status::failed_precondition(m),
        // A definite answer (no machine can take it now), not a server
        // that is away: `Unavailable` would have clients send it again.
        CommandError::Unavailable(m) => Status::failed_precondition(m),
        CommandError::Full(m) => Status::resource_exhausted(m),
        CommandError::Store(e) => store_err(e),
    }
}

fn idem_err(e: IdemError) -> Status {
    match e {
        IdemError::BadKey => Status::invalid_argument(e.to_string()),
        IdemError::Reused(_) => Status::failed_precondition(e.to_string()),
        IdemError::Store(e) => store_err(e),
    }
}

/// A request as idempotency compares it: its encoding without the key,
/// with map fields (which prost encodes in hash order) appended sorted.
fn fingerprint<M: prost::Message>(
    rest: &M,
    maps: &[&std::collections::HashMap<String, String>],
) -> Vec<u8> {
    let mut b = rest.encode_to_vec();
    for m in maps {
        let sorted: std::collections::BTreeMap<_, _> = m.iter().collect();
        for (k, v) in sorted {
            b.extend_from_slice(k.as_bytes());
            b.push(0);
            b.extend_from_slice(v.as_bytes());
            b.push(0);
        }
        b.push(1);
    }
    b
}

impl Api {
    /// Claims a creating call's idempotency key: `Ok(Err(record))` when the
    /// key already created something.
    async fn claim(
        &self,
        scope: &str,
        by: &str,
        key: &str,
        request: &[u8],
    ) -> Result<Result<Pending, byom_protocol::pb::IdempotencyRecord>, Status> {
        match self
            .idem
            .claim(scope, by, key, request)
            .await
            .map_err(idem_err)?
        {
            Claim::New(p) => Ok(Ok(p)),
            Claim::Done(r) => Ok(Err(r)),
        }
    }
}

type Reply<T> = Result<Response<T>, Status>;
type Stream<T> = Pin<Box<dyn futures_util::Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl Admin for Api {
    async fn server_info(
        &self,
        _: Request<pb::ServerInfoRequest>,
    ) -> Reply<pb::ServerInfoResponse> {
        Ok(Response::new(pb::ServerInfoResponse {
            version: byom_protocol::VERSION.into(),
            quic_addr: self.identity.quic_addr.to_string(),
            public_addr: self.identity.public_addr.clone(),
            ca_sha256: byom_wire::hex(&self.identity.pki.ca_sha256),
        }))
    }

    async fn create_token(
        &self,
        req: Request<pb::CreateTokenRequest>,
    ) -> Reply<pb::CreateTokenResponse> {
        let by = caller(&req);
        self.create_token(req.into_inner(), &by)
            .await
            .map(Response::new)
    }

    async fn list_tokens(
        &self,
        req: Request<pb::ListTokensRequest>,
    ) -> Reply<pb::ListTokensResponse> {
        self.list_tokens(req.into_inner()).map(Response::new)
    }

    async fn revoke_token(
        &self,
        req: Request<pb::RevokeTokenRequest>,
    ) -> Reply<pb::RevokeTokenResponse> {
        self.revoke_token(req.into_inner()).await.map(Response::new)
    }

    async fn list_machines(
        &self,
        req: Request<pb::ListMachinesRequest>,
    ) -> Reply<pb::ListMachinesResponse> {
        self.list_machines(req.into_inner()).map(Response::new)
    }

    async fn get_machine(&self, req: Request<pb::MachineRef>) -> Reply<pb::MachineResponse> {
        let m = self.machine(&req.into_inner().machine)?;
        Ok(Response::new(pb::MachineResponse { machine: Some(m) }))
    }

    async fn rename_machine(
        &self,
        req: Request<pb::RenameMachineRequest>,
    ) -> Reply<pb::MachineResponse> {
        self.rename_machine(req.into_inner())
            .await
            .map(Response::new)
    }

    async fn label_machine(
        &self,
        req: Request<pb::LabelMachineRequest>,
    ) -> Reply<pb::MachineResponse> {
        self.label_machine(req.into_inner())
            .await
            .map(Response::new)
    }

    async fn revoke_machine(&self, req: Request<pb::MachineRef>) -> Reply<pb::MachineResponse> {
        let by = caller(&req);
        self.revoke_machine(req.into_inner(), &by)
            .await
            .map(Response::new)
    }

    async fn remove_machine(&self, req: Request<pb::MachineRef>) -> Reply<pb::MachineResponse> {
        self.remove_machine(req.into_inner())
            .await
            .map(Response::new)
    }

    async fn create_command(
        &self,
        req: Request<pb::CreateCommandRequest>,
    ) -> Reply<pb::CommandResponse> {
        let by = caller(&req);
        self.create_command(req.into_inner(), by)
            .await
            .map(Response::new)
    }

    async fn get_command(&self, req: Request<pb::CommandRef>) -> Reply<pb::CommandResponse> {
        let c = self.command(&req.into_inner().id)?;
        Ok(Response::new(pb::CommandResponse { command: Some(c) }))
    }

    async fn list_commands(
        &self,
        req: Request<pb::ListCommandsRequest>,
    ) -> Reply<pb::ListCommandsResponse> {
        self.list_commands(req.into_inner()).map(Response::new)
    }

    async fn cancel_command(
        &self,
        req: Request<pb::CancelCommandRequest>,
    ) -> Reply<pb::CommandResponse> {
        self.cancel_command(req.into_inner())
            .await
            .map(Response::new)
    }

    async fn send_event(&self, req: Request<pb::SendEventRequest>) -> Reply<pb::SendEventResponse> {
        let by = caller(&req);
        self.send_event(req.into_inner(), &by)
            .await
            .map(Response::new)
    }

    async fn list_triggers(
        &self,
        req: Request<pb::ListTriggersRequest>,
    ) -> Reply<pb::ListTriggersResponse> {
        self.list_triggers(req.into_inner()).map(Response::new)
    }

    type TailTriggersStream = Stream<pb::Trigger>;

    async fn tail_triggers(
        &self,
        _: Request<pb::TailTriggersRequest>,
    ) -> Reply<Self::TailTriggersStream> {
        Ok(Response::new(self.tail_triggers()))
    }

    async fn add_policy(&self, req: Request<pb::AddPolicyRequest>) -> Reply<pb::PolicyResponse> {
        let by = caller(&req);
        self.add_policy(req.into_inner(), by)
            .await
            .map(Response::new)
    }

    async fn list_policies(
        &self,
        _: Request<pb::ListPoliciesRequest>,
    ) -> Reply<pb::ListPoliciesResponse> {
        let mut policies = self.store.list_policies().map_err(store_err)?;
        for p in &mut policies {
            p.enforced = enforcement(&p.text);
        }
        Ok(Response::new(pb::ListPoliciesResponse { policies }))
    }

    async fn remove_policy(
        &self,
        req: Request<pb::RemovePolicyRequest>,
    ) -> Reply<pb::PolicyResponse> {
        self.remove_policy(req.into_inner())
            .await
            .map(Response::new)
    }

    type WatchCommandStream = Stream<pb::CommandEvent>;
    type RunCommandStream = Stream<pb::CommandEvent>;
    type ExecStream = Stream<pb::CommandEvent>;

    async fn exec(&self, req: Request<tonic::Streaming<pb::ExecInput>>) -> Reply<Self::ExecStream> {
        let by = caller(&req);
        self.exec(req.into_inner(), by).await.map(Response::new)
    }

    async fn run_command(
        &self,
        req: Request<pb::CreateCommandRequest>,
    ) -> Reply<Self::RunCommandStream> {
        let by = caller(&req);
        self.run_command(req.into_inner(), by)
            .await
            .map(Response::new)
    }

    async fn watch_command(
        &self,
        req: Request<pb::WatchCommandRequest>,
    ) -> Reply<Self::WatchCommandStream> {
        self.watch_command(req.into_inner()).map(Response::new)
    }

    async fn show(&self, req: Request<pb::ShowRequest>) -> Reply<pb::ShowResponse> {
        self.show(&req.into_inner().id).map(Response::new)
    }
}
