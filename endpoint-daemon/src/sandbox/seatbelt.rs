//! The same sandbox for macOS, as a Seatbelt profile (the language
//! `sandbox-exec -p` reads, and Apple's own tools and Codex use). Pure
//! text from a [`Spec`], so it is tested on any OS.
//!
//! In a Seatbelt profile the last matching rule wins, so the order is the
//! meaning: everything allowed, then no writes anywhere, then writes under
//! the write roots, then the read-only paths closed to writing again,
//! then the hidden paths closed to reading and writing, then the network.

use std::fmt::Write;
use std::path::Path;

use super::plan::Spec;
use crate::policy::sandbox::Net;

/// A path as an SBPL string literal.
fn quoted(p: &Path) -> String {
    let mut s = String::from("\"");
    for c in p.to_string_lossy().chars() {
        match c {
            '"' => s.push_str("\\\""),
            '\\' => s.push_str("\\\\"),
            c if c.is_control() => {
                let _ = write!(s, "\\x{:02x}", c as u32 & 0xff);
            }
            c => s.push(c),
        }
    }
    s.push('"');
    s
}

fn refs(v: &[std::path::PathBuf]) -> Vec<&Path> {
    v.iter().map(|p| p.as_path()).collect()
}

fn rule(out: &mut String, verb: &str, ops: &str, paths: &[&Path], file: bool) {
    if paths.is_empty() {
        return;
    }
    let _ = writeln!(out, "({verb} {ops}");
    for p in paths {
        let kind = if file { "literal" } else { "subpath" };
        let _ = writeln!(out, "  ({kind} {})", quoted(p));
    }
    out.push_str(")\n");
}

/// The profile for one command. `net` is the network its origin gets.
pub fn profile(spec: &Spec, net: &Net) -> String {
    let mut out = String::from(
        "(version 1)\n\
         ; byomd: generated for one command; the last matching rule wins.\n\
         (allow default)\n\
         (deny file-write* (subpath \"/\"))\n",
    );
    let dirs = |v: &[std::path::PathBuf], want_dir: bool| -> Vec<std::path::PathBuf> {
        v.iter()
            .filter(|p| p.is_dir() == want_dir || !p.exists() && want_dir)
            .cloned()
            .collect()
    };
    let write_dirs = dirs(&spec.write, true);
    let write_files = dirs(&spec.write, false);
    rule(&mut out, "allow", "file-write*", &refs(&write_dirs), false);
    rule(&mut out, "allow", "file-write*", &refs(&write_files), true);
    rule(
        &mut out,
        "allow",
        "file-write*",
        &[
            Path::new("/dev/null"),
            Path::new("/dev/zero"),
            Path::new("/dev/tty"),
        ],
        true,
    );
    if let Some(t) = &spec.tmp {
        rule(&mut out, "allow", "file-write*", &[t.own.as_path()], false);
    }
    rule(
        &mut out,
        "deny",
        "file-write*",
        &refs(&spec.read_only),
        false,
    );
    rule(
        &mut out,
        "deny",
        "file-read* file-write*",
        &refs(&spec.hide),
        false,
    );
    // No pushing keystrokes or reading other processes.
    out.push_str("(deny process-info* (target others))\n");
    out.push_str("(deny file-ioctl (literal \"/dev/tty\"))\n");
    match net {
        Net::Allow => {}
        Net::Deny => {
            out.push_str("(deny network-outbound (remote ip))\n(deny network-inbound (local ip))\n")
        }
        Net::Ports(ports) => {
            out.push_str("(deny network-outbound (remote ip))\n");
            for p in ports {
                let _ = writeln!(out, "(allow network-outbound (remote tcp \"*:{p}\"))");
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn the_order_is_the_meaning() {
        let home = tempfile::tempdir().unwrap();
        let h = home.path();
        std::fs::create_dir_all(h.join("src")).unwrap();
        let spec = Spec {
            write: vec![h.to_path_buf()],
            read_only: vec![h.join(".zshrc")],
            hide: vec![h.join(".ssh"), PathBuf::from("/Users/a \"b\"/byomd")],
            ..Default::default()
        };
        let p = profile(&spec, &Net::Ports(vec![443]));
        let at = |needle: &str| {
            p.find(needle)
                .unwrap_or_else(|| panic!("{needle} not in\n{p}"))
        };
        assert!(p.starts_with("(version 1)"));
        // Deny everything, then open the roots, then close what is
        // protected again: later rules win.
        assert!(at("(deny file-write* (subpath \"/\"))") < at("(allow file-write*"));
        assert!(at("(allow file-write*") < at("(deny file-write*\n"));
        assert!(at("(deny file-write*\n") < at("(deny file-read* file-write*"));
        assert!(p.contains(&format!("(subpath \"{}\")", h.join(".ssh").display())));
        // Quotes in a path cannot end the string early.
        assert!(p.contains("(subpath \"/Users/a \\\"b\\\"/byomd\")"), "{p}");
        assert!(p.contains("(deny network-outbound (remote ip))"));
        assert!(p.contains("(allow network-outbound (remote tcp \"*:443\"))"));
        let open = profile(&spec, &Net::Allow);
        assert!(!open.contains("network-outbound"));
        assert_eq!(p.matches('(').count(), p.matches(')').count(), "{p}");
    }
}
