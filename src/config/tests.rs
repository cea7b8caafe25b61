//! Behaviour of the whole module through its public entry points: every error message, variable
//! precedence, PyTorch-only keys, and the README's options table.

use super::options::{
    self, CONF_VAR, DISABLE_VAR, LOG_VAR, PYTORCH_CONF_VAR, PYTORCH_CUDA_CONF_VAR,
};
use super::*;
use crate::pool::rounding::ROUNDUP_INTERVALS;

const MIB: u64 = 1 << 20;

/// A lookup over a fixed set of variables (the process environment is never read).
fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> + use<> {
    let vars: Vec<(String, String)> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |name| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
}

fn conf(text: &str) -> Result<Config, ConfigError> {
    Config::from_lookup(env(&[(CONF_VAR, text)]))
}

fn error(vars: &[(&str, &str)]) -> String {
    match Config::from_lookup(env(vars)) {
        Ok(c) => panic!("{vars:?} was accepted: {c:?}"),
        Err(e) => e.to_string(),
    }
}

const OUR_KEYS: &str = "max_split_size_mb, max_non_split_rounding_mb, roundup_power2_divisions, \
     garbage_collection_threshold, expandable_segments, per_process_memory_fraction, free_sync, \
     stats, stats_file, trace, count_cached_as_free; PyTorch's own keys are accepted and ignored: \
     backend, release_lock_on_cudamalloc, release_lock_on_hipmalloc, \
     pinned_use_cuda_host_register, pinned_use_hip_host_register, pinned_num_register_threads, \
     pinned_use_background_threads, pinned_reserve_segment_size_mb, \
     pinned_max_round_threshold_mb, pinned_max_cached_size_mb, pinned_free_catch_all, \
     graph_capture_record_stream_reuse, throw_on_cudamalloc_oom, large_segment_size_mb, \
     expandable_segments_reserve, expandable_segments_reserve_by_class";
const SHARED_KEYS: &str = "max_split_size_mb, max_non_split_rounding_mb, roundup_power2_divisions, \
     garbage_collection_threshold, expandable_segments, per_process_memory_fraction; PyTorch's \
     own keys are accepted and ignored: backend, release_lock_on_cudamalloc, \
     release_lock_on_hipmalloc, pinned_use_cuda_host_register, pinned_use_hip_host_register, \
     pinned_num_register_threads, pinned_use_background_threads, pinned_reserve_segment_size_mb, \
     pinned_max_round_threshold_mb, pinned_max_cached_size_mb, pinned_free_catch_all, \
     graph_capture_record_stream_reuse, throw_on_cudamalloc_oom, large_segment_size_mb, \
     expandable_segments_reserve, expandable_segments_reserve_by_class";

