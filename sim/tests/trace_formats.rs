//! Each trace reader on a small sample of its format (sim/tests/traces/, written from the
//! published format descriptions; the binary ones built here), malformed records included:
//! units, devices, sorting, widening, and the counts of ignored and bad records.

use tiercache_sim::trace::{
    DeviceSel, Format, Op, ReadOptions, Request, Trace, read_bytes, read_file, sniff,
};

fn path(name: &str) -> String {
    format!("{}/tests/traces/{name}", env!("CARGO_MANIFEST_DIR"))
}

fn opts(format: Option<Format>, device: DeviceSel, strict: bool) -> ReadOptions {
    ReadOptions {
        format,
        device,
        strict,
    }
}

/// Reads a sample with its format named and with `auto`; both must agree.
fn read(name: &str, format: Format, device: DeviceSel) -> Trace {
    let t = read_file(&path(name), &opts(Some(format), device.clone(), false)).unwrap();
    let bytes = std::fs::read(path(name)).unwrap();
    assert_eq!(sniff(&bytes), Ok(format), "{name} sniffed");
    let auto = read_file(&path(name), &opts(None, device, false)).unwrap();
    assert_eq!(auto.requests, t.requests);
    t
}

fn req(time_us: u64, op: Op, offset: u64, len: u32) -> Request {
    Request {
        time_us,
        offset,
        len,
        op,
    }
}

#[test]
fn our_csv_with_trims_flushes_unaligned_and_unsorted_lines() {
    let t = read("ours.csv", Format::Csv, DeviceSel::Only);
    assert_eq!(
        t.requests,
        vec![
            req(0, Op::Read, 0, 4096),
            req(5, Op::Read, 0, 1536),
            req(10, Op::Write, 8192, 512),
            req(20, Op::Trim, 0, 65536),
            req(30, Op::Flush, 0, 0),
        ]
    );
    assert_eq!((t.ignored, t.bad, t.widened, t.reordered), (2, 1, 1, 1));
    assert!(t.bad_shown[0].ends_with("ours.csv:8: op 'X' is not R, W, T or F"));
    let s = t.summary("ours.csv");
    assert!(
        s.contains("1 bad records") && s.contains("1 widened"),
        "{s}"
    );
    let e = read_file(
        &path("ours.csv"),
        &opts(Some(Format::Csv), DeviceSel::Only, true),
    )
    .unwrap_err();
    assert!(e.ends_with("ours.csv:8: op 'X' is not R, W, T or F"), "{e}");
    assert!(!e.contains('\n'));
}

#[test]
fn blkparse_keeps_queue_events_per_device_and_skips_the_summary() {
    let e = read_file(&path("blkparse.txt"), &opts(None, DeviceSel::Only, false)).unwrap_err();
    assert!(
        e.contains("2 devices: 8,0 (4 requests), 8,16 (1 requests); choose one with --device"),
        "{e}"
    );
    let t = read(
        "blkparse.txt",
        Format::Blkparse,
        DeviceSel::Id("8,0".into()),
    );
    assert_eq!(
        t.requests,
        vec![
            req(0, Op::Write, 3417048 * 512, 4096),
            req(1000, Op::Read, 2048 * 512, 8192),
            req(1200, Op::Flush, 0, 0),
            req(2000, Op::Trim, 4096 * 512, 1 << 20),
        ]
    );
    assert_eq!(t.stage, Some('Q'));
    // G and P events, the D and C events of the write, the four summary lines.
    assert_eq!((t.ignored, t.bad, t.other_devices), (8, 1, 1));
    assert!(t.bad_shown[0].contains("blkparse.txt:10: time 'notatime'"));
    let e = read_file(
        &path("blkparse.txt"),
        &opts(None, DeviceSel::Id("9,9".into()), false),
    )
    .unwrap_err();
    assert!(e.contains("no device '9,9'"), "{e}");
}

#[test]
fn msr_filetime_hosts_and_disks() {
    let t = read("msr.csv", Format::Msr, DeviceSel::Id("hm_1".into()));
    let ids: Vec<&str> = t.devices.iter().map(|d| d.id.as_str()).collect();
    assert_eq!(ids, ["hm_1", "hm_0"]);
    assert_eq!(
        t.requests,
        vec![
            req(0, Op::Write, 3719016448, 1024),
            req(9600, Op::Read, 3718968320, 4096),
            req(32602, Op::Read, 3718968320, 4096),
        ]
    );
    assert_eq!(
        (t.bad, t.widened, t.reordered, t.other_devices),
        (1, 1, 1, 1)
    );
    assert!(t.bad_shown[0].contains("msr.csv:5: type 'Delete'"));
}

