//! What this CPU runs, detected once, and the caps on it: `ZOO_CPU` for the process, and
//! [`with_tier`] for one thread (and the pool work it hands out), so that the code of every
//! tier below the machine's is tested on the machine too.
//!
//! Every fast path asks here, never `is_x86_feature_detected!` itself: a kernel reachable at a
//! tier may use exactly the instructions that tier names, and a cap lowers what every kernel
//! sees at once.

use std::cell::Cell;
use std::fmt;
use std::sync::OnceLock;

/// A CPU tier: a set of instructions the fast paths are written for. Each includes the ones
/// below it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Tier {
    /// No vector kernels of zoo's own: candle's (and its GEMM library's) paths.
    Generic,
    /// x86-64 with AVX2, FMA and F16C (Haswell, AMD Zen 1 on).
    Avx2,
    /// AVX-512 F, BW and VL besides (Skylake-SP, Ice Lake, AMD Zen 4 on).
    Avx512,
    /// AMX tiles (AMX-TILE, AMX-BF16) besides, granted to the process by Linux (Sapphire
    /// Rapids on).
    Amx,
}

impl Tier {
    /// Every tier, lowest first.
    pub const ALL: [Tier; 4] = [Tier::Generic, Tier::Avx2, Tier::Avx512, Tier::Amx];

    /// The name `ZOO_CPU` takes.
    pub fn name(self) -> &'static str {
        match self {
            Tier::Generic => "generic",
            Tier::Avx2 => "avx2",
            Tier::Avx512 => "avx512",
            Tier::Amx => "amx",
        }
    }

    /// The tier named `name` (as `ZOO_CPU` takes it), or `None`.
    pub fn parse(name: &str) -> Option<Tier> {
        Tier::ALL.into_iter().find(|t| t.name() == name)
    }
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A `ZOO_CPU` (or `ZOO_NO_AMX`) value zoo does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("ZOO_CPU={value:?} is not a CPU tier: use one of generic, avx2, avx512, amx (or unset it to use everything this CPU has, {detected})")]
pub struct TierError {
    pub value: String,
    pub detected: Tier,
}

struct Detected {
    /// The most this CPU runs.
    hardware: Tier,
    /// `hardware` capped by the environment: what runs when no thread cap is set.
    ceiling: Tier,
    /// AVX-512 BF16 (`vdpbf16ps`), within the AVX-512 tier.
    avx512_bf16: bool,
    env_error: Option<TierError>,
}

fn detected() -> &'static Detected {
    static DETECTED: OnceLock<Detected> = OnceLock::new();
    DETECTED.get_or_init(|| {
        let mut env_error = None;
        let mut cap = Tier::Amx;
        if std::env::var("ZOO_NO_AMX").is_ok_and(|v| v == "1") {
            cap = Tier::Avx512;
        }
        if let Ok(value) = std::env::var("ZOO_CPU") {
            match Tier::parse(value.trim().to_ascii_lowercase().as_str()) {
                Some(t) => cap = cap.min(t),
                None => {
                    // An unknown name runs nothing of zoo's own (the slowest, surely supported
                    // paths); `tier()` reports it, so that programs refuse it at start.
                    cap = Tier::Generic;
                    env_error = Some(TierError {
                        value,
                        detected: Tier::Generic,
                    });
                }
            }
        }
        let (hardware, avx512_bf16) = probe(cap);
        if let Some(e) = env_error.as_mut() {
            e.detected = hardware;
        }
        Detected {
            hardware,
            ceiling: hardware.min(cap),
            avx512_bf16,
            env_error,
        }
    })
}

/// The CPU's tier and whether it has AVX-512 BF16. The tile state is asked for only where
/// `cap` allows AMX: the grant is a process-wide change.
fn probe(cap: Tier) -> (Tier, bool) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        if !(has!("avx2") && has!("fma") && has!("f16c")) {
            return (Tier::Generic, false);
        }
        if !(has!("avx512f") && has!("avx512bw") && has!("avx512vl")) {
            return (Tier::Avx2, false);
        }
        let bf16 = has!("avx512bf16");
        // Below a cap of amx the CPU's AMX is reported but the tile state not asked for.
        if !amx_present() || (cap == Tier::Amx && !tile_state_granted()) {
            return (Tier::Avx512, bf16);
        }
        (Tier::Amx, bf16)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = cap;
        (Tier::Generic, false)
    }
}

/// The CPU has AMX-TILE and AMX-BF16.
#[cfg(target_arch = "x86_64")]
fn amx_present() -> bool {
    // CPUID.(EAX=7,ECX=0):EDX bit 22 = AMX-BF16, bit 24 = AMX-TILE.
    let edx = std::arch::x86_64::__cpuid_count(7, 0).edx;
    edx & (1 << 22) != 0 && edx & (1 << 24) != 0
}

/// Asks Linux for the tile data state (`arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA)`), which a
/// process must hold before its first tile instruction; false where it refuses.
#[cfg(target_arch = "x86_64")]
fn tile_state_granted() -> bool {
    #[cfg(target_os = "linux")]
    {
        const SYS_ARCH_PRCTL: i64 = 158;
        const ARCH_REQ_XCOMP_PERM: i64 = 0x1023;
        const XFEATURE_XTILEDATA: i64 = 18;
        let ret: i64;
        // SAFETY: arch_prctl with these arguments only changes the process's permitted xsave
        // features; the syscall clobbers rcx and r11 and returns in rax.
        unsafe {
            std::arch::asm!(
                "syscall",
                inlateout("rax") SYS_ARCH_PRCTL => ret,
                in("rdi") ARCH_REQ_XCOMP_PERM,
                in("rsi") XFEATURE_XTILEDATA,
                lateout("rcx") _,
                lateout("r11") _,
                options(nostack),
            );
        }
        ret == 0
    }
    #[cfg(not(target_os = "linux"))]
    {
        false
    }
}

