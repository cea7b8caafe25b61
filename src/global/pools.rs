//! The process-wide pools: one `DeviceAllocator<CudaBackend>` per device, each behind its own
//! lock (the lock wraps the core; the core knows nothing of it), created at the device's first
//! allocation and dropped by `cudaDeviceReset`.
//!
//! Code running under a pool lock never logs or formats: callers take the result out and
//! report after the lock is released. What the backend must say from under it is held
//! (`backend::cuda::notices`) and said here as each call below releases the lock.
//!
//! A panic while a lock was held poisons it. The next user checks the pool with the invariant
//! walker: a consistent pool is used on; an inconsistent one refuses further use of that device
//! (`ShimError::PoolBroken`) rather than hand out overlapping memory.

use super::error::ShimError;
use super::exit_wait::lock_at_exit;
use crate::backend::cuda::CudaBackend;
use crate::backend::cuda::epoch::SyncEpochs;
use crate::backend::cuda::notices;
use crate::pool::{DeviceAllocator, DeviceId, DeviceStats};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, TryLockError};

/// Devices with an ordinal below this get a pool; calls on others are forwarded.
pub const MAX_DEVICES: usize = 64;

/// One device's caching pool over the real runtime.
pub type Pool = DeviceAllocator<CudaBackend>;

static POOLS: [Mutex<Option<Pool>>; MAX_DEVICES] = [const { Mutex::new(None) }; MAX_DEVICES];
static EPOCHS: [SyncEpochs; MAX_DEVICES] = [const { SyncEpochs::new() }; MAX_DEVICES];
/// Bit `d` of slot `p`: device `d` was given access to device `p`'s memory
/// (`cudaDeviceEnablePeerAccess(p)` called on `d`), which expandable segments must grant.
static PEERS: [AtomicU64; MAX_DEVICES] = [const { AtomicU64::new(0) }; MAX_DEVICES];
/// Per device, the statistics of the pools that device resets ended, folded together
/// (`DeviceStats::then`): the exit report covers the whole run.
static ENDED: [Mutex<Option<DeviceStats>>; MAX_DEVICES] = [const { Mutex::new(None) }; MAX_DEVICES];
/// Per device, the segments of a pool dropped for a `cudaDeviceReset()` that then failed: they
/// are still allocated, and a free inside them does nothing (forwarded, a free of a segment's
/// first block would release the whole segment under the allocations still in it). Emptied by
/// the device's next reset that happens.
static RETIRED: [Mutex<Vec<(u64, u64)>>; MAX_DEVICES] =
    [const { Mutex::new(Vec::new()) }; MAX_DEVICES];
/// Bit `d` set: `RETIRED[d]` is not empty (a free of memory no pool owns reads one atomic).
static ANY_RETIRED: AtomicU64 = AtomicU64::new(0);
/// Bit `d` set: device `d` has held a pool at some point (where frees and stats look).
static USED: AtomicU64 = AtomicU64::new(0);
/// Bit `d` set: device `d` holds a pool now (set when one is made, cleared by a reset).
static LIVE: AtomicU64 = AtomicU64::new(0);
/// Per device, the memory fraction the program set (`set_memory_fraction`) as the bits of an
/// `f64`, or `NO_FRACTION`: a pool made later (at the device's first allocation, or after a
/// reset) starts with it.
static FRACTIONS: [AtomicU64; MAX_DEVICES] = [const { AtomicU64::new(NO_FRACTION) }; MAX_DEVICES];
/// No fraction set: the settings' own. (The bits of a NaN, which no fraction is.)
const NO_FRACTION: u64 = u64::MAX;

fn index(device: DeviceId) -> Option<usize> {
    usize::try_from(device.0).ok().filter(|&d| d < MAX_DEVICES)
}

/// Whether any device has had a pool made (read by the fork handler: one atomic load).
pub fn any_used() -> bool {
    USED.load(Ordering::Relaxed) != 0
}