#[test]
fn every_error_names_variable_key_value_and_what_is_allowed() {
    let c = CONF_VAR;
    let p = PYTORCH_CUDA_CONF_VAR;
    let cases: Vec<(&str, &str, String)> = vec![
        // max_split_size_mb / max_non_split_rounding_mb
        (
            c,
            "max_split_size_mb:10",
            format!("{c}: max_split_size_mb:10: too small, must be an integer >= 20 (MiB)"),
        ),
        (
            c,
            "max_split_size_mb:19",
            format!("{c}: max_split_size_mb:19: too small, must be an integer >= 20 (MiB)"),
        ),
        (
            c,
            "max_split_size_mb:abc",
            format!(
                "{c}: max_split_size_mb:abc: not a whole number; expected an integer >= 20 (MiB)"
            ),
        ),
        (
            c,
            "max_split_size_mb:MB128",
            format!(
                "{c}: max_split_size_mb:MB128: not a whole number; expected an integer >= 20 (MiB)"
            ),
        ),
        // read as PyTorch reads it (19), then refused like 19
        (
            c,
            "max_split_size_mb:19.9",
            format!(
                "{c}: max_split_size_mb:19.9: too small, must be an integer >= 20 (MiB) ('19.9' is read as 19, as PyTorch reads it (the number at the start of the text))"
            ),
        ),
        (
            c,
            "garbage_collection_threshold:0x1p-1",
            format!(
                "{c}: garbage_collection_threshold:0x1p-1: hexadecimal numbers are not read; expected a decimal number greater than 0.0 and less than 1.0"
            ),
        ),
        // std::stod reads these as hexadecimal numbers: refused, whatever the case of the 'x'
        // or a sign before it
        (
            c,
            "per_process_memory_fraction:0X1p-1",
            format!(
                "{c}: per_process_memory_fraction:0X1p-1: hexadecimal numbers are not read; expected a decimal number in [0.0, 1.0]"
            ),
        ),
        (
            c,
            "per_process_memory_fraction:+0x1p-1",
            format!(
                "{c}: per_process_memory_fraction:+0x1p-1: hexadecimal numbers are not read; expected a decimal number in [0.0, 1.0]"
            ),
        ),
        // std::stod throws out_of_range below a double's range, as PyTorch would
        (
            c,
            "garbage_collection_threshold:1e-400",
            format!(
                "{c}: garbage_collection_threshold:1e-400: out of a double's range; expected a number greater than 0.0 and less than 1.0"
            ),
        ),
        (
            c,
            "max_split_size_mb:99999999999999999999",
            format!(
                "{c}: max_split_size_mb:99999999999999999999: out of range; expected an integer >= 20 (MiB) below 2^64"
            ),
        ),
        (
            c,
            "max_split_size_mb:[20:1]",
            format!(
                "{c}: max_split_size_mb:[20:1]: expects a single value, not a list; allowed: \
                 integer >= 20 (MiB)"
            ),
        ),
        (
            p,
            "max_non_split_rounding_mb:5",
            format!("{p}: max_non_split_rounding_mb:5: too small, must be an integer >= 20 (MiB)"),
        ),
        // garbage_collection_threshold / per_process_memory_fraction
        (
            c,
            "garbage_collection_threshold:0",
            format!(
                "{c}: garbage_collection_threshold:0: must be greater than 0.0 and less than 1.0"
            ),
        ),
        (
            c,
            "garbage_collection_threshold:1.0",
            format!(
                "{c}: garbage_collection_threshold:1.0: must be greater than 0.0 and less than 1.0"
            ),
        ),
        (
            c,
            "garbage_collection_threshold:half",
            format!(
                "{c}: garbage_collection_threshold:half: not a number; expected a number greater than 0.0 and less than 1.0"
            ),
        ),
        (
            c,
            "per_process_memory_fraction:1.5",
            format!("{c}: per_process_memory_fraction:1.5: must be in [0.0, 1.0]"),
        ),
        (
            c,
            "per_process_memory_fraction:x",
            format!(
                "{c}: per_process_memory_fraction:x: not a number; expected a number in [0.0, 1.0]"
            ),
        ),
        // booleans
        (
            c,
            "expandable_segments:true",
            format!(
                "{c}: expandable_segments:true: must be exactly True or False (case-sensitive)"
            ),
        ),
        (
            c,
            "count_cached_as_free:1",
            format!("{c}: count_cached_as_free:1: must be exactly True or False (case-sensitive)"),
        ),
        // paths: the syntax drops whitespace, so a path with a space would silently change
        (
            c,
            "trace:/tmp/my dir/run.jsonl",
            format!(
                "{c}: trace:/tmp/my dir/run.jsonl: a path cannot contain whitespace (the syntax drops it, so it would read as '/tmp/mydir/run.jsonl'); allowed: a path without whitespace, ',', ':', '[' or ']'"
            ),
        ),
        (
            c,
            "stats:json,stats_file:/tmp/a\tb.json",
            format!(
                "{c}: stats_file:/tmp/a\tb.json: a path cannot contain whitespace (the syntax drops it, so it would read as '/tmp/ab.json'); allowed: a path without whitespace, ',', ':', '[' or ']'"
            ),
        ),
        // roundup_power2_divisions
        (
            c,
            "roundup_power2_divisions:3",
            format!(
                "{c}: roundup_power2_divisions:3: divisions must be a power of 2 (1, 2, 4, 8, ...); to round no size to divisions, leave the key out"
            ),
        ),
        (
            c,
            "roundup_power2_divisions:0",
            format!(
                "{c}: roundup_power2_divisions:0: divisions must be a power of 2 (1, 2, 4, 8, ...); to round no size to divisions, leave the key out"
            ),
        ),
        (
            c,
            "roundup_power2_divisions:four",
            format!(
                "{c}: roundup_power2_divisions:four: not a whole number; expected a power of 2 (1, 2, 4, 8, ...) or a list [MB:divisions,...,>:divisions]"
            ),
        ),
        (
            c,
            "roundup_power2_divisions:[256:3]",
            format!(
                "{c}: roundup_power2_divisions:[256:3]: divisions 3 for interval '256' must be 0 (off) or a power of 2"
            ),
        ),
        (
            c,
            "roundup_power2_divisions:[>:6]",
            format!(
                "{c}: roundup_power2_divisions:[>:6]: divisions 6 for interval '>' must be 0 (off) or a power of 2"
            ),
        ),
        (
            c,
            "roundup_power2_divisions:[256:x]",
            format!(
                "{c}: roundup_power2_divisions:[256:x]: divisions 'x' for interval '256': not a whole number; expected 0 (off) or a power of 2"
            ),
        ),
        (
            c,
            "roundup_power2_divisions:[300:2]",
            format!(
                "{c}: roundup_power2_divisions:[300:2]: interval 300 must be a power-of-2 size in MB (1, 2, 4, ...) or '>'"
            ),
        ),
        (
            c,
            "roundup_power2_divisions:[0:2]",
            format!(
                "{c}: roundup_power2_divisions:[0:2]: interval 0 must be a power-of-2 size in MB (1, 2, 4, ...) or '>'"
            ),
        ),
        (
            c,
            "roundup_power2_divisions:[<:2]",
            format!(
                "{c}: roundup_power2_divisions:[<:2]: interval '<': not a whole number; expected a power-of-2 size in MB (1, 2, 4, ...) or '>'"
            ),
        ),
        // our enumerations and paths
        (
            c,
            "free_sync:stream",
            format!("{c}: free_sync:stream: must be one of device, event, none"),
        ),
        (
            c,
            "free_sync:Device",
            format!("{c}: free_sync:Device: must be one of device, event, none"),
        ),
        (
            c,
            "stats:yaml",
            format!("{c}: stats:yaml: must be one of off, text, json"),
        ),
        (
            c,
            "stats_file:[a:b]",
            format!(
                "{c}: stats_file:[a:b]: expects a single value, not a list; allowed: path (%p = \
                 process id)"
            ),
        ),
        // keys
        (
            c,
            "max_split_size:128",
            format!(
                "{c}: unknown key 'max_split_size'; did you mean 'max_split_size_mb'? (allowed keys: {OUR_KEYS})"
            ),
        ),
        (
            c,
            "Expandable_Segments:True",
            format!(
                "{c}: unknown key 'Expandable_Segments'; did you mean 'expandable_segments'? (allowed keys: {OUR_KEYS})"
            ),
        ),
        (
            c,
            "zzz:1",
            format!("{c}: unknown key 'zzz' (allowed keys: {OUR_KEYS})"),
        ),
        // three edits from a short key is still a likely typo
        (
            c,
            "tracing:/tmp/t",
            format!("{c}: unknown key 'tracing'; did you mean 'trace'? (allowed keys: {OUR_KEYS})"),
        ),
        // '=' followed by ':' is no `key=value` slip ("write max_split_size_mb:128" would leave
        // ":1" behind): the whole is the key
        (
            c,
            "max_split_size_mb=128:1",
            format!(
                "{c}: unknown key 'max_split_size_mb=128'; did you mean 'max_split_size_mb'? (allowed keys: {OUR_KEYS})"
            ),
        ),
        (
            p,
            "bakend:native",
            format!(
                "{p}: unknown key 'bakend'; did you mean 'backend'? (allowed keys: {SHARED_KEYS})"
            ),
        ),
        (
            p,
            "zzz:1",
            format!("{p}: unknown key 'zzz' (allowed keys: {SHARED_KEYS})"),
        ),
        (
            p,
            "free_sync:none",
            format!(
                "{p}: key 'free_sync' is a cachealloc option and is read only from CACHEALLOC_CONF (PyTorch rejects keys it does not know)"
            ),
        ),
        (
            PYTORCH_CONF_VAR,
            "stats:text",
            format!(
                "{PYTORCH_CONF_VAR}: key 'stats' is a cachealloc option and is read only from CACHEALLOC_CONF (PyTorch rejects keys it does not know)"
            ),
        ),
        // structure
        (
            c,
            "max_split_size_mb",
            format!("{c}: expected ':' after key 'max_split_size_mb', found the end of the text"),
        ),
        (
            c,
            "max_split_size_mb:",
            format!(
                "{c}: missing value after 'max_split_size_mb:', found the end of the text; \
                 allowed: integer >= 20 (MiB)"
            ),
        ),
        (
            c,
            ",stats:text",
            format!("{c}: expected a key, found ',' (an empty entry: remove the extra ',')"),
        ),
        (
            c,
            "stats:json,trace:/tmp/run-%p.jsonl,stats_file:/tmp/run-%p.jsonl",
            format!(
                "{c}: stats_file:/tmp/run-%p.jsonl: it is the trace file too, which the \
                 statistics written at exit would overwrite; give them different paths (only `/dev/null`, \
                 `/dev/stdout`, `/dev/stderr` and `/dev/tty` may be both)"
            ),
        ),
        (
            c,
            "stats_file:/tmp/a:b",
            format!(
                "{c}: expected ',' after stats_file:/tmp/a (a value cannot contain ',', ':', '[' or ']'), found ':'"
            ),
        ),
        (
            c,
            "roundup_power2_divisions:[256:1",
            format!(
                "{c}: the list value of 'roundup_power2_divisions' is missing its closing ']'; \
                 allowed: power of 2, or list [MB:div,...,>:div] (div 0 or a power of 2)"
            ),
        ),
        (
            c,
            "roundup_power2_divisions:[256:1,512]",
            format!(
                "{c}: expected ':' after '512' in the list of 'roundup_power2_divisions', found \
                 ']'; allowed: power of 2, or list [MB:div,...,>:div] (div 0 or a power of 2)"
            ),
        ),
        // A single-value key given a list that is not even a well-formed one: the same
        // message as for a well-formed list.
        (
            c,
            "max_split_size_mb:[128]",
            format!(
                "{c}: max_split_size_mb:[128]: expects a single value, not a list; allowed: \
                 integer >= 20 (MiB)"
            ),
        ),
        (
            c,
            "expandable_segments:[True,max_split_size_mb:128",
            format!(
                "{c}: expandable_segments:[True: expects a single value, not a list; allowed: \
                 True or False"
            ),
        ),
        (
            c,
            "stats:text,expandable_segments:[True",
            format!(
                "{c}: expandable_segments:[True: expects a single value, not a list; allowed: \
                 True or False"
            ),
        ),
        // whole-variable values
        (
            DISABLE_VAR,
            "yes",
            format!("{DISABLE_VAR}=yes: must be 1 (pass-through) or 0 (enabled)"),
        ),
    ];
    for (var, text, want) in cases {
        assert_eq!(error(&[(var, text)]), want, "{var}={text}");
    }
}

