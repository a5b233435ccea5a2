//! The web console: server-rendered pages over HTTPS with the server's own
//! certificate (the admin CA in `<data-dir>/admin/ca.pem` is what a
//! browser trusts), on `--listen-console` (default [`DEFAULT_ADDR`], on
//! loopback like the API; a default port that is taken leaves the console
//! off with a warning, an address given explicitly must bind).
//!
//! Sign-in is a single-use link `byom console` asks the API for
//! ([`sessions`]): opening it sets the session cookie (HttpOnly, Secure,
//! SameSite=Strict) and redirects home. Every page needs a live session
//! of an admin still on the admin list; GET never changes anything (but
//! the login link, which is spent); every change is a POST carrying the
//! session's CSRF token from a page of this origin (Origin, else Referer,
//! checked), and goes through the API's own code with the session's
//! person as the actor (`admin:NAME`), so the audit names them. A
//! read-only session may look, never act.
//!
//! Pages: Needs you ([`needs`], following changes live), tasks, threads,
//! a thread's timeline and a worker's transcript with Cancel
//! ([`timeline`]), machines, commands, the audit trail, connectors and
//! the outbox with Retry, trust ([`ops`]).
//!
//! Pages ([`pages`]) escape every value; the Content-Security-Policy
//! allows only this origin's script and style (no inline code). A
//! command's page follows its output live over server-sent events
//! ([`live`]), resuming from `Last-Event-ID`, bounded per session and in
//! total. Requests are bounded: header count and size, form body size,
//! time to send headers and body, connections per address and in total.

mod live;
mod needs;
mod ops;
mod pages;
pub mod sessions;
mod timeline;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use byom_protocol::pb;
use bytes::Bytes;
use http_body_util::{combinators::UnsyncBoxBody, BodyExt, Full};
use hyper::header::HeaderValue;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio_util::sync::CancellationToken;

use crate::admin::Api;
use pages::Viewer;
use sessions::Session;

/// Where the console listens unless told.
pub const DEFAULT_ADDR: &str = "127.0.0.1:7446";
/// Connections to the console: at most, and from one address.
pub const MAX_CONNECTIONS: usize = 256;
pub const MAX_CONNECTIONS_PER_ADDRESS: usize = 64;
/// Headers in one request, and bytes of the request head.
pub const MAX_HEADERS: usize = 64;
pub const MAX_HEAD_BYTES: usize = 16 * 1024;
/// Largest form body (a CSRF token and little else).
pub const MAX_FORM_BYTES: usize = 8 * 1024;
/// Time to send a request's headers, then its body.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
const BODY_TIMEOUT: Duration = Duration::from_secs(10);
/// Time for the TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest a connection stays open; a live stream cut by it resumes
/// (the browser reconnects with `Last-Event-ID`).
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(600);
/// How often a live stream checks that its session still stands: signed
/// out, ended, or its admin revoked, the stream ends (the browser's
/// reconnection is then refused).
const SESSION_RECHECK: Duration = Duration::from_secs(5);
/// Rows on the commands page.
const COMMAND_ROWS: u32 = 200;
/// Output of each stream rendered into a command's page (the rest comes
/// live).
const PAGE_OUTPUT_BYTES: usize = 256 * 1024;

/// `__Host-`: the browser keeps it only from this very host over HTTPS,
/// with `Path=/` and no `Domain`, so a sibling subdomain cannot set or
/// shadow it.
const COOKIE: &str = "__Host-byom_session";
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";
const CSS: &str = include_str!("console.css");
const JS: &str = include_str!("console.js");

/// Where the console is served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listen {
    /// [`DEFAULT_ADDR`], or nowhere (with a warning) if it is taken.
    Default,
    Addr(SocketAddr),
    Off,
}

impl std::str::FromStr for Listen {
    type Err = String;
    fn from_str(s: &str) -> Result<Listen, String> {
        match s {
            "off" => Ok(Listen::Off),
            a => a
                .parse()
                .map(Listen::Addr)
                .map_err(|e| format!("{a:?}: give HOST:PORT (e.g. 127.0.0.1:7446) or off ({e})")),
        }
    }
}

