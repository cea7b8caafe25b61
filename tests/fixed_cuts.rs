//! Recordings with fixed (not expandable) segments that begin mid-run, made by the pool itself:
//! random workloads (several streams, `empty_cache()` calls that give segments back, a device
//! small enough to run out of memory, so that the pool releases its cache, retries and fails)
//! run through the pool, their events written down as a PyTorch snapshot's trace, their final
//! segments as its state and their settings as PyTorch records them. Each recording replays
//! faithfully to its own figures; then its first entries are cut off between two of the
//! program's calls, and each cut recording — which begins with segments reserved and blocks
//! live, some of them carrying unsplit tails that the trace never shows — must replay exactly
//! too: peak reserved, cudaMalloc and cudaFree counts, retries, the out-of-memory point and
//! every allocation's address; given the device's memory and without it.
//!
//! Under default settings, under `max_split_size_mb` (requests up to 121 MiB: most are oversize,
//! served by a segment of their own or a cached block up to `max_non_split_rounding_mb` larger,
//! whole), with a larger `max_non_split_rounding_mb`, under `roundup_power2_divisions`, under
//! `per_process_memory_fraction` (its limit, half the device, refuses segments), with garbage
//! collection on under it, and with `max_split_size_mb` too. A trace cannot tell a retry from
//! `max_split_size`'s release of oversize blocks or a collection before a new segment, so the
//! retries are compared with those the pool made (the recording's count of them says it may
//! count more). Every recording's inferred capacity, whole or cut, must be the device's, not
//! the limit's.
//!
//! Frees that wait for other streams' work (`record_stream`) too: the same shapes with a fifth of
//! their frees made after a side stream's work, cut where such frees wait (their blocks taken as
//! allocated at the start) and ending with some still waiting (`active_pending_free`), under
//! default settings, a memory fraction, `max_split_size_mb` and garbage collection, alone and
//! with `max_split_size_mb` (see their tests).
//!
//! `CACHEALLOC_CUT_SEEDS` (default 1, cut at every 8th place) sets the recordings per shape; a
//! sweep cuts at every third place, and like the default run allows no departure outside
//! garbage collection and some of the frees that wait (see their tests)
//! (`CACHEALLOC_CUT_SEEDS=40 cargo test --release --test fixed_cuts -- --nocapture`: all of
//! the 9,319 to 9,967 cut recordings of each of the five settings exact both ways; without the
//! fraction, 200 seeds: all of 46,518 to 49,795). `CACHEALLOC_CUT_FIRST_SEED` starts the sweep
//! at another seed, to look at one recording.

use cachealloc::pool::DevicePtr;
use cachealloc::trace::recording::{Action, CallSite};
use support::cli::{cachealloc, json};
use support::cut_replay::{
    CutSweep, assert_replays_exactly, between_operations, departures, sweep_seeds,
};
use support::pool_recorder::{GIB, MIB, Recorder, Shape, StreamFrees, record};
use support::snapshot_pickle::write_recording;

mod support;

const SHAPES: [Shape; 2] = [
    Shape {
        streams: 3,
        ops: 300,
        empty_cache_every: 41,
        small_percent: 40,
        max_large: 100 * MIB,
        live_max: 40,
        device: 8 * GIB,
        stream_frees: None,
    },
    // Runs out of memory: retries release cached segments, some requests fail.
    Shape {
        streams: 2,
        ops: 300,
        empty_cache_every: 0,
        small_percent: 20,
        max_large: 120 * MIB,
        live_max: 40,
        device: 2 * GIB,
        stream_frees: None,
    },
];

/// Record, cut and replay the shapes under the settings of `conf`: none of the cuts may
/// depart.
fn cuts_replay_exactly(conf: &str) {
    cuts_replay(conf, None);
}

/// Record, cut and replay the shapes under the settings of `conf`, allowing 1 cut recording in
/// `allowed_per` to depart (`None`: none), and return what the sweep met.
fn cuts_replay(conf: &str, allowed_per: Option<(usize, usize)>) -> CutSweep {
    let (sweep, first) = sweep_seeds();
    let seeds = sweep.unwrap_or(1);
    let step = if sweep.is_some() { 3 } else { 8 };
    let found = CutSweep::run(&SHAPES, conf, first..first + seeds, step);
    // The shapes do what they are for (over the seeds from 0: a chosen one may not run out).
    assert!(
        first > 0 || (found.ooms >= 1 && found.retries >= 10 && found.device_frees >= 20),
        "{} OOMs, {} retries, {} cudaFrees",
        found.ooms,
        found.retries,
        found.device_frees
    );
    found.check(allowed_per);
    found
}

