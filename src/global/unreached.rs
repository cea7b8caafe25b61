//! A process that asked for statistics or a trace, used CUDA, and never called into cachealloc.
//!
//! The exit report and the recording begin at the first call that reaches the library, so a
//! program whose CUDA calls never do — its runtime linked statically (nvcc's default,
//! `-cudart static`), or its memory taken through the driver API (`cuMemAlloc`) or
//! `cudaMallocAsync` — ended with nothing printed and no file written, as if cachealloc were not
//! there. At exit such a process now says why it has no report, when the report or a trace was
//! asked for (`stats` or `trace` set) and the process did use CUDA: the driver `libcuda.so.1`,
//! which every CUDA runtime loads at its first call, is mapped. A process that never used CUDA
//! (a shell, a launcher, a data-loader worker) says nothing, as before. One that only asked the
//! runtime about its devices (`torch.cuda.is_available()`) did load the driver and is told too,
//! in words that do not claim it allocated anything; so is a child it forked that ends with
//! `exit`, which inherits the mapped driver.
//!
//! A library loaded with `dlopen` rather than preloaded (PyTorch's `CUDAPluggableAllocator`)
//! interposes nothing: the program's `cudaMalloc` goes to the runtime, and only calls of the
//! library's own functions reach it. There the notice says that none was made, not that the
//! program's memory came from calls cachealloc cannot see.
//!
//! The handler is registered when the library is loaded (a constructor), since no call of the
//! program may ever reach the library; at load it only registers it. At exit it does nothing
//! once a call reached the library (its mode decided or being decided: `exit_stats` reports),
//! nor in a child that stepped aside (`fork`); otherwise it reads the settings, and only where
//! they ask for a report or a trace, `/proc/self/maps`.

use super::{fork, init, raw_stderr};
use crate::backend::cuda::runtime::program_calls_reach_here;
use crate::config::{Config, StatsOutput};

/// What the process has mapped of CUDA's libraries.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct CudaLibraries {
    /// The driver, `libcuda.so.1`: loaded by any CUDA runtime, shared or static, at its first
    /// call.
    driver: bool,
    /// A shared runtime, `libcudart.so.*` (or a wheel's renamed copy, `libcudart-1a2b3c4d.so.*`),
    /// whose calls the library interposes.
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
            found.shared_runtime |= name.starts_with("libcudart") && name.contains(".so");
        }
        found
    }
}

/// How the library was loaded into the process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Loaded {
    /// Preloaded or linked: the program's `cudaMalloc` and the other interposed calls come here.
    Interposing,
    /// With `dlopen` (`RTLD_LOCAL`, as PyTorch's pluggable allocator loads it): only calls of the
    /// library's own functions come here.
    Opened,
}

/// Whether `config` asks for something that only a call reaching the library gives: what it
/// asks for, in words.
fn asked(config: &Config) -> Option<&'static str> {
    if config.disabled {
        return None;
    }
    match (config.stats != StatsOutput::Off, config.trace.is_some()) {
        (false, false) => None,
        (true, false) => Some("statistics at exit"),
        (false, true) => Some("a trace"),
        (true, true) => Some("statistics at exit and a trace"),
    }
}

