//! `/metrics` of a real daemon: a `wb` cache whose export is named `vol"x\y` and a `wl` cache
//! whose export is `wl\log"` (export names are printable ASCII: no newline), after NBD traffic on the reactor and on the threaded
//! path. The whole exposition must parse with a real parser (`prometheus_client`) and with a
//! strict checker here; its families must be exactly those of docs/METRICS.md, each with at
//! least one sample; the request histograms must count the requests made; `HEAD /metrics`
//! answers 200 without a body.

mod common;

use common::{Daemon, Dir, Opts, free_port};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use tiercache_io::Backend;

const ODD: &str = "vol\"x\\y";
const ODD_URI: &str = "vol%22x%5Cy";
const WL: &str = "wl\\log\"";

/// One HTTP request to the metrics listener: (status line, headers, body).
fn http(port: u16, request_line: &str) -> (String, String, String) {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(format!("{request_line}\r\nHost: x\r\n\r\n").as_bytes())
        .unwrap();
    let mut r = String::new();
    s.read_to_string(&mut r).unwrap();
    let (head, body) = r.split_once("\r\n\r\n").expect("headers end");
    let (status, headers) = head.split_once("\r\n").unwrap_or((head, ""));
    (status.to_string(), headers.to_string(), body.to_string())
}

/// A sample: metric name, labels, value.
#[derive(Debug)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

fn valid_name(n: &str) -> bool {
    let mut c = n.chars();
    c.next()
        .is_some_and(|f| f.is_ascii_alphabetic() || f == '_' || f == ':')
        && c.all(|x| x.is_ascii_alphanumeric() || x == '_' || x == ':')
}

/// Parses `{k="v",...}` strictly (only `\\`, `\"`, `\n` escapes); the rest of the line.
fn labels(s: &str) -> Result<(BTreeMap<String, String>, &str), String> {
    let mut m = BTreeMap::new();
    let Some(mut s) = s.strip_prefix('{') else {
        return Ok((m, s));
    };
    loop {
        if let Some(rest) = s.strip_prefix('}') {
            return Ok((m, rest));
        }
        let eq = s.find('=').ok_or("label without =")?;
        let k = &s[..eq];
        if !valid_name(k) || k.starts_with("__") {
            return Err(format!("bad label name {k:?}"));
        }
        let mut chars = s[eq + 1..]
            .strip_prefix('"')
            .ok_or("unquoted value")?
            .char_indices();
        let mut v = String::new();
        let end = loop {
            match chars.next().ok_or("unterminated value")? {
                (_, '\\') => match chars.next().ok_or("dangling escape")?.1 {
                    '\\' => v.push('\\'),
                    '"' => v.push('"'),
                    'n' => v.push('\n'),
                    c => return Err(format!("bad escape \\{c}")),
                },
                (i, '"') => break i,
                (_, '\n') => return Err("raw newline in a value".into()),
                (_, c) => v.push(c),
            }
        };
        if m.insert(k.to_string(), v).is_some() {
            return Err(format!("label {k} twice"));
        }
        s = &s[eq + 1..][1 + end + 1..];
        s = s.strip_prefix(',').unwrap_or(s);
    }
}

