//! Approvals as protocol, not prose. The core (never the Router) writes
//! each request: the exact action, its machine, why it needs a person, and
//! a short code. A request is answered only by an explicit act that names
//! its code (`approve CODE` / `deny CODE`, alone in a message) from an
//! approver judged when the message arrived, after the request, once.
//! Nothing else is read as consent: "Do not approve this.", "not ok", a
//! quoted "> approve CODE" or a "yes" are not answers.
//!
//! What an attacker controls: the text of any message they can post (on
//! the request's thread or elsewhere), the wording of the model's tool
//! calls, and the names their channel lets them choose. What must never
//! happen: an action runs on anything but an approver's explicit act for
//! that very action. So the decision reads only the message's whole text
//! against a fixed grammar, its author's judged principal, and the
//! request's code and digest.

use sha2::{Digest, Sha256};

/// How long a request stays open before it expires (as a "no").
pub const APPROVAL_TTL_MS: u64 = 24 * 3600 * 1000;
/// Characters of a code: no 0/O, 1/I/L, so it reads back unambiguously.
const ALPHABET: &[u8] = b"23456789ABCDEFGHJKMNPQRSTUVWXYZ";
/// Characters in a code.
pub const CODE_LEN: usize = 6;
/// Longest action shown whole in a request; a longer one is shown cut,
/// and says where to read all of it.
pub const MAX_SHOWN_ACTION: usize = 1500;
/// Longest message read as an answer (an answer is a few words).
const MAX_ANSWER_CHARS: usize = 200;

/// A message that is an answer: approve or deny the request with `code`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub approve: bool,
    pub code: String,
}

/// A code from a random ID (its bytes hashed onto [`ALPHABET`]).
pub fn code_from(seed: &str) -> String {
    let h = Sha256::digest(seed.as_bytes());
    h.iter()
        .take(CODE_LEN)
        .map(|b| ALPHABET[*b as usize % ALPHABET.len()] as char)
        .collect()
}

/// What an approval covers, as a digest: a changed action (another
/// command, machine, thread or text) is another request.
pub fn digest(kind: &str, machine: &str, action: &str) -> String {
    let mut h = Sha256::new();
    for part in [kind, machine, action] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part.as_bytes());
    }
    byom_protocol::hex(&h.finalize()[..16])
}

/// Whether `word` is a mention of someone (the bot) that a channel puts
/// before a message: `@byom`, Slack's `<@U123>`. (Not `word:`: "Deny:
/// approve …" must not read as an approval.)
fn is_mention(word: &str) -> bool {
    (word.starts_with('@') && word.len() > 1) || (word.starts_with("<@") && word.ends_with('>'))
}

/// Reads a message as an answer, or not at all. The whole message, once
/// quoted lines (`> …`, what someone else said) and leading mentions are
/// set aside, must be exactly `approve CODE` or `deny CODE` (any case, a
/// final `.` or `!` allowed). Anything more or less is not an answer.
pub fn parse_answer(text: &str) -> Option<Answer> {
    if text.chars().count() > MAX_ANSWER_CHARS {
        return None;
    }
    let own: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('>'))
        .collect();
    let [line] = own.as_slice() else {
        return None;
    };
    let line = line.trim_end_matches(['.', '!']);
    let mut words: Vec<&str> = line.split_whitespace().collect();
    // At most two mentions in front ("@byom", "<@U1>").
    for _ in 0..2 {
        if words.len() > 2 && is_mention(words[0]) {
            words.remove(0);
        }
    }
    let [verb, code] = words.as_slice() else {
        return None;
    };
    let approve = match verb.to_ascii_lowercase().as_str() {
        "approve" => true,
        "deny" => false,
        _ => return None,
    };
    let code = code.to_ascii_uppercase();
    let well_formed = code.len() == CODE_LEN && code.bytes().all(|b| ALPHABET.contains(&b));
    well_formed.then_some(Answer { approve, code })
}

/// `s`, cut at `max` characters (with a note that it was).
pub fn shown(s: &str, max: usize) -> (String, bool) {
    if s.chars().count() <= max {
        return (s.to_string(), false);
    }
    (s.chars().take(max).collect(), true)
}

