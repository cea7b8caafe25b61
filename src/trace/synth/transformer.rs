//! The `transformer` workload: training steps of a decoder-only transformer (GPT-2 small by
//! default) whose sequence length is drawn anew each step.
//!
//! The order of allocations and frees follows what an eager framework does:
//! - Setup: every weight (in `dtype_bytes`), then Adam's two fp32 moments per weight. These stay
//!   for the whole workload.
//! - Forward, per layer: layer-norm output and its fp32 mean/rstd (small), `qkv`, the attention
//!   scores (`batch·heads·seq²`, freed as soon as the softmax probabilities exist), the context,
//!   the residual sum (the projection output is a temporary), then the MLP (`4·hidden` wide,
//!   fc1 output and GELU output kept). Then the final norm, the logits and fp32 log-probabilities.
//! - Backward, layers in reverse: each saved activation is freed once the gradient that needs it
//!   exists; weight gradients are allocated when first produced and kept until the optimizer is
//!   done (`zero_grad(set_to_none=True)`).
//! - Optimizer: a 4-byte norm per gradient for clipping, then an fp32 temporary per weight for the
//!   Adam update, then every gradient is freed.
//!
//! Activation sizes scale with the step's sequence length (scores with its square), while biases,
//! norm statistics and scalars stay under 1 MiB: a changing mix of large blocks interleaved with
//! small ones, which is what fragments a caching pool across steps.

use super::params::{check, range, unknown, whole};
use super::{MAX_OPS, SynthError};
use crate::pool::StreamId;
use crate::pool::rounding::MAX_REQUEST;
use crate::trace::rng::SplitMix64;
use crate::trace::workload::{AllocId, Op, Workload};

/// Parameters of the `transformer` workload.
#[derive(Clone, Debug, PartialEq)]
pub struct TransformerParams {
    /// Transformer blocks.
    pub layers: u32,
    /// Model width (elements).
    pub hidden: u64,
    /// Attention heads; must divide `hidden`.
    pub heads: u64,
    /// Vocabulary size (embedding rows and logits width).
    pub vocab: u64,
    /// Sequences per step.
    pub batch: u64,
    /// Each step's sequence length is drawn uniformly from `seq_min..=seq_max` (tokens).
    pub seq_min: u64,
    pub seq_max: u64,
    /// Training steps.
    pub steps: u32,
    /// Bytes per element of weights and activations (2 = bf16/fp16).
    pub dtype_bytes: u64,
}

impl Default for TransformerParams {
    /// GPT-2 small at batch 4 and 128–1024 tokens: about 55k operations, peaking near 5 GiB.
    fn default() -> Self {
        Self {
            layers: 12,
            hidden: 768,
            heads: 12,
            vocab: 50257,
            batch: 4,
            seq_min: 128,
            seq_max: 1024,
            steps: 32,
            dtype_bytes: 2,
        }
    }
}

/// Operations generated, counted: 12 once, 36 per layer (weights and optimizer state), 54 per
/// step and 128 per layer and step; none of these depends on sizes. `most_ops` rounds each up.
const OPS_BOUND: [u64; 4] = [16, 40, 60, 130];

/// Bytes of an fp32 element (optimizer state, norm statistics, log-probabilities).
const FP32: u64 = 4; // bytes
/// Bytes of a token id (int64).
const TOKEN: u64 = 8; // bytes

impl TransformerParams {
    /// Each parameter's key with what it sets and its default, for the command line's help.
    pub fn described() -> Vec<(&'static str, String)> {
        let d = Self::default();
        vec![
            ("layers", format!("transformer blocks ({})", d.layers)),
            ("hidden", format!("model width in elements ({})", d.hidden)),
            (
                "heads",
                format!("attention heads, dividing hidden ({})", d.heads),
            ),
            ("vocab", format!("vocabulary size ({})", d.vocab)),
            ("batch", format!("sequences per step ({})", d.batch)),
            (
                "seq",
                format!(
                    "each step's sequence length in tokens, drawn from LO-HI, or one length \
                     ({}-{})",
                    d.seq_min, d.seq_max
                ),
            ),
            ("steps", format!("training steps ({})", d.steps)),
            (
                "dtype_bytes",
                format!(
                    "bytes per element of weights and activations ({}: bf16/fp16)",
                    d.dtype_bytes
                ),
            ),
        ]
    }

