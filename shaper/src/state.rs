//! Where a shaped interface's state lives, and the record that lets another
//! process (`shaper status`, `shaper cleanup`) find and undo it.
//!
//! Layout, for an interface in the initial network namespace:
//! - `/sys/fs/bpf/shaper/<iface>/` holds the pinned maps (`config`,
//!   `counters`, `aggregate`) and, under TCX, the pinned link (`link`), so the
//!   pacer and its counters outlive the process that attached them;
//! - `/run/shaper/<iface>.state` is this module's [`Record`]: what was
//!   attached, how, and the snapshot of the qdisc tree to restore.
//!
//! Interfaces in another network namespace get `netns-<inode>/` inserted
//! after `shaper/` in both paths, so equal names in different namespaces never
//! collide. The record is written before the first change to the interface
//! and removed after the last undo, so its presence means "maybe shaped".
//! bpffs may vanish under us (a private mount namespace, as `ip netns exec`
//! makes, dies with its process); everything here tolerates missing pins.
//!
//! Non-goals: surviving a reboot (both trees are in memory, as is the
//! interface state they describe).

use std::{
    fs,
    io::{self, Write},
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

use crate::gso::GsoSizes;

/// bpffs's magic number (include/uapi/linux/magic.h).
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

/// Default root of the pinned objects.
pub const BPFFS_ROOT: &str = "/sys/fs/bpf";
/// Default root of the state records.
pub const RUN_ROOT: &str = "/run/shaper";

/// Errors reading or writing state.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// A file system operation failed.
    #[error("{op} {}", path.display())]
    Io {
        /// What was being done.
        op: &'static str,
        /// On what.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A record could not be parsed.
    #[error(
        "state record {} is damaged ({reason}): remove it by hand if the interface is known to be \
         clean",
        path.display()
    )]
    Damaged {
        /// The record.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

/// The paths for one interface.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Paths {
    /// Where bpffs is mounted (the pin directory lies below it).
    pub bpffs: PathBuf,
    /// Directory of pinned BPF objects.
    pub pin_dir: PathBuf,
    /// The state record.
    pub record: PathBuf,
}

impl Paths {
    /// The paths of another interface `iface` in the same namespace (the
    /// IFB of `--ingress-mode ifb`).
    pub fn sibling(&self, iface: &str) -> Paths {
        Paths {
            bpffs: self.bpffs.clone(),
            pin_dir: self.pin_dir.with_file_name(iface),
            record: self.record.with_file_name(format!("{iface}.state")),
        }
    }
}

/// Roots of the two trees; tests point them elsewhere.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Roots {
    /// Where bpffs is (or will be) mounted.
    pub bpffs: PathBuf,
    /// Where records go.
    pub run: PathBuf,
}

impl Default for Roots {
    fn default() -> Self {
        Self {
            bpffs: PathBuf::from(BPFFS_ROOT),
            run: PathBuf::from(RUN_ROOT),
        }
    }
}

impl Roots {
    /// Paths for `iface` in the network namespace `netns` (`None` = the
    /// initial one).
    pub fn paths(&self, iface: &str, netns: Option<u64>) -> Paths {
        let sub = netns.map(|ino| format!("netns-{ino}"));
        let mut pin_dir = self.bpffs.join("shaper");
        let mut record = self.run.clone();
        if let Some(sub) = &sub {
            pin_dir.push(sub);
            record.push(sub);
        }
        pin_dir.push(iface);
        record.push(format!("{iface}.state"));
        Paths {
            bpffs: self.bpffs.clone(),
            pin_dir,
            record,
        }
    }

    /// Directory holding the records of the namespace `netns`.
    pub fn record_dir(&self, netns: Option<u64>) -> PathBuf {
        match netns {
            Some(ino) => self.run.join(format!("netns-{ino}")),
            None => self.run.clone(),
        }
    }
}

/// Inode of the initial network namespace on kernels that give the initial
/// namespaces fixed inode numbers (`PROC_NET_INIT_INO`, include/linux/proc_ns.h).
const PROC_NET_INIT_INO: u64 = 0xEFFF_FFF9;

/// The calling thread's network namespace, or `None` when it is the initial
/// one: the one PID 1 is in, or, where PID 1 cannot be inspected (a sandbox),
/// the one with the kernel's fixed initial inode number.
pub fn current_netns() -> Result<Option<u64>, StateError> {
    let mine = fs::metadata("/proc/thread-self/ns/net")
        .map(|m| m.ino())
        .map_err(|source| StateError::Io {
            op: "stat",
            path: PathBuf::from("/proc/thread-self/ns/net"),
            source,
        })?;
    let init = fs::metadata("/proc/1/ns/net")
        .map(|m| m.ino())
        .unwrap_or(PROC_NET_INIT_INO);
    Ok((mine != init).then_some(mine))
}

