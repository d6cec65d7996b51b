"""The distillation step, ablate against Hugging Face transformers at the same configuration: a
:class:`~ablate.benchmarks.cases.Case` with a ``teacher``, one step the frozen teacher's forward and
the student's step with MobileBERT's losses (MLM, the sentence loss, KD, FMT, AT), both sides from the
same weights on the same batches, timed as :mod:`ablate.benchmarks.train_speed` times pre-training
(docs/performance.md, "The distillation step"). Device-agnostic (CPU, CUDA; fp32, bf16)."""

from __future__ import annotations

import torch

from ablate.benchmarks.cases import Case
from ablate.benchmarks.train_speed import Batch, Side, _autocast, _optim
from ablate.lightning_modules.config.distill import DistillConfig
from ablate.lightning_modules.config.experiment import DataConfig, ExperimentConfig, ObjectiveConfig
from ablate.lightning_modules.config.run import CompileMode, TrainerConfig
from ablate.lightning_modules.interop.pretrained import to_transformers
from ablate.lightning_modules.methods.losses import attention_loss, feature_map_loss, head_map, kd_loss, layer_map
from ablate.lightning_modules.methods.pretrain import PretrainModule, distill_module
from ablate.lightning_modules.methods.train_module import adamw, param_groups, warmup_linear_decay
from ablate.lightning_modules.model.heads import IGNORE, PretrainingModel, build_pretraining_model

BENCH_TEACHER = "benchmark"  # distill.teacher: a name only (the bench builds the teacher itself)


def distill_cfg(case: Case, max_steps: int, compile: bool = False, mode: CompileMode = "default") -> ExperimentConfig:
    """The distillation config of ``case``: MobileBERT's auxiliary strategy, every term weighted 1."""
    return ExperimentConfig(
        model=case.model,
        objective=ObjectiveConfig(sentence=case.sentence, mask_prob=case.mask_prob),
        data=DataConfig(max_length=case.seq_len, batch_size=case.batch),
        optim=_optim(),
        trainer=TrainerConfig(max_steps=max_steps, compile=compile, compile_mode=mode),
        distill=DistillConfig(teacher=BENCH_TEACHER, strategy="auxiliary", fmt_weight=1.0, at_weight=1.0),
    )


def initial_weights(case: Case, seed: int) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The student's and the teacher's initial weights (every side starts from these)."""
    assert case.teacher is not None
    objective = ObjectiveConfig(sentence=case.sentence)
    torch.manual_seed(seed)
    student = build_pretraining_model(case.model, objective).state_dict()
    teacher = build_pretraining_model(case.teacher, objective).state_dict()
    return student, teacher


def ablate_module(
    case: Case, init: tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]], max_steps: int, compile: bool = False
) -> PretrainModule:
    """ablate's distillation module of ``case`` from the weights ``init`` (student, teacher)."""
    assert case.teacher is not None
    cfg = distill_cfg(case, max_steps, compile)
    student = build_pretraining_model(case.model, cfg.objective)
    student.load_state_dict(init[0])
    teacher = build_pretraining_model(case.teacher, cfg.objective)
    teacher.load_state_dict(init[1])
    return distill_module(cfg, teacher, case.teacher, student)


def ablate_distill_side(
    case: Case,
    init: tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]],
    precision: str,
    compile: bool,
    device: torch.device,
    max_steps: int,
) -> Side:
    """ablate's distillation step at ``case`` (the student compiled when ``compile``)."""
    module = ablate_module(case, init, max_steps, compile)
    module.to(device).train()  # the teacher stays in eval mode
    optimizer, schedule = module.optimizer_and_schedule()
    assert schedule is not None  # pre-training's: warmup, then linear decay
    stage = module.stages[0]

    def loss_only(batch: Batch) -> torch.Tensor:
        with _autocast(precision, device):
            return module.weighted(module.losses(batch, stage))

    def step(batch: Batch) -> torch.Tensor:
        with _autocast(precision, device):
            loss = module.training_step(batch, 0)
        loss.backward()  # type: ignore[no-untyped-call]  # torch leaves Tensor.backward unannotated
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach().clone()

    name = f"ablate {precision}" + (" compiled" if compile else "")
    return Side(name, "ablate", precision, step, loss_only, [*module.parameters(), *module.buffers()])


