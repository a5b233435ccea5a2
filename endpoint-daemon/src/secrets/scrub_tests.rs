//! The scrubber against the ways a command can print a secret without
//! trying hard: reversed, wrapped or dumped encodings, and the quoting and
//! escaping of shells, JSON and URLs (made by `tool_imitations`).

use std::collections::BTreeMap;

use super::tool_imitations::*;
use super::{Scrubber, Stream};

const LONG: &str = "s3cr3t-value-XYZ-0123456789abcdef!";
const MID: &str = "tok3n-Qw9z";
const SHORT: [&str; 4] = ["pw42", "k3y!z", "ab-cd9", "hunter2"];
const UTF8: &str = "pässwörd-ünï";
const QUOTY: &str = "it's a \"q\" $x\\y%z";
const CTRL: &str = "a\nb\tc\x1bd'e";
/// Long enough that its encodings wrap (and `rev` reverses them line by
/// line).
const WIDE: &str = "wide-0123456789abcdefghijklmnopqrstuvwxyz-ABCDEFGHIJKLMNOPQRSTUVWXYZ-0123456789-wide-wide-wide!";
/// Values with the characters each kind of quoting treats specially.
const EXTRA: [&str; 6] = [
    "tab\there",
    "emoji-\u{1f511}-key!",
    "x&y;z(1) <a|b>",
    "it's a secret",
    "don't-tell-anyone",
    "pass word/+1",
];
/// Text around a value: no digit, hyphen or letter run a value shares.
const FILLER: &[u8] = b"The quick brown fox jumps over the lazy dog; ";

