//! Instruction-set levels with kernels, detected at run time, on x86-64
//! (`avx2`, `avx512`) and aarch64 (`neon`, `dotprod`, `i8mm`), and the
//! `ONEBIT_ISA` override that forces one of them (or `scalar`).
//!
//! Every SIMD user in the crate (the quantized dot products, attention, the
//! elementwise ops) takes its level from [`Isa::best`], capped at the highest
//! level it has code for, so one `ONEBIT_ISA` forces them all.
//!
//! A build has the levels of its target architecture only (the variants are
//! `cfg`-gated), ordered: each includes the one before.

use std::sync::OnceLock;

/// An instruction-set level with kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Isa {
    /// The scalar reference, everywhere.
    Scalar,
    /// x86-64: AVX2 + FMA + F16C.
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// x86-64: AVX2 plus AVX-512 F/BW/VL/VNNI.
    #[cfg(target_arch = "x86_64")]
    Avx512,
    /// aarch64: base Advanced SIMD (every aarch64 CPU has it).
    #[cfg(target_arch = "aarch64")]
    Neon,
    /// aarch64: NEON plus the `sdot`/`udot` dot-product instructions (FEAT_DotProd).
    #[cfg(target_arch = "aarch64")]
    Dotprod,
    /// aarch64: dotprod plus the `smmla`/`usmmla` 8-bit matrix multiplies (FEAT_I8MM).
    #[cfg(target_arch = "aarch64")]
    I8mm,
}

