//! **Needs you**, the console's home: approvals waiting, workers stalled,
//! failing or over budget ([`super::timeline::attention`]), machines away
//! with queued work and replies that failed to send. The page follows
//! changes live: a stream ([`super::live::Streams::changes`]) compares
//! the page's digest (what it lists, by ID and state) with the store's
//! every few seconds and tells the page to reload when it moved. The
//! digest is worked out once per interval however many pages watch
//! ([`Recent`]).

use std::sync::{Arc, Mutex};
use std::time::Instant;

use byom_agent::state::WorkerStatus;
use byom_protocol::pb;
use tonic::Status;

use super::pages::{self, Viewer};
use super::{form_field, live, object_id, timeline, Console};

/// Failed replies shown.
const OUTBOX_ROWS: u32 = 50;

/// What Needs you lists.
pub struct NeedsData {
    pub approvals: Vec<pb::Approval>,
    pub workers: Vec<(pb::Worker, String)>,
    /// Machines not online that hold queued commands.
    pub machines: Vec<pb::Machine>,
    pub failed: Vec<pb::OutboxItem>,
}

impl NeedsData {
    /// What the page lists, by ID and state, hashed: equal digests, the
    /// same page (but for times).
    pub fn digest(&self) -> String {
        let mut s = String::new();
        for a in &self.approvals {
            s.push_str(&format!("a {} {}\n", a.id, a.state));
        }
        for (w, _) in &self.workers {
            if let Some(x) = &w.summary {
                s.push_str(&format!("w {} {}\n", x.id, x.status));
            }
        }
        for m in &self.machines {
            s.push_str(&format!("m {} {}\n", m.id, m.queued_commands));
        }
        for o in &self.failed {
            s.push_str(&format!("o {}\n", o.id));
        }
        byom_wire::hex(&byom_wire::sha256(s.as_bytes())[..16])
    }
}

/// The digest last worked out, and when: every change stream shares it.
#[derive(Default)]
pub struct Recent {
    last: Mutex<Option<(Instant, Option<String>)>>,
}

impl Console {
    pub(super) fn needs_data(&self, now: u64) -> Result<NeedsData, Status> {
        let approvals = self.api.list_approvals(false)?.approvals;
        let machines = self
            .api
            .list_machines(pb::ListMachinesRequest::default())?
            .machines
            .into_iter()
            .filter(|m| !m.revoked && !m.online && m.queued_commands > 0)
            .collect();
        let failed = self
            .api
            .channels
            .list_outbox(true, OUTBOX_ROWS)
            .map_err(|e| Status::unavailable(e.to_string()))?;
        let since = now.saturating_sub(timeline::OVER_BUDGET_SHOWN_MS);
        let workers = self
            .api
            .workers_where(|w| {
                w.status == WorkerStatus::Running
                    || (w.status == WorkerStatus::Failed && w.updated_ms >= since)
            })?
            .into_iter()
            .filter_map(|w| timeline::attention(&w, now).map(|why| (w, why)))
            .collect();
        Ok(NeedsData {
            approvals,
            workers,
            machines,
            failed,
        })
    }

    pub(super) fn home(&self, v: &Viewer, query: &str, now: u64) -> Result<String, Status> {
        let d = self.needs_data(now)?;
        let note = form_field(query, "answered")
            .and_then(|id| object_id(id, "apr_"))
            .map(|id| {
                if form_field(query, "approved") == Some("1") {
                    format!("Approved {id}: the work goes on.")
                } else {
                    format!("Denied {id}.")
                }
            });
        let n = pages::NeedsYou {
            approvals: &d.approvals,
            workers: &d.workers,
            waiting_machines: d.machines.iter().collect(),
            failed_outbox: &d.failed,
            note,
            digest: d.digest(),
        };
        Ok(pages::home(v, &n, now))
    }

    /// The current digest, worked out at most once per
    /// [`live::CHANGES_EVERY`] for all streams; `None` if the store
    /// cannot say.
    fn needs_digest(&self) -> Option<String> {
        let mut last = self.needs.last.lock().ok()?;
        if let Some((at, d)) = &*last {
            if at.elapsed() < live::CHANGES_EVERY {
                return d.clone();
            }
        }
        let d = self
            .needs_data(byom_wire::now_ms())
            .ok()
            .map(|d| d.digest());
        *last = Some((Instant::now(), d.clone()));
        d
    }

    /// `GET /needs-you/events`.
    pub(super) fn needs_events(
        &self,
        req: &hyper::Request<hyper::body::Incoming>,
        session: &str,
    ) -> hyper::Response<super::Body> {
        let me = Arc::new(self.clone());
        self.streams
            .changes(req, session, move || me.needs_digest())
    }
}
