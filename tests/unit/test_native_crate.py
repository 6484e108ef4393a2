"""The Rust crates pass their own unit tests: pg2kafka's per-event path
(services/pg2kafka/native) and kafka2postgres's bulk path (services/kafka2postgres/native).

Each module of a crate tests its pure functions (``#[cfg(test)] mod tests``: the
TupleData reader, the conversion kinds, the JSON writers, dates and timestamps, array
literals, bytea; event rows to COPY text, key texts) against the outputs the Python side
expects; this runs them with the rest of the suite. The crates' dependencies come from
cargo's cache, which the ``pip install`` that builds the extensions filled
(deploy/local/walcast), so no network.
The debug test build has a target directory of its own: the extension's release build
stays as it is.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CRATES = ["pg2kafka", "kafka2postgres"]  # services/<name>/native
# A cold debug build takes about 20 s on two busy cores; this stays under pytest's own
# timeout (600 s, pyproject.toml) so a hang is reported with cargo's words.
TIMEOUT_S = 540
TAIL_LINES = 60


def _cargo() -> str | None:
    # deploy/local/walcast puts rustup's cargo on PATH for the same reason.
    rustup = Path.home() / ".cargo" / "bin" / "cargo"
    return shutil.which("cargo") or (str(rustup) if rustup.is_file() else None)


def _tail(output: str) -> str:
    return "\n".join(output.splitlines()[-TAIL_LINES:])


@pytest.mark.parametrize("service", CRATES)
def test_the_crates_unit_tests_pass(service: str) -> None:
    crate = REPO / "services" / service / "native"
    cargo = _cargo()
    if cargo is None:
        pytest.fail(
            f"cargo (Rust 1.78 or newer) not found: {service}'s native extension needs it. "
            "Install Rust with rustup (https://rustup.rs).",
            pytrace=False,
        )
    env = {
        **os.environ,
        # pyo3 links the test binary against this interpreter's libpython (the
        # extension-module feature, which leaves it out, is off for tests).
        "PYO3_PYTHON": sys.executable,
        "CARGO_TARGET_DIR": str(crate / "target" / "unit-tests"),
        "CARGO_TERM_COLOR": "never",
        "RUST_BACKTRACE": "0",  # a failed assertion's values, not a stack, in the tail
    }
    command = [cargo, "test", "--no-default-features", "--offline", "--locked"]
    shown = "cargo " + " ".join(command[1:])
    try:
        proc = subprocess.run(
            command,
            cwd=crate,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        out = (
            exc.output
            if isinstance(exc.output, str)
            else (exc.output or b"").decode(errors="replace")
        )
        pytest.fail(
            f"`{shown}` ran over {TIMEOUT_S} s:\n{_tail(out)}",
            pytrace=False,
        )
    if proc.returncode != 0:
        pytest.fail(
            f"`{shown}` in {crate.relative_to(REPO)} failed "
            f"(exit {proc.returncode}; --offline: the crates come from the cache the "
            f"extension's build filled):\n{_tail(proc.stdout)}",
            pytrace=False,
        )
    assert "test result: ok." in proc.stdout, _tail(proc.stdout)
