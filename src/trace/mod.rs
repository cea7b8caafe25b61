//! Allocation traces: the workload model, readers for recorded traces, and replay through the
//! pool on the simulated device.

pub mod rng;
pub mod synth;
pub mod workload;

pub use workload::{AllocId, Op, Workload};
