//! What an operand may be when its command runs, as shapes a pattern's
//! targets are tested against. A brace expansion is each of its words; a
//! glob any name it matches; a variable or substitution any text, `/` and
//! `..` included, so a path that has one may end up anywhere that ends
//! like the text after it (`"$X/build"` may be `/build`); find's `{}` any
//! path below its start; a relative path is taken from the request's
//! directory, or from anywhere when the line changes directory. An operand
//! matches a target when some text fits both: the test is an intersection
//! of two globs, never a guess at the value.

use std::path::Path;

use crate::shell::{Arg, Part};

/// One piece of what an operand may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tok {
    /// This character.
    Ch(char),
    /// Any one character but `/` (`?`, `[…]`).
    One,
    /// Any run of characters without `/` (`*`).
    Star,
    /// Any run of characters at all (a variable, a substitution).
    Any,
}

/// Most words a brace expansion is followed into; past it, the operand
/// may be anything.
const MAX_SHAPES: usize = 64;
/// Longest shape compared; a longer operand may be anything.
const MAX_SHAPE_LEN: usize = 4096;

/// A character of the word, or a part only known when it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Item {
    C(char),
    Dyn,
    Below,
}

/// Pieces before path resolution: `Below` (find's `{}` under its start)
/// is any text, but cannot climb out of what precedes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum P {
    T(Tok),
    Below,
}

fn items(arg: &Arg) -> Vec<Item> {
    let mut out = Vec::new();
    for p in &arg.parts {
        match p {
            Part::Lit(t) => out.extend(t.chars().map(Item::C)),
            Part::Dyn => out.push(Item::Dyn),
            Part::Below => out.push(Item::Below),
        }
    }
    out
}

/// The words a brace expansion makes of `items` (the word itself too: its
/// braces may have been quoted); None past [`MAX_SHAPES`].
fn braces(items: &[Item], out: &mut Vec<Vec<Item>>) -> Option<()> {
    if out.len() >= MAX_SHAPES {
        return None;
    }
    for (i, it) in items.iter().enumerate() {
        if *it != Item::C('{') {
            continue;
        }
        // The matching `}`, and the commas at this level.
        let (mut depth, mut commas, mut close) = (0usize, Vec::new(), None);
        for (j, x) in items.iter().enumerate().skip(i + 1) {
            match x {
                Item::C('{') => depth += 1,
                Item::C('}') if depth == 0 => {
                    close = Some(j);
                    break;
                }
                Item::C('}') => depth -= 1,
                Item::C(',') if depth == 0 => commas.push(j),
                _ => {}
            }
        }
        let Some(j) = close else {
            continue;
        };
        let (prefix, body, suffix) = (&items[..i], &items[i + 1..j], &items[j + 1..]);
        let sequence = body.windows(2).any(|w| w == [Item::C('.'), Item::C('.')]);
        if commas.is_empty() && !sequence {
            continue;
        }
        let mut alternatives: Vec<Vec<Item>> = Vec::new();
        if commas.is_empty() {
            // `{a..z}`, `{/..0}`: some characters or numbers, `/` among them.
            alternatives.push(vec![Item::Dyn]);
        } else {
            let mut from = i + 1;
            for &c in commas.iter().chain(std::iter::once(&j)) {
                alternatives.push(items[from..c].to_vec());
                from = c + 1;
            }
        }
        for alt in alternatives {
            let mut word = prefix.to_vec();
            word.extend(alt);
            word.extend_from_slice(suffix);
            braces(&word, out)?;
        }
        // As written, in case the braces were quoted.
        out.push(items.to_vec());
        return (out.len() <= MAX_SHAPES).then_some(());
    }
    out.push(items.to_vec());
    (out.len() <= MAX_SHAPES).then_some(())
}

/// Glob characters as what they match (when the word may be a glob).
fn pieces(items: &[Item], glob: bool) -> Vec<P> {
    let mut out = Vec::with_capacity(items.len());
    let mut i = 0;
    while i < items.len() {
        let p = match items[i] {
            Item::Dyn => P::T(Tok::Any),
            Item::Below => P::Below,
            Item::C('*') if glob => P::T(Tok::Star),
            Item::C('?') if glob => P::T(Tok::One),
            Item::C('[') if glob => {
                // `[…]` up to its `]` (a `]` right after `[` or `[!` is in it).
                let mut j = i + 1;
                if matches!(items.get(j), Some(Item::C('!' | '^'))) {
                    j += 1;
                }
                if matches!(items.get(j), Some(Item::C(']'))) {
                    j += 1;
                }
                while j < items.len() && items[j] != Item::C(']') {
                    j += 1;
                }
                if j < items.len() {
                    i = j;
                    P::T(Tok::One)
                } else {
                    P::T(Tok::Ch('['))
                }
            }
            Item::C(c) => P::T(Tok::Ch(c)),
        };
        out.push(p);
        i += 1;
    }
    out
}

