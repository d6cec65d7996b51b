"""The GLUE benchmark as the papers evaluate it: its nine tasks by hub name, what each reads and
predicts, the metrics GLUE reports for it, its dev sets, and ALBERT's per-task fine-tuning settings
at BERT's sequence length; a task's score and the GLUE score as docs/guides/glue.md defines them."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, get_args

from ablate.lightning_modules.config.metric_names import GLUE_BERT_AVG, GLUE_SCORE
from ablate.lightning_modules.config.task_kinds import Kind, Metric

HUB = "nyu-mll/glue"
"""The hub dataset holding GLUE, one config per task (``nyu-mll/glue:mrpc``)."""

GlueName = Literal["cola", "sst2", "mrpc", "qqp", "stsb", "mnli", "qnli", "rte", "wnli"]
"""A GLUE task, as its hub config is named."""


@dataclass(frozen=True)
class DevSplit:
    """One dev set of a GLUE task: its hub split and the prefix its metrics are logged under."""

    split: str
    name: str


@dataclass(frozen=True)
class Recipe:
    """A task's fine-tuning settings (ALBERT's appendix A.4, at BERT's length)."""

    lr: float
    batch_size: int
    max_steps: int
    max_length: int = 128


@dataclass(frozen=True)
class GlueTask:
    """One GLUE task.

    Attributes:
        name: the hub config (``mrpc``); the run's ``finetune.task``.
        text_fields: the sentence column, or the pair's two.
        label_names: the labels' names in label order (the hub's); None for STS-B's score.
        kind: classification, or regression (STS-B: a similarity from 0 to 5).
        metrics: what GLUE reports for the task; its score is their mean. The first is what early
            stopping watches.
        dev: its dev sets (the first is ``finetune.validation_split``, the others ``extra_validation``).
        recipe: the papers' fine-tuning settings.
        bert_metric: the metric BERT's Table 1 reports where it is not the first of ``metrics``.
        train_size, dev_size: the hub's example counts (train; each dev set), for the docs and checks.
    """

    name: GlueName
    text_fields: tuple[str, ...]
    label_names: tuple[str, ...] | None
    kind: Kind
    metrics: tuple[Metric, ...]
    recipe: Recipe
    train_size: int
    dev_size: tuple[int, ...]
    dev: tuple[DevSplit, ...] = ()
    bert_metric: Metric | None = None

    @property
    def paper_metric(self) -> Metric:
        """The one metric BERT's Table 1 reports for the task (Devlin et al. 2019: F1 for MRPC and QQP,
        Spearman for STS-B, MCC for CoLA, accuracy for the others)."""
        return self.bert_metric or self.metrics[0]

    @property
    def hub(self) -> str:
        """The task's hub name, ``nyu-mll/glue:<name>``."""
        return f"{HUB}:{self.name}"

    @property
    def num_labels(self) -> int:
        """Outputs of its head: classes, or 1 for regression."""
        return 1 if self.label_names is None else len(self.label_names)

    @property
    def dev_sets(self) -> tuple[DevSplit, ...]:
        """Its dev sets: ``validation`` as the task, or those it names (MNLI's two)."""
        return self.dev or (DevSplit("validation", self.name),)

    def definition_fields(self) -> dict[str, object]:
        """The ``finetune`` fields that say what the task is: its data, dev sets, columns, labels and
        metrics (what ``finetune.task: mrpc`` fills in)."""
        first, *more = self.dev_sets
        return {
            "task": self.name,
            "kind": self.kind,
            "label_names": self.label_names,
            "train": self.hub,
            "validation": None,
            "validation_split": None if first.split == "validation" else first.split,
            "extra_validation": tuple({"name": d.name, "split": d.split} for d in more),
            "text_fields": self.text_fields,
            "label_field": "label",
            "num_labels": self.num_labels,
            "metric": self.metrics[0],
            "score_metrics": self.metrics,
        }

    def finetune_fields(self) -> dict[str, object]:
        """The task's fields and the papers' settings (what ``finetune.glue: mrpc`` fills in):
        validated every tenth of the schedule, never stopped early (the best of the ten is kept)."""
        r = self.recipe
        return {
            **self.definition_fields(),
            "lr": r.lr,
            "batch_size": r.batch_size,
            "max_steps": r.max_steps,
            "max_length": r.max_length,
            "val_every": max(1, r.max_steps // 10),
            "patience": 10,
        }


_NLI = ("entailment", "not_entailment")
GLUE: Mapping[str, GlueTask] = {
    t.name: t
    for t in (
        GlueTask("cola", ("sentence",), ("unacceptable", "acceptable"), "classification", ("mcc",),
                 Recipe(1e-5, 16, 5336), 8551, (1043,)),
        GlueTask("sst2", ("sentence",), ("negative", "positive"), "classification", ("accuracy",),
                 Recipe(1e-5, 32, 20935), 67349, (872,)),
        GlueTask("mrpc", ("sentence1", "sentence2"), ("not_equivalent", "equivalent"), "classification",
                 ("f1", "accuracy"), Recipe(2e-5, 32, 800), 3668, (408,)),
        GlueTask("qqp", ("question1", "question2"), ("not_duplicate", "duplicate"), "classification",
                 ("f1", "accuracy"), Recipe(5e-5, 128, 14000), 363846, (40430,)),
        GlueTask("stsb", ("sentence1", "sentence2"), None, "regression", ("pearson", "spearman"),
                 Recipe(2e-5, 16, 3598), 5749, (1500,), bert_metric="spearman"),
        GlueTask("mnli", ("premise", "hypothesis"), ("entailment", "neutral", "contradiction"), "classification",
                 ("accuracy",), Recipe(3e-5, 128, 10000), 392702, (9815, 9832),
                 dev=(DevSplit("validation_matched", "mnli"), DevSplit("validation_mismatched", "mnli-mm"))),
        GlueTask("qnli", ("question", "sentence"), _NLI, "classification", ("accuracy",),
                 Recipe(1e-5, 32, 33112), 104743, (5463,)),
        GlueTask("rte", ("sentence1", "sentence2"), _NLI, "classification", ("accuracy",),
                 Recipe(3e-5, 32, 800), 2490, (277,)),
        GlueTask("wnli", ("sentence1", "sentence2"), ("not_entailment", "entailment"), "classification",
                 ("accuracy",), Recipe(2e-5, 16, 2000), 635, (71,)),
    )
}  # fmt: skip
"""The nine GLUE tasks by name, in the benchmark's order."""

assert tuple(GLUE) == get_args(GlueName)

WNLI = "wnli"


def suite(wnli: bool = False) -> tuple[str, ...]:
    """The GLUE tasks a study's ``tasks: glue`` fine-tunes: all nine, or all but WNLI (the default)."""
    return tuple(name for name in GLUE if wnli or name != WNLI)


@dataclass(frozen=True)
class Convention:
    """One way papers make GLUE's single number from a model's dev results.

    Attributes:
        metric: the trial metric it is logged as.
        columns: the ``<dev set>/best_<metric>`` metrics it averages for a task (its GLUE entry and
            the names of its dev sets as the run logged them: ``("mnli", "mnli-mm")``).
        wnli: whether WNLI counts; None: as the study says (``glue_wnli``).
    """

    metric: str
    columns: Callable[[GlueTask, Sequence[str]], tuple[str, ...]]
    wnli: bool | None

    def average(self, best: Mapping[str, float], devs: Mapping[str, Sequence[str]], wnli: bool = False) -> float | None:
        """The mean of its columns over the GLUE tasks in ``devs`` (GLUE name -> the run's dev set names)
        found in ``best``; None when none counts or one is missing."""
        counts = wnli if self.wnli is None else self.wnli
        names = [c for task, d in devs.items() if task != WNLI or counts for c in self.columns(GLUE[task], d)]
        if not names or any(n not in best for n in names):
            return None
        return statistics.fmean(best[n] for n in names)


LEADERBOARD = Convention(GLUE_SCORE, lambda task, devs: (f"{devs[0]}/best_score",), wnli=None)
"""The GLUE leaderboard's score (Wang et al. 2019): the mean over the tasks of each task's score, the
mean of its metrics (MNLI's over its matched and mismatched dev sets); the leaderboard counts WNLI,
a study only with ``glue_wnli`` (BERT, DistilBERT and ALBERT leave it out of their dev averages)."""
BERT_AVERAGE = Convention(
    GLUE_BERT_AVG, lambda task, devs: tuple(f"{d}/best_{task.paper_metric}" for d in devs), wnli=False
)
"""BERT's Table 1 "Average" (Devlin et al. 2019): one metric per task (:attr:`GlueTask.paper_metric`),
MNLI-m and MNLI-mm as two columns, WNLI left out."""
CONVENTIONS = (LEADERBOARD, BERT_AVERAGE)


def counted(tasks: Iterable[str], wnli: bool = False) -> list[str]:
    """The GLUE tasks among ``tasks`` the leaderboard's score averages: WNLI only when ``wnli``."""
    return [name for name in tasks if name in GLUE and (wnli or name != WNLI)]
