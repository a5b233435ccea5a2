//! The API's services by area (admin.proto): each generated trait is
//! implemented here by delegation to the resource modules, so this file
//! is the one map from RPC to code.

use byom_api::proto::admins_server::Admins;
use byom_api::proto::approvals_server::Approvals;
use byom_api::proto::connectors_server::Connectors;
use byom_api::proto::outbox_server::Outbox;
use byom_api::proto::sources_server::Sources;
use byom_api::proto::tasks_server::Tasks;
use byom_api::proto::trust_server::Trust;
use byom_protocol::pb;
use tonic::{Request, Response, Status};

use super::{caller, Api};
use crate::channels::admin::OpError;

type Reply<T> = Result<Response<T>, Status>;

fn op_err(e: OpError) -> Status {
    match e {
        OpError::Invalid(m) => Status::invalid_argument(m),
        OpError::NotFound(m) => Status::not_found(m),
        OpError::Exists(m) => Status::already_exists(m),
        OpError::Unavailable(m) => Status::unavailable(m),
    }
}

fn ok<T>(r: Result<T, Status>) -> Reply<T> {
    r.map(Response::new)
}

fn ch<T>(r: Result<T, OpError>) -> Reply<T> {
    r.map(Response::new).map_err(op_err)
}

#[tonic::async_trait]
impl Tasks for Api {
    async fn list_workers(&self, req: Request<pb::ListWorkersRequest>) -> Reply<pb::WorkerList> {
        ok(Api::list_workers(self, req.into_inner().subagents))
    }
    async fn get_worker(&self, req: Request<pb::WorkerRef>) -> Reply<pb::Worker> {
        ok(self.worker(&req.into_inner().id))
    }
    async fn cancel_task(
        &self,
        req: Request<pb::CancelTaskRequest>,
    ) -> Reply<pb::CancelTaskResponse> {
        let by = caller(&req);
        ok(Api::cancel_task(self, req.into_inner(), &by).await)
    }
    async fn list_threads(&self, _: Request<pb::ListThreadsRequest>) -> Reply<pb::ThreadList> {
        ok(self.threads())
    }
    async fn get_thread(&self, req: Request<pb::ThreadRef>) -> Reply<pb::ThreadView> {
        ok(self.thread(&req.into_inner().id))
    }
    async fn get_router(&self, _: Request<pb::GetRouterRequest>) -> Reply<pb::RouterView> {
        ok(self.router())
    }
    async fn get_fate(&self, req: Request<pb::FateRequest>) -> Reply<pb::Fate> {
        ok(self.fate(&req.into_inner().trigger))
    }
}

#[tonic::async_trait]
impl Approvals for Api {
    async fn list_approvals(
        &self,
        req: Request<pb::ListApprovalsRequest>,
    ) -> Reply<pb::ApprovalList> {
        ok(Api::list_approvals(self, req.into_inner().all))
    }
    async fn answer_approval(
        &self,
        req: Request<pb::AnswerApprovalRequest>,
    ) -> Reply<pb::AnswerApprovalResponse> {
        let by = caller(&req);
        ok(self.answer(req.into_inner(), &by).await)
    }
}

#[tonic::async_trait]
impl Trust for Api {
    async fn get_trust(&self, _: Request<pb::GetTrustRequest>) -> Reply<pb::TrustConfig> {
        ok(Api::get_trust(self))
    }
    async fn set_trust(&self, req: Request<pb::TrustConfig>) -> Reply<pb::TrustConfig> {
        let by = caller(&req);
        ok(Api::set_trust(self, req.into_inner(), &by))
    }
    async fn check_trust(&self, req: Request<pb::CheckTrustRequest>) -> Reply<pb::TrustVerdict> {
        ok(Api::check_trust(self, req.into_inner()))
    }
}

#[tonic::async_trait]
impl Admins for Api {
    async fn list_admins(&self, req: Request<pb::ListAdminsRequest>) -> Reply<pb::AdminList> {
        let by = caller(&req);
        ok(Api::list_admins(self, &by))
    }
    async fn add_admin(&self, req: Request<pb::AddAdminRequest>) -> Reply<pb::AddAdminResponse> {
        let by = caller(&req);
        ok(Api::add_admin(self, req.into_inner(), &by))
    }
    async fn revoke_admin(&self, req: Request<pb::AdminRef>) -> Reply<pb::AdminView> {
        let by = caller(&req);
        ok(Api::revoke_admin(self, &req.into_inner().name, &by))
    }
    async fn console_link(
        &self,
        req: Request<pb::ConsoleLinkRequest>,
    ) -> Reply<pb::ConsoleLinkResponse> {
        let who = req.extensions().get::<super::AdminIdentity>().cloned();
        ok(Api::console_link(self, req.into_inner(), who))
    }
}

#[tonic::async_trait]
impl Connectors for Api {
    async fn add_connector(&self, req: Request<pb::Connector>) -> Reply<pb::ConnectorView> {
        ch(self.channels.add_connector(req.into_inner()).await)
    }
    async fn list_connectors(
        &self,
        _: Request<pb::ListConnectorsRequest>,
    ) -> Reply<pb::ConnectorList> {
        ch(self
            .channels
            .list_connectors()
            .map(|connectors| pb::ConnectorList { connectors }))
    }
    async fn get_connector(&self, req: Request<pb::ConnectorRef>) -> Reply<pb::ConnectorView> {
        ch(self.channels.get_connector(&req.into_inner().name))
    }
    async fn remove_connector(&self, req: Request<pb::ConnectorRef>) -> Reply<pb::ConnectorView> {
        ch(self.channels.remove_connector(&req.into_inner().name).await)
    }
    async fn test_connector(&self, req: Request<pb::ConnectorRef>) -> Reply<pb::ConnectorTest> {
        ch(self.channels.test_connector(&req.into_inner().name).await)
    }
}

#[tonic::async_trait]
impl Outbox for Api {
    async fn list_outbox(&self, req: Request<pb::ListOutboxRequest>) -> Reply<pb::OutboxList> {
        let r = req.into_inner();
        ch(self
            .channels
            .list_outbox(r.failed, r.limit)
            .map(|items| pb::OutboxList { items }))
    }
    async fn get_outbox(&self, req: Request<pb::OutboxRef>) -> Reply<pb::OutboxItem> {
        ch(self.channels.get_outbox(&req.into_inner().id))
    }
    async fn retry_outbox(&self, req: Request<pb::OutboxRef>) -> Reply<pb::OutboxItem> {
        ch(self.channels.retry_outbox(&req.into_inner().id).await)
    }
}

#[tonic::async_trait]
impl Sources for Api {
    async fn get_sources(&self, _: Request<pb::GetSourcesRequest>) -> Reply<pb::Sources> {
        Ok(Response::new(self.channels.sources()))
    }
    async fn check_sources(&self, req: Request<pb::SourcesText>) -> Reply<pb::SourcesCheck> {
        Ok(Response::new(crate::channels::Channels::check_sources(
            &req.into_inner().rules,
        )))
    }
    async fn set_sources(&self, req: Request<pb::SourcesText>) -> Reply<pb::Sources> {
        ch(self.channels.set_sources(&req.into_inner().rules).await)
    }
}
