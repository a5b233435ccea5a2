//! Tests of `crate::shell` (kept here, under `policy/`, so `shell.rs` stays
//! within the size limit; it is still the module `shell::tests`).

use super::words::ansi_c;
use super::*;

fn first_words(line: &str) -> Vec<Option<String>> {
    let s = parse(line, Some("/home/u"), 0);
    assert!(s.unknown.is_empty(), "{line}: {:?}", s.unknown);
    s.commands
        .iter()
        .map(|c| c.words.first().and_then(Arg::literal))
        .collect()
}

#[test]
fn quotes_and_escapes_are_removed() {
    for line in [
        "s''u -c id",
        "\\su -c id",
        "\"s\"u",
        "$'s\\x75'",
        "$'\\163u'",
        "'su'",
    ] {
        assert_eq!(first_words(line), vec![Some("su".to_string())], "{line}");
    }
}

#[test]
fn every_command_is_found() {
    assert_eq!(
        first_words("a; b && c || d | e & f\n(g); { h; }"),
        ["a", "b", "c", "d", "e", "f", "g", "h"]
            .map(|s| Some(s.to_string()))
            .to_vec()
    );
    let s = parse(
        "echo $(su) `doas x` \"$(sudo y)\" <(pkexec z) ${a:-$(reboot)}",
        None,
        0,
    );
    let progs: Vec<_> = s
        .commands
        .iter()
        .filter_map(|c| c.words.first().and_then(Arg::literal))
        .collect();
    for p in ["su", "doas", "sudo", "pkexec", "reboot", "echo"] {
        assert!(progs.contains(&p.to_string()), "{p} in {progs:?}");
    }
    let s = parse("cat <<EOF\n$(su)\nEOF\nif x; then y; elif z; then w; else v; fi; for i in 1; do q; done; case a in b) r;; esac; f() { t; }", None, 0);
    let progs: Vec<_> = s
        .commands
        .iter()
        .filter_map(|c| c.words.first().and_then(Arg::literal))
        .collect();
    for p in ["cat", "su", "x", "y", "z", "w", "v", "q", "r", "t"] {
        assert!(progs.contains(&p.to_string()), "{p} in {progs:?}");
    }
    assert!(s.functions.contains("f"));
    // A quoted here-document is text, not commands.
    let s = parse("cat <<'EOF'\n$(su)\nEOF", None, 0);
    assert_eq!(s.commands.len(), 1);
}

#[test]
fn what_the_shell_builds_is_dynamic() {
    let s = parse("x=s; ${x}u -c id", None, 0);
    assert_eq!(s.commands[1].words[0].literal(), None);
    assert!(s.commands[1].words[0].is_dynamic());
    assert!(s.assigned.contains("x"));
    let s = parse("/bin/s? -c id; {s,}u", None, 0);
    assert_eq!(s.commands[0].words[0].literal(), None);
    assert_eq!(s.commands[1].words[0].literal(), None);
    // Quoted glob characters are text.
    let s = parse("echo '*'", None, 0);
    assert_eq!(s.commands[0].words[1].literal().as_deref(), Some("*"));
    let s = parse("rm -rf ~ $HOME/ \"$X/\"", Some("/home/u"), 0);
    let w = &s.commands[0].words;
    assert_eq!(w[2].literal().as_deref(), Some("/home/u"));
    assert_eq!(w[3].literal().as_deref(), Some("/home/u/"));
    assert_eq!(w[4].known(), "/");
}

#[test]
fn what_cannot_be_parsed_is_unknown_not_a_crash() {
    assert!(!parse("echo 'unterminated", None, 0).unknown.is_empty());
    let deep = format!("{}x{}", "(".repeat(5000), ")".repeat(5000));
    assert!(!parse(&deep, None, 0).unknown.is_empty());
    let mut nested = "x".to_string();
    for _ in 0..40 {
        nested = format!("echo $({nested})");
    }
    assert!(!parse(&nested, None, 0).unknown.is_empty());
    assert!(!parse(&"a".repeat(MAX_SCRIPT_BYTES + 1), None, 0)
        .unknown
        .is_empty());
    // Deep but allowed: parsed, not refused.
    let ok = format!("{}x{}", "(".repeat(150), ")".repeat(150));
    assert!(parse(&ok, None, 0).unknown.is_empty());
}

#[test]
fn arithmetic_injection_is_unknown() {
    assert!(!parse("x='a[$(su)]'; echo $((x))", None, 0)
        .unknown
        .is_empty());
    assert!(parse("echo '$(date)'", None, 0).unknown.is_empty());
    assert!(parse("printf '%s' 'see $(x)'", None, 0).unknown.is_empty());
}

#[test]
fn ansi_c_escapes() {
    assert_eq!(ansi_c("s\\x75"), "su");
    assert_eq!(ansi_c("\\163\\165"), "su");
    assert_eq!(ansi_c("\\u0073u"), "su");
    assert_eq!(ansi_c("a\\tb\\q"), "a\tb\\q");
    assert_eq!(ansi_c("\\"), "\\");
}