    pub(super) fn set(&mut self, key: &str, value: &str) -> Result<(), SynthError> {
        let small = |v: u64| {
            u32::try_from(v).map_err(|_| {
                SynthError(format!(
                    "transformer parameter {key}={v} is too large (at most {})",
                    u32::MAX
                ))
            })
        };
        match key {
            "layers" => self.layers = small(whole(key, value)?)?,
            "hidden" => self.hidden = whole(key, value)?,
            "heads" => self.heads = whole(key, value)?,
            "vocab" => self.vocab = whole(key, value)?,
            "batch" => self.batch = whole(key, value)?,
            "seq" => (self.seq_min, self.seq_max) = range(key, value)?,
            "steps" => self.steps = small(whole(key, value)?)?,
            "dtype_bytes" => self.dtype_bytes = whole(key, value)?,
            _ => return Err(unknown("transformer", key, &Self::described())),
        }
        Ok(())
    }

    /// The workload for `seed` with its step boundaries (`SynthSpec::generate` gives the
    /// workload alone).
    pub fn generate(&self, seed: u64) -> Result<TransformerWorkload, SynthError> {
        self.validate()?;
        Ok(generate(self, seed))
    }

    pub(super) fn validate(&self) -> Result<(), SynthError> {
        let positive = [
            ("layers", self.layers as u64),
            ("hidden", self.hidden),
            ("heads", self.heads),
            ("vocab", self.vocab),
            ("batch", self.batch),
        ];
        for (name, value) in positive {
            check(value > 0, || {
                format!("transformer {name} must be at least 1")
            })?;
        }
        check(self.hidden.is_multiple_of(self.heads), || {
            format!(
                "transformer heads={} must divide hidden={}",
                self.heads, self.hidden
            )
        })?;
        check(self.seq_min >= 1 && self.seq_min <= self.seq_max, || {
            format!(
                "transformer seq={}-{}: need 1 <= min <= max",
                self.seq_min, self.seq_max
            )
        })?;
        check(matches!(self.dtype_bytes, 1 | 2 | 4 | 8), || {
            format!(
                "transformer dtype_bytes={} must be 1, 2, 4 or 8",
                self.dtype_bytes
            )
        })?;
        check(
            self.largest_tensor().is_some_and(|b| b < MAX_REQUEST),
            || "transformer parameters make a tensor of 1 EiB or more".into(),
        )?;
        let ops = self.most_ops();
        check(ops <= MAX_OPS, || {
            format!(
                "transformer layers={} and steps={} make up to {ops} operations, more than a \
                 synthetic workload may have (at most {MAX_OPS}): use fewer layers or steps",
                self.layers, self.steps
            )
        })
    }

    /// An upper bound on the number of operations (see `OPS_BOUND`).
    fn most_ops(&self) -> u64 {
        // In 128 bits: u32 layers and steps cannot overflow it.
        let (layers, steps) = (u128::from(self.layers), u128::from(self.steps));
        let [once, per_layer, per_step, per_layer_step] = OPS_BOUND.map(u128::from);
        let ops = once + per_layer * layers + steps * (per_step + per_layer_step * layers);
        u64::try_from(ops).unwrap_or(u64::MAX)
    }

    /// The largest tensor at `seq_max` in bytes, or `None` on overflow: activations in
    /// `dtype_bytes`, what is also kept in fp32 (log-probabilities, Adam's moments and updates)
    /// in the wider of the two, token ids in 8 bytes. Every other size is a product of no
    /// larger factors, so generation cannot overflow once this fits.
    fn largest_tensor(&self) -> Option<u64> {
        let (b, s, h, dt) = (self.batch, self.seq_max, self.hidden, self.dtype_bytes);
        let wide = dt.max(FP32);
        let tokens = b.checked_mul(s)?;
        let scores = b.checked_mul(self.heads)?.checked_mul(s)?.checked_mul(s)?;
        let mlp = tokens.checked_mul(h)?.checked_mul(4)?;
        let logits = tokens.checked_mul(self.vocab)?;
        let embedding = self.vocab.checked_mul(h)?;
        let fc_weight = h.checked_mul(h)?.checked_mul(4)?;
        let position = s.checked_mul(h)?;
        [
            scores.checked_mul(dt)?,
            mlp.checked_mul(dt)?,
            logits.checked_mul(wide)?,
            embedding.checked_mul(wide)?,
            fc_weight.checked_mul(wide)?,
            position.checked_mul(wide)?,
            tokens.checked_mul(TOKEN)?,
        ]
        .into_iter()
        .max()
    }

