//! The `cachealloc` command line: replay recorded or synthetic allocation traces through the
//! pool on a simulated device, and list the configuration options.

#[macro_use]
mod console;
mod device_arg;
mod device_size;
mod fits_text;
mod outcome;
mod recorded;
mod request_report;
mod save_file;
mod seed_arg;
mod size;
mod sources;
mod state;
mod state_report;

use cachealloc::backend::sim::Placement;
use cachealloc::config::{Config, ConfigSource, options};
use cachealloc::trace::fit::{
    ExpandableTrial, MaxSplitSearch, search_after_oom, try_expandable_segments,
};
use cachealloc::trace::record::save::{SaveError, replay_saved};
use cachealloc::trace::record::settings_text;
use cachealloc::trace::{ReplayConfig, ReplayOutcome, Workload, replay, synth};
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};
use outcome::{Context, ReplayJson};
use save_file::SaveFile;
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "cachealloc",
    version,
    about = "A caching CUDA allocator with PyTorch's policy: offline replay and tuning"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Replay a recorded PyTorch memory snapshot (torch.cuda.memory._dump_snapshot) or a
    /// cachealloc trace (CACHEALLOC_CONF=trace:PATH) through the pool on a simulated device.
    Replay(ReplayArgs),
    /// Generate a built-in workload (transformer, loguniform) and replay it.
    Synth(SynthArgs),
    /// Report the memory state a PyTorch snapshot records (one without an allocation trace
    /// too, as taken in an out-of-memory handler): what each pool reserves, holds and has free,
    /// and whether a request of a given size would be served in that state.
    State(state::StateArgs),
    /// List the configuration options (CACHEALLOC_CONF / PYTORCH_CUDA_ALLOC_CONF keys).
    Options {
        /// Print the Markdown table used in the README.
        #[arg(long)]
        markdown: bool,
    },
}

#[derive(clap::Args)]
struct Common {
    /// Allocator settings in PYTORCH_CUDA_ALLOC_CONF syntax, e.g. "max_split_size_mb:128".
    /// Replays read only this option: the CACHEALLOC_CONF and PYTORCH_CUDA_ALLOC_CONF
    /// variables configure the preloaded library.
    #[arg(long)]
    conf: Option<String>,
    /// Device capacity: 24GiB, 512MiB (KiB..TiB and K..T are powers of 1024, KB..TB powers of
    /// 1000) or bytes, at least 2 MiB (one segment). Default: unlimited, or all of
    /// --device-memory (in a faithful replay: the capacity the recording's failures and retries
    /// imply, else the device's memory when the recording names or implies it).
    #[arg(long, value_parser = size::parse_capacity, allow_hyphen_values = true)]
    capacity: Option<u64>,
    /// The device's total memory, as cudaMemGetInfo reports it (same forms as --capacity): what
    /// per_process_memory_fraction takes its fraction of and the ranges of expandable segments
    /// are sized from. More than the capacity when a CUDA context or other processes hold the
    /// rest; without --capacity the allocator may have all of it (a faithful replay keeps the
    /// recording's capacity, held to it). Default: the capacity (in a faithful replay: the
    /// memory the recording names or its ranges imply, raised to a larger --capacity).
    #[arg(long, value_parser = size::parse_device_memory, allow_hyphen_values = true)]
    device_memory: Option<u64>,
    /// Print one JSON object instead of the readable summary.
    #[arg(long)]
    json: bool,
    /// Where the simulated driver places new segments [default: top-down; a faithful replay
    /// of a run saved by synth --save: the run's].
    #[arg(long, value_enum)]
    placement: Option<PlacementArg>,
}

impl Common {
    fn given_device(&self) -> device_size::GivenDevice {
        device_size::GivenDevice {
            capacity: self.capacity,
            memory: self.device_memory,
        }
    }
}

#[derive(clap::Args)]
struct ReplayArgs {
    /// The trace: a PyTorch snapshot (the pickle torch.cuda.memory._dump_snapshot writes, or
    /// the same snapshot written as JSON) or a cachealloc trace; - reads standard input.
    trace: PathBuf,
    /// Which device's trace to replay (default: the first device whose trace allocates or
    /// frees).
    #[arg(long, value_parser = device_arg::parse_device, allow_hyphen_values = true)]
    device: Option<i32>,
    /// Reproduce the recording exactly: rebuild the state at trace start, use the recording's
    /// settings (unless --conf is given: then a what-if from the recorded start state), device
    /// capacity (unless --capacity is given; held to --device-memory) and segment addresses.
    #[arg(long)]
    faithful: bool,
    #[command(flatten)]
    common: Common,
}

