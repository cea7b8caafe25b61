//! The pluggable-allocator entry points, called as PyTorch calls them, against
//! the fake runtime's simulated kernels (`tests/preload/torch_hooks_check.c`):
//! `cachealloc_torch_record_stream` (`set_record_stream_fn`, `Tensor.record_stream`) keeps a
//! freed block from the next tensor while another stream's work still uses it (an event on each
//! recorded stream, on that stream's device, under every `free_sync` policy, and no device
//! synchronization), and
//! `cachealloc_torch_empty_cache` (`set_reset_fn`, `torch.cuda.empty_cache()`) gives the cached
//! segments back. And a failed `cachealloc_torch_malloc` reaches C++ as a `std::runtime_error`
//! (`tests/preload/torch_oom_check.cpp`), which PyTorch raises as a Python `RuntimeError`,
//! instead of a NULL pointer it would turn into a tensor at address 0 — also when, as in a
//! Python process, libstdc++ and the library are loaded `RTLD_LOCAL`
//! (`tests/preload/torch_host.c` loading `torch_like.cpp`) — while
//! `cachealloc_torch_mempool_malloc` answers NULL for PyTorch's MemPool path, which checks it.
//! And with expandable segments on several devices, a library that is not preloaded warns that
//! PyTorch's peer access cannot reach its pages (`tests/preload/torch_peer_check.c`).
//! And `cachealloc_torch_set_memory_fraction` (`set_memory_fraction_fn`,
//! `torch.cuda.set_per_process_memory_fraction`) limits the device it names.
//! And malloc and free themselves, as PyTorch relies on them: the block of a stream, the device
//! asked for, size 0, a free that reads only the pointer, refusals thrown and logged.

mod support;

use std::path::PathBuf;
use std::process::{Command, Output};
use support::fake_cudart;
use support::shim::{library, run_ok, stderr, stdout};

fn program() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let lib = library();
    let lib_dir = lib.parent().unwrap().display().to_string();
    fake_cudart::compile_c_program(
        &root.join("tests/preload/torch_hooks_check.c"),
        "torch_hooks_check",
        &[
            &format!("-I{}", root.join("include").display()),
            &format!("-L{lib_dir}"),
            "-lcachealloc",
            &format!("-Wl,-rpath,{lib_dir}"),
        ],
    )
}

/// Under every `free_sync` policy (which is about the interposed `cudaFree`): a recorded block
/// waits for an event on each recorded stream, non-blocking ones included, without a device
/// synchronization.
#[test]
fn a_block_recorded_on_other_streams_waits_for_them_and_empty_cache_releases_everything() {
    for conf in ["", "free_sync:device", "free_sync:event", "free_sync:none"] {
        let out = run_ok(
            fake_cudart::command(&program())
                .env("CACHEALLOC_CONF", conf)
                .env_remove("CACHEALLOC_DISABLE"),
        );
        let (stdout, stderr) = (stdout(&out), stderr(&out));
        assert!(
            stdout.contains("ok torch hooks"),
            "CACHEALLOC_CONF={conf}: {stdout}\n{stderr}"
        );
        assert!(
            stderr.contains("cachealloc_torch_record_stream"),
            "a pointer of no allocation is logged: {stderr}"
        );
        assert!(
            stderr.lines().any(|line| line
                .contains("cachealloc_torch_record_stream: invalid device pointer 0x")
                && line.ends_with(
                    ": the memory there is free in cachealloc's cache (already freed: a double \
                     free; or never allocated)"
                )),
            "the record of a freed tensor names it as such: {stderr}"
        );
        assert!(
            stderr.lines().any(|line| line
                .contains("cachealloc_torch_free: invalid device pointer 0x")
                && line.ends_with("(already freed: a double free; or never allocated)")),
            "a double free is logged: {stderr}"
        );
        assert!(
            stderr.contains(
                "is not waited for before the block is reused (cudaEventRecord failed with CUDA \
                 error 400"
            ),
            "a stream that cannot be waited for is named: {stderr}"
        );
    }
}

