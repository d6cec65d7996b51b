"""Timing a run's model again, long after the run (``ablate report --remeasure``): rebuilt from the run's
config with random weights, quantized as the run's was by a :class:`Quantizer` the caller hands in
(quantizing belongs to the methods layer above), and timed as runs time themselves, a round at a
time (docs/reports.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, cast

import torch
from torch import nn

from ablate.lightning_modules.config.experiment import ExperimentConfig
from ablate.lightning_modules.config.quant import QuantConfig
from ablate.lightning_modules.measure import profiling
from ablate.lightning_modules.measure.measuring import describe_device, describe_machine, training_device
from ablate.lightning_modules.measure.reference_load import Workload, reference_workload
from ablate.lightning_modules.model.heads import PretrainingModel, build_pretraining_model


class Quantizer(Protocol):
    """A float model (random weights will do) quantized the way a run with ``q`` ends, to time it."""

    def __call__(self, model: nn.Module, q: QuantConfig, /) -> nn.Module: ...


def timing_device(cfg: ExperimentConfig) -> torch.device:
    """Where a run with ``cfg`` measured its latency: a quantized model on the CPU (float32 around its
    int8 kernels), any other on the device it trained on."""
    return torch.device("cpu") if cfg.quant.enabled else training_device(cfg.trainer.accelerator)


def rebuilt(cfg: ExperimentConfig, quantize: Quantizer) -> PretrainingModel:
    """The model a run with ``cfg`` ended with, its weights random (seed 0; the caller's random
    streams untouched), quantized by ``quantize`` when ``quant.method`` is set."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = build_pretraining_model(cfg.model, cfg.objective)
    return cast(PretrainingModel, quantize(model, cfg.quant)) if cfg.quant.enabled else model  # quantized in place


@dataclass
class Retimed:
    """One architecture timed again over several rounds: every timed repeat and reference run, by batch size.

    Attributes:
        cfg: the config of (one of) the runs that share the architecture.
        device: where it is timed (:func:`timing_device`).
        times: batch size -> every timed repeat, ms.
        refs: batch size -> the reference workload's run after each repeat, ms.
    """

    cfg: ExperimentConfig
    device: torch.device
    times: dict[int, list[float]] = field(default_factory=dict)
    refs: dict[int, list[float]] = field(default_factory=dict)

    @classmethod
    def of(cls, cfg: ExperimentConfig) -> Retimed:
        """An architecture not yet timed, on the device its run measured on."""
        return cls(cfg, timing_device(cfg))

    @property
    def key(self) -> tuple[str, ...]:
        """What makes two runs' timings the same: the model, its quantization, the sequence length, the
        precision and the device (seeds differ only in values)."""
        c = self.cfg
        return (repr(c.model), repr(c.quant), str(c.data.max_length), c.trainer.precision, str(self.device))

    def workload(self) -> Workload:
        """The fixed reference workload on this architecture's device."""
        return reference_workload(self.device)

    def time_round(self, quantize: Quantizer, repeats: int, warmup: int, reference: Workload) -> None:
        """One round: the model rebuilt (:func:`rebuilt`) and timed at every batch size of
        :data:`~ablate.lightning_modules.measure.profiling.LATENCY_BATCHES`, ``repeats`` timed forwards
        after ``warmup`` untimed ones each, ``reference`` timed after every repeat."""
        model = rebuilt(self.cfg, quantize)
        precision = "32-true" if self.cfg.quant.enabled else self.cfg.trainer.precision
        for batch in profiling.LATENCY_BATCHES:
            lat = profiling.time_forward(
                model,
                self.cfg.model.vocab_size,
                batch,
                self.cfg.data.max_length,
                repeats,
                warmup,
                self.device,
                precision,
                reference,
            )
            self.times.setdefault(batch, []).extend(lat.times_ms)
            self.refs.setdefault(batch, []).extend(lat.reference_ms)

    def metrics(self) -> dict[str, float]:
        """The latency metrics over every round (:func:`~ablate.lightning_modules.measure.profiling.latency_metrics`):
        the fastest repeat, the spread of all of them, the reference's median."""
        timed = {b: profiling.Latency(tuple(t), tuple(self.refs.get(b, ()))) for b, t in self.times.items()}
        return profiling.latency_metrics(timed)

    def describe(self) -> tuple[str, str]:
        """The device and the machine, for the record (:func:`describe_device`, :func:`describe_machine`)."""
        return describe_device(self.device), describe_machine(self.device)
