//! `cachealloc state`: the memory state a snapshot records, for snapshots with no allocation
//! trace to replay (as one taken in an out-of-memory handler), and whether a request of a given
//! size would be served in it.

mod support;

use serde_pickle::Value as V;
use support::cli::{cachealloc, json, state};
use support::snapshot_pickle::{
    Segment, dict, int, write, write_segment_list, write_snapshot, write_state_snapshot,
};
use support::trace_lines::write_trace;
use support::traces::trace;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const SEG: u64 = 0x7f00_0000_0000;

/// Two 100 MiB segments with 60 MiB allocated at the front of each and 40 MiB free behind (the
/// second with 5 bytes less requested), and a small segment with 1 KiB allocated; all on the
/// default stream.
fn split_segments() -> Vec<Segment> {
    vec![
        Segment {
            address: SEG,
            stream: 0,
            expandable: false,
            pool_id: (0, 0),
            blocks: vec![
                (1024, 1000, "active_allocated"),
                (2 * MIB - 1024, 0, "inactive"),
            ],
        },
        Segment {
            address: SEG + 0x1000_0000,
            stream: 0,
            expandable: false,
            pool_id: (0, 0),
            blocks: vec![
                (60 * MIB, 60 * MIB, "active_allocated"),
                (40 * MIB, 0, "inactive"),
            ],
        },
        Segment {
            address: SEG + 0x2000_0000,
            stream: 0,
            expandable: false,
            pool_id: (0, 0),
            blocks: vec![
                (60 * MIB, 60 * MIB - 5, "active_allocated"),
                (40 * MIB, 0, "inactive"),
            ],
        },
    ]
}

fn state_json(path: &std::path::Path, extra: &[&str]) -> serde_json::Value {
    json(&state(path, &[extra, &["--json"]].concat()))
}

