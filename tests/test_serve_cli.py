"""``specopd serve`` through the real console script: bad input fails fast and cleanly, start-up deaths are reported.

Pre-launch problems (missing target, bad YAML, unknown key, drafter that does not fit, port in use) must exit with
code 2 and exactly one ``error:`` line naming the problem, no traceback, and leave no process behind. A server
that dies during start-up must make ``specopd serve`` exit non-zero with the tail of SGLang's log and, again, leave
no process behind (every process the CLI starts inherits a unique environment tag that the check looks for, since
SGLang's children rename themselves and do not show the port).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
from pathlib import Path
from typing import List, Optional

import pytest

from conftest import TEST_TAG_ENV, assert_no_orphans, new_process_tag
from support.serving import specopd_exe

BASE_CONFIG = {
    "name": "tiny-cli-test", "speculative_algorithm": "SPECOPD", "block_size": 4, "device": "cpu",
    "dtype": "float32", "attention_backend": "torch_native", "max_total_tokens": 2048, "disable_cuda_graph": True,
    "disable_overlap_schedule": True, "sleep_on_idle": True,
}


def write_config(path: Path, **fields) -> Path:
    import yaml

    path.write_text(yaml.safe_dump({**BASE_CONFIG, **fields}, sort_keys=False))
    return path


def free_port() -> int:
    from sglang_specopd.app.launch.process import free_port as _free_port

    return _free_port()


def run_serve(args: List[str], tag: str, timeout: float = 120.0) -> subprocess.CompletedProcess:
    env = {**os.environ, TEST_TAG_ENV: tag}
    return subprocess.run([specopd_exe(), "serve", *args], capture_output=True, text=True, timeout=timeout, env=env,
                          stdin=subprocess.DEVNULL)


def assert_clean_error(proc: subprocess.CompletedProcess, *needles: str, port: Optional[int], tag: str) -> None:
    err = proc.stderr
    assert proc.returncode == 2, (proc.returncode, err, proc.stdout)
    error_lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(error_lines) == 1, err
    for needle in needles:
        assert needle in err, (needle, err)
    assert "Traceback" not in err + proc.stdout, err
    assert "starting SGLang" not in err, "the server was launched although the input was bad"
    assert_no_orphans(port=port, tag=tag, timeout=5.0)


@pytest.fixture()
def tag() -> str:
    return new_process_tag()


def test_target_path_does_not_exist(tmp_path: Path, tag: str) -> None:
    missing = tmp_path / "no-such-target"
    cfg = write_config(tmp_path / "cfg.yaml", target=str(missing), drafter=None)
    port = free_port()
    proc = run_serve(["--config", str(cfg), "--port", str(port)], tag)
    assert_clean_error(proc, "target path does not exist", str(missing), port=port, tag=tag)


def test_malformed_yaml(tmp_path: Path, tag: str) -> None:
    cfg = tmp_path / "broken.yaml"
    cfg.write_text("name: tiny\ntarget: [unclosed\ndevice: cpu\n")
    port = free_port()
    proc = run_serve(["--config", str(cfg), "--port", str(port)], tag)
    assert_clean_error(proc, "not valid YAML", str(cfg), port=port, tag=tag)


def test_unknown_config_key(tmp_path: Path, tiny_target: Path, tag: str) -> None:
    cfg = write_config(tmp_path / "cfg.yaml", target=str(tiny_target), drafter=None, max_tokens_typo=128)
    port = free_port()
    proc = run_serve(["--config", str(cfg), "--port", str(port)], tag)
    assert_clean_error(proc, "invalid server config", "max_tokens_typo", port=port, tag=tag)


def test_drafter_with_wrong_hidden_size(tmp_path: Path, tiny_target: Path, tiny_drafter: Path, tag: str) -> None:
    bad = tmp_path / "bad-drafter"
    shutil.copytree(tiny_drafter, bad)
    cfg_json = json.loads((bad / "config.json").read_text())
    cfg_json["hidden_size"] = cfg_json["hidden_size"] // 2
    (bad / "config.json").write_text(json.dumps(cfg_json, indent=2))
    cfg = write_config(tmp_path / "cfg.yaml", target=str(tiny_target), drafter=str(bad))
    port = free_port()
    proc = run_serve(["--config", str(cfg), "--port", str(port)], tag)
    assert_clean_error(proc, "does not fit target", f"hidden_size {cfg_json['hidden_size']} != target hidden_size",
                       port=port, tag=tag)


def test_port_in_use(tmp_path: Path, tiny_target: Path, tiny_drafter: Path, tag: str) -> None:
    cfg = write_config(tmp_path / "cfg.yaml", target=str(tiny_target), drafter=str(tiny_drafter))
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        port = sock.getsockname()[1]
        proc = run_serve(["--config", str(cfg), "--port", str(port)], tag)
        assert_clean_error(proc, f"port {port}", "already in use", port=None, tag=tag)


@pytest.mark.server
@pytest.mark.parametrize(("sglang_arg", "why"), [
    # the scheduler process dies while sizing the KV pool: the launcher and its children must all go
    ("--max-total-tokens=-5", "Not enough memory"),
])
def test_server_dying_at_startup_is_reported(tmp_path: Path, tiny_target: Path, tiny_drafter: Path, tag: str,
                                             sglang_arg: str, why: str) -> None:
    cfg = write_config(tmp_path / "cfg.yaml", target=str(tiny_target), drafter=str(tiny_drafter))
    port = free_port()
    log = tmp_path / "sglang.log"
    proc = run_serve(["--config", str(cfg), "--port", str(port), "--timeout", "300", "--log-file", str(log),
                      f"--sglang-arg={sglang_arg}"], tag, timeout=420)
    err = proc.stderr
    assert proc.returncode != 0, err
    assert "starting SGLang" in err and "SGLang exited with code" in err, err
    assert "Traceback" not in err.split("SGLang exited with code")[0], "the CLI itself crashed"
    assert why in err, err  # SGLang's own error, from its log tail
    tail = [line for line in log.read_text(errors="replace").splitlines() if line.strip()][-3:]
    assert all(line in err for line in tail), (tail, err)
    assert_no_orphans(port=port, tag=tag)


@pytest.mark.parametrize("port", [0, -1, 65536, 99999])
def test_port_out_of_range_is_a_clear_error(port: int) -> None:
    from sglang_specopd.app.launch.process import PortInUseError, ServeError, check_port_free

    with pytest.raises(ServeError, match=r"--port must be in 1\.\.65535") as info:
        check_port_free("127.0.0.1", port)
    assert not isinstance(info.value, PortInUseError)