#[test]
fn alibaba_devices_bytes_and_microseconds() {
    let t = read("alibaba.csv", Format::Alibaba, DeviceSel::Id("419".into()));
    assert_eq!(
        t.requests,
        vec![
            req(0, Op::Write, 8792711168, 4096),
            req(174, Op::Read, 8792711168, 8192),
            req(374, Op::Read, 0, 4608),
        ]
    );
    assert_eq!((t.bad, t.widened, t.other_devices), (1, 1, 1));
    assert!(t.bad_shown[0].contains("alibaba.csv:4: expected device_id"));
    // `all`: device 61 placed after device 419's highest byte, 1 GiB aligned.
    let all = read("alibaba.csv", Format::Alibaba, DeviceSel::All);
    assert_eq!(all.requests.len(), 4);
    assert_eq!(all.device, "all");
    let base = (8792711168u64 + 8192).div_ceil(1 << 30) << 30;
    assert!(all.requests.contains(&req(74, Op::Write, base, 4096)));
}

#[test]
fn tencent_seconds_sectors_and_volumes() {
    let t = read("tencent.csv", Format::Tencent, DeviceSel::Id("1283".into()));
    assert_eq!(
        t.requests,
        vec![
            req(0, Op::Write, 12845056 * 512, 8192),
            req(0, Op::Read, 12845072 * 512, 4096),
            req(3_000_000, Op::Read, 12845056 * 512, 8192),
        ]
    );
    assert_eq!((t.bad, t.other_devices), (1, 1));
    assert!(t.bad_shown[0].contains("tencent.csv:4: iotype '2'"));
}

#[test]
fn fio_iologs_v2_and_v3() {
    let t = read("fio2.log", Format::FioIolog, DeviceSel::Only);
    assert_eq!(
        t.requests,
        vec![
            req(0, Op::Write, 0, 4096),
            req(0, Op::Read, 4096, 4096),
            req(5000, Op::Trim, 8192, 8192),
            req(5000, Op::Flush, 0, 0),
        ]
    );
    assert_eq!((t.ignored, t.bad), (5, 1));
    assert_eq!(t.device, "/dev/sdb");
    let t = read("fio3.log", Format::FioIolog, DeviceSel::Only);
    assert_eq!(
        t.requests,
        vec![
            req(0, Op::Read, 0, 4096),
            req(18, Op::Write, 1 << 20, 131072),
            req(33, Op::Read, 4096, 4096),
        ]
    );
    assert_eq!((t.ignored, t.bad), (4, 1));
    assert!(t.bad_shown[0].contains("fio3.log:6: write without offset and length"));
    let e = read_bytes(
        "x.log",
        b"/dev/sdb read 0 4096\n",
        &opts(Some(Format::FioIolog), DeviceSel::Only, true),
    )
    .unwrap_err();
    assert!(e.starts_with("x.log:1: no 'fio version"), "{e}");
}

/// vscsi v2 record: cmd, ver, sn, len, nSG, lbn, ts, rt.
fn vscsi2(cmd: u16, ver: u16, len: u32, lbn: u64, ts: u64) -> Vec<u8> {
    let mut r = Vec::new();
    r.extend(cmd.to_le_bytes());
    r.extend(ver.to_le_bytes());
    r.extend(7u32.to_le_bytes());
    r.extend(len.to_le_bytes());
    r.extend(1u32.to_le_bytes());
    r.extend(lbn.to_le_bytes());
    r.extend(ts.to_le_bytes());
    r.extend(250u64.to_le_bytes());
    r
}

/// vscsi v1 record: sn, len, nSG, cmd, ver, lbn, ts.
fn vscsi1(cmd: u16, len: u32, lbn: u64, ts: u64) -> Vec<u8> {
    let mut r = Vec::new();
    r.extend(7u32.to_le_bytes());
    r.extend(len.to_le_bytes());
    r.extend(1u32.to_le_bytes());
    r.extend(cmd.to_le_bytes());
    r.extend(0x0100u16.to_le_bytes());
    r.extend(lbn.to_le_bytes());
    r.extend(ts.to_le_bytes());
    r
}

