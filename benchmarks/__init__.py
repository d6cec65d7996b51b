"""Benchmarks, run on demand with ``ablate bench`` (never in the test suite): ablate's step against
transformers' (``train_speed``, ``distill_speed``, ``ceiling``), ``precision``, the data pipeline
(``data_speed``), Optuna pruning (``sweep_pruning``), the loop against its step (``loop``,
``regimes``), a study's time (``study_bench``), the deployed classifier (``deploy``); docs/performance.md."""


def mark(ok: bool) -> str:
    """How a table states a target: met or missed."""
    return "ok" if ok else "MISSED"
