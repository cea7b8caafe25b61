//! `cachealloc state` on expandable segments: a request's trial in a state whose segments are
//! runs of pages mapped into reserved ranges, which the snapshot does not record.

mod support;

use serde_json::json as value;
use support::cli::{json, state};
use support::snapshot_pickle::{Segment, write_state_snapshot};
use support::traces::trace;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const SEG: u64 = 0x7f00_0000_0000;
/// Where the small pool's run lies, far above the large pool's.
const SMALL: u64 = SEG + 0x10_0000_0000;

/// The large pool's range holds two runs: at its start, 20 MiB allocated and 20 MiB free
/// (two pages); one page on, 20 MiB free. The small pool's run is one 2 MiB page with 1 KiB
/// allocated.
fn runs() -> Vec<Segment> {
    let run = |address, blocks| Segment {
        address,
        stream: 0,
        expandable: true,
        pool_id: (0, 0),
        blocks,
    };
    vec![
        run(
            SEG,
            vec![
                (20 * MIB, 20 * MIB, "active_allocated"),
                (20 * MIB, 0, "inactive"),
            ],
        ),
        run(SEG + 60 * MIB, vec![(20 * MIB, 0, "inactive")]),
        run(
            SMALL,
            vec![
                (1024, 1000, "active_allocated"),
                (2 * MIB - 1024, 0, "inactive"),
            ],
        ),
    ]
}

fn request(path: &std::path::Path, extra: &[&str]) -> serde_json::Value {
    let j = json(&state(path, &[extra, &["--json"]].concat()));
    j["request"].clone()
}

/// A free block that fits serves the request; one that can grow into the unmapped pages after
/// it is grown (the gap between two runs mapped, and the runs merged); on a full device the
/// free pages are unmapped first; beyond that it runs out of memory. (62 MiB mapped, 20 MiB and
/// 1 KiB of it allocated; on a device of 1 GiB, whose ranges are 1160 MiB.)
#[test]
fn requests_grow_blocks_map_pages_and_unmap_free_ones() {
    let path = write_state_snapshot("expandable-runs.pickle", &runs(), None);
    let on_1_gib = |extra: &[&str]| request(&path, &[extra, &["--device-memory", "1GiB"]].concat());

    // Best fit among the two 20 MiB free blocks: the one that can grow less, the first run's
    // (to 40 MiB: the second run's has the rest of the range after it), no pages mapped.
    let r = on_1_gib(&["--request", "15MiB"]);
    assert_eq!(r["outcome"], "cached", "{r}");
    assert_eq!(r["block_address"], SEG + 20 * MIB);
    // Without the device's memory, it is taken as the 62 MiB mapped, and the large pool's
    // range as 80 MiB (1⅛ of 62 MiB in whole pages), ending with the second run: that run's
    // block can grow less.
    let r = request(&path, &["--request", "15MiB"]);
    assert_eq!(r["block_address"], SEG + 60 * MIB, "{r}");

    // 35 MiB: the free block at 20 MiB, the unmapped page after it and the second run's free
    // block make room; one page is mapped, with the device's 20 MiB free.
    let r = on_1_gib(&["--request", "35MiB", "--device-free", "20MiB"]);
    assert_eq!(r["outcome"], "mapped_pages", "{r}");
    assert_eq!(r["served_address"], SEG + 20 * MIB);
    assert_eq!(r["mapped_bytes"], 20 * MIB);
    assert_eq!(r["unmapped_bytes"], 0);
    assert_eq!(r["range_address"], SEG);
    assert_eq!(r["new_range"], false);

    // On a full device the page cannot be mapped: the two free pages are unmapped (the small
    // page's free part is not a whole page), then two pages mapped, beside the 22 MiB still
    // mapped.
    let out = state(&path, &["--request", "35MiB", "--device-memory", "1GiB"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!(
            "served at {:#x} by mapping 40.00 MiB of pages into the expandable segment at \
             {SEG:#x}, after unmapping 40.00 MiB of free cached pages (a retry)",
            SEG + 20 * MIB
        )),
        "{text}"
    );
    assert!(text.contains("In this state the request fits"), "{text}");

    // 20 MiB live and 50 MiB more exceed the 62 MiB: live memory, not pieces. (With the
    // device's 1 GiB named, the memory beyond the pool is held by others.)
    let r = on_1_gib(&["--request", "50MiB"]);
    assert_eq!(r["oom"]["kind"], "untracked", "{r}");
    let r = request(&path, &["--request", "50MiB"]);
    assert_eq!(r["outcome"], "out_of_memory", "{r}");
    assert_eq!(r["oom"]["kind"], "exhausted", "{r}");
    std::fs::remove_file(path).unwrap();
}