fn values() -> BTreeMap<String, String> {
    let mut v: BTreeMap<String, String> = [
        ("LONG", LONG),
        ("MID", MID),
        ("UTF8", UTF8),
        ("QUOTY", QUOTY),
        ("CTRL", CTRL),
        ("WIDE", WIDE),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    for (i, s) in SHORT.iter().enumerate() {
        v.insert(format!("SHORT{i}"), s.to_string());
    }
    for (i, s) in EXTRA.iter().enumerate() {
        v.insert(format!("EXTRA{i}"), s.to_string());
    }
    v
}

fn name_of(value: &str) -> String {
    values()
        .into_iter()
        .find(|(_, v)| v == value)
        .map(|(k, _)| k)
        .unwrap_or_default()
}

/// A new scrubber for [`values`] (built once: the tests run thousands).
fn fresh() -> Scrubber {
    static BUILT: std::sync::OnceLock<Scrubber> = std::sync::OnceLock::new();
    BUILT.get_or_init(|| Scrubber::new(&values())).clone()
}

/// `text` as stdout through a fresh scrubber, in the given pieces.
fn run(parts: &[&[u8]]) -> Vec<u8> {
    let mut s = fresh();
    let mut out = Vec::new();
    for p in parts {
        out.extend_from_slice(&s.push(Stream::Out, p)[0]);
    }
    out.extend_from_slice(&s.finish(Stream::Out)[0]);
    out.extend_from_slice(&s.finish(Stream::Err)[0]);
    out
}

/// Most two-piece cuttings tried per text (spread evenly over it).
const MAX_CUTS: usize = 48;

/// Every way these tests cut a text: whole, byte by byte, and in two at
/// every position (at [`MAX_CUTS`] positions spread over a long text).
fn outputs(text: &[u8]) -> Vec<(String, Vec<u8>)> {
    let mut outs = vec![("whole".to_string(), run(&[text]))];
    let bytes: Vec<&[u8]> = text.chunks(1).collect();
    outs.push(("byte by byte".into(), run(&bytes)));
    let step = text.len().div_ceil(MAX_CUTS).max(1);
    for cut in (1..text.len()).step_by(step) {
        outs.push((format!("cut at {cut}"), run(&[&text[..cut], &text[cut..]])));
    }
    outs
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    needle.is_empty() || hay.windows(needle.len()).any(|w| w == needle)
}

fn strip_ws(b: &[u8]) -> Vec<u8> {
    b.iter()
        .copied()
        .filter(|c| !c.is_ascii_whitespace())
        .collect()
}

/// `text` leaks nothing of `value` through `forms` (no `window`-long piece
/// of any form survives, whitespace removed or not) and shows the handle.
fn assert_scrubbed(text: &[u8], value: &str, forms: &[(Vec<u8>, usize)]) {
    let handle = format!("{{{{secret:{}}}}}", name_of(value));
    for (how, out) in outputs(text) {
        let shown = String::from_utf8_lossy(&out);
        assert!(
            contains(&out, handle.as_bytes()),
            "{value:?}: no handle ({how}) in\n{shown}\nfrom\n{}",
            String::from_utf8_lossy(text)
        );
        // The handles themselves may share letters with a value.
        let out = String::from_utf8_lossy(&out)
            .replace(&handle, "\u{0}")
            .into_bytes();
        let flat = strip_ws(&out);
        for (form, window) in forms {
            let w = (*window).min(form.len());
            for piece in form.windows(w) {
                assert!(
                    !contains(&out, piece) && !contains(&flat, piece),
                    "{value:?}: {:?} leaked ({how}) in\n{shown}",
                    String::from_utf8_lossy(piece)
                );
            }
        }
    }
}

/// The value itself must not survive (any 4 bytes of it).
fn plain(v: &[u8]) -> (Vec<u8>, usize) {
    (v.to_vec(), 4)
}

/// An encoded form must not survive (any 8 characters of it).
fn encoded(f: Vec<u8>) -> (Vec<u8>, usize) {
    (f, 8)
}

fn embed(before: usize, v: &[u8], after: usize) -> Vec<u8> {
    let mut d: Vec<u8> = FILLER.iter().cycle().take(before).copied().collect();
    d.extend_from_slice(v);
    d.extend(FILLER.iter().cycle().skip(7).take(after));
    d
}

// ---- class 1: reversed values ----------------------------------------

#[test]
fn reversed_short_values_are_taken_out() {
    for v in SHORT {
        // `echo "$S" | rev`, and `printf` of it backwards mid-line.
        let mut text = rev_chars(v);
        text.push(b'\n');
        assert_scrubbed(&text, v, &[plain(&rev_chars(v))]);
        let text = [b"got ".as_slice(), &rev_chars(v), b" ok\n"].concat();
        assert_scrubbed(&text, v, &[plain(&rev_chars(v))]);
    }
}

#[test]
fn reversed_values_are_taken_out_by_characters_and_by_bytes() {
    for v in [LONG, MID, UTF8, QUOTY] {
        for r in [rev_chars(v), rev_bytes(v.as_bytes())] {
            let text = [b"x ".as_slice(), &r, b"\n"].concat();
            assert_scrubbed(&text, v, &[plain(&r)]);
        }
    }
}

#[test]
fn reversed_encodings_are_taken_out() {
    for v in [LONG, MID, UTF8] {
        let r = rev_chars(v);
        for form in [
            hex(&r),                       // rev | xxd -p
            rev_bytes(&hex(v.as_bytes())), // xxd -p | rev
            b64(&r),                       // rev | base64
            rev_bytes(&b64(v.as_bytes())), // base64 | rev
        ] {
            let text = [b"= ".as_slice(), &form, b"\n"].concat();
            assert_scrubbed(&text, v, &[encoded(form.clone())]);
        }
    }
}

#[test]
fn wrapped_encodings_reversed_line_by_line_are_taken_out() {
    // `rev` reverses each line: `xxd -p | rev`, `base64 | rev`.
    let v = WIDE;
    let mut nl = v.as_bytes().to_vec();
    nl.push(b'\n');
    for (lines, width) in [
        (wrap(&hex(v.as_bytes()), 60), 60),
        (wrap(&b64(v.as_bytes()), 76), 76),
        (wrap(&b64(&nl), 76), 76),
        (wrap(&b32(v.as_bytes()), 76), 76),
    ] {
        let text: Vec<u8> = lines
            .split(|&b| b == b'\n')
            .flat_map(|l| rev_bytes(l).into_iter().chain([b'\n']))
            .collect();
        let first: Vec<u8> = rev_bytes(&strip_ws(&lines)[..width]);
        assert_scrubbed(&text, v, &[encoded(first)]);
    }
}

// ---- class 2: wrapped and dumped encodings ---------------------------

#[test]
fn hex_wrapped_like_xxd_p_is_taken_out() {
    for v in [LONG, MID, UTF8, SHORT[3]] {
        for before in [0, 1, 5, 24, 27, 29] {
            let d = embed(before, v.as_bytes(), 9);
            let text = wrap(&hex(&d), 60);
            assert_scrubbed(&text, v, &[encoded(hex(v.as_bytes()))]);
        }
    }
}

#[test]
fn od_hex_bytes_without_offsets_are_taken_out() {
    for v in [LONG, MID, UTF8] {
        for before in [0, 3, 10, 15] {
            let text = od(&embed(before, v.as_bytes(), 5), false, od_x1);
            assert_scrubbed(&text, v, &[encoded(hex(v.as_bytes()))]);
        }
    }
}

#[test]
fn base64_and_base32_wrapped_at_76_are_taken_out_at_every_offset() {
    for v in [LONG, MID, UTF8] {
        for before in 0..6 {
            // Embedded in larger data at each byte offset: the characters
            // the value alone determines must go (a character at each
            // end also carries a neighbour's bits and may stay).
            let start = before + 50;
            let d = embed(start, v.as_bytes(), 40);
            let end = start + v.len();
            for (enc, bits) in [(b64 as fn(&[u8]) -> Vec<u8>, 6), (b64url, 6), (b32, 5)] {
                let e = enc(&d);
                let fixed = e[(8 * start).div_ceil(bits)..8 * end / bits].to_vec();
                assert_scrubbed(&wrap(&e, 76), v, &[(fixed, 12)]);
            }
        }
        // The value alone, as `echo "$S" | base64` prints it.
        let mut nl = v.as_bytes().to_vec();
        nl.push(b'\n');
        let text = wrap(&b64(&nl), 76);
        assert_scrubbed(&text, v, &[encoded(b64(v.as_bytes()))]);
    }
}

#[test]
fn xxd_with_offsets_and_ascii_column_is_taken_out() {
    for v in [LONG, MID, UTF8, SHORT[3]] {
        for before in [0, 10, 13, 15] {
            let d = embed(before, v.as_bytes(), 20);
            for (group, upper) in [(2, false), (1, false), (2, true), (4, false)] {
                let text = xxd(&d, group, upper);
                let mut h = hex(v.as_bytes());
                if upper {
                    h.make_ascii_uppercase();
                }
                let ascii: Vec<u8> = v.bytes().map(printable).collect();
                assert_scrubbed(&text, v, &[encoded(h), plain(&ascii)]);
            }
        }
    }
}

#[test]
fn hexdump_c_is_taken_out() {
    for v in [LONG, MID, UTF8, SHORT[3]] {
        for before in [0, 3, 6, 10, 13, 15] {
            let text = hexdump_c(&embed(before, v.as_bytes(), 20));
            let ascii: Vec<u8> = v.bytes().map(printable).collect();
            assert_scrubbed(&text, v, &[encoded(hex(v.as_bytes())), plain(&ascii)]);
        }
    }
}

#[test]
fn od_dumps_with_offsets_are_taken_out() {
    for v in [LONG, MID, UTF8] {
        for before in [0, 5, 13] {
            let d = embed(before, v.as_bytes(), 7);
            let h = hex(v.as_bytes());
            assert_scrubbed(&od(&d, true, od_x1), v, &[encoded(h.clone())]);
            let oct: Vec<u8> = v
                .bytes()
                .flat_map(|b| format!("{b:03o}").into_bytes())
                .collect();
            assert_scrubbed(&od(&d, true, od_b), v, &[(oct.clone(), 9)]);
            assert_scrubbed(&od(&d, false, od_b), v, &[(oct, 9)]);
            // od -c: one character (or escape, or octal) per field.
            let text = od(&d, true, od_c);
            let fields: Vec<u8> = strip_ws(&od(v.as_bytes(), false, od_c));
            assert_scrubbed(&text, v, &[(fields, 8)]);
            assert_scrubbed(
                &od(&d, false, od_c),
                v,
                &[(strip_ws(&od(v.as_bytes(), false, od_c)), 8)],
            );
            // hexdump / od -x: little-endian words; the words wholly
            // inside the value must go.
            let first = before.div_ceil(2);
            let words: Vec<u8> = (first..(before + v.len()) / 2)
                .flat_map(|w| format!("{:02x}{:02x}", d[2 * w + 1], d[2 * w]).into_bytes())
                .collect();
            assert_scrubbed(&hexdump_words(&d), v, &[(words, 8)]);
        }
    }
}

// ---- class 3: quoting and escaping -----------------------------------

#[test]
fn bash_set_x_quoting_is_taken_out() {
    for v in [QUOTY, CTRL, LONG, UTF8] {
        // bash 5.2 `set -x`: single quotes, `'\''` for a quote, control
        // characters raw.
        let text = format!("+ curl -H {} https://x\n", bash_sq(v));
        assert_scrubbed(text.as_bytes(), v, &[plain(v.as_bytes())]);
        // `$'…'`: `printf %q`, `${v@Q}`, newer `set -x`.
        for octal in [false, true] {
            let text = format!("+ echo {}\n", ansi_c(v, octal));
            assert_scrubbed(text.as_bytes(), v, &[plain(v.as_bytes())]);
        }
    }
}

#[test]
fn dash_set_x_quoting_is_taken_out() {
    for v in [QUOTY, "don't-tell-anyone", LONG] {
        let text = format!("+ echo {}\n", dash_sq(v));
        assert_scrubbed(text.as_bytes(), v, &[plain(v.as_bytes())]);
        // dash leaves a plain word unquoted.
        let text = format!("+ echo {v} done\n");
        assert_scrubbed(text.as_bytes(), v, &[plain(v.as_bytes())]);
    }
}

#[test]
fn printf_q_escapes_are_taken_out() {
    for v in [QUOTY, "x&y;z(1) <a|b>", LONG, "it's a secret"] {
        let text = format!("{}\n", printf_q(v));
        assert_scrubbed(text.as_bytes(), v, &[plain(v.as_bytes())]);
    }
}

#[test]
fn json_escapes_are_taken_out() {
    for v in [QUOTY, CTRL, UTF8, "emoji-\u{1f511}-key!", LONG] {
        let text = format!("{{\"token\":{}}}\n", json(v));
        assert_scrubbed(text.as_bytes(), v, &[plain(v.as_bytes())]);
    }
}

#[test]
fn json_inside_json_is_taken_out() {
    // A JSON document in a JSON string: escaped twice.
    for v in [QUOTY, CTRL, UTF8, "tab\there"] {
        let inner = format!("{{\"token\":{}}}", json(v));
        let text = format!("{{\"body\":{}}}\n", json(&inner));
        assert_scrubbed(text.as_bytes(), v, &[plain(v.as_bytes())]);
    }
    // `set -x` output logged as JSON.
    let text = format!(
        "{{\"log\":{}}}\n",
        json(&format!("+ echo {}", bash_sq(QUOTY)))
    );
    assert_scrubbed(text.as_bytes(), QUOTY, &[plain(QUOTY.as_bytes())]);
}

#[test]
fn python_ascii_escapes_are_taken_out() {
    // Python's ascii() and repr of bytes-as-text: `\xe4` is U+00E4.
    let escaped: String = UTF8
        .chars()
        .map(|c| match u32::from(c) {
            n @ 0x80..=0xff => format!("\\x{n:02x}"),
            _ => c.to_string(),
        })
        .collect();
    let text = format!("'{escaped}'\n");
    assert_scrubbed(
        text.as_bytes(),
        UTF8,
        &[plain(UTF8.as_bytes()), plain(escaped.as_bytes())],
    );
}

#[test]
fn url_encoding_is_taken_out() {
    for v in [QUOTY, UTF8, LONG, "pass word/+1"] {
        for upper in [false, true] {
            for all in [false, true] {
                let text = format!("GET /login?pw={}&x=1\n", url(v, upper, all));
                assert_scrubbed(text.as_bytes(), v, &[plain(v.as_bytes())]);
            }
        }
    }
    // Form encoding: a space as '+'.
    let v = "pass word/+1";
    let text = format!("pw={}\n", url(v, true, false).replace("%20", "+"));
    assert_scrubbed(text.as_bytes(), v, &[plain(v.as_bytes())]);
}

#[test]
fn octal_forms_are_taken_out() {
    for v in [LONG, MID, UTF8] {
        // printf '\163\063…' style escapes.
        let esc: String = v.bytes().map(|b| format!("\\{b:03o}")).collect();
        assert_scrubbed(format!("{esc}\n").as_bytes(), v, &[plain(v.as_bytes())]);
        // printf '%o ' per byte, zero-padded or not.
        for pad in [true, false] {
            let o: Vec<String> = v
                .bytes()
                .map(|b| {
                    if pad {
                        format!("{b:03o}")
                    } else {
                        format!("{b:o}")
                    }
                })
                .collect();
            let text = format!("{}\n", o.join(" "));
            assert_scrubbed(text.as_bytes(), v, &[(o.concat().into_bytes(), 9)]);
        }
    }
}

// ---- streaming: chunk boundaries and the two streams ------------------

fn two() -> BTreeMap<String, String> {
    [
        ("TOKEN".to_string(), "s3cr3t-value".to_string()),
        ("PW".to_string(), "hunter22".to_string()),
    ]
    .into()
}
/// One stream through a scrubber, split into three chunks.
fn through(s: &mut Scrubber, text: &[u8], a: usize, b: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for part in [&text[..a], &text[a..b], &text[b..]] {
        out.extend(s.push(Stream::Out, part)[0].clone());
    }
    out.extend(s.finish(Stream::Out)[0].clone());
    out.extend(s.finish(Stream::Err)[0].clone());
    out
}

#[test]
fn scrubbing_across_every_split() {
    let text = b"x s3cr3t-value y hunter22 z hunter2 s3cr3t-valu".to_vec();
    let want = b"x {{secret:TOKEN}} y {{secret:PW}} z hunter2 s3cr3t-valu".to_vec();
    for a in 0..text.len() {
        for b in a..text.len() {
            let mut s = Scrubber::new(&two());
            assert_eq!(through(&mut s, &text, a, b), want, "split at {a},{b}");
        }
    }
}

/// Chunks through one scrubber, both streams ended at the end.
fn both(s: &mut Scrubber, parts: &[(Stream, &[u8])]) -> [Vec<u8>; 2] {
    let mut out: [Vec<u8>; 2] = Default::default();
    for (st, part) in parts {
        let o = s.push(*st, part);
        out[0].extend(&o[0]);
        out[1].extend(&o[1]);
    }
    for st in [Stream::Out, Stream::Err] {
        let o = s.finish(st);
        out[0].extend(&o[0]);
        out[1].extend(&o[1]);
    }
    out
}

#[test]
fn a_value_split_between_stdout_and_stderr_is_taken_out() {
    let v = b"s3cr3t-value";
    for cut in 1..v.len() {
        let mut s = Scrubber::new(&two());
        let out = both(
            &mut s,
            &[
                (Stream::Out, b"a "),
                (Stream::Out, &v[..cut]),
                (Stream::Err, &v[cut..]),
                (Stream::Err, b" b"),
            ],
        );
        assert_eq!(out[0], b"a {{secret:TOKEN}}", "cut {cut}");
        assert_eq!(out[1], b" b", "cut {cut}");
    }
}

#[test]
fn a_value_interleaved_with_the_other_stream_is_still_whole_in_its_own() {
    let mut s = Scrubber::new(&two());
    let out = both(
        &mut s,
        &[
            (Stream::Out, b"hunt"),
            (Stream::Err, b"noise"),
            (Stream::Out, b"er22\n"),
        ],
    );
    assert_eq!(out[0], b"{{secret:PW}}\n");
    assert_eq!(out[1], b"noise");
}

/// Both streams print the value in halves and the chunks interleave:
/// each stream still shows one handle where its value was.
#[test]
fn the_same_value_split_in_both_streams_keeps_a_handle_in_each() {
    let mut s = Scrubber::new(&two());
    let out = both(
        &mut s,
        &[
            (Stream::Out, b"hunt"),
            (Stream::Err, b"hunt"),
            (Stream::Out, b"er22\n"),
            (Stream::Err, b"er22\n"),
        ],
    );
    assert_eq!(out[0], b"{{secret:PW}}\n");
    assert_eq!(out[1], b"{{secret:PW}}\n");
}

#[test]
fn encoded_values_are_taken_out_too() {
    let v = "s3cr3t-value";
    let alone = b64(v.as_bytes());
    let with_nl = b64(format!("{v}\n").as_bytes());
    let hex: String = v.bytes().map(|b| format!("{b:02x}")).collect();
    let rev: String = v.chars().rev().collect();
    let embedded = b64(format!("Authorization: {v}!").as_bytes());
    for text in [
        String::from_utf8(alone).unwrap(),
        String::from_utf8(with_nl).unwrap(),
        hex.clone(),
        hex.to_uppercase(),
        rev,
        String::from_utf8(embedded).unwrap(),
    ] {
        let mut s = Scrubber::new(&two());
        let out = through(&mut s, text.as_bytes(), 0, text.len() / 2);
        assert!(
            String::from_utf8_lossy(&out).contains("{{secret:TOKEN}}"),
            "{text} came out as {}",
            String::from_utf8_lossy(&out)
        );
    }
}
/// After lines on one stream (the both-streams view then rests, see
/// `Scrubber::synced`), a value split between the streams is still caught.
#[test]
fn a_split_value_after_quiet_lines_is_taken_out() {
    let v = b"s3cr3t-value";
    for cut in 1..v.len() {
        let mut s = Scrubber::new(&two());
        let out = both(
            &mut s,
            &[
                (Stream::Out, b"one\ntwo\n"),
                (Stream::Out, &v[..cut]),
                (Stream::Err, &v[cut..]),
                (Stream::Err, b"\nx\n"),
                (Stream::Out, b"\nthree\n"),
            ],
        );
        // The value is whole in neither stream but in both together.
        assert_eq!(out[0], b"one\ntwo\n{{secret:TOKEN}}\nthree\n", "cut {cut}");
        assert_eq!(out[1], b"\nx\n", "cut {cut}");
    }
}

/// Lines of filler and values (plain, in hex, base64-wrapped), each
/// value whole in one stream or split between them, pushed in chunks of
/// varying size: no value leaks from either stream.
#[test]
fn random_interleavings_leak_nothing() {
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move |n: usize| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        (rng % n as u64) as usize
    };
    for round in 0..200 {
        let mut s = fresh();
        let mut outs: [Vec<u8>; 2] = Default::default();
        let mut sent: std::collections::BTreeSet<&str> = Default::default();
        let push = |s: &mut Scrubber, st: Stream, bytes: &[u8], outs: &mut [Vec<u8>; 2]| {
            let o = s.push(st, bytes);
            outs[0].extend(&o[0]);
            outs[1].extend(&o[1]);
        };
        for _ in 0..12 {
            let stream = |k: usize| {
                if k.is_multiple_of(2) {
                    Stream::Out
                } else {
                    Stream::Err
                }
            };
            let line: Vec<u8> = match next(4) {
                0 => FILLER.to_vec(),
                k => {
                    let v = [LONG, MID, UTF8, SHORT[3]][next(4)];
                    sent.insert(v);
                    match k {
                        1 => v.as_bytes().to_vec(),
                        2 => wrap(&hex(v.as_bytes()), 60),
                        _ => wrap(&b64(v.as_bytes()), 16),
                    }
                }
            };
            let mut text = line;
            text.extend_from_slice(b"\n");
            // Split the line between the streams at a random point, each
            // part in random chunks.
            let cut = next(text.len() + 1);
            let first = next(2);
            for (k, part) in [(first, &text[..cut]), (first + 1, &text[cut..])] {
                let mut at = 0;
                while at < part.len() {
                    let n = 1 + next(9);
                    let end = (at + n).min(part.len());
                    push(&mut s, stream(k), &part[at..end], &mut outs);
                    at = end;
                }
            }
        }
        for st in [Stream::Out, Stream::Err] {
            let o = s.finish(st);
            outs[0].extend(&o[0]);
            outs[1].extend(&o[1]);
        }
        for out in &outs {
            for v in &sent {
                for form in [v.as_bytes().to_vec(), hex(v.as_bytes()), b64(v.as_bytes())] {
                    for w in form.windows(form.len().min(8)) {
                        assert!(
                            !contains(&strip_ws(out), w),
                            "round {round}: {:?} leaked in\n{}",
                            String::from_utf8_lossy(w),
                            String::from_utf8_lossy(out)
                        );
                    }
                }
            }
        }
    }
}

