//! The archives of `cargo xtask dist`: the OpenWrt `.ipk`, the OpenWrt tree
//! for apk-based releases, and the tarball for Debian-like routers.
//!
//! The `.ipk` is what OpenWrt's own `ipkg-build` writes: a gzip-compressed
//! tar holding `debian-binary` ("2.0"), `control.tar.gz` (control,
//! conffiles, postinst, prerm) and `data.tar.gz` (the files, rooted at `/`).
//! opkg reads that form as well as the older ar form.
//!
//! The service files themselves live in `shaper/dist/` beside the code whose
//! commands they call; this module only places them.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail, ensure};

use crate::cross::Target;

/// The package's release number: bumped when the packaging changes but the
/// program does not.
const PACKAGE_RELEASE: u32 = 1;

/// OpenWrt kernel packages the shaper needs: sch_fq and cls_bpf (with the
/// clsact qdisc from kmod-sched-core on kernels without TCX), and the IFB
/// that the default download mode redirects to.
const OPENWRT_DEPENDS: &[&str] = &[
    "kmod-sched-core",
    "kmod-sched",
    "kmod-sched-bpf",
    "kmod-ifb",
];

/// The service files, read from `shaper/dist/`.
pub struct Files {
    init: String,
    hotplug: String,
    uci_config: String,
    systemd_unit: String,
    simple_config: String,
}

impl Files {
    pub fn read(root: &Path) -> Result<Files> {
        let dir = root.join("shaper/dist");
        let read = |rel: &str| {
            let path = dir.join(rel);
            std::fs::read_to_string(&path)
                .with_context(|| format!("cannot read {}", path.display()))
        };
        Ok(Files {
            init: read("openwrt/shaper.init")?,
            hotplug: read("openwrt/shaper.hotplug")?,
            uci_config: read("openwrt/shaper.config")?,
            systemd_unit: read("systemd/shaper@.service")?,
            simple_config: read("systemd/shaper.conf")?,
        })
    }
}

/// What the archives are made of, and where they go.
#[derive(Clone, Copy)]
pub struct Package<'a> {
    /// An empty-or-absent folder for the archives' trees.
    pub staging: &'a Path,
    /// Where the archives go.
    pub dist: &'a Path,
    /// The stripped static binary.
    pub binary: &'a Path,
    pub files: &'a Files,
    pub target: Target,
    /// Seconds since 1970 for every file's time: the last commit's.
    pub epoch: u64,
}

/// The workspace's version (xtask shares it).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// One file placed in a tree: its path below the tree's root, its mode, and
/// where its bytes come from.
enum Source<'a> {
    Text(&'a str),
    Copy(&'a Path),
}

fn place(tree: &Path, rel: &str, mode: u32, source: Source) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let path = tree.join(rel);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("cannot create {}", parent.display()))?;
    }
    match source {
        Source::Text(text) => std::fs::write(&path, text),
        Source::Copy(from) => std::fs::copy(from, &path).map(|_| ()),
    }
    .with_context(|| format!("cannot write {}", path.display()))?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("cannot chmod {}", path.display()))
}

/// The router's file tree: the binary, the init script, the UCI config and
/// the hotplug hook.
fn openwrt_tree(tree: &Path, binary: &Path, files: &Files) -> Result<()> {
    place(tree, "usr/sbin/shaper", 0o755, Source::Copy(binary))?;
    place(tree, "etc/init.d/shaper", 0o755, Source::Text(&files.init))?;
    place(
        tree,
        "etc/config/shaper",
        0o644,
        Source::Text(&files.uci_config),
    )?;
    place(
        tree,
        "etc/hotplug.d/iface/50-shaper",
        0o644,
        Source::Text(&files.hotplug),
    )
}

/// The control file opkg reads.
fn control(target: Target, version: &str, installed_size: u64) -> String {
    format!(
        "Package: shaper\n\
         Version: {version}-{PACKAGE_RELEASE}\n\
         Depends: {}\n\
         License: MIT OR Apache-2.0\n\
         Section: net\n\
         Architecture: {}\n\
         Installed-Size: {installed_size}\n\
         Maintainer: shaper maintainers\n\
         Description: eBPF traffic shaper for routers: per-flow fair pacing with sch_fq,\n \
         host isolation, link-layer framing, an AQM policer for the download, and\n \
         per-flow telemetry. Configured in /etc/config/shaper.\n",
        OPENWRT_DEPENDS.join(", "),
        target.openwrt_arch()
    )
}

/// Run by opkg after installing. On the router itself (not while an image
/// is assembled, when IPKG_INSTROOT is set) the service is enabled and
/// (re)started; it shapes only the sections enabled in the config.
const POSTINST: &str = "#!/bin/sh\n\
[ -n \"$IPKG_INSTROOT\" ] && exit 0\n\
/etc/init.d/shaper enable\n\
/etc/init.d/shaper restart\n\
exit 0\n";

