"""tests/forked.py: a forked command is a process of its own that answers as ``python -m ablate`` does."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

from tests import forked


def test_a_forked_command_prints_and_exits_as_a_new_interpreter_does(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    args = ["params", "albert-tiny", "--json"]
    fresh = subprocess.run([sys.executable, "-m", "ablate", *args], capture_output=True, text=True, timeout=300)
    done = forked.run(args, cwd=tmp_path, env=env, timeout=300)
    assert done.returncode == fresh.returncode == 0
    assert json.loads(done.stdout) == json.loads(fresh.stdout)
    (tmp_path / "bad.yaml").write_text("model:\n  colour: red\n", encoding="utf-8")
    bad = forked.run(["train", "bad.yaml"], cwd=tmp_path, env=env, timeout=300)  # found in its own working folder
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.startswith("error: model.colour: unknown key") and bad.stderr.count("\n") == 1


def test_a_forked_command_has_its_own_session_environment_and_streams(tmp_path):
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "COLUMNS": "123"}
    measuring = ["params", "albert-tiny", "data.max_length=16", "--measure"]  # a second or more: still running below
    proc = forked.popen(measuring, cwd=tmp_path, env=env, stdout=subprocess.PIPE, start_new_session=True)
    assert proc.pid != os.getpid() and os.getpgid(proc.pid) == proc.pid  # a session of its own once started
    assert proc.stdout is not None
    assert "latency" in proc.stdout.read()
    assert proc.wait(timeout=300) == 0 and proc.poll() == 0
    proc.send_signal(signal.SIGTERM)  # ended (and reaped by the fork server): nothing to signal, no error
    proc.kill_group()
    with (tmp_path / "out.log").open("w") as out:
        joined = forked.popen(["params", "nope"], cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT)
    assert joined.wait(timeout=60) == 2
    assert (tmp_path / "out.log").read_text().startswith("error: nope:")  # stderr joined stdout's file