/// A long value (a key) printed whole, or wrapped in base64, is taken out
/// piece by piece (no single pattern may be that long).
#[test]
fn long_values_are_taken_out_piece_by_piece() {
    let key: String = (0..3000u32)
        .map(|i| {
            char::from(
                b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
                    [(i * 7919 % 62) as usize],
            )
        })
        .collect();
    let vals: BTreeMap<String, String> = [("KEY".to_string(), key.clone())].into();
    for text in [
        format!("-----BEGIN-----\n{key}\n-----END-----\n").into_bytes(),
        wrap(&b64(format!("{key}\n").as_bytes()), 76),
        wrap(&hex(key.as_bytes()), 60),
    ] {
        for chunk in [7, 4096] {
            let mut s = Scrubber::new(&vals);
            let mut out = Vec::new();
            for c in text.chunks(chunk) {
                out.extend(s.push(Stream::Out, c)[0].clone());
            }
            out.extend(s.finish(Stream::Out)[0].clone());
            out.extend(s.finish(Stream::Err)[0].clone());
            let shown = String::from_utf8_lossy(&out);
            assert!(shown.len() < 200, "{shown}");
            assert!(shown.contains("{{secret:KEY}}"), "{shown}");
        }
    }
}

/// Inputs that keep readers waiting as long as they can (and never match,
/// so what is not out yet is held): what is held back never exceeds the
/// named bound, and all comes out at the end.
#[test]
fn held_output_stays_bounded() {
    let h = hex(LONG.as_bytes());
    let almost = &LONG.as_bytes()[..LONG.len() - 1];
    let mut dump_line = b"00000000: 7333 ".to_vec();
    dump_line.extend(std::iter::repeat_n(b' ', 900));
    dump_line.extend(b"s3\n");
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "hex prefix, then spaces",
            [&h[..h.len() / 2], &[b' '; 64][..]].concat(),
        ),
        ("an endless dump line", b"00000000: 7333 6372 ".to_vec()),
        ("endless hex", h[..h.len() - 2].to_vec()),
        ("wide dump lines", dump_line),
        ("escapes", b"\\u00\\x7%4'\\'".to_vec()),
        ("near misses", [almost, b" ".as_slice()].concat()),
    ];
    for (what, unit) in cases {
        let mut s = fresh();
        let (mut pushed, mut emitted) = (0usize, 0usize);
        let text: Vec<u8> = unit.iter().copied().cycle().take(2 << 20).collect();
        for c in text.chunks(4096) {
            pushed += c.len();
            let o = s.push(Stream::Out, c);
            emitted += o[0].len();
            assert!(
                pushed - emitted <= super::scrub::MAX_HELD_BYTES,
                "{what}: {} held",
                pushed - emitted
            );
        }
        for st in [Stream::Out, Stream::Err] {
            emitted += s.finish(st)[0].len();
        }
        assert_eq!(emitted, pushed, "{what}: all comes out");
    }
}

