//! Pairing tokens and machines: create, list, rename, label, revoke. Token
//! secrets are shown once, at creation; only their hash is stored.

use std::time::Duration;

use byom_protocol::id::TokenId;
use byom_protocol::limits;
use byom_protocol::names;
use byom_protocol::pb;
use byom_protocol::token::PairingToken;
use byom_store::StoreError;
use tonic::Status;

use super::{fingerprint, store_err, Api};
use crate::live::decorate;

fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}

fn label_err(e: names::LabelError) -> Status {
    Status::invalid_argument(e.to_string())
}

impl Api {
    /// A machine by ID or name, with its live facts. A revoked machine no
    /// longer holds its name, but is still found by it.
    pub(super) fn machine(&self, id_or_name: &str) -> Result<pb::Machine, Status> {
        let m = match self.store.resolve_machine(id_or_name).map_err(store_err)? {
            Some(m) => m,
            None => self
                .store
                .revoked_named(id_or_name)
                .map_err(store_err)?
                .ok_or_else(|| {
                    Status::not_found(format!("no machine {id_or_name:?}: see `byom machines ls`"))
                })?,
        };
        Ok(self.decorate(m))
    }

    pub(super) fn decorate(&self, m: pb::Machine) -> pb::Machine {
        decorate(&self.store, &self.live, m)
    }

