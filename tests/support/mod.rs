//! Helpers shared by the integration tests (`mod support;`). Each test binary uses only some of
//! them, hence the `dead_code` allowance.
#![allow(dead_code)]

pub mod ci;
pub mod cli;
pub mod cut_replay;
pub mod fake_cudart;
pub mod json_copy;
pub mod pool_recorder;
pub mod real_cudart;
pub mod reference_pool;
pub mod shim;
pub mod snapshot_pickle;
pub mod trace_lines;
pub mod traces;
