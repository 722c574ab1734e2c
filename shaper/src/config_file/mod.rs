//! Config files that `shaper run --config` and the service scripts share:
//! one section per shaped interface, its keys `run`'s long flags with `_`
//! for `-`, plus `enabled`.
//!
//! Principles:
//! - **The flags are the one definition.** The keys come from clap's
//!   metadata of `RunArgs` (`keys`); a section becomes the argv those
//!   flags would be (`--rate=850mbit`, one argument per key and value, in
//!   the flags' order), which clap parses and [`RunArgs::plan`]
//!   validates, as for `run` itself. A section is refused with the flags'
//!   own message, prefixed with the file, the line and the key.
//! - **All or nothing.** Every section, enabled or not, is validated when
//!   the file is loaded, so a service never starts half of a file.
//! - **Refuse rather than guess.** An unknown key, a key given twice, a
//!   switch that is not a boolean are errors, not ignored.
//!
//! Files: `uci.rs` (OpenWrt's `/etc/config/shaper`), `simple.rs` (`[wan]`
//! and `key = value`), `keys.rs` (the keys from clap), `error.rs`. The
//! format is told by the first line that is not blank or a comment.

mod error;
mod keys;
mod simple;
mod uci;

use std::path::{Path, PathBuf};

pub use error::{At, ConfigFileError};
pub use keys::{ENABLED, Key, Kind, keys, parse_bool};

use crate::cli::RunArgs;

/// One `KEY VALUE` line of a section, as written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The key.
    pub key: String,
    /// The value, quotes removed.
    pub value: String,
    /// 1-based line.
    pub line: usize,
    /// Given with UCI's `list` keyword.
    pub list: bool,
}

/// A section as written, before validation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawSection {
    /// Its name (UCI's `@interface[N]` when unnamed).
    pub name: String,
    /// The line of its header.
    pub line: usize,
    /// Its keys in file order.
    pub entries: Vec<Entry>,
}

/// Which of the two formats a file is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// OpenWrt's UCI.
    Uci,
    /// `[NAME]` and `KEY = VALUE`.
    Simple,
}

impl Format {
    /// The line that sets `key`, as an example for an error message.
    fn example(self, key: &Key) -> String {
        let value = key.value_name.as_deref().unwrap_or("1");
        match self {
            Format::Uci => format!("option {} '{value}'", key.name),
            Format::Simple => format!("{} = {value}", key.name),
        }
    }
}

/// One argument of a section's argv, and where it came from.
#[derive(Clone, Debug)]
struct Arg {
    /// Index of its key in [`keys`]: the canonical order.
    key: usize,
    /// `--flag` or `--flag=value`.
    arg: String,
    /// The value as written.
    value: String,
    /// Its line.
    line: usize,
}

/// A validated section.
#[derive(Clone, Debug)]
pub struct Section {
    /// Its name.
    pub name: String,
    /// The line of its header.
    pub line: usize,
    /// Its `enabled` (default true).
    pub enabled: bool,
    /// The line of its `enabled`, or of its header.
    enabled_line: usize,
    /// `run`'s flags as parsed from it.
    pub args: RunArgs,
    /// The same as arguments, in the flags' order.
    argv: Vec<Arg>,
}

impl Section {
    /// The section as `run`'s arguments, one per element, in the flags'
    /// order; without `--rate` and `--ingress-rate` when `rates` is false.
    pub fn run_args(&self, rates: bool) -> Vec<&str> {
        self.argv
            .iter()
            .filter(|a| {
                rates || !a.arg.starts_with("--rate=") && !a.arg.starts_with("--ingress-rate=")
            })
            .map(|a| a.arg.as_str())
            .collect()
    }
}

/// A loaded and validated config file.
#[derive(Clone, Debug)]
pub struct ConfigFile {
    /// The file as given.
    pub path: PathBuf,
    /// Its format.
    pub format: Format,
    /// Its sections, in file order.
    pub sections: Vec<Section>,
}

