//! The agents' context budgets and loop bounds: named, configurable in
//! `<data-dir>/agents.toml` under `[budgets]`, and checked before the server
//! starts, so a bad value is refused with its field and the reason instead
//! of surfacing later as a stuck or looping agent.

use serde::{Deserialize, Serialize};

/// Router model calls are numbered `turn × ROUTER_TURN_STRIDE + step`, so a
/// reply to an earlier turn can never be taken for the current one.
pub const ROUTER_TURN_STRIDE: u64 = 1000;
/// Deepest subagent nesting any configuration may ask for (the core walks
/// parent chains this far).
pub const MAX_DEPTH_LIMIT: u32 = 16;
/// Smallest chat reply that still has room for text next to the pointer to
/// the rest (`… (more: byom threads show thr_…)`).
pub const MIN_CHAT_REPLY_WORDS: usize = 12;
/// Smallest context budget (estimated tokens) a session can work in.
pub const MIN_CONTEXT_TOKENS: usize = 500;

/// Named, configurable context budgets and loop bounds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Budgets {
    /// Characters of a trigger's text inlined in a prompt.
    pub trigger_chars: usize,
    /// Characters of a command's stdout (and of stderr) inlined.
    pub output_chars: usize,
    /// Characters of a worker's report inlined for the Router.
    pub report_chars: usize,
    /// Characters `recall`/`read` return at once.
    pub recall_chars: usize,
    /// Router conversation size (estimated tokens) before old turns drop.
    pub router_context_tokens: usize,
    /// Worker conversation size before old turns drop.
    pub worker_context_tokens: usize,
    /// Words in a reply on a chat channel.
    pub chat_reply_words: usize,
    /// Model calls one worker may make on one piece of work, from waking up
    /// until it is idle again (a looping worker stops; follow-ups over a
    /// long-lived thread each get the full allowance).
    pub max_worker_steps: u32,
    /// Model calls in one Router turn (tool results → model → …).
    pub max_router_steps: u32,
    /// Subagents one `run_js` program may spawn.
    pub max_subagents: usize,
    /// Subagents of one program running at once (more wait their turn).
    pub max_concurrent_subagents: usize,
    /// Subagents may spawn subagents down to this depth.
    pub max_depth: u32,
    /// Output tokens asked of the model per call.
    pub max_output_tokens: u32,
    /// Events one Router turn takes at most (the rest wait for the next).
    pub max_batch: usize,
    /// An idle worker (task done, listening on its threads) retires after
    /// this long without activity; its threads go back to the Router.
    pub idle_retire_ms: u64,
    /// Earlier messages of a thread inlined with each trigger (locality:
    /// the message replied to and the ones before it).
    pub context_messages: usize,
    /// Characters of those messages in all.
    pub context_chars: usize,
}

impl Default for Budgets {
    fn default() -> Self {
        Budgets {
            trigger_chars: 1500,
            output_chars: 1500,
            report_chars: 3000,
            recall_chars: 6000,
            router_context_tokens: 24_000,
            worker_context_tokens: 48_000,
            chat_reply_words: 100,
            max_worker_steps: 64,
            max_router_steps: 6,
            max_subagents: 8,
            max_concurrent_subagents: 4,
            max_depth: 2,
            max_output_tokens: 2048,
            max_batch: 100,
            idle_retire_ms: 24 * 3600 * 1000,
            context_messages: 5,
            context_chars: 2000,
        }
    }
}

/// A budget that cannot work, with the field that says so.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("budgets.{field}: {reason}")]
pub struct BudgetError {
    pub field: &'static str,
    pub reason: String,
}

#[derive(Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
struct File {
    budgets: Budgets,
}

impl Budgets {
    /// Reads the `[budgets]` table of an `agents.toml` text and validates it.
    pub fn from_toml(text: &str) -> Result<Budgets, BudgetError> {
        let f: File = toml::from_str(text).map_err(|e| BudgetError {
            field: "*",
            reason: e.to_string().trim().to_string(),
        })?;
        f.budgets.validate()?;
        Ok(f.budgets)
    }

