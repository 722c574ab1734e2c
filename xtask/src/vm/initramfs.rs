//! Builds the guest's initramfs: newc cpio archives made with GNU cpio.
//!
//! The cached base archive holds a static busybox (`/bin/busybox`, `/bin/sh`)
//! and, in `/modules/`, the guest kernel's modules needed to mount the 9p
//! shares and to open the job's output ports (9p, 9pnet_virtio,
//! virtio_console and whatever they depend on, including virtio_pci where
//! the kernel builds it as a module, as 6.1 does),
//! decompressed, with `/modules/order` listing them in load order.
//!
//! Per run, a second small archive with `/init`, `/config` and
//! `/vm-modprobe` is appended. The kernel unpacks concatenated archives in
//! turn (Documentation/driver-api/early-userspace/buffer-format.rst), so the
//! init script can change without rebuilding the cache.
//!
//! Non-goals: device nodes (devtmpfs provides them), compressing the archive
//! (it is a few MB and read from the host's page cache).

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

use super::Tools;

/// The guest's PID 1 (busybox sh).
const INIT_SH: &str = include_str!("init.sh");
/// The kernel's module-loading helper in the guest (see init.sh).
const MODPROBE_SH: &str = include_str!("modprobe.sh");

/// Modules init needs: the 9p shares and the virtio-serial ports for the
/// job's output. Their dependencies are added from modules.dep; those built
/// into the kernel are skipped.
const BOOT_MODULES: &[&str] = &["virtio_pci", "9pnet_virtio", "9p", "virtio_console"];

/// Writes the cached base archive for the kernel whose unpacked, indexed
/// module directory (`lib/modules/<release>`) is `modules`, with `busybox`
/// (a static busybox of the guest's architecture), staging its files in the
/// empty-or-absent directory `staging` (removed afterwards).
pub(crate) fn write_base(
    tools: &Tools,
    busybox: &Path,
    modules: &Path,
    staging: &Path,
    out: &Path,
) -> Result<()> {
    let read = |name: &str| {
        let path = modules.join(name);
        std::fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))
    };
    let order = load_order(
        &read("modules.dep")?,
        &read("modules.builtin")?,
        BOOT_MODULES,
    )?;

    for dir in ["bin", "modules", "dev", "proc", "sys", "newroot"] {
        std::fs::create_dir_all(staging.join(dir))
            .with_context(|| format!("cannot create {}", staging.display()))?;
    }
    std::fs::copy(busybox, staging.join("bin/busybox"))
        .with_context(|| format!("cannot copy {}", busybox.display()))?;
    std::os::unix::fs::symlink("busybox", staging.join("bin/sh"))
        .context("cannot link bin/sh to busybox")?;

    let mut names = String::new();
    for rel in &order {
        let name = module_file_name(rel)?;
        decompress_module(
            tools,
            &modules.join(rel),
            &staging.join("modules").join(&name),
        )?;
        names.push_str(&name);
        names.push('\n');
    }
    std::fs::write(staging.join("modules/order"), names).context("cannot write modules/order")?;

    cpio_dir(tools, staging, out)?;
    std::fs::remove_dir_all(staging).with_context(|| format!("cannot remove {}", staging.display()))
}

/// Writes `out`: the cached `base` archive followed by an archive holding this
/// run's init script, `config` and the modprobe helper (staged in `run_dir`).
pub(crate) fn write_run_initrd(
    tools: &Tools,
    base: &Path,
    run_dir: &Path,
    config: &str,
    out: &Path,
) -> Result<()> {
    let staging = run_dir.join("initrd");
    std::fs::create_dir_all(&staging)
        .with_context(|| format!("cannot create {}", staging.display()))?;
    for (name, text, mode) in [
        ("init", INIT_SH, 0o755),
        ("vm-modprobe", MODPROBE_SH, 0o755),
        ("config", config, 0o644),
    ] {
        let path = staging.join(name);
        std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
            .with_context(|| format!("cannot chmod {}", path.display()))?;
    }
    let tail = run_dir.join("run.cpio");
    cpio_dir(tools, &staging, &tail)?;

    let mut dst = File::create(out).with_context(|| format!("cannot create {}", out.display()))?;
    for part in [base, tail.as_path()] {
        let mut src =
            File::open(part).with_context(|| format!("cannot open {}", part.display()))?;
        std::io::copy(&mut src, &mut dst)
            .with_context(|| format!("cannot write {}", out.display()))?;
    }
    Ok(())
}

