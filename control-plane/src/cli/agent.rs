//! The agents' and channels' calls as the CLI makes them: typed requests
//! to the services by area, answers shown through [`super::views`] as the
//! JSON scripts read. Every call is sent again while the server is away
//! (a restart); the two that change something (cancel, answer) carry an
//! idempotency key, so a retry cannot act twice.

use byom_api::Client;
use byom_protocol::pb;
use serde_json::Value;

use super::views;

/// Runs `call` with a clone of the client until the server answers.
macro_rules! call {
    ($c:expr, $svc:ident, $method:ident, $req:expr) => {{
        let req = $req;
        byom_api::until_answered(|| {
            let (mut s, req) = ($c.$svc(), req.clone());
            async move { s.$method(req).await }
        })
        .await
        .map(tonic::Response::into_inner)
    }};
}

/// Tasks (top-level workers), or every worker with `subagents`.
pub async fn workers(c: &Client, subagents: bool) -> anyhow::Result<Value> {
    let r = call!(c, tasks, list_workers, pb::ListWorkersRequest { subagents })?;
    Ok(views::summaries(&r.workers))
}

pub async fn worker(c: &Client, id: &str) -> anyhow::Result<Value> {
    let r = call!(c, tasks, get_worker, pb::WorkerRef { id: id.into() })?;
    Ok(views::worker(&r))
}

pub async fn cancel(c: &Client, id: &str) -> anyhow::Result<()> {
    call!(
        c,
        tasks,
        cancel_task,
        pb::CancelTaskRequest {
            id: id.into(),
            idempotency_key: byom_api::new_key(),
        }
    )?;
    Ok(())
}

pub async fn threads(c: &Client) -> anyhow::Result<Value> {
    let r = call!(c, tasks, list_threads, pb::ListThreadsRequest {})?;
    Ok(views::threads(&r))
}

/// A thread by `thr_…` ID or by the channel's own name for it.
pub async fn thread(c: &Client, id: &str) -> anyhow::Result<Value> {
    let r = call!(c, tasks, get_thread, pb::ThreadRef { id: id.into() })?;
    Ok(views::thread(&r))
}

pub async fn router(c: &Client) -> anyhow::Result<Value> {
    let r = call!(c, tasks, get_router, pb::GetRouterRequest {})?;
    Ok(views::router(&r))
}

pub async fn fate(c: &Client, trigger: &str) -> anyhow::Result<Value> {
    let r = call!(
        c,
        tasks,
        get_fate,
        pb::FateRequest {
            trigger: trigger.into()
        }
    )?;
    Ok(views::fate(&r))
}

/// Open approvals, or all of them.
pub async fn approvals(c: &Client, all: bool) -> anyhow::Result<Value> {
    let r = call!(
        c,
        approvals,
        list_approvals,
        pb::ListApprovalsRequest { all }
    )?;
    Ok(Value::Array(
        r.approvals.iter().map(views::approval).collect(),
    ))
}

/// Answers an approval; `answer` is what the program receives.
pub async fn answer(c: &Client, id: &str, approved: bool, answer: &Value) -> anyhow::Result<()> {
    call!(
        c,
        approvals,
        answer_approval,
        pb::AnswerApprovalRequest {
            id: id.into(),
            approved,
            answer_json: answer.to_string(),
            idempotency_key: byom_api::new_key(),
        }
    )?;
    Ok(())
}

pub async fn trust(c: &Client) -> anyhow::Result<Value> {
    let r = call!(c, trust, get_trust, pb::GetTrustRequest {})?;
    Ok(views::trust(&r))
}

/// Replaces the trust configuration with `v` (its JSON).
pub async fn set_trust(c: &Client, v: &Value) -> anyhow::Result<Value> {
    let t = views::trust_from(v)?;
    let r = call!(c, trust, set_trust, t)?;
    Ok(views::trust(&r))
}

