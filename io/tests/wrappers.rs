//! What each [`Backend`] wrapper passes on to the device under it (`io/src/forward.rs`): over a
//! probe with every optional capability (inline, prefetch, holes, a ring descriptor, an
//! asynchronous path, batches), a pass-through (`Box`, `Arc`) forwards all of them, and the
//! wrappers that must see every IO (fault, timeout, emulated device) are synchronous, give no
//! ring descriptor, and still apply what they do to an IO submitted asynchronously.

use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;
use tiercache_io::conformance::{PROBE_FD, Probe};
use tiercache_io::{
    AlignedBuf, AsyncReq, Backend, EmuBackend, FaultBackend, FaultConfig, IoErr, OpKind,
    TimeoutBackend,
};

const BLOCKS: u64 = 4096;

/// Submits a 4 KiB write through `dev`'s asynchronous call and waits for its result.
fn async_write(dev: &dyn Backend) -> Result<(), IoErr> {
    let (tx, rx) = mpsc::channel();
    let mut buf = AlignedBuf::new(4096);
    buf.fill(0x5a);
    dev.submit_async(
        AsyncReq::Write {
            lba: 8,
            buf,
            fua: false,
        },
        Box::new(move |_, r| tx.send(r).unwrap()),
    );
    rx.recv_timeout(Duration::from_secs(10))
        .expect("done called")
}

fn has_hole(dev: &dyn Backend) -> bool {
    dev.extents(0, 64).unwrap().iter().any(|e| e.hole)
}

#[test]
fn box_and_arc_forward_every_capability() {
    let probe = Arc::new(Probe::new(BLOCKS));
    let boxed: Box<dyn Backend> = Box::new(probe.clone());
    for dev in [&boxed as &dyn Backend, &probe as &dyn Backend] {
        assert!(dev.inline() && dev.is_async() && has_hole(dev));
        assert_eq!(dev.ring_fd(), Some(PROBE_FD));
    }
    let before = Probe::get(&probe.async_calls);
    async_write(&*boxed).unwrap();
    assert_eq!(
        Probe::get(&probe.async_calls),
        before + 1,
        "async path reached"
    );
    boxed.prefetch(0, 8);
    assert_eq!(Probe::get(&probe.prefetches), 1);
    boxed.submit_batch(&mut []);
    assert_eq!(Probe::get(&probe.batches), 1);
}

#[test]
fn the_fault_wrapper_sees_every_io_and_its_faults_apply_to_asynchronous_ones() {
    let probe = Arc::new(Probe::new(BLOCKS));
    let f = FaultBackend::new(probe.clone(), FaultConfig::default());
    assert!(!f.is_async(), "an async IO would skip the fault gates");
    assert_eq!(f.ring_fd(), None, "a ring would skip the fault gates");
    f.set_error_rate(OpKind::Write, 1.0);
    assert!(matches!(async_write(&f), Err(IoErr::Injected { .. })));
    f.set_error_rate(OpKind::Write, 0.0);
    async_write(&f).unwrap();
    assert_eq!(Probe::get(&probe.async_calls), 0);
    assert!(
        Probe::get(&probe.sync_calls) >= 1,
        "the write that passed the gate"
    );
    assert_eq!(f.unflushed_blocks(), 8, "tracked for a power cut");
}

#[test]
fn the_timeout_wrapper_times_asynchronous_ios_too() {
    let probe = Arc::new(Probe::new(BLOCKS));
    let t = TimeoutBackend::new(probe.clone(), Duration::from_secs(5));
    assert!(!t.is_async() && t.ring_fd().is_none());
    async_write(&t).unwrap();
    assert_eq!(Probe::get(&probe.async_calls), 0);
    assert_eq!(Probe::get(&probe.sync_calls), 1, "ran under the timeout");
    assert!(has_hole(&t), "allocation queries reach the device");
}

#[test]
fn the_emulated_device_models_asynchronous_ios_too() {
    let probe = Arc::new(Probe::new(BLOCKS));
    let e = EmuBackend::with_preset(probe.clone(), "nvme-p4510").unwrap();
    assert!(!e.is_async() && e.ring_fd().is_none());
    async_write(&e).unwrap();
    assert_eq!(e.stats().ios, 1, "the model timed it");
    assert_eq!(Probe::get(&probe.async_calls), 0);
    assert!(has_hole(&e), "allocation queries reach the device");
}