/// Archives everything under `dir` (paths relative to it, owned by root)
/// into the newc cpio file `out`.
fn cpio_dir(tools: &Tools, dir: &Path, out: &Path) -> Result<()> {
    let mut list = Vec::new();
    walk(dir, Path::new(""), &mut list)?;
    let mut names = String::new();
    for path in &list {
        let s = path
            .to_str()
            .with_context(|| format!("non-UTF-8 path {} in the initramfs", path.display()))?;
        names.push_str(s);
        names.push('\n');
    }
    let out_file = File::create(out).with_context(|| format!("cannot create {}", out.display()))?;
    let mut child = Command::new(&tools.cpio)
        .args(["--create", "--format=newc", "--owner=0:0", "--quiet"])
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(out_file)
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot start {}", tools.cpio.display()))?;
    let mut stdin = child.stdin.take().context("cpio has no stdin pipe")?;
    stdin
        .write_all(names.as_bytes())
        .context("cannot send the file list to cpio")?;
    drop(stdin);
    let result = child.wait_with_output().context("cannot wait for cpio")?;
    if !result.status.success() {
        bail!(
            "cpio failed ({}): {}",
            result.status,
            String::from_utf8_lossy(&result.stderr)
        );
    }
    Ok(())
}

/// Lists `root/rel` recursively, parents before children, sorted.
fn walk(root: &Path, rel: &Path, list: &mut Vec<PathBuf>) -> Result<()> {
    let dir = root.join(rel);
    let mut entries = std::fs::read_dir(&dir)
        .with_context(|| format!("cannot list {}", dir.display()))?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<std::io::Result<Vec<_>>>()
        .with_context(|| format!("cannot list {}", dir.display()))?;
    entries.sort();
    for name in entries {
        let child = rel.join(&name);
        list.push(child.clone());
        let meta = std::fs::symlink_metadata(root.join(&child))
            .with_context(|| format!("cannot stat {}", root.join(&child).display()))?;
        if meta.is_dir() {
            walk(root, &child, list)?;
        }
    }
    Ok(())
}

fn decompress_module(tools: &Tools, src: &Path, dst: &Path) -> Result<()> {
    let name = src.to_string_lossy();
    if name.ends_with(".ko") {
        std::fs::copy(src, dst).with_context(|| format!("cannot copy {}", src.display()))?;
        return Ok(());
    }
    if !name.ends_with(".ko.xz") {
        bail!("{name}: only .ko and .ko.xz modules are supported (Debian 12's kernels ship those)");
    }
    let out = File::create(dst).with_context(|| format!("cannot create {}", dst.display()))?;
    let status = Command::new(&tools.xz)
        .arg("-dc")
        .arg(src)
        .stdout(out)
        .status()
        .with_context(|| format!("cannot start {}", tools.xz.display()))?;
    if !status.success() {
        bail!("xz -dc {name} failed ({status})");
    }
    Ok(())
}

/// A module's canonical name: file name without `.ko*`, with '-' as '_'
/// (the kernel treats both alike in module names).
fn module_name(path: &str) -> &str {
    let base = path.rsplit('/').next().unwrap_or(path);
    base.split(".ko").next().unwrap_or(base)
}

fn same_module(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .all(|(x, y)| x == y || (x == b'-' && y == b'_') || (x == b'_' && y == b'-'))
}

/// The file name a module gets in the initramfs (`9p.ko.xz` → `9p.ko`).
fn module_file_name(rel: &str) -> Result<String> {
    let name = module_name(rel);
    if name.is_empty() {
        bail!("modules.dep names an empty module path '{rel}'");
    }
    Ok(format!("{name}.ko"))
}

/// Resolves `wanted` module names against `modules.dep` (`path: dep dep...`
/// per line) into module paths in load order, dependencies first. Names found
/// in `modules.builtin` are skipped; a name in neither is an error.
fn load_order(modules_dep: &str, modules_builtin: &str, wanted: &[&str]) -> Result<Vec<String>> {
    let entries: Vec<(&str, Vec<&str>)> = modules_dep
        .lines()
        .filter_map(|line| line.split_once(':'))
        .map(|(path, deps)| (path.trim(), deps.split_whitespace().collect()))
        .collect();
    let find = |name: &str| {
        entries
            .iter()
            .find(|(path, _)| same_module(module_name(path), name))
    };

    let mut order: Vec<String> = Vec::new();
    let mut stack: Vec<(&str, usize)> = Vec::new();
    for &name in wanted {
        if find(name).is_none() {
            if modules_builtin
                .lines()
                .any(|path| same_module(module_name(path), name))
            {
                continue;
            }
            bail!(
                "module {name} is neither in modules.dep nor built in: this kernel cannot mount 9p shares"
            );
        }
        stack.push((name, 0));
        // Iterative depth-first walk: a module is emitted after all its deps.
        while let Some((current, next_dep)) = stack.pop() {
            let Some((path, deps)) = find(current) else {
                bail!("modules.dep lists a dependency {current} that it does not define");
            };
            if order.iter().any(|done| done == path) {
                continue;
            }
            if let Some(dep) = deps.get(next_dep) {
                stack.push((current, next_dep + 1));
                let dep = module_name(dep);
                if stack.iter().any(|(open, _)| same_module(open, dep)) {
                    bail!("modules.dep has a dependency cycle through {dep}");
                }
                stack.push((dep, 0));
            } else {
                order.push((*path).to_owned());
            }
        }
    }
    Ok(order)
}

