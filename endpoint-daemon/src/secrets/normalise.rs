//! Readers that turn a command's output into what the patterns are
//! matched against, one byte at a time, each symbol carrying the span of
//! output bytes it came from (so a match takes out exactly those bytes).
//!
//! - [`Unescape`]: shell, C, JSON and URL escapes decoded (`\n`, `\x1b`,
//!   `\033`, `\u00e9` and surrogate pairs, `\'`, `\ `, `%2F`), and the
//!   quote splices `'\''` (bash `set -x`) and `'"'"'` (dash) read as `'`.
//!   It decodes everywhere, not only inside quotes: the output is no shell
//!   script, and a value is only ever looked for in what it yields.
//! - [`DumpLines`]: hex and octal dumps read line by line, their offset
//!   column dropped, the data column decoded to bytes and the ASCII column
//!   kept apart (`xxd`, `xxd -p`, `xxd -i`, `hexdump -C`, `hexdump`, `od`
//!   with `-tx1`, `-x`, `-b`, `-c`, with or without `-An`).

/// Longest escape read: `\uD83D\uDE00`, a surrogate pair.
pub const MAX_ESCAPE_LEN: usize = 12;

/// The quote splices that put a `'` inside single quotes.
const SPLICES: [&[u8]; 2] = [b"'\\''", b"'\"'\"'"];

/// One symbol for the matcher: its byte and the span of output it came
/// from (sequence numbers of its first and last byte).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sym {
    pub byte: u8,
    pub start: u64,
    pub end: u64,
}

/// What the bytes at the front of the escape buffer are.
enum Parse {
    /// They may begin an escape: wait for more.
    NeedMore,
    /// The first byte stands for itself.
    Literal,
    /// An escape of `consumed` bytes, standing for `bytes[..n]`.
    Token {
        bytes: [u8; 4],
        n: usize,
        consumed: usize,
    },
}

fn one(b: u8, consumed: usize) -> Parse {
    Parse::Token {
        bytes: [b, 0, 0, 0],
        n: 1,
        consumed,
    }
}

fn utf8(c: char, consumed: usize) -> Parse {
    let mut bytes = [0u8; 4];
    let n = c.encode_utf8(&mut bytes).len();
    Parse::Token { bytes, n, consumed }
}

fn hex_value(d: &[u8]) -> u32 {
    d.iter().fold(0, |acc, &c| {
        // Only called on hex digits.
        (acc << 4) | char::from(c).to_digit(16).unwrap_or(0)
    })
}

fn is_octal(c: &u8) -> bool {
    (b'0'..=b'7').contains(c)
}

/// Waits for more unless the input has ended.
fn more(eof: bool) -> Parse {
    if eof {
        Parse::Literal
    } else {
        Parse::NeedMore
    }
}

/// `b` starts with a backslash.
fn escape(b: &[u8], eof: bool) -> Parse {
    let Some(&c) = b.get(1) else {
        return more(eof);
    };
    let simple = match c {
        b'n' => b'\n',
        b't' => b'\t',
        b'r' => b'\r',
        b'a' => 0x07,
        b'b' => 0x08,
        b'f' => 0x0c,
        b'v' => 0x0b,
        b'e' | b'E' => 0x1b,
        b'0'..=b'7' => {
            // C, bash `$'…'` and printf: one to three octal digits.
            let digits = b[1..].iter().take(3).take_while(|c| is_octal(c)).count();
            if digits < 3 && b.len() == 1 + digits && !eof {
                return Parse::NeedMore;
            }
            let v = b[1..1 + digits]
                .iter()
                .fold(0u32, |acc, &d| acc * 8 + u32::from(d - b'0'));
            return match u8::try_from(v) {
                Ok(v) => one(v, 1 + digits),
                Err(_) => Parse::Literal,
            };
        }
        b'x' | b'u' | b'U' => return code_point(b, c, eof),
        c if c.is_ascii_punctuation() || c == b' ' => c,
        _ => return Parse::Literal,
    };
    one(simple, 2)
}

