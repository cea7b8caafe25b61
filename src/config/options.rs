//! The options table: every option is declared here once — name, value, unit, which variables may
//! carry it, a one-line description, how its value is applied and how it is shown. The parser,
//! the README table (`render_markdown_table`, checked by a test), the `--help` listing
//! (`render_help`) and the effective-settings listing (`render_values`) all read this table.
//!
//! Adding an option: add one `OptionSpec` to `OPTIONS` (and a field to `Config` if it needs one),
//! then regenerate the README table (the README test prints the expected text).
//!
//! Note: the "Default" column is not written by hand; it is the option's `show` applied to
//! `Config::default()`, so it cannot drift from the real default.

use super::syntax::Value;
use super::values::{self, MB};
use super::{Config, FreeSync, StatsOutput};
use crate::pool::max_split_size_from_bytes;
use crate::pool::rounding::ROUNDUP_INTERVALS;

/// Our own variable: shared and cachealloc keys.
pub const CONF_VAR: &str = "CACHEALLOC_CONF";
/// PyTorch's variable, read when `CACHEALLOC_CONF` is unset (PyTorch reads it first as well).
pub const PYTORCH_CUDA_CONF_VAR: &str = "PYTORCH_CUDA_ALLOC_CONF";
/// PyTorch's newer generic variable, read when both of the above are unset.
pub const PYTORCH_CONF_VAR: &str = "PYTORCH_ALLOC_CONF";
/// `1` turns the library into a pure pass-through.
pub const DISABLE_VAR: &str = "CACHEALLOC_DISABLE";
/// A `tracing` EnvFilter for our log lines.
pub const LOG_VAR: &str = "CACHEALLOC_LOG";
/// The log filter when `CACHEALLOC_LOG` is unset or blank.
pub const DEFAULT_LOG_FILTER: &str = "warn";

/// Which variables may carry an option.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Carrier {
    /// A PyTorch allocator key with PyTorch's meaning: read from `CACHEALLOC_CONF` and, when that
    /// is unset, from `PYTORCH_CUDA_ALLOC_CONF` / `PYTORCH_ALLOC_CONF`.
    Shared,
    /// Our own key: only in `CACHEALLOC_CONF` (PyTorch rejects keys it does not know).
    Cachealloc,
}

impl Carrier {
    fn read_from(self) -> &'static str {
        match self {
            Carrier::Shared => "`CACHEALLOC_CONF`, `PYTORCH_CUDA_ALLOC_CONF`, `PYTORCH_ALLOC_CONF`",
            Carrier::Cachealloc => "`CACHEALLOC_CONF`",
        }
    }
}

/// One option of the `key:value` grammar.
pub struct OptionSpec {
    /// The key, case-sensitive.
    pub name: &'static str,
    /// What a value may be.
    pub value: &'static str,
    /// Unit of the value ("" when it has none).
    pub unit: &'static str,
    /// Which variables may carry it.
    pub carrier: Carrier,
    /// One line for the README and `--help`.
    pub doc: &'static str,
    apply: fn(&mut Config, &Value, &mut Vec<String>) -> Result<(), String>,
    show: fn(&Config) -> String,
}

/// The options whose value may be a bracketed list; every other one takes a single value.
const LIST_OPTIONS: &[&str] = &["roundup_power2_divisions"];

impl OptionSpec {
    /// Store the value in `config`, or say what is allowed.
    /// Notes about how a number was read go to `notes` (see `values`).
    pub(crate) fn apply(
        &self,
        config: &mut Config,
        value: &Value,
        notes: &mut Vec<String>,
    ) -> Result<(), String> {
        if matches!(value, Value::List(_)) && !self.takes_list() {
            return Err(format!(
                "{}; allowed: {}",
                values::NOT_A_LIST,
                self.allowed()
            ));
        }
        (self.apply)(config, value, notes)
    }

    /// Whether the value may be a bracketed list.
    pub fn takes_list(&self) -> bool {
        LIST_OPTIONS.contains(&self.name)
    }

    /// What a value may be, with its unit: "integer >= 20 (MiB)".
    pub fn allowed(&self) -> String {
        // `value` is written for the README (Markdown); messages show it without the backticks.
        let value = self.value.replace('`', "");
        // A value that explains itself in brackets already names its unit.
        if self.unit.is_empty() || value.contains('(') {
            value
        } else {
            format!("{value} ({})", self.unit)
        }
    }

