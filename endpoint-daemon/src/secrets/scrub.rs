//! The [`Scrubber`]: takes secret values, in every form `forms` lists,
//! out of a command's output before it leaves the machine.
//!
//! The output is read three ways (both streams in arrival order, stdout
//! alone, stderr alone), each by every reader of `normalise`, each reader
//! feeding one Aho-Corasick automaton a symbol at a time. A match takes
//! out the output bytes from its first symbol's first byte to its last
//! symbol's last byte, whatever the reader skipped or decoded in between
//! (line breaks, offset columns, quotes, escapes). Bytes are held back
//! only while some reader may still be inside a match that began at or
//! before them, and never more than [`MAX_HELD_BYTES`] per stream.

use std::collections::{BTreeMap, VecDeque};

use super::automaton::{Automaton, MAX_PATTERN_LEN};
use super::forms::forms;
use super::normalise::{DumpLines, Step, Sym, Unescape, MAX_DUMP_LINE, MAX_ESCAPE_LEN};
use super::MIN_VALUE_LEN;

/// Longest run of whitespace (in output bytes) a text match in progress
/// skips: a line break and the next row's indentation, or the column
/// spaces of `od -An`. A longer run ends the match, so nothing waits long
/// on one that may not come.
const MAX_WRAP_GAP: usize = 16;

/// Most output bytes one symbol of the text readers spans, with the
/// whitespace skipped before it: an escape of escapes, decoded twice.
const MAX_TEXT_SYMBOL_SPAN: usize = MAX_ESCAPE_LEN * MAX_ESCAPE_LEN + MAX_WRAP_GAP;

/// Most bytes of one stream held back at any time. The text reader waits
/// on at most a pattern's worth of symbols; the dump reader on at most a
/// pattern's worth of data bytes, one per line at worst, plus the line it
/// is reading.
pub const MAX_HELD_BYTES: usize = MAX_PATTERN_LEN * (MAX_DUMP_LINE + 1) + MAX_DUMP_LINE;

/// The positions a reader remembers: where each of its last
/// [`MAX_PATTERN_LEN`] symbols began, enough for any match's start.
const RING: usize = MAX_PATTERN_LEN;

const _: () = assert!(MAX_TEXT_SYMBOL_SPAN * MAX_PATTERN_LEN < MAX_HELD_BYTES);

/// Which output stream bytes came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Out = 0,
    Err = 1,
}

/// A match: output sequence numbers `start..=end`, for the secret `tag`.
#[derive(Clone)]
struct Hit {
    start: u64,
    end: u64,
    tag: u16,
}

/// One reader's matching state.
#[derive(Clone)]
struct Track {
    state: u32,
    /// Where the last [`RING`] symbols began, by symbol count.
    starts: Box<[u64; RING]>,
    count: usize,
    /// Whitespace skipped since the last symbol.
    gap: usize,
}

impl Default for Track {
    fn default() -> Self {
        Track {
            state: 0,
            starts: Box::new([0; RING]),
            count: 0,
            gap: 0,
        }
    }
}

fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c)
}

impl Track {
    fn reset(&mut self) {
        self.state = 0;
        self.gap = 0;
    }

    /// The start of the `k`th symbol back (1: the last).
    fn back(&self, k: usize) -> u64 {
        self.starts[self.count.wrapping_sub(k) % RING]
    }

    /// Whether this track will do with the same input exactly what `o`
    /// does: the same state, reached over the same output bytes (only the
    /// symbols of the match in progress are ever looked at again).
    fn same_as(&self, o: &Track, ac: &Automaton) -> bool {
        self.state == o.state
            && (self.state == 0
                || (self.gap == o.gap
                    && (1..=ac.depth(self.state)).all(|k| self.back(k) == o.back(k))))
    }

    fn copy_from(&mut self, o: &Track, ac: &Automaton) {
        self.state = o.state;
        self.gap = o.gap;
        self.count = o.count;
        for k in 1..=ac.depth(o.state) {
            let i = o.count.wrapping_sub(k) % RING;
            self.starts[i] = o.starts[i];
        }
    }

    /// The first byte of the match in progress, if any.
    fn hold(&self, ac: &Automaton) -> Option<u64> {
        let d = ac.depth(self.state);
        (d > 0).then(|| self.back(d))
    }

