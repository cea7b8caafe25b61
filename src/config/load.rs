//! Reading the variables: which one holds the options, and applying its entries through the
//! options table. The rules are described in the module docs of `config`.

use super::error::{ConfigError, Problem};
use super::options::{self, Carrier, PYTORCH_ONLY_KEYS};
use super::syntax;
use super::{Config, ConfigSource};

pub(super) fn from_lookup(lookup: &dyn Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
    let mut config = Config {
        disabled: disabled(lookup(options::DISABLE_VAR))?,
        ..Config::default()
    };
    if config.disabled {
        // A pure pass-through: nothing else is read, so nothing else can stop it.
        return Ok(config);
    }
    // A log filter that cannot be read changes no allocation: a warning, not an error that would
    // take the GPU's memory away from the program.
    config.log_filter = log_filter(lookup(options::LOG_VAR)).unwrap_or_else(|e| {
        config.reading_notes.push(format!(
            "{e}; logging stays at the default, {}",
            options::DEFAULT_LOG_FILTER
        ));
        options::DEFAULT_LOG_FILTER.to_string()
    });
    let mut sources = ConfigSource::PRECEDENCE.into_iter();
    for source in sources.by_ref() {
        if let Some(text) = lookup(source.name()) {
            config.source = source;
            apply_conf(&mut config, &text)?;
            break;
        }
    }
    // Lower-precedence variables (PyTorch's: CACHEALLOC_CONF comes first) are not read; note
    // the allocator tuning they would carry, and the settings in them that change what PyTorch
    // itself does (it may read them).
    for source in sources {
        let Some(text) = lookup(source.name()) else {
            continue;
        };
        let entries = syntax::parse_entries(&text, &|_| None);
        let not_in_force = match &entries {
            Ok(entries) => entries_not_in_force(&config, entries),
            Err(_) => text.trim().to_string(),
        };
        if !not_in_force.is_empty() {
            config.unread.push((source, not_in_force));
        }
        for e in entries.unwrap_or_default() {
            let value = e.value.as_read();
            if options::policy_key(&e.key, &value).is_some() {
                config.unread_policy.push((source, e.key, value));
            }
        }
    }
    Ok(config)
}

/// The entries with keys shared with PyTorch (`max_split_size_mb:128`, ...) that the settings
/// in force do not hold, as written: an entry PyTorch would refuse, or one whose key ends up
/// with another value than `config` holds when the variable is read alone, as PyTorch reads it
/// (each variable over the defaults: `roundup_power2_divisions:[1024:4]` means 0 from 2 GiB
/// up, whatever another variable set).
fn entries_not_in_force(config: &Config, entries: &[syntax::Entry]) -> String {
    let mut alone = Config::default();
    let shared = |e: &syntax::Entry| options::find(&e.key).filter(|s| s.carrier == Carrier::Shared);
    let refused: Vec<bool> = entries
        .iter()
        .map(|e| {
            shared(e).is_some_and(|spec| spec.apply(&mut alone, &e.value, &mut Vec::new()).is_err())
        })
        .collect();
    entries
        .iter()
        .zip(refused)
        .filter(|(e, refused)| {
            shared(e).is_some_and(|spec| *refused || spec.current(&alone) != spec.current(config))
        })
        .map(|(e, _)| format!("{}:{}", e.key, e.value.as_written()))
        .collect::<Vec<_>>()
        .join(",")
}

/// `CACHEALLOC_DISABLE`: `1` disables; `0`, empty or unset enables; anything else is an error.
fn disabled(value: Option<String>) -> Result<bool, ConfigError> {
    let Some(raw) = value else { return Ok(false) };
    match raw.trim() {
        "" | "0" => Ok(false),
        "1" => Ok(true),
        _ => Err(ConfigError::new(
            options::DISABLE_VAR,
            Problem::InvalidVariable {
                value: raw,
                why: "must be 1 (pass-through) or 0 (enabled)".to_string(),
            },
        )),
    }
}

