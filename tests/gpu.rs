//! The CUDA backend on a real GPU, in one process: device facts, measured
//! ceilings, buffers and poison fills, dynamic shared memory opt-in, graph
//! capture, cold vs warm L2 timing, the module cache, and a deliberate
//! fault that must surface as "device lost". Skipped, with a message, where
//! no GPU can be opened; `MLABENCH_REQUIRE_GPU=1` turns the skip into a
//! failure (a GPU machine that lost its driver must not pass).
//!
//!   cargo test --release --test gpu -- --nocapture
//!
//! `MLABENCH_GPU_REPORT=FILE` also writes the checks as JSON.

#[cfg(not(feature = "cuda"))]
#[test]
fn cuda_backend_on_a_real_gpu() {
    eprintln!("skipped: built without the cuda feature");
}

#[cfg(feature = "cuda")]
#[test]
fn cuda_backend_on_a_real_gpu() {
    match smoke::run() {
        Ok(smoke::Outcome::Skipped(why)) => {
            assert!(
                std::env::var_os("MLABENCH_REQUIRE_GPU").is_none(),
                "MLABENCH_REQUIRE_GPU is set but no GPU opened: {why}"
            );
            eprintln!("skipped: no usable GPU ({why})");
        }
        Ok(smoke::Outcome::Ran(failed)) => assert!(failed.is_empty(), "failed GPU checks: {failed:?}"),
        Err(e) => panic!("{e:#}"),
    }
}

#[cfg(feature = "cuda")]
mod smoke {
    use anyhow::{Context, Result};
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;
    use std::path::PathBuf;
    use std::time::Instant;

    use mlabench::backend::cuda::{probe, CudaBackend, LaunchConfig, OpenOptions};
    use mlabench::backend::{BackendError, Sampling, TimingOptions};

    struct Check {
        name: &'static str,
        pass: bool,
        detail: String,
    }

    pub enum Outcome {
        Skipped(String),
        /// The names of the checks that failed.
        Ran(Vec<&'static str>),
    }

    pub fn run() -> Result<Outcome> {
        // cargo runs tests in the package root.
        let kernels = PathBuf::from("kernels");
        let out = std::env::var_os("MLABENCH_GPU_REPORT").map(PathBuf::from);

        let t0 = Instant::now();
        let opts = OpenOptions {
            measure_ceilings: true,
            measure_launch: true,
            ..OpenOptions::default()
        };
        let mut be = match CudaBackend::open_with(&kernels, &opts) {
            Ok(b) => b,
            Err(e) => {
                return Ok(Outcome::Skipped(
                    format!("{e:#}").lines().next().unwrap_or("").to_string(),
                ))
            }
        };
        let open_s = t0.elapsed().as_secs_f64();
        let report = be.report();
        for (k, v) in report.lines() {
            println!("{k:>26}: {v}");
        }
        println!("{:>26}: {open_s:.2} s (probe compile + ceilings)", "open");

        let mut checks = Vec::new();
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let mut check = |name: &'static str, r: Result<(bool, String)>| {
            let (pass, detail) = r.unwrap_or_else(|e| (false, format!("{e:#}")));
            checks.push(Check { name, pass, detail });
        };

        check("round trips u8/u16/i32/f32", round_trips(&be, &mut rng));
        check("poison fills", poison(&be));
        check("dynamic smem opt-in (200000 B)", smem(&be, &mut rng));
        check("graph capture + replay", graph(&be, &mut rng));
        let l2 = l2_timing(&be);
        check("cold vs warm L2 timing", l2);
        check("noise-aware stopping", noise_stop(&be));
        check("module cache", module_cache(&mut be));
        check("fault -> device lost", fault(&be));