/// Makes sure `root` is a bpffs mount, mounting one if it is not (as tc and
/// bpftool do). Returns true if it mounted.
pub fn ensure_bpffs(root: &Path) -> Result<bool, StateError> {
    if is_bpffs(root)? {
        return Ok(false);
    }
    let err = |op, source| StateError::Io {
        op,
        path: root.to_owned(),
        source,
    };
    fs::create_dir_all(root).map_err(|e| err("create", e))?;
    let target = std::ffi::CString::new(root.as_os_str().as_encoded_bytes()).map_err(|e| {
        err(
            "mount bpffs on",
            io::Error::new(io::ErrorKind::InvalidInput, e),
        )
    })?;
    // SAFETY: all pointers are valid NUL-terminated strings for the duration
    // of the call; a null data argument is allowed for bpffs.
    let rc = unsafe {
        libc::mount(
            c"bpf".as_ptr(),
            target.as_ptr(),
            c"bpf".as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        return Err(err("mount bpffs on", io::Error::last_os_error()));
    }
    Ok(true)
}

fn is_bpffs(path: &Path) -> Result<bool, StateError> {
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) else {
        return Ok(false);
    };
    let mut st = std::mem::MaybeUninit::<libc::statfs>::zeroed();
    // SAFETY: `c` is a valid C string and `st` points to writable memory of
    // the right type and size.
    let rc = unsafe { libc::statfs(c.as_ptr(), st.as_mut_ptr()) };
    if rc != 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::NotFound {
            return Ok(false);
        }
        return Err(StateError::Io {
            op: "statfs",
            path: path.to_owned(),
            source: e,
        });
    }
    // SAFETY: statfs returned 0, so it filled the struct.
    let st = unsafe { st.assume_init() };
    #[allow(
        clippy::useless_conversion,
        reason = "f_type is i64 on 64-bit targets but i32 on 32-bit ones"
    )]
    let f_type = i64::from(st.f_type);
    Ok(f_type == BPF_FS_MAGIC)
}

/// How the classifier was attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttachMode {
    /// A TCX link (kernel >= 6.6), pinned as `link` in the pin directory.
    Tcx,
    /// A cls_bpf filter on clsact egress (older kernels), found by priority
    /// and handle.
    Netlink {
        /// Filter priority.
        priority: u16,
        /// Filter handle.
        handle: u32,
    },
    /// `ifb` mode without TCX: a matchall filter with a mirred redirect to
    /// the IFB on clsact ingress (`tc::add_ingress_redirect`), found by
    /// priority and handle. No BPF program runs at the hook.
    Mirred {
        /// Filter priority.
        priority: u16,
        /// Filter handle.
        handle: u32,
    },
}

/// What one `shaper run` did at an interface's ingress hook.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IngressRecord {
    /// The ingress rate in bits per second.
    pub rate_bits_per_s: u64,
    /// How the ingress program is attached; `None` until it is. Its pins
    /// live in the `ingress` directory under the pin directory.
    pub attach: Option<AttachMode>,
    /// `ifb` mode: the IFB device, recorded before it is created (ifindex
    /// 0 until it exists). `None` in `police` mode.
    pub ifb: Option<IfbRecord>,
}

/// The IFB of `--ingress-mode ifb`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IfbRecord {
    /// Its name (`ifb4<iface>`).
    pub name: String,
    /// Its index; 0 before creation.
    pub ifindex: u32,
}

/// A LAN interface of `--nat`, where the LAN-side classifier runs at
/// ingress ([`crate::nat`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LanRecord {
    /// Its name.
    pub name: String,
    /// Its index when attached.
    pub ifindex: u32,
    /// The shaper created its clsact qdisc (and so removes it).
    pub created_clsact: bool,
    /// How the classifier is attached; `None` until it is. A TCX link is
    /// pinned in the run's NAT directory ([`crate::pins::lan_link`]).
    pub attach: Option<AttachMode>,
}

