"""ablate: a research harness for BERT compression ablations. The installed packages live under this
namespace (``ablate.lightning_modules``, ``ablate.datamodules``, ``ablate.sweeps``, ``ablate.reports``,
``ablate.benchmarks``); the repository keeps the design card's folders at its top and setuptools maps them
here (docs/development.md, "Layout")."""

__version__ = "0.1.0"