        println!();
        println!("{:<34} {:<5} detail", "check", "ok");
        for c in &checks {
            println!(
                "{:<34} {:<5} {}",
                c.name,
                if c.pass { "PASS" } else { "FAIL" },
                c.detail
            );
        }
        if let Some(path) = out {
            let json = serde_json::json!({
                "report": report,
                "open_s": open_s,
                "checks": checks.iter().map(|c| serde_json::json!({"name": c.name, "pass": c.pass, "detail": c.detail})).collect::<Vec<_>>(),
            });
            std::fs::write(&path, serde_json::to_string_pretty(&json)?)
                .with_context(|| format!("writing {}", path.display()))?;
        }
        Ok(Outcome::Ran(
            checks.iter().filter(|c| !c.pass).map(|c| c.name).collect(),
        ))
    }

    fn round_trips(be: &CudaBackend, rng: &mut ChaCha8Rng) -> Result<(bool, String)> {
        let d = &be.dev;
        let a: Vec<u8> = (0..1001).map(|_| rng.gen()).collect();
        let b: Vec<u16> = (0..1001).map(|_| rng.gen()).collect();
        let c: Vec<i32> = (0..1001).map(|_| rng.gen()).collect();
        let f: Vec<f32> = (0..1001).map(|_| rng.gen_range(-1e3f32..1e3)).collect();
        let ok = d.download(&d.upload(&a)?)? == a
            && d.download(&d.upload(&b)?)? == b
            && d.download(&d.upload(&c)?)? == c
            && d.download(&d.upload(&f)?)? == f;
        Ok((ok, "1001 random elements each".into()))
    }

    fn poison(be: &CudaBackend) -> Result<(bool, String)> {
        let d = &be.dev;
        let mut f = d.upload(&vec![1.5f32; 4099])?;
        d.fill_u32(&mut f, 0x7fc0_0000)?;
        let f_ok = d.download(&f)?.iter().all(|x| x.to_bits() == 0x7fc0_0000);
        let mut h = d.upload(&vec![0x3f80u16; 4099])?;
        d.fill_u16(&mut h, 0x7fc0)?;
        let h_ok = d.download(&h)?.iter().all(|&x| x == 0x7fc0);
        let refused = d.fill_u32(&mut h, 0).is_err(); // 8198 bytes: not a multiple of 4
        let mut u = d.upload(&vec![0u8; 333])?;
        d.fill_u8(&mut u, 0xab)?;
        let u_ok = d.download(&u)?.iter().all(|&x| x == 0xab);
        Ok((
            f_ok && h_ok && refused && u_ok,
            format!("f32 NaN {f_ok}, bf16 NaN {h_ok}, odd fill_u32 refused {refused}, u8 {u_ok}"),
        ))
    }