    pub(super) async fn create_token(
        &self,
        mut req: pb::CreateTokenRequest,
        by: &str,
    ) -> Result<pb::CreateTokenResponse, Status> {
        let key = std::mem::take(&mut req.idempotency_key);
        let labels = std::mem::take(&mut req.labels);
        let request = fingerprint(&req, &[&labels]);
        req.labels = labels;
        let claim = match self.claim("token", by, &key, &request).await? {
            Ok(p) => p,
            // A retry: the same token, its secret derived again.
            Err(r) => {
                let mut token = self
                    .store
                    .get_token(&r.object_id)
                    .map_err(store_err)?
                    .ok_or_else(|| Status::not_found(format!("token {} is gone", r.object_id)))?;
                token.secret_sha256.clear();
                return Ok(self.token_response(token, self.token_string(by, &key).encode()));
            }
        };
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
        names::check_labels(&req.labels).map_err(label_err)?;
        if !req.name.is_empty() && !names::valid_name(&req.name) {
            return Err(Status::invalid_argument(
                "bad name: use lower-case letters, digits, '-', '_' or '.'",
            ));
        }
        let reusable = req.reusable || req.max_uses > 0;
        if reusable && !req.replace.is_empty() {
            return Err(Status::invalid_argument(
                "a token that replaces a machine pairs exactly one: leave out --reusable and --max-uses",
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
        let now = byom_wire::now_ms();
        let secret = if key.is_empty() {
            PairingToken::generate(
                self.identity.pki.ca_sha256,
                self.identity.public_addr.clone(),
            )
        } else {
            self.token_string(by, &key)
        };
        let token = pb::Token {
            id: TokenId::new(now).to_string(),
            name: req.name,
            labels: req.labels,
            created_at_ms: now,
            expires_at_ms: now + ttl,
            secret_sha256: byom_wire::hex(&byom_wire::sha256(&secret.secret)),
            replace_machine,
            reusable,
            max_uses: req.max_uses,
            ..Default::default()
        };
        self.store
            .create_token(&token, &claim.ops(&token.id, ""))
            .map_err(store_err)?;
        self.store.flush_async().await.map_err(store_err)?;
        let mut shown = token;
        shown.secret_sha256.clear();
        Ok(self.token_response(shown, secret.encode()))
    }

    /// The token with its install one-liners (when the server ships a daemon).
    fn token_response(&self, token: pb::Token, secret: String) -> pb::CreateTokenResponse {
        let site = &self.identity.site;
        pb::CreateTokenResponse {
            token: Some(token),
            install_command: site.install_command(&secret).unwrap_or_default(),
            install_command_windows: site.install_command_windows(&secret).unwrap_or_default(),
            secret,
        }
    }

    /// The token a key derives: the same for every retry, never stored.
    fn token_string(&self, by: &str, key: &str) -> PairingToken {
        PairingToken {
            ca_sha256: self.identity.pki.ca_sha256,
            secret: self.identity.token_secret(by, key),
            server_addr: self.identity.public_addr.clone(),
        }
    }

    pub(super) fn list_tokens(
        &self,
        req: pb::ListTokensRequest,
    ) -> Result<pb::ListTokensResponse, Status> {
        let now = byom_wire::now_ms();
        let mut tokens = self.store.list_tokens().map_err(store_err)?;
        tokens.retain(|t| {
            req.include_used
                || (!t.revoked
                    && t.expires_at_ms > now
                    && if t.reusable {
                        t.max_uses == 0 || t.uses < t.max_uses
                    } else {
                        t.used_at_ms == 0
                    })
        });
        for t in &mut tokens {
            t.secret_sha256.clear();
        }
        Ok(pb::ListTokensResponse { tokens })
    }

    pub(super) async fn revoke_token(
        &self,
        req: pb::RevokeTokenRequest,
    ) -> Result<pb::RevokeTokenResponse, Status> {
        let id = req.id;
        let mut t = self.store.revoke_token(&id).map_err(|e| match e {
            StoreError::NotFound(_) => {
                Status::not_found(format!("no token {id}: see `byom token ls`"))
            }
            e => store_err(e),
        })?;
        self.store.flush_async().await.map_err(store_err)?;
        t.secret_sha256.clear();
        Ok(pb::RevokeTokenResponse { token: Some(t) })
    }

    pub(crate) fn list_machines(
        &self,
        req: pb::ListMachinesRequest,
    ) -> Result<pb::ListMachinesResponse, Status> {
        let machines = self
            .store
            .list_machines()
            .map_err(store_err)?
            .into_iter()
            .filter(|m| req.include_revoked || !m.revoked)
            .map(|m| self.decorate(m))
            .collect();
        Ok(pb::ListMachinesResponse {
            machines,
            shipped_version: self.identity.site.shipped_version().to_string(),
        })
    }

    pub(super) async fn rename_machine(
        &self,
        req: pb::RenameMachineRequest,
    ) -> Result<pb::MachineResponse, Status> {
        let m = self.machine(&req.machine)?;
        if !names::valid_name(&req.name) {
            return Err(Status::invalid_argument(
                "bad name: use lower-case letters, digits, '-', '_' or '.' (and not an ID)",
            ));
        }
        let m = self
            .store
            .rename_machine(&m.id, &req.name)
            .map_err(store_err)?;
        self.store.flush_async().await.map_err(store_err)?;
        Ok(pb::MachineResponse {
            machine: Some(self.decorate(m)),
        })
    }

    pub(super) async fn label_machine(
        &self,
        req: pb::LabelMachineRequest,
    ) -> Result<pb::MachineResponse, Status> {
        let m = self.machine(&req.machine)?;
        names::check_labels(&req.set).map_err(label_err)?;
        let m = self
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
        self.store.flush_async().await.map_err(store_err)?;
        Ok(pb::MachineResponse {
            machine: Some(self.decorate(m)),
        })
    }

    /// Forgets a revoked machine.
    pub(super) async fn remove_machine(
        &self,
        req: pb::MachineRef,
    ) -> Result<pb::MachineResponse, Status> {
        let m = self.machine(&req.machine)?;
        if !m.revoked {
            return Err(Status::failed_precondition(format!(
                "{} is not revoked: revoke it first (`byom machines revoke {}`)",
                m.name, m.name
            )));
        }
        self.store.delete_machine(&m.id).map_err(store_err)?;
        self.store.flush_async().await.map_err(store_err)?;
        Ok(pb::MachineResponse { machine: Some(m) })
    }

    pub(super) async fn revoke_machine(
        &self,
        req: pb::MachineRef,
        by: &str,
    ) -> Result<pb::MachineResponse, Status> {
        let m = self.machine(&req.machine)?;
        let m = crate::machines::revoke(
            &self.store,
            &self.identity,
            &self.live,
            &self.commands,
            &m.id,
            &format!("revoked by {by}"),
        )
        .await
        .map_err(store_err)?;
        Ok(pb::MachineResponse {
            machine: Some(self.decorate(m)),
        })
    }
}
