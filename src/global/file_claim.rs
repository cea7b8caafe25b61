//! Claiming a file a process writes for its whole run (the `trace` recording, the `stats_file`
//! report): the process holds an exclusive advisory lock (`flock`) on it for as long as it
//! lives, so that processes sharing one path without `%p` (the ranks of one launch, say) do not
//! truncate and overwrite each other's files. A process that finds the file locked writes beside
//! it instead, to the name with its process id before the extension (`run.jsonl` →
//! `run.4242.jsonl`), and says so on stderr. A file left by a run that has ended is not locked,
//! and is replaced as before. On a file system without locks the file is taken as before too,
//! and a path that is not a regular file (`/dev/stderr` on a terminal or a pipe) is written as it
//! is, neither locked nor emptied. Nor is the file the program's standard output or error goes
//! to (`/dev/stdout` when it is redirected to a file): that is written through the program's own
//! descriptor, after what the program wrote.
//!
//! The lock belongs to the open file, which a forked child shares: a child that outlived its
//! parent (an orphaned worker) would keep it, and the next run would write beside the file. So
//! the descriptors of the files held are noted (`HeldFile`), and a forked child lets go of them
//! (`let_go_in_forked_child`, from the fork handler): each becomes `/dev/null` in the child,
//! while the parent's lock stands. The files are never the child's to write: its parent's
//! recording and report are the parent's, and a child writes its own files (`exit_stats`).

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicI32, Ordering};

/// Descriptors of the locked files this process holds (`NONE`: a free place): a trace and a
/// statistics file, and one more for a statistics file claimed at exit.
static HELD: [AtomicI32; 3] = [const { AtomicI32::new(NONE) }; 3];
const NONE: i32 = -1;

/// A claimed file. While it is open, its descriptor is noted for a forked child to let go of.
#[derive(Debug)]
pub struct HeldFile(File);

impl HeldFile {
    fn new(file: File) -> Self {
        let fd = file.as_raw_fd();
        // No free place (not expected: a process claims at most three): a forked child then
        // keeps this one's lock until it ends, as it would without the note.
        let _ = HELD.iter().find(|place| {
            place
                .compare_exchange(NONE, fd, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
        });
        HeldFile(file)
    }
}

impl Drop for HeldFile {
    fn drop(&mut self) {
        // Forgotten before the file is closed, so that a child forked in between never takes a
        // descriptor number the program may reuse for a file of its own.
        let fd = self.0.as_raw_fd();
        for place in &HELD {
            let _ = place.compare_exchange(fd, NONE, Ordering::SeqCst, Ordering::SeqCst);
        }
    }
}

impl Write for HeldFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

/// In a child just forked: point each descriptor of the parent's held files at `/dev/null`,
/// so that the child no longer shares the open files whose locks the parent holds (the parent
/// keeps them). Async-signal-safe: atomics, `open`, `dup3` and `close` only. A descriptor left
/// as it was (no `/dev/null`) keeps the lock until the child ends, as before.
pub fn let_go_in_forked_child() {
    for place in &HELD {
        let fd = place.swap(NONE, Ordering::SeqCst);
        if fd == NONE {
            continue;
        }
        // SAFETY: a NUL-terminated path; `open` is async-signal-safe and borrows nothing.
        let null = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC) };
        if null < 0 {
            continue;
        }
        // SAFETY: `fd` is open (a `HeldFile` forgets it before closing it, and the child has
        // only this thread): `dup3` makes it refer to `/dev/null`, so the `HeldFile` that owns
        // it still owns an open descriptor, one that drops the child's share of the lock.
        // `null` is ours to close.
        unsafe {
            libc::dup3(null, fd, libc::O_CLOEXEC);
            libc::close(null);
        }
    }
}

/// A file this process holds, and its name.
pub struct Claimed {
    pub file: HeldFile,
    pub path: String,
    /// The name asked for, when another process held it.
    pub diverted_from: Option<String>,
    /// Whether the holder of the name asked for is this process: it holds the same file under
    /// another name (`./run.jsonl`, a link), as its other file.
    pub held_here: bool,
}

/// Create (or empty) the file `path` for this process, or, when another process holds it, the
/// file named with `pid` beside it.
pub fn claim(path: &str, pid: u32) -> io::Result<Claimed> {
    if let Some(file) = claim_exactly(path)? {
        return Ok(Claimed {
            file: HeldFile::new(file),
            path: path.to_owned(),
            diverted_from: None,
            held_here: false,
        });
    }
    let held_here = held_by_this_process(path);
    let beside = with_pid(path, pid);
    match claim_exactly(&beside)? {
        Some(file) => Ok(Claimed {
            file: HeldFile::new(file),
            path: beside,
            diverted_from: Some(path.to_owned()),
            held_here,
        }),
        None => Err(io::Error::new(
            io::ErrorKind::WouldBlock,
            format!("{path} and {beside} are both being written by other processes"),
        )),
    }
}