    fn smem(be: &CudaBackend, rng: &mut ChaCha8Rng) -> Result<(bool, String)> {
        let d = &be.dev;
        let n: i32 = 50_000;
        let host: Vec<u32> = (0..n).map(|_| rng.gen()).collect();
        let want = host.iter().fold(0u32, |s, &x| s.wrapping_add(x));
        let input = d.upload(&host)?;
        let mut out = d.alloc_zeros::<u32>(1)?;
        let k = be.probe.smem_sum();
        let cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: (n * 4) as u32,
        };
        // SAFETY: mlab_smem_sum(const unsigned* in, unsigned* out, int n) with
        // n words of input, one of output and n * 4 bytes of dynamic smem.
        unsafe { d.launch(k).arg(&input).arg(&mut out).arg(&n).launch(cfg)? };
        let got = d.download(&out)?[0];
        let r = k.resources()?;
        Ok((
            got == want,
            format!(
                "sum {got:#x} want {want:#x}; {} regs, {} B local",
                r.registers, r.local_bytes
            ),
        ))
    }

    fn graph(be: &CudaBackend, rng: &mut ChaCha8Rng) -> Result<(bool, String)> {
        let d = &be.dev;
        let words = 1 << 18; // 1 MiB
        let host: Vec<u32> = (0..words).map(|_| rng.gen()).collect();
        let src = d.upload(&host)?;
        let mut dst = d.alloc_zeros::<u32>(words)?;
        let k = be.probe.copy();
        let n16 = (words / 4) as u64;
        let cfg = LaunchConfig {
            grid_dim: (264, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let g = d.capture(|| {
            // SAFETY: mlab_copy_u128(src, dst, n) with n 16-byte words in each buffer.
            unsafe { d.launch(k).arg(&src).arg(&mut dst).arg(&n16).launch(cfg) }
        })?;
        // Nothing ran during capture: dst is still zeros.
        let untouched = d.download(&dst)?.iter().all(|&x| x == 0);
        d.replay(&g)?;
        let copied = d.download(&dst)? == host;
        d.fill_u32(&mut dst, 0xffff_ffff)?;
        d.replay(&g)?;
        let again = d.download(&dst)? == host;
        Ok((
            untouched && copied && again,
            format!("untouched during capture {untouched}, replay 1 {copied}, replay 2 {again}"),
        ))
    }

    /// Medians (ms) of one region timed warm, cold (flushed) and per launch
    /// in a warm graph, with the sample counts.
    fn warm_cold_graph(
        be: &CudaBackend,
        mut launch: impl FnMut(usize) -> Result<(), BackendError>,
    ) -> Result<([f64; 3], [usize; 3])> {
        let base = TimingOptions {
            enabled: true,
            warmup: 3,
            min_samples: 20,
            min_time_ms: 5.0,
            target_noise: None,
            max_time_ms: 10_000.0,
            cold_l2: false,
            graph: false,
            sampling: Sampling::Auto,
        };
        let mut med = [0.0; 3];
        let mut n = [0; 3];
        let modes = [
            base.clone(),
            TimingOptions {
                cold_l2: true,
                ..base.clone()
            },
            TimingOptions { graph: true, ..base },
        ];
        for (i, o) in modes.iter().enumerate() {
            let r = be.time_region(o, || Ok(()), &mut launch)?;
            let mut s = r.ms.clone();
            s.sort_by(f64::total_cmp);
            med[i] = s[s.len() / 2];
            n[i] = s.len();
        }
        Ok((med, n))
    }

    /// A 16 MiB read and a 16 MiB copy, both small enough for the L2, timed
    /// warm and cold: the flush must make them slower, or it does not flush.
    fn l2_timing(be: &CudaBackend) -> Result<(bool, String)> {
        let d = &be.dev;
        let words = 4 << 20;
        let bytes = (words * 4) as f64;
        let src = d.alloc_zeros::<u32>(words)?;
        let mut dst = d.alloc_zeros::<u32>(words)?;
        let mut sink = d.alloc_zeros::<u32>(1)?;
        let n16 = (words / 4) as u64;
        let grid = d.props().sm_count as u32 * 8;
        let cfg = LaunchConfig {
            grid_dim: (grid, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let (read, kr) = (be.probe.l2_flush(), 1u32);
        let (rm, rn) = warm_cold_graph(be, |_| {
            // SAFETY: mlab_l2_flush(buf, n, magic, sink): src holds n 16-byte
            // words of zeros, so with magic 1 nothing is stored to sink.
            unsafe { d.launch(read).arg(&src).arg(&n16).arg(&kr).arg(&mut sink).launch(cfg) }
        })?;
        let copy = be.probe.copy();
        let (cm, cn) = warm_cold_graph(be, |_| {
            // SAFETY: mlab_copy_u128(src, dst, n), both buffers n 16-byte words.
            unsafe { d.launch(copy).arg(&src).arg(&mut dst).arg(&n16).launch(cfg) }
        })?;
        let gbps = |traffic: f64, ms: f64| traffic / (ms * 1e-3) / 1e9;
        let line = |name: &str, m: [f64; 3], n: [usize; 3], traffic: f64| {
            format!(
                "{name}: warm {:.2} us ({:.0} GB/s, n={}), cold {:.2} us ({:.0} GB/s, n={}), graph warm {:.2} us/launch (n={})",
                m[0] * 1e3,
                gbps(traffic, m[0]),
                n[0],
                m[1] * 1e3,
                gbps(traffic, m[1]),
                n[1],
                m[2] * 1e3,
                n[2]
            )
        };
        Ok((
            rm[1] > 1.15 * rm[0] && cm[1] > cm[0],
            format!(
                "{}; {}; flush {} MiB, queue-ahead {} us",
                line("16 MiB read", rm, rn, bytes),
                line("16 MiB copy", cm, cn, 2.0 * bytes),
                be.flush.bytes() >> 20,
                be.timer.queue_ahead_ns / 1000
            ),
        ))
    }

    /// A cold 16 MiB read timed to a 0.5% target: it must stop on the
    /// target (noise at or under it) well before the wall-clock cap, and a
    /// 1 ms cap with an unreachable target must stop at the cap with more
    /// than the minimum samples.
    fn noise_stop(be: &CudaBackend) -> Result<(bool, String)> {
        let d = &be.dev;
        let words = 4 << 20;
        let src = d.alloc_zeros::<u32>(words)?;
        let mut sink = d.alloc_zeros::<u32>(1)?;
        let n16 = (words / 4) as u64;
        let cfg = LaunchConfig {
            grid_dim: (d.props().sm_count as u32 * 8, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let (read, kr) = (be.probe.l2_flush(), 1u32);
        let mut launch = |_| {
            // SAFETY: mlab_l2_flush(buf, n, magic, sink): src holds n 16-byte
            // words of zeros, so with magic 1 nothing is stored to sink.
            unsafe { d.launch(read).arg(&src).arg(&n16).arg(&kr).arg(&mut sink).launch(cfg) }
        };
        let opts = TimingOptions {
            enabled: true,
            warmup: 3,
            min_samples: 10,
            min_time_ms: 0.0,
            target_noise: Some(0.005),
            max_time_ms: 5_000.0,
            cold_l2: true,
            graph: false,
            sampling: Sampling::Auto,
        };
        let t0 = std::time::Instant::now();
        let r = be.time_region(&opts, || Ok(()), &mut launch)?;
        let wall = t0.elapsed().as_secs_f64() * 1e3;
        let noise = mlabench::stats::median_noise(&r.ms);
        let capped_opts = TimingOptions {
            target_noise: Some(1e-9),
            max_time_ms: 1.0,
            ..opts
        };
        let c = be.time_region(&capped_opts, || Ok(()), &mut launch)?;
        Ok((
            noise <= 0.005 && wall < 2_000.0 && c.ms.len() >= 10 && c.ms.len() < 5_000,
            format!(
                "to 0.5%: n={} noise {:.3}% in {wall:.0} ms; capped at 1 ms: n={}",
                r.ms.len(),
                noise * 100.0,
                c.ms.len()
            ),
        ))
    }

    fn module_cache(be: &mut CudaBackend) -> Result<(bool, String)> {
        let a = be.module(&probe::spec())?;
        let b = be.module(&probe::spec())?;
        let notes = be.take_notes();
        Ok((std::sync::Arc::ptr_eq(&a, &b) && notes.len() == 1, notes.join("; ")))
    }

    fn fault(be: &CudaBackend) -> Result<(bool, String)> {
        let d = &be.dev;
        let cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (32, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: mlab_trap takes no parameters; it faults on purpose.
        let launched = unsafe { d.launch(be.probe.trap()).launch(cfg) };
        let first = launched.and_then(|_| d.sync());
        let second = d.alloc_zeros::<u32>(16).map(|_| ());
        let lost = |r: &Result<(), BackendError>| matches!(r, Err(BackendError::DeviceLost(_)));
        Ok((
            lost(&first) && lost(&second),
            format!("first: {first:?}; next call: {second:?}"),
        ))
    }
}
