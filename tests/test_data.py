import json

import numpy as np
import pytest
from click.testing import CliRunner

from evolve.data import tokens as data
from evolve.data.sources import synthetic as synth
from evolve.cli import main
from evolve.data.tokens import DataError


def _records(ds, n=None):
    cols = {f: getattr(ds, f).tolist() for f in data.FIELDS}
    k = len(ds) if n is None else n
    return [{f: cols[f][i] for f in data.FIELDS} for i in range(k)]


def _write(tmp_path, obj, name="bad.json"):
    p = tmp_path / name
    p.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return p


# ------------------------------------------------------------------ generator

def test_generator_is_deterministic_bit_for_bit(tmp_path):
    a = synth.generate(50, seed=7)
    b = synth.generate(50, seed=7)
    for f in data.FIELDS:
        assert np.array_equal(getattr(a, f), getattr(b, f))
    data.save_npz(a, tmp_path / "a.npz")
    data.save_npz(b, tmp_path / "b.npz")
    assert (tmp_path / "a.npz").read_bytes() == (tmp_path / "b.npz").read_bytes()
    c = synth.generate(50, seed=8)
    assert not np.array_equal(a.draft_prob[:100], c.draft_prob[:100])


def test_shipped_splits_equal_regeneration(default_splits):
    fresh = synth.generate_splits()
    for name, ds in fresh.items():
        for f in data.FIELDS:
            assert np.array_equal(getattr(ds, f), getattr(default_splits[name], f)), (name, f)


def test_generator_statistics(default_splits):
    train = default_splits["train"]
    assert len(train) == pytest.approx(49_185, rel=0.02)
    assert train.baseline_accepts.mean() == pytest.approx(0.785, abs=0.01)
    assert train.top_token_match.mean() == pytest.approx(0.72, abs=0.01)
    lengths = np.diff(np.flatnonzero(np.append(train.position == 0, True)))
    assert lengths.min() >= 25 and lengths.max() <= 74
    assert train.draft_prob.min() >= 0.05 and train.draft_prob.max() <= 0.95
    assert train.target_prob.min() >= 0.01 and train.target_prob.max() <= 0.99
    miss = ~train.top_token_match
    assert train.target_prob[miss].max() <= 0.5
    assert train.draft_entropy.min() >= 2.0 and train.draft_entropy.max() <= 6.0 * 1.3


# -------------------------------------------------------------- json and npz

def test_json_roundtrip_exact(tmp_path, small_splits):
    ds = small_splits["valid"]
    p1 = tmp_path / "one.json"
    data.save_json(ds, p1)
    back = data.load_json(p1)
    for f in data.FIELDS:
        assert np.array_equal(getattr(back, f), getattr(ds, f))
    p2 = tmp_path / "two.json"
    data.save_json(back, p2)
    assert p1.read_bytes() == p2.read_bytes()
    assert json.loads(p1.read_text()) == _records(ds)


def test_json_in_original_layout_imports(tmp_path, small_splits):
    # pretty-printed as the original harness writes it, ints where floats are whole
    recs = _records(small_splits["test"], 20)
    recs[0]["draft_prob"] = 1
    recs[0]["target_prob"] = 1
    recs[0]["baseline_accepts"] = recs[0]["rand_value"] < 1.0
    p = _write(tmp_path, json.dumps(recs, indent=2))
    ds = data.load_json(p)
    assert len(ds) == 20 and ds.draft_prob.dtype == np.float64


def test_npz_roundtrip(tmp_path, small_splits):
    ds = small_splits["train"]
    data.save_npz(ds, tmp_path / "x.npz")
    back = data.load_npz(tmp_path / "x.npz")
    for f in data.FIELDS:
        assert np.array_equal(getattr(back, f), getattr(ds, f))
        assert getattr(back, f).dtype == data.FIELDS[f]


# ---------------------------------------------------------------- validation

def _bad(tmp_path, small_splits, row, field, value):
    recs = _records(small_splits["test"], 10)
    recs[row][field] = value
    return _write(tmp_path, recs)


@pytest.mark.parametrize("field,value,words", [
    ("draft_prob", 0.0, "outside (0, 1]"),
    ("draft_prob", 1.5, "outside (0, 1]"),
    ("target_prob", -0.1, "outside (0, 1]"),
    ("draft_entropy", -1.0, "negative"),
    ("target_entropy", -0.5, "negative"),
    ("position", -3, "negative"),
    ("rand_value", 1.0, "outside [0, 1)"),
    ("rand_value", -0.01, "outside [0, 1)"),
    ("position", 1.5, "expected an integer"),
    ("top_token_match", 1, "expected true or false"),
    ("draft_prob", "0.5", "expected a number"),
    ("draft_prob", None, "expected a number"),
])
def test_bad_values_name_file_field_row(tmp_path, small_splits, field, value, words):
    p = _bad(tmp_path, small_splits, 3, field, value)
    with pytest.raises(DataError) as e:
        data.load_json(p)
    msg = str(e.value)
    assert str(p) in msg and f"'{field}'" in msg and "row 3" in msg and words in msg
    assert "\n" not in msg


def test_nan_and_inf_rejected(tmp_path, small_splits):
    for token in ("NaN", "Infinity"):
        recs = _records(small_splits["test"], 5)
        text = json.dumps(recs).replace(json.dumps(recs[2]["draft_entropy"]), token, 1)
        p = _write(tmp_path, text)
        with pytest.raises(DataError, match=r"'draft_entropy' row 2: .* not finite"):
            data.load_json(p)


