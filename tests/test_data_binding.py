"""A matrix is bound to its data (issue 37, item 4): experiment.json and every result.json record
the sha256 of the files each split was read from and the tokenizer's sha256, and a rerun compares
them before any run trains. A matrix continued with other data (one sentence changed in a copy
of SST-2 under the same file names; another tokenizer file under the same path) is refused with
one line naming the split (or tokenizer), both hashes and the fix; the same bytes under another
data dir are the same data; a matrix recorded by an older oelm (no ``data``) is accepted and bound.

Before, nothing was compared: the changed copy resumed silently (bg's code: exit 0).
Real data: SST-2 train and validation, copied under tmp_path; a 2-step gpt-tiny run.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from oelm.cli import main
from oelm.config import config_from_dict
from oelm.errors import ConfigError

TINY = {
    "name": "bound",
    "task": {"dataset": "sst2", "tokenizer": "bpe-512", "train_samples": 48, "validation_samples": 32, "max_length": 32},
    "model": {"gpt": "gpt-tiny", "gpt_overrides": {"hidden_size": 32, "num_layers": 2, "num_heads": 2,
                                                   "intermediate_size": 64, "dropout": 0.0}},
    "methods": [{"name": "baseline", "learning_rate": 2.0e-3}],
    "seeds": [0],
    "training": {"max_steps": 2, "batch_size": 16, "eval_every": 2, "log_every": 2, "timing_warmup_steps": 1,
                 "progress_bar": False, "tensorboard": False},
}


def _copy_sst2(data_dir: Path, to: Path) -> Path:
    (to / "sst2").mkdir(parents=True)
    for name in ("train.parquet", "validation.parquet"):
        shutil.copyfile(data_dir / "sst2" / name, to / "sst2" / name)
    return to


def _run(config: Path, out: Path, capsys) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["run", str(config), "--output-dir", str(out)])
    return code, capsys.readouterr().err


@pytest.fixture(scope="module")
def trained(data_dir, tmp_path_factory):
    """A finished 1-run matrix on a copy of SST-2 (OELM_DATA_DIR = the copy): (config, out, data copy)."""
    root = tmp_path_factory.mktemp("bound")
    data = _copy_sst2(data_dir, root / "data")
    config = root / "bound.yaml"
    config.write_text(json.dumps(TINY))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OELM_DATA_DIR", str(data))
        # module-scoped: set up before conftest's per-test cache folder is; the same folder, never ~/.cache
        mp.setenv("OELM_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "oelm-cache"))
        assert main(["run", str(config), "--output-dir", str(root / "out")]) == 0
    return config, root / "out", data


def _copies(trained, tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the finished output folder and of its data, for a test to change."""
    _, out, data = trained
    shutil.copytree(out, tmp_path / "out")
    shutil.copytree(data, tmp_path / "data")
    return tmp_path / "out", tmp_path / "data"


