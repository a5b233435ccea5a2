//! Workloads for the simulator: a seeded generator, and a working day on a
//! team chat.

use crate::event::TriggerInfo;

/// A deterministic generator (xorshift64*), so a seed is a whole workload.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545F4914F6CDD1D)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

/// A working day on a team chat: `n` messages over eight hours, mixing new
/// requests, follow-ups in the same threads, parallel checks with an
/// approval, chatter, and the odd cancel. Returns (time, trigger) pairs.
pub fn day(n: usize, seed: u64) -> Vec<(u64, TriggerInfo)> {
    mixed_day(n, seed, 0)
}

/// Marks the text of every untrusted message of [`mixed_day`], so the
/// simulator can see, independently of the core's own flags, which model
/// contexts held untrusted text.
pub const UNTRUSTED_MARK: &str = "ux-untrusted";

/// [`day`] where `strangers` percent of the messages come from untrusted
/// principals (`github:mallory`, `matrix:@eve:evil.example`), each text
/// carrying [`UNTRUSTED_MARK`]; the rest are trusted teammates.
pub fn mixed_day(n: usize, seed: u64, strangers: u64) -> Vec<(u64, TriggerInfo)> {
    let mut rng = Rng::new(seed);
    let span = 8 * 3600 * 1000u64;
    let users = ["ada", "bob", "cy", "dee", "eve"];
    let mut threads: Vec<String> = Vec::new();
    let mut out = Vec::new();
    let mut t = 0u64;
    for i in 0..n {
        t += rng.below(2 * span / n as u64 + 1);
        let user = users[rng.below(users.len() as u64) as usize].to_string();
        let roll = rng.below(100);
        let (thread, text, mention) = if roll < 35 || threads.is_empty() {
            let th = format!("thr_sim{i:04}");
            threads.push(th.clone());
            let cmds = ["uname -s", "df -h /", "uptime", "git status", "cargo test"];
            let c = cmds[rng.below(cmds.len() as u64) as usize];
            (th, format!("please run `{c}` on lap"), true)
        } else if roll < 60 {
            let th = threads[rng.below(threads.len() as u64) as usize].clone();
            (th, "also run `ls /tmp` on lap".to_string(), false)
        } else if roll < 65 {
            let th = format!("thr_sim{i:04}");
            threads.push(th.clone());
            (
                th,
                "check `uptime`, `df -h /` and `free -m` on lap in parallel, then ask me before running `echo cleaned`".to_string(),
                true,
            )
        } else if roll < 70 {
            let th = threads[rng.below(threads.len() as u64) as usize].clone();
            (th, "yes".to_string(), false)
        } else if roll < 73 {
            let th = threads[rng.below(threads.len() as u64) as usize].clone();
            (th, "stop that please, cancel".to_string(), false)
        } else {
            let th = threads[rng.below(threads.len() as u64) as usize].clone();
            let chatter = ["lunch?", "thanks!", "nice", "see the standup notes", "brb"];
            (
                th,
                chatter[rng.below(chatter.len() as u64) as usize].to_string(),
                false,
            )
        };
        // Drawn only when asked for, so `day`'s workloads stay as they were.
        let stranger = strangers > 0 && rng.below(100) < strangers;
        let (user, text) = if stranger {
            let who = ["github:mallory", "matrix:@eve:evil.example"];
            let u = who[rng.below(who.len() as u64) as usize].to_string();
            (u, format!("{text} ({UNTRUSTED_MARK})"))
        } else {
            (user, text)
        };
        out.push((
            t,
            TriggerInfo {
                id: format!("trg_sim{i:05}"),
                thread,
                source: "chat".into(),
                trust: if stranger {
                    format!("{user} is not trusted")
                } else {
                    format!("{user} is a teammate")
                },
                user,
                text,
                mention,
                trusted: !stranger,
                ..Default::default()
            },
        ));
    }
    out
}