    /// The option's value in `config`, as a user would read it.
    pub fn current(&self, config: &Config) -> String {
        (self.show)(config)
    }

    /// The default value, as a user would read it.
    pub fn default_text(&self) -> String {
        self.current(&Config::default())
    }
}

/// PyTorch allocator keys that have no meaning here: accepted (their value is not checked) and
/// ignored with a debug log line, from any variable.
pub const PYTORCH_ONLY_KEYS: &[&str] = &[
    "backend",
    "release_lock_on_cudamalloc",
    "release_lock_on_hipmalloc",
    "pinned_use_cuda_host_register",
    "pinned_use_hip_host_register",
    "pinned_num_register_threads",
    "pinned_use_background_threads",
    "pinned_reserve_segment_size_mb",
    "pinned_max_round_threshold_mb",
    "pinned_max_cached_size_mb",
    "pinned_free_catch_all",
    "graph_capture_record_stream_reuse",
    "throw_on_cudamalloc_oom",
    "large_segment_size_mb",
    "expandable_segments_reserve",
    "expandable_segments_reserve_by_class",
];

/// A PyTorch-only key that changes the policy PyTorch would follow, so that ignoring it is
/// worth a warning (see `Config::unsupported_key_warnings`).
pub struct IgnoredPolicyKey {
    pub key: &'static str,
    /// The value that changes the policy (`None`: any value).
    pub value: Option<&'static str>,
    /// What cachealloc does instead.
    pub instead: &'static str,
}

impl IgnoredPolicyKey {
    /// `key` or `key:value`, as the warning names it.
    pub fn written(&self) -> String {
        match self.value {
            Some(value) => format!("{}:{value}", self.key),
            None => self.key.to_string(),
        }
    }
}

/// The policy-changing entry `key:value` is, if it is one.
pub fn policy_key(key: &str, value: &str) -> Option<&'static IgnoredPolicyKey> {
    POLICY_KEYS_NOT_SUPPORTED
        .iter()
        .find(|p| p.key == key && p.value.is_none_or(|v| v == value))
}

pub const POLICY_KEYS_NOT_SUPPORTED: &[IgnoredPolicyKey] = &[
    IgnoredPolicyKey {
        key: "large_segment_size_mb",
        value: None,
        instead: "large segments stay 20 MiB (PyTorch's default) and max_split_size_mb's \
                  minimum stays 20",
    },
    IgnoredPolicyKey {
        key: "backend",
        value: Some("cudaMallocAsync"),
        instead: "cachealloc serves and replays PyTorch's native caching allocator only; a \
                  PyTorch that reads this setting allocates with cudaMallocAsync instead, which \
                  cachealloc does not see",
    },
    IgnoredPolicyKey {
        key: "throw_on_cudamalloc_oom",
        value: Some("True"),
        instead: "a request over the per_process_memory_fraction limit takes the native path \
                  (release cached blocks, retry) before it fails",
    },
];

