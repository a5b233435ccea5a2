//! Aho-Corasick: every form of every secret searched for in one pass over
//! the output, one byte at a time, so the scrubber can stream (no
//! backtracking, no look-ahead) and always knows how far back a match now
//! in progress began (the current state's depth).

/// Longest pattern, in symbols. The scrubber cuts longer forms into pieces
/// of at most this length, so no reader ever waits on more than this many
/// symbols and the positions it remembers fit in a fixed ring.
pub const MAX_PATTERN_LEN: usize = 256;

/// A state's transitions are searched linearly up to this many, by
/// bisection beyond (deep states nearly always have one).
const LINEAR_EDGES: usize = 8;

/// States this shallow get a full row of transitions (suffix fallbacks
/// resolved): ordinary output keeps the matcher at the root or one byte
/// into a pattern, and this makes each of its bytes one lookup. Deeper
/// rows would cost 1 KiB per state for states rarely visited.
const DENSE_DEPTH: u16 = 1;

/// The automaton for a fixed set of patterns; each pattern carries a tag
/// (the secret it belongs to). States are numbered breadth first: state 0
/// is the root (nothing matched), the shallow ones come next.
#[derive(Clone)]
pub struct Automaton {
    /// Transitions of state `s`: `edge_start[s]..edge_start[s + 1]` in
    /// `edge_byte` (sorted) and `edge_to`.
    edge_start: Vec<u32>,
    edge_byte: Vec<u8>,
    edge_to: Vec<u32>,
    /// Full rows for the states below `dense_states` (see [`DENSE_DEPTH`]):
    /// `dense[s * 256 + b]`.
    dense: Vec<u32>,
    dense_states: usize,
    /// No state numbered below this is as deep as the shortest pattern,
    /// so none has an output (states are numbered by depth).
    first_output: u32,
    /// The state for the longest proper suffix that is also a prefix.
    fail: Vec<u32>,
    /// Symbols matched so far in this state (how far back a match began).
    depth: Vec<u16>,
    /// The longest pattern ending in this state, itself or a suffix:
    /// (length, tag); length 0 when none.
    out: Vec<(u16, u16)>,
}

/// `edges` (from, byte, to) grouped by state in `n` states, each state's
/// in the order given: (start per state, bytes, targets).
fn group(n: usize, edges: &[(u32, u8, u32)]) -> (Vec<u32>, Vec<u8>, Vec<u32>) {
    let mut start = vec![0u32; n + 1];
    for &(from, _, _) in edges {
        start[from as usize + 1] += 1;
    }
    for i in 0..n {
        start[i + 1] += start[i];
    }
    let mut fill = start.clone();
    let mut bytes = vec![0u8; edges.len()];
    let mut to = vec![0u32; edges.len()];
    for &(from, b, t) in edges {
        let i = fill[from as usize] as usize;
        bytes[i] = b;
        to[i] = t;
        fill[from as usize] += 1;
    }
    (start, bytes, to)
}

