//! A config file's keys, read off clap's own definition of `run`'s flags:
//! every long flag of [`RunArgs`] is a key, with `_` for `-`, and takes
//! the kind of value the flag takes. A new flag is a key without a change
//! here, and no key is listed twice.

use clap::{ArgAction, CommandFactory, Parser};

use crate::cli::RunArgs;

/// `shaper run`'s flags alone, to parse the argv a section becomes.
#[derive(Debug, Parser)]
#[command(
    name = "shaper run",
    no_binary_name = true,
    disable_help_flag = true,
    disable_version_flag = true
)]
pub(super) struct FileRun {
    /// The section's options.
    #[command(flatten)]
    pub args: RunArgs,
}

/// The key that switches a section on or off: no flag of `run`'s.
pub const ENABLED: &str = "enabled";

/// What a key's value is, from its flag's clap action.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A switch (`--no-ecn`): `1`/`0` and the other spellings of
    /// [`parse_bool`].
    Switch,
    /// One value (`--rate 850mbit`).
    Value,
    /// A value that may be left out for the flag's default (`--metrics`):
    /// the value, `1` for the default, `0` for none.
    OptionalValue,
    /// A repeatable flag (`--lan`): the key may be given once per value.
    List,
}

/// One key of a config file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Key {
    /// The key as written in the file (`ingress_rate`).
    pub name: String,
    /// The flag it stands for, without dashes (`ingress-rate`).
    pub long: String,
    /// The flag's value name as `--help` shows it (`RATE`), if it takes one.
    pub value_name: Option<String>,
    /// What its value is.
    pub kind: Kind,
}

impl Key {
    /// The flag with its value as one argument (`--rate=850mbit`), so that
    /// a value starting with `-` stays a value.
    pub fn arg(&self, value: Option<&str>) -> String {
        match value {
            Some(v) => format!("--{}={v}", self.long),
            None => format!("--{}", self.long),
        }
    }
}

/// Every key, in the order of `run`'s flags: the order `config args`
/// prints them in.
pub fn keys() -> Vec<Key> {
    let mut cmd = FileRun::command();
    cmd.build();
    cmd.get_arguments()
        .filter_map(|a| {
            let long = a.get_long()?;
            let min_values = a.get_num_args().map_or(1, |r| r.min_values());
            let kind = match a.get_action() {
                ArgAction::SetTrue => Kind::Switch,
                ArgAction::Append => Kind::List,
                _ if min_values == 0 => Kind::OptionalValue,
                _ => Kind::Value,
            };
            Some(Key {
                name: long.replace('-', "_"),
                long: long.to_owned(),
                value_name: a
                    .get_value_names()
                    .and_then(|v| v.first())
                    .map(ToString::to_string),
                kind,
            })
        })
        .collect()
}

/// A boolean as UCI and the usual config files spell it, or `None`.
pub fn parse_bool(value: &str) -> Option<bool> {
    match value.to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Some(true),
        "0" | "false" | "no" | "off" => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_long_flag_of_run_is_a_key_once() {
        let keys = keys();
        let names: Vec<&str> = keys.iter().map(|k| k.name.as_str()).collect();
        let mut cmd = crate::cli::Cli::command();
        cmd.build();
        let run = cmd.find_subcommand("run").expect("run");
        for a in run.get_arguments() {
            let Some(long) = a.get_long() else { continue };
            if ["config", "section", "help", "version"].contains(&long) {
                continue;
            }
            let key = long.replace('-', "_");
            assert_eq!(
                names.iter().filter(|n| **n == key).count(),
                1,
                "--{long} as key {key}: {names:?}"
            );
        }
        let mut sorted = names.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), names.len(), "{names:?}");
        assert!(!names.contains(&ENABLED));
        for expected in [
            "iface",
            "rate",
            "ingress_rate",
            "ingress_mode",
            "ingress_isolate",
            "lan",
            "framing",
            "overhead",
            "mpu",
            "atm",
            "metrics",
            "no_telemetry",
            "top",
        ] {
            assert!(names.contains(&expected), "{expected} in {names:?}");
        }
    }

    #[test]
    fn kinds_follow_the_flags() {
        let kind = |name: &str| {
            keys()
                .into_iter()
                .find(|k| k.name == name)
                .map(|k| k.kind)
                .expect("known")
        };
        assert_eq!(kind("no_ecn"), Kind::Switch);
        assert_eq!(kind("wash"), Kind::Switch);
        assert_eq!(kind("rate"), Kind::Value);
        assert_eq!(kind("horizon"), Kind::Value);
        assert_eq!(kind("metrics"), Kind::OptionalValue);
        assert_eq!(kind("lan"), Kind::List);
        assert_eq!(kind("framing"), Kind::List);
    }

    #[test]
    fn booleans() {
        for t in ["1", "true", "Yes", "on"] {
            assert_eq!(parse_bool(t), Some(true), "{t}");
        }
        for f in ["0", "false", "no", "OFF"] {
            assert_eq!(parse_bool(f), Some(false), "{f}");
        }
        for n in ["", "2", "enabled", "y"] {
            assert_eq!(parse_bool(n), None, "{n}");
        }
    }
}