#[test]
fn recordings_cut_mid_run_replay_exactly() {
    cuts_replay_exactly("");
}

#[test]
fn recordings_cut_mid_run_replay_exactly_under_max_split_size() {
    cuts_replay_exactly("max_split_size_mb:40");
}

#[test]
fn recordings_cut_mid_run_replay_exactly_under_a_larger_non_split_rounding() {
    cuts_replay_exactly("max_split_size_mb:64,max_non_split_rounding_mb:32");
}

#[test]
fn recordings_cut_mid_run_replay_exactly_under_roundup_power2_divisions() {
    cuts_replay_exactly("roundup_power2_divisions:4");
}

/// The limit of `per_process_memory_fraction` refuses segments: the retries and the
/// out-of-memory errors meet it, not the device (the whole of which the pool may not have).
#[test]
fn recordings_cut_mid_run_replay_exactly_under_a_memory_fraction() {
    cuts_replay_exactly("per_process_memory_fraction:0.5");
}

/// A recorder under `max_split_size_mb:40` whose 45 MiB request took a cached 60 MiB segment
/// whole: the request's pointer, and the entries recorded so far (where to cut).
fn an_oversize_block_in_a_cached_segment() -> (Recorder, DevicePtr, usize) {
    let mut recorder = Recorder::new(8 * GIB, "max_split_size_mb:40");
    let first = recorder.malloc(60 * MIB, 0).unwrap();
    recorder.free(first);
    let oversize = recorder.malloc(45 * MIB, 0).unwrap();
    assert_eq!(oversize, first, "the cached segment serves it");
    let cut_at = recorder.entries();
    (recorder, oversize, cut_at)
}

/// Under `max_split_size_mb:40` a request of 45 MiB takes a cached segment of 60 MiB whole: a
/// recording that begins with it live (its trace shows only the 45 MiB requested) begins with
/// the segment full, so a later 10 MiB request gets a segment of its own, as recorded, and the
/// segment goes back whole when the block is freed.
#[test]
fn an_oversize_block_with_a_long_unsplit_tail_replays_exactly() {
    let (mut recorder, oversize, cut_at) = an_oversize_block_in_a_cached_segment();
    let fresh = recorder.malloc(10 * MIB, 0).unwrap();
    recorder.free(oversize);
    recorder.free(fresh);
    recorder.empty_cache();
    let rec = recorder.recording("a 60 MiB segment serving 45 MiB".into());
    let cut = rec.cut(cut_at);
    assert_replays_exactly(&rec, &cut, 8 * GIB);
}

/// A snapshot that names no settings (older PyTorch wrote none) of a program that ran
/// under `max_split_size_mb:40`, beginning with the 45 MiB request of the case above live in
/// its 60 MiB segment: `cachealloc replay --faithful --conf max_split_size_mb:40` rebuilds its
/// start under the settings given and replays it exactly, and says so; under the defaults' rules
/// the walk leaves 15 MiB of the segment free, which the later 10 MiB request then takes
/// instead of a segment of its own.
#[test]
fn a_snapshot_naming_no_settings_is_rebuilt_under_those_given() {
    let (mut recorder, oversize, cut_at) = an_oversize_block_in_a_cached_segment();
    let fresh = recorder.malloc(10 * MIB, 0).unwrap();
    recorder.free(fresh);
    recorder.free(oversize);
    let mut rec = recorder.recording("no settings".into()).cut(cut_at).rec;
    rec.settings = None;
    let path = write_recording("fixed-no-settings.pickle", &rec);
    let path = path.to_str().unwrap();
    let replay = |conf: &[&str]| {
        let mut args = vec!["replay", path, "--faithful", "--json"];
        args.extend(conf);
        let j = json(&cachealloc(&args));
        (
            j["allocs_at_recorded_addr"].as_u64().unwrap(),
            j["allocs"].as_u64().unwrap(),
            j["num_device_alloc"].as_u64().unwrap(),
            j["recorded_segment_allocs"].as_u64().unwrap(),
        )
    };
    assert_eq!(replay(&["--conf", "max_split_size_mb:40"]), (1, 1, 1, 1));
    // Under the defaults' rules: the request lands in the rebuilt segment's free tail.
    assert_eq!(replay(&[]), (0, 1, 0, 1));
    let text = cachealloc(&[
        "replay",
        path,
        "--faithful",
        "--conf",
        "max_split_size_mb:40",
    ]);
    assert!(text.status.success());
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains(
            "max_split_size_mb:40 (from --conf; the recording names none, so its start state is \
             rebuilt under these)"
        ),
        "{text}"
    );
    std::fs::remove_file(path).unwrap();
}

