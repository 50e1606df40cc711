//! The Ceph side of the benchmarks (`tiercache bench --core rbd`, `tiercache bench wl`): a
//! cluster to run on (a single-node one started with `scripts/ceph-cluster.sh`, or one given
//! with `--ceph-conf`), its images, the client configurations of the librbd peers, and fio's
//! targets (its `rbd` engine for the peers, its `nbd` engine for tiercache).

use serde_json::{Value, json};
use std::fmt::Write as _;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

/// The Ceph cluster the benchmark runs against: one it started (stopped on drop) or one it was
/// given (its images removed on drop).
/// The options that say which cluster a benchmark runs on (`bench --core rbd`, `bench wl`).
#[derive(clap::Args, Default, Clone)]
pub struct CephArgs {
    /// Use this Ceph cluster instead of starting one (the images are created in --pool and
    /// removed at the end).
    #[arg(long)]
    pub ceph_conf: Option<PathBuf>,
    /// The cephx client (with --ceph-conf).
    #[arg(long, default_value = "admin")]
    pub ceph_id: String,
    /// The pool the images are created in.
    #[arg(long, default_value = "rbd")]
    pub pool: String,
}

impl CephArgs {
    /// The cluster of `--ceph-conf`, or a single-node one started in `scratch` with an OSD
    /// file of `osd_bytes` (sparse).
    pub(crate) fn cluster(
        &self,
        scratch: &Path,
        osd_bytes: u64,
        setup: &mut Value,
    ) -> Result<Cluster, String> {
        match &self.ceph_conf {
            Some(c) => Cluster::given(c, &self.ceph_id, &self.pool, setup),
            None => Cluster::start(scratch, osd_bytes, setup),
        }
    }
}

pub(crate) struct Cluster {
    /// The directory of a cluster this run started, and the script that started it.
    own: Option<(PathBuf, PathBuf)>,
    pub(crate) conf: PathBuf,
    pub(crate) id: String,
    pub(crate) pool: String,
    images: Vec<String>,
    stopped: bool,
}

fn cluster_script() -> Option<PathBuf> {
    let here = PathBuf::from("scripts/ceph-cluster.sh");
    if here.is_file() {
        return Some(here.canonicalize().unwrap_or(here));
    }
    let built = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/ceph-cluster.sh");
    built.is_file().then_some(built)
}

impl Cluster {
    pub(crate) fn start(
        scratch: &Path,
        osd_bytes: u64,
        setup: &mut Value,
    ) -> Result<Cluster, String> {
        let size = format!("{}M", osd_bytes >> 20);
        let c = Self::start_with(scratch, &["--osd-size", &size], setup)?;
        setup["cluster"]["osd_bytes"] = json!(osd_bytes);
        Ok(c)
    }

