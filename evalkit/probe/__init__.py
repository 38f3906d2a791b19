"""The BF16 RoPE probe: the paper's Figure 1 measured on any Llama, Qwen2, Mistral or Gemma 3 checkpoint.

RoPE promises that shifting every position id by the same Δ changes no attention score. The
probe runs a text with position ids Δ..Δ+T−1 for Δ1 and for Δ2 and measures how far the
attention moves (Wang et al. 2024, arXiv 2411.13476, §3 and Figure 1):

  evalkit probe shift  --ckpt PATH [--texts FILE] [--seq 4096] [--n 50] [--delta2 16]
                       [--delta1 0,2,4,...,2000] [--dtypes bf16,fp32] [--rope cast,fp32]
                       [--random-init] [--out DIR]
      D(X, Δ1, Δ2) (Eq. 4) for each Δ1: Σ over layers, heads and key columns j of
      n_j Σ_i |ATTN_ij(Δ1) − ATTN_ij(Δ2)|, n_j = 1/(T − j + 1). Figure 1 left.
  evalkit probe tokens --ckpt PATH [same options; --delta1 defaults to 0]
      the same difference kept per key column j, and the first token's share. Figure 1 middle.
  evalkit probe length --ckpt PATH [--lengths 64,128,...,8192] [--delta1 0] [--delta2 16] [...]
      D_logit (Eq. 5) = (1/T) Σ_i Σ_(l,h) |A_i1(Δ1) − A_i1(Δ2)| of the pre-softmax logits
      A = q·k/sqrt(d) (scale included: the logit the softmax sees), per length. Figure 1 right.

Options: ProbeOptions (evalkit.probe.options) holds each with the paper's default and the way it
is checked; the texts and how they are cut are evalkit.probe.texts', the two RoPE variants
evalkit.probe.rope's. With --out DIR a run writes probe-<kind>.json (long-form rows + provenance +
summary), probe-<kind>.png/.svg (the panel) and probe-<kind>.md (key ratios and whether the
paper's observations hold for this checkpoint).

The CLI calls `run_probe(kind, ckpt, out_dir, texts=..., seq_len=..., n_texts=..., delta2=...,
delta1=..., dtypes=..., rope=..., random_init=..., lengths=..., seed=..., device=...,
progress=print_fn)`; every bad input raises `evalkit.errors.UserError` before a model loads.
"""

from importlib import import_module

from evalkit.probe.options import PAPER_DELTA1, PAPER_LENGTHS, PROBE_KINDS, ROPE_VARIANTS, ProbeOptions, ProbePlan

# The rest needs torch (and transformers when run): loaded on first use, so importing the
# options for a command line's --help stays fast.
_LAZY = {
    "PROBE_ATTENTION": "attention",
    "ShiftRecorder": "attention",
    "register_probe_attention": "attention",
    "ShiftMeasurement": "measure",
    "measure_shifts": "measure",
    "rope_precision": "rope",
    "summarise": "report",
    "summary_markdown": "report",
    "write_plots": "report",
    "run_probe": "run",
}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(import_module(f"evalkit.probe.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'evalkit.probe' has no attribute {name!r}")


__all__ = ["PAPER_DELTA1", "PAPER_LENGTHS", "PROBE_KINDS", "ROPE_VARIANTS", "ProbeOptions", "ProbePlan", *_LAZY]