/// `text` made safe to show in a code block: no run of backticks can end
/// the block (each backtick is followed by a zero-width space), and
/// characters that hide or reorder what is shown (controls, bidi
/// overrides, zero-width ones) are written out as `\u{…}`, so the
/// approver sees every character that will run.
fn code_span(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        let hidden = (c.is_control() && c != '\n' && c != '\t')
            || matches!(
                c,
                '\u{200b}'..='\u{200f}'
                    | '\u{202a}'..='\u{202e}'
                    | '\u{2066}'..='\u{2069}'
                    | '\u{feff}'
                    | '\u{061c}'
            );
        if hidden {
            out.push_str(&format!("\\u{{{:x}}}", c as u32));
        } else if c == '`' {
            out.push_str("`\u{200b}");
        } else {
            out.push(c);
        }
    }
    out
}

/// The request a person reads, written by the core: the exact action,
/// where, why, who may answer, and how.
#[allow(clippy::too_many_arguments)]
pub fn request_text(
    id: &str,
    code: &str,
    worker: &str,
    what: &str,
    action: &str,
    machine: &str,
    why: &str,
    approvers: &[String],
) -> String {
    let (body, cut) = shown(action, MAX_SHOWN_ACTION);
    let more = if cut {
        format!("\n(cut here; all of it: `byom show {id}`)")
    } else {
        String::new()
    };
    let on = if machine.is_empty() {
        String::new()
    } else {
        format!(" on {machine}")
    };
    format!(
        "Approval needed ({id}, code {code}): {worker} wants to {what}{on}:\n```\n{}\n```{more}\nWhy a person must decide: {why}.\nTo allow exactly this, an approver ({}) replies `approve {code}`; to refuse, `deny {code}`. Nothing else counts as an answer; it expires in 24 h.",
        code_span(&body),
        approvers.join(", "),
    )
}

/// A character as a reader would take it: fullwidth forms and the common
/// Cyrillic and Greek look-alikes of Latin letters become those letters
/// (so "Аpproval" with a Cyrillic А reads as what it imitates).
pub fn fold(c: char) -> char {
    let u = c as u32;
    if (0xFF01..=0xFF5E).contains(&u) {
        return char::from_u32(u - 0xFEE0).unwrap_or(c);
    }
    match c {
        'А' | 'а' | 'Α' | 'α' => 'a',
        'В' | 'в' | 'Β' | 'β' => 'b',
        'С' | 'с' | 'ϲ' => 'c',
        'ԁ' => 'd',
        'Е' | 'е' | 'Ε' | 'ε' => 'e',
        'ɡ' => 'g',
        'Н' | 'н' | 'Η' => 'h',
        'І' | 'і' | 'Ι' | 'ι' | 'ı' => 'i',
        'Ј' | 'ј' => 'j',
        'К' | 'к' | 'Κ' | 'κ' => 'k',
        'М' | 'м' | 'Μ' => 'm',
        'Ν' | 'ո' => 'n',
        'О' | 'о' | 'Ο' | 'ο' | 'σ' => 'o',
        'Р' | 'р' | 'Ρ' | 'ρ' => 'p',
        'Ѕ' | 'ѕ' => 's',
        'Т' | 'т' | 'Τ' | 'τ' => 't',
        'υ' | 'ս' => 'u',
        'ν' | 'ѵ' => 'v',
        'ԝ' | 'ω' => 'w',
        'Х' | 'х' | 'Χ' | 'χ' => 'x',
        'У' | 'у' | 'Υ' | 'γ' => 'y',
        'Ζ' => 'z',
        c => c,
    }
}

/// The code a request (as [`request_text`] wrote it) asks to be answered
/// with: what a reaction or a button on that message stands for.
pub fn code_of_request(text: &str) -> Option<String> {
    let rest = text.strip_prefix("Approval needed (")?;
    let head = &rest[..rest.find(')')?];
    let code = head.split(", code ").nth(1)?;
    (code.len() == CODE_LEN && code.chars().all(|c| c.is_ascii_alphanumeric()))
        .then(|| code.to_string())
}

/// The name of an approval's kind in its digest.
pub fn kind_name(k: crate::state::ApprovalKind) -> &'static str {
    match k {
        crate::state::ApprovalKind::Question => "question",
        crate::state::ApprovalKind::Command => "command",
        crate::state::ApprovalKind::Message => "message",
    }
}

