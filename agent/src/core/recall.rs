//! `recall(id)` and `read(id, offset)`: any object an agent saw an ID of,
//! in pages of `recall_chars`, each cut ending with where to read on. The
//! core answers for its own records; the world for everything stored.

use super::Core;
use crate::prompt::spill;
use crate::state::WorkerState;
use crate::world::World;

impl Core {
    pub(super) fn recall(
        &self,
        world: &dyn World,
        id: &str,
        offset: usize,
    ) -> Result<String, String> {
        let full = if let Some(w) = self.records.worker(id) {
            worker_text(w)
        } else if let Some(a) = self.records.approvals().get(id) {
            serde_json::to_string_pretty(a).unwrap_or_default()
        } else {
            self.read(world.lookup(id), None)
                .ok_or_else(|| format!("no object {id}"))?
        };
        let page = self.budgets.recall_chars;
        let rest: String = full.chars().skip(offset).collect();
        Ok(spill(&rest, page, id).replace(
            &format!("read(\"{id}\", {page})"),
            &format!("read(\"{id}\", {})", offset + page),
        ))
    }
}

fn worker_text(w: &WorkerState) -> String {
    let mut s = format!(
        "worker {} ({}){}\ntask: {}\nthreads: {}\nmachine: {}\nlast report: {}\n",
        w.id,
        w.status.name(),
        w.parent
            .as_ref()
            .map(|p| format!(", subagent of {p}"))
            .unwrap_or_default(),
        w.task,
        w.threads.join(" "),
        w.machine,
        w.last_report
    );
    for (cmd, c) in &w.commands {
        s.push_str(&format!(
            "command {cmd} on {}: `{}`{}\n",
            c.machine,
            c.command,
            if c.done { " (finished)" } else { " (running)" }
        ));
    }
    s
}
