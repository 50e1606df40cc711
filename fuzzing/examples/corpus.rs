//! Writes a seed corpus for the cargo-fuzz targets: valid inputs from each target's
//! structure-aware generator, so libFuzzer starts from inputs that decode instead of from
//! nothing.
//!
//! ```text
//! cargo run -p tiercache-fuzzing --example corpus -- fuzz/corpus 500
//! ```
//!
//! writes `fuzz/corpus/<target>/seed-<n>` (default 200 per target).

use tiercache_fuzzing::TARGETS;
use tiercache_fuzzing::mutate::Rng;

fn main() {
    let mut args = std::env::args().skip(1);
    let dir = std::path::PathBuf::from(args.next().unwrap_or_else(|| "fuzz/corpus".into()));
    let n: u64 = match args.next().map(|s| s.parse()) {
        None => 200,
        Some(Ok(n)) => n,
        Some(Err(e)) => {
            eprintln!("corpus: the count is not a number: {e}");
            std::process::exit(1);
        }
    };
    for t in TARGETS {
        let d = dir.join(t.name);
        if let Err(e) = std::fs::create_dir_all(&d) {
            eprintln!("corpus: {}: {e}", d.display());
            std::process::exit(1);
        }
        let mut rng = Rng::new(0x636f_7270_7573);
        for i in 0..n {
            let s = (t.generate)(&mut rng);
            let p = d.join(format!("seed-{i}"));
            if let Err(e) = std::fs::write(&p, &s.bytes) {
                eprintln!("corpus: {}: {e}", p.display());
                std::process::exit(1);
            }
        }
        println!("{}: {n} inputs in {}", t.name, d.display());
    }
}
