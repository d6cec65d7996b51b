"""Intrinsic evaluation (ALBERT Table 5): MLM accuracy and NSP/SOP accuracy of any model (:func:`intrinsic_eval`),
the sentence tasks by a linear probe on the frozen [CLS] vector, with the same budget for every model whatever
its own pre-training objective (docs/guides/finetuning.md, "Intrinsic probes")."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ablate.lightning_modules.model.heads import PretrainingModel

IGNORE_INDEX = -100


@dataclass
class IntrinsicScores:
    """Intrinsic scores of one model, each in [0, 1]."""

    mlm_acc: float
    nsp_acc: float
    sop_acc: float

    def as_metrics(self) -> dict[str, float]:
        """MLflow metric names -> values."""
        return {"intrinsic/mlm_acc": self.mlm_acc, "intrinsic/nsp_acc": self.nsp_acc, "intrinsic/sop_acc": self.sop_acc}


@dataclass
class _Pass:
    """What one frozen pass over batches collects."""

    features: torch.Tensor  # (N, H) final hidden state at [CLS], float32 on the model's device
    labels: torch.Tensor  # (N,) sentence labels, -100 rows dropped
    mlm_correct: int
    mlm_total: int


class _FrozenEval:
    """Context manager: every module in eval mode, no grad; each module's own flag restored."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.modes: dict[nn.Module, bool] = {}

    def __enter__(self) -> None:
        self.modes = {m: m.training for m in self.model.modules()}
        self.grad = torch.is_grad_enabled()
        self.model.eval()
        torch.set_grad_enabled(False)

    def __exit__(self, *exc: object) -> None:
        torch.set_grad_enabled(self.grad)
        for module, mode in self.modes.items():
            module.training = mode


def _run(model: PretrainingModel, batches: Iterable[dict[str, torch.Tensor]]) -> _Pass:
    """One frozen forward per batch: [CLS] features, sentence labels and MLM counts. Nothing is read from
    the device until every batch has run (on a GPU a read per batch would make each forward wait)."""
    device = next(model.parameters()).device
    feats, labels = [], []
    correct = total = torch.zeros((), dtype=torch.long, device=device)
    with _FrozenEval(model):
        for batch in batches:
            batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
            out = model(batch)
            feats.append(out.cls.float())  # (B, H), on the model's device
            labels.append(batch["sentence_label"])
            correct = correct + ((out.mlm_logits.argmax(-1) == out.mlm_targets) & out.mlm_valid).sum()
            total = total + out.mlm_valid.sum()
    if not feats:
        return _Pass(torch.empty(0, 0, device=device), torch.empty(0, dtype=torch.long, device=device), 0, 0)
    y = torch.cat(labels)
    keep = y != IGNORE_INDEX  # (N,): rows without a sentence label are left out
    return _Pass(torch.cat(feats)[keep], y[keep], int(correct), int(total))


def cls_features(
    model: PretrainingModel, batches: Iterable[dict[str, torch.Tensor]]
) -> tuple[torch.Tensor, torch.Tensor]:
    """The encoder's final hidden state at [CLS] and the sentence labels, over batches.

    Args:
        model: the model (put in eval mode, no grad, then restored).
        batches: pre-training batches (``input_ids``, ``token_type_ids``,
            ``attention_mask``, ``mlm_labels``, ``sentence_label``).

    Returns:
        Features (N, H) float32 and labels (N,) on the CPU; rows labelled -100 are skipped.
    """
    run = _run(model, batches)
    return run.features.cpu(), run.labels.cpu()


def mlm_accuracy(model: PretrainingModel, batches: Iterable[dict[str, torch.Tensor]]) -> float:
    """Top-1 accuracy at the masked positions of ``batches`` (0.0 when none are masked)."""
    run = _run(model, batches)
    return run.mlm_correct / max(run.mlm_total, 1)


def linear_probe(
    train_x: torch.Tensor,
    train_y: torch.Tensor,
    test_x: torch.Tensor,
    test_y: torch.Tensor,
    steps: int = 300,
    lr: float = 1e-2,
    seed: int = 0,
    weight_decay: float = 1e-2,
) -> float:
    """Test accuracy of a 2-way logistic regression trained on frozen features.

    Features are standardised with the training statistics; the probe is trained full-batch
    with AdamW from a seeded initialisation, on the features' device (a study's GPU), deterministic
    for a seed on one device.

    Args:
        train_x: (N, H) training features; train_y: (N,) labels in {0, 1}.
        test_x: (M, H) test features; test_y: (M,) labels in {0, 1}.
        steps: full-batch AdamW steps.
        lr: learning rate.
        seed: seed of the probe's initialisation.
        weight_decay: AdamW's decoupled weight decay.

    Returns:
        Accuracy on the test set in [0, 1].

    Raises:
        ValueError: the training or the test set is empty.
    """
    if len(train_y) == 0 or len(test_y) == 0:
        raise ValueError(f"linear probe needs examples, got {len(train_y)} to train and {len(test_y)} to test")
    device = train_x.device
    train_x, test_x = train_x.detach().float(), test_x.detach().float().to(device)
    train_y, test_y = train_y.detach().long().to(device), test_y.detach().long().to(device)
    mean, std = train_x.mean(0), train_x.std(0, unbiased=False)  # (H,)
    std = torch.where(std > 1e-6, std, torch.ones_like(std))  # a constant feature stays unscaled, not blown up
    train_x, test_x = (train_x - mean) / std, (test_x - mean) / std
    generator = torch.Generator().manual_seed(seed)
    probe = nn.Linear(train_x.shape[1], 2, device=device)
    with torch.no_grad():
        probe.weight.copy_(torch.randn(probe.weight.shape, generator=generator) * 0.01)  # (2, H), drawn on the CPU
        probe.bias.zero_()
    optimizer = torch.optim.AdamW(probe.parameters(), lr=lr, weight_decay=weight_decay)
    with torch.enable_grad():
        for _ in range(steps):
            optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(probe(train_x), train_y).backward()  # type: ignore[no-untyped-call]  # logits (N, 2); backward: untyped
            optimizer.step()
    with torch.no_grad():
        return float((probe(test_x).argmax(-1) == test_y).float().mean())


def intrinsic_eval(
    model: PretrainingModel,
    streams: Mapping[str, tuple[Iterable[dict[str, torch.Tensor]], Iterable[dict[str, torch.Tensor]]]],
    seed: int = 0,
) -> IntrinsicScores:
    """MLM, NSP and SOP accuracy of a model, with the same budget for every model.

    Args:
        model: the model to score; its parameters and train/eval flags are left unchanged.
        streams: per sentence task (``nsp``, ``sop``), the probe's training batches and its test
            batches (:func:`ablate.datamodules.pretrain.probe_streams` builds them from a run's data).
        seed: seed of the probes.

    Returns:
        The three accuracies; MLM pools the masked positions of both tasks' test batches.
    """
    accuracy: dict[str, float] = {}
    correct = total = 0
    for task in ("nsp", "sop"):
        train_batches, test_batches = streams[task]
        train = _run(model, train_batches)
        test = _run(model, test_batches)
        accuracy[task] = linear_probe(train.features, train.labels, test.features, test.labels, seed=seed)
        correct, total = correct + test.mlm_correct, total + test.mlm_total
    return IntrinsicScores(mlm_acc=correct / max(total, 1), nsp_acc=accuracy["nsp"], sop_acc=accuracy["sop"])