/// Binds the console's port as `listen` says; `None`: no console.
pub async fn bind(listen: Listen) -> anyhow::Result<Option<tokio::net::TcpListener>> {
    use anyhow::Context;
    match listen {
        Listen::Off => Ok(None),
        Listen::Addr(a) => {
            Ok(Some(tokio::net::TcpListener::bind(a).await.with_context(
                || format!("cannot bind the console on {a}"),
            )?))
        }
        Listen::Default => match tokio::net::TcpListener::bind(DEFAULT_ADDR).await {
            Ok(l) => Ok(Some(l)),
            Err(e) => {
                tracing::warn!(
                    "the console's port {DEFAULT_ADDR} is taken ({e}): no console; give --listen-console ADDR"
                );
                Ok(None)
            }
        },
    }
}

/// The console's base URL for links: the bound address, or the public
/// host when bound to every interface.
pub fn base_url(bound: SocketAddr, public_addr: &str) -> String {
    let host = if bound.ip().is_unspecified() {
        public_addr
            .rsplit_once(':')
            .map(|(h, _)| h.to_string())
            .unwrap_or_else(byom_wire::hostname)
    } else {
        match bound.ip() {
            std::net::IpAddr::V6(ip) => format!("[{ip}]"),
            ip => ip.to_string(),
        }
    };
    format!("https://{host}:{}", bound.port())
}

type Body = UnsyncBoxBody<Bytes, Infallible>;

fn full(b: impl Into<Bytes>) -> Body {
    Full::new(b.into()).boxed_unsync()
}

/// A response with the headers every console answer carries.
fn respond(status: u16, ctype: &str, body: Body) -> Response<Body> {
    let mut r = Response::new(body);
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let h = r.headers_mut();
    for (k, v) in [
        ("content-type", ctype),
        ("content-security-policy", CSP),
        ("x-content-type-options", "nosniff"),
        ("x-frame-options", "DENY"),
        ("referrer-policy", "same-origin"),
        ("cache-control", "no-store"),
    ] {
        h.insert(k, HeaderValue::from_static_str(v));
    }
    r
}

trait StaticStr {
    fn from_static_str(s: &str) -> HeaderValue;
}

impl StaticStr for HeaderValue {
    /// A header value from text we wrote (never from a request).
    fn from_static_str(s: &str) -> HeaderValue {
        HeaderValue::from_str(s).unwrap_or_else(|_| HeaderValue::from_static(""))
    }
}

fn html(status: u16, page: String) -> Response<Body> {
    respond(status, "text/html; charset=utf-8", full(page))
}

fn see_other(to: &str) -> Response<Body> {
    let mut r = respond(303, "text/plain; charset=utf-8", full(""));
    r.headers_mut()
        .insert("location", HeaderValue::from_static_str(to));
    r
}

fn refused(status: u16, title: &str, why: &str, next: &str) -> Response<Body> {
    html(status, pages::refusal(title, why, next))
}

/// A read-only session's refusal to `act`.
fn read_only(act: &str) -> Response<Body> {
    refused(
        403,
        "Read-only",
        &format!("This session is read-only: it may look, not {act}."),
        "`byom console` without --read-only signs you in to act.",
    )
}

fn not_signed_in(why: &str) -> Response<Body> {
    refused(
        401,
        "Sign in",
        why,
        "Run `byom console` where your admin credentials are: it prints a link that signs you in once, within 5 minutes.",
    )
}

/// The API's refusal as a page.
fn status_page(s: tonic::Status) -> Response<Body> {
    let code = match s.code() {
        tonic::Code::NotFound => 404,
        tonic::Code::PermissionDenied => 403,
        tonic::Code::InvalidArgument | tonic::Code::FailedPrecondition => 409,
        tonic::Code::Unavailable => 503,
        tonic::Code::ResourceExhausted => 429,
        _ => 500,
    };
    refused(
        code,
        "Refused",
        s.message(),
        "Go back to the page and reload it.",
    )
}

/// The session cookie's value, if the request carries one.
fn cookie(req: &Request<hyper::body::Incoming>) -> Option<String> {
    req.headers()
        .get_all("cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == COOKIE)
        .map(|(_, v)| v.to_string())
}

/// Whether a state-changing request comes from a page of this origin:
/// its Origin (else its Referer) names `https://` the host it was sent to.
fn same_origin(req: &Request<hyper::body::Incoming>) -> bool {
    let h = |n: &str| req.headers().get(n).and_then(|v| v.to_str().ok());
    let Some(host) = h("host") else {
        return false;
    };
    let me = format!("https://{host}");
    match (h("origin"), h("referer")) {
        (Some(o), _) => o == me,
        (None, Some(r)) => r == me || r.starts_with(&format!("{me}/")),
        (None, None) => false,
    }
}

/// The value of `name` in a urlencoded form (values we check are hex, so
/// no decoding is needed).
fn form_field<'a>(form: &'a str, name: &str) -> Option<&'a str> {
    form.split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// An object ID from a path: a known prefix, then letters, digits, `_`.
