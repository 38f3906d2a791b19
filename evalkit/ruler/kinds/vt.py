"""Variable tracking (vt): a chain `VAR A = 12345`, `VAR B = VAR A `, ... hidden in noise lines.

NVIDIA's variable_tracking.py puts one demonstration before the question: the same task with
3-letter names, its noise sized so its prompt fits 500 tokens, answered. With a small-vocabulary
tokenizer even 5 noise lines exceed 500 tokens and NVIDIA's loop never ends; evalkit then keeps
the 5-line minimum and reports TaskDoesNotFit if the whole sample cannot fit the length.
"""

from __future__ import annotations

import random
import string

from evalkit.ruler.context import Context
from evalkit.ruler.counting import Item, compose_count
from evalkit.ruler.fitting import Coarse, search
from evalkit.ruler.kinds import KindPlan, KindTask
from evalkit.ruler.layout import RepeatedLine, stream_items
from evalkit.ruler.spec import NOISE_LINE, VT_PREFIX, VT_TEMPLATE

NUM_HOPS = 4
DEMO_TOKENS = 500  # the demonstration's prompt budget in variable_tracking.py
MIN_NOISE_LINES = 5  # the chain's lines go at distinct noise-line positions
DATA_CONSTANTS = {"NUM_HOPS": NUM_HOPS, "DEMO_TOKENS": DEMO_TOKENS, "MIN_NOISE_LINES": MIN_NOISE_LINES}  # cache key


def variable_names(rng: random.Random, count: int, letters: int) -> list[str]:
    """Distinct upper-case names (NVIDIA draws with replacement and can repeat one in a chain)."""
    names: list[str] = []
    while len(names) < count:
        name = "".join(rng.choices(string.ascii_uppercase, k=letters))
        if name not in names:
            names.append(name)
    return names


def chain_lines(names: list[str], value: str) -> list[str]:
    # The trailing space after `VAR X` is in NVIDIA's chains; kept so prompts match its.
    return [f"VAR {names[0]} = {value}"] + [f"VAR {names[j + 1]} = VAR {names[j]} " for j in range(len(names) - 1)]


def random_chain_value(rng: random.Random, avoid: str = "") -> str:
    value = str(rng.randint(10000, 99998))  # np.random.randint(10000, 99999) excludes its upper bound
    while value == avoid:
        value = str(rng.randint(10000, 99998))
    return value


class VariableTrackingPlan(KindPlan["VariableTrackingTask"]):
    min_size = MIN_NOISE_LINES

    def __init__(self, task: VariableTrackingTask, index: int):
        super().__init__(task, index)
        ctx = task.ctx
        rng = ctx.rng(index)
        hops = task.num_hops
        names = variable_names(rng, hops + 1, 5)
        value = random_chain_value(rng)
        self.chain = chain_lines(names, value)
        self.outputs = names
        self.prefix = VT_PREFIX.format(num_v=hops + 1, query=value)
        # The demonstration: fresh 3-letter names and a value other than the question's.
        demo_names = variable_names(rng, hops + 1, 3)
        demo_value = random_chain_value(rng, avoid=value)
        demo_chain = chain_lines(demo_names, demo_value)
        demo_context = task.chain_items(task.demo_lines, demo_chain, ctx.seed_for(index, "demo positions"))
        # The answered demonstration, then a blank line, then the task (variable_tracking.py).
        bridge = task.demo_question(demo_value) + " " + " ".join(demo_names) + "\n" + "\n" + task.head
        self.before_context: list[Item] = [ctx.head(task.head), *demo_context, bridge]
        self.tail = ctx.tail(task.tail_template.format(query=value), self.prefix)

    def items(self, size: int) -> list[Item]:
        context = self.task.chain_items(size, self.chain, self.position_seed ^ size)
        return [*self.before_context, *context, self.tail]

    def per_unit(self) -> float:
        return self.task.noise.per_unit


class VariableTrackingTask(KindTask):
    Plan = VariableTrackingPlan

    def __init__(self, ctx: Context):
        super().__init__(ctx)
        self.num_hops = ctx.spec.params["num_hops"]
        self.noise = RepeatedLine(ctx.counter, NOISE_LINE)
        head, self.tail_template = VT_TEMPLATE.split("{context}")
        self.head = head[:-1]  # lines carry their own leading newline
        self.demo_lines = self._demo_size()

    def chain_items(self, lines: int, chain: list[str], position_seed: int) -> list[Item]:
        spots = sorted(random.Random(position_seed).sample(range(lines), len(chain)))
        return stream_items(self.noise, lines, list(zip(spots, chain)), strip_first=False)

    def demo_question(self, value: str) -> str:
        """The demonstration's question and answer prefix (NVIDIA formats template + prefix together)."""
        return self.tail_template.format(query=value) + VT_PREFIX.format(num_v=self.num_hops + 1, query=value)

    def _demo_size(self) -> int:
        """Noise lines of the demonstration: the most whose prompt stays within DEMO_TOKENS."""
        rng = self.ctx.rng(-1, "demo size")
        chain = chain_lines(variable_names(rng, self.num_hops + 1, 3), random_chain_value(rng))
        question = self.demo_question("12345")
        seed = self.ctx.seed_for(-1, "demo positions")

        def tokens(lines: int) -> int:
            items = [self.head, *self.chain_items(lines, chain, seed ^ lines), question]
            return compose_count(self.ctx.counter, items, special=False)

        guess = max(MIN_NOISE_LINES, DEMO_TOKENS // max(1, self.noise.per_unit))
        return search(tokens, DEMO_TOKENS, MIN_NOISE_LINES, guess, None) or MIN_NOISE_LINES

    def coarse(self) -> Coarse:
        """NVIDIA's step (variable_tracking.py, noise haystack): 10 noise lines (5 below 4096)."""
        return Coarse(10 if self.ctx.length >= 4096 else 5)