    /// A single-node cluster started in `scratch` with `scripts/ceph-cluster.sh start` and
    /// `args` (stopped on drop).
    pub(crate) fn start_with(
        scratch: &Path,
        args: &[&str],
        setup: &mut Value,
    ) -> Result<Cluster, String> {
        let script = cluster_script().ok_or(
            "scripts/ceph-cluster.sh not found (run from the repository, or pass --ceph-conf)",
        )?;
        let ok = Command::new("ceph-mon")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            return Err(
                "ceph-mon is not installed (apt-get install ceph ceph-mon ceph-osd), or pass --ceph-conf"
                    .into(),
            );
        }
        let dir = scratch.join("ceph");
        let t = Instant::now();
        let out = Command::new(&script)
            .arg("start")
            .arg(&dir)
            .args(["--watch-pid", &std::process::id().to_string()])
            .args(args)
            .stdin(Stdio::null())
            .process_group(0)
            .output()
            .map_err(|e| format!("{}: {e}", script.display()))?;
        let c = Cluster {
            own: Some((dir.clone(), script)),
            conf: dir.join("ceph.conf"),
            id: "admin".into(),
            pool: "rbd".into(),
            images: Vec::new(),
            stopped: false,
        };
        let said = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() {
            return Err(format!(
                "ceph-cluster.sh start failed: {}{}",
                said,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let line = said.lines().next().unwrap_or("").to_string();
        println!("{line}");
        setup["cluster"] = json!({"started_by_bench": true, "script_says": line,
            "start_s": t.elapsed().as_secs_f64(), "args": args, "conf": c.conf});
        Ok(c)
    }

    pub(crate) fn given(
        conf: &Path,
        id: &str,
        pool: &str,
        setup: &mut Value,
    ) -> Result<Cluster, String> {
        let conf = conf
            .canonicalize()
            .map_err(|e| format!("--ceph-conf {}: {e}", conf.display()))?;
        setup["cluster"] = json!({"started_by_bench": false, "conf": conf, "id": id,
            "pool": pool});
        Ok(Cluster {
            own: None,
            conf,
            id: id.into(),
            pool: pool.into(),
            images: Vec::new(),
            stopped: false,
        })
    }

    /// `rbd ARGS` against the cluster (bounded in time); its stdout.
    pub(crate) fn rbd(&self, args: &[&str]) -> Result<String, String> {
        self.cli("rbd", args)
    }

    /// `ceph ARGS` against the cluster (bounded in time); its stdout.
    pub(crate) fn ceph(&self, args: &[&str]) -> Result<String, String> {
        self.cli("ceph", args)
    }

    fn cli(&self, tool: &str, args: &[&str]) -> Result<String, String> {
        let o = Command::new("timeout")
            .args(["-k", "5", "600", tool, "-c"])
            .arg(&self.conf)
            .args(["--id", &self.id])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("{tool}: {e}"))?;
        if !o.status.success() {
            return Err(format!(
                "{tool} {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&o.stderr).trim()
            ));
        }
        Ok(String::from_utf8_lossy(&o.stdout).into_owned())
    }

    /// `ceph-cluster.sh VERB DIR ARGS` on a cluster this run started; its stdout.
    fn script(&self, verb: &str, args: &[&str]) -> Result<String, String> {
        let (dir, script) = self
            .own
            .as_ref()
            .ok_or("only a cluster the bench started can add or remove OSDs")?;
        let o = Command::new(script)
            .arg(verb)
            .arg(dir)
            .args(args)
            .stdin(Stdio::null())
            .process_group(0)
            .output()
            .map_err(|e| format!("{}: {e}", script.display()))?;
        if !o.status.success() {
            return Err(format!(
                "ceph-cluster.sh {verb} {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&o.stderr)
                    .trim()
                    .replace('\n', "; ")
            ));
        }
        Ok(String::from_utf8_lossy(&o.stdout).into_owned())
    }

    /// Adds a BlueStore OSD (`ceph-cluster.sh add-osd`, ARGS its options); its id, once up.
    pub(crate) fn add_osd(&self, args: &[&str]) -> Result<u32, String> {
        let out = self.script("add-osd", args)?;
        let last = out.lines().last().unwrap_or("").trim();
        last.parse()
            .map_err(|_| format!("ceph-cluster.sh add-osd said '{last}', not an OSD id"))
    }

    /// Stops OSD `id` and removes it from the cluster (`ceph-cluster.sh remove-osd`).
    pub(crate) fn remove_osd(&self, id: u32) -> Result<(), String> {
        self.script("remove-osd", &[&id.to_string()]).map(|_| ())
    }

    /// Creates POOL/NAME and writes it end to end (4 MiB sequential writes).
    pub(crate) fn image(&mut self, name: &str, bytes: u64) -> Result<f64, String> {
        let spec = format!("{}/{name}", self.pool);
        self.rbd(&["create", "--size", &format!("{}M", bytes >> 20), &spec])?;
        self.images.push(name.to_string());
        self.write_image(&spec, bytes)
    }

    /// Writes POOL/NAME (`spec`) end to end with 4 MiB sequential writes; the seconds it took.
    pub(crate) fn write_image(&self, spec: &str, bytes: u64) -> Result<f64, String> {
        let t = Instant::now();
        self.rbd(&[
            "bench",
            "--io-type",
            "write",
            "--io-pattern",
            "seq",
            "--io-size",
            "4M",
            "--io-threads",
            "16",
            "--io-total",
            &format!("{}M", bytes >> 20),
            spec,
        ])?;
        Ok(t.elapsed().as_secs_f64())
    }

    /// A copy of the cluster's config with `lines` added for clients.
    pub(crate) fn variant(&self, path: &Path, lines: &[(&str, &str)]) -> Result<PathBuf, String> {
        let mut s = std::fs::read_to_string(&self.conf)
            .map_err(|e| format!("{}: {e}", self.conf.display()))?;
        s.push_str("\n# Added by tiercache bench.\n[client]\n");
        for (k, v) in lines {
            let _ = writeln!(s, "{k} = {v}");
        }
        std::fs::write(path, s).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(path.to_path_buf())
    }

    pub(crate) fn stop(&mut self) {
        if self.stopped {
            return;
        }
        self.stopped = true;
        match &self.own {
            Some((dir, script)) => {
                let t = Instant::now();
                match Command::new(script)
                    .arg("stop")
                    .arg(dir)
                    .stdin(Stdio::null())
                    .output()
                {
                    Ok(o) if o.status.success() => {
                        println!("cluster stopped in {:.2} s", t.elapsed().as_secs_f64())
                    }
                    Ok(o) => eprintln!(
                        "ceph-cluster.sh stop: {}",
                        String::from_utf8_lossy(&o.stderr).trim()
                    ),
                    Err(e) => eprintln!("ceph-cluster.sh stop: {e}"),
                }
            }
            None => {
                for i in std::mem::take(&mut self.images) {
                    if let Err(e) =
                        self.rbd(&["rm", "--no-progress", &format!("{}/{i}", self.pool)])
                    {
                        eprintln!("could not remove image {}/{i}: {e}", self.pool);
                    }
                }
            }
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop();
    }
}

/// What `ceph-conf` says `key` is for this client in `conf` (None without ceph-conf).
pub(crate) fn conf_lookup(conf: &Path, id: &str, key: &str) -> Option<String> {
    let o = Command::new("ceph-conf")
        .arg("-c")
        .arg(conf)
        .args(["-n", &format!("client.{id}"), "--lookup", key])
        .output()
        .ok()?;
    Some(String::from_utf8_lossy(&o.stdout).trim().to_string())
}

/// The client configurations of the librbd configurations: `plain` (`rbd_cache = false`, the
/// reference, also what tiercache opens its `rbd:` cores with) and `wb` (librbd's in-memory
/// writeback cache: `rbd_cache = true`, policy writeback, and
/// `rbd_cache_writethrough_until_flush = false` — fio sends no flush, so with the default
/// `true` the cache would never leave writethrough; librbd's default sizes).
pub(crate) struct ClientConfs {
    pub(crate) plain: PathBuf,
    pub(crate) wb: PathBuf,
}

impl ClientConfs {
    /// Writes both into `dir`; records what `ceph-conf` says they hold in `setup`
    /// (`librbd_conf`, `librbd_wb_conf`, `ceph_version`).
    pub(crate) fn write(cluster: &Cluster, dir: &Path, setup: &mut Value) -> Result<Self, String> {
        let plain = cluster.variant(&dir.join("librbd.conf"), &[("rbd_cache", "false")])?;
        let wb = cluster.variant(
            &dir.join("librbd-wb.conf"),
            &[
                ("rbd_cache", "true"),
                ("rbd_cache_policy", "writeback"),
                ("rbd_cache_writethrough_until_flush", "false"),
            ],
        )?;
        let id = &cluster.id;
        let look = |c: &Path| {
            json!({
                "rbd_cache": conf_lookup(c, id, "rbd_cache"),
                "rbd_cache_policy": conf_lookup(c, id, "rbd_cache_policy"),
                "rbd_cache_writethrough_until_flush":
                    conf_lookup(c, id, "rbd_cache_writethrough_until_flush"),
                "rbd_cache_size": conf_lookup(c, id, "rbd_cache_size"),
                "rbd_cache_max_dirty": conf_lookup(c, id, "rbd_cache_max_dirty"),
            })
        };
        setup["librbd_conf"] = look(&plain);
        setup["librbd_wb_conf"] = look(&wb);
        setup["ceph_version"] = json!(
            Command::new("ceph")
                .arg("--version")
                .output()
                .ok()
                .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        );
        Ok(ClientConfs { plain, wb })
    }

    /// The `rbd:` device string of IMAGE opened with the plain configuration.
    pub(crate) fn core_device(&self, cluster: &Cluster, image: &str) -> String {
        format!(
            "rbd:{}/{image}:conf={}:id={}",
            cluster.pool,
            self.plain.display(),
            cluster.id
        )
    }
}

/// What fio runs against.
pub(crate) enum FioTarget {
    /// fio's rbd engine: the config file (rbd_cache settings), client, pool and image.
    Rbd {
        conf: PathBuf,
        id: String,
        pool: String,
        image: String,
    },
    /// fio's nbd engine.
    Nbd { uri: String },
    /// fio's io_uring engine with `O_DIRECT` on a file (the cache device's own ceiling).
    File { path: PathBuf },
}

impl FioTarget {
    /// Adds the engine's options (and environment) to a fio command.
    pub(crate) fn apply(&self, cmd: &mut Command) {
        match self {
            FioTarget::Rbd {
                conf,
                id,
                pool,
                image,
            } => {
                cmd.arg("--ioengine=rbd")
                    .arg(format!("--clientname={id}"))
                    .arg(format!("--pool={pool}"))
                    .arg(format!("--rbdname={image}"))
                    .env("CEPH_CONF", conf);
            }
            FioTarget::Nbd { uri } => {
                cmd.arg("--ioengine=nbd").arg(format!("--uri={uri}"));
            }
            FioTarget::File { path } => {
                cmd.arg("--ioengine=io_uring")
                    .arg("--direct=1")
                    .arg(format!("--filename={}", path.display()));
            }
        }
    }
}
