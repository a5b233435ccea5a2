//! `byom admins`: the people who may use the API, each with a personal
//! certificate (see [`crate::admins`]). Managing them takes what changing
//! trust takes: being an approver for every machine.

use serde_json::{json, Value};
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
    pub(super) fn admins_op(&self, op: &str, args: &Value, by: &str) -> Result<Value, Status> {
        let name = args.get("name").and_then(Value::as_str).unwrap_or("");
        match op {
            "admins" => {
                let rows: Vec<Value> = admins::list(&self.store)
                    .map_err(store_err)?
                    .into_iter()
                    .map(|r| {
                        let mut v = serde_json::to_value(&r).unwrap_or(Value::Null);
                        v["revoked"] = json!(r.revoked_ms.is_some());
                        v["you"] = json!(by == format!("admin:{}", r.name));
                        super::agents::times(&mut v);
                        v
                    })
                    .collect();
                Ok(Value::Array(rows))
            }
            "admins_add" => {
                self.may_manage(by)?;
                admins::validate_name(name).map_err(admin_err)?;
                let csr = args.get("csr").and_then(Value::as_str).unwrap_or("");
                let (cert, spki) = self
                    .identity
                    .pki
                    .sign_admin(csr, name)
                    .map_err(|e| Status::invalid_argument(e.to_string()))?;
                let r = admins::add(&self.store, name, &spki, by, byom_wire::now_ms())
                    .map_err(admin_err)?;
                self.live.cluster.tell(crate::cluster::Note::Admins);
                tracing::info!(name, by, "admin certificate issued");
                Ok(json!({"name": r.name, "cert_pem": cert,
                          "ca_pem": self.identity.pki.ca_pem, "spki_sha256": spki}))
            }
            "admins_revoke" => {
                self.may_manage(by)?;
                let r = admins::revoke(&self.store, name, by, byom_wire::now_ms())
                    .map_err(admin_err)?;
                // The other replicas check calls against it at once.
                self.live.cluster.tell(crate::cluster::Note::Admins);
                let mut v = serde_json::to_value(&r).unwrap_or(Value::Null);
                super::agents::times(&mut v);
                Ok(v)
            }
            other => Err(Status::invalid_argument(format!("unknown op {other:?}"))),
        }
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