/// Every option, in the order of the README table.
pub static OPTIONS: &[OptionSpec] = &[
    OptionSpec {
        name: "max_split_size_mb",
        value: "integer >= 20",
        unit: "MiB",
        carrier: Carrier::Shared,
        doc: "Cached blocks this large or larger are never split; limits fragmentation. (PyTorch 2.9 and older refuse 20 itself, their parser wanting more than 20: write 21 or more for them.)",
        apply: |c, v, notes| {
            c.settings.max_split_size =
                max_split_size_from_bytes(values::size_mb_at_least_20(v, notes)?);
            Ok(())
        },
        show: |c| match c.settings.max_split_size {
            u64::MAX => "unlimited".to_string(),
            bytes => (bytes / MB).to_string(),
        },
    },
    OptionSpec {
        name: "max_non_split_rounding_mb",
        value: "integer >= 20",
        unit: "MiB",
        carrier: Carrier::Shared,
        doc: "An unsplittable cached block serves a smaller request only if it is less than this much larger. (PyTorch 2.9 and older refuse 20 here too: write 21 or more for them.)",
        apply: |c, v, notes| {
            c.settings.max_non_split_rounding = values::size_mb_at_least_20(v, notes)?;
            Ok(())
        },
        show: |c| (c.settings.max_non_split_rounding / MB).to_string(),
    },
    OptionSpec {
        name: "roundup_power2_divisions",
        value: "power of 2, or list `[MB:div,...,>:div]` (div 0 or a power of 2)",
        unit: "MiB (intervals)",
        carrier: Carrier::Shared,
        doc: "Round request sizes up to one of `div` steps between powers of two; a list sets `div` per size interval, entry `B` covering `[B MiB, 2B MiB)`, and `>:div` every interval after the last one listed. (PyTorch 2.9 and older let `>` overwrite that last interval too: there `[256:1,1024:4,>:8]` gives 8 from 1 GiB up, here 4 in `[1 GiB, 2 GiB)`.)",
        apply: |c, v, notes| {
            values::apply_roundup_divisions(&mut c.settings.roundup_power2_divisions, v, notes)
        },
        show: |c| show_roundup(&c.settings.roundup_power2_divisions),
    },
    OptionSpec {
        name: "garbage_collection_threshold",
        value: "number, 0 < v < 1",
        unit: "fraction",
        carrier: Carrier::Shared,
        doc: "Reclaim cached unused blocks once reserved memory exceeds this fraction of the allowed maximum (acts when `per_process_memory_fraction` < 1).",
        apply: |c, v, notes| {
            c.settings.garbage_collection_threshold = values::open_fraction(v, notes)?;
            Ok(())
        },
        show: |c| match c.settings.garbage_collection_threshold {
            0.0 => "0 (off)".to_string(),
            v => format!("{v:?}"),
        },
    },
    OptionSpec {
        name: "expandable_segments",
        value: "`True` or `False`",
        unit: "",
        carrier: Carrier::Shared,
        doc: "PyTorch's growable segments: an address range per pool and stream, pages mapped on demand. The preloaded library maps them with the driver's virtual-memory calls (`cuMemAddressReserve`, `cuMemCreate`, `cuMemMap`) from the process's `libcuda.so.1`; on a device without them (no driver library, no virtual memory management, or an allocation granularity that does not divide 2 MiB) it warns (once per device) and uses fixed segments there. `cachealloc replay` simulates them.",
        apply: |c, v, _| {
            c.settings.expandable_segments = values::boolean(v)?;
            Ok(())
        },
        show: |c| show_bool(c.settings.expandable_segments),
    },
    OptionSpec {
        name: "per_process_memory_fraction",
        value: "number, 0 <= v <= 1",
        unit: "fraction",
        carrier: Carrier::Shared,
        doc: "Share of each device's memory the pool may reserve (1 = no limit). PyTorch 2.9 and older do not know this key and refuse a `PYTORCH_CUDA_ALLOC_CONF` that holds it: with them, give it in `CACHEALLOC_CONF`.",
        apply: |c, v, notes| {
            c.settings.per_process_memory_fraction = values::closed_fraction(v, notes)?;
            Ok(())
        },
        show: |c| format!("{:?}", c.settings.per_process_memory_fraction),
    },
    OptionSpec {
        name: "free_sync",
        value: "`device`, `event` or `none`",
        unit: "",
        carrier: Carrier::Cachealloc,
        doc: "When a freed block may be reused: after a device synchronization, after an event on the legacy stream, or at once (PyTorch's single-stream semantics).",
        apply: |c, v, _| {
            c.free_sync = values::choice(v, &FreeSync::CHOICES)?;
            Ok(())
        },
        show: |c| c.free_sync.name().to_string(),
    },
    OptionSpec {
        name: "stats",
        value: "`off`, `text` or `json`",
        unit: "",
        carrier: Carrier::Cachealloc,
        doc: "Print allocator statistics at exit in this format. Frees still waiting for the \
              device at exit (`free_sync`) count as active memory, not allocated, as a free \
              waiting for a stream does in PyTorch; the text report says how much.",
        apply: |c, v, _| {
            c.stats = values::choice(v, &StatsOutput::CHOICES)?;
            Ok(())
        },
        show: |c| c.stats.name().to_string(),
    },
    OptionSpec {
        name: "stats_file",
        value: "path (`%p` = process id)",
        unit: "",
        carrier: Carrier::Cachealloc,
        doc: "Where `stats` writes; stderr when unset, or when the file cannot be written. Not \
              the `trace` file, unless that is `/dev/null`, `/dev/stdout`, `/dev/stderr` or \
              `/dev/tty` (the report then follows the recording). Held from the first CUDA \
              call, emptied then, and written at exit (a process killed before its exit leaves \
              it empty; one that cannot open it says so at the first call); a path another \
              running process holds is left to it: this process writes beside it, with its \
              process id before the extension. `/dev/stdout` and `/dev/stderr` get the report \
              after what the program wrote there, also when redirected to a file (what its C \
              library still buffers at exit, as `printf`'s to a file or pipe, comes after the \
              report). A path cannot contain `,`, `:`, `[`, `]` or whitespace, and must be valid \
              UTF-8.",
        apply: |c, v, _| {
            c.stats_file = Some(values::path(v)?);
            Ok(())
        },
        show: |c| {
            c.stats_file
                .clone()
                .unwrap_or_else(|| "unset (stderr)".to_string())
        },
    },
    OptionSpec {
        name: "trace",
        value: "path (`%p` = process id)",
        unit: "",
        carrier: Carrier::Cachealloc,
        doc: "Record allocator events to this file for `cachealloc replay`; off when unset. A \
              path another running process records to is left to it: this process records \
              beside it, with its process id before the extension. A path cannot contain `,`, \
              `:`, `[`, `]` or whitespace, and must be valid UTF-8.",
        apply: |c, v, _| {
            c.trace = Some(values::path(v)?);
            Ok(())
        },
        show: |c| c.trace.clone().unwrap_or_else(|| "unset (off)".to_string()),
    },
    OptionSpec {
        name: "count_cached_as_free",
        value: "`True` or `False`",
        unit: "",
        carrier: Carrier::Cachealloc,
        doc: "`cudaMemGetInfo` reports cached, unused bytes as free. A block whose free is \
              still pending is not counted until it completes (under `free_sync:device`, at a \
              device synchronization that began after the free, such as \
              `cudaDeviceSynchronize()`).",
        apply: |c, v, _| {
            c.count_cached_as_free = values::boolean(v)?;
            Ok(())
        },
        show: |c| show_bool(c.count_cached_as_free),
    },
];

