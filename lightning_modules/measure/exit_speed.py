"""FastBERT's early exit measured (Liu et al. 2020): the metric, mean layers run, FLOPs and batch-1
latency of early exit at a set of speeds (:func:`speed_curve`), the full model timed the same way
(:func:`full_latency_ms`), the two timed in turns (:func:`latency_ratio`) and where examples leave
(:func:`exit_counts`). The model side is :mod:`ablate.lightning_modules.model.early_exit`."""

from __future__ import annotations

import functools
import hashlib
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from ablate.lightning_modules.measure.accounting import flops_per_token, linear_flops
from ablate.lightning_modules.measure.cache import structure
from ablate.lightning_modules.measure.measuring import placed
from ablate.lightning_modules.model.classifier import Classifier
from ablate.lightning_modules.model.early_exit import Batch, predict_early_exit
from ablate.lightning_modules.model.encoder import Encoder

Metric = Callable[[torch.Tensor, torch.Tensor], float]
"""``metric(preds (N,), labels (N,))``: a dev metric of predicted classes."""


def layer_flops(encoder: Encoder, seq_len: int) -> list[int]:
    """Forward FLOPs of one example of ``seq_len`` tokens after k layers, k = 0..L (k = 0: the
    embeddings and their projection), as :func:`~ablate.lightning_modules.measure.accounting.flops_per_token`
    counts them (its count of the encoder cut after k layers) times the tokens."""
    parts = (encoder.embeddings, encoder.attentions, encoder.ffn_stacks, encoder.bottlenecks)
    return [flops_per_token(Encoder(*parts, encoder.plan[:k]), seq_len) * seq_len for k in range(len(encoder.plan) + 1)]


@dataclass(frozen=True)
class SpeedPoint:
    """Early exit at one speed over a set of examples.

    Attributes:
        speed: the entropy threshold.
        metric_value: the metric of the early-exit predictions (accuracy by default).
        mean_layers: layers run per example, on average (L at speed 0).
        flops_per_example: forward FLOPs per example, on average: embeddings, the layers run and
            the heads evaluated (exits up to the one it left at, on [CLS] only; the final head
            when it ran every layer; none of the exits at speed 0).
        latency_ms: batch-1 wall time per example, ms: the mean over the timed examples of each
            one's fastest repeat (:func:`time_examples`).
    """

    speed: float
    metric_value: float
    mean_layers: float
    flops_per_example: float
    latency_ms: float


def accuracy(preds: torch.Tensor, labels: torch.Tensor) -> float:
    """Share of ``preds`` (N,) equal to ``labels`` (N,)."""
    return float((preds == labels).float().mean().item())


def time_examples(
    run: Callable[[Batch], object], examples: Sequence[Batch], repeats: int = 3, warmup: int = 5
) -> float:
    """Mean batch-1 wall time of ``run`` over ``examples``, ms: ``warmup`` untimed runs first (over
    the first examples), then each example's time is the fastest of ``repeats`` runs (a busy
    machine only adds time). Under inference mode; CUDA is synchronized around each run."""
    return _time_interleaved([run], examples, repeats, warmup)[0]


def _time_interleaved(
    runs: Sequence[Callable[[Batch], object]], examples: Sequence[Batch], repeats: int, warmup: int
) -> list[float]:
    """:func:`time_examples` of several ``runs`` at once, taking turns on each example and each
    repeat (load that comes and goes then slows them alike): one mean ms per run."""
    if not examples:
        return [0.0] * len(runs)
    cuda = examples[0]["input_ids"].device.type == "cuda"
    totals = [0.0] * len(runs)
    with torch.inference_mode():
        for i in range(warmup):
            for run in runs:
                run(examples[i % len(examples)])
        for example in examples:
            best = [math.inf] * len(runs)
            for _ in range(max(1, repeats)):
                for j, run in enumerate(runs):
                    if cuda:
                        torch.cuda.synchronize()
                    start = time.perf_counter()
                    run(example)
                    if cuda:
                        torch.cuda.synchronize()
                    best[j] = min(best[j], time.perf_counter() - start)
            totals = [t + b * 1e3 for t, b in zip(totals, best, strict=True)]
    return [t / len(examples) for t in totals]


def full_latency_ms(model: Classifier, examples: Sequence[Batch], repeats: int = 3, warmup: int = 5) -> float:
    """The model's own forward (``model(batch)``: every layer, the final head) timed as
    :func:`speed_curve` times early exit, ms per example, in eval mode (modes restored)."""
    with placed(model, None, train=False):
        return time_examples(model, examples, repeats, warmup)


_BY_SHAPE: dict[str, float] = {}  # this process's batch-1 latencies, by model shape and examples


