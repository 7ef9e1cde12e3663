"""Nothing read or written outside a command's folders (issue 46, item 1): every path oelm reads
or writes in an output folder goes through :func:`oelm.io.inside`. Each reader and writer is tried
with the fault as it really happens: a record naming an absolute or ``..`` path, and a real
symbolic link planted in the folder (to another matrix's file, with its sha256 updated where one is
recorded). Each is refused in one line naming the path; the file outside is neither read nor
changed. Committed results (paths relative to their run folder) still read."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from _tiny_matrix import ONE_RUN
from oelm.cli import main
from oelm.errors import OutsideFolderError
from oelm.io import inside, sha256_file
from oelm.records import MatrixFolder, PlannedRun, RunFolder, read_record, read_status, step_checkpoints, write_status
from oelm.records.predictions import read_predictions

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
VARIANTS = "research-variants-sst2"  # a committed matrix with real predictions.npz files
RUN, OTHER = "oelm_ffn_only-lr0.0002-seed1", "oelm_ffn_only-lr0.0002-seed2"


@pytest.fixture
def two(tmp_path) -> tuple[Path, Path]:
    """Two copies of a committed matrix: the one a command works on, and another one."""
    for name in ("mine", "other"):
        shutil.copytree(RESULTS / VARIANTS, tmp_path / name)
    return tmp_path / "mine", tmp_path / "other"


def _record_predictions(run: Path, path: str, source: Path) -> None:
    """``run``'s result.json names ``path`` for its predictions, with ``source``'s sha256 and size."""
    raw = json.loads((run / "result.json").read_text())
    raw["predictions"] |= {"path": path, "sha256": sha256_file(source), "bytes": source.stat().st_size}
    (run / "result.json").write_text(json.dumps(raw))


def test_inside_accepts_plain_paths_and_a_linked_root(tmp_path):
    (tmp_path / "real" / "a").mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "real")  # the folder the user chose may itself be a link
    assert inside(tmp_path / "link", "a/b.json") == tmp_path / "link" / "a" / "b.json"
    assert inside(tmp_path / "link") == tmp_path / "link"


def test_committed_results_name_their_files_relative_to_their_run_folder():
    """Every committed result's predictions and checkpoint paths read through inside()."""
    runs = [RunFolder(p.parent) for p in RESULTS.glob("*/runs/*/result.json")]
    recorded = 0
    for run in runs:
        r = read_record(run.result)
        for entry in (r.predictions, r.checkpoint):
            if isinstance(entry, dict) and entry.get("path"):
                inside(run.path, entry["path"], named_in=run.result)
                recorded += 1
    assert recorded > 100
    assert read_predictions(RESULTS / VARIANTS / "runs" / RUN, read_record(RESULTS / VARIANTS / "runs" / RUN / "result.json"))


@pytest.mark.parametrize("fault", ["absolute", "dotdot", "symlink"])
def test_report_never_reads_predictions_outside_the_run_folder(two, fault):
    mine, other = two
    run, source = mine / "runs" / RUN, other / "runs" / OTHER / "predictions.npz"
    if fault == "absolute":
        _record_predictions(run, str(source), source)
    elif fault == "dotdot":
        _record_predictions(run, f"../{OTHER}/predictions.npz", mine / "runs" / OTHER / "predictions.npz")
    else:  # the file itself swapped for a link to another matrix's, its checksum updated
        (run / "predictions.npz").unlink()
        (run / "predictions.npz").symlink_to(source)
        _record_predictions(run, "predictions.npz", source)
    with pytest.raises(OutsideFolderError) as caught:
        read_predictions(run, read_record(run / "result.json"))
    line = str(caught.value)
    assert "\n" not in line and f"named in {run / 'result.json'}" in line
    assert ("symbolic link" in line) if fault == "symlink" else ("leads outside" in line)