/// Fails unless the ELF file at `path` is statically linked: the initramfs
/// has no shared libraries.
pub(crate) fn check_static(path: &Path) -> Result<()> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    if super::elf::has_interpreter(&bytes)
        .with_context(|| format!("cannot parse {} as ELF", path.display()))?
    {
        bail!(
            "{} is dynamically linked, but the guest's initramfs needs a static busybox: \
             install the Debian package busybox-static (cargo xtask setup does this)",
            path.display()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEP_6_1: &str = "\
kernel/fs/netfs/netfs.ko:
kernel/fs/fscache/fscache.ko: kernel/fs/netfs/netfs.ko
kernel/fs/9p/9p.ko: kernel/net/9p/9pnet.ko kernel/fs/fscache/fscache.ko kernel/fs/netfs/netfs.ko
kernel/drivers/virtio/virtio.ko: kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/virtio/virtio_ring.ko:
kernel/drivers/virtio/virtio_pci.ko: kernel/drivers/virtio/virtio_pci_legacy_dev.ko kernel/drivers/virtio/virtio_pci_modern_dev.ko kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/virtio/virtio_pci_legacy_dev.ko:
kernel/drivers/virtio/virtio_pci_modern_dev.ko:
kernel/net/9p/9pnet.ko:
kernel/net/9p/9pnet_virtio.ko: kernel/net/9p/9pnet.ko kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/char/virtio_console.ko: kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
";

    fn position(order: &[String], name: &str) -> usize {
        order
            .iter()
            .position(|p| module_name(p) == name)
            .unwrap_or(usize::MAX)
    }

    #[test]
    fn load_order_puts_dependencies_first() -> Result<()> {
        let order = load_order(DEP_6_1, "", BOOT_MODULES)?;
        assert_eq!(order.len(), 11);
        for (before, after) in [
            ("virtio_ring", "virtio"),
            ("virtio", "virtio_pci"),
            ("virtio", "9pnet_virtio"),
            ("9pnet", "9pnet_virtio"),
            ("netfs", "fscache"),
            ("fscache", "9p"),
            ("9pnet", "9p"),
            ("virtio", "virtio_console"),
        ] {
            assert!(
                position(&order, before) < position(&order, after),
                "{before} after {after}: {order:?}"
            );
        }
        Ok(())
    }

    #[test]
    fn load_order_skips_builtin_and_keeps_compressed_paths() -> Result<()> {
        let dep = "kernel/fs/netfs/netfs.ko.xz:\n\
                   kernel/net/9p/9pnet.ko.xz: kernel/fs/netfs/netfs.ko.xz\n\
                   kernel/net/9p/9pnet_virtio.ko.xz: kernel/net/9p/9pnet.ko.xz kernel/fs/netfs/netfs.ko.xz\n\
                   kernel/fs/9p/9p.ko.xz: kernel/net/9p/9pnet.ko.xz kernel/fs/netfs/netfs.ko.xz\n";
        let builtin = "kernel/drivers/virtio/virtio.ko\nkernel/drivers/virtio/virtio_pci.ko\n\
                       kernel/drivers/char/virtio_console.ko\n";
        let order = load_order(dep, builtin, BOOT_MODULES)?;
        assert_eq!(
            order,
            [
                "kernel/fs/netfs/netfs.ko.xz",
                "kernel/net/9p/9pnet.ko.xz",
                "kernel/net/9p/9pnet_virtio.ko.xz",
                "kernel/fs/9p/9p.ko.xz"
            ]
        );
        Ok(())
    }

    #[test]
    fn load_order_rejects_missing_module() {
        let err = load_order("kernel/fs/9p/9p.ko:\n", "", &["9pnet_virtio"]).err();
        assert!(err.is_some_and(|e| e.to_string().contains("9pnet_virtio")));
    }

    #[test]
    fn load_order_rejects_cycles() {
        let dep = "a/x.ko: a/y.ko\na/y.ko: a/x.ko\n";
        assert!(load_order(dep, "", &["x"]).is_err());
    }

    #[test]
    fn module_names_ignore_dash_underscore_and_suffix() -> Result<()> {
        assert_eq!(
            module_name("kernel/drivers/char/hw_random/virtio-rng.ko.xz"),
            "virtio-rng"
        );
        assert!(same_module("virtio-rng", "virtio_rng"));
        assert_eq!(module_file_name("kernel/fs/9p/9p.ko.xz")?, "9p.ko");
        Ok(())
    }
}
