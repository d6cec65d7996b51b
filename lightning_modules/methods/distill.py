"""What joins a student to a frozen teacher: :class:`TeacherLink` (layer and head maps, learned projections)
and the initialisations a student can take from its teacher (:func:`copy_embeddings`, :func:`copy_layers`:
DistilBERT's every other layer). The terms the link serves (``fmt``, ``at``, ``embed``, ``cos``) are computed in
the registry of terms (:mod:`ablate.lightning_modules.methods.terms`); docs/guides/distillation.md."""

from __future__ import annotations

import torch
from torch import nn

from ablate.lightning_modules.config.distill import MIX_PROB, DistillConfig
from ablate.lightning_modules.config.errors import ConfigError
from ablate.lightning_modules.config.model import ModelConfig
from ablate.lightning_modules.methods.losses import head_map, layer_map
from ablate.lightning_modules.methods.task_model import TeacherModel
from ablate.lightning_modules.model.components.embeddings import Embeddings
from ablate.lightning_modules.model.encoder import Encoder, Trace
from ablate.lightning_modules.model.heads import PretrainingModel
from ablate.lightning_modules.model.vocab_bridge import VocabBridge, VocabMap


def copy_embeddings(student: Embeddings, teacher: Embeddings, mode: str) -> list[str]:
    """Copy the teacher's embedding weights into the student's; return the names copied.

    ``word``: the word embedding only (its V x E shape must match). ``all``: every tensor the
    student has whose name and shape match the teacher's; parts the student dropped
    (positions, token types, the norm) stay dropped.
    """
    if mode == "none":
        return []
    mine, theirs = student.state_dict(), teacher.state_dict()
    if mine["word.weight"].shape != theirs["word.weight"].shape:
        raise ConfigError(
            f"distill.init_embeddings: the student's word embedding is {tuple(mine['word.weight'].shape)}"
            f" but the teacher's is {tuple(theirs['word.weight'].shape)} (set model.embed_dim)"
        )
    names = ["word.weight"] if mode == "word" else [n for n in mine if n in theirs and theirs[n].shape == mine[n].shape]
    with torch.no_grad():
        for name in names:
            mine[name].copy_(theirs[name])
    return names


def init_layer_map(mode: str, student_layers: int, teacher_layers: int, mapped: list[int]) -> list[int]:
    """The teacher layer each student layer starts from: ``every_other`` 0, 2, 4, ... (DistilBERT),
    ``layer_map`` the transfer's map; [] for ``none``."""
    if mode == "none":
        return []
    chosen = [2 * i for i in range(student_layers)] if mode == "every_other" else list(mapped)
    if max(chosen) >= teacher_layers:
        raise ConfigError(
            f"distill.init_layers: {mode} needs teacher layer {max(chosen)}, "
            f"but the teacher has {teacher_layers} layers"
        )
    return chosen


def copy_layers(student: Encoder, teacher: Encoder, chosen: list[int]) -> list[str]:
    """Copy teacher layer ``chosen[i]``'s weights into student layer i (attention, FFN stack,
    bottleneck); return the names copied (``layer i <- j``).

    Every tensor must have the teacher's shape: ConfigError names the first that does not. A
    student whose layers share weights takes the teacher layer of the first student layer using them.
    """
    done: set[tuple[int, int]] = set()
    copied: list[str] = []
    where = {id(m): name for name, m in student.named_modules()}  # a module's name in the encoder
    for i, j in enumerate(chosen):
        for kind, (mine, theirs) in enumerate(zip(student.layer_modules(i), teacher.layer_modules(j), strict=False)):
            if (kind, id(mine)) in done:  # shared with an earlier student layer
                continue
            done.add((kind, id(mine)))
            src, dst = theirs.state_dict(), mine.state_dict()
            for name, tensor in dst.items():
                if name not in src or src[name].shape != tensor.shape:
                    have = tuple(src[name].shape) if name in src else "no such tensor"
                    raise ConfigError(
                        f"distill.init_layers: student layer {i} cannot start from teacher layer {j}: "
                        f"encoder.{where[id(mine)]}.{name} is {tuple(tensor.shape)} in the student, "
                        f"{have} in the teacher"
                    )
            with torch.no_grad():
                for name, tensor in dst.items():
                    tensor.copy_(src[name])
        copied.append(f"layer {i} <- {j}")
    return copied