/// A log filter that cannot be read is a warning naming the variable, and logging stays at
/// warn: a logging mistake takes no memory away from the program.
#[test]
fn a_bad_log_filter_is_a_warning_naming_the_variable() {
    let warned = |filter: &str| {
        let c = Config::from_lookup(env(&[(LOG_VAR, filter)])).unwrap();
        assert_eq!(c.log_filter, "warn", "{filter}");
        let warnings = c.value_warnings();
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        warnings[0].clone()
    };
    let message = warned("cachealloc=[");
    assert!(
        message.starts_with("CACHEALLOC_LOG=cachealloc=[: not a log filter ("),
        "{message}"
    );
    assert!(
        message.ends_with(
            "expected a level such as warn, or directives such as cachealloc=debug; logging \
             stays at the default, warn"
        ),
        "{message}"
    );
    // A misspelt level is a target to EnvFilter, one that never logs: said too.
    assert_eq!(
        warned("degub"),
        "CACHEALLOC_LOG=degub: 'degub' is neither a level (off, error, warn, info, debug, \
         trace) nor one of cachealloc's log targets (cachealloc, cachealloc::device, ...); \
         expected a level such as warn, or directives such as cachealloc=debug; logging stays \
         at the default, warn"
    );
    for good in [
        "DEBUG",
        "info,cachealloc::device=debug",
        "cachealloc",
        "4",
        "warn",
    ] {
        let c = Config::from_lookup(env(&[(LOG_VAR, good)])).unwrap();
        assert_eq!(c.log_filter, good, "{good}");
    }
    // A space after a comma would make EnvFilter read the next level as a target: each
    // directive is trimmed.
    for (spaced, read) in [
        ("info, cachealloc=debug", "info,cachealloc=debug"),
        (
            "cachealloc::device=debug, warn",
            "cachealloc::device=debug,warn",
        ),
        (" warn , ", "warn"),
    ] {
        let c = Config::from_lookup(env(&[(LOG_VAR, spaced)])).unwrap();
        assert_eq!(c.log_filter, read, "{spaced:?}");
        assert!(c.value_warnings().is_empty(), "{spaced:?}");
    }
    // Commas alone name no directive: logging stays at warn (an empty filter would let
    // errors through only).
    let c = Config::from_lookup(env(&[(LOG_VAR, ",")])).unwrap();
    assert_eq!(c.log_filter, "warn");
    // With CACHEALLOC_DISABLE=1 nothing else is read: a bad filter cannot stop the
    // pass-through.
    let c = Config::from_lookup(env(&[(DISABLE_VAR, "1"), (LOG_VAR, "degub")])).unwrap();
    assert!(c.disabled);
}

/// `Config::from_env` reads a byte that is not UTF-8 as U+FFFD: in a path that would name
/// another file, so the path is refused, saying why.
#[test]
fn a_path_that_is_not_utf8_is_refused() {
    use std::os::unix::ffi::OsStrExt;
    for key in ["stats_file", "trace"] {
        // "/tmp/café.json" in Latin-1, read as `from_env` reads the variable.
        let mut raw = format!("stats:json,{key}:/tmp/caf").into_bytes();
        raw.extend_from_slice(b"\xe9.json");
        let text = std::ffi::OsStr::from_bytes(&raw)
            .to_string_lossy()
            .into_owned();
        assert_eq!(
            error(&[(CONF_VAR, &text)]),
            format!(
                "CACHEALLOC_CONF: {key}:/tmp/caf\u{FFFD}.json: a path must be valid UTF-8 (a \
                 byte that is not is read as '\u{FFFD}', so the file would be \
                 '/tmp/caf\u{FFFD}.json'); allowed: a UTF-8 path without whitespace, ',', ':', \
                 '[' or ']'"
            )
        );
    }
}

