//! A replay saved as a trace in this format: what `cachealloc synth --save FILE` writes, so that
//! a generated workload can be kept, shared and replayed (`cachealloc replay FILE`, also
//! `--faithful`) like a program's recording.
//!
//! The file is what the library would have written had a program made the same calls under the
//! same settings on a device like the replay's: the header names the replay's settings and
//! device, with `pid` 0 (no process made the calls) and `free_sync` `none` (a replay's frees
//! complete at once); `t_us` numbers the events, so one workload always writes the same bytes.

use super::buffer::EventBuffer;
use super::{Header, settings_text, write_events, write_header};
use crate::config::FreeSync;
use crate::pool::Error;
use crate::trace::replay::{ReplayConfig, ReplayOutcome, replay_with_sink};
use crate::trace::workload::Workload;

/// Replay `workload` from an empty device under `config`, and return what happened with the
/// trace file's bytes.
pub fn replay_saved(
    workload: &Workload,
    config: &ReplayConfig,
) -> Result<(ReplayOutcome, Vec<u8>), Error> {
    let buffer = EventBuffer::numbered();
    let device = config.device.0;
    let out = replay_with_sink(workload, config, None, Box::new(buffer.sink(device)))?;
    let mut bytes = Vec::new();
    let header = Header::new(
        0,
        vec![device],
        settings_text(&config.settings),
        FreeSync::None.name(),
    );
    write_header(&mut bytes, &header);
    write_events(&mut bytes, &buffer.take());
    Ok((out, bytes))
}