    /// Element counts of every weight: embeddings and final norm, then each layer's.
    fn weight_numels(&self) -> Vec<u64> {
        let h = self.hidden;
        let mut numels = vec![self.vocab * h, self.seq_max * h, h, h];
        for _ in 0..self.layers {
            numels.extend(LayerWeight::ALL.map(|w| w.numel(h)));
        }
        numels
    }
}

/// The weights of one transformer block, in the order they are stored.
#[derive(Clone, Copy)]
enum LayerWeight {
    Ln1W,
    Ln1B,
    QkvW,
    QkvB,
    ProjW,
    ProjB,
    Ln2W,
    Ln2B,
    Fc1W,
    Fc1B,
    Fc2W,
    Fc2B,
}

impl LayerWeight {
    const ALL: [LayerWeight; 12] = [
        Self::Ln1W,
        Self::Ln1B,
        Self::QkvW,
        Self::QkvB,
        Self::ProjW,
        Self::ProjB,
        Self::Ln2W,
        Self::Ln2B,
        Self::Fc1W,
        Self::Fc1B,
        Self::Fc2W,
        Self::Fc2B,
    ];

    fn numel(self, h: u64) -> u64 {
        match self {
            Self::Ln1W | Self::Ln1B | Self::ProjB | Self::Ln2W | Self::Ln2B | Self::Fc2B => h,
            Self::QkvB => 3 * h,
            Self::Fc1B => 4 * h,
            Self::ProjW => h * h,
            Self::QkvW => 3 * h * h,
            Self::Fc1W | Self::Fc2W => 4 * h * h,
        }
    }
}

/// Index of the global weights in `weight_numels`.
const WTE: usize = 0;
const WPE: usize = 1;
const LNF_W: usize = 2;
const LNF_B: usize = 3;
const GLOBAL_WEIGHTS: usize = 4;

/// A generated transformer workload with its step structure.
#[derive(Clone, Debug, PartialEq)]
pub struct TransformerWorkload {
    pub workload: Workload,
    /// Allocations made during setup that stay live: weights and optimizer state.
    pub persistent: usize,
    /// Index in `workload.ops` of each step's first op.
    pub step_starts: Vec<usize>,
}

/// Emits ops with fresh dense ids.
struct Emitter {
    workload: Workload,
    stream: StreamId,
}

impl Emitter {
    fn alloc(&mut self, size: u64) -> AllocId {
        let id = self.workload.num_ids;
        self.workload.num_ids += 1;
        self.workload.ops.push(Op::Alloc {
            id,
            size,
            stream: self.stream,
            recorded_addr: None,
        });
        id
    }

    fn free(&mut self, id: AllocId) {
        self.workload.ops.push(Op::Free { id });
    }
}

/// Activations one layer saves in the forward pass for its backward pass.
struct Saved {
    input: AllocId,
    ln1: [AllocId; 3],
    qkv: AllocId,
    probs: AllocId,
    ctx: AllocId,
    resid: AllocId,
    ln2: [AllocId; 3],
    fc1: AllocId,
    gelu: AllocId,
}

