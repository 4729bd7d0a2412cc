"""bfloat16 on the CPU: allowed where the CPU has it in hardware (AVX-512 BF16, AMX, aarch64 BF16), refused in one
line elsewhere (the CPU's flags faked), and recorded in run.json as what trained."""

from __future__ import annotations

import json

import pytest

from accrot import runtime
from accrot.cli import main

QUICK = ["--config", "tiny", "--trainer.max_steps=2", "--trainer.enable_progress_bar=false", "--wandb=disabled",
         "--extrapolation.multipliers=[1]", "--extrapolation.budget_tokens=1024", "--trainer.limit_val_batches=1",
         "--data.init_args.batch_size=2", "--trainer.accelerator=cpu"]
X86 = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse2 avx2 avx512f {extra} xsave\n\nprocessor\t: 1\n"


@pytest.mark.parametrize("text, found", [
    (X86.format(extra="avx512_bf16"), "avx512_bf16"),
    (X86.format(extra="amx_tile amx_bf16 avx512_bf16"), "amx_bf16"),
    (X86.format(extra="avx512_vnni"), None),  # AVX-512 without its BF16 extension: emulated, slow
    ("processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n", "bf16"),  # aarch64 (Neoverse V1, Graviton 3)
    ("processor\t: 0\nFeatures\t: fp asimd crc32\n", None),
    ("", None),
], ids=["avx512-bf16", "amx", "avx512-only", "arm-bf16", "arm-without", "no-flags"])
def test_the_cpus_hardware_bf16_is_read_from_its_flags(tmp_path, monkeypatch, text, found):
    info = tmp_path / "cpuinfo"
    info.write_text(text)
    assert runtime.cpu_bf16(str(info)) == found
    monkeypatch.setattr(runtime, "cpu_bf16", lambda: found)
    assert (runtime.cpu_bf16_problem("bf16-mixed") is None) == (found is not None)
    assert runtime.cpu_bf16_problem("32-true") is None


def test_no_cpuinfo_is_no_hardware_bf16(tmp_path):
    assert runtime.cpu_flags(str(tmp_path / "missing")) == set()


@pytest.mark.parametrize("precision", ["bf16-mixed", "bf16-true", "16-mixed"])
def test_bf16_on_a_cpu_without_it_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys, precision):
    monkeypatch.setattr(runtime, "cpu_bf16", lambda: None)
    rc = main(["fit", *QUICK, f"--root={tmp_path / 'runs'}", f"--trainer.precision={precision}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "Traceback" not in err[0]
    assert err[0].startswith(f"accrot: error: trainer.precision='{precision}'")
    assert "is not valid on this CPU" in err[0] and "trainer.precision=32-true" in err[0]
    assert not (tmp_path / "runs").exists()  # refused before any run directory


def test_float32_and_a_gpu_are_never_refused_for_the_cpus_flags(monkeypatch):
    from accrot.run.lightning import check_cpu_precision

    monkeypatch.setattr(runtime, "cpu_bf16", lambda: None)
    check_cpu_precision({"precision": "32-true", "accelerator": "cpu"})
    check_cpu_precision({"precision": "bf16-mixed", "accelerator": "gpu"})  # the GPU's own business
    check_cpu_precision({"accelerator": "cpu"})  # the default precision
    with pytest.raises(ValueError, match="is not valid on this CPU"):
        check_cpu_precision({"precision": "bf16-true", "accelerator": "cpu"})


@pytest.mark.filterwarnings("ignore:Precision bf16-mixed is not supported by the model summary")
@pytest.mark.parametrize("precision", [None, "bf16-mixed"], ids=["default", "bf16-mixed"])
def test_run_json_records_the_precision_that_trained(tmp_path, monkeypatch, precision):
    """Where the CPU has hardware bf16, bf16-mixed trains and run.json says so; the default stays float32."""
    monkeypatch.setattr(runtime, "cpu_bf16", lambda: "avx512_bf16")
    extra = [f"--trainer.precision={precision}"] if precision else []
    assert main(["fit", *QUICK, f"--root={tmp_path}", "--name=p", *extra]) == 0
    record = json.loads((tmp_path / "p" / "version_0" / "run.json").read_text())
    assert record["ran"]["precision"] == (precision or "32-true")
    assert record["ran"]["device"] == "cpu"
