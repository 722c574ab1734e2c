//! OpenWrt's UCI format, as `/etc/config/shaper` holds it:
//!
//! ```text
//! config interface 'wan'
//!     option iface 'eth1'
//!     list lan 'br-lan'
//! ```
//!
//! As libuci reads it: a line is words, each bare, in single quotes
//! (taken as is) or in double quotes (`\` escapes the next character), and
//! adjacent pieces join into one word (`'a'"b"` is `ab`); a `#` that
//! starts a word starts a comment. `config TYPE [NAME]` opens a section,
//! `option KEY VALUE` and `list KEY VALUE` set its keys; an unnamed
//! section is `@TYPE[N]`, N counting that type's sections from 0.
//! `package NAME` is accepted and ignored.
//!
//! Non-goals: libuci's merging of sections that share a name (refused
//! here, so one section is one instance) and its `delta` files.

use std::path::Path;

use super::{
    Entry, RawSection,
    error::{At, ConfigFileError, unterminated},
};

/// The only section type: one shaped interface.
pub const SECTION_TYPE: &str = "interface";

/// Parses `text` (from `path`, for the errors) into its sections.
pub fn parse(path: &Path, text: &str) -> Result<Vec<RawSection>, ConfigFileError> {
    let mut sections: Vec<RawSection> = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let at = || At {
            path: path.to_owned(),
            line,
        };
        let syntax = |what: String| ConfigFileError::Syntax { at: at(), what };
        let words = words(raw).map_err(syntax)?;
        let Some((first, rest)) = words.split_first() else {
            continue;
        };
        match (first.as_str(), rest) {
            ("package", [_]) => {}
            ("config", [kind, name @ ..]) if name.len() <= 1 => {
                if kind != SECTION_TYPE {
                    return Err(ConfigFileError::SectionType {
                        at: at(),
                        kind: kind.clone(),
                    });
                }
                let name = match name.first() {
                    Some(n) if valid_name(n) => n.clone(),
                    Some(n) => {
                        return Err(syntax(format!(
                            "section name '{n}' is not a UCI name: use letters, digits and _"
                        )));
                    }
                    None => format!("@{SECTION_TYPE}[{}]", sections.len()),
                };
                sections.push(RawSection {
                    name,
                    line,
                    entries: Vec::new(),
                });
            }
            (keyword @ ("option" | "list"), [key, value]) => {
                let Some(section) = sections.last_mut() else {
                    return Err(syntax(format!(
                        "`{keyword} {key}` before any section: put `config interface 'NAME'` \
                         above it"
                    )));
                };
                section.entries.push(Entry {
                    key: key.clone(),
                    value: value.clone(),
                    line,
                    list: keyword == "list",
                });
            }
            ("option" | "list", [key]) => {
                return Err(syntax(format!(
                    "`{first} {key}` has no value: write `{first} {key} 'VALUE'`"
                )));
            }
            _ => {
                return Err(syntax(format!(
                    "expected `config interface 'NAME'`, `option KEY 'VALUE'` or `list KEY \
                     'VALUE'`, found `{}`",
                    raw.trim()
                )));
            }
        }
    }
    Ok(sections)
}

