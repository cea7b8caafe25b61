//! Catching panics at the C boundary. A panic must never unwind into the host program; the
//! `ffi` layer turns it into an error code and one log line. While a boundary is active on a
//! thread, the panic hook stays silent and only remembers where the panic happened (so the one
//! log line can say it); panics elsewhere go to the previous hook unchanged.

use std::cell::{Cell, RefCell};
use std::panic::{AssertUnwindSafe, PanicHookInfo};
use std::sync::atomic::{AtomicBool, Ordering};

thread_local! {
    static IN_BOUNDARY: Cell<bool> = const { Cell::new(false) };
    static LOCATION: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Set by the first boundary, which installs the hook. An atomic, not a `Once`: a child forked
/// while another thread was installing it would wait forever on a `Once` left running. (A
/// boundary entered by another thread during the installation runs without waiting for it; a
/// panic there is still caught, and only its location is missing from the log line.)
static HOOK_INSTALLED: AtomicBool = AtomicBool::new(false);

#[inline]
fn install_hook() {
    // A thread unwinding a panic of the program's (a Rust program's destructor that frees
    // device memory) leaves the hook to a later boundary: `take_hook` and `set_hook` panic on
    // a panicking thread, and that panic would abort the program.
    if HOOK_INSTALLED.load(Ordering::Acquire)
        || std::thread::panicking()
        || HOOK_INSTALLED.swap(true, Ordering::AcqRel)
    {
        return;
    }
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info: &PanicHookInfo<'_>| {
        if IN_BOUNDARY.try_with(Cell::get).unwrap_or(false) {
            let location = info.location().map(|l| l.to_string());
            let _ = LOCATION.try_with(|cell| cell.replace(location));
        } else {
            previous(info);
        }
    }));
}

/// Run `f`; a panic becomes `Err` with its message and location.
pub fn catch<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    install_hook();
    let outer = IN_BOUNDARY
        .try_with(|flag| flag.replace(true))
        .unwrap_or(false);
    let result = std::panic::catch_unwind(AssertUnwindSafe(f));
    let _ = IN_BOUNDARY.try_with(|flag| flag.set(outer));
    result.map_err(|payload| {
        let message = payload
            .downcast_ref::<&str>()
            .map(|s| (*s).to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".to_string());
        let location = LOCATION
            .try_with(|cell| cell.borrow_mut().take())
            .ok()
            .flatten()
            .unwrap_or_else(|| "unknown location".to_string());
        format!("{message} (at {location})")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_an_error_with_its_message() {
        let err = catch(|| -> i32 { panic!("boom {}", 7) }).unwrap_err();
        assert!(err.starts_with("boom 7 (at "), "{err}");
        assert!(err.contains("panics.rs"), "{err}");
        assert_eq!(catch(|| 5).unwrap(), 5);
    }
}
