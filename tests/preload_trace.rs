//! End to end: a C program runs under `LD_PRELOAD=libcachealloc.so` against the fake runtime
//! with `CACHEALLOC_CONF=trace:PATH`, and `cachealloc replay PATH` reproduces what the shim did.
//! The shim's own exit statistics (`stats:json`) are the ground truth the replay is held to.

mod support;

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use support::fake_cudart;
use support::shim::{held_file, preloaded, stderr, stdout};
use support::trace_lines::copy_without;

fn program() -> &'static Path {
    static PROGRAM: OnceLock<PathBuf> = OnceLock::new();
    PROGRAM.get_or_init(|| {
        let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/preload/trace_mix.c");
        fake_cudart::compile_c_program(&source, "trace_mix", &["-ldl"])
    })
}

/// Run `scenario` under the shim recording into `dir/trace-%p.jsonl` with the exit statistics
/// in `dir/stats.json`; returns the expanded trace path.
fn record(dir: &Path, scenario: &str, env: &[(&str, &str)]) -> PathBuf {
    record_with(dir, scenario, "", env)
}

/// `record` with `settings` (`key:value,` items) before the recording's own.
fn record_with(dir: &Path, scenario: &str, settings: &str, env: &[(&str, &str)]) -> PathBuf {
    let conf = format!(
        "{settings}trace:{}/trace-%p.jsonl,stats:json,stats_file:{}/stats.json",
        dir.display(),
        dir.display()
    );
    let mut cmd = preloaded(program());
    cmd.arg(scenario)
        .env("CACHEALLOC_CONF", conf)
        .envs(env.iter().copied());
    let (pid, out) = run_with_pid(&mut cmd);
    assert!(
        out.status.success() && stdout(&out).contains(&format!("ok {scenario}")),
        "{scenario} failed:\n{}\n{}",
        stdout(&out),
        stderr(&out)
    );
    dir.join(format!("trace-{pid}.jsonl"))
}

/// Run `cmd` to its end, its output captured; returns its process id and output.
fn run_with_pid(cmd: &mut Command) -> (u32, Output) {
    let child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("program starts");
    let pid = child.id();
    (pid, child.wait_with_output().expect("program runs"))
}