/// Garbage collection under a memory fraction releases cached segments before growing,
/// without a retry: its releases are the trace's `segment_free`s inside `malloc` before a new
/// segment. Which cached segments it releases depends on their ages, counted in the pool's
/// searches since each became free: a cut recording does not say how long before its start the
/// segments it begins with became free, so they are taken to be as old as one another (and
/// as old as those that become free after the start before the pool's next search); where they
/// were not, the replay's collection releases other segments than the recorded one did (the
/// collections the trace goes on to show constrain those ages, but do not give them). Allowed:
/// 1 cut recording in 30 departing, either way (the default run: 2 of 86; the sweep,
/// `CACHEALLOC_CUT_SEEDS=40`: 208 of 9,410, both ways).
#[test]
fn recordings_cut_mid_run_replay_exactly_under_garbage_collection() {
    let found = cuts_replay(
        "garbage_collection_threshold:0.6,per_process_memory_fraction:0.5",
        Some((30, 30)),
    );
    assert!(
        found.releases_without_retry >= 20,
        "{} segments collected",
        found.releases_without_retry
    );
}

/// Garbage collection under a memory fraction and `max_split_size_mb:40`: oversize requests
/// take segments whole, which the collection releases once cached, and a release before a new
/// segment without a retry may be the collection's or the oversize release's. The departures
/// have the cause of those under garbage collection alone: a cut recording does not give the
/// ages of the segments it begins with cached (see
/// `recordings_cut_mid_run_replay_exactly_under_garbage_collection`). Every departing cut
/// recording of the sweeps below replays exactly when its start's cached blocks are given the
/// ages they had in the pool (measured with a diagnostic, not kept). More depart than without
/// `max_split_size` (there 208 of 9,410 in the sweep of 40 seeds). Allowed: 1 cut recording in
/// 12 departing, either way (the default run: 2 of 79; `CACHEALLOC_CUT_SEEDS=40 cargo test
/// --release --test fixed_cuts exactly_under_garbage_collection_and -- --nocapture`: 433 of
/// 8,562, both ways; 200 seeds: 2,430 of 42,782, and at most 585 of the 8,653 of any 40 of
/// them, seeds 80 to 119).
#[test]
fn recordings_cut_mid_run_replay_exactly_under_garbage_collection_and_max_split_size() {
    let found = cuts_replay(
        "garbage_collection_threshold:0.6,per_process_memory_fraction:0.5,max_split_size_mb:40",
        Some((12, 12)),
    );
    assert!(
        found.releases_without_retry >= 20,
        "{} segments collected",
        found.releases_without_retry
    );
}

