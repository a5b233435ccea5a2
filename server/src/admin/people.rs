//! `byom admins`: the people who may use the API, each with a personal
//! certificate (see [`crate::admins`]). Managing them takes what changing
//! trust takes: being an approver for every machine.

use byom_protocol::pb;
use tonic::Status;

use super::{store_err, Api};
use crate::admins::{self, AdminError};

fn admin_err(e: AdminError) -> Status {
    match e {
        AdminError::Invalid(m) => Status::invalid_argument(m),
        AdminError::Refused(m) => Status::failed_precondition(m),
        AdminError::Store(e) => store_err(e),
    }
}

impl Api {
    pub(super) fn list_admins(&self, by: &str) -> Result<pb::AdminList, Status> {
        Ok(pb::AdminList {
            admins: admins::list(&self.store)
                .map_err(store_err)?
                .iter()
                .map(|r| super::views::admin(r, by))
                .collect(),
        })
    }

    pub(super) fn add_admin(
        &self,
        r: pb::AddAdminRequest,
        by: &str,
    ) -> Result<pb::AddAdminResponse, Status> {
        self.may_manage(by)?;
        let name = r.name.as_str();
        admins::validate_name(name).map_err(admin_err)?;
        let (cert, spki) = self
            .identity
            .pki
            .sign_admin(&r.csr_pem, name)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let rec =
            admins::add(&self.store, name, &spki, by, byom_wire::now_ms()).map_err(admin_err)?;
        self.live.cluster.tell(crate::cluster::Note::Admins);
        tracing::info!(name, by, "admin certificate issued");
        Ok(pb::AddAdminResponse {
            name: rec.name,
            cert_pem: cert,
            ca_pem: self.identity.pki.ca_pem.clone(),
            spki_sha256: spki,
        })
    }

    pub(super) fn revoke_admin(&self, name: &str, by: &str) -> Result<pb::AdminView, Status> {
        self.may_manage(by)?;
        let r = admins::revoke(&self.store, name, by, byom_wire::now_ms()).map_err(admin_err)?;
        // The other replicas check calls against it at once.
        self.live.cluster.tell(crate::cluster::Note::Admins);
        Ok(super::views::admin(&r, by))
    }

    /// A single-use login link to the console for the calling admin
    /// (its certificate's name and key): the session acts as them.
    pub(super) fn console_link(
        &self,
        r: pb::ConsoleLinkRequest,
        who: Option<super::AdminIdentity>,
    ) -> Result<pb::ConsoleLinkResponse, Status> {
        let who = who.ok_or_else(|| Status::unauthenticated("no admin certificate"))?;
        let Some(base) = &self.console_url else {
            return Err(Status::failed_precondition(
                "the web console is off on this server: start it with --listen-console HOST:PORT",
            ));
        };
        let (secret, expires_at_ms) = crate::console::sessions::create_link(
            &self.store,
            &who.name,
            &who.spki,
            r.read_only,
            self.console_link_ttl,
            byom_wire::now_ms(),
        )
        .map_err(store_err)?;
        tracing::info!(admin = %who.name, read_only = r.read_only, "console login link made");
        Ok(pb::ConsoleLinkResponse {
            url: format!("{base}/login/{secret}"),
            expires_at_ms,
            admin: format!("admin:{}", who.name),
            read_only: r.read_only,
        })
    }

    fn may_manage(&self, by: &str) -> Result<(), Status> {
        let trust = crate::trust::load(&self.store).map_err(store_err)?;
        if trust.may_approve(by, None) {
            Ok(())
        } else {
            Err(Status::permission_denied(format!(
                "{by} may not manage admins: only an approver for every machine may ({})",
                trust.approvers_for(None).join(", ")
            )))
        }
    }
}