    #[inline(always)]
    fn enter(&mut self, ac: &Automaton, t: u32, s: Sym, hits: &mut Vec<Hit>) {
        self.state = t;
        self.gap = 0;
        self.starts[self.count % RING] = s.start;
        self.count = self.count.wrapping_add(1);
        if ac.may_output(t) {
            self.output(ac, t, s.end, hits);
        }
    }

    /// Kept out of line: reached only deep in a pattern.
    #[inline(never)]
    fn output(&mut self, ac: &Automaton, t: u32, end: u64, hits: &mut Vec<Hit>) {
        if let Some((len, tag)) = ac.output(t) {
            hits.push(Hit {
                start: self.back(len),
                end,
                tag,
            });
        }
    }

    /// A symbol matched exactly.
    #[inline]
    fn exact(&mut self, ac: &Automaton, s: Sym, hits: &mut Vec<Hit>) {
        let t = ac.next(self.state, s.byte);
        if t != 0 || self.state != 0 {
            self.enter(ac, t, s, hits);
        }
    }

    /// A symbol of text: inside a match, whitespace the pattern does not
    /// have there is skipped (a wrapped or column-spaced encoding). The
    /// usual case (at the root or one byte in, no whitespace to skip) is
    /// one table lookup, kept inline.
    #[inline(always)]
    fn text(&mut self, ac: &Automaton, s: Sym, hits: &mut Vec<Hit>) {
        let at = self.state;
        if at == 0 || !is_space(s.byte) {
            if let Some(t) = ac.shallow(at, s.byte) {
                if t != 0 || at != 0 {
                    self.enter(ac, t, s, hits);
                }
                return;
            }
        }
        self.text_deep(ac, s, hits);
    }

    /// Deeper states and whitespace inside a match (out of line, so the
    /// usual case stays small enough to inline).
    #[inline(never)]
    fn text_deep(&mut self, ac: &Automaton, s: Sym, hits: &mut Vec<Hit>) {
        if self.state != 0 && is_space(s.byte) {
            match ac.child(self.state, s.byte) {
                Some(t) => self.enter(ac, t, s, hits),
                None => {
                    let span = usize::try_from(s.end - s.start).unwrap_or(usize::MAX);
                    self.gap = self.gap.saturating_add(span).saturating_add(1);
                    if self.gap > MAX_WRAP_GAP {
                        self.reset();
                    }
                }
            }
            return;
        }
        self.exact(ac, s, hits);
    }
}

/// The two automata: text forms, dump forms.
#[derive(Clone)]
struct Automata {
    text: Automaton,
    dump: Automaton,
    needs_raw: bool,
    needs_twice: bool,
}

/// One way of reading the output (see the module docs) with all readers.
#[derive(Clone, Default)]
struct View {
    unescape: Unescape,
    /// The decoded text.
    text: Track,
    /// The decoded text decoded again, when some value has a character
    /// that escaping changes (escaped text inside escaped text).
    unescape_twice: Unescape,
    twice: Track,
    /// The raw text, when some value has a character that decoding
    /// changes (it would not be found in the decoded text as printed).
    raw: Track,
    /// Dumps: their data column as bytes, their ASCII column as text.
    lines: DumpLines,
    data: Track,
    ascii: Track,
}

impl View {
    fn push(&mut self, ac: &Automata, base: u64, chunk: &[u8], hits: &mut Vec<Hit>) {
        for (seq, &b) in (base..).zip(chunk) {
            self.step(ac, seq, b, hits);
        }
    }

    /// One output byte, through every reader.
    #[inline(always)]
    fn step(&mut self, ac: &Automata, seq: u64, b: u8, hits: &mut Vec<Hit>) {
        let s = Sym {
            byte: b,
            start: seq,
            end: seq,
        };
        let (text, again, twice) = (&mut self.text, &mut self.unescape_twice, &mut self.twice);
        self.unescape.push(s, &mut |d| {
            text.text(&ac.text, d, hits);
            if ac.needs_twice {
                again.push(d, &mut |dd| twice.text(&ac.text, dd, hits));
            }
        });
        if ac.needs_raw {
            self.raw.text(&ac.text, s, hits);
        }
        let step = self.lines.push(seq, b);
        if step != Step::Nothing {
            self.dump_step(ac, step, hits);
        }
    }

