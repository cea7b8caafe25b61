//! `TraceFile`: a trace path opened once.
//!
//! Its first bytes are read to tell a trace cachealloc recorded (a header line) from a PyTorch
//! memory snapshot (a pickle, or the same snapshot written as JSON), and the reader of that kind
//! goes on from there. So a trace can come through a pipe (`cachealloc replay <(zcat
//! snapshot.pickle.gz)`, or `-` for standard input), which gives its bytes once. A stream that
//! is not a regular file has no end to wait for: a snapshot is judged by its first bytes before
//! the rest is read, so `/dev/zero` or `/dev/urandom` is refused at once rather than read until
//! memory runs out. JSON that does not begin as a snapshot (a profiler trace, which can be
//! large) is refused from its first bytes as well, file or stream; a snapshot written as JSON
//! is decoded as it is read, never held whole as text.

use std::fs::File;
use std::io::{BufReader, Cursor, Read};
use std::path::Path;

use super::error::TraceError;
use super::json_snapshot::{JsonStart, json_start};
use super::record::looks_like_header;
use super::record::read::{RecordedTrace, parse_recorded_trace};
use super::recording::RecordedSnapshot;
use super::snapshot::{check_snapshot_start, parse_json_snapshot, parse_snapshot};

/// Bytes read before the kind is decided: a recorded trace's header line fits in them.
const HEAD_BYTES: u64 = 4096;

/// The process's standard input, as a file of its own.
fn standard_input() -> std::io::Result<File> {
    use std::os::fd::AsFd;
    Ok(File::from(std::io::stdin().as_fd().try_clone_to_owned()?))
}

/// An opened trace: its first bytes, read, and the rest, not yet read.
#[derive(Debug)]
pub struct TraceFile {
    /// The path, as messages name it.
    name: String,
    head: Vec<u8>,
    rest: File,
    /// A regular file (not a pipe or a device).
    regular: bool,
}

impl TraceFile {
    /// Open `path` (`-`: standard input) and read its first bytes.
    pub fn open(path: &Path) -> Result<Self, TraceError> {
        let name = path.display().to_string();
        let io = |source| TraceError::Io {
            path: name.clone(),
            source,
        };
        if path.is_dir() {
            return Err(io(std::io::Error::other(
                "it is a directory: give the snapshot file, the pickle that \
                 torch.cuda.memory._dump_snapshot wrote (or a trace cachealloc recorded)",
            )));
        }
        let mut file = if path.as_os_str() == "-" {
            standard_input().map_err(io)?
        } else {
            File::open(path).map_err(io)?
        };
        let regular = file.metadata().is_ok_and(|m| m.is_file());
        let mut head = Vec::new();
        (&mut file)
            .take(HEAD_BYTES)
            .read_to_end(&mut head)
            .map_err(io)?;
        Ok(Self {
            name,
            head,
            rest: file,
            regular,
        })
    }

    /// Whether it begins with the header line of a trace cachealloc recorded.
    pub fn is_recorded_trace(&self) -> bool {
        let first_line = self.head.split(|&b| b == b'\n').next().unwrap_or(&[]);
        looks_like_header(first_line)
    }

    /// Read it as a trace cachealloc recorded.
    pub fn read_recorded_trace(self) -> Result<RecordedTrace, TraceError> {
        let reader = BufReader::new(Cursor::new(self.head).chain(self.rest));
        parse_recorded_trace(reader, &self.name)
    }

