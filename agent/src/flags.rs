//! The Rule of Two's flags and their causes: plain data, carried by
//! workers, approvals and the reports that travel to the Router.

use serde::{Deserialize, Serialize};

/// Why a worker holds one of the Rule of Two's flags: the object that gave
/// it (a trigger, a machine, a command, a thread, a worker) and a reason.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cause {
    pub object: String,
    pub why: String,
}

/// Causes kept per flag; the first ones stay (the flag itself is sticky).
pub const MAX_CAUSES: usize = 8;

/// The Rule of Two's flags, each set while it has a cause: [A] untrusted
/// input, [B] access to sensitive systems or private data, [C] the power
/// to change state or communicate externally. They only ever grow.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Flags {
    pub untrusted: Vec<Cause>,
    pub sensitive: Vec<Cause>,
    pub acts: Vec<Cause>,
}

impl Flags {
    fn push(list: &mut Vec<Cause>, object: &str, why: &str) {
        if list.len() < MAX_CAUSES && !list.iter().any(|c| c.object == object) {
            list.push(Cause {
                object: object.to_string(),
                why: why.to_string(),
            });
        }
    }
    pub fn add_untrusted(&mut self, object: &str, why: &str) {
        Flags::push(&mut self.untrusted, object, why);
    }
    pub fn add_sensitive(&mut self, object: &str, why: &str) {
        Flags::push(&mut self.sensitive, object, why);
    }
    pub fn add_acts(&mut self, object: &str, why: &str) {
        Flags::push(&mut self.acts, object, why);
    }
    /// Everything `other` has, added (its causes after ours).
    pub fn absorb(&mut self, other: &Flags) {
        for c in &other.untrusted {
            self.add_untrusted(&c.object, &c.why);
        }
        for c in &other.sensitive {
            self.add_sensitive(&c.object, &c.why);
        }
        for c in &other.acts {
            self.add_acts(&c.object, &c.why);
        }
    }
    pub fn a(&self) -> bool {
        !self.untrusted.is_empty()
    }
    pub fn b(&self) -> bool {
        !self.sensitive.is_empty()
    }
    pub fn c(&self) -> bool {
        !self.acts.is_empty()
    }
    pub fn all_three(&self) -> bool {
        self.a() && self.b() && self.c()
    }
    /// `A B C` letters held, `-` for none.
    pub fn letters(&self) -> String {
        let l: Vec<&str> = [(self.a(), "A"), (self.b(), "B"), (self.c(), "C")]
            .into_iter()
            .filter(|(on, _)| *on)
            .map(|(_, l)| l)
            .collect();
        if l.is_empty() {
            "-".into()
        } else {
            l.join("")
        }
    }
    /// [`Flags::explain`] with at most `n` causes per flag (and how many
    /// more there are): for what people read in a channel.
    pub fn summary(&self, n: usize) -> String {
        let mut s = String::new();
        for (name, list) in [
            ("untrusted input", &self.untrusted),
            ("sensitive access", &self.sensitive),
            ("changes state or communicates", &self.acts),
        ] {
            if list.is_empty() {
                continue;
            }
            let mut causes: Vec<String> = list
                .iter()
                .take(n)
                .map(|c| format!("{} ({})", c.object, c.why))
                .collect();
            if list.len() > n {
                causes.push(format!("and {} more", list.len() - n));
            }
            s.push_str(&format!("{name}: {}; ", causes.join(", ")));
        }
        s.trim_end_matches("; ").to_string()
    }

    /// One line per flag held, with its causes.
    pub fn explain(&self) -> String {
        self.summary(usize::MAX)
    }
}
