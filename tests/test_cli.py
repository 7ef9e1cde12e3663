"""The command line a newcomer meets: --version, help on every option, no-argument usage,
shipped configs by name, `oelm init`, `--data-dir` and the offline Hub, refused empty
--output-dir, `oelm inspect` on a missing YAML, the run's closing lines (processes, warnings,
report.html) and `oelm stop` on a real run, by the pid in its lock file.

Subprocess tests run the installed `oelm` entry point from a plain environment (no
OELM_DATA_DIR, no HF_HUB_OFFLINE), as a shell would.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path

import pytest

from oelm.cli import build_parser, main
from oelm.config import load_config
from oelm.configs import resolve_config, shipped_configs

ROOT = Path(__file__).resolve().parents[1]
TINY = [  # seconds-long tinystories-tiny: 2-layer, 32-wide GPT, BPE-512, one seed
    "task.train_samples=40", "task.validation_samples=12", "task.tokenizer=bpe-512", "task.block_size=32",
    "training.eval_every=2", "training.log_every=2", "training.timing_warmup_steps=1", "training.progress_bar=false",
    "training.tensorboard=false", "training.save_best_checkpoint=false", "seeds=[0]",
    "model.gpt_overrides={dropout: 0.0, hidden_size: 32, num_layers: 2, num_heads: 2}",
]


def _plain_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("OELM_DATA_DIR", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")}
    return env | {"OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE", "TOKENIZERS_PARALLELISM": "false"} | extra


def _oelm(*args: str, cwd: Path, timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "oelm", *args], cwd=cwd, env=_plain_env(**env), capture_output=True,
                          text=True, timeout=timeout)


def test_version_comes_from_the_package_metadata(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"oelm {version('oelm')}"


def test_every_option_of_every_sub_command_has_help():
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    missing = [f"{name} {a.option_strings or a.dest}" for name, p in sub.choices.items() for a in p._actions if not a.help]
    assert set(sub.choices) >= {"run", "plan", "stop", "report", "inspect", "configs", "init", "monitor", "bench", "env"}
    assert missing == []


def test_run_without_arguments_asks_for_the_config_only(capsys):
    with pytest.raises(SystemExit) as info:
        main(["run"])
    err = capsys.readouterr().err
    assert info.value.code == 2
    assert "config [overrides ...]" in err  # overrides shown as optional in the usage
    assert err.strip().endswith("the following arguments are required: config")


@pytest.mark.parametrize("command", ["run", "plan"])
def test_an_empty_output_dir_is_refused_in_one_line(command, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main([command, "quickstart", "--output-dir", ""]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("oelm: error: --output-dir is empty")
    assert not (tmp_path / "outputs").exists()


def test_inspect_of_a_missing_yaml_is_no_such_file_not_a_hub_id(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["inspect", "missing.yaml"]) == 2
    err = capsys.readouterr().err
    assert "config missing.yaml: no such file" in err and "Hub" not in err
    assert main(["inspect", "./no-model-dir"]) == 2
    assert "./no-model-dir: no such file or directory" in capsys.readouterr().err


def test_shipped_configs_resolve_by_name_from_anywhere(tmp_path, monkeypatch):
    shipped = shipped_configs()
    package_dir = Path(__import__("oelm").__file__).parent / "configs"
    assert {"quickstart", "tinystories-tiny", "evidence/sst2_minilm", "cpu/phase1_bert/sst2"} <= set(shipped)
    assert all(p.is_relative_to(package_dir) and p.is_file() for p in shipped.values())
    assert (ROOT / "configs").resolve() == package_dir.resolve()  # the repository's configs/ is the package's
    monkeypatch.chdir(tmp_path)  # no configs/ here
    for arg in ("quickstart", "quickstart.yaml", "configs/quickstart.yaml"):
        assert resolve_config(arg) == shipped["quickstart"]
    assert load_config(resolve_config("cpu/phase1_bert/sst2")).name == load_config(shipped["cpu/phase1_bert/sst2"]).name
    (tmp_path / "quickstart").write_text("a local file wins")
    assert resolve_config("quickstart") == Path("quickstart")


def test_oelm_configs_lists_every_shipped_config(capsys):
    assert main(["configs"]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()[1:]]
    assert listed == list(shipped_configs())


def test_init_writes_a_commented_starter_that_validates(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["init", "my-lm.yaml", "--template", "tinystories-tiny"]) == 0
    text = (tmp_path / "my-lm.yaml").read_text()
    assert text.startswith("# Starter experiment written by `oelm init`") and "oelm run THIS_FILE" in text
    config = load_config(tmp_path / "my-lm.yaml")
    template = load_config(shipped_configs()["tinystories-tiny"])
    assert config.name == "my-lm"  # its outputs do not mix with the template's
    assert config.model_dump(exclude={"name"}) == template.model_dump(exclude={"name"})
    assert main(["init"]) == 0 and load_config(tmp_path / "experiment.yaml").name == "experiment"
    capsys.readouterr()
    assert main(["init", "my-lm.yaml"]) == 2
    assert "my-lm.yaml exists" in capsys.readouterr().err
    assert main(["init", "x.yaml", "--template", "nope"]) == 2
    assert "--template nope: no shipped config" in capsys.readouterr().err
    assert not (tmp_path / "x.yaml").exists()


def test_init_refuses_a_symbolic_link_dangling_or_not(tmp_path, monkeypatch, capsys):
    """`oelm init link.yaml` where link.yaml points nowhere (yet): writing would put the config
    wherever the link points (another folder, another user's file). One line, nothing written."""
    monkeypatch.chdir(tmp_path)
    target = tmp_path / "elsewhere" / "planted.yaml"
    target.parent.mkdir()
    (tmp_path / "link.yaml").symlink_to(target)
    assert main(["init", "link.yaml"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"oelm: error: link.yaml is a symbolic link (to {target}); oelm init writes plain files only: "
                   "give another PATH, or the link's target itself"]
    assert not target.exists()
    assert main(["init", "link.yaml", "--force"]) == 2 and not target.exists()


def test_a_folder_named_like_a_shipped_config_does_not_hide_it(tmp_path, monkeypatch, capsys):
    """`oelm plan tinystories-tiny --output-dir tinystories-tiny` creates a folder of the config's
    name; "rerun the same command" then still means the shipped config, not that folder."""
    monkeypatch.chdir(tmp_path)
    command = ["plan", "tinystories-tiny", "--output-dir", "tinystories-tiny"]
    assert main(command) == 0 and (tmp_path / "tinystories-tiny" / "experiment.json").is_file()
    capsys.readouterr()
    assert main(command) == 0, capsys.readouterr().err
    assert resolve_config("tinystories-tiny") == shipped_configs()["tinystories-tiny"]
    (tmp_path / "mine").mkdir()  # any other folder is still refused with load_config's one line
    assert main(["plan", "mine"]) == 2 and "is a directory" in capsys.readouterr().err


# `python -m oelm` with the wandb package uninstalled, as it is on a machine without the extra: a
# finder ahead of the others looks for `wandb` in the working directory only (where a plain ./wandb
# folder is a namespace package), so the installed wheel (`make test` installs it) is not seen.
_OELM_WITHOUT_WANDB = """
import importlib.machinery, os, sys
class WandbNotInstalled:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name != "wandb":
            return None
        return importlib.machinery.PathFinder.find_spec(name, [os.getcwd()])
sys.meta_path.insert(0, WandbNotInstalled)
from oelm.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_wandb_folder_in_the_working_directory_is_not_taken_for_the_package(tmp_path, data_dir):
    """W&B writes its offline runs to ./wandb/; with the package not installed that folder imports
    as an empty namespace package. `report_to: wandb` is refused in one line naming the folder,
    before anything is written, instead of failing inside the run."""
    from _tiny_matrix import write_config

    out = tmp_path / "out"
    args = ["run", str(write_config(tmp_path)), "--output-dir", str(out), "--data-dir", str(data_dir),
            "training.report_to=[wandb]"]
    (tmp_path / "wandb").mkdir()
    proc = subprocess.run([sys.executable, "-c", _OELM_WITHOUT_WANDB, *args], cwd=tmp_path, env=_plain_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"oelm: error: report_to: wandb needs the wandb package, which is not installed ({tmp_path / 'wandb'} is a "
        'folder of that name, not the package): pip install "oelm[wandb]"']
    assert not out.exists()


def test_data_dir_option_sets_the_environment_and_a_bad_one_is_refused(tmp_path, monkeypatch, capsys):
    from oelm.cli import _apply_environment

    monkeypatch.delenv("OELM_DATA_DIR", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    _apply_environment(argparse.Namespace(data_dir=str(tmp_path), online=False))
    assert os.environ["OELM_DATA_DIR"] == str(tmp_path.resolve()) and os.environ["HF_HUB_OFFLINE"] == "1"
    _apply_environment(argparse.Namespace(data_dir=None, online=True))
    assert os.environ["HF_HUB_OFFLINE"] == "0"
    monkeypatch.chdir(tmp_path)
    assert main(["plan", "quickstart", "--data-dir", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert "oelm: error: --data-dir" in err and "no such directory" in err


def test_plain_shell_run_without_data_fails_fast_in_one_short_line(tmp_path):
    proc = _oelm("run", "tinystories-tiny", "--output-dir", str(tmp_path / "out"), *TINY, "training.max_steps=2",
                 cwd=tmp_path, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("oelm: error:") and len(lines[0]) < 400, lines
    assert "OELM_DATA_DIR" in lines[0] and "--data-dir" in lines[0]
    assert "not tried because the Hub is offline" in lines[0]  # offline by default: no Hub retries (they took 44 s)


def test_plain_shell_run_with_data_dir_prints_processes_warnings_and_report_html(tmp_path, data_dir):
    out = tmp_path / "out"
    proc = _oelm("run", "tinystories-tiny", "--data-dir", str(data_dir), "--output-dir", str(out), *TINY,
                 "training.max_steps=4", "methods=[{name: baseline, learning_rate: 3.0e-3}]", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"-> {out} (executor local; 1 process on cpu)" in proc.stdout
    warnings = json.loads((out / "comparison.json").read_text())["warnings"]
    for w in warnings:
        assert f"warning: {w}" in proc.stdout
    assert f"report: {out / 'report.html'}" in proc.stdout and (out / "report.html").is_file()


def test_stop_sends_sigterm_to_the_pid_in_the_lock_and_nothing_else(tmp_path, data_dir):
    from oelm.runtime.lock import LOCK_NAME, read_holder

    out = tmp_path / "out"
    run = subprocess.Popen(
        [sys.executable, "-m", "oelm", "run", "tinystories-tiny", "--data-dir", str(data_dir), "--output-dir", str(out),
         *TINY, "training.max_steps=100000", "training.eval_every=50000"],
        cwd=tmp_path, env=_plain_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 180
        while not list(out.glob("runs/*/metrics.jsonl")):  # training has started
            assert run.poll() is None and time.monotonic() < deadline, run.communicate()[1][-2000:]
            time.sleep(0.2)
        assert read_holder(out)["pid"] == run.pid
        stop = _oelm("stop", str(out), cwd=tmp_path, timeout=120)
        assert stop.returncode == 0, stop.stdout + stop.stderr
        assert f"sent SIGTERM to pid {run.pid}" in stop.stdout and "it stopped" in stop.stdout
        assert run.wait(timeout=60) == 130
        assert not (out / LOCK_NAME).exists()
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    # nothing holds it now: a second stop signals nobody
    again = _oelm("stop", str(out), cwd=tmp_path)
    assert again.returncode == 0 and "nothing to stop" in again.stdout


def test_stop_never_signals_a_pid_from_a_left_over_lock_file(tmp_path):
    """A lock file left by a killed run names a pid that may now be another process: no flock is
    held on it, so `oelm stop` sends nothing."""
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / ".oelm.lock").write_text(json.dumps({"pid": bystander.pid, "host": socket.gethostname(),
                                                          "started_at": "2026-01-01T00:00:00+00:00"}))
        stop = _oelm("stop", str(tmp_path), cwd=tmp_path)
        assert stop.returncode == 0 and "nothing to stop" in stop.stdout
        time.sleep(0.5)
        assert bystander.poll() is None  # still alive: never signalled
    finally:
        bystander.send_signal(signal.SIGKILL)
        bystander.wait()
    assert _oelm("stop", str(tmp_path / "missing"), cwd=tmp_path).returncode == 2


def test_stop_beside_only_jobs_sends_sigterm_to_each_job_by_the_pid_its_run_lock_records(tmp_path, data_dir):
    """A batch system's `oelm run --only` job holds the folder in shared mode (no pid there) and
    its run's own lock: `oelm stop OUT` finds the job through runs/<name>/.oelm.lock, sends it
    SIGTERM, and the job saves and exits 130."""
    from _tiny_matrix import write_config

    cfg, out = write_config(tmp_path), tmp_path / "out"
    long = ["training.max_steps=100000", "training.eval_every=50000"]
    plan = _oelm("plan", str(cfg), "--output-dir", str(out), *long, cwd=tmp_path)
    assert plan.returncode == 0, plan.stderr
    name = json.loads(plan.stdout.splitlines()[0])["name"]
    job = subprocess.Popen([sys.executable, "-m", "oelm", "run", str(cfg), "--output-dir", str(out), "--only", name,
                            "--data-dir", str(data_dir), *long],
                           cwd=tmp_path, env=_plain_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 180
        while not (out / "runs" / name / "metrics.jsonl").exists():  # training has started
            assert job.poll() is None and time.monotonic() < deadline, job.communicate()[1][-2000:]
            time.sleep(0.2)
        stop = _oelm("stop", str(out), cwd=tmp_path, timeout=120)
        assert stop.returncode == 0, stop.stdout + stop.stderr
        assert f"is used by `oelm run --only` jobs, not by one driver; sent SIGTERM to 1 of them: {name} (pid {job.pid})" \
            in stop.stdout and "they stopped" in stop.stdout
        assert job.wait(timeout=60) == 130
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    assert json.loads((out / "runs" / name / "status.json").read_text())["state"] == "interrupted"


def test_stop_refuses_a_lock_of_another_host_or_one_without_a_pid(tmp_path, capsys):
    lock = tmp_path / ".oelm.lock"
    lock.write_text(json.dumps({"pid": 1, "host": "elsewhere", "started_at": "2026-01-01T00:00:00+00:00"}))
    assert main(["stop", str(tmp_path)]) == 2
    assert "is on host elsewhere (pid 1); run `oelm stop` there" in capsys.readouterr().err
    lock.write_text("")  # a run that has not written its record yet
    assert main(["stop", str(tmp_path)]) == 2
    assert ".oelm.lock names no pid" in capsys.readouterr().err
    lock.unlink()
    assert main(["stop", str(tmp_path)]) == 0
    assert "nothing to stop" in capsys.readouterr().out


@pytest.mark.slow
def test_run_says_how_many_processes_each_launcher_gave_it(tmp_path, data_dir):
    """torchrun --nproc_per_node=2 gives 2 CPU processes; `accelerate launch --cpu --num_processes 2`
    starts one (Accelerate's simple launcher), which the run now says, with the launcher that works."""
    run = ["-m", "oelm", "run", "tinystories-tiny", "--data-dir", str(data_dir), *TINY, "training.max_steps=2",
           "training.batch_size=4", "methods=[{name: baseline, learning_rate: 3.0e-3}]"]
    bindir = Path(sys.executable).parent
    torchrun = subprocess.run([str(bindir / "torchrun"), "--nproc_per_node=2", *run, "--output-dir", str(tmp_path / "t")],
                              cwd=tmp_path, env=_plain_env(), capture_output=True, text=True, timeout=600)
    assert torchrun.returncode == 0, torchrun.stderr[-3000:]
    assert "(executor local; 2 processes on cpu (MULTI_CPU))" in torchrun.stdout
    accelerate = subprocess.run([str(bindir / "accelerate"), "launch", "--cpu", "--num_processes", "2", *run,
                                 "--output-dir", str(tmp_path / "a")],
                                cwd=tmp_path, env=_plain_env(), capture_output=True, text=True, timeout=600)
    assert accelerate.returncode == 0, accelerate.stderr[-3000:]
    assert accelerate.stdout.count("oelm run: tinystories-tiny ->") == 1
    assert "1 process on cpu; for N CPU processes: torchrun --nproc_per_node=N -m oelm run" in accelerate.stdout


def test_inspect_takes_a_shipped_config_by_name_as_run_does(tmp_path, monkeypatch, capsys):
    """``oelm inspect quickstart`` is the shipped config (its model and methods), as ``oelm run
    quickstart`` is, not a Hub model id called quickstart."""
    monkeypatch.chdir(tmp_path)  # no configs/ folder here: the name alone
    assert main(["inspect", "quickstart", "--method", "oelm_freeze"]) == 0
    out = capsys.readouterr().out
    assert "== sentence-transformers/all-MiniLM-L6-v2 / oelm_freeze" in out and "query/key projections found" in out


def test_inspect_shows_every_named_method_and_says_which_do_not_apply(capsys):
    """`oelm inspect MODEL` runs every method of oelm.METHODS (the research methods included) and, for a
    Hugging Face model, names fixed_attention as not applicable instead of failing."""
    from oelm.method import METHODS

    assert main(["inspect", "sentence-transformers/all-MiniLM-L6-v2", "--config-only"]) == 0
    out = capsys.readouterr().out
    for name in METHODS:
        assert f"all-MiniLM-L6-v2 / {name}" in out, name
    assert "/ fixed_attention: not applicable: fixed_attention replaces the attention scores inside oelm's own GPT" in out
    section = out.split("/ reservoir\n")[1]  # layers 1, 3, 5 of 6 drawn and frozen whole
    total, per_layer = 22_713_216, 4 * (384 * 384 + 384) + 2 * 384 * 1536 + 1536 + 384 + 2 * 2 * 384
    assert f"trainable params: {total - 3 * per_layer:,} || all params: {total:,}" in section.splitlines()[-1]
    assert "trainable params: 20,939,136" in out.split("/ oelm_rescaled\n")[1].split("== ")[0]


def test_inspect_gpt_preset_alone_shows_every_named_method(capsys):
    """`oelm inspect --gpt PRESET` without --method shows every method of oelm.METHODS (its help's
    default), as `oelm inspect MODEL` does; it showed baseline alone."""
    from oelm.method import METHODS

    assert main(["inspect", "--gpt", "gpt-tiny"]) == 0
    out = capsys.readouterr().out
    shown = [line.split(" / ")[1].split(":")[0] for line in out.splitlines() if line.startswith("== oelm-gpt-tiny / ")]
    assert shown == list(METHODS)
    assert "/ fixed_attention\n" in out and "not applicable" not in out.split("/ fixed_attention\n")[1].split("== ")[0]


def test_inspect_gpt_preset_with_the_gpt_only_method_and_a_refusal_by_name(capsys):
    assert main(["inspect", "--gpt", "gpt-tiny", "--method", "fixed_attention", "--method", "oelm_mimetic"]) == 0
    out = capsys.readouterr().out
    assert "/ fixed_attention" in out and "attention_map" in out and "/ oelm_mimetic" in out
    assert main(["inspect", "sentence-transformers/all-MiniLM-L6-v2", "--config-only", "--method", "fixed_attention"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("oelm: error:") and "oelm's own GPT" in err and len(err.strip().splitlines()) == 1