/// `\xHH` (a byte), `\uHHHH` and `\UHHHHHHHH` (a character, in UTF-8).
fn code_point(b: &[u8], c: u8, eof: bool) -> Parse {
    let max = match c {
        b'x' => 2,
        b'u' => 4,
        _ => 8,
    };
    let digits = b[2..]
        .iter()
        .take(max)
        .take_while(|d| d.is_ascii_hexdigit())
        .count();
    if digits < max && b.len() == 2 + digits && !eof {
        return Parse::NeedMore;
    }
    if digits == 0 {
        return Parse::Literal;
    }
    let used = 2 + digits;
    let v = hex_value(&b[2..used]);
    if c == b'x' {
        // Two hex digits at most: fits a byte.
        return one(v as u8, used);
    }
    if c == b'u' && (0xd800..0xdc00).contains(&v) {
        // JSON writes a character beyond U+FFFF as a surrogate pair.
        let rest = &b[used..];
        let shape = |i: usize, d: &u8| match i {
            0 => *d == b'\\',
            1 => *d == b'u',
            _ => d.is_ascii_hexdigit(),
        };
        if !rest.iter().take(6).enumerate().all(|(i, d)| shape(i, d)) {
            return Parse::Literal;
        }
        if rest.len() < 6 {
            return more(eof);
        }
        let low = hex_value(&rest[2..6]);
        if !(0xdc00..0xe000).contains(&low) {
            return Parse::Literal;
        }
        let cp = 0x10000 + ((v - 0xd800) << 10) + (low - 0xdc00);
        return match char::from_u32(cp) {
            Some(ch) => utf8(ch, used + 6),
            None => Parse::Literal,
        };
    }
    match char::from_u32(v) {
        Some(ch) => utf8(ch, used),
        None => Parse::Literal,
    }
}

fn parse(b: &[u8], eof: bool) -> Parse {
    match b[0] {
        b'\\' => escape(b, eof),
        b'%' => match (b.get(1), b.get(2)) {
            (Some(h), _) if !h.is_ascii_hexdigit() => Parse::Literal,
            (Some(_), Some(l)) if l.is_ascii_hexdigit() => one(hex_value(&b[1..3]) as u8, 3),
            (Some(_), Some(_)) => Parse::Literal,
            _ => more(eof),
        },
        b'\'' => {
            let mut maybe = false;
            for s in SPLICES {
                if b.starts_with(s) {
                    return one(b'\'', s.len());
                }
                maybe |= s.starts_with(b);
            }
            if maybe {
                more(eof)
            } else {
                Parse::Literal
            }
        }
        _ => Parse::Literal,
    }
}

/// Decodes escapes as the bytes stream past; see the module docs. It
/// reads symbols, so a second one can decode what the first yields.
#[derive(Clone)]
pub struct Unescape {
    buf: [Sym; MAX_ESCAPE_LEN],
    len: usize,
}

impl Default for Unescape {
    fn default() -> Self {
        Unescape {
            buf: [Sym {
                byte: 0,
                start: 0,
                end: 0,
            }; MAX_ESCAPE_LEN],
            len: 0,
        }
    }
}

impl Unescape {
    /// Whether both hold the same symbols (so decode what follows alike).
    pub fn same_as(&self, o: &Unescape) -> bool {
        self.buf[..self.len] == o.buf[..o.len]
    }

    /// The first output byte not decoded yet.
    pub fn held_from(&self) -> Option<u64> {
        (self.len > 0).then(|| self.buf[0].start)
    }

    #[inline]
    pub fn push(&mut self, s: Sym, emit: &mut impl FnMut(Sym)) {
        if self.len == 0 && !matches!(s.byte, b'\\' | b'%' | b'\'') {
            emit(s);
            return;
        }
        self.buf[self.len] = s;
        self.len += 1;
        self.drain(false, emit);
    }

    /// No more input: what is buffered is decoded as far as it goes.
    pub fn finish(&mut self, emit: &mut impl FnMut(Sym)) {
        self.drain(true, emit);
    }

    fn drain(&mut self, eof: bool, emit: &mut impl FnMut(Sym)) {
        while self.len > 0 {
            let mut bytes = [0u8; MAX_ESCAPE_LEN];
            for (d, s) in bytes.iter_mut().zip(&self.buf[..self.len]) {
                *d = s.byte;
            }
            // A full buffer decides: every escape is shorter.
            let eof = eof || self.len == MAX_ESCAPE_LEN;
            let consumed = match parse(&bytes[..self.len], eof) {
                Parse::NeedMore => return,
                Parse::Literal => {
                    emit(self.buf[0]);
                    1
                }
                Parse::Token { bytes, n, consumed } => {
                    let (start, end) = (self.buf[0].start, self.buf[consumed - 1].end);
                    for &byte in &bytes[..n] {
                        emit(Sym { byte, start, end });
                    }
                    consumed
                }
            };
            self.buf.copy_within(consumed..self.len, 0);
            self.len -= consumed;
        }
    }
}