#[test]
fn shared_keys_take_pytorch_meaning() {
    let c = conf(
        "max_split_size_mb:128, max_non_split_rounding_mb:40, garbage_collection_threshold:0.8, \
         expandable_segments:True, per_process_memory_fraction:0.5, roundup_power2_divisions:4",
    )
    .unwrap();
    let s = &c.settings;
    assert_eq!(s.max_split_size, 128 * MIB);
    assert_eq!(s.max_non_split_rounding, 40 * MIB);
    assert_eq!(s.garbage_collection_threshold, 0.8);
    assert!(s.expandable_segments);
    assert_eq!(s.per_process_memory_fraction, 0.5);
    assert_eq!(s.roundup_power2_divisions, [4; ROUNDUP_INTERVALS]);
    // The smallest allowed values and the bounds of the closed fraction.
    let c = conf("max_split_size_mb:20,max_non_split_rounding_mb:20,per_process_memory_fraction:0")
        .unwrap();
    assert_eq!(c.settings.max_split_size, 20 * MIB);
    assert!(c.settings.has_max_split_size());
    assert_eq!(c.settings.max_non_split_rounding, 20 * MIB);
    assert_eq!(c.settings.per_process_memory_fraction, 0.0);
}

#[test]
fn our_keys_fill_their_fields() {
    let c = conf(
        "free_sync:none,stats:json,stats_file:/tmp/stats-%p.json,trace:/tmp/trace-%p.bin,\
         count_cached_as_free:True",
    )
    .unwrap();
    assert_eq!(c.free_sync, FreeSync::None);
    assert_eq!(c.stats, StatsOutput::Json);
    assert_eq!(c.stats_path(12), Some("/tmp/stats-12.json".to_string()));
    assert_eq!(c.trace_path(12), Some("/tmp/trace-12.bin".to_string()));
    assert!(c.count_cached_as_free);
    for (text, want) in [
        ("free_sync:device", FreeSync::Device),
        ("free_sync:event", FreeSync::Event),
    ] {
        assert_eq!(conf(text).unwrap().free_sync, want);
    }
    for (text, want) in [
        ("stats:off", StatsOutput::Off),
        ("stats:text", StatsOutput::Text),
    ] {
        assert_eq!(conf(text).unwrap().stats, want);
    }
    let d = conf("").unwrap();
    assert_eq!((d.stats_path(1), d.trace_path(1)), (None, None));
}

#[test]
fn the_last_occurrence_of_a_key_wins_and_roundup_lists_stack_like_pytorch() {
    let c = conf("max_split_size_mb:64,max_split_size_mb:32").unwrap();
    assert_eq!(c.settings.max_split_size, 32 * MIB);
    let c = conf("roundup_power2_divisions:[256:1],roundup_power2_divisions:[1024:4]").unwrap();
    let mut want = [0; ROUNDUP_INTERVALS];
    want[..=10].fill(4);
    assert_eq!(c.settings.roundup_power2_divisions, want);
}

/// A second `>` entry fills again from after the latest numeric entry (PyTorch's
/// `last_index + 1`), over what the first one wrote.
#[test]
fn a_second_gt_entry_fills_again_after_the_last_interval() {
    let c = conf("roundup_power2_divisions:[256:1,>:2,>:4]").unwrap();
    let mut want = [4; ROUNDUP_INTERVALS];
    want[..=8].fill(1);
    assert_eq!(c.settings.roundup_power2_divisions, want);
}

#[test]
fn roundup_list_with_whitespace_and_trailing_commas() {
    let c = conf(" roundup_power2_divisions : [ 256 : 1 , 512:2 ,1024:4, > : 8 , ] , ").unwrap();
    let mut want = [8; ROUNDUP_INTERVALS];
    want[..=8].fill(1);
    want[9] = 2;
    want[10] = 4;
    assert_eq!(c.settings.roundup_power2_divisions, want);
    // The table feeds the pool's rounding: 600 MB + 1 falls in [512 MB, 1 GB) → 2 divisions.
    let rounded = crate::pool::rounding::round_size(&c.settings, 600 * MIB + 1);
    assert_eq!(rounded, 768 * MIB);
}

#[test]
fn blank_values_mean_defaults() {
    for text in ["", " ", "\t\n ", "\r\x0b\x0c"] {
        let c = conf(text).unwrap();
        assert_eq!(c.settings, crate::pool::Settings::default(), "{text:?}");
        assert_eq!(c.source, ConfigSource::CacheallocConf);
        let blank = Config::from_lookup(env(&[(DISABLE_VAR, text), (LOG_VAR, text)])).unwrap();
        assert!(!blank.disabled);
        assert_eq!(blank.log_filter, "warn");
        // Blank is the default, not a filter that cannot be read.
        assert!(blank.value_warnings().is_empty(), "{text:?}");
    }
    assert_eq!(Config::from_lookup(env(&[])).unwrap(), Config::default());
}

#[test]
fn precedence_is_cachealloc_then_pytorch_cuda_then_pytorch() {
    let ours = (CONF_VAR, "max_split_size_mb:100");
    let cuda = (PYTORCH_CUDA_CONF_VAR, "max_split_size_mb:200");
    let generic = (PYTORCH_CONF_VAR, "max_split_size_mb:300");
    let cases = [
        (vec![ours, cuda, generic], ConfigSource::CacheallocConf, 100),
        (vec![cuda, generic], ConfigSource::PytorchCudaAllocConf, 200),
        (vec![generic], ConfigSource::PytorchAllocConf, 300),
        (vec![ours, generic], ConfigSource::CacheallocConf, 100),
    ];
    for (vars, source, mb) in cases {
        let c = Config::from_lookup(env(&vars)).unwrap();
        assert_eq!(c.source, source, "{vars:?}");
        assert_eq!(c.settings.max_split_size, mb * MIB, "{vars:?}");
    }
    // Only one variable is parsed: a broken lower-precedence one is never read.
    let c = Config::from_lookup(env(&[ours, (PYTORCH_CUDA_CONF_VAR, "garbage")])).unwrap();
    assert_eq!(c.settings.max_split_size, 100 * MIB);
    // Set but empty still wins: defaults, PyTorch's tuning ignored.
    let c = Config::from_lookup(env(&[(CONF_VAR, ""), cuda])).unwrap();
    assert_eq!(c.source, ConfigSource::CacheallocConf);
    assert!(!c.settings.has_max_split_size());
}