    /// Whether this view will do with the same input exactly what `o`
    /// does (see [`Track::same_as`]).
    fn same_as(&self, o: &View, ac: &Automata) -> bool {
        self.unescape.same_as(&o.unescape)
            && self.unescape_twice.same_as(&o.unescape_twice)
            && self.lines.same_as(&o.lines)
            && self.text.same_as(&o.text, &ac.text)
            && self.twice.same_as(&o.twice, &ac.text)
            && self.raw.same_as(&o.raw, &ac.text)
            && self.data.same_as(&o.data, &ac.dump)
            && self.ascii.same_as(&o.ascii, &ac.dump)
    }

    fn copy_from(&mut self, o: &View, ac: &Automata) {
        self.unescape = o.unescape.clone();
        self.unescape_twice = o.unescape_twice.clone();
        self.lines.copy_from(&o.lines);
        self.text.copy_from(&o.text, &ac.text);
        self.twice.copy_from(&o.twice, &ac.text);
        self.raw.copy_from(&o.raw, &ac.text);
        self.data.copy_from(&o.data, &ac.dump);
        self.ascii.copy_from(&o.ascii, &ac.dump);
    }

    /// What a dump line (or a line that is none) does to the dump
    /// readers; out of line, as most bytes do nothing to them.
    #[inline(never)]
    fn dump_step(&mut self, ac: &Automata, step: Step, hits: &mut Vec<Hit>) {
        match step {
            Step::Nothing => {}
            Step::NotADump => {
                self.data.reset();
                self.ascii.reset();
            }
            Step::Line => {
                for &s in self.lines.data() {
                    self.data.exact(&ac.dump, s, hits);
                }
                if self.lines.ascii().is_empty() {
                    self.ascii.reset();
                }
                for &s in self.lines.ascii() {
                    self.ascii.exact(&ac.dump, s, hits);
                }
            }
        }
    }

    /// No more input: decide what is pending and wait for nothing.
    fn finish(&mut self, ac: &Automata, hits: &mut Vec<Hit>) {
        let (text, again, twice) = (&mut self.text, &mut self.unescape_twice, &mut self.twice);
        self.unescape.finish(&mut |d| {
            text.text(&ac.text, d, hits);
            if ac.needs_twice {
                again.push(d, &mut |dd| twice.text(&ac.text, dd, hits));
            }
        });
        self.unescape_twice
            .finish(&mut |dd| twice.text(&ac.text, dd, hits));
        let step = self.lines.finish();
        self.dump_step(ac, step, hits);
        for t in [
            &mut self.text,
            &mut self.twice,
            &mut self.raw,
            &mut self.data,
            &mut self.ascii,
        ] {
            t.reset();
        }
    }

    /// The first byte some reader may still need.
    fn hold(&self, ac: &Automata) -> Option<u64> {
        [
            self.unescape.held_from(),
            self.text.hold(&ac.text),
            self.unescape_twice.held_from(),
            self.twice.hold(&ac.text),
            self.raw.hold(&ac.text),
            self.lines.held_from(),
            self.data.hold(&ac.dump),
            self.ascii.hold(&ac.dump),
        ]
        .into_iter()
        .flatten()
        .min()
    }
}

/// A stream's bytes not emitted yet, in runs of consecutive sequence
/// numbers.
#[derive(Clone, Default)]
struct Pending {
    bytes: VecDeque<u8>,
    runs: VecDeque<(u64, usize)>,
}

impl Pending {
    fn first(&self) -> Option<u64> {
        self.runs.front().map(|r| r.0)
    }
}

/// Bytes a match took, per stream: `start → end` (inclusive), disjoint.
type Taken = BTreeMap<u64, u64>;

/// Marks `start..=end` taken, merged with the ranges it overlaps or
/// touches.
fn take(taken: &mut Taken, mut start: u64, mut end: u64) {
    if let Some((&s, &e)) = taken.range(..=start).next_back() {
        if e.saturating_add(1) >= start {
            start = s;
            end = end.max(e);
            taken.remove(&s);
        }
    }
    while let Some((&s, &e)) = taken.range(start..).next() {
        if s > end.saturating_add(1) {
            break;
        }
        end = end.max(e);
        taken.remove(&s);
    }
    taken.insert(start, end);
}