/// What one `shaper run` did to one interface.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// Interface name.
    pub iface: String,
    /// Interface index when attached (a recreated interface gets a new one).
    pub ifindex: u32,
    /// The `shaper run` process.
    pub pid: u32,
    /// Configured rate in bits per second.
    pub rate_bits_per_s: u64,
    /// How the classifier is attached; `None` until it is.
    pub attach: Option<AttachMode>,
    /// The shaper created the clsact qdisc (and so removes it).
    pub created_clsact: bool,
    /// The shaper replaced the root qdisc (and so restores it).
    pub replaced_root: bool,
    /// `shaper::tc` snapshot of the root qdisc tree before the change.
    pub snapshot: Vec<u8>,
    /// The restore of that tree has begun and may not have finished: the
    /// root may be a partial copy of `snapshot`, or the kernel's default
    /// that the restore's first step leaves, and a later undo restores it
    /// again.
    pub restoring_root: bool,
    /// The device's GSO sizes before the shaper lowered them
    /// ([`crate::gso`]); `None` when it did not.
    pub gso_before: Option<GsoSizes>,
    /// Ingress shaping, when asked for (`--ingress-rate`).
    pub ingress: Option<IngressRecord>,
    /// `--nat`: the LAN interfaces, each recorded before its classifier is
    /// attached.
    pub lans: Vec<LanRecord>,
}

const MAGIC_LINE: &str = "shaper-state 1";

impl Record {
    /// A record of this process for `link` before anything is done to it.
    pub fn fresh(link: &crate::link::Link) -> Self {
        Self {
            iface: link.name.clone(),
            ifindex: link.ifindex,
            pid: std::process::id(),
            rate_bits_per_s: 0,
            attach: None,
            created_clsact: false,
            replaced_root: false,
            snapshot: Vec::new(),
            restoring_root: false,
            gso_before: None,
            ingress: None,
            lans: Vec::new(),
        }
    }

