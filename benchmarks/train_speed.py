"""ablate's training step against Hugging Face transformers at the same model: for one
:class:`~ablate.benchmarks.cases.Case`, every side (ablate or transformers; fp32 or bf16; SDPA or
eager; compiled or not) from the same weights, on the same batches, with the same AdamW and schedule,
taking turns one step each in one process (docs/performance.md, "Training step"). On CUDA both sides
run fp32 matmuls on TF32 (:func:`use_tensor_cores`)."""

from __future__ import annotations

import statistics
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

import torch

from ablate.benchmarks.cases import Case
from ablate.datamodules.stream import PretrainStream
from ablate.datamodules.tokenizer import load_or_train_tokenizer
from ablate.lightning_modules.config.experiment import DataConfig, ExperimentConfig, ObjectiveConfig
from ablate.lightning_modules.config.run import CompileMode, OptimConfig, TrainerConfig
from ablate.lightning_modules.interop.maps import family
from ablate.lightning_modules.interop.pretrained import to_transformers
from ablate.lightning_modules.measure.memory import saved_activation_bytes
from ablate.lightning_modules.methods.pretrain import PretrainModule
from ablate.lightning_modules.methods.train_module import adamw, param_groups, warmup_linear_decay
from ablate.lightning_modules.model.heads import build_pretraining_model

HF_SENTENCE_LABEL = {
    "albert": "sentence_order_label",
    "bert": "next_sentence_label",
    "mobilebert": "next_sentence_label",
}
Batch = dict[str, torch.Tensor]


@dataclass
class Side:
    """One implementation in one setting, ready to train.

    Attributes:
        name: e.g. ``ablate bf16`` or ``transformers sdpa fp32``.
        library: ``ablate`` or ``transformers``.
        precision: ``fp32`` or ``bf16`` (autocast).
        step: one training step on a batch; returns the loss (a device tensor: reading it waits
            for the step).
        loss_only: the forward loss of a batch (for the activation memory).
        params: the side's parameters and buffers (not activations).
    """

    name: str
    library: str
    precision: str
    step: Callable[[Batch], torch.Tensor]
    loss_only: Callable[[Batch], torch.Tensor]
    params: list[torch.Tensor]
    times: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    first_s: float = float("nan")  # the first step, compilation included
    activation_mb: float = float("nan")
    flops: float = float("nan")  # one forward + backward (FlopCounterMode)


def _autocast(precision: str, device: torch.device) -> AbstractContextManager[None]:
    return torch.autocast(device.type, dtype=torch.bfloat16) if precision == "bf16" else nullcontext()


def _optim() -> OptimConfig:
    return OptimConfig(lr=1e-3, warmup_steps=10)


def ablate_side(
    case: Case,
    init: dict[str, torch.Tensor],
    precision: str,
    compile: bool,
    device: torch.device,
    max_steps: int,
    mode: CompileMode = "default",
    grad_clip: float = 0.0,
) -> Side:
    """ablate's PretrainModule at ``case``, from the weights ``init`` (compiled in ``mode``); with
    ``grad_clip``, gradients clipped to that norm as a run with ``optim.grad_clip`` does."""
    cfg = ExperimentConfig(
        model=case.model,
        objective=ObjectiveConfig(sentence=case.sentence),
        optim=_optim(),
        trainer=TrainerConfig(max_steps=max_steps, compile=compile, compile_mode=mode),
    )
    model = build_pretraining_model(cfg.model, cfg.objective)
    model.load_state_dict(init)
    module = PretrainModule(cfg, model)  # wraps the encoder in torch.compile when asked
    module.to(device).train()
    optimizer, schedule = module.optimizer_and_schedule()
    assert schedule is not None  # pre-training's: warmup, then linear decay
    trained = [p for group in optimizer.param_groups for p in group["params"]]

    def step(batch: Batch) -> torch.Tensor:
        if mode == "reduce-overhead":
            torch.compiler.cudagraph_mark_step_begin()  # type: ignore[no-untyped-call]  # last step's graph outputs: not read again
        with _autocast(precision, device):
            loss = module.training_step(batch, 0)
        loss.backward()  # type: ignore[no-untyped-call]  # torch leaves Tensor.backward unannotated
        if grad_clip:
            torch.nn.utils.clip_grad_norm_(trained, grad_clip, foreach=True)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach().clone()

    def loss_only(batch: Batch) -> torch.Tensor:
        if mode == "reduce-overhead":
            torch.compiler.cudagraph_mark_step_begin()  # type: ignore[no-untyped-call]  # torch leaves it unannotated
        with _autocast(precision, device):
            loss: torch.Tensor = module.model(batch).loss
            return loss

    name = (
        f"ablate {precision}" + (" compiled" if compile else "") + (" cudagraphs" if mode == "reduce-overhead" else "")
    )
    return Side(name, "ablate", precision, step, loss_only, [*module.parameters(), *module.buffers()])