def _eager(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` with eager attention everywhere (the only transformers attention that returns probabilities)."""
    for module in model.modules():
        if (config := getattr(module, "config", None)) is not None:  # transformers keeps it on models and layers
            config._attn_implementation = "eager"
    return model


def _log(probabilities: torch.Tensor) -> torch.Tensor:
    """Log-probabilities: what :func:`attention_loss` turns back into the same distribution."""
    return probabilities.float().clamp_min(1e-30).log()


def hf_distill_side(case: Case, ours: PretrainModule, precision: str, device: torch.device, max_steps: int) -> Side:
    """transformers' distillation step at ``case``: teacher and student copied from ``ours``."""
    assert case.teacher is not None and ours.link is not None
    assert isinstance(ours.link.teacher, PretrainingModel)
    student = _eager(to_transformers(ours.model, case.model)).to(device).train()
    teacher = _eager(to_transformers(ours.link.teacher, case.teacher)).to(device).eval().requires_grad_(False)
    o = _optim()
    optimizer = adamw(param_groups(student, o.weight_decay), lr=o.lr, eps=o.eps)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_linear_decay(o, max_steps))
    w, temperature = ours.weights, ours.link.temperature
    assert w["mlm"] == w["sentence"] == 1.0, "transformers' own loss weighs MLM and NSP 1 each"
    lmap = layer_map(case.model.num_layers, case.teacher.num_layers)
    heads = [head_map(case.model.num_heads, case.teacher.num_heads) for _ in lmap]
    out = {"output_hidden_states": True, "output_attentions": True}

    def loss_only(batch: Batch) -> torch.Tensor:
        inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
        mask = batch["attention_mask"]
        with _autocast(precision, device):
            with torch.no_grad():
                t = teacher(**inputs, **out)
            s = student(**inputs, labels=batch["mlm_labels"], next_sentence_label=batch["sentence_label"], **out)
            masked = batch["mlm_labels"] != IGNORE
            kd = kd_loss(s.prediction_logits[masked], t.prediction_logits[masked], temperature)
            # hidden_states[0] is the embedding output: layer i's output is hidden_states[i + 1]
            fmt = torch.stack(
                [feature_map_loss(s.hidden_states[i + 1], t.hidden_states[j + 1], mask) for i, j in enumerate(lmap)]
            ).mean()
            at = torch.stack(
                [
                    attention_loss(_log(s.attentions[i]), _log(t.attentions[j]), heads[i], mask)
                    for i, j in enumerate(lmap)
                ]
            ).mean()
            loss: torch.Tensor = s.loss + w["kd"] * kd + w["fmt"] * fmt + w["at"] * at
            return loss

    def step(batch: Batch) -> torch.Tensor:
        loss = loss_only(batch)
        loss.backward()  # type: ignore[no-untyped-call]  # torch leaves Tensor.backward unannotated
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach().clone()

    params = [*student.parameters(), *student.buffers(), *teacher.parameters(), *teacher.buffers()]
    return Side(f"transformers eager {precision}", "transformers", precision, step, loss_only, params)


def build_distill_sides(
    case: Case, settings: list[str], device: torch.device, max_steps: int, seed: int = 0
) -> list[Side]:
    """The sides ``settings`` names for a distillation ``case`` (``ablate:fp32``, ``ablate:bf16:compile``,
    ``transformers:eager:fp32``, ...; transformers' SDPA settings are left out: no attention
    probabilities), all from one initialisation."""
    init = initial_weights(case, seed)
    reference = ablate_module(case, init, max_steps)
    sides = []
    for setting in settings:
        parts = setting.split(":")
        if parts[0] == "ablate":
            sides.append(ablate_distill_side(case, init, parts[1], "compile" in parts[2:], device, max_steps))
        elif parts[1] == "eager":
            sides.append(hf_distill_side(case, reference, parts[2], device, max_steps))
    return sides
