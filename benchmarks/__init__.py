"""Benchmarks, run on demand with ``ablate bench`` (never in the test suite).

- :mod:`ablate.benchmarks.train_speed`: ablate's training step against Hugging Face transformers'
  ``*ForPreTraining`` at the same configuration, same weights and same batches, alternated
  in one process; :mod:`ablate.benchmarks.distill_speed` the same for a distillation step (the
  teacher's forward and the student's step).
- :mod:`ablate.benchmarks.ceiling`: a step's FLOPs and the machine's matmul peak per precision,
  the bound on any speed-up for the same arithmetic; precisions without fast kernels left out.
- :mod:`ablate.benchmarks.precision`: bf16 and ``torch.compile`` against fp32 over 300 steps.
- :mod:`ablate.benchmarks.data_speed`: the data pipeline's tokens/s per worker and the memory of
  streaming one shard against many.
- :mod:`ablate.benchmarks.sweep_pruning`: the wall time Optuna pruning saves on a 12-trial study.
- :mod:`ablate.benchmarks.loop`: a real ``ablate train`` against its isolated step, per regime
  (:mod:`ablate.benchmarks.regimes`: pre-training, distillation, pruning, fine-tuning).
- :mod:`ablate.benchmarks.study_bench`: where a study's time goes, run by run (start-up, steps,
  validation, teardown) and the study's efficiency.
- :mod:`ablate.benchmarks.deploy`: a bert-base-sized classifier where it is deployed: PyTorch fp32 against
  ONNX Runtime fp32, dynamic and static int8 and 4-bit, batch 1 and 32, one thread and every core.
- :mod:`ablate.benchmarks.status`: what a bench is doing, on stderr, while it runs.
"""


def mark(ok: bool) -> str:
    """How a table states a target: met or missed."""
    return "ok" if ok else "MISSED"
