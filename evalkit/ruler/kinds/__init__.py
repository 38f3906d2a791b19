"""RULER's generators, one per task kind, and the module constants each one's data depends on.

A task (spec.py) names its kind; the kind names the module and class that generate its samples
and the constants in that module that shape them (needle depths, hop counts, noise words). Those
constants are part of the cache key (cache.py): change one and cached samples of that kind are
regenerated, never served stale.

Adding a task:
- of an existing kind: one TaskSpec in spec.py (its params are keyed into the cache already);
- of a new kind: a module with a generator class (built with a Context; see kinds/niah.py) and a
  DATA_CONSTANTS dict of every module-level value its samples depend on, its template in
  spec.TEMPLATES, and one TaskKind below. tests/ruler/test_kinds.py checks that every kind is
  registered and keyed.
"""

from __future__ import annotations

import hashlib
import importlib
import json
from dataclasses import dataclass
from types import ModuleType


@dataclass(frozen=True)
class TaskKind:
    name: str
    module: str  # imported on first use
    generator: str  # the class in `module` that makes samples from a Context


KINDS = {
    kind.name: kind
    for kind in (
        TaskKind("niah", "evalkit.ruler.kinds.niah", "NiahTask"),
        TaskKind("variable_tracking", "evalkit.ruler.kinds.vt", "VariableTrackingTask"),
        TaskKind("common_words_extraction", "evalkit.ruler.kinds.cwe", "CommonWordsTask"),
        TaskKind("freq_words_extraction", "evalkit.ruler.kinds.fwe", "FrequentWordsTask"),
        TaskKind("qa", "evalkit.ruler.kinds.qa", "QaTask"),
    )
}

# The digest of each kind's DATA_CONSTANTS when they joined the cache key (generator version 1).
# A kind whose constants still hash to this adds nothing to its keys, so the keys of samples
# cached (and of results stored) before keep holding; any change to a constant changes the key.
CONSTANTS_DIGESTS_AT_V1 = {
    "niah": "9b9eaabb348075487834",
    "variable_tracking": "3c4f239107f719801d88",
    "common_words_extraction": "ba6be521d78352c1c89f",
    "freq_words_extraction": "423643e8daa21558084d",
    "qa": "fefe1b66693c666a44d0",
}


def _module(kind: str) -> ModuleType:
    return importlib.import_module(KINDS[kind].module)


def generator_class(kind: str) -> type:
    """The class that generates samples of this kind."""
    return getattr(_module(kind), KINDS[kind].generator)


def constants_digest(kind: str) -> str:
    """A hash of the module constants that shape this kind's samples."""
    constants = _module(kind).DATA_CONSTANTS
    return hashlib.sha256(json.dumps(constants, sort_keys=True, default=repr).encode()).hexdigest()[:20]


def changed_constants_digest(kind: str) -> str | None:
    """constants_digest(kind) if it differs from the one recorded at version 1, else None."""
    digest = constants_digest(kind)
    return None if digest == CONSTANTS_DIGESTS_AT_V1[kind] else digest
