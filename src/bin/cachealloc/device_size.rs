//! The simulated device's capacity and memory, from `--capacity`, `--device-memory` and, in a
//! faithful replay, the recording.
//!
//! The device memory is the total `cudaMemGetInfo` reports (a memory fraction takes its share of
//! it, expandable segments size their ranges from it); the capacity is the part the allocator
//! may have. A replay never has a capacity beyond its device's memory. Where the device departs
//! from the recording's, a note or a warning on stderr says how.

use crate::sources::Loaded;
use cachealloc::pool::format_size;
use cachealloc::trace::ReplayConfig;
use cachealloc::trace::ranges::most_memory;

/// What the command line says of the device.
#[derive(Clone, Copy, Debug)]
pub struct GivenDevice {
    /// `--capacity`.
    pub capacity: Option<u64>,
    /// `--device-memory`.
    pub memory: Option<u64>,
}

/// The capacity of a plain replay's (or synth's) device: `--capacity`, else all of
/// `--device-memory`. A capacity beyond the device's memory is refused.
pub fn plain_capacity(given: GivenDevice) -> Result<Option<u64>, String> {
    if let (Some(c), Some(m)) = (given.capacity, given.memory)
        && c > m
    {
        let (c, m) = two_sizes(c, m);
        return Err(format!(
            "--capacity {c} is more than --device-memory {m}: the capacity is the part of the \
             device's memory the allocator can have (the memory less what the CUDA context and \
             other processes hold); give a capacity of at most the device memory"
        ));
    }
    Ok(given.capacity.or(given.memory))
}

/// Set a faithful replay's capacity, device memory and recorded addresses in `config`. `Ok(true)`
/// when the capacity is the device's whole memory because nothing in the recording brackets
/// less (no `--capacity` or `--device-memory` given).
///
/// The capacity is `--capacity`, else the recording's (held to a `--device-memory` given, and to
/// the memory its ranges imply), else all of `--device-memory`. The memory is
/// `--device-memory`, else the recording's (its `device_memory` line, or what its ranges
/// imply), raised to a `--capacity` given beyond it.
pub fn follow_recording(
    config: &mut ReplayConfig,
    loaded: &Loaded,
    given: GivenDevice,
) -> Result<bool, String> {
    // Refused before any note on the device's size is printed.
    if given.capacity.is_none()
        && let Some(memory) = given.memory
    {
        check_start_fits(loaded, memory)?;
    }
    // (A start state the capacity cannot hold is refused later, which says enough.)
    if let (Some(capacity), Some(peak)) = (given.capacity, loaded.recorded.peak_reserved_bytes)
        && peak > capacity
        && loaded
            .start
            .as_ref()
            .is_none_or(|start| start.held_bytes() <= capacity)
    {
        let (peak, shown) = two_sizes(peak, capacity);
        say!(
            "cachealloc: note: the recording reserved up to {peak}, more than --capacity \
             {shown}: this replay's device is smaller than the recording's"
        );
    }
    config.capacity = given
        .capacity
        .or_else(|| recorded_capacity_within(loaded, given.memory));
    let memory = given.memory.or(loaded.device_memory);
    config.follow_recorded_addresses(loaded.address_hints.clone(), &loaded.range_changes, memory);
    // A recording whose capacity nothing brackets (no out-of-memory error, no retry) still had
    // no more than its device's memory: a what-if under other settings must not get more.
    let whole_memory = config.capacity.is_none() && config.device_total.is_some();
    if whole_memory {
        config.capacity = config.device_total;
    }
    // The memory can fall short of a capacity: one given makes the device that large (a
    // what-if), one inferred (the middle of a retry's bracket) is held to it.
    if let (Some(capacity), Some(memory)) = (config.capacity, config.device_total)
        && capacity > memory
    {
        if given.capacity.is_some() {
            config.device_total = Some(capacity);
        } else {
            config.capacity = Some(memory);
        }
    }
    if let (Some(recorded), Some(total)) = (loaded.device_memory, config.device_total)
        && total != recorded
    {
        let option = if given.memory.is_some() {
            "--device-memory"
        } else {
            "--capacity"
        };
        let (recorded, total) = two_sizes(recorded, total);
        say!(
            "cachealloc: note: the recording names its device's memory, {recorded}; this \
             replay's device has {total}, from {option}"
        );
    }
    if config.settings.expandable_segments
        && let (Some(total), Some(most)) = (config.device_total, most_memory(&loaded.range_changes))
        && total > most
    {
        let (total, limit) = (format_size(total), with_bytes(most));
        say!(
            "cachealloc: warning: a device of {total} reserves larger ranges for expandable \
             segments than the recording's, which fit a device of at most {limit}: they cannot \
             all lie at the recorded addresses (give --device-memory, and --capacity, of at \
             most that to reserve them where the recording did)"
        );
    }
    Ok(whole_memory)
}

/// The recording's capacity, held to a `--device-memory` given (a what-if on a smaller device,
/// said in a note), else all of that memory.
fn recorded_capacity_within(loaded: &Loaded, given_memory: Option<u64>) -> Option<u64> {
    let Some(memory) = given_memory else {
        return loaded.capacity;
    };
    match loaded.capacity {
        Some(recorded) if recorded > memory => {
            let (recorded, shown) = two_sizes(recorded, memory);
            say!(
                "cachealloc: note: the capacity found for the recording, {recorded}, is more \
                 than --device-memory {shown}: the replay's device has {shown} and all of it is \
                 available"
            );
            Some(memory)
        }
        Some(recorded) => Some(recorded),
        None => {
            if let Some(peak) = loaded.recorded.peak_reserved_bytes
                && peak > memory
            {
                let (peak, shown) = two_sizes(peak, memory);
                say!(
                    "cachealloc: note: the recording reserved up to {peak}, more than \
                     --device-memory {shown}: this replay's device is smaller than the \
                     recording's"
                );
            }
            Some(memory)
        }
    }
}

/// A start state that a `--device-memory` (the capacity, without `--capacity`) cannot hold is
/// refused, naming the option to change.
fn check_start_fits(loaded: &Loaded, memory: u64) -> Result<(), String> {
    let Some(start) = &loaded.start else {
        return Ok(());
    };
    let held = start.held_bytes();
    if held > memory {
        let (held, memory) = (with_bytes(held), format_size(memory));
        return Err(format!(
            "the segments live at the start of the recording hold {held}, more than \
             --device-memory {memory} gives the allocator; give --device-memory of at least \
             that (without --capacity, the allocator may have all of it)"
        ));
    }
    Ok(())
}

/// A size as the summary writes it, with its bytes: a limit the user may have to give exactly.
fn with_bytes(bytes: u64) -> String {
    format!("{} ({bytes} bytes)", format_size(bytes))
}

/// Two sizes as the summary writes them, each with its bytes where the two read the same.
fn two_sizes(a: u64, b: u64) -> (String, String) {
    let (sa, sb) = (format_size(a), format_size(b));
    if sa == sb && a != b {
        (format!("{sa} ({a} bytes)"), format!("{sb} ({b} bytes)"))
    } else {
        (sa, sb)
    }
}
