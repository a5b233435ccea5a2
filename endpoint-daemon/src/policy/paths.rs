//! Paths as text, without touching the disk: shared by the analysis and
//! the rules (which must not depend on each other both ways).

/// A path as text, with `.`, `..`, repeated and trailing slashes resolved
/// without touching the disk (`//` and `/.` are `/`).
pub fn normalize(p: &str) -> String {
    if p.is_empty() {
        return String::new();
    }
    let absolute = p.starts_with('/');
    let mut parts: Vec<&str> = Vec::new();
    for c in p.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                if parts.pop().is_none() && !absolute {
                    parts.push("..");
                }
            }
            c => parts.push(c),
        }
    }
    let joined = parts.join("/");
    match (absolute, joined.is_empty()) {
        (true, _) => format!("/{joined}"),
        (false, true) => ".".into(),
        (false, false) => joined,
    }
}
