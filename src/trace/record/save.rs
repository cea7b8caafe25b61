//! A replay saved as a trace in this format: what `cachealloc synth --save FILE` writes, so that
//! a generated workload can be kept, shared and replayed (`cachealloc replay FILE`, also
//! `--faithful`) like a program's recording.
//!
//! The file is what the library would have written had a program made the same calls under the
//! same settings on a device like the replay's: the header names the replay's settings, device,
//! capacity and placement, a `device_memory` line the simulated device's memory (when it is
//! limited), with `pid` 0 (no process made the calls) and `free_sync` `none` (a
//! replay's frees complete at once); `t_us` numbers the events (a replay has no clock worth
//! keeping), so one workload always writes the same bytes. The lines are written as the replay
//! makes them, not gathered first.

use super::{Event, Header, settings_text, write_events, write_header};
use crate::config::FreeSync;
use crate::pool::{Error, EventSink, PoolEvent};
use crate::trace::replay::{ReplayConfig, ReplayOutcome, replay_with_sink};
use crate::trace::workload::Workload;
use std::fmt;
use std::io::{self, Write};
use std::sync::{Arc, Mutex};

/// Why a replay could not be saved.
#[derive(Debug)]
pub enum SaveError {
    /// The replay itself failed.
    Replay(Error),
    /// Writing the trace failed.
    Write(io::Error),
}

impl fmt::Display for SaveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SaveError::Replay(e) => e.fmt(f),
            SaveError::Write(e) => write!(f, "cannot write the trace: {e}"),
        }
    }
}

impl std::error::Error for SaveError {}

/// What a saved replay did, and how many of the pool's event lines its trace holds.
#[derive(Debug)]
pub struct Saved {
    pub outcome: ReplayOutcome,
    pub events: u64,
}

/// Replay `workload` from an empty device under `config`, writing the trace to `out` (which
/// is flushed at the end).
pub fn replay_saved<W: Write + Send + 'static>(
    workload: &Workload,
    config: &ReplayConfig,
    out: W,
) -> Result<Saved, SaveError> {
    let device = config.device.0;
    let mut header = Header::new(
        0,
        vec![device],
        settings_text(&config.settings),
        FreeSync::None.name(),
    );
    header.capacity = config.capacity;
    header.placement = Some(config.placement.name().to_string());
    let writer = Arc::new(Mutex::new(LineWriter {
        out,
        device,
        events: 0,
        line: Vec::new(),
        failed: None,
    }));
    {
        let mut w = lock(&writer);
        write_header(&mut w.line, &header);
        w.write_line();
        // The memory the simulated device reports, as the library notes a device's (at time
        // 0, not counted among the pool's events).
        if let Some(total) = config.total() {
            write_events(&mut w.line, &[Event::device_memory(device, total, 0)]);
            w.write_line();
        }
    }
    let sink = Sink(Arc::clone(&writer));
    let outcome = replay_with_sink(workload, config, Box::new(sink)).map_err(SaveError::Replay)?;
    // The pool, and the sink with it, are gone: the writer is ours alone.
    let mut w = lock(&writer);
    let end = Event::end(w.events);
    write_events(&mut w.line, &[end]);
    w.write_line();
    if let Some(e) = w.failed.take() {
        return Err(SaveError::Write(e));
    }
    w.out.flush().map_err(SaveError::Write)?;
    Ok(Saved {
        outcome,
        events: w.events,
    })
}

fn lock<W>(writer: &Mutex<LineWriter<W>>) -> std::sync::MutexGuard<'_, LineWriter<W>> {
    writer.lock().unwrap_or_else(|p| p.into_inner())
}

/// Formats each event into a line and writes it; the first write error stops the writing and
/// is kept for the end of the replay.
struct LineWriter<W> {
    out: W,
    device: i32,
    /// Lines written after the header: the next event's `t_us`.
    events: u64,
    line: Vec<u8>,
    failed: Option<io::Error>,
}

impl<W: Write> LineWriter<W> {
    fn write_line(&mut self) {
        if self.failed.is_none()
            && let Err(e) = self.out.write_all(&self.line)
        {
            self.failed = Some(e);
        }
        self.line.clear();
    }
}

/// The pool's sink: one line per event.
struct Sink<W>(Arc<Mutex<LineWriter<W>>>);

impl<W: Write + Send> EventSink for Sink<W> {
    fn record(&mut self, event: &PoolEvent) {
        let mut w = lock(&self.0);
        let line = Event::from_pool(event, w.device, w.events);
        w.events += 1;
        write_events(&mut w.line, &[line]);
        w.write_line();
    }
}
