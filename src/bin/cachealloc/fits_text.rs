//! The settings search after an out-of-memory, in words: the settings that fit (and which of
//! the replay's own settings they go without), or how far the best one gets, and what binds
//! when none does.

use crate::outcome::{FittingJson, FractionTrialJson, ReplayJson, device_allocs, event_at};
use cachealloc::config::shell_word;
use cachealloc::pool::format_size;
use cachealloc::trace::fit::MAX_SPLIT_LADDER_MB;

/// Values, as a list: `1024, 512, 256`.
fn listed(values: &[u64]) -> String {
    values
        .iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Settings, as a list: `a`, `a and b`.
fn and_listed(items: &[String]) -> String {
    match items {
        [] => String::new(),
        [one] => one.clone(),
        [rest @ .., last] => format!("{} and {last}", rest.join(", ")),
    }
}

impl ReplayJson {
    /// The settings search, in words: the values that fit, or how far the best one gets.
    pub(crate) fn fits_text(&self, fits: &[FittingJson], expandable_fits: bool) -> String {
        let not_replayable = self
            .max_split_sizes_not_replayable
            .as_deref()
            .unwrap_or(&[]);
        let tried: Vec<u64> = MAX_SPLIT_LADDER_MB
            .into_iter()
            .filter(|mb| !not_replayable.contains(mb))
            .collect();
        let (tried, skipped) = (listed(&tried), listed(not_replayable));
        if tried.is_empty() {
            return format!(
                "\nNo max_split_size_mb value could be tried: the start state rebuilt from the \
                 snapshot holds blocks that could not exist under any of them ({skipped}).\n"
            );
        }
        // Values the recorded start state rules out were not replayed: say so, and which.
        let untried = if not_replayable.is_empty() {
            String::new()
        } else {
            let (values, were, them) = if not_replayable.len() == 1 {
                ("value", "was", "it")
            } else {
                ("values", "were", "them")
            };
            format!(
                "  (max_split_size_mb {values} {skipped} {were} not tried: the start state \
                 rebuilt from the snapshot holds blocks that could not exist under {them}.)\n"
            )
        };
        let suggestion = self.suggestion_text();
        let mut without = Vec::new();
        if self.searched_without_divisions {
            without.push(" without its roundup_power2_divisions");
        }
        if self.searched_without_max_split {
            without.push(" without the max_split_size_mb it set");
        }
        let also = if without.is_empty() {
            String::new()
        } else {
            format!(", and also{}", without.join(" and"))
        };
        if fits.is_empty() {
            let mut t = format!(
                "\nNo max_split_size_mb value tried ({tried}; other settings as in this \
                 replay{also}) lets this workload run without an out-of-memory {}",
                self.why_nothing_fits(expandable_fits)
            );
            match &self.gets_furthest {
                Some(g) => {
                    t += &format!(
                        " With --conf {} it gets past this out-of-memory and first runs out at \
                         {}.\n",
                        shell_word(&g.conf),
                        event_at(self.mode, g.first_oom_event_index)
                    );
                }
                None => t += " No value gets past this out-of-memory.\n",
            }
            return t + &suggestion + &untried;
        }
        let mut t = format!(
            "\nSettings that avoid every out-of-memory here, each verified by replaying \
             (max_split_size_mb values with this replay's other settings{also})"
        );
        // The hint's remedy is the program's: these are a way round it, not the cure.
        if self
            .first_oom_report
            .as_ref()
            .is_some_and(|r| r.kind == "freed_during_request")
        {
            t += "; the hint above needs none of them (freeing the block before the request \
                  avoids it), but they avoid it too";
        }
        // When every one goes without some of the replay's own settings, that is the remedy.
        if fits.iter().all(|f| !f.dropped_settings.is_empty()) {
            let mut own: Vec<String> = Vec::new();
            for f in fits {
                for d in &f.dropped_settings {
                    if !own.contains(d) {
                        own.push(d.clone());
                    }
                }
            }
            let drop = if own.len() == 1 {
                "drop it"
            } else {
                "each says which it drops"
            };
            t += &format!(
                "; none keeps this replay's {}: {drop}",
                and_listed(&own).replace(" and ", " and its ")
            );
        }
        t += ":\n";
        let width = fits
            .iter()
            .map(|f| shell_word(&f.conf).len())
            .max()
            .unwrap_or(0);
        for f in fits {
            t += &format!(
                "  --conf {:<width$}  peak reserved {}{}, {}, {}{}\n",
                shell_word(&f.conf),
                format_size(f.peak_reserved_bytes),
                self.fills_text(f),
                device_allocs(self.expandable_segments, f.num_device_alloc),
                match f.num_alloc_retries {
                    1 => "1 retry".to_string(),
                    n => format!("{n} retries"),
                },
                self.fit_notes(f)
            );
        }
        t + &self.older_pytorch_text() + &suggestion + &untried
    }

    /// A listed `max_split_size_mb:20` as PyTorch 2.9 and older must have it: 21, replayed.
    fn older_pytorch_text(&self) -> String {
        let Some(o) = &self.older_pytorch_trial else {
            return String::new();
        };
        let outcome = match o.first_oom_event_index {
            None => format!(
                "runs without an out-of-memory too: peak reserved {}",
                format_size(o.peak_reserved_bytes)
            ),
            Some(at) => format!("runs out of memory, first at {}", event_at(self.mode, at)),
        };
        format!(
            "  (PyTorch 2.9 and older refuse max_split_size_mb:20, wanting more than 20: with \
             them --conf {} {outcome}.)\n",
            shell_word(&o.conf)
        )
    }

    /// Why no value fits, after "lets this workload run without an out-of-memory ": where, and
    /// what binds.
    fn why_nothing_fits(&self, expandable_fits: bool) -> String {
        let place = match &self.fraction_trial {
            Some(f) if f.fits => return fraction_text(f),
            // Nor does the replay without its fraction.
            Some(f) => format!("{}, nor without it on this device", within_limit(f)),
            None => "on this device".to_string(),
        };
        let why = if expandable_fits {
            "."
        } else if let Some(r) = self
            .first_oom_report
            .as_ref()
            .filter(|r| r.kind == "padding")
        {
            // The requests fit; their blocks do not (the hint says why).
            if r.padding_held_outside_bytes > 0 {
                ": its blocks need more memory, though the requests alone would fit without \
                 the memory held outside cachealloc."
            } else {
                ": its blocks need more memory, though the requests alone would fit."
            }
        } else {
            ": it needs more memory."
        };
        format!("{place}{why}")
    }

    /// What became of the value the report's hint named.
    fn suggestion_text(&self) -> String {
        match &self.report_suggestion {
            Some(s) if !s.tried => format!(
                "  ({}, the report's suggestion, cannot be replayed from this recording's start \
                 state.)\n",
                s.conf
            ),
            Some(s) if s.gets_further => format!(
                "  ({}, the report's suggestion, was tried: it gets past this out-of-memory too, \
                 and runs out of memory later.)\n",
                s.conf
            ),
            Some(s) if !s.fits => format!(
                "  ({}, the report's suggestion, was tried and does not get past this \
                 out-of-memory.)\n",
                s.conf
            ),
            _ => String::new(),
        }
    }

    /// " (fills the device)" when the fit's peak fills what it may reserve.
    fn fills_text(&self, f: &FittingJson) -> &'static str {
        match f.fills_memory_limit {
            true if self.memory_limit == self.capacity_bytes => " (fills the device)",
            true => " (fills its memory fraction)",
            false => "",
        }
    }

    /// A fit's notes, in parentheses: the replay's settings it goes without, the values with
    /// the same figures, the report's suggestion.
    fn fit_notes(&self, f: &FittingJson) -> String {
        let mut notes = Vec::new();
        if !f.dropped_settings.is_empty() {
            let defaults = if f.conf.is_empty() {
                ": the defaults"
            } else {
                ""
            };
            notes.push(format!(
                "without {}{defaults}",
                and_listed(&f.dropped_settings)
            ));
        }
        if !f.same_figures_max_split_size_mb.is_empty() {
            notes.push(same_figures_note(
                &f.same_figures_max_split_size_mb,
                f.max_split_size_mb.is_none(),
            ));
        }
        let suggested_mb = self
            .first_oom_report
            .as_ref()
            .and_then(|r| r.suggested_max_split_size_mb);
        if self
            .report_suggestion
            .as_ref()
            .is_some_and(|s| s.conf == f.conf)
        {
            notes.push("the report's suggestion".to_string());
        } else if let Some(mb) = suggested_mb
            && f.dropped_settings.is_empty()
            && f.same_figures_max_split_size_mb.contains(&mb)
        {
            notes.push(format!("{mb}, the report's suggestion, among them"));
        }
        match notes.len() {
            0 => String::new(),
            _ => format!(" ({})", notes.join("; ")),
        }
    }
}

