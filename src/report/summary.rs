//! `memory_summary`: the text table of `torch.cuda.memory_summary()`, for one device.
//!
//! Same grid, rows, order and units as PyTorch (torch/cuda/memory.py): 75-character lines
//! framed by `|`, one block per metric with an `all` row and (unless abbreviated) the large-
//! and small-pool rows, whose units follow the `all` row of the same column. Only the title says
//! "cachealloc memory summary" instead of "PyTorch CUDA memory summary"; the device field is two
//! characters wider so the line keeps its 75 characters.

use super::format::{summary_count, summary_size};
use crate::pool::{DeviceId, DeviceStats, Stat, StatArray};
use std::fmt::Write;

/// Width of every line between the `|` frames.
const WIDTH: usize = 75; // characters

type Formatter = fn(i64, i64) -> String;

/// The table for `stats` of `device`; `abbreviated` drops the per-pool rows.
pub fn memory_summary(stats: &DeviceStats, device: DeviceId, abbreviated: bool) -> String {
    let blocks: [(&StatArray, &str, Formatter); 9] = [
        (&stats.allocated_bytes, "Allocated memory", summary_size),
        (&stats.active_bytes, "Active memory", summary_size),
        (&stats.requested_bytes, "Requested memory", summary_size),
        (&stats.reserved_bytes, "GPU reserved memory", summary_size),
        (
            &stats.inactive_split_bytes,
            "Non-releasable memory",
            summary_size,
        ),
        (&stats.allocation, "Allocations", summary_count),
        (&stats.active, "Active allocs", summary_count),
        (&stats.segment, "GPU reserved segments", summary_count),
        (
            &stats.inactive_split,
            "Non-releasable allocs",
            summary_count,
        ),
    ];
    let singles: [(&Stat, &str); 2] = [
        (&stats.oversize_allocations, "Oversize allocations"),
        (&stats.oversize_segments, "Oversize GPU segments"),
    ];

    let mut lines = vec![
        "=".repeat(WIDTH),
        format!(
            " {:16} cachealloc memory summary, device ID {:<19} ",
            "", device.0
        ),
        "-".repeat(WIDTH),
        format!(
            "  {:9} CUDA OOMs: {:<12} | {:6} cudaMalloc retries: {:<8}  ",
            "", stats.counts.num_ooms, "", stats.counts.num_alloc_retries
        ),
        "=".repeat(WIDTH),
        "        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  ".to_string(),
    ];
    for (array, name, format) in blocks {
        lines.push("-".repeat(WIDTH));
        let mut rows = vec![(name, &array.all)];
        if !abbreviated {
            rows.push(("      from large pool", &array.large_pool));
            rows.push(("      from small pool", &array.small_pool));
        }
        for (row_name, stat) in rows {
            lines.push(row(row_name, stat, &array.all, format));
        }
    }
    for (stat, name) in singles {
        lines.push("-".repeat(WIDTH));
        lines.push(row(name, stat, stat, summary_count));
    }
    lines.push("=".repeat(WIDTH));

    let mut out = String::with_capacity(lines.len() * (WIDTH + 3));
    for line in lines {
        // Writing to a String cannot fail.
        let _ = writeln!(out, "|{line}|");
    }
    out
}