class TeacherLink(nn.Module):
    """A frozen teacher and what joins the student to it.

    Args:
        d: the ``distill`` section (layer map, attention loss, temperature).
        teacher: the teacher model (a ``PretrainingModel`` or a ``Classifier``); frozen here.
        teacher_cfg: the teacher's architecture.
        student_cfg: the student's architecture.
        vocab: for a student with its own, smaller vocabulary, the map of its ids to the
            teacher's: the link then holds the :class:`VocabBridge` that teaches through it (``vocab``).
    """

    def __init__(
        self,
        d: DistillConfig,
        teacher: TeacherModel,
        teacher_cfg: ModelConfig,
        student_cfg: ModelConfig,
        vocab: VocabMap | None = None,
    ) -> None:
        super().__init__()
        self.teacher: TeacherModel = teacher.eval().requires_grad_(False)
        self.temperature, self.at_mode = d.temperature, d.at_loss
        Ls, Lt = student_cfg.num_layers, teacher_cfg.num_layers
        self.layer_map = list(d.layer_map) if d.layer_map is not None else layer_map(Ls, Lt)
        if max(self.layer_map) >= Lt:
            raise ConfigError(
                f"distill.layer_map: teacher layer {max(self.layer_map)} does not exist (the teacher has {Lt} layers)"
            )
        s_specs, t_specs = student_cfg.layer_specs(), teacher_cfg.layer_specs()
        self.heads_error: str | None = None  # why attention transfer cannot pair the heads (the at term is refused)
        try:
            self.head_maps = [
                head_map(s_specs[i].num_heads, t_specs[j].num_heads) for i, j in enumerate(self.layer_map)
            ]
        except ValueError as exc:
            self.heads_error, self.head_maps = str(exc), []
        Hs, Ht = student_cfg.hidden_dim, teacher_cfg.hidden_dim
        self.shared = d.projection == "shared"
        if self.shared and Hs == Ht:
            raise ConfigError(
                f"distill.projection: 'shared' projects the student's hidden states to the teacher's width, "
                f"but both are H={Hs} (model.hidden_dim): there is nothing to project; use per_layer"
            )
        # projections student H -> teacher H: one per layer, then one for the embedding (TinyBERT's W_h),
        # or one for all (Zhao et al.); every hidden state the traces record is H wide
        count = 1 if self.shared else Ls + 1
        self.project = nn.ModuleList(nn.Linear(Hs, Ht) for _ in range(count)) if Hs != Ht else None
        self.vocab: VocabBridge | None = None  # a student with its own vocabulary: Zhao et al.'s dual training
        if vocab is not None:
            assert isinstance(teacher, PretrainingModel), "dual training reads a pre-trained teacher's MLM head"
            mix = MIX_PROB if d.mix_prob is None else d.mix_prob
            self.vocab = VocabBridge(vocab, teacher, student_cfg.embed_dim, mix)

    def train(self, mode: bool = True) -> TeacherLink:
        super().train(mode)
        self.teacher.eval()  # the teacher's dropout stays off
        return self

    def traces(self, layers: tuple[int, ...], attention: bool, full: bool) -> tuple[Trace, Trace]:
        """What the student and the teacher record for a stage on ``layers``: the attention scores
        when ``attention``, and (unless ``full``: the prediction layer is needed too) only up to
        the last layer that counts."""
        s = Trace(attention=frozenset(layers) if attention else frozenset(), until=None if full else max(layers))
        mapped = [self.layer_map[i] for i in layers]
        t = Trace(attention=frozenset(mapped) if attention else frozenset(), until=None if full else max(mapped))
        return s, t

    def learned(self) -> list[nn.Module]:
        """What the link trains beside the student: the projections and the vocabulary bridge."""
        return [m for m in (self.project, self.vocab) if m is not None]

    def projected(self, x: torch.Tensor, index: int) -> torch.Tensor:
        """x (B, T, H_s) -> (B, T, H_t) through projection ``index`` (layer i, or -1: the embedding)."""
        return x if self.project is None else self.project[0 if self.shared else index](x)