/// What the hook prevents: without it, the block is handed out again at once, while the side
/// stream's kernel still reads it (PyTorch's own semantics for unrecorded tensors).
#[test]
fn without_the_record_the_block_is_reused_while_the_side_stream_still_uses_it() {
    let out = run_ok(
        fake_cudart::command(&program())
            .arg("unrecorded")
            .env_remove("CACHEALLOC_CONF")
            .env_remove("CACHEALLOC_DISABLE"),
    );
    assert_eq!(
        stdout(&out).trim(),
        "reused while busy: 1",
        "{}",
        stderr(&out)
    );
}

/// A recorded free that fails (no event could be created) keeps the record: the free made again
/// still waits for the recorded stream, under every `free_sync` policy.
#[test]
fn a_recorded_free_that_failed_still_waits_for_its_streams_when_made_again() {
    for conf in ["", "free_sync:event", "free_sync:none"] {
        let out = run_ok(
            fake_cudart::command(&program())
                .arg("failed_free")
                .env("CACHEALLOC_CONF", conf)
                .env_remove("CACHEALLOC_DISABLE"),
        );
        assert!(
            stdout(&out).contains("ok failed free"),
            "CACHEALLOC_CONF={conf}: {}\n{}",
            stdout(&out),
            stderr(&out)
        );
    }
}

/// The test program's `mode`, with `CACHEALLOC_CONF` set to `conf` (unset for `None`) and the
/// library enabled at its default log level; it must succeed.
fn run_mode(mode: &str, conf: Option<&str>) -> Output {
    let mut cmd = fake_cudart::command(&program());
    cmd.arg(mode)
        .env_remove("CACHEALLOC_DISABLE")
        .env_remove("CACHEALLOC_LOG");
    match conf {
        Some(conf) => cmd.env("CACHEALLOC_CONF", conf),
        None => cmd.env_remove("CACHEALLOC_CONF"),
    };
    run_ok(&mut cmd)
}

/// What PyTorch's `CUDAPluggableAllocator` relies on from the malloc and free it is given
/// (`contract` in `torch_hooks_check.c`): a freed block goes at once to the next tensor of its
/// own stream and to no other stream's; free reads the pointer only; size 0 (an empty tensor) is
/// NULL; the device argument picks the memory's device. NULL to free is nothing to do; a pointer
/// of no allocation and a device the process does not have are logged.
#[test]
fn malloc_and_free_keep_the_pluggable_allocators_contract() {
    let out = run_mode("contract", None);
    let (stdout, log) = (stdout(&out), stderr(&out));
    assert!(stdout.contains("ok contract"), "{stdout}\n{log}");
    let frees: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("cachealloc_torch_free"))
        .collect();
    assert!(
        frees.len() == 1 && frees[0].ends_with("was not allocated by cachealloc"),
        "only the pointer of no allocation is logged, NULL is not: {log}"
    );
    for call in ["cachealloc_torch_malloc", "cachealloc_torch_mempool_malloc"] {
        assert!(
            log.contains(&format!(
                "{call}: no device 7 in this process (it has 2: devices 0 to 1)"
            )),
            "{log}"
        );
    }
}

/// `cachealloc_torch_base_alloc`, the `set_base_alloc_fn` hook that PyTorch 2.1 to 2.4 call to
/// share a CUDA tensor with another process: the tensor's segment's start and size, whose IPC
/// handle opens where the tensor's offset finds it; a pointer of no segment answered with itself.
/// Nothing is logged.
#[test]
fn the_base_allocation_hook_names_the_segment_an_ipc_handle_opens() {
    let out = run_mode("base_alloc", None);
    let (stdout, log) = (stdout(&out), stderr(&out));
    assert!(stdout.contains("ok base alloc"), "{stdout}\n{log}");
    assert!(!log.contains("cachealloc_torch_base_alloc"), "{log}");
}