/// A strict reading of the text format: HELP and TYPE once per family and before its samples,
/// samples of a family together, valid names, labels and values, histograms whole (cumulative
/// buckets ending at `+Inf` equal to `_count`, with `_sum`). The families with their types.
fn check_exposition(text: &str) -> (BTreeMap<String, String>, Vec<Sample>) {
    let mut types: BTreeMap<String, String> = BTreeMap::new();
    let mut helps = std::collections::BTreeSet::new();
    let mut samples = Vec::new();
    let mut current: Option<String> = None;
    let mut closed = std::collections::BTreeSet::new();
    for (i, line) in text.lines().enumerate() {
        let at = |what: &str| format!("line {}: {what}: {line:?}", i + 1);
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, _) = rest.split_once(' ').expect("HELP text");
            assert!(valid_name(name), "{}", at("bad name"));
            assert!(helps.insert(name.to_string()), "{}", at("HELP twice"));
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("TYPE kind");
            assert!(
                ["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind),
                "{}",
                at("bad type")
            );
            assert!(helps.contains(name), "{}", at("TYPE before HELP"));
            assert!(
                types.insert(name.to_string(), kind.to_string()).is_none(),
                "{}",
                at("TYPE twice")
            );
            if let Some(c) = current.replace(name.to_string()) {
                closed.insert(c);
            }
            continue;
        }
        assert!(
            !line.starts_with('#') && !line.is_empty(),
            "{}",
            at("stray")
        );
        let end = line.find(['{', ' ']).expect("a value");
        let name = &line[..end];
        assert!(valid_name(name), "{}", at("bad metric name"));
        let (l, rest) = labels(&line[end..]).unwrap_or_else(|e| panic!("{}", at(&e)));
        let v = rest
            .strip_prefix(' ')
            .unwrap_or_else(|| panic!("{}", at("no value")));
        let value = match v {
            "NaN" => f64::NAN,
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v.parse().unwrap_or_else(|_| panic!("{}", at("bad value"))),
        };
        let family = current
            .clone()
            .unwrap_or_else(|| panic!("{}", at("no TYPE")));
        let ok = match types[&family].as_str() {
            "histogram" => {
                [&family, "_bucket"].concat() == name
                    || [&family, "_sum"].concat() == name
                    || [&family, "_count"].concat() == name
            }
            _ => family == name,
        };
        assert!(ok, "{}", at(&format!("sample outside its family {family}")));
        assert!(!closed.contains(&family), "{}", at("family reopened"));
        samples.push(Sample {
            name: name.to_string(),
            labels: l,
            value,
        });
    }
    for (family, kind) in &types {
        if kind != "histogram" {
            continue;
        }
        let series: std::collections::BTreeSet<BTreeMap<String, String>> = samples
            .iter()
            .filter(|s| s.name.starts_with(family.as_str()))
            .map(|s| {
                let mut l = s.labels.clone();
                l.remove("le");
                l
            })
            .collect();
        for key in series {
            let of = |suffix: &str| -> Vec<&Sample> {
                samples
                    .iter()
                    .filter(|s| s.name == format!("{family}{suffix}"))
                    .filter(|s| {
                        let mut l = s.labels.clone();
                        l.remove("le");
                        l == key
                    })
                    .collect()
            };
            let buckets = of("_bucket");
            let les: Vec<f64> = buckets
                .iter()
                .map(|s| s.labels["le"].parse().unwrap())
                .collect();
            assert!(
                les.windows(2).all(|w| w[0] < w[1]),
                "{family} {key:?}: le ascending"
            );
            assert_eq!(
                les.last(),
                Some(&f64::INFINITY),
                "{family} {key:?}: +Inf last"
            );
            let counts: Vec<f64> = buckets.iter().map(|s| s.value).collect();
            assert!(
                counts.windows(2).all(|w| w[0] <= w[1]),
                "{family}: cumulative"
            );
            let count = of("_count");
            assert_eq!(count.len(), 1, "{family} {key:?}: one _count");
            assert_eq!(
                count[0].value,
                *counts.last().unwrap(),
                "{family}: +Inf = _count"
            );
            assert_eq!(of("_sum").len(), 1, "{family} {key:?}: one _sum");
        }
    }
    (types, samples)
}

/// The families of docs/METRICS.md's table: name to type.
fn documented() -> BTreeMap<String, String> {
    let p = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/METRICS.md");
    let text = std::fs::read_to_string(p).unwrap();
    let mut m = BTreeMap::new();
    for line in text.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if cells.len() > 3
            && let Some(name) = cells[1].strip_prefix("`tiercache_")
        {
            let name = format!("tiercache_{}", name.trim_end_matches('`'));
            if ["counter", "gauge", "histogram"].contains(&cells[2]) {
                m.insert(name, cells[2].to_string());
            }
        }
    }
    m
}

/// The exposition read by `prometheus_client`'s parser: (family, type, samples, export label
/// values) per family.
fn python_parse(text: &str) -> Vec<serde_json::Value> {
    let script = "import sys, json\n\
        from prometheus_client.parser import text_string_to_metric_families as f\n\
        print(json.dumps([[m.name, m.type, len(m.samples), sorted({s.labels.get('export', '') for s in m.samples})] for m in f(sys.stdin.read())]))\n";
    let mut child = std::process::Command::new("/usr/bin/python3")
        .args(["-c", script])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("/usr/bin/python3");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "prometheus_client refused the exposition (apt-get install python3-prometheus-client if it is missing): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn value(samples: &[Sample], name: &str, want: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .find(|s| {
            s.name == name
                && want
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(v))
        })
        .unwrap_or_else(|| panic!("no {name} {want:?}"))
        .value
}

