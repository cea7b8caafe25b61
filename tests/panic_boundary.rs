//! The panic boundary of the exported functions, entered for the first time in a process while
//! the calling thread unwinds a panic of its own: a Rust program whose destructor frees device
//! memory (its first CUDA call reaching the library) as a panic unwinds through it. The
//! boundary must not touch the process's panic hook then (`take_hook` and `set_hook` panic on a
//! panicking thread, and a panic there would abort the program). One test in this file: the
//! process's first boundary is the one under test.

use cachealloc::ffi::status::boundary;

/// Enters the library's boundary from its destructor.
struct EntersOnDrop;

impl Drop for EntersOnDrop {
    fn drop(&mut self) {
        assert_eq!(boundary("test", 0, || 7), 7);
    }
}

#[test]
fn a_first_boundary_entered_while_unwinding_runs_its_body() {
    let unwound = std::panic::catch_unwind(|| {
        let _frees_on_drop = EntersOnDrop;
        panic!("the program's own panic");
    });
    assert!(unwound.is_err());
    // A later boundary catches a panic as every boundary does.
    assert_eq!(boundary("test", 0, || -> i32 { panic!("inside") }), 0);
}