/// Memory of an expandable segment cannot be named by an IPC handle: the hook answers the
/// tensor's own address, and the log says why the handle PyTorch then asks for fails.
#[test]
fn the_base_allocation_hook_leaves_expandable_memory_as_it_is_and_says_why() {
    let out = run_mode("base_alloc_expandable", Some("expandable_segments:True"));
    let (stdout, log) = (stdout(&out), stderr(&out));
    assert!(
        stdout.contains("ok base alloc expandable"),
        "{stdout}\n{log}"
    );
    assert!(
        log.lines()
            .any(|line| line.contains("cachealloc_torch_base_alloc: 0x")
                && line.contains("is memory of an expandable segment")),
        "{log}"
    );
}

/// The free and empty-cache hooks return nothing, so the log is the only word of a failure
/// inside them, and it is at the default level: a recorded free whose event cannot be made
/// (the tensor's memory stays allocated), pages that cannot be unmapped (they stay cached).
#[test]
fn a_failure_inside_a_hook_that_returns_nothing_is_logged_at_the_default_level() {
    let out = run_mode("hook_failures", Some("expandable_segments:True"));
    let (stdout, log) = (stdout(&out), stderr(&out));
    assert!(stdout.contains("ok hook failures"), "{stdout}\n{log}");
    for line in [
        "WARN cachealloc::ffi::status: cachealloc_torch_free: cudaEventCreateWithFlags failed \
         with CUDA error 2",
        "WARN cachealloc::ffi::status: cachealloc_torch_empty_cache: cuMemUnmap failed with \
         CUDA error 1",
    ] {
        assert!(log.contains(line), "{line}: {log}");
    }
}

/// `torch.cuda.set_per_process_memory_fraction` with `cachealloc_torch_set_memory_fraction` as
/// the `set_memory_fraction_fn` hook: the device's pool, made after the call, is limited (a
/// request past the limit fails as out of memory), another device is not, 1 lifts the limit,
/// and a fraction outside [0, 1] is logged and changes nothing.
#[test]
fn the_memory_fraction_hook_limits_the_device_it_names() {
    let out = run_mode("memory_fraction", None);
    let (stdout, log) = (stdout(&out), stderr(&out));
    assert!(stdout.contains("ok memory fraction"), "{stdout}\n{log}");
    assert!(
        log.contains("2.00 GiB allowed"),
        "the report names the limit of 1/8 of 16 GiB: {log}"
    );
    assert!(
        log.contains(
            "cachealloc_torch_set_memory_fraction: invalid memory fraction 2: set it within \
             [0, 1] (1 = no limit)"
        ),
        "{log}"
    );
}

/// With three devices: the reset of one leaves the waits of a recorded free on another device's
/// stream in place (only the reset device's events go with it), and the block comes back once
/// that stream's work is done.
#[test]
fn a_reset_of_one_device_keeps_the_waits_on_another_device_s_stream() {
    let out = run_ok(
        fake_cudart::command(&program())
            .arg("third_device_reset")
            .env("FAKECUDART_DEVICES", "3")
            .env_remove("CACHEALLOC_CONF")
            .env_remove("CACHEALLOC_DISABLE"),
    );
    assert!(
        stdout(&out).contains("ok third device reset"),
        "{}\n{}",
        stdout(&out),
        stderr(&out)
    );
}