impl ConfigFile {
    /// Reads and validates the file at `path`.
    pub fn load(path: &Path) -> Result<Self, ConfigFileError> {
        let text = std::fs::read_to_string(path).map_err(|io_error| ConfigFileError::Read {
            path: path.to_owned(),
            io_error,
        })?;
        Self::parse(path, &text)
    }

    /// Validates `text`, read from `path`: every section must be one that
    /// `run` takes, and no two enabled ones may shape one interface.
    pub fn parse(path: &Path, text: &str) -> Result<Self, ConfigFileError> {
        let (format, raw) = match detect(path, text)? {
            Format::Uci => (Format::Uci, uci::parse(path, text)?),
            Format::Simple => (Format::Simple, simple::parse(path, text)?),
        };
        let keys = keys();
        let mut sections: Vec<Section> = Vec::new();
        for r in raw {
            let at = At {
                path: path.to_owned(),
                line: r.line,
            };
            if let Some(first) = sections.iter().find(|s| s.name == r.name) {
                return Err(ConfigFileError::DuplicateSection {
                    at,
                    name: r.name,
                    first: first.line,
                });
            }
            let section = validate(path, format, &keys, r)?;
            if let Some(other) = sections
                .iter()
                .find(|o| o.enabled && section.enabled && o.args.iface == section.args.iface)
            {
                return Err(ConfigFileError::SameInterface {
                    at,
                    section: section.name,
                    other: other.name.clone(),
                    iface: section.args.iface,
                });
            }
            sections.push(section);
        }
        Ok(Self {
            path: path.to_owned(),
            format,
            sections,
        })
    }

    /// The enabled sections, in file order.
    pub fn enabled(&self) -> impl Iterator<Item = &Section> {
        self.sections.iter().filter(|s| s.enabled)
    }

    /// The section `name`, which must be enabled; without a name, the one
    /// enabled section.
    pub fn select(&self, name: Option<&str>) -> Result<&Section, ConfigFileError> {
        let Some(name) = name else {
            let enabled: Vec<&Section> = self.enabled().collect();
            return match enabled[..] {
                [] => Err(ConfigFileError::NoSection {
                    path: self.path.clone(),
                }),
                [one] => Ok(one),
                _ => Err(ConfigFileError::SectionNeeded {
                    path: self.path.clone(),
                    names: names(enabled.into_iter()),
                }),
            };
        };
        let section = self
            .sections
            .iter()
            .find(|s| s.name == name)
            .ok_or_else(|| ConfigFileError::NoSuchSection {
                path: self.path.clone(),
                name: name.to_owned(),
                names: names(self.sections.iter()),
            })?;
        if !section.enabled {
            return Err(ConfigFileError::Disabled {
                at: At {
                    path: self.path.clone(),
                    line: section.enabled_line,
                },
                name: name.to_owned(),
            });
        }
        Ok(section)
    }
}

/// The names, comma-separated.
fn names<'a>(sections: impl Iterator<Item = &'a Section>) -> String {
    let names: Vec<&str> = sections.map(|s| s.name.as_str()).collect();
    if names.is_empty() {
        "none".to_owned()
    } else {
        names.join(", ")
    }
}

/// The format of `text`, from its first line that is not blank or a
/// comment; UCI for a file without one.
fn detect(path: &Path, text: &str) -> Result<Format, ConfigFileError> {
    let first = text
        .lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l.trim()))
        .find(|(_, l)| !l.is_empty() && !l.starts_with('#'));
    match first {
        None => Ok(Format::Uci),
        Some((_, l)) if l.starts_with('[') => Ok(Format::Simple),
        Some((_, l))
            if ["config", "package"].contains(&l.split_whitespace().next().unwrap_or("")) =>
        {
            Ok(Format::Uci)
        }
        Some((line, l)) => Err(ConfigFileError::Syntax {
            at: At {
                path: path.to_owned(),
                line,
            },
            what: format!(
                "expected a section: `config interface 'NAME'` (UCI) or `[NAME]`, found `{l}`"
            ),
        }),
    }
}