impl Isa {
    /// Every level of this build's architecture, scalar first.
    pub fn all() -> &'static [Isa] {
        #[cfg(target_arch = "x86_64")]
        {
            &[Isa::Scalar, Isa::Avx2, Isa::Avx512]
        }
        #[cfg(target_arch = "aarch64")]
        {
            &[Isa::Scalar, Isa::Neon, Isa::Dotprod, Isa::I8mm]
        }
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        {
            &[Isa::Scalar]
        }
    }

    /// The name `ONEBIT_ISA` takes for this level.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => "avx2",
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => "avx512",
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => "neon",
            #[cfg(target_arch = "aarch64")]
            Isa::Dotprod => "dotprod",
            #[cfg(target_arch = "aarch64")]
            Isa::I8mm => "i8mm",
        }
    }

    /// Whether this CPU can run the level.
    pub fn supported(self) -> bool {
        match self {
            Isa::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                is_x86_feature_detected!("avx2")
                    && is_x86_feature_detected!("fma")
                    && is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => {
                Isa::Avx2.supported()
                    && is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vl")
                    && is_x86_feature_detected!("avx512vnni")
            }
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => std::arch::is_aarch64_feature_detected!("neon"),
            #[cfg(target_arch = "aarch64")]
            Isa::Dotprod => {
                Isa::Neon.supported() && std::arch::is_aarch64_feature_detected!("dotprod")
            }
            #[cfg(target_arch = "aarch64")]
            Isa::I8mm => {
                Isa::Dotprod.supported() && std::arch::is_aarch64_feature_detected!("i8mm")
            }
        }
    }

    /// Every level this CPU supports, scalar first.
    pub fn available() -> Vec<Isa> {
        Isa::all()
            .iter()
            .copied()
            .filter(|i| i.supported())
            .collect()
    }

    /// The levels of this architecture this CPU cannot run.
    pub fn unavailable() -> Vec<Isa> {
        Isa::all()
            .iter()
            .copied()
            .filter(|i| !i.supported())
            .collect()
    }

    /// One line naming the levels a test runs on this CPU and those it
    /// cannot, e.g. `levels run: scalar avx2; not on this CPU: avx512`.
    pub fn levels_line() -> String {
        let names = |v: Vec<Isa>| {
            if v.is_empty() {
                "-".to_string()
            } else {
                v.iter().map(|i| i.name()).collect::<Vec<_>>().join(" ")
            }
        };
        format!(
            "levels run: {}; not on this CPU: {}",
            names(Isa::available()),
            names(Isa::unavailable())
        )
    }

    /// Whether the CPU's vendor is Intel (CPUID leaf 0 names
    /// "GenuineIntel"). Kernel choices that measured differently on Intel
    /// and AMD cores consult it (see `matmul::wide_from`); it never changes
    /// a result, only which bit-identical kernel computes it. Detected once.
    pub fn intel() -> bool {
        static INTEL: OnceLock<bool> = OnceLock::new();
        *INTEL.get_or_init(|| {
            #[cfg(target_arch = "x86_64")]
            {
                let r = std::arch::x86_64::__cpuid(0);
                let mut v = [0u8; 12];
                v[..4].copy_from_slice(&r.ebx.to_le_bytes());
                v[4..8].copy_from_slice(&r.edx.to_le_bytes());
                v[8..].copy_from_slice(&r.ecx.to_le_bytes());
                &v == b"GenuineIntel"
            }
            #[cfg(not(target_arch = "x86_64"))]
            {
                false
            }
        })
    }

    /// The best supported level, or the one `ONEBIT_ISA` names (scalar,
    /// avx2, avx512, neon, dotprod, i8mm) when this CPU supports it; a name
    /// this CPU cannot run, or does not know, is reported on stderr and the
    /// best level used instead. Detected once.
    pub fn best() -> Isa {
        static BEST: OnceLock<Isa> = OnceLock::new();
        *BEST.get_or_init(|| {
            let best = *Isa::available().last().expect("scalar is always available");
            let Ok(want) = std::env::var("ONEBIT_ISA") else {
                return best;
            };
            match Isa::all().iter().find(|i| i.name() == want) {
                Some(&i) if i.supported() => i,
                found => {
                    let why = if found.is_some() {
                        "not supported by this CPU"
                    } else {
                        "not a level of this architecture"
                    };
                    eprintln!("ONEBIT_ISA={want}: {why}; using {}", best.name());
                    best
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::Isa;

    /// Set in the child processes of `onebit_isa_forces_every_simd_user`.
    const CHILD: &str = "ONEBIT_ISA_TEST_CHILD";

    /// `ONEBIT_ISA=<level>` forces every SIMD user: this test re-runs itself
    /// in a child process per level this CPU supports, with the variable
    /// set, and the child checks that the quant kernels, attention and the
    /// elementwise ops all run at that level or (when they have no code for
    /// it) the highest below it.
    #[test]
    fn onebit_isa_forces_every_simd_user() {
        if let Ok(want) = std::env::var(CHILD) {
            let best = Isa::best();
            assert_eq!(best.name(), want, "Isa::best() under ONEBIT_ISA={want}");
            for (who, got) in [
                ("attention", crate::attention::level()),
                ("ops", crate::ops::level()),
            ] {
                assert!(got <= best, "{who} runs {got:?} under ONEBIT_ISA={want}");
                if best == Isa::Scalar {
                    assert_eq!(got, Isa::Scalar, "{who} under ONEBIT_ISA=scalar");
                }
                #[cfg(target_arch = "x86_64")]
                if best >= Isa::Avx2 {
                    assert!(
                        got >= Isa::Avx2,
                        "{who} runs {got:?} under ONEBIT_ISA={want}"
                    );
                }
            }
            return;
        }
        let exe = std::env::current_exe().expect("the test binary's path");
        for isa in Isa::available() {
            let out = std::process::Command::new(&exe)
                .args(["isa::tests::onebit_isa_forces_every_simd_user", "--exact"])
                .args(["--nocapture", "--test-threads=1"])
                .env("ONEBIT_ISA", isa.name())
                .env(CHILD, isa.name())
                .output()
                .expect("run the test binary again");
            assert!(
                out.status.success() && String::from_utf8_lossy(&out.stdout).contains("1 passed"),
                "ONEBIT_ISA={}: {}{}",
                isa.name(),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        eprintln!("ONEBIT_ISA forcing: {}", Isa::levels_line());
    }
}