/// The ranges the trial takes: one per pool and stream, from the lowest run, 1⅛ of the
/// device's memory in whole pages; listed in the JSON and in words.
#[test]
fn the_ranges_taken_are_listed() {
    let path = write_state_snapshot("expandable-ranges.pickle", &runs(), None);
    let args = ["--request", "1MiB", "--device-memory", "1GiB"];
    let r = request(&path, &args);
    let ranges = r["inferred_ranges"].as_array().unwrap();
    let taken: Vec<(u64, u64, &str, u64)> = ranges
        .iter()
        .map(|r| {
            (
                r["address"].as_u64().unwrap(),
                r["size"].as_u64().unwrap(),
                r["pool"].as_str().unwrap(),
                r["mapped_bytes"].as_u64().unwrap(),
            )
        })
        .collect();
    // 1152 MiB: 57.6 large pages, rounded up to 58; 576 small ones.
    assert_eq!(
        taken,
        [
            (SEG, 1160 * MIB, "large", 60 * MIB),
            (SMALL, 1152 * MIB, "small", 2 * MIB)
        ]
    );
    let text = String::from_utf8_lossy(&state(&path, &args).stdout).into_owned();
    assert!(
        text.contains(&format!(
            "1.13 GiB at {SEG:#x} (large pool, stream 0x0, 60.00 MiB mapped)"
        )),
        "{text}"
    );
    assert!(
        text.contains("A snapshot records the pages mapped in expandable segments")
            && text.contains(&format!(
                "(a run beyond it begins another range). The ranges: 1.13 GiB at {SEG:#x}"
            )),
        "{text}"
    );
    // Without a request the report offers one, as for native segments.
    let text = String::from_utf8_lossy(&state(&path, &[]).stdout).into_owned();
    assert!(text.contains("The segments are expandable"), "{text}");
    assert!(text.contains("--request SIZE"), "{text}");
    assert_eq!(
        json(&state(&path, &["--json"]))["both_segment_kinds"],
        false
    );
    std::fs::remove_file(path).unwrap();
}

