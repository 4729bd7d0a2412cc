"""Test hygiene: offline, caches in tmp, fixed seeds, default dtype reset, tiny shapes."""

from __future__ import annotations

import os
import tempfile

import pytest
import torch

_CACHE = tempfile.mkdtemp(prefix="accrot-test-cache-")
# set before Lightning / datasets / wandb / matplotlib are imported by any test module
for key, value in {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "WANDB_MODE": "disabled",
    "WANDB_SILENT": "true",
    "HF_HOME": os.path.join(_CACHE, "hf"),
    "WANDB_DIR": os.path.join(_CACHE, "wandb"),
    "MPLCONFIGDIR": os.path.join(_CACHE, "mpl"),
    # name every jsonargparse deprecation (its default first message is a generic one)
    "JSONARGPARSE_DEPRECATION_WARNINGS": "all",
}.items():
    os.environ[key] = value

# Lightning attaches a StreamHandler to the sys.stderr of its first import. Imported inside a test that uses
# capsys, that is capsys's stream, closed after the test: every later Lightning log line then prints a
# "--- Logging error ---" traceback into other tests' stderr (test_slurm.py before test_bad_inputs.py did).
# Imported here, it binds to pytest's session-long capture instead.
import lightning.pytorch  # noqa: E402,F401


@pytest.fixture(autouse=True)
def _hygiene():
    torch.manual_seed(0)
    dtype = torch.get_default_dtype()
    yield
    torch.set_default_dtype(dtype)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


@pytest.fixture(params=["compiled", "eager"])
def kernels_mode(request, monkeypatch) -> str:
    """The CPU kernels both ways: compiled (``accrot/ops/csrc``) and their eager Python twins. A machine that
    cannot build the kernels skips the compiled half with the reason (under CI=true it fails)."""
    from tests.helpers.kernels import kernels_or_skip

    monkeypatch.setenv("ACCROT_CPU_KERNELS", "on" if request.param == "compiled" else "off")
    if request.param == "compiled":
        kernels_or_skip()
    return request.param


@pytest.fixture
def one_thread():
    """Tiny shapes: one intra-op thread is fastest, and steady when other processes share the cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)



@pytest.fixture(scope="module")
def postgres_server():
    """A real PostgreSQL server from the installed binaries, in a temp dir, stopped by PID
    (:class:`accrot.bench.postgres.PostgresServer`); one per test module. Without the binaries the test skips
    with the reason (under CI=true it fails)."""
    from accrot.bench.postgres import PostgresServer, missing

    why = missing()
    if why is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(why + " and CI=true")
        pytest.skip(why)
    server = PostgresServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def postgres(postgres_server) -> str:
    """The URL of :func:`postgres_server`'s empty database."""
    return postgres_server.url


def tiny_model(seed: int | None = 0, d_model: int = 32, n_layers: int = 2, n_heads: int = 4, **scheme):
    """The tests' one tiny model: a ``Transformer`` of ``d_model`` × ``n_layers`` with ``n_heads`` heads under the
    position scheme ``SchemeConfig(**scheme)`` (NoPE when none is given), its weights drawn after
    ``torch.manual_seed(seed)`` (None: from the current generator), in training mode. A plain function, so worker
    processes can build the same model: ``from tests.conftest import tiny_model``."""
    from accrot.model import ModelConfig, Transformer
    from accrot.position import SchemeConfig

    if seed is not None:
        torch.manual_seed(seed)
    return Transformer(ModelConfig(d_model=d_model, n_layers=n_layers, n_heads=n_heads, scheme=SchemeConfig(**scheme)))