/// Generate the workload (parameters already validated).
pub(super) fn generate(p: &TransformerParams, seed: u64) -> TransformerWorkload {
    let mut rng = SplitMix64::new(seed);
    let mut e = Emitter {
        workload: Workload::new(format!("synth:transformer seed={seed}")),
        stream: StreamId(0),
    };
    let dt = p.dtype_bytes;
    let numels = p.weight_numels();
    for &n in &numels {
        e.alloc(n * dt);
    }
    for &n in &numels {
        e.alloc(n * FP32); // exp_avg
        e.alloc(n * FP32); // exp_avg_sq
    }
    let persistent = e.workload.ops.len();

    let mut step_starts = Vec::with_capacity(p.steps as usize);
    for _ in 0..p.steps {
        step_starts.push(e.workload.ops.len());
        let seq = rng.between(p.seq_min, p.seq_max);
        step(&mut e, p, &numels, seq);
    }
    TransformerWorkload {
        workload: e.workload,
        persistent,
        step_starts,
    }
}

/// One training step at sequence length `seq`: forward, backward, optimizer.
fn step(e: &mut Emitter, p: &TransformerParams, numels: &[u64], seq: u64) {
    let dt = p.dtype_bytes;
    let tokens = p.batch * seq;
    let act = tokens * p.hidden * dt; // one hidden-wide activation
    let stat = tokens * FP32; // layer-norm mean or rstd
    let scores = p.batch * p.heads * seq * seq * dt;
    let logits = tokens * p.vocab;
    let norm = |e: &mut Emitter| [e.alloc(act), e.alloc(stat), e.alloc(stat)];
    // Layer-norm backward: the gradient through the norm from `upstream` (freed once used),
    // freeing the norm's saved output and statistics; returns the gradient of its input.
    let norm_backward = |e: &mut Emitter, upstream: AllocId, saved: [AllocId; 3]| {
        let g_out = e.alloc(act);
        e.free(upstream);
        e.free(saved[0]);
        let g_in = e.alloc(act);
        e.free(g_out);
        e.free(saved[1]);
        e.free(saved[2]);
        g_in
    };

    // Forward.
    let ids = e.alloc(tokens * TOKEN);
    let mut x = e.alloc(act); // token + position embedding
    let mut saved = Vec::with_capacity(p.layers as usize);
    for _ in 0..p.layers {
        let ln1 = norm(e);
        let qkv = e.alloc(3 * act);
        let raw_scores = e.alloc(scores);
        let probs = e.alloc(scores);
        e.free(raw_scores);
        let ctx = e.alloc(act);
        let proj = e.alloc(act);
        let resid = e.alloc(act);
        e.free(proj);
        let ln2 = norm(e);
        let fc1 = e.alloc(4 * act);
        let gelu = e.alloc(4 * act);
        let mlp = e.alloc(act);
        let out = e.alloc(act);
        e.free(mlp);
        saved.push(Saved {
            input: x,
            ln1,
            qkv,
            probs,
            ctx,
            resid,
            ln2,
            fc1,
            gelu,
        });
        x = out;
    }
    let lnf = norm(e);
    let logits_id = e.alloc(logits * dt);
    let log_probs = e.alloc(logits * FP32);
    let loss = e.alloc(FP32);

    // Backward.
    let mut grads: Vec<Option<AllocId>> = vec![None; numels.len()];
    let mut grad = |e: &mut Emitter, w: usize| grads[w] = Some(e.alloc(numels[w] * dt));
    let g_loss = e.alloc(FP32);
    let g_log_probs = e.alloc(logits * FP32);
    e.free(g_loss);
    e.free(log_probs);
    let g_logits = e.alloc(logits * dt);
    e.free(g_log_probs);
    e.free(logits_id);
    grad(e, WTE); // tied language-model head
    let mut g = norm_backward(e, g_logits, lnf);
    e.free(x);
    grad(e, LNF_W);
    grad(e, LNF_B);
    for (layer, s) in saved.into_iter().enumerate().rev() {
        let w = |lw: LayerWeight| GLOBAL_WEIGHTS + layer * LayerWeight::ALL.len() + lw as usize;
        // MLP.
        grad(e, w(LayerWeight::Fc2W));
        grad(e, w(LayerWeight::Fc2B));
        let g_gelu = e.alloc(4 * act);
        e.free(s.gelu);
        let g_fc1 = e.alloc(4 * act);
        e.free(g_gelu);
        e.free(s.fc1);
        grad(e, w(LayerWeight::Fc1W));
        grad(e, w(LayerWeight::Fc1B));
        let g_norm2 = norm_backward(e, g_fc1, s.ln2);
        grad(e, w(LayerWeight::Ln2W));
        grad(e, w(LayerWeight::Ln2B));
        let g_resid = e.alloc(act);
        e.free(g_norm2);
        e.free(g);
        e.free(s.resid);
        // Attention.
        grad(e, w(LayerWeight::ProjW));
        grad(e, w(LayerWeight::ProjB));
        let g_ctx = e.alloc(act);
        let g_probs = e.alloc(scores);
        e.free(s.ctx);
        let g_scores = e.alloc(scores);
        e.free(g_probs);
        e.free(s.probs);
        let g_qkv = e.alloc(3 * act);
        e.free(g_scores);
        e.free(g_ctx);
        e.free(s.qkv);
        grad(e, w(LayerWeight::QkvW));
        grad(e, w(LayerWeight::QkvB));
        let g_norm1 = norm_backward(e, g_qkv, s.ln1);
        grad(e, w(LayerWeight::Ln1W));
        grad(e, w(LayerWeight::Ln1B));
        let g_input = e.alloc(act);
        e.free(g_norm1);
        e.free(g_resid);
        e.free(s.input);
        g = g_input;
    }
    grad(e, WPE);
    e.free(g);
    e.free(ids);
    e.free(loss);

    // Optimizer: clip by global norm, then one Adam update per weight.
    let grads: Vec<AllocId> = grads.into_iter().flatten().collect();
    let norms: Vec<AllocId> = grads.iter().map(|_| e.alloc(FP32)).collect();
    let total = e.alloc(FP32);
    for n in norms {
        e.free(n);
    }
    let clip = e.alloc(FP32);
    e.free(total);
    e.free(clip);
    for &n in numels {
        let update = e.alloc(n * FP32);
        e.free(update);
    }
    for g in grads {
        e.free(g);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::rounding::SMALL_SIZE;

    /// The bound that refuses oversized specs holds for every shape: it is what keeps a
    /// refused spec from being one that would have fit.
    #[test]
    fn most_ops_bounds_the_operations_generated() {
        for (layers, steps, batch, seq) in [
            (1, 1, 1, 1),
            (2, 3, 4, 64),
            (12, 2, 8, 2048),
            (40, 1, 1, 16),
            (24, 8, 2, 32),
        ] {
            let p = TransformerParams {
                layers,
                steps,
                batch,
                seq_min: seq,
                seq_max: seq,
                ..TransformerParams::default()
            };
            let ops = generate(&p, 1).workload.ops.len() as u64;
            assert!(
                ops <= p.most_ops(),
                "{layers} layers, {steps} steps: {ops} ops"
            );
            assert!(
                ops * 10 > p.most_ops() * 9,
                "bound too loose: {ops} vs {}",
                p.most_ops()
            );
        }
        for spec in [
            "transformer:layers=100000",
            // 130 · layers · steps wraps around 2^64 to about 1.7 million.
            "transformer:layers=4294922792,steps=33038552",
            "transformer:layers=4294967295,steps=4294967295",
        ] {
            let err = spec.parse::<crate::trace::synth::SynthSpec>().unwrap_err();
            assert!(err.0.contains("at most 10000000"), "{spec}: {err}");
        }
    }

    fn tiny() -> TransformerParams {
        TransformerParams {
            layers: 2,
            hidden: 64,
            heads: 4,
            vocab: 1000,
            batch: 2,
            seq_min: 16,
            seq_max: 256,
            steps: 6,
            dtype_bytes: 2,
        }
    }

    /// Replays ids, checking each free names a live id; returns the peak of live bytes.
    fn check_frees(w: &Workload, mut at_step: impl FnMut(usize, &[Option<u64>])) -> u64 {
        let mut live = vec![None; w.num_ids as usize];
        let (mut bytes, mut peak) = (0u64, 0u64);
        for (i, op) in w.ops.iter().enumerate() {
            at_step(i, &live);
            match *op {
                Op::Alloc { id, size, .. } => {
                    assert!(live[id as usize].replace(size).is_none(), "id {id} reused");
                    bytes += size;
                    peak = peak.max(bytes);
                }
                Op::Free { id } => {
                    bytes -= live[id as usize]
                        .take()
                        .unwrap_or_else(|| panic!("op {i} frees dead id {id}"));
                }
                _ => panic!("unexpected op {op:?}"),
            }
        }
        at_step(w.ops.len(), &live);
        peak
    }

    #[test]
    fn same_seed_same_ops_different_seed_different_ops() {
        let p = tiny();
        assert_eq!(generate(&p, 5).workload, generate(&p, 5).workload);
        assert_ne!(generate(&p, 5).workload.ops, generate(&p, 6).workload.ops);
    }

    #[test]
    fn each_step_frees_everything_it_allocates_and_weights_stay() {
        let p = tiny();
        let out = generate(&p, 11);
        let persistent = out.persistent as u32;
        assert_eq!(out.persistent, p.weight_numels().len() * 3);
        assert_eq!(out.step_starts.len(), p.steps as usize);
        let mut boundaries = out.step_starts.clone();
        boundaries.push(out.workload.ops.len());
        check_frees(&out.workload, |i, live| {
            if boundaries.contains(&i) {
                let live_ids: Vec<u32> = (0..live.len() as u32)
                    .filter(|&id| live[id as usize].is_some())
                    .collect();
                assert_eq!(
                    live_ids,
                    (0..persistent).collect::<Vec<_>>(),
                    "at op {i} only weights and optimizer state may be live"
                );
            }
        });
    }

    #[test]
    fn sequence_lengths_vary_and_sizes_mix_small_and_large() {
        let out = generate(&TransformerParams::default(), 1);
        let w = &out.workload;
        let step_sizes = |k: usize| -> Vec<u64> {
            let end = out.step_starts.get(k + 1).copied().unwrap_or(w.ops.len());
            w.ops[out.step_starts[k]..end]
                .iter()
                .filter_map(|op| match op {
                    Op::Alloc { size, .. } => Some(*size),
                    _ => None,
                })
                .collect()
        };
        let first = step_sizes(0);
        let small = first.iter().filter(|&&s| s <= SMALL_SIZE).count();
        let large = first.len() - small;
        assert!(small > 100 && large > 100, "{small} small, {large} large");
        // Attention scores differ between steps because the sequence length does.
        let largest: Vec<u64> = (0..out.step_starts.len())
            .map(|k| step_sizes(k).into_iter().max().unwrap())
            .collect();
        let mut distinct = largest.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert!(distinct.len() > largest.len() / 2, "{largest:?}");
    }

    #[test]
    fn default_peaks_at_a_few_gib() {
        let out = generate(&TransformerParams::default(), 1);
        let peak = check_frees(&out.workload, |_, _| {});
        assert!(
            (2u64 << 30..8 << 30).contains(&peak),
            "peak {peak} bytes is not a few GiB"
        );
        assert!(
            out.workload.ops.len() < 200_000,
            "{} ops",
            out.workload.ops.len()
        );
    }

    /// Each op of `ops` as `A size` or `F size` (the size of the allocation it frees).
    fn sizes(w: &Workload, ops: std::ops::Range<usize>) -> Vec<(char, u64)> {
        let mut size_of = vec![0; w.num_ids as usize];
        let mut out = Vec::new();
        for (i, op) in w.ops.iter().enumerate() {
            let entry = match *op {
                Op::Alloc { id, size, .. } => {
                    size_of[id as usize] = size;
                    ('A', size)
                }
                Op::Free { id } => ('F', size_of[id as usize]),
                _ => unreachable!(),
            };
            if ops.contains(&i) {
                out.push(entry);
            }
        }
        out
    }

    /// `A name F name ...` with each name's size from `size`.
    fn expected(text: &str, size: impl Fn(&str) -> u64) -> Vec<(char, u64)> {
        let mut out = Vec::new();
        for token in text.split_whitespace() {
            let (kind, name) = token.split_at(1);
            let kind = kind.chars().next().unwrap();
            out.push((kind, size(name)));
        }
        out
    }

    /// Setup: every weight in `dtype_bytes` (embeddings, final norm, then each layer's twelve),
    /// then Adam's two fp32 moments per weight.
    #[test]
    fn setup_allocates_the_weights_then_two_fp32_moments_each() {
        let p = TransformerParams {
            layers: 2,
            dtype_bytes: 1,
            ..tiny()
        };
        let (h, v, s) = (p.hidden, p.vocab, p.seq_max);
        let layer = [
            h,
            h,
            3 * h * h,
            3 * h,
            h * h,
            h,
            h,
            h,
            4 * h * h,
            4 * h,
            4 * h * h,
            h,
        ];
        let mut numels = vec![v * h, s * h, h, h];
        numels.extend(layer);
        numels.extend(layer);
        let mut want: Vec<(char, u64)> = numels.iter().map(|&n| ('A', n)).collect();
        want.extend(numels.iter().flat_map(|&n| [('A', 4 * n), ('A', 4 * n)]));
        let out = generate(&p, 1);
        assert_eq!(sizes(&out.workload, 0..out.persistent), want);
    }

    /// One training step (one layer, a fixed sequence length), op by op as the module doc
    /// describes it: sizes follow the batch, the sequence length (scores its square), the width,
    /// the heads and the vocabulary, and each activation is freed where it says.
    #[test]
    fn a_step_allocates_and_frees_as_documented() {
        let p = TransformerParams {
            layers: 1,
            seq_min: 32,
            seq_max: 32,
            steps: 1,
            ..tiny()
        };
        let (b, s, h, dt) = (p.batch, 32, p.hidden, p.dtype_bytes);
        let tokens = b * s;
        let act = tokens * h * dt;
        let size = |name: &str| match name {
            "ids" => tokens * 8,
            "act" => act,
            "act3" => 3 * act,
            "act4" => 4 * act,
            "stat" => tokens * 4,
            "scores" => b * p.heads * s * s * dt,
            "logits" => tokens * p.vocab * dt,
            "logits32" => tokens * p.vocab * 4,
            "f32" => 4,
            "g_wte" => p.vocab * h * dt,
            "g_wpe" => p.seq_max * h * dt,
            "g_h" => h * dt,
            "g_3h" => 3 * h * dt,
            "g_4h" => 4 * h * dt,
            "g_hh" => h * h * dt,
            "g_3hh" => 3 * h * h * dt,
            "g_4hh" => 4 * h * h * dt,
            _ => panic!("{name}"),
        };
        let forward = "Aids Aact \
            Aact Astat Astat Aact3 Ascores Ascores Fscores Aact Aact Aact Fact \
            Aact Astat Astat Aact4 Aact4 Aact Aact Fact \
            Aact Astat Astat Alogits Alogits32 Af32";
        let backward = "Af32 Alogits32 Ff32 Flogits32 Alogits Flogits32 Flogits Ag_wte \
            Aact Flogits Fact Aact Fact Fstat Fstat Fact Ag_h Ag_h \
            Ag_4hh Ag_h Aact4 Fact4 Aact4 Fact4 Fact4 Ag_4hh Ag_4h \
            Aact Fact4 Fact Aact Fact Fstat Fstat Ag_h Ag_h \
            Aact Fact Fact Fact Ag_hh Ag_h \
            Aact Ascores Fact Ascores Fscores Fscores Aact3 Fscores Fact Fact3 Ag_3hh Ag_3h \
            Aact Fact3 Fact Aact Fact Fstat Fstat Ag_h Ag_h \
            Aact Fact Fact Fact Ag_wpe Fact Fids Ff32";
        let out = generate(&p, 1);
        let w = &out.workload;
        let start = out.step_starts[0];
        let want: Vec<(char, u64)> = expected(&format!("{forward} {backward}"), size);
        assert_eq!(sizes(w, start..start + want.len()), want);

        // The optimizer: a 4-byte norm per gradient, their total, then the clip factor; an fp32
        // temporary per weight for the update; then every gradient is freed, in weight order.
        let numels = p.weight_numels();
        let n = numels.len();
        let mut tail = vec![('A', 4); n + 1];
        tail.extend(vec![('F', 4); n]);
        tail.extend([('A', 4), ('F', 4), ('F', 4)]);
        tail.extend(numels.iter().flat_map(|&k| [('A', 4 * k), ('F', 4 * k)]));
        tail.extend(numels.iter().map(|&k| ('F', k * dt)));
        let end = w.ops.len();
        assert_eq!(sizes(w, end - tail.len()..end), tail);
        assert_eq!(
            start + want.len() + tail.len(),
            end,
            "ops between backward and optimizer"
        );
    }

    /// Each step's sequence length is drawn from the whole range, both ends included (the
    /// token ids, a step's first allocation, hold 8 bytes per token).
    #[test]
    fn sequence_lengths_cover_the_range_with_its_ends() {
        let p = TransformerParams {
            layers: 1,
            seq_min: 16,
            seq_max: 19,
            steps: 40,
            ..tiny()
        };
        let out = generate(&p, 2);
        let mut seen: Vec<u64> = out
            .step_starts
            .iter()
            .map(|&at| match out.workload.ops[at] {
                Op::Alloc { size, .. } => size / (8 * p.batch),
                ref op => panic!("a step starts with {op:?}"),
            })
            .collect();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen, [16, 17, 18, 19]);
    }

    /// A tensor of 1 EiB or more is refused (the pool would refuse the request), for each kind
    /// of tensor that can grow there, and one just under it is not.
    #[test]
    fn tensors_of_1_eib_are_refused_at_the_boundary() {
        let tensor = "transformer parameters make a tensor of 1 EiB or more";
        let err = |s: &str| {
            s.parse::<crate::trace::synth::SynthSpec>()
                .err()
                .map(|e| e.0)
        };
        let pairs = [
            // Attention scores, batch·heads·seq² elements of 8 bytes: 2^57 · 8 bytes.
            (
                "hidden=1,heads=1,vocab=1,seq=1048576,dtype_bytes=8",
                "batch=131072",
                "batch=131071",
            ),
            // Logits, batch·seq·vocab elements.
            (
                "hidden=1,heads=1,seq=1,batch=1048576,dtype_bytes=8",
                "vocab=137438953472",
                "vocab=137438953471",
            ),
            // The token embedding, vocab·hidden elements.
            (
                "heads=1,seq=1,batch=1,hidden=1048576,dtype_bytes=8",
                "vocab=137438953472",
                "vocab=137438953471",
            ),
            // In one-byte elements the attention scores reach 1 EiB at 2^60 elements, not at
            // the 2^57 of eight-byte ones.
            (
                "hidden=1,heads=1,vocab=1,seq=1048576,dtype_bytes=1",
                "batch=1048576",
                "batch=1048575",
            ),
            // Token ids are eight bytes whatever the activations' type: 2^57 tokens.
            (
                "hidden=1,heads=1,vocab=1,seq=1,dtype_bytes=1",
                "batch=144115188075855872",
                "batch=144115188075855871",
            ),
        ];
        for (shape, refused, taken) in pairs {
            let spec = |last: &str| format!("transformer:layers=1,{shape},{last}");
            assert_eq!(
                err(&spec(refused)).as_deref(),
                Some(tensor),
                "{shape},{refused}"
            );
            assert_eq!(err(&spec(taken)), None, "{shape},{taken}");
        }
        // In bf16 the embedding is half that, but its Adam moments are fp32: 2^58 · 4 bytes.
        let moments = "transformer:layers=1,heads=1,seq=1,batch=1,hidden=1048576,dtype_bytes=2,\
                       vocab=274877906944";
        assert_eq!(err(moments).as_deref(), Some(tensor));
    }

    #[test]
    fn validation_catches_impossible_shapes() {
        let bad = |f: fn(&mut TransformerParams)| {
            let mut p = TransformerParams::default();
            f(&mut p);
            p.validate().unwrap_err().0
        };
        assert!(bad(|p| p.heads = 5).contains("divide"));
        assert!(bad(|p| p.dtype_bytes = 3).contains("dtype_bytes"));
        assert!(bad(|p| p.batch = 0).contains("batch"));
        assert!(bad(|p| p.seq_max = u64::MAX / 2).contains("1 EiB"));
        assert!(TransformerParams::default().validate().is_ok());
    }
}