def test_the_comparison_leaves_a_linked_predictions_file_out_with_a_note(two):
    from oelm.config import load_config
    from oelm.report import compare_results, load_results

    mine, other = two
    run, source = mine / "runs" / RUN, other / "runs" / OTHER / "predictions.npz"
    (run / "predictions.npz").unlink()
    (run / "predictions.npz").symlink_to(source)
    _record_predictions(run, "predictions.npz", source)
    c = compare_results(load_config(mine / "config.yaml"), load_results(mine), mine)
    method = c["uncertainty"]["methods"]["oelm_ffn_only"]
    assert method["interval"] == "seed-only interval" and "seed(s) 1" in method["reason"]
    (note,) = c["uncertainty"]["notes"]
    assert str(run / "predictions.npz") in note and "symbolic link" in note


def test_best_weights_recorded_outside_the_run_folder_are_refused(two):
    mine, other = two
    run = MatrixFolder(mine).run(RUN)
    weights = other / "weights.safetensors"
    weights.write_bytes(b"another matrix's weights")
    raw = json.loads(run.result.read_text())
    raw["checkpoint"] = {"path": str(weights), "sha256": sha256_file(weights), "bytes": weights.stat().st_size}
    run.result.write_text(json.dumps(raw))
    with pytest.raises(OutsideFolderError, match=f"{weights} \\(named in {run.result}\\) leads outside {run.path}"):
        run.verify_weights(read_record(run.result), "fix")