fn object_id<'a>(s: &'a str, prefix: &str) -> Option<&'a str> {
    (s.starts_with(prefix)
        && s.len() <= 64
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'))
    .then_some(s)
}

/// The console's handles.
#[derive(Clone)]
pub struct Console {
    api: Api,
    checker: Arc<crate::admins::Checker>,
    streams: Arc<live::Streams>,
    needs: Arc<needs::Recent>,
}

/// A signed-in request: the session, its cookie and CSRF token.
struct Signed {
    session: Session,
    cookie: String,
    csrf: String,
}

impl Signed {
    fn viewer(&self) -> (String, bool) {
        (self.session.who(), self.session.read_only)
    }
}

impl Console {
    pub fn new(api: Api) -> Console {
        Console {
            api,
            checker: Arc::default(),
            streams: Arc::new(live::Streams::default()),
            needs: Arc::default(),
        }
    }

    /// The live session the request's cookie names, of an admin still
    /// on the admin list; else the page saying why not.
    fn signed_in(
        &self,
        req: &Request<hyper::body::Incoming>,
    ) -> Result<Signed, Box<Response<Body>>> {
        let Some(cookie) = cookie(req) else {
            return Err(Box::new(not_signed_in("You are not signed in.")));
        };
        let now = byom_wire::now_ms();
        // A live stream's request, or a page reloading itself, is the
        // page at work, not the person: it does not hold the session open.
        let automatic = req.uri().path().ends_with("/events")
            || req
                .uri()
                .query()
                .is_some_and(|q| q.split('&').any(|kv| kv == "auto=1"));
        let looked = if automatic {
            sessions::session_untouched(&self.api.store, &cookie, now)
        } else {
            sessions::session(&self.api.store, &cookie, now)
        };
        let session = match looked {
            Ok(Some(s)) => s,
            Ok(None) => {
                return Err(Box::new(not_signed_in(
                    "Your session ended (30 minutes idle, 12 hours at most, or signed out).",
                )))
            }
            Err(e) => {
                return Err(Box::new(refused(
                    503,
                    "Unavailable",
                    &e.to_string(),
                    "Try again.",
                )))
            }
        };
        // Fail closed: an admin list that cannot be read admits no one.
        let admitted = self
            .checker
            .admins(&self.api.store)
            .map_err(|e| e.to_string())
            .and_then(|a| crate::admins::check(&a, &session.admin, &session.spki));
        if let Err(why) = admitted {
            return Err(Box::new(refused(
                403,
                "Refused",
                &why,
                "Ask an admin for access.",
            )));
        }
        Ok(Signed {
            csrf: sessions::csrf(&cookie),
            session,
            cookie,
        })
    }

    /// Whether the session whose secret is `cookie` still stands, its
    /// admin still admitted (a store that cannot say: no).
    fn still_signed_in(&self, cookie: &str) -> bool {
        let Ok(Some(s)) = sessions::session_untouched(&self.api.store, cookie, byom_wire::now_ms())
        else {
            return false;
        };
        self.checker
            .admins(&self.api.store)
            .map_err(|e| e.to_string())
            .and_then(|a| crate::admins::check(&a, &s.admin, &s.spki))
            .is_ok()
    }

    /// `r` (a live stream), ended as soon as its session is: checked every
    /// [`SESSION_RECHECK`], so a stream opened before a sign-out or a
    /// revocation does not go on sending what follows.
    fn while_signed_in(&self, cookie: String, r: Response<Body>) -> Response<Body> {
        use futures_util::StreamExt;
        if !r.status().is_success() {
            return r;
        }
        let me = self.clone();
        let ended = async move {
            loop {
                tokio::time::sleep(SESSION_RECHECK).await;
                if !me.still_signed_in(&cookie) {
                    break;
                }
            }
        };
        let (parts, body) = r.into_parts();
        let frames = http_body_util::BodyStream::new(body).take_until(ended);
        Response::from_parts(
            parts,
            http_body_util::StreamBody::new(frames).boxed_unsync(),
        )
    }

