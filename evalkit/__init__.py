"""evalkit: evaluation harness for long-context training under the paper's attention paradigms."""

__version__ = "0.1.0"