/// `" {name:<21} | cur | peak | alloc | freed "`, each column in the unit of `reference`.
fn row(name: &str, stat: &Stat, reference: &Stat, format: Formatter) -> String {
    format!(
        " {name:<21} | {} | {} | {} | {} ",
        format(stat.current, reference.current),
        format(stat.peak, reference.peak),
        format(stat.allocated, reference.allocated),
        format(stat.freed, reference.freed),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::Counts;

    fn stat(current: i64, peak: i64, allocated: i64, freed: i64) -> Stat {
        Stat {
            current,
            peak,
            allocated,
            freed,
        }
    }

    /// Stats chosen so the table shows MiB, KiB, B, plain, K and M units.
    fn hand_built() -> DeviceStats {
        const MIB: i64 = 1 << 20;
        const GIB: i64 = 1 << 30;
        let mut stats = DeviceStats {
            counts: Counts {
                num_ooms: 2,
                num_alloc_retries: 17,
                ..Counts::default()
            },
            max_split_size: -1,
            ..DeviceStats::default()
        };
        stats.allocated_bytes = StatArray {
            all: stat(3 * GIB / 2, 2 * GIB, 5 * GIB, 7 * GIB / 2),
            large_pool: stat(
                3 * GIB / 2 - MIB,
                2 * GIB - MIB,
                5 * GIB - 4 * MIB,
                7 * GIB / 2 - 3 * MIB,
            ),
            small_pool: stat(MIB, MIB, 4 * MIB, 3 * MIB),
        };
        stats.active_bytes.all.current = 800_000;
        stats.active_bytes.small_pool.current = 800_000;
        stats.allocation = StatArray {
            all: stat(1234, 800_000, 2_500_000_000, 2_499_998_766),
            large_pool: stat(1000, 500_000, 1_000_000_000, 999_999_000),
            small_pool: stat(234, 300_000, 1_500_000_000, 1_499_999_766),
        };
        stats.oversize_segments = stat(3, 5, 7, 4);
        stats
    }

    #[test]
    fn full_summary_matches_pytorch_layout() {
        let expected = [
            "|===========================================================================|",
            "|                  cachealloc memory summary, device ID 1                   |",
            "|---------------------------------------------------------------------------|",
            "|            CUDA OOMs: 2            |        cudaMalloc retries: 17        |",
            "|===========================================================================|",
            "|        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  |",
            "|---------------------------------------------------------------------------|",
            "| Allocated memory      |   1536 MiB |   2048 MiB |   5120 MiB |   3584 MiB |",
            "|       from large pool |   1535 MiB |   2047 MiB |   5116 MiB |   3581 MiB |",
            "|       from small pool |      1 MiB |      1 MiB |      4 MiB |      3 MiB |",
            "|---------------------------------------------------------------------------|",
            "| Active memory         |    781 KiB |      0 B   |      0 B   |      0 B   |",
            "|       from large pool |      0 KiB |      0 B   |      0 B   |      0 B   |",
            "|       from small pool |    781 KiB |      0 B   |      0 B   |      0 B   |",
            "|---------------------------------------------------------------------------|",
            "| Requested memory      |      0 B   |      0 B   |      0 B   |      0 B   |",
            "|       from large pool |      0 B   |      0 B   |      0 B   |      0 B   |",
            "|       from small pool |      0 B   |      0 B   |      0 B   |      0 B   |",
            "|---------------------------------------------------------------------------|",
            "| GPU reserved memory   |      0 B   |      0 B   |      0 B   |      0 B   |",
            "|       from large pool |      0 B   |      0 B   |      0 B   |      0 B   |",
            "|       from small pool |      0 B   |      0 B   |      0 B   |      0 B   |",
            "|---------------------------------------------------------------------------|",
            "| Non-releasable memory |      0 B   |      0 B   |      0 B   |      0 B   |",
            "|       from large pool |      0 B   |      0 B   |      0 B   |      0 B   |",
            "|       from small pool |      0 B   |      0 B   |      0 B   |      0 B   |",
            "|---------------------------------------------------------------------------|",
            "| Allocations           |    1234    |     800 K  |    2500 M  |    2499 M  |",
            "|       from large pool |    1000    |     500 K  |    1000 M  |     999 M  |",
            "|       from small pool |     234    |     300 K  |    1500 M  |    1499 M  |",
            "|---------------------------------------------------------------------------|",
            "| Active allocs         |       0    |       0    |       0    |       0    |",
            "|       from large pool |       0    |       0    |       0    |       0    |",
            "|       from small pool |       0    |       0    |       0    |       0    |",
            "|---------------------------------------------------------------------------|",
            "| GPU reserved segments |       0    |       0    |       0    |       0    |",
            "|       from large pool |       0    |       0    |       0    |       0    |",
            "|       from small pool |       0    |       0    |       0    |       0    |",
            "|---------------------------------------------------------------------------|",
            "| Non-releasable allocs |       0    |       0    |       0    |       0    |",
            "|       from large pool |       0    |       0    |       0    |       0    |",
            "|       from small pool |       0    |       0    |       0    |       0    |",
            "|---------------------------------------------------------------------------|",
            "| Oversize allocations  |       0    |       0    |       0    |       0    |",
            "|---------------------------------------------------------------------------|",
            "| Oversize GPU segments |       3    |       5    |       7    |       4    |",
            "|===========================================================================|",
        ];
        let expected = expected.join("\n") + "\n";
        assert_eq!(memory_summary(&hand_built(), DeviceId(1), false), expected);
    }

    /// Each block shows its own statistic, in its rows for all pools, the large and the small
    /// pool: a block whose figures were another's would read plausibly.
    #[test]
    fn each_block_shows_its_own_statistic() {
        let mut stats = DeviceStats::default();
        let blocks = [
            (&mut stats.allocated_bytes, "Allocated memory"),
            (&mut stats.active_bytes, "Active memory"),
            (&mut stats.requested_bytes, "Requested memory"),
            (&mut stats.reserved_bytes, "GPU reserved memory"),
            (&mut stats.inactive_split_bytes, "Non-releasable memory"),
            (&mut stats.allocation, "Allocations"),
            (&mut stats.active, "Active allocs"),
            (&mut stats.segment, "GPU reserved segments"),
            (&mut stats.inactive_split, "Non-releasable allocs"),
        ];
        let mut expected = Vec::new();
        for (k, (array, name)) in (1..).zip(blocks) {
            // Current, peak, allocated and freed told apart, and each pool from the others.
            array.all = stat(k, 10 + k, 20 + k, 30 + k);
            array.large_pool = stat(100 + k, 110 + k, 120 + k, 130 + k);
            array.small_pool = stat(200 + k, 210 + k, 220 + k, 230 + k);
            let unit = if k <= 5 { "B  " } else { "  " };
            let width = if k <= 5 { 6 } else { 7 };
            let row = |name: &str, base: i64| {
                let cells: Vec<String> = (0..4)
                    .map(|c| format!("{:width$} {unit}", base + 10 * c + k))
                    .collect();
                format!("| {name:<21} | {} |", cells.join(" | "))
            };
            expected.push(row(name, 0));
            expected.push(row("      from large pool", 100));
            expected.push(row("      from small pool", 200));
        }
        stats.oversize_allocations = stat(41, 42, 43, 44);
        stats.oversize_segments = stat(51, 52, 53, 54);
        expected.push(
            "| Oversize allocations  |      41    |      42    |      43    |      44    |".into(),
        );
        expected.push(
            "| Oversize GPU segments |      51    |      52    |      53    |      54    |".into(),
        );
        let text = memory_summary(&stats, DeviceId(0), false);
        let rows: Vec<&str> = text
            .lines()
            .filter(|line| line.matches(" | ").count() == 4 && !line.contains("Metric"))
            .collect();
        assert_eq!(rows, expected);
    }

    #[test]
    fn abbreviated_summary_keeps_only_all_rows() {
        let text = memory_summary(&hand_built(), DeviceId(0), true);
        assert!(!text.contains("from large pool") && !text.contains("from small pool"));
        assert!(text.contains("| Allocated memory      |   1536 MiB |   2048 MiB |"));
        // 6 header lines, 11 metrics of 2 lines each, the closing line.
        assert_eq!(text.lines().count(), 6 + 11 * 2 + 1);
        assert!(text.lines().all(|line| line.chars().count() == WIDTH + 2));
        assert!(text.contains("device ID 0                   |"));
    }
}
