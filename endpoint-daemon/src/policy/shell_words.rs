//! Word-level helpers of `crate::shell`: the quoting a piece of a word is
//! in, whether the word is a glob or brace expansion, and bash's `$'…'`.

use super::Arg;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Quote {
    Bare,
    Double,
    HereDoc,
}

/// What a word has shown so far of a glob (`*`, `?`, `[…]`) or a brace
/// expansion (`{a,b}`): a lone `[` (the `test` builtin) or `{}` is text.
#[derive(Debug, Default)]
pub(super) struct GlobScan {
    bracket: bool,
    brace: bool,
    brace_body: bool,
}

impl GlobScan {
    pub(super) fn bare(&mut self, t: &str, arg: &mut Arg) {
        for c in t.chars() {
            match c {
                '*' | '?' => arg.expands = true,
                '[' => self.bracket = true,
                ']' if self.bracket => arg.expands = true,
                '{' => {
                    self.brace = true;
                    self.brace_body = false;
                }
                '}' if self.brace && self.brace_body => arg.expands = true,
                _ => self.brace_body |= self.brace,
            }
        }
    }

    /// Quoted text cannot open a bracket or brace, but may close one.
    pub(super) fn quoted(&mut self, t: &str, arg: &mut Arg) {
        if self.bracket && t.contains(']') {
            arg.expands = true;
        }
        self.brace_body |= self.brace && !t.is_empty();
    }

    /// An expansion: its value may hold anything.
    pub(super) fn other(&mut self, arg: &mut Arg) {
        if self.bracket {
            arg.expands = true;
        }
        self.brace_body |= self.brace;
    }
}

/// Decodes bash's `$'…'` escapes.
pub(super) fn ansi_c(t: &str) -> String {
    let mut out = String::with_capacity(t.len());
    let cs: Vec<char> = t.chars().collect();
    let mut i = 0;
    let digits = |from: usize, max: usize, radix: u32| -> (u32, usize) {
        let mut v = 0u32;
        let mut n = 0;
        while n < max {
            match cs.get(from + n).and_then(|c| c.to_digit(radix)) {
                Some(d) => {
                    v = v.saturating_mul(radix).saturating_add(d);
                    n += 1;
                }
                None => break,
            }
        }
        (v, n)
    };
    while i < cs.len() {
        if cs[i] != '\\' || i + 1 == cs.len() {
            out.push(cs[i]);
            i += 1;
            continue;
        }
        let c = cs[i + 1];
        i += 2;
        let simple = match c {
            'a' => Some('\u{7}'),
            'b' => Some('\u{8}'),
            'e' | 'E' => Some('\u{1b}'),
            'f' => Some('\u{c}'),
            'n' => Some('\n'),
            'r' => Some('\r'),
            't' => Some('\t'),
            'v' => Some('\u{b}'),
            '\\' | '\'' | '"' | '?' => Some(c),
            _ => None,
        };
        if let Some(s) = simple {
            out.push(s);
            continue;
        }
        let (v, n) = match c {
            '0'..='7' => {
                let (v, n) = digits(i - 1, 3, 8);
                i -= 1;
                (v, n)
            }
            'x' => digits(i, 2, 16),
            'u' => digits(i, 4, 16),
            'U' => digits(i, 8, 16),
            'c' if i < cs.len() => {
                let ctl = (cs[i] as u32) & 0x1f;
                i += 1;
                out.extend(char::from_u32(ctl));
                continue;
            }
            _ => {
                out.push('\\');
                out.push(c);
                continue;
            }
        };
        if n == 0 {
            out.push('\\');
            out.push(c);
            continue;
        }
        i += n;
        out.extend(char::from_u32(v));
    }
    out
}