/// The shapes of `arg` as text (no paths resolved).
pub fn text_shapes(arg: &Arg) -> Vec<Vec<Tok>> {
    expansions(arg)
        .into_iter()
        .map(|ps| {
            ps.into_iter()
                .map(|p| match p {
                    P::T(t) => t,
                    P::Below => Tok::Any,
                })
                .collect()
        })
        .collect()
}

fn expansions(arg: &Arg) -> Vec<Vec<P>> {
    let items = items(arg);
    let mut words = Vec::new();
    if !arg.expands {
        return vec![pieces(&items, false)];
    }
    if braces(&items, &mut words).is_none() {
        return vec![vec![P::T(Tok::Any)]];
    }
    words.iter().map(|w| pieces(w, true)).collect()
}

/// Where relative paths start.
#[derive(Debug, Clone, Copy, Default)]
pub struct From<'a> {
    /// The request's directory, when it exists.
    pub cwd: Option<&'a Path>,
    /// The line changes directory: a relative path may start anywhere.
    pub cwd_moves: bool,
}

/// The shapes of `arg` as a path, `.` and `..` resolved, relative paths
/// made absolute when the directory is known. With `rm`, a relative
/// operand whose last part is `.` or `..` has none: POSIX rm refuses it.
pub fn path_shapes(arg: &Arg, from: &From, rm: bool) -> Vec<Vec<Tok>> {
    let mut out = Vec::new();
    for ps in expansions(arg) {
        if let Some(shape) = resolve(&ps, from, rm) {
            // A path that exists may be a link elsewhere (`/dev/disk/…`).
            if let Some(real) = literal(&shape)
                .and_then(|t| std::fs::canonicalize(t).ok())
                .map(|p| p.to_string_lossy().into_owned())
            {
                out.push(real.chars().map(Tok::Ch).collect());
            }
            out.push(shape);
        }
    }
    out
}

fn literal(shape: &[Tok]) -> Option<String> {
    shape
        .iter()
        .map(|t| match t {
            Tok::Ch(c) => Some(*c),
            _ => None,
        })
        .collect()
}

fn resolve(ps: &[P], from: &From, rm: bool) -> Option<Vec<Tok>> {
    if ps.is_empty() || ps.len() > MAX_SHAPE_LEN {
        return (!ps.is_empty()).then(|| vec![Tok::Any]);
    }
    let absolute = ps.first() == Some(&P::T(Tok::Ch('/')));
    let comps: Vec<&[P]> = ps
        .split(|p| *p == P::T(Tok::Ch('/')))
        .filter(|c| !c.is_empty())
        .collect();
    let is = |c: &[P], t: &str| {
        c.len() == t.len()
            && c.iter()
                .zip(t.chars())
                .all(|(p, ch)| *p == P::T(Tok::Ch(ch)))
    };
    // (Only relative ones: `/.` is refused too, but is kept a match.)
    if rm && !absolute && comps.last().is_some_and(|c| is(c, ".") || is(c, "..")) {
        return None;
    }
    // A variable may hold `/` and `..`, as may a glob that starts with a
    // dot (`.?`): all before the last of them may be climbed out of.
    let climbs = |c: &[P]| {
        c.contains(&P::T(Tok::Any))
            || (c.first() == Some(&P::T(Tok::Ch('.')))
                && c.iter().any(|p| matches!(p, P::T(Tok::One | Tok::Star))))
    };
    let (mut shape, start) = match comps.iter().rposition(|c| climbs(c)) {
        Some(k) => {
            let c = comps[k];
            // What follows the last variable in that part.
            let tail = match c.iter().rposition(|p| *p == P::T(Tok::Any)) {
                Some(a) => &c[a + 1..],
                None => &[][..],
            };
            let mut shape = vec![Tok::Any];
            shape.extend(tail.iter().map(|p| tok(*p)));
            (vec![shape], k + 1)
        }
        None if absolute => (Vec::new(), 0),
        None if from.cwd_moves => (vec![vec![Tok::Any]], 0),
        None => match from.cwd {
            Some(cwd) => {
                let cwd = cwd.to_string_lossy();
                let parts = cwd
                    .split('/')
                    .filter(|c| !c.is_empty())
                    .map(|c| c.chars().map(Tok::Ch).collect())
                    .collect();
                (parts, 0)
            }
            // Unknown directory: a relative path stays relative.
            None => return Some(relative(&comps, &is)),
        },
    };
    // The first part is a variable's text: climbing out of it is anywhere.
    let free = shape.first().is_some_and(|c| c.first() == Some(&Tok::Any));
    let mut below = false;
    for c in &comps[start..] {
        if is(c, ".") {
            continue;
        }
        if is(c, "..") {
            // Out of find's `{}` or a variable's text: anywhere.
            if below || (free && shape.len() == 1) {
                return Some(vec![Tok::Any]);
            }
            // `/..` is `/`.
            shape.pop();
            continue;
        }
        below |= c.contains(&P::Below);
        shape.push(c.iter().map(|p| tok(*p)).collect());
    }
    let mut out = Vec::new();
    for (i, c) in shape.iter().enumerate() {
        if !(i == 0 && free) {
            out.push(Tok::Ch('/'));
        }
        out.extend(c.iter().copied());
    }
    if out.is_empty() {
        out.push(Tok::Ch('/'));
    }
    Some(out)
}