/// In a child just forked: whether a thread of the parent held a pool slot's lock at the fork
/// (before any pool was made: a device's statistics, `cudaMemGetInfo`, a memory fraction, or the
/// first pool being made). No thread of the child will ever release it. Only try-locks, each
/// released at once: atomic operations on the lock word (async-signal-safe; no thread of the
/// child contends for them).
pub fn any_lock_held_at_fork() -> bool {
    POOLS
        .iter()
        .any(|slot| matches!(slot.try_lock(), Err(TryLockError::WouldBlock)))
}

/// Whether `device` has had a pool made (its slot is never emptied again).
pub fn has_pool(device: DeviceId) -> bool {
    index(device).is_some_and(|d| USED.load(Ordering::Relaxed) & (1u64 << d) != 0)
}

/// Whether `device` holds a pool now (a hint read without its lock: the pool may be made or
/// dropped by another thread right after).
pub fn is_live(device: DeviceId) -> bool {
    index(device).is_some_and(|d| LIVE.load(Ordering::Relaxed) & (1u64 << d) != 0)
}

/// The slots of the devices that have had a pool made, in order (one load of `USED`).
fn used_slots() -> impl Iterator<Item = usize> {
    let used = USED.load(Ordering::SeqCst);
    (0..MAX_DEVICES).filter(move |d| used & (1u64 << d) != 0)
}

/// The devices that have had a pool made, in order.
pub fn used_devices() -> impl Iterator<Item = DeviceId> {
    used_slots().map(|d| DeviceId(d as i32))
}

/// The synchronization epochs of `device` (`None` for an ordinal without a pool slot).
pub fn epochs(device: DeviceId) -> Option<&'static SyncEpochs> {
    index(device).map(|d| &EPOCHS[d])
}

/// The devices given access to `device`'s memory, as a bit mask (`None` for an ordinal without
/// a pool slot).
pub fn peers(device: DeviceId) -> Option<&'static AtomicU64> {
    index(device).map(|d| &PEERS[d])
}

/// `device` was given access to `owner`'s memory (`cudaDeviceEnablePeerAccess(owner)` called
/// on `device`); false when either ordinal has no pool slot.
pub fn add_peer(owner: DeviceId, device: DeviceId) -> bool {
    let (Some(o), Some(d)) = (index(owner), index(device)) else {
        return false;
    };
    PEERS[o].fetch_or(1u64 << d, Ordering::AcqRel);
    true
}

/// After a reset of `device`: the peer access it had and the access given to its memory went
/// with its context, so no later mapping grants either.
pub fn forget_peers(device: DeviceId) {
    let Some(d) = index(device) else {
        return;
    };
    PEERS[d].store(0, Ordering::Release);
    for peers in &PEERS {
        peers.fetch_and(!(1u64 << d), Ordering::AcqRel);
    }
}

/// Under `device`'s pool lock, remember that the program set its memory fraction to
/// `fraction` (for the pools made from now on), then run `set` on the pool there is, if any:
/// calls on two threads, and a pool made or dropped meanwhile, see one order. `Ok(None)` for an
/// ordinal without a pool slot (no pool to limit).
pub fn set_memory_fraction<R>(
    device: DeviceId,
    fraction: f64,
    set: impl FnOnce(Option<&mut Pool>) -> R,
) -> Result<Option<R>, ShimError> {
    let Some(d) = index(device) else {
        return Ok(None);
    };
    let mut guard = lock(device, d)?;
    FRACTIONS[d].store(fraction.to_bits(), Ordering::Release);
    Ok(Some(set(guard.as_mut())))
}

/// The memory fraction the program set for `device`, if it set one.
pub fn memory_fraction(device: DeviceId) -> Option<f64> {
    let bits = FRACTIONS[index(device)?].load(Ordering::Acquire);
    (bits != NO_FRACTION).then(|| f64::from_bits(bits))
}

/// The pool lock of slot `d`; the uncontended, unpoisoned case is inlined into each caller.
#[inline]
fn lock(device: DeviceId, d: usize) -> Result<MutexGuard<'static, Option<Pool>>, ShimError> {
    match POOLS[d].lock() {
        Ok(guard) => Ok(guard),
        Err(poisoned) => recover(device, d, poisoned.into_inner()),
    }
}

