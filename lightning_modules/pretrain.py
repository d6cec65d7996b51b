"""``PretrainModule``: MLM + SOP/NSP pre-training of any encoder the config describes."""

from __future__ import annotations

import lightning.pytorch as pl
import torch
from torch import nn
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy
from torchmetrics.text import Perplexity

from ablate.lightning_modules.config import ExperimentConfig, OptimConfig
from ablate.lightning_modules.heads import IGNORE, PretrainingModel, build_pretraining_model


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """AdamW groups: decay matrices, not biases, norms or embeddings' 1-d parameters."""
    decay = [p for p in model.parameters() if p.requires_grad and p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.ndim < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def adamw(groups: list[dict], lr: float, eps: float = 1e-8, precision: str = "32-true") -> torch.optim.AdamW:
    """AdamW over ``groups``, fused (one kernel for every parameter) where PyTorch has the fused
    kernel for their device (CUDA, CPU), else the multi-tensor implementation. Not fused under
    ``16-mixed``: its gradient scaler must unscale before clipping (see :func:`clip_gradients`)."""
    params = [p for group in groups for p in group["params"]]
    fused = (
        precision != "16-mixed"
        and bool(params)
        and all(p.device.type in ("cuda", "cpu") and p.is_floating_point() for p in params)
    )
    return torch.optim.AdamW(groups, lr=lr, eps=eps, fused=fused, foreach=None if fused else True)


def clip_gradients(
    module: pl.LightningModule, optimizer: torch.optim.Optimizer, value: float | None, algorithm: str | None
) -> None:
    """Gradient clipping by norm, done here rather than by Lightning's mixed-precision plugin,
    which refuses a fused optimizer even in bf16, where there is no scaler to unscale first."""
    if not value:
        return
    if module.trainer.precision == "16-mixed":  # the scaler unscales first: Lightning's own path
        pl.LightningModule.configure_gradient_clipping(module, optimizer, value, algorithm)
        return
    params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
    torch.nn.utils.clip_grad_norm_(params, value, foreach=True)


def use_tensor_cores(device: torch.device) -> None:
    """fp32 matmuls on TF32 tensor cores on a CUDA device (Ampere and later; bf16 autocast is
    unaffected); nothing elsewhere."""
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")


def warmup_linear_decay(optim: OptimConfig, max_steps: int):
    """LR multiplier: linear warmup to 1, then linear decay to 0 at ``max_steps``."""
    warmup = max(optim.warmup_steps, 0)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return max(0.0, (max_steps - step) / max(1, max_steps - warmup))

    return factor


class PretrainModule(pl.LightningModule):
    """Pre-training regime. The architecture and loss combination come from the config.

    Args:
        cfg: the resolved experiment config.
        model: an already built model to train (built from ``cfg`` when None).
    """

    def __init__(self, cfg: ExperimentConfig, model: PretrainingModel | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        self.model = model if model is not None else build_pretraining_model(cfg.model, cfg.objective)
        if cfg.trainer.compile:  # the whole forward and loss: one graph (tests/lightning_modules/test_compile.py)
            self.model.compile(mode=cfg.trainer.compile_mode)
        V = cfg.model.vocab_size
        self.val_loss = MeanMetric()
        self.val_mlm_loss = MeanMetric()
        self.val_mlm_acc = MulticlassAccuracy(num_classes=V, average="micro", ignore_index=IGNORE)
        self.val_mlm_ppl = Perplexity(ignore_index=IGNORE)
        self.val_sentence_acc = MulticlassAccuracy(num_classes=2, average="micro", ignore_index=-100)

    def forward(self, batch: dict[str, torch.Tensor]):
        return self.model(batch)

    def new_step(self) -> None:
        """Compiled with CUDA graphs, a step's graph outputs are overwritten by the next replay:
        say where a step begins (nothing from an earlier step is read after this)."""
        if self.cfg.trainer.compile and self.cfg.trainer.compile_mode == "reduce-overhead":
            torch.compiler.cudagraph_mark_step_begin()

    def logs_this_step(self) -> bool:
        """Whether the logger writes this step's training metrics (every ``trainer.log_every``
        steps, and the last step, whose values are the run's final ones): only then are they
        handed to Lightning, whose bookkeeping costs host time."""
        trainer = self._trainer
        if trainer is None:
            return True
        step = trainer.global_step + 1
        return step % trainer.log_every_n_steps == 0 or 0 < trainer.max_steps <= step

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        """One step's loss; logged as device tensors (no host sync: the NaN guard is
        :class:`~lightning_modules.loop.FiniteLoss`)."""
        self.new_step()
        out = self.model(batch)
        if self.logs_this_step():
            bs = batch["input_ids"].shape[0]
            self.log("train/loss", out.loss.detach().clone(), batch_size=bs)
            self.log("train/mlm_loss", out.mlm_loss.detach().clone(), batch_size=bs)
            if out.sentence_loss is not None:
                self.log("train/sentence_loss", out.sentence_loss.detach().clone(), batch_size=bs)
            self.log("train/tokens", batch["attention_mask"].sum().float(), reduce_fx="sum", batch_size=bs)
        return out.loss

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self.new_step()
        out = self.model(batch)
        self.val_loss.update(out.loss.detach(), weight=batch["input_ids"].shape[0])
        self.val_mlm_loss.update(out.mlm_loss.detach(), weight=out.mlm_valid.sum().float())
        self.val_mlm_acc.update(out.mlm_logits, out.mlm_targets)  # padding slots (-100) are ignored
        self.val_mlm_ppl.update(out.mlm_logits.float()[None], out.mlm_targets[None])  # (1, K, V)
        if out.sentence_logits is not None:
            self.val_sentence_acc.update(out.sentence_logits, batch["sentence_label"])

    def on_validation_epoch_end(self) -> None:
        metrics = {
            "val/loss": self.val_loss,
            "val/mlm_loss": self.val_mlm_loss,
            "val/mlm_acc": self.val_mlm_acc,
            "val/mlm_ppl": self.val_mlm_ppl,
        }
        if self.model.sentence_head is not None:
            metrics["val/sentence_acc"] = self.val_sentence_acc
        for name, metric in metrics.items():
            if metric.update_count:
                self.log(name, metric.compute(), prog_bar=name in ("val/loss", "val/mlm_acc"), sync_dist=True)
            metric.reset()

    def on_fit_start(self) -> None:
        use_tensor_cores(self.device)

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None) -> None:
        clip_gradients(self, optimizer, gradient_clip_val, gradient_clip_algorithm)

    def trainable_modules(self) -> nn.Module:
        """What the optimizer trains (the model; a distillation adds its projections)."""
        return self.model

    def configure_optimizers(self):
        o, steps = self.cfg.optim, self.cfg.trainer.max_steps
        optimizer = adamw(
            param_groups(self.trainable_modules(), o.weight_decay),
            lr=o.lr,
            eps=o.eps,
            precision=self.cfg.trainer.precision,
        )
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_linear_decay(o, steps))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
