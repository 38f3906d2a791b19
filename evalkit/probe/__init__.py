"""The BF16 RoPE probe: the paper's Figure 1 measured on any Llama, Qwen2, Mistral or Gemma 3 checkpoint.

RoPE promises that shifting every position id by the same Δ changes no attention score. The
probe runs a text with position ids Δ..Δ+T−1 for Δ1 and for Δ2 and measures how far the
attention moves (Wang et al. 2024, arXiv 2411.13476, §3 and Figure 1; the formulas are
evalkit.probe.measure's):

- `evalkit probe shift`: D(X, Δ1, Δ2) (Eq. 4) for each Δ1. Figure 1 left.
- `evalkit probe tokens`: the same kept per key column j, and the first token's share. Figure 1 middle.
- `evalkit probe length`: D_logit (Eq. 5), the first key's logit difference, per length. Figure 1 right.

The CLI calls `run_probe(kind, ckpt, out_dir, progress=print_fn, **options)`, the options being
ProbeOptions' fields (each with the paper's default; a bad one is a UserError before a model
loads). It writes probe-<kind>.json (rows, provenance, summary), probe-<kind>.png/.svg (the
panel) and probe-<kind>.md (key ratios and whether the paper's observations hold).
"""

from importlib import import_module

from evalkit.probe.options import PAPER_DELTA1, PAPER_LENGTHS, PROBE_KINDS, ROPE_VARIANTS, ProbeOptions, ProbePlan

# The rest needs torch (and transformers when run): loaded on first use, so importing the
# options for a command line's --help stays fast.
_LAZY = {
    "PROBE_ATTENTION": "attention",
    "register_probe_attention": "attention",
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