/// A poisoned lock: the pool is used on only when the invariant walker finds it consistent.
#[cold]
#[inline(never)]
fn recover(
    device: DeviceId,
    d: usize,
    guard: MutexGuard<'static, Option<Pool>>,
) -> Result<MutexGuard<'static, Option<Pool>>, ShimError> {
    match guard.as_ref().map(|pool| pool.validate()) {
        None | Some(Ok(())) => {
            POOLS[d].clear_poison();
            Ok(guard)
        }
        Some(Err(why)) => Err(ShimError::PoolBroken(device, why)),
    }
}

/// Run `f` on the pool of `device`, creating it with `create` first if needed. `Ok(None)` when
/// the ordinal has no pool slot.
pub fn with_pool_or_create<R>(
    device: DeviceId,
    create: impl FnOnce() -> Pool,
    f: impl FnOnce(&mut Pool) -> R,
) -> Result<Option<R>, ShimError> {
    let Some(d) = index(device) else {
        return Ok(None);
    };
    let guard = lock(device, d)?;
    Ok(Some(then_say_held(guard, |slot| {
        let pool = slot.get_or_insert_with(|| {
            USED.fetch_or(1u64 << d, Ordering::SeqCst);
            LIVE.fetch_or(1u64 << d, Ordering::SeqCst);
            create()
        });
        f(pool)
    })))
}

/// Run `f` under `guard`, release it, then say the notices the call held back.
#[inline]
fn then_say_held<R>(
    mut guard: MutexGuard<'static, Option<Pool>>,
    f: impl FnOnce(&mut Option<Pool>) -> R,
) -> R {
    let result = f(&mut guard);
    drop(guard);
    notices::say_held();
    result
}

/// Run `f` on the pool of `device` if it has one.
pub fn with_pool<R>(
    device: DeviceId,
    f: impl FnOnce(&mut Pool) -> R,
) -> Result<Option<R>, ShimError> {
    let Some(d) = index(device) else {
        return Ok(None);
    };
    let guard = lock(device, d)?;
    Ok(then_say_held(guard, |slot| slot.as_mut().map(f)))
}

/// Run `f` on the pool of `device` if it has one and its lock is free now (for work that the
/// pool's next call would do anyway: waiting for another thread's pool call is not worth a
/// dependency between the two threads). A poisoned lock counts as busy.
pub fn try_with_pool<R>(device: DeviceId, f: impl FnOnce(&mut Pool) -> R) -> Option<R> {
    let d = index(device)?;
    let guard = POOLS[d].try_lock().ok()?;
    then_say_held(guard, |slot| slot.as_mut().map(f))
}

/// Run `f` on the pool whose segments contain `addr`, whatever device is current.
///
/// Each device's pool is asked without waiting first; only the pools that were busy (another
/// thread inside a call of theirs, which may take long: a segment's `cudaMalloc`, a device
/// synchronization, an out-of-memory retry) are then waited for, one by one in device order,
/// when none of the others owns `addr`. So a thread freeing its device's memory does not wait
/// for another device's pool, as the runtime's own `cudaFree` does not, unless the owner was
/// busy too: then it may wait for a busy pool of a lower device before its own.
pub fn with_owner<R>(addr: u64, f: impl FnOnce(&mut Pool) -> R) -> Result<Option<R>, ShimError> {
    let mut busy = 0u64;
    for d in used_slots() {
        let device = DeviceId(d as i32);
        let guard = match POOLS[d].try_lock() {
            Ok(guard) => guard,
            Err(TryLockError::WouldBlock) => {
                busy |= 1u64 << d;
                continue;
            }
            Err(TryLockError::Poisoned(poisoned)) => recover(device, d, poisoned.into_inner())?,
        };
        if let Some(guard) = owning(guard, addr) {
            return Ok(then_say_held(guard, |slot| slot.as_mut().map(f)));
        }
    }
    for d in (0..MAX_DEVICES).filter(|d| busy & (1u64 << d) != 0) {
        if let Some(guard) = owning(lock(DeviceId(d as i32), d)?, addr) {
            return Ok(then_say_held(guard, |slot| slot.as_mut().map(f)));
        }
    }
    Ok(None)
}