/// The shim's exit statistics of `device` (memory_stats keys).
fn shim_stats(dir: &Path, device: i64) -> Value {
    let text = std::fs::read_to_string(dir.join("stats.json")).expect("stats written at exit");
    let doc: Value = serde_json::from_str(&text).unwrap();
    doc["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["device"] == device)
        .unwrap_or_else(|| panic!("no stats for device {device}: {text}"))["stats"]
        .clone()
}

fn replay(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cachealloc"))
        .arg("replay")
        .args(args)
        .output()
        .expect("cachealloc runs")
}

fn replay_json(trace: &Path, extra: &[&str]) -> Value {
    let mut args = vec![trace.to_str().unwrap(), "--json"];
    args.extend_from_slice(extra);
    let out = replay(&args);
    assert!(
        out.status.success(),
        "replay failed: {}\n{}",
        stderr(&out),
        stdout(&out)
    );
    serde_json::from_str(&stdout(&out)).unwrap()
}

#[test]
fn a_recorded_trace_replays_to_what_the_shim_did() {
    let dir = tempfile::tempdir().unwrap();
    let trace = record(dir.path(), "mix", &[("FAKECUDART_CAPACITY", "1GiB")]);
    let stats = shim_stats(dir.path(), 0);
    let (mallocs, frees) = (&stats["num_device_alloc"], &stats["num_device_free"]);
    let peak = &stats["reserved_bytes.all.peak"];
    assert!(stats["num_ooms"] == 1, "the mix ends in one OOM: {stats}");

    for extra in [&[][..], &["--faithful"][..]] {
        let out = replay_json(&trace, extra);
        assert_eq!(out["recorded_segment_allocs"], *mallocs, "{extra:?}");
        assert_eq!(out["recorded_segment_frees"], *frees, "{extra:?}");
        assert_eq!(out["recorded_peak_reserved_bytes"], *peak, "{extra:?}");
        assert!(out["recorded_oom"].is_object(), "{extra:?}: {out}");
        assert_eq!(out["num_device_alloc"], *mallocs, "{extra:?}");
        assert_eq!(out["peak_reserved_bytes"], *peak, "{extra:?}");
    }
    // The pool's synchronizations (before growing, where its lines mark them) are the faithful
    // replay's too. (The plain replay, with no capacity, does not ask for the failed request
    // again, nor make its synchronizations.)
    let faithful = replay_json(&trace, &["--faithful"]);
    assert_eq!(
        faithful["memory_stats"]["num_sync_all_streams"],
        stats["num_sync_all_streams"]
    );

    // Frees still waiting for their fence at exit are named, and the replay ends with them
    // freed but active, as the shim's statistics have them.
    let text = std::fs::read_to_string(&trace).unwrap();
    let count = |action: &str| text.matches(&format!("\"action\":\"{action}\"")).count();
    let pending = count("free_requested") - count("free_completed");
    assert!(pending > 0, "the mix exits with frees pending: {stats}");
    let plain = replay_json(&trace, &[]);
    assert_eq!(plain["pending_frees"], pending, "{plain}");
    for key in [
        "allocated_bytes.all.current",
        "allocated_bytes.all.peak",
        "allocation.all.current",
        "allocation.all.peak",
        "active_bytes.all.current",
        "active.all.current",
        "requested_bytes.all.current",
    ] {
        assert_eq!(plain["memory_stats"][key], stats[key], "{key}");
    }
    let summary = stdout(&replay(&[trace.to_str().unwrap()]));
    assert!(
        summary.contains(&format!(
            "still pending at the end: {pending} allocations whose free was waiting for \
             device work when the recording ended (freed, still active"
        )),
        "{summary}"
    );

    // Complete: the file ends with its `end` line, and the replay warns of nothing. Without
    // that line (the program killed between two writes) the replay says the end may be lost.
    assert!(
        text.lines().last().unwrap().contains(r#""action":"end""#),
        "{}",
        text.lines().last().unwrap()
    );
    assert!(!stderr(&replay(&[trace.to_str().unwrap()])).contains("warning"));
    let killed = dir.path().join("killed.jsonl");
    let kept = text.lines().count() - 1;
    let lines: Vec<&str> = text.lines().take(kept).collect();
    std::fs::write(&killed, lines.join("\n") + "\n").unwrap();
    let out = replay(&[killed.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("the recording has no end line: the program did not reach its exit"),
        "{}",
        stderr(&out)
    );

    let faithful = replay_json(&trace, &["--faithful"]);
    let allocs = faithful["allocs"].as_u64().unwrap();
    assert!(allocs > 1000, "the mix allocates often: {faithful}");
    assert_eq!(
        faithful["allocs_at_recorded_addr"].as_u64(),
        Some(allocs),
        "every allocation lands at its recorded address"
    );
    // The capacity comes from the recorded OOM, which the replay then meets at the same event.
    assert!(faithful["capacity_bytes"].as_u64().unwrap() <= 1 << 30);
    assert_eq!(faithful["num_device_free"], *frees);
    assert_eq!(faithful["num_ooms"], 1);
    assert_eq!(
        faithful["first_oom_event_index"],
        faithful["recorded_oom"]["event_index"]
    );
}

/// With expandable segments, the shim maps pages with the driver (the fake one here), and the
/// faithful replay of its recording maps and unmaps the same pages, in ranges at the recorded
/// addresses: same peak, same retry, the OOM at the same event, every allocation at its address.
#[test]
fn a_recording_with_expandable_segments_replays_page_for_page() {
    let dir = tempfile::tempdir().unwrap();
    let trace = record_with(
        dir.path(),
        "mix",
        "expandable_segments:True,",
        &[("FAKECUDART_CAPACITY", "1GiB")],
    );
    let stats = shim_stats(dir.path(), 0);
    assert_eq!(stats["num_ooms"], 1, "{stats}");
    let faithful = replay_json(&trace, &["--faithful"]);
    assert_eq!(faithful["expandable_segments"], true, "{faithful}");
    assert_eq!(faithful["recorded_expandable_segments"], true);
    let maps = faithful["recorded_segment_maps"].as_u64().unwrap();
    assert!(maps > 5, "the mix maps pages as it grows: {faithful}");
    assert_eq!(faithful["recorded_segment_maps"], stats["num_device_alloc"]);
    assert_eq!(
        faithful["recorded_segment_unmaps"],
        stats["num_device_free"]
    );
    assert_eq!(
        faithful["first_oom_event_index"],
        faithful["recorded_oom"]["event_index"]
    );
    assert!(faithful["allocs"].as_u64().unwrap() > 1000, "{faithful}");
    assert_replays_the_run(&faithful, &stats);
}

/// The faithful replay `faithful` did what the shim's exit statistics `stats` say the run did:
/// the same device calls, peak reserved and retries, every allocation at its recorded address.
fn assert_replays_the_run(faithful: &Value, stats: &Value) {
    for (replayed, run) in [
        ("num_device_alloc", "num_device_alloc"),
        ("num_device_free", "num_device_free"),
        ("peak_reserved_bytes", "reserved_bytes.all.peak"),
        ("num_alloc_retries", "num_alloc_retries"),
    ] {
        assert_eq!(faithful[replayed], stats[run], "{replayed}: {faithful}");
    }
    // The pool's synchronizations too, where the recording marks them.
    assert_eq!(
        faithful["memory_stats"]["num_sync_all_streams"],
        stats["num_sync_all_streams"]
    );
    let allocs = faithful["allocs"].as_u64().unwrap();
    assert_eq!(faithful["allocs_at_recorded_addr"].as_u64(), Some(allocs));
}

/// A recording replayed on a smaller device does what the program did on that device, where a
/// free completes later than the program asked (recorded at 1 GiB, run and replayed at
/// 500 MiB): the pool's synchronizations complete it, those the recording never made. A
/// `cudaFree` pending under `free_sync:device` completes where the pool synchronizes before
/// growing, and the request reuses its block; a free that waits for another stream's work
/// (`cachealloc_record_stream`) where the 250 MiB request's retry synchronizes, which then
/// releases its segment. Held until the recording's completion, either free made the replay
/// run out of memory. A `cudaFreeAsync` under `free_sync:device` waits for its stream only:
/// the 80 MiB request grows without synchronizing, and its retry completes the free and
/// releases its segment (its `free_requested` says so: taken for a `cudaFree`, as the lines
/// of a version 6 file would have it, the free made the replay synchronize before growing and
/// serve the request from its block, with one cudaMalloc and one cudaFree fewer than the
/// program).
#[test]
fn a_recording_replayed_on_a_smaller_device_does_what_the_program_did_there() {
    for (scenario, settings, mallocs, frees) in [
        ("freed_pending", "", 2, 3),
        ("freed_on_stream", "free_sync:none,", 3, 3),
        ("freed_async", "", 4, 4),
    ] {
        let (large, small) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let capacity = |size| [("FAKECUDART_CAPACITY", size)];
        let trace = record_with(large.path(), scenario, settings, &capacity("1GiB"));
        record_with(small.path(), scenario, settings, &capacity("500MiB"));
        let stats = shim_stats(small.path(), 0);
        assert_eq!(stats["num_device_alloc"], mallocs, "{scenario}: {stats}");
        let out = replay_json(&trace, &["--capacity", "500MiB"]);
        for (replayed, run) in [
            ("num_ooms", "num_ooms"),
            ("num_device_alloc", "num_device_alloc"),
            ("num_device_free", "num_device_free"),
            ("peak_reserved_bytes", "reserved_bytes.all.peak"),
            ("num_alloc_retries", "num_alloc_retries"),
        ] {
            assert_eq!(out[replayed], stats[run], "{scenario}: {replayed}: {out}");
        }
        // Each free completed once, the one completed early too.
        assert_eq!(
            (&out["frees"], &out["frees_of_failed_allocs"]),
            (&frees.into(), &0.into()),
            "{scenario}"
        );
    }
}

/// The seeded mix under `free_sync:device`, recorded on 1 GiB and replayed on smaller devices
/// (and under other settings), does what the program does there: the same device calls,
/// retries, peak reserved memory and synchronizations of the pool. Where the recorded pool
/// synchronized before growing (`sync_before_growth`) the replay's pool synchronizes only
/// where it too finds no free block while a `cudaFree` waits, and the program's
/// `cudaDeviceSynchronize` (`device_synchronize`) completes every free the replay still
/// holds. Taken where the recording completed them, those frees made the replay depart from
/// the program on 340 to 370 MiB (by one or two cudaMalloc or cudaFree calls and 2 to 8 MiB of
/// peak), and under `max_split_size_mb:20` or expandable segments at every capacity.
#[test]
fn the_mix_replayed_on_other_devices_does_what_the_program_did_there() {
    let recorded = tempfile::tempdir().unwrap();
    let trace = record(recorded.path(), "mix", &[("FAKECUDART_CAPACITY", "1GiB")]);
    for (capacity, conf) in [
        ("340MiB", ""),
        ("360MiB", ""),
        ("350MiB", "max_split_size_mb:20"),
        ("700MiB", "max_split_size_mb:20"),
        ("500MiB", "expandable_segments:True"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let settings = if conf.is_empty() {
            String::new()
        } else {
            format!("{conf},")
        };
        record_with(
            dir.path(),
            "mix",
            &settings,
            &[("FAKECUDART_CAPACITY", capacity)],
        );
        let stats = shim_stats(dir.path(), 0);
        let mut args = vec!["--capacity", capacity];
        if !conf.is_empty() {
            args.extend(["--conf", conf]);
        }
        let out = replay_json(&trace, &args);
        for (replayed, run) in [
            ("num_device_alloc", "num_device_alloc"),
            ("num_device_free", "num_device_free"),
            ("num_alloc_retries", "num_alloc_retries"),
            ("num_ooms", "num_ooms"),
            ("peak_reserved_bytes", "reserved_bytes.all.peak"),
        ] {
            assert_eq!(out[replayed], stats[run], "{capacity} {conf}: {replayed}");
        }
        assert_eq!(
            out["memory_stats"]["num_sync_all_streams"], stats["num_sync_all_streams"],
            "{capacity} {conf}"
        );
    }
}

/// On a device without virtual memory management, the shim asked for expandable segments uses
/// fixed ones (one cudaMalloc per segment) while its header still names the setting: the
/// faithful replay follows what the device did, not the header, and says so (it mapped pages
/// for every segment, none at its recorded address).
#[test]
fn a_recording_that_fell_back_to_fixed_segments_replays_them() {
    let dir = tempfile::tempdir().unwrap();
    let trace = record_with(
        dir.path(),
        "mix",
        "expandable_segments:True,",
        &[("FAKECUDART_CAPACITY", "1GiB"), ("FAKECUDART_VMM", "0")],
    );
    let header = std::fs::read_to_string(&trace).unwrap();
    assert!(
        header
            .lines()
            .next()
            .unwrap()
            .contains("expandable_segments:True"),
        "{header}"
    );
    let stats = shim_stats(dir.path(), 0);
    let faithful = replay_json(&trace, &["--faithful"]);
    assert_eq!(faithful["expandable_segments"], false, "{faithful}");
    assert_eq!(faithful["recorded_expandable_segments"], false);
    assert!(
        faithful["settings"].as_str().unwrap().contains(
            "the header's expandable_segments:True left out: device 0's pool made cudaMalloc \
             calls and mapped no page"
        ),
        "{faithful}"
    );
    assert_eq!(
        faithful["recorded_segment_allocs"],
        stats["num_device_alloc"]
    );
    assert_replays_the_run(&faithful, &stats);
}

/// With expandable segments, a small allocation first reserves the small pool's range, and the
/// large pool's range is reserved below it, a little over 1 1/8 of the device's memory lower. A
/// faithful replay sizes its ranges from that distance and still lands every allocation at its
/// recorded address, on devices of several sizes (at 4 GiB, the large range once came out a
/// page longer than the distance and was placed elsewhere: 1 of 2 at the recorded address).
#[test]
fn an_expandable_recording_whose_small_range_came_first_replays_at_its_addresses() {
    for capacity in ["1GiB", "4GiB", "16GiB", "80GiB"] {
        let dir = tempfile::tempdir().unwrap();
        let trace = record_with(
            dir.path(),
            "small_first",
            "expandable_segments:True,",
            &[("FAKECUDART_CAPACITY", capacity)],
        );
        let faithful = replay_json(&trace, &["--faithful"]);
        assert_eq!(faithful["allocs"], 4, "{capacity}: {faithful}");
        assert_eq!(
            faithful["allocs_at_recorded_addr"], 4,
            "{capacity}: {faithful}"
        );
        assert_eq!(
            faithful["recorded_segment_maps"],
            faithful["num_device_alloc"]
        );
    }
}

/// The lines of `trace` (after the header) whose action is `action`.
fn lines_of(trace: &Path, action: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(trace).unwrap();
    text.lines()
        .skip(1)
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|e| e["action"] == action)
        .collect()
}

/// A request too large for the device still reserves its range, and a later large allocation
/// maps its pages there, after the small pool reserved its own range: the range's first map
/// comes after another range's. The recording names each range where it was reserved, so a
/// faithful replay reserves them in the same order, at the same addresses; from the page maps
/// alone (a file without the range lines, as a PyTorch snapshot is), the ranges come out in the
/// order of their first maps and the allocations land elsewhere.
#[test]
fn ranges_are_replayed_where_and_when_the_recording_reserved_them() {
    let dir = tempfile::tempdir().unwrap();
    let trace = record_with(
        dir.path(),
        "huge_first",
        "expandable_segments:True,",
        &[("FAKECUDART_CAPACITY", "1GiB")],
    );
    let reserved = lines_of(&trace, "range_reserve");
    let maps = lines_of(&trace, "segment_map");
    assert_eq!(reserved.len(), 2, "the large range, then the small one");
    // The request's own pages: 4 GiB is 204.8 pages of 20 MiB.
    assert_eq!(reserved[0]["size"].as_u64(), Some(205 * (20 << 20)));
    assert_eq!(reserved[0]["page"].as_u64(), Some(20 << 20));
    assert_eq!(reserved[1]["page"].as_u64(), Some(2 << 20));
    assert_eq!(
        maps[0]["addr"], reserved[1]["addr"],
        "the small range maps first"
    );
    assert_eq!(maps[1]["addr"], reserved[0]["addr"]);
    let faithful = replay_json(&trace, &["--faithful"]);
    assert_eq!(faithful["allocs"], 2, "{faithful}");
    assert_eq!(faithful["allocs_at_recorded_addr"], 2, "{faithful}");
    assert_eq!(faithful["num_ooms"], 1, "{faithful}");

    let stripped = trace.with_extension("without-ranges.jsonl");
    copy_without(&trace, &["range_reserve", "range_release"], &stripped);
    let inferred = replay_json(&stripped, &["--faithful"]);
    assert_eq!(inferred["allocs"], 2, "{inferred}");
    assert_eq!(
        inferred["allocs_at_recorded_addr"], 0,
        "the ranges' order inferred from their first maps: {inferred}"
    );
}

/// On a GPU the context (and any other user) holds memory the allocator never sees, so the
/// capacity a faithful replay infers from an out-of-memory is less than the device's memory; a
/// memory fraction limits a fraction of the device's memory, not of that capacity. The
/// recording names the device's memory, and the replay's fraction limits what the shim's did.
#[test]
fn a_memory_fraction_is_replayed_of_the_recorded_device_memory() {
    let dir = tempfile::tempdir().unwrap();
    let trace = record_with(
        dir.path(),
        "mix",
        "per_process_memory_fraction:0.5,garbage_collection_threshold:0.6,",
        &[
            ("FAKECUDART_CAPACITY", "1GiB"),
            ("FAKECUDART_CONTEXT", "300MiB"),
        ],
    );
    let memory = lines_of(&trace, "device_memory");
    assert_eq!(memory.len(), 1, "one line, at the pool's creation");
    assert_eq!(memory[0]["size"].as_u64(), Some(1 << 30));
    let stats = shim_stats(dir.path(), 0);
    let faithful = replay_json(&trace, &["--faithful"]);
    assert_eq!(faithful["device_memory_bytes"].as_u64(), Some(1 << 30));
    assert_eq!(
        faithful["capacity_bytes"].as_u64(),
        Some((1 << 30) - (300 << 20)),
        "what the allocator could have had: {faithful}"
    );
    for (replayed, shim) in [
        ("peak_reserved_bytes", "reserved_bytes.all.peak"),
        ("num_device_alloc", "num_device_alloc"),
        ("num_device_free", "num_device_free"),
        ("num_alloc_retries", "num_alloc_retries"),
        ("num_ooms", "num_ooms"),
    ] {
        assert_eq!(faithful[replayed], stats[shim], "{replayed}: {faithful}");
    }
    assert_eq!(faithful["allocs_at_recorded_addr"], faithful["allocs"]);
    // A capacity beyond the recorded memory, for a what-if, makes a device that large.
    let larger = replay_json(&trace, &["--faithful", "--capacity", "2GiB"]);
    assert_eq!(larger["device_memory_bytes"].as_u64(), Some(2 << 30));

    // Without the line, the fraction is taken of the capacity: a lower limit, under which the
    // replay collects and releases where the shim did not, and departs from the recording.
    let stripped = trace.with_extension("without-memory.jsonl");
    copy_without(&trace, &["device_memory"], &stripped);
    let guessed = replay_json(&stripped, &["--faithful"]);
    assert_eq!(guessed["device_memory_bytes"], guessed["capacity_bytes"]);
    assert_ne!(guessed["num_device_alloc"], stats["num_device_alloc"]);
    assert!(
        guessed["allocs_at_recorded_addr"].as_u64().unwrap() < guessed["allocs"].as_u64().unwrap(),
        "{guessed}"
    );
}

/// A program that sets the memory fraction as it runs (`cachealloc_set_memory_fraction`, as
/// PyTorch's `set_per_process_memory_fraction` does through the pluggable allocator): each call
/// is one `memory_fraction` line — the one made before the device's first allocation too, and
/// none for the pool made after a device reset, which starts with the fraction in force — and
/// the replay sets each where the program did (the garbage collection it turns on included) to
/// what the shim did. Without the lines it departs.
#[test]
fn memory_fractions_set_as_the_program_runs_are_replayed_where_it_set_them() {
    let dir = tempfile::tempdir().unwrap();
    let trace = record_with(
        dir.path(),
        "fraction",
        "garbage_collection_threshold:0.5,",
        &[("FAKECUDART_CAPACITY", "1GiB")],
    );
    let fractions: Vec<f64> = lines_of(&trace, "memory_fraction")
        .iter()
        .map(|line| line["fraction"].as_f64().unwrap())
        .collect();
    assert_eq!(fractions, [0.6, 0.3, 1.0, 0.7]);
    let stats = shim_stats(dir.path(), 0);
    assert!(
        stats["num_alloc_retries"].as_u64().unwrap() > 0,
        "the limit of 30 % made the pool release and retry: {stats}"
    );
    let faithful = replay_json(&trace, &["--faithful"]);
    assert_replays_the_run(&faithful, &stats);
    assert_eq!(faithful["memory_fraction_calls"], 4);
    let summary = stdout(&replay(&[trace.to_str().unwrap(), "--faithful"]));
    assert!(
        summary.contains(
            "4 memory fraction calls of the program's, each in force from where it \
             was made"
        ),
        "{summary}"
    );
    // A plain replay's device is unlimited: a fraction of it limits nothing, which it says.
    let plain = replay(&[trace.to_str().unwrap()]);
    assert!(
        stderr(&plain).contains(
            "per_process_memory_fraction limits a fraction of the device's \
             memory, and this replay's device is unlimited"
        ),
        "{}",
        stderr(&plain)
    );

    let stripped = trace.with_extension("without-fractions.jsonl");
    copy_without(&trace, &["memory_fraction"], &stripped);
    let unlimited = replay_json(&stripped, &["--faithful"]);
    assert_ne!(
        unlimited["num_alloc_retries"], stats["num_alloc_retries"],
        "{unlimited}"
    );
}

#[test]
fn one_file_holds_every_device() {
    let dir = tempfile::tempdir().unwrap();
    let trace = record(dir.path(), "devices", &[("FAKECUDART_DEVICES", "2")]);
    let text = std::fs::read_to_string(&trace).unwrap();
    let header: Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    assert_eq!(header["format"], "cachealloc-trace");
    assert_eq!(
        header["devices"],
        serde_json::json!([1]),
        "device 1 came first"
    );
    for device in [0i64, 1] {
        let out = replay_json(&trace, &["--device", &device.to_string(), "--faithful"]);
        let stats = shim_stats(dir.path(), device);
        assert_eq!(out["device"], device);
        assert_eq!(out["num_device_alloc"], stats["num_device_alloc"]);
        assert_eq!(out["peak_reserved_bytes"], stats["reserved_bytes.all.peak"]);
        assert_eq!(out["allocs_at_recorded_addr"], out["allocs"]);
    }
    let missing = replay(&[trace.to_str().unwrap(), "--device", "5"]);
    assert_eq!(missing.status.code(), Some(2));
    assert!(
        stderr(&missing).contains("devices with events: 0, 1"),
        "{}",
        stderr(&missing)
    );
}

/// `exit()` stops none of the program's other threads: while the exit handler finishes the
/// recording, four of them still allocate. The handler waits for the one writing, and the file
/// ends with its `end` line (before, the handler gave up when a thread held the file, which with
/// threads this busy was nine runs in ten: the recording had no end, and its replay warned that
/// the program had been killed), and the statistics report has both devices. Three runs, each
/// of which must end the file and report both.
#[test]
fn a_recording_ends_at_exit_while_other_threads_allocate() {
    for run in 0..3 {
        let dir = tempfile::tempdir().unwrap();
        let trace = record(dir.path(), "busy_exit", &[("FAKECUDART_DEVICES", "2")]);
        let text = std::fs::read_to_string(&trace).unwrap();
        let last = text.lines().last().unwrap();
        assert!(last.contains(r#""action":"end""#), "run {run}: {last}");
        assert_eq!(text.matches(r#""action":"end""#).count(), 1, "run {run}");
        for device in ["0", "1"] {
            let out = replay(&[trace.to_str().unwrap(), "--device", device]);
            assert!(out.status.success(), "run {run}: {}", stderr(&out));
            assert!(
                !stderr(&out).contains("warning"),
                "run {run}: {}",
                stderr(&out)
            );
        }
        // The statistics report, written by the same handler, covers both devices (before,
        // a device whose pool a thread held at that moment was left out of it).
        for device in [0, 1] {
            let stats = shim_stats(dir.path(), device);
            assert!(
                stats["allocation.all.allocated"].as_u64() >= Some(400),
                "run {run}: {stats}"
            );
        }
    }
}

/// A process killed before its first 64 KiB of events still leaves a recording: its header and
/// its first pool call's lines are written when the file is created, so the replay says the
/// program did not reach its exit and replays what there is (before, the file was empty, and
/// the replay refused it as "not a readable Python pickle"). Also when that first call, a
/// cudaMalloc, was its last.
#[test]
fn a_process_killed_early_leaves_a_recording_that_says_so() {
    for scenario in ["killed", "killed_first"] {
        killed_early_leaves_a_recording(scenario);
    }
}

fn killed_early_leaves_a_recording(scenario: &str) {
    let dir = tempfile::tempdir().unwrap();
    let (pid, out) = run_with_pid(preloaded(program()).arg(scenario).env(
        "CACHEALLOC_CONF",
        format!("trace:{}/trace-%p.jsonl", dir.path().display()),
    ));
    assert!(
        stdout(&out).contains(&format!("ok {scenario}")) && out.status.code().is_none(),
        "{}\n{}",
        stdout(&out),
        stderr(&out)
    );
    let trace = dir.path().join(format!("trace-{pid}.jsonl"));
    let text = std::fs::read_to_string(&trace)
        .unwrap_or_else(|e| panic!("{scenario}: {} not written: {e}", trace.display()));
    let header: Value = serde_json::from_str(text.lines().next().unwrap_or_default())
        .unwrap_or_else(|e| panic!("{scenario}: no header ({e}): {text:?}"));
    assert_eq!(header["pid"], pid);
    let replayed = replay(&[trace.to_str().unwrap(), "--json"]);
    assert!(replayed.status.success(), "{}", stderr(&replayed));
    assert!(
        stderr(&replayed)
            .contains("the recording has no end line: the program did not reach its exit"),
        "{}",
        stderr(&replayed)
    );
    let summary: Value = serde_json::from_str(&stdout(&replayed)).unwrap();
    assert!(
        summary["allocs"].as_u64() >= Some(1),
        "{scenario}: {summary}"
    );
}

/// A child forked after its parent's first CUDA call (here a free of memory cachealloc does not
/// hold) but before its first allocation keeps cachealloc and records to its own file, `%p`
/// being its own process id. Before, that free settled the file's name in the parent, so the
/// child recorded under the parent's id (and, had the parent been recording then, beside it,
/// told to put `%p` in a path that had it), and the parent, allocating once the child had
/// ended, replaced the child's recording with its own.
#[test]
fn a_child_forked_before_any_allocation_records_to_its_own_file() {
    let dir = tempfile::tempdir().unwrap();
    let (pid, out) = run_with_pid(preloaded(program()).arg("fork_early").env(
        "CACHEALLOC_CONF",
        format!("trace:{}/trace-%p.jsonl", dir.path().display()),
    ));
    assert!(
        out.status.success() && stdout(&out).contains("ok fork_early"),
        "{}\n{}",
        stdout(&out),
        stderr(&out)
    );
    assert!(
        !stderr(&out).contains("another process"),
        "{}",
        stderr(&out)
    );
    let child: u32 = stdout(&out)
        .lines()
        .find_map(|l| l.strip_prefix("child "))
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or_else(|| panic!("no child line: {}", stdout(&out)));
    let mut names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let mut expected = vec![format!("trace-{pid}.jsonl"), format!("trace-{child}.jsonl")];
    expected.sort();
    assert_eq!(names, expected);
    for (process, size) in [(pid, 2 << 20), (child, 1 << 20)] {
        let trace = dir.path().join(format!("trace-{process}.jsonl"));
        let text = std::fs::read_to_string(&trace).unwrap();
        let header: Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
        assert_eq!(header["pid"], process);
        let allocs = lines_of(&trace, "alloc");
        assert_eq!(allocs.len(), 1, "{text}");
        assert_eq!(allocs[0]["size"], size, "{text}");
    }
}

/// `trace:` alone, as the README's first example sets it (no `stats`): the exit still finishes
/// the recording, its last events and its `end` line, so the replay has nothing to warn about.
#[test]
fn a_recording_without_statistics_is_finished_at_exit() {
    let dir = tempfile::tempdir().unwrap();
    let (pid, out) = run_with_pid(
        preloaded(program())
            .arg("mix")
            .env(
                "CACHEALLOC_CONF",
                format!("trace:{}/trace-%p.jsonl", dir.path().display()),
            )
            .env("FAKECUDART_CAPACITY", "1GiB"),
    );
    assert!(
        out.status.success() && stdout(&out).contains("ok mix"),
        "{}\n{}",
        stdout(&out),
        stderr(&out)
    );
    let trace = dir.path().join(format!("trace-{pid}.jsonl"));
    let text = std::fs::read_to_string(&trace).unwrap();
    let last = text.lines().last().unwrap_or_default();
    assert!(last.contains(r#""action":"end""#), "{last}");
    let replayed = replay(&[trace.to_str().unwrap()]);
    assert!(replayed.status.success(), "{}", stderr(&replayed));
    assert!(
        !stderr(&replayed).contains("warning"),
        "{}",
        stderr(&replayed)
    );
}

#[test]
fn a_process_that_never_calls_cuda_writes_no_trace() {
    let dir = tempfile::tempdir().unwrap();
    record(dir.path(), "nocuda", &[]);
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert!(left.is_empty(), "files were created: {left:?}");
}

#[test]
fn a_broken_trace_is_refused_with_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("broken.jsonl");
    std::fs::write(
        &path,
        "{\"format\":\"cachealloc-trace\",\"version\":1,\"pid\":1,\"devices\":[0],\
         \"settings\":\"\",\"free_sync\":\"device\"}\n\
         {\"t_us\":1,\"device\":0,\"action\":\"alloc\",\"addr\":4096,\"size\":8,\"stream\":0}\n\
         {\"t_us\":2,\"device\":0,\"action\":\"alloc\",\"addr\":\"x\"}\n",
    )
    .unwrap();
    let out = replay(&[path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let message = stderr(&out);
    assert!(
        message.contains("broken.jsonl, line 3: not a valid cachealloc trace"),
        "{message}"
    );
}

#[test]
fn a_trace_path_another_process_is_recording_to_is_left_to_it() {
    let dir = tempfile::tempdir().unwrap();
    let asked = dir.path().join("run.jsonl");
    // Another process's recording in progress: the file exists and its lock is held.
    let theirs = held_file(&asked, "theirs\n");

    let (pid, out) = run_with_pid(
        preloaded(program())
            .arg("mix")
            .env("CACHEALLOC_CONF", format!("trace:{}", asked.display()))
            .env("FAKECUDART_CAPACITY", "1GiB"),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let beside = dir.path().join(format!("run.{pid}.jsonl"));
    let message = stderr(&out);
    assert!(
        message.contains(&format!(
            "another process is recording to {}; this one records to {}",
            asked.display(),
            beside.display()
        )),
        "{message}"
    );
    assert_eq!(std::fs::read_to_string(&asked).unwrap(), "theirs\n");
    let replayed = replay_json(&beside, &[]);
    assert!(replayed["recorded_oom"].is_object(), "{replayed}");

    // A file left by a run that has ended holds no lock: the next run replaces it, quietly.
    // (Unlocked, not only closed: a program another test starts at this moment shares the open
    // file, and with it the lock, until it executes.)
    theirs.unlock().unwrap();
    drop(theirs);
    let again = preloaded(program())
        .arg("mix")
        .env("CACHEALLOC_CONF", format!("trace:{}", asked.display()))
        .env("FAKECUDART_CAPACITY", "1GiB")
        .output()
        .expect("program runs");
    assert!(
        !stderr(&again).contains("another process"),
        "{}",
        stderr(&again)
    );
    assert!(replay_json(&asked, &[])["recorded_oom"].is_object());
}

#[test]
fn a_stats_file_named_another_way_as_the_trace_is_not_taken_for_another_process() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("same.jsonl");
    // The same file, spelled so that the settings' own check (equal paths) does not see it.
    let stats = dir.path().join(".").join("same.jsonl");
    let (pid, out) = run_with_pid(
        preloaded(program())
            .arg("mix")
            .env(
                "CACHEALLOC_CONF",
                format!(
                    "trace:{},stats:json,stats_file:{}",
                    trace.display(),
                    stats.display()
                ),
            )
            .env("FAKECUDART_CAPACITY", "1GiB"),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let message = stderr(&out);
    assert!(!message.contains("another process"), "{message}");
    // The statistics file is claimed at the first call, the trace when its first events are
    // written: the trace goes beside it, and says why.
    let beside = dir.path().join(format!("same.{pid}.jsonl"));
    assert!(
        message.contains(&format!(
            "{} is this process's statistics file (stats_file names it another way); the trace \
             goes to {} instead: give them different files",
            trace.display(),
            beside.display()
        )),
        "{message}"
    );
    // Nothing is lost: the statistics in the one, the trace in the other.
    let stats: Value = serde_json::from_str(&std::fs::read_to_string(&trace).unwrap()).unwrap();
    assert!(stats["devices"].is_array(), "{stats}");
    let replayed = replay_json(&beside, &[]);
    assert!(replayed["recorded_oom"].is_object(), "{replayed}");
}

/// `trace:/dev/stderr` while the program's stderr goes to a file (`2>> job.log`): the recording
/// goes into that file after what was there, through the program's own descriptor, between the
/// lines the program writes there (here the library's out-of-memory warning), every one whole.
/// Before, `/dev/stderr` was opened anew as the file it names: emptied when the first events
/// were written, then written from its start, over what the program wrote there meanwhile.
#[test]
fn a_recording_sent_to_a_redirected_stderr_is_added_to_it() {
    let text = mix_with_stderr_added_to_a_log("trace:/dev/stderr");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "written before the program");
    assert!(
        lines[1].starts_with(r#"{"format":"cachealloc-trace""#),
        "{}",
        lines[1]
    );
    assert!(
        lines.iter().any(|l| l.contains(
            "cudaMalloc: CUDA out of memory. Tried to allocate 4.00 GiB. GPU 0 has a total \
             capacity of 1024.00 MiB"
        )),
        "the warning is whole"
    );
    let events: Vec<Value> = lines
        .iter()
        .filter(|l| l.starts_with(r#"{"t_us""#))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert!(events.len() > 1000, "{}", events.len());
    assert_eq!(events.last().unwrap()["action"], "end");
}

/// The recording and the statistics both sent to the program's redirected stderr: neither empties
/// the file nor overwrites the other (each is written after what is there), so the setting is
/// taken. Before, any `trace` and `stats_file` of the same path were refused as a configuration
/// error, `/dev/stderr` and `/dev/null` included.
#[test]
fn a_recording_and_statistics_may_share_the_programs_stderr() {
    let text =
        mix_with_stderr_added_to_a_log("trace:/dev/stderr,stats:json,stats_file:/dev/stderr");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "written before the program");
    let json: Vec<Value> = lines
        .iter()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert_eq!(json[0]["format"], "cachealloc-trace", "{}", lines[1]);
    let events = json.iter().filter(|v| v.get("t_us").is_some()).count();
    assert!(events > 1000, "{events}");
    let stats: Vec<&Value> = json.iter().filter(|v| v.get("skipped").is_some()).collect();
    assert_eq!(stats.len(), 1, "one statistics report");
    assert!(
        stats[0]["devices"][0]["stats"]["num_ooms"].as_i64() >= Some(1),
        "{}",
        stats[0]
    );
    assert!(
        json.iter().any(|v| v["action"] == "end"),
        "the recording has its end"
    );
}

/// The text of a job's log after `trace_mix mix` ran under `conf` on a 1 GiB device with its
/// stderr added to the log (`2>> job.log`), which held one line before.
fn mix_with_stderr_added_to_a_log(conf: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("job.log");
    std::fs::write(&log, "written before the program\n").unwrap();
    let appended = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
    let out = preloaded(program())
        .arg("mix")
        .env("CACHEALLOC_CONF", conf)
        .env("FAKECUDART_CAPACITY", "1GiB")
        .stderr(appended)
        .output()
        .expect("trace_mix runs");
    assert!(out.status.success(), "{}", stdout(&out));
    std::fs::read_to_string(&log).unwrap()
}

/// `exit()` called while the library holds its event buffer's lock, by the thread holding it (a
/// signal handler that calls `exit` and lands there; here the program's own `clock_gettime`,
/// which the library reads under that lock): the exit handler waits a while for the lock, then
/// leaves the file with what was written to it, and the process ends. Before, the handler
/// waited for the lock for ever, and the process hung at its exit.
#[test]
fn exit_while_the_exiting_thread_holds_the_event_buffer_ends_the_process() {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/preload/exit_in_push.c");
    let program = fake_cudart::compile_c_program(&source, "exit_in_push", &["-ldl"]);
    let dir = tempfile::tempdir().unwrap();
    let mut child = preloaded(&program)
        .env(
            "CACHEALLOC_CONF",
            format!("trace:{}/trace-%p.jsonl", dir.path().display()),
        )
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("exit_in_push starts");
    let pid = child.id();
    let start = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > std::time::Duration::from_secs(30) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the process still had not ended 30 s after its exit()");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success() && stdout(&out).contains("ok exit_in_push"),
        "{:?}\n{}\n{}",
        out.status,
        stdout(&out),
        stderr(&out)
    );
    // What the pool calls before wrote is in the file (the last of it from the writer's
    // buffer); the interrupted call's event and the end are not.
    let trace = dir.path().join(format!("trace-{pid}.jsonl"));
    assert_eq!(lines_of(&trace, "alloc").len(), 2);
    assert_eq!(lines_of(&trace, "free_requested").len(), 2);
    assert!(lines_of(&trace, "end").is_empty());
    let replayed = replay(&[trace.to_str().unwrap()]);
    assert!(replayed.status.success(), "{}", stderr(&replayed));
    assert!(
        stderr(&replayed).contains("the recording has no end line"),
        "{}",
        stderr(&replayed)
    );
}