#[derive(clap::Args)]
struct SynthArgs {
    /// The workload: transformer or loguniform, optionally with parameters
    /// (e.g. "transformer:layers=24,seq=512-4096"; --help lists them).
    #[arg(default_value = "transformer")]
    spec: String,
    /// Seed of the generator (same seed, same workload).
    #[arg(long, default_value_t = 1, allow_hyphen_values = true, value_parser = seed_arg::parse_seed)]
    seed: u64,
    /// Also write the run to FILE as a cachealloc trace (the library's trace:PATH format), to
    /// replay later with other settings: cachealloc replay FILE [--faithful].
    #[arg(long, value_name = "FILE")]
    save: Option<PathBuf>,
    /// Options of `replay` that have no meaning for a generated workload, accepted only to be
    /// refused with a message that says so (clap's own would suggest `-- --device`).
    #[arg(long, hide = true, num_args = 0..=1, allow_hyphen_values = true)]
    device: Option<Option<String>>,
    #[arg(long, hide = true)]
    faithful: bool,
    #[command(flatten)]
    common: Common,
}

#[derive(Clone, Copy, ValueEnum)]
enum PlacementArg {
    /// Highest free address range first (what the Linux driver mostly does).
    TopDown,
    /// Lowest free address range first.
    BottomUp,
}

/// The command line, with `synth`'s help for the options it shares with `replay` told without
/// what they do in a faithful replay, which `synth` has not.
fn command() -> clap::Command {
    let synth_help = [
        (
            "capacity",
            "Device capacity: 24GiB, 512MiB (KiB..TiB and K..T are powers of 1024, KB..TB \
             powers of 1000) or bytes, at least 2 MiB (one segment). Default: unlimited, or all \
             of --device-memory",
        ),
        (
            "device_memory",
            "The device's total memory, as cudaMemGetInfo reports it (same forms as \
             --capacity): what per_process_memory_fraction takes its fraction of and the ranges \
             of expandable segments are sized from. More than the capacity when a CUDA context \
             or other processes hold the rest; without --capacity the allocator may have all of \
             it. Default: the capacity",
        ),
        (
            "placement",
            "Where the simulated driver places new segments [default: top-down]",
        ),
    ];
    Cli::command().mut_subcommand("synth", |synth| {
        synth_help
            .into_iter()
            .fold(synth, |synth, (id, help)| {
                synth.mut_arg(id, |arg| arg.help(help).long_help(help))
            })
            .mut_arg("spec", |arg| arg.long_help(synth::parameters_help()))
    })
}

fn main() -> ExitCode {
    let cli = command()
        .try_get_matches()
        .and_then(|matches| Cli::from_arg_matches(&matches))
        .unwrap_or_else(|e| exit_on_usage(e));
    match run(cli).and_then(|text| console::write_output(&text)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            say!("cachealloc: error: {message}");
            ExitCode::from(2)
        }
    }
}

/// clap's own refusals (a bad value, an unknown option, a missing argument) said as ours are,
/// "cachealloc: error: …", with exit code 2; help and version printed as clap prints them.
fn exit_on_usage(e: clap::Error) -> ! {
    use clap::error::ErrorKind;
    use std::io::IsTerminal;
    let to_stdout = matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion);
    // Not to a terminal: written as any output is, so that a failed write (a full disk) is
    // said and fails, where clap's own printing would ignore it.
    if to_stdout && !std::io::stdout().is_terminal() {
        if let Err(message) = console::write_output(&e.render().to_string()) {
            say!("cachealloc: error: {message}");
            std::process::exit(2);
        }
        std::process::exit(0);
    }
    if to_stdout || e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
        e.exit();
    }
    let text = e.render().to_string();
    eprint!("cachealloc: {text}");
    std::process::exit(e.exit_code());
}