/// Longest line read as a dump line (`xxd -c 64` is ~280 bytes); longer
/// lines are not dumps, and no reader holds more than this of one line.
pub const MAX_DUMP_LINE: usize = 1024;
/// An offset column: 6 to 16 hex (or octal) digits, then `:` or a space
/// (`xxd` 8 and a colon, `hexdump` 7 or 8, `od` 7).
const MIN_OFFSET_DIGITS: usize = 6;
const MAX_OFFSET_DIGITS: usize = 16;
/// `hexdump -C` puts a double space after the 8th byte of a row.
const HEXDUMP_C_HALF_ROW: usize = 8;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LineState {
    /// Nothing of this line yet.
    Start,
    /// In the first token, all hex digits so far.
    FirstToken,
    /// Past it: whatever follows until the line ends.
    Fields,
    /// Not a dump line: ignored until it ends.
    Skip,
}

/// What a byte did to the dump reader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Nothing,
    /// The line is not part of a dump: a dump match in progress ends.
    NotADump,
    /// A dump line ended: [`DumpLines::data`] and [`DumpLines::ascii`].
    Line,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Hex,
    Octal,
}

/// Reads hex and octal dumps line by line; see the module docs.
#[derive(Clone)]
pub struct DumpLines {
    line: Vec<(u64, u8)>,
    state: LineState,
    data: Vec<Sym>,
    ascii: Vec<Sym>,
}

impl Default for DumpLines {
    fn default() -> Self {
        DumpLines {
            line: Vec::new(),
            state: LineState::Start,
            data: Vec::new(),
            ascii: Vec::new(),
        }
    }
}

impl DumpLines {
    /// Whether both are at the same point of the same line.
    pub fn same_as(&self, o: &DumpLines) -> bool {
        self.state == o.state && self.line == o.line
    }

    pub fn copy_from(&mut self, o: &DumpLines) {
        self.state = o.state;
        self.line.clone_from(&o.line);
    }

    /// The first byte of the line being read.
    pub fn held_from(&self) -> Option<u64> {
        self.line.first().map(|(s, _)| *s)
    }

    /// The last line's data column, as bytes.
    pub fn data(&self) -> &[Sym] {
        &self.data
    }

    /// The last line's ASCII column (empty when it has none).
    pub fn ascii(&self) -> &[Sym] {
        &self.ascii
    }

    #[inline]
    pub fn push(&mut self, seq: u64, b: u8) -> Step {
        if b == b'\n' {
            return self.end_line();
        }
        if self.state == LineState::Skip {
            return Step::Nothing;
        }
        // Dumps are printable ASCII; a control byte (a carriage return
        // redrawing a progress bar, say) or UTF-8 means text. A line too
        // long for a dump is text too, and is not held.
        let fits = (0x20..0x7f).contains(&b)
            && self.line.len() < MAX_DUMP_LINE
            && match self.state {
                LineState::Start => b.is_ascii_hexdigit() || b == b' ',
                LineState::FirstToken => b.is_ascii_hexdigit() || b == b':' || b == b' ',
                _ => true,
            };
        if !fits {
            self.line.clear();
            self.state = LineState::Skip;
            return Step::NotADump;
        }
        self.state = match (self.state, b) {
            (LineState::Start, b' ') | (LineState::FirstToken, b':' | b' ') => LineState::Fields,
            (LineState::Start, _) => LineState::FirstToken,
            (s, _) => s,
        };
        self.line.push((seq, b));
        Step::Nothing
    }

    /// No more input: the last line, if unfinished, is read as it is.
    pub fn finish(&mut self) -> Step {
        if self.line.is_empty() {
            self.state = LineState::Start;
            return Step::NotADump;
        }
        self.end_line()
    }

    fn end_line(&mut self) -> Step {
        let was = std::mem::replace(&mut self.state, LineState::Start);
        if was == LineState::Skip {
            return Step::Nothing;
        }
        self.data.clear();
        self.ascii.clear();
        if !self.od_c() {
            self.columns();
        }
        self.line.clear();
        if self.data.is_empty() {
            Step::NotADump
        } else {
            Step::Line
        }
    }

    /// Where the data starts: after an offset column, if any.
    fn data_start(&self) -> usize {
        let run = self
            .line
            .iter()
            .take_while(|(_, b)| b.is_ascii_hexdigit())
            .count();
        match self.line.get(run).map(|(_, b)| *b) {
            Some(b':') if (1..=MAX_OFFSET_DIGITS).contains(&run) => run + 1,
            Some(b' ') if (MIN_OFFSET_DIGITS..=MAX_OFFSET_DIGITS).contains(&run) => run,
            _ => 0,
        }
    }

