//! Writing to the terminal without a panic: a reader that goes away (`cachealloc replay … |
//! head`) or a full disk ends the output, not the program with a backtrace.

use std::io::{ErrorKind, Write};

/// A line on stderr, like `eprintln!`, but a failed write is ignored: there is nowhere left to
/// say so.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

/// Write the command's output to stdout. A closed pipe is not an error (the reader has what it
/// wanted, as with `head`); any other failure is, named.
pub fn write_output(text: &str) -> Result<(), String> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != ErrorKind::BrokenPipe => {
            Err(format!("could not write the output to stdout: {e}"))
        }
        _ => Ok(()),
    }
}