#[test]
fn reports_each_pool_and_the_largest_free_blocks() {
    let path = write_state_snapshot("pools.pickle", &split_segments(), None);
    let j = state_json(&path, &[]);
    assert_eq!(j["device"], 0);
    assert_eq!(j["replayable"], false);
    let large = &j["pools"]["large"];
    assert_eq!(large["segments"], 2);
    assert_eq!(large["reserved_bytes"], 200 * MIB);
    assert_eq!(large["allocated_bytes"], 120 * MIB);
    assert_eq!(large["requested_bytes"], 120 * MIB - 5);
    assert_eq!(large["free_bytes"], 80 * MIB);
    assert_eq!(large["free_blocks"], 2);
    assert_eq!(large["largest_free_block_bytes"], 40 * MIB);
    assert_eq!(large["free_segments"], 0);
    let all = &j["pools"]["all"];
    assert_eq!(all["reserved_bytes"], 202 * MIB);
    assert_eq!(all["allocated_bytes"], 120 * MIB + 1024);
    assert_eq!(all["free_blocks"], 3);
    let blocks = j["largest_free_blocks"].as_array().unwrap();
    assert_eq!(blocks.len(), 3);
    assert_eq!(blocks[0]["size"], 40 * MIB);
    assert_eq!(blocks[0]["address"], SEG + 0x1000_0000 + 60 * MIB);
    assert_eq!(blocks[2]["pool"], "small");
    assert_eq!(j["request"], serde_json::Value::Null);
    assert!(
        j["settings"]
            .as_str()
            .unwrap()
            .starts_with("defaults (the snapshot names none"),
        "{j}"
    );

    let out = state(&path, &[]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    // The table's rows, each pool's figures in its own row.
    assert!(
        text.contains(
            "            segments      reserved     allocated     requested   free cached  blocks  largest free
large pool         2    200.00 MiB    120.00 MiB    120.00 MiB     80.00 MiB       2     40.00 MiB
small pool         1      2.00 MiB    1024 bytes    1000 bytes      2.00 MiB       1      2.00 MiB
all                3    202.00 MiB    120.00 MiB    120.00 MiB     82.00 MiB       3     40.00 MiB
"
        ),
        "{text}"
    );
    assert!(
        text.contains("(it holds no allocation trace to replay)"),
        "{text}"
    );
    assert!(
        text.contains("82.00 MiB of the 202.00 MiB reserved (40.6%) is cached free, in 3 blocks."),
        "{text}"
    );
    assert!(
        text.contains(
            "The large pool's largest free block is 40.00 MiB (50.0% of its free memory)"
        ),
        "{text}"
    );
    assert!(
        text.contains("Try a request in this state: --request SIZE"),
        "{text}"
    );
    std::fs::remove_file(path).unwrap();

    // All allocated: nothing cached free, and no largest free block to speak of.
    let allocated = || Segment {
        address: SEG + 0x1000_0000,
        stream: 0,
        expandable: false,
        pool_id: (0, 0),
        blocks: vec![(2000 * MIB, 2000 * MIB, "active_allocated")],
    };
    let path = write_state_snapshot("all-allocated.pickle", &[allocated()], None);
    let text = String::from_utf8_lossy(&state(&path, &[]).stdout).into_owned();
    assert!(
        text.contains("\nEvery reserved byte is allocated: nothing is cached free.\n"),
        "{text}"
    );
    std::fs::remove_file(path).unwrap();
    // A sliver free in the small pool: a share under 0.1%, and no large pool's free block.
    let mut segments = split_segments();
    segments.truncate(1);
    segments.push(allocated());
    let path = write_state_snapshot("sliver-free.pickle", &segments, None);
    let text = String::from_utf8_lossy(&state(&path, &[]).stdout).into_owned();
    assert!(
        text.contains("2.00 MiB of the 1.96 GiB reserved (under 0.1%) is cached free, in 1 block."),
        "{text}"
    );
    assert!(
        !text.contains("The large pool's largest free block"),
        "{text}"
    );
    std::fs::remove_file(path).unwrap();
}

/// Memory of private pools (CUDA graphs', MemPools') is reported apart, and a request to the
/// default pools neither takes their free blocks nor returns their wholly free segments: the
/// state of `split_segments` with a private pool's 100 MiB segment (35 MiB free behind an
/// allocation) and its wholly free 60 MiB segment.
#[test]
fn private_pools_are_reported_apart_and_serve_no_request() {
    let mut segments = split_segments();
    segments.push(Segment {
        address: SEG + 0x3000_0000,
        stream: 0,
        expandable: false,
        pool_id: (0, 1),
        blocks: vec![
            (65 * MIB, 65 * MIB, "active_allocated"),
            (35 * MIB, 0, "inactive"),
        ],
    });
    segments.push(Segment {
        address: SEG + 0x4000_0000,
        stream: 0,
        expandable: false,
        pool_id: (0, 1),
        blocks: vec![(60 * MIB, 0, "inactive")],
    });
    let path = write_state_snapshot("private.pickle", &segments, None);
    let j = state_json(&path, &[]);
    let pools = &j["pools"];
    assert_eq!(pools["private_pool_ids"], serde_json::json!([[0, 1]]));
    let private = &pools["private"];
    assert_eq!(private["segments"], 2);
    assert_eq!(private["reserved_bytes"], 160 * MIB);
    assert_eq!(private["free_bytes"], 95 * MIB);
    assert_eq!(private["free_segments"], 1);
    // The default pools' figures are split_segments' alone; `all` counts every pool.
    assert_eq!(pools["large"]["reserved_bytes"], 200 * MIB);
    assert_eq!(pools["large"]["largest_free_block_bytes"], 40 * MIB);
    assert_eq!(pools["all"]["reserved_bytes"], 362 * MIB);
    assert_eq!(pools["all"]["free_bytes"], 82 * MIB - 1024 + 95 * MIB);
    let listed: Vec<u64> = j["largest_free_blocks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["size"].as_u64().unwrap())
        .collect();
    assert_eq!(listed, [40 * MIB, 40 * MIB, 2 * MIB - 1024]);

    // 30 MiB: best fit in the default pools is a 40 MiB block, not the private 35 MiB one.
    let r = &state_json(&path, &["--request", "30MiB"])["request"];
    assert_eq!(r["outcome"], "cached", "{r}");
    assert_eq!(r["block_address"], SEG + 0x1000_0000 + 60 * MIB);
    // 50 MiB on a full device: the private pool's wholly free 60 MiB segment is not returned to
    // make room, so no new segment can be had.
    let r = &state_json(&path, &["--request", "50MiB"])["request"];
    assert_eq!(r["outcome"], "out_of_memory", "{r}");
    assert_eq!(r["oom"]["kind"], "fragmentation", "{r}");

    let out = state(&path, &["--request", "50MiB"]);
    let text = String::from_utf8_lossy(&out.stdout);
    let row = text.lines().find(|l| l.starts_with("private "));
    let words: Vec<&str> = row.map_or(vec![], |l| l.split_whitespace().collect());
    assert_eq!(
        words[..],
        [
            "private", "2", "160.00", "MiB", "65.00", "MiB", "65.00", "MiB", "95.00", "MiB", "2",
            "60.00", "MiB"
        ],
        "{text}"
    );
    assert!(
        text.contains(
            "160.00 MiB of the 362.00 MiB reserved is in a private pool (CUDA graphs' or \
             torch.cuda.MemPools', segment_pool_id (0, 1)), 95.00 MiB of it cached free there."
        ),
        "{text}"
    );
    assert!(
        text.contains("the request's trial holds the private pools' memory as allocated"),
        "{text}"
    );
    assert!(
        text.contains(
            "82.00 MiB of the 202.00 MiB the default pools reserve (40.6%) is cached free, in 3 \
             blocks."
        ),
        "{text}"
    );
    // The out-of-memory report counts the private pools as allocated, and says so.
    assert!(
        text.contains(
            "Of the memory counted allocated above, 160.00 MiB is the private pools' (95.00 MiB \
             of it cached free there"
        ),
        "{text}"
    );
    std::fs::remove_file(path).unwrap();
}

#[test]
fn a_request_is_served_from_a_cached_block_a_new_segment_or_runs_out_of_memory() {
    let path = write_state_snapshot("requests.pickle", &split_segments(), None);
    // 30 MiB: the first 40 MiB block (best fit, lowest address among equals).
    let cached = state_json(&path, &["--request", "30MiB"]);
    let r = &cached["request"];
    assert_eq!(r["outcome"], "cached", "{cached}");
    assert_eq!(r["block_address"], SEG + 0x1000_0000 + 60 * MIB);
    assert_eq!(r["block_bytes"], 40 * MIB);
    assert_eq!(
        (r["pool"].as_str(), r["stream"].as_u64()),
        (Some("large"), Some(0))
    );
    // 4 KiB: the small pool's free block, behind its 1 KiB allocation.
    let small = state_json(&path, &["--request", "4KiB"]);
    let r = &small["request"];
    assert_eq!(r["outcome"], "cached", "{small}");
    assert_eq!(r["pool"], "small");
    assert_eq!(r["block_address"], SEG + 1024);

    // 50 MiB on a full device: 82 MiB is free but in pieces of 40 MiB at most.
    let frag = state_json(&path, &["--request", "50MiB"]);
    let r = &frag["request"];
    assert_eq!(r["outcome"], "out_of_memory", "{frag}");
    assert_eq!(r["oom"]["kind"], "fragmentation");
    assert_eq!(r["oom"]["suggested_max_split_size_mb"], 32);
    assert_eq!(r["settings_may_help"], true);
    let out = state(&path, &["--request", "50MiB"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Fragmentation: "), "{text}");
    assert!(text.contains("_record_memory_history()"), "{text}");
    // The hint's own pointer to a replay is left out: the advice says how to get a trace.
    assert!(
        !text.contains("`cachealloc replay` of a recorded trace"),
        "{text}"
    );

    // With 64 MiB free on the device, a new segment serves it.
    let fresh = state_json(&path, &["--request", "50MiB", "--device-free", "64MiB"]);
    let r = &fresh["request"];
    assert_eq!(r["outcome"], "new_segment", "{fresh}");
    assert_eq!(r["segment_bytes"], 50 * MIB);
    assert_eq!(r["released_segments"], 0);

    // More than is reserved and free together: no setting helps.
    let out = state(&path, &["--request", "100MiB"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Not fragmentation"), "{text}");
    assert!(!text.contains("_record_memory_history()"), "{text}");

    // A stream with nothing cached: the block of the default stream is named.
    let other = state_json(&path, &["--request", "30MiB", "--stream", "0x7"]);
    assert_eq!(other["request"]["oom"]["kind"], "other_stream", "{other}");
    assert_eq!(other["request"]["stream"], 7);
    std::fs::remove_file(path).unwrap();
}

/// 100 small segments of 2 MiB, each holding a live 512 KiB block: 150 MiB of the small pool
/// is unallocated, and a 100 MiB request with 60 MiB free on the device would fit only in it.
/// No setting gives it to a large request: its own kind, with no advice on finding a setting.
#[test]
fn the_small_pools_memory_is_no_room_for_a_large_request() {
    let segments: Vec<Segment> = (0..100)
        .map(|k| Segment {
            address: SEG + k * 2 * MIB,
            stream: 0,
            expandable: false,
            pool_id: (0, 0),
            blocks: vec![
                (MIB / 2, MIB / 2, "active_allocated"),
                (3 * MIB / 2, 0, "inactive"),
            ],
        })
        .collect();
    let path = write_state_snapshot("small_pool_held.pickle", &segments, None);
    let args = ["--request", "100MiB", "--device-free", "60MiB"];
    let j = state_json(&path, &args);
    let r = &j["request"];
    assert_eq!(r["outcome"], "out_of_memory", "{j}");
    assert_eq!(r["oom"]["kind"], "small_pool_held", "{j}");
    assert_eq!(
        r["oom"]["suggested_max_split_size_mb"],
        serde_json::Value::Null
    );
    assert_eq!(r["settings_may_help"], false);
    let out = state(&path, &args);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("Fragmentation of the small pool: ")
            && text.contains("No allocator setting gives it to this request"),
        "{text}"
    );
    assert!(!text.contains("Which setting avoids this"), "{text}");
    assert!(!text.contains("_record_memory_history()"), "{text}");
    std::fs::remove_file(path).unwrap();
}

/// The device's total memory beyond what is reserved and free is reported as memory held
/// outside the allocator, and the snapshot's settings are used unless --conf replaces them
/// (with settings under which the state could not exist refused).
#[test]
fn device_memory_and_settings() {
    let path = write_state_snapshot(
        "settings.pickle",
        &split_segments(),
        Some(("max_split_size_mb:128", Some(128 * MIB))),
    );
    let j = state_json(
        &path,
        &[
            "--request",
            "50MiB",
            "--device-memory",
            "1GiB",
            "--device-free",
            "10MiB",
        ],
    );
    assert_eq!(j["settings"], "as recorded: max_split_size_mb:128");
    let oom = &j["request"]["oom"];
    assert_eq!(oom["device_total_bytes"], GIB);
    assert_eq!(oom["device_free_bytes"], 10 * MIB);
    assert_eq!(oom["suggested_max_split_size_mb"], 32);
    assert!(
        oom["text"]
            .as_str()
            .unwrap()
            .contains("other allocators): 812.00 MiB."),
        "{oom}"
    );
    let replaced = state_json(&path, &["--conf", "", "--request", "50MiB"]);
    assert_eq!(replaced["settings"], "defaults (from --conf)");
    // 60 MiB blocks split off their segments cannot exist under max_split_size_mb:32.
    let out = state(
        &path,
        &["--conf", "max_split_size_mb:32", "--request", "50MiB"],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains(
            "the snapshot's state cannot exist under the settings max_split_size_mb:32 (from \
             --conf): segment 0x7f0010000000: holds a split-off block of 62914560 bytes"
        ),
        "{err}"
    );
    // The settings given are the program's, as it says: what to do is record a trace.
    assert!(
        err.contains(
            "; --conf names the settings the program ran with, under which it reached this \
             state; to see how other settings would have done, record the allocation history"
        ),
        "{err}"
    );
    // Keys of the preloaded library are named as having no effect on the command that runs.
    let out = state(
        &path,
        &["--conf", "max_split_size_mb:128,free_sync:event,stats:json"],
    );
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "cachealloc: warning: --conf free_sync, stats: configure the preloaded library, not the \
         pool, and have no effect on cachealloc state\n"
    );
    std::fs::remove_file(path).unwrap();
}

/// A free block of max_split_size_mb or more beside others in a segment cannot exist under
/// that setting either: a block is split only for a request below it, and only when the block
/// is below it (or a new segment at most 1 MiB past it). The state is refused with the block
/// named, not reported (and tried with a request, which read "would hold this block, but the
/// largest free cached block is" larger than it).
#[test]
fn a_split_segment_with_a_free_block_of_max_split_size_is_refused() {
    let segments = [Segment {
        address: SEG,
        stream: 0,
        expandable: false,
        pool_id: (0, 0),
        blocks: vec![
            (300 * MIB, 300 * MIB, "active_allocated"),
            (724 * MIB, 0, "inactive"),
        ],
    }];
    let path = write_state_snapshot(
        "free-oversize.pickle",
        &segments,
        Some(("max_split_size_mb:512", Some(512 * MIB))),
    );
    for extra in [&[][..], &["--request", "300MiB"]] {
        let out = state(&path, extra);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {err}");
        assert!(
            err.contains(
                "the snapshot's state cannot exist under the settings as recorded: \
                 max_split_size_mb:512: segment 0x7f0000000000: holds a free block of 759169024 bytes \
                 (724.00 MiB) at 0x7f0012c00000 beside other blocks, but under \
                 max_split_size_mb:512 no split leaves a free block that large"
            ),
            "{err}"
        );
        // The settings are the file's: they may have changed while the program ran.
        assert!(
            err.ends_with(
                "; were they changed while the program ran? give --conf with the ones in force \
                 when the snapshot was taken\n"
            ),
            "{extra:?}: {err}"
        );
    }
    // Under the defaults (no max_split_size) the same state is one PyTorch reaches.
    let j = state_json(&path, &["--conf", "", "--request", "300MiB"]);
    assert_eq!(j["request"]["outcome"], "cached", "{j}");
    std::fs::remove_file(path).unwrap();
}

#[test]
fn wholly_free_segments_and_pending_frees_are_told_apart() {
    let mut segments = split_segments();
    segments[1].blocks[0].2 = "active_pending_free";
    segments.push(Segment {
        address: SEG + 0x3000_0000,
        stream: 0,
        expandable: false,
        pool_id: (0, 0),
        blocks: vec![(20 * MIB, 0, "inactive")],
    });
    let path = write_state_snapshot("free-segment.pickle", &segments, None);
    let j = state_json(&path, &[]);
    assert_eq!(j["pools"]["large"]["free_segments"], 1);
    assert_eq!(j["pools"]["large"]["free_segment_bytes"], 20 * MIB);
    assert_eq!(j["pools"]["all"]["pending_free_bytes"], 60 * MIB);
    let text = String::from_utf8_lossy(&state(&path, &[]).stdout).into_owned();
    assert!(
        text.contains(
            "102.00 MiB of the 222.00 MiB reserved (45.9%) is cached free, in 4 blocks: 20.00 MiB \
             in 1 segment wholly free, which the allocator returns to the device when a request \
             finds no room (as empty_cache() does), and 82.00 MiB in pieces of segments that \
             also hold allocations."
        ),
        "{text}"
    );
    assert!(text.contains("60.00 MiB is freed but pending"), "{text}");
    // A 50 MiB request with 30 MiB free on the device: the pool synchronizes (the pending
    // free completes and its segment is whole) and returns both wholly free segments first.
    let j = state_json(&path, &["--request", "50MiB", "--device-free", "30MiB"]);
    assert_eq!(j["request"]["outcome"], "new_segment", "{j}");
    assert_eq!(j["request"]["released_segments"], 2);
    assert_eq!(j["request"]["released_once_pending"], 1);
    let text = String::from_utf8_lossy(
        &state(&path, &["--request", "50MiB", "--device-free", "30MiB"]).stdout,
    )
    .into_owned();
    assert!(
        text.contains(
            "served by a new segment of 50.00 MiB from the device, after returning 2 \
             free cached segments to it, 1 of them wholly free only once the pending frees \
             completed (the pool synchronizes first)."
        ),
        "{text}"
    );
    let text = String::from_utf8_lossy(
        &state(&path, &["--request", "500MiB", "--device-free", "30MiB"]).stdout,
    )
    .into_owned();
    // Refused even after the segments were returned: the calls on the way are told.
    assert!(
        text.contains(
            "\nOn the way the pool returned 2 free cached segments (120.00 MiB) to the device \
             and retried.\n"
        ),
        "{text}"
    );
    std::fs::remove_file(path).unwrap();
}

#[test]
fn bad_input_is_refused_with_what_is_allowed() {
    let path = write_state_snapshot("bad-input.pickle", &split_segments(), None);
    let empty = write_state_snapshot("no-segments.pickle", &[], None);
    let expandable = write_state_snapshot(
        "expandable.pickle",
        &[Segment {
            address: SEG,
            stream: 0,
            expandable: true,
            pool_id: (0, 0),
            blocks: vec![
                (20 * MIB, 20 * MIB, "active_allocated"),
                (20 * MIB, 0, "inactive"),
            ],
        }],
        None,
    );
    let recorded = write_trace(
        "state-recorded.trace",
        &[("alloc", 0x7f00_0000_0000, 1024, 0)],
    );
    let at_zero = write_state_snapshot(
        "at-zero.pickle",
        &[Segment {
            address: 0,
            stream: 0,
            expandable: false,
            pool_id: (0, 0),
            blocks: vec![(20 * MIB, 20 * MIB, "active_allocated")],
        }],
        None,
    );
    let cases: [(&std::path::Path, &[&str], &str); 15] = [
        (
            &path,
            &["--request", "1MiB", "--device-free", "200TiB"],
            "invalid device free memory \"200TiB\": the simulated device has",
        ),
        // Past 64 bits, the same bound.
        (
            &path,
            &["--request", "1MiB", "--device-free", "99999999999999999999"],
            "invalid device free memory \"99999999999999999999\": the simulated device has",
        ),
        (
            &at_zero,
            &["--request", "1MiB"],
            "a segment of 20971520 bytes at address 0, which is no device address",
        ),
        (
            &path,
            &[
                "--request",
                "1MiB",
                "--conf",
                "per_process_memory_fraction:0.5",
            ],
            "the snapshot reserves 202.00 MiB (211812352 bytes), more than \
             per_process_memory_fraction:0.5 allows of the device's 202.00 MiB: 101.00 MiB",
        ),
        (
            std::path::Path::new(env!("CARGO_TARGET_TMPDIR")),
            &[],
            "it is a directory: give the snapshot file",
        ),
        (&path, &["--device-free", "1GiB"], "--request <SIZE>"),
        (
            &path,
            &["--request", "1152921504606846976"],
            "PyTorch refuses a request of 1 EB",
        ),
        (
            &path,
            &["--request", "20000000TiB"],
            "invalid request \"20000000TiB\": PyTorch refuses a request of 1 EB",
        ),
        (
            &recorded,
            &[],
            "a trace cachealloc recorded, which begins with the process: replay it",
        ),
        (
            &path,
            &["--request", "0"],
            "a request of 0 bytes allocates nothing",
        ),
        (&path, &["--request", "ten"], "invalid size \"ten\""),
        (
            &path,
            &["--stream", "main"],
            "expected a stream id, decimal or 0x hex",
        ),
        (
            &path,
            &["--device", "1"],
            "device 1 has no memory reserved in this snapshot (device 0 has memory reserved)",
        ),
        (
            &path,
            &["--request", "1MiB", "--device-memory", "100MiB"],
            "--device-memory 100.00 MiB (104857600 bytes) is less than the memory the snapshot \
             reserves plus --device-free: 202.00 MiB",
        ),
        (&empty, &[], "the snapshot holds no segments"),
    ];
    for (file, extra, needle) in cases {
        let out = state(file, extra);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {err}");
        assert!(err.contains(needle), "{extra:?}: {err}");
    }
    // An expandable state's free memory is not told in wholly free segments.
    let j = state_json(&expandable, &[]);
    assert_eq!(j["pools"]["all"]["allocated_bytes"], 20 * MIB);
    let text = String::from_utf8_lossy(&state(&expandable, &[]).stdout).into_owned();
    assert!(text.contains("The segments are expandable"), "{text}");
    assert!(!text.contains("wholly free"), "{text}");
    for p in [path, empty, expandable, recorded, at_zero] {
        std::fs::remove_file(p).unwrap();
    }
}

/// A real snapshot taken in an out-of-memory handler (flexgen): 176 segments, 11,296 MiB
/// reserved (SOURCES.md), nearly all of it allocated: true exhaustion, which no setting helps.
#[test]
fn a_real_out_of_memory_snapshot_is_exhaustion() {
    let Some(t) = trace("flexgen-llm-inference/41810ba/oom_snapshot.pickle") else {
        return;
    };
    let j = state_json(&t, &["--request", "100MiB"]);
    assert_eq!(j["pools"]["all"]["segments"], 176);
    assert_eq!(j["pools"]["all"]["reserved_bytes"], 11296 * MIB);
    assert_eq!(j["request"]["oom"]["kind"], "exhausted", "{j}");
    assert_eq!(j["request"]["settings_may_help"], false);
    // The replay that refuses it points here.
    let out = cachealloc(&["replay", t.to_str().unwrap()]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("which cachealloc state "),
        "{out:?}"
    );
}

/// verl's state (127 segments, 24.4 GiB, 569.7 MiB of frees pending on other streams): a
/// 300 MiB request is larger than every free block, and the device is full; the pool waits for
/// the pending frees and returns the 12 segments then wholly free (as an independent model of
/// PyTorch's ladder counted), and a new segment serves it. layout-editing's state has 676 MiB
/// free in pieces of at most 22.5 MiB: a 1 GiB request is fragmentation there.
#[test]
fn real_states_after_the_ladder() {
    if let Some(t) = trace("verl/27ee9a4/mem.pickle") {
        let j = state_json(&t, &["--request", "300MiB"]);
        assert_eq!(j["pools"]["all"]["segments"], 127);
        assert_eq!(j["pools"]["all"]["pending_free_bytes"], 597377024);
        let r = &j["request"];
        assert_eq!(r["outcome"], "new_segment", "{j}");
        assert_eq!(r["released_segments"], 12);
        // 8 of them wholly free in the state, 4 once its pending frees complete.
        assert_eq!(j["pools"]["all"]["free_segments"], 8);
        assert_eq!(r["released_once_pending"], 4);
        // 68 of its segments are two private pools' (as a plain-python count of the pickle
        // says): a 15 MiB request takes a 96.75 MiB block of the default pool, not the private
        // pool's 15.84 MiB one at 0x32e428000.
        let pools = &j["pools"];
        assert_eq!(
            pools["private_pool_ids"],
            serde_json::json!([[0, 1], [0, 2]])
        );
        assert_eq!(pools["private"]["segments"], 68);
        assert_eq!(
            pools["large"]["segments"].as_u64().unwrap()
                + pools["small"]["segments"].as_u64().unwrap(),
            59
        );
        let r = &state_json(&t, &["--request", "15MiB"])["request"];
        assert_eq!(r["outcome"], "cached", "{r}");
        assert_eq!(r["block_address"], 0x7ef1_4414_0000_u64, "{r}");
        let out = cachealloc(&["replay", t.to_str().unwrap()]);
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("; cachealloc state "),
            "{out:?}"
        );
    }
    if let Some(t) = trace("layout-editing/33ade60/dump_snapshot.pickle") {
        let j = state_json(&t, &["--request", "1GiB"]);
        let oom = &j["request"]["oom"];
        assert_eq!(oom["kind"], "fragmentation", "{j}");
        assert_eq!(oom["suggested_max_split_size_mb"], 20);
        assert_eq!(j["request"]["settings_may_help"], true);
    }
}

/// A snapshot of `_record_memory_history(record_cuda=False)` holds the pinned host memory alone
/// (`host_segments`, `host_traces`) and no device's trace, with `device_traces` empty or left out:
/// `replay` says so, not that the history was never recorded, and does not point to `state`,
/// which says it holds host memory alone.
#[test]
fn a_snapshot_of_host_memory_alone_is_refused_as_such() {
    let host_entry = dict(vec![
        ("action", V::String("alloc".into())),
        ("addr", int(0x7f00_0000_0000)),
        ("size", int(MIB)),
        ("stream", int(0)),
    ]);
    let host_segment = dict(vec![
        ("address", int(0x7f00_0000_0000)),
        ("total_size", int(2 * MIB)),
    ]);
    for (name, device_traces) in [
        ("host-only.pickle", Some(V::List(vec![V::List(vec![])]))),
        ("host-only-no-device-traces.pickle", None),
    ] {
        let mut top = vec![
            ("segments", V::List(vec![])),
            ("host_segments", V::List(vec![host_segment.clone()])),
            ("host_traces", V::List(vec![host_entry.clone()])),
        ];
        if let Some(traces) = device_traces {
            top.push(("device_traces", traces));
        }
        let path = write(name, &dict(top));
        let out = cachealloc(&["replay", path.to_str().unwrap()]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name}: {err}");
        assert!(
            err.contains(
                "the snapshot holds host (pinned) memory only and no CUDA device's trace \
                 (_record_memory_history(record_cuda=False) records the host's alone"
            ) && !err.contains("saved without"),
            "{name}: {err}"
        );
        // With no device's segments, `state` has nothing to report either: replay does not
        // point to it, and state says why it has nothing.
        assert!(
            err.contains("nothing to replay, nor a device's memory state")
                && !err.contains("cachealloc state"),
            "{name}: {err}"
        );
        let out = cachealloc(&["state", path.to_str().unwrap()]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name}: {err}");
        assert!(
            err.contains(
                "; it holds host (pinned) memory only, which cachealloc does not read \
                 (_record_memory_history(record_cuda=False) records the host's alone)"
            ),
            "{name}: {err}"
        );
        std::fs::remove_file(path).unwrap();
    }
}

/// `torch.cuda.memory_snapshot()` writes the segments alone, as a list: `state` reports it, and
/// `replay` says it has no trace and points here.
#[test]
fn a_segment_list_is_a_state() {
    let path = write_segment_list("segment-list.pickle", &split_segments());
    let j = state_json(&path, &["--request", "50MiB"]);
    assert_eq!(j["pools"]["all"]["reserved_bytes"], 202 * MIB);
    assert_eq!(j["request"]["oom"]["kind"], "fragmentation");
    let out = cachealloc(&["replay", path.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("torch.cuda.memory_snapshot() writes the segments alone")
            && err.contains("cachealloc state "),
        "{err}"
    );
    std::fs::remove_file(path).unwrap();
    // layout-editing's list: 255 segments on device 1, 3,480 MiB reserved (SOURCES.md).
    let Some(t) = trace("layout-editing/413b2eb/memory_snapshot.pkl") else {
        return;
    };
    let j = state_json(&t, &[]);
    assert_eq!(j["device"], 1);
    assert_eq!(j["pools"]["all"]["segments"], 255);
    assert_eq!(j["pools"]["all"]["reserved_bytes"], 3480 * MIB);
}

/// Several streams: the report lists each one's memory; a request goes on the default stream
/// when it holds memory, must name its stream when none does, and a stream with no memory is
/// noted.
#[test]
fn streams() {
    let mut segments = split_segments();
    segments[2].stream = 7;
    let path = write_state_snapshot("streams.pickle", &segments, None);
    let text = String::from_utf8_lossy(&state(&path, &[]).stdout).into_owned();
    assert!(
        text.contains(
            "Streams (a cached block is reused only on its own): 0x0: 102.00 MiB reserved, \
             42.00 MiB free cached; 0x7: 100.00 MiB reserved, 40.00 MiB free cached."
        ),
        "{text}"
    );
    assert!(text.contains("(large, stream 0x7)"), "{text}");
    let j = state_json(&path, &["--request", "30MiB"]);
    assert_eq!(j["request"]["stream"], 0);
    assert_eq!(j["request"]["block_address"], SEG + 0x1000_0000 + 60 * MIB);
    let j = state_json(&path, &["--request", "30MiB", "--stream", "7"]);
    assert_eq!(j["request"]["block_address"], SEG + 0x2000_0000 + 60 * MIB);
    let out = state(&path, &["--request", "30MiB", "--stream", "9", "--json"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            "stream 0x9 holds no memory of the default pools in this snapshot (their streams: \
             0x0, 0x7)"
        ),
        "{err}"
    );
    assert_eq!(json(&out)["request"]["oom"]["kind"], "other_stream");
    std::fs::remove_file(path).unwrap();

    for s in &mut segments {
        s.stream += 5;
    }
    let path = write_state_snapshot("no-default-stream.pickle", &segments, None);
    let out = state(&path, &["--request", "30MiB"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains(
            "the snapshot's memory is on streams 0x5, 0xc, none of them the default stream: \
             give the request's --stream"
        ),
        "{err}"
    );
    std::fs::remove_file(path).unwrap();

    // All on one stream, not the default: the request goes there, and finds its cached block.
    for s in &mut segments {
        s.stream = 7;
    }
    let path = write_state_snapshot("one-other-stream.pickle", &segments, None);
    let j = state_json(&path, &["--request", "30MiB"]);
    assert_eq!(j["request"]["stream"], 7, "{j}");
    assert_eq!(j["request"]["outcome"], "cached", "{j}");
    std::fs::remove_file(path).unwrap();
}

/// The readable report lists the five largest free cached blocks of the default pools and
/// counts the rest, not the private pools' (reported apart).
#[test]
fn five_free_blocks_are_listed_and_the_rest_counted() {
    let mut segments: Vec<Segment> = (1..=7)
        .map(|k| Segment {
            address: SEG + k * 0x1000_0000,
            stream: 0,
            expandable: false,
            pool_id: (0, 0),
            blocks: vec![
                (20 * MIB, 20 * MIB, "active_allocated"),
                (2 * k * MIB, 0, "inactive"),
            ],
        })
        .collect();
    segments.push(Segment {
        address: SEG + 0x1_0000_0000,
        stream: 0,
        expandable: false,
        pool_id: (0, 3),
        blocks: vec![
            (20 * MIB, 20 * MIB, "active_allocated"),
            (30 * MIB, 0, "inactive"),
        ],
    });
    let path = write_state_snapshot("seven-free.pickle", &segments, None);
    let text = String::from_utf8_lossy(&state(&path, &[]).stdout).into_owned();
    let line = text
        .lines()
        .find(|l| l.starts_with("Largest free cached blocks: "))
        .unwrap_or_else(|| panic!("{text}"));
    assert_eq!(
        line,
        "Largest free cached blocks: 14.00 MiB at 0x7f0071400000 (large), 12.00 MiB at \
         0x7f0061400000 (large), 10.00 MiB at 0x7f0051400000 (large), 8.00 MiB at \
         0x7f0041400000 (large), 6.00 MiB at 0x7f0031400000 (large) (and 2 more)."
    );
    std::fs::remove_file(path).unwrap();
}

/// Under max_split_size_mb a request that no cached block may serve makes the pool return
/// the cached blocks of that size or more first (PyTorch's release_available_cached_blocks):
/// a wholly free 200 MiB segment is returned for a 150 MiB one; without the setting, the
/// 150 MiB request takes that block.
#[test]
fn max_split_size_returns_oversize_blocks_first() {
    let mut segments = split_segments();
    segments.push(Segment {
        address: SEG + 0x4000_0000,
        stream: 0,
        expandable: false,
        pool_id: (0, 0),
        blocks: vec![(200 * MIB, 0, "inactive")],
    });
    let path = write_state_snapshot("oversize.pickle", &segments, None);
    let j = state_json(&path, &["--request", "150MiB"]);
    assert_eq!(j["request"]["outcome"], "cached", "{j}");
    assert_eq!(j["request"]["block_bytes"], 200 * MIB);
    let j = state_json(
        &path,
        &["--request", "150MiB", "--conf", "max_split_size_mb:128"],
    );
    let r = &j["request"];
    assert_eq!(r["outcome"], "new_segment", "{j}");
    assert_eq!(r["segment_bytes"], 150 * MIB);
    assert_eq!(r["released_segments"], 1);
    std::fs::remove_file(path).unwrap();
}

/// PyTorch's "Tried to allocate 2.00 MiB" (or 20.00 MiB) names a segment, not the request:
/// given as the request, the trial says so.
#[test]
fn a_segment_size_given_as_the_request_is_noted() {
    let path = write_state_snapshot("segment-size.pickle", &split_segments(), None);
    for (size, range) in [("2MiB", "up to 1 MiB"), ("20MiB", "of 1-10 MiB")] {
        let out = state(&path, &["--request", size]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{err}");
        assert!(
            err.contains("names the segment it tried to obtain, for any request ")
                && err.contains(range),
            "{size}: {err}"
        );
    }
    let out = state(&path, &["--request", "3MiB"]);
    assert!(out.stderr.is_empty(), "{out:?}");
    // No free memory is no size to misread.
    let out = state(&path, &["--request", "3MiB", "--device-free", "0"]);
    assert!(out.stderr.is_empty(), "{out:?}");
    std::fs::remove_file(path).unwrap();
}

/// A device other than the one `replay` picks by itself is named in the command the header
/// gives (code_location: device 0 is replay's default).
#[test]
fn the_replay_command_names_the_device() {
    let Some(t) = trace("code_location/52e52b2/memory_snapshot.pickle") else {
        return;
    };
    let j = state_json(&t, &["--device", "1"]);
    let command = j["replay_command"].as_str().unwrap();
    assert!(command.ends_with(" --device 1"), "{command}");
    // The message to copy the request's sizes from is the one for this device.
    let text = String::from_utf8_lossy(&state(&t, &["--device", "1"]).stdout).into_owned();
    assert!(
        text.contains("\"Tried to allocate SIZE. GPU 1 has a total capacity of SIZE"),
        "{text}"
    );
    assert_eq!(j["expandable_segments"], true);
    let j = state_json(&t, &[]);
    assert!(
        !j["replay_command"].as_str().unwrap().contains("--device"),
        "{j}"
    );
}

/// What a user may misread is said: a number without a unit is bytes; a request that fits did
/// not fail in this state (so the snapshot is not the failing moment, or the inputs differ);
/// an exhaustion found without the device's total memory may be memory held elsewhere.
#[test]
fn notes_for_what_may_be_misread() {
    let path = write_state_snapshot("notes.pickle", &split_segments(), None);
    let out = state(&path, &["--request", "300", "--device-free", "120"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--request 300 is read as 300 bytes")
            && err.contains("--device-free 120 is read as 120 bytes"),
        "{err}"
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("In this state the request fits. If the program ran out of memory here"),
        "{text}"
    );
    // The block the request needs: 300 bytes round up to 512 in the small pool.
    assert!(
        text.contains(
            "Trying a request of 300 bytes on stream 0x0 (a block of 512 bytes in the small pool)"
        ),
        "{text}"
    );
    let j = state_json(&path, &["--request", "300"]);
    assert_eq!(j["request"]["requested_bytes"], 300);
    assert_eq!(j["request"]["rounded_bytes"], 512);
    let text = String::from_utf8_lossy(&state(&path, &["--request", "100MiB"]).stdout).into_owned();
    assert!(
        text.contains("The device's total memory was not given"),
        "{text}"
    );
    let text = String::from_utf8_lossy(
        &state(&path, &["--request", "100MiB", "--device-memory", "1GiB"]).stdout,
    )
    .into_owned();
    assert!(!text.contains("total memory was not given"), "{text}");
    assert!(
        text.contains("Memory outside cachealloc: 822.00 MiB"),
        "{text}"
    );
    // Exhaustion on a device whose total was given (all of it the pool's): nothing to add.
    let exhausted = ["--request", "100MiB", "--device-memory", "202MiB"];
    let j = state_json(&path, &exhausted);
    assert_eq!(j["request"]["oom"]["kind"], "exhausted", "{j}");
    let text = String::from_utf8_lossy(&state(&path, &exhausted).stdout).into_owned();
    assert!(!text.contains("total memory was not given"), "{text}");
    std::fs::remove_file(path).unwrap();
}

/// The header offers the replay command only for a trace that allocates: sketchkv2's trace is
/// one free of memory from before it, which a plain replay refuses.
#[test]
fn no_replay_command_for_a_trace_of_frees_alone() {
    let Some(t) = trace("sketchkv2/b118ae0/my_snapshot.pickle") else {
        return;
    };
    let j = state_json(&t, &[]);
    assert_eq!(j["trace_entries"], 1);
    assert_eq!(j["replayable"], false);
    assert_eq!(j["replay_command"], serde_json::Value::Null);
}

/// A trace of one failed request (its `oom` entry, no allocation) is replayable: the header
/// offers the replay command, and the replay runs the request.
#[test]
fn a_trace_of_an_out_of_memory_alone_is_replayable() {
    let path = write_snapshot(
        "oom-alone.pickle",
        &split_segments(),
        &[("oom", 0, 300 * MIB)],
        None,
    );
    let j = state_json(&path, &[]);
    assert_eq!(j["trace_entries"], 1);
    assert_eq!(j["replayable"], true, "{j}");
    assert!(
        j["replay_command"]
            .as_str()
            .is_some_and(|c| c.starts_with("cachealloc replay")),
        "{j}"
    );
    let out = cachealloc(&["replay", path.to_str().unwrap(), "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(json(&out)["recorded_oom_requests"], 1);
    std::fs::remove_file(path).unwrap();
}

/// cachealloc keeps no private pools (CUDA graphs', MemPools'): a replay of a recording that has
/// them says that their requests are served from the default pools, in both modes, and replays.
#[test]
fn replays_say_that_private_pools_are_not_kept_apart() {
    const MIB: u64 = 1 << 20;
    const SEG: u64 = 0x7f00_0000_0000;
    let segment = |address, pool_id| Segment {
        address,
        stream: 0,
        expandable: false,
        pool_id,
        blocks: vec![(20 * MIB, 0, "inactive")],
    };
    let path = write_snapshot(
        "private-trace.pickle",
        &[segment(SEG, (0, 0)), segment(SEG + 0x1000_0000, (1, 0))],
        &[
            ("segment_alloc", SEG + 0x1000_0000, 20 * MIB),
            ("alloc", SEG + 0x1000_0000, 4 * MIB),
            ("free_completed", SEG + 0x1000_0000, 4 * MIB),
        ],
        None,
    );
    for faithful in [false, true] {
        let mut args = vec!["replay", path.to_str().unwrap(), "--json"];
        if faithful {
            args.push("--faithful");
        }
        let out = cachealloc(&args);
        assert_eq!(json(&out)["allocs"], 1);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(
                "device 0: 1 of the 2 segments at the end (20.00 MiB) belong to private pools \
                 (CUDA graphs' or torch.cuda.MemPools'); cachealloc keeps no private pools, so \
                 the replay serves the requests made in them from the default pools"
            ),
            "{stderr}"
        );
        assert_eq!(
            stderr.contains("the start state holds their segments in the default pools"),
            faithful,
            "{stderr}"
        );
    }
    // A replay refused is refused alone, without the note.
    let out = cachealloc(&[
        "replay",
        path.to_str().unwrap(),
        "--faithful",
        "--device-memory",
        "10MiB",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("note:"), "{stderr}");
    std::fs::remove_file(path).unwrap();
}