    /// Answers one request.
    async fn handle(&self, req: Request<hyper::body::Incoming>) -> Response<Body> {
        let path = req.uri().path().to_string();
        let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        let method = req.method().clone();
        match (&method, parts.as_slice()) {
            (&Method::GET, ["console.css"]) => respond(200, "text/css; charset=utf-8", full(CSS)),
            (&Method::GET, ["console.js"]) => {
                respond(200, "text/javascript; charset=utf-8", full(JS))
            }
            (&Method::GET, ["login", secret]) => self.login(secret),
            (&Method::GET, ["signed-out"]) => refused(
                200,
                "Signed out",
                "You are signed out.",
                "`byom console` signs you in again.",
            ),
            (&Method::GET | &Method::HEAD, _) => self.get(req, &parts).await,
            (&Method::POST, _) => self.post(req, &parts).await,
            _ => refused(
                405,
                "Not allowed",
                "The console answers GET and POST only.",
                "",
            ),
        }
    }

    /// `GET /login/SECRET`: spends the link, sets the cookie, goes home.
    fn login(&self, secret: &str) -> Response<Body> {
        match sessions::redeem(&self.api.store, secret, byom_wire::now_ms()) {
            Ok((cookie, s)) => {
                tracing::info!(admin = %s.who(), read_only = s.read_only, "console sign-in");
                let mut r = see_other("/");
                let c = format!(
                    "{COOKIE}={cookie}; Path=/; HttpOnly; Secure; SameSite=Strict; Max-Age={}",
                    sessions::MAX_AGE.as_secs()
                );
                r.headers_mut()
                    .insert("set-cookie", HeaderValue::from_static_str(&c));
                r
            }
            Err(sessions::LoginError::Store(e)) => {
                refused(503, "Unavailable", &e.to_string(), "Try the link again.")
            }
            Err(e) => refused(
                403,
                "Link refused",
                &e.to_string(),
                "Run `byom console` for a new link.",
            ),
        }
    }

    async fn get(&self, req: Request<hyper::body::Incoming>, parts: &[&str]) -> Response<Body> {
        let s = match self.signed_in(&req) {
            Ok(s) => s,
            Err(r) => return *r,
        };
        let (who, read_only) = s.viewer();
        let v = Viewer {
            who: &who,
            read_only,
            csrf: &s.csrf,
        };
        let now = byom_wire::now_ms();
        let r = match parts {
            [""] => self.home(&v, req.uri().query().unwrap_or(""), now),
            ["machines"] => self.machines(&v, now),
            ["commands"] => self.commands(&v, now),
            ["commands", id] => match object_id(id, "cmd_") {
                Some(id) => self.command(&v, id, now),
                None => Err(tonic::Status::not_found(format!("no command {id}"))),
            },
            ["tasks"] => self.tasks(&v, now),
            ["audit"] => self.audit(&v, req.uri().query().unwrap_or(""), now),
            ["connectors"] => self.connectors(&v, req.uri().query().unwrap_or(""), now),
            ["trust"] => self.trust(&v),
            ["threads"] => self.threads(&v, now),
            ["threads", id] => match object_id(id, "thr_") {
                Some(id) => self.thread(&v, id, now),
                None => Err(tonic::Status::not_found(format!("no thread {id}"))),
            },
            ["workers", id] => match object_id(id, "wrk_") {
                Some(id) => self.worker(&v, id, req.uri().query().unwrap_or(""), now),
                None => Err(tonic::Status::not_found(format!("no worker {id}"))),
            },
            ["needs-you", "events"] => {
                let r = self.needs_events(&req, &s.csrf);
                return self.while_signed_in(s.cookie, r);
            }
            ["commands", id, "events"] => {
                let Some(id) = object_id(id, "cmd_") else {
                    return status_page(tonic::Status::not_found(format!("no command {id}")));
                };
                let r = self.streams.events(&self.api, &req, id, &s.csrf);
                return self.while_signed_in(s.cookie, r);
            }
            _ => Err(tonic::Status::not_found(format!(
                "no page {}",
                req.uri().path()
            ))),
        };
        match r {
            Ok(page) => html(200, page),
            Err(e) => status_page(e),
        }
    }