    /// `od -c`: after the offset, four columns per byte: the character,
    /// a backslash escape, or three octal digits. False if it is not.
    fn od_c(&mut self) -> bool {
        let rest = &self.line[self.data_start()..];
        if rest.is_empty() || !rest.len().is_multiple_of(4) {
            return false;
        }
        for f in rest.chunks_exact(4) {
            let b = [f[0].1, f[1].1, f[2].1, f[3].1];
            let (byte, from) = match b {
                [b' ', b' ', b' ', b' '] => (b' ', 0),
                [b' ', b' ', b' ', c] if c.is_ascii_graphic() => (c, 3),
                [b' ', b' ', b'\\', c] => match c {
                    b'0' => (0, 2),
                    b'a' => (0x07, 2),
                    b'b' => (0x08, 2),
                    b't' => (b'\t', 2),
                    b'n' => (b'\n', 2),
                    b'v' => (0x0b, 2),
                    b'f' => (0x0c, 2),
                    b'r' => (b'\r', 2),
                    _ => {
                        self.data.clear();
                        return false;
                    }
                },
                [b' ', o @ (b'0'..=b'3'), p, q] if is_octal(&p) && is_octal(&q) => {
                    ((o - b'0') * 64 + (p - b'0') * 8 + (q - b'0'), 1)
                }
                _ => {
                    self.data.clear();
                    return false;
                }
            };
            self.data.push(Sym {
                byte,
                start: f[from].0,
                end: f[3].0,
            });
        }
        true
    }

    /// Whitespace-separated columns: hex byte groups (any even number of
    /// digits, or `0xHH,`) or three-digit octal bytes, then the ASCII
    /// column (after a double space, or between `|`).
    fn columns(&mut self) {
        let n = self.line.len();
        let offset = self.data_start();
        let mut j = offset;
        let mut kind = None;
        let mut only_pairs = true;
        let mut data_end = j;
        let ascii_at = loop {
            let gap_from = j;
            while j < n && self.line[j].1 == b' ' {
                j += 1;
            }
            if j >= n {
                break n;
            }
            let wide_gap = j - gap_from >= 2;
            let half_row = only_pairs && self.data.len() == HEXDUMP_C_HALF_ROW;
            if !self.data.is_empty() && wide_gap && !half_row {
                break j;
            }
            let k = (j..n).find(|&x| self.line[x].1 == b' ').unwrap_or(n);
            if !self.token(j, k, &mut kind, &mut only_pairs) {
                break j;
            }
            data_end = k;
            j = k;
        };
        if ascii_at < n && offset == 0 {
            // Dumps without offsets (`xxd -p`, `od -An`, `xxd -i`) are
            // data to the end of the line; anything else is text that
            // happens to start with hex.
            self.data.clear();
        }
        if self.data.is_empty() || ascii_at >= n {
            return;
        }
        let line = &self.line;
        let col = if line[ascii_at].1 == b'|' {
            // hexdump -C: |…|
            match line.iter().rposition(|(_, b)| *b == b'|') {
                Some(z) if z > ascii_at => &line[ascii_at + 1..z],
                _ => return,
            }
        } else if kind == Some(Kind::Hex) && n - self.data.len() > data_end {
            // xxd: as many characters as the row has bytes, ending it.
            &line[n - self.data.len()..]
        } else {
            return;
        };
        self.ascii.extend(col.iter().map(|&(seq, byte)| Sym {
            byte,
            start: seq,
            end: seq,
        }));
    }

