//! How glibc's allocator treats the eager backend's activations.
//!
//! Every op allocates its output, and a model step frees most of them again before the next.
//! By default glibc serves an allocation above its mmap threshold (128 KiB at first, raised
//! to a freed block's size up to 32 MiB) with a fresh `mmap`, and hands a free top of the
//! heap above its trim threshold back to the system, so the next step takes the same pages
//! again as page faults, each one zero-filled by the kernel. For the benchmark's FLUX.1-shaped
//! step in a fresh process those faults were a fifth of the step (f32 40.8–43.1 → 32.3–33.2
//! ms with the thresholds below, bf16 21.6–21.9 → 19.8–20.0 ms; SmolLM2 decode unchanged
//! within noise), and peak RSS did not move: what is kept is what the previous step had in
//! use.
//!
//! So on first use the eager backend fixes the mmap threshold at 32 MiB (glibc's own ceiling
//! for the dynamic one: larger buffers, weights, still come from `mmap` and go back when
//! freed) and the trim threshold at 256 MiB. A process that sets either itself
//! (`glibc.malloc.mmap_threshold` or `glibc.malloc.trim_threshold` in `GLIBC_TUNABLES`,
//! `MALLOC_MMAP_THRESHOLD_`, `MALLOC_TRIM_THRESHOLD_`) keeps its own; an explicit
//! `malloc_trim` (as the loaders call after building a tokenizer) still returns every free
//! page. Other allocators and platforms are left alone.

/// Sets the thresholds once per process (see the module docs); cheap after the first call.
pub(crate) fn keep_freed_pages() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            if !user_tuned(|k| std::env::var(k).ok()) {
                set_thresholds();
            }
        });
    }
}

/// Hands the heap's free pages back to the system (glibc's `malloc_trim`; elsewhere a
/// no-op). Building a tokenizer from its JSON frees tens of MiB of small allocations that
/// the allocator would otherwise keep mapped beside the weights loaded next: for a 94 MiB
/// GGUF that is most of the gap between its file size and the process's peak.
pub fn release_freed_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        extern "C" {
            fn malloc_trim(pad: usize) -> std::ffi::c_int;
        }
        // SAFETY: malloc_trim only walks glibc's own arenas and takes no pointers.
        unsafe {
            malloc_trim(0);
        }
    }
}

/// Whether the process configured glibc's thresholds itself through its environment.
#[cfg_attr(not(all(target_os = "linux", target_env = "gnu")), allow(dead_code))]
fn user_tuned(var: impl Fn(&str) -> Option<String>) -> bool {
    let tunables = var("GLIBC_TUNABLES").unwrap_or_default();
    tunables.contains("glibc.malloc.mmap_threshold")
        || tunables.contains("glibc.malloc.trim_threshold")
        || var("MALLOC_MMAP_THRESHOLD_").is_some()
        || var("MALLOC_TRIM_THRESHOLD_").is_some()
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn set_thresholds() {
    use std::ffi::c_int;
    extern "C" {
        fn mallopt(param: c_int, value: c_int) -> c_int;
    }
    // <malloc.h>: M_TRIM_THRESHOLD = -1, M_MMAP_THRESHOLD = -3.
    const M_TRIM_THRESHOLD: c_int = -1;
    const M_MMAP_THRESHOLD: c_int = -3;
    // SAFETY: mallopt only changes the allocator's parameters, under its own lock; it takes
    // no pointers.
    unsafe {
        mallopt(M_MMAP_THRESHOLD, 32 << 20);
        mallopt(M_TRIM_THRESHOLD, 256 << 20);
    }
}

#[cfg(test)]
mod tests {
    use super::user_tuned;

    #[test]
    fn a_process_that_tunes_malloc_itself_keeps_its_settings() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(name, _)| *name == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert!(!user_tuned(env(&[])));
        assert!(!user_tuned(env(&[(
            "GLIBC_TUNABLES",
            "glibc.cpu.hwcaps=-AVX2"
        )])));
        assert!(user_tuned(env(&[(
            "GLIBC_TUNABLES",
            "glibc.cpu.x86_rep_movsb_threshold=1:glibc.malloc.trim_threshold=0"
        )])));
        assert!(user_tuned(env(&[(
            "GLIBC_TUNABLES",
            "glibc.malloc.mmap_threshold=131072"
        )])));
        assert!(user_tuned(env(&[("MALLOC_MMAP_THRESHOLD_", "131072")])));
        assert!(user_tuned(env(&[("MALLOC_TRIM_THRESHOLD_", "0")])));
    }
}
