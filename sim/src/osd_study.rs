//! The simulator beside `tiercache bench --study ceph-osd` (issue 26): a cluster scenario
//! built in memory from the study's own parameters, and the seed study's 12-OSD cluster with
//! the same per-op costs.
//!
//! The study runs three layouts of real BlueStore OSDs; the scenario has one config each:
//!
//! | config | model |
//! |---|---|
//! | `hdd` | bare HDD per OSD, plus the extra HDD IOs per op that BlueStore's RocksDB and WAL make on it ([`Cost::hdd_extra_per_read`], measured by the study as data-device requests per client op over those of `hdd+db`) |
//! | `hdd+db` | bare HDD per OSD (RocksDB and WAL elsewhere, at no cost in the model) |
//! | `tiercache` | the real cache core over the HDD with the study's settings, its lines warm |
//!
//! Every OSD has the same software model ([`Cost`]): `threads` servers of `cpu_us` each per op,
//! plus `latency_us` fixed per op (client, messenger, network, the data device's attach).
//! The study calibrates these on the machine it runs on; see docs/CEPH.md.

use crate::scenario::{
    CacheSpec, ClusterSpec, ConfigSpec, CutoffSpec, ExtraSpec, Scenario, ServerSpec,
};
use crate::workload::{Distribution, Pattern, WorkloadSpec};

/// The study's layouts, as the scenario's configs.
pub const LAYOUTS: [&str; 3] = ["hdd", "hdd+db", "tiercache"];

/// What the study ran: its topology, devices, cache and workloads.
#[derive(Clone, Debug)]
pub struct Study {
    /// Failure domains (hosts in a real cluster; a single-node study uses one per OSD).
    pub nodes: u32,
    /// OSDs per failure domain.
    pub osds_per_node: u32,
    /// Copies of each object.
    pub replicas: u32,
    /// HDD preset (the study's `emu:` preset).
    pub hdd: String,
    /// HDD size, GiB (the emulated HDD's file: the model's seek curve spans it).
    pub hdd_gib: f64,
    /// Where each OSD's objects (and, for `hdd`, its RocksDB) lie: the first this many GiB.
    pub span_gib: f64,
    /// The image's data on each OSD, GiB.
    pub data_gib_per_osd: f64,
    /// Cache device preset.
    pub cache_dev: String,
    /// Cache per OSD, GiB.
    pub cache_gib_per_osd: f64,
    /// OSDs sharing one cache device.
    pub osds_per_cache_dev: u32,
    /// Cache line, KiB.
    pub line_kib: u32,
    /// Sequential cutoff `always` at this many KiB.
    pub cutoff_kib: u64,
    /// The IO-class CSV.
    pub ioclass_csv: String,
    /// Client jobs and QD per job.
    pub jobs: u32,
    /// Requests outstanding per job.
    pub qd: u32,
    /// Simulated seconds measured per run, after `warmup_s`.
    pub duration_s: f64,
    /// Simulated warm-up before each run, seconds.
    pub warmup_s: f64,
    /// Workloads: (name, random, read %, block KiB).
    pub workloads: Vec<(String, bool, u32, u32)>,
}

/// The per-OSD software model and the `hdd` layout's RocksDB/WAL IOs on the HDD.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct Cost {
    /// Ops an OSD processes at once.
    pub threads: u32,
    /// CPU per op, µs.
    pub cpu_us: f64,
    /// Fixed latency per op, µs.
    pub latency_us: f64,
    /// `hdd` layout: extra HDD reads per read op.
    pub hdd_extra_per_read: f64,
    /// `hdd` layout: extra HDD writes per write op.
    pub hdd_extra_per_write: f64,
}

/// One predicted run.
#[derive(Clone, Debug, PartialEq)]
pub struct Predicted {
    /// Layout (config) name.
    pub layout: String,
    /// Workload name.
    pub workload: String,
    /// Client IOPS.
    pub iops: f64,
    /// Mean client latency, µs.
    pub mean_us: f64,
    /// p99 client latency, µs.
    pub p99_us: f64,
}

