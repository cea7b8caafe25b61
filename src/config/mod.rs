//! Configuration: the options table, the `PYTORCH_CUDA_ALLOC_CONF` grammar and the variables the
//! library reads.
//!
//! Which variable holds the options (only one is parsed, the first that is set):
//! 1. `CACHEALLOC_CONF` — shared keys and our own keys;
//! 2. else `PYTORCH_CUDA_ALLOC_CONF` — shared keys only (read first, as the newest PyTorch does);
//! 3. else `PYTORCH_ALLOC_CONF` — shared keys only.
//!
//! A variable that is set but empty (or only whitespace) still wins and means "all defaults", as
//! in PyTorch; so `CACHEALLOC_CONF=` runs with defaults even when a PyTorch tuning is present.
//!
//! Keys:
//! - shared keys (`max_split_size_mb`, ...) validate exactly as PyTorch does;
//! - our own keys (`free_sync`, `stats`, ...) are errors in the PyTorch variables, because
//!   PyTorch would reject them there;
//! - PyTorch-only keys (`backend`, `pinned_*`, ...) are accepted and ignored, with a debug log
//!   line, in every variable — also in `CACHEALLOC_CONF`, so a PyTorch tuning can be copied over
//!   unchanged; their values are not checked (PyTorch checks them); the one that would change
//!   the policy (`large_segment_size_mb`) is ignored with a warning instead;
//! - any other key is an error naming the allowed keys.
//!
//! A key given twice takes its last value; `roundup_power2_divisions` lists apply on top of the
//! table as it stands, as in PyTorch.
//!
//! `CACHEALLOC_DISABLE=1` turns the library into a pass-through; then no options variable is
//! parsed at all (a broken tuning cannot stop a user from switching the library off).
//! `CACHEALLOC_LOG` is checked as a `tracing` EnvFilter.
//!
//! Everything reads the environment through an injected lookup function, so tests never touch
//! the process environment.

pub mod error;
mod load;
pub mod numbers;
pub mod options;
pub mod path;
mod shell;
pub mod syntax;
pub mod values;

#[cfg(test)]
mod tests;

pub use error::{ConfigError, Problem};
pub(crate) use load::is_level as is_log_level;
pub use options::{
    OPTIONS, OptionSpec, render_conf, render_help, render_markdown_table, render_values,
};
pub use path::expand_pid;
pub use shell::{shell_path, shell_word};

use crate::pool::Settings;

/// When a freed block may be handed out again (see design.md, "Reuse safety").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum FreeSync {
    /// Pending until a device-wide synchronization that started after the free.
    #[default]
    Device,
    /// Ready when an event recorded on the legacy default stream at free time completes.
    Event,
    /// Immediately (PyTorch's single-stream semantics).
    None,
}

impl FreeSync {
    pub(crate) const CHOICES: [(&'static str, FreeSync); 3] = [
        ("device", FreeSync::Device),
        ("event", FreeSync::Event),
        ("none", FreeSync::None),
    ];

    /// The value as written in `free_sync:<name>`.
    pub fn name(self) -> &'static str {
        Self::CHOICES
            .iter()
            .find(|(_, v)| *v == self)
            .map_or("device", |(n, _)| n)
    }
}

/// Whether and how statistics are printed at exit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum StatsOutput {
    #[default]
    Off,
    Text,
    Json,
}

impl StatsOutput {
    pub(crate) const CHOICES: [(&'static str, StatsOutput); 3] = [
        ("off", StatsOutput::Off),
        ("text", StatsOutput::Text),
        ("json", StatsOutput::Json),
    ];

    /// The value as written in `stats:<name>`.
    pub fn name(self) -> &'static str {
        Self::CHOICES
            .iter()
            .find(|(_, v)| *v == self)
            .map_or("off", |(n, _)| n)
    }
}

/// Where the options came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ConfigSource {
    /// No options variable was set (or the library is disabled).
    #[default]
    Defaults,
    /// `CACHEALLOC_CONF`.
    CacheallocConf,
    /// `PYTORCH_CUDA_ALLOC_CONF`.
    PytorchCudaAllocConf,
    /// `PYTORCH_ALLOC_CONF`.
    PytorchAllocConf,
    /// The `--conf` command-line flag (same meaning as `CACHEALLOC_CONF`).
    CommandLine,
}

impl ConfigSource {
    /// The options variables in order of precedence: the first one set is read.
    pub const PRECEDENCE: [ConfigSource; 3] = [
        ConfigSource::CacheallocConf,
        ConfigSource::PytorchCudaAllocConf,
        ConfigSource::PytorchAllocConf,
    ];

