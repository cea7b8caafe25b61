//! End to end: `expandable_segments:True` in the preloaded library, on the fake runtime and the
//! fake driver (`libcuda.so.1`, loaded by the fake runtime as the real one loads the real
//! driver). Scenarios live in `tests/preload/expandable_check.c`, one process each.

mod support;

use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::OnceLock;
use support::fake_cudart;
use support::shim::{assert_in_order, library, preloaded, run_ok, run_scenario, stderr, stdout};

fn program() -> &'static Path {
    static PROGRAM: OnceLock<PathBuf> = OnceLock::new();
    PROGRAM.get_or_init(|| {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let lib = library();
        let lib_dir = lib.parent().unwrap().display().to_string();
        fake_cudart::compile_c_program(
            &root.join("tests/preload/expandable_check.c"),
            "expandable_check",
            &[
                &format!("-I{}", root.join("include").display()),
                &format!("-L{lib_dir}"),
                "-lcachealloc",
                &format!("-Wl,-rpath,{lib_dir}"),
                "-ldl",
            ],
        )
    })
}

/// Run `scenario` under the library with expandable segments on (plus `conf`) and `env`, and
/// require its "ok" line.
fn check(scenario: &str, conf: &str, env: &[(&str, &str)]) -> Output {
    let mut cmd = preloaded(program());
    cmd.arg(scenario)
        .env("CACHEALLOC_CONF", format!("expandable_segments:True{conf}"))
        .envs(env.iter().copied());
    run_scenario(&mut cmd, scenario)
}

#[test]
fn requests_grow_an_address_range_page_by_page_and_empty_cache_gives_it_back() {
    let out = check("grow", "", &[]);
    assert!(stderr(&out).is_empty(), "unexpected log: {}", stderr(&out));
}

/// The device-call log shows a range's life: reserved, pages mapped into it, unmapped, and the
/// range given back.
#[test]
fn the_debug_log_shows_a_range_reserved_mapped_and_given_back() {
    let log = stderr(&check(
        "grow",
        "",
        &[("CACHEALLOC_LOG", "cachealloc::device=debug")],
    ));
    let expected = [
        "device 0: reserve ",
        " of address space at 0x",
        "(cuMemAddressReserve; stream 0x0)",
        "device 0: map 20.00 MiB at 0x",
        "device 0: unmap ",
        "device 0: release ",
        "(cuMemAddressFree)",
    ];
    assert_in_order(&log, &expected);
}

#[test]
fn pages_are_unmapped_only_after_the_work_on_their_stream() {
    check("unmap_waits", ",free_sync:none", &[]);
}

#[test]
fn a_failed_unmap_leaves_the_pages_mapped_and_usable() {
    check("unmap_fails", "", &[]);
}

#[test]
fn a_failed_map_gives_its_pages_back_and_passes_the_error_on() {
    check("set_access_fails", "", &[]);
}

#[test]
fn a_failed_page_map_releases_that_page_s_memory_and_passes_the_error_on() {
    check("map_fails", "", &[]);
}

#[test]
fn a_failed_page_creation_gives_the_pages_made_before_back_and_passes_the_error_on() {
    check("create_fails", "", &[]);
}

#[test]
fn a_reservation_refused_for_room_is_retried_after_the_cache_and_other_errors_pass_on() {
    check("reserve_fails", "", &[]);
}

#[test]
fn a_request_that_does_not_fit_gives_its_pages_back_and_answers_2() {
    check("oom", "", &[("FAKECUDART_CAPACITY", "30MiB")]);
}

#[test]
fn peer_access_opens_the_pages_mapped_before_and_after_it() {
    check("peer", "", &[]);
}

#[test]
fn pages_are_made_for_gpudirect_rdma_where_the_device_supports_it() {
    check("rdma", "", &[]);
    check("rdma", "", &[("FAKECUDART_VMM_RDMA", "0")]);
}

#[test]
fn memory_of_expandable_segments_gets_no_ipc_handle() {
    let out = check("ipc", "", &[]);
    let log = stderr(&out);
    assert!(
        log.contains("cudaIpcGetMemHandle") && log.contains("is memory of an expandable segment"),
        "{log}"
    );
}