/// Throughput of the scrubber against plain copying, in release mode:
/// `cargo test -p byom-daemon --release --lib throughput -- --ignored --nocapture`.
#[test]
#[ignore]
fn throughput() {
    const TOTAL: usize = 64 * 1024 * 1024;
    const CHUNK: usize = 64 * 1024;
    let secrets = |e: &str| -> BTreeMap<String, String> {
        [
            ("A", "hunter22"),
            ("B", "s3cr3t-value-XYZ"),
            ("C", "ghp_0123456789abcdefghijklmnopqrstuvwxyz"),
            ("D", "AKIAIOSFODNN7EXAMPLE"),
            ("E", e),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
    };
    // Log-like text: words, numbers, hex ids, punctuation, newlines.
    let mut text = Vec::with_capacity(TOTAL);
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let words = [
        "GET",
        "/api/v1/items",
        "200",
        "ok",
        "error:",
        "user",
        "id=",
        "0x7f3a",
        "deadbeef",
        "took",
        "ms",
        "[INFO]",
        "cache",
        "miss",
        "a1b2c3d4",
        "--",
        "retrying",
        "connection",
        "reset",
        "by",
        "peer",
        "{\"k\":",
        "\"v\"}",
    ];
    while text.len() < TOTAL {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        text.extend_from_slice(words[(rng % words.len() as u64) as usize].as_bytes());
        text.push(if rng.is_multiple_of(11) { b'\n' } else { b' ' });
    }
    text.truncate(TOTAL);
    let mbs = |d: std::time::Duration| TOTAL as f64 / 1e6 / d.as_secs_f64();
    let t0 = std::time::Instant::now();
    let mut copied = 0usize;
    for c in text.chunks(CHUNK) {
        let out = c.to_vec();
        copied += std::hint::black_box(out).len();
    }
    println!("plain copy: {:.0} MB/s ({copied} bytes)", mbs(t0.elapsed()));
    for (what, e, err_every) in [
        // Every 4th chunk on stderr: both streams' views at work.
        (
            "5 secrets, stdout+stderr",
            "correct horse battery staple, 2024!",
            4,
        ),
        (
            "5 secrets, stdout only",
            "correct horse battery staple, 2024!",
            usize::MAX,
        ),
        // A quote and a backslash: the raw and twice-decoded readers too.
        (
            "5 secrets, one quoty, stdout+stderr",
            "it's \"a\" c:\\path",
            4,
        ),
    ] {
        let mut s = Scrubber::new(&secrets(e));
        let t0 = std::time::Instant::now();
        let mut emitted = 0usize;
        for (i, c) in text.chunks(CHUNK).enumerate() {
            let st = if i % err_every == err_every - 1 {
                Stream::Err
            } else {
                Stream::Out
            };
            let out = s.push(st, c);
            emitted += out[0].len() + out[1].len();
        }
        for st in [Stream::Out, Stream::Err] {
            let out = s.finish(st);
            emitted += out[0].len() + out[1].len();
        }
        println!("scrubber ({what}): {:.1} MB/s", mbs(t0.elapsed()));
        assert_eq!(emitted, TOTAL);
    }
}

// ---- what must not change ---------------------------------------------

#[test]
fn ordinary_output_is_left_alone() {
    let mut text = Vec::new();
    let other = b"an unrelated payload, 0123 4567 89ab cdef, nothing secret here";
    text.extend(xxd(other, 2, false));
    text.extend(hexdump_c(other));
    text.extend(od(other, true, od_c));
    text.extend(od(other, false, od_x1));
    text.extend(wrap(&b64(other), 76));
    text.extend(wrap(&hex(other), 60));
    text.extend(format!("+ echo {}\n", bash_sq("it's fine")).into_bytes());
    text.extend(format!("{}\n", json("say \"hi\"\n\\ \u{e9}")).into_bytes());
    text.extend(b"GET /a%20b?q=%2Fx%2f HTTP/1.1\n");
    // Near misses: each value but its last byte, plain and in hex.
    for v in [LONG, MID] {
        let cut = &v.as_bytes()[..v.len() - 1];
        text.extend_from_slice(cut);
        text.push(b'\n');
        text.extend(wrap(&hex(cut), 60));
    }
    for (how, out) in outputs(&text) {
        assert_eq!(
            String::from_utf8_lossy(&out),
            String::from_utf8_lossy(&text),
            "{how}"
        );
    }
}