#[test]
fn vscsi_versions_1_and_2() {
    let mut b = Vec::new();
    b.extend(vscsi2(0x28, 0x0200, 4096, 100, 1_000_000));
    b.extend(vscsi2(0x2a, 0x0200, 700, 8, 1_000_050));
    b.extend(vscsi2(0x00, 0x0200, 0, 0, 1_000_060)); // TEST UNIT READY: ignored
    b.extend(vscsi2(0x28, 0x0300, 4096, 0, 1_000_070)); // wrong version byte: bad
    b.extend(vscsi2(0x35, 0x0200, 0, 0, 1_000_080)); // SYNCHRONIZE CACHE: flush
    assert_eq!(sniff(&b), Ok(Format::Vscsi));
    let t = read_bytes("v2.vscsi", &b, &opts(None, DeviceSel::Only, false)).unwrap();
    assert_eq!(
        t.requests,
        vec![
            req(0, Op::Read, 51200, 4096),
            req(50, Op::Write, 4096, 1024),
            req(80, Op::Flush, 0, 0),
        ]
    );
    assert_eq!((t.ignored, t.bad, t.widened), (1, 1, 1));
    assert!(t.bad_shown[0].starts_with("v2.vscsi: record 4: version byte 3"));
    let mut b = Vec::new();
    b.extend(vscsi1(0x88, 8192, 16, 5));
    b.extend(vscsi1(0x8a, 4096, 0, 9));
    b.extend([1, 2, 3]); // a torn last record
    let t = read_bytes(
        "v1.vscsi",
        &b[..b.len() - 3],
        &opts(Some(Format::Vscsi), DeviceSel::Only, false),
    )
    .unwrap();
    assert_eq!(
        t.requests,
        vec![req(0, Op::Read, 8192, 8192), req(4, Op::Write, 0, 4096)]
    );
    let e = read_bytes(
        "v1.vscsi",
        &b,
        &opts(Some(Format::Vscsi), DeviceSel::Only, true),
    )
    .unwrap_err();
    assert!(e.contains("not a vscsi trace"), "{e}");
}

fn oracle(time: u32, id: u64, size: u32) -> Vec<u8> {
    let mut r = Vec::new();
    r.extend(time.to_le_bytes());
    r.extend(id.to_le_bytes());
    r.extend(size.to_le_bytes());
    r.extend((-1i64).to_le_bytes());
    r
}

#[test]
fn oracle_general_objects_get_their_own_slots() {
    let mut b = Vec::new();
    b.extend(oracle(10, 0xdead_beef_0000_0001, 4096));
    b.extend(oracle(10, 0xdead_beef_0000_0002, 8192));
    b.extend(oracle(11, 0xdead_beef_0000_0001, 4096));
    b.extend(oracle(12, 5, 0)); // size 0: bad
    assert_eq!(sniff(&b), Ok(Format::OracleGeneral));
    let t = read_bytes("t.oracleGeneral", &b, &opts(None, DeviceSel::Only, false)).unwrap();
    assert_eq!(
        t.requests,
        vec![
            req(0, Op::Read, 0, 4096),
            req(0, Op::Read, 8192, 8192),
            req(1_000_000, Op::Read, 0, 4096),
        ]
    );
    assert_eq!(t.bad, 1);
    let mut torn = b.clone();
    torn.extend([0; 5]);
    let e = read_bytes(
        "t.bin",
        &torn,
        &opts(Some(Format::OracleGeneral), DeviceSel::Only, true),
    )
    .unwrap_err();
    assert!(e.contains("5 trailing bytes"), "{e}");
}

#[test]
fn garbage_never_panics_and_unknown_text_asks_for_a_format() {
    assert!(sniff(b"hello world\nthis is not a trace\n").is_err());
    assert!(sniff(b"").is_err());
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for n in 0..2000 {
        let len = (n % 97) + 1;
        let bytes: Vec<u8> = (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                // Mostly text-like bytes, so the text readers get exercised too.
                if x.is_multiple_of(5) {
                    (x >> 8) as u8
                } else {
                    b"0123456789,RW. +\nQD8"[(x % 20) as usize]
                }
            })
            .collect();
        for f in [
            None,
            Some(Format::Csv),
            Some(Format::Blkparse),
            Some(Format::Msr),
            Some(Format::Alibaba),
            Some(Format::Tencent),
            Some(Format::FioIolog),
            Some(Format::Vscsi),
            Some(Format::OracleGeneral),
        ] {
            let _ = read_bytes("fuzz", &bytes, &opts(f, DeviceSel::All, false));
            let _ = read_bytes("fuzz", &bytes, &opts(f, DeviceSel::Only, true));
        }
    }
}