def test_report_refuses_a_result_json_that_is_a_link(two, capsys):
    mine, other = two
    result = mine / "runs" / RUN / "result.json"
    result.unlink()
    result.symlink_to(other / "runs" / OTHER / "result.json")
    before = (mine / "comparison.json").read_bytes()
    assert main(["report", str(mine)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"oelm: error: {result} is a symbolic link (to {other / 'runs' / OTHER / 'result.json'})")
    assert (mine / "comparison.json").read_bytes() == before


def test_a_run_folder_that_is_a_link_is_refused(two):
    mine, other = two
    (mine / "runs" / RUN).rename(mine / "moved")
    (mine / "runs" / RUN).symlink_to(other / "runs" / RUN)
    with pytest.raises(OutsideFolderError, match=f"{mine / 'runs' / RUN} is a symbolic link"):
        MatrixFolder(mine).results()
    with pytest.raises(OutsideFolderError):
        MatrixFolder(mine).run("../../other")


def test_monitor_shows_a_run_with_a_linked_file_as_damaged_and_reads_nothing_through_it(two, capsys):
    from oelm.cli.monitor import collect_runs

    mine, other = two
    status = mine / "runs" / RUN / "status.json"
    status.unlink(missing_ok=True)
    status.symlink_to(other / "runs" / OTHER / "result.json")
    rows = {r["name"]: r for r in collect_runs(mine)}
    row = rows[RUN]
    assert row["state"] == "damaged" and row["damage"].startswith(f"{status} is a symbolic link")
    assert row["best_validation"] is None and row["seed"] == 1  # nothing of the other run's record shown
    assert sum(r["state"] == "damaged" for r in rows.values()) == 1
    main(["monitor", str(mine), "--once"])
    out = capsys.readouterr().out
    (note,) = [line for line in out.splitlines() if line.startswith("damaged:")]
    assert f"{status} is a symbolic link" in note and "replace the link" in note and "runs/.damaged" not in note


def test_status_and_metrics_writers_never_write_through_a_link(tmp_path):
    from oelm.training.metrics_log import MetricsLog

    run, outside = tmp_path / "out" / "runs" / "baseline-seed0", tmp_path / "elsewhere.txt"
    run.mkdir(parents=True)
    outside.write_text("precious\n")
    for name in ("status.json", "metrics.jsonl"):
        (run / name).symlink_to(outside)
    planned = PlannedRun("baseline", 1e-3, 0, "final", "baseline-seed0")
    with pytest.raises(OutsideFolderError, match=f"{run / 'status.json'} is a symbolic link"):
        write_status(run, planned, "running")
    with pytest.raises(OutsideFolderError):
        read_status(run)
    with pytest.raises(OutsideFolderError, match=f"{run / 'metrics.jsonl'} is a symbolic link"):
        MetricsLog(run, tensorboard=False)
    assert outside.read_text() == "precious\n"


def test_checkpoints_behind_a_link_are_refused(tmp_path):
    run, elsewhere = RunFolder(tmp_path / "runs" / "baseline-seed0"), tmp_path / "elsewhere"
    (elsewhere / "step-4").mkdir(parents=True)
    run.path.mkdir(parents=True)
    (run.path / "checkpoints").mkdir()
    (run.path / "checkpoints" / "step-4").symlink_to(elsewhere / "step-4")
    with pytest.raises(OutsideFolderError, match="step-4 is a symbolic link"):
        step_checkpoints(run.checkpoints)
    (run.path / "checkpoints" / "step-4").unlink()
    (run.path / "checkpoints").rmdir()
    (run.path / "checkpoints").symlink_to(elsewhere)
    with pytest.raises(OutsideFolderError, match="checkpoints is a symbolic link"):
        run.holds_results()


def test_a_run_never_appends_its_train_log_through_a_planted_link(tmp_path, data_dir, capsys):
    """A train.log planted as a link in the run's folder before the run trains: one line, the file
    it points to unchanged, nothing trained."""
    (tmp_path / "c.yaml").write_text(ONE_RUN)
    out, outside = tmp_path / "out", tmp_path / "elsewhere.log"
    outside.write_text("someone else's file\n")
    run = out / "runs" / "baseline-seed0"
    run.mkdir(parents=True)
    (run / "train.log").symlink_to(outside)
    code = main(["run", str(tmp_path / "c.yaml"), "--output-dir", str(out)])
    err = capsys.readouterr().err
    assert code != 0 and f"{run / 'train.log'} is a symbolic link" in err
    assert outside.read_text() == "someone else's file\n"
    assert not (run / "result.json").exists()


@pytest.fixture(scope="module")
def stories(data_dir) -> list[str]:
    from oelm.data import load_documents

    return load_documents("tinystories", "train", data_dir)[:40]


def test_a_token_cache_entry_that_is_a_link_is_removed_never_read(stories, tmp_path):
    """A cache entry swapped for a link to a file elsewhere (here another cache's entry for the same
    documents, so its content would pass): warning, the link removed, the stream built again; the
    file it pointed to unchanged."""
    import numpy as np

    from oelm.data.lm import pack_documents, train_bpe_tokenizer

    tokenizer = train_bpe_tokenizer(stories, 400, tmp_path / "cache" / "tokenizers")
    fresh = pack_documents(stories, tokenizer, 32, cache_dir=tmp_path / "cache" / "tokens")
    pack_documents(stories, tokenizer, 32, cache_dir=tmp_path / "elsewhere" / "tokens")
    (entry,) = (tmp_path / "cache" / "tokens").glob("tokens-*.npz")
    outside = tmp_path / "elsewhere" / "tokens" / entry.name
    before = outside.read_bytes()
    entry.unlink()
    entry.symlink_to(outside)
    with pytest.warns(UserWarning, match=rf"oelm cache {entry} is a symbolic link .*removed the link, building the data again"):
        again = pack_documents(stories, tokenizer, 32, cache_dir=tmp_path / "cache" / "tokens")
    assert again.equal(fresh) and entry.is_file() and not entry.is_symlink()
    assert outside.read_bytes() == before
    assert np.load(entry)["tokens"].shape == np.load(outside)["tokens"].shape


def test_a_linked_cache_folder_is_neither_read_nor_written(stories, tmp_path):
    from oelm.data.lm import pack_documents, train_bpe_tokenizer

    tokenizer = train_bpe_tokenizer(stories, 400, tmp_path / "cache" / "tokenizers")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "cache" / "tokens").symlink_to(tmp_path / "elsewhere")
    with pytest.warns(UserWarning, match=r"tokens is a symbolic link"):
        pack_documents(stories, tokenizer, 32, cache_dir=tmp_path / "cache" / "tokens")
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_a_cached_tokenizer_folder_that_is_a_link_is_trained_again(stories, tmp_path):
    from oelm.data.lm import train_bpe_tokenizer

    first = train_bpe_tokenizer(stories, 400, tmp_path / "cache" / "tokenizers")
    (folder,) = [p for p in (tmp_path / "cache" / "tokenizers").iterdir() if p.is_dir()]
    folder.rename(tmp_path / "moved")
    folder.symlink_to(tmp_path / "moved")
    before = (tmp_path / "moved" / "tokenizer.json").read_bytes()
    with pytest.warns(UserWarning, match=rf"oelm cache {folder} is a symbolic link"):
        again = train_bpe_tokenizer(stories, 400, tmp_path / "cache" / "tokenizers")
    assert again.get_vocab() == first.get_vocab()
    assert (tmp_path / "moved" / "tokenizer.json").read_bytes() == before