#[test]
fn pytorch_only_keys_are_ignored_in_every_variable() {
    let text = "backend:cudaMallocAsync,max_split_size_mb:64,pinned_num_register_threads:8,\
                release_lock_on_cudamalloc:True,large_segment_size_mb:40,\
                expandable_segments:True";
    for var in [CONF_VAR, PYTORCH_CUDA_CONF_VAR, PYTORCH_CONF_VAR] {
        let c = Config::from_lookup(env(&[(var, text)])).unwrap();
        assert_eq!(c.settings.max_split_size, 64 * MIB, "{var}");
        assert!(c.settings.expandable_segments, "{var}");
        assert_eq!(
            c.ignored_keys(),
            [
                "backend",
                "pinned_num_register_threads",
                "release_lock_on_cudamalloc",
                "large_segment_size_mb"
            ],
            "{var}"
        );
    }
    // Their values are PyTorch's to check, including lists.
    let c = conf("pinned_num_register_threads:3,backend:[a:b]").unwrap();
    assert_eq!(c.ignored_keys(), ["pinned_num_register_threads", "backend"]);
}

/// PyTorch drops whitespace inside a value too (`cudaMalloc Async` is `cudaMallocAsync` to
/// it): an ignored key is kept as PyTorch reads it, so its policy warning still fires.
#[test]
fn ignored_keys_are_kept_as_pytorch_reads_them() {
    let c =
        Config::from_lookup(env(&[(PYTORCH_CUDA_CONF_VAR, "backend:cudaMalloc Async")])).unwrap();
    assert_eq!(
        c.ignored,
        [("backend".to_string(), "cudaMallocAsync".to_string())]
    );
    assert_eq!(c.unsupported_key_warnings().len(), 1);
}

#[test]
fn shared_key_errors_in_pytorch_variables_name_that_variable() {
    for var in [PYTORCH_CUDA_CONF_VAR, PYTORCH_CONF_VAR] {
        let message = error(&[(var, "expandable_segments:1")]);
        assert_eq!(
            message,
            format!("{var}: expandable_segments:1: must be exactly True or False (case-sensitive)")
        );
    }
}

#[test]
fn disable_and_log_variables() {
    let c = Config::from_lookup(env(&[(DISABLE_VAR, "1"), (LOG_VAR, "cachealloc=debug")])).unwrap();
    assert!(c.disabled);
    // A pass-through installs no logger: the filter is not read.
    assert_eq!(c.log_filter, "warn");
    let c = Config::from_lookup(env(&[(LOG_VAR, "cachealloc=debug")])).unwrap();
    assert_eq!(c.log_filter, "cachealloc=debug");
    assert!(
        !Config::from_lookup(env(&[(DISABLE_VAR, "0")]))
            .unwrap()
            .disabled
    );
    // Disabled: a broken tuning does not stop the pass-through.
    let c = Config::from_lookup(env(&[
        (DISABLE_VAR, " 1 "),
        (CONF_VAR, "max_split_size_mb:1"),
    ]))
    .unwrap();
    assert!(c.disabled);
    assert_eq!(c.source, ConfigSource::Defaults);
}

#[test]
fn conf_flag_has_cachealloc_conf_meaning() {
    let c = Config::parse_conf_str("free_sync:event,max_split_size_mb:40,backend:native").unwrap();
    assert_eq!(c.source, ConfigSource::CommandLine);
    assert_eq!(c.free_sync, FreeSync::Event);
    assert_eq!(c.settings.max_split_size, 40 * MIB);
    assert_eq!(c.ignored_keys(), ["backend"]);
    let e = Config::parse_conf_str("max_split_size_mb:1").unwrap_err();
    assert_eq!(
        e.to_string(),
        "--conf: max_split_size_mb:1: too small, must be an integer >= 20 (MiB)"
    );
}

/// A string read as `PYTORCH_CUDA_ALLOC_CONF` (a snapshot's recorded one) takes the variable's
/// meaning: shared keys, PyTorch's own ignored, cachealloc's refused as PyTorch would.
#[test]
fn pytorch_conf_has_the_variables_meaning() {
    let c = Config::parse_pytorch_conf("per_process_memory_fraction:0.5,backend:native").unwrap();
    assert_eq!(c.source, ConfigSource::PytorchCudaAllocConf);
    assert_eq!(c.settings.per_process_memory_fraction, 0.5);
    assert_eq!(c.ignored_keys(), ["backend"]);
    let e = Config::parse_pytorch_conf("free_sync:event").unwrap_err();
    assert!(
        e.to_string()
            .starts_with("PYTORCH_CUDA_ALLOC_CONF: key 'free_sync' is a cachealloc option"),
        "{e}"
    );
}

/// `render_conf` gives another run the same settings: every option set away from its default,
/// in `CACHEALLOC_CONF` syntax, parses back to the same configuration.
#[test]
fn render_conf_parses_back_to_the_same_settings() {
    assert_eq!(render_conf(&Config::default()), "");
    let text = "max_split_size_mb:128,max_non_split_rounding_mb:64,\
                roundup_power2_divisions:[256:1,512:2,>:4],garbage_collection_threshold:0.6,\
                per_process_memory_fraction:0.5,free_sync:none,stats:json,\
                stats_file:/tmp/s-%p.json,trace:/tmp/t-%p.jsonl,count_cached_as_free:True";
    let c = conf(text).unwrap();
    let rendered = render_conf(&c);
    let again = conf(&rendered).unwrap();
    assert_eq!(again, c, "{rendered}");
    // Every option was set away from its default (expandable_segments is not implemented and
    // stays off), so each is named.
    for o in options::OPTIONS
        .iter()
        .filter(|o| o.name != "expandable_segments")
    {
        let named = rendered.starts_with(&format!("{}:", o.name))
            || rendered.contains(&format!(",{}:", o.name));
        assert!(named, "{} missing from {rendered}", o.name);
    }
    // From PYTORCH_CUDA_ALLOC_CONF too: the same settings, now for CACHEALLOC_CONF.
    let from_pytorch = Config::from_lookup(env(&[(
        "PYTORCH_CUDA_ALLOC_CONF",
        "max_split_size_mb:256,roundup_power2_divisions:4",
    )]))
    .unwrap();
    let rendered = render_conf(&from_pytorch);
    assert_eq!(
        conf(&rendered).unwrap().settings,
        from_pytorch.settings,
        "{rendered}"
    );
}