/// `CACHEALLOC_LOG`: a `tracing` EnvFilter; blank or unset means `warn`.
fn log_filter(value: Option<String>) -> Result<String, ConfigError> {
    let Some(raw) = value.filter(|v| !v.trim().is_empty()) else {
        return Ok(options::DEFAULT_LOG_FILTER.to_string());
    };
    // Each directive trimmed, empty ones dropped: EnvFilter reads a space after a comma as
    // part of the next directive (` warn` would be a target, not the level).
    let normalized = raw
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .collect::<Vec<_>>()
        .join(",");
    let bad = |why: String| {
        Err(ConfigError::new(
            options::LOG_VAR,
            Problem::InvalidVariable {
                value: raw.clone(),
                why: format!(
                    "{why}; expected a level such as warn, or directives such as \
                     cachealloc=debug"
                ),
            },
        ))
    };
    if let Err(e) = tracing_subscriber::EnvFilter::builder().parse(&normalized) {
        return bad(format!("not a log filter ({e})"));
    }
    // EnvFilter reads a word that is not a level as a target, which a misspelt level
    // (`degub`) then is: logging would stay at warn without a word. Only cachealloc logs here.
    if let Some(word) = normalized
        .split(',')
        .find(|d| !d.contains(['=', '[']) && !is_level(d) && !d.starts_with("cachealloc"))
    {
        return bad(format!(
            "'{word}' is neither a level (off, error, warn, info, debug, trace) nor one of \
             cachealloc's log targets (cachealloc, cachealloc::device, ...)"
        ));
    }
    Ok(normalized)
}

/// A directive that is a level alone, as EnvFilter reads one (a name in any case, or a number).
pub(crate) fn is_level(directive: &str) -> bool {
    // `LevelFilter` reads "" as a level too; an empty directive names none.
    !directive.is_empty()
        && directive
            .parse::<tracing_subscriber::filter::LevelFilter>()
            .is_ok()
}

