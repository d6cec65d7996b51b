"""The library notes the ``ablate`` command hides (ablate.quiet): gone once its filters are installed,
and only those; nothing is installed by importing ablate. Each case runs in a fresh interpreter,
as the command does."""

from __future__ import annotations

import subprocess
import sys

import lightning
import pytest

HIDE = "from ablate.quiet import hide_library_notes; hide_library_notes(); "


def _stderr(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    return out.stderr


def test_torchao_kernel_notes_are_hidden_and_its_other_warnings_are_not() -> None:
    plain = _stderr("import ablate.cli, torchao")  # importing ablate installs nothing
    hidden = _stderr(HIDE + "import torchao, logging; logging.getLogger('torchao').warning('a real warning')")
    if "Failed to load" not in plain:
        pytest.skip("torchao loaded every kernel library here: nothing to hide")
    assert "_C_" in plain and "Failed to load" not in hidden
    assert "a real warning" in hidden


def test_lightning_notes_are_hidden_and_its_other_lines_are_not() -> None:
    """Lightning's cloud tips, its accelerator lines and its note on a batch limit print for every
    Trainer (a run has one per phase): hidden; a line Lightning logs about anything else still shows."""
    trainer = (
        "import lightning.pytorch as pl, logging; "
        "pl.Trainer(accelerator='cpu', logger=True, enable_progress_bar=False, limit_val_batches=1); "
        "logging.getLogger('lightning.pytorch.utilities.rank_zero').info('a real note')"
    )
    plain = _stderr(trainer)
    for note in ("GPU available: ", "TPU available: ", "`Trainer(limit_val_batches=1)`"):
        assert note in plain
    tips = "💡 Tip: For seamless cloud" in plain  # Lightning 2.5 on; 2.4 has none
    assert tips or lightning.__version__.startswith("2.4.")
    hidden = _stderr(HIDE + trainer)
    assert "Tip" not in hidden and "available" not in hidden and "configured so" not in hidden
    assert "a real note" in hidden


def test_onnxruntime_pre_processing_advice_is_hidden_and_other_root_warnings_are_not() -> None:
    """onnxruntime's quantizer logs its pre-processing advice on the root logger at every
    ``export --quantize``: hidden; another root warning still shows."""
    advice = (
        "import logging; logging.warning('Please consider to run pre-processing before quantization. Refer to x'); "
        "logging.warning('a real warning')"
    )
    assert "Please consider" in _stderr(advice)
    hidden = _stderr(HIDE + advice)
    assert "Please consider" not in hidden and "a real warning" in hidden


def test_the_note_on_a_resumed_runs_checkpoint_folder_is_hidden_and_other_warnings_are_not() -> None:
    """Lightning warns when a fit's checkpoint folder already holds files, which a resumed run's (a retried
    trial's) always does: hidden; another warning still shows."""
    fit = (
        "import pathlib, tempfile, warnings, lightning.pytorch as pl; "
        "from lightning.pytorch.demos.boring_classes import BoringModel; "
        "d = tempfile.mkdtemp(); pathlib.Path(d, 'last.ckpt').write_bytes(b'earlier'); "
        "pl.Trainer(max_steps=1, limit_val_batches=0, logger=False, enable_progress_bar=False, "
        "enable_model_summary=False, accelerator='cpu', default_root_dir=d, "
        "callbacks=[pl.callbacks.ModelCheckpoint(dirpath=d)]).fit(BoringModel()); "
        "warnings.warn('a real warning')"
    )
    assert "exists and is not empty" in _stderr(fit)
    hidden = _stderr(HIDE + fit)
    assert "exists and is not empty" not in hidden and "a real warning" in hidden


def test_every_command_and_mode_takes_verbose() -> None:
    from ablate.parsers import leaves, parser

    assert [leaf.prog for leaf in leaves(parser()) if "--verbose" not in leaf._option_string_actions] == []


@pytest.mark.parametrize(("verbose", "installed"), [(False, "True"), (True, "False")])
def test_verbose_installs_no_filter(verbose: bool, installed: str) -> None:
    """``--verbose`` (``prepare(verbose=True)``): no note filtered, so every library line shows."""
    code = (
        f"from ablate.process import prepare; prepare(signals=False, verbose={verbose}); import logging; "
        "from ablate.quiet import HIDDEN, DropMessage; "
        "print(any(isinstance(f, DropMessage) for n in HIDDEN for f in logging.getLogger(n).filters))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.strip() == installed