    /// Read it as a PyTorch memory snapshot: a pickle, or JSON.
    pub fn read_snapshot(self) -> Result<RecordedSnapshot, TraceError> {
        let Self {
            name,
            mut head,
            mut rest,
            regular,
        } = self;
        match json_start(&head) {
            Some(JsonStart::Snapshot) => {
                let text = BufReader::new(Cursor::new(head).chain(rest));
                return parse_json_snapshot(text, &name);
            }
            Some(JsonStart::Other) => check_snapshot_start(&head, &name)?,
            None if !regular => check_snapshot_start(&head, &name)?,
            None => {}
        }
        rest.read_to_end(&mut head)
            .map_err(|source| TraceError::Io {
                path: name.clone(),
                source,
            })?;
        parse_snapshot(&head, &name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endless_streams_that_are_not_pickles_are_refused_from_their_first_bytes() {
        for device in ["/dev/zero", "/dev/urandom"] {
            let file = TraceFile::open(Path::new(device)).unwrap();
            assert!(!file.is_recorded_trace(), "{device}");
            let err = file.read_snapshot().unwrap_err().to_string();
            assert!(
                err.starts_with(&format!("{device}: not a readable Python pickle: ")),
                "{device}: {err}"
            );
        }
    }

    /// The kind is told by the first line alone, wherever in it the header names its format: a
    /// header with its keys in another order is a recorded trace, and JSON that names a
    /// `format` only on a later line is not.
    #[test]
    fn the_first_line_alone_tells_a_recorded_trace() {
        let dir = tempfile::tempdir().unwrap();
        let open = |name: &str, text: String| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            TraceFile::open(&path).unwrap()
        };
        let settings = "max_split_size_mb:512,garbage_collection_threshold:0.6";
        let reordered = format!(
            "{{\"settings\":\"{settings}\",\"free_sync\":\"device\",\"pid\":1,\"devices\":[0],\
             \"version\":4,\"format\":\"cachealloc-trace\"}}\n"
        );
        let file = open("reordered.trace", reordered);
        assert!(file.is_recorded_trace());
        let trace = file.read_recorded_trace().unwrap();
        assert_eq!(trace.header.settings, settings);
        let json = open(
            "profile.json",
            "{\n  \"schemaVersion\": 1,\n  \"format\": \"chrome\"\n}\n".into(),
        );
        assert!(!json.is_recorded_trace());
        let err = json.read_snapshot().unwrap_err().to_string();
        assert!(err.contains("it is JSON text"), "{err}");
    }

    /// A snapshot written as JSON is read through a pipe; other JSON is refused from its first
    /// bytes, file or pipe, without reading the rest.
    #[test]
    fn json_is_told_from_its_first_bytes_through_a_pipe_or_in_a_file() {
        use std::io::Write;
        use std::os::fd::AsRawFd;
        // What `text` reads as through a pipe, and how many of its bytes were written to the
        // pipe before the reader closed it.
        let pipe_through = |text: Vec<u8>| {
            let (reader, mut writer) = std::io::pipe().unwrap();
            let feeder = std::thread::spawn(move || {
                let mut written = 0;
                for chunk in text.chunks(4096) {
                    if writer.write_all(chunk).is_err() {
                        break;
                    }
                    written += chunk.len();
                }
                written
            });
            let path = format!("/dev/fd/{}", reader.as_raw_fd());
            let result = read_trace_snapshot(Path::new(&path));
            drop(reader);
            (result, feeder.join().unwrap())
        };
        let snapshot = br#"{"segments": [{"device": 0, "address": 2097152, "total_size": 2097152,
            "blocks": [{"size": 2097152, "state": "inactive"}]}], "device_traces": [[]]}"#;
        let snap = pipe_through(snapshot.to_vec()).0.unwrap();
        assert_eq!(snap.devices[0].segments[0].total_size, 2 << 20);
        // A profiler trace far longer than the bytes read to decide.
        let mut profile = b"{\"traceEvents\": [".to_vec();
        profile.resize(64 << 20, b' ');
        let (result, written) = pipe_through(profile.clone());
        let err = result.unwrap_err().to_string();
        assert!(
            err.contains("it is JSON text, but not a memory snapshot"),
            "{err}"
        );
        // What a pipe buffers beyond the bytes read is at most 1 MiB on Linux.
        assert!(written <= 4 << 20, "{written} bytes read before refusing");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("profile.json");
        std::fs::write(&path, &profile).unwrap();
        let err = read_trace_snapshot(&path).unwrap_err().to_string();
        assert!(
            err.contains("it is JSON text, but not a memory snapshot"),
            "{err}"
        );
    }

    fn read_trace_snapshot(path: &Path) -> Result<RecordedSnapshot, TraceError> {
        TraceFile::open(path)?.read_snapshot()
    }

    #[test]
    fn a_directory_is_named_as_one() {
        let dir = tempfile::tempdir().unwrap();
        let err = TraceFile::open(dir.path()).unwrap_err().to_string();
        assert!(
            err.contains("it is a directory: give the snapshot file"),
            "{err}"
        );
    }
}
