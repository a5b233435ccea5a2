//! A command's output, live, as server-sent events (`text/event-stream`):
//! the API's own watch (store first, then live notices, here or on
//! another replica) from the offsets the page already shows, or from the
//! `Last-Event-ID` a reconnecting browser sends. Each event's ID is the
//! two offsets reached (`STDOUT-STDERR`), so a cut stream resumes where
//! it stopped and nothing is shown twice. Output bytes travel base64 (a
//! chunk may end inside a UTF-8 character; the page's decoder joins
//! them). Streams are bounded per session ([`MAX_STREAMS_PER_SESSION`])
//! and in total ([`MAX_STREAMS`]); one more is refused with 429.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use byom_protocol::pb;
use bytes::Bytes;
use futures_util::StreamExt;
use http_body_util::BodyExt;
use hyper::body::Frame;
use hyper::{Request, Response};

use super::{refused, respond, status_page, Body};
use crate::admin::Api;

/// How often a page's change stream asks whether the page changed.
pub const CHANGES_EVERY: Duration = Duration::from_secs(2);
/// A change stream writes a comment at least this often, so a browser
/// that went away is noticed (on the write) and its place given back.
const KEEPALIVE: Duration = Duration::from_secs(15);
/// Longest digest a change stream resumes from.
const MAX_DIGEST: usize = 64;

/// Live streams one session may hold open at once.
pub const MAX_STREAMS_PER_SESSION: usize = 8;
/// Live streams the console holds open at once.
pub const MAX_STREAMS: usize = 256;

/// Open streams, per session (keyed by its CSRF token, which names it).
#[derive(Debug, Default)]
pub struct Streams {
    open: Mutex<(usize, HashMap<String, usize>)>,
}

/// One open stream's place; given back when the stream ends.
#[derive(Debug)]
struct Place {
    streams: Arc<Streams>,
    session: String,
}

impl Drop for Place {
    fn drop(&mut self) {
        if let Ok(mut o) = self.streams.open.lock() {
            o.0 = o.0.saturating_sub(1);
            if let Some(n) = o.1.get_mut(&self.session) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    o.1.remove(&self.session);
                }
            }
        }
    }
}

impl Streams {
    fn take(self: &Arc<Self>, session: &str) -> Result<Place, String> {
        let mut o = self.open.lock().map_err(|_| "poisoned".to_string())?;
        if o.0 >= MAX_STREAMS {
            return Err(format!(
                "the console holds {MAX_STREAMS} live streams already"
            ));
        }
        let mine = o.1.entry(session.to_string()).or_default();
        if *mine >= MAX_STREAMS_PER_SESSION {
            return Err(format!(
                "this session holds {MAX_STREAMS_PER_SESSION} live streams already: close a command page"
            ));
        }
        *mine += 1;
        o.0 += 1;
        Ok(Place {
            streams: self.clone(),
            session: session.to_string(),
        })
    }

    /// `GET /commands/ID/events`.
    pub fn events(
        self: &Arc<Self>,
        api: &Api,
        req: &Request<hyper::body::Incoming>,
        id: &str,
        session: &str,
    ) -> Response<Body> {
        let offsets = resume_from(req);
        let place = match self.take(session) {
            Ok(p) => p,
            Err(why) => return refused(429, "Too many live streams", &why, ""),
        };
        let watch = api.watch_command(pb::WatchCommandRequest {
            id: id.to_string(),
            stdout_offset: offsets[0],
            stderr_offset: offsets[1],
        });
        let events = match watch {
            Ok(w) => w,
            Err(e) => return status_page(e),
        };
        let mut at = offsets;
        let frames = events.map(move |ev| {
            let _held = &place;
            let text = match ev {
                Ok(ev) => event(&mut at, ev),
                Err(e) => format!(
                    "event: failed\ndata: {}\n\n",
                    serde_json::json!({ "error": e.message() })
                ),
            };
            Ok::<_, std::convert::Infallible>(Frame::data(Bytes::from(text)))
        });
        // A comment first, so the browser sees the stream open at once.
        let opening = futures_util::stream::once(async {
            Ok::<_, std::convert::Infallible>(Frame::data(Bytes::from_static(b": live\n\n")))
        });
        let body = BodyExt::boxed_unsync(http_body_util::StreamBody::new(opening.chain(frames)));
        respond(200, "text/event-stream", body)
    }
}

