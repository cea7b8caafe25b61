//! Damaged recordings never panic: truncations and random byte changes of a real snapshot
//! either load or give an error, and recordings with fields set to extreme or inconsistent
//! values replay (plain, with a capacity, faithful) to a result or an error, and their memory
//! states report (`cachealloc state`) or give an error the same way.
//!
//! Each test damages the small recording 200 times and the larger one 25 times;
//! `CACHEALLOC_CORRUPT_ROUNDS=N` makes that N and N/8 (`scripts/corrupt-long.sh`).

mod support;

use support::traces::trace;

use cachealloc::global::panics::catch;
use cachealloc::pool::StreamId;
use cachealloc::trace::pickle::decode;
use cachealloc::trace::recording::Action;
use cachealloc::trace::rng::SplitMix64;
use cachealloc::trace::{
    DeviceRecording, MemoryState, ReplayConfig, parse_snapshot, pending_frees, replay,
    replay_faithful, trial_state, try_request,
};

/// The project's deterministic generator, with indexes as `usize`.
struct Rng(SplitMix64);

impl Rng {
    fn new(seed: u64) -> Self {
        Self(SplitMix64::new(seed))
    }
    fn next(&mut self) -> u64 {
        self.0.next_u64()
    }
    fn below(&mut self, n: usize) -> usize {
        self.0.below(n as u64) as usize
    }
}

/// Damaged copies of the small recording (`CACHEALLOC_CORRUPT_ROUNDS`, default 200).
fn rounds() -> usize {
    match std::env::var("CACHEALLOC_CORRUPT_ROUNDS") {
        Ok(text) => text.parse().unwrap_or_else(|_| {
            panic!("CACHEALLOC_CORRUPT_ROUNDS={text}: expected a whole number of rounds")
        }),
        Err(_) => 200,
    }
}

/// The recordings damaged, each with the fraction of the rounds it gets: a small one with
/// little but allocations, and a larger one with frees of memory from before the trace,
/// `empty_cache()` bursts and retries (slower to load and replay, so fewer rounds).
const TRACES: [(&str, usize); 3] = [
    ("octree-nca/752276c/my_snapshot.pickle", 1),
    ("cs336-magma27/15883f2/memory_snapshot.pickle", 8),
    // Expandable segments.
    ("code_location/52e52b2/memory_snapshot.pickle", 25),
];

/// Each trace found, with its share of `rounds()`.
fn traces() -> Vec<(std::path::PathBuf, usize)> {
    TRACES
        .iter()
        .filter_map(|&(rel, share)| Some((trace(rel)?, rounds().div_ceil(share))))
        .collect()
}

/// Run `f`, failing the test with `what` and the panic's message and place if it panics.
fn no_panic<T>(what: &str, f: impl FnOnce() -> T) -> T {
    catch(f).unwrap_or_else(|panic| panic!("panicked on {what}: {panic}"))
}

#[test]
fn truncated_and_corrupted_snapshots_load_or_give_an_error() {
    for (path, rounds) in traces() {
        damage_bytes(&path, rounds);
    }
}

fn damage_bytes(path: &std::path::Path, rounds: usize) {
    let bytes = std::fs::read(path).unwrap();
    let mut rng = Rng::new(0x5eed);
    for _ in 0..rounds {
        let cut = rng.below(bytes.len());
        // The decoder itself first: `parse_snapshot` turns a panic inside it into an error.
        let decoded = no_panic(&format!("decoding, truncated at {cut}"), || {
            decode(&bytes[..cut])
        });
        assert!(decoded.is_err(), "a pickle cut at byte {cut} decoded");
        let r = no_panic(&format!("truncation at {cut}"), || {
            parse_snapshot(&bytes[..cut], "cut.pickle")
        });
        assert!(r.is_err(), "a snapshot cut at byte {cut} loaded");
    }
    for _ in 0..rounds {
        let mut damaged = bytes.clone();
        let mut places = Vec::new();
        for _ in 0..1 + rng.below(4) {
            let at = rng.below(damaged.len());
            damaged[at] = rng.next() as u8;
            places.push(at);
        }
        let _ = no_panic(&format!("decoding, bytes changed at {places:?}"), || {
            decode(&damaged)
        });
        let loaded = no_panic(&format!("bytes changed at {places:?}"), || {
            parse_snapshot(&damaged, "damaged.pickle")
        });
        if let Ok(snap) = loaded {
            for rec in snap.traced_devices() {
                replay_every_way(rec, &format!("bytes changed at {places:?}"));
            }
        }
    }
}

/// Values that break assumptions: zero, unaligned, huge (just under and at the 1 EB that no
/// request reaches), near overflow.
fn extreme(rng: &mut Rng, like: u64) -> u64 {
    match rng.below(8) {
        0 => 0,
        1 => 1,
        2 => u64::MAX,
        3 => u64::MAX - like,
        4 => 1 << 60,
        7 => (1 << 60) - 1 - rng.next() % (1 << 40),
        5 => like.wrapping_add(rng.next() % 4096),
        _ => rng.next(),
    }
}

