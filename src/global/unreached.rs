//! A process that asked for statistics or a trace, used CUDA, and never called into cachealloc.
//!
//! The exit report and the recording begin at the first call that reaches the library, so a
//! program whose CUDA calls never do — its runtime linked statically (nvcc's default,
//! `-cudart static`), or its memory taken through the driver API (`cuMemAlloc`) or
//! `cudaMallocAsync` — ended with nothing printed and no file written, as if cachealloc were not
//! there. At exit such a process now says why it has no report, when the report or a trace was
//! asked for (`stats` or `trace` set) and the process did use CUDA: the driver `libcuda.so.1`,
//! which every CUDA runtime loads at its first call, is mapped. A process that never used CUDA
//! (a shell, a launcher, a data-loader worker) says nothing, as before.
//!
//! The handler is registered when the library is loaded (a constructor), since no call of the
//! program may ever reach the library; at load it only registers it. At exit it does nothing
//! once the mode was decided (a call reached the library: `exit_stats` reports), nor in a child
//! that stepped aside (`fork`); otherwise it reads the settings and `/proc/self/maps`.

use super::{fork, init, raw_stderr};
use crate::config::{Config, StatsOutput};

/// What the process has mapped of CUDA's libraries.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct CudaLibraries {
    /// The driver, `libcuda.so.1`: loaded by any CUDA runtime, shared or static, at its first
    /// call.
    driver: bool,
    /// A shared runtime, `libcudart.so.*`, whose calls the library interposes.
    shared_runtime: bool,
}

impl CudaLibraries {
    /// The libraries named in `maps`, the text of `/proc/self/maps`.
    fn in_maps(maps: &str) -> Self {
        let mut found = Self::default();
        for line in maps.lines() {
            // The path is the sixth field; anonymous mappings have none.
            let Some(path) = line.split_whitespace().nth(5) else {
                continue;
            };
            let name = path.rsplit('/').next().unwrap_or(path);
            found.driver |= name.starts_with("libcuda.so");
            found.shared_runtime |= name.starts_with("libcudart.so");
        }
        found
    }
}

/// The notice for a process that used CUDA (`cuda.driver`) under `config`, which asks for a
/// report or a trace, without any call reaching the library; `None` when nothing is to be said.
fn notice(config: &Config, cuda: CudaLibraries) -> Option<String> {
    let asked = match (config.stats != StatsOutput::Off, config.trace.is_some()) {
        _ if config.disabled || !cuda.driver => return None,
        (false, false) => return None,
        (true, false) => "statistics at exit",
        (false, true) => "a trace",
        (true, true) => "statistics at exit and a trace",
    };
    let why = if cuda.shared_runtime {
        "it loaded the CUDA driver and the shared runtime (libcudart.so) but made none of the \
         calls cachealloc interposes (cudaMalloc, cudaFree, cudaMemGetInfo, …): its memory came \
         from cudaMallocAsync, the driver API (cuMemAlloc), a runtime linked statically into one \
         of its libraries, or a cudaMalloc looked up by handle (dlsym, ctypes), none of which \
         cachealloc sees"
    } else {
        "it used CUDA (the driver libcuda.so.1 is loaded) without the shared runtime \
         libcudart.so: its runtime is linked statically (nvcc's default; build with -cudart \
         shared to use cachealloc) or it calls the driver API (cuMemAlloc), neither of which \
         cachealloc can intercept"
    };
    Some(format!(
        "cachealloc: {} asks for {asked}, but no CUDA call reached cachealloc in this process: \
         {why}.\n",
        config.source.name()
    ))
}

extern "C" fn at_exit() {
    // Nothing may unwind into libc's exit.
    let _ = std::panic::catch_unwind(say_if_unreached);
}

fn say_if_unreached() {
    if init::decided() || fork::in_forked_child() {
        return;
    }
    let Ok(config) = Config::from_env() else {
        // An invalid configuration is reported at the first call, which never came.
        return;
    };
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return;
    };
    if let Some(text) = notice(&config, CudaLibraries::in_maps(&maps)) {
        raw_stderr::write(&text);
    }
}

