"""What data a run reads, resolved before anything is written and logged with the run:
:func:`check_data` resolves a config's data names (and the checkpoints and tokenizer it names)
without reading them, and :func:`data_tags` says, as MLflow tags, what they resolved to
(docs/data.md, "Checks" and "What a run records")."""

from __future__ import annotations

from pathlib import Path

from ablate.datamodules.catalog import ENV, active_catalog, check_model
from ablate.datamodules.hub_reach import check_reachable
from ablate.datamodules.sources import CorpusSpec, TaskData, resolve_corpus, resolve_task
from ablate.lightning_modules.config.experiment import ExperimentConfig
from ablate.lightning_modules.config.finetune import FinetuneConfig

CATALOG_TAG = "ablate.data.catalog"
"""The data catalog file in effect for the run (absent without one)."""
CORPUS_TAG = "ablate.data.corpus"
"""What ``data.corpus`` resolved to."""
TOKENIZER_TAG = "ablate.data.tokenizer"
"""Where ``data.tokenizer`` was read from (a folder, the catalog's model entry, the hub)."""
TASK_TAG = "ablate.data.finetune.{key}"
"""What ``finetune.train`` / ``finetune.validation`` resolved to."""
MAX_TAG = 8000
"""The longest tag value MLflow stores (``mlflow.utils.validation.MAX_TAG_VAL_LENGTH``)."""


def task_data(task: FinetuneConfig, prefix: str = "finetune") -> tuple[TaskData, TaskData] | None:
    """The resolved training and dev data of a ``finetune`` section (None: no ``train``); ``prefix``
    names it in errors (``tasks[0]`` for a study's first task)."""
    if task.train is None:
        return None
    train = resolve_task(f"{prefix}.train", task.train, task.train_split, "train")
    val = resolve_task(f"{prefix}.validation", task.validation or task.train, task.validation_split, "validation")
    return train, val


def check_task_reachable(task: FinetuneConfig, prefix: str = "finetune") -> None:
    """A task's data resolved (:func:`task_data`), and its hub datasets the catalog does not map cached
    or the hub reachable (:func:`~ablate.datamodules.hub_reach.check_reachable`)."""
    found = task_data(task, prefix)
    for key, data in zip(("train", "validation"), found or (), strict=False):
        if not data.files:
            check_reachable(f"{prefix}.{key}", data.name)


def check_data(cfg: ExperimentConfig) -> None:
    """Resolve the data names ``cfg`` reads, without reading them: a pre-training run's corpus, a fine-tuning
    run's ``finetune.train`` and ``finetune.validation``, and the checkpoints and tokenizer it names. Local
    files and the data catalog's copies must exist; other hub names are checked for their form (no network).

    Raises:
        DataError: a local file or the catalog's copy is missing; a hub name is malformed.
        ConfigError: ``ABLATE_DATA_CATALOG`` names a missing or malformed catalog.
    """
    if cfg.regime == "finetune":
        check_task_reachable(cfg.finetune)
    else:
        corpus = resolve_corpus(cfg.data.corpus, cfg.data.text_field)
        if not corpus.files:  # a hub dataset the catalog does not map
            check_reachable("data.corpus", cfg.data.corpus)
    for field, name in checkpoint_names(cfg).items():
        check_model(name, field)


def checkpoint_names(cfg: ExperimentConfig) -> dict[str, str]:
    """The checkpoints and tokenizer ``cfg`` names, by field: ``data.tokenizer``, ``init_from`` and the
    sources of its regime (``distill.teacher``, ``prune.source``, ``quant.source``, ``finetune.source``,
    ``finetune.augment_model``)."""
    named = {
        "data.tokenizer": cfg.data.tokenizer,
        "init_from": cfg.init_from,
        "distill.teacher": cfg.distill.teacher,
        "prune.source": cfg.prune.source,
        "quant.source": cfg.quant.source,
        "finetune.source": cfg.finetune.source,
        "finetune.augment_model": cfg.finetune.augment_model,
    }
    return {field: name for field, name in named.items() if name is not None}


def describe_model(name: str) -> str:
    """One line: where the checkpoint or tokenizer ``name`` is read from (without fetching it)."""
    catalog = active_catalog()
    folder = catalog.model(name) if catalog is not None else None
    if Path(name).expanduser().is_dir():
        return f"folder {Path(name).expanduser().absolute()}"
    if catalog is not None and folder is not None:
        return f"{name} via {ENV} ({catalog.file}): folder {folder}"
    return f"hub model {name}"


def describe(data: CorpusSpec | TaskData) -> str:
    """One line: ``hub DATASET[:CONFIG], split S``, or the files (through the catalog, if it mapped them;
    ``, articles 0:8`` after the file where it maps the split to part of one)."""
    if isinstance(data, CorpusSpec):
        hub, config, split, via, part = data.builder, data.config_name, "train", data.catalog, ""
    else:
        hub, config, split, via = data.builder, data.config, data.split, data.catalog
        part = f", {data.slice}" if data.slice is not None else ""
    if not data.files:
        return f"hub {hub}{f':{config}' if config else ''}, split {split} (datasets)"
    n = len(data.files)
    head = f"{split} split via {ENV} ({via}): " if via else ""
    head += f"{n} file{'s' * (n != 1)}: "
    shown: list[str] = []
    room = MAX_TAG - len(head) - 40  # for ", ... (N more)"
    for name in data.files:
        room -= len(name) + 2
        if room < 0:
            break
        shown.append(name)
    rest = n - len(shown)
    return head + ", ".join(shown) + (f", ... ({rest} more)" if rest else "") + part


def data_tags(cfg: ExperimentConfig) -> dict[str, str]:
    """MLflow tags saying what the run's data names resolved to: the catalog in effect and, per name, its
    hub dataset or its files (and the slice of a file the catalog maps a split to)."""
    catalog = active_catalog()
    tags = {CATALOG_TAG: str(catalog.file)} if catalog is not None else {}
    if cfg.regime == "finetune":
        resolved = task_data(cfg.finetune)
        for data in resolved or ():
            tags[TASK_TAG.format(key=data.key.rsplit(".", 1)[-1])] = describe(data)
    else:
        tags[CORPUS_TAG] = describe(resolve_corpus(cfg.data.corpus, cfg.data.text_field))
    if cfg.data.tokenizer is not None:
        tags[TOKENIZER_TAG] = describe_model(cfg.data.tokenizer)
    return tags
