//! Revoking a machine, which must reach the store, the TLS layer, the open
//! connection and the machine's commands, in that order.

use byom_protocol::close;
use byom_protocol::pb;
use byom_store::{Store, StoreError};

use crate::commands::Commands;
use crate::identity::ServerIdentity;
use crate::live::LiveMachines;

/// Revokes a machine: the store first (flushed), then the TLS layer's set,
/// then the live connection, whose daemon kills its running commands when
/// closed with the revoked code; then its commands end.
pub async fn revoke(
    store: &Store,
    identity: &ServerIdentity,
    live: &LiveMachines,
    commands: &Commands,
    machine_id: &str,
    reason: &str,
) -> Result<pb::Machine, StoreError> {
    let m = store.update_machine(machine_id, |m| {
        if !m.revoked {
            m.revoked = true;
            m.revoked_at_ms = byom_wire::now_ms();
        }
        m.offline_reason = reason.to_string();
        Ok(())
    })?;
    // The name is free for the machine's successor (the record keeps it,
    // and its ID, for the audit trail).
    store.release_machine_name(&m.name, &m.id)?;
    store.flush_async().await?;
    identity.revoked.insert(machine_id);
    if let Some(l) = live.remove(machine_id) {
        l.conn.close(close::REVOKED.into(), reason.as_bytes());
    }
    // Another replica may hold its connection.
    live.cluster.tell(crate::cluster::Note::Revoke(
        machine_id.to_string(),
        reason.to_string(),
    ));
    commands.machine_revoked(machine_id, reason).await?;
    tracing::info!(machine = %machine_id, "machine revoked: {reason}");
    Ok(m)
}