/// Garbage collection's clock runs from a cut recording's start: the segments it begins with
/// cached, and those cached after, age by the pool's searches from the start on, also while
/// the requests are served from the cache and the pool does not grow. Here a 100 MiB segment
/// cached before the cut is older, by three searches, than a 60 MiB one that serves them and a
/// 100 MiB one freed after: the collection before a 150 MiB segment releases only it, as
/// recorded.
#[test]
fn garbage_collection_ages_the_blocks_of_a_cut_recording_from_its_start() {
    let conf = "garbage_collection_threshold:0.6,per_process_memory_fraction:0.5";
    // 512 MiB allowed, collected above 307 MiB reserved.
    let mut recorder = Recorder::new(GIB, conf);
    let oldest = recorder.malloc(100 * MIB, 0).unwrap();
    let later = recorder.malloc(100 * MIB, 0).unwrap();
    let _kept = recorder.malloc(100 * MIB, 0).unwrap();
    let serving = recorder.malloc(60 * MIB, 0).unwrap();
    recorder.free(oldest);
    recorder.free(serving);
    let cut_at = recorder.entries();
    for _ in 0..3 {
        let again = recorder.malloc(60 * MIB, 0).unwrap();
        recorder.free(again);
    }
    recorder.free(later);
    recorder.malloc(150 * MIB, 0).unwrap();
    let rec = recorder.recording("the oldest cached segment collected".into());
    let cut = rec.cut(cut_at);
    let collected: Vec<_> = cut
        .rec
        .entries
        .iter()
        .filter(|e| e.action == Action::SegmentFree)
        .map(|e| e.addr)
        .collect();
    assert_eq!(collected, vec![oldest.addr()]);
    assert_eq!(cut.releases_without_retry(), 1);
    assert_replays_exactly(&rec, &cut, GIB);
}

/// Without stack frames (a snapshot recorded without them) a collection's releases are told
/// from `empty_cache()` calls by what follows them, a new segment or the retry's releases:
/// the cut recordings of the shape that collects and runs out of memory replay as they do with
/// frames.
#[test]
fn collections_without_frames_replay_as_with_them() {
    let conf = "garbage_collection_threshold:0.6,per_process_memory_fraction:0.5";
    let shape = SHAPES[1];
    let framed = record(0, shape, conf);
    let mut frameless = framed.clone();
    for e in &mut frameless.rec.entries {
        e.call_site = CallSite::Unrecorded;
    }
    let mut collections = 0;
    for at in between_operations(&framed.rec).step_by(16) {
        let (with, without) = (framed.cut(at), frameless.cut(at));
        collections += usize::from(with.releases_without_retry() > 0);
        assert_eq!(
            departures(&without, shape.device, true),
            departures(&with, shape.device, true),
            "cut at {at}"
        );
    }
    assert!(collections >= 5, "{collections} cuts with collections");
}

/// A fifth of the frees wait for a side stream's work (`record_stream`), which the device
/// finishes before one operation in ten: their blocks stay `active_pending_free` until the
/// pool's next allocation, or a retry's or `empty_cache()`'s synchronization, completes them.
const STREAM_FREES: StreamFrees = StreamFrees {
    percent: 20,
    complete_percent: 10,
};

/// Record, cut and replay the shapes with frees that wait for other streams, under the settings
/// of `conf`, and return what the sweep met. Cut recordings begin with such frees waiting:
/// their blocks are taken as allocated at the start, the cut recording shows only their
/// completions; and end with some still waiting, the state's `active_pending_free` blocks.
fn cuts_with_waiting_frees(conf: &str) -> CutSweep {
    let (sweep, first) = sweep_seeds();
    let seeds = sweep.unwrap_or(1);
    let step = if sweep.is_some() { 3 } else { 8 };
    let shapes = SHAPES.map(|shape| Shape {
        stream_frees: Some(STREAM_FREES),
        ..shape
    });
    let found = CutSweep::run(&shapes, conf, first..first + seeds, step);
    eprintln!("{conf:?}: {}", found.waiting_frees_met());
    // Over the seeds from 0 (a chosen one may lack some).
    if first == 0 {
        found.assert_waiting_frees_met(seeds as usize);
    }
    found
}

/// Frees that wait for other streams replay exactly, cut mid-run or whole: completed at the
/// pool's next allocation, by `empty_cache()`, or by a retry's synchronization after the
/// request's search (`trace::retry_sync`); blocks whose free was requested before the cut and
/// completes after it are taken as allocated at the start (the trace shows their completion
/// only); those still waiting at the end are the state's `active_pending_free` blocks.
/// (`CACHEALLOC_CUT_SEEDS=200 cargo test --release --test fixed_cuts waiting -- --nocapture`:
/// all 47,907 cut recordings exact both ways, 21,537 of them beginning with frees waiting that
/// complete after the start.)
#[test]
fn recordings_with_frees_waiting_for_streams_cut_mid_run_replay_exactly() {
    cuts_with_waiting_frees("").check(None);
}

