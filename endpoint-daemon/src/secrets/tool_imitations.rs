//! Small imitations of the tools a command can print a secret with, so
//! the scrubber's tests run every case at many offsets and chunk
//! boundaries without the tools installed. `imitations_match_the_real_tools`
//! (ignored: it runs them) checks each against the real one.

pub fn hex(d: &[u8]) -> Vec<u8> {
    d.iter()
        .flat_map(|b| format!("{b:02x}").into_bytes())
        .collect()
}

pub fn wrap(s: &[u8], width: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for line in s.chunks(width) {
        out.extend_from_slice(line);
        out.push(b'\n');
    }
    out
}

pub fn printable(b: u8) -> u8 {
    if (0x20..0x7f).contains(&b) {
        b
    } else {
        b'.'
    }
}

/// `xxd` (`-g group`, `-u`): offset, grouped hex, ASCII column.
pub fn xxd(d: &[u8], group: usize, upper: bool) -> Vec<u8> {
    let mut out = String::new();
    for (n, line) in d.chunks(16).enumerate() {
        out += &format!("{:08x}: ", n * 16);
        for i in 0..16 {
            out += &match line.get(i) {
                Some(b) if upper => format!("{b:02X}"),
                Some(b) => format!("{b:02x}"),
                None => "  ".into(),
            };
            if i % group == group - 1 {
                out.push(' ');
            }
        }
        out.push(' ');
        out.extend(line.iter().map(|&b| printable(b) as char));
        out.push('\n');
    }
    out.into_bytes()
}

/// `hexdump -C`.
pub fn hexdump_c(d: &[u8]) -> Vec<u8> {
    let mut out = String::new();
    for (n, line) in d.chunks(16).enumerate() {
        out += &format!("{:08x}  ", n * 16);
        for i in 0..16 {
            out += &match line.get(i) {
                Some(b) => format!("{b:02x} "),
                None => "   ".into(),
            };
            if i == 7 {
                out.push(' ');
            }
        }
        out += " |";
        out.extend(line.iter().map(|&b| printable(b) as char));
        out += "|\n";
    }
    out += &format!("{:08x}\n", d.len());
    out.into_bytes()
}

/// `od` with one field per byte (`field` formats it), octal offsets
/// unless `-An`.
pub fn od(d: &[u8], offsets: bool, field: fn(u8) -> String) -> Vec<u8> {
    let mut out = String::new();
    for (n, line) in d.chunks(16).enumerate() {
        if offsets {
            out += &format!("{:07o}", n * 16);
        }
        for &b in line {
            out += &field(b);
        }
        out.push('\n');
    }
    if offsets {
        out += &format!("{:07o}\n", d.len());
    }
    out.into_bytes()
}

pub fn od_x1(b: u8) -> String {
    format!(" {b:02x}")
}

pub fn od_b(b: u8) -> String {
    format!(" {b:03o}")
}

pub fn od_c(b: u8) -> String {
    match b {
        0 => "  \\0".into(),
        7 => "  \\a".into(),
        8 => "  \\b".into(),
        9 => "  \\t".into(),
        10 => "  \\n".into(),
        11 => "  \\v".into(),
        12 => "  \\f".into(),
        13 => "  \\r".into(),
        0x20..=0x7e => format!("   {}", b as char),
        _ => format!(" {b:03o}"),
    }
}

/// `hexdump` without options (and `od -x`'s words): little-endian 16-bit
/// words.
pub fn hexdump_words(d: &[u8]) -> Vec<u8> {
    let mut out = String::new();
    for (n, line) in d.chunks(16).enumerate() {
        let mut row = format!("{:07x}", n * 16);
        for w in line.chunks(2) {
            let hi = w.get(1).copied().unwrap_or(0);
            row += &format!(" {hi:02x}{:02x}", w[0]);
        }
        // A short last row is padded to the full width.
        out += &format!("{row:<47}\n");
    }
    out += &format!("{:07x}\n", d.len());
    out.into_bytes()
}

pub fn radix(d: &[u8], alphabet: &[u8], bits: u32, pad_to: usize) -> Vec<u8> {
    let mut out = Vec::new();
    let (mut acc, mut n) = (0u32, 0u32);
    for &b in d {
        acc = (acc << 8) | u32::from(b);
        n += 8;
        while n >= bits {
            n -= bits;
            out.push(alphabet[((acc >> n) & ((1 << bits) - 1)) as usize]);
        }
        acc &= (1 << n) - 1;
    }
    if n > 0 {
        out.push(alphabet[((acc << (bits - n)) & ((1 << bits) - 1)) as usize]);
    }
    while !out.len().is_multiple_of(pad_to) {
        out.push(b'=');
    }
    out
}

pub fn b64(d: &[u8]) -> Vec<u8> {
    radix(
        d,
        b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/",
        6,
        4,
    )
}