/// One environment variable the library reads.
pub struct VariableSpec {
    pub name: &'static str,
    pub default: &'static str,
    pub doc: &'static str,
}

/// Every environment variable, in the order of the README table.
pub static VARIABLES: &[VariableSpec] = &[
    VariableSpec {
        name: CONF_VAR,
        default: "unset",
        doc: "The options of the options table (`cachealloc options`), `key:value,key:[a:b,>:c]`. When set (even empty) it is the only options variable read.",
    },
    VariableSpec {
        name: PYTORCH_CUDA_CONF_VAR,
        default: "unset",
        doc: "Read when `CACHEALLOC_CONF` is unset: shared keys apply, PyTorch-only keys are ignored.",
    },
    VariableSpec {
        name: PYTORCH_CONF_VAR,
        default: "unset",
        doc: "Read when both variables above are unset, like `PYTORCH_CUDA_ALLOC_CONF`.",
    },
    VariableSpec {
        name: DISABLE_VAR,
        default: "0",
        doc: "`1`: pure pass-through to the CUDA runtime (no options are read); `0` or empty: enabled.",
    },
    VariableSpec {
        name: LOG_VAR,
        default: DEFAULT_LOG_FILTER,
        doc: "Log filter in `tracing` EnvFilter syntax, for example `cachealloc=debug`; \
              `cachealloc::device=debug` logs the pool's own cudaMalloc/cudaFree calls (with \
              expandable segments its page maps and unmaps and its address ranges reserved and \
              given back), out-of-memory failures and `empty_cache` calls.",
    },
];

/// The option called `name`, if any.
pub fn find(name: &str) -> Option<&'static OptionSpec> {
    OPTIONS.iter().find(|o| o.name == name)
}

/// The keys a variable accepts as options of its own (for messages).
pub fn keys_for(carrier_allowed: &[Carrier]) -> Vec<&'static str> {
    OPTIONS
        .iter()
        .filter(|o| carrier_allowed.contains(&o.carrier))
        .map(|o| o.name)
        .collect()
}

fn show_bool(b: bool) -> String {
    if b { "True" } else { "False" }.to_string()
}

