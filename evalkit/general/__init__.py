"""General tasks: any lm-evaluation-harness task or group on evalkit's engines (docs/general.md).
Nothing heavy is imported here: lm_eval and transformers load when a run starts.
"""

from evalkit.general.runner import GeneralBenchmark, GeneralSettings
from evalkit.general.tables import general_checkpoint_table

__all__ = ["GeneralBenchmark", "GeneralSettings", "general_checkpoint_table"]