def test_the_files_read_and_the_tokenizer_are_recorded(trained):
    _, out, data = trained
    recorded = json.loads((out / "experiment.json").read_text())["data"]
    for role in ("train", "validation"):
        (entry,) = recorded["splits"][role]["files"]
        path = data / "sst2" / f"{role}.parquet"
        assert entry == {"path": str(path), "bytes": path.stat().st_size, "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
    result = json.loads(next(out.glob("runs/*/result.json")).read_text())
    assert recorded["tokenizer"] == {"spec": "bpe-512", "sha256": result["tokenizer"]["sha256"]}
    assert result["data_source"] == recorded


def test_one_changed_sentence_in_the_data_is_refused_in_one_line(trained, tmp_path, monkeypatch, capsys):
    import pandas as pd

    config = trained[0]
    out, data = _copies(trained, tmp_path)
    path = data / "sst2" / "validation.parquet"
    frame = pd.read_parquet(path)
    frame.loc[500, "text"] = "a different sentence entirely . "  # one of 872; not even in the 32 validation_samples
    frame.to_parquet(path)
    before = {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    monkeypatch.setenv("OELM_DATA_DIR", str(data))
    code, err = _run(config, out, capsys)
    assert code == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"oelm: error: output directory {out} holds runs trained on other data: sst2/validation "
                               f"(validation): {path} has sha256 ")
    assert f"the runs here read sha256 " in lines[0] and "Restore the data they were trained on" in lines[0]
    assert {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()} == before  # nothing written


def test_the_same_bytes_under_another_data_dir_are_the_same_data(trained, tmp_path, monkeypatch, capsys):
    config = trained[0]
    out, data = _copies(trained, tmp_path)
    results = {p: p.read_bytes() for p in out.glob("runs/*/result.json")}
    monkeypatch.setenv("OELM_DATA_DIR", str(data))
    code, err = _run(config, out, capsys)
    assert code == 0, err
    assert {p: p.read_bytes() for p in out.glob("runs/*/result.json")} == results  # kept, not retrained


def test_a_matrix_recorded_without_its_data_is_accepted_and_bound(trained, tmp_path, monkeypatch, capsys):
    """experiment.json written by an oelm that did not record the data (committed results, a
    matrix training in the background now) resumes, and is bound from then on."""
    config = trained[0]
    out, _ = _copies(trained, tmp_path)
    record = json.loads((out / "experiment.json").read_text())
    older = {k: v for k, v in record.items() if k != "data"}
    (out / "experiment.json").write_text(json.dumps(older))
    monkeypatch.setenv("OELM_DATA_DIR", str(trained[2]))
    code, err = _run(config, out, capsys)
    assert code == 0, err
    now = json.loads((out / "experiment.json").read_text())
    assert now["fingerprint"] == record["fingerprint"] and now["data"] == record["data"]


def test_a_run_started_alone_on_other_data_is_refused(trained, tmp_path, monkeypatch, capsys):
    """`oelm run --only` (a batch system's job, a Ray task) prepares its own data: it is bound too."""
    import pandas as pd

    config = trained[0]
    out, data = _copies(trained, tmp_path)
    (run_dir,) = [p for p in (out / "runs").iterdir() if p.is_dir() and not p.name.startswith(".")]
    shutil.rmtree(run_dir)  # the run is to do again
    path = data / "sst2" / "train.parquet"
    frame = pd.read_parquet(path)
    frame.loc[0, "text"] = frame.loc[0, "text"].upper()
    frame.to_parquet(path)
    monkeypatch.setenv("OELM_DATA_DIR", str(data))
    capsys.readouterr()
    assert main(["run", str(config), "--output-dir", str(out), "--only", run_dir.name]) == 2
    err = capsys.readouterr().err
    assert "holds runs trained on other data: sst2/train (train)" in err and len(err.strip().splitlines()) == 1, err
    assert not (run_dir / "result.json").exists()


def test_another_tokenizer_under_the_same_path_is_refused(data_dir, tmp_path, monkeypatch):
    """task.tokenizer names a tokenizer.json that was replaced: the config and the data are the
    same, the ids are not. The driver's data step (start_output, then prepare_matrix_data) refuses."""
    from oelm.data import load_documents
    from oelm.data.lm import save_tokenizer, train_bpe_tokenizer
    from oelm.matrix.output import prepare_matrix_data, start_output

    docs = load_documents("tinystories", "train", data_dir)
    tokenizer_file = tmp_path / "tok" / "tokenizer.json"
    save_tokenizer(train_bpe_tokenizer(docs[:30], 400, None), tokenizer_file)
    config = config_from_dict(TINY | {"task": TINY["task"] | {"tokenizer": str(tokenizer_file)}})
    out = tmp_path / "out"
    out.mkdir()
    start_output(config, out)
    first = prepare_matrix_data(config, out, lambda _: None)
    assert json.loads((out / "experiment.json").read_text())["data"]["tokenizer"]["sha256"] == first.tokenizer_record["sha256"]
    save_tokenizer(train_bpe_tokenizer(docs[30:60], 400, None), tokenizer_file)  # another corpus, same path
    start_output(config, out)  # the config is unchanged: its fingerprint passes
    with pytest.raises(ConfigError, match=rf"output directory {out} holds runs trained on other data: tokenizer "
                                          rf"{tokenizer_file}: sha256 \w{{12}}, the runs here used {tokenizer_file} with sha256"):
        prepare_matrix_data(config, out, lambda _: None)


def test_a_process_prepares_the_same_config_again_for_another_data_dir(trained, tmp_path, monkeypatch):
    """A Ray worker or `--only` job prepares a matrix's data once per process (run_one.prepared_data);
    the same config over another OELM_DATA_DIR is other data and is prepared (and bound) again, not
    served from the first preparation (which made the --only refusal above pass only in a fresh process)."""
    from oelm.matrix.run_one import prepared_data

    config = config_from_dict(TINY)
    monkeypatch.setenv("OELM_DATA_DIR", str(trained[2]))
    first = prepared_data(config, lambda _: None)
    assert prepared_data(config, lambda _: None) is first  # once per process and data dir
    other = _copy_sst2(trained[2], tmp_path / "other")
    monkeypatch.setenv("OELM_DATA_DIR", str(other))
    second = prepared_data(config, lambda _: None)
    assert second is not first
    assert second.source["splits"]["train"]["files"][0]["path"] == str(other / "sst2" / "train.parquet")