/// The C++ program, linked as PyTorch's extension would be: libstdc++ is in the process.
fn cxx_program() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let lib = library();
    let lib_dir = lib.parent().unwrap();
    let fake = fake_cudart::fake_cudart();
    let out = std::env::temp_dir().join(format!("cachealloc-torch-oom-{}", std::process::id()));
    run_ok(
        Command::new("c++")
            .arg("-std=c++17")
            .arg("-I")
            .arg(root.join("include"))
            .arg("-I")
            .arg(&fake.include_dir)
            .arg("-o")
            .arg(&out)
            .arg(root.join("tests/preload/torch_oom_check.cpp"))
            .arg("-L")
            .arg(lib_dir)
            .arg("-lcachealloc")
            .arg(format!("-Wl,-rpath,{}", lib_dir.display()))
            .arg("-Wl,--no-as-needed")
            .arg("-L")
            .arg(&fake.lib_dir)
            .arg("-lcudart")
            .arg(format!("-Wl,-rpath,{}", fake.lib_dir.display())),
    );
    out
}

#[test]
fn a_failed_allocation_is_thrown_to_cxx_as_a_runtime_error_with_its_report() {
    let program = cxx_program();
    let out = run_ok(
        fake_cudart::command(&program)
            .env("FAKECUDART_CAPACITY", "1GiB")
            .env_remove("CACHEALLOC_CONF")
            .env_remove("CACHEALLOC_DISABLE"),
    );
    let text = stdout(&out);
    assert!(
        text.starts_with("caught: CUDA out of memory. Tried to allocate"),
        "{text}\n{}",
        stderr(&out)
    );
    // The whole report, as the log gives it: the figures and the hint.
    assert!(
        text.contains("GPU 0 has a total capacity of 1024.00 MiB") && text.contains("\nHint: "),
        "{text}"
    );
    assert!(text.contains("then: allocated"), "{text}");
    assert!(text.contains("last error: 0"), "{text}");
    assert!(
        stderr(&out).contains("CUDA out of memory"),
        "the report is logged too"
    );
    // An empty tensor is NULL, not a failure; the other refusals are thrown, and logged.
    for line in [
        "size 0: returned NULL\n",
        "device 7: caught: no device 7 in this process (it has 2: devices 0 to 1)\n",
        "over 1 EiB: caught: CUDA out of memory. Tried to allocate more than 1EB memory \
         (2305843009213693952 bytes requested).\n",
        // std::runtime_error's constructor throws std::bad_alloc: it reaches the caller.
        "no memory for the message: caught bad_alloc\n",
    ] {
        assert!(text.contains(line), "{line}{text}");
    }
    assert!(
        stderr(&out).contains(
            "cachealloc_torch_malloc: CUDA out of memory. Tried to allocate more than 1EB memory"
        ),
        "{}",
        stderr(&out)
    );

    // Disabled, the runtime's own out-of-memory answer is thrown in PyTorch's words, and the
    // failed cudaMalloc's error is not left for PyTorch's next check to raise somewhere else.
    let out = run_ok(
        fake_cudart::command(&program)
            .env("FAKECUDART_CAPACITY", "1GiB")
            .env_remove("CACHEALLOC_CONF")
            .env("CACHEALLOC_DISABLE", "1"),
    );
    let text = stdout(&out);
    assert!(
        text.starts_with(
            "caught: CUDA out of memory. Tried to allocate 1099511627776 bytes on device 0: \
             cudaMalloc answered cudaErrorMemoryAllocation (2)"
        ),
        "{text}\n{}",
        stderr(&out)
    );
    assert!(text.contains("then: allocated"), "{text}");
    assert!(text.contains("last error: 0"), "{text}");
    assert!(text.contains("size 0: returned NULL\n"), "{text}");

    // A configuration error: every allocation throws, naming it.
    let out = run_ok(
        fake_cudart::command(&program)
            .env("CACHEALLOC_CONF", "max_split_size_mb:abc")
            .env_remove("CACHEALLOC_DISABLE"),
    );
    let text = stdout(&out);
    assert!(
        text.starts_with(
            "caught: the cachealloc configuration is invalid (the error was printed on stderr"
        ),
        "{text}"
    );
    assert!(text.contains("then: caught"), "{text}");
    let _ = std::fs::remove_file(&program);
}