def test_missing_and_extra_fields(tmp_path, small_splits):
    recs = _records(small_splits["test"], 5)
    del recs[4]["rand_value"]
    with pytest.raises(DataError, match=r"field 'rand_value' row 4: missing"):
        data.load_json(_write(tmp_path, recs))
    recs = _records(small_splits["test"], 5)
    recs[1]["bogus"] = 1
    with pytest.raises(DataError, match=r"field 'bogus' row 1: not part of the schema"):
        data.load_json(_write(tmp_path, recs))


def test_inconsistent_baseline_reports_count(tmp_path, small_splits):
    recs = _records(small_splits["test"], 30)
    for i in (5, 9, 17):
        recs[i]["baseline_accepts"] = not recs[i]["baseline_accepts"]
    with pytest.raises(DataError, match=r"'baseline_accepts' row 5: .*\(3 inconsistent rows"):
        data.load_json(_write(tmp_path, recs))


@pytest.mark.parametrize("text,words", [
    ("[]", "empty"),
    ('[{"draft_prob": 0.5', "not valid JSON"),
    ("not json at all", "not valid JSON"),
    ('{"draft_prob": 0.5}', "expected a JSON array"),
    ("[1, 2]", "row 0: expected an object"),
])
def test_structural_errors(tmp_path, text, words):
    with pytest.raises(DataError, match=words):
        data.load_json(_write(tmp_path, text))


def test_unequal_arrays_and_missing_file(tmp_path, small_splits):
    cols = small_splits["test"].columns()
    cols["rand_value"] = cols["rand_value"][:-1]
    with pytest.raises(DataError, match="'rand_value' has"):
        data.from_columns(cols, source="x.npz")
    with pytest.raises(DataError, match="file not found"):
        data.load_json(tmp_path / "nope.json")
    (tmp_path / "trunc.npz").write_bytes(b"PK\x03\x04garbage")
    with pytest.raises(DataError, match="not a readable split file"):
        data.load_npz(tmp_path / "trunc.npz")


def test_empty_npz_split_rejected(tmp_path, small_splits):
    cols = {f: v[:0] for f, v in small_splits["test"].columns().items()}
    with pytest.raises(DataError, match="empty"):
        data.from_columns(cols, source="e.npz")


# ------------------------------------------------------------------------ CLI

def test_cli_import_benchmark_export_roundtrip(tmp_path, small_splits):
    src = tmp_path / "orig"
    src.mkdir()
    for name, ds in small_splits.items():
        (src / f"{name}.json").write_text(json.dumps(_records(ds), indent=2))
    out = tmp_path / "imported"
    runner = CliRunner()
    for name in small_splits:
        r = runner.invoke(main, ["data", "import", str(src / f"{name}.json"), "--split", name,
                                 "--out", str(out)])
        assert r.exit_code == 0, r.output
    r = runner.invoke(main, ["benchmark", "--data", str(out), "--json", "--repeats", "1",
                             "--heuristic", "standard_rejection"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    for name in small_splits:
        assert res["splits"][name]["heuristics"]["standard_rejection"]["accuracy"] == 1.0
    exp = tmp_path / "exported"
    r = runner.invoke(main, ["data", "export", "--data", str(out), "--out", str(exp)])
    assert r.exit_code == 0, r.output
    for name in small_splits:
        assert json.loads((exp / f"{name}.json").read_text()) == \
            json.loads((src / f"{name}.json").read_text())


def test_cli_bad_input_one_line_exit_2(tmp_path, small_splits):
    p = _bad(tmp_path, small_splits, 2, "draft_prob", 2.0)
    r = CliRunner().invoke(main, ["data", "import", str(p), "--split", "x",
                                  "--out", str(tmp_path / "o")])
    assert r.exit_code == 2
    assert "Traceback" not in r.output
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and "row 2" in lines[0] and "'draft_prob'" in lines[0]
    assert not (tmp_path / "o" / "x.npz").exists()


def test_cli_generate_refuses_to_clobber(tmp_path):
    runner = CliRunner()
    r = runner.invoke(main, ["data", "generate", "--out", str(tmp_path), "--sequences", "20"])
    assert r.exit_code == 0, r.output
    before = (tmp_path / "train.npz").read_bytes()
    r = runner.invoke(main, ["data", "generate", "--out", str(tmp_path), "--sequences", "20"])
    assert r.exit_code == 0 and "unchanged" in r.stderr
    r = runner.invoke(main, ["data", "generate", "--out", str(tmp_path), "--sequences", "20",
                             "--seed", "5"])
    assert r.exit_code == 2 and "--force" in r.stderr
    assert (tmp_path / "train.npz").read_bytes() == before


def test_cli_data_info(small_data_dir):
    r = CliRunner().invoke(main, ["data", "info", "--data", str(small_data_dir), "--json"])
    assert r.exit_code == 0, r.output
    info = json.loads(r.stdout)
    assert set(info) == {"train", "valid", "test"}
    assert 0.6 < info["train"]["standard_accept_rate"] < 0.95
    r = CliRunner().invoke(main, ["data", "info", "--data", str(small_data_dir)])
    assert "standard accept %" in r.stdout and "train" in r.stdout