    async fn post(&self, req: Request<hyper::body::Incoming>, parts: &[&str]) -> Response<Body> {
        let s = match self.signed_in(&req) {
            Ok(s) => s,
            Err(r) => return *r,
        };
        if !same_origin(&req) {
            return refused(
                403,
                "Refused",
                "This request did not come from a console page (its Origin or Referer is another site's, or missing).",
                "Use the buttons on the console's own pages.",
            );
        }
        let parts: Vec<String> = parts.iter().map(|p| p.to_string()).collect();
        let form = match read_form(req).await {
            Ok(f) => f,
            Err(r) => return *r,
        };
        if !form_field(&form, "csrf").is_some_and(|t| sessions::csrf_ok(&s.cookie, t)) {
            return refused(
                403,
                "Refused",
                "This form's CSRF token is missing or not this session's.",
                "Reload the page and try again.",
            );
        }
        let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
        match parts.as_slice() {
            ["logout"] => {
                if let Err(e) = sessions::end(&self.api.store, &s.cookie) {
                    return refused(503, "Unavailable", &e.to_string(), "Try again.");
                }
                let mut r = see_other("/signed-out");
                let c = format!("{COOKIE}=; Path=/; HttpOnly; Secure; SameSite=Strict; Max-Age=0");
                r.headers_mut()
                    .insert("set-cookie", HeaderValue::from_static_str(&c));
                r
            }
            ["approvals", id, verb @ ("approve" | "deny")] => {
                let Some(id) = object_id(id, "apr_") else {
                    return status_page(tonic::Status::not_found(format!("no approval {id}")));
                };
                if s.session.read_only {
                    return read_only("approve or deny");
                }
                let approved = *verb == "approve";
                let who = s.session.who();
                let req = pb::AnswerApprovalRequest {
                    id: id.to_string(),
                    approved,
                    ..Default::default()
                };
                match self.api.answer(req, &who).await {
                    Ok(_) => {
                        tracing::info!(approval = id, approved, by = %who, "answered in the console");
                        see_other(&format!("/?answered={id}&approved={}", u8::from(approved)))
                    }
                    Err(e) => status_page(e),
                }
            }
            ["workers", id, "cancel"] => {
                let Some(id) = object_id(id, "wrk_") else {
                    return status_page(tonic::Status::not_found(format!("no worker {id}")));
                };
                if s.session.read_only {
                    return read_only("cancel");
                }
                match self.cancel(id, &s.session.who()).await {
                    Ok(to) => see_other(&to),
                    Err(e) => status_page(e),
                }
            }
            ["outbox", id, "retry"] => {
                let Some(id) = object_id(id, "out_") else {
                    return status_page(tonic::Status::not_found(format!("no outbox item {id}")));
                };
                if s.session.read_only {
                    return read_only("retry");
                }
                match self.retry(id, &s.session.who()).await {
                    Ok(to) => see_other(&to),
                    Err(e) => status_page(e),
                }
            }
            _ => refused(404, "Not found", "No such action.", ""),
        }
    }

    fn machines(&self, v: &Viewer, now: u64) -> Result<String, tonic::Status> {
        let r = self.api.list_machines(pb::ListMachinesRequest::default())?;
        Ok(pages::machines(v, &r.machines, &r.shipped_version, now))
    }

    fn machine_names(&self) -> Result<std::collections::HashMap<String, String>, tonic::Status> {
        Ok(self
            .api
            .list_machines(pb::ListMachinesRequest {
                include_revoked: true,
            })?
            .machines
            .into_iter()
            .map(|m| (m.id, m.name))
            .collect())
    }

    fn commands(&self, v: &Viewer, now: u64) -> Result<String, tonic::Status> {
        let cs = self
            .api
            .list_commands(pb::ListCommandsRequest {
                limit: COMMAND_ROWS,
                ..Default::default()
            })?
            .commands;
        Ok(pages::commands(v, &cs, &self.machine_names()?, now))
    }