fn config(d: &Dir) -> String {
    let (c1, k1) = (d.sparse("c1.img", 64 << 20), d.sparse("k1.img", 32 << 20));
    let (c2, k2) = (d.sparse("c2.img", 64 << 20), d.sparse("k2.img", 32 << 20));
    let t = format!(
        "[[cache]]\nid = 1\ndevice = \"{c1}\"\nmode = \"wb\"\n[cache.params]\ncleaning = {{ policy = \"nop\" }}\n\
         [[cache.core]]\nid = 0\ndevice = \"{k1}\"\nexport = 'vol\"x\\y'\n\
         [[cache]]\nid = 2\ndevice = \"{c2}\"\nmode = \"wl\"\n\
         [[cache.core]]\nid = 0\ndevice = \"{k2}\"\nexport = 'wl\\log\"'\n"
    );
    let p = d.path("tc.toml");
    std::fs::write(&p, t).unwrap();
    p
}

/// Writes 8 blocks of 4 KiB, reads 4, flushes, on the odd export.
fn traffic(dm: &Daemon) {
    let c = dm.nbd(ODD_URI).unwrap();
    let buf = tiercache_io::AlignedBuf::new(4096);
    for i in 0..8 {
        c.write(i * 8, &buf, false).unwrap();
    }
    let mut r = tiercache_io::AlignedBuf::new(4096);
    for i in 0..4 {
        c.read(i * 8, &mut r).unwrap();
    }
    c.flush().unwrap();
}