thread_local! {
    /// This thread's cap, set by [`with_tier`] (and carried onto pool threads by `par_units`).
    static CAP: Cell<Option<Tier>> = const { Cell::new(None) };
}

/// The tier the fast paths run at on this thread: the CPU's, capped by `ZOO_CPU` and by
/// [`with_tier`]. Errs when `ZOO_CPU` names no tier; the kernels then run the generic tier.
pub fn tier() -> Result<Tier, TierError> {
    match &detected().env_error {
        Some(e) => Err(e.clone()),
        None => Ok(active()),
    }
}

/// The most this CPU runs, whatever the caps.
pub fn hardware_tier() -> Tier {
    detected().hardware
}

/// The tiers this process can run, lowest first: every tier up to the CPU's capped by
/// `ZOO_CPU`.
pub fn tiers() -> Vec<Tier> {
    let top = detected().ceiling;
    Tier::ALL.into_iter().filter(|t| *t <= top).collect()
}

/// Runs `f` with the fast paths of this thread, and of the pool work it hands out, capped at
/// `tier` (a cap above the process's changes nothing). What tests and benchmarks use to run
/// the lower tiers' code on a CPU that has more.
pub fn with_tier<R>(tier: Tier, f: impl FnOnce() -> R) -> R {
    let _restore = Restore(CAP.with(|c| c.replace(Some(tier))));
    f()
}

/// Runs `f(tier)` under each tier of [`tiers`], lowest first.
pub fn each_tier(mut f: impl FnMut(Tier)) {
    for t in tiers() {
        with_tier(t, || f(t));
    }
}

/// Puts a thread's previous cap back, also when the closure panics.
struct Restore(Option<Tier>);
impl Drop for Restore {
    fn drop(&mut self) {
        CAP.with(|c| c.set(self.0));
    }
}

/// This thread's cap, for a pool to carry onto the threads that run its work.
pub(crate) fn thread_cap() -> Option<Tier> {
    CAP.with(|c| c.get())
}

/// Runs `f` under `cap` as this thread's cap (a pool thread running another thread's work).
pub(crate) fn under_cap<R>(cap: Option<Tier>, f: impl FnOnce() -> R) -> R {
    let _restore = Restore(CAP.with(|c| c.replace(cap)));
    f()
}

/// The tier in force on this thread.
pub(crate) fn active() -> Tier {
    let ceiling = detected().ceiling;
    match thread_cap() {
        Some(cap) => ceiling.min(cap),
        None => ceiling,
    }
}

/// AVX2, FMA and F16C may run.
pub(crate) fn avx2() -> bool {
    active() >= Tier::Avx2
}

/// AVX-512 F, BW and VL (and everything AVX2 has) may run.
pub(crate) fn avx512() -> bool {
    active() >= Tier::Avx512
}

/// AVX-512 BF16 may run.
pub(crate) fn avx512_bf16() -> bool {
    avx512() && detected().avx512_bf16
}

/// AMX tiles may run (the process holds the tile state).
pub(crate) fn amx() -> bool {
    active() >= Tier::Amx
}

/// `got`, asserting that a fast path answered (`Some`) exactly where the tier in force runs
/// it: what a kernel test checks before comparing the path's values.
#[cfg(test)]
pub(crate) fn taken<T>(got: Option<T>, runs: bool, what: &str) -> Option<T> {
    assert_eq!(
        got.is_some(),
        runs,
        "{what} at the {} tier: the fast path should {}",
        active(),
        if runs { "run" } else { "decline" }
    );
    got
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_lower_the_tier_on_this_thread_and_its_pool_work() {
        let top = *tiers().last().unwrap();
        assert_eq!(active(), top);
        for t in tiers() {
            with_tier(t, || {
                assert_eq!(active(), t);
                assert_eq!(avx2(), t >= Tier::Avx2);
                assert_eq!(avx512(), t >= Tier::Avx512);
                assert_eq!(amx(), t >= Tier::Amx);
                // Pool threads see the caller's cap.
                let seen = std::sync::Mutex::new(Vec::new());
                crate::cpu::kernels::par_units(64, |_| seen.lock().unwrap().push(active()));
                assert!(seen.into_inner().unwrap().iter().all(|s| *s == t));
            });
        }
        // A cap above the process's changes nothing, and each cap ends with its closure.
        with_tier(Tier::Amx, || assert_eq!(active(), top));
        assert_eq!(active(), top);
        assert!(!avx512_bf16() || avx512());
    }

    #[test]
    fn tier_names_round_trip() {
        for t in Tier::ALL {
            assert_eq!(Tier::parse(t.name()), Some(t));
        }
        assert_eq!(Tier::parse("sse"), None);
        let e = TierError {
            value: "sse".into(),
            detected: Tier::Avx2,
        };
        assert!(e.to_string().contains("generic, avx2, avx512, amx"), "{e}");
    }
}