/// The same under `per_process_memory_fraction:0.5`, whose limit the retries meet. A sweep
/// meets what a cut recording cannot show, as without waiting frees: the unsplit tail of a
/// block live at the start whose neighbour was freed before the start (the walk back finds a
/// block's end from a neighbour that reappears next to it in the trace; here none does), which
/// a later request then finds free in the replay. Allowed in a sweep: 1 cut recording in 1,000
/// departing (`CACHEALLOC_CUT_SEEDS=40`: all 9,138 exact both ways; 200 seeds: 25 of 45,662,
/// all cuts of one recording, in one allocation's address).
#[test]
fn recordings_with_frees_waiting_for_streams_cut_mid_run_replay_exactly_under_a_memory_fraction() {
    let found = cuts_with_waiting_frees("per_process_memory_fraction:0.5");
    found.check(sweep_seeds().0.map(|_| (1000, 1000)));
}

/// Under `max_split_size_mb`, a release before a new segment may be a retry's or the oversize
/// release (which makes no retry), and the completions of waiting frees before it were made by
/// the retry's synchronization, after the request's search, or by `process_events`, before it:
/// the trace shows both alike. Where the release left a free segment cached it was no retry's,
/// and where the new segment would have fitted without it there was no retry; otherwise the
/// replay takes it as the retry's. Where the recording's was the oversize release, its blocks
/// completed before the search and released as oversize, the replay makes one retry more than
/// the recording, its segments, addresses and peak the same: the trace does not say which (its
/// count of retries is only an upper bound here). Allowed: 1 recording in 400, whole or cut,
/// departing, in its retries only (`CACHEALLOC_CUT_SEEDS=40`: all 9,014 cut recordings exact
/// both ways; 200 seeds: 75 of 44,908, all cuts of one recording, and that recording whole).
#[test]
fn recordings_with_frees_waiting_for_streams_cut_mid_run_replay_under_max_split_size() {
    cuts_with_waiting_frees("max_split_size_mb:40").check_retries_only(400);
}

/// Garbage collection under a memory fraction with frees that wait for other streams. As
/// without them, a cut recording does not give the ages of the segments it begins with cached
/// (see `recordings_cut_mid_run_replay_exactly_under_garbage_collection`); and a run of
/// completions right before a collection's releases and a new segment may be
/// `process_events'`, before the request, or a retry's synchronization, after the
/// collection: where the collection would have released a segment cached before them it was
/// no retry's (`a_free_completed_before_a_collection_is_no_retry_s`), but where it released
/// only the segments those completions left free, and every segment free, the trace reads the
/// same either way. The replay takes those as the retry's (read as `process_events'` wherever
/// the collection runs, 3,024 of the sweep's cuts below depart): where the recording's were
/// `process_events'`, it makes one retry more, its segments, addresses and peak the same, also
/// whole. Allowed: 1 recording in 12, whole or cut, departing (the default run: none of 81;
/// `CACHEALLOC_CUT_SEEDS=40 cargo test --release --test fixed_cuts
/// waiting_for_streams_cut_mid_run_replay_under_garbage -- --nocapture`: 614 of 9,035 cut
/// recordings depart both ways, of 26 of the 80 recordings: 401, of 5 recordings that depart
/// whole too, in their retries only; 213, of 24, beyond them, as many with the completions
/// read as the pool made them: the ages').
#[test]
fn recordings_with_frees_waiting_for_streams_cut_mid_run_replay_under_garbage_collection() {
    let found =
        cuts_with_waiting_frees("garbage_collection_threshold:0.6,per_process_memory_fraction:0.5");
    assert!(
        found.releases_without_retry >= 20,
        "{} segments collected",
        found.releases_without_retry
    );
    found.check_with_wholes(Some((12, 12)));
}

