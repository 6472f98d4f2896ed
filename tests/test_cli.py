"""The ``fp8gemm`` command on mistakes a user can make: exit status 2, one line on stderr that names the option and
the fix, never a traceback; ``info`` fails where the backend asked for cannot run; every run prints its seed."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from fp8gemm import cli, cli_args, registry
from fp8gemm.cli import main
from fp8gemm.testing import conformance
from fp8gemm_bench import accuracy, bench

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    """``fp8gemm argv`` in this process: (exit status, stdout, stderr), argparse's own exits included."""
    try:
        code = main(list(argv))
    except SystemExit as exit_:
        code = exit_.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def cpu_only_torch(monkeypatch):
    """torch as a CPU-only build sees itself, whatever this machine has."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(torch.version, "hip", None)


@pytest.mark.parametrize("command", ["info", "check", "bench"])
def test_a_gpu_device_on_cpu_only_torch_is_refused_in_words(capsys, cpu_only_torch, command):
    code, _, err = run_cli(capsys, command, "--device", "cuda")
    assert code == 2
    assert "argument --device: 'cuda'" in err and "built without GPU support" in err and "--device cpu" in err


def test_a_gpu_device_torch_cannot_find_is_refused_in_words(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    code, _, err = run_cli(capsys, "info", "--device", "cuda:0")
    assert code == 2 and "finds no GPU" in err and "CUDA_VISIBLE_DEVICES" in err


@pytest.mark.parametrize(
    "device, words",
    [("mps", "runs on cpu and cuda devices"), ("cuda:x", "is not a torch device; write cpu, cuda or cuda:N")],
)
def test_devices_fp8gemm_cannot_use_are_refused(capsys, device, words):
    code, _, err = run_cli(capsys, "info", "--device", device)
    assert code == 2 and "argument --device" in err and words in err


def test_a_gpu_index_past_the_last_gpu_is_refused(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    code, _, err = run_cli(capsys, "info", "--device", "cuda:2")
    assert code == 2 and "has 2 GPU(s), cuda:0 to cuda:1" in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a torch that cannot reach a GPU")
def test_no_traceback_from_the_installed_command():
    """The issue as reported: `fp8gemm info --device cuda` with CPU torch ended in an AssertionError traceback."""
    run = subprocess.run(
        [sys.executable, "-m", "fp8gemm", "info", "--device", "cuda"], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 2 and "Traceback" not in run.stderr and "argument --device" in run.stderr


def test_info_on_a_device_it_can_run_exits_0(capsys):
    code, out, err = run_cli(capsys, "info", "--device", "cpu")
    assert code == 0 and "selected: reference" in out and not err


@pytest.mark.parametrize("json_flag", [[], ["--json"]])
def test_info_fails_where_the_backend_asked_for_is_not_installed(capsys, json_flag):
    code, out, err = run_cli(capsys, "info", "--device", "cpu", "--backend", "bogus", *json_flag)
    assert code == 2
    assert "--backend='bogus' is not an installed backend" in err and "'reference'" in err
    assert "leave --backend out" in err and "use one of those names" not in err
    if json_flag:
        assert json.loads(out)["selected"]["name"] is None
    else:
        assert "selected: none" in out


def test_info_fails_where_the_environment_names_a_backend_that_is_not_installed(capsys, monkeypatch):
    monkeypatch.setenv(registry.ENV_VAR, "bogus")
    code, _, err = run_cli(capsys, "info", "--device", "cpu")
    assert code == 2 and f"{registry.ENV_VAR}='bogus' is not an installed backend" in err and "unset it" in err


def test_info_fails_where_no_installed_backend_fits_the_device(capsys, monkeypatch):
    def no_fit(device, backend=None):
        raise RuntimeError("No installed fp8gemm backend supports this device")

    monkeypatch.setattr(registry, "select", no_fit)
    code, out, err = run_cli(capsys, "info", "--device", "cpu")
    assert code == 2 and "No installed fp8gemm backend supports this device" in err and "selected: none" in out


@pytest.mark.parametrize(
    "argv, words",
    [
        (["bench", "--rounds", "0"], "argument --rounds: 0 is below 1"),
        (["bench", "--seed", "-1"], "argument --seed: -1 is below 0"),
        (["bench", "--seed", "x"], "argument --seed: 'x' is not a whole number"),
        (["check", "--random", "-1"], "argument --random: -1 is below 0"),
        (["bench", "--out-dtype", "fp8"], "argument --out-dtype: invalid choice"),
        (["bench", "--resume"], "--resume goes with --layer or --grouped and --json"),
        (["check", "--backend", "bogus"], "--backend='bogus' is not an installed backend"),
    ],
)
def test_argument_mistakes_exit_2_with_the_option_named(capsys, argv, words):
    code, _, err = run_cli(capsys, *argv, "--device", "cpu")
    assert code == 2 and words in err and one_line(err)


def one_line(err: str) -> bool:
    """stderr as the command promises it: one line, no usage block, no traceback."""
    return err.count("\n") == 1 and "usage:" not in err and "Traceback" not in err


@pytest.mark.parametrize(
    "argv, where",
    [
        (["bench", "--bogus"], "fp8gemm bench"),
        (["bench", "--device", "cpu", "--bogus", "3"], "fp8gemm bench"),
        (["info", "--bogus"], "fp8gemm info"),
        (["--bogus"], "fp8gemm"),
        (["--bogus", "info"], "fp8gemm info"),
    ],
)
def test_an_unknown_option_is_one_line_naming_it_and_the_help(capsys, argv, where):
    code, _, err = run_cli(capsys, *argv)
    assert code == 2 and one_line(err)
    assert err.startswith(f"{where}: error: unrecognized argument(s) --bogus") and f"`{where} --help`" in err


@pytest.mark.parametrize(
    "argv, words",
    [
        ([], "fp8gemm: error: name a command; `fp8gemm --help` lists them"),
        (["bnech"], "fp8gemm: error: argument command: invalid choice: 'bnech' (choose from 'info', 'check', 'bench')"),
    ],
)
def test_a_missing_or_misspelt_command_is_one_line(capsys, argv, words):
    code, _, err = run_cli(capsys, *argv)
    assert code == 2 and one_line(err) and err.startswith(words)


def test_a_report_path_under_a_file_names_the_file(capsys, tmp_path, monkeypatch):
    (tmp_path / "afile").write_text("not a folder")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(accuracy, "run", lambda *a, **k: pytest.fail("ran before refusing --json"))
    for option in ("--json", "--plot"):
        code, _, err = run_cli(capsys, "bench", "--device", "cpu", option, "afile/x.json")
        assert code == 2 and one_line(err) and "File exists" not in err
        assert f"argument {option}: afile/x.json: afile is a file, not a folder" in err


def test_plot_without_matplotlib_is_refused_before_the_run(capsys, monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else find_spec(name))
    monkeypatch.setattr(accuracy, "run", lambda *a, **k: pytest.fail("ran before refusing --plot"))
    code, _, err = run_cli(capsys, "bench", "--device", "cpu", "--plot", "x.png")
    assert code == 2 and one_line(err) and "argument --plot: matplotlib is needed here" in err
    assert err.rstrip().endswith(f"not installed: {cli_args.INSTALL_HINTS['matplotlib']}")


@pytest.mark.parametrize("module", sorted(cli_args.INSTALL_HINTS))
def test_each_install_hint_names_the_distribution_that_provides_the_module(module):
    """`pip install X` installs from PyPI: X must be the module's own distribution (as installed here), never an extra
    of a package that is not on PyPI."""
    words = cli_args.INSTALL_HINTS[module].split(" (")[0].split()
    assert words[:2] == ["pip", "install"] and len(words) == 3 and "fp8gemm" not in words[2]
    providers = importlib.metadata.packages_distributions().get(module)
    if providers is None:
        pytest.skip(f"{module} is not installed here: its distribution cannot be checked")
    assert words[2] in providers


@pytest.mark.parametrize(
    "missing, hint", [("triton", "pip install triton"), ("safetensors", "pip install safetensors")]
)
def test_a_missing_optional_package_names_what_to_install(capsys, monkeypatch, missing, hint):
    def run(*args, **kwargs):
        raise ModuleNotFoundError(f"No module named '{missing}.sub'", name=f"{missing}.sub")

    monkeypatch.setattr(accuracy, "run", run)
    code, _, err = run_cli(capsys, "bench", "--device", "cpu")
    assert code == 2 and f"{missing} is needed here and is not installed: {hint}" in err


def test_an_unwritable_report_path_is_an_error_not_a_traceback(capsys, tmp_path):
    code, _, err = run_cli(capsys, "bench", "--device", "cpu", "--shapes", "16,128,128", "--json", str(tmp_path))
    assert code == 2 and str(tmp_path) in err and err.startswith("fp8gemm bench: error:")


def test_an_interrupted_run_exits_130_without_a_traceback(capsys, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(accuracy, "run", interrupted)
    code, _, err = run_cli(capsys, "bench", "--device", "cpu")
    assert code == 130 and "interrupted" in err


def test_bench_prints_and_stores_its_seed_and_repeats_a_run(capsys, tmp_path):
    def report(*seed: str) -> dict:
        path = tmp_path / f"r{len(list(tmp_path.iterdir()))}.json"
        code, out, _ = run_cli(capsys, "bench", "--device", "cpu", "--shapes", "16,256,512", "--json", str(path), *seed)
        data = json.loads(path.read_text())
        assert code == 0 and f"data seed {data['environment']['seed']}" in out
        return data

    default, again, seven, seven_again = report(), report(), report("--seed", "7"), report("--seed", "7")
    assert default["environment"]["seed"] == bench.DEFAULT_SEED and seven["environment"]["seed"] == 7
    assert default["accuracy"] == again["accuracy"] and seven["accuracy"] == seven_again["accuracy"]
    assert default["accuracy"] != seven["accuracy"]


def test_check_prints_its_seed_and_takes_another(capsys, monkeypatch):
    seen = []
    monkeypatch.setattr(conformance, "cases", lambda device, n_random, seed: seen.append(seed) or [])
    monkeypatch.setattr(conformance, "BAD_INPUTS", [])
    monkeypatch.setattr(cli, "check_layer", lambda *a: [])
    code, out, _ = run_cli(capsys, "check", "--device", "cpu")
    assert code == 0 and f"seed {conformance.DEFAULT_SEED}" in out and seen == [conformance.DEFAULT_SEED]
    code, out, _ = run_cli(capsys, "check", "--device", "cpu", "--seed", "5")
    assert code == 0 and "--seed 5 repeats this run" in out and seen[-1] == 5


# --- commands other packages add: `fp8gemm bench` through the fp8gemm.commands entry points ---------------------------


def _command_entry_points(monkeypatch, *added: importlib.metadata.EntryPoint) -> None:
    """The fp8gemm.commands entry points the CLI sees: ``added`` alone (other groups as installed)."""
    entry_points = importlib.metadata.entry_points
    monkeypatch.setattr(
        importlib.metadata,
        "entry_points",
        lambda **kw: list(added) if kw.get("group") == cli.COMMAND_GROUP else entry_points(**kw),
    )


def test_the_bench_package_registers_the_bench_command():
    (ep,) = [ep for ep in importlib.metadata.entry_points(group=cli.COMMAND_GROUP) if ep.name == "bench"]
    assert ep.value == "fp8gemm_bench.cli" and ep.dist.name == "fp8gemm-bench"
    command = ep.load()
    assert callable(command.add_arguments) and callable(command.run) and command.HELP


@pytest.mark.parametrize("argv", [["bench", "--device", "cpu", "--json", "x.json"], ["bench", "--help"]])
def test_bench_without_its_package_says_how_to_install_it(capsys, monkeypatch, argv):
    _command_entry_points(monkeypatch)
    code, out, err = run_cli(capsys, *argv)
    assert code == 2 and one_line(err) and not out
    assert err.startswith("fp8gemm bench: error: the benchmarks are a package of their own")
    assert err.rstrip().endswith("pip install ./bench")
    pyproject = tomllib.loads((ROOT / "bench" / "pyproject.toml").read_text())  # what ./bench installs, from a checkout
    assert pyproject["project"]["name"] == "fp8gemm-bench"
    assert pyproject["project"]["entry-points"][cli.COMMAND_GROUP] == {"bench": "fp8gemm_bench.cli"}
    assert run_cli(capsys, "info", "--device", "cpu")[0] == 0


def test_help_lists_a_command_that_is_not_installed(capsys, monkeypatch):
    _command_entry_points(monkeypatch)
    code, out, _ = run_cli(capsys, "--help")
    assert code == 0 and "[not installed]" in out and "bench" in out


def test_without_rich_info_runs_and_bench_says_why_it_cannot():
    """rich missing: `fp8gemm info` still runs (the core prints plain text); `fp8gemm bench` says why it cannot."""
    code = (
        "import sys; sys.modules['rich'] = None\n"  # an import of rich now raises ModuleNotFoundError
        "from fp8gemm.cli import main\n"
        "print('info', main(['info', '--device', 'cpu']), flush=True)\n"
        "print('bench', main(['bench', '--device', 'cpu']), flush=True)\n"
        "assert 'rich' not in {m.split('.')[0] for m in sys.modules if sys.modules[m] is not None}\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "selected: reference" in run.stdout and "info 0" in run.stdout and "bench 2" in run.stdout
    assert run.stderr.startswith("fp8gemm bench: error: the package that adds `fp8gemm bench` (fp8gemm_bench.cli)")
    assert "fails to load: rich is needed here and is not installed: pip install rich" in run.stderr