pub async fn check_trust(
    c: &Client,
    principal: &str,
    association: &str,
    label: &str,
) -> anyhow::Result<Value> {
    let r = call!(
        c,
        trust,
        check_trust,
        pb::CheckTrustRequest {
            principal: principal.into(),
            association: association.into(),
            label: label.into(),
        }
    )?;
    Ok(views::verdict(&r))
}

pub async fn admins(c: &Client) -> anyhow::Result<Value> {
    let r = call!(c, admins, list_admins, pb::ListAdminsRequest {})?;
    Ok(Value::Array(
        r.admins.iter().map(views::admin_row).collect(),
    ))
}

/// Signs `csr_pem` as admin `name`: the certificate and the CA.
pub async fn add_admin(
    c: &Client,
    name: &str,
    csr_pem: &str,
) -> anyhow::Result<pb::AddAdminResponse> {
    Ok(call!(
        c,
        admins,
        add_admin,
        pb::AddAdminRequest {
            name: name.into(),
            csr_pem: csr_pem.into(),
        }
    )?)
}

pub async fn revoke_admin(c: &Client, name: &str) -> anyhow::Result<Value> {
    let r = call!(c, admins, revoke_admin, pb::AdminRef { name: name.into() })?;
    Ok(views::admin(&r))
}

/// Adds a connector (the same add again answers with the first).
pub async fn add_connector(c: &Client, conn: pb::Connector) -> anyhow::Result<Value> {
    let r = call!(c, connectors, add_connector, conn)?;
    Ok(views::connector(&r))
}

pub async fn connectors(c: &Client) -> anyhow::Result<Value> {
    let r = call!(c, connectors, list_connectors, pb::ListConnectorsRequest {})?;
    Ok(r.connectors.iter().map(views::connector).collect())
}

pub async fn connector(c: &Client, name: &str) -> anyhow::Result<Value> {
    let r = call!(
        c,
        connectors,
        get_connector,
        pb::ConnectorRef { name: name.into() }
    )?;
    Ok(views::connector(&r))
}

pub async fn remove_connector(c: &Client, name: &str) -> anyhow::Result<Value> {
    let r = call!(
        c,
        connectors,
        remove_connector,
        pb::ConnectorRef { name: name.into() }
    )?;
    Ok(views::connector(&r))
}

pub async fn test_connector(c: &Client, name: &str) -> anyhow::Result<Value> {
    let r = call!(
        c,
        connectors,
        test_connector,
        pb::ConnectorRef { name: name.into() }
    )?;
    Ok(views::connector_test(&r))
}

pub async fn outbox(c: &Client, failed: bool, limit: u32) -> anyhow::Result<Value> {
    let r = call!(
        c,
        outbox,
        list_outbox,
        pb::ListOutboxRequest { failed, limit }
    )?;
    Ok(r.items.iter().map(views::outbox).collect())
}

pub async fn outbox_item(c: &Client, id: &str) -> anyhow::Result<Value> {
    let r = call!(c, outbox, get_outbox, pb::OutboxRef { id: id.into() })?;
    Ok(views::outbox(&r))
}

pub async fn retry_outbox(c: &Client, id: &str) -> anyhow::Result<Value> {
    let r = call!(c, outbox, retry_outbox, pb::OutboxRef { id: id.into() })?;
    Ok(views::outbox(&r))
}

pub async fn sources(c: &Client) -> anyhow::Result<Value> {
    let r = call!(c, sources, get_sources, pb::GetSourcesRequest {})?;
    Ok(views::sources(&r))
}

pub async fn set_sources(c: &Client, rules: &str) -> anyhow::Result<Value> {
    let r = call!(
        c,
        sources,
        set_sources,
        pb::SourcesText {
            rules: rules.into()
        }
    )?;
    Ok(views::sources(&r))
}

pub async fn check_sources(c: &Client, rules: &str) -> anyhow::Result<Value> {
    let r = call!(
        c,
        sources,
        check_sources,
        pb::SourcesText {
            rules: rules.into()
        }
    )?;
    Ok(views::sources_check(&r))
}

pub fn s<'a>(v: &'a Value, k: &str) -> &'a str {
    v.get(k).and_then(Value::as_str).unwrap_or("")
}
