"""Text that needs no download: built-in English prose and a locally trained tokenizer."""

from evalkit.corpus.prose import prose_documents, prose_text
from evalkit.corpus.tokenizer import builtin_tokenizer, tokenizer_fingerprint

__all__ = ["builtin_tokenizer", "prose_documents", "prose_text", "tokenizer_fingerprint"]
