"""The BF16 RoPE probe: the paper's Figure 1 measured on any Llama, Qwen2, Mistral or Gemma 3 checkpoint.

RoPE promises that shifting every position id by the same Δ changes no attention score; the
probe measures how far attention moves when it does (Wang et al. 2024, arXiv 2411.13476, §3).
`run_probe(kind, ckpt, out_dir, **options)` runs one kind (ProbeOptions' fields; a bad one is a
UserError before a model loads); what each kind measures and writes is docs/probe.md's.
"""

from importlib import import_module

# They need torch (and transformers when run): loaded on first use, so importing the options
# (probe.options) for a command line's --help stays fast.
_LAZY = {
    "PROBE_ATTENTION": "attention",
    "register_probe_attention": "attention",
    "measure_shifts": "measure",
    "rope_precision": "measure",
    "summarise": "report",
    "summary_markdown": "report",
    "write_plots": "report",
    "run_probe": "run",
}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(import_module(f"evalkit.probe.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'evalkit.probe' has no attribute {name!r}")


__all__ = list(_LAZY)