/// Takes secret values (and their common encodings) out of a command's
/// output before it leaves the machine: within stdout, within stderr, and
/// across the two as the command interleaves them (half a value on each).
/// A run of taken bytes becomes the handle of the first match that begins
/// in it, or nothing when every match in it began in the other stream.
/// Every byte is emitted once. (Clone copies one with everything it
/// holds; tests build one and copy it for each case.)
#[derive(Clone)]
pub struct Scrubber {
    ac: Box<Automata>,
    /// No secret to look for: output passes as it is.
    empty: bool,
    /// Both streams, stdout, stderr.
    views: [View; 3],
    /// `Some(st)`: the both-streams view is in the same state as stream
    /// `st`'s and nothing of the other stream came since, so it is not
    /// updated (the two would do the same work and find the same matches)
    /// until the other stream prints or one ends. Most commands print
    /// mostly to one stream: this halves the work for them.
    synced: Option<usize>,
    out: Output,
    ended: [bool; 2],
    hits: Vec<Hit>,
}

/// What is held back, what matches took, and where their handles go.
#[derive(Clone)]
struct Output {
    handles: Vec<Vec<u8>>,
    next_seq: u64,
    pending: [Pending; 2],
    taken: [Taken; 2],
    /// Where matches begin: sequence number → secret.
    marks: BTreeMap<u64, u16>,
    /// The handle already shown for the taken run being emitted.
    shown: [Option<u16>; 2],
}