fn run(cli: Cli) -> Result<String, String> {
    match cli.command {
        Command::Options { markdown } => Ok(if markdown {
            options::render_markdown_table()
        } else {
            options::render_help()
        }),
        Command::State(args) => state::run(args),
        Command::Synth(args) => {
            if args.device.is_some() || args.faithful {
                let option = if args.faithful {
                    "--faithful"
                } else {
                    "--device"
                };
                return Err(format!(
                    "synth: {option} applies to a recorded trace (cachealloc replay TRACE \
                     {option}); synth generates its workload on one device, from its spec \
                     and --seed"
                ));
            }
            let spec: cachealloc::trace::synth::SynthSpec = args
                .spec
                .parse()
                .map_err(|e: cachealloc::trace::synth::SynthError| e.0)?;
            let workload = spec.generate(args.seed).map_err(|e| e.0)?;
            let (config, settings_text) = replay_config(&args.common, "synth")?;
            if args.common.conf.is_none() {
                note_unread_variable();
            }
            warn_fraction_without_memory(&config, &workload);
            let out = match &args.save {
                Some(path) => save_replay(&workload, &config, path)?,
                None => replay(&workload, &config, None).map_err(|e| e.to_string())?,
            };
            let fits = fits_after_oom(&out, &workload, &config, None);
            let ctx = Context {
                trace: format!("{} (seed {})", args.spec, args.seed),
                device: 0,
                mode: "synthetic",
                settings: settings_text,
                expandable_segments: config.settings.expandable_segments,
                capacity: config.capacity,
                capacity_is_device_memory: false,
                device_memory: config.total(),
                placement: config.placement.name(),
                recorded: Default::default(),
                faithful: false,
                orphans_replayed: false,
                start_rebuildable: false,
                memory_limit: memory_limit(&config, &workload),
            };
            Ok(render(
                ReplayJson::new(ctx, out)
                    .with_fits(fits.0)
                    .with_expandable_trial(fits.1),
                args.common.json,
            ))
        }
        Command::Replay(args) => {
            let (mut config, mut settings_text) = replay_config(&args.common, "replay")?;
            // A faithful replay takes the recording's settings: no variable could apply.
            if args.common.conf.is_none() && !args.faithful {
                note_unread_variable();
            }
            let loaded = sources::load(
                &args.trace,
                args.device,
                args.faithful,
                args.common.device_memory,
                args.common.conf.is_some().then_some(&config.settings),
            )?;
            if args.faithful {
                // Faithful replay runs with the recording's own settings unless told otherwise:
                // --conf makes it a what-if from the recorded start state, and says so.
                if args.common.conf.is_some() {
                    if settings_text.is_empty() {
                        settings_text = "defaults".to_string();
                    }
                    settings_text = if loaded.settings_inferred {
                        format!(
                            "{settings_text} (from --conf; the recording names none, so its \
                             start state is rebuilt under these)"
                        )
                    } else {
                        format!("{settings_text} (from --conf, in place of the recording's)")
                    };
                } else if let Some(recorded) = &loaded.recorded_settings {
                    for warning in &loaded.settings_warnings {
                        say!("cachealloc: warning: {warning}");
                    }
                    config.settings = recorded.clone();
                    let how = if loaded.settings_inferred {
                        "as the recording shows them"
                    } else {
                        "as recorded"
                    };
                    settings_text = named_settings(how, recorded);
                    if let Some(remark) = &loaded.settings_remark {
                        settings_text = format!("{settings_text} ({remark})");
                    }
                } else {
                    settings_text = "defaults (the recording names none)".to_string();
                }
            }
            let mut capacity_is_device_memory = false;
            if args.faithful {
                capacity_is_device_memory =
                    device_size::follow_recording(&mut config, &loaded, args.common.given_device())
                        .map_err(|e| format!("{}: {e}", args.trace.display()))?;
                if args.common.placement.is_none()
                    && let Some(placement) = loaded.placement
                {
                    config.placement = placement;
                }
            }
            config.device = cachealloc::pool::DeviceId(loaded.device);
            for note in &loaded.notes {
                say!("cachealloc: note: {note}");
            }
            warn_fraction_without_memory(&config, &loaded.workload);
            let out = replay(&loaded.workload, &config, loaded.start.as_ref()).map_err(|e| {
                let advice = match e {
                    cachealloc::pool::Error::SeedForbiddenBySettings(_)
                        if args.common.conf.is_some() =>
                    {
                        if loaded.settings_inferred {
                            " (the recording names no settings, and its start state, rebuilt \
                             under --conf's, is one their rules cannot have made; for a what-if \
                             replay under other settings, drop --faithful)"
                        } else {
                            " (the start state is rebuilt under the recording's settings, which \
                             --conf's cannot hold; for a what-if replay under other settings, \
                             drop --faithful)"
                        }
                    }
                    _ => "",
                };
                format!("{}: {e}{advice}", args.trace.display())
            })?;
            let fits = fits_after_oom(&out, &loaded.workload, &config, loaded.start.as_ref());
            let ctx = Context {
                trace: args.trace.display().to_string(),
                device: loaded.device,
                mode: if args.faithful { "faithful" } else { "plain" },
                settings: settings_text,
                expandable_segments: config.settings.expandable_segments,
                capacity: config.capacity,
                capacity_is_device_memory,
                device_memory: config.total(),
                placement: config.placement.name(),
                orphans_replayed: loaded.start.is_some(),
                start_rebuildable: loaded.start_rebuildable,
                memory_limit: memory_limit(&config, &loaded.workload),
                recorded: loaded.recorded,
                faithful: args.faithful,
            };
            Ok(render(
                ReplayJson::new(ctx, out)
                    .with_fits(fits.0)
                    .with_expandable_trial(fits.1),
                args.common.json,
            ))
        }
    }
}