    /// Text form: a magic line, then `key=value` lines; the snapshot in hex.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        out.push_str(MAGIC_LINE);
        out.push('\n');
        let mut kv = |k: &str, v: String| {
            out.push_str(k);
            out.push('=');
            out.push_str(&v);
            out.push('\n');
        };
        kv("iface", self.iface.clone());
        kv("ifindex", self.ifindex.to_string());
        kv("pid", self.pid.to_string());
        kv("rate_bits_per_s", self.rate_bits_per_s.to_string());
        kv("attach", encode_attach(self.attach));
        kv("created_clsact", u8::from(self.created_clsact).to_string());
        kv("replaced_root", u8::from(self.replaced_root).to_string());
        kv("snapshot", hex(&self.snapshot));
        kv("restoring_root", u8::from(self.restoring_root).to_string());
        if let Some(g) = self.gso_before {
            let v4 = g.ipv4_max_bytes.map_or("-".to_owned(), |v| v.to_string());
            kv("gso_before", format!("{}:{v4}", g.max_bytes));
        }
        if let Some(i) = &self.ingress {
            kv("ingress_rate_bits_per_s", i.rate_bits_per_s.to_string());
            kv("ingress_attach", encode_attach(i.attach));
            if let Some(ifb) = &i.ifb {
                kv("ingress_ifb", format!("{}:{}", ifb.name, ifb.ifindex));
            }
        }
        for (i, lan) in self.lans.iter().enumerate() {
            // Interface names hold no ':', so the name ends at the first.
            kv(
                &format!("lan.{i}"),
                format!(
                    "{}:{}:{}:{}",
                    lan.name,
                    lan.ifindex,
                    u8::from(lan.created_clsact),
                    encode_attach(lan.attach)
                ),
            );
        }
        out
    }

    /// Parses [`Record::encode`]'s output. `path` is only for messages.
    pub fn decode(text: &str, path: &Path) -> Result<Self, StateError> {
        let damaged = |reason: String| StateError::Damaged {
            path: path.to_owned(),
            reason,
        };
        let mut lines = text.lines();
        if lines.next() != Some(MAGIC_LINE) {
            return Err(damaged(format!("first line is not '{MAGIC_LINE}'")));
        }
        let mut get = std::collections::HashMap::new();
        for line in lines {
            let (k, v) = line
                .split_once('=')
                .ok_or_else(|| damaged(format!("line without '=': {line:?}")))?;
            get.insert(k, v);
        }
        let field = |k: &str| {
            get.get(k)
                .copied()
                .ok_or_else(|| damaged(format!("missing {k}")))
        };
        let num = |k: &str| -> Result<u64, StateError> {
            field(k)?
                .parse()
                .map_err(|_| damaged(format!("{k} is not a number")))
        };
        let flag = |k: &str| -> Result<bool, StateError> {
            match field(k)? {
                "0" => Ok(false),
                "1" => Ok(true),
                v => Err(damaged(format!("{k}={v} is not 0 or 1"))),
            }
        };
        let attach = decode_attach(field("attach")?).map_err(damaged)?;
        let ingress = match get.get("ingress_rate_bits_per_s") {
            None => None,
            Some(_) => Some(IngressRecord {
                rate_bits_per_s: num("ingress_rate_bits_per_s")?,
                attach: decode_attach(field("ingress_attach")?).map_err(damaged)?,
                ifb: match get.get("ingress_ifb") {
                    None => None,
                    Some(v) => {
                        let bad = || damaged(format!("ingress_ifb={v} is not NAME:IFINDEX"));
                        let (name, idx) = v.rsplit_once(':').ok_or_else(bad)?;
                        Some(IfbRecord {
                            name: name.to_owned(),
                            ifindex: idx.parse().map_err(|_| bad())?,
                        })
                    }
                },
            }),
        };
        let too_big = |k: &str| damaged(format!("{k} out of range"));
        let gso_before = match get.get("gso_before") {
            None => None,
            Some(v) => {
                let bad = || damaged(format!("gso_before={v} is not SIZE:SIZE or SIZE:-"));
                let (max, v4) = v.split_once(':').ok_or_else(bad)?;
                Some(GsoSizes {
                    max_bytes: max.parse().map_err(|_| bad())?,
                    ipv4_max_bytes: match v4 {
                        "-" => None,
                        n => Some(n.parse().map_err(|_| bad())?),
                    },
                })
            }
        };
        let mut lans = Vec::new();
        while let Some(v) = get.get(format!("lan.{}", lans.len()).as_str()) {
            let bad = |why: String| damaged(format!("lan.{}={v}: {why}", lans.len()));
            let mut parts = v.splitn(4, ':');
            let (Some(name), Some(idx), Some(created), Some(attach)) =
                (parts.next(), parts.next(), parts.next(), parts.next())
            else {
                return Err(bad("not NAME:IFINDEX:CREATED:ATTACH".into()));
            };
            lans.push(LanRecord {
                name: name.to_owned(),
                ifindex: idx.parse().map_err(|_| bad("bad ifindex".into()))?,
                created_clsact: match created {
                    "0" => false,
                    "1" => true,
                    _ => return Err(bad("created is not 0 or 1".into())),
                },
                attach: decode_attach(attach).map_err(bad)?,
            });
        }
        Ok(Self {
            iface: field("iface")?.to_owned(),
            ifindex: u32::try_from(num("ifindex")?).map_err(|_| too_big("ifindex"))?,
            pid: u32::try_from(num("pid")?).map_err(|_| too_big("pid"))?,
            rate_bits_per_s: num("rate_bits_per_s")?,
            attach,
            created_clsact: flag("created_clsact")?,
            replaced_root: flag("replaced_root")?,
            snapshot: unhex(field("snapshot")?)
                .ok_or_else(|| damaged("snapshot is not hex".into()))?,
            // A record written before this field existed had no restore
            // under way.
            restoring_root: get.contains_key("restoring_root") && flag("restoring_root")?,
            gso_before,
            ingress,
            lans,
        })
    }

    /// Writes the record atomically (temp file, fsync, rename).
    pub fn store(&self, path: &Path) -> Result<(), StateError> {
        let io = |op, source| StateError::Io {
            op,
            path: path.to_owned(),
            source,
        };
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir).map_err(|e| io("create directory for", e))?;
        }
        let tmp = path.with_extension("state.tmp");
        let mut f = fs::File::create(&tmp).map_err(|e| io("create", e))?;
        f.write_all(self.encode().as_bytes())
            .map_err(|e| io("write", e))?;
        f.sync_all().map_err(|e| io("sync", e))?;
        fs::rename(&tmp, path).map_err(|e| io("rename into", e))
    }

    /// Reads a record; `Ok(None)` if there is none.
    pub fn load(path: &Path) -> Result<Option<Self>, StateError> {
        match fs::read_to_string(path) {
            Ok(text) => Self::decode(&text, path).map(Some),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(StateError::Io {
                op: "read",
                path: path.to_owned(),
                source,
            }),
        }
    }
}

fn encode_attach(a: Option<AttachMode>) -> String {
    match a {
        None => "none".to_owned(),
        Some(AttachMode::Tcx) => "tcx".to_owned(),
        Some(AttachMode::Netlink { priority, handle }) => format!("netlink:{priority}:{handle}"),
        Some(AttachMode::Mirred { priority, handle }) => format!("mirred:{priority}:{handle}"),
    }
}