fn config(name: &str, cache: bool, hdd_extra: Option<ExtraSpec>) -> ConfigSpec {
    ConfigSpec {
        name: name.into(),
        cache,
        cache_dev: None,
        cleaning: None,
        rate_target_pct: None,
        hdd_extra,
    }
}

impl Study {
    /// The scenario of this study with per-op costs `c`, one config per layout in `layouts`.
    pub fn scenario(&self, c: &Cost, layouts: &[&str]) -> Result<Scenario, String> {
        let mut configs = Vec::new();
        for &l in layouts {
            configs.push(match l {
                "hdd" => config(
                    l,
                    false,
                    Some(ExtraSpec {
                        per_read: c.hdd_extra_per_read.max(0.0),
                        per_write: c.hdd_extra_per_write.max(0.0),
                        gib: self.span_gib,
                    }),
                ),
                "hdd+db" => config(l, false, None),
                "tiercache" => config(l, true, None),
                other => return Err(format!("unknown layout '{other}'")),
            });
        }
        let workload = self
            .workloads
            .iter()
            .map(|(name, random, read_pct, block_kib)| WorkloadSpec {
                name: name.clone(),
                pattern: if *random {
                    Pattern::Random
                } else {
                    Pattern::Sequential
                },
                read_pct: *read_pct,
                block_kib: *block_kib,
                qd: self.qd,
                jobs: self.jobs,
                distribution: Distribution::default(),
                duration_s: self.duration_s,
                // The study warms the whole image into the cache before every workload.
                cold: false,
            })
            .collect();
        let s = Scenario {
            name: "ceph-osd-study".into(),
            title: "tiercache bench --study ceph-osd, simulated".into(),
            about: "built from the study's parameters and this machine's calibration".into(),
            seed: 1,
            warmup_s: self.warmup_s,
            sample_s: self.duration_s.max(0.1),
            show_series: false,
            single: None,
            cluster: Some(ClusterSpec {
                nodes: self.nodes,
                osds_per_node: self.osds_per_node,
                replicas: self.replicas,
                object_mib: 4,
                working_set_gib_per_osd: self.data_gib_per_osd,
                hdd: self.hdd.clone(),
                hdd_gib: self.hdd_gib,
                span_gib: Some(self.span_gib),
                cache_dev: self.cache_dev.clone(),
                osds_per_cache_dev: self.osds_per_cache_dev,
                cache_gib_per_osd: self.cache_gib_per_osd,
                server: ServerSpec {
                    threads: c.threads.max(1),
                    cpu_us: c.cpu_us.max(0.0),
                    latency_us: c.latency_us.max(0.0),
                },
            }),
            cache: CacheSpec {
                mode: "wb".into(),
                line_kib: self.line_kib,
                cutoff: Some(CutoffSpec {
                    policy: "always".into(),
                    threshold_kib: self.cutoff_kib,
                }),
                ioclass_csv: Some(self.ioclass_csv.clone()),
                cleaning: "alru".into(),
                alru_activity_threshold_ms: Some(1000),
                alru_staleness_time_s: None,
                alru_wake_up_s: None,
                rate_target_pct: None,
                warm: true,
            },
            config: configs,
            workload,
            published: Vec::new(),
        };
        // The checks a scenario file gets.
        Scenario::parse_checks(&s)?;
        Ok(s)
    }

    /// The seed study's cluster (the shipped `ceph-opencas-2020` scenario: 2 nodes x 6 OSDs,
    /// replica 2, 10k RPM HDDs, NVMe cache partitions, 20 jobs x QD 16) with this study's
    /// workloads and duration.
    pub fn seed_cluster(&self) -> Result<Study, String> {
        let s = Scenario::load("ceph-opencas-2020")?;
        let cl = s
            .cluster
            .as_ref()
            .ok_or("ceph-opencas-2020 has no cluster")?;
        Ok(Study {
            nodes: cl.nodes,
            osds_per_node: cl.osds_per_node,
            replicas: cl.replicas,
            hdd: cl.hdd.clone(),
            hdd_gib: cl.hdd_gib,
            span_gib: cl.hdd_gib,
            data_gib_per_osd: cl.working_set_gib_per_osd,
            cache_dev: cl.cache_dev.clone(),
            cache_gib_per_osd: cl.cache_gib_per_osd,
            osds_per_cache_dev: cl.osds_per_cache_dev,
            jobs: 20,
            qd: 16,
            duration_s: 2.0,
            ..self.clone()
        })
    }