/// Parse `text` with the meaning of `config.source` and apply it onto `config`.
pub(super) fn apply_conf(config: &mut Config, text: &str) -> Result<(), ConfigError> {
    let source = config.source;
    let variable = source.name();
    let form = |key: &str| {
        options::find(key).map(|spec| syntax::ValueForm {
            allowed: spec.allowed(),
            takes_list: spec.takes_list(),
        })
    };
    let entries =
        syntax::parse_entries(text, &form).map_err(|m| ConfigError::syntax(variable, m))?;
    let carriers: &[Carrier] = if source.is_pytorch() {
        &[Carrier::Shared]
    } else {
        &[Carrier::Shared, Carrier::Cachealloc]
    };
    // Each known key's value as written so far: a key given again replaces it (PyTorch's
    // reading too), which is said, since the earlier value is lost.
    let mut given: Vec<(String, String)> = Vec::new();
    for entry in entries {
        let key = entry.key.as_str();
        if let Some(spec) = options::find(key) {
            let written = entry.value.as_written();
            match given.iter_mut().find(|(k, _)| k == key) {
                Some((_, earlier)) if *earlier != written => {
                    // A list of roundup intervals is applied over the table as it stands.
                    let how = if matches!(entry.value, syntax::Value::List(_)) {
                        "is applied over"
                    } else {
                        "replaces"
                    };
                    config.reading_notes.push(format!(
                        "{variable}: {key} is given more than once: {key}:{written} {how} \
                         {key}:{earlier}, as in PyTorch"
                    ));
                    *earlier = written;
                }
                Some(_) => {}
                None => given.push((key.to_string(), written)),
            }
            if !carriers.contains(&spec.carrier) {
                let problem = Problem::CacheallocOnlyKey { key: entry.key };
                return Err(ConfigError::new(variable, problem));
            }
            let mut notes = Vec::new();
            let applied = spec.apply(config, &entry.value, &mut notes);
            applied.map_err(|why| {
                // A refused number says what it was read as.
                let why = if notes.is_empty() {
                    why
                } else {
                    format!("{why} ({})", notes.join("; "))
                };
                let value = entry.value.as_written();
                let problem = Problem::InvalidValue {
                    key: entry.key.clone(),
                    value,
                    why,
                };
                ConfigError::new(variable, problem)
            })?;
            let written = entry.value.as_written();
            for note in notes {
                config.reading_notes.push(format!(
                    "{variable}: {key}:{written}: {note}; write it plainly to say so"
                ));
            }
        } else if PYTORCH_ONLY_KEYS.contains(&key) {
            log_event!(debug,
                variable,
                key,
                value = %entry.value.as_written(),
                "ignoring PyTorch-only allocator key"
            );
            let value = entry.value.as_read();
            config.ignored.push((entry.key, value));
        } else {
            let allowed = options::keys_for(carriers);
            let known: Vec<&'static str> =
                allowed.iter().chain(PYTORCH_ONLY_KEYS).copied().collect();
            let suggestion = closest(key, &known);
            let problem = Problem::UnknownKey {
                key: entry.key,
                allowed,
                suggestion,
            };
            return Err(ConfigError::new(variable, problem));
        }
    }
    // The statistics written at exit would overwrite the recording.
    if let (Some(trace), Some(stats)) = (&config.trace, &config.stats_file)
        && trace == stats
        && !both_outputs_may_share(stats)
    {
        let problem = Problem::InvalidValue {
            key: "stats_file".into(),
            value: stats.clone(),
            why: "it is the trace file too, which the statistics written at exit would \
                  overwrite; give them different paths (only `/dev/null`, `/dev/stdout`, \
                  `/dev/stderr` and `/dev/tty` may be both)"
                .into(),
        };
        return Err(ConfigError::new(variable, problem));
    }
    Ok(())
}

/// Whether `trace` and `stats_file` may name the same `path`: a device that keeps nothing
/// (`/dev/null`), or one that each writes after what is there, the statistics after the
/// recording (the program's standard output or error, redirected to a file or not; a
/// terminal). Any other path is a file each would empty (`file_claim`).
fn both_outputs_may_share(path: &str) -> bool {
    matches!(
        path,
        "/dev/null" | "/dev/stdout" | "/dev/stderr" | "/dev/tty"
    )
}

/// The allowed key nearest to `key`, when the difference looks like a typo.
fn closest(key: &str, allowed: &[&'static str]) -> Option<&'static str> {
    let (best, distance) = allowed
        .iter()
        .map(|&a| (a, edit_distance(key, a)))
        .min_by_key(|&(_, d)| d)?;
    (distance <= 3.max(key.len() / 4)).then_some(best)
}

/// Levenshtein distance over bytes (keys are ASCII).
fn edit_distance(a: &str, b: &str) -> usize {
    let b = b.as_bytes();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.bytes().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let substitution = diagonal + usize::from(ca != cb);
            diagonal = row[j + 1];
            row[j + 1] = substitution.min(row[j] + 1).min(row[j + 1] + 1);
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edit_distance_counts_single_edits() {
        assert_eq!(edit_distance("", ""), 0);
        assert_eq!(edit_distance("abc", "abc"), 0);
        assert_eq!(edit_distance("abc", "abd"), 1);
        assert_eq!(edit_distance("abc", "ab"), 1);
        assert_eq!(edit_distance("ab", "abc"), 1);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
    }

    #[test]
    fn suggestions_only_for_near_misses() {
        let allowed = ["max_split_size_mb", "stats", "trace"];
        assert_eq!(
            closest("max_split_size", &allowed),
            Some("max_split_size_mb")
        );
        assert_eq!(closest("stat", &allowed), Some("stats"));
        assert_eq!(closest("completely_unrelated_key", &allowed), None);
    }
}