/// A pool's lock, kept when its pool contains `addr`.
fn owning(
    guard: MutexGuard<'static, Option<Pool>>,
    addr: u64,
) -> Option<MutexGuard<'static, Option<Pool>>> {
    guard
        .as_ref()
        .is_some_and(|pool| pool.contains(addr))
        .then_some(guard)
}

/// Remove the pool of `device` (its memory is gone with a device reset). The caller drops it
/// after the lock is released.
pub fn take(device: DeviceId) -> Option<Pool> {
    let d = index(device)?;
    let mut guard = POOLS[d]
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    POOLS[d].clear_poison();
    LIVE.fetch_and(!(1u64 << d), Ordering::SeqCst);
    guard.take()
}

/// The reset of `device` failed after its pool, with `segments` (start, end), was dropped: keep
/// frees away from them.
pub fn retire_segments(device: DeviceId, segments: Vec<(u64, u64)>) {
    change_retired(device, |retired| retired.extend(segments));
}

/// A reset of `device` happened: the segments of an earlier one that failed went with it.
pub fn forget_retired(device: DeviceId) {
    change_retired(device, Vec::clear);
}

fn change_retired(device: DeviceId, change: impl FnOnce(&mut Vec<(u64, u64)>)) {
    let Some(d) = index(device) else {
        return;
    };
    let mut retired = RETIRED[d]
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    change(&mut retired);
    if retired.is_empty() {
        ANY_RETIRED.fetch_and(!(1u64 << d), Ordering::SeqCst);
    } else {
        ANY_RETIRED.fetch_or(1u64 << d, Ordering::SeqCst);
    }
}

/// Whether `addr` lies in a segment of a pool dropped for a reset that failed.
pub fn is_retired(addr: u64) -> bool {
    let any = ANY_RETIRED.load(Ordering::SeqCst);
    (0..MAX_DEVICES)
        .filter(|d| any & (1u64 << d) != 0)
        .any(|d| {
            let retired = RETIRED[d]
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            retired
                .iter()
                .any(|&(start, end)| start <= addr && addr < end)
        })
}

/// A device reset ended the pool of `device`, whose statistics were `stats`.
pub fn note_ended(device: DeviceId, stats: DeviceStats) {
    let Some(d) = index(device) else {
        return;
    };
    let mut ended = ENDED[d]
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    *ended = Some(match ended.take() {
        Some(earlier) => earlier.then(Some(&stats)),
        None => stats,
    });
}

/// Apply `change` to the statistics of the pools device resets ended on `device`, if any
/// (a reset of peaks or totals: from then on the run's figures are the current pool's).
pub fn with_ended(device: DeviceId, change: fn(&mut DeviceStats)) {
    let Some(d) = index(device) else {
        return;
    };
    let mut ended = ENDED[d]
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(stats) = ended.as_mut() {
        change(stats);
    }
}

/// The exit report's statistics.
pub struct ExitSnapshot {
    /// Statistics of every device that has had a pool, over the whole run (the pools device
    /// resets ended, then the pool now).
    pub devices: Vec<(DeviceId, DeviceStats)>,
    /// Devices whose pool lock stayed busy for longer than the exit handler waits.
    pub busy: Vec<DeviceId>,
}

/// The statistics for the exit report: a lock another thread holds (one still allocating) is
/// waited for, a while (`exit_wait`); a device whose lock stays busy is in `busy`.
pub fn stats_snapshot() -> ExitSnapshot {
    let mut snapshot = ExitSnapshot {
        devices: Vec::new(),
        busy: Vec::new(),
    };
    for d in used_slots() {
        let device = DeviceId(d as i32);
        let Some(now) = lock_at_exit(&POOLS[d]).map(|pool| pool.as_ref().map(Pool::stats)) else {
            snapshot.busy.push(device);
            continue;
        };
        let Some(ended) = lock_at_exit(&ENDED[d]).map(|ended| ended.clone()) else {
            snapshot.busy.push(device);
            continue;
        };
        let stats = match (ended, now) {
            (Some(ended), now) => ended.then(now.as_ref()),
            (None, Some(now)) => now,
            (None, None) => continue,
        };
        snapshot.devices.push((device, stats));
    }
    snapshot
}