#[test]
fn exposition_parses_and_matches_the_docs() {
    let d = Dir::new("metrics");
    let cfg = config(&d);
    for threaded in [false, true] {
        let port = free_port();
        let mut args = vec!["--metrics-listen".to_string(), format!("127.0.0.1:{port}")];
        if threaded {
            args.push("--nbd-threaded".into());
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let dm = Daemon::start(Opts::new(&d).config(&cfg).args(&args));
        traffic(&dm);

        let (status, headers, text) = http(port, "GET /metrics HTTP/1.1");
        assert!(status.contains(" 200 "), "{status}");
        assert!(headers.contains("text/plain; version=0.0.4"), "{headers}");
        let (types, samples) = check_exposition(&text);

        // The request histograms counted what the client did, under the odd name.
        let odd = [("export", ODD)];
        let count = |op| {
            value(
                &samples,
                "tiercache_request_duration_seconds_count",
                &[odd[0], ("op", op)],
            )
        };
        assert_eq!(
            (count("write"), count("read"), count("flush")),
            (8.0, 4.0, 1.0),
            "threaded={threaded}"
        );
        assert!(
            value(
                &samples,
                "tiercache_request_duration_seconds_sum",
                &[odd[0], ("op", "write")]
            ) > 0.0
        );
        assert_eq!(
            value(&samples, "tiercache_client_written_bytes_total", &odd),
            8.0 * 4096.0
        );
        assert_eq!(
            value(&samples, "tiercache_client_read_bytes_total", &odd),
            4.0 * 4096.0
        );
        assert_eq!(
            value(
                &samples,
                "tiercache_request_errors_total",
                &[odd[0], ("op", "write")]
            ),
            0.0
        );
        assert_eq!(
            value(
                &samples,
                "tiercache_core_state",
                &[("export", WL), ("state", "running")]
            ),
            1.0
        );
        assert!(value(&samples, "tiercache_nbd_connections_accepted_total", &[]) >= 1.0);
        let fill = value(&samples, "tiercache_wl_log_fill_ratio", &[("cache", "2")]);
        assert!((0.0..=1.0).contains(&fill), "fill ratio {fill}");
        let bi = samples
            .iter()
            .find(|s| s.name == "tiercache_build_info")
            .expect("build_info");
        assert_eq!(bi.labels["version"], env!("CARGO_PKG_VERSION"));
        assert!(!bi.labels["commit"].is_empty());
        assert!(["true", "false"].contains(&bi.labels["io_uring"].as_str()));

        // The documented families, exactly, each with a sample.
        let docs = documented();
        assert!(docs.len() > 30, "docs table read: {docs:?}");
        assert_eq!(
            types, docs,
            "families in /metrics (left) vs docs/METRICS.md (right)"
        );
        for family in docs.keys() {
            assert!(
                samples.iter().any(|s| s.name.starts_with(family.as_str())),
                "{family} has no sample"
            );
        }

        // Every metric the example alert rules and the Grafana dashboard use exists.
        let used = |file: &str| -> usize {
            let p = format!("{}/../contrib/{file}", env!("CARGO_MANIFEST_DIR"));
            let text = std::fs::read_to_string(&p).unwrap();
            let mut used = 0;
            for (i, _) in text.match_indices("tiercache_") {
                let name: String = text[i..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                let family = ["_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|x| {
                        name.strip_suffix(x)
                            .filter(|f| types.get(*f).is_some_and(|t| t == "histogram"))
                    })
                    .unwrap_or(&name);
                assert!(
                    types.contains_key(family),
                    "{file} uses {name}, not in /metrics"
                );
                used += 1;
            }
            used
        };
        let rules = used("tiercache-alerts.yml");
        assert!(rules >= 10, "alert rules read: {rules} names");
        let dash = used("tiercache-grafana.json");
        assert!(dash >= 25, "dashboard read: {dash} names");

        // A real parser reads the whole exposition and gets the names back unescaped.
        let parsed = python_parse(&text);
        assert_eq!(parsed.len(), types.len());
        let hist = parsed
            .iter()
            .find(|f| f[0] == "tiercache_request_duration_seconds")
            .expect("histogram parsed");
        assert_eq!(hist[1], "histogram");
        assert_eq!(hist[3], serde_json::json!([ODD, WL]));

        // HEAD: 200 and the length GET would have, no body; / answered; others refused.
        let (status, headers, body) = http(port, "HEAD /metrics HTTP/1.1");
        assert!(status.contains(" 200 "), "{status}");
        assert!(body.is_empty(), "HEAD body: {body:?}");
        let len: usize = headers
            .lines()
            .find_map(|l| l.strip_prefix("Content-Length: "))
            .unwrap()
            .parse()
            .unwrap();
        assert!(len > 1000, "{headers}");
        assert!(http(port, "GET / HTTP/1.1").0.contains(" 200 "));
        assert!(http(port, "GET /nothing HTTP/1.1").0.contains(" 404 "));
        assert!(http(port, "POST /metrics HTTP/1.1").0.contains(" 405 "));
        // At most 4 scrapes at once: a fifth connection gets 503 at once, and once the
        // others go away the next is served.
        let idle: Vec<std::net::TcpStream> = (0..4)
            .map(|_| std::net::TcpStream::connect(("127.0.0.1", port)).unwrap())
            .collect();
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(http(port, "GET /metrics HTTP/1.1").0.contains(" 503 "));
        drop(idle);
        let t = std::time::Instant::now();
        while !http(port, "GET /metrics HTTP/1.1").0.contains(" 200 ") {
            assert!(
                t.elapsed() < std::time::Duration::from_secs(5),
                "still refused"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        dm.stop();
    }
}

#[test]
fn a_metrics_port_taken_is_a_problem_not_served() {
    let d = Dir::new("metrics-taken");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let dm = Daemon::start(Opts::new(&d).args(&["--metrics-listen", &format!("127.0.0.1:{port}")]));
    let log = dm.log();
    assert!(
        log.contains("level=error msg=\"metrics not served\""),
        "{log}"
    );
    let ready = log.lines().find(|l| l.contains("daemon ready")).unwrap();
    assert!(ready.contains("problems=1"), "{ready}");
    assert!(
        ready.contains(&format!(
            "metrics=\"none (bind of 127.0.0.1:{port} failed)\""
        )),
        "{ready}"
    );
    dm.stop();
}

#[test]
fn the_checker_refuses_what_prometheus_refuses() {
    let ok = "# HELP tiercache_x x\n# TYPE tiercache_x gauge\ntiercache_x{export=\"a\\\"b\\\\c\\nd\"} 1\n";
    let (_, s) = check_exposition(ok);
    assert_eq!(s[0].labels["export"], "a\"b\\c\nd");
    for bad in [
        "# HELP tiercache_x x\n# TYPE tiercache_x gauge\ntiercache_x{export=\"vol\"x\\y\"} 1\n",
        "# HELP tiercache_x x\n# TYPE tiercache_x gauge\ntiercache_x{export=\"a\\qb\"} 1\n",
        "# HELP tiercache_x x\n# TYPE tiercache_x gauge\ntiercache_x 1x\n",
        "tiercache_x 1\n",
        "# HELP tiercache_h h\n# TYPE tiercache_h histogram\ntiercache_h_bucket{le=\"1\"} 2\ntiercache_h_bucket{le=\"+Inf\"} 1\ntiercache_h_sum 1\ntiercache_h_count 1\n",
    ] {
        assert!(
            std::panic::catch_unwind(|| check_exposition(bad)).is_err(),
            "accepted: {bad}"
        );
    }
}