#[test]
fn render_values_shows_the_effective_settings() {
    let c = conf("max_split_size_mb:128,free_sync:none").unwrap();
    let listing = render_values(&c);
    assert!(
        listing.starts_with("source: CACHEALLOC_CONF\n"),
        "{listing}"
    );
    assert!(
        listing.contains("max_split_size_mb            = 128\n"),
        "{listing}"
    );
    assert!(
        listing.contains("free_sync                    = none\n"),
        "{listing}"
    );
    assert_eq!(listing.lines().count(), options::OPTIONS.len() + 1);
}

#[test]
fn readme_options_table_matches_the_options_table() {
    const BEGIN: &str = "<!-- options:begin -->";
    const END: &str = "<!-- options:end -->";
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/README.md");
    let readme = std::fs::read_to_string(path).expect("README.md is readable");
    let start = readme
        .find(BEGIN)
        .expect("README has the options:begin marker")
        + BEGIN.len();
    let end = readme.find(END).expect("README has the options:end marker");
    let expected = render_markdown_table();
    assert!(
        readme[start..end].trim() == expected.trim(),
        "README.md options table is stale; put this between the markers:\n{expected}"
    );
}

/// `expandable_segments:True` is kept as written, without a warning at parse time: whether a
/// device can have them is decided when its pool is made.
#[test]
fn expandable_segments_are_kept_as_written() {
    let c = Config::from_lookup(|k| {
        (k == "PYTORCH_CUDA_ALLOC_CONF").then(|| "expandable_segments:True".to_string())
    })
    .unwrap();
    assert!(c.settings.expandable_segments, "parsed as written");
    assert!(c.unsupported_key_warnings().is_empty());
    assert!(c.settings.expandable_segments);
}

/// Ignoring a key that would change PyTorch's policy is said out loud; the keys of an
/// expandable-segments tuning are ignored quietly (expandable segments themselves warn).
#[test]
fn ignored_policy_keys_warn_and_expandable_reserve_keys_are_ignored() {
    let c = Config::from_lookup(|k| {
        (k == "PYTORCH_CUDA_ALLOC_CONF").then(|| {
            "large_segment_size_mb:64,expandable_segments_reserve:0.5,\
             expandable_segments_reserve_by_class:4G"
                .to_string()
        })
    })
    .unwrap();
    assert_eq!(
        c.unsupported_key_warnings(),
        [
            "PYTORCH_CUDA_ALLOC_CONF: large_segment_size_mb is not supported by cachealloc yet; \
          large segments stay 20 MiB (PyTorch's default) and max_split_size_mb's minimum stays 20"
        ]
    );
    assert_eq!(
        c.ignored_keys(),
        [
            "large_segment_size_mb",
            "expandable_segments_reserve",
            "expandable_segments_reserve_by_class"
        ]
    );
}

/// `backend:cudaMallocAsync` and `throw_on_cudamalloc_oom:True` change what PyTorch would do,
/// so ignoring them warns; their harmless values (`native`, `False`) do not.
#[test]
fn policy_values_of_ignored_keys_warn() {
    let source = "PYTORCH_CUDA_ALLOC_CONF";
    let with = |text: &'static str| {
        Config::from_lookup(move |k| (k == source).then(|| text.to_string()))
            .unwrap()
            .unsupported_key_warnings()
    };
    assert_eq!(
        with("backend:cudaMallocAsync,throw_on_cudamalloc_oom:True"),
        [
            "PYTORCH_CUDA_ALLOC_CONF: backend:cudaMallocAsync is not supported by cachealloc yet; \
             cachealloc serves and replays PyTorch's native caching allocator only; a PyTorch \
             that reads this setting allocates with cudaMallocAsync instead, which cachealloc \
             does not see",
            "PYTORCH_CUDA_ALLOC_CONF: throw_on_cudamalloc_oom:True is not supported by cachealloc \
             yet; a request over the per_process_memory_fraction limit takes the native path \
             (release cached blocks, retry) before it fails",
        ]
    );
    assert!(with("backend:native,throw_on_cudamalloc_oom:False").is_empty());
    // PyTorch reads its own variable even when cachealloc reads CACHEALLOC_CONF: warned too,
    // under that variable's name.
    let c = Config::from_lookup(|k| match k {
        "CACHEALLOC_CONF" => Some("max_split_size_mb:64".to_string()),
        "PYTORCH_CUDA_ALLOC_CONF" => Some("backend:cudaMallocAsync".to_string()),
        _ => None,
    })
    .unwrap();
    let warned = c.unsupported_key_warnings();
    assert_eq!(warned.len(), 1, "{warned:?}");
    assert!(
        warned[0].starts_with("PYTORCH_CUDA_ALLOC_CONF: backend:cudaMallocAsync is not supported"),
        "{warned:?}"
    );
}

/// A value PyTorch accepts is accepted, read as PyTorch reads it (`std::stoull` / `std::stod`:
/// the number at the start of the text), and the reading is a warning naming the variable.
#[test]
fn numbers_pytorch_accepts_are_read_its_way_with_a_warning() {
    for var in [CONF_VAR, PYTORCH_CUDA_CONF_VAR, PYTORCH_CONF_VAR] {
        let text = "max_split_size_mb:128MB,roundup_power2_divisions:[256:2.5,>:+4],\
                    garbage_collection_threshold:0.6abc,per_process_memory_fraction:0.8";
        let c = Config::from_lookup(env(&[(var, text)])).unwrap();
        assert_eq!(c.settings.max_split_size, 128 * MIB, "{var}");
        assert_eq!(c.settings.roundup_power2_divisions[8], 2, "{var}");
        assert_eq!(c.settings.roundup_power2_divisions[15], 4, "{var}");
        assert_eq!(c.settings.garbage_collection_threshold, 0.6, "{var}");
        let warned = c.value_warnings();
        assert_eq!(warned.len(), 4, "{warned:?}");
        assert_eq!(
            warned[0],
            format!(
                "{var}: max_split_size_mb:128MB: '128MB' is read as 128, as PyTorch reads it \
                 (the number at the start of the text); write it plainly to say so"
            )
        );
        assert!(warned[3].starts_with(&format!(
            "{var}: garbage_collection_threshold:0.6abc: '0.6abc' is read as 0.6"
        )));
    }
    // -1 is 2^64 - 1 to PyTorch, clamped to whole MiB below 2^64: more than any block can be,
    // so unlimited, and named so.
    let c = conf("max_split_size_mb:-1").unwrap();
    assert_eq!(c.settings.max_split_size, u64::MAX);
    assert!(!c.settings.has_max_split_size());
    assert_eq!(crate::config::render_conf(&c), "");
    assert!(
        conf("max_split_size_mb:128")
            .unwrap()
            .value_warnings()
            .is_empty()
    );
}

