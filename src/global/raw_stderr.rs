//! The library's writer to stderr: `write(2)` on file descriptor 2 directly, with no lock of its
//! own. Every line the library prints goes through it — the log (`logging`), the configuration
//! error, the trace and statistics files' messages, the exit report, the missing runtime's
//! warning — never through Rust's `Stderr`, whose lock is held for the whole of each write: a
//! child forked while another thread of the parent was inside one (blocked on a full pipe, say)
//! would find that lock held for ever (no thread of the child releases it), and its own first
//! such write would wait on it.
//!
//! Each message is formatted first and handed over whole (`write`), so that one is one `write`
//! call (more only when the descriptor takes part of it) and lines from threads do not
//! interleave.

use std::io;

/// File descriptor 2, unlocked (see the module comment).
pub(crate) struct RawStderr;

impl io::Write for RawStderr {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        // SAFETY: `buf` is valid for reading `buf.len()` bytes for the duration of the call;
        // `write` only reads it.
        let written = unsafe { libc::write(libc::STDERR_FILENO, buf.as_ptr().cast(), buf.len()) };
        match usize::try_from(written) {
            Ok(n) => Ok(n),
            // As Rust's `Stderr`: a closed descriptor 2 swallows the text.
            Err(_) => match io::Error::last_os_error() {
                e if e.raw_os_error() == Some(libc::EBADF) => Ok(buf.len()),
                e => Err(e),
            },
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Write `text` to stderr whole; a failure (no reader left, say) loses it, nothing else.
pub(crate) fn write(text: &str) {
    let _ = io::Write::write_all(&mut RawStderr, text.as_bytes());
}