impl Automaton {
    /// Patterns longer than [`MAX_PATTERN_LEN`] or empty are skipped (the
    /// caller cuts them first). A pattern given twice keeps its first tag.
    pub fn new<'a>(patterns: impl IntoIterator<Item = (&'a [u8], u16)>) -> Automaton {
        let mut pats: Vec<(&[u8], u16)> = patterns
            .into_iter()
            .filter(|(p, _)| !p.is_empty() && p.len() <= MAX_PATTERN_LEN)
            .collect();
        // Sorted (stably: the first tag stays first), the trie grows along
        // one path at a time and each state's edges come in byte order:
        // no lookups while building, no allocation per state.
        pats.sort_by(|a, b| a.0.cmp(b.0));
        let mut edges: Vec<(u32, u8, u32)> = Vec::new();
        let mut depth: Vec<u16> = vec![0];
        let mut end: Vec<(u16, u16)> = vec![(0, 0)];
        // The states along the previous pattern, by depth.
        let mut path: Vec<u32> = vec![0];
        let mut prev: &[u8] = &[];
        for (p, tag) in pats {
            let common = prev.iter().zip(p).take_while(|(a, b)| a == b).count();
            path.truncate(common + 1);
            for &b in &p[common..] {
                let t = depth.len() as u32;
                edges.push((path[path.len() - 1], b, t));
                // At most MAX_PATTERN_LEN deep: fits.
                depth.push(path.len() as u16);
                end.push((0, 0));
                path.push(t);
            }
            let s = path[p.len()] as usize;
            if end[s].0 == 0 {
                end[s] = (p.len() as u16, tag);
            }
            prev = p;
        }
        let n = depth.len();
        // Renumber breadth first: suffix states come before the states
        // that fall back to them, shallow states first.
        let (start, _, to) = group(n, &edges);
        let mut order: Vec<u32> = Vec::with_capacity(n);
        order.push(0);
        let mut i = 0;
        while i < order.len() {
            let s = order[i] as usize;
            order.extend_from_slice(&to[start[s] as usize..start[s + 1] as usize]);
            i += 1;
        }
        let mut id = vec![0u32; n];
        for (new, &old) in order.iter().enumerate() {
            id[old as usize] = new as u32;
        }
        for e in &mut edges {
            *e = (id[e.0 as usize], e.1, id[e.2 as usize]);
        }
        let (edge_start, edge_byte, edge_to) = group(n, &edges);
        let depth: Vec<u16> = order.iter().map(|&o| depth[o as usize]).collect();
        let mut out: Vec<(u16, u16)> = order.iter().map(|&o| end[o as usize]).collect();
        let dense_states = depth.iter().take_while(|&&d| d <= DENSE_DEPTH).count();
        let mut a = Automaton {
            edge_start,
            edge_byte,
            edge_to,
            dense: vec![0; 256],
            dense_states: 1,
            first_output: 0,
            fail: vec![0; n],
            depth,
            out: Vec::new(),
        };
        for e in 0..a.edge_start[1] as usize {
            a.dense[usize::from(a.edge_byte[e])] = a.edge_to[e];
        }
        // The root's children fall back to the root (fail 0).
        for s in 1..n {
            for e in a.edge_start[s] as usize..a.edge_start[s + 1] as usize {
                let (b, t) = (a.edge_byte[e], a.edge_to[e]);
                let mut f = a.fail[s];
                a.fail[t as usize] = loop {
                    if let Some(x) = a.child(f, b) {
                        break x;
                    }
                    if f == 0 {
                        break 0;
                    }
                    f = a.fail[f as usize];
                };
                // Its own pattern is longer than any suffix's.
                if out[t as usize].0 == 0 {
                    out[t as usize] = out[a.fail[t as usize] as usize];
                }
            }
        }
        a.out = out;
        let mut dense = vec![0u32; dense_states * 256];
        for s in 0..dense_states {
            for b in 0..=255u8 {
                dense[s * 256 + usize::from(b)] = a.next(s as u32, b);
            }
        }
        a.dense = dense;
        a.dense_states = dense_states;
        let shortest = a
            .out
            .iter()
            .map(|o| o.0)
            .filter(|&l| l > 0)
            .min()
            .unwrap_or(1);
        a.first_output = a.depth.iter().take_while(|&&d| d < shortest).count() as u32;
        a
    }

    /// Whether there are no patterns at all.
    pub fn is_empty(&self) -> bool {
        self.fail.len() == 1
    }

    /// The state `s` goes to on `b`, if it has a transition for it.
    #[inline]
    pub fn child(&self, s: u32, b: u8) -> Option<u32> {
        if s == 0 {
            return Some(self.dense[b as usize]).filter(|&t| t != 0);
        }
        let lo = self.edge_start[s as usize] as usize;
        let hi = self.edge_start[s as usize + 1] as usize;
        let bytes = &self.edge_byte[lo..hi];
        let i = if bytes.len() <= LINEAR_EDGES {
            bytes.iter().position(|&c| c == b)
        } else {
            bytes.binary_search(&b).ok()
        }?;
        Some(self.edge_to[lo + i])
    }

    /// The next state after `b` from a shallow state (one with a full
    /// row), or None for a deeper one.
    #[inline(always)]
    pub fn shallow(&self, s: u32, b: u8) -> Option<u32> {
        ((s as usize) < self.dense_states).then(|| self.dense[(s as usize) << 8 | usize::from(b)])
    }

    /// Whether `s` may have an output (cheaper than [`Self::output`]).
    #[inline(always)]
    pub fn may_output(&self, s: u32) -> bool {
        s >= self.first_output
    }

    /// The next state after `b`, falling back along suffixes.
    #[inline]
    pub fn next(&self, mut s: u32, b: u8) -> u32 {
        loop {
            if (s as usize) < self.dense_states {
                return self.dense[(s as usize) << 8 | usize::from(b)];
            }
            if let Some(t) = self.child(s, b) {
                return t;
            }
            s = self.fail[s as usize];
        }
    }

    #[inline]
    pub fn depth(&self, s: u32) -> usize {
        usize::from(self.depth[s as usize])
    }

    /// The longest pattern ending in `s`: (length, tag).
    #[inline]
    pub fn output(&self, s: u32) -> Option<(usize, u16)> {
        let (len, tag) = self.out[s as usize];
        (len > 0).then_some((usize::from(len), tag))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every (end index, length, tag) the automaton reports over `text`.
    fn matches(a: &Automaton, text: &[u8]) -> Vec<(usize, usize, u16)> {
        let mut s = 0;
        let mut out = Vec::new();
        for (i, &b) in text.iter().enumerate() {
            s = a.next(s, b);
            if let Some((len, tag)) = a.output(s) {
                out.push((i, len, tag));
            }
        }
        out
    }

    #[test]
    fn finds_overlapping_and_nested_patterns() {
        let pats: [(&[u8], u16); 4] = [(b"he", 0), (b"she", 1), (b"his", 2), (b"hers", 3)];
        let a = Automaton::new(pats);
        // "ushers": she (ends 3), he is its suffix, hers (ends 5).
        assert_eq!(matches(&a, b"ushers"), vec![(3, 3, 1), (5, 4, 3)]);
        assert_eq!(matches(&a, b"ahishe"), vec![(3, 3, 2), (5, 3, 1)]);
    }

    #[test]
    fn depth_is_the_match_in_progress() {
        let a = Automaton::new([(b"abcd".as_slice(), 0)]);
        let mut s = 0;
        for b in *b"xxabab" {
            s = a.next(s, b);
        }
        assert_eq!(a.depth(s), 2);
        assert!(Automaton::new([(b"".as_slice(), 0)]).is_empty());
    }
}