/// The notice for a process that used CUDA (`cuda.driver`) under `config`, which asks for a
/// report or a trace, without any call reaching the library, `loaded` as it was; `None` when
/// nothing is to be said.
fn notice(config: &Config, cuda: CudaLibraries, loaded: Loaded) -> Option<String> {
    let asked = asked(config)?;
    if !cuda.driver {
        return None;
    }
    let why = match (loaded, cuda.shared_runtime) {
        (Loaded::Opened, _) => {
            "the program's cudaMalloc does not come to cachealloc (loaded with dlopen, as \
             PyTorch's CUDAPluggableAllocator loads it, rather than preloaded), only calls of \
             its own functions (cachealloc_torch_malloc, cachealloc_malloc, …) do, and none was \
             made: PyTorch makes them once the allocator is installed with \
             torch.cuda.memory.change_current_allocator"
        }
        (Loaded::Interposing, true) => {
            "it loaded the CUDA driver and the shared runtime (libcudart.so) but made none of \
             the calls cachealloc serves (cudaMalloc, cudaFree, cudaMemGetInfo, …): any device \
             memory it used came from cudaMallocAsync, the driver API (cuMemAlloc), a runtime \
             linked statically into one of its libraries, or a cudaMalloc looked up by handle \
             (dlsym, ctypes), none of which cachealloc sees"
        }
        (Loaded::Interposing, false) => {
            "it used CUDA (the driver libcuda.so.1 is loaded) without the shared runtime \
             libcudart.so: its runtime is linked statically (nvcc's default; build with -cudart \
             shared to use cachealloc) or it calls the driver API (cuMemAlloc), neither of \
             which cachealloc can intercept"
        }
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

/// The variables the settings are read from (`ConfigSource::PRECEDENCE`), as C strings.
const SETTINGS_VARIABLES: [&std::ffi::CStr; 3] = [
    c"CACHEALLOC_CONF",
    c"PYTORCH_CUDA_ALLOC_CONF",
    c"PYTORCH_ALLOC_CONF",
];

/// Whether any variable the settings are read from is set, asked without allocating: in most
/// processes none is, and the handler then returns before anything allocates (an `exit` made
/// from a signal handler stays as safe as it is without the library).
fn any_settings_variable() -> bool {
    SETTINGS_VARIABLES.iter().any(|name| {
        // SAFETY: `name` is NUL-terminated; `getenv` only reads it and the environment, and the
        // pointer it returns is only compared with null.
        !unsafe { libc::getenv(name.as_ptr()) }.is_null()
    })
}

fn say_if_unreached() {
    if init::reached() || fork::in_forked_child() || !any_settings_variable() {
        return;
    }
    let Ok(config) = Config::from_env() else {
        // An invalid configuration is reported at the first call, which never came.
        return;
    };
    // The maps are read only where the notice may be due: not in every process of a session
    // whose settings ask for no report.
    if asked(&config).is_none() {
        return;
    }
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return;
    };
    let loaded = if program_calls_reach_here(c"cudaMalloc") {
        Loaded::Interposing
    } else {
        Loaded::Opened
    };
    if let Some(text) = notice(&config, CudaLibraries::in_maps(&maps), loaded) {
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
    use crate::config::ConfigSource;

    #[test]
    fn the_variables_asked_first_are_those_the_settings_are_read_from() {
        let names: Vec<&str> = SETTINGS_VARIABLES
            .iter()
            .map(|name| name.to_str().unwrap())
            .collect();
        let sources: Vec<&str> = ConfigSource::PRECEDENCE.iter().map(|s| s.name()).collect();
        assert_eq!(names, sources);
    }

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

    /// A wheel's renamed copy of the runtime (auditwheel's `libcudart-<hash>.so.*`) is a shared
    /// runtime too.
    #[test]
    fn a_renamed_shared_runtime_is_one() {
        let maps =
            format!("{STATIC_MAPS}7f00-7f01 r-xp 0 08:01 9 /torch/lib/libcudart-9335f6a2.so.12\n");
        assert!(CudaLibraries::in_maps(&maps).shared_runtime);
    }

    /// Said only where a report or trace was asked for and CUDA was used; the reason follows
    /// from the runtime being shared or not, and from the library being preloaded or opened.
    #[test]
    fn the_notice_is_given_only_where_it_explains_a_missing_report() {
        use Loaded::{Interposing, Opened};
        let static_runtime = CudaLibraries {
            driver: true,
            shared_runtime: false,
        };
        let shared_runtime = CudaLibraries {
            driver: true,
            shared_runtime: true,
        };
        let text = notice(&config("stats:text"), static_runtime, Interposing).unwrap();
        assert!(
            text.starts_with(
                "cachealloc: CACHEALLOC_CONF asks for statistics at exit, but no CUDA call \
                 reached cachealloc in this process: "
            ),
            "{text}"
        );
        assert!(text.contains("build with -cudart shared"), "{text}");
        let text = notice(&config("trace:/tmp/t.jsonl"), shared_runtime, Interposing).unwrap();
        assert!(text.contains("asks for a trace"), "{text}");
        // The process may have allocated nothing at all (it only asked for the device count).
        assert!(
            text.contains("any device memory it used came from cudaMallocAsync"),
            "{text}"
        );
        let conf = config("stats:json,trace:/tmp/t.jsonl");
        let text = notice(&conf, static_runtime, Interposing).unwrap();
        assert!(text.contains("statistics at exit and a trace"), "{text}");
        // Opened as a pluggable allocator, the library sees none of the program's CUDA calls.
        for cuda in [shared_runtime, static_runtime] {
            let text = notice(&config("stats:text"), cuda, Opened).unwrap();
            assert!(
                text.contains("the program's cudaMalloc does not come to cachealloc")
                    && text.contains("change_current_allocator")
                    && !text.contains("cudaMallocAsync"),
                "{text}"
            );
        }
        for loaded in [Interposing, Opened] {
            assert_eq!(
                notice(&config("max_split_size_mb:128"), static_runtime, loaded),
                None
            );
            assert_eq!(
                notice(&config("stats:text"), CudaLibraries::default(), loaded),
                None
            );
        }
        let disabled = Config::from_lookup(|name| match name {
            "CACHEALLOC_CONF" => Some("stats:text".into()),
            "CACHEALLOC_DISABLE" => Some("1".into()),
            _ => None,
        })
        .unwrap();
        assert_eq!(notice(&disabled, static_runtime, Interposing), None);
    }
}