def shape_latency_ms(model: Classifier, examples: Sequence[Batch]) -> float:
    """:func:`full_latency_ms`, timed once per model shape (its modules, tensors' names, shapes and dtypes),
    the examples' shapes and the CPU threads in this process: a dense forward's time does not depend on
    the weights, so a study's seeds and trials of one shape time it once."""
    parts = [structure(model), repr([tuple(b["input_ids"].shape) for b in examples]), f"{torch.get_num_threads()}"]
    key = hashlib.sha256("\n".join(parts).encode()).hexdigest()
    if key not in _BY_SHAPE:
        _BY_SHAPE[key] = full_latency_ms(model, examples)
    return _BY_SHAPE[key]


@dataclass(frozen=True)
class LatencyRatio:
    """Early exit at one speed against the full model, timed in turns (:func:`latency_ratio`)."""

    speed: float
    mean_layers: float  # over the timed examples
    early_ms: float  # batch-1 ms per example with early exit
    full_ms: float  # the same for ``model(batch)``

    @property
    def ratio(self) -> float:
        """``early_ms / full_ms``."""
        return self.early_ms / self.full_ms


def latency_ratio(
    model: Classifier, examples: Sequence[Batch], speed: float, repeats: int = 5, warmup: int = 5
) -> LatencyRatio:
    """Batch-1 latency of early exit at ``speed`` over the full model's on the same ``examples``,
    the two timed in turns on each example and repeat (each example's time the fastest repeat),
    so a machine whose load comes and goes slows both alike. Eval mode (modes restored)."""
    with placed(model, None, train=False):
        layers = [predict_early_exit(model, ex, speed)[1] for ex in examples]
        run = functools.partial(predict_early_exit, model, speed=speed)
        early, full = _time_interleaved([run, model], examples, repeats, warmup)
    return LatencyRatio(speed, sum(layers) / max(1, len(layers)), early, full)


def exit_counts(model: Classifier, examples: Sequence[Batch], speed: float) -> list[int]:
    """How many ``examples`` leave after each layer at ``speed``: a list of L counts (index i =
    after layer i; the last = ran every layer), in eval mode (modes restored)."""
    counts = [0] * len(model.encoder.plan)
    with placed(model, None, train=False):
        for example in examples:
            counts[predict_early_exit(model, example, speed)[1] - 1] += 1
    return counts


def speed_curve(
    model: Classifier,
    examples: list[Batch],
    labels: torch.Tensor,
    speeds: Sequence[float],
    metric: Metric | None = None,
    timed: int = 200,
    repeats: int = 3,
    warmup: int = 5,
) -> list[SpeedPoint]:
    """The metric, mean layers run, FLOPs and batch-1 latency of early exit at each speed.

    Runs in eval mode under inference mode (modes restored), on the model's device (the examples
    must be there; the latency figure is meant for the CPU).

    Args:
        model: the classifier with its exits.
        examples: one batch of one (unpadded) per example: ``input_ids`` (1, T_n), optional
            ``token_type_ids``, ``attention_mask`` (1, T_n).
        labels: (N,) the examples' labels.
        speeds: the entropy thresholds.
        metric: ``metric(preds (N,), labels (N,))``; None = accuracy.
        timed: the latency is measured on the first ``timed`` examples (0 = not measured: 0.0).
        repeats: timed runs per example (its time is the fastest).
        warmup: untimed runs before the timed ones, per speed.

    Returns:
        One :class:`SpeedPoint` per speed, in order.
    """
    score = metric or accuracy
    L = len(model.encoder.plan)
    points = []
    with placed(model, None, train=False):
        flops_cache: dict[int, list[int]] = {}
        head_flops = linear_flops(model.head)
        exit_flops = [0] if model.exits is None else [0, *[linear_flops(e) for e in model.exits]]
        cumulative_exits = [sum(exit_flops[: k + 1]) for k in range(len(exit_flops))]  # k exits run
        for speed in speeds:
            preds, layers, flops = [], [], []
            for example in examples:
                logits, k = predict_early_exit(model, example, speed)
                T = int(example["input_ids"].shape[1])
                if T not in flops_cache:
                    flops_cache[T] = layer_flops(model.encoder, T)
                exits_run = 0 if speed <= 0 else min(k, L - 1)
                heads = cumulative_exits[exits_run] + (head_flops if k == L else 0)
                preds.append(logits.argmax(dim=-1))
                layers.append(k)
                flops.append(flops_cache[T][k] + heads)
            value = score(torch.cat(preds).cpu(), labels.cpu()) if examples else math.nan
            run = functools.partial(predict_early_exit, model, speed=speed)
            latency = time_examples(run, examples[:timed], repeats, warmup)
            n = max(1, len(examples))
            points.append(SpeedPoint(speed, value, sum(layers) / n, sum(flops) / n, latency))
    return points
