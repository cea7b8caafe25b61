//! Whether the tests run under CI, where everything a test needs must be present: a missing
//! prerequisite there means a set-up step did not run, and is a failure rather than a skip.

/// `$CI` set and not empty, `0` or `false`.
pub fn running_under_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !matches!(v.trim(), "" | "0" | "false"))
}