fn decode_attach(v: &str) -> Result<Option<AttachMode>, String> {
    match v {
        "none" => Ok(None),
        "tcx" => Ok(Some(AttachMode::Tcx)),
        v => {
            let mut parts = v.split(':');
            let filter = |p: &str, h: &str| -> Result<(u16, u32), String> {
                Ok((
                    p.parse().map_err(|_| format!("bad priority {p}"))?,
                    h.parse().map_err(|_| format!("bad handle {h}"))?,
                ))
            };
            match (parts.next(), parts.next(), parts.next(), parts.next()) {
                (Some("netlink"), Some(p), Some(h), None) => {
                    let (priority, handle) = filter(p, h)?;
                    Ok(Some(AttachMode::Netlink { priority, handle }))
                }
                (Some("mirred"), Some(p), Some(h), None) => {
                    let (priority, handle) = filter(p, h)?;
                    Ok(Some(AttachMode::Mirred { priority, handle }))
                }
                _ => Err(format!("unknown attach mode {v}")),
            }
        }
    }
}

/// Removes a record; missing is fine.
pub fn remove_record(path: &Path) -> Result<(), StateError> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(StateError::Io {
            op: "remove",
            path: path.to_owned(),
            source,
        }),
    }
}

/// Interfaces with a record in the namespace `netns`, sorted.
pub fn recorded_ifaces(roots: &Roots, netns: Option<u64>) -> Result<Vec<String>, StateError> {
    let dir = roots.record_dir(netns);
    let entries = match fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(StateError::Io {
                op: "list",
                path: dir,
                source,
            });
        }
    };
    let mut out: Vec<String> = entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            e.file_name()
                .to_str()
                .and_then(|n| n.strip_suffix(".state"))
                .map(str::to_owned)
        })
        .collect();
    out.sort();
    Ok(out)
}

