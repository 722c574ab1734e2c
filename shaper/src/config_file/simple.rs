//! The plain format for systems without UCI (`/etc/shaper/shaper.conf`):
//!
//! ```text
//! [wan]
//! iface = eth1
//! lan = br-lan
//! lan = br-guest
//! ```
//!
//! `[NAME]` opens a section, `KEY = VALUE` sets a key (again for each
//! value of a list). A value may be quoted with `'` or `"` (taken as is
//! inside); a `#` at the start of a line, or after whitespace outside
//! quotes, starts a comment.
//!
//! Non-goals: INI's nesting, continuation lines and keys outside a section.

use std::path::Path;

use super::{
    Entry, RawSection,
    error::{At, ConfigFileError, unterminated},
};

/// Parses `text` (from `path`, for the errors) into its sections.
pub fn parse(path: &Path, text: &str) -> Result<Vec<RawSection>, ConfigFileError> {
    let mut sections: Vec<RawSection> = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let syntax = |what: String| ConfigFileError::Syntax {
            at: At {
                path: path.to_owned(),
                line,
            },
            what,
        };
        let trimmed = raw.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        if let Some(header) = trimmed.strip_prefix('[') {
            let name = header
                .split_once(']')
                .filter(|(_, rest)| is_comment(rest))
                .map(|(name, _)| name.trim())
                .ok_or_else(|| syntax(format!("expected `[NAME]`, found `{trimmed}`")))?;
            if !valid_name(name) {
                return Err(syntax(format!(
                    "section name '{name}' is not a name: use letters, digits, _, - and ."
                )));
            }
            sections.push(RawSection {
                name: name.to_owned(),
                line,
                entries: Vec::new(),
            });
            continue;
        }
        let Some((key, value)) = trimmed.split_once('=') else {
            return Err(syntax(format!(
                "expected `[NAME]` or `KEY = VALUE`, found `{trimmed}`"
            )));
        };
        let key = key.trim();
        let value = value_of(value.trim()).map_err(syntax)?;
        let Some(section) = sections.last_mut() else {
            return Err(syntax(format!(
                "`{key} = ...` before any section: put `[NAME]` above it"
            )));
        };
        if key.is_empty() || key.contains(char::is_whitespace) {
            return Err(syntax(format!("expected `KEY = VALUE`, found `{trimmed}`")));
        }
        section.entries.push(Entry {
            key: key.to_owned(),
            value,
            line,
            list: false,
        });
    }
    Ok(sections)
}

/// A section name: letters, digits, `_`, `-` and `.`, which a systemd
/// instance name and a procd instance take as they are.
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

/// True for what may follow a value: nothing, or a comment.
fn is_comment(rest: &str) -> bool {
    let rest = rest.trim_start();
    rest.is_empty() || rest.starts_with('#')
}

/// The value after `=`: quoted, or bare up to a comment.
fn value_of(v: &str) -> Result<String, String> {
    if let Some(quote) = v.chars().next().filter(|c| matches!(c, '\'' | '"')) {
        let inner = &v[1..];
        return match inner.split_once(quote) {
            Some((value, rest)) if is_comment(rest) => Ok(value.to_owned()),
            Some(_) => Err(format!(
                "text after the quoted value `{v}`: put a comment after #"
            )),
            None => Err(unterminated(quote)),
        };
    }
    let end = v
        .char_indices()
        .find(|&(i, c)| c == '#' && v[..i].ends_with(char::is_whitespace))
        .map_or(v.len(), |(i, _)| i);
    Ok(v[..end].trim_end().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_ok(text: &str) -> Vec<RawSection> {
        parse(Path::new("shaper.conf"), text).expect("valid")
    }

    fn parse_err(text: &str) -> String {
        parse(Path::new("shaper.conf"), text)
            .expect_err("invalid")
            .to_string()
    }

    #[test]
    fn sections_keys_and_lists() {
        let s = parse_ok(
            "# shaper\n\
             \n\
             [wan]\n\
             iface = eth1\n\
             rate=850mbit   # the ISP's\n\
             lan = br-lan\n\
             lan = 'br guest'\n\
             \x20 [wan-6.b]  # second\n\
             iface = \"eth2\" # quoted\n\
             framing = a#b\n",
        );
        assert_eq!(s.len(), 2);
        assert_eq!((s[0].name.as_str(), s[0].line), ("wan", 3));
        assert_eq!((s[1].name.as_str(), s[1].line), ("wan-6.b", 8));
        let e: Vec<(&str, &str, usize)> = s[0]
            .entries
            .iter()
            .map(|e| (e.key.as_str(), e.value.as_str(), e.line))
            .collect();
        assert_eq!(
            e,
            [
                ("iface", "eth1", 4),
                ("rate", "850mbit", 5),
                ("lan", "br-lan", 6),
                ("lan", "br guest", 7),
            ]
        );
        assert_eq!(s[1].entries[0].value, "eth2");
        assert_eq!(
            s[1].entries[1].value, "a#b",
            "a # inside a word is no comment"
        );
    }

    #[test]
    fn errors_name_the_line() {
        let e = parse_err("iface = eth1\n");
        assert!(
            e.starts_with("shaper.conf:1: `iface = ...` before any section"),
            "{e}"
        );
        let e = parse_err("[wan]\niface eth1\n");
        assert!(
            e.starts_with("shaper.conf:2: expected `[NAME]` or `KEY = VALUE`"),
            "{e}"
        );
        let e = parse_err("[wan\n");
        assert!(e.starts_with("shaper.conf:1: expected `[NAME]`"), "{e}");
        let e = parse_err("[w an]\n");
        assert!(e.starts_with("shaper.conf:1: section name 'w an'"), "{e}");
        let e = parse_err("[wan]\n\nrate = '1mbit\n");
        assert!(e.starts_with("shaper.conf:3: unterminated '"), "{e}");
        let e = parse_err("[wan]\nrate = '1mbit' x\n");
        assert!(e.starts_with("shaper.conf:2: text after"), "{e}");
        let e = parse_err("[wan]\nin face = eth1\n");
        assert!(
            e.starts_with("shaper.conf:2: expected `KEY = VALUE`"),
            "{e}"
        );
    }
}