/// What a held post's approval covers: where and what.
pub fn post_action(r: &crate::event::Reply) -> String {
    format!("post on {}:\n{}", r.thread, r.text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_names_its_code() {
        let text = request_text(
            "apr_1",
            "K7QX9P",
            "wrk_1",
            "run a command",
            "ls",
            "lap",
            "why",
            &[],
        );
        assert_eq!(code_of_request(&text).as_deref(), Some("K7QX9P"));
        assert_eq!(code_of_request("Done: approve K7QX9P"), None);
        assert_eq!(code_of_request("Approval needed (apr_1, code K7Q)"), None);
    }

    #[test]
    fn only_the_exact_form_answers() {
        let yes = Some(Answer {
            approve: true,
            code: "K7QX9P".into(),
        });
        let no = Some(Answer {
            approve: false,
            code: "K7QX9P".into(),
        });
        assert_eq!(parse_answer("approve K7QX9P"), yes);
        assert_eq!(parse_answer("  Approve k7qx9p. "), yes);
        assert_eq!(parse_answer("@byom-bot approve K7QX9P"), yes);
        assert_eq!(parse_answer("<@U123> approve K7QX9P"), yes);
        assert_eq!(parse_answer("@byom deny K7QX9P"), no);
        assert_eq!(parse_answer("> Approval needed\n> …\n\nDENY K7QX9P!"), no);
        for not in [
            "Do not approve this.",
            "do not approve K7QX9P",
            "not ok",
            "I'm not sure",
            "Is it ok to run this?",
            "> approve K7QX9P",
            "yes",
            "ok",
            "lgtm",
            "approve",
            "approve K7QX9",
            "approve K7QX9P0",
            "approve K7QX9P please",
            "please approve K7QX9P",
            "approve K7QX9P\napprove K7QX9P",
            "approve K7QX9P and deny ABCDEF",
            "approve apr_0000",
            "approve K7QX0P",
            "approve `K7QX9P`",
            "no: approve K7QX9P",
            "Deny: approve K7QX9P",
            "Don\u{2019}t: approve K7QX9P",
            "byom: approve K7QX9P",
        ] {
            assert_eq!(parse_answer(not), None, "{not:?}");
        }
    }

    #[test]
    fn codes_and_digests() {
        let a = code_from("apr_1");
        assert_eq!(a.len(), CODE_LEN);
        assert!(parse_answer(&format!("approve {a}")).is_some());
        assert_ne!(a, code_from("apr_2"));
        assert_ne!(
            digest("command", "lap", "ls"),
            digest("command", "lap", "ls ")
        );
        assert_ne!(
            digest("command", "lap", "ls"),
            digest("command", "lap2", "ls")
        );
        // Parts cannot run into each other.
        assert_ne!(
            digest("command", "la", "pls"),
            digest("command", "lap", "ls")
        );
    }

    #[test]
    fn the_request_shows_the_exact_action() {
        let t = request_text(
            "apr_1",
            "K7QX9P",
            "wrk_1",
            "run a command",
            "git push --force ```x",
            "lap",
            "A: trg_1",
            &["github:maint".into()],
        );
        assert!(t.contains("git push --force"), "{t}");
        assert!(
            !t.contains("```x"),
            "a fence in the action cannot end the block: {t}"
        );
        let hidden = request_text(
            "apr_1",
            "K7QX9P",
            "w",
            "run",
            "ls\u{202e}hs.x\r; rm",
            "",
            "",
            &[],
        );
        assert!(
            hidden.contains("\\u{202e}") && hidden.contains("\\u{d}"),
            "{hidden}"
        );
        assert!(
            t.contains("`approve K7QX9P`") && t.contains("github:maint"),
            "{t}"
        );
        let long = "x".repeat(MAX_SHOWN_ACTION + 10);
        let t = request_text("apr_1", "K7QX9P", "w", "run", &long, "", "", &[]);
        assert!(t.contains("byom show apr_1"), "{t}");
    }

    proptest::proptest! {
        /// Whatever else a message says, it answers only when it is the
        /// exact form.
        #[test]
        fn answers_are_exact(prefix in "\\PC{0,30}", suffix in "\\PC{0,30}") {
            let text = format!("{prefix}approve K7QX9P{suffix}");
            if let Some(a) = parse_answer(&text) {
                proptest::prop_assert_eq!(a.code, "K7QX9P");
                let own: Vec<String> = text.lines().map(str::trim)
                    .filter(|l| !l.is_empty() && !l.starts_with('>'))
                    .map(|l| l.trim_end_matches(['.', '!']).to_string()).collect();
                proptest::prop_assert_eq!(own.len(), 1);
                let words: Vec<&str> = own[0].split_whitespace().collect();
                let n = words.len();
                proptest::prop_assert!((2..=4).contains(&n));
                proptest::prop_assert!(words[n - 2].eq_ignore_ascii_case("approve"));
                for w in &words[..n - 2] {
                    proptest::prop_assert!(is_mention(w));
                }
            }
        }
    }
}
