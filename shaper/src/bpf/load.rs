//! Loading the embedded object: the loader's settings, finding and loading a
//! classifier, filling the telemetry program's jump slot, writing a
//! one-entry map and taking a map out. The pacer, the policer, the
//! redirect, the observer, the benchmark and the tests load through here.
//!
//! Invariant: nothing here touches an interface; a load can be dropped with
//! nothing to undo. Non-goals: the tracer's own map sizes (it passes them).

use std::path::Path;

use aya::{
    Ebpf, EbpfLoader, Pod,
    maps::{Array, Map},
    programs::{ProgramFd, SchedClassifier},
};
use shaper_common::{JUMP_TELEMETRY, TELEMETRY_PROGRAM, maps};

use super::ObjectError;

/// Why a load failed.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The binary has no object.
    #[error(transparent)]
    Object(#[from] ObjectError),
    /// The kernel or the object refused a step.
    #[error("{what}: {detail}")]
    Step {
        /// The step: the object, a program or a map.
        what: String,
        /// What aya said, with the verifier log if any.
        detail: String,
    },
}

fn step(what: impl Into<String>) -> impl FnOnce(String) -> LoadError {
    let what = what.into();
    move |detail| LoadError::Step { what, detail }
}

/// The embedded object, loaded with a flow table of `flow_sets` sets and
/// the maps in `sizes` resized; no program is loaded yet.
pub fn open(flow_sets: u32, sizes: &[(&str, u32)]) -> Result<Ebpf, LoadError> {
    open_sharing(flow_sets, sizes, &[])
}

/// As [`open`], with each map in `shared` taken from its pin, so that
/// objects loaded apart share it; a map whose pin is missing is created
/// and pinned there.
pub fn open_sharing(
    flow_sets: u32,
    sizes: &[(&str, u32)],
    shared: &[(&str, &Path)],
) -> Result<Ebpf, LoadError> {
    let object = super::object()?;
    // No program has CO-RE relocations, so the kernel's BTF is not a
    // relocation target: a kernel with it and one without load the same
    // object. The loader is told so rather than given a parse of it that
    // nothing reads (megabytes, a second per parse under emulation).
    let mut loader = EbpfLoader::new();
    loader.btf(None);
    loader.map_max_entries(maps::FLOWS, flow_sets);
    for &(name, entries) in sizes {
        loader.map_max_entries(name, entries);
    }
    for &(name, path) in shared {
        loader.map_pin_path(name, path);
    }
    loader
        .load(object)
        .map_err(|e| step("loading the BPF object")(format!("{e:#}")))
}

/// The TC classifier `name` in the object.
pub fn classifier<'a>(
    ebpf: &'a mut Ebpf,
    name: &str,
) -> Result<&'a mut SchedClassifier, LoadError> {
    ebpf.program_mut(name)
        .ok_or_else(|| step(name)("the object has no such program".to_owned()))?
        .try_into()
        .map_err(|e| step(name)(format!("not a TC classifier: {e}")))
}

/// Loads the TC classifier `name` (the verifier runs here).
pub fn load_classifier(ebpf: &mut Ebpf, name: &str) -> Result<(), LoadError> {
    classifier(ebpf, name)?
        .load()
        .map_err(|e| step(name)(format!("{e:#}")))
}

/// Loads the TC classifier `name` and returns a descriptor of it of its own
/// (for `BPF_PROG_TEST_RUN`).
pub fn program_fd(ebpf: &mut Ebpf, name: &str) -> Result<ProgramFd, LoadError> {
    let prog = classifier(ebpf, name)?;
    prog.load().map_err(|e| step(name)(format!("{e:#}")))?;
    prog.fd()
        .map_err(|e| step(name)(e.to_string()))?
        .try_clone()
        .map_err(|e| step(name)(format!("duplicating its descriptor: {e}")))
}

/// Loads the telemetry program and puts it in the classifiers' jump slot
/// (a classifier tail-calls it when a record is due).
pub fn load_telemetry(ebpf: &mut Ebpf) -> Result<(), LoadError> {
    let prog = classifier(ebpf, TELEMETRY_PROGRAM)?;
    prog.load()
        .map_err(|e| step(TELEMETRY_PROGRAM)(format!("{e:#}")))?;
    let fd = prog
        .fd()
        .map_err(|e| step(TELEMETRY_PROGRAM)(e.to_string()))?
        .try_clone()
        .map_err(|e| step(TELEMETRY_PROGRAM)(e.to_string()))?;
    let mut jump = aya::maps::ProgramArray::try_from(take_mut(ebpf, maps::JUMP)?)
        .map_err(|e| step(maps::JUMP)(e.to_string()))?;
    jump.set(JUMP_TELEMETRY, &fd, 0)
        .map_err(|e| step(maps::JUMP)(format!("filling the slot: {e}")))
}

fn take_mut<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut Map, LoadError> {
    ebpf.map_mut(name)
        .ok_or_else(|| step(name)("the object has no such map".to_owned()))
}

/// Writes entry 0 of the one-entry array map `name`.
pub fn set_entry0<T: Pod>(ebpf: &mut Ebpf, name: &str, value: T) -> Result<(), LoadError> {
    let mut array: Array<_, T> =
        Array::try_from(take_mut(ebpf, name)?).map_err(|e| step(name)(e.to_string()))?;
    array
        .set(0, value, 0)
        .map_err(|e| step(name)(format!("writing: {e}")))
}

/// Sets entries `0..count` of array map `name` to `value`.
pub fn set_entries<T: Pod>(
    ebpf: &mut Ebpf,
    name: &str,
    count: u32,
    value: T,
) -> Result<(), LoadError> {
    let mut array: Array<_, T> =
        Array::try_from(take_mut(ebpf, name)?).map_err(|e| step(name)(e.to_string()))?;
    for i in 0..count {
        array
            .set(i, value, 0)
            .map_err(|e| step(name)(format!("writing entry {i}: {e}")))?;
    }
    Ok(())
}

/// Takes map `name` out of the object, typed (for a reader that outlives
/// borrows of the object).
pub fn take<T: TryFrom<Map>>(ebpf: &mut Ebpf, name: &str) -> Result<T, LoadError>
where
    T::Error: std::fmt::Display,
{
    let map = ebpf
        .take_map(name)
        .ok_or_else(|| step(name)("the object has no such map".to_owned()))?;
    T::try_from(map).map_err(|e| step(name)(e.to_string()))
}