const ACTIONS: [Action; 7] = [
    Action::Alloc,
    Action::FreeRequested,
    Action::FreeCompleted,
    Action::SegmentAlloc,
    Action::SegmentFree,
    Action::Oom,
    Action::Snapshot,
];

fn replay_every_way(rec: &DeviceRecording, what: &str) {
    let plain = no_panic(&format!("{what}: plain()"), || rec.plain());
    no_panic(&format!("{what}: figures()"), || rec.figures());
    for capacity in [None, Some(64 << 20), Some(1 << 30)] {
        let config = ReplayConfig {
            capacity,
            ..ReplayConfig::default()
        };
        let _ = no_panic(
            &format!("{what}: plain replay, capacity {capacity:?}"),
            || replay(&plain, &config, None),
        );
    }
    let _ = no_panic(&format!("{what}: faithful replay"), || {
        replay_faithful(rec, &ReplayConfig::default())
    });
    report_state(rec, what);
}

/// What `cachealloc state` does with the recording's end state: its figures, and requests of a
/// few sizes tried in it on a full device and on one with 1 GiB free.
fn report_state(rec: &DeviceRecording, what: &str) {
    let memory = no_panic(&format!("{what}: memory state"), || MemoryState::of(rec));
    let reserved = memory.total().reserved;
    let device_memory = reserved.saturating_add(1 << 30);
    let Ok(state) = no_panic(&format!("{what}: end state"), || {
        trial_state(rec, device_memory)
    }) else {
        return;
    };
    let pending = pending_frees(rec);
    for free in [0, 1 << 30] {
        for size in [1, 3 << 20, 700 << 20, 1 << 60] {
            let config = ReplayConfig {
                capacity: Some(reserved.saturating_add(free)),
                device_total: Some(device_memory),
                settings: rec.replay_settings(),
                ..ReplayConfig::default()
            };
            let _ = no_panic(
                &format!("{what}: request of {size} with {free} free"),
                || try_request(&state, &pending, &config, size, StreamId(0)),
            );
        }
    }
}

#[test]
fn recordings_with_extreme_fields_replay_or_give_an_error() {
    for (path, rounds) in traces() {
        damage_fields(&path, rounds);
    }
}

fn damage_fields(path: &std::path::Path, rounds: usize) {
    let snap = cachealloc::trace::read_snapshot(path).unwrap();
    let original = snap.traced_devices().next().unwrap().clone();
    let mut rng = Rng::new(0xdead_beef);
    for round in 0..rounds {
        let mut rec = original.clone();
        let mut changes = Vec::new();
        for _ in 0..1 + rng.below(3) {
            let n = rec.entries.len();
            match rng.below(7) {
                0 => {
                    let i = rng.below(n);
                    rec.entries[i].size = extreme(&mut rng, rec.entries[i].size);
                    changes.push(format!("entry {i} size {}", rec.entries[i].size));
                }
                6 => {
                    let i = rng.below(n);
                    let free = rec.entries[i].device_free.unwrap_or(0);
                    rec.entries[i].device_free = Some(extreme(&mut rng, free));
                    changes.push(format!("entry {i} device_free {free}"));
                }
                1 => {
                    let i = rng.below(n);
                    rec.entries[i].addr = extreme(&mut rng, rec.entries[i].addr);
                    changes.push(format!("entry {i} addr {:#x}", rec.entries[i].addr));
                }
                2 => {
                    let i = rng.below(n);
                    rec.entries[i].action = ACTIONS[rng.below(ACTIONS.len())];
                    changes.push(format!("entry {i} action {:?}", rec.entries[i].action));
                }
                3 => {
                    let i = rng.below(n);
                    rec.entries.remove(i);
                    changes.push(format!("entry {i} removed"));
                }
                4 => {
                    let (i, j) = (rng.below(n), rng.below(n));
                    rec.entries.swap(i, j);
                    changes.push(format!("entries {i} and {j} swapped"));
                }
                _ => {
                    if rec.segments.is_empty() {
                        continue;
                    }
                    let s = rng.below(rec.segments.len());
                    let seg = &mut rec.segments[s];
                    let b = rng.below(seg.blocks.len().max(1));
                    match (rng.below(5), seg.blocks.get_mut(b)) {
                        (4, _) => {
                            seg.is_expandable = !seg.is_expandable;
                            changes.push(format!("segment {s} expandable {}", seg.is_expandable));
                        }
                        (0, _) | (_, None) => {
                            seg.total_size = extreme(&mut rng, seg.total_size);
                            changes.push(format!("segment {s} size {}", seg.total_size));
                        }
                        (1, _) => {
                            seg.address = extreme(&mut rng, seg.address);
                            changes.push(format!("segment {s} address {:#x}", seg.address));
                        }
                        (2, Some(block)) => {
                            block.size = extreme(&mut rng, block.size);
                            changes.push(format!("segment {s} block {b} size {}", block.size));
                        }
                        (_, Some(block)) => {
                            block.address = extreme(&mut rng, block.address);
                            changes.push(format!(
                                "segment {s} block {b} address {:#x}",
                                block.address
                            ));
                        }
                    }
                }
            }
        }
        replay_every_way(&rec, &format!("round {round}: {}", changes.join(", ")));
    }
}