/// The file at `path`, locked and emptied; `None` when another process holds its lock.
fn claim_exactly(path: &str) -> io::Result<Option<File>> {
    // Not truncated on opening: the file may be another process's, in use.
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)?;
    // A device or a pipe (`/dev/stderr`, which processes may share) is written as it is.
    if !file.metadata()?.is_file() {
        return Ok(Some(file));
    }
    if let Some(stream) = standard_stream_to(&file) {
        return Ok(Some(stream));
    }
    match file.try_lock() {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => return Ok(None),
        // No locks here (some network file systems): write without one, as before.
        Err(TryLockError::Error(_)) => {}
    }
    file.set_len(0)?;
    Ok(Some(file))
}

/// The program's standard output or error, when it goes to `file` (`/dev/stdout`, or the file it
/// is redirected to): a duplicate of its descriptor, which shares the program's offset, so that
/// what is written follows what the program wrote (a file opened anew would be written from its
/// start, and the program's own writes would overwrite it, or it them). Neither locked nor
/// emptied: the file is the program's.
fn standard_stream_to(file: &File) -> Option<File> {
    use std::os::fd::FromRawFd;
    use std::os::unix::fs::MetadataExt;
    let asked = file.metadata().ok()?;
    [libc::STDOUT_FILENO, libc::STDERR_FILENO]
        .into_iter()
        .find_map(|fd| {
            // SAFETY: `fcntl` with `F_DUPFD_CLOEXEC` reads no memory; on a closed descriptor it
            // fails (-1), and nothing is made of it.
            let copy = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
            if copy < 0 {
                return None;
            }
            // SAFETY: `copy` is a descriptor just made, which nothing else owns: the `File`
            // closes it when dropped.
            let stream = unsafe { File::from_raw_fd(copy) };
            let same = stream
                .metadata()
                .is_ok_and(|m| m.dev() == asked.dev() && m.ino() == asked.ino());
            same.then_some(stream)
        })
}

/// Whether `path` is a file this process holds (the same device and inode as one of `HELD`).
fn held_by_this_process(path: &str) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(asked) = std::fs::metadata(path) else {
        return false;
    };
    HELD.iter().any(|place| {
        let fd = place.load(Ordering::SeqCst);
        fd != NONE
            && std::fs::metadata(format!("/proc/self/fd/{fd}"))
                .is_ok_and(|held| held.dev() == asked.dev() && held.ino() == asked.ino())
    })
}

/// `path` with `pid` before its extension (after the whole name when it has none).
fn with_pid(path: &str, pid: u32) -> String {
    let p = Path::new(path);
    match (p.file_stem(), p.extension()) {
        (Some(stem), Some(ext)) => p
            .with_file_name(format!(
                "{}.{pid}.{}",
                stem.to_string_lossy(),
                ext.to_string_lossy()
            ))
            .to_string_lossy()
            .into_owned(),
        _ => format!("{path}.{pid}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_process_id_goes_before_the_extension() {
        assert_eq!(with_pid("/tmp/run.jsonl", 42), "/tmp/run.42.jsonl");
        assert_eq!(with_pid("/tmp/a.b/run", 42), "/tmp/a.b/run.42");
        assert_eq!(with_pid("run.trace.jsonl", 7), "run.trace.7.jsonl");
    }

    #[test]
    fn a_device_is_written_as_it_is_even_when_held() {
        let theirs = File::open("/dev/null").unwrap();
        theirs.lock().unwrap();
        let ours = claim("/dev/null", 42).unwrap();
        assert_eq!(ours.path, "/dev/null");
        assert_eq!(ours.diverted_from, None);
    }

    #[test]
    fn a_held_file_is_left_alone_and_the_recording_goes_beside_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run.jsonl");
        let path = path.to_str().unwrap();
        std::fs::write(path, "theirs\n").unwrap();
        let theirs = File::open(path).unwrap();
        theirs.lock().unwrap();

        let ours = claim(path, 42).unwrap();
        assert_eq!(ours.path, with_pid(path, 42));
        assert_eq!(ours.diverted_from.as_deref(), Some(path));
        assert_eq!(std::fs::read_to_string(path).unwrap(), "theirs\n");

        // Once both are released, the name is free to take again, and is emptied.
        drop((theirs, ours));
        let again = claim(path, 43).unwrap();
        assert_eq!(again.path, path);
        assert_eq!(again.diverted_from, None);
        assert_eq!(std::fs::read_to_string(path).unwrap(), "");
    }

    #[test]
    fn a_file_this_process_holds_under_another_name_is_told_apart_from_another_process() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run.jsonl");
        let ours = claim(path.to_str().unwrap(), 42).unwrap();
        assert!(!ours.held_here);
        let spelled = dir.path().join(".").join("run.jsonl");
        let again = claim(spelled.to_str().unwrap(), 42).unwrap();
        assert_eq!(again.diverted_from.as_deref(), spelled.to_str());
        assert!(again.held_here);

        // Held by another open file of this process that is not one of its claims: not "here"
        // in the sense of a clash between its own two files, but still locked.
        let other = dir.path().join("other.jsonl");
        std::fs::write(&other, "").unwrap();
        let theirs = File::open(&other).unwrap();
        theirs.lock().unwrap();
        let beside = claim(other.to_str().unwrap(), 42).unwrap();
        assert!(beside.diverted_from.is_some() && !beside.held_here);
    }
}