fn tok(p: P) -> Tok {
    match p {
        P::T(t) => t,
        P::Below => Tok::Any,
    }
}

/// A relative path with no directory to start from, `.` and `..`
/// resolved as far as they can be.
fn relative(comps: &[&[P]], is: &dyn Fn(&[P], &str) -> bool) -> Vec<Tok> {
    let mut parts: Vec<Vec<Tok>> = Vec::new();
    for c in comps {
        if is(c, ".") {
            continue;
        }
        let up = parts
            .last()
            .is_some_and(|l| *l != [Tok::Ch('.'), Tok::Ch('.')]);
        if is(c, "..") && up {
            parts.pop();
            continue;
        }
        parts.push(c.iter().map(|p| tok(*p)).collect());
    }
    if parts.is_empty() {
        return vec![Tok::Ch('.')];
    }
    parts.join(&Tok::Ch('/'))
}

/// A pattern's pieces: `[*]` is a literal star.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pt {
    Ch(char),
    One,
    Star,
}

fn pattern(p: &str) -> Vec<Pt> {
    let cs: Vec<char> = p.chars().collect();
    let mut out = Vec::with_capacity(cs.len());
    let mut i = 0;
    while i < cs.len() {
        if cs[i..].starts_with(&['[', '*', ']']) {
            out.push(Pt::Ch('*'));
            i += 3;
            continue;
        }
        out.push(match cs[i] {
            '*' => Pt::Star,
            '?' => Pt::One,
            c => Pt::Ch(c),
        });
        i += 1;
    }
    out
}

/// Whether some text fits both `shape` and the glob `pat` (whose `*` and
/// `?` cross `/` only with `cross_slash`).
pub fn meets(shape: &[Tok], pat: &str, cross_slash: bool) -> bool {
    if shape.len() > MAX_SHAPE_LEN {
        return true;
    }
    let pat = pattern(pat);
    let (n, m) = (shape.len(), pat.len());
    // reach[i][j]: shape[..i] and pat[..j] can match the same text.
    let mut reach = vec![vec![false; m + 1]; n + 1];
    reach[0][0] = true;
    let repeats = |t: Tok| matches!(t, Tok::Star | Tok::Any);
    for i in 0..=n {
        for j in 0..=m {
            if !reach[i][j] {
                continue;
            }
            if i < n && repeats(shape[i]) {
                reach[i + 1][j] = true;
            }
            if j < m && pat[j] == Pt::Star {
                reach[i][j + 1] = true;
            }
            if i < n && j < m && one_char(shape[i], pat[j], cross_slash) {
                let ni = if repeats(shape[i]) { i } else { i + 1 };
                let nj = if pat[j] == Pt::Star { j } else { j + 1 };
                if (ni, nj) != (i, j) {
                    reach[ni][nj] = true;
                }
            }
        }
    }
    reach[n][m]
}

/// Whether one character can be matched by both.
fn one_char(s: Tok, p: Pt, cross_slash: bool) -> bool {
    match (s, p) {
        (Tok::Any, _) => true,
        (Tok::Ch(a), Pt::Ch(b)) => a == b,
        (Tok::Ch(a), _) => cross_slash || a != '/',
        (_, Pt::Ch(b)) => b != '/',
        _ => true,
    }
}
