//! `cargo xtask bench`: builds, then runs the shaper's own benchmark,
//! `shaper bench`, where each part needs to run.
//!
//! Steps: the BPF object and the release binary; `shaper bench --json FILE`
//! on this machine's kernel (BPF_PROG_TEST_RUN, the per-packet figures);
//! then, unless `--no-vm`, `shaper bench --vm-part --json F2` in the 6.12 VM
//! (CAKE, sch_fq and netem are missing here), and `shaper bench --merge-vm
//! F2 --json FILE` to put the VM's figures under `vm`; then, unless
//! `--no-multiqueue`, `shaper bench --vm-part --multiqueue` in the 7.x VM
//! (cake_mq), merged the same way under `vm.multiqueue` and
//! `vm.diffserv`. F2 lives under `target/bench/`, which the guest sees
//! read-write at the same path. A failed VM part leaves FILE with what
//! was merged before it, and fails the command.
//!
//! With `--soak[=DURATION]` only the soak runs, in the 6.12 VM; its JSON,
//! written under `target/bench/` by the guest, is copied to FILE.
//!
//! All measuring, JSON and tables are `shaper bench`'s; this only
//! orchestrates.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{Context, Result, bail, ensure};

use crate::{ebpf, toolchain, vm};

/// Options of `cargo xtask bench`.
#[derive(clap::Args)]
pub struct BenchArgs {
    /// Write the merged results to FILE (default: target/bench/bench.json).
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Only the host part (no VM).
    #[arg(long, conflicts_with = "soak")]
    no_vm: bool,
    /// Skip the multi-queue and DiffServ part (the 7.x VM).
    #[arg(long)]
    no_multiqueue: bool,
    /// Only the soak, in the VM: DURATION (10m when not given) of flows
    /// that start and end throughout under the shaper, its controller
    /// sampled; the JSON goes to --json (default: target/bench/soak.json).
    #[arg(
        long,
        value_name = "DURATION",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "10m"
    )]
    soak: Option<String>,
    /// Extra arguments for both `shaper bench` runs, e.g. `-- --rounds 3`.
    #[arg(last = true)]
    args: Vec<String>,
}

/// Runs the benchmark; returns the exit code.
pub fn run(root: &Path, args: &BenchArgs) -> Result<i32> {
    if !crate::is_root() {
        bail!(
            "the benchmark loads BPF programs and creates network namespaces, so it needs \
             root: run `sudo -E cargo xtask bench`"
        );
    }
    let out_dir = root.join("target/bench");
    std::fs::create_dir_all(&out_dir)
        .with_context(|| format!("cannot create {}", out_dir.display()))?;
    let json = match &args.json {
        Some(p) => {
            std::path::absolute(p).with_context(|| format!("cannot resolve {}", p.display()))?
        }
        None if args.soak.is_some() => out_dir.join("soak.json"),
        None => out_dir.join("bench.json"),
    };

    let tc = toolchain::setup(if args.no_vm { &[] } else { vm::HOST_PACKAGES })?;
    let object = ebpf::build_ebpf(root, &tc)?;
    let bin = ebpf::build_host(root, &object, true)?;

    if let Some(length) = &args.soak {
        let t = Instant::now();
        let guest_json = out_dir.join(format!("soak-{}.json", std::process::id()));
        let soak = format!("--soak={length}");
        let code = vm_part(
            root,
            vm::Kernel::V6_12,
            &bin,
            &[soak.as_str()],
            &guest_json,
            &args.args,
        )?;
        eprintln!("xtask bench: soak in {:.1} s", t.elapsed().as_secs_f64());
        if code != 0 {
            return Ok(code);
        }
        if guest_json != json {
            std::fs::copy(&guest_json, &json).with_context(|| {
                format!("cannot copy {} to {}", guest_json.display(), json.display())
            })?;
            let _ = std::fs::remove_file(&guest_json);
        }
        eprintln!("xtask bench: wrote {}", json.display());
        return Ok(0);
    }

    let t = Instant::now();
    let status = Command::new(&bin)
        .arg("bench")
        .arg("--json")
        .arg(&json)
        .args(&args.args)
        .status()
        .with_context(|| format!("cannot start {}", bin.display()))?;
    ensure!(status.success(), "the host part failed ({status})");
    eprintln!(
        "xtask bench: host part in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    if args.no_vm {
        eprintln!("xtask bench: wrote {}", json.display());
        return Ok(0);
    }

    let mut parts = vec![(vm::Kernel::V6_12, &[][..], "the VM part")];
    if !args.no_multiqueue {
        parts.push((
            vm::Kernel::V7,
            &["--multiqueue"][..],
            "the multi-queue part",
        ));
    }
    for (kernel, opts, what) in parts {
        let t = Instant::now();
        let vm_json = out_dir.join(format!("vm-{}.json", std::process::id()));
        let code = vm_part(root, kernel, &bin, opts, &vm_json, &args.args)?;
        eprintln!("xtask bench: {what} in {:.1} s", t.elapsed().as_secs_f64());
        if code != 0 {
            eprintln!(
                "xtask bench: {what} failed (exit {code}); {} holds what was merged before it",
                json.display()
            );
            return Ok(code);
        }
        let status = Command::new(&bin)
            .args(["bench", "--merge-vm"])
            .arg(&vm_json)
            .arg("--json")
            .arg(&json)
            .status()
            .with_context(|| format!("cannot start {}", bin.display()))?;
        ensure!(status.success(), "merging {what} failed ({status})");
        // Best effort: the merged file has it all.
        let _ = std::fs::remove_file(&vm_json);
    }
    eprintln!("xtask bench: wrote {}", json.display());
    Ok(0)
}

/// Runs `BIN bench --vm-part OPTS --json JSON ARGS` in the VM with
/// `kernel`; returns its exit code.
fn vm_part(
    root: &Path,
    kernel: vm::Kernel,
    bin: &Path,
    opts: &[&str],
    json: &Path,
    args: &[String],
) -> Result<i32> {
    let mut cmd: Vec<String> = vec![
        bin.display().to_string(),
        "bench".into(),
        "--vm-part".into(),
    ];
    cmd.extend(opts.iter().map(|o| (*o).to_owned()));
    cmd.extend(["--json".to_owned(), json.display().to_string()]);
    cmd.extend(args.iter().cloned());
    vm::run(root, kernel, &cmd)
}
