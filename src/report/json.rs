//! Statistics as one JSON object under PyTorch's flattened keys, as `torch.cuda.memory_stats()`
//! returns them (`"allocated_bytes.all.current"`, …, `"max_split_size"`), so tools written for
//! PyTorch's dictionary read ours unchanged.

use crate::pool::DeviceStats;
use serde_json::{Map, Value};

/// `{"active.all.allocated": …, …}` with every key of `DeviceStats::flat`, in sorted order.
pub fn stats_json(stats: &DeviceStats) -> Value {
    let object: Map<String, Value> = stats
        .flat()
        .into_iter()
        .map(|(key, value)| (key, Value::from(value)))
        .collect();
    Value::Object(object)
}

/// `stats_json` as compact text.
pub fn stats_json_string(stats: &DeviceStats) -> String {
    stats_json(stats).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::Counts;

    #[test]
    fn keys_are_pytorch_flattened_names() {
        let mut stats = DeviceStats {
            max_split_size: -1,
            counts: Counts {
                num_ooms: 3,
                ..Counts::default()
            },
            ..DeviceStats::default()
        };
        stats.allocated_bytes.all.increase(512);
        stats.allocated_bytes.small_pool.increase(512);
        stats.reserved_bytes.all.increase(20 << 20);
        stats.reserved_bytes.large_pool.increase(20 << 20);
        stats.oversize_segments.increase(1);

        let text = stats_json_string(&stats);
        let parsed: Value = serde_json::from_str(&text).unwrap();
        let object = parsed.as_object().unwrap();
        assert_eq!(object.len(), stats.flat().len());
        assert_eq!(object["allocated_bytes.all.current"], 512);
        assert_eq!(object["allocated_bytes.small_pool.peak"], 512);
        assert_eq!(object["allocated_bytes.large_pool.current"], 0);
        assert_eq!(object["reserved_bytes.large_pool.allocated"], 20 << 20);
        assert_eq!(object["oversize_segments.current"], 1);
        assert_eq!(object["num_ooms"], 3);
        assert_eq!(object["max_split_size"], -1);
        assert!(object.contains_key("inactive_split_bytes.all.freed"));
        assert!(object.contains_key("num_sync_all_streams"));
        // Keys appear sorted, as PyTorch's OrderedDict holds them.
        assert!(text.starts_with("{\"active.all.allocated\":0,"));
    }
}
