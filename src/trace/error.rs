//! The one error type of the trace readers and converters.
//!
//! Every message names the file it is about and says what was wrong, so a user who points the
//! replay at the wrong file (or a file from an unsupported PyTorch version) learns why at once.

use std::fmt;

/// What went wrong reading or converting a recorded trace.
#[derive(Debug)]
pub enum TraceError {
    /// The file could not be read at all.
    Io {
        path: String,
        source: std::io::Error,
    },
    /// The bytes are not a pickle (or a truncated / corrupt one).
    NotPickle { path: String, detail: String },
    /// The text begins as a memory snapshot written as JSON, but is not valid JSON (or a
    /// truncated one).
    NotJson { path: String, detail: String },
    /// A pickle or JSON, but not a `torch.cuda.memory._dump_snapshot` dictionary.
    NotSnapshot { path: String, detail: String },
    /// A memory snapshot, but one entry or field is malformed or of a kind not supported.
    Unsupported { path: String, detail: String },
    /// The recording cannot be turned into a consistent replay (start state, ids).
    Inconsistent { path: String, detail: String },
    /// A line of a cachealloc trace (our own format) is malformed; `line` counts from 1.
    BadLine {
        path: String,
        line: usize,
        detail: String,
    },
}

impl TraceError {
    pub(crate) fn not_snapshot(path: &str, detail: impl Into<String>) -> Self {
        TraceError::NotSnapshot {
            path: path.to_owned(),
            detail: detail.into(),
        }
    }

    pub(crate) fn not_json(path: &str, detail: impl Into<String>) -> Self {
        TraceError::NotJson {
            path: path.to_owned(),
            detail: detail.into(),
        }
    }

    pub(crate) fn unsupported(path: &str, detail: impl Into<String>) -> Self {
        TraceError::Unsupported {
            path: path.to_owned(),
            detail: detail.into(),
        }
    }

    pub(crate) fn bad_line(path: &str, line: usize, detail: impl Into<String>) -> Self {
        TraceError::BadLine {
            path: path.to_owned(),
            line,
            detail: detail.into(),
        }
    }

    pub(crate) fn inconsistent(path: &str, detail: impl Into<String>) -> Self {
        TraceError::Inconsistent {
            path: path.to_owned(),
            detail: detail.into(),
        }
    }
}

impl fmt::Display for TraceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TraceError::Io { path, source } => write!(f, "{path}: cannot read file: {source}"),
            TraceError::NotPickle { path, detail } => write!(
                f,
                "{path}: not a readable Python pickle: {detail}; expected a memory snapshot written by \
                 torch.cuda.memory._dump_snapshot (or as JSON), or a trace cachealloc recorded \
                 (CACHEALLOC_CONF=trace:PATH), whose first line names its format"
            ),
            TraceError::NotJson { path, detail } => write!(
                f,
                "{path}: begins as a memory snapshot written as JSON, but is not readable JSON: \
                 {detail}"
            ),
            TraceError::NotSnapshot { path, detail } => write!(
                f,
                "{path}: not a PyTorch memory snapshot: {detail}; expected a dict with \
                 'segments' and 'device_traces' as written by torch.cuda.memory._dump_snapshot \
                 (or by json.dump of torch.cuda.memory._snapshot())"
            ),
            TraceError::Unsupported { path, detail } => {
                write!(f, "{path}: unsupported memory snapshot content: {detail}")
            }
            TraceError::Inconsistent { path, detail } => {
                write!(
                    f,
                    "{path}: recording cannot be replayed faithfully: {detail}"
                )
            }
            TraceError::BadLine { path, line, detail } => write!(
                f,
                "{path}, line {line}: not a valid cachealloc trace: {detail}; expected a file \
                 written with CACHEALLOC_CONF=trace:PATH or cachealloc synth --save"
            ),
        }
    }
}

impl std::error::Error for TraceError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            TraceError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}
