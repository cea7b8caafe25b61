//! A replay's out-of-memory where the recording's own retry completed a free that then holds
//! the request: its synchronization completed it after the search, which PyTorch does not
//! repeat (the README's "Freed too late", pytorch#189504). The report says so, in a plain replay
//! and a faithful one, not fragmentation.

mod support;

use support::cli::{cachealloc, json};

/// A cachealloc trace: a 600 MiB segment whose block is allocated and freed; 500 MiB and
/// 100 MiB cut from it; the 500 MiB block's free requested, and completed by the retry of a
/// 500 MiB request that then runs out of memory.
fn write_freed_at_retry() -> std::path::PathBuf {
    let (a, mib) = (0x7f00_0000_0000u64, 1u64 << 20);
    let events = [
        ("segment_alloc", a, 600 * mib),
        ("alloc", a, 600 * mib),
        ("free_completed", a, 600 * mib),
        ("alloc", a, 500 * mib),
        ("alloc", a + 500 * mib, 100 * mib),
        ("free_requested", a, 500 * mib),
        ("free_completed", a, 500 * mib),
        ("retry", 0, 500 * mib),
    ];
    let mut lines = vec![
        r#"{"format":"cachealloc-trace","version":4,"pid":1,"devices":[0],"settings":"","free_sync":"device"}"#.to_string(),
    ];
    for (t, (action, addr, size)) in events.iter().enumerate() {
        lines.push(format!(
            r#"{{"t_us":{},"device":0,"action":"{action}","addr":{addr},"size":{size},"stream":0}}"#,
            t + 1
        ));
    }
    lines.push(format!(
        r#"{{"t_us":9,"device":0,"action":"oom","addr":0,"size":{},"stream":0,"device_free":{},"requested":{}}}"#,
        500 * mib,
        200 * mib,
        500 * mib
    ));
    lines.push(r#"{"t_us":10,"device":0,"action":"end","addr":0,"size":0,"stream":0}"#.to_string());
    let path = std::env::temp_dir().join(format!("cachealloc-ft2-{}.trace", std::process::id()));
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    path
}

#[test]
fn a_block_freed_at_the_retry_is_reported_as_freed_too_late() {
    let path = write_freed_at_retry();
    let p = path.to_str().unwrap();
    for mode in [&[][..], &["--faithful"][..]] {
        let args = [&["replay", p, "--capacity", "800MiB"][..], mode].concat();
        let v = json(&cachealloc(&[&args[..], &["--json"]].concat()));
        let report = &v["first_oom_report"];
        assert_eq!(report["kind"], "freed_during_request", "{mode:?}: {v}");
        let text = String::from_utf8(cachealloc(&args).stdout).unwrap();
        assert!(
            text.contains("Hint: Freed too late: a free cached block of 500.00 MiB now holds this 500.00 MiB block")
                && !text.contains("Fragmentation"),
            "{mode:?}: {text}"
        );
        // The settings that avoid it too are not presented as the remedy.
        assert!(
            text.contains(
                "the hint above needs none of them (freeing the block before the request avoids \
                 it), but they avoid it too:"
            ),
            "{mode:?}: {text}"
        );
    }
    std::fs::remove_file(&path).unwrap();
}