/// A `max_non_split_rounding_mb` so large that adding it to a request wraps around 2^64 (as
/// PyTorch adds it) refuses every cached block to large requests: a warning says so, and what
/// to write for no limit. A large value that does not wrap is quiet.
#[test]
fn a_rounding_limit_that_wraps_is_a_warning() {
    let c = conf("max_split_size_mb:128,max_non_split_rounding_mb:-1").unwrap();
    let warned = c.value_warnings();
    assert_eq!(warned.len(), 2, "{warned:?}");
    assert!(warned[0].contains("'-1' is read as"), "{warned:?}");
    assert_eq!(
        warned[1],
        "CACHEALLOC_CONF: max_non_split_rounding_mb this large wraps around 2^64 when added to a \
         request (as in PyTorch): no cached block serves a request of 128.00 MiB or more, each \
         takes new memory; for no limit, write a value such as 1048576"
    );
    // Without max_split_size_mb the limit applies to no request.
    assert_eq!(
        conf("max_non_split_rounding_mb:-1")
            .unwrap()
            .value_warnings()
            .len(),
        1
    );
    for quiet in ["1048576", "8796093022208"] {
        let text = format!("max_split_size_mb:128,max_non_split_rounding_mb:{quiet}");
        assert!(conf(&text).unwrap().value_warnings().is_empty(), "{text}");
    }
}

/// A key given twice keeps its last value, as in PyTorch, and the lost value is a warning.
#[test]
fn a_key_given_twice_keeps_its_last_value_with_a_warning() {
    let c = conf("max_split_size_mb:128,stats:text,max_split_size_mb:256").unwrap();
    assert_eq!(c.settings.max_split_size, 256 * MIB);
    assert_eq!(
        c.value_warnings(),
        [
            "CACHEALLOC_CONF: max_split_size_mb is given more than once: max_split_size_mb:256 \
             replaces max_split_size_mb:128, as in PyTorch"
        ]
    );
    // Each repetition names the value it replaces: the one just before it.
    let c = conf("max_split_size_mb:64,max_split_size_mb:128,max_split_size_mb:256").unwrap();
    assert_eq!(c.settings.max_split_size, 256 * MIB);
    assert_eq!(
        c.value_warnings(),
        [
            "CACHEALLOC_CONF: max_split_size_mb is given more than once: max_split_size_mb:128 \
             replaces max_split_size_mb:64, as in PyTorch",
            "CACHEALLOC_CONF: max_split_size_mb is given more than once: max_split_size_mb:256 \
             replaces max_split_size_mb:128, as in PyTorch"
        ]
    );
    // The same value twice loses nothing.
    assert!(
        conf("stats:text,stats:text")
            .unwrap()
            .value_warnings()
            .is_empty()
    );
    // A list is applied over the table as it stands: intervals it does not name keep theirs.
    let c = conf("roundup_power2_divisions:[256:1,>:4],roundup_power2_divisions:[>:8]").unwrap();
    assert_eq!(c.settings.roundup_power2_divisions[0], 1);
    assert_eq!(c.settings.roundup_power2_divisions[15], 8);
    assert_eq!(
        c.value_warnings(),
        [
            "CACHEALLOC_CONF: roundup_power2_divisions is given more than once: \
             roundup_power2_divisions:[>:8] is applied over \
             roundup_power2_divisions:[256:1,>:4], as in PyTorch"
        ]
    );
}

/// A garbage-collection threshold acts only under a fraction below 1 (as in PyTorch): set
/// without one, it is a warning; with one, none.
#[test]
fn a_collection_threshold_without_a_fraction_is_a_warning() {
    assert_eq!(
        conf("garbage_collection_threshold:0.6")
            .unwrap()
            .value_warnings(),
        [
            "CACHEALLOC_CONF: garbage_collection_threshold acts only under a \
             per_process_memory_fraction below 1 (as in PyTorch): without one, no cached block \
             is collected until the program sets one (cachealloc_set_memory_fraction)"
        ]
    );
    let limited = conf("garbage_collection_threshold:0.6,per_process_memory_fraction:0.9");
    assert!(limited.unwrap().value_warnings().is_empty());
}

#[test]
fn trace_and_stats_file_may_share_a_device_that_empties_nothing() {
    for path in ["/dev/null", "/dev/stdout", "/dev/stderr", "/dev/tty"] {
        let config = conf(&format!("stats:json,trace:{path},stats_file:{path}"))
            .unwrap_or_else(|e| panic!("{path}: {e}"));
        assert_eq!(config.trace.as_deref(), Some(path));
        assert_eq!(config.stats_file.as_deref(), Some(path));
    }
    // A regular file, or a device each would open anew, stays refused.
    for path in ["/dev/shm/run.jsonl", "/dev/fd/3", "run.jsonl"] {
        let refused = conf(&format!("stats:json,trace:{path},stats_file:{path}"));
        assert!(refused.is_err(), "{path}");
    }
}

#[test]
fn a_stats_file_without_stats_is_a_warning() {
    let warned = conf("stats_file:/tmp/s.json").unwrap().library_warnings();
    assert_eq!(
        warned,
        [
            "CACHEALLOC_CONF: stats_file:/tmp/s.json has no effect without stats:json or \
             stats:text (the statistics are written at exit only when stats is set)"
        ]
    );
    let quiet = conf("stats:json,stats_file:/tmp/s.json").unwrap();
    assert!(quiet.library_warnings().is_empty());
}

#[test]
fn library_keys_are_told_apart_from_pool_settings() {
    let c = conf("max_split_size_mb:128,free_sync:none,trace:/tmp/t.jsonl").unwrap();
    assert_eq!(c.library_keys_set(), vec!["free_sync", "trace"]);
    // Every key of the preloaded library is named, in the table's order.
    let c = conf(
        "count_cached_as_free:True,stats_file:/tmp/s.json,stats:json,trace:/tmp/t.jsonl,\
         free_sync:event",
    )
    .unwrap();
    assert_eq!(
        c.library_keys_set(),
        vec![
            "free_sync",
            "stats",
            "stats_file",
            "trace",
            "count_cached_as_free"
        ]
    );
    assert!(
        conf("max_split_size_mb:128")
            .unwrap()
            .library_keys_set()
            .is_empty()
    );
}