    /// Runs every workload under every layout of `layouts` with costs `c`.
    pub fn predict(&self, c: &Cost, layouts: &[&str]) -> Result<Vec<Predicted>, String> {
        let s = self.scenario(c, layouts)?;
        let runs = s.run_all(s.seed, |_, _, _| {})?;
        Ok(runs
            .into_iter()
            .map(|r| Predicted {
                layout: r.config,
                workload: r.workload,
                iops: r.result.iops(),
                mean_us: r.result.latency.mean_ns() / 1000.0,
                p99_us: r.result.latency.quantile_ns(0.99) as f64 / 1000.0,
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The quick single-OSD study's shape, at a small size.
    fn study(osds: u32) -> Study {
        Study {
            nodes: osds,
            osds_per_node: 1,
            replicas: osds.min(2),
            hdd: "hdd-10k-sas".into(),
            hdd_gib: 4.0,
            span_gib: 0.125,
            data_gib_per_osd: 0.0625,
            cache_dev: "ram".into(),
            cache_gib_per_osd: 0.25,
            osds_per_cache_dev: 1,
            line_kib: 4,
            cutoff_kib: 16,
            ioclass_csv: "IO class id,IO class name,Eviction priority,Allocation\n\
                          0,unclassified,22,0\n1,request_size:le:131072,1,1\n"
                .into(),
            jobs: 1,
            qd: 16,
            duration_s: 0.5,
            warmup_s: 0.2,
            workloads: vec![("randread-4k".into(), true, 100, 4)],
        }
    }

    const COST: Cost = Cost {
        threads: 2,
        cpu_us: 150.0,
        latency_us: 500.0,
        hdd_extra_per_read: 0.5,
        hdd_extra_per_write: 1.0,
    };

    #[test]
    fn the_scenario_has_the_studys_topology() {
        let st = study(2);
        let s = st.scenario(&COST, &LAYOUTS).unwrap();
        let cl = s.cluster.as_ref().unwrap();
        assert_eq!(
            (cl.nodes * cl.osds_per_node, cl.replicas, cl.hdd.as_str()),
            (2, 2, "hdd-10k-sas")
        );
        assert_eq!((cl.hdd_gib, cl.cache_gib_per_osd), (4.0, 0.25));
        assert_eq!(
            (cl.server.threads, cl.server.cpu_us, cl.server.latency_us),
            (2, 150.0, 500.0)
        );
        let names: Vec<&str> = s.config.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, LAYOUTS);
        assert!(s.config[0].hdd_extra.is_some() && s.config[1].hdd_extra.is_none());
        assert_eq!(
            (
                s.cache.line_kib,
                s.cache.cutoff.as_ref().unwrap().threshold_kib
            ),
            (4, 16)
        );
        assert_eq!((s.workload[0].qd, s.workload[0].jobs), (16, 1));
        let seed = st.seed_cluster().unwrap();
        assert_eq!(
            (seed.nodes, seed.osds_per_node, seed.replicas, seed.jobs),
            (2, 6, 2, 20)
        );
    }

    #[test]
    fn predicted_random_reads_order_the_layouts() {
        let p = study(1).predict(&COST, &LAYOUTS).unwrap();
        let iops = |l: &str| p.iter().find(|r| r.layout == l).unwrap().iops;
        let (hdd, db, tc) = (iops("hdd"), iops("hdd+db"), iops("tiercache"));
        println!("randread-4k predicted: tiercache {tc:.0}, hdd+db {db:.0}, hdd {hdd:.0} IOPS");
        assert!(
            tc > db && db > hdd,
            "tiercache {tc}, hdd+db {db}, hdd {hdd}"
        );
        // Hits are bound by the OSD model: 2 threads x 150 us at most.
        assert!(tc <= 2.0e6 / 150.0 * 1.01, "{tc}");
    }
}