/// Garbage collection under a memory fraction and `max_split_size_mb:40` with frees that wait
/// for other streams. The departures have three causes, each something a recording cannot show:
/// - the ages of the segments a cut recording begins with cached, as without waiting frees
///   (`recordings_cut_mid_run_replay_exactly_under_garbage_collection_and_max_split_size`);
/// - a run of completions right before its request's releases, which give back just the
///   segments those completions left free (every free segment) before a new segment: the
///   completions were `process_events'` and the releases the collection's or the oversize
///   release's, without a retry, or the completions were a retry's synchronization and the
///   releases its own; the trace reads the same. The replay takes them as the retry's (see
///   `recordings_with_frees_waiting_for_streams_cut_mid_run_replay_under_garbage_collection`
///   and `recordings_with_frees_waiting_for_streams_cut_mid_run_replay_under_max_split_size`):
///   where they were `process_events'`, it makes one retry more, its segments, addresses and
///   peak the same, also whole;
/// - the unsplit tail of a block live at the start whose neighbour was freed before the start
///   (as under a memory fraction alone): a later request finds it free in the replay.
///
/// Allowed: 1 cut recording in 8 departing, and as many whole recordings as that number
/// (`check_with_wholes`: more than a default run records, so its whole recordings are not
/// held to a rate) (the default run: 1 of 75; `CACHEALLOC_CUT_SEEDS=40 cargo test --release
/// --test fixed_cuts waiting_for_streams_cut_mid_run_replay_under_garbage_collection_and --
/// --nocapture`: 508 of 8,276 cut recordings depart both ways, and 3 of the 80 recordings whole; 200 seeds: 3,512 of 41,352, and at most
/// 910 of the 8,184 of any 40 of them, seeds 40 to 79; 27 of the 400 recordings whole, each in
/// its retries only, one to three more. Of those cuts, 1,771 replay exactly when given the
/// pool's ages at their start (measured with a diagnostic, not kept); of the rest, 1,734 are
/// cuts of the 27 recordings that depart whole, departing in their retries only as those do,
/// and 7 the cuts of one recording made after the pending neighbour of a live block with a
/// 965 KiB unsplit tail completed).
#[test]
fn recordings_with_frees_waiting_for_streams_cut_mid_run_replay_under_garbage_collection_and_max_split_size()
 {
    let found = cuts_with_waiting_frees(
        "garbage_collection_threshold:0.6,per_process_memory_fraction:0.5,max_split_size_mb:40",
    );
    assert!(
        found.releases_without_retry >= 20,
        "{} segments collected",
        found.releases_without_retry
    );
    found.check_with_wholes(Some((8, 8)));
}

/// A free that waited for another stream, completed at the start of a request (PyTorch's
/// `process_events`) whose garbage collection then releases its segment and one cached before,
/// after which the new segment fits: the trace shows the completion before the collection's
/// releases, as it would show a retry's synchronization before the retry's releases. But a
/// collection runs before a retry's synchronization, and with reserved memory above its
/// threshold and a segment cached it releases one: a retry's synchronization would have come
/// after that release. So the completion was made before the request, and the replay
/// releases both segments without a retry, as recorded (holding the block for a retry, it
/// released the one cached only and made no retry either, its block left cached).
#[test]
fn a_free_completed_before_a_collection_is_no_retry_s() {
    let conf = "garbage_collection_threshold:0.6,per_process_memory_fraction:0.5";
    // 512 MiB allowed, collected above 307 MiB reserved.
    let mut recorder = Recorder::new(GIB, conf);
    let cached = recorder.malloc(120 * MIB, 0).unwrap();
    let waiting = recorder.malloc(120 * MIB, 0).unwrap();
    let _kept = recorder.malloc(120 * MIB, 0).unwrap();
    let cut_at = recorder.entries();
    recorder.free(cached);
    recorder.free_after(waiting, &[1]);
    recorder.complete_work();
    // 360 MiB reserved: 160 MiB more do not fit under the limit before the collection.
    let fresh = recorder.malloc(160 * MIB, 0).unwrap();
    recorder.free(fresh);
    let rec = recorder.recording("a collection after a completed free".into());
    let actions: Vec<_> = rec.rec.entries[cut_at + 3..]
        .iter()
        .map(|e| (e.action, e.addr))
        .collect();
    assert_eq!(
        actions[..4],
        [
            (Action::FreeCompleted, waiting.addr()),
            (Action::SegmentFree, waiting.addr()),
            (Action::SegmentFree, cached.addr()),
            (Action::SegmentAlloc, fresh.addr()),
        ]
    );
    assert_eq!((rec.retries(), rec.releases_without_retry()), (0, 2));
    assert_replays_exactly(&rec, &rec.cut(cut_at), GIB);
}
