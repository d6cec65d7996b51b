"""ablate: a research harness for BERT compression ablations.

The installed packages live under this namespace; the repository keeps the design card's
folders at its top and setuptools maps them here:

- :mod:`ablate.lightning_modules`: the config, the models and the LightningModules;
- :mod:`ablate.datamodules`: corpora, tokenizer, SOP/NSP pairs, masking, DataModules;
- :mod:`ablate.sweeps`: studies, Optuna, MLflow tracking, workers;
- :mod:`ablate.reports`: paper-style tables and plots from MLflow;
- :mod:`ablate.benchmarks`: ``ablate bench``;
- :mod:`ablate.cli`: the ``ablate`` command.
"""

__version__ = "0.1.0"