/// Run by opkg before removing: stopping restores every shaped interface.
const PRERM: &str = "#!/bin/sh\n\
[ -n \"$IPKG_INSTROOT\" ] && exit 0\n\
/etc/init.d/shaper stop\n\
/etc/init.d/shaper disable\n\
exit 0\n";

impl Package<'_> {
    /// Writes the `.ipk`; returns its path.
    pub fn ipk(&self) -> Result<PathBuf> {
        let base = self.staging.join("ipk");
        let data = base.join("data");
        openwrt_tree(&data, self.binary, self.files)?;
        let installed_size = tree_size(&data)?;
        let ctrl = base.join("control");
        let control = control(self.target, VERSION, installed_size);
        place(&ctrl, "control", 0o644, Source::Text(&control))?;
        let conffiles = Source::Text("/etc/config/shaper\n");
        place(&ctrl, "conffiles", 0o644, conffiles)?;
        place(&ctrl, "postinst", 0o755, Source::Text(POSTINST))?;
        place(&ctrl, "prerm", 0o755, Source::Text(PRERM))?;
        let outer = base.join("outer");
        place(&outer, "debian-binary", 0o644, Source::Text("2.0\n"))?;
        tar_gz(&data, &["."], &outer.join("data.tar.gz"), self.epoch)?;
        tar_gz(&ctrl, &["."], &outer.join("control.tar.gz"), self.epoch)?;
        check_members(
            &outer.join("data.tar.gz"),
            &[
                "./usr/sbin/shaper",
                "./etc/init.d/shaper",
                "./etc/config/shaper",
                "./etc/hotplug.d/iface/50-shaper",
            ],
        )?;
        let ipk = self.dist.join(format!(
            "shaper_{VERSION}-{PACKAGE_RELEASE}_{}.ipk",
            self.target.openwrt_arch()
        ));
        let members = ["./debian-binary", "./data.tar.gz", "./control.tar.gz"];
        tar_gz(&outer, &members, &ipk, self.epoch)?;
        check_members(&ipk, &members)?;
        Ok(ipk)
    }

    /// Writes the OpenWrt tree with its install steps; returns its path.
    pub fn openwrt_tarball(&self) -> Result<PathBuf> {
        let name = format!(
            "shaper-{VERSION}-openwrt-{}.tar.gz",
            self.target.openwrt_arch()
        );
        self.tarball(
            "openwrt",
            &name,
            &["INSTALL", "root/usr/sbin/shaper"],
            |top| {
                openwrt_tree(&top.join("root"), self.binary, self.files)?;
                let install = openwrt_install_text(self.target, VERSION);
                place(top, "INSTALL", 0o644, Source::Text(&install))
            },
        )
    }

    /// Writes the tarball for Debian-like routers; returns its path.
    pub fn linux_tarball(&self) -> Result<PathBuf> {
        let name = format!("shaper-{VERSION}-linux-{}.tar.gz", self.target.name());
        let members = ["shaper", "shaper@.service", "shaper.conf"];
        self.tarball("linux", &name, &members, |top| {
            let files = self.files;
            place(top, "shaper", 0o755, Source::Copy(self.binary))?;
            place(
                top,
                "shaper@.service",
                0o644,
                Source::Text(&files.systemd_unit),
            )?;
            place(
                top,
                "shaper.conf",
                0o644,
                Source::Text(&files.simple_config),
            )?;
            let install = linux_install_text(VERSION);
            place(top, "INSTALL", 0o644, Source::Text(&install))
        })
    }

    /// `dist/name`: a tarball of one folder `shaper-<version>`, which `fill`
    /// writes (staged under `kind`), checked to hold `members` (paths in
    /// that folder).
    fn tarball(
        &self,
        kind: &str,
        name: &str,
        members: &[&str],
        fill: impl FnOnce(&Path) -> Result<()>,
    ) -> Result<PathBuf> {
        let top = format!("shaper-{VERSION}");
        let base = self.staging.join(kind);
        fill(&base.join(&top))?;
        let out = self.dist.join(name);
        tar_gz(&base, &[&top], &out, self.epoch)?;
        let wanted: Vec<String> = members.iter().map(|m| format!("{top}/{m}")).collect();
        check_members(&out, &wanted.iter().map(String::as_str).collect::<Vec<_>>())?;
        Ok(out)
    }
}