/// Beyond four ranges the words list the first four and count the rest; a range that another
/// segment begins inside of is cut short there, and says so. (Five streams' runs of one page,
/// 1 GiB apart on a 1 GiB device, whose ranges would be 1160 MiB.)
#[test]
fn many_ranges_are_counted_and_cut_short_ones_named() {
    let runs: Vec<Segment> = (0..5)
        .map(|stream| Segment {
            address: SEG + stream * GIB,
            stream,
            ..one_run(vec![(20 * MIB, 0, "inactive")])
        })
        .collect();
    let path = write_state_snapshot("expandable-five.pickle", &runs, None);
    let args = ["--request", "1MiB", "--device-memory", "1GiB"];
    let r = request(&path, &args);
    let cut: Vec<bool> = r["inferred_ranges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["cut_short"].as_bool().unwrap())
        .collect();
    assert_eq!(cut, [true, true, true, true, false], "{r}");
    let text = String::from_utf8_lossy(&state(&path, &args).stdout).into_owned();
    let cut_short = "20.00 MiB mapped, cut short where another segment begins";
    assert!(
        text.contains(&format!(
            "The ranges: 1020.00 MiB at {SEG:#x} (large pool, stream 0x0, {cut_short}); "
        )) && text.contains(&format!(
            "; 1020.00 MiB at {:#x} (large pool, stream 0x3, {cut_short}) (and 1 more).",
            SEG + 3 * GIB
        )),
        "{text}"
    );
    assert!(
        !text.contains(&format!("at {:#x} (large pool", SEG + 4 * GIB)),
        "{text}"
    );
    std::fs::remove_file(path).unwrap();
}

/// Expandable segments are on when the segments are, whatever the snapshot's settings say;
/// `--conf` without them is refused for such a state, naming why.
#[test]
fn settings_without_expandable_segments_cannot_hold_the_state() {
    // The snapshot's settings say expandable_segments False (turned on after the start).
    let path = write_state_snapshot("expandable-settings.pickle", &runs(), Some(("", None)));
    let out = state(&path, &["--request", "15MiB", "--json"]);
    let j = json(&out);
    assert_eq!(
        j["settings"],
        "as recorded: defaults, with expandable_segments:True, as the segments show"
    );
    assert_eq!(j["request"]["outcome"], "cached");
    let out = state(
        &path,
        &["--request", "15MiB", "--conf", "max_split_size_mb:100"],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("the snapshot's state cannot exist under the settings max_split_size_mb:100")
            && err.contains(&format!(
                "the segment at {SEG:#x} is expandable (pages mapped into a reserved range), \
                 but expandable_segments is off"
            )),
        "{err}"
    );
    // Older snapshots name no settings.
    let old = write_state_snapshot("expandable-no-settings.pickle", &runs(), None);
    let j = json(&state(&old, &["--request", "15MiB", "--json"]));
    assert!(
        j["settings"]
            .as_str()
            .unwrap()
            .starts_with("expandable_segments:True, as the segments show"),
        "{j}"
    );
    for p in [path, old] {
        std::fs::remove_file(p).unwrap();
    }
}

/// code_location's device 1, after its out-of-memory error: 78.42 GiB mapped, 78.04 GiB of it
/// cached free in 8 blocks, the largest 25.61 GiB.
#[test]
fn a_real_expandable_state() {
    let Some(t) = trace("code_location/52e52b2/memory_snapshot.pickle") else {
        return;
    };
    let on_device_1 = |size: &str| request(&t, &["--device", "1", "--request", size]);
    // The 4.94 GiB request that failed fits now: the best fit is the 5.59 GiB block.
    let r = on_device_1("4.94GiB");
    assert_eq!(r["outcome"], "cached", "{r}");
    assert_eq!(r["block_address"], 0x45a9800000u64);
    // Larger than any free block, on a full device: the free pages are unmapped and 30 GiB
    // mapped, in the one large range.
    let r = on_device_1("30GiB");
    assert_eq!(r["outcome"], "mapped_pages", "{r}");
    assert_eq!(r["mapped_bytes"], 30 * GIB);
    assert!(r["unmapped_bytes"].as_u64().unwrap() > 78 * GIB, "{r}");
    assert_eq!(r["range_address"], 0x3288000000u64);
    // Live memory plus the request exceed the device.
    let r = on_device_1("78.10GiB");
    assert_eq!(r["oom"]["kind"], "exhausted", "{r}");
}

/// One run of the default stream at `SEG`, its blocks as `(size, requested, state)`.
fn one_run(blocks: Vec<(u64, u64, &'static str)>) -> Segment {
    Segment {
        address: SEG,
        stream: 0,
        expandable: true,
        pool_id: (0, 0),
        blocks,
    }
}

/// The calls the pool made to the device, in order, as the JSON lists them.
fn calls(r: &serde_json::Value) -> &Vec<serde_json::Value> {
    r["device_calls"].as_array().unwrap()
}

/// A block whose free was pending can serve the request once the pool synchronizes, which it
/// does before giving memory back: its page is unmapped first, and what is left of the block
/// serves it without any page mapped.
#[test]
fn a_block_freed_pending_serves_after_the_retry() {
    let path = write_state_snapshot(
        "expandable-pending.pickle",
        &[one_run(vec![
            (MIB, MIB, "active_allocated"),
            (38 * MIB, 38 * MIB, "active_pending_free"),
            (MIB, 0, "inactive"),
        ])],
        None,
    );
    let r = request(&path, &["--request", "15MiB"]);
    assert_eq!(r["outcome"], "cached", "{r}");
    assert_eq!(r["block_address"], SEG + MIB);
    assert_eq!(r["block_was_pending"], true);
    assert_eq!(r["retried"], true);
    assert_eq!(calls(&r), &[value!({"call": "unmap", "bytes": 20 * MIB})]);
    let text = String::from_utf8_lossy(&state(&path, &["--request", "15MiB"]).stdout).into_owned();
    assert!(
        text.contains(&format!(
            "served from the block of 38.00 MiB at {:#x}, whose free was pending",
            SEG + MIB
        )) && text.contains(
            "after these calls to the device: unmapped 20.00 MiB of free cached pages (a retry, \
             after giving memory back)"
        ),
        "{text}"
    );
    std::fs::remove_file(path).unwrap();
}

/// Every call is told, in order: a page mapped that the retry then unmaps with the other free
/// pages, before mapping what the request needs; a native segment returned with cudaFree
/// (the program turned expandable segments on after it started) is not counted as unmapped.
#[test]
fn the_calls_on_the_way_are_listed_in_order() {
    // Stream 0's range: 30 MiB allocated, 10 MiB free, a page unmapped, a free page. Stream 1
    // holds 40 MiB free in a range of its own.
    let runs = vec![
        one_run(vec![
            (30 * MIB, 30 * MIB, "active_allocated"),
            (10 * MIB, 0, "inactive"),
        ]),
        Segment {
            address: SEG + 60 * MIB,
            ..one_run(vec![(20 * MIB, 0, "inactive")])
        },
        Segment {
            address: SEG + (1 << 40),
            stream: 1,
            ..one_run(vec![(40 * MIB, 0, "inactive")])
        },
    ];
    let path = write_state_snapshot("expandable-calls.pickle", &runs, None);
    let args = [
        "--request",
        "75MiB",
        "--device-free",
        "20MiB",
        "--device-memory",
        "1GiB",
    ];
    let r = request(&path, &args);
    assert_eq!(r["outcome"], "mapped_pages", "{r}");
    assert_eq!(
        calls(&r),
        &[
            value!({"call": "map", "bytes": 20 * MIB}),
            value!({"call": "unmap", "bytes": 80 * MIB}),
            value!({"call": "map", "bytes": 80 * MIB}),
        ]
    );
    assert_eq!(
        (r["mapped_bytes"].as_u64(), r["unmapped_bytes"].as_u64()),
        (Some(100 * MIB), Some(80 * MIB))
    );
    let text = String::from_utf8_lossy(&state(&path, &args).stdout).into_owned();
    assert!(
        text.contains(
            "after these calls to the device: mapped 20.00 MiB of pages, then unmapped \
                       80.00 MiB of free cached pages, then mapped 80.00 MiB of pages"
        ),
        "{text}"
    );

    // A native segment, wholly free, beside a range of stream 0.
    let mixed = vec![
        Segment {
            expandable: false,
            ..one_run(vec![(40 * MIB, 0, "inactive")])
        },
        Segment {
            address: SEG + (1 << 40),
            ..one_run(vec![(20 * MIB, 20 * MIB, "active_allocated")])
        },
    ];
    let mixed = write_state_snapshot("expandable-mixed.pickle", &mixed, None);
    // One expandable segment among native ones makes the state expandable.
    let j = json(&state(&mixed, &["--json"]));
    assert_eq!(j["expandable_segments"], true, "{j}");
    // Its free memory is not all pages to unmap: the native segment's is returned only whole.
    assert_eq!(j["both_segment_kinds"], true, "{j}");
    let text = String::from_utf8_lossy(&state(&mixed, &[]).stdout).into_owned();
    assert!(
        text.contains(
            "40.00 MiB of the 60.00 MiB reserved (66.7%) is cached free, in 1 block. The \
             snapshot holds native segments beside expandable ones (expandable segments turned \
             on while the program ran, or a CUDA graph's private pool kept on native segments): \
             when a request finds no room the free pages of the expandable ones are unmapped, \
             and a native segment is returned to the device only when wholly free."
        ),
        "{text}"
    );
    assert!(!text.contains("The segments are expandable"), "{text}");
    let r = request(&mixed, &["--request", "50MiB", "--device-free", "20MiB"]);
    assert_eq!(r["outcome"], "mapped_pages", "{r}");
    assert_eq!(r["unmapped_bytes"], 0);
    assert_eq!(
        calls(&r),
        &[
            value!({"call": "release", "segments": 1, "bytes": 40 * MIB}),
            value!({"call": "map", "bytes": 60 * MIB}),
        ]
    );
    for p in [path, mixed] {
        std::fs::remove_file(p).unwrap();
    }
}

/// A request on a stream with no range gets one reserved for it.
#[test]
fn a_stream_without_a_range_gets_one() {
    let path = write_state_snapshot("expandable-stream.pickle", &runs(), None);
    let args = [
        "--request",
        "30MiB",
        "--stream",
        "7",
        "--device-free",
        "40MiB",
    ];
    let r = request(&path, &args);
    assert_eq!(r["outcome"], "mapped_pages", "{r}");
    assert_eq!(r["new_range"], true);
    assert_eq!(r["mapped_bytes"], 40 * MIB);
    let range = r["range_address"].as_u64().unwrap();
    assert_eq!(r["served_address"], range);
    assert_eq!(r["range_bytes"], 120 * MIB);
    // The calls in order: the range reserved (where, how large), then its pages mapped.
    assert_eq!(
        r["device_calls"].as_array().unwrap(),
        &[
            value!({"call": "reserve_range", "address": range, "bytes": 120 * MIB}),
            value!({"call": "map", "bytes": 40 * MIB}),
        ]
    );
    let text = String::from_utf8_lossy(&state(&path, &args).stdout).into_owned();
    assert!(
        text.contains(&format!(
            "by mapping 40.00 MiB of pages into a range of {} reserved for it at {range:#x}.",
            "120.00 MiB"
        )),
        "{text}"
    );
    // The ranges taken, and the device memory they were sized from: not given, so inferred.
    assert!(
        text.contains(
            "1⅛ of the device's memory long (102.00 MiB: the reserved memory plus --device-free, \
             as --device-memory was not given), as PyTorch reserves them (a run beyond it begins \
             another range). The ranges: 120.00 MiB at 0x7f0000000000 (large pool, stream 0x0, \
             60.00 MiB mapped); 116.00 MiB at 0x7f1000000000 (small pool, stream 0x0, 2.00 MiB \
             mapped)."
        ),
        "{text}"
    );
    let given = [&args[..], &["--device-memory", "102MiB"]].concat();
    let text = String::from_utf8_lossy(&state(&path, &given).stdout).into_owned();
    assert!(
        text.contains("1⅛ of the device's memory long (102.00 MiB), as PyTorch"),
        "{text}"
    );
    std::fs::remove_file(path).unwrap();
}
