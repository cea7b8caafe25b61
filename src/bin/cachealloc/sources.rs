//! Loading a recorded trace for replay.

use crate::outcome::Recorded;
use cachealloc::trace::{StartLayout, Workload};
use std::path::Path;

/// A trace ready to replay.
pub struct Loaded {
    pub device: i32,
    pub workload: Workload,
    pub start: Option<StartLayout>,
    pub capacity: Option<u64>,
    pub address_hints: Vec<(u64, u64)>,
    pub recorded: Recorded,
}

pub fn load(path: &Path, _device: Option<i32>, _faithful: bool) -> Result<Loaded, String> {
    Err(format!(
        "{}: reading recorded traces is not built yet",
        path.display()
    ))
}