def hf_side(
    case: Case,
    ours: PretrainModule,
    attention: str,
    precision: str,
    device: torch.device,
    max_steps: int,
    compile: bool = False,
) -> Side:
    """transformers' ``*ForPreTraining`` at ``case``, weights copied from ``ours`` (interop path); with
    ``compile``, the model wrapped in ``torch.compile`` (default mode: what the transformers Trainer's
    ``torch_compile=True`` does), the fastest way a user runs it."""
    model: Any = to_transformers(ours.model, case.model)  # set and moved as transformers' own code does
    model.config._attn_implementation = attention  # "eager" or "sdpa"
    for module in model.modules():
        if hasattr(module, "config"):
            module.config._attn_implementation = attention
    model.to(device).train()
    o = _optim()
    optimizer = adamw(param_groups(model, o.weight_decay), lr=o.lr, eps=o.eps)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_linear_decay(o, max_steps))
    label = HF_SENTENCE_LABEL[family(case.model)]
    forward = torch.compile(model) if compile else model  # same parameters: the optimizer above steps them

    def loss_only(batch: Batch) -> torch.Tensor:
        with _autocast(precision, device):
            loss: torch.Tensor = forward(
                input_ids=batch["input_ids"],
                attention_mask=batch["attention_mask"],
                token_type_ids=batch["token_type_ids"],
                labels=batch["mlm_labels"],
                **{label: batch["sentence_label"]},
            ).loss
            return loss

    def step(batch: Batch) -> torch.Tensor:
        loss = loss_only(batch)
        loss.backward()  # type: ignore[no-untyped-call]  # torch leaves Tensor.backward unannotated
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach().clone()

    return Side(
        f"transformers {attention} {precision}" + (" compiled" if compile else ""),
        "transformers",
        precision,
        step,
        loss_only,
        [*model.parameters(), *model.buffers()],
    )


def batches(case: Case, corpus: str, count: int, device: torch.device, seed: int = 0) -> list[Batch]:
    """``count`` training batches of ``case`` from ablate's data pipeline on ``corpus``."""
    data = DataConfig(corpus=corpus, max_length=case.seq_len, batch_size=case.batch, num_workers=0, tokenizer_docs=5000)
    objective = ObjectiveConfig(sentence=case.sentence, mask_prob=case.mask_prob)
    tokenizer, _ = load_or_train_tokenizer(data, case.model.vocab_size)
    stream: Iterator[Batch] = iter(PretrainStream(data, objective, tokenizer.to_str(), seed, "train"))
    return [{k: v.to(device) for k, v in b.items()} for b in islice(stream, count)]


def activation_mb(side: Side, batch: Batch, device: torch.device) -> float:
    """Memory one training step keeps for backward, MiB: CUDA's peak allocation above the
    parameters; on CPU the unique storages autograd saves (parameters and batch excluded)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        side.loss_only(batch).backward()  # type: ignore[no-untyped-call]  # torch leaves Tensor.backward unannotated
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device) - before
    else:
        peak = saved_activation_bytes(lambda: side.loss_only(batch), [*side.params, *batch.values()])
    for p in side.params:
        p.grad = None
    return peak / 2**20


def race(sides: list[Side], data: list[Batch], warmup: int, progress: Callable[[], None]) -> None:
    """Warm every side up, then time one step of each side per batch, alternating the order."""
    for i, batch in enumerate(data):
        order = sides if i % 2 == 0 else sides[::-1]
        for side in order:
            start = time.perf_counter()
            loss = float(side.step(batch))  # reading the loss waits until the device has finished the step
            elapsed = time.perf_counter() - start
            side.losses.append(loss)
            if i == 0:
                side.first_s = elapsed
            if i >= warmup:
                side.times.append(elapsed)
        progress()


def tokens_per_s(side: Side, data: list[Batch], warmup: int) -> float:
    tokens = statistics.mean(float(b["attention_mask"].sum()) for b in data[warmup:])
    return tokens / statistics.median(side.times)


def build_pretrain_sides(
    case: Case, settings: list[str], device: torch.device, max_steps: int, seed: int = 0
) -> list[Side]:
    """The pre-training sides named by ``settings`` (``ablate:fp32``, ``ablate:bf16``, ``ablate:fp32:compile``,
    ``ablate:bf16:compile:cudagraphs``, ``transformers:sdpa:fp32``, ``transformers:sdpa:bf16:compile``, ...),
    all from one initialisation (any case: :func:`ablate.benchmarks.sides.build_sides`)."""
    torch.manual_seed(seed)
    reference = PretrainModule(ExperimentConfig(model=case.model, objective=ObjectiveConfig(sentence=case.sentence)))
    init = {k: v.clone() for k, v in reference.model.state_dict().items()}
    sides = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for setting in settings:
            parts = setting.split(":")
            if parts[0] == "ablate":
                mode: CompileMode = "reduce-overhead" if "cudagraphs" in parts[2:] else "default"
                sides.append(ablate_side(case, init, parts[1], "compile" in parts[2:], device, max_steps, mode))
            else:
                compiled = "compile" in parts[3:]
                sides.append(hf_side(case, reference, parts[1], parts[2], device, max_steps, compiled))
    return sides