/// The replay's configuration from the options of `command` (`replay` or `synth`), and its
/// settings named.
fn replay_config(common: &Common, command: &str) -> Result<(ReplayConfig, String), String> {
    let conf = common.conf.as_deref().unwrap_or("");
    let config = parse_conf(conf, command)?;
    let placement = match common.placement {
        None | Some(PlacementArg::TopDown) => Placement::TopDown,
        Some(PlacementArg::BottomUp) => Placement::BottomUp,
    };
    let replay_config = ReplayConfig {
        settings: config.settings,
        capacity: device_size::plain_capacity(common.given_device())?,
        device_total: common.device_memory,
        placement,
        ..ReplayConfig::default()
    };
    // The settings in effect, not the text given: a key given twice names its last value, and
    // PyTorch-only keys (ignored here) are left out.
    let named = settings_text(&replay_config.settings);
    Ok((replay_config, named))
}

/// A recording's settings as a summary names them: `how` they were found, then their
/// `--conf` form, or "defaults".
fn named_settings(how: &str, settings: &cachealloc::pool::Settings) -> String {
    let conf = settings_text(settings);
    if conf.is_empty() {
        format!("{how}: defaults")
    } else {
        format!("{how}: {conf}")
    }
}

/// Parse `--conf` for `command` (`replay`, `synth`, `state`), printing the warnings its keys
/// and values earn.
fn parse_conf(conf: &str, command: &str) -> Result<Config, String> {
    let config = Config::parse_conf_str(conf).map_err(|e| e.to_string())?;
    for warning in config.unsupported_key_warnings() {
        say!("cachealloc: warning: {warning}");
    }
    for warning in config.value_warnings() {
        say!("cachealloc: warning: {warning}");
    }
    let library_keys = config.library_keys_set();
    if !library_keys.is_empty() {
        let (configure, have) = if library_keys.len() == 1 {
            ("configures", "has")
        } else {
            ("configure", "have")
        };
        say!(
            "cachealloc: warning: --conf {}: {configure} the preloaded library, not the pool, \
             and {have} no effect on cachealloc {command}",
            library_keys.join(", ")
        );
    }
    Ok(config)
}

/// `synth --save`: replay `workload`, writing its events to `path` as a cachealloc trace.
fn save_replay(
    workload: &Workload,
    config: &ReplayConfig,
    path: &Path,
) -> Result<ReplayOutcome, String> {
    if path.as_os_str() == "-" {
        return Err(
            "--save -: the summary goes to standard output; name a file for the trace".into(),
        );
    }
    if let Some(stream) = save_file::standard_stream(path) {
        return Err(format!(
            "--save {}: that is {stream}; name a file for the trace",
            path.display()
        ));
    }
    let failed = |e: &dyn std::fmt::Display| format!("--save {}: {e}", path.display());
    // Opened before the replay, so that a bad path is named at once.
    let target = SaveFile::create(path).map_err(|e| failed(&SaveError::Write(e)))?;
    let kept = if target.keeps_previous() {
        "; the file there is left as it was"
    } else {
        ""
    };
    let written = target
        .writer()
        .map_err(SaveError::Write)
        .and_then(|file| replay_saved(workload, config, BufWriter::new(file)))
        .and_then(|saved| target.commit().map(|()| saved).map_err(SaveError::Write));
    // On failure the temporary file goes with `target`: no partial trace is left behind.
    let saved = written.map_err(|e| match e {
        SaveError::Replay(e) => e.to_string(),
        e @ SaveError::Write(_) => format!("{}{kept}", failed(&e)),
    })?;
    let file = cachealloc::config::shell_path(path);
    if saved.events == 0 {
        say!("cachealloc: note: the run allocated nothing: {file} holds no event of the pool");
    } else if !std::fs::metadata(path).is_ok_and(|m| m.is_file()) {
        // A pipe or a device: there is no file to replay later.
        say!("cachealloc: note: wrote the run's trace to {file}");
    } else {
        say!(
            "cachealloc: note: saved the run as a trace in {file}; cachealloc replay {file} \
             --faithful replays this run again, and with --conf or --capacity instead of \
             --faithful, its requests under other settings"
        );
    }
    if saved.outcome.first_oom.is_some() {
        say!(
            "cachealloc: note: the run ran out of memory, and the trace keeps its outcome: each \
             refused request is an oom line (a replay requests it again and frees it at once) \
             and the frees of refused allocations are left out; to keep the workload itself, \
             save it without --capacity or with one it fits"
        );
    }
    Ok(saved.outcome)
}