/// A UCI name: letters, digits and `_` (libuci's `uci_validate_name`).
fn valid_name(name: &str) -> bool {
    !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Splits a line into its words, quotes removed, up to a comment.
fn words(line: &str) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut chars = line.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        match chars.peek() {
            None | Some('#') => return Ok(words),
            Some(_) => {}
        }
        let mut word = String::new();
        while let Some(c) = chars.next_if(|c| !c.is_whitespace()) {
            match c {
                '\'' => loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(c) => word.push(c),
                        None => return Err(unterminated('\'')),
                    }
                },
                '"' => loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => word.push(chars.next().ok_or_else(|| unterminated('"'))?),
                        Some(c) => word.push(c),
                        None => return Err(unterminated('"')),
                    }
                },
                '\\' => {
                    if let Some(c) = chars.next() {
                        word.push(c);
                    }
                }
                c => word.push(c),
            }
        }
        words.push(word);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_ok(text: &str) -> Vec<RawSection> {
        parse(Path::new("/etc/config/shaper"), text).expect("valid")
    }

    fn parse_err(text: &str) -> String {
        parse(Path::new("/etc/config/shaper"), text)
            .expect_err("invalid")
            .to_string()
    }

    #[test]
    fn sections_options_and_lists() {
        let s = parse_ok(
            "# shaper\n\
             package shaper\n\
             \n\
             config interface 'wan'\n\
             \toption iface 'eth1'   # the WAN port\n\
             \toption rate \"850mbit\"\n\
             \toption isolate dual-srchost\n\
             \tlist lan 'br-lan'\n\
             \tlist lan 'br-guest'\n\
             config interface\n\
             \toption iface eth2\n\
             config interface lte\n\
             config interface\n",
        );
        let names: Vec<&str> = s.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            ["wan", "@interface[1]", "lte", "@interface[3]"],
            "unnamed sections count every section of the type"
        );
        assert_eq!((s[0].line, s[1].line), (4, 10));
        let e: Vec<(&str, &str, usize, bool)> = s[0]
            .entries
            .iter()
            .map(|e| (e.key.as_str(), e.value.as_str(), e.line, e.list))
            .collect();
        assert_eq!(
            e,
            [
                ("iface", "eth1", 5, false),
                ("rate", "850mbit", 6, false),
                ("isolate", "dual-srchost", 7, false),
                ("lan", "br-lan", 8, true),
                ("lan", "br-guest", 9, true),
            ]
        );
        assert_eq!(s[1].entries[0].value, "eth2");
    }

    #[test]
    fn quoting_as_libuci() {
        let w = |l: &str| words(l).expect("valid");
        assert_eq!(w("option a 'x y'"), ["option", "a", "x y"]);
        assert_eq!(w(r#"option a "say \"hi\"""#), ["option", "a", "say \"hi\""]);
        assert_eq!(w(r"option a 'back\slash'"), ["option", "a", r"back\slash"]);
        assert_eq!(w("option a 'x'\"y\"z"), ["option", "a", "xyz"]);
        assert_eq!(w("option a ''"), ["option", "a", ""]);
        assert_eq!(w("option a 'x#y' # comment"), ["option", "a", "x#y"]);
        assert_eq!(w("option a b#c"), ["option", "a", "b#c"]);
        assert_eq!(w("  # all comment"), Vec::<String>::new());
        assert!(words("option a 'open").is_err());
        assert!(words("option a \"open\\\"").is_err());
    }

    #[test]
    fn errors_name_the_line() {
        let e = parse_err("config interface 'wan'\n\toption rate '1mbit\n");
        assert!(e.starts_with("/etc/config/shaper:2: unterminated '"), "{e}");
        let e = parse_err("\n# x\nconfig queue 'eth1'\n");
        assert!(
            e.starts_with("/etc/config/shaper:3: section type 'queue'"),
            "{e}"
        );
        assert!(e.contains("config interface 'NAME'"), "{e}");
        let e = parse_err("option iface 'eth1'\n");
        assert!(e.starts_with("/etc/config/shaper:1: `option iface` before any section"));
        let e = parse_err("config interface 'wan'\n\toption iface\n");
        assert!(e.contains(":2: `option iface` has no value"), "{e}");
        let e = parse_err("config interface 'wan'\n\toption iface eth1 eth2\n");
        assert!(e.contains(":2: expected `config interface 'NAME'`"), "{e}");
        let e = parse_err("config interface 'wan'\n\tset iface eth1\n");
        assert!(e.contains(":2: expected"), "{e}");
        let e = parse_err("config interface 'my-wan'\n");
        assert!(e.contains(":1: section name 'my-wan'"), "{e}");
        let e = parse_err("config interface 'wan' extra\n");
        assert!(e.contains(":1: expected"), "{e}");
    }
}