/// Turns one section into `run`'s arguments and validates them as `run`
/// does before it looks at the system.
fn validate(
    path: &Path,
    format: Format,
    keys: &[Key],
    raw: RawSection,
) -> Result<Section, ConfigFileError> {
    let at = |line| At {
        path: path.to_owned(),
        line,
    };
    let mut enabled = (true, raw.line);
    let mut seen: Vec<(&str, usize)> = Vec::new();
    let mut argv = Vec::new();
    for e in &raw.entries {
        let not_boolean = || ConfigFileError::NotBoolean {
            at: at(e.line),
            key: e.key.clone(),
            value: e.value.clone(),
        };
        let key = keys.iter().position(|k| k.name == e.key);
        let kind = key.map(|k| keys[k].kind);
        if e.list && (kind.is_some_and(|k| k != Kind::List) || e.key == ENABLED) {
            return Err(ConfigFileError::NotAList {
                at: at(e.line),
                key: e.key.clone(),
            });
        }
        if kind != Some(Kind::List) {
            if let Some((_, first)) = seen.iter().find(|(k, _)| *k == e.key) {
                return Err(ConfigFileError::Repeated {
                    at: at(e.line),
                    key: e.key.clone(),
                    first: *first,
                });
            }
            seen.push((&e.key, e.line));
        }
        if e.key == ENABLED {
            enabled = (parse_bool(&e.value).ok_or_else(not_boolean)?, e.line);
            continue;
        }
        let Some(index) = key else {
            return Err(ConfigFileError::UnknownKey {
                at: at(e.line),
                key: e.key.clone(),
                hint: unknown_key_hint(&e.key, keys),
            });
        };
        let k = &keys[index];
        let arg = match k.kind {
            Kind::Switch => parse_bool(&e.value)
                .ok_or_else(not_boolean)?
                .then(|| k.arg(None)),
            Kind::OptionalValue => match parse_bool(&e.value) {
                Some(on) => on.then(|| k.arg(None)),
                None => Some(k.arg(Some(&e.value))),
            },
            Kind::Value | Kind::List => Some(k.arg(Some(&e.value))),
        };
        argv.extend(arg.map(|arg| Arg {
            key: index,
            arg,
            value: e.value.clone(),
            line: e.line,
        }));
    }
    argv.sort_by_key(|a| a.key);
    let section_error = |message: String| ConfigFileError::InvalidSection {
        at: at(raw.line),
        section: raw.name.clone(),
        message,
    };
    let parsed = <keys::FileRun as clap::Parser>::try_parse_from(argv.iter().map(|a| &a.arg))
        .map_err(|e| clap_error(&e, &argv, keys).into_file_error(path, format, &raw, keys))?;
    if let Err(e) = parsed.args.plan() {
        let message = e.to_string();
        // The first flag the message names that the section sets; of a
        // list, the value the message quotes.
        let quoted = |a: &&Arg| {
            a.value.split(',').any(|v| {
                message.contains(&format!("\"{v}\"")) || message.contains(&format!("'{v}'"))
            })
        };
        let named = flags_named(&message).into_iter().find_map(|long| {
            let mut of_flag = argv.iter().filter(|a| keys[a.key].long == long).peekable();
            let first = of_flag.peek().copied();
            of_flag.find(quoted).or(first)
        });
        return Err(match named {
            Some(a) => ConfigFileError::Invalid {
                at: at(a.line),
                key: keys[a.key].name.clone(),
                message,
            },
            None => section_error(message),
        });
    }
    Ok(Section {
        name: raw.name,
        line: raw.line,
        enabled: enabled.0,
        enabled_line: enabled.1,
        args: parsed.args,
        argv,
    })
}

/// What clap refused, located in the section.
enum ClapRefusal {
    /// A required flag is missing: its key.
    Missing(usize),
    /// A value or flag is refused: the argument, if it is the section's.
    Refused(Option<Arg>, String),
}

