"""``ablate bench deploy --smoke``: the table of every setting at both thread counts and batch sizes, the CPU's
instruction sets, and the last line's format (its ratio parses; speed itself is a benchmark's, never a test's)."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("onnxruntime")

from ablate.benchmarks.deploy import CPU_FLAGS, ONNX_SETTINGS, TORCH, cpu_flags  # noqa: E402
from ablate.cli import main  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def test_the_smoke_bench_prints_the_table_and_ends_with_the_int8_ratio(capsys):
    assert main(["bench", "deploy", "--smoke"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    last = re.fullmatch(r"int8 over PyTorch fp32, batch 32: (\d+\.\d\d)x", lines[-1])
    assert last is not None, lines[-1]
    assert float(last.group(1)) > 0
    rows = [line for line in lines if line.startswith("| ") and not line.startswith("| setting")]
    settings = [TORCH, *ONNX_SETTINGS]
    threads = {row.split(" | ")[1] for row in rows}
    assert "1" in threads and len(rows) == len(settings) * len(threads)
    assert [row.split(" | ")[0].removeprefix("| ") for row in rows[: len(settings)]] == settings
    for row in rows:
        cells = row.strip("| ").split(" | ")
        assert float(cells[2]) > 0 and float(cells[4]) > 0 and cells[3].endswith("x")
    isa = next(line for line in lines if line.startswith("- instruction sets: "))
    assert all(f"{name} " in isa for name in CPU_FLAGS)


def test_cpu_flags_read_the_flags_line(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx_vnni\n", encoding="utf-8")
    assert cpu_flags(info) == {"AVX2": True, "AVX-512": True, "VNNI": True, "AMX": False}
    assert cpu_flags(tmp_path / "missing") == dict.fromkeys(CPU_FLAGS, False)


def test_smoke_is_refused_where_a_bench_has_none(capsys):
    assert main(["bench", "train", "--smoke"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: --smoke: only for `ablate bench study` and `ablate bench deploy` (not ablate bench train)"]
