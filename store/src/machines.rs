//! Machines, with unique names (a name index claimed by compare-and-swap).

use byom_protocol::pb;
use prost::Message;

use crate::backend::Space;
use crate::{Result, Store, StoreError, MAX_LIST};

impl Store {
    /// Stores a new machine, making its name unique by adding `-2`, `-3`, ….
    pub fn create_machine(&self, m: &mut pb::Machine) -> Result<()> {
        let base = m.name.clone();
        for n in 1..=1000u32 {
            let candidate = if n == 1 {
                base.clone()
            } else {
                format!("{base}-{n}")
            };
            if self.kv.compare_and_swap(
                Space::MachineNames,
                candidate.as_bytes(),
                None,
                Some(m.id.as_bytes()),
            )? {
                m.name = candidate;
                return self
                    .kv
                    .put(Space::Machines, m.id.as_bytes(), &m.encode_to_vec());
            }
        }
        Err(StoreError::Conflict(format!(
            "too many machines named {base:?}"
        )))
    }

    pub fn get_machine(&self, id: &str) -> Result<Option<pb::Machine>> {
        self.get_msg(Space::Machines, id)
    }

    /// Finds a machine by ID or name.
    pub fn resolve_machine(&self, id_or_name: &str) -> Result<Option<pb::Machine>> {
        // Only what looks like an ID is looked up as one: a name costs one
        // read fewer (on a shared store, a statement fewer per command).
        if byom_protocol::id::MachineId::parse(id_or_name).is_ok() {
            if let Some(m) = self.get_machine(id_or_name)? {
                return Ok(Some(m));
            }
        }
        // Names are unique and a machine's record carries its name, so a
        // machine that still bears the name, unrevoked, is the one the
        // index would name (a revoked one gives its name up).
        if let Some(id) = self.names.get(id_or_name) {
            if let Some(m) = self.get_machine(&id)? {
                if m.name == id_or_name && !m.revoked {
                    return Ok(Some(m));
                }
            }
        }
        match self.kv.get(Space::MachineNames, id_or_name.as_bytes())? {
            Some(id) => {
                let id = String::from_utf8_lossy(&id);
                let m = self.get_machine(&id)?;
                if m.as_ref().is_some_and(|m| m.name == id_or_name) {
                    self.names.set(id_or_name, id.into_owned());
                }
                Ok(m)
            }
            None => Ok(None),
        }
    }

    pub fn list_machines(&self) -> Result<Vec<pb::Machine>> {
        let mut v: Vec<pb::Machine> = self.list_msgs(Space::Machines, MAX_LIST)?;
        v.reverse();
        Ok(v)
    }

    pub fn update_machine<F>(&self, id: &str, f: F) -> Result<pb::Machine>
    where
        F: FnMut(&mut pb::Machine) -> Result<()>,
    {
        self.update_msg(Space::Machines, id, f)
    }

    pub fn rename_machine(&self, id: &str, new_name: &str) -> Result<pb::Machine> {
        let Some(m) = self.get_machine(id)? else {
            return Err(StoreError::NotFound(id.to_string()));
        };
        if m.name == new_name {
            return Ok(m);
        }
        if !self.kv.compare_and_swap(
            Space::MachineNames,
            new_name.as_bytes(),
            None,
            Some(id.as_bytes()),
        )? {
            return Err(StoreError::Conflict(format!(
                "a machine named {new_name:?} already exists"
            )));
        }
        let old_name = m.name.clone();
        let m = self.update_machine(id, |m| {
            m.name = new_name.to_string();
            Ok(())
        })?;
        self.release_machine_name(&old_name, id)?;
        Ok(m)
    }

    /// Forgets a machine: its record, and its name if it still holds it.
    pub fn delete_machine(&self, id: &str) -> Result<Option<pb::Machine>> {
        let Some(m) = self.get_machine(id)? else {
            return Ok(None);
        };
        self.release_machine_name(&m.name, id)?;
        self.kv.delete(Space::Machines, id.as_bytes())?;
        Ok(Some(m))
    }

    /// A revoked machine that was called `name` (it no longer holds the
    /// name), newest first: to say what happened to it.
    pub fn revoked_named(&self, name: &str) -> Result<Option<pb::Machine>> {
        Ok(self
            .list_machines()?
            .into_iter()
            .rev()
            .find(|m| m.revoked && m.name == name))
    }

    /// Releases a name held by `id` (after a rename).
    pub fn release_machine_name(&self, name: &str, id: &str) -> Result<()> {
        self.kv.compare_and_swap(
            Space::MachineNames,
            name.as_bytes(),
            Some(id.as_bytes()),
            None,
        )?;
        Ok(())
    }
}
