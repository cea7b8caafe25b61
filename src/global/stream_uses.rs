//! Allocations of the C API and the pluggable allocator that the program recorded as used on
//! streams other than their allocation's (`Tensor.record_stream` in PyTorch), with those streams.
//!
//! Those frees are immediate otherwise: a block belongs to its allocation stream and the next
//! allocation on that stream is ordered after the freed one's work. Work on another stream is
//! not, so the free of a recorded block records an event on each recorded stream and the block
//! is reused once they have completed, as PyTorch's own allocator does — under every `free_sync`
//! policy (which is about the interposed `cudaFree`, whose streams are unknown), and without a
//! device-wide synchronization. A stream of another device gets an event of its own device, as
//! PyTorch's allocator records on the stream's device; where the runtime cannot name that device
//! (`cudaStreamGetDevice` is new in CUDA 12.8), the stream's work is not waited for, and the free
//! logs a warning. During a CUDA graph capture the events are recorded only once no capture is
//! underway, as PyTorch defers them (`backend::cuda::stream_events`).
//!
//! An interposed `cudaFree` of a recorded allocation waits for its policy's fence and for the
//! recorded streams; under `free_sync:device` the fence is a device-wide synchronization (which
//! the pool makes before growing, and which covers every stream of the block's device), then the
//! block waits for the events of any recorded stream of another device.
//!
//! An entry goes when its allocation is freed (through the C API, the pluggable allocator or the
//! interposed `cudaFree`; a free that fails with the allocation still live puts it back) or its
//! pool is dropped by a device reset. The set is small (the
//! recorded allocations alive at one moment) and read by every free only through one atomic load
//! while it is empty.

use super::error::ShimError;
use super::pools::{self, Pool};
use super::trace_file;
use crate::backend::BackendError;
use crate::pool::{DevicePtr, Error, StreamId};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Recorded allocations by address, each with the streams recorded for it.
static RECORDED: Mutex<Vec<(u64, Vec<StreamId>)>> = Mutex::new(Vec::new());
/// `RECORDED`'s length, readable without the lock.
static COUNT: AtomicUsize = AtomicUsize::new(0);

type Recorded = std::sync::MutexGuard<'static, Vec<(u64, Vec<StreamId>)>>;

fn recorded() -> Recorded {
    // A panic while the lock was held leaves a list of addresses and streams, still consistent.
    RECORDED
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn publish(list: &Recorded) {
    COUNT.store(list.len(), Ordering::Release);
}

/// The allocation at `addr` is used on `stream` too.
pub fn record(addr: u64, stream: StreamId) {
    restore(addr, &[stream]);
}

/// Record `streams` for the allocation at `addr` (each once, however often recorded); none
/// records nothing.
pub fn restore(addr: u64, streams: &[StreamId]) {
    if streams.is_empty() {
        return;
    }
    let mut list = recorded();
    let pos = match list.iter().position(|(a, _)| *a == addr) {
        Some(pos) => pos,
        None => {
            list.push((addr, Vec::new()));
            list.len() - 1
        }
    };
    let uses = &mut list[pos].1;
    for &stream in streams {
        if !uses.contains(&stream) {
            uses.push(stream);
        }
    }
    publish(&list);
}

/// Forget the recorded allocations `gone` says are gone (a pool dropped by a device reset).
pub fn forget(gone: impl Fn(u64) -> bool) {
    if COUNT.load(Ordering::Acquire) == 0 {
        return;
    }
    let mut list = recorded();
    list.retain(|&(addr, _)| !gone(addr));
    publish(&list);
}

/// The streams recorded for the allocation at `addr`, if any; forgets them (it is being freed).
#[inline]
pub fn take(addr: u64) -> Option<Vec<StreamId>> {
    if COUNT.load(Ordering::Acquire) == 0 {
        return None;
    }
    take_recorded(addr)
}

#[cold]
#[inline(never)]
fn take_recorded(addr: u64) -> Option<Vec<StreamId>> {
    let mut list = recorded();
    let pos = list.iter().position(|&(a, _)| a == addr)?;
    let (_, streams) = list.swap_remove(pos);
    publish(&list);
    Some(streams)
}

/// Free the allocation at `ptr`, taken from the set with its recorded `streams`, in the pool
/// that owns it: `free` frees it there (given the streams) and returns the streams it could not
/// wait for, which are logged. A free that fails with the allocation still live puts the record
/// back for the retry. `None`: no pool owns `ptr`. (The C API's free and the interposed
/// `cudaFree` differ only in `free` and in what they do without an owner.)
pub fn free_recorded(
    ptr: DevicePtr,
    streams: Vec<StreamId>,
    free: impl FnOnce(&mut Pool, &[StreamId]) -> Result<Vec<(StreamId, BackendError)>, Error>,
) -> Result<Option<Result<(), Error>>, ShimError> {
    let addr = ptr.addr();
    let freed = pools::with_owner(addr, |pool| free(pool, &streams));
    trace_file::flush();
    let still_allocated = match &freed {
        Ok(None | Some(Ok(_))) => false,
        Ok(Some(Err(e))) => !e.is_bad_pointer(),
        Err(_) => true,
    };
    if still_allocated {
        restore(addr, &streams);
    }
    Ok(freed?.map(|result| result.map(|unfenced| warn_unfenced(addr, &unfenced))))
}

/// A recorded free could not wait for these streams: say so, with the device's answer.
fn warn_unfenced(addr: u64, unfenced: &[(StreamId, BackendError)]) {
    for (stream, answer) in unfenced {
        log_event!(
            warn,
            "free of {addr:#x}: the work of its recorded stream {:#x} is not waited for before \
             the block is reused ({answer}: a destroyed stream, or one of another device with a \
             runtime older than CUDA 12.8, which cannot name its device?)",
            stream.0
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One test owns the process-wide set (tests run in parallel threads).
    #[test]
    fn a_record_lasts_until_its_free_or_its_pools_reset() {
        let (s1, s2) = (StreamId(0x51), StreamId(0x52));
        assert_eq!(take(0x1000), None, "nothing recorded");
        restore(0x1000, &[]);
        assert_eq!(COUNT.load(Ordering::Acquire), 0, "no streams, no record");
        record(0x1000, s1);
        record(0x1000, s2);
        record(0x1000, s1);
        record(0x2000, s1);
        record(0x9000, s2);
        assert_eq!(take(0x1000), Some(vec![s1, s2]), "each stream once");
        assert_eq!(take(0x1000), None, "a free forgets it");
        restore(0x1000, &[s2, s1]);
        assert_eq!(
            take(0x1000),
            Some(vec![s2, s1]),
            "a failed free restores them"
        );
        forget(|addr| addr < 0x8000);
        assert_eq!(take(0x2000), None, "its pool was reset");
        assert_eq!(take(0x9000), Some(vec![s2]), "another pool's record stays");
        assert_eq!(COUNT.load(Ordering::Acquire), 0);
    }
}