impl Streams {
    /// `GET /needs-you/events`: an event `changed` (its ID the page's new
    /// digest) whenever `digest` differs from the one the page was
    /// rendered with (`?since=`, or `Last-Event-ID` on a reconnect);
    /// the page reloads itself. Asked every [`CHANGES_EVERY`]; `digest`
    /// answers `None` when it cannot tell (nothing is sent then).
    pub fn changes<F>(
        self: &Arc<Self>,
        req: &Request<hyper::body::Incoming>,
        session: &str,
        digest: F,
    ) -> Response<Body>
    where
        F: Fn() -> Option<String> + Send + Sync + 'static,
    {
        // The digest reads the store (blocking I/O, growing with what is
        // stored): on the blocking pool, never on the threads that serve
        // the API, the daemons and the webhooks.
        let digest = Arc::new(digest);
        let valid = |d: &str| d.len() <= MAX_DIGEST && d.bytes().all(|b| b.is_ascii_hexdigit());
        let since = req
            .headers()
            .get("last-event-id")
            .and_then(|v| v.to_str().ok())
            .or_else(|| super::form_field(req.uri().query().unwrap_or(""), "since"))
            .filter(|d| valid(d))
            .unwrap_or("")
            .to_string();
        let place = match self.take(session) {
            Ok(p) => p,
            Err(why) => return refused(429, "Too many live streams", &why, ""),
        };
        let frames = futures_util::stream::unfold(
            (since, place, digest),
            |(mut since, place, digest)| async move {
                let mut quiet = Duration::ZERO;
                let text = loop {
                    tokio::time::sleep(CHANGES_EVERY).await;
                    quiet += CHANGES_EVERY;
                    let d = digest.clone();
                    match tokio::task::spawn_blocking(move || d())
                        .await
                        .ok()
                        .flatten()
                    {
                        Some(d) if d != since => {
                            let t = format!("id: {d}\nevent: changed\ndata: {{}}\n\n");
                            since = d;
                            break t;
                        }
                        _ if quiet >= KEEPALIVE => break ": still here\n\n".to_string(),
                        _ => {}
                    }
                };
                let frame = Ok::<_, std::convert::Infallible>(Frame::data(Bytes::from(text)));
                Some((frame, (since, place, digest)))
            },
        );
        let opening = futures_util::stream::once(async {
            Ok::<_, std::convert::Infallible>(Frame::data(Bytes::from_static(b": live\n\n")))
        });
        let body = BodyExt::boxed_unsync(http_body_util::StreamBody::new(opening.chain(frames)));
        respond(200, "text/event-stream", body)
    }
}

/// The offsets to start from: `Last-Event-ID` (`STDOUT-STDERR`) if the
/// browser resumes, else the page's `?stdout=N&stderr=M`, else 0.
fn resume_from(req: &Request<hyper::body::Incoming>) -> [u64; 2] {
    if let Some(id) = req
        .headers()
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
    {
        if let Some((a, b)) = id.split_once('-') {
            if let (Ok(a), Ok(b)) = (a.parse(), b.parse()) {
                return [a, b];
            }
        }
    }
    let q = req.uri().query().unwrap_or("");
    let field = |n: &str| {
        super::form_field(q, n)
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    [field("stdout"), field("stderr")]
}

/// One API event as an SSE event; `at`: the offsets reached.
fn event(at: &mut [u64; 2], ev: pb::CommandEvent) -> String {
    match ev.event {
        Some(pb::command_event::Event::Output(o)) => {
            let stderr = o.stream == pb::OutputStream::Stderr as i32;
            let i = usize::from(stderr);
            at[i] = at[i].max(o.offset + o.data.len() as u64);
            let data = serde_json::json!({
                "stream": if stderr { "stderr" } else { "stdout" },
                "b64": base64::engine::general_purpose::STANDARD.encode(&o.data),
            });
            format!("id: {}-{}\nevent: output\ndata: {data}\n\n", at[0], at[1])
        }
        Some(pb::command_event::Event::State(c)) => {
            let data = serde_json::json!({
                "state": c.state().name(),
                "terminal": c.state().is_terminal(),
                "exit": c.exit_code,
                "signal": c.signal,
                "reason": c.reason,
            });
            format!("id: {}-{}\nevent: state\ndata: {data}\n\n", at[0], at[1])
        }
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_bounded_per_session_and_in_total() {
        let s = Arc::new(Streams::default());
        let mine: Vec<_> = (0..MAX_STREAMS_PER_SESSION)
            .map(|_| s.take("a").unwrap())
            .collect();
        assert!(s.take("a").unwrap_err().contains("this session"));
        drop(mine);
        let all: Vec<_> = (0..MAX_STREAMS)
            .map(|i| {
                s.take(&format!("s{}", i / MAX_STREAMS_PER_SESSION))
                    .unwrap()
            })
            .collect();
        assert!(s.take("new").unwrap_err().contains("the console holds"));
        drop(all);
        assert!(s.take("new").is_ok());
        assert_eq!(s.open.lock().unwrap().0, 0);
    }

    #[test]
    fn events_carry_the_offsets_reached() {
        let mut at = [3, 0];
        let e = event(
            &mut at,
            pb::CommandEvent {
                event: Some(pb::command_event::Event::Output(pb::Output {
                    stream: pb::OutputStream::Stdout as i32,
                    offset: 3,
                    data: b"hi\n".to_vec(),
                })),
            },
        );
        assert!(e.starts_with("id: 6-0\nevent: output\ndata: "), "{e}");
        assert!(e.ends_with("\n\n"));
        assert_eq!(at, [6, 0]);
    }
}