impl ClapRefusal {
    fn into_file_error(
        self,
        path: &Path,
        format: Format,
        raw: &RawSection,
        keys: &[Key],
    ) -> ConfigFileError {
        let header = At {
            path: path.to_owned(),
            line: raw.line,
        };
        match self {
            ClapRefusal::Missing(k) => ConfigFileError::Missing {
                at: header,
                section: raw.name.clone(),
                key: keys[k].name.clone(),
                example: format.example(&keys[k]),
            },
            ClapRefusal::Refused(Some(a), message) => ConfigFileError::Invalid {
                at: At {
                    path: path.to_owned(),
                    line: a.line,
                },
                key: keys[a.key].name.clone(),
                message,
            },
            ClapRefusal::Refused(None, message) => ConfigFileError::InvalidSection {
                at: header,
                section: raw.name.clone(),
                message,
            },
        }
    }
}

/// Locates clap's refusal of `argv`: the flag its context names, and for
/// a refused value the line with that value.
fn clap_error(err: &clap::Error, argv: &[Arg], keys: &[Key]) -> ClapRefusal {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    // clap's own text, without its "error: " and its usage and tips.
    let rendered = err.render().to_string();
    let message = rendered
        .split("\n\n")
        .next()
        .unwrap_or_default()
        .trim_start_matches("error: ")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    let flags: Vec<String> = match err.get(ContextKind::InvalidArg) {
        Some(ContextValue::String(s)) => flags_named(s),
        Some(ContextValue::Strings(v)) => v.iter().flat_map(|s| flags_named(s)).collect(),
        _ => Vec::new(),
    };
    let key_of = |long: &str| keys.iter().position(|k| k.long == long);
    if err.kind() == ErrorKind::MissingRequiredArgument
        && let Some(k) = flags.iter().find_map(|f| key_of(f))
    {
        return ClapRefusal::Missing(k);
    }
    let value = match err.get(ContextKind::InvalidValue) {
        Some(ContextValue::String(s)) => Some(s.as_str()),
        _ => None,
    };
    let arg = flags.iter().find_map(|f| {
        let of_flag: Vec<&Arg> = argv.iter().filter(|a| keys[a.key].long == *f).collect();
        of_flag
            .iter()
            .find(|a| value.is_none_or(|v| a.value == v))
            .or_else(|| of_flag.first())
            .copied()
    });
    ClapRefusal::Refused(arg.cloned(), message)
}

/// The long flags `text` names (`--rate <RATE>`, `--isolate dual-dsthost`),
/// without their dashes, in order.
fn flags_named(text: &str) -> Vec<String> {
    text.match_indices("--")
        .map(|(i, _)| {
            text[i + 2..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect::<String>()
        })
        .filter(|f| !f.is_empty())
        .collect()
}

/// What to write instead of the unknown `key`.
fn unknown_key_hint(key: &str, keys: &[Key]) -> String {
    let dashes = key.replace('-', "_");
    if keys.iter().any(|k| k.name == dashes) {
        return format!("write '{dashes}' (keys have _ where the flags have -)");
    }
    // sqm-scripts' names for the same settings.
    let sqm = match key {
        "interface" => Some(("iface", "")),
        "upload" => Some(("rate", ", with a unit: '20mbit'")),
        "download" => Some(("ingress_rate", ", with a unit: '100mbit'")),
        _ => None,
    };
    if let Some((ours, unit)) = sqm {
        return format!("sqm's '{key}' is '{ours}' here{unit}");
    }
    let all: Vec<&str> = std::iter::once(ENABLED)
        .chain(keys.iter().map(|k| k.name.as_str()))
        .collect();
    match all.iter().find(|k| edit_distance(k, key) <= 2) {
        Some(close) => format!("did you mean '{close}'?"),
        None => format!("the options are {}", all.join(", ")),
    }
}

/// Levenshtein distance, for the unknown-key hint.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(ca != *cb));
            diagonal = above;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests;
