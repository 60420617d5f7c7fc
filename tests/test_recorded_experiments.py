"""The experiments too long for a book build (book/experiments/recorded.py, ``make experiments``):
a few steps of the same code still run and record their provenance, a record from other code is
refused and one from today's code accepted, the committed record is the tool's own and today's,
and a stale record fails the book build before Jupyter Book runs."""
from __future__ import annotations

import copy
import importlib
import json

import pytest

from book.experiments import charlm_long, recorded

MODULE = "book.experiments.charlm_long"


@pytest.fixture(scope="module")
def short_record(tmp_path_factory):
    """The experiment's every run, a few steps each (charlm_long.SHORT), recorded as make experiments does."""
    out = tmp_path_factory.mktemp("recorded") / "charlm_long.json"
    lines = []
    record = recorded.run("charlm_long", jobs=2, short=True, out=out, log=lambda *a, **k: lines.append(a[0]))
    return out, record, lines


def assert_short_record(name, out, record, lines):
    exp = importlib.import_module(recorded.EXPERIMENTS[name])
    assert recorded.read(out) == record
    assert set(record["runs"]) == {recorded.key_id(k) for k in exp.runs()}
    for entry in record["runs"].values():
        assert entry["code_hash"] == recorded.code_hash(recorded.EXPERIMENTS[name])
        assert entry["settings"] == exp.SHORT
        # the last evaluation is after the last step (charlm labels it steps - 1, beyond.train steps)
        assert entry["result"]["finite"] and entry["result"]["evals"][-1][0] in (exp.SHORT["steps"] - 1, exp.SHORT["steps"])
        assert {"platform", "cpu", "python", "torch", "torch_threads"} <= set(entry["machine"])
        assert entry["machine"]["torch_threads"] == 1
        assert entry["wall_s"] > 0 and entry["started"] <= entry["finished"]
    # one progress line per run, with the overall count
    n = len(exp.runs())
    assert [ln for ln in lines if ln.startswith("[")] and all(f"/{n}]" in ln for ln in lines[1:])


def test_a_short_run_trains_every_variant_and_records_its_provenance(short_record):
    assert_short_record("charlm_long", *short_record)


@pytest.mark.parametrize("name", sorted(set(recorded.EXPERIMENTS) - {"charlm_long"}))
def test_every_other_experiment_still_runs_a_few_steps(name, tmp_path):
    out, lines = tmp_path / f"{name}.json", []
    record = recorded.run(name, jobs=2, short=True, out=out, log=lambda *a, **k: lines.append(a[0]))
    assert_short_record(name, out, record, lines)


def test_a_second_run_resumes_and_reruns_nothing(short_record):
    out, record, _ = short_record
    lines = []
    again = recorded.run("charlm_long", short=True, out=out, log=lambda *a, **k: lines.append(a[0]))
    assert again == record and len(lines) == 1 and "0 to run" in lines[0]


def test_the_check_accepts_a_record_of_todays_code(short_record):
    recorded.check(short_record[1], MODULE, settings=charlm_long.SHORT)


def test_the_check_refuses_a_record_from_other_code_and_names_the_changed_file(short_record):
    stale = copy.deepcopy(short_record[1])
    entry = stale["runs"]["seed=0,variant=post-norm"]
    entry["code_hash"] = "0" * 64
    entry["code_files"]["book/experiments/blocks.py"] = "0" * 64
    with pytest.raises(recorded.StaleResults) as e:
        recorded.check(stale, MODULE, settings=charlm_long.SHORT)
    msg = str(e.value)
    assert "seed=0,variant=post-norm" in msg and "book/experiments/blocks.py" in msg
    assert recorded.REFRESH in msg and "seed=1,variant=post-norm" not in msg


def test_the_check_refuses_other_settings_and_missing_runs(short_record):
    with pytest.raises(recorded.StaleResults, match="the settings"):
        recorded.check(short_record[1], MODULE)  # the SHORT record is not the long experiment's
    partial = copy.deepcopy(short_record[1])
    del partial["runs"]["seed=1,variant=pre-norm"]
    with pytest.raises(recorded.StaleResults, match=r"Missing runs: seed=1,variant=pre-norm"):
        recorded.check(partial, MODULE, settings=charlm_long.SHORT)


def test_the_code_hash_covers_the_model_and_training_code():
    files = {p.name for p in recorded.code_files(MODULE)}
    assert {"charlm_long.py", "charlm.py", "blocks.py", "toytask.py"} <= files
    assert "recorded.py" not in files  # how results are written down does not change them


@pytest.mark.parametrize("name", sorted(recorded.EXPERIMENTS))
def test_the_committed_record_was_written_by_the_tool_from_todays_code(name):
    path = recorded.path_of(name)
    text = path.read_text(encoding="utf-8")
    record = json.loads(text)
    # the tool's own formatting, byte for byte: a hand edit that reformats shows
    assert text == json.dumps(record, indent=1, sort_keys=True) + "\n"
    assert record["schema"] == recorded.SCHEMA and record["written_by"] == recorded.WRITER
    recorded.load(name)  # every run, today's code hash, today's settings
    for entry in record["runs"].values():
        evals = entry["result"]["evals"]
        assert [s for s, _ in evals] == sorted(s for s, _ in evals)
        assert entry["result"]["final_held"] == evals[-1][1] and entry["result"]["finite"]
        assert entry["machine"]["torch_threads"] == 1


def test_the_pages_pin_the_committed_record():
    recorded.check_pages()


def test_a_page_pinning_an_older_record_is_refused(tmp_path):
    page = tmp_path / "page.md"
    page.write_text('record = recorded.load("charlm_long", pin="0000000000000000")\n')
    with pytest.raises(recorded.StaleResults, match="update the pin"):
        recorded.check_pages([page])


def test_a_stale_record_fails_the_book_build_before_jupyter_book(tmp_path, monkeypatch, capsys):
    from book import build

    stale = recorded.read(recorded.path_of("charlm_long"))
    for entry in stale["runs"].values():
        entry["code_hash"] = "0" * 64
    (tmp_path / "charlm_long.json").write_text(json.dumps(stale))
    monkeypatch.setattr(recorded, "RESULTS", tmp_path)

    def must_not_run(*a, **k):
        raise AssertionError("the build went on past a stale record")
    monkeypatch.setattr(build, "ensure_mathjax", must_not_run)
    assert build.build() == 1
    err = capsys.readouterr().err
    assert "stale" in err and "make experiments" in err and "charlm_long.json" in err