    /// The variable (or flag) name, as used in messages.
    pub fn name(self) -> &'static str {
        match self {
            ConfigSource::Defaults => "defaults",
            ConfigSource::CacheallocConf => options::CONF_VAR,
            ConfigSource::PytorchCudaAllocConf => options::PYTORCH_CUDA_CONF_VAR,
            ConfigSource::PytorchAllocConf => options::PYTORCH_CONF_VAR,
            ConfigSource::CommandLine => "--conf",
        }
    }

    /// True for PyTorch's variables, which carry shared keys only.
    pub fn is_pytorch(self) -> bool {
        matches!(
            self,
            ConfigSource::PytorchCudaAllocConf | ConfigSource::PytorchAllocConf
        )
    }
}

/// Everything the library reads from its environment.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// The pool policy (the shared keys).
    pub settings: Settings,
    /// `free_sync`.
    pub free_sync: FreeSync,
    /// `stats`.
    pub stats: StatsOutput,
    /// `stats_file`, unexpanded (`%p` still in it); `None` = stderr.
    pub stats_file: Option<String>,
    /// `trace`, unexpanded; `None` = no recording.
    pub trace: Option<String>,
    /// `count_cached_as_free`.
    pub count_cached_as_free: bool,
    /// `CACHEALLOC_DISABLE=1`: forward every call to the real runtime.
    pub disabled: bool,
    /// `CACHEALLOC_LOG`, an EnvFilter string (`warn` by default).
    pub log_filter: String,
    /// Which variable the options came from.
    pub source: ConfigSource,
    /// PyTorch-only keys that were present and ignored, with their values as written, in
    /// order of appearance.
    pub ignored: Vec<(String, String)>,
    /// Policy-changing PyTorch-only settings (`options::POLICY_KEYS_NOT_SUPPORTED`) in PyTorch
    /// variables cachealloc did not read (PyTorch may read them): source, key, value.
    pub unread_policy: Vec<(ConfigSource, String, String)>,
    /// Warnings from reading the variables, one each: numbers not written plainly, with what
    /// they were read as (PyTorch's reading: "VARIABLE: key:value: 'value' is read as ..."), a
    /// key given twice, and a `CACHEALLOC_LOG` filter that cannot be read.
    pub reading_notes: Vec<String>,
    /// Variables set but not read (a variable before them in precedence was set), with the
    /// allocator keys they hold: a tuning the user may think is in force.
    pub unread: Vec<(ConfigSource, String)>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            settings: Settings::default(),
            free_sync: FreeSync::default(),
            stats: StatsOutput::default(),
            stats_file: None,
            trace: None,
            count_cached_as_free: false,
            disabled: false,
            log_filter: options::DEFAULT_LOG_FILTER.to_string(),
            source: ConfigSource::Defaults,
            ignored: Vec::new(),
            unread_policy: Vec::new(),
            reading_notes: Vec::new(),
            unread: Vec::new(),
        }
    }
}

