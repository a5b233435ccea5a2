//! `byom show ID`: any object by its ID (or a machine by name).

use byom_protocol::id::Kind;
use byom_protocol::pb::{self, show_response::Object};
use tonic::Status;

use super::{store_err, Api};

impl Api {
    pub(super) fn show(&self, id: &str) -> Result<pb::ShowResponse, Status> {
        let none = || Status::not_found(format!("no {id}"));
        let object = match Kind::of(id) {
            Some(Kind::Machine) => Object::Machine(self.machine(id)?),
            Some(Kind::Command) => Object::Command(self.command(id)?),
            Some(Kind::Token) => {
                let mut t = self
                    .store
                    .get_token(id)
                    .map_err(store_err)?
                    .ok_or_else(none)?;
                t.secret_sha256.clear();
                Object::Token(t)
            }
            Some(Kind::Trigger) => Object::Trigger(
                self.store
                    .get_trigger(id)
                    .map_err(store_err)?
                    .ok_or_else(none)?,
            ),
            Some(Kind::Thread) => Object::Thread(
                self.store
                    .get_thread(id)
                    .map_err(store_err)?
                    .ok_or_else(none)?,
            ),
            Some(Kind::Worker) => Object::Worker(self.worker(id)?),
            Some(Kind::Approval) => Object::Approval(self.approval(id)?.ok_or_else(none)?),
            Some(Kind::Snapshot) => {
                let bytes = self
                    .store
                    .get_snapshot(id)
                    .map_err(store_err)?
                    .ok_or_else(none)?
                    .len();
                Object::Snapshot(pb::Snapshot {
                    id: id.to_string(),
                    bytes: bytes as u64,
                    paused_program_of: crate::agents::paused_program_of(&self.store, id)
                        .map_err(store_err)?,
                })
            }
            Some(_) => {
                return Err(Status::unimplemented(format!(
                    "{id}: this kind of object cannot be shown"
                )))
            }
            None => match self.store.resolve_machine(id).map_err(store_err)? {
                Some(m) => Object::Machine(self.decorate(m)),
                None => {
                    return Err(Status::invalid_argument(format!(
                        "{id:?} is not an ID (mch_…, cmd_…, tok_…) or a machine name"
                    )))
                }
            },
        };
        Ok(pb::ShowResponse {
            object: Some(object),
        })
    }
}