/// A replay reads its settings from `--conf` only: say so when the variable the preloaded
/// library would read holds settings, since a user who exports one for a training run may
/// expect the replay to follow it.
fn note_unread_variable() {
    // The library reads the first of these that is set, even when it is empty.
    let read = ConfigSource::PRECEDENCE
        .into_iter()
        .map(ConfigSource::name)
        .find_map(|var| std::env::var(var).ok().map(|value| (var, value)));
    let Some((var, value)) = read else {
        return;
    };
    if value.trim().is_empty() {
        return;
    }
    let unread = "a replay reads its settings from --conf only (the variable configures the \
                  preloaded library)";
    // Read as the library reads it: the same variable, the same keys, the same errors.
    match Config::from_env() {
        // Only the pool's settings matter to a replay: library and PyTorch-only keys are left
        // out of the --conf offered, and a variable with none of them needs no note.
        Ok(config) => {
            let conf = settings_text(&config.settings);
            if !conf.is_empty() {
                say!(
                    "cachealloc: note: {var} is set, but {unread}; to replay with its allocator \
                     settings, give --conf {}",
                    cachealloc::config::shell_word(&conf)
                );
            }
        }
        Err(e) => say!(
            "cachealloc: note: {var} is set, but {unread}; the preloaded library would refuse \
             its configuration: {e}"
        ),
    }
}

/// The most the replay's pool may reserve: the capacity, or PyTorch's allowed maximum (the
/// fraction of the device's total) under a memory fraction below 1, the settings' or the one
/// the program set before its first request — unless the program changed it between requests,
/// when no one limit holds throughout: the capacity.
fn memory_limit(config: &ReplayConfig, workload: &cachealloc::trace::Workload) -> Option<u64> {
    let allowed = config.total().and_then(|total| {
        let fraction = workload.fraction_throughout(config.settings.per_process_memory_fraction)?;
        cachealloc::pool::allowed_maximum(fraction, total)
    });
    match (config.capacity, allowed) {
        (Some(capacity), Some(allowed)) => Some(capacity.min(allowed)),
        (capacity, allowed) => capacity.or(allowed),
    }
}

/// Warn about a fraction limit on an unlimited device: `per_process_memory_fraction` limits the
/// pool to a fraction of the device's total (its memory, or its capacity, or in a faithful
/// replay the total the recording names or its reservations imply), which a replay with none of
/// them does not have. (The other settings that do nothing as set are warned about with the
/// configuration: `Config::value_warnings`.)
fn warn_fraction_without_memory(config: &ReplayConfig, workload: &cachealloc::trace::Workload) {
    // (A fraction of 0 allows nothing of any device: warned about with the configuration.)
    let limits = |fraction: f64| fraction > 0.0 && fraction < 1.0;
    let set_as_it_ran = workload.memory_fractions().any(limits);
    if config.total().is_none()
        && (limits(config.settings.per_process_memory_fraction) || set_as_it_ran)
    {
        say!(
            "cachealloc: warning: per_process_memory_fraction limits a fraction of the device's \
             memory, and this replay's device is unlimited: give --device-memory (or --capacity) for \
             the limit to apply"
        );
    }
}

/// After a replay that ran out of memory: the `max_split_size_mb` values that would have fit,
/// and the replay with expandable segments switched (on when this one ran without them, off
/// when with them).
fn fits_after_oom(
    out: &cachealloc::trace::ReplayOutcome,
    workload: &cachealloc::trace::Workload,
    config: &ReplayConfig,
    start: Option<&cachealloc::trace::StartLayout>,
) -> (Option<MaxSplitSearch>, Option<ExpandableTrial>) {
    let Some(first_oom) = out.first_oom.as_ref() else {
        return (None, None);
    };
    let search = search_after_oom(workload, config, start, first_oom);
    (
        Some(search),
        try_expandable_segments(workload, config, start),
    )
}

fn render(result: ReplayJson, json: bool) -> String {
    if json {
        result.to_json() + "\n"
    } else {
        result.to_text()
    }
}