impl Scrubber {
    pub fn new(values: &BTreeMap<String, String>) -> Scrubber {
        let kept: Vec<(&String, &String)> = values
            .iter()
            .filter(|(_, v)| v.len() >= MIN_VALUE_LEN)
            .collect();
        let f = forms(kept.iter().map(|(_, v)| v.as_str()));
        let text = Automaton::new(f.text.iter().map(|(p, t)| (p.as_slice(), *t)));
        let dump = Automaton::new(f.dump.iter().map(|(p, t)| (p.as_slice(), *t)));
        Scrubber {
            empty: text.is_empty(),
            ac: Box::new(Automata {
                text,
                dump,
                needs_raw: f.needs_raw,
                needs_twice: f.needs_twice,
            }),
            views: Default::default(),
            synced: None,
            out: Output {
                handles: kept
                    .iter()
                    .map(|(k, _)| format!("{{{{secret:{k}}}}}").into_bytes())
                    .collect(),
                next_seq: 0,
                pending: Default::default(),
                taken: Default::default(),
                marks: BTreeMap::new(),
                shown: [None; 2],
            },
            ended: [false; 2],
            hits: Vec::new(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.empty
    }

    /// Brings the both-streams view up to date (see `synced`).
    fn unsync(&mut self) {
        if let Some(st) = self.synced.take() {
            let (shared, own) = self.views.split_at_mut(1);
            shared[0].copy_from(&own[st], &self.ac);
        }
    }

    /// A chunk of `stream`; returns what may be sent now of each stream
    /// (stdout, stderr).
    pub fn push(&mut self, stream: Stream, chunk: &[u8]) -> [Vec<u8>; 2] {
        let st = stream as usize;
        if self.empty {
            let mut out: [Vec<u8>; 2] = Default::default();
            out[st] = chunk.to_vec();
            return out;
        }
        let base = self.out.next_seq;
        self.out.next_seq += chunk.len() as u64;
        if !chunk.is_empty() {
            self.out.pending[st].bytes.extend(chunk);
            self.out.pending[st].runs.push_back((base, chunk.len()));
        }
        let mut done = 0;
        if self.synced != Some(st) {
            self.unsync();
            let (shared, own) = self.views.split_at_mut(1);
            let (shared, own) = (&mut shared[0], &mut own[st]);
            let mut both = Vec::new();
            for (seq, &b) in (base..).zip(chunk) {
                own.step(&self.ac, seq, b, &mut self.hits);
                shared.step(&self.ac, seq, b, &mut both);
                done += 1;
                // Line ends are where the views most often agree again.
                if b == b'\n' && shared.same_as(own, &self.ac) {
                    self.synced = Some(st);
                    break;
                }
            }
            // Each stream on its own first: a value whole in one stream
            // gets its handle there, whatever the other stream did.
            self.out.apply(&mut self.hits, &[st]);
            self.out.apply(&mut both, &[0, 1]);
        }
        if done < chunk.len() {
            // Synced: what this stream's view finds, the both-streams view
            // would find too.
            let rest = &chunk[done..];
            self.views[1 + st].push(&self.ac, base + done as u64, rest, &mut self.hits);
            self.out.apply(&mut self.hits, &[0, 1]);
        }
        self.emit()
    }

    /// `stream` ended: what is held for it (and, once both ended, all the
    /// rest) is decided and sent.
    pub fn finish(&mut self, stream: Stream) -> [Vec<u8>; 2] {
        let st = stream as usize;
        self.ended[st] = true;
        if self.empty {
            return Default::default();
        }
        self.unsync();
        self.views[1 + st].finish(&self.ac, &mut self.hits);
        self.out.apply(&mut self.hits, &[st]);
        if self.ended.iter().all(|e| *e) {
            self.views[0].finish(&self.ac, &mut self.hits);
            self.out.apply(&mut self.hits, &[0, 1]);
        }
        self.emit()
    }

    /// Emits, per stream, what no reader may still need.
    fn emit(&mut self) -> [Vec<u8>; 2] {
        let shared = self.views[self.synced.map_or(0, |st| 1 + st)].hold(&self.ac);
        let mut out: [Vec<u8>; 2] = Default::default();
        for (st, out) in out.iter_mut().enumerate() {
            let hold = [shared, self.views[1 + st].hold(&self.ac)]
                .into_iter()
                .flatten()
                .min()
                .unwrap_or(u64::MAX);
            self.out.emit_stream(st, hold, out);
        }
        self.out.forget_marks();
        out
    }
}

impl Output {
    /// Marks what `hits` took in `streams`.
    fn apply(&mut self, hits: &mut Vec<Hit>, streams: &[usize]) {
        for h in hits.drain(..) {
            for &s in streams {
                // Only bytes still pending can be taken (a later byte
                // cannot be inside an earlier match).
                if self.pending[s].first().is_some_and(|f| f <= h.end) {
                    take(&mut self.taken[s], h.start, h.end);
                }
            }
            self.marks.entry(h.start).or_insert(h.tag);
        }
    }

    /// Marks of bytes both streams are past can never be shown.
    fn forget_marks(&mut self) {
        let low = [self.pending[0].first(), self.pending[1].first()]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(self.next_seq);
        while let Some(e) = self.marks.first_entry() {
            if *e.key() >= low {
                break;
            }
            e.remove();
        }
    }

    /// Emits stream `st`'s bytes before `hold`, taken runs as handles.
    fn emit_stream(&mut self, st: usize, hold: u64, out: &mut Vec<u8>) {
        let p = &mut self.pending[st];
        let taken = &mut self.taken[st];
        while let Some(&(first, len)) = p.runs.front() {
            if first >= hold {
                break;
            }
            let n = len.min(usize::try_from(hold - first).unwrap_or(usize::MAX));
            let end = first + n as u64;
            let mut seq = first;
            while seq < end {
                while let Some(e) = taken.first_entry() {
                    if *e.get() >= seq {
                        break;
                    }
                    e.remove();
                }
                let (from, to) = match taken.first_key_value() {
                    Some((&s, &e)) if s < end => (s.max(seq), (e + 1).min(end)),
                    _ => (end, end),
                };
                if from > seq {
                    let k = (from - seq) as usize;
                    let (a, b) = p.bytes.as_slices();
                    let from_a = k.min(a.len());
                    out.extend_from_slice(&a[..from_a]);
                    out.extend_from_slice(&b[..k - from_a]);
                    p.bytes.drain(..k);
                    self.shown[st] = None;
                }
                for t in from..to {
                    if let Some(tag) = self.marks.remove(&t) {
                        if self.shown[st] != Some(tag) {
                            out.extend_from_slice(&self.handles[usize::from(tag)]);
                            self.shown[st] = Some(tag);
                        }
                    }
                }
                p.bytes.drain(..(to - from) as usize);
                seq = to;
            }
            if n == len {
                p.runs.pop_front();
            } else if let Some(r) = p.runs.front_mut() {
                *r = (end, len - n);
            }
        }
    }
}