/// Register the exit handler when the library is loaded. Only libc is called: the Rust runtime
/// may not be set up yet.
// SAFETY (of running before main): the function calls `atexit`, which needs nothing the Rust
// runtime sets up.
#[ctor::ctor(unsafe)]
fn watch_exit() {
    // SAFETY: `at_exit` is an `extern "C" fn()` that lives as long as the library (a preloaded
    // or linked library is never unloaded before exit handlers run; glibc runs a dlopen'ed
    // one's handlers when it is closed). A failed registration only loses the notice.
    let _ = unsafe { libc::atexit(at_exit) };
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATIC_MAPS: &str = "\
55d0c0a00000-55d0c0a01000 r--p 00000000 08:01 123 /home/u/prog
7f1c2a000000-7f1c2a100000 r-xp 00000000 08:01 456 /usr/lib/x86_64-linux-gnu/libcuda.so.560.35.03
7f1c2b000000-7f1c2b021000 rw-p 00000000 00:00 0
7ffd1a000000-7ffd1a021000 rw-p 00000000 00:00 0 [stack]
";

    fn config(conf: &str) -> Config {
        Config::from_lookup(|name| (name == "CACHEALLOC_CONF").then(|| conf.to_string())).unwrap()
    }

    #[test]
    fn the_maps_tell_the_driver_and_the_shared_runtime() {
        assert_eq!(
            CudaLibraries::in_maps(STATIC_MAPS),
            CudaLibraries {
                driver: true,
                shared_runtime: false
            }
        );
        let shared = format!("{STATIC_MAPS}7f00-7f01 r-xp 0 08:01 9 /opt/cuda/libcudart.so.12\n");
        assert_eq!(
            CudaLibraries::in_maps(&shared),
            CudaLibraries {
                driver: true,
                shared_runtime: true
            }
        );
        // A path that only mentions the names elsewhere is not the library.
        let other = "7f00-7f01 r-xp 0 08:01 9 /data/libcuda.so.1-notes/x.so\n";
        assert_eq!(CudaLibraries::in_maps(other), CudaLibraries::default());
    }

    /// Said only where a report or trace was asked for and CUDA was used; the reason follows
    /// from the runtime being shared or not.
    #[test]
    fn the_notice_is_given_only_where_it_explains_a_missing_report() {
        let static_runtime = CudaLibraries {
            driver: true,
            shared_runtime: false,
        };
        let shared_runtime = CudaLibraries {
            driver: true,
            shared_runtime: true,
        };
        let text = notice(&config("stats:text"), static_runtime).unwrap();
        assert!(
            text.starts_with(
                "cachealloc: CACHEALLOC_CONF asks for statistics at exit, but no CUDA call \
                 reached cachealloc in this process: "
            ),
            "{text}"
        );
        assert!(text.contains("build with -cudart shared"), "{text}");
        let text = notice(&config("trace:/tmp/t.jsonl"), shared_runtime).unwrap();
        assert!(text.contains("asks for a trace"), "{text}");
        assert!(text.contains("cudaMallocAsync"), "{text}");
        let text = notice(&config("stats:json,trace:/tmp/t.jsonl"), static_runtime).unwrap();
        assert!(text.contains("statistics at exit and a trace"), "{text}");
        assert_eq!(
            notice(&config("max_split_size_mb:128"), static_runtime),
            None
        );
        assert_eq!(
            notice(&config("stats:text"), CudaLibraries::default()),
            None
        );
        let disabled = Config::from_lookup(|name| match name {
            "CACHEALLOC_CONF" => Some("stats:text".into()),
            "CACHEALLOC_DISABLE" => Some("1".into()),
            _ => None,
        })
        .unwrap();
        assert_eq!(notice(&disabled, static_runtime), None);
    }
}