/// Install steps for OpenWrt releases that use apk, shipped in their tarball.
fn openwrt_install_text(target: Target, version: &str) -> String {
    format!(
        "shaper {version} for OpenWrt ({arch})\n\n\
         OpenWrt 24.10 and older (opkg): install the .ipk instead:\n\
         \x20   opkg install shaper_{version}-{PACKAGE_RELEASE}_{arch}.ipk\n\n\
         OpenWrt 25.12 and newer (apk), by hand:\n\
         \x20   apk add {deps}\n\
         \x20   tar -xzf shaper-{version}-openwrt-{arch}.tar.gz -C /tmp\n\
         \x20   cp -a /tmp/shaper-{version}/root/. /\n\
         \x20   /etc/init.d/shaper enable\n\
         Then set up /etc/config/shaper (see its comments) and run\n\
         \x20   /etc/init.d/shaper start\n\
         To remove: /etc/init.d/shaper stop; /etc/init.d/shaper disable; then\n\
         delete /usr/sbin/shaper, /etc/init.d/shaper, /etc/config/shaper and\n\
         /etc/hotplug.d/iface/50-shaper.\n",
        arch = target.openwrt_arch(),
        deps = OPENWRT_DEPENDS.join(" "),
    )
}

/// Install steps for Debian-like routers.
fn linux_install_text(version: &str) -> String {
    format!(
        "shaper {version}\n\n\
         \x20   install -m 755 shaper /usr/sbin/shaper\n\
         \x20   install -d /etc/shaper && install -m 644 shaper.conf /etc/shaper/shaper.conf\n\
         \x20   install -m 644 shaper@.service /etc/systemd/system/\n\
         \x20   systemctl daemon-reload\n\
         Edit /etc/shaper/shaper.conf: one [section] per shaped interface. Then\n\
         \x20   systemctl enable --now shaper@SECTION\n\
         `systemctl reload shaper@SECTION` applies a new rate live; other changes\n\
         need `systemctl restart shaper@SECTION`.\n\
         The kernel needs sch_fq and cls_bpf (and ifb for the default download\n\
         mode); the tracer alone needs BTF.\n"
    )
}

/// The bytes of every file under `dir`.
fn tree_size(dir: &Path) -> Result<u64> {
    let mut total = 0;
    for entry in std::fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))? {
        let entry = entry?;
        let meta = entry.metadata()?;
        total += if meta.is_dir() {
            tree_size(&entry.path())?
        } else {
            meta.len()
        };
    }
    Ok(total)
}

/// `tar` of `members` (relative to `dir`) into the gzip file `out`, owned by
/// root, in name order, with the commit's time, compressed without a name
/// or time of its own.
fn tar_gz(dir: &Path, members: &[&str], out: &Path, epoch: u64) -> Result<()> {
    let status = Command::new("tar")
        .current_dir(dir)
        .args(["--format=gnu", "--sort=name", "--owner=0", "--group=0"])
        .args(["--numeric-owner", &format!("--mtime=@{epoch}")])
        .arg("--use-compress-program=gzip -9n")
        .arg("-cf")
        .arg(out)
        .args(members)
        .status()
        .context("cannot start tar")?;
    ensure!(status.success(), "tar into {} failed", out.display());
    Ok(())
}

/// Fails unless the archive `path` lists every one of `wanted`.
fn check_members(path: &Path, wanted: &[&str]) -> Result<()> {
    let out = Command::new("tar")
        .arg("-tzf")
        .arg(path)
        .output()
        .context("cannot start tar")?;
    ensure!(out.status.success(), "tar cannot read {}", path.display());
    let listing = String::from_utf8_lossy(&out.stdout);
    for member in wanted {
        if !listing.lines().any(|l| l == *member) {
            bail!("{} lacks {member}; it lists:\n{listing}", path.display());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_control_file_names_the_architecture_and_the_kernel_packages() {
        let c = control(Target::Aarch64, "1.2.3", 4096);
        assert!(c.contains("Architecture: aarch64_cortex-a53\n"), "{c}");
        assert!(c.contains("Version: 1.2.3-1\n"), "{c}");
        assert!(c.contains("Installed-Size: 4096\n"), "{c}");
        for dep in ["kmod-sched,", "kmod-sched-bpf,", "kmod-ifb"] {
            assert!(c.contains(dep), "{c}");
        }
        // Continuation lines of a field start with a space; no blank line
        // ends the stanza early.
        assert!(
            c.lines()
                .all(|l| l.starts_with(' ') || l.contains(": ") && !l.is_empty())
        );
    }

    #[test]
    fn the_install_steps_name_the_files_they_install() {
        let t = openwrt_install_text(Target::Aarch64, "1.2.3");
        assert!(t.contains("opkg install shaper_1.2.3-1_aarch64_cortex-a53.ipk"));
        assert!(t.contains("apk add kmod-sched-core kmod-sched kmod-sched-bpf kmod-ifb"));
        assert!(linux_install_text("1.2.3").contains("systemctl enable --now shaper@"));
    }
}