pub fn b64url(d: &[u8]) -> Vec<u8> {
    let mut e = radix(
        d,
        b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_",
        6,
        1,
    );
    e.retain(|&c| c != b'=');
    e
}

pub fn b32(d: &[u8]) -> Vec<u8> {
    radix(d, b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", 5, 8)
}

pub fn rev_chars(v: &str) -> Vec<u8> {
    v.chars().rev().collect::<String>().into_bytes()
}

pub fn rev_bytes(v: &[u8]) -> Vec<u8> {
    v.iter().rev().copied().collect()
}

/// bash `set -x` and `'…'` quoting: `'` becomes `'\''`.
pub fn bash_sq(v: &str) -> String {
    format!("'{}'", v.replace('\'', "'\\''"))
}

/// dash's `set -x` quoting: `'` becomes `'"'"'`.
pub fn dash_sq(v: &str) -> String {
    format!("'{}'", v.replace('\'', "'\"'\"'"))
}

/// `$'…'` (bash's `printf %q` and `${v@Q}` for control characters).
pub fn ansi_c(v: &str, octal: bool) -> String {
    let mut out = String::from("$'");
    for c in v.chars() {
        match c {
            '\n' => out += "\\n",
            '\t' => out += "\\t",
            '\x1b' if octal => out += "\\033",
            '\x1b' => out += "\\E",
            '\'' => out += "\\'",
            '\\' => out += "\\\\",
            c if (c as u32) < 0x20 => out += &format!("\\x{:02x}", c as u32),
            c => out.push(c),
        }
    }
    out + "'"
}

/// bash `printf %q` for printable text: backslash before specials.
pub fn printf_q(v: &str) -> String {
    let mut out = String::new();
    for c in v.chars() {
        if " '\"$\\&;()<>|*?[]#~`!{}".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// JSON string escaping, ASCII only (Python's default `json.dumps`).
pub fn json(v: &str) -> String {
    let mut out = String::from("\"");
    for c in v.chars() {
        match c {
            '"' => out += "\\\"",
            '\\' => out += "\\\\",
            '\n' => out += "\\n",
            '\t' => out += "\\t",
            '/' => out += "\\/",
            c if (c as u32) < 0x20 || (c as u32) > 0x7e => {
                let mut buf = [0u16; 2];
                for u in c.encode_utf16(&mut buf) {
                    out += &format!("\\u{u:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out + "\""
}

/// Percent-encoding of every byte (`all`) or of all but the unreserved.
pub fn url(v: &str, upper: bool, all: bool) -> String {
    v.bytes()
        .map(|b| {
            if !all && (b.is_ascii_alphanumeric() || b"-._~".contains(&b)) {
                (b as char).to_string()
            } else if upper {
                format!("%{b:02X}")
            } else {
                format!("%{b:02x}")
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Run by hand when a tool imitation changes:
    /// `cargo test -p byom-daemon --lib imitations -- --ignored`.
    #[test]
    #[ignore]
    fn imitations_match_the_real_tools() {
        use std::io::Write;
        let d = "The s3cr3t-\u{e9}\u{1b}\x7f\0 value, then more text to wrap".as_bytes();
        let tool = |args: &[&str]| -> Vec<u8> {
            let mut c = std::process::Command::new(args[0])
                .args(&args[1..])
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .spawn()
                .expect("tool");
            c.stdin.take().expect("stdin").write_all(d).expect("write");
            c.wait_with_output().expect("output").stdout
        };
        let check = |ours: Vec<u8>, theirs: Vec<u8>, what: &str| {
            assert_eq!(
                String::from_utf8_lossy(&ours),
                String::from_utf8_lossy(&theirs),
                "{what}"
            );
        };
        check(xxd(d, 2, false), tool(&["xxd"]), "xxd");
        check(xxd(d, 1, false), tool(&["xxd", "-g1"]), "xxd -g1");
        check(xxd(d, 4, false), tool(&["xxd", "-g4"]), "xxd -g4");
        check(xxd(d, 2, true), tool(&["xxd", "-u"]), "xxd -u");
        check(wrap(&hex(d), 60), tool(&["xxd", "-p"]), "xxd -p");
        check(hexdump_c(d), tool(&["hexdump", "-C"]), "hexdump -C");
        check(hexdump_words(d), tool(&["hexdump"]), "hexdump");
        check(od(d, true, od_x1), tool(&["od", "-tx1"]), "od -tx1");
        check(od(d, false, od_x1), tool(&["od", "-An", "-tx1"]), "od -An");
        check(od(d, true, od_b), tool(&["od", "-b"]), "od -b");
        check(od(d, true, od_c), tool(&["od", "-c"]), "od -c");
        check(wrap(&b64(d), 76), tool(&["base64"]), "base64");
        check(wrap(&b32(d), 76), tool(&["base32"]), "base32");
    }
}