/// The divisions table in the shortest form that parses back to the same table: `0 (off)`, a
/// scalar when every interval agrees, else a list whose first entry covers the leading run and
/// whose `>` entry covers the trailing run.
fn show_roundup(table: &[u64; ROUNDUP_INTERVALS]) -> String {
    let first = table[0];
    if table.iter().all(|&d| d == first) {
        return if first == 0 {
            "0 (off)".to_string()
        } else {
            first.to_string()
        };
    }
    let lead_end = table.iter().take_while(|&&d| d == first).count() - 1;
    let mut items = vec![format!("{}:{first}", 1u64 << lead_end)];
    for i in lead_end + 1..ROUNDUP_INTERVALS {
        if table[i..].iter().all(|&d| d == table[i]) && i + 1 < ROUNDUP_INTERVALS {
            items.push(format!(">:{}", table[i]));
            break;
        }
        items.push(format!("{}:{}", 1u64 << i, table[i]));
    }
    format!("[{}]", items.join(","))
}

/// The README's options section (between the `options:begin` / `options:end` markers).
pub fn render_markdown_table() -> String {
    let mut out = String::new();
    out.push_str("| Key | Value | Unit | Default | Read from | Meaning |\n");
    out.push_str("|---|---|---|---|---|---|\n");
    for o in OPTIONS {
        let unit = if o.unit.is_empty() { "—" } else { o.unit };
        out.push_str(&format!(
            "| `{}` | {} | {} | {} | {} | {} |\n",
            o.name,
            o.value,
            unit,
            o.default_text(),
            o.carrier.read_from(),
            o.doc
        ));
    }
    out.push('\n');
    let ignored: Vec<String> = PYTORCH_ONLY_KEYS.iter().map(|k| format!("`{k}`")).collect();
    out.push_str(&format!(
        "PyTorch-only keys are accepted and ignored (a debug log line says so), in any of the \
         variables: {}.",
        ignored.join(", ")
    ));
    for p in POLICY_KEYS_NOT_SUPPORTED {
        out.push_str(&format!(
            " `{}` changes PyTorch's policy, so ignoring it is a warning: {}.",
            p.written(),
            p.instead
        ));
    }
    out.push('\n');
    out.push('\n');
    out.push_str("| Variable | Default | Meaning |\n");
    out.push_str("|---|---|---|\n");
    for v in VARIABLES {
        out.push_str(&format!("| `{}` | {} | {} |\n", v.name, v.default, v.doc));
    }
    out
}

/// Plain-text listing of the variables and options for `--help`-style output.
pub fn render_help() -> String {
    let strip = |s: &str| s.replace('`', "");
    let mut out = String::from("Environment variables:\n");
    for v in VARIABLES {
        out.push_str(&format!(
            "  {:<26} default {}\n      {}\n",
            v.name,
            v.default,
            strip(v.doc)
        ));
    }
    out.push_str(&format!(
        "\nOptions ({CONF_VAR}=key:value,key:value; [PyTorch] keys are also read from \
         {PYTORCH_CUDA_CONF_VAR} / {PYTORCH_CONF_VAR}):\n"
    ));
    for o in OPTIONS {
        let unit = if o.unit.is_empty() {
            String::new()
        } else {
            format!("; unit {}", o.unit)
        };
        let tag = match o.carrier {
            Carrier::Shared => " [PyTorch]",
            Carrier::Cachealloc => "",
        };
        out.push_str(&format!(
            "  {:<30} {}{unit}, default {}{tag}\n      {}\n",
            o.name,
            strip(o.value),
            o.default_text(),
            strip(o.doc)
        ));
    }
    out.push_str(&format!(
        "\nAccepted and ignored (PyTorch-only): {}\n",
        PYTORCH_ONLY_KEYS.join(", ")
    ));
    for p in POLICY_KEYS_NOT_SUPPORTED {
        out.push_str(&format!(
            "  {} changes PyTorch's policy, so ignoring it is a warning: {}.\n",
            p.written(),
            p.instead
        ));
    }
    out
}

/// `key = value` lines for every option as set in `config` (verbose / `--print-config` output).
pub fn render_values(config: &Config) -> String {
    let width = OPTIONS.iter().map(|o| o.name.len()).max().unwrap_or(0);
    let mut out = format!("source: {}\n", config.source.name());
    for o in OPTIONS {
        out.push_str(&format!("{:<width$} = {}\n", o.name, o.current(config)));
    }
    out
}

