//! Text from the server (command lines, directories, rules, who asked),
//! made safe to show the owner in a terminal. A command line can carry
//! control characters, ANSI escapes, carriage returns, bidi overrides and
//! zero-width characters that make `git push --force` look like `ls -l`;
//! the owner approves what they see, so everything that could hide or
//! reorder text is shown as a visible escape instead.
//!
//! Backslashes are left as they are: doubling them would misquote every
//! regex and Windows path, and a literal `\x1b` in a command line hides
//! nothing (only a real escape character could).

use std::borrow::Cow;
use std::fmt::Write;

/// Whether `c` could hide, overwrite, reorder or disguise text on a
/// terminal: controls (C0, DEL, C1), line and paragraph separators, bidi
/// controls, zero-width and other format characters, characters Unicode
/// says to render as nothing (default ignorables, fillers, variation
/// selectors, tags), and spaces other than U+0020 (a no-break space looks
/// like an argument separator and is not one).
pub fn hidden(c: char) -> bool {
    matches!(c,
        '\u{0}'..='\u{1f}'
        | '\u{7f}'..='\u{9f}'
        | '\u{a0}'
        | '\u{ad}'
        | '\u{34f}'
        | '\u{61c}'
        | '\u{600}'..='\u{605}'
        | '\u{6dd}'
        | '\u{70f}'
        | '\u{890}'..='\u{891}'
        | '\u{8e2}'
        | '\u{115f}'..='\u{1160}'
        | '\u{1680}'
        | '\u{17b4}'..='\u{17b5}'
        | '\u{180b}'..='\u{180f}'
        | '\u{2000}'..='\u{200f}'
        | '\u{2028}'..='\u{202f}'
        | '\u{205f}'..='\u{206f}'
        | '\u{2800}'
        | '\u{3000}'
        | '\u{3164}'
        | '\u{fe00}'..='\u{fe0f}'
        | '\u{feff}'
        | '\u{ffa0}'
        | '\u{fff0}'..='\u{fffb}'
        | '\u{110bd}'
        | '\u{110cd}'
        | '\u{13430}'..='\u{1343f}'
        | '\u{1bca0}'..='\u{1bca3}'
        | '\u{1d173}'..='\u{1d17a}'
        | '\u{e0000}'..='\u{e0fff}'
    )
}

/// `s` with every [`hidden`] character shown as an escape: `\n`, `\r`,
/// `\t`, `\x1b` for other C0 controls and DEL, `\u{202e}` for the rest.
/// Borrowed when there is nothing to escape.
pub fn escape(s: &str) -> Cow<'_, str> {
    if !s.chars().any(hidden) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 16);
    for c in s.chars() {
        // Writing to a String cannot fail.
        let _ = match c {
            '\n' => out.write_str("\\n"),
            '\r' => out.write_str("\\r"),
            '\t' => out.write_str("\\t"),
            c if c <= '\u{7f}' && hidden(c) => write!(out, "\\x{:02x}", u32::from(c)),
            c if hidden(c) => write!(out, "\\u{{{:x}}}", u32::from(c)),
            c => out.write_char(c),
        };
    }
    Cow::Owned(out)
}

/// JSON text (as serde_json writes it) with every [`hidden`] character
/// written as a `\uXXXX` escape: the same JSON once parsed, but safe to
/// print. Inside strings serde_json already escapes tabs, line feeds and
/// carriage returns, so those are layout (pretty printing) and stay; any
/// other such character is inside a string, where the escape means the
/// same character.
pub fn escape_json(json: &str) -> Cow<'_, str> {
    let escaped = |c: char| hidden(c) && !matches!(c, '\n' | '\r' | '\t');
    if !json.chars().any(escaped) {
        return Cow::Borrowed(json);
    }
    let mut out = String::with_capacity(json.len() + 16);
    for c in json.chars() {
        if escaped(c) {
            let mut units = [0u16; 2];
            for u in c.encode_utf16(&mut units) {
                // Writing to a String cannot fail.
                let _ = write!(out, "\\u{u:04x}");
            }
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_text_is_borrowed() {
        for s in ["ls -l", "grep 'a\\|b' C:\\x", "naïve café ✓ 日本語", ""] {
            assert!(matches!(escape(s), Cow::Borrowed(_)), "{s}");
        }
    }

    #[test]
    fn what_hides_a_command_is_shown() {
        for (s, want) in [
            // Carriage return: the terminal overwrites the line.
            ("git push --force\rls -l", "git push --force\\rls -l"),
            // ANSI: erase line, cursor up, colours.
            ("rm -rf ~\x1b[2K\x1b[1Als", "rm -rf ~\\x1b[2K\\x1b[1Als"),
            ("a\nb\tc\0d\x7fe", "a\\nb\\tc\\x00d\\x7fe"),
            // C1 CSI (U+009B) and NEL.
            ("x\u{9b}2Ky\u{85}", "x\\u{9b}2Ky\\u{85}"),
            // Bidi override and isolates.
            (
                "ls \u{202e}ecrof-- hsup tig",
                "ls \\u{202e}ecrof-- hsup tig",
            ),
            (
                "a\u{2066}b\u{2069}\u{200f}",
                "a\\u{2066}b\\u{2069}\\u{200f}",
            ),
            // Zero-width and invisible characters, separators, odd spaces.
            (
                "r\u{200b}m\u{feff}\u{2060}",
                "r\\u{200b}m\\u{feff}\\u{2060}",
            ),
            ("a\u{2028}b\u{2029}c", "a\\u{2028}b\\u{2029}c"),
            ("ls\u{a0}-l\u{3000}\u{ad}", "ls\\u{a0}-l\\u{3000}\\u{ad}"),
            (
                "x\u{e0041}\u{fe0f}\u{3164}",
                "x\\u{e0041}\\u{fe0f}\\u{3164}",
            ),
        ] {
            assert_eq!(escape(s), want);
        }
    }

    #[test]
    fn every_control_is_escaped() {
        for c in (0u32..0x20).chain(0x7f..0xa0).filter_map(char::from_u32) {
            let e = escape(&c.to_string()).into_owned();
            assert!(e.starts_with('\\') && e.is_ascii(), "{c:?} -> {e}");
        }
    }

    #[test]
    fn json_stays_the_same_json() {
        let command = "ls\u{202e}x\n\u{7f}\u{9b}\u{e0041}\u{200b}";
        let v = serde_json::json!({"command": command, "n": 1});
        let pretty = serde_json::to_string_pretty(&v).expect("JSON");
        for text in [v.to_string(), pretty] {
            let safe = escape_json(&text);
            let layout = |c: char| matches!(c, '\n' | '\r' | '\t');
            assert!(!safe.chars().any(|c| hidden(c) && !layout(c)), "{safe}");
            assert!(
                safe.contains("\\u202e") && safe.contains("\\udb40\\udc41"),
                "{safe}"
            );
            let back: serde_json::Value = serde_json::from_str(&safe).expect("valid JSON");
            assert_eq!(back, v);
        }
        assert!(matches!(escape_json("{\"a\":\"b\"}"), Cow::Borrowed(_)));
    }
}
