//! Throwing a C++ `std::runtime_error` to PyTorch from the pluggable allocator's malloc.
//!
//! PyTorch's `CUDAPluggableAllocator`, installed with `change_current_allocator`, takes whatever
//! pointer the allocation function returns, NULL included, and wraps it in a tensor: the next
//! kernel then faults on address 0 and the CUDA context is lost. A failure must reach it as a
//! C++ exception, as its own allocator's `OutOfMemoryError` does; PyTorch turns a
//! `std::exception` into a Python `RuntimeError` carrying its text ("CUDA out of memory. …",
//! which is what OOM handlers look for).
//!
//! The exception is built with the libstdc++ the process has loaded (every PyTorch process
//! has it, often loaded `RTLD_LOCAL` with PyTorch's own libraries, so it is found by its soname
//! with `RTLD_NOLOAD`, not in the global scope): `__cxa_allocate_exception`,
//! `std::runtime_error`'s constructor from a C string, and `__cxa_throw`, all from that one
//! library. Where it is not loaded (a C program, a process whose C++ runtime is another one)
//! nothing is thrown and the caller returns NULL. A caller with libstdc++ loaded and no C++
//! handler around the call (a C program linked with it, ctypes) is terminated by the C++
//! runtime: the entry point is documented for PyTorch's allocator only. The throw starts in a
//! frame that owns nothing and unwinds through `extern "C-unwind"` entry points only.

use std::ffi::{CStr, CString, c_char, c_void};

type AllocateException = unsafe extern "C" fn(usize) -> *mut c_void;
type Destructor = unsafe extern "C" fn(*mut c_void);
type Throw = unsafe extern "C-unwind" fn(*mut c_void, *mut c_void, Destructor) -> !;
/// The constructor copies the message into a string it allocates: it throws `std::bad_alloc`
/// when that fails, which reaches the caller as the exception thrown.
type RuntimeErrorFromCString = unsafe extern "C-unwind" fn(*mut c_void, *const c_char);

/// Bytes allocated for the exception object: `std::runtime_error` is 16 in libstdc++ (a vtable
/// pointer and a reference-counted string); more room costs nothing.
const EXCEPTION_BYTES: usize = 64;

/// The libstdc++ functions and type information the throw needs.
struct CxxRuntime {
    allocate: AllocateException,
    construct: RuntimeErrorFromCString,
    destroy: Destructor,
    type_info: *mut c_void,
    throw: Throw,
}

/// The loaded libstdc++, if any (never loads one: `RTLD_NOLOAD`). The handle stays open for the
/// life of the process, as the library itself does.
fn loaded_libstdcxx() -> Option<*mut c_void> {
    // SAFETY: dlopen with RTLD_NOLOAD only returns a handle to an object already loaded.
    let handle = unsafe {
        libc::dlopen(
            c"libstdc++.so.6".as_ptr(),
            libc::RTLD_NOW | libc::RTLD_NOLOAD,
        )
    };
    (!handle.is_null()).then_some(handle)
}

fn symbol(library: *mut c_void, name: &CStr) -> Option<*mut c_void> {
    // SAFETY: `library` is a live dlopen handle and `name` is NUL-terminated.
    let found = unsafe { libc::dlsym(library, name.as_ptr()) };
    (!found.is_null()).then_some(found)
}

fn cxx_runtime() -> Option<CxxRuntime> {
    let library = loaded_libstdcxx()?;
    let allocate = symbol(library, c"__cxa_allocate_exception")?;
    let construct = symbol(library, c"_ZNSt13runtime_errorC1EPKc")?;
    let destroy = symbol(library, c"_ZNSt13runtime_errorD1Ev")?;
    let type_info = symbol(library, c"_ZTISt13runtime_error")?;
    let throw = symbol(library, c"__cxa_throw")?;
    // SAFETY: each symbol is the libstdc++ function of that mangled name, whose C ABI signature
    // is the one transmuted to (the Itanium C++ ABI's, and the complete-object constructor and
    // destructor of std::runtime_error).
    unsafe {
        Some(CxxRuntime {
            allocate: std::mem::transmute::<*mut c_void, AllocateException>(allocate),
            construct: std::mem::transmute::<*mut c_void, RuntimeErrorFromCString>(construct),
            destroy: std::mem::transmute::<*mut c_void, Destructor>(destroy),
            type_info,
            throw: std::mem::transmute::<*mut c_void, Throw>(throw),
        })
    }
}

/// Throw `std::runtime_error(message)`; returns only when the process has no libstdc++ loaded.
/// Every value this function owns is dropped before the throw.
///
/// # Safety
/// The caller is an `extern "C-unwind"` function called by C++ code that can catch the
/// exception (PyTorch's allocator), and holds nothing that must be released on return: the
/// exception unwinds through it.
pub unsafe fn throw_runtime_error(message: String) {
    let Some(cxx) = crate::backend::cuda::loader::lookup(cxx_runtime) else {
        return;
    };
    let text = CString::new(message.replace('\0', " ")).unwrap_or_default();
    drop(message);
    // SAFETY: __cxa_allocate_exception returns storage for the object (it aborts rather than
    // return NULL); the constructor builds a std::runtime_error there, copying `text`, or
    // throws std::bad_alloc through this frame (`text` is dropped on the way; the storage is
    // lost), which the caller's contract allows as it allows the throw below.
    let exception = unsafe {
        let exception = (cxx.allocate)(EXCEPTION_BYTES);
        (cxx.construct)(exception, text.as_ptr());
        exception
    };
    drop(text);
    // SAFETY: `exception` holds a constructed std::runtime_error whose type information and
    // destructor are passed; the caller's contract makes unwinding from here sound.
    unsafe { (cxx.throw)(exception, cxx.type_info, cxx.destroy) }
}