    /// Refuses values that would break the agents: zero bounds that stall
    /// them, bounds that make turn numbers collide, budgets too small to
    /// hold a turn.
    pub fn validate(&self) -> Result<(), BudgetError> {
        let bad = |field: &'static str, reason: String| Err(BudgetError { field, reason });
        let positive: [(&'static str, u64); 10] = [
            ("trigger_chars", self.trigger_chars as u64),
            ("output_chars", self.output_chars as u64),
            ("report_chars", self.report_chars as u64),
            ("recall_chars", self.recall_chars as u64),
            ("max_worker_steps", u64::from(self.max_worker_steps)),
            ("max_router_steps", u64::from(self.max_router_steps)),
            (
                "max_concurrent_subagents",
                self.max_concurrent_subagents as u64,
            ),
            ("max_output_tokens", u64::from(self.max_output_tokens)),
            ("max_batch", self.max_batch as u64),
            ("idle_retire_ms", self.idle_retire_ms),
        ];
        for (field, v) in positive {
            if v == 0 {
                return bad(field, "must be at least 1".into());
            }
        }
        if u64::from(self.max_router_steps) >= ROUTER_TURN_STRIDE {
            return bad(
                "max_router_steps",
                format!(
                    "must be below {ROUTER_TURN_STRIDE}: Router calls are numbered turn × {ROUTER_TURN_STRIDE} + step, so more steps would give two calls the same number"
                ),
            );
        }
        if self.max_depth > MAX_DEPTH_LIMIT {
            return bad(
                "max_depth",
                format!("at most {MAX_DEPTH_LIMIT} levels of subagents"),
            );
        }
        if self.chat_reply_words < MIN_CHAT_REPLY_WORDS {
            return bad(
                "chat_reply_words",
                format!(
                    "at least {MIN_CHAT_REPLY_WORDS}: a cut reply ends with a pointer to the rest, which needs room"
                ),
            );
        }
        for (field, v) in [
            ("router_context_tokens", self.router_context_tokens),
            ("worker_context_tokens", self.worker_context_tokens),
        ] {
            if v < MIN_CONTEXT_TOKENS {
                return bad(
                    field,
                    format!("at least {MIN_CONTEXT_TOKENS} tokens: a single turn would not fit"),
                );
            }
        }
        if self.max_concurrent_subagents > self.max_subagents.max(1) {
            return bad(
                "max_concurrent_subagents",
                format!(
                    "cannot exceed max_subagents ({}): a program never has more subagents than that",
                    self.max_subagents
                ),
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        Budgets::default().validate().unwrap();
        assert_eq!(Budgets::from_toml("").unwrap(), Budgets::default());
    }

    #[test]
    fn bad_values_name_their_field() {
        let e = Budgets::from_toml("[budgets]\nmax_router_steps = 1000\n").unwrap_err();
        assert_eq!(e.field, "max_router_steps");
        assert!(e.reason.contains("same number"), "{e}");
        let e = Budgets::from_toml("[budgets]\nmax_batch = 0\n").unwrap_err();
        assert_eq!(e.field, "max_batch");
        let e = Budgets::from_toml("[budgets]\nchat_reply_words = 3\n").unwrap_err();
        assert_eq!(e.field, "chat_reply_words");
        let e = Budgets::from_toml("[budgets]\nmax_depth = 40\n").unwrap_err();
        assert_eq!(e.field, "max_depth");
        let e = Budgets::from_toml("[budgets]\nworker_context_tokens = 10\n").unwrap_err();
        assert_eq!(e.field, "worker_context_tokens");
        let e = Budgets::from_toml("[budgets]\nmax_subagents = 2\nmax_concurrent_subagents = 3\n")
            .unwrap_err();
        assert_eq!(e.field, "max_concurrent_subagents");
        let e = Budgets::from_toml("[budgets]\nchat_reply_wordz = 12\n").unwrap_err();
        assert!(e.to_string().contains("chat_reply_wordz"), "{e}");
        let ok = Budgets::from_toml("[budgets]\nchat_reply_words = 12\n").unwrap();
        assert_eq!(ok.chat_reply_words, 12);
    }
}
