//! Allocation traces: the workload model, readers for recorded traces, and replay through the
//! pool on the simulated device.

pub mod replay;
pub mod rng;
pub mod synth;
pub mod workload;

pub use replay::{OomAt, ReplayConfig, ReplayOutcome, StartLayout, replay};
pub use workload::{AllocId, Op, Workload};