/// A tuning in a variable that is not read (one before it in precedence is set) is named in a
/// warning; a lower variable with only PyTorch-only keys, or none set, gives none.
#[test]
fn a_tuning_in_an_unread_variable_is_warned_about() {
    let c = Config::from_lookup(env(&[
        (CONF_VAR, "stats:text"),
        (
            PYTORCH_CUDA_CONF_VAR,
            "backend:native,max_split_size_mb:128",
        ),
        (PYTORCH_CONF_VAR, "backend:native"),
    ]))
    .unwrap();
    assert!(!c.settings.has_max_split_size());
    assert_eq!(
        c.unread_warnings(),
        [
            "CACHEALLOC_CONF is set, so PYTORCH_CUDA_ALLOC_CONF is not read: its \
          max_split_size_mb:128 is not in force (copy it into CACHEALLOC_CONF to keep it)"
        ]
    );
    let c = Config::from_lookup(env(&[
        (PYTORCH_CUDA_CONF_VAR, "max_split_size_mb:64"),
        (
            PYTORCH_CONF_VAR,
            "garbage_collection_threshold:0.6,max_split_size_mb:128",
        ),
    ]))
    .unwrap();
    assert_eq!(c.settings.max_split_size, 64 * MIB);
    assert_eq!(
        c.unread_warnings(),
        [
            "PYTORCH_CUDA_ALLOC_CONF is set, so PYTORCH_ALLOC_CONF is not read: its \
          garbage_collection_threshold:0.6,max_split_size_mb:128 is not in force (copy it into \
          PYTORCH_CUDA_ALLOC_CONF to keep it)"
        ]
    );
    let quiet = Config::from_lookup(env(&[
        (CONF_VAR, "stats:text"),
        (PYTORCH_CUDA_CONF_VAR, "backend:native"),
    ]))
    .unwrap();
    assert!(quiet.unread_warnings().is_empty());
    // Our own keys are no tuning of PyTorch's (it refuses them): not named, even with a value
    // we would refuse.
    let quiet = Config::from_lookup(env(&[
        (CONF_VAR, "stats:text"),
        (PYTORCH_CUDA_CONF_VAR, "stats:yaml"),
    ]))
    .unwrap();
    assert!(quiet.unread_warnings().is_empty());
    // The tuning copied over, as the warning advises: nothing left out, no warning; a key
    // with another value is still named.
    let copied = Config::from_lookup(env(&[
        (CONF_VAR, "stats:text,max_split_size_mb:128"),
        (
            PYTORCH_CUDA_CONF_VAR,
            "max_split_size_mb:128,garbage_collection_threshold:0.6",
        ),
    ]))
    .unwrap();
    assert_eq!(
        copied.unread_warnings(),
        [
            "CACHEALLOC_CONF is set, so PYTORCH_CUDA_ALLOC_CONF is not read: its \
          garbage_collection_threshold:0.6 is not in force (copy it into CACHEALLOC_CONF to keep \
          it)"
        ]
    );
    let copied = Config::from_lookup(env(&[
        (CONF_VAR, "max_split_size_mb:128"),
        (PYTORCH_CUDA_CONF_VAR, "max_split_size_mb:128"),
    ]))
    .unwrap();
    assert!(copied.unread_warnings().is_empty());
    // A lower variable that cannot even be parsed is still a tuning the user may think is in
    // force: named as written.
    let broken = Config::from_lookup(env(&[
        (CONF_VAR, "stats:text"),
        (PYTORCH_CUDA_CONF_VAR, " max_split_size_mb=128 "),
    ]))
    .unwrap();
    assert_eq!(
        broken.unread_warnings(),
        [
            "CACHEALLOC_CONF is set, so PYTORCH_CUDA_ALLOC_CONF is not read: its \
          max_split_size_mb=128 is not in force (copy it into CACHEALLOC_CONF to keep it)"
        ]
    );
}

/// An unread variable's tuning is compared as PyTorch reads that variable: alone, over the
/// defaults. A list of roundup divisions sets only the sizes it names after the first, so
/// `[1024:4]` read alone rounds nothing from 2 GiB up, unlike `4` in force.
#[test]
fn an_unread_variable_is_compared_as_read_alone() {
    let c = Config::from_lookup(env(&[
        (CONF_VAR, "roundup_power2_divisions:4"),
        (PYTORCH_CUDA_CONF_VAR, "roundup_power2_divisions:[1024:4]"),
    ]))
    .unwrap();
    assert_eq!(
        c.unread_warnings(),
        [
            "CACHEALLOC_CONF is set, so PYTORCH_CUDA_ALLOC_CONF is not read: its \
          roundup_power2_divisions:[1024:4] is not in force (copy it into CACHEALLOC_CONF to \
          keep it)"
        ]
    );
    // The same list in force: nothing to copy.
    let same = Config::from_lookup(env(&[
        (CONF_VAR, "stats:text,roundup_power2_divisions:[1024:4]"),
        (PYTORCH_CUDA_CONF_VAR, "roundup_power2_divisions:[1024:4]"),
    ]))
    .unwrap();
    assert!(same.unread_warnings().is_empty());
    // A key given twice is compared by the value it ends with: both entries are named (copying
    // them both keeps the tuning), and none when it ends at the value in force.
    let twice = |lower: &str| {
        Config::from_lookup(env(&[
            (CONF_VAR, "max_split_size_mb:128"),
            (PYTORCH_CUDA_CONF_VAR, lower),
        ]))
        .unwrap()
        .unread_warnings()
    };
    assert_eq!(
        twice("max_split_size_mb:128,max_split_size_mb:256"),
        [
            "CACHEALLOC_CONF is set, so PYTORCH_CUDA_ALLOC_CONF is not read: its \
          max_split_size_mb:128,max_split_size_mb:256 is not in force (copy it into \
          CACHEALLOC_CONF to keep it)"
        ]
    );
    assert!(twice("max_split_size_mb:256,max_split_size_mb:128").is_empty());
    // A value PyTorch refuses is named, whatever else the variable holds.
    assert_eq!(
        twice("max_split_size_mb:10,max_split_size_mb:128"),
        [
            "CACHEALLOC_CONF is set, so PYTORCH_CUDA_ALLOC_CONF is not read: its \
          max_split_size_mb:10 is not in force (copy it into CACHEALLOC_CONF to keep it)"
        ]
    );
}
