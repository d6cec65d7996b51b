"""One frozen, validated config for a run.

Every field is addressed by its dotted name (``model.embed_dim``); the same names are
the ``key=value`` overrides on the command line, the Optuna parameter names of a sweep,
the MLflow params of a run and the columns of a report.

Validation happens once, when the config is built: unknown keys, wrong types and
impossible shapes raise :class:`ConfigError` naming the dotted key.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from typing import Annotated, Any, Literal

import yaml
from pydantic import Field, model_validator
from pydantic.dataclasses import dataclass

from ablate.lightning_modules.distill_config import DistillConfig, schedule
from ablate.lightning_modules.errors import STRICT
from ablate.lightning_modules.fields import NonNegFloat, NonNegInt, PosFloat, PosInt, Prob
from ablate.lightning_modules.finetune_config import FinetuneConfig
from ablate.lightning_modules.pruning.config import PruneConfig
from ablate.lightning_modules.quant_config import QuantConfig
from ablate.lightning_modules.run_config import OptimConfig, TrackingConfig, TrainerConfig

Sharing = Literal["none", "all", "attn", "ffn"]
# sharing mode -> (share attention across layers, share feed-forward stacks across layers)
SHARES: dict[str, tuple[bool, bool]] = {
    "none": (False, False),
    "all": (True, True),
    "attn": (True, False),
    "ffn": (False, True),
}
Norm = Literal["layer_norm", "no_norm"]
Regime = Literal["pretrain", "distill", "prune", "finetune", "quant"]
# a regime other than pre-training starts from a trained model, named by this field
REGIME_SOURCE: dict[str, str] = {
    "distill": "distill.teacher",
    "prune": "prune.source",
    "finetune": "finetune.source",
    "quant": "quant.source",
}
Activation = Literal["gelu", "relu"]
ACCELERATORS = ("auto", "cpu", "gpu", "cuda", "mps", "tpu")
"""``trainer.accelerator`` values Lightning knows."""
MAX_SEED = 2**32 - 1
"""The largest ``seed`` (numpy's, which Lightning seeds too)."""


@dataclass(frozen=True, config=STRICT)
class LayerSpec:
    """One layer's dimensions (schuBERT): heads a_i, per-head query/key width k_i, per-head
    value width v_i and feed-forward width f_i. k_i != v_i is allowed."""

    num_heads: PosInt
    qk_dim: PosInt
    v_dim: PosInt
    ffn_dim: PosInt


@dataclass(frozen=True, config=STRICT)
class ModelConfig:
    """Encoder architecture (BERT/ALBERT family).

    Attributes:
        vocab_size: V, also the size of the WordPiece tokenizer trained for the run.
        embed_dim: E, the word-embedding size; E != H adds an E->H projection.
        hidden_dim: H, the width of the residual stream.
        num_layers: L, transformer blocks run (shared blocks still run L times).
        num_heads: A, attention heads; H must be divisible by A.
        ffn_dim: inner size of each feed-forward sub-layer.
        num_ffn: F, stacked feed-forward sub-layers per block (MobileBERT), each with
            its own residual and norm.
        intra_dim: width inside a block (MobileBERT): None = H, no bottleneck; otherwise
            each block has a linear H -> intra_dim in and intra_dim -> H out, with the
            residual between blocks at H. Narrower than H is MobileBERT's bottleneck,
            wider is IB-BERT's inverted bottleneck.
        attention_input: with a bottleneck, where attention reads from: ``bottleneck``
            (Q, K, V from the narrow block input), ``hidden`` (Q, K, V from the H-wide
            block input; IB-BERT) or ``shared_qk`` (Q, K from a second, shared H ->
            intra_dim bottleneck, V from the H-wide input; the released MobileBERT).
        embedding: ``plain`` (word + position + token type at width E, then E -> H) or
            ``trigram`` (MobileBERT: word embeddings of t+1, t, t-1 concatenated, 3E ->
            H, then position and token type at H).
        layers: per-layer dimensions (schuBERT); None = every layer uses ``num_heads``
            heads of width intra_dim / num_heads and ``ffn_dim``.
        mlm_head: ``factorized`` (BERT/ALBERT: H -> E transform, norm, decoder tied to the
            V x E word embedding) or ``mobilebert`` (H -> H transform, LayerNorm, decoder
            ``[word embedding V x E ; extra V x (H - E)]``, as released MobileBERT).
        sharing: cross-layer sharing, ``none | all | attn | ffn`` (ALBERT).
        norm: ``layer_norm`` or ``no_norm`` (MobileBERT's ``h * gamma + beta``).
        activation: ``gelu`` or ``relu``.
        position: ``learned`` absolute position embeddings or ``none``.
        max_position: rows of the position embedding.
        token_types: rows of the token-type embedding; 0 removes it.
        embed_norm: norm after the embedding sum.
        dropout: dropout on embeddings, attention probabilities and sub-layer outputs;
            0 removes the dropout modules.
        norm_eps: epsilon of LayerNorm.
        init_std: std of the normal initialisation of weights.
    """

    vocab_size: PosInt = 30000
    embed_dim: PosInt = 128
    hidden_dim: PosInt = 768
    num_layers: PosInt = 12
    num_heads: PosInt = 12
    ffn_dim: PosInt = 3072
    num_ffn: PosInt = 1
    intra_dim: PosInt | None = None
    attention_input: Literal["bottleneck", "hidden", "shared_qk"] = "bottleneck"
    embedding: Literal["plain", "trigram"] = "plain"
    layers: tuple[LayerSpec, ...] | None = None
    mlm_head: Literal["factorized", "mobilebert"] = "factorized"
    sharing: Sharing = "none"
    norm: Norm = "layer_norm"
    activation: Activation = "gelu"
    position: Literal["learned", "none"] = "learned"
    max_position: PosInt = 512
    token_types: NonNegInt = 2
    embed_norm: bool = True
    dropout: Prob = 0.1
    norm_eps: PosFloat = 1e-12
    init_std: PosFloat = 0.02

    @model_validator(mode="after")
    def _check_shapes(self) -> ModelConfig:
        width = "hidden_dim" if self.intra_dim is None else "intra_dim"
        if self.layers is None and self.block_dim % self.num_heads:
            raise ValueError(f"num_heads: {width} {self.block_dim} is not divisible by num_heads {self.num_heads}")
        if self.layers is not None and len(self.layers) != self.num_layers:
            raise ValueError(f"layers: gives {len(self.layers)} layers but num_layers is {self.num_layers}")
        if self.embedding == "trigram" and self.embed_dim > self.hidden_dim:
            raise ValueError(
                f"embed_dim: a trigram embedding needs E <= H, got E={self.embed_dim} > H={self.hidden_dim}"
            )
        if self.mlm_head == "mobilebert" and self.embed_dim > self.hidden_dim:
            raise ValueError(f"mlm_head: 'mobilebert' decodes at H and needs E <= H, got E={self.embed_dim}")
        if self.attention_input != "bottleneck" and self.intra_dim is None:
            raise ValueError(f"attention_input: {self.attention_input!r} needs a bottleneck (set model.intra_dim)")
        specs = self.layer_specs()
        share_attn, share_ffn = SHARES[self.sharing]
        for i, spec in enumerate(specs[1:], start=1):
            first = specs[0]
            attn_differs = (spec.num_heads, spec.qk_dim, spec.v_dim) != (first.num_heads, first.qk_dim, first.v_dim)
            if (share_attn and attn_differs) or (share_ffn and spec.ffn_dim != first.ffn_dim):
                raise ValueError(
                    f"sharing: {self.sharing!r} shares modules across layers, but model.layers "
                    f"differ at layer {i} ({spec} vs {first})"
                )
        return self

    @property
    def head_dim(self) -> int:
        """Width of one attention head in the uniform short form, block width / A."""
        return self.block_dim // self.num_heads

    @property
    def block_dim(self) -> int:
        """Width inside a block: intra_dim with a bottleneck, else H."""
        return self.intra_dim or self.hidden_dim

    def layer_specs(self) -> tuple[LayerSpec, ...]:
        """Per-layer dimensions, from ``layers`` or the uniform fields."""
        if self.layers is not None:
            return self.layers
        uniform = LayerSpec(num_heads=self.num_heads, qk_dim=self.head_dim, v_dim=self.head_dim, ffn_dim=self.ffn_dim)
        return (uniform,) * self.num_layers


def prediction_slots(tokens: int, mask_prob: float) -> int:
    """How many MLM predictions a batch of ``tokens`` positions has room for: 1.25x the
    expected count, a multiple of 8, at most ``tokens``.

    The number is fixed for a batch shape, so the model's MLM head runs on a tensor of static
    shape (one compiled graph, CUDA graphs possible, no host sync to learn a count); the
    masking caps its selection to it (:func:`datamodules.masking.cap_selection`), which
    binds only in rare batches far above the expected count."""
    slots = -(-int(1.25 * tokens * mask_prob) // 8) * 8
    return min(tokens, slots)


@dataclass(frozen=True, config=STRICT)
class ObjectiveConfig:
    """Pre-training objective.

    Attributes:
        sentence: sentence-level task, ``sop`` (ALBERT), ``nsp`` (BERT) or ``none``.
        masking: ``token``, ``whole_word`` or ALBERT's ``ngram`` span masking.
        mask_prob: fraction of tokens selected for prediction (80% [MASK], 10% random,
            10% kept).
        max_ngram: longest n-gram for ``ngram`` masking (ALBERT uses 3).
        sentence_weight: weight of the sentence loss next to the MLM loss.
    """

    sentence: Literal["sop", "nsp", "none"] = "sop"
    masking: Literal["token", "whole_word", "ngram"] = "token"
    mask_prob: Annotated[float, Field(gt=0.0, lt=1.0)] = 0.15
    max_ngram: PosInt = 3
    sentence_weight: NonNegFloat = 1.0


@dataclass(frozen=True, config=STRICT)
class DataConfig:
    """Corpus, tokenizer and batching.

    Attributes:
        corpus: a builtin name (``norvig-big``), a local file, glob or directory
            (``text``, ``json``/``jsonl`` optionally ``.gz``, ``parquet``), or a
            ``datasets`` hub name (``wikitext/wikitext-103-raw-v1``), streamed.
        text_field: column holding the document text in json/parquet/hub corpora.
        text_doc_chars: in ``.txt`` corpora (and ``norvig-big``), a document groups
            consecutive paragraphs up to about this many characters, so that books whose
            paragraphs are single lines still give pairs that fill ``max_length``;
            0 = one paragraph per document.
        max_length: tokens per packed sequence, [CLS] and [SEP]s included.
        lowercase: lowercase and strip accents before WordPiece.
        tokenizer_docs: documents read to train the WordPiece tokenizer.
        val_fraction: fraction of documents held out for validation (by hash).
        short_seq_prob: probability of a shorter target length (BERT's trick).
        batch_size: sequences per batch.
        num_workers: DataLoader worker processes per device, or ``auto`` (default): one per
            core the device's share of the machine has, less one for the training process,
            at least 1 (:meth:`workers`); the number used is tagged on the run
            (``ablate.num_workers``). The data stream depends on it: set a number to get the
            same batches on another machine.
        shuffle_buffer: examples in the streaming shuffle buffer (0 = no shuffle).
        cache_dir: where trained tokenizers are cached; None = ``~/.cache/ablate``.
    """

    corpus: str = "norvig-big"
    text_field: str = "text"
    text_doc_chars: NonNegInt = 4000
    max_length: Annotated[int, Field(ge=16)] = 128
    lowercase: bool = True
    tokenizer_docs: PosInt = 20000
    val_fraction: Annotated[float, Field(gt=0.0, lt=1.0)] = 0.02
    short_seq_prob: Annotated[float, Field(ge=0.0, le=1.0)] = 0.1
    batch_size: PosInt = 32
    num_workers: NonNegInt | Literal["auto"] = "auto"
    shuffle_buffer: NonNegInt = 1000
    cache_dir: str | None = None

    def workers(self, devices: int = 1) -> int:
        """``num_workers`` resolved for a run on ``devices`` devices of this machine."""
        if self.num_workers != "auto":
            return self.num_workers
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 2)
        return max(1, cores // max(1, devices) - 1)


@dataclass(frozen=True, config=STRICT)
class ExperimentConfig:
    """Everything one training run needs.

    Attributes:
        regime: what the run is: ``pretrain``, ``distill`` (from ``distill.teacher``), ``prune``
            (``prune.source``), ``finetune`` (``finetune.source``) or ``quant`` (``quant.source``:
            quantize a trained model; ``quant.method`` without a source quantizes the model any
            other regime trains, when it ends). Left out, it is the regime
            whose source is set (``pretrain`` when none is); a config naming two regimes' sources,
            or a regime without its own, is an error, as is a field set in another regime's
            section (``distill.*`` in a pre-training run). Logged as the param ``regime``.
        init_from: start from a checkpoint's weights instead of a random initialisation: a
            transformers checkpoint folder (BERT, ALBERT, MobileBERT ``*ForPreTraining``) or an
            ``ablate export`` folder. ``model`` must describe the checkpoint's architecture
            (``dropout`` and ``init_std`` may differ); otherwise the run stops with an error
            listing the ``model.key=value`` overrides that match it. See
            :func:`lightning_modules.interop.initial_model`.
    """

    name: str = "experiment"
    regime: Regime | None = None
    seed: int = 0
    init_from: str | None = None
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    objective: ObjectiveConfig = dataclasses.field(default_factory=ObjectiveConfig)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)
    trainer: TrainerConfig = dataclasses.field(default_factory=TrainerConfig)
    tracking: TrackingConfig = dataclasses.field(default_factory=TrackingConfig)
    distill: DistillConfig = dataclasses.field(default_factory=DistillConfig)
    prune: PruneConfig = dataclasses.field(default_factory=PruneConfig)
    finetune: FinetuneConfig = dataclasses.field(default_factory=FinetuneConfig)
    quant: QuantConfig = dataclasses.field(default_factory=QuantConfig)

    @model_validator(mode="after")
    def _resolve_regime(self) -> ExperimentConfig:
        """The run's regime: as named, else the one whose source is set, else ``pretrain``.

        Sources of two regimes, or a regime without its source (or with another's), are errors.
        """
        sources = {
            "distill": self.distill.teacher,
            "prune": self.prune.source,
            "finetune": self.finetune.source,
            "quant": self.quant.source,
        }
        named = [r for r, source in sources.items() if source is not None]
        if len(named) > 1:
            first, second = (REGIME_SOURCE[r] for r in named[:2])
            regimes = ", ".join(("pretrain", *REGIME_SOURCE))
            raise ValueError(f"{second}: a run has one regime ({regimes}); {first} is set too")
        found = named[0] if named else "pretrain"
        if self.regime is not None and self.regime != found:
            if self.regime == "pretrain":
                raise ValueError(f"{REGIME_SOURCE[found]}: set, but regime is 'pretrain' (use regime: {found})")
            raise ValueError(f"{REGIME_SOURCE[self.regime]}: required by regime '{self.regime}'")
        object.__setattr__(self, "regime", found)  # frozen: resolved once, here
        for regime in ("distill", "prune", "finetune"):  # the other regimes' sections stay at their defaults
            section = getattr(self, regime)
            default = type(section)()
            changed = [
                f.name for f in dataclasses.fields(section) if getattr(section, f.name) != getattr(default, f.name)
            ]
            if regime != found and changed:
                raise ValueError(
                    f"{regime}.{changed[0]}: only for a {regime} run ({REGIME_SOURCE[regime]}); this run is {found!r}"
                )
        return self

    @model_validator(mode="after")
    def _check_distill(self) -> ExperimentConfig:
        if self.distill.teacher is None:
            return self
        if self.distill.strategy == "progressive" and self.model.sharing != "none":
            raise ValueError(
                f"distill.strategy: 'progressive' freezes layers one at a time and needs "
                f"model.sharing 'none', not {self.model.sharing!r}"
            )
        if self.distill.layer_map is not None and len(self.distill.layer_map) != self.model.num_layers:
            raise ValueError(
                f"distill.layer_map: gives {len(self.distill.layer_map)} layers but the student has "
                f"model.num_layers {self.model.num_layers}"
            )
        try:
            schedule(self.distill, self.model.num_layers, self.trainer.max_steps)
        except ValueError as exc:
            raise ValueError(f"distill.{exc}") from None
        return self

    @model_validator(mode="after")
    def _check_sections(self) -> ExperimentConfig:
        """Constraints between sections that would otherwise fail inside the training loop, after
        the MLflow run exists: ``key: what is wrong (the other key and its value)``."""
        if not 0 <= self.seed <= MAX_SEED:
            raise ValueError(f"seed: must be between 0 and {MAX_SEED} (numpy's range), got {self.seed}")
        if self.trainer.accelerator not in ACCELERATORS:
            raise ValueError(
                f"trainer.accelerator: {self.trainer.accelerator!r} is not one of {', '.join(ACCELERATORS)}"
            )
        if self.quant.method == "qat-int8" and self.regime == "prune":
            raise ValueError(
                "quant.method: 'qat-int8' trains with fake quantization, which pruning's phases do not; "
                "quantize the pruned model after training (dynamic-int8, weight-int8 ...)"
            )
        if self.regime not in ("pretrain", "distill"):  # the model is the source's: checked when it is loaded
            return self
        m, data = self.model, self.data
        # the default length is not held against a model with fewer positions: such configs describe
        # models (exports, tests); a run of one sets its own data.max_length
        if m.position == "learned" and m.max_position < data.max_length != DataConfig().max_length:
            raise ValueError(
                f"data.max_length: {data.max_length} tokens, but the position embedding has "
                f"model.max_position {m.max_position} rows (raise model.max_position or lower data.max_length)"
            )
        if m.token_types == 1 and (self.objective.sentence != "none" or self.trainer.intrinsic):
            why = (
                f"objective.sentence {self.objective.sentence!r} puts a second segment (token type 1) in each sequence"
                if self.objective.sentence != "none"
                else "trainer.intrinsic probes NSP and SOP on segment pairs (token type 1)"
            )
            raise ValueError(f"model.token_types: 1 row, but {why}; use 2, or 0 for no token-type embedding")
        return self


def to_dict(cfg: Any) -> dict[str, Any]:
    """Nested plain-Python dict of a config dataclass."""
    return dataclasses.asdict(cfg)


def flatten(cfg: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted-name -> value for every leaf field: the MLflow params and report columns."""
    out: dict[str, Any] = {}
    for key, value in (to_dict(cfg) if dataclasses.is_dataclass(cfg) else cfg).items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = value
    return out


def to_yaml(cfg: ExperimentConfig) -> str:
    """The resolved config as YAML, loadable by :func:`load_config`."""
    text: str = yaml.safe_dump(to_dict(cfg), sort_keys=False)
    return text


def config_digest(cfg: ExperimentConfig) -> str:
    """sha256 of the resolved config's YAML: equal digests, equal runs."""
    return hashlib.sha256(to_yaml(cfg).encode()).hexdigest()


def run_params(cfg: ExperimentConfig) -> dict[str, Any]:
    """The fields the run uses, dotted: :func:`flatten` without the sections of the other regimes
    (a pre-training run logs no ``distill.*``, ``prune.*`` or ``finetune.*``), and of ``quant`` the
    fields its method reads (``quant.method`` always: a report's column for every run)."""
    unused = tuple(f"{regime}." for regime in REGIME_SOURCE if regime not in (cfg.regime, "quant"))
    quant = {f"quant.{name}" for name in cfg.quant.used_fields() if name != "source" or cfg.regime == "quant"}
    return {
        k: v for k, v in flatten(cfg).items() if not k.startswith(unused) and (not k.startswith("quant.") or k in quant)
    }


def field_names() -> set[str]:
    """Every valid dotted key."""
    return set(flatten(ExperimentConfig()))