/// The fraction's limit a replay ran out of memory within, after "lets this workload run
/// without an out-of-memory ".
fn within_limit(f: &FractionTrialJson) -> String {
    let limit = format!("per_process_memory_fraction:{}", f.fraction);
    if f.set_by_program {
        format!("within the {limit} limit in force (the program set its fraction as it ran)")
    } else {
        format!("within its {limit} limit")
    }
}

/// What the replay without its memory fraction found when it fits, after "lets this workload
/// run without an out-of-memory ".
fn fraction_text(f: &FractionTrialJson) -> String {
    // The program's calls are in force whatever --conf says: the trial lifted them too.
    let without = if f.set_by_program {
        format!(
            "Without the program's calls (which --conf does not override), with --conf {},",
            shell_word(&f.conf)
        )
    } else {
        format!("Without it (--conf {})", shell_word(&f.conf))
    };
    let mut t = format!(
        "{}: that limit binds, not the device. {without} it runs without an out-of-memory on \
         this device: peak reserved {}.",
        within_limit(f),
        format_size(f.peak_reserved_bytes)
    );
    if let (Some(fraction), Some(conf)) = (f.enough_fraction, &f.enough_conf) {
        t += &format!(
            " A fraction of {fraction} was replayed and fits too (--conf {}; found by halving \
             the range above {}, a smaller one may fit too).",
            shell_word(conf),
            f.fraction
        );
    } else if let (Some(fraction), true) = (f.enough_fraction, f.set_by_program) {
        t += &format!(
            " A fraction of {fraction} set by the program in their place was replayed and fits \
             too (found by halving the range above {}, a smaller one may fit too).",
            f.fraction
        );
    }
    t
}

/// The note naming the other `max_split_size_mb` values with a fit's figures (`added` to
/// settings that set none).
fn same_figures_note(values: &[u64], added: bool) -> String {
    let added = if added { " added" } else { "" };
    let verb = if values.len() == 1 { "gives" } else { "give" };
    format!(
        "max_split_size_mb {}{added} {verb} the same figures",
        listed(values)
    )
}

#[cfg(test)]
mod tests {
    use super::same_figures_note;

    /// One value gives, several give.
    #[test]
    fn the_same_figures_note_agrees_with_its_values() {
        assert_eq!(
            same_figures_note(&[512], false),
            "max_split_size_mb 512 gives the same figures"
        );
        assert_eq!(
            same_figures_note(&[64, 48], true),
            "max_split_size_mb 64, 48 added give the same figures"
        );
    }
}