    /// One data token, `line[j..k]`; false if it is none.
    fn token(
        &mut self,
        j: usize,
        k: usize,
        kind: &mut Option<Kind>,
        only_pairs: &mut bool,
    ) -> bool {
        let t = &self.line[j..k];
        let digits = |r: &[(u64, u8)]| r.iter().all(|(_, b)| b.is_ascii_hexdigit());
        let pair = |p: &[(u64, u8)]| Sym {
            byte: hex_value(&[p[0].1, p[1].1]) as u8,
            start: p[0].0,
            end: p[1].0,
        };
        if *kind != Some(Kind::Octal) {
            // xxd -i: 0x73,
            let body = match t.split_last() {
                Some((&(_, b','), body)) => body,
                _ => t,
            };
            if body.len() == 4
                && body[0].1 == b'0'
                && matches!(body[1].1, b'x' | b'X')
                && digits(&body[2..])
            {
                self.data.push(pair(&body[2..]));
                *kind = Some(Kind::Hex);
                return true;
            }
            if t.len().is_multiple_of(2) && digits(t) {
                self.data.extend(t.chunks_exact(2).map(pair));
                *only_pairs &= t.len() == 2;
                *kind = Some(Kind::Hex);
                return true;
            }
        }
        if *kind != Some(Kind::Hex)
            && t.len() == 3
            && t.iter().all(|(_, b)| is_octal(b))
            && t[0].1 <= b'3'
        {
            let v = t.iter().fold(0u8, |acc, (_, d)| acc * 8 + (d - b'0'));
            self.data.push(Sym {
                byte: v,
                start: t[0].0,
                end: t[2].0,
            });
            *kind = Some(Kind::Octal);
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unescape(text: &[u8]) -> Vec<u8> {
        let mut u = Unescape::default();
        let mut out = Vec::new();
        for (i, &byte) in text.iter().enumerate() {
            let (start, end) = (i as u64, i as u64);
            u.push(Sym { byte, start, end }, &mut |s| out.push(s.byte));
        }
        u.finish(&mut |s| out.push(s.byte));
        out
    }

    #[test]
    fn escapes_are_decoded() {
        for (text, want) in [
            (&b"'it'\\''s'"[..], &b"'it's'"[..]),
            (b"'it'\"'\"'s'", b"'it's'"),
            (
                b"$'a\\nb\\tc\\Ed\\'e\\x1bf\\033g'",
                b"$'a\nb\tc\x1bd'e\x1bf\x1bg'",
            ),
            (b"it\\'s\\ a\\&b", b"it's a&b"),
            (
                b"\"q\\\"\\\\\\/\\u00e9\\ud83d\\udd11\"",
                "\"q\"\\/é🔑\"".as_bytes(),
            ),
            (b"%2F%2f%zz%4", b"//%zz%4"),
            (b"\\163\\63x\\", b"s3x\\"),
            (b"don't \\q \\x \\ud83dx", b"don't \\q \\x \\ud83dx"),
        ] {
            assert_eq!(
                String::from_utf8_lossy(&unescape(text)),
                String::from_utf8_lossy(want)
            );
        }
    }

    #[test]
    fn decoded_bytes_span_their_escape() {
        let mut u = Unescape::default();
        let mut out = Vec::new();
        for (i, &byte) in b"a\\x41b".iter().enumerate() {
            let (start, end) = (i as u64, i as u64);
            u.push(Sym { byte, start, end }, &mut |s| out.push(s));
        }
        assert_eq!(
            out[1],
            Sym {
                byte: b'A',
                start: 1,
                end: 4
            }
        );
        assert_eq!(u.held_from(), None);
    }

    /// Each line's (data, ascii) columns.
    fn dump(text: &str) -> Vec<(Vec<u8>, String)> {
        let mut d = DumpLines::default();
        let mut out = Vec::new();
        for (i, b) in text.bytes().enumerate() {
            if d.push(i as u64, b) == Step::Line {
                out.push((
                    d.data().iter().map(|s| s.byte).collect(),
                    d.ascii().iter().map(|s| s.byte as char).collect(),
                ));
            }
        }
        out
    }

    #[test]
    fn dump_columns_are_read() {
        let rows = [
            (
                "00000000: 7333 6372 3374 2d76 616c 7565 2d58 595a  s3cr3t-value-XYZ\n",
                "s3cr3t-value-XYZ",
                "s3cr3t-value-XYZ",
            ),
            (
                "00000020: 6621                                     f!\n",
                "f!",
                "f!",
            ),
            (
                "00000000  73 33 63 72 33 74 2d 76  61 6c 75 65 2d 58 59 5a  |s3cr3t-value-XYZ|\n",
                "s3cr3t-value-XYZ",
                "s3cr3t-value-XYZ",
            ),
            ("0000000 163 063 143\n", "s3c", ""),
            (" 73 33 63\n", "s3c", ""),
            ("0000000   s   3   c  \\n 033    \n", "s3c\n\x1b ", ""),
            ("  0x73, 0x33, 0x63,\n", "s3c", ""),
            ("7333637233\n", "s3cr3", ""),
        ];
        for (line, data, ascii) in rows {
            let got = dump(line);
            assert_eq!(got.len(), 1, "{line}");
            assert_eq!(String::from_utf8_lossy(&got[0].0), data, "{line}");
            assert_eq!(got[0].1, ascii, "{line}");
        }
        for text in [
            "error: 7333\n",
            "Hello world\n",
            "  indented words\n",
            "\n",
            "a\rb\n",
            "200 ok 0x7f3a\n",
        ] {
            assert!(dump(text).is_empty(), "{text}");
        }
    }
}
