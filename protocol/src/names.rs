//! Names and labels, checked the same way everywhere: by the admin API, by
//! the gateway for labels a daemon reports in Hello, and by `byomd` before
//! it sends them.

use crate::limits::{MAX_LABELS, MAX_NAME_LEN};

/// Why a label was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LabelError {
    #[error("bad label {key}={value}: keys and values use letters, digits, '-', '_', '.', '/' (at most {MAX_NAME_LEN} characters), and keys are not empty")]
    Bad { key: String, value: String },
    #[error("at most {MAX_LABELS} labels")]
    TooMany,
}

/// Names are lower-case ASCII words that cannot be mistaken for IDs.
pub fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_NAME_LEN
        && sanitize_name(s) == s
        && crate::id::Kind::of(s).is_none()
}

/// Turns any host name into a valid machine name.
pub fn sanitize_name(s: &str) -> String {
    let mut out: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .take(MAX_NAME_LEN - 4)
        .collect();
    if out.is_empty() {
        out = "machine".into();
    }
    out
}

/// One label, `key=value`.
pub fn check_label(key: &str, value: &str) -> Result<(), LabelError> {
    let ok = |s: &str| {
        s.len() <= MAX_NAME_LEN
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
    };
    if key.is_empty() || !ok(key) || !ok(value) {
        return Err(LabelError::Bad {
            key: key.to_string(),
            value: value.to_string(),
        });
    }
    Ok(())
}

/// A whole label set.
pub fn check_labels<'a>(
    labels: impl IntoIterator<Item = (&'a String, &'a String)>,
) -> Result<(), LabelError> {
    let mut n = 0;
    for (k, v) in labels {
        n += 1;
        if n > MAX_LABELS {
            return Err(LabelError::TooMany);
        }
        check_label(k, v)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn names_and_labels() {
        assert!(valid_name("lap"));
        assert!(valid_name("web-1.prod"));
        assert!(!valid_name("Lap"));
        assert!(
            !valid_name("mch_01jb2s9r6x0000000000000000"),
            "an ID is not a name"
        );
        assert!(valid_name("mch_lap"), "only a real ID is refused");
        assert!(!valid_name(""));
        assert_eq!(sanitize_name("Ada's MacBook"), "ada-s-macbook");
        assert_eq!(sanitize_name(""), "machine");
        assert!(check_label("team", "web").is_ok());
        assert!(check_label("k8s.io/zone", "eu-1").is_ok());
        assert!(check_label("", "x").is_err());
        assert!(check_label("team", "a b").is_err());
        assert!(check_label("team", "\u{7}").is_err());
        assert!(check_label(&"k".repeat(64), "v").is_err());
        let many: Vec<(String, String)> = (0..=MAX_LABELS)
            .map(|i| (format!("k{i}"), "v".to_string()))
            .collect();
        assert_eq!(
            check_labels(many.iter().map(|(k, v)| (k, v))),
            Err(LabelError::TooMany)
        );
    }

    proptest! {
        /// Whatever a host calls itself, the sanitized name is valid
        /// (unless it happens to look like an ID).
        #[test]
        fn sanitized_names_are_valid(s in "\\PC{0,80}") {
            let n = sanitize_name(&s);
            prop_assert!(valid_name(&n) || crate::id::Kind::of(&n).is_some());
        }
    }
}