/// The options of `config` that differ from their defaults, in `CACHEALLOC_CONF` syntax: the
/// value that gives another run the same settings whichever variable they came from.
pub fn render_conf(config: &Config) -> String {
    OPTIONS
        .iter()
        .filter_map(|o| {
            let value = o.current(config);
            (value != o.default_text()).then(|| format!("{}:{value}", o.name))
        })
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_disjoint_from_pytorch_only_keys() {
        let mut names: Vec<&str> = OPTIONS.iter().map(|o| o.name).collect();
        names.extend(PYTORCH_ONLY_KEYS);
        let before = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), before, "duplicate key in the options table");
    }

    #[test]
    fn defaults_shown_are_those_of_config_default() {
        let shown: Vec<(&str, String)> =
            OPTIONS.iter().map(|o| (o.name, o.default_text())).collect();
        let get = |n: &str| shown.iter().find(|(k, _)| *k == n).unwrap().1.clone();
        assert_eq!(get("max_split_size_mb"), "unlimited");
        assert_eq!(get("max_non_split_rounding_mb"), "20");
        assert_eq!(get("roundup_power2_divisions"), "0 (off)");
        assert_eq!(get("expandable_segments"), "False");
        assert_eq!(get("per_process_memory_fraction"), "1.0");
        assert_eq!(get("free_sync"), "device");
        assert_eq!(get("stats"), "off");
        assert_eq!(get("count_cached_as_free"), "False");
    }

    #[test]
    fn roundup_display_parses_back_to_the_same_table() {
        let samples = [
            "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]",
            "roundup_power2_divisions:[256:1,1024:4]",
            "roundup_power2_divisions:[>:2]",
            "roundup_power2_divisions:[1:4,2:0,>:2]",
            "roundup_power2_divisions:[16384:4,32768:8]",
            "roundup_power2_divisions:[32768:8]",
            "roundup_power2_divisions:16",
        ];
        let spec = find("roundup_power2_divisions").unwrap();
        for text in samples {
            let config = Config::parse_conf_str(text).unwrap();
            let shown = spec.current(&config);
            let again = Config::parse_conf_str(&format!("{}:{shown}", spec.name)).unwrap();
            assert_eq!(
                again.settings.roundup_power2_divisions, config.settings.roundup_power2_divisions,
                "{text} shown as {shown}"
            );
        }
    }

    #[test]
    fn every_option_shows_a_value_that_parses_back() {
        let text = "max_split_size_mb:512,max_non_split_rounding_mb:64,\
                    garbage_collection_threshold:0.6,expandable_segments:True,\
                    per_process_memory_fraction:0.5,free_sync:event,stats:json,\
                    stats_file:/tmp/s-%p.json,trace:/tmp/t.bin,count_cached_as_free:True,\
                    roundup_power2_divisions:[64:2,>:4]";
        let config = Config::parse_conf_str(text).unwrap();
        let shown: Vec<String> = OPTIONS
            .iter()
            .map(|o| format!("{}:{}", o.name, o.current(&config)))
            .collect();
        let again = Config::parse_conf_str(&shown.join(",")).unwrap();
        assert_eq!(again, config);
    }

    #[test]
    fn help_lists_every_option_and_variable() {
        let help = render_help();
        for o in OPTIONS {
            assert!(help.contains(o.name), "{} missing from help", o.name);
        }
        for v in VARIABLES {
            assert!(help.contains(v.name), "{} missing from help", v.name);
        }
        // The options PyTorch reads too are tagged; cachealloc's own are not.
        for o in OPTIONS {
            let line = help
                .lines()
                .find(|l| l.trim_start().starts_with(&format!("{} ", o.name)))
                .unwrap_or_else(|| panic!("no line for {}", o.name));
            let tagged = line.ends_with(" [PyTorch]");
            assert_eq!(tagged, o.carrier == Carrier::Shared, "{line}");
        }
        // Ignoring a key that changes PyTorch's policy is a warning, and the help says so.
        for p in POLICY_KEYS_NOT_SUPPORTED {
            let warned = format!("{} changes PyTorch's policy", p.written());
            assert!(help.contains(&warned), "{warned} missing from help");
        }
        assert!(!help.contains('`'));
    }
}