/// True if a process with this pid exists.
pub fn pid_alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Record {
        Record {
            iface: "veth0".into(),
            ifindex: 7,
            pid: 1234,
            rate_bits_per_s: 20_000_000,
            attach: Some(AttachMode::Netlink {
                priority: 49152,
                handle: 1,
            }),
            created_clsact: true,
            replaced_root: true,
            snapshot: vec![0, 1, 0xfe, 0xff],
            restoring_root: false,
            gso_before: Some(GsoSizes {
                max_bytes: 65_536,
                ipv4_max_bytes: None,
            }),
            ingress: None,
            lans: Vec::new(),
        }
    }

    #[test]
    fn a_sibling_is_the_same_namespace_another_name() {
        let roots = Roots {
            bpffs: "/b".into(),
            run: "/r".into(),
        };
        let p = roots.paths("wan0", Some(7));
        assert_eq!(p.sibling("ifb4wan0"), roots.paths("ifb4wan0", Some(7)));
        let p = roots.paths("wan0", None);
        assert_eq!(p.sibling("ifb4wan0"), roots.paths("ifb4wan0", None));
    }

    #[test]
    fn record_round_trips() {
        for attach in [None, Some(AttachMode::Tcx), sample().attach] {
            let r = Record { attach, ..sample() };
            let back = Record::decode(&r.encode(), Path::new("x")).expect("decodes");
            assert_eq!(back, r);
        }
        let lans = Record {
            lans: vec![
                LanRecord {
                    name: "br-lan".into(),
                    ifindex: 9,
                    created_clsact: false,
                    attach: Some(AttachMode::Tcx),
                },
                LanRecord {
                    name: "lan2".into(),
                    ifindex: 11,
                    created_clsact: true,
                    attach: Some(AttachMode::Netlink {
                        priority: 49152,
                        handle: 1,
                    }),
                },
                LanRecord {
                    name: "lan3".into(),
                    ifindex: 12,
                    created_clsact: false,
                    attach: None,
                },
            ],
            ..sample()
        };
        let back = Record::decode(&lans.encode(), Path::new("x")).expect("decodes");
        assert_eq!(back, lans);
        let restoring = Record {
            restoring_root: true,
            ..sample()
        };
        let text = restoring.encode();
        assert!(text.contains("restoring_root=1\n"), "{text}");
        assert_eq!(
            Record::decode(&text, Path::new("x")).expect("decodes"),
            restoring
        );
        // A record from before the field: no restore under way.
        let old: String = sample()
            .encode()
            .lines()
            .filter(|l| !l.starts_with("restoring_root="))
            .map(|l| format!("{l}\n"))
            .collect();
        assert_eq!(
            Record::decode(&old, Path::new("x")).expect("decodes"),
            sample()
        );
        for gso_before in [
            None,
            Some(GsoSizes {
                max_bytes: 3028,
                ipv4_max_bytes: Some(185_000),
            }),
        ] {
            let r = Record {
                gso_before,
                ..sample()
            };
            let back = Record::decode(&r.encode(), Path::new("x")).expect("decodes");
            assert_eq!(back, r);
        }
        let mirred = Some(AttachMode::Mirred {
            priority: 49151,
            handle: 1,
        });
        for attach in [None, Some(AttachMode::Tcx), sample().attach, mirred] {
            let r = Record {
                ingress: Some(IngressRecord {
                    rate_bits_per_s: 100_000_000,
                    attach,
                    ifb: attach.map(|_| IfbRecord {
                        name: "ifb4veth0".into(),
                        ifindex: 9,
                    }),
                }),
                ..sample()
            };
            let back = Record::decode(&r.encode(), Path::new("x")).expect("decodes");
            assert_eq!(back, r);
        }
    }

    #[test]
    fn damaged_records_are_refused() {
        let good = sample().encode();
        let cases = [
            String::new(),
            good.replace("shaper-state 1", "shaper-state 9"),
            good.replace("pid=1234", "pid=12x4"),
            good.replace("snapshot=0001feff", "snapshot=0001fef"),
            good.replace("created_clsact=1", "created_clsact=2"),
            good.replace("netlink:49152:1", "netlink:49152"),
            good.replace("iface=veth0\n", ""),
            good.replace("gso_before=65536:-", "gso_before=65536"),
            good.replace("gso_before=65536:-", "gso_before=big:-"),
            format!("{good}ingress_rate_bits_per_s=1000\n"),
            format!("{good}ingress_rate_bits_per_s=x\ningress_attach=tcx\n"),
            format!("{good}ingress_rate_bits_per_s=1000\ningress_attach=xdp\n"),
            format!("{good}ingress_rate_bits_per_s=1000\ningress_attach=mirred:1\n"),
            format!("{good}ingress_rate_bits_per_s=1000\ningress_attach=mirred:x:1\n"),
            format!("{good}ingress_rate_bits_per_s=1000\ningress_attach=tcx\ningress_ifb=ifb4x\n"),
            format!(
                "{good}ingress_rate_bits_per_s=1000\ningress_attach=tcx\ningress_ifb=ifb4x:y\n"
            ),
            format!("{good}lan.0=br-lan:9:0\n"),
            format!("{good}lan.0=br-lan:x:0:tcx\n"),
            format!("{good}lan.0=br-lan:9:2:tcx\n"),
            format!("{good}lan.0=br-lan:9:0:xdp\n"),
        ];
        for text in cases {
            assert!(
                matches!(
                    Record::decode(&text, Path::new("r")),
                    Err(StateError::Damaged { .. })
                ),
                "{text:?}"
            );
        }
    }

    #[test]
    fn paths_keep_namespaces_apart() {
        let roots = Roots::default();
        let init = roots.paths("eth0", None);
        assert_eq!(init.pin_dir, Path::new("/sys/fs/bpf/shaper/eth0"));
        assert_eq!(init.record, Path::new("/run/shaper/eth0.state"));
        let other = roots.paths("eth0", Some(4026532000));
        assert_eq!(
            other.pin_dir,
            Path::new("/sys/fs/bpf/shaper/netns-4026532000/eth0")
        );
        assert_eq!(
            other.record,
            Path::new("/run/shaper/netns-4026532000/eth0.state")
        );
    }

    #[test]
    fn store_load_remove_and_list() {
        let dir = std::env::temp_dir().join(format!("shaper-state-test-{}", std::process::id()));
        let roots = Roots {
            bpffs: dir.join("bpf"),
            run: dir.join("run"),
        };
        let p = roots.paths("veth0", None);
        assert_eq!(Record::load(&p.record).expect("load"), None);
        sample().store(&p.record).expect("store");
        assert_eq!(Record::load(&p.record).expect("load"), Some(sample()));
        assert_eq!(
            recorded_ifaces(&roots, None).expect("list"),
            vec!["veth0".to_owned()]
        );
        remove_record(&p.record).expect("remove");
        remove_record(&p.record).expect("remove twice is fine");
        assert!(recorded_ifaces(&roots, None).expect("list").is_empty());
        let _ = fs::remove_dir_all(dir);
    }
}
