//! Device selection, time normalisation and sorting: from every record read to the one
//! device's (or all devices') requests in time order.

use super::{Collected, Format, Op, Request};

/// Which device(s) of a multi-device trace to keep.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum DeviceSel {
    /// The only device; a trace with several is refused, listing them.
    #[default]
    Only,
    /// This device id (as the trace writes it).
    Id(String),
    /// Every device, each in its own address range (device k after device k-1's highest
    /// byte, rounded up to 1 GiB), as one shared cache would see them.
    All,
}

impl DeviceSel {
    /// From a `--device` value (`None`: [`DeviceSel::Only`]).
    pub fn parse(s: Option<&str>) -> DeviceSel {
        match s {
            None => DeviceSel::Only,
            Some("all") => DeviceSel::All,
            Some(id) => DeviceSel::Id(id.to_string()),
        }
    }
}

/// One device found in a trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Its id as the trace writes it (`""`: the format has no device column).
    pub id: String,
    /// Requests (after blkparse stage selection).
    pub requests: u64,
    /// Highest byte touched.
    pub max_end: u64,
}

/// A trace read and selected.
#[derive(Clone, Debug)]
pub struct Trace {
    /// The format read.
    pub format: Format,
    /// The requests of the selected device(s), in time order, time 0 at the first.
    pub requests: Vec<Request>,
    /// Every device found, in order of first appearance.
    pub devices: Vec<DeviceInfo>,
    /// The selected device id, or `all`.
    pub device: String,
    /// Lines or records read (empty lines not counted).
    pub records: u64,
    /// Records that are not requests by the format's rules.
    pub ignored: u64,
    /// Records that could not be read.
    pub bad: u64,
    /// The first bad records, `file:line: reason`.
    pub bad_shown: Vec<String>,
    /// Requests of other devices, left out.
    pub other_devices: u64,
    /// Requests widened to whole 512-byte sectors.
    pub widened: u64,
    /// Requests that came earlier in time than the one before them in the file (sorted).
    pub reordered: u64,
    /// blkparse: the action kept (`Q`, `D` or `C`); events of other stages are ignored.
    pub stage: Option<char>,
}

/// Selects, shifts, sorts (stable) and normalises time.
pub(crate) fn select(name: &str, c: Collected, sel: &DeviceSel) -> Result<Trace, String> {
    // blkparse logs one request per stage: keep the earliest stage present (queue, then
    // issue, then completion), ignore the rest.
    let stages: Vec<u8> = {
        let mut s: Vec<u8> = c.recs.iter().map(|r| r.1).collect();
        s.sort_unstable();
        s.dedup();
        s
    };
    let keep_stage = stages.first().copied().unwrap_or(0);
    let mut ignored = c.ignored;
    let mut devices: Vec<DeviceInfo> = c
        .devices
        .iter()
        .map(|id| DeviceInfo {
            id: id.clone(),
            requests: 0,
            max_end: 0,
        })
        .collect();
    for (d, st, r) in &c.recs {
        if *st != keep_stage {
            ignored += 1;
            continue;
        }
        let di = &mut devices[*d as usize];
        di.requests += 1;
        di.max_end = di.max_end.max(r.end());
    }
    let list = || {
        devices
            .iter()
            .map(|d| format!("{} ({} requests)", d.id, d.requests))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let (want, label): (Option<u32>, String) = match sel {
        DeviceSel::Only if devices.len() > 1 => {
            return Err(format!(
                "{name}: the trace has {} devices: {}; choose one with --device ID (or --device all)",
                devices.len(),
                list()
            ));
        }
        DeviceSel::Only | DeviceSel::All => (None, "all".into()),
        DeviceSel::Id(id) => match devices.iter().position(|d| &d.id == id) {
            Some(i) => (Some(i as u32), id.clone()),
            None => {
                return Err(format!(
                    "{name}: no device '{id}' in the trace; it has {}",
                    if devices.is_empty() {
                        "no requests".to_string()
                    } else {
                        list()
                    }
                ));
            }
        },
    };
    let label = if devices.len() == 1 && want.is_none() {
        devices[0].id.clone()
    } else {
        label
    };
    // Address bases for `all`: each device after the previous one's end, 1 GiB aligned.
    let mut base = vec![0u64; devices.len()];
    let mut next = 0u64;
    for (i, d) in devices.iter().enumerate() {
        base[i] = next;
        next = next.saturating_add(d.max_end.div_ceil(1 << 30) << 30);
    }
    let mut other = 0u64;
    let mut reqs = Vec::with_capacity(c.recs.len());
    for (d, st, r) in c.recs {
        if st != keep_stage {
            continue;
        }
        if want.is_some_and(|w| w != d) {
            other += 1;
            continue;
        }
        let mut r = r;
        if r.op != Op::Flush {
            r.offset += base[d as usize];
        }
        reqs.push(r);
    }
    let reordered = reqs
        .windows(2)
        .filter(|w| w[1].time_us < w[0].time_us)
        .count() as u64;
    if reordered > 0 {
        reqs.sort_by_key(|r| r.time_us);
    }
    if let Some(t0) = reqs.first().map(|r| r.time_us) {
        reqs.iter_mut().for_each(|r| r.time_us -= t0);
    }
    Ok(Trace {
        format: c.format,
        requests: reqs,
        devices,
        device: label,
        records: c.records,
        ignored,
        bad: c.bad,
        bad_shown: c.bad_shown,
        other_devices: other,
        widened: c.widened,
        reordered,
        stage: (keep_stage != 0).then(|| super::blkparse::stage_name(keep_stage)),
    })
}

impl Trace {
    /// Highest byte any request touches.
    pub fn max_end(&self) -> u64 {
        self.requests.iter().map(|r| r.end()).max().unwrap_or(0)
    }

    /// One paragraph saying what was read and what was left out (the counts a user needs to
    /// trust the result).
    pub fn summary(&self, name: &str) -> String {
        let mut s = format!(
            "{name}: {} format, device {}, {} requests from {} records",
            self.format.name(),
            if self.device.is_empty() {
                "-"
            } else {
                &self.device
            },
            self.requests.len(),
            self.records
        );
        if self.devices.len() > 1 {
            s += &format!(
                " ({} devices in the file, {} requests of others left out)",
                self.devices.len(),
                self.other_devices
            );
        }
        if let Some(st) = self.stage {
            s += &format!("; blkparse action {st} kept");
        }
        s += &format!(
            "\n  ignored {} non-request records, {} bad records, {} widened to 512-byte sectors, {} out of time order (sorted)",
            self.ignored, self.bad, self.widened, self.reordered
        );
        for b in &self.bad_shown {
            s += &format!("\n  bad: {b}");
        }
        if self.bad as usize > self.bad_shown.len() {
            s += &format!(
                "\n  ... and {} more bad records (--strict stops at the first)",
                self.bad as usize - self.bad_shown.len()
            );
        }
        s
    }
}