/// The process layout of Python with PyTorch: a C host loads a C++ library `RTLD_LOCAL` (its
/// libstdc++ is not in the global scope), which loads libcachealloc `RTLD_LOCAL` and calls it.
#[test]
fn the_exception_is_thrown_where_libstdcxx_is_loaded_locally_as_in_python() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let fake = fake_cudart::fake_cudart();
    let dir = std::env::temp_dir().join(format!("cachealloc-torch-like-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let torch_like = dir.join("torch_like.so");
    run_ok(
        Command::new("c++")
            .args(["-std=c++17", "-shared", "-fPIC", "-o"])
            .arg(&torch_like)
            .arg(root.join("tests/preload/torch_like.cpp"))
            .arg("-ldl"),
    );
    let host = dir.join("torch_host");
    run_ok(
        Command::new("cc")
            .arg("-o")
            .arg(&host)
            .arg(root.join("tests/preload/torch_host.c"))
            .arg("-ldl"),
    );
    // The runtime is loaded by the host's environment as PyTorch's would be (preloaded here,
    // since nothing in the host links it).
    let out = run_ok(
        fake_cudart::command(&host)
            .arg(&torch_like)
            .arg(library())
            .env("LD_PRELOAD", fake.lib_dir.join("libcudart.so.12"))
            .env("FAKECUDART_CAPACITY", "1GiB")
            .env_remove("CACHEALLOC_CONF")
            .env_remove("CACHEALLOC_DISABLE"),
    );
    let text = stdout(&out);
    assert!(
        text.starts_with("thrown: CUDA out of memory. Tried to allocate"),
        "{text}\n{}",
        stderr(&out)
    );
    assert!(text.contains("mempool returned NULL"), "{text}");
    assert!(text.contains("then: allocated"), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// With expandable segments on two devices, the pages of a library loaded as PyTorch's
/// pluggable allocator loads it (ctypes, not preloaded) stay private to their device: PyTorch's
/// `cudaDeviceEnablePeerAccess` goes to the runtime, and another device reading them faults.
/// The library says so once, with the remedy; preloaded as well, it sees the call and grants the
/// access, and says nothing.
#[test]
fn expandable_pages_that_peer_access_cannot_reach_are_warned_about_unless_preloaded() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let program = fake_cudart::compile_c_program(
        &root.join("tests/preload/torch_peer_check.c"),
        "torch_peer_check",
        &["-ldl"],
    );
    let run = |preload: bool, devices: &str| {
        let mut cmd = fake_cudart::command(&program);
        cmd.arg(library())
            .env("CACHEALLOC_CONF", "expandable_segments:True")
            .env("FAKECUDART_DEVICES", devices)
            .env_remove("CACHEALLOC_DISABLE")
            .env_remove("CACHEALLOC_LOG");
        if preload {
            cmd.env("LD_PRELOAD", library());
        }
        run_ok(&mut cmd)
    };
    let warning = "the program's cudaDeviceEnablePeerAccess goes to the runtime, not here";

    let out = run(false, "2");
    let (text, log) = (stdout(&out), stderr(&out));
    assert_eq!(text, "enable: 0\nread from device 1: 700\n", "{log}");
    assert_eq!(log.matches(warning).count(), 1, "{log}");
    assert!(
        log.contains("CACHEALLOC_CONF: expandable_segments:True with 2 devices")
            && log.contains("LD_PRELOAD=")
            && log.contains("expandable_segments:False"),
        "{log}"
    );

    let out = run(true, "2");
    let (text, log) = (stdout(&out), stderr(&out));
    assert_eq!(text, "enable: 0\nread from device 1: 0\n", "{log}");
    assert!(!log.contains(warning), "{log}");

    // One device: no peer to reach the pages, nothing to say.
    let out = run(false, "1");
    assert!(!stderr(&out).contains(warning), "{}", stderr(&out));
}