    fn command(&self, v: &Viewer, id: &str, now: u64) -> Result<String, tonic::Status> {
        let c = self.api.command(id)?;
        let names = self.machine_names()?;
        let machine = names.get(&c.machine_id).unwrap_or(&c.machine_id);
        let mut out: [(String, u64); 2] = Default::default();
        for (i, stream) in [pb::OutputStream::Stdout, pb::OutputStream::Stderr]
            .into_iter()
            .enumerate()
        {
            let chunks = self
                .api
                .store
                .read_output(id, stream as i32, 0, PAGE_OUTPUT_BYTES)
                .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
            let mut bytes = Vec::new();
            for (off, data) in chunks {
                out[i].1 = off + data.len() as u64;
                bytes.extend_from_slice(&data);
            }
            out[i].0 = String::from_utf8_lossy(&bytes).into_owned();
        }
        Ok(pages::command(v, &c, machine, out, now))
    }

    /// Serves one connection (TLS done), its ticket held while it lives.
    async fn serve_conn<I>(&self, io: I, ticket: Arc<crate::gate::Ticket>)
    where
        I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let me = self.clone();
        let t = ticket.clone();
        let svc = hyper::service::service_fn(move |req| {
            let me = me.clone();
            let t = t.clone();
            async move {
                let resp = me.handle(req).await;
                // A person once signed in: no longer a stranger the gate
                // evicts first.
                if resp.status().is_success() {
                    t.established();
                }
                Ok::<_, Infallible>(resp)
            }
        });
        let conn = hyper::server::conn::http1::Builder::new()
            .timer(hyper_util::rt::TokioTimer::new())
            .header_read_timeout(HEADER_TIMEOUT)
            .max_headers(MAX_HEADERS)
            .max_buf_size(MAX_HEAD_BYTES)
            .serve_connection(TokioIo::new(io), svc);
        tokio::select! {
            _ = tokio::time::timeout(CONNECTION_TIMEOUT, conn) => {}
            _ = ticket.evicted() => {}
        }
    }

    /// Serves the console over TLS on `listener` until shutdown.
    pub async fn serve(
        self,
        listener: tokio::net::TcpListener,
        tls: rustls::ServerConfig,
        shutdown: CancellationToken,
    ) {
        let gate = crate::gate::Gate::new(
            "console",
            "console connections",
            MAX_CONNECTIONS,
            MAX_CONNECTIONS_PER_ADDRESS,
        );
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
        while let Some((tcp, remote, ticket)) =
            crate::gate::accept(&listener, &gate, &shutdown).await
        {
            let me = self.clone();
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let ticket = Arc::new(ticket);
                let tls = match ticket.within(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                    Some(Ok(t)) => t,
                    Some(Err(e)) => {
                        tracing::debug!(%remote, "console handshake failed: {e}");
                        return;
                    }
                    None => return,
                };
                me.serve_conn(tls, ticket).await;
            });
        }
    }
}

/// A POST's form body, bounded in bytes and time.
async fn read_form(req: Request<hyper::body::Incoming>) -> Result<String, Box<Response<Body>>> {
    let body = http_body_util::Limited::new(req.into_body(), MAX_FORM_BYTES).collect();
    match tokio::time::timeout(BODY_TIMEOUT, body).await {
        Ok(Ok(b)) => Ok(String::from_utf8_lossy(&b.to_bytes()).into_owned()),
        Ok(Err(_)) => Err(Box::new(refused(
            413,
            "Too large",
            &format!("A console form is at most {MAX_FORM_BYTES} bytes."),
            "",
        ))),
        Err(_) => Err(Box::new(refused(
            408,
            "Too slow",
            &format!(
                "The form did not arrive within {} s.",
                BODY_TIMEOUT.as_secs()
            ),
            "",
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn form_fields_and_ids() {
        assert_eq!(form_field("a=1&csrf=ab&c=", "csrf"), Some("ab"));
        assert_eq!(form_field("csrfx=1", "csrf"), None);
        assert_eq!(object_id("apr_01ABz", "apr_"), Some("apr_01ABz"));
        assert_eq!(object_id("apr_../x", "apr_"), None);
        assert_eq!(object_id("cmd_1", "apr_"), None);
        assert_eq!(
            base_url("127.0.0.1:7446".parse().unwrap(), "h:7443"),
            "https://127.0.0.1:7446"
        );
        assert_eq!(
            base_url("0.0.0.0:7446".parse().unwrap(), "byom.example.com:7443"),
            "https://byom.example.com:7446"
        );
        assert_eq!("off".parse::<Listen>(), Ok(Listen::Off));
        assert!("nowhere".parse::<Listen>().is_err());
    }
}
