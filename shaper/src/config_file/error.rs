//! Why a config file was refused. Every variant names the file and, where
//! there is one, the line, and says what to write instead.

use std::path::PathBuf;

/// Where in a file: `FILE:LINE`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct At {
    /// The file as given.
    pub path: PathBuf,
    /// 1-based line.
    pub line: usize,
}

impl std::fmt::Display for At {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.path.display(), self.line)
    }
}

/// A config file that `run --config` and `shaper config` refuse; nothing
/// on the system was looked at or changed.
#[derive(Debug, thiserror::Error)]
pub enum ConfigFileError {
    /// The file could not be read.
    #[error("cannot read config file {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        io_error: std::io::Error,
    },
    /// A line that is no part of the file's format.
    #[error("{at}: {what}")]
    Syntax {
        /// Where.
        at: At,
        /// What is wrong and what the line should look like.
        what: String,
    },
    /// A UCI section of another type than `interface`.
    #[error("{at}: section type '{kind}' is not one of shaper's: write `config interface 'NAME'`")]
    SectionType {
        /// Where.
        at: At,
        /// The type given.
        kind: String,
    },
    /// A section name given twice.
    #[error("{at}: section '{name}' is given twice (first at line {first}): rename one")]
    DuplicateSection {
        /// Where the second one starts.
        at: At,
        /// The name.
        name: String,
        /// Where the first one starts.
        first: usize,
    },
    /// A key that is no flag of `run`'s.
    #[error("{at}: unknown option '{key}': {hint}")]
    UnknownKey {
        /// Where.
        at: At,
        /// The key given.
        key: String,
        /// The likely key, or the list of them.
        hint: String,
    },
    /// A switch or `enabled` with a value that is not a boolean.
    #[error("{at}: option '{key}' takes 1 or 0 (or true/false, yes/no, on/off), not '{value}'")]
    NotBoolean {
        /// Where.
        at: At,
        /// The key.
        key: String,
        /// The value given.
        value: String,
    },
    /// A key given twice that takes one value.
    #[error(
        "{at}: option '{key}' is given twice (first at line {first}) and takes one value: keep one"
    )]
    Repeated {
        /// Where the second one is.
        at: At,
        /// The key.
        key: String,
        /// Where the first one is.
        first: usize,
    },
    /// UCI's `list` for a key that takes one value.
    #[error("{at}: option '{key}' takes one value: write `option {key} '...'`, not `list`")]
    NotAList {
        /// Where.
        at: At,
        /// The key.
        key: String,
    },
    /// A flag that a section needs and lacks.
    #[error("{at}: section '{section}' lacks option '{key}': add `{example}`")]
    Missing {
        /// The section's header.
        at: At,
        /// The section.
        section: String,
        /// The first key it lacks.
        key: String,
        /// The line to add, in the file's format.
        example: String,
    },
    /// A value that `run`'s flags refuse, with the flags' message.
    #[error("{at}: option '{key}': {message}")]
    Invalid {
        /// Where the value is (the section's header when the refusal is
        /// about the whole section).
        at: At,
        /// The key.
        key: String,
        /// The flags' message.
        message: String,
    },
    /// A section that `run` would refuse as a whole.
    #[error("{at}: section '{section}': {message}")]
    InvalidSection {
        /// The section's header.
        at: At,
        /// The section.
        section: String,
        /// The flags' message.
        message: String,
    },
    /// Two enabled sections on one interface.
    #[error(
        "{at}: section '{section}' shapes {iface}, as section '{other}' does: one section per \
         interface (or set `enabled` to 0 on one)"
    )]
    SameInterface {
        /// The second section's header.
        at: At,
        /// The second section.
        section: String,
        /// The first one.
        other: String,
        /// The interface.
        iface: String,
    },
    /// No enabled section.
    #[error("{}: no enabled section: add one (`config interface 'wan'` or `[wan]`), or set `enabled` to 1", path.display())]
    NoSection {
        /// The file.
        path: PathBuf,
    },
    /// More than one enabled section and no `--section`.
    #[error("{}: more than one enabled section: choose one with --section ({names})", path.display())]
    SectionNeeded {
        /// The file.
        path: PathBuf,
        /// The enabled sections, comma-separated.
        names: String,
    },
    /// `--section` names none of the file's sections.
    #[error("{}: no section '{name}': the sections are {names}", path.display())]
    NoSuchSection {
        /// The file.
        path: PathBuf,
        /// The name given.
        name: String,
        /// The file's sections, comma-separated.
        names: String,
    },
    /// `--section` names a disabled section.
    #[error("{at}: section '{name}' is disabled: set `enabled` to 1 to run it")]
    Disabled {
        /// Where its `enabled` is.
        at: At,
        /// The section.
        name: String,
    },
}

/// The message for a quoted value that does not end on its line, in
/// either format.
pub(super) fn unterminated(quote: char) -> String {
    format!("unterminated {quote}-quoted value: close it with {quote} on the same line")
}