#[test]
fn peer_access_enabled_behind_the_library_s_back_is_granted_on_704() {
    check("peer_already", "", &[]);
}

#[test]
fn a_device_reset_gives_back_every_page_and_range() {
    check("reset", "", &[]);
}

/// A reset that fails after the pool's expandable memory was released says that the allocations
/// in it are gone; their frees do nothing.
#[test]
fn a_failed_device_reset_says_the_expandable_memory_is_gone() {
    let out = check("reset_fails", "", &[]);
    let log = stderr(&out);
    assert!(
        log.contains("cudaDeviceReset failed with CUDA error 999")
            && log.contains(
                "the memory of its 2 expandable segments was released before the reset (a \
                 reset does not free it), so the allocations in it are gone: do not use them"
            ),
        "{log}"
    );
    assert!(!log.contains("stay allocated"), "{log}");
}

#[test]
fn a_driver_without_virtual_memory_management_gets_fixed_segments_with_a_warning() {
    let out = check("unsupported", "", &[("FAKECUDART_VMM", "0")]);
    let log = stderr(&out);
    assert!(
        log.contains("expandable_segments:True is not supported on device 0")
            && log.contains(
                "the device has no virtual memory management (its \
                 CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED is 0)"
            )
            && log.contains("using fixed segments"),
        "{log}"
    );
    // Said once for the device, not again for the pool made after its reset.
    assert_eq!(
        log.matches("is not supported on device 0").count(),
        1,
        "{log}"
    );
}

/// A device whose allocation granularity does not divide the pools' 2 MiB pages gets fixed
/// segments, with a warning that gives the granularity.
#[test]
fn a_granularity_coarser_than_2_mib_gets_fixed_segments_with_a_warning() {
    let out = check("unsupported", "", &[("FAKECUDART_VMM_GRANULARITY", "4MiB")]);
    let log = stderr(&out);
    assert!(
        log.contains("expandable_segments:True is not supported on device 0")
            && log.contains("allocation granularity (4194304 bytes")
            && log.contains("using fixed segments"),
        "{log}"
    );
}

/// Pages are made for GPUDirect RDMA, and sized by the granularity the driver gives for those
/// very properties: where it is coarser than for plain memory and does not divide 2 MiB pages,
/// the device gets fixed segments (rather than pages the driver refuses to make).
#[test]
fn the_granularity_is_asked_for_the_properties_pages_are_made_with() {
    let out = check(
        "unsupported",
        "",
        &[("FAKECUDART_VMM_RDMA_GRANULARITY", "4MiB")],
    );
    let log = stderr(&out);
    assert!(
        log.contains("allocation granularity (4194304 bytes")
            && log.contains("using fixed segments"),
        "{log}"
    );
    // Where the device takes no RDMA flag, plain memory's granularity is the one that counts.
    check(
        "grow",
        "",
        &[
            ("FAKECUDART_VMM_RDMA_GRANULARITY", "4MiB"),
            ("FAKECUDART_VMM_RDMA", "0"),
        ],
    );
}

/// A finer granularity changes nothing: the pages stay 2 and 20 MiB.
#[test]
fn a_granularity_finer_than_2_mib_maps_the_same_pages() {
    let out = check("grow", "", &[("FAKECUDART_VMM_GRANULARITY", "64KiB")]);
    assert!(stderr(&out).is_empty(), "unexpected log: {}", stderr(&out));
}

/// The same program with expandable segments off: every segment is a cudaMalloc, and the driver
/// is never asked for memory (the scenarios above measure the expandable path).
#[test]
fn without_the_setting_no_driver_memory_is_used() {
    let mut cmd = preloaded(program());
    cmd.arg("unsupported");
    let out = run_ok(&mut cmd);
    assert!(stdout(&out).contains("ok unsupported"), "{}", stderr(&out));
    assert!(stderr(&out).is_empty(), "{}", stderr(&out));
}