def test_the_lock_file_is_never_truncated_through_a_link(tmp_path):
    from oelm.runtime.lock import LOCK_NAME, hold_output_lock

    out, outside = tmp_path / "out", tmp_path / "precious.txt"
    out.mkdir()
    outside.write_text("someone else's file\n")
    (out / LOCK_NAME).symlink_to(outside)
    with pytest.raises(OutsideFolderError, match=f"{out / LOCK_NAME} is a symbolic link"):
        with hold_output_lock(out):
            pass
    assert outside.read_text() == "someone else's file\n"


def test_report_plots_are_never_written_through_a_linked_folder(two, capsys, report_plots):
    mine, other = two
    shutil.rmtree(mine / "report_files", ignore_errors=True)  # none where the fixture's reports drew no plots
    (other / "plots").mkdir()
    (mine / "report_files").symlink_to(other / "plots")
    assert main(["report", str(mine)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"oelm: error: {mine / 'report_files'} is a symbolic link")
    assert list((other / "plots").iterdir()) == []


def test_result_json_and_the_output_tokenizer_are_never_written_through_a_link(two, stories, tmp_path):
    from oelm.data.lm import train_bpe_tokenizer
    from oelm.records import write_record

    mine, other = two
    run = MatrixFolder(mine).run(RUN)
    result = run.result
    record = read_record(result)
    target = other / "runs" / OTHER / "result.json"
    before = target.read_bytes()
    result.unlink()
    result.symlink_to(target)
    with pytest.raises(OutsideFolderError, match=f"{result} is a symbolic link"):
        write_record(MatrixFolder(mine).run(RUN).result, record)
    assert target.read_bytes() == before
    outside = tmp_path / "precious.json"
    outside.write_text("{}")
    (mine / "tokenizer.json").symlink_to(outside)
    from oelm.data.lm import save_tokenizer

    with pytest.raises(OutsideFolderError, match="tokenizer.json is a symbolic link"):
        save_tokenizer(train_bpe_tokenizer(stories, 300, tmp_path / "cache"), MatrixFolder(mine).tokenizer)
    assert outside.read_text() == "{}"


def test_a_data_file_linked_out_of_the_data_dir_is_refused_and_a_link_within_it_read(tmp_path, data_dir):
    """The data dir is the one folder whose links are followed (users link files within it), as
    long as they stay inside it."""
    from oelm.data import load_classification

    root, outside = tmp_path / "data", tmp_path / "elsewhere"
    (root / "sst2").mkdir(parents=True)
    outside.mkdir()
    shutil.copyfile(data_dir / "sst2" / "validation.parquet", outside / "validation.parquet")
    (root / "sst2" / "validation.parquet").symlink_to(outside / "validation.parquet")
    with pytest.raises(OutsideFolderError) as caught:
        load_classification("sst2", "validation", root)
    assert str(caught.value).startswith(f"{root / 'sst2' / 'validation.parquet'} leads outside {root} "
                                        f"(to {outside / 'validation.parquet'}, through a symbolic link)")
    (root / "sst2" / "validation.parquet").unlink()
    (root / "shared").mkdir()
    shutil.copyfile(data_dir / "sst2" / "validation.parquet", root / "shared" / "validation.parquet")
    (root / "sst2" / "validation.parquet").symlink_to(root / "shared" / "validation.parquet")
    assert len(load_classification("sst2", "validation", root)) == 872