impl Config {
    /// Read the configuration through `lookup` (a variable name → its value, `None` when unset).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        load::from_lookup(&lookup)
    }

    /// Read the configuration from the process environment. A value that is not valid UTF-8 is
    /// read with replacement characters (U+FFFD): a path holding one is refused (the file would
    /// get another name), a key or word fails to parse, and a number is read up to it, as
    /// PyTorch reads it, with a warning.
    pub fn from_env() -> Result<Config, ConfigError> {
        Self::from_lookup(|name| std::env::var_os(name).map(|v| v.to_string_lossy().into_owned()))
    }

    /// Parse options given on the command line (`--conf STR`), with `CACHEALLOC_CONF` meaning.
    pub fn parse_conf_str(text: &str) -> Result<Config, ConfigError> {
        Self::parse_from(ConfigSource::CommandLine, text)
    }

    /// Parse options as the library reads `PYTORCH_CUDA_ALLOC_CONF`: shared keys only, PyTorch's
    /// own keys accepted and ignored (the string a PyTorch snapshot recorded, for one).
    pub fn parse_pytorch_conf(text: &str) -> Result<Config, ConfigError> {
        Self::parse_from(ConfigSource::PytorchCudaAllocConf, text)
    }

    /// Parse options with the meaning they have in `source`.
    fn parse_from(source: ConfigSource, text: &str) -> Result<Config, ConfigError> {
        let mut config = Config {
            source,
            ..Config::default()
        };
        load::apply_conf(&mut config, text)?;
        Ok(config)
    }

    /// The stats file for process `pid` (`%p` expanded); `None` = stderr.
    pub fn stats_path(&self, pid: u32) -> Option<String> {
        self.stats_file.as_deref().map(|t| expand_pid(t, pid))
    }

    /// The trace file for process `pid` (`%p` expanded); `None` = no recording.
    pub fn trace_path(&self, pid: u32) -> Option<String> {
        self.trace.as_deref().map(|t| expand_pid(t, pid))
    }

    /// The keys set away from their defaults that configure the preloaded library around the
    /// pool (how frees wait, what is printed or recorded): a replay on the simulated device has
    /// no use for them.
    pub fn library_keys_set(&self) -> Vec<&'static str> {
        let default = Config::default();
        [
            ("free_sync", self.free_sync != default.free_sync),
            ("stats", self.stats != default.stats),
            ("stats_file", self.stats_file.is_some()),
            ("trace", self.trace.is_some()),
            ("count_cached_as_free", self.count_cached_as_free),
        ]
        .into_iter()
        .filter_map(|(key, set)| set.then_some(key))
        .collect()
    }

    /// One warning per variable that holds allocator keys but was not read, because a variable
    /// before it in precedence was set.
    pub fn unread_warnings(&self) -> Vec<String> {
        self.unread
            .iter()
            .map(|(source, keys)| {
                format!(
                    "{} is set, so {} is not read: its {keys} is not in force (copy it into {} \
                     to keep it)",
                    self.source.name(),
                    source.name(),
                    self.source.name()
                )
            })
            .collect()
    }

    /// One warning for each ignored PyTorch key that would change the policy
    /// (`large_segment_size_mb`), to be shown to the user. Accepting the key keeps an existing
    /// `PYTORCH_CUDA_ALLOC_CONF` usable; the warning keeps the substitution visible.
    /// (`expandable_segments:True` is honoured: by replay, and by the preloaded library on
    /// devices whose driver has virtual memory management; elsewhere it warns per device.)
    pub fn unsupported_key_warnings(&self) -> Vec<String> {
        let mut warnings = Vec::new();
        let read = self.ignored.iter().map(|(k, v)| (self.source, k, v));
        let unread = self.unread_policy.iter().map(|(s, k, v)| (*s, k, v));
        for (source, key, value) in read.chain(unread) {
            if let Some(p) = options::policy_key(key, value) {
                warnings.push(format!(
                    "{}: {} is not supported by cachealloc yet; {}",
                    source.name(),
                    p.written(),
                    p.instead
                ));
            }
        }
        warnings
    }

    /// Warnings about the values: numbers not written plainly (what they were read as), and
    /// settings that do nothing, or refuse everything, as set (as they would in PyTorch).
    pub fn value_warnings(&self) -> Vec<String> {
        let mut warnings = self.reading_notes.clone();
        let source = self.source.name();
        let s = &self.settings;
        if s.per_process_memory_fraction == 0.0 {
            warnings.push(format!(
                "{source}: per_process_memory_fraction:0 allows no memory at all: every \
                 allocation fails (as in PyTorch)"
            ));
        }
        // PyTorch adds the limit to a request at or above max_split_size in `size_t`; from
        // 2^64 the sum wraps to below the request, and no cached block serves it
        // (`pool::may_serve` does the same). Named when requests up to 1 PiB wrap: a `-1`
        // written to mean "no limit" does the opposite.
        let wraps_from = (u64::MAX - s.max_non_split_rounding).saturating_add(1);
        if s.has_max_split_size() && wraps_from <= 1 << 50 {
            warnings.push(format!(
                "{source}: max_non_split_rounding_mb this large wraps around 2^64 when added to \
                 a request (as in PyTorch): no cached block serves a request of {} or more, \
                 each takes new memory; for no limit, write a value such as 1048576",
                crate::pool::format_size(wraps_from.max(s.max_split_size))
            ));
        }
        if s.garbage_collection_threshold > 0.0 && s.per_process_memory_fraction >= 1.0 {
            warnings.push(format!(
                "{source}: garbage_collection_threshold acts only under a \
                 per_process_memory_fraction below 1 (as in PyTorch): without one, no cached \
                 block is collected until the program sets one \
                 (cachealloc_set_memory_fraction)"
            ));
        }
        warnings
    }

    /// Warnings about options of the preloaded library that are set but do nothing as set
    /// (today: `stats_file` without `stats`).
    pub fn library_warnings(&self) -> Vec<String> {
        let mut warnings = Vec::new();
        if let (Some(path), StatsOutput::Off) = (&self.stats_file, self.stats) {
            warnings.push(format!(
                "{}: stats_file:{path} has no effect without stats:json or stats:text (the \
                 statistics are written at exit only when stats is set)",
                self.source.name()
            ));
        }
        warnings
    }

    /// The ignored PyTorch-only keys, in order of appearance.
    pub fn ignored_keys(&self) -> Vec<&str> {
        self.ignored.iter().map(|(k, _)| k.as_str()).collect()
    }
}
